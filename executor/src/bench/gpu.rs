//! (`--features cuda`) What every benchmark shares on the GPU: the device's
//! description, the libraries' files, and [`timed_calls`], the one timing loop.

use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{result as drv, sys as drv_sys, CudaContext, CudaStream};

use crate::cuda::ffi;
use crate::cuda::{
    bind, close_gate, describe, device, driver, guarded, query_failed, timing_event, GATE_BATCH,
};
use crate::culibs::Lib;
use crate::cuload::ensure;
use crate::error::{BenchError, CudaError};

use super::{DeviceInfo, Timing};

/// Name, memory, SMs and compute capability of device `ordinal`, the number of
/// devices, and the driver's CUDA version. Creates no context.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo, BenchError> {
    guarded(|| {
        let dev = device(ordinal)?;
        let name = drv::device::get_name(dev).map_err(|e| query_failed("the name", ordinal, e))?;
        let total = ffi::total_mem(dev).map_err(|e| query_failed("the memory", ordinal, e))?;
        let attr = |a: drv_sys::CUdevice_attribute| {
            ffi::attribute(dev, a).map_err(|e| query_failed(&format!("{a:?}"), ordinal, e))
        };
        use drv_sys::CUdevice_attribute as A;
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let visible = drv::device::get_count().map_err(|e| CudaError::Count(describe(e)))?;
        let version = ffi::driver_version().map_err(|e| CudaError::DriverVersion(describe(e)))?;
        Ok(DeviceInfo {
            name,
            memory_bytes: total as u64,
            sms: sms.max(0) as u64,
            compute_capability: (major, minor),
            visible: visible.max(0) as u64,
            cuda_version: version,
        })
    })
}

/// Where each library in `libs` was loaded from (`None`: by name, through the
/// system loader). Loads what is not loaded yet.
pub fn library_files(libs: &[Lib]) -> Result<Vec<(Lib, Option<PathBuf>)>, BenchError> {
    libs.iter()
        .map(|&l| Ok((l, ensure(l).map_err(CudaError::from)?)))
        .collect()
}

/// Times `issue` (which queues one call on every stream of `streams`): `warmup`
/// untimed calls, then `iters` calls, each between a pair of events on every
/// stream, queued behind a host gate on every stream in batches of [`GATE_BATCH`].
/// Returns, per timed call, the slowest stream's seconds.
pub(super) fn timed_calls(
    streams: &[(&Arc<CudaContext>, &Arc<CudaStream>)],
    t: Timing,
    mut issue: impl FnMut() -> Result<(), BenchError>,
) -> Result<Vec<f64>, BenchError> {
    for _ in 0..t.warmup {
        issue()?;
    }
    for (_, s) in streams {
        s.synchronize().map_err(driver)?;
    }
    let n = t.iters as usize;
    let mut events = Vec::with_capacity(streams.len());
    for (ctx, _) in streams {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push((timing_event(ctx)?, timing_event(ctx)?));
        }
        events.push(v);
    }
    let mut i = 0;
    while i < n {
        let mut gates = Vec::with_capacity(streams.len());
        for (ctx, s) in streams {
            bind(ctx)?;
            gates.push(close_gate(s)?);
        }
        let stop = (i + GATE_BATCH as usize).min(n);
        while i < stop {
            for (j, (_, s)) in streams.iter().enumerate() {
                events[j][i].0.record(s).map_err(driver)?;
            }
            issue()?;
            for (j, (_, s)) in streams.iter().enumerate() {
                events[j][i].1.record(s).map_err(driver)?;
            }
            i += 1;
        }
        drop(gates);
    }
    for (_, s) in streams {
        s.synchronize().map_err(driver)?;
    }
    let mut secs = vec![0.0f64; n];
    for per_stream in &events {
        for (k, (a, b)) in per_stream.iter().enumerate() {
            let x = a.elapsed_ms(b).map_err(driver)? as f64 / 1e3;
            secs[k] = secs[k].max(x);
        }
    }
    Ok(secs)
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    fn t(iters: u32) -> Timing {
        Timing { warmup: 1, iters }
    }

    fn shape(m: u64, n: u64, k: u64) -> GemmShape {
        GemmShape {
            class: "sweep".into(),
            m,
            n,
            k,
            batch: 1,
        }
    }

    #[test]
    fn bench_bad_arguments_are_errors_before_any_library_call() {
        let e = |r: Result<GemmTimes, BenchError>| r.unwrap_err().to_string();
        assert!(e(gemms(0, &[shape(8, 8, 8)], t(0))).contains("use 1 to 10000 timed calls"));
        assert!(e(gemms(0, &[], t(1))).contains("no GEMM shape"));
        assert!(e(gemms(0, &[shape(0, 8, 8)], t(1))).contains("outside cuBLAS's range"));
        assert!(e(gemms(0, &[shape(1 << 32, 8, 8)], t(1))).contains("outside cuBLAS's range"));
        assert!(e(gemms(
            0,
            &[shape(2_000_000_000, 2_000_000_000, 2_000_000_000)],
            t(1)
        ))
        .contains("overflows"));
        let mut batched = shape(8, 8, 8);
        batched.batch = 0;
        assert!(e(gemms(0, &[batched], t(1))).contains("batch"));
        let m = |s: &[u64]| memory(0, s, t(1)).unwrap_err().to_string();
        assert!(m(&[]).contains("no buffer size"));
        assert!(m(&[0, 8]).contains("0 bytes"));
        let c = |o: &[usize], s: &[u64]| {
            collectives(o, &[CollOp::AllReduce], s, t(1))
                .unwrap_err()
                .to_string()
        };
        assert!(c(&[0, 0], &[1024]).contains("repeat one"));
        assert!(c(&[0, 1], &[1026]).contains("a positive multiple of 4 bytes"));
        assert!(c(&[0], &[0]).contains("positive multiple of 2 bytes"));
        let p = |a, s: &[u64]| peer_copies(a, 1, s, t(1)).unwrap_err().to_string();
        assert!(p(1, &[8]).contains("two devices"));
        assert!(p(0, &[0]).contains("0 bytes"));
    }

    #[test]
    fn bench_sizes_follow_nccl_tests() {
        assert_eq!(CollOp::AllReduce.sides(1024, 4), (1024, 1024));
        assert_eq!(CollOp::AllGather.sides(1024, 4), (256, 1024));
        assert_eq!(CollOp::ReduceScatter.sides(1024, 4), (1024, 256));
        assert_eq!(gemm_bytes(2, 3, 4), Some(2 * (8 + 12 + 6)));
        assert_eq!(gemm_bytes(u64::MAX, 2, 2), None);
        let mut s = shape(2, 3, 4);
        s.batch = 5;
        assert_eq!(s.elems(), Some((40, 60, 30)));
    }

    /// Without a driver every benchmark is one line naming what was looked for.
    #[test]
    fn bench_without_driver_is_one_line() {
        if ffi::driver_present() {
            return;
        }
        let no_driver = |e: BenchError| crate::cuda::tests::no_driver::<(), _>(&Err(e));
        assert!(no_driver(device_info(0).unwrap_err()));
        assert!(no_driver(gemms(0, &[shape(64, 64, 64)], t(2)).unwrap_err()));
        assert!(no_driver(memory(0, &[1024], t(2)).unwrap_err()));
        assert!(no_driver(
            collectives(&[0], &[CollOp::AllGather], &[1024], t(2)).unwrap_err()
        ));
        assert!(no_driver(peer_copies(0, 1, &[1024], t(2)).unwrap_err()));
    }
}
