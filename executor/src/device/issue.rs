//! Issuing the program on the stream: one op at a time (cuBLAS GEMMs, device copies,
//! NCCL collectives and grouped transfers, allocations), in gate batches.

use std::collections::HashMap;
use std::ops::Range;

use sextant_planner::ranks::GroupKind;

use super::{alloc, Buf, Gpu, GATE_ENTRIES};
use crate::cuda::ffi::copy_dtod;
use crate::cuda::ffi::nccl::Elem;
use crate::cuda::{bf16_gemm, describe, nccl_failed, nccl_group, DevSpan};
use crate::error::DeviceError;
use crate::trace::{coll_sides, Coll, CommKind, Op, COPY_PIECE};

/// Stream entries an op queues: its launches, copies or NCCL calls (an allocation or
/// a free with the events cudarc tracks it by), and the event after it.
pub(super) fn entries(op: &Op, group_size: &impl Fn(GroupKind) -> u64) -> u64 {
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
pub(super) fn gate_batches(
    program: &[Op],
    group_size: &impl Fn(GroupKind) -> u64,
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
pub(super) struct Issue<'a> {
    pub(super) gpu: &'a Gpu,
    /// Scratch A (GEMM inputs, sends), B (GEMM weights, receives), C (GEMM outputs).
    pub(super) a: DevSpan<'a>,
    pub(super) b: DevSpan<'a>,
    pub(super) c: DevSpan<'a>,
    pub(super) group_size: &'a dyn Fn(GroupKind) -> u64,
}

/// `bytes` at `offset` of a scratch buffer, or the line saying they do not fit.
fn part<'a>(
    scratch: DevSpan<'a>,
    offset: u64,
    bytes: u64,
    what: &str,
) -> Result<DevSpan<'a>, DeviceError> {
    scratch
        .at(offset, bytes)
        .ok_or_else(|| DeviceError::PastScratch {
            what: what.to_string(),
            offset,
            bytes,
            scratch: scratch.bytes(),
        })
}

impl Issue<'_> {
    pub(super) fn op(
        &self,
        op: &Op,
        kept: &mut HashMap<(u64, u64), Buf>,
    ) -> Result<(), DeviceError> {
        let gpu = self.gpu;
        let stream = &gpu.stream;
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
                    bf16_gemm(&gpu.blas, (*m, *n, *k), *batch, (a, b, c)).map_err(|error| {
                        DeviceError::Gemm {
                            class: *class,
                            error: Box::new(error),
                        }
                    })?;
                }
            }
            Op::Memory { bytes, .. } => {
                let mut left = bytes / 2;
                while left > 0 {
                    let n = left.min(COPY_PIECE);
                    // Scratch A and B each hold the op's first piece (`Scratch::of`).
                    copy_dtod(stream, b, a, n).map_err(|e| DeviceError::Copy {
                        bytes: n,
                        status: describe(e),
                    })?;
                    left -= n;
                }
            }
            Op::Coll {
                group,
                op: kind,
                bytes,
                ..
            } => self.coll(*group, *kind, *bytes)?,
            Op::P2p { kind, sends, recvs } => self.p2p(*kind, sends, recvs)?,
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
                let comm = &gpu.comms.world;
                // One element of scratch A and B.
                comm.all_reduce((a, b), 1, Elem::Bf16, stream)
                    .map_err(nccl_failed("the step's barrier", Some(comm)))?;
            }
        }
        Ok(())
    }

    /// A collective over one group kind's communicator.
    fn coll(&self, group: GroupKind, kind: Coll, bytes: u64) -> Result<(), DeviceError> {
        let gpu = self.gpu;
        let stream = &gpu.stream;
        let bf16 = Elem::Bf16;
        let (a, b) = (self.a, self.b);
        let comm = gpu.comms.of(group);
        let n = (self.group_size)(group);
        let what = format!("{} of {bytes} bytes over the {group} group", kind.label());
        let (snd, _) = coll_sides(kind, bytes, n);
        // Scratch A holds the send side and B the receive side of every collective
        // of the program (`Scratch::of`).
        match kind {
            Coll::AllGather => comm
                .all_gather((a, b), (snd / 2) as usize, bf16, stream)
                .map(|_| ())
                .map_err(|e| nccl_failed(&what, Some(comm))(e).into()),
            Coll::ReduceScatter => comm
                .reduce_scatter((a, b), (bytes / n / 2) as usize, bf16, stream)
                .map(|_| ())
                .map_err(|e| nccl_failed(&what, Some(comm))(e).into()),
            Coll::AllReduce => comm
                .all_reduce((a, b), (bytes / 2) as usize, bf16, stream)
                .map(|_| ())
                .map_err(|e| nccl_failed(&what, Some(comm))(e).into()),
            Coll::AllToAll => nccl_group::<DeviceError>(&what, || {
                let size = bytes / n / 2 * 2;
                for j in 0..n {
                    // Part j of A and of B (n parts of `size` bytes, `Scratch::of`).
                    let (to, from) = (
                        part(a, j * size, size, &what)?,
                        part(b, j * size, size, &what)?,
                    );
                    comm.send(to, (size / 2) as usize, bf16, j, stream)
                        .map_err(nccl_failed(&what, Some(comm)))?;
                    comm.recv(from, (size / 2) as usize, bf16, j, stream)
                        .map_err(nccl_failed(&what, Some(comm)))?;
                }
                Ok(())
            }),
        }?;
        Ok(())
    }

    /// A pass's pipeline or CP transfers, in one NCCL group.
    fn p2p(
        &self,
        kind: CommKind,
        sends: &[(u64, u64)],
        recvs: &[(u64, u64)],
    ) -> Result<(), DeviceError> {
        let gpu = self.gpu;
        let stream = &gpu.stream;
        let bf16 = Elem::Bf16;
        let (a, b) = (self.a, self.b);
        let comm = &gpu.comms.world;
        let what = format!(
            "{} transfers (sends {sends:?}, receives {recvs:?})",
            kind.key()
        );
        nccl_group::<DeviceError>(&what, || {
            for &(to, bytes) in sends {
                // Scratch A holds the largest send.
                comm.send(a, (bytes / 2) as usize, bf16, to, stream)
                    .map_err(nccl_failed(&what, Some(comm)))?;
            }
            let mut off = 0;
            for &(from, bytes) in recvs {
                // Scratch B holds all of a group's receives side by side.
                let into = part(b, off, bytes, &what)?;
                comm.recv(into, (bytes / 2) as usize, bf16, from, stream)
                    .map_err(nccl_failed(&what, Some(comm)))?;
                off += bytes;
            }
            Ok(())
        })?;
        Ok(())
    }
}
