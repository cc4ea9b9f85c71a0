//! The `ferroce` tool, over the ferroce library: what its subcommands run (`tools`), and the
//! capture decoder behind `ferroce pcap` (`frame`, `decode`). It lives apart from the library
//! so that a program using ferroce does not build clap, env_logger or pnet_packet.

pub mod cm_decode;
pub mod decode;
pub mod frame;
pub mod fuzz;
pub mod tools;
