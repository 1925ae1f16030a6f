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
pub use crate::error::CudaError;
use crate::error::{BlasStatus, DriverStatus, NcclStatus};
use cudarc::cublas::result::CublasError;
use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError,
};
use ffi::nccl;
pub(crate) use ffi::nccl::Comm;
pub(crate) use ffi::{Blas, DevSpan, Gate, Pool, PoolBytes};
use ffi::{BlasInit, BLAS_WORKSPACE_BYTES};

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
pub fn probe(ordinal: usize) -> Result<String, CudaError> {
    guarded(|| {
        let dev = device(ordinal)?;
        let name = drv::device::get_name(dev).map_err(|e| query_failed("the name", ordinal, e))?;
        let total = ffi::total_mem(dev).map_err(|e| query_failed("the memory size", ordinal, e))?;
        let sms = ffi::attribute(
            dev,
            drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(|e| query_failed("the SM count", ordinal, e))?;
        Ok(format!("{name} ({:.1} GiB, {sms} SMs)", total as f64 / GIB))
    })
}

/// `(free, total)` bytes on the device (`cuMemGetInfo` in the device's primary
/// context, which this retains for the call).
pub fn free_memory(ordinal: usize) -> Result<(u64, u64), CudaError> {
    guarded(|| {
        device(ordinal)?;
        let ctx = context(ordinal)?;
        mem_info(&ctx, ordinal)
    })
}

/// A new NCCL unique id (128 bytes) for rank 0 to hand to the other ranks.
pub fn nccl_unique_id() -> Result<Vec<u8>, CudaError> {
    guarded(|| {
        nccl_loaded()?;
        let id = nccl::get_uniqueid().map_err(nccl_failed("ncclGetUniqueId", None))?;
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

/// Runs `f`, turning a panic from inside cudarc into an `Err` with its message
/// ([`CudaError::Panic`], in whichever error `f` returns).
pub(crate) fn guarded<T, E: From<CudaError>>(f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
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
            Err(CudaError::Panic(msg.to_string()).into())
        }
    }
}

/// Loads the driver, initialises it and returns device `ordinal`.
pub(crate) fn device(ordinal: usize) -> Result<drv_sys::CUdevice, CudaError> {
    ensure(Lib::Driver)?;
    match drv::init() {
        Ok(()) => {}
        Err(DriverError(drv_sys::CUresult::CUDA_ERROR_NO_DEVICE)) => {
            return Err(no_such_device(ordinal, 0))
        }
        Err(DriverError(drv_sys::CUresult::CUDA_ERROR_STUB_LIBRARY)) => {
            return Err(CudaError::StubDriver)
        }
        Err(e) => return Err(CudaError::Init(describe(e))),
    }
    // cudarc's CUDA 13 bindings time events with cuEventElapsedTime_v2 (CUDA 12.8).
    let version = ffi::driver_version().map_err(|e| CudaError::DriverVersion(describe(e)))?;
    if version < MIN_DRIVER {
        return Err(CudaError::OldDriver { version });
    }
    let count = drv::device::get_count().map_err(|e| CudaError::Count(describe(e)))?;
    if ordinal >= count.max(0) as usize {
        return Err(no_such_device(ordinal, count.max(0) as usize));
    }
    drv::device::get(ordinal as c_int).map_err(|e| CudaError::Open {
        ordinal,
        status: describe(e),
    })
}

fn no_such_device(ordinal: usize, count: usize) -> CudaError {
    CudaError::NoDevice {
        ordinal,
        count,
        visible: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
    }
}

/// The error for reading `what` (a property, in words) of device `ordinal`.
pub(crate) fn query_failed(what: &str, ordinal: usize, e: DriverError) -> CudaError {
    CudaError::Query {
        what: what.to_string(),
        ordinal,
        status: describe(e),
    }
}

pub(crate) fn context(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    CudaContext::new(ordinal).map_err(|e| CudaError::Context {
        ordinal,
        status: describe(e),
    })
}

/// A new stream on `ctx` (device `ordinal`), whose context must be current.
pub(crate) fn new_stream(
    ctx: &Arc<CudaContext>,
    ordinal: usize,
) -> Result<Arc<CudaStream>, CudaError> {
    ctx.new_stream().map_err(|e| CudaError::Stream {
        ordinal,
        status: describe(e),
    })
}

/// Makes `ctx` current on this thread.
pub(crate) fn bind(ctx: &CudaContext) -> Result<(), CudaError> {
    ctx.bind_to_thread().map_err(driver)
}

pub(crate) fn mem_info(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<(u64, u64), CudaError> {
    let (free, total) = ctx.mem_get_info().map_err(|e| CudaError::MemInfo {
        ordinal,
        status: describe(e),
    })?;
    Ok((free as u64, total as u64))
}

pub(crate) fn nccl_loaded() -> Result<(), CudaError> {
    // NCCL runs on the driver: without it the clearer message is the driver's.
    ensure(Lib::Driver)?;
    Ok(nccl::bind()?)
}

/// "CUDA_ERROR_X: text" for a driver error (the library is loaded when one exists).
pub(crate) fn describe(e: DriverError) -> DriverStatus {
    match (e.error_name(), e.error_string()) {
        (Ok(n), Ok(s)) => DriverStatus {
            name: n.to_string_lossy().into_owned(),
            text: Some(s.to_string_lossy().into_owned()),
        },
        _ => DriverStatus {
            name: format!("{:?}", e.0),
            text: None,
        },
    }
}

/// A failed driver call with nothing more to say than its status.
pub(crate) fn driver(e: DriverError) -> CudaError {
    CudaError::Driver(describe(e))
}

/// A failed driver call: `call` names it or says what it did.
pub(crate) fn driver_call(call: impl Into<String>) -> impl FnOnce(DriverError) -> CudaError {
    let call = call.into();
    move |e| CudaError::DriverCall {
        call,
        status: describe(e),
    }
}

/// NCCL's status for `e`, with the communicator's last error where there is one.
pub(crate) fn nccl_describe(e: &nccl::NcclError, comm: Option<&Comm>) -> NcclStatus {
    // ncclGetLastError exists from NCCL 2.13 (version code 21300) on.
    let has_last_error = nccl::get_nccl_version()
        .map(|v| v >= 21300)
        .unwrap_or(false);
    let last = match (comm, has_last_error) {
        (Some(c), true) => c.last_error(),
        _ => String::new(),
    };
    NcclStatus {
        name: format!("{:?}", e.0),
        general: nccl::error_string(e.0),
        last,
    }
}

/// A failed NCCL call: `call` names it or says what it did; `comm`, where given,
/// adds its last error.
pub(crate) fn nccl_failed<'a>(
    call: &'a str,
    comm: Option<&'a Comm>,
) -> impl Fn(nccl::NcclError) -> CudaError + 'a {
    move |e| CudaError::Nccl {
        call: call.to_string(),
        status: nccl_describe(&e, comm),
    }
}

/// A cuBLAS status as cudarc names it.
pub(crate) fn blas_status(e: CublasError) -> BlasStatus {
    BlasStatus(format!("{:?}", e.0))
}

/// A cuBLAS handle on `stream` (its context bound to this thread first), with its
/// workspace.
pub(crate) fn new_blas(stream: &Arc<CudaStream>, ordinal: usize) -> Result<Blas, CudaError> {
    bind(stream.context())?;
    Blas::new(stream).map_err(|e| match e {
        BlasInit::Handle(e) => CudaError::BlasHandle {
            ordinal,
            status: blas_status(e),
        },
        BlasInit::Workspace(e) => CudaError::Alloc {
            ordinal,
            what: "the cuBLAS workspace".into(),
            bytes: BLAS_WORKSPACE_BYTES as u64,
            status: describe(e),
        },
    })
}

/// The library's version code (`cublasGetVersion`: major x 10000 + minor x 100 +
/// patch).
pub(crate) fn blas_version(blas: &Blas) -> Result<c_int, CudaError> {
    blas.version()
        .map_err(|e| CudaError::BlasVersion(blas_status(e)))
}

/// Runs `f` between `ncclGroupStart` and `ncclGroupEnd` and ends the group on every
/// path out of it (an error, a panic caught by [`guarded`]): a communicator is then
/// never aborted inside an open group. The first error wins.
pub(crate) fn nccl_group<E: From<CudaError>>(
    what: &str,
    f: impl FnOnce() -> Result<(), E>,
) -> Result<(), E> {
    /// Ends the group if `f` unwinds.
    struct Open(bool);
    impl Drop for Open {
        fn drop(&mut self) {
            if self.0 {
                let _ = nccl::group_end();
            }
        }
    }
    let failed = |call: &'static str| {
        move |e: nccl::NcclError| CudaError::NcclGroup {
            what: what.to_string(),
            call,
            status: nccl_describe(&e, None),
        }
    };
    nccl::group_start().map_err(failed("ncclGroupStart"))?;
    let mut open = Open(true);
    let inside = f();
    open.0 = false;
    let end = nccl::group_end()
        .map(|_| ())
        .map_err(|e| failed("ncclGroupEnd")(e).into());
    inside.and(end)
}

/// The memory pool `cuMemAllocAsync` takes the run's buffers from, set to keep what
/// is freed across synchronisations (release threshold: no limit), so that a timed
/// step does not map again the activation memory the step before it gave back.
/// `None` where the device has no memory pools (allocations are then synchronous).
pub(crate) fn keep_pool(ctx: &CudaContext, ordinal: usize) -> Result<Option<Pool>, CudaError> {
    if !ctx.has_async_alloc() {
        return Ok(None);
    }
    let what = |e| CudaError::Pool {
        ordinal,
        status: describe(e),
    };
    let pool = Pool::of(ctx).map_err(what)?;
    pool.set_release_threshold(u64::MAX).map_err(what)?;
    Ok(Some(pool))
}

/// A 64-bit count of `pool` (reserved / used bytes and their peaks).
pub(crate) fn pool_bytes(pool: Pool, what: PoolBytes) -> Result<u64, CudaError> {
    pool.bytes(what).map_err(|e| CudaError::PoolBytes {
        counter: format!("{what:?}"),
        status: describe(e),
    })
}

/// Resets the pool's peak of reserved bytes to what it holds now.
pub(crate) fn reset_pool_peak(pool: Pool) -> Result<(), CudaError> {
    pool.reset_reserved_peak()
        .map_err(driver_call("resetting the memory pool's peak"))
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
) -> Result<(c_int, c_int, c_int, c_int, c_int, c_int), CudaError> {
    let f = |x: u64| -> Result<c_int, CudaError> {
        if x == 0 || x > c_int::MAX as u64 {
            Err(CudaError::GemmDimension(x))
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
) -> Result<(), CudaError> {
    let dims = colmajor_args(m, n, k)?;
    let count = c_int::try_from(batch).map_err(|_| CudaError::GemmBatch(batch))?;
    // cuBLAS's first operand is our B (see `colmajor_args`).
    let gemm = ffi::Bf16Gemm {
        dims,
        batch: count,
        first: b,
        second: a,
        out: c,
    };
    ffi::bf16_gemm(blas, &gemm).map_err(|error| CudaError::Gemm {
        m,
        n,
        k,
        batch,
        error,
    })
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

/// A failed allocation of `bytes` for `what`: out of memory (with what the device
/// has free), or the driver's status.
pub(crate) fn oom_or(
    e: DriverError,
    ctx: &Arc<CudaContext>,
    ordinal: usize,
    what: &str,
    bytes: u64,
) -> CudaError {
    if e.0 == drv_sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        out_of_memory(ctx, ordinal, what, bytes)
    } else {
        CudaError::Alloc {
            ordinal,
            what: what.to_string(),
            bytes,
            status: describe(e),
        }
    }
}

pub(crate) fn out_of_memory(
    ctx: &Arc<CudaContext>,
    ordinal: usize,
    what: &str,
    bytes: u64,
) -> CudaError {
    CudaError::OutOfMemory {
        ordinal,
        what: what.to_string(),
        bytes,
        free: mem_info(ctx, ordinal).map_err(Box::new),
    }
}

/// `bytes` as a `usize` for an allocation for `what`.
pub(crate) fn host_size(bytes: u64, what: &str) -> Result<usize, CudaError> {
    usize::try_from(bytes).map_err(|_| CudaError::AddressSpace {
        what: what.to_string(),
        bytes,
    })
}

/// A BF16 buffer of `elems` (as u16 bits) on `stream`.
pub(crate) fn alloc_bf16(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    ordinal: usize,
    elems: usize,
    what: &str,
) -> Result<CudaSlice<u16>, CudaError> {
    ffi::alloc::<u16>(stream, elems).map_err(|e| oom_or(e, ctx, ordinal, what, elems as u64 * 2))
}

pub(crate) fn fill(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<u16>,
    pattern: &[u16],
) -> Result<(), CudaError> {
    let len = buf.len();
    let mut off = 0;
    while off < len {
        let n = pattern.len().min(len - off);
        let mut view = buf.slice_mut(off..off + n);
        stream
            .memcpy_htod(&pattern[..n], &mut view)
            .map_err(driver_call("filling a GEMM operand"))?;
        off += n;
    }
    Ok(())
}

/// Holds `stream` at a host function until the [`Gate`] drops: the work queued
/// behind it then runs back to back (at most [`GATE_TIMEOUT`] if never released).
pub(crate) fn close_gate(stream: &CudaStream) -> Result<Gate, CudaError> {
    Gate::close(stream, GATE_TIMEOUT).map_err(driver_call("cuLaunchHostFunc failed"))
}

pub(crate) fn timing_event(ctx: &Arc<CudaContext>) -> Result<CudaEvent, CudaError> {
    ctx.new_event(Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(driver_call("creating a CUDA event"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use ffi::driver_present;

    /// The one line for a missing driver, naming what was tried.
    pub(crate) fn no_driver<T, E: std::fmt::Display>(r: &Result<T, E>) -> bool {
        matches!(r, Err(e) if { let e = e.to_string(); e.starts_with("CUDA driver not found: looked for libcuda.so.1 in ")
            && e.contains("system loader") && !e.contains('\n') })
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
                assert!(!e.to_string().contains('\n'), "{e}");
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
                assert!(e.is_some_and(|e| no_driver::<(), _>(&Err(e))));
            }
        }
    }

    #[test]
    fn cuda_guarded_turns_a_panic_into_an_err() {
        let r: Result<(), CudaError> = guarded(|| panic!("Missing symbol cuFoo"));
        assert_eq!(
            r.unwrap_err().to_string(),
            "CUDA library call failed: Missing symbol cuFoo"
        );
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
