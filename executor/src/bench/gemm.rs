//! BF16 cuBLAS GEMMs over shapes, operands allocated once at the largest shape.

use sextant_planner::calibration::median;

use super::{check_timing, gemm_bytes, timed_calls, GemmShape, GemmTimes, Timing};
use crate::cuda::{
    alloc_bf16, bf16_gemm, bind, blas_version, colmajor_args, context, device, driver, fill,
    fill_pattern, guarded, mem_info, new_blas, new_stream, out_of_memory, DevSpan, FILL_ELEMS,
};
use crate::culibs::Lib;
use crate::cuload::ensure;
use crate::error::{BenchError, CudaError};

/// Times BF16 GEMMs (`cublasGemmEx`, or `cublasGemmStridedBatchedEx` for a batch;
/// FP32 accumulation, the default algorithm) of every shape on device `ordinal`.
/// The operands are allocated once at the largest shape's sizes and filled with
/// small pseudo-random values (all-zero data would run the tensor cores at lower
/// power than training does).
pub fn gemms(ordinal: usize, shapes: &[GemmShape], t: Timing) -> Result<GemmTimes, BenchError> {
    check_timing(t)?;
    if shapes.is_empty() {
        return Err(BenchError::NoShape);
    }
    let (mut na, mut nb, mut nc) = (0u64, 0u64, 0u64);
    for s in shapes {
        let what = format!(
            "GEMM '{}' {}x{}x{} (batch {})",
            s.class, s.m, s.n, s.k, s.batch
        );
        if let Err(error) = colmajor_args(s.m, s.n, s.k) {
            return Err(BenchError::Gemm {
                gemm: what,
                error: Box::new(error),
            });
        }
        if s.batch == 0 || s.batch > i32::MAX as u64 {
            return Err(BenchError::GemmBatch { gemm: what });
        }
        let Some((a, b, c)) = s.elems().filter(|_| gemm_bytes(s.m, s.n, s.k).is_some()) else {
            return Err(BenchError::GemmOverflow { gemm: what });
        };
        (na, nb, nc) = (na.max(a), nb.max(b), nc.max(c));
    }
    let total = (na + nb)
        .checked_add(nc)
        .and_then(|e| e.checked_mul(2))
        .filter(|&b| usize::try_from(b).is_ok())
        .ok_or(BenchError::OperandsOverflow)?;
    guarded(|| {
        device(ordinal)?;
        ensure(Lib::Cublas).map_err(CudaError::from)?;
        let ctx = context(ordinal)?;
        bind(&ctx)?;
        let stream = new_stream(&ctx, ordinal)?;
        let blas = new_blas(&stream, ordinal)?;
        let cublas_version = blas_version(&blas)?;
        let what = "the GEMM operands at the largest shapes (A, B and C)";
        let (free, _) = mem_info(&ctx, ordinal)?;
        if total > free {
            return Err(out_of_memory(&ctx, ordinal, what, total).into());
        }
        let pattern = fill_pattern(FILL_ELEMS.min(na.max(nb) as usize));
        let mut a = alloc_bf16(&ctx, &stream, ordinal, na as usize, what)?;
        let mut b = alloc_bf16(&ctx, &stream, ordinal, nb as usize, what)?;
        let c = alloc_bf16(&ctx, &stream, ordinal, nc as usize, what)?;
        fill(&stream, &mut a, &pattern)?;
        fill(&stream, &mut b, &pattern)?;
        // Addresses, taken once: the buffers outlive every call, all on `stream`.
        let (pa, pb, pc) = (
            DevSpan::of(&a, &stream),
            DevSpan::of(&b, &stream),
            DevSpan::of(&c, &stream),
        );
        let mut points = Vec::with_capacity(shapes.len());
        for s in shapes {
            let shape = format!("the GEMM {}x{}x{} (batch {})", s.m, s.n, s.k, s.batch);
            let secs = timed_calls(&[(&ctx, &stream)], t, || {
                bf16_gemm(&blas, (s.m, s.n, s.k), s.batch, (pa, pb, pc)).map_err(|error| {
                    BenchError::Gemm {
                        gemm: shape.clone(),
                        error: Box::new(error),
                    }
                })
            })?;
            points.push((s.clone(), median(&secs).unwrap_or(0.0)));
        }
        stream.synchronize().map_err(driver)?;
        Ok(GemmTimes {
            points,
            cublas_version,
        })
    })
}
