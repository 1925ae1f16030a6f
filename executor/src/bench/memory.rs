//! HBM bandwidth: device copies and memsets.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use sextant_planner::calibration::median;

use super::{check_timing, timed_calls, MemOp, Timing};
use crate::cuda::ffi::{copy_dtod, memset, DevBuf};
use crate::cuda::{
    bind, context, describe, device, driver, guarded, host_size, mem_info, new_stream, oom_or,
    out_of_memory,
};
use crate::error::{BenchError, CudaError};

/// A byte buffer from `stream`'s pool.
pub(super) fn bytes_on(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    ordinal: usize,
    bytes: u64,
    what: &str,
) -> Result<DevBuf, CudaError> {
    let n = host_size(bytes, what)?;
    // Uninitialised: every byte is written before it is read, or its value is
    // irrelevant (a copy's or a collective's source: only the traffic is measured).
    DevBuf::alloc(stream, n).map_err(|e| oom_or(e, ctx, ordinal, what, bytes))
}

/// Times a device-to-device copy and a memset of each size on device `ordinal`
/// (two buffers of the largest size, allocated once). Returns (op, bytes, median
/// seconds).
pub fn memory(
    ordinal: usize,
    sizes: &[u64],
    t: Timing,
) -> Result<Vec<(MemOp, u64, f64)>, BenchError> {
    check_timing(t)?;
    let Some(&max) = sizes.iter().max() else {
        return Err(BenchError::NoBufferSize);
    };
    if sizes.contains(&0) {
        return Err(BenchError::ZeroBuffer);
    }
    let need = max.checked_mul(2).ok_or(BenchError::BuffersOverflow)?;
    guarded(|| {
        device(ordinal)?;
        let ctx = context(ordinal)?;
        bind(&ctx)?;
        let stream = new_stream(&ctx, ordinal)?;
        let what = format!("two buffers of {max} bytes (copy source and destination)");
        let (free, _) = mem_info(&ctx, ordinal)?;
        if need > free {
            return Err(out_of_memory(&ctx, ordinal, &what, need).into());
        }
        let src = bytes_on(&ctx, &stream, ordinal, max, &what)?;
        let dst = bytes_on(&ctx, &stream, ordinal, max, &what)?;
        let (ps, pd) = (src.span(), dst.span());
        memset(&stream, ps, 0x3c, max).map_err(driver)?;
        let mut out = Vec::with_capacity(2 * sizes.len());
        for &bytes in sizes {
            for op in [MemOp::Copy, MemOp::Memset] {
                let secs = timed_calls(&[(&ctx, &stream)], t, || {
                    // Both buffers hold `max >= bytes` bytes and live on `stream`.
                    match op {
                        MemOp::Copy => copy_dtod(&stream, pd, ps, bytes),
                        MemOp::Memset => memset(&stream, pd, 0, bytes),
                    }
                    .map_err(|e| BenchError::Memory {
                        op: op.label(),
                        bytes,
                        status: describe(e),
                    })
                })?;
                out.push((op, bytes, median(&secs).unwrap_or(0.0)));
            }
        }
        stream.synchronize().map_err(driver)?;
        Ok(out)
    })
}
