//! (`--features cuda`) The microbenchmarks behind `sextant bench`: BF16 cuBLAS
//! GEMMs over shapes, device copies and memsets (HBM bandwidth), NCCL collectives
//! over local GPUs driven from one thread, and copies between two GPUs.
//!
//! Every point is timed the same way ([`timed_calls`]): `warmup` untimed calls,
//! then each timed call between its own pair of CUDA events, the calls queued
//! behind a host gate ([`Gate`]) in batches of 64, so that the GPU runs a batch
//! back to back and the events time the device, not the host's launch gaps. A
//! point's time is the median over its calls of the slowest GPU's event time.
//!
//! As everywhere in [`crate::cuda`], nothing here panics: a missing library or
//! device, a failed allocation or call is one line ([`guarded`]). Arguments are
//! checked before any library is touched.

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaSlice, CudaStream, DevicePtr,
};
use cudarc::nccl::sys as nccl_sys;
use sextant_planner::calibration::median;

use crate::cuda::{
    alloc_bf16, bf16_gemm, colmajor_args, context, describe, device, fill, fill_pattern, guarded,
    mem_info, nccl_describe, nccl_group, nccl_loaded, oom_or, out_of_memory, timing_event, Blas,
    Comm, Gate, FILL_ELEMS, GATE_BATCH,
};
use crate::culibs::Lib;
use crate::cuload::{ensure, nccl};

/// Warm-up and timed calls per point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub warmup: u32,
    pub iters: u32,
}

/// The most timed calls per point (two events each).
pub const MAX_ITERS: u32 = 10_000;

fn check_timing(t: Timing) -> Result<(), String> {
    if t.iters == 0 || t.iters > MAX_ITERS || t.warmup > MAX_ITERS {
        return Err(format!(
            "{} timed and {} warm-up calls per point: use 1 to {MAX_ITERS} timed calls and at most {MAX_ITERS} warm-up calls",
            t.iters, t.warmup
        ));
    }
    Ok(())
}

/// What the driver says about one device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub name: String,
    pub memory_bytes: u64,
    pub sms: u64,
    pub compute_capability: (i32, i32),
    /// Devices this process sees.
    pub visible: u64,
    /// `cuDriverGetVersion`: the CUDA version the driver supports, e.g. 13000.
    pub cuda_version: i32,
}

/// Name, memory, SMs and compute capability of device `ordinal`, the number of
/// devices, and the driver's CUDA version. Creates no context.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo, String> {
    guarded(|| {
        let dev = device(ordinal)?;
        let name = drv::device::get_name(dev)
            .map_err(|e| format!("reading the name of CUDA device {ordinal}: {}", describe(e)))?;
        // SAFETY: a device handle from `device`.
        let total = unsafe { drv::device::total_mem(dev) }.map_err(|e| {
            format!(
                "reading the memory of CUDA device {ordinal}: {}",
                describe(e)
            )
        })?;
        let attr = |a: drv_sys::CUdevice_attribute| {
            // SAFETY: a device handle from `device`, an integer attribute.
            unsafe { drv::device::get_attribute(dev, a) }
                .map_err(|e| format!("reading {a:?} of CUDA device {ordinal}: {}", describe(e)))
        };
        use drv_sys::CUdevice_attribute as A;
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let visible = drv::device::get_count()
            .map_err(|e| format!("counting CUDA devices: {}", describe(e)))?;
        let mut version: c_int = 0;
        // SAFETY: writes one int.
        unsafe { drv_sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(|e| format!("reading the CUDA driver's version: {}", describe(e)))?;
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
pub fn library_files(libs: &[Lib]) -> Result<Vec<(Lib, Option<PathBuf>)>, String> {
    libs.iter().map(|&l| Ok((l, ensure(l)?))).collect()
}

/// Times `issue` (which queues one call on every stream of `streams`): `warmup`
/// untimed calls, then `iters` calls, each between a pair of events on every
/// stream, queued behind a host gate on every stream in batches of [`GATE_BATCH`].
/// Returns, per timed call, the slowest stream's seconds.
fn timed_calls(
    streams: &[(&Arc<CudaContext>, &Arc<CudaStream>)],
    t: Timing,
    mut issue: impl FnMut() -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    for _ in 0..t.warmup {
        issue()?;
    }
    for (_, s) in streams {
        s.synchronize().map_err(describe)?;
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
            ctx.bind_to_thread().map_err(describe)?;
            gates.push(Gate::close(s)?);
        }
        let stop = (i + GATE_BATCH as usize).min(n);
        while i < stop {
            for (j, (_, s)) in streams.iter().enumerate() {
                events[j][i].0.record(s).map_err(describe)?;
            }
            issue()?;
            for (j, (_, s)) in streams.iter().enumerate() {
                events[j][i].1.record(s).map_err(describe)?;
            }
            i += 1;
        }
        drop(gates);
    }
    for (_, s) in streams {
        s.synchronize().map_err(describe)?;
    }
    let mut secs = vec![0.0f64; n];
    for per_stream in &events {
        for (k, (a, b)) in per_stream.iter().enumerate() {
            let x = a.elapsed_ms(b).map_err(describe)? as f64 / 1e3;
            secs[k] = secs[k].max(x);
        }
    }
    Ok(secs)
}

/// One GEMM shape: row-major `C[m,n] = A[m,k] · B[k,n]`, `batch` products per call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmShape {
    pub class: String,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
}

impl GemmShape {
    /// Elements of A, B and C over the batch, or None on overflow.
    fn elems(&self) -> Option<(u64, u64, u64)> {
        let b = self.batch;
        Some((
            self.m.checked_mul(self.k)?.checked_mul(b)?,
            self.k.checked_mul(self.n)?.checked_mul(b)?,
            self.m.checked_mul(self.n)?.checked_mul(b)?,
        ))
    }
}

/// Bytes of A, B and C for one BF16 GEMM, or None on overflow.
fn gemm_bytes(m: u64, n: u64, k: u64) -> Option<u64> {
    let e = m
        .checked_mul(k)?
        .checked_add(k.checked_mul(n)?)?
        .checked_add(m.checked_mul(n)?)?;
    let b = e.checked_mul(2)?;
    usize::try_from(b).ok()?;
    Some(b)
}

/// The GEMM benchmark's results: per shape, the median seconds of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmTimes {
    pub points: Vec<(GemmShape, f64)>,
    /// `cublasGetVersion`.
    pub cublas_version: i32,
}

/// Times BF16 GEMMs (`cublasGemmEx`, or `cublasGemmStridedBatchedEx` for a batch;
/// FP32 accumulation, the default algorithm) of every shape on device `ordinal`.
/// The operands are allocated once at the largest shape's sizes and filled with
/// small pseudo-random values (all-zero data would run the tensor cores at lower
/// power than training does).
pub fn gemms(ordinal: usize, shapes: &[GemmShape], t: Timing) -> Result<GemmTimes, String> {
    check_timing(t)?;
    if shapes.is_empty() {
        return Err("no GEMM shape to time".into());
    }
    let (mut na, mut nb, mut nc) = (0u64, 0u64, 0u64);
    for s in shapes {
        let what = format!(
            "GEMM '{}' {}x{}x{} (batch {})",
            s.class, s.m, s.n, s.k, s.batch
        );
        colmajor_args(s.m, s.n, s.k).map_err(|e| format!("{what}: {e}"))?;
        if s.batch == 0 || s.batch > i32::MAX as u64 {
            return Err(format!("{what}: the batch is outside cuBLAS's range"));
        }
        let (a, b, c) = s
            .elems()
            .filter(|_| gemm_bytes(s.m, s.n, s.k).is_some())
            .ok_or_else(|| format!("{what}: its buffers' size overflows"))?;
        (na, nb, nc) = (na.max(a), nb.max(b), nc.max(c));
    }
    let total = (na + nb)
        .checked_add(nc)
        .and_then(|e| e.checked_mul(2))
        .filter(|&b| usize::try_from(b).is_ok())
        .ok_or("the GEMM operands' size overflows")?;
    guarded(|| {
        device(ordinal)?;
        ensure(Lib::Cublas)?;
        let ctx = context(ordinal)?;
        ctx.bind_to_thread().map_err(describe)?;
        let stream = ctx.new_stream().map_err(|e| {
            format!(
                "creating a CUDA stream on device {ordinal}: {}",
                describe(e)
            )
        })?;
        let blas = Blas::new(&stream, ordinal)?;
        let cublas_version = blas.version()?;
        let what = "the GEMM operands at the largest shapes (A, B and C)";
        let (free, _) = mem_info(&ctx, ordinal)?;
        if total > free {
            return Err(out_of_memory(&ctx, ordinal, what, total));
        }
        let pattern = fill_pattern(FILL_ELEMS.min(na.max(nb) as usize));
        let mut a = alloc_bf16(&ctx, &stream, ordinal, na as usize, what)?;
        let mut b = alloc_bf16(&ctx, &stream, ordinal, nb as usize, what)?;
        let c = alloc_bf16(&ctx, &stream, ordinal, nc as usize, what)?;
        fill(&stream, &mut a, &pattern)?;
        fill(&stream, &mut b, &pattern)?;
        // Raw addresses, taken once: the buffers outlive every call, all on `stream`.
        let (pa, pb, pc) = {
            let (pa, _ra) = a.device_ptr(&stream);
            let (pb, _rb) = b.device_ptr(&stream);
            let (pc, _rc) = c.device_ptr(&stream);
            (pa, pb, pc)
        };
        let mut points = Vec::with_capacity(shapes.len());
        for s in shapes {
            let shape = format!("the GEMM {}x{}x{} (batch {})", s.m, s.n, s.k, s.batch);
            let secs = timed_calls(&[(&ctx, &stream)], t, || {
                bf16_gemm(&blas, (s.m, s.n, s.k), s.batch, (pa, pb, pc))
                    .map_err(|e| format!("{shape}: {e}"))
            })?;
            points.push((s.clone(), median(&secs).unwrap_or(0.0)));
        }
        stream.synchronize().map_err(describe)?;
        Ok(GemmTimes {
            points,
            cublas_version,
        })
    })
}

/// A device-memory operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemOp {
    /// `cuMemcpyDtoDAsync` within one device: reads and writes the bytes.
    Copy,
    /// `cuMemsetD8Async`: writes them.
    Memset,
}

impl MemOp {
    pub fn label(self) -> &'static str {
        match self {
            MemOp::Copy => "copy",
            MemOp::Memset => "memset",
        }
    }
}

/// A byte buffer from `stream`'s pool and its address.
fn bytes_on(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    ordinal: usize,
    bytes: u64,
    what: &str,
) -> Result<(CudaSlice<u8>, u64), String> {
    let n = usize::try_from(bytes)
        .map_err(|_| format!("{what}: {bytes} bytes do not fit this machine's address space"))?;
    // SAFETY: every byte is written before it is read, or its value is irrelevant
    // (a copy's or a collective's source: only the traffic is measured).
    let slice =
        unsafe { stream.alloc::<u8>(n) }.map_err(|e| oom_or(e, ctx, ordinal, what, bytes))?;
    let ptr = {
        let (p, _sync) = slice.device_ptr(stream);
        p
    };
    Ok((slice, ptr))
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
        let (_src, ps) = bytes_on(&ctx, &stream, ordinal, max, &what)?;
        let (_dst, pd) = bytes_on(&ctx, &stream, ordinal, max, &what)?;
        let cu = stream.cu_stream();
        // SAFETY: `ps` holds `max` bytes on this stream.
        unsafe { drv::memset_d8_async(ps, 0x3c, max as usize, cu) }.map_err(describe)?;
        let mut out = Vec::with_capacity(2 * sizes.len());
        for &bytes in sizes {
            let n = bytes as usize;
            for op in [MemOp::Copy, MemOp::Memset] {
                let secs = timed_calls(&[(&ctx, &stream)], t, || {
                    // SAFETY: both buffers hold `max >= bytes` bytes and live on `stream`.
                    unsafe {
                        match op {
                            MemOp::Copy => drv::memcpy_dtod_async(pd, ps, n, cu),
                            MemOp::Memset => drv::memset_d8_async(pd, 0, n, cu),
                        }
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

/// An NCCL collective, BF16, summed where it reduces, out of place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollOp {
    AllReduce,
    AllGather,
    ReduceScatter,
}

impl CollOp {
    pub fn label(self) -> &'static str {
        match self {
            CollOp::AllReduce => "all_reduce",
            CollOp::AllGather => "all_gather",
            CollOp::ReduceScatter => "reduce_scatter",
        }
    }

    /// Bytes each rank sends and receives for a collective of `bytes` in nccl-tests'
    /// convention (the all-reduce's buffer, the all-gather's output, the
    /// reduce-scatter's input) over `n` ranks.
    pub fn sides(self, bytes: u64, n: u64) -> (u64, u64) {
        match self {
            CollOp::AllReduce => (bytes, bytes),
            CollOp::AllGather => (bytes / n, bytes),
            CollOp::ReduceScatter => (bytes, bytes / n),
        }
    }
}

/// The collective benchmark's results: (op, bytes, median seconds of the slowest
/// rank) and NCCL's version code.
#[derive(Debug, Clone, PartialEq)]
pub struct CollTimes {
    pub points: Vec<(CollOp, u64, f64)>,
    pub nccl_version: i32,
}

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
) -> Result<CollTimes, String> {
    check_timing(t)?;
    let n = ordinals.len() as u64;
    if ordinals.is_empty() || ops.is_empty() || sizes.is_empty() {
        return Err("no device, collective or size to time".into());
    }
    if (1..ordinals.len()).any(|i| ordinals[..i].contains(&ordinals[i])) || n > i32::MAX as u64 {
        return Err(format!(
            "the devices {ordinals:?} repeat one: NCCL takes one rank per device"
        ));
    }
    for &b in sizes {
        if b == 0 || b % (2 * n) != 0 || b.checked_mul(2).is_none() {
            return Err(format!(
                "a collective of {b} bytes over {n} GPUs: give a positive multiple of {} bytes (a whole number of BF16 elements per GPU)",
                2 * n
            ));
        }
    }
    guarded(|| {
        for &o in ordinals {
            device(o)?;
        }
        nccl_loaded()?;
        let nccl_version = nccl::get_nccl_version()
            .map_err(|e| format!("ncclGetVersion failed: {}", nccl_describe(&e, None)))?;
        let mut gpus = Vec::with_capacity(ordinals.len());
        for &o in ordinals {
            let ctx = context(o)?;
            ctx.bind_to_thread().map_err(describe)?;
            let stream = ctx
                .new_stream()
                .map_err(|e| format!("creating a CUDA stream on device {o}: {}", describe(e)))?;
            gpus.push((o, ctx, stream));
        }
        let id = nccl::get_uniqueid()
            .map_err(|e| format!("ncclGetUniqueId failed: {}", nccl_describe(&e, None)))?;
        let mut raws: Vec<nccl_sys::ncclComm_t> = vec![std::ptr::null_mut(); gpus.len()];
        let made = nccl_group("creating the NCCL communicators", || {
            for (r, (o, ctx, _)) in gpus.iter().enumerate() {
                ctx.bind_to_thread().map_err(describe)?;
                // SAFETY: `raws[r]` is written by NCCL; the id came from ncclGetUniqueId.
                unsafe { nccl::comm_init_rank(&mut raws[r], n as c_int, id, r as c_int) }.map_err(
                    |e| {
                        format!(
                            "ncclCommInitRank (rank {r} of {n}, device {o}) failed: {}",
                            nccl_describe(&e, None)
                        )
                    },
                )?;
            }
            Ok(())
        });
        // Whatever was made is aborted on an early exit (before the streams go).
        let mut comms: Vec<Comm> = raws
            .iter()
            .filter(|c| !c.is_null())
            .map(|&raw| Comm {
                raw,
                finished: false,
            })
            .collect();
        made?;
        if comms.len() != gpus.len() {
            return Err(format!(
                "NCCL made {} of {} communicators",
                comms.len(),
                gpus.len()
            ));
        }
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
                        return Err(out_of_memory(ctx, *o, &what, send + recv));
                    }
                    let s = bytes_on(ctx, stream, *o, send, &what)?;
                    let r = bytes_on(ctx, stream, *o, recv, &what)?;
                    bufs.push((s, r));
                }
                let call = format!("nccl {} of {bytes} bytes on {n} GPUs", op.label());
                let secs = timed_calls(&streams, t, || {
                    nccl_group(&call, || {
                        for (r, (_, ctx, stream)) in gpus.iter().enumerate() {
                            ctx.bind_to_thread().map_err(describe)?;
                            let (ps, pr) =
                                (bufs[r].0 .1 as *const c_void, bufs[r].1 .1 as *mut c_void);
                            let (cu, comm) =
                                (stream.cu_stream() as nccl_sys::cudaStream_t, comms[r].raw);
                            let bf16 = nccl_sys::ncclDataType_t::ncclBfloat16;
                            let sum = nccl_sys::ncclRedOp_t::ncclSum;
                            // SAFETY: the buffers hold what `sides` says, on this
                            // communicator's device, and live until after the timing.
                            unsafe {
                                match op {
                                    CollOp::AllReduce => nccl::all_reduce(
                                        ps,
                                        pr,
                                        (send / 2) as usize,
                                        bf16,
                                        sum,
                                        comm,
                                        cu,
                                    ),
                                    CollOp::AllGather => nccl::all_gather(
                                        ps,
                                        pr,
                                        (send / 2) as usize,
                                        bf16,
                                        comm,
                                        cu,
                                    ),
                                    CollOp::ReduceScatter => nccl::reduce_scatter(
                                        ps,
                                        pr,
                                        (recv / 2) as usize,
                                        bf16,
                                        sum,
                                        comm,
                                        cu,
                                    ),
                                }
                            }
                            .map(|_| ())
                            .map_err(|e| {
                                format!("{call}: rank {r}: {}", nccl_describe(&e, Some(comm)))
                            })?;
                        }
                        Ok(())
                    })
                })?;
                points.push((op, bytes, median(&secs).unwrap_or(0.0)));
                for (_, _, s) in &gpus {
                    s.synchronize().map_err(describe)?;
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

/// A device allocation made with `cuMemAlloc` (not from a memory pool, whose peer
/// access `cuCtxEnablePeerAccess` does not govern), freed on drop.
struct PlainBuf {
    ctx: Arc<CudaContext>,
    ptr: drv_sys::CUdeviceptr,
}

impl PlainBuf {
    fn new(
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        bytes: u64,
        what: &str,
    ) -> Result<PlainBuf, String> {
        ctx.bind_to_thread().map_err(describe)?;
        let n = usize::try_from(bytes).map_err(|_| {
            format!("{what}: {bytes} bytes do not fit this machine's address space")
        })?;
        // SAFETY: the context is current; the memory is freed in `drop`.
        let ptr =
            unsafe { drv::malloc_sync(n) }.map_err(|e| oom_or(e, ctx, ordinal, what, bytes))?;
        Ok(PlainBuf {
            ctx: ctx.clone(),
            ptr,
        })
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

/// Enables access from `ctx` to `peer`'s memory when the devices allow it; says
/// whether it is on.
fn enable_peer(ctx: &Arc<CudaContext>, peer: &Arc<CudaContext>) -> Result<bool, String> {
    let mut can: c_int = 0;
    // SAFETY: two device handles from live contexts; writes one int.
    unsafe { drv_sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer.cu_device()) }
        .result()
        .map_err(|e| format!("cuDeviceCanAccessPeer: {}", describe(e)))?;
    if can == 0 {
        return Ok(false);
    }
    ctx.bind_to_thread().map_err(describe)?;
    // SAFETY: the peer's live context, flags 0 as the API requires.
    match unsafe { drv_sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) }.result() {
        Ok(()) => Ok(true),
        Err(e) if e.0 == drv_sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
        Err(e) => Err(format!("cuCtxEnablePeerAccess: {}", describe(e))),
    }
}

/// The peer-copy benchmark's results: whether peer access was on each way, and
/// (source, destination, bytes, median seconds) for each direction and size.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerTimes {
    pub peer_access: [bool; 2],
    pub points: Vec<(usize, usize, u64, f64)>,
}

/// Times `cuMemcpyPeerAsync` of each size from device `a` to device `b` and back,
/// each on the source's stream, with peer access enabled where the devices allow
/// it (otherwise the driver stages the copy through the host).
pub fn peer_copies(a: usize, b: usize, sizes: &[u64], t: Timing) -> Result<PeerTimes, String> {
    check_timing(t)?;
    if a == b {
        return Err(format!("a peer copy needs two devices: both are {a}"));
    }
    let Some(&max) = sizes.iter().max() else {
        return Err("no copy size to time".into());
    };
    if sizes.contains(&0) {
        return Err("a copy of 0 bytes: give sizes of 1 byte or more".into());
    }
    guarded(|| {
        device(a)?;
        device(b)?;
        let (ca, cb) = (context(a)?, context(b)?);
        let stream = |ctx: &Arc<CudaContext>, o: usize| {
            ctx.bind_to_thread().map_err(describe)?;
            ctx.new_stream()
                .map_err(|e| format!("creating a CUDA stream on device {o}: {}", describe(e)))
        };
        let (sa, sb) = (stream(&ca, a)?, stream(&cb, b)?);
        let peer_access = [enable_peer(&ca, &cb)?, enable_peer(&cb, &ca)?];
        let what = format!("a peer-copy buffer of {max} bytes");
        for (ctx, o) in [(&ca, a), (&cb, b)] {
            let (free, _) = mem_info(ctx, o)?;
            if max > free {
                return Err(out_of_memory(ctx, o, &what, max));
            }
        }
        let (ba, bb) = (
            PlainBuf::new(&ca, a, max, &what)?,
            PlainBuf::new(&cb, b, max, &what)?,
        );
        let mut points = Vec::with_capacity(2 * sizes.len());
        for (src, dst, cs, cd, s, ps, pd) in [
            (a, b, &ca, &cb, &sa, ba.ptr, bb.ptr),
            (b, a, &cb, &ca, &sb, bb.ptr, ba.ptr),
        ] {
            for &bytes in sizes {
                let secs = timed_calls(&[(cs, s)], t, || {
                    // SAFETY: both buffers hold `max >= bytes` bytes and outlive the copies.
                    unsafe {
                        drv::memcpy_peer_async(
                            cd.cu_ctx(),
                            pd,
                            cs.cu_ctx(),
                            ps,
                            bytes as usize,
                            s.cu_stream(),
                        )
                    }
                    .map_err(|e| {
                        format!(
                            "copying {bytes} bytes from device {src} to {dst}: {}",
                            describe(e)
                        )
                    })
                })?;
                points.push((src, dst, bytes, median(&secs).unwrap_or(0.0)));
            }
            s.synchronize().map_err(describe)?;
        }
        Ok(PeerTimes {
            peer_access,
            points,
        })
    })
}

#[cfg(test)]
mod tests {
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
        let e = |r: Result<GemmTimes, String>| r.unwrap_err();
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
        assert!(memory(0, &[], t(1)).unwrap_err().contains("no buffer size"));
        assert!(memory(0, &[0, 8], t(1)).unwrap_err().contains("0 bytes"));
        let c = |o: &[usize], s: &[u64]| collectives(o, &[CollOp::AllReduce], s, t(1)).unwrap_err();
        assert!(c(&[0, 0], &[1024]).contains("repeat one"));
        assert!(c(&[0, 1], &[1026]).contains("a positive multiple of 4 bytes"));
        assert!(c(&[0], &[0]).contains("positive multiple of 2 bytes"));
        assert!(peer_copies(1, 1, &[8], t(1))
            .unwrap_err()
            .contains("two devices"));
        assert!(peer_copies(0, 1, &[0], t(1))
            .unwrap_err()
            .contains("0 bytes"));
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
        // SAFETY: cudarc's probe of whether the driver library opens.
        if unsafe { drv_sys::is_culib_present() } {
            return;
        }
        let no_driver = |e: String| crate::cuda::tests::no_driver::<()>(&Err(e));
        assert!(no_driver(device_info(0).unwrap_err()));
        assert!(no_driver(gemms(0, &[shape(64, 64, 64)], t(2)).unwrap_err()));
        assert!(no_driver(memory(0, &[1024], t(2)).unwrap_err()));
        assert!(no_driver(
            collectives(&[0], &[CollOp::AllGather], &[1024], t(2)).unwrap_err()
        ));
        assert!(no_driver(peer_copies(0, 1, &[1024], t(2)).unwrap_err()));
    }
}
