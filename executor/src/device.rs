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

//!
//! The start-up checks are in `check`, the issuing of one op on the stream in `issue`.

mod check;
mod issue;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::culibs::Lib;
use crate::cuload::ensure;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use sextant_planner::ranks::{GroupKind, RankMap};

use crate::cuda::ffi::{copy_htod, nccl, DevBuf};
use crate::cuda::{
    bind, close_gate, context, describe, device, driver, fill_pattern, guarded, host_size,
    keep_pool, mem_info, nccl_describe, nccl_loaded, new_blas, new_stream, oom_or, pool_bytes,
    reset_pool_peak, timing_event, Blas, Comm, Pool, PoolBytes,
};
use crate::error::CudaError;
pub use crate::error::DeviceError;
use crate::record::{DeviceMemory, RankStats};
use crate::trace::{book, peaks, Op, Scratch};

use check::{check_communicators, check_gemms};
use issue::{gate_batches, Issue};

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

/// A device buffer of `bytes`, with its address.
type Buf = DevBuf;

fn alloc(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    ordinal: usize,
    bytes: u64,
    what: &str,
) -> Result<Buf, CudaError> {
    // `bytes.max(2)` is `bytes` wherever it does not fit.
    let n = host_size(bytes.max(2), what)?;
    // Uninitialised: the buffer is written (filled, or by the ops) before it is read.
    DevBuf::alloc(stream, n).map_err(|e| oom_or(e, ctx, ordinal, what, bytes))
}

/// Runs `warmup + steps` steps of the program and returns the timed steps' statistics.
pub fn run_device(job: &DeviceJob) -> Result<RankStats, DeviceError> {
    if job.program.len() > MAX_PROGRAM_OPS {
        return Err(DeviceError::TooManyOps(job.program.len()));
    }
    if job.unique_id.len() != 128 {
        return Err(DeviceError::UniqueId(job.unique_id.len()));
    }
    guarded(|| run(job))
}

/// The world communicator and one per group kind (in [`GroupKind::ALL`] order).
/// Declared first in [`Gpu`], so they are aborted (on an early exit) before anything
/// else goes.
struct Comms {
    world: Comm,
    kinds: Vec<Comm>,
}

impl Comms {
    /// The communicator of this rank's group of `kind`.
    fn of(&self, kind: GroupKind) -> &Comm {
        &self.kinds[kind.index()]
    }
}

/// What a rank opens on its GPU, dropped in field order.
struct Gpu {
    comms: Comms,
    blas: Blas,
    pool: Option<Pool>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    ordinal: usize,
}

fn open(job: &DeviceJob, memory: &mut DeviceMemory) -> Result<Gpu, DeviceError> {
    let ordinal = job.ordinal;
    set(job.phase, "opening the GPU".into());
    device(ordinal)?;
    nccl_loaded()?;
    ensure(Lib::Cublas).map_err(CudaError::from)?;
    let ctx = context(ordinal)?;
    bind(&ctx)?;
    let pool = keep_pool(&ctx, ordinal)?;
    let stream = new_stream(&ctx, ordinal)?;
    (memory.free_with_context_bytes, memory.total_bytes) = mem_info(&ctx, ordinal)?;
    let blas = new_blas(&stream, ordinal)?;
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

fn communicators(job: &DeviceJob) -> Result<Comms, DeviceError> {
    let (map, rank, world) = (job.map, job.rank, job.map.world_size);
    let me = &map.ranks[rank as usize];
    let mut internal = [0 as std::ffi::c_char; 128];
    for (d, &s) in internal.iter_mut().zip(job.unique_id) {
        *d = s as std::ffi::c_char;
    }
    let mut made = Vec::with_capacity(1);
    Comm::init_rank(world, nccl::UniqueId { internal }, rank, &mut made).map_err(|e| {
        CudaError::NcclInit {
            rank,
            ranks: world,
            device: None,
            status: nccl_describe(&e, None),
        }
    })?;
    let world_comm = made
        .pop()
        .ok_or(DeviceError::NoCommunicator { rank, world })?;
    let mut comms = Comms {
        world: world_comm,
        kinds: Vec::with_capacity(GroupKind::ALL.len()),
    };
    // One communicator per group kind, split in the same order on every rank.
    for kind in GroupKind::ALL {
        let idx = me.group_index_of(kind);
        let members = map.group_of(rank, kind);
        let key = members
            .iter()
            .position(|&q| q == rank)
            .ok_or(DeviceError::NotInGroup { rank, kind })?;
        let comm = comms
            .world
            .split(idx as u64, key as u64, members.len() as u64)
            .map_err(|e| CudaError::NcclSplit {
                kind,
                status: nccl_describe(&e, Some(&comms.world)),
            })?;
        comms.kinds.push(comm);
    }
    Ok(comms)
}

/// Fills each `(buffer, size)` with `pattern` repeated, and waits for the copies.
fn fill_scratch(
    stream: &Arc<CudaStream>,
    bufs: [(&Buf, u64); 2],
    pattern: &[u8],
) -> Result<(), DeviceError> {
    for (buf, size) in bufs {
        let mut off = 0u64;
        while off < size {
            let n = (pattern.len() as u64).min(size - off);
            let piece = buf
                .span()
                .at(off, n)
                .ok_or(DeviceError::ScratchSize { size })?;
            copy_htod(stream, piece, &pattern[..n as usize])
                .map_err(|e| DeviceError::FillScratch(describe(e)))?;
            off += n;
        }
    }
    Ok(stream.synchronize().map_err(driver)?)
}

/// The pool's peaks after the timed steps: reserved (over the whole run), used, and
/// how much the timed steps grew it.
fn pool_peaks(
    pool: Pool,
    memory: &mut DeviceMemory,
    reserved_peak: u64,
    reserved_at_timed_start: u64,
) -> Result<(), CudaError> {
    let high = pool_bytes(pool, PoolBytes::ReservedHigh)?;
    memory.pool_reserved_peak_bytes = reserved_peak.max(high);
    memory.pool_used_peak_bytes = pool_bytes(pool, PoolBytes::UsedHigh)?;
    memory.pool_grown_in_timed_steps_bytes = high.saturating_sub(reserved_at_timed_start);
    Ok(())
}

fn run(job: &DeviceJob) -> Result<RankStats, DeviceError> {
    let (map, rank) = (job.map, job.rank);
    let mut memory = DeviceMemory {
        rank,
        ..DeviceMemory::default()
    };
    let mut gpu = open(job, &mut memory)?;
    let (ctx, stream, ordinal) = (&gpu.ctx, &gpu.stream, gpu.ordinal);
    let group_size = |k: GroupKind| map.group_of(rank, k).len() as u64;
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
    fill_scratch(stream, [(&a, sc.a.max(2)), (&b, sc.b.max(2))], &pattern)?;

    set(job.phase, "checking the communicators and the GEMMs".into());
    check_communicators(&gpu, job, &mut stats.checks)?;
    check_gemms(
        &gpu,
        job.program,
        (a.span(), b.span(), c.span()),
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
        a: a.span(),
        b: b.span(),
        c: c.span(),
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
                reserved_peak = pool_bytes(pool, PoolBytes::ReservedHigh)?;
                reserved_at_timed_start = pool_bytes(pool, PoolBytes::ReservedCurrent)?;
                reset_pool_peak(pool)?;
            }
        }
        set(
            job.phase,
            format!("step {step}: issuing its {} ops", job.program.len()),
        );
        for (bi, (range, gated)) in batches.iter().enumerate() {
            let gate = if *gated {
                Some(close_gate(stream)?)
            } else {
                None
            };
            starts[bi].record(stream).map_err(driver)?;
            for i in range.clone() {
                issue.op(&job.program[i], &mut kept)?;
                ends[i].record(stream).map_err(driver)?;
            }
            drop(gate);
        }
        set(job.phase, format!("step {step}: waiting for the GPU (a peer's collective or transfer that never arrives hangs here)"));
        stream.synchronize().map_err(|e| DeviceError::Step {
            step,
            status: describe(e),
        })?;
        if step < job.warmup {
            continue;
        }
        for (i, op) in job.program.iter().enumerate() {
            let secs = start_of(i).elapsed_ms(&ends[i]).map_err(driver)? as f64 / 1e3;
            book(&mut stats, op, secs, group_size);
        }
        let step_secs = match ends.last() {
            Some(end) if first < ends.len() => {
                start_of(first).elapsed_ms(end).map_err(driver)? as f64 / 1e3
            }
            _ => 0.0,
        };
        stats.step_secs.push(step_secs);
    }
    (memory.free_after_steps_bytes, _) = mem_info(ctx, ordinal)?;
    if let Some(pool) = gpu.pool {
        pool_peaks(pool, &mut memory, reserved_peak, reserved_at_timed_start)?;
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
                class: sextant_planner::walk::OpClass::Mlp,
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
        if !crate::cuda::ffi::driver_present() {
            assert!(crate::cuda::tests::no_driver(&r), "{r:?}");
        }
        let short = [0u8; 16];
        let bad = DeviceJob {
            unique_id: &short,
            ..job
        };
        assert!(run_device(&bad)
            .unwrap_err()
            .to_string()
            .contains("128 bytes"));
        let long = vec![Op::Barrier; MAX_PROGRAM_OPS + 1];
        let too_long = DeviceJob {
            program: &long,
            unique_id: &id,
            ..bad
        };
        assert!(run_device(&too_long)
            .unwrap_err()
            .to_string()
            .contains("--micro-batches"));
    }
}
