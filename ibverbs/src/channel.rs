//! Completion channels: `ibv_create_comp_channel`, `ibv_destroy_comp_channel`.

use core::ffi::c_int;

use crate::abi::*;
use crate::device::ctx_of;
use crate::errno_of;
use crate::objects::*;

/// `ibv_create_comp_channel`: its `fd` is readable while an event is pending.
///
/// # Safety
/// `context` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    if context.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: `context` came from this library's ibv_open_device and is not closed (verbs forbids using a closed context), so it is the context of a live Ctx.
    let c = unsafe { ctx_of(context) };
    match c.ctx.create_comp_channel() {
        Ok(ch) => Channel::into_raw(
            ibv_comp_channel {
                context,
                fd: ch.fd(),
                refcnt: 0,
            },
            ChannelInner { ch },
        ),
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ibv_destroy_comp_channel`: EBUSY while CQs use it.
///
/// # Safety
/// `channel` is live and not used again on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if channel.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `channel` is a channel of this library the program has not destroyed.
        let ch = unsafe { ch_of(channel) };
        if ch.ch.in_use() {
            log::debug!("ibv_destroy_comp_channel: CQs still use the channel");
            return libc::EBUSY;
        }
        // SAFETY: no CQ uses the channel (checked above), so nothing of ferroce refers to it, and the program gives up `channel` with this call.
        unsafe { Channel::free(channel) };
        0
    })())
}
