//! The CUDA backend's device layer: probing a GPU and its free memory, and what the
//! device program ([`crate::device`]) and the microbenchmarks ([`crate::bench`])
//! share (loading, cuBLAS handles, NCCL groups and communicators, host gates,
//! events). Built on cudarc with dynamic loading, so a build with
//! `--features cuda` needs no CUDA toolkit and starts on machines without a GPU.
//!
//! # Missing libraries never panic
//!
//! cudarc opens `libcuda` and `libcublas` lazily, on the first call into each, and
//! panics when none of its candidate file names opens (`panic_no_lib_found`) or when
//! an opened library lacks a symbol ("Missing symbol"). Every public function here
//! therefore does two things:
//!
//! 1. Before the first call into a library it calls [`crate::cuload::ensure`], which
//!    finds the library where current stacks put it ([`crate::culibs`]: CUDA 13 and
//!    12 names, NVIDIA's pip wheels in the active Python environment, `CUDA_HOME`,
//!    `LD_LIBRARY_PATH`), opens it so that cudarc's own loader finds it, and
//!    otherwise returns one line naming the files and directories it tried. NCCL is
//!    called through [`crate::cuload::nccl`], bound to the file found.
//! 2. As a backstop for what that cannot foresee (a library that loads but lacks a
//!    symbol, a cudarc `expect` in a destructor), the whole body runs inside
//!    `std::panic::catch_unwind` and a caught panic becomes an `Err` carrying its
//!    message. So that such a panic prints nothing (no backtrace), the panic hook is
//!    wrapped once per process: it stays silent only on a thread that is inside one
//!    of these calls and hands every other panic to the hook it wrapped.
//!
//! This needs `panic = "unwind"` (the default; the workspace does not change it).
//!
//! A driver that loads but has no usable device (no GPU, `CUDA_VISIBLE_DEVICES=""`,
//! the toolkit's stub `libcuda.so`) is reported by what `cuInit` returned.
//!
//! # No `unsafe` here
//!
//! Every raw call into the driver, cuBLAS and NCCL, and the opening of the
//! libraries, is in [`ffi`] behind safe functions and types that own their handles
//! and check device buffers' extents; this module and the rest of the backend hold
//! no `unsafe`.
//!
//! # Data layout and timing
//!
//! GEMMs are row-major `C[m,n] = A[m,k] · B[k,n]` in BF16 with FP32 accumulation,
//! stated to column-major cuBLAS as `Cᵀ = Bᵀ·Aᵀ` (see [`colmajor_args`]). Inputs are
//! filled with small pseudo-random BF16 values (a 2 MiB host pattern copied over the
//! buffer): all-zero data would run the tensor cores at lower power than training
//! does and overstate throughput.

pub(crate) mod ffi;

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use crate::culibs::Lib;
use crate::cuload::ensure;
use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError,
};
use ffi::nccl;
pub(crate) use ffi::nccl::Comm;
pub(crate) use ffi::{Blas, DevSpan, Gate, Pool, PoolBytes};

/// The oldest driver the backend runs on, as `cuDriverGetVersion` says it: CUDA 12.8.
pub const MIN_DRIVER: c_int = 12080;
/// Timed calls queued behind one host gate (see [`Gate`]); well under the driver's
/// launch-queue depth.
pub(crate) const GATE_BATCH: u32 = 64;
/// How long a gate holds its stream at most, should the host never release it.
const GATE_TIMEOUT: Duration = Duration::from_secs(5);
/// Elements of the host fill pattern (2 MiB of BF16).
pub(crate) const FILL_ELEMS: usize = 1 << 20;
pub(crate) const GIB: f64 = (1u64 << 30) as f64;

/// The device's name, memory and SM count, e.g.
/// `"NVIDIA H100 80GB HBM3 (79.1 GiB, 132 SMs)"`. Creates no context.
pub fn probe(ordinal: usize) -> Result<String, String> {
    guarded(|| {
        let dev = device(ordinal)?;
        let name = drv::device::get_name(dev)
            .map_err(|e| format!("reading the name of CUDA device {ordinal}: {}", describe(e)))?;
        let total = ffi::total_mem(dev).map_err(|e| {
            format!(
                "reading the memory size of CUDA device {ordinal}: {}",
                describe(e)
            )
        })?;
        let sms = ffi::attribute(
            dev,
            drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(|e| {
            format!(
                "reading the SM count of CUDA device {ordinal}: {}",
                describe(e)
            )
        })?;
        Ok(format!("{name} ({:.1} GiB, {sms} SMs)", total as f64 / GIB))
    })
}

/// `(free, total)` bytes on the device (`cuMemGetInfo` in the device's primary
/// context, which this retains for the call).
pub fn free_memory(ordinal: usize) -> Result<(u64, u64), String> {
    guarded(|| {
        device(ordinal)?;
        let ctx = context(ordinal)?;
        mem_info(&ctx, ordinal)
    })
}

/// A new NCCL unique id (128 bytes) for rank 0 to hand to the other ranks.
pub fn nccl_unique_id() -> Result<Vec<u8>, String> {
    guarded(|| {
        nccl_loaded()?;
        let id = nccl::get_uniqueid()
            .map_err(|e| format!("ncclGetUniqueId failed: {}", nccl_describe(&e, None)))?;
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    })
}

thread_local! {
    /// Set while this thread runs a [`guarded`] body: its panics are caught and
    /// reported as the `Err`, so the panic hook stays quiet about them.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Wraps the panic hook in place at first use, once per process: panics on a thread
/// inside [`guarded`] are not printed; every other panic goes to the wrapped hook
/// unchanged, so other threads keep their messages.
fn install_quiet_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.try_with(|q| q.get()).unwrap_or(false) {
                prev(info)
            }
        }));
    });
}

/// Runs `f`, turning a panic from inside cudarc into an `Err` with its message.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    install_quiet_hook();
    let outer = QUIET.with(|q| q.replace(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(outer));
    match r {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(format!("CUDA library call failed: {msg}"))
        }
    }
}

/// Loads the driver, initialises it and returns device `ordinal`.
pub(crate) fn device(ordinal: usize) -> Result<drv_sys::CUdevice, String> {
    ensure(Lib::Driver).map_err(|e| e.to_string())?;
    match drv::init() {
        Ok(()) => {}
        Err(DriverError(drv_sys::CUresult::CUDA_ERROR_NO_DEVICE)) => return Err(no_such_device(ordinal, 0)),
        Err(DriverError(drv_sys::CUresult::CUDA_ERROR_STUB_LIBRARY)) => {
            return Err("no CUDA driver found (only the CUDA toolkit's stub libcuda.so was loaded): run on a machine with an NVIDIA GPU and driver, or use --backend cpu".into())
        }
        Err(e) => return Err(format!("the CUDA driver failed to initialise: {}", describe(e))),
    }
    // cudarc's CUDA 13 bindings time events with cuEventElapsedTime_v2 (CUDA 12.8).
    let version = ffi::driver_version()
        .map_err(|e| format!("reading the CUDA driver's version: {}", describe(e)))?;
    if version < MIN_DRIVER {
        return Err(format!(
            "the CUDA driver supports CUDA {}.{}; the CUDA backend needs 12.8 or later (driver 570 or newer): update the driver, or use --backend cpu",
            version / 1000,
            version % 1000 / 10
        ));
    }
    let count =
        drv::device::get_count().map_err(|e| format!("counting CUDA devices: {}", describe(e)))?;
    if ordinal >= count.max(0) as usize {
        return Err(no_such_device(ordinal, count.max(0) as usize));
    }
    drv::device::get(ordinal as c_int)
        .map_err(|e| format!("opening CUDA device {ordinal}: {}", describe(e)))
}

fn no_such_device(ordinal: usize, count: usize) -> String {
    let plural = if count == 1 { "device" } else { "devices" };
    let vis = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => format!("; CUDA_VISIBLE_DEVICES is '{v}'"),
        Err(_) => String::new(),
    };
    format!("CUDA device {ordinal} does not exist ({count} {plural} visible{vis})")
}

pub(crate) fn context(ordinal: usize) -> Result<Arc<CudaContext>, String> {
    CudaContext::new(ordinal).map_err(|e| {
        format!(
            "creating a CUDA context on device {ordinal}: {}",
            describe(e)
        )
    })
}

pub(crate) fn mem_info(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<(u64, u64), String> {
    let (free, total) = ctx
        .mem_get_info()
        .map_err(|e| format!("cuMemGetInfo on device {ordinal}: {}", describe(e)))?;
    Ok((free as u64, total as u64))
}

pub(crate) fn nccl_loaded() -> Result<(), String> {
    // NCCL runs on the driver: without it the clearer message is the driver's.
    ensure(Lib::Driver).map_err(|e| e.to_string())?;
    nccl::bind().map_err(|e| e.to_string())
}

/// "CUDA_ERROR_X: text" for a driver error (the library is loaded when one exists).
pub(crate) fn describe(e: DriverError) -> String {
    match (e.error_name(), e.error_string()) {
        (Ok(n), Ok(s)) => format!("{}: {}", n.to_string_lossy(), s.to_string_lossy()),
        _ => format!("{:?}", e.0),
    }
}

pub(crate) fn nccl_describe(e: &nccl::NcclError, comm: Option<&Comm>) -> String {
    let mut s = format!("{:?}", e.0);
    let general = nccl::error_string(e.0);
    if !general.is_empty() {
        s = format!("{s} ({general})");
    }
    // ncclGetLastError exists from NCCL 2.13 (version code 21300) on.
    let has_last_error = nccl::get_nccl_version()
        .map(|v| v >= 21300)
        .unwrap_or(false);
    if let (Some(c), true) = (comm, has_last_error) {
        let last = c.last_error();
        if !last.is_empty() {
            s = format!("{s}: {last}");
        }
    }
    s
}

/// A cuBLAS handle on `stream` (its context bound to this thread first).
pub(crate) fn new_blas(stream: &CudaStream, ordinal: usize) -> Result<Blas, String> {
    stream.context().bind_to_thread().map_err(describe)?;
    Blas::new(stream).map_err(|e| format!("creating a cuBLAS handle on device {ordinal}: {e:?}"))
}

/// The library's version code (`cublasGetVersion`: major x 10000 + minor x 100 +
/// patch).
pub(crate) fn blas_version(blas: &Blas) -> Result<c_int, String> {
    blas.version()
        .map_err(|e| format!("cublasGetVersion failed: {e:?}"))
}

/// Runs `f` between `ncclGroupStart` and `ncclGroupEnd` and ends the group on every
/// path out of it (an error, a panic caught by [`guarded`]): a communicator is then
/// never aborted inside an open group. The first error wins.
pub(crate) fn nccl_group(what: &str, f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    /// Ends the group if `f` unwinds.
    struct Open(bool);
    impl Drop for Open {
        fn drop(&mut self) {
            if self.0 {
                let _ = nccl::group_end();
            }
        }
    }
    nccl::group_start()
        .map_err(|e| format!("{what}: ncclGroupStart failed: {}", nccl_describe(&e, None)))?;
    let mut open = Open(true);
    let inside = f();
    open.0 = false;
    let end = nccl::group_end()
        .map(|_| ())
        .map_err(|e| format!("{what}: ncclGroupEnd failed: {}", nccl_describe(&e, None)));
    inside.and(end)
}

/// The memory pool `cuMemAllocAsync` takes the run's buffers from, set to keep what
/// is freed across synchronisations (release threshold: no limit), so that a timed
/// step does not map again the activation memory the step before it gave back.
/// `None` where the device has no memory pools (allocations are then synchronous).
pub(crate) fn keep_pool(ctx: &CudaContext, ordinal: usize) -> Result<Option<Pool>, String> {
    if !ctx.has_async_alloc() {
        return Ok(None);
    }
    let what = |e| {
        format!(
            "setting up the memory pool of CUDA device {ordinal}: {}",
            describe(e)
        )
    };
    let pool = Pool::of(ctx).map_err(what)?;
    pool.set_release_threshold(u64::MAX).map_err(what)?;
    Ok(Some(pool))
}

/// A 64-bit count of `pool` (reserved / used bytes and their peaks).
pub(crate) fn pool_bytes(pool: Pool, what: PoolBytes) -> Result<u64, String> {
    pool.bytes(what)
        .map_err(|e| format!("reading the memory pool's {what:?}: {}", describe(e)))
}

/// Resets the pool's peak of reserved bytes to what it holds now.
pub(crate) fn reset_pool_peak(pool: Pool) -> Result<(), String> {
    pool.reset_reserved_peak()
        .map_err(|e| format!("resetting the memory pool's peak: {}", describe(e)))
}

/// Column-major cuBLAS arguments for row-major `C[m,n] = A[m,k] · B[k,n]`.
///
/// A row-major `X[r,c]` is a column-major `Xᵀ[c,r]` with leading dimension `c`, so
/// cuBLAS computes `Cᵀ[n,m] = Bᵀ[n,k] · Aᵀ[k,m]` with no transposes: its "A" is our
/// B (`lda = n`), its "B" is our A (`ldb = k`), `ldc = n`.
/// Returns `(m', n', k', lda, ldb, ldc)` where the first operand passed is B.
pub(crate) fn colmajor_args(
    m: u64,
    n: u64,
    k: u64,
) -> Result<(c_int, c_int, c_int, c_int, c_int, c_int), String> {
    let f = |x: u64| -> Result<c_int, String> {
        if x == 0 || x > c_int::MAX as u64 {
            Err(format!(
                "dimension {x} is outside cuBLAS's range 1..={}",
                c_int::MAX
            ))
        } else {
            Ok(x as c_int)
        }
    };
    let (m, n, k) = (f(m)?, f(n)?, f(k)?);
    Ok((n, m, k, n, k, n))
}

/// Row-major BF16 `C[m,n] = A[m,k] · B[k,n]` (FP32 accumulation) on the handle's
/// stream, in device buffers `(a, b, c)`: `cublasGemmEx`, or for `batch > 1`
/// `cublasGemmStridedBatchedEx` over contiguous operands.
pub(crate) fn bf16_gemm(
    blas: &Blas,
    (m, n, k): (u64, u64, u64),
    batch: u64,
    (a, b, c): (DevSpan, DevSpan, DevSpan),
) -> Result<(), String> {
    let dims = colmajor_args(m, n, k)?;
    let count =
        c_int::try_from(batch).map_err(|_| format!("batch {batch} is outside cuBLAS's range"))?;
    // cuBLAS's first operand is our B (see `colmajor_args`).
    let gemm = ffi::Bf16Gemm {
        dims,
        batch: count,
        first: b,
        second: a,
        out: c,
    };
    ffi::bf16_gemm(blas, &gemm)
        .map_err(|e| format!("cuBLAS GEMM {m}x{n}x{k} (batch {batch}) failed: {e}"))
}

/// A BF16 value's bits from an f32 (round to nearest even; our values are finite).
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// `len` BF16 values spread over [-1, 1) by a fixed xorshift generator.
pub(crate) fn fill_pattern(len: usize) -> Vec<u16> {
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            bf16_bits(((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        })
        .collect()
}

pub(crate) fn oom_or(
    e: DriverError,
    ctx: &Arc<CudaContext>,
    ordinal: usize,
    what: &str,
    bytes: u64,
) -> String {
    if e.0 == drv_sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        out_of_memory(ctx, ordinal, what, bytes)
    } else {
        format!(
            "allocating {bytes} bytes for {what} on CUDA device {ordinal}: {}",
            describe(e)
        )
    }
}

pub(crate) fn out_of_memory(
    ctx: &Arc<CudaContext>,
    ordinal: usize,
    what: &str,
    bytes: u64,
) -> String {
    let free = match mem_info(ctx, ordinal) {
        Ok((free, total)) => format!(
            "{free} bytes ({:.2} GiB) free of {:.1} GiB",
            free as f64 / GIB,
            total as f64 / GIB
        ),
        Err(e) => format!("free memory unknown ({e})"),
    };
    format!("out of memory on CUDA device {ordinal}: {what} needs {bytes} bytes ({:.2} GiB); the device has {free}", bytes as f64 / GIB)
}

/// A BF16 buffer of `elems` (as u16 bits) on `stream`.
pub(crate) fn alloc_bf16(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    ordinal: usize,
    elems: usize,
    what: &str,
) -> Result<CudaSlice<u16>, String> {
    ffi::alloc::<u16>(stream, elems).map_err(|e| oom_or(e, ctx, ordinal, what, elems as u64 * 2))
}

pub(crate) fn fill(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<u16>,
    pattern: &[u16],
) -> Result<(), String> {
    let len = buf.len();
    let mut off = 0;
    while off < len {
        let n = pattern.len().min(len - off);
        let mut view = buf.slice_mut(off..off + n);
        stream
            .memcpy_htod(&pattern[..n], &mut view)
            .map_err(|e| format!("filling a GEMM operand: {}", describe(e)))?;
        off += n;
    }
    Ok(())
}

/// Holds `stream` at a host function until the [`Gate`] drops: the work queued
/// behind it then runs back to back (at most [`GATE_TIMEOUT`] if never released).
pub(crate) fn close_gate(stream: &CudaStream) -> Result<Gate, String> {
    Gate::close(stream, GATE_TIMEOUT)
        .map_err(|e| format!("cuLaunchHostFunc failed: {}", describe(e)))
}

pub(crate) fn timing_event(ctx: &Arc<CudaContext>) -> Result<CudaEvent, String> {
    ctx.new_event(Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| format!("creating a CUDA event: {}", describe(e)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use ffi::driver_present;

    /// The one line for a missing driver, naming what was tried.
    pub(crate) fn no_driver<T>(r: &Result<T, String>) -> bool {
        matches!(r, Err(e) if e.starts_with("CUDA driver not found: looked for libcuda.so.1 in ")
            && e.contains("system loader") && !e.contains('\n'))
    }

    /// cuload hands cudarc files by soname: cudarc must try the names current stacks
    /// have (CUDA 13 and 12 cuBLAS, the driver's .so.1), whatever discovery found.
    #[test]
    fn cudarc_tries_the_cuda_13_and_12_sonames() {
        let blas = cudarc::get_lib_name_candidates("cublas");
        for name in crate::culibs::Lib::Cublas.names() {
            assert!(blas.iter().any(|n| n == name), "{name} not in {blas:?}");
        }
        let drv = cudarc::get_lib_name_candidates("cuda");
        assert!(drv.iter().any(|n| n == "libcuda.so.1"), "{drv:?}");
    }

    #[test]
    fn cuda_probe_without_driver_is_a_clear_error() {
        let r = catch_unwind(|| probe(0));
        let r = r.expect("probe must not panic");
        if driver_present() {
            // A driver is here: Ok, or an Err from cuInit / the device count; either way one line.
            if let Err(e) = r {
                assert!(!e.contains('\n'), "{e}");
            }
        } else {
            assert!(no_driver(&r), "{r:?}");
            // Still fine on a second call (nothing cached a failed load).
            assert!(no_driver(&probe(3)));
        }
    }

    #[test]
    fn cuda_calls_without_driver_do_not_panic() {
        let fm = catch_unwind(|| free_memory(0)).expect("free_memory must not panic");
        let id = catch_unwind(nccl_unique_id).expect("nccl_unique_id must not panic");
        if !driver_present() {
            for e in [fm.err(), id.err()] {
                assert!(e.is_some_and(|e| no_driver::<()>(&Err(e))));
            }
        }
    }

    #[test]
    fn cuda_guarded_turns_a_panic_into_an_err() {
        let r: Result<(), String> = guarded(|| panic!("Missing symbol cuFoo"));
        assert!(r.unwrap_err().contains("Missing symbol cuFoo"));
        // The hook is quiet only inside a guarded call.
        assert!(!QUIET.with(|q| q.get()));
    }

    /// The column-major call `colmajor_args` describes, run on the CPU, gives the
    /// row-major product.
    #[test]
    fn cuda_row_major_gemm_through_column_major_arguments() {
        let (m, n, k) = (3u64, 5u64, 4u64);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 1.0).collect(); // row-major m x k
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 - 3.0).collect(); // row-major k x n
        let (cm, cn, ck, lda, ldb, ldc) = colmajor_args(m, n, k).unwrap();
        let (cm, cn, ck, lda, ldb, ldc) = (
            cm as usize,
            cn as usize,
            ck as usize,
            lda as usize,
            ldb as usize,
            ldc as usize,
        );
        // cuBLAS (N, N): C'[i + j*ldc] = sum_p A'[i + p*lda] * B'[p + j*ldb], A' = our B, B' = our A.
        let mut c = vec![0f32; (m * n) as usize];
        for j in 0..cn {
            for i in 0..cm {
                c[i + j * ldc] = (0..ck).map(|p| b[i + p * lda] * a[p + j * ldb]).sum();
            }
        }
        for r in 0..m as usize {
            for col in 0..n as usize {
                let want: f32 = (0..k as usize)
                    .map(|p| a[r * k as usize + p] * b[p * n as usize + col])
                    .sum();
                assert_eq!(c[r * n as usize + col], want, "C[{r},{col}]");
            }
        }
    }

    #[test]
    fn cuda_bf16_fill_and_sizes() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_bits(-2.0), 0xc000);
        assert_eq!(bf16_bits(0.0), 0);
        let p = fill_pattern(4096);
        let vals: Vec<f32> = p
            .iter()
            .map(|&h| f32::from_bits((h as u32) << 16))
            .collect();
        assert!(vals
            .iter()
            .all(|v| v.is_finite() && (-1.0..=1.0).contains(v)));
        assert!(vals.iter().filter(|v| **v != 0.0).count() > 4000);
    }
}
