//! A server and a client that find each other over TCP, as verbs programs do: each side sends
//! its QP endpoint (and the server its region) as bytes, both connect their QPs, the client
//! RDMA WRITEs a message into the server's region, then says so over TCP.
//!
//! ```sh
//! cargo run -p ferroce --example client_server -- server 127.0.0.1:18600 127.0.0.1
//! cargo run -p ferroce --example client_server -- client 127.0.0.1:18600 127.0.0.1
//! ```

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use ferroce::{
    AccessFlags, CompletionQueue, Context, Device, MemoryRegion, QpEndpoint, QpType, QueuePair,
    RemoteMemory, SendWr, WcStatus,
};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Side {
    _ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(device: &str) -> Result<Side> {
    let ctx = Device::find(device)?.open()?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None)?;
    let qp = pd.qp(QpType::Rc, &cq).build()?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.reg_mr(4096, access)?;
    Ok(Side {
        _ctx: ctx,
        cq,
        qp,
        mr,
    })
}

/// Serves one client on `listener`; returns the message the client wrote into the region.
fn server(listener: &TcpListener, device: &str) -> Result<Vec<u8>> {
    let s = side(device)?;
    let (mut tcp, _) = listener.accept()?;
    tcp.write_all(&s.qp.endpoint(0x100).to_bytes())?;
    tcp.write_all(&s.mr.remote().to_bytes())?;
    let mut peer = [0u8; QpEndpoint::LEN];
    tcp.read_exact(&mut peer)?;
    s.qp.connect(0x100, &QpEndpoint::from_bytes(&peer)?)?;
    tcp.write_all(b"R")?; // ready: the client may write
    let mut len = [0u8; 1];
    tcp.read_exact(&mut len)?; // the client's WRITE has completed
    let mut msg = vec![0u8; usize::from(len[0])];
    s.mr.read(0, &mut msg)?;
    Ok(msg)
}

/// Connects to the server at `addr` and writes `msg` into its region.
fn client(addr: &str, device: &str, msg: &[u8]) -> Result<()> {
    let s = side(device)?;
    let mut tcp = TcpStream::connect(addr)?;
    let mut peer = [0u8; QpEndpoint::LEN];
    tcp.read_exact(&mut peer)?;
    let mut region = [0u8; RemoteMemory::LEN];
    tcp.read_exact(&mut region)?;
    tcp.write_all(&s.qp.endpoint(0x200).to_bytes())?;
    s.qp.connect(0x200, &QpEndpoint::from_bytes(&peer)?)?;
    let remote = RemoteMemory::from_bytes(&region)?;
    let mut ready = [0u8; 1];
    tcp.read_exact(&mut ready)?;
    s.mr.write(0, msg)?;
    let len = u32::try_from(msg.len())?;
    s.qp.post_send(&SendWr::write(1, s.mr.sge(0, len), remote.at(0)))?;
    let wc = s.cq.wait(Duration::from_secs(10)).ok_or("no completion")?;
    if wc.status != WcStatus::Success {
        return Err(format!("WRITE: {:?}", wc.status).into());
    }
    tcp.write_all(&[u8::try_from(msg.len())?])?;
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1..4) {
        Some([role, addr, device]) if role == "server" => {
            let msg = server(&TcpListener::bind(addr)?, device)?;
            println!("the client wrote {:?}", String::from_utf8_lossy(&msg));
            Ok(())
        }
        Some([role, addr, device]) if role == "client" => {
            client(addr, device, b"hello from the client")?;
            println!("written");
            Ok(())
        }
        _ => Err("usage: client_server server|client TCP_ADDR DEVICE_ADDR".into()),
    }
}

#[test]
fn client_and_server_connect_over_tcp() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let srv = std::thread::spawn(move || server(&listener, "127.0.0.1").map_err(|e| e.to_string()));
    client(&addr, "127.0.0.1", b"hello from the client").unwrap();
    assert_eq!(srv.join().unwrap().unwrap(), b"hello from the client");
}
