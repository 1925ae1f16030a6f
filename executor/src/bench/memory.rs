//! HBM bandwidth: device copies and memsets.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use sextant_planner::calibration::median;

use super::{check_timing, timed_calls, MemOp, Timing};
use crate::cuda::ffi::{copy_dtod, memset, DevBuf};
use crate::cuda::{context, describe, device, guarded, mem_info, oom_or, out_of_memory};

/// A byte buffer from `stream`'s pool.
pub(super) fn bytes_on(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    ordinal: usize,
    bytes: u64,
    what: &str,
) -> Result<DevBuf, String> {
    let n = usize::try_from(bytes)
        .map_err(|_| format!("{what}: {bytes} bytes do not fit this machine's address space"))?;
    // Uninitialised: every byte is written before it is read, or its value is
    // irrelevant (a copy's or a collective's source: only the traffic is measured).
    DevBuf::alloc(stream, n).map_err(|e| oom_or(e, ctx, ordinal, what, bytes))
}

/// Times a device-to-device copy and a memset of each size on device `ordinal`
/// (two buffers of the largest size, allocated once). Returns (op, bytes, median
/// seconds).
pub fn memory(ordinal: usize, sizes: &[u64], t: Timing) -> Result<Vec<(MemOp, u64, f64)>, String> {
    check_timing(t)?;
    let Some(&max) = sizes.iter().max() else {
        return Err("no buffer size to time".into());
    };
    if sizes.contains(&0) {
        return Err("a buffer size of 0 bytes: give sizes of 1 byte or more".into());
    }
    let need = max.checked_mul(2).ok_or("the buffers' size overflows")?;
    guarded(|| {
        device(ordinal)?;
        let ctx = context(ordinal)?;
        ctx.bind_to_thread().map_err(describe)?;
        let stream = ctx.new_stream().map_err(|e| {
            format!(
                "creating a CUDA stream on device {ordinal}: {}",
                describe(e)
            )
        })?;
        let what = format!("two buffers of {max} bytes (copy source and destination)");
        let (free, _) = mem_info(&ctx, ordinal)?;
        if need > free {
            return Err(out_of_memory(&ctx, ordinal, &what, need));
        }
        let src = bytes_on(&ctx, &stream, ordinal, max, &what)?;
        let dst = bytes_on(&ctx, &stream, ordinal, max, &what)?;
        let (ps, pd) = (src.span(), dst.span());
        memset(&stream, ps, 0x3c, max).map_err(describe)?;
        let mut out = Vec::with_capacity(2 * sizes.len());
        for &bytes in sizes {
            for op in [MemOp::Copy, MemOp::Memset] {
                let secs = timed_calls(&[(&ctx, &stream)], t, || {
                    // Both buffers hold `max >= bytes` bytes and live on `stream`.
                    match op {
                        MemOp::Copy => copy_dtod(&stream, pd, ps, bytes),
                        MemOp::Memset => memset(&stream, pd, 0, bytes),
                    }
                    .map_err(|e| format!("{} of {bytes} bytes: {}", op.label(), describe(e)))
                })?;
                out.push((op, bytes, median(&secs).unwrap_or(0.0)));
            }
        }
        stream.synchronize().map_err(describe)?;
        Ok(out)
    })
}
