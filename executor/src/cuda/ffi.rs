//! Every `unsafe` of the CUDA backend, behind safe functions and types (cudarc's
//! sys / result / safe split, one level up): opening the libraries, the driver
//! calls, cuBLAS, the host gate and, in [`nccl`], NCCL. The rest of the backend
//! (`cuda.rs`, `cuload.rs`, `device/`, `bench/`) calls only what is here and holds
//! no `unsafe` of its own.
//!
//! What makes the wrappers safe to call:
//! - Handles are owned by types that keep them live: [`Blas`] (a cuBLAS handle),
//!   [`PlainBuf`] and [`DevBuf`] (device memory), [`nccl::Comm`] (a communicator);
//!   contexts and streams are cudarc's `Arc`s. A raw handle never leaves this module.
//! - Device memory is passed as a [`DevSpan`]: an address and the bytes behind it,
//!   borrowed from the buffer that owns them, so it cannot outlive the buffer. Every
//!   call that touches device memory checks that what it reads and writes lies inside
//!   its spans and refuses otherwise (`CUDA_ERROR_INVALID_VALUE`,
//!   `ncclInvalidArgument`, a cuBLAS line), as the library would an invalid argument.
//!   The fake libraries that CI runs against keep device memory in host memory, so
//!   an out-of-bounds write there would be a host write; the check keeps it out.
//! - Device operations are queued on one stream per buffer, and a buffer is freed in
//!   stream order (cudarc's `CudaSlice` frees with `cuMemFreeAsync` on its stream;
//!   [`PlainBuf`] synchronously), after the work queued before it.
//! - Host memory is only ever pageable memory of a Rust slice: a host-to-device copy
//!   returns once the driver has staged the source, a device-to-host copy once it
//!   has written the destination (CUDA's rules for pageable memory), so neither
//!   outlives the borrow.
//!
//! Every `unsafe` block says why it is sound in a `// SAFETY:` line.

#![allow(unsafe_code)]

pub mod nccl;

use std::ffi::{c_int, c_void, OsStr};
use std::marker::PhantomData;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaSlice, CudaStream, DevicePtr, DriverError,
};
use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::error::GemmError;

// ---- libraries -----------------------------------------------------------------

/// Opens `file` (a path or a soname) with `RTLD_NOW | RTLD_GLOBAL`.
pub(crate) fn open_global(file: &OsStr) -> Result<Library, libloading::Error> {
    // SAFETY: opening runs the library's initialisers; the files opened here are the
    // CUDA, cuBLAS and NCCL libraries (or the test fakes) that the process is about to
    // use anyway, found by name in the directories `culibs` searched.
    unsafe { Library::open(Some(file), RTLD_NOW | RTLD_GLOBAL) }
}

/// Whether cudarc's own loader opens the driver library by its candidate names.
pub(crate) fn driver_present() -> bool {
    // SAFETY: cudarc's probe only tries to dlopen its candidate file names and
    // returns whether one opened; it calls nothing inside the library.
    unsafe { drv_sys::is_culib_present() }
}

/// Whether cudarc's own loader opens cuBLAS by its candidate names.
pub(crate) fn cublas_present() -> bool {
    // SAFETY: as in `driver_present`, for cuBLAS.
    unsafe { blas_sys::is_culib_present() }
}

// ---- the driver ----------------------------------------------------------------

/// `cuDriverGetVersion`: the CUDA version the driver supports, e.g. 13000.
pub(crate) fn driver_version() -> Result<c_int, DriverError> {
    let mut version: c_int = 0;
    // SAFETY: writes one c_int through a pointer to a local; the caller has loaded
    // the driver (`cuload::ensure`) so cudarc's lazy loader does not panic, and a
    // panic would be caught by `cuda::guarded` anyway.
    unsafe { drv_sys::cuDriverGetVersion(&mut version) }.result()?;
    Ok(version)
}

/// `cuDeviceTotalMem` of device `dev`.
pub(crate) fn total_mem(dev: drv_sys::CUdevice) -> Result<usize, DriverError> {
    // SAFETY: a CUdevice is an ordinal that the driver checks (an invalid one is
    // CUDA_ERROR_INVALID_DEVICE); the size is written into a local.
    unsafe { drv::device::total_mem(dev) }
}

/// An integer attribute of device `dev`.
pub(crate) fn attribute(
    dev: drv_sys::CUdevice,
    attr: drv_sys::CUdevice_attribute,
) -> Result<i32, DriverError> {
    // SAFETY: as in `total_mem`; every CUdevice_attribute is an int, written into a
    // local.
    unsafe { drv::device::get_attribute(dev, attr) }
}

/// Whether `ctx`'s device can access `peer`'s memory (`cuDeviceCanAccessPeer`).
pub(crate) fn can_access_peer(ctx: &CudaContext, peer: &CudaContext) -> Result<bool, DriverError> {
    let mut can: c_int = 0;
    // SAFETY: two device ordinals of live contexts; writes one int into a local.
    unsafe { drv_sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer.cu_device()) }
        .result()?;
    Ok(can != 0)
}

/// `cuCtxEnablePeerAccess` from the context current on this thread to `peer`.
pub(crate) fn enable_peer_access(peer: &CudaContext) -> Result<(), DriverError> {
    // SAFETY: the peer's context is live (borrowed) and flags are 0 as the API
    // requires; the driver checks the current context and returns an error without one.
    unsafe { drv_sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) }.result()
}

// ---- device memory -------------------------------------------------------------

/// Element types whose every bit pattern is a valid value, so uninitialised device
/// memory of them holds arbitrary values and nothing worse.
pub(crate) trait AnyBits: cudarc::driver::DeviceRepr {}
impl AnyBits for u8 {}
impl AnyBits for u16 {}
impl AnyBits for f32 {}

/// `len` uninitialised elements from `stream` (its context's pool where the device
/// has one), freed on drop in stream order.
pub(crate) fn alloc<T: AnyBits>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>, DriverError> {
    // SAFETY: `T: AnyBits`: read before it is written, the memory holds arbitrary but
    // valid values; cudarc tracks and frees the allocation.
    unsafe { stream.alloc::<T>(len) }
}

/// Device memory: an address and the bytes behind it, borrowed from the buffer that
/// owns them (so it cannot outlive it). Made only here, from a live allocation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DevSpan<'a> {
    addr: u64,
    bytes: u64,
    _owner: PhantomData<&'a ()>,
}

impl<'a> DevSpan<'a> {
    /// The whole of `slice`, for work on `stream` (cudarc orders `stream` after the
    /// slice's earlier writes).
    pub(crate) fn of<T>(slice: &'a CudaSlice<T>, stream: &CudaStream) -> DevSpan<'a> {
        let (addr, _sync) = slice.device_ptr(stream);
        DevSpan {
            addr,
            bytes: (slice.len() * std::mem::size_of::<T>()) as u64,
            _owner: PhantomData,
        }
    }

    /// `bytes` at `offset` inside this span, or `None` where they run past it.
    pub(crate) fn at(self, offset: u64, bytes: u64) -> Option<DevSpan<'a>> {
        (offset.checked_add(bytes)? <= self.bytes).then_some(DevSpan {
            addr: self.addr + offset,
            bytes,
            _owner: PhantomData,
        })
    }

    pub(crate) fn bytes(self) -> u64 {
        self.bytes
    }

    /// Whether `bytes` fit in the span (checked before a call touches them).
    fn holds(self, bytes: Option<u64>) -> bool {
        bytes.is_some_and(|b| b <= self.bytes)
    }
}

/// The error a span too small for a call gives.
fn too_small() -> DriverError {
    DriverError(drv_sys::CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// A byte buffer from a stream's pool, with its address taken once.
pub(crate) struct DevBuf {
    slice: CudaSlice<u8>,
    addr: u64,
}

impl DevBuf {
    /// `bytes` uninitialised bytes from `stream`.
    pub(crate) fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> Result<DevBuf, DriverError> {
        let slice = alloc::<u8>(stream, bytes)?;
        let addr = DevSpan::of(&slice, stream).addr;
        Ok(DevBuf { slice, addr })
    }

    pub(crate) fn span(&self) -> DevSpan<'_> {
        DevSpan {
            addr: self.addr,
            bytes: self.slice.len() as u64,
            _owner: PhantomData,
        }
    }
}

/// A device allocation made with `cuMemAlloc` (not from a memory pool, whose peer
/// access `cuCtxEnablePeerAccess` does not govern), freed on drop.
pub(crate) struct PlainBuf {
    ctx: Arc<CudaContext>,
    ptr: drv_sys::CUdeviceptr,
    bytes: u64,
}

impl PlainBuf {
    /// `bytes` on `ctx`'s device (bound to this thread here).
    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<PlainBuf, DriverError> {
        ctx.bind_to_thread()?;
        // SAFETY: the context is current on this thread; the memory is freed only in
        // `drop`.
        let ptr = unsafe { drv::malloc_sync(bytes) }?;
        Ok(PlainBuf {
            ctx: ctx.clone(),
            ptr,
            bytes: bytes as u64,
        })
    }

    pub(crate) fn span(&self) -> DevSpan<'_> {
        DevSpan {
            addr: self.ptr,
            bytes: self.bytes,
            _owner: PhantomData,
        }
    }
}

impl Drop for PlainBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `new` and freed only here; the streams that used
            // it were synchronised (or the process is failing anyway).
            let _ = unsafe { drv::free_sync(self.ptr) };
        }
    }
}

/// Copies `src` to the start of `dst` on `stream`.
pub(crate) fn copy_htod<T: AnyBits>(
    stream: &CudaStream,
    dst: DevSpan,
    src: &[T],
) -> Result<(), DriverError> {
    if !dst.holds(Some(std::mem::size_of_val(src) as u64)) {
        return Err(too_small());
    }
    // SAFETY: `dst` holds the bytes of `src` (checked above) and lives until the
    // copy is done (stream-ordered free); `src` is pageable host memory, staged by
    // the driver before the call returns.
    unsafe { drv::memcpy_htod_async(dst.addr, src, stream.cu_stream()) }
}

/// Copies the start of `src` into `dst` on `stream`; `dst` holds the values when
/// this returns.
pub(crate) fn copy_dtoh<T: AnyBits>(
    stream: &CudaStream,
    dst: &mut [T],
    src: DevSpan,
) -> Result<(), DriverError> {
    if !src.holds(Some(std::mem::size_of_val(dst) as u64)) {
        return Err(too_small());
    }
    // SAFETY: `src` holds the bytes of `dst` (checked above); `dst` is pageable host
    // memory of a type valid for any bits, and a device-to-host copy into pageable
    // memory returns only once it is written.
    unsafe { drv::memcpy_dtoh_async(dst, src.addr, stream.cu_stream()) }
}

/// Copies the first `bytes` of `src` to `dst` on `stream`.
pub(crate) fn copy_dtod(
    stream: &CudaStream,
    dst: DevSpan,
    src: DevSpan,
    bytes: u64,
) -> Result<(), DriverError> {
    if !dst.holds(Some(bytes)) || !src.holds(Some(bytes)) {
        return Err(too_small());
    }
    // SAFETY: both spans hold `bytes` (checked above) and live until the copy is done.
    unsafe { drv::memcpy_dtod_async(dst.addr, src.addr, bytes as usize, stream.cu_stream()) }
}

/// Sets the first `bytes` of `dst` to `value` on `stream`.
pub(crate) fn memset(
    stream: &CudaStream,
    dst: DevSpan,
    value: u8,
    bytes: u64,
) -> Result<(), DriverError> {
    if !dst.holds(Some(bytes)) {
        return Err(too_small());
    }
    // SAFETY: `dst` holds `bytes` (checked above) and lives until the memset is done.
    unsafe { drv::memset_d8_async(dst.addr, value, bytes as usize, stream.cu_stream()) }
}

/// Copies the first `bytes` of `src` (on `src_ctx`'s device) to `dst` (on
/// `dst_ctx`'s) on `stream`.
pub(crate) fn copy_peer(
    stream: &CudaStream,
    (dst_ctx, dst): (&CudaContext, DevSpan),
    (src_ctx, src): (&CudaContext, DevSpan),
    bytes: u64,
) -> Result<(), DriverError> {
    if !dst.holds(Some(bytes)) || !src.holds(Some(bytes)) {
        return Err(too_small());
    }
    // SAFETY: both spans hold `bytes` (checked above), on the devices of the two live
    // contexts given, and outlive the copy.
    unsafe {
        drv::memcpy_peer_async(
            dst_ctx.cu_ctx(),
            dst.addr,
            src_ctx.cu_ctx(),
            src.addr,
            bytes as usize,
            stream.cu_stream(),
        )
    }
}

// ---- the memory pool -----------------------------------------------------------

/// A device's current memory pool (the one `cuMemAllocAsync` takes from). A
/// device's pool lives as long as the process; this only reads and sets its
/// attributes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pool(drv_sys::CUmemoryPool);

/// The pool's 64-bit byte counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolBytes {
    ReservedCurrent,
    ReservedHigh,
    UsedHigh,
}

impl PoolBytes {
    fn attr(self) -> drv_sys::CUmemPool_attribute {
        use drv_sys::CUmemPool_attribute::*;
        match self {
            PoolBytes::ReservedCurrent => CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            PoolBytes::ReservedHigh => CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            PoolBytes::UsedHigh => CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        }
    }
}

impl Pool {
    /// The current pool of `ctx`'s device.
    pub(crate) fn of(ctx: &CudaContext) -> Result<Pool, DriverError> {
        // SAFETY: the device of a live context; the handle is written into a local.
        unsafe { drv::device::get_mem_pool(ctx.cu_device()) }.map(Pool)
    }

    /// Sets the release threshold (bytes the pool keeps across synchronisations).
    pub(crate) fn set_release_threshold(self, bytes: u64) -> Result<(), DriverError> {
        let mut v = bytes;
        // SAFETY: a pool handle from `Pool::of`; the release threshold is a
        // cuuint64_t, read from a local u64.
        unsafe {
            drv::mem_pool::set_attribute(
                self.0,
                drv_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut v as *mut u64).cast(),
            )
        }
    }

    /// One of the pool's byte counts.
    pub(crate) fn bytes(self, what: PoolBytes) -> Result<u64, DriverError> {
        let mut v = 0u64;
        // SAFETY: a pool handle from `Pool::of`; every `PoolBytes` attribute is a
        // cuuint64_t, written into a local u64.
        unsafe { drv::mem_pool::get_attribute(self.0, what.attr(), (&mut v as *mut u64).cast()) }?;
        Ok(v)
    }

    /// Resets the peak of reserved bytes to what the pool holds now.
    pub(crate) fn reset_reserved_peak(self) -> Result<(), DriverError> {
        let mut zero = 0u64;
        // SAFETY: a pool handle from `Pool::of`; resetting a peak takes a cuuint64_t
        // 0, read from a local.
        unsafe {
            drv::mem_pool::set_attribute(
                self.0,
                drv_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        }
    }
}

// ---- the host gate -------------------------------------------------------------

/// Holds a stream at a host function until dropped: the work queued behind it then
/// runs back to back. The host function only waits on a channel (no CUDA calls, as
/// `cuLaunchHostFunc` requires), at most `timeout`.
pub(crate) struct Gate(#[allow(dead_code)] mpsc::Sender<()>);

/// What the host function owns: the receiver and how long it waits at most.
type GateArg = (mpsc::Receiver<()>, Duration);

unsafe extern "C" fn gate_wait(arg: *mut c_void) {
    // Owns the receiver from here; returns when the sender is dropped or on timeout.
    // SAFETY: `arg` is the Box::into_raw of `Gate::close`, launched once, so it is
    // reclaimed exactly once.
    let (rx, timeout) = *unsafe { Box::from_raw(arg.cast::<GateArg>()) };
    let _ = rx.recv_timeout(timeout);
}

impl Gate {
    /// Queues the gate on `stream`; `Err` where the driver refused the host function.
    pub(crate) fn close(stream: &CudaStream, timeout: Duration) -> Result<Gate, DriverError> {
        let (tx, rx) = mpsc::channel::<()>();
        let arg = Box::into_raw(Box::new((rx, timeout)));
        // SAFETY: `gate_wait` makes no CUDA call and takes ownership of `arg`; the
        // stream is live (borrowed).
        match unsafe {
            drv::stream::launch_host_function(stream.cu_stream(), gate_wait, arg.cast())
        } {
            Ok(()) => Ok(Gate(tx)),
            Err(e) => {
                // Not launched: the receiver is still ours.
                // SAFETY: the function was not queued, so nothing else owns `arg`.
                drop(unsafe { Box::from_raw(arg) });
                Err(e)
            }
        }
    }
}

// ---- cuBLAS --------------------------------------------------------------------

/// The workspace every handle gets: the cuBLAS API reference (`cublasSetWorkspace`)
/// recommends 32 MiB on Hopper and 4 MiB before it, as PyTorch sets. On one H200
/// (cuBLAS 13.1), GEMMs of 2^33 multiply-adds and more ran at a median 0.93 of
/// `torch.matmul`'s speed without it and 0.95 with it (`scripts/gemm_vs_torch.py`,
/// one run each on different machines; docs/executor.md has the runs).
pub(crate) const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Why a handle could not be made: the handle itself, or its workspace.
pub(crate) enum BlasInit {
    Handle(blas::CublasError),
    Workspace(DriverError),
}

/// A cuBLAS handle bound to one stream, with its own workspace. cudarc's `CudaBlas`
/// unwraps `cublasDestroy` in its `Drop`: a failure there while a panic unwinds
/// aborts the process past `cuda::guarded`. Dropping this ignores a failed destroy,
/// then frees the workspace (fields drop after `drop`).
pub(crate) struct Blas(blas_sys::cublasHandle_t, DevBuf);

impl Blas {
    /// A handle on `stream`, whose context must be current on this thread, with a
    /// [`BLAS_WORKSPACE_BYTES`] workspace from the stream's pool.
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Blas, BlasInit> {
        let workspace = DevBuf::alloc(stream, BLAS_WORKSPACE_BYTES).map_err(BlasInit::Workspace)?;
        let handle = Blas(blas::create_handle().map_err(BlasInit::Handle)?, workspace);
        // SAFETY: a live handle and a live stream of the context current on this thread.
        unsafe { blas::set_stream(handle.0, stream.cu_stream() as _) }.map_err(BlasInit::Handle)?;
        // After the stream: `cublasSetStream` puts the default workspace back.
        let span = handle.1.span();
        // SAFETY: a live handle; the workspace is a live allocation of `span.bytes`
        // bytes on this handle's stream, owned by the handle and freed only after
        // the handle is destroyed.
        unsafe {
            blas_sys::cublasSetWorkspace_v2(handle.0, span.addr as *mut c_void, span.bytes as usize)
        }
        .result()
        .map_err(BlasInit::Handle)?;
        Ok(handle)
    }

    /// The library's version code (`cublasGetVersion`: major x 10000 + minor x 100 +
    /// patch).
    pub(crate) fn version(&self) -> Result<c_int, blas::CublasError> {
        let mut v: c_int = 0;
        // SAFETY: a live handle; the version is written into a local.
        unsafe { blas_sys::cublasGetVersion_v2(self.0, &mut v) }.result()?;
        Ok(v)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: made by `cublasCreate` in `new` and destroyed only here.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

/// A BF16 GEMM as column-major cuBLAS sees it: `(m, n, k, lda, ldb, ldc)` with the
/// first operand's span, the second's and the output's, `batch` products per call.
pub(crate) struct Bf16Gemm<'a> {
    pub(crate) dims: (c_int, c_int, c_int, c_int, c_int, c_int),
    pub(crate) batch: c_int,
    pub(crate) first: DevSpan<'a>,
    pub(crate) second: DevSpan<'a>,
    pub(crate) out: DevSpan<'a>,
}

/// `C = A · B` (no transposes, FP32 accumulation, default algorithm) on the
/// handle's stream: `cublasGemmEx`, or for `batch > 1` `cublasGemmStridedBatchedEx`
/// over contiguous operands (strides `m x k`, `k x n`, `m x n` in cuBLAS's terms).
/// Refuses operands whose spans do not hold them.
pub(crate) fn bf16_gemm(blas: &Blas, g: &Bf16Gemm) -> Result<(), GemmError> {
    let (m, n, k, lda, ldb, ldc) = g.dims;
    let all = [m, n, k, lda, ldb, ldc, g.batch];
    if all.iter().any(|&x| x < 1) || lda != m || ldb != k || ldc != m {
        return Err(GemmError::Arguments(all));
    }
    let elems = |rows: c_int, cols: c_int| (rows as u64) * (cols as u64);
    let (sa, sb, sc) = (elems(m, k), elems(k, n), elems(m, n));
    // A batch's operands lie side by side: `batch` strides of BF16 elements each.
    let need = |stride: u64| stride.checked_mul(g.batch as u64)?.checked_mul(2);
    for (span, stride, name) in [
        (g.first, sa, "first operand"),
        (g.second, sb, "second operand"),
        (g.out, sc, "output"),
    ] {
        if !span.holds(need(stride)) {
            return Err(GemmError::Span {
                operand: name,
                stride,
                batch: g.batch,
                bytes: span.bytes,
            });
        }
    }
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (op, bf16) = (
        blas_sys::cublasOperation_t::CUBLAS_OP_N,
        blas_sys::cudaDataType::CUDA_R_16BF,
    );
    let (compute, algo) = (
        blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
    );
    let (pa, pb, pc) = (
        g.first.addr as *const c_void,
        g.second.addr as *const c_void,
        g.out.addr as *mut c_void,
    );
    let (al, be) = ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
    // SAFETY: a live handle; every operand's extent (leading dimension = rows, as
    // checked, x columns, and its stride over the batch) lies in its span (checked),
    // so in a live allocation; alpha and beta are f32 on the stack, read
    // before the call returns (host pointer mode, the default).
    let r = unsafe {
        if g.batch > 1 {
            blas::gemm_strided_batched_ex(
                blas.0, op, op, m, n, k, al, pa, bf16, lda, sa as i64, pb, bf16, ldb, sb as i64,
                be, pc, bf16, ldc, sc as i64, g.batch, compute, algo,
            )
        } else {
            blas::gemm_ex(
                blas.0, op, op, m, n, k, al, pa, bf16, lda, pb, bf16, ldb, be, pc, bf16, ldc,
                compute, algo,
            )
        }
    };
    r.map_err(|e| GemmError::Status(crate::cuda::blas_status(e)))
}
