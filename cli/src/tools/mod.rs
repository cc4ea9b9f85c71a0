//! The `ferroce` tools: what the binary's subcommands run, as functions the tests can drive.

pub mod demo;
pub mod devinfo;
pub mod doctor;
pub mod loopback;
pub mod perf;
pub mod pingpong;
pub mod sysfs;
pub mod udp_ceiling;
