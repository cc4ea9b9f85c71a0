//! The agent's control connection: its TCP line protocol (`rdma_peer`'s, served also by
//! `ferroce fuzz-agent`): one command line, one reply line.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The agent's control connection.
pub struct Agent {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Agent {
    /// Connects to an agent's TCP port (retrying for up to `patience`, as it may still be
    /// starting).
    ///
    /// # Errors
    /// The last connection error.
    pub fn connect(at: SocketAddr, patience: Duration) -> io::Result<Agent> {
        let deadline = Instant::now() + patience;
        loop {
            match TcpStream::connect_timeout(&at, Duration::from_secs(2)) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(60)))?;
                    s.set_nodelay(true)?;
                    let writer = s.try_clone()?;
                    return Ok(Agent {
                        reader: BufReader::new(s),
                        writer,
                    });
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Sends one command and returns its one-line reply.
    ///
    /// # Errors
    /// A broken connection (the agent is gone), or an `ERR` reply.
    pub fn cmd(&mut self, line: &str) -> io::Result<String> {
        self.writer.write_all(format!("{line}\n").as_bytes())?;
        let mut reply = String::new();
        if self.reader.read_line(&mut reply)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the agent closed its control connection",
            ));
        }
        let reply = reply.trim().to_owned();
        if reply.starts_with("ERR") {
            return Err(io::Error::other(format!("agent: {line:?} -> {reply}")));
        }
        Ok(reply)
    }
}

impl Agent {
    /// An agent-less link over an established stream (the `--pingpong` mode, whose server
    /// speaks no agent protocol): commands are never sent on it.
    ///
    /// # Errors
    /// Cloning the stream.
    pub fn over(stream: TcpStream) -> io::Result<Agent> {
        Ok(Agent {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }
}
