//! Awaiting completions from async code: the completion channel's descriptor is `AsFd`, so
//! tokio's `AsyncFd` wakes the task when the armed CQ has a new completion; the task takes the
//! event, acknowledges it, re-arms the CQ and polls. `cargo run -p ferroce --example async_cq`.

use std::time::Duration;

use ferroce::{
    AccessFlags, CompletionChannel, CompletionQueue, Device, QpType, SendWr, WcStatus,
    WorkCompletion,
};
use tokio::io::unix::AsyncFd;

/// The next completion of `cq`, awaited through `channel`'s descriptor.
async fn next_completion(
    cq: &CompletionQueue,
    channel: &AsyncFd<CompletionChannel>,
) -> std::io::Result<WorkCompletion> {
    loop {
        cq.req_notify(false).map_err(std::io::Error::from)?;
        // A completion that landed before the arming raises no event: poll once first.
        if let Some(wc) = cq.poll_one() {
            return Ok(wc);
        }
        let mut ready = channel.readable().await?;
        if let Some(ev_cq) = channel.get_ref().get_event_timeout(Duration::ZERO) {
            ev_cq.ack_events(1);
        }
        ready.clear_ready();
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let a = Device::find("127.0.0.1")?.open()?;
    let b = Device::find("127.0.0.1")?.open()?;
    let channel = a.create_comp_channel()?;
    let cq_a = a.create_cq(16, Some(&channel))?;
    let cq_b = b.create_cq(16, None)?;
    let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
    let qp_a = pd_a.qp(QpType::Rc, &cq_a).build()?;
    let qp_b = pd_b.qp(QpType::Rc, &cq_b).build()?;
    let (mr_a, mr_b) = (pd_a.reg_mr(4096, access)?, pd_b.reg_mr(4096, access)?);
    qp_a.connect(1, &qp_b.endpoint(2))?;
    qp_b.connect(2, &qp_a.endpoint(1))?;

    // SAFETY: the channel owns its eventfd for its whole life, and `as_raw_fd` always returns that descriptor, which is what `register` asks of the object it takes over.
    let channel = unsafe { AsyncFd::register(channel) }.map_err(|e| e.to_string())?;
    for i in 0..3u64 {
        mr_a.write(0, &i.to_be_bytes())?;
        qp_a.post_send(&SendWr::write(i, mr_a.sge(0, 8), mr_b.remote().at(8 * i)))?;
        let wc = tokio::time::timeout(Duration::from_secs(10), next_completion(&cq_a, &channel))
            .await??;
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        println!("WRITE {i} completed, awaited");
    }
    let mut got = [0u8; 8];
    mr_b.read(16, &mut got)?;
    assert_eq!(u64::from_be_bytes(got), 2);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

#[test]
fn completions_are_awaited() {
    main().unwrap();
}
