//! NCCL collectives over local GPUs, driven from one thread with group calls.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use sextant_planner::calibration::median;

use super::memory::bytes_on;
use super::{check_timing, timed_calls, CollOp, CollTimes, Timing};
use crate::cuda::ffi::nccl::{self, Elem};
use crate::cuda::{
    bind, context, device, driver, guarded, mem_info, nccl_describe, nccl_failed, nccl_group,
    nccl_loaded, new_stream, out_of_memory, Comm,
};
use crate::error::{BenchError, CudaError};

/// Times each collective at each size over one NCCL communicator of the devices in
/// `ordinals` (one rank each), all driven from this thread with group calls (NCCL's
/// way to manage several GPUs from one thread). On one device this is NCCL's
/// one-rank path: a copy within the device, with no link crossed. `bytes` must be
/// a whole number of BF16 elements on every rank.
pub fn collectives(
    ordinals: &[usize],
    ops: &[CollOp],
    sizes: &[u64],
    t: Timing,
) -> Result<CollTimes, BenchError> {
    check_timing(t)?;
    let n = ordinals.len() as u64;
    if ordinals.is_empty() || ops.is_empty() || sizes.is_empty() {
        return Err(BenchError::NoCollective);
    }
    if (1..ordinals.len()).any(|i| ordinals[..i].contains(&ordinals[i])) || n > i32::MAX as u64 {
        return Err(BenchError::RepeatedDevice(ordinals.to_vec()));
    }
    for &b in sizes {
        if b == 0 || b % (2 * n) != 0 || b.checked_mul(2).is_none() {
            return Err(BenchError::CollectiveSize { bytes: b, gpus: n });
        }
    }
    guarded(|| {
        for &o in ordinals {
            device(o)?;
        }
        nccl_loaded()?;
        let nccl_version = nccl::get_nccl_version().map_err(nccl_failed("ncclGetVersion", None))?;
        let mut gpus = Vec::with_capacity(ordinals.len());
        for &o in ordinals {
            let ctx = context(o)?;
            bind(&ctx)?;
            let stream = new_stream(&ctx, o)?;
            gpus.push((o, ctx, stream));
        }
        let mut comms = open_comms(&gpus)?;
        let streams: Vec<(&Arc<CudaContext>, &Arc<CudaStream>)> =
            gpus.iter().map(|(_, c, s)| (c, s)).collect();
        let mut points = Vec::with_capacity(ops.len() * sizes.len());
        for &op in ops {
            for &bytes in sizes {
                let (send, recv) = op.sides(bytes, n);
                let what = format!(
                    "the {} buffers of {bytes} bytes ({send} bytes sent and {recv} received per GPU)",
                    op.label()
                );
                let mut bufs = Vec::with_capacity(gpus.len());
                for (o, ctx, stream) in &gpus {
                    let (free, _) = mem_info(ctx, *o)?;
                    if send + recv > free {
                        return Err(out_of_memory(ctx, *o, &what, send + recv).into());
                    }
                    let s = bytes_on(ctx, stream, *o, send, &what)?;
                    let r = bytes_on(ctx, stream, *o, recv, &what)?;
                    bufs.push((s, r));
                }
                let call = format!("nccl {} of {bytes} bytes on {n} GPUs", op.label());
                let secs = timed_calls(&streams, t, || {
                    nccl_group::<BenchError>(&call, || {
                        for (r, (_, ctx, stream)) in gpus.iter().enumerate() {
                            bind(ctx)?;
                            let (ps, pr) = (bufs[r].0.span(), bufs[r].1.span());
                            let comm = &comms[r];
                            // The buffers hold what `sides` says, on this
                            // communicator's device, and live until after the timing.
                            match op {
                                CollOp::AllReduce => comm.all_reduce(
                                    (ps, pr),
                                    (send / 2) as usize,
                                    Elem::Bf16,
                                    stream,
                                ),
                                CollOp::AllGather => comm.all_gather(
                                    (ps, pr),
                                    (send / 2) as usize,
                                    Elem::Bf16,
                                    stream,
                                ),
                                CollOp::ReduceScatter => comm.reduce_scatter(
                                    (ps, pr),
                                    (recv / 2) as usize,
                                    Elem::Bf16,
                                    stream,
                                ),
                            }
                            .map(|_| ())
                            .map_err(|e| BenchError::Collective {
                                op: op.label(),
                                bytes,
                                gpus: n,
                                rank: r,
                                status: nccl_describe(&e, Some(comm)),
                            })?;
                        }
                        Ok(())
                    })
                })?;
                points.push((op, bytes, median(&secs).unwrap_or(0.0)));
                for (_, _, s) in &gpus {
                    s.synchronize().map_err(driver)?;
                }
                drop(bufs);
            }
        }
        for (c, (_, _, s)) in comms.iter_mut().zip(&gpus) {
            c.finish(s)?;
        }
        Ok(CollTimes {
            points,
            nccl_version,
        })
    })
}

/// One NCCL communicator over `gpus` (rank r on the r-th), made in one group;
/// whatever was made is aborted on an early exit (before the caller's streams go).
fn open_comms(
    gpus: &[(usize, Arc<CudaContext>, Arc<CudaStream>)],
) -> Result<Vec<Comm>, BenchError> {
    let n = gpus.len() as u64;
    let id = nccl::get_uniqueid().map_err(nccl_failed("ncclGetUniqueId", None))?;
    // Whatever was made is aborted on an early exit (before the streams go).
    let mut comms: Vec<Comm> = Vec::with_capacity(gpus.len());
    let made = nccl_group::<CudaError>("creating the NCCL communicators", || {
        for (r, (o, ctx, _)) in gpus.iter().enumerate() {
            bind(ctx)?;
            Comm::init_rank(n, id, r as u64, &mut comms).map_err(|e| CudaError::NcclInit {
                rank: r as u64,
                ranks: n,
                device: Some(*o),
                status: nccl_describe(&e, None),
            })?;
        }
        Ok(())
    });
    made?;
    if comms.len() != gpus.len() {
        return Err(BenchError::Communicators {
            made: comms.len(),
            wanted: gpus.len(),
        });
    }
    Ok(comms)
}
