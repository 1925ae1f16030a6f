//! Copies between two GPUs, with peer access where the devices allow it.

use std::sync::Arc;

use cudarc::driver::{sys as drv_sys, CudaContext};
use sextant_planner::calibration::median;

use super::{check_timing, timed_calls, PeerTimes, Timing};
use crate::cuda::ffi::{self, copy_peer, PlainBuf};
use crate::cuda::{
    bind, context, describe, device, driver, driver_call, guarded, host_size, mem_info, new_stream,
    oom_or, out_of_memory,
};
use crate::error::{BenchError, CudaError};

/// A `cuMemAlloc` buffer of `bytes` on `ctx`'s device (see [`PlainBuf`]).
fn plain_buf(
    ctx: &Arc<CudaContext>,
    ordinal: usize,
    bytes: u64,
    what: &str,
) -> Result<PlainBuf, CudaError> {
    bind(ctx)?;
    let n = host_size(bytes, what)?;
    PlainBuf::new(ctx, n).map_err(|e| oom_or(e, ctx, ordinal, what, bytes))
}

/// Enables access from `ctx` to `peer`'s memory when the devices allow it; says
/// whether it is on.
pub(super) fn enable_peer(
    ctx: &Arc<CudaContext>,
    peer: &Arc<CudaContext>,
) -> Result<bool, CudaError> {
    let can = ffi::can_access_peer(ctx, peer).map_err(driver_call("cuDeviceCanAccessPeer"))?;
    if !can {
        return Ok(false);
    }
    bind(ctx)?;
    match ffi::enable_peer_access(peer) {
        Ok(()) => Ok(true),
        Err(e) if e.0 == drv_sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
        Err(e) => Err(driver_call("cuCtxEnablePeerAccess")(e)),
    }
}

/// Times `cuMemcpyPeerAsync` of each size from device `a` to device `b` and back,
/// each on the source's stream, with peer access enabled where the devices allow
/// it (otherwise the driver stages the copy through the host).
pub fn peer_copies(a: usize, b: usize, sizes: &[u64], t: Timing) -> Result<PeerTimes, BenchError> {
    check_timing(t)?;
    if a == b {
        return Err(BenchError::SameDevice(a));
    }
    let Some(&max) = sizes.iter().max() else {
        return Err(BenchError::NoCopySize);
    };
    if sizes.contains(&0) {
        return Err(BenchError::ZeroCopy);
    }
    guarded(|| {
        device(a)?;
        device(b)?;
        let (ca, cb) = (context(a)?, context(b)?);
        let stream = |ctx: &Arc<CudaContext>, o: usize| {
            bind(ctx)?;
            new_stream(ctx, o)
        };
        let (sa, sb) = (stream(&ca, a)?, stream(&cb, b)?);
        let peer_access = [enable_peer(&ca, &cb)?, enable_peer(&cb, &ca)?];
        let what = format!("a peer-copy buffer of {max} bytes");
        for (ctx, o) in [(&ca, a), (&cb, b)] {
            let (free, _) = mem_info(ctx, o)?;
            if max > free {
                return Err(out_of_memory(ctx, o, &what, max).into());
            }
        }
        let (ba, bb) = (
            plain_buf(&ca, a, max, &what)?,
            plain_buf(&cb, b, max, &what)?,
        );
        let mut points = Vec::with_capacity(2 * sizes.len());
        for (src, dst, cs, cd, s, ps, pd) in [
            (a, b, &ca, &cb, &sa, ba.span(), bb.span()),
            (b, a, &cb, &ca, &sb, bb.span(), ba.span()),
        ] {
            for &bytes in sizes {
                let secs = timed_calls(&[(cs, s)], t, || {
                    // Both buffers hold `max >= bytes` bytes and outlive the copies.
                    copy_peer(s, (cd, pd), (cs, ps), bytes).map_err(|e| BenchError::PeerCopy {
                        bytes,
                        src,
                        dst,
                        status: describe(e),
                    })
                })?;
                points.push((src, dst, bytes, median(&secs).unwrap_or(0.0)));
            }
            s.synchronize().map_err(driver)?;
        }
        Ok(PeerTimes {
            peer_access,
            points,
        })
    })
}
