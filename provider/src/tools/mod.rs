//! The `ferroce` tools: what the binary's subcommands run. They live in the library so tests
//! can drive them.

pub mod demo;
pub mod devinfo;
pub mod loopback;
pub mod perf;
pub mod pingpong;
pub mod udp_ceiling;
