//! The checks before the timed steps: every communicator sums known data, and every
//! distinct GEMM shape's result is compared with the host's on sampled entries.

use std::collections::BTreeMap;

use sextant_planner::ranks::GroupKind;

use super::{alloc, DeviceJob, Gpu, GEMM_TOLERANCE};
use crate::cuda::ffi::nccl::Elem;
use crate::cuda::ffi::{copy_dtoh, copy_htod};
use crate::cuda::{bf16_gemm, driver, driver_call, nccl_failed, nccl_group, Comm, DevSpan};
use crate::error::{CudaError, DeviceError};
use crate::record::Checks;
use crate::trace::Op;
use sextant_planner::walk::OpClass;

/// Every communicator (the world's first, then one per group kind) sums its members'
/// `rank + 1` in FP32, all of them in one NCCL group: a rank split into the wrong
/// group gives a wrong sum here rather than a wrong timing later.
pub(super) fn check_communicators(
    gpu: &Gpu,
    job: &DeviceJob,
    checks: &mut Checks,
) -> Result<(), DeviceError> {
    let comms: Vec<&Comm> = std::iter::once(&gpu.comms.world)
        .chain(&gpu.comms.kinds)
        .collect();
    let n = comms.len() as u64;
    let buf = alloc(
        &gpu.ctx,
        &gpu.stream,
        gpu.ordinal,
        2 * n * 4,
        "the communicator check",
    )?;
    let stream = &gpu.stream;
    // One float per communicator each way: sent from the first n, received into the
    // last n.
    let floats = |i: u64, count: u64| {
        buf.span()
            .at(4 * i, 4 * count)
            .ok_or(DeviceError::CommCheckBuffer(i))
    };
    let failed = |e| DeviceError::CommCheck(driver(e));
    let mine = vec![(job.rank + 1) as f32; n as usize];
    copy_htod(stream, buf.span(), &mine).map_err(failed)?;
    nccl_group::<DeviceError>("checking the communicators", || {
        for (i, comm) in comms.iter().enumerate() {
            let i = i as u64;
            comm.all_reduce((floats(i, 1)?, floats(n + i, 1)?), 1, Elem::F32, stream)
                .map_err(|e| DeviceError::CommCheck(nccl_failed("ncclAllReduce", Some(comm))(e)))?;
        }
        Ok(())
    })?;
    let mut got = vec![0f32; n as usize];
    copy_dtoh(stream, &mut got, floats(n, n)?).map_err(failed)?;
    gpu.stream.synchronize().map_err(failed)?;
    for (i, g) in got.iter().enumerate() {
        let (kind, members): (&str, Vec<u64>) = match i {
            0 => ("world", (0..job.map.world_size).collect()),
            _ => {
                let k = GroupKind::ALL[i - 1];
                (k.name(), job.map.group_of(job.rank, k).to_vec())
            }
        };
        let want = members.iter().map(|q| q + 1).sum::<u64>() as f32;
        if *g != want {
            return Err(DeviceError::CommSum {
                kind,
                rank: job.rank,
                got: *g,
                members,
                want,
            });
        }
    }
    checks.collectives += n;
    Ok(())
}

/// A BF16 value of the fill pattern as f64.
pub(super) fn pattern_value(pattern: &[u16], index: u64) -> f64 {
    let h = pattern[(index % pattern.len() as u64) as usize];
    f64::from(f32::from_bits(u32::from(h) << 16))
}

/// Runs each distinct GEMM shape of the program once on the scratch operands, which
/// then hold only the fill pattern, and compares sampled entries of C (first and
/// last product of a batch, corners and middle) with the same sums on the host: a
/// wrong leading dimension, stride or operand order shows here.
pub(super) fn check_gemms(
    gpu: &Gpu,
    program: &[Op],
    (a, b, c): (DevSpan, DevSpan, DevSpan),
    pattern: &[u16],
    checks: &mut Checks,
) -> Result<(), DeviceError> {
    let mut shapes: BTreeMap<(u64, u64, u64, u64), OpClass> = BTreeMap::new();
    for op in program {
        if let Op::Gemm {
            class,
            m,
            n,
            k,
            batch,
            ..
        } = *op
        {
            shapes.entry((m, n, k, batch)).or_insert(class);
        }
    }
    for (&(m, n, k, batch), class) in &shapes {
        let shape = format!("the {class} GEMM {m}x{n}x{k} (batch {batch})");
        let failed = |error: CudaError| DeviceError::GemmCheck {
            gemm: shape.clone(),
            error: Box::new(error),
        };
        bf16_gemm(&gpu.blas, (m, n, k), batch, (a, b, c)).map_err(failed)?;
        let mut at: Vec<(u64, u64, u64)> = Vec::new();
        for q in [0, batch - 1] {
            for (r, col) in [(0, 0), (m - 1, n - 1), (m / 2, n / 3), (m - 1, 0)] {
                if !at.contains(&(q, r, col)) {
                    at.push((q, r, col));
                }
            }
        }
        let mut got = vec![0u16; at.len()];
        for (&(q, r, col), g) in at.iter().zip(got.chunks_mut(1)) {
            let offset = 2 * (q * m * n + r * n + col);
            // One element of C (row-major m x n per product) into `g`.
            let at = c
                .at(offset, 2)
                .ok_or_else(|| DeviceError::GemmResultPastScratch {
                    gemm: shape.clone(),
                })?;
            copy_dtoh(&gpu.stream, g, at)
                .map_err(|e| failed(driver_call("reading its result")(e)))?;
        }
        gpu.stream.synchronize().map_err(|e| failed(driver(e)))?;
        for (&(q, r, col), &g) in at.iter().zip(&got) {
            let (mut want, mut scale) = (0f64, 0f64);
            for p in 0..k {
                let x = pattern_value(pattern, q * m * k + r * k + p)
                    * pattern_value(pattern, q * k * n + p * n + col);
                want += x;
                scale += x.abs();
            }
            let got = f64::from(f32::from_bits(u32::from(g) << 16));
            let rel = (got - want).abs() / scale.max(f64::MIN_POSITIVE);
            if rel.is_nan() || rel > GEMM_TOLERANCE {
                return Err(DeviceError::GemmMismatch {
                    gemm: shape,
                    at: (q, r, col),
                    got,
                    want,
                    rel,
                    tolerance: GEMM_TOLERANCE,
                });
            }
            checks.max_rel_error = checks.max_rel_error.max(rel);
        }
        checks.gemm_results += 1;
    }
    Ok(())
}
