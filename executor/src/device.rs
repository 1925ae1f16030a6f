//! The CUDA backend's step: runs one rank's device program ([`crate::trace`]) on its
//! GPU, op by op on one stream, and times each op with CUDA events.
//!
//! - GEMMs run through cuBLAS (`cublasGemmEx`, batched attention products through
//!   `cublasGemmStridedBatchedEx`), BF16 in and out with FP32 accumulation, on
//!   scratch operands filled with small pseudo-random values.
//! - Collectives run through NCCL on one communicator per group kind, split from a
//!   world communicator (`ncclCommSplit`, NCCL 2.18 or later); all-to-alls and
//!   pipeline / CP transfers as grouped `ncclSend` / `ncclRecv`. Every group is
//!   ended on every path out of it ([`crate::cuda::nccl_group`]).
//! - Element-wise work (norms, activations, the optimizer's update) runs as device
//!   copies of the bytes the cost model charges for it: its time measures HBM
//!   traffic, not a fused kernel.
//! - Weights, gradients and optimizer state are allocated at their sharded sizes,
//!   and each micro-batch's stored activations from its forward to its backward, so
//!   the run's peak memory is the plan's. They come from the device's memory pool,
//!   set to keep freed memory ([`crate::cuda::keep_pool`]): a timed step reuses what
//!   the step before it freed instead of mapping it again.
//!
//! Before the steps two checks run: every communicator sums its members' ranks (a
//! wrong split gives a wrong sum), and every distinct GEMM shape runs once on the
//! fill pattern with sampled entries of its result compared with the host's.
//!
//! Ops are issued in batches behind a host gate ([`crate::cuda::Gate`]): the stream
//! waits until the whole batch is queued, so an op's events time the GPU's work and
//! not the host's launch gaps. Each batch starts with an event of its own, so the gap
//! before a batch is in no op's time (it is in the step's). Everything runs on one
//! stream, so an op's time is its own (communication is not overlapped with compute
//! here); the time between two events also holds any wait for a peer that has not
//! reached the same collective yet.
//!
//! The run records device memory ([`DeviceMemory`]): `cuMemGetInfo` once the
//! context exists, once the communicators and cuBLAS exist, and after the timed
//! steps, and the pool's peaks.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::culibs::Lib;
use crate::cuload::{ensure, nccl};
use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr,
};
use cudarc::nccl::sys as nccl_sys;
use sextant_planner::ranks::{RankMap, GROUP_KINDS};

use crate::cuda::{
    bf16_gemm, context, describe, device, fill_pattern, guarded, keep_pool, mem_info,
    nccl_describe, nccl_group, nccl_loaded, oom_or, pool_bytes, reset_pool_peak, timing_event,
    Blas, Comm, Gate,
};
use crate::record::{Checks, DeviceMemory, RankStats};
use crate::trace::{book, coll_sides, peaks, Coll, Op, Scratch, COPY_PIECE};

/// Longest program the backend records events for (one per op and one per gate
/// batch); cut the step down with --micro-batches.
pub const MAX_PROGRAM_OPS: usize = 4_000_000;

/// Stream entries (launches, copies, NCCL calls, events) queued behind one host gate:
/// well under the driver's launch queue (about a thousand), which would otherwise
/// block the host behind its own gate.
const GATE_ENTRIES: u64 = 256;

/// Elements of the BF16 fill pattern in the scratch operands (2 MiB), repeated.
const PATTERN_ELEMS: usize = 1 << 20;

/// Largest error of a sampled GEMM result, relative to the sum of its terms'
/// magnitudes: BF16 rounding of the output is 2^-9 of it, FP32 accumulation far
/// less; wrong leading dimensions, strides or operand order give errors near 1.
const GEMM_TOLERANCE: f64 = 1.0 / 64.0;

/// What one rank's run needs besides its program.
pub struct DeviceJob<'a> {
    pub ordinal: usize,
    pub unique_id: &'a [u8],
    pub rank: u64,
    pub map: &'a RankMap,
    pub program: &'a [Op],
    /// Model state bytes: (weights, gradients, optimizer).
    pub footprint: (u64, u64, u64),
    pub warmup: u64,
    pub steps: u64,
    /// What the rank is doing, for the watchdog's message.
    pub phase: &'a Mutex<String>,
}

fn set(phase: &Mutex<String>, p: String) {
    *phase.lock().unwrap_or_else(|e| e.into_inner()) = p;
}

/// A device buffer of `bytes`, with its raw address.
struct Buf {
    _slice: CudaSlice<u8>,
    ptr: u64,
}

fn alloc(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    ordinal: usize,
    bytes: u64,
    what: &str,
) -> Result<Buf, String> {
    let n = usize::try_from(bytes.max(2))
        .map_err(|_| format!("{what}: {bytes} bytes do not fit this machine's address space"))?;
    // SAFETY: the buffer is written (filled, or by the ops) before it is read.
    let slice =
        unsafe { stream.alloc::<u8>(n) }.map_err(|e| oom_or(e, ctx, ordinal, what, bytes))?;
    let ptr = {
        let (p, _sync) = slice.device_ptr(stream);
        p
    };
    Ok(Buf { _slice: slice, ptr })
}

/// Runs `warmup + steps` steps of the program and returns the timed steps' statistics.
pub fn run_device(job: &DeviceJob) -> Result<RankStats, String> {
    if job.program.len() > MAX_PROGRAM_OPS {
        return Err(format!("this rank's step is {} ops, more than the {MAX_PROGRAM_OPS} the CUDA backend times: cut it down with --micro-batches or --scale-layers", job.program.len()));
    }
    if job.unique_id.len() != 128 {
        return Err(format!(
            "an NCCL unique id is 128 bytes, got {}",
            job.unique_id.len()
        ));
    }
    guarded(|| run(job))
}

/// The world communicator and one per group kind (in `GROUP_KINDS` order). Declared
/// first in [`Gpu`], so they are aborted (on an early exit) before anything else goes.
struct Comms {
    world: Comm,
    kinds: Vec<Comm>,
}

/// What a rank opens on its GPU, dropped in field order.
struct Gpu {
    comms: Comms,
    blas: Blas,
    pool: Option<drv_sys::CUmemoryPool>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    ordinal: usize,
}

fn open(job: &DeviceJob, memory: &mut DeviceMemory) -> Result<Gpu, String> {
    let ordinal = job.ordinal;
    set(job.phase, "opening the GPU".into());
    device(ordinal)?;
    nccl_loaded()?;
    ensure(Lib::Cublas)?;
    let ctx = context(ordinal)?;
    ctx.bind_to_thread().map_err(describe)?;
    let pool = keep_pool(&ctx, ordinal)?;
    let stream = ctx.new_stream().map_err(|e| {
        format!(
            "creating a CUDA stream on device {ordinal}: {}",
            describe(e)
        )
    })?;
    (memory.free_with_context_bytes, memory.total_bytes) = mem_info(&ctx, ordinal)?;
    let blas = Blas::new(&stream, ordinal)?;
    set(job.phase, "creating NCCL communicators".into());
    let comms = communicators(job)?;
    (memory.free_before_run_bytes, _) = mem_info(&ctx, ordinal)?;
    Ok(Gpu {
        comms,
        blas,
        pool,
        stream,
        ctx,
        ordinal,
    })
}

fn communicators(job: &DeviceJob) -> Result<Comms, String> {
    let (map, rank, world) = (job.map, job.rank, job.map.world_size);
    let me = &map.ranks[rank as usize];
    let mut internal = [0 as std::ffi::c_char; 128];
    for (d, &s) in internal.iter_mut().zip(job.unique_id) {
        *d = s as std::ffi::c_char;
    }
    let mut raw: nccl_sys::ncclComm_t = std::ptr::null_mut();
    // SAFETY: `raw` is written by NCCL; the id is the 128 bytes rank 0 made.
    unsafe {
        nccl::comm_init_rank(
            &mut raw,
            world as c_int,
            nccl_sys::ncclUniqueId { internal },
            rank as c_int,
        )
    }
    .map_err(|e| {
        format!(
            "ncclCommInitRank (rank {rank} of {world}) failed: {}",
            nccl_describe(&e, None)
        )
    })?;
    let mut comms = Comms {
        world: Comm {
            raw,
            finished: false,
        },
        kinds: Vec::with_capacity(GROUP_KINDS.len()),
    };
    // One communicator per group kind, split in GROUP_KINDS order on every rank.
    for (k, kind) in GROUP_KINDS.iter().enumerate() {
        let idx = me.group_index[k];
        let key = map
            .group_of(rank, k)
            .iter()
            .position(|&q| q == rank)
            .ok_or_else(|| format!("rank {rank} is not in its own {kind} group"))?;
        let mut raw: nccl_sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: a live parent communicator; `raw` is written by NCCL.
        unsafe {
            nccl::comm_split(
                comms.world.raw,
                idx as c_int,
                key as c_int,
                &mut raw,
                std::ptr::null_mut(),
            )
        }
        .map_err(|e| {
            format!(
                "ncclCommSplit for the {kind} groups failed (NCCL 2.18 or later is needed): {}",
                nccl_describe(&e, Some(comms.world.raw))
            )
        })?;
        comms.kinds.push(Comm {
            raw,
            finished: false,
        });
    }
    Ok(comms)
}

/// Every communicator (the world's first, then one per group kind) sums its members'
/// `rank + 1` in FP32, all of them in one NCCL group: a rank split into the wrong
/// group gives a wrong sum here rather than a wrong timing later.
fn check_communicators(gpu: &Gpu, job: &DeviceJob, checks: &mut Checks) -> Result<(), String> {
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
    let cu = gpu.stream.cu_stream();
    let mine = vec![(job.rank + 1) as f32; n as usize];
    // SAFETY: `buf` holds 2n floats; the first n are written here.
    unsafe { drv::memcpy_htod_async(buf.ptr, &mine, cu) }
        .map_err(|e| format!("checking the communicators: {}", describe(e)))?;
    nccl_group("checking the communicators", || {
        for (i, comm) in comms.iter().enumerate() {
            let i = i as u64;
            // SAFETY: one float each way, inside `buf`, on this rank's stream.
            unsafe {
                nccl::all_reduce(
                    (buf.ptr + 4 * i) as *const c_void,
                    (buf.ptr + 4 * (n + i)) as *mut c_void,
                    1,
                    nccl_sys::ncclDataType_t::ncclFloat32,
                    nccl_sys::ncclRedOp_t::ncclSum,
                    comm.raw,
                    cu as _,
                )
            }
            .map_err(|e| {
                format!(
                    "checking the communicators: ncclAllReduce failed: {}",
                    nccl_describe(&e, Some(comm.raw))
                )
            })?;
        }
        Ok(())
    })?;
    let mut got = vec![0f32; n as usize];
    // SAFETY: the last n floats of `buf` into `got`; the stream is synchronised below.
    unsafe { drv::memcpy_dtoh_async(&mut got, buf.ptr + 4 * n, cu) }
        .map_err(|e| format!("checking the communicators: {}", describe(e)))?;
    gpu.stream
        .synchronize()
        .map_err(|e| format!("checking the communicators: {}", describe(e)))?;
    for (i, g) in got.iter().enumerate() {
        let (kind, members): (&str, Vec<u64>) = match i {
            0 => ("world", (0..job.map.world_size).collect()),
            _ => (
                GROUP_KINDS[i - 1],
                job.map.group_of(job.rank, i - 1).to_vec(),
            ),
        };
        let want = members.iter().map(|q| q + 1).sum::<u64>() as f32;
        if *g != want {
            return Err(format!("the {kind} communicator of rank {} summed its members' rank + 1 to {g}, but its members {members:?} sum to {want}: NCCL grouped the ranks differently from the plan", job.rank));
        }
    }
    checks.collectives += n;
    Ok(())
}

/// A BF16 value of the fill pattern as f64.
fn pattern_value(pattern: &[u16], index: u64) -> f64 {
    let h = pattern[(index % pattern.len() as u64) as usize];
    f64::from(f32::from_bits(u32::from(h) << 16))
}

/// Runs each distinct GEMM shape of the program once on the scratch operands, which
/// then hold only the fill pattern, and compares sampled entries of C (first and
/// last product of a batch, corners and middle) with the same sums on the host: a
/// wrong leading dimension, stride or operand order shows here.
fn check_gemms(
    gpu: &Gpu,
    program: &[Op],
    (a, b, c): (u64, u64, u64),
    pattern: &[u16],
    checks: &mut Checks,
) -> Result<(), String> {
    let mut shapes: BTreeMap<(u64, u64, u64, u64), &str> = BTreeMap::new();
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
    let cu = gpu.stream.cu_stream();
    for (&(m, n, k, batch), class) in &shapes {
        let shape = format!("the {class} GEMM {m}x{n}x{k} (batch {batch})");
        bf16_gemm(&gpu.blas, (m, n, k), batch, (a, b, c)).map_err(|e| format!("{shape}: {e}"))?;
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
            // SAFETY: one element of C (row-major m x n per product) into `g`.
            unsafe { drv::memcpy_dtoh_async(g, c + offset, cu) }
                .map_err(|e| format!("{shape}: reading its result: {}", describe(e)))?;
        }
        gpu.stream
            .synchronize()
            .map_err(|e| format!("{shape}: {}", describe(e)))?;
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
                return Err(format!("{shape}: C[{q}][{r}][{col}] is {got}, the host computes {want:.6} (relative error {rel:.2e}, more than {GEMM_TOLERANCE:.2e}): cuBLAS was called with arguments that do not describe the operands"));
            }
            checks.max_rel_error = checks.max_rel_error.max(rel);
        }
        checks.gemm_results += 1;
    }
    Ok(())
}

/// Stream entries an op queues: its launches, copies or NCCL calls (an allocation or
/// a free with the events cudarc tracks it by), and the event after it.
fn entries(op: &Op, group_size: &impl Fn(usize) -> u64) -> u64 {
    1 + match op {
        Op::Gemm { count, .. } => *count,
        Op::Memory { bytes, .. } => (bytes / 2).div_ceil(COPY_PIECE),
        Op::Coll {
            op: Coll::AllToAll,
            group,
            ..
        } => 2 * group_size(*group),
        Op::Coll { .. } | Op::Barrier => 1,
        Op::P2p { sends, recvs, .. } => (sends.len() + recvs.len()) as u64,
        Op::Keep { .. } | Op::Free { .. } => 4,
    }
}

/// The program cut into gate batches of at most [`GATE_ENTRIES`] entries: `true`
/// where the batch is gated. An op bigger than a batch runs alone and ungated (the
/// host would block on the full launch queue behind its own gate), and so do the
/// allocations and frees where the device has no memory pool (a free would then
/// synchronise the stream behind the gate).
fn gate_batches(
    program: &[Op],
    group_size: &impl Fn(usize) -> u64,
    pools: bool,
) -> Vec<(Range<usize>, bool)> {
    let mut out: Vec<(Range<usize>, bool)> = Vec::new();
    let mut start = 0;
    let mut used = 0;
    for (i, op) in program.iter().enumerate() {
        let e = entries(op, group_size);
        let alone = e > GATE_ENTRIES || (!pools && matches!(op, Op::Keep { .. } | Op::Free { .. }));
        if alone || used + e > GATE_ENTRIES {
            if start < i {
                out.push((start..i, true));
            }
            start = i;
            used = 0;
        }
        if alone {
            out.push((i..i + 1, false));
            start = i + 1;
        } else {
            used += e;
        }
    }
    if start < program.len() {
        out.push((start..program.len(), true));
    }
    out
}

/// What the ops run on.
struct Issue<'a> {
    gpu: &'a Gpu,
    /// Scratch A (GEMM inputs, sends), B (GEMM weights, receives), C (GEMM outputs).
    a: u64,
    b: u64,
    c: u64,
    group_size: &'a dyn Fn(usize) -> u64,
}

fn nccl_err(what: &str, comm: nccl_sys::ncclComm_t) -> impl Fn(nccl::NcclError) -> String + '_ {
    move |e| format!("{what} failed: {}", nccl_describe(&e, Some(comm)))
}

impl Issue<'_> {
    fn op(&self, op: &Op, kept: &mut HashMap<(u64, u64), Buf>) -> Result<(), String> {
        let gpu = self.gpu;
        let cu = gpu.stream.cu_stream();
        let bf16 = nccl_sys::ncclDataType_t::ncclBfloat16;
        let sum = nccl_sys::ncclRedOp_t::ncclSum;
        let (a, b, c) = (self.a, self.b, self.c);
        match op {
            Op::Gemm {
                class,
                m,
                n,
                k,
                batch,
                count,
                ..
            } => {
                for _ in 0..*count {
                    bf16_gemm(&gpu.blas, (*m, *n, *k), *batch, (a, b, c))
                        .map_err(|e| format!("the {class} GEMM: {e}"))?;
                }
            }
            Op::Memory { bytes, .. } => {
                let mut left = bytes / 2;
                while left > 0 {
                    let n = left.min(COPY_PIECE);
                    // SAFETY: scratch A and B each hold at least one copy piece.
                    unsafe { drv::memcpy_dtod_async(b, a, n as usize, cu) }
                        .map_err(|e| format!("element-wise copy of {n} bytes: {}", describe(e)))?;
                    left -= n;
                }
            }
            Op::Coll {
                group,
                op: kind,
                bytes,
                ..
            } => {
                let comm = gpu.comms.kinds[*group].raw;
                let n = (self.group_size)(*group);
                let what = format!(
                    "{} of {bytes} bytes over the {} group",
                    kind.label(),
                    GROUP_KINDS[*group]
                );
                let (snd, _) = coll_sides(*kind, *bytes, n);
                let (pa, pb) = (a as *const c_void, b as *mut c_void);
                let s = cu as _;
                // SAFETY (all four): scratch A holds the send side and B the receive
                // side of every collective of the program (`Scratch::of`).
                match kind {
                    Coll::AllGather => {
                        unsafe { nccl::all_gather(pa, pb, (snd / 2) as usize, bf16, comm, s) }
                            .map(|_| ())
                            .map_err(nccl_err(&what, comm))
                    }
                    Coll::ReduceScatter => unsafe {
                        nccl::reduce_scatter(pa, pb, (bytes / n / 2) as usize, bf16, sum, comm, s)
                    }
                    .map(|_| ())
                    .map_err(nccl_err(&what, comm)),
                    Coll::AllReduce => unsafe {
                        nccl::all_reduce(pa, pb, (bytes / 2) as usize, bf16, sum, comm, s)
                    }
                    .map(|_| ())
                    .map_err(nccl_err(&what, comm)),
                    Coll::AllToAll => nccl_group(&what, || {
                        let part = bytes / n / 2 * 2;
                        for j in 0..n {
                            // SAFETY: part j of A and of B, inside their scratch
                            // buffers (n parts of `part` bytes, `Scratch::of`).
                            unsafe {
                                nccl::send(
                                    (a + j * part) as *const c_void,
                                    (part / 2) as usize,
                                    bf16,
                                    j as c_int,
                                    comm,
                                    s,
                                )
                            }
                            .map_err(nccl_err(&what, comm))?;
                            // SAFETY: the same part of B.
                            unsafe {
                                nccl::recv(
                                    (b + j * part) as *mut c_void,
                                    (part / 2) as usize,
                                    bf16,
                                    j as c_int,
                                    comm,
                                    s,
                                )
                            }
                            .map_err(nccl_err(&what, comm))?;
                        }
                        Ok(())
                    }),
                }?;
            }
            Op::P2p { kind, sends, recvs } => {
                let comm = gpu.comms.world.raw;
                let what = format!("{kind} transfers (sends {sends:?}, receives {recvs:?})");
                let s = cu as _;
                nccl_group(&what, || {
                    for &(to, bytes) in sends {
                        // SAFETY: scratch A holds the largest send.
                        unsafe {
                            nccl::send(
                                a as *const c_void,
                                (bytes / 2) as usize,
                                bf16,
                                to as c_int,
                                comm,
                                s,
                            )
                        }
                        .map_err(nccl_err(&what, comm))?;
                    }
                    let mut off = 0;
                    for &(from, bytes) in recvs {
                        // SAFETY: scratch B holds all of a group's receives side by side.
                        unsafe {
                            nccl::recv(
                                (b + off) as *mut c_void,
                                (bytes / 2) as usize,
                                bf16,
                                from as c_int,
                                comm,
                                s,
                            )
                        }
                        .map_err(nccl_err(&what, comm))?;
                        off += bytes;
                    }
                    Ok(())
                })?;
            }
            Op::Keep { key, bytes } => {
                let buf = alloc(
                    &gpu.ctx,
                    &gpu.stream,
                    gpu.ordinal,
                    *bytes,
                    &format!(
                        "the stored activations of chunk {} micro-batch {}",
                        key.0, key.1
                    ),
                )?;
                kept.insert(*key, buf);
            }
            Op::Free { key } => {
                kept.remove(key);
            }
            Op::Barrier => {
                let comm = gpu.comms.world.raw;
                // SAFETY: one element of scratch A and B.
                unsafe {
                    nccl::all_reduce(
                        a as *const c_void,
                        b as *mut c_void,
                        1,
                        bf16,
                        sum,
                        comm,
                        cu as _,
                    )
                }
                .map_err(nccl_err("the step's barrier", comm))?;
            }
        }
        Ok(())
    }
}

fn run(job: &DeviceJob) -> Result<RankStats, String> {
    let (map, rank) = (job.map, job.rank);
    let mut memory = DeviceMemory {
        rank,
        ..DeviceMemory::default()
    };
    let mut gpu = open(job, &mut memory)?;
    let (ctx, stream, ordinal) = (&gpu.ctx, &gpu.stream, gpu.ordinal);
    let group_size = |k: usize| map.group_of(rank, k).len() as u64;
    let mut stats = RankStats {
        rank,
        ..RankStats::default()
    };

    set(job.phase, "allocating model state and scratch".into());
    let (wb, gb, ob) = job.footprint;
    let _weights = alloc(ctx, stream, ordinal, wb, "the weights")?;
    let _grads = alloc(ctx, stream, ordinal, gb, "the gradients")?;
    let _optimizer = alloc(ctx, stream, ordinal, ob, "the optimizer state")?;
    let sc = Scratch::of(job.program, group_size);
    let a = alloc(ctx, stream, ordinal, sc.a, "scratch A (GEMM inputs, sends)")?;
    let b = alloc(
        ctx,
        stream,
        ordinal,
        sc.b,
        "scratch B (GEMM weights, receives)",
    )?;
    let c = alloc(ctx, stream, ordinal, sc.c, "scratch C (GEMM outputs)")?;
    // Small pseudo-random BF16 values in A and B: all-zero operands would run the
    // tensor cores at lower power than training does.
    let pattern16 = fill_pattern(PATTERN_ELEMS);
    let pattern: Vec<u8> = pattern16.iter().flat_map(|h| h.to_le_bytes()).collect();
    let cu = stream.cu_stream();
    for (buf, size) in [(&a, sc.a.max(2)), (&b, sc.b.max(2))] {
        let mut off = 0u64;
        while off < size {
            let n = (pattern.len() as u64).min(size - off);
            // SAFETY: `n` bytes at `off` lie inside the buffer of `size` bytes.
            unsafe { drv::memcpy_htod_async(buf.ptr + off, &pattern[..n as usize], cu) }
                .map_err(|e| format!("filling scratch: {}", describe(e)))?;
            off += n;
        }
    }
    stream.synchronize().map_err(describe)?;

    set(job.phase, "checking the communicators and the GEMMs".into());
    check_communicators(&gpu, job, &mut stats.checks)?;
    check_gemms(
        &gpu,
        job.program,
        (a.ptr, b.ptr, c.ptr),
        &pattern16,
        &mut stats.checks,
    )?;

    let batches = gate_batches(job.program, &group_size, gpu.pool.is_some());
    let ends: Vec<CudaEvent> = (0..job.program.len())
        .map(|_| timing_event(ctx))
        .collect::<Result<_, _>>()?;
    let starts: Vec<CudaEvent> = (0..batches.len())
        .map(|_| timing_event(ctx))
        .collect::<Result<_, _>>()?;
    // Where the timed part of a step starts: after its barrier.
    let first = job
        .program
        .iter()
        .position(|o| matches!(o, Op::Barrier))
        .map_or(0, |i| i + 1);
    // An op's time starts at its batch's own event, or at the end of the op before.
    let mut opens = vec![None; job.program.len()];
    for (bi, (r, _)) in batches.iter().enumerate() {
        opens[r.start] = Some(bi);
    }
    let start_of = |i: usize| -> &CudaEvent {
        match opens[i] {
            Some(bi) => &starts[bi],
            None => &ends[i - 1],
        }
    };
    let issue = Issue {
        gpu: &gpu,
        a: a.ptr,
        b: b.ptr,
        c: c.ptr,
        group_size: &group_size,
    };
    let mut kept: HashMap<(u64, u64), Buf> = HashMap::new();
    let mut reserved_at_timed_start = 0;
    let mut reserved_peak = 0;
    for step in 0..job.warmup + job.steps {
        if step == job.warmup {
            // The pool's reserved bytes from here on tell whether a timed step had
            // to map memory again.
            if let Some(pool) = gpu.pool {
                let high = drv_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH;
                let now = drv_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT;
                reserved_peak = pool_bytes(pool, high)?;
                reserved_at_timed_start = pool_bytes(pool, now)?;
                reset_pool_peak(pool)?;
            }
        }
        set(
            job.phase,
            format!("step {step}: issuing its {} ops", job.program.len()),
        );
        for (bi, (range, gated)) in batches.iter().enumerate() {
            let gate = if *gated {
                Some(Gate::close(stream)?)
            } else {
                None
            };
            starts[bi].record(stream).map_err(describe)?;
            for i in range.clone() {
                issue.op(&job.program[i], &mut kept)?;
                ends[i].record(stream).map_err(describe)?;
            }
            drop(gate);
        }
        set(job.phase, format!("step {step}: waiting for the GPU (a peer's collective or transfer that never arrives hangs here)"));
        stream
            .synchronize()
            .map_err(|e| format!("step {step}: {}", describe(e)))?;
        if step < job.warmup {
            continue;
        }
        for (i, op) in job.program.iter().enumerate() {
            let secs = start_of(i).elapsed_ms(&ends[i]).map_err(describe)? as f64 / 1e3;
            book(&mut stats, op, secs, group_size);
        }
        let step_secs = match ends.last() {
            Some(end) if first < ends.len() => {
                start_of(first).elapsed_ms(end).map_err(describe)? as f64 / 1e3
            }
            _ => 0.0,
        };
        stats.step_secs.push(step_secs);
    }
    (memory.free_after_steps_bytes, _) = mem_info(ctx, ordinal)?;
    if let Some(pool) = gpu.pool {
        use drv_sys::CUmemPool_attribute::*;
        let high = pool_bytes(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?;
        memory.pool_reserved_peak_bytes = reserved_peak.max(high);
        memory.pool_used_peak_bytes = pool_bytes(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH)?;
        memory.pool_grown_in_timed_steps_bytes = high.saturating_sub(reserved_at_timed_start);
    }
    set(job.phase, "closing the communicators".into());
    drop(kept);
    for comm in gpu.comms.kinds.iter_mut() {
        comm.finish(stream)?;
    }
    gpu.comms.world.finish(stream)?;
    let (live, bytes) = peaks(job.program);
    stats.peak_live_chunks = live;
    stats.peak_activation_bytes = bytes;
    stats.param_bytes = wb;
    stats.optimizer_bytes = ob;
    stats.device_memory = Some(memory);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sextant_planner::config::{Dispatcher, Layout, Overlap, ParallelConfig, Recompute, Zero};
    use sextant_planner::schedule::Schedule;

    fn one_rank() -> RankMap {
        let cfg = ParallelConfig {
            tp: 1,
            pp: 1,
            vpp: 1,
            cp: 1,
            ep: 1,
            etp: 1,
            dp: 1,
            sp: false,
            mbs: 1,
            zero: Zero::None,
            recompute: Recompute::None,
            layout: Layout::Even,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            recompute_modules: Default::default(),
            moe_dispatcher: Dispatcher::AllToAll,
            schedule: Schedule::default_for(1),
        };
        sextant_planner::ranks::rank_map(&cfg, sextant_planner::config::RANK_ORDER, 8).unwrap()
    }

    #[test]
    fn cuda_device_run_without_a_gpu_is_one_clear_error() {
        let map = one_rank();
        let phase = Mutex::new(String::new());
        let program = vec![
            Op::Barrier,
            Op::Gemm {
                class: "mlp",
                m: 64,
                n: 64,
                k: 64,
                batch: 1,
                count: 1,
                recompute: false,
            },
        ];
        let id = [0u8; 128];
        let job = DeviceJob {
            ordinal: 0,
            unique_id: &id,
            rank: 0,
            map: &map,
            program: &program,
            footprint: (2, 4, 12),
            warmup: 0,
            steps: 1,
            phase: &phase,
        };
        let r = std::panic::catch_unwind(|| run_device(&job)).expect("run_device must not panic");
        // SAFETY: only tries to load the driver library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            assert!(crate::cuda::tests::no_driver(&r), "{r:?}");
        }
        let short = [0u8; 16];
        let bad = DeviceJob {
            unique_id: &short,
            ..job
        };
        assert!(run_device(&bad).unwrap_err().contains("128 bytes"));
        let long = vec![Op::Barrier; MAX_PROGRAM_OPS + 1];
        let too_long = DeviceJob {
            program: &long,
            unique_id: &id,
            ..bad
        };
        assert!(run_device(&too_long)
            .unwrap_err()
            .contains("--micro-batches"));
    }
}
