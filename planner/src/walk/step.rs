//! The step around the layers: the schedule's passes in one rank's order, grouped
//! into Megatron's communication slots, the pipeline transfers between them, and
//! the gradient reduction and optimizer at the end.

use std::collections::{HashMap, HashSet};

use super::layer::Walker;
use super::op::{Coll, CommKind, Op, OpClass, B};
use super::{Sink, Step};
use crate::config::{Recompute, Zero};
use crate::memory::{self, LayerKind};
use crate::ranks::{GroupKind, RankMap};
use crate::schedule::{locate, rank_order, virtual_stage, Pass, Schedule};

/// One pass of a rank's step: which, on which chunk and micro-batch, at which
/// virtual stage, and whether its weight gradient runs later as its own pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub pass: Pass,
    pub chunk: u64,
    pub mb: u64,
    pub vstage: usize,
    pub deferred: bool,
}

/// A rank's passes in the simulator's order, grouped into the slots Megatron
/// communicates in: under the interleaved schedule (and DualPipe) a forward
/// followed by the backward of another micro-batch or chunk share a slot
/// (`send_forward_backward_recv_forward_backward`); weight passes join the slot
/// they follow; every other pass is a slot of its own (`send_forward_recv_backward`
/// and kin). Both the device program and the CPU program run this order.
pub fn slots(s: &Step, pp_rank: u64) -> Vec<Vec<Slot>> {
    let (p, m, v) = (s.cfg.pp, s.micro_batches, s.vpp());
    let order = rank_order(s.schedule, p, v, m, pp_rank);
    let deferred: HashSet<(u64, u64)> = order
        .iter()
        .filter(|o| o.0 == Pass::Weight)
        .map(|o| (o.1, o.2))
        .collect();
    // Only the interleaved schedule and DualPipe pair a forward with an independent
    // backward; under GPipe a later backward can depend on the forward before it.
    // An interleaved rank whose warm-up holds every forward (few micro-batches:
    // Megatron's `are_all_microbatches_in_warmup`) has no steady state: its last
    // forward and first backward are not a pair, and joining them would make its
    // transfer groups disagree with its neighbours' (a hang).
    let forwards = order.iter().filter(|o| o.0 == Pass::Forward).count();
    let all_warmup = order.iter().take_while(|o| o.0 == Pass::Forward).count() == forwards;
    let pairs = match s.schedule {
        Schedule::Interleaved => !all_warmup,
        Schedule::DualPipe => true,
        _ => false,
    };
    let mut slots: Vec<Vec<Slot>> = Vec::new();
    for &(pass, chunk, mb) in &order {
        let slot = Slot {
            pass,
            chunk,
            mb,
            vstage: virtual_stage(s.schedule, p, pp_rank, chunk) as usize,
            deferred: deferred.contains(&(chunk, mb)),
        };
        let joins = match (slots.last().and_then(|x| x.last()), pass) {
            (Some(_), Pass::Weight) => true,
            (Some(prev), Pass::Backward) if prev.pass == Pass::Forward => {
                pairs
                    && (prev.chunk, prev.mb) != (chunk, mb)
                    && slots.last().is_some_and(|x| x.len() == 1)
            }
            _ => false,
        };
        match slots.last_mut() {
            Some(last) if joins => last.push(slot),
            _ => slots.push(vec![slot]),
        }
    }
    slots
}

/// Walks one step of `rank`, sending its ops to `sink` in issue order.
pub fn walk_step(s: Step, map: &RankMap, rank: u64, sink: &mut dyn Sink) {
    Walker::new(s, map, rank, sink).step();
}

/// Parameters `rank` holds, (dense, expert), summed over its virtual stages.
pub fn held_params(s: Step, map: &RankMap, rank: u64) -> (u64, u64) {
    let mut none: Vec<Op> = Vec::new();
    Walker::new(s, map, rank, &mut none)
        .units()
        .iter()
        .fold((0, 0), |a, u| (a.0 + u.0, a.1 + u.1))
}

impl Walker<'_> {
    /// The compute of one pass (its transfers are issued by [`Self::step`]).
    fn pass(&mut self, slot: Slot, wjobs: &mut HashMap<(u64, u64), Vec<Op>>) {
        let s = self.s;
        let cfg = s.cfg;
        let Slot {
            pass,
            chunk: c,
            mb,
            vstage,
            deferred,
        } = slot;
        let layers = s.first_layer[vstage]..s.first_layer[vstage] + s.stage_layers[vstage];
        match pass {
            Pass::Forward => {
                self.gather(vstage);
                let mut kept = 0.0;
                for l in layers {
                    let moe = s.moe_layer[l];
                    self.layer_forward(moe, false);
                    let kind = if moe {
                        LayerKind::Moe
                    } else {
                        LayerKind::Dense
                    };
                    kept += memory::layer_activations(
                        s.model,
                        cfg,
                        s.workload,
                        kind,
                        crate::cost::Assumptions::default(),
                    )
                    .stored;
                }
                self.sink.op(Op::Keep {
                    key: (c, mb),
                    bytes: kept as u64,
                });
            }
            Pass::Backward => {
                self.gather(vstage);
                if cfg.recompute == Recompute::Full {
                    for l in layers.clone() {
                        self.layer_forward(s.moe_layer[l], true);
                    }
                }
                let mut w = Vec::new();
                for l in layers.rev() {
                    let moe = s.moe_layer[l];
                    if cfg.recompute == Recompute::Selective {
                        self.selective(moe);
                    }
                    self.layer_backward(moe, &mut w);
                }
                self.sink.op(Op::Free { key: (c, mb) });
                if deferred {
                    wjobs.insert((c, mb), w);
                } else {
                    w.into_iter().for_each(|op| self.sink.op(op));
                }
            }
            Pass::Weight => {
                let w = wjobs.remove(&(c, mb)).unwrap_or_default();
                w.into_iter().for_each(|op| self.sink.op(op));
            }
        }
    }

    /// One step: the slots of [`slots`], and between two slots one NCCL group that
    /// sends what the first produced and receives what the second needs.
    fn step(&mut self) {
        let s = self.s;
        let (p, m) = (s.cfg.pp, s.micro_batches);
        let pp_rank = self.map.ranks[self.rank as usize].pp;
        let pp_members = self.members(GroupKind::Pp).to_vec();
        let holder = |vstage: usize, mb: u64| {
            pp_members[locate(s.schedule, p, m, vstage as u64, mb).0 as usize]
        };
        let last = s.stage_layers.len() - 1;
        let msg = self.z.tl * self.z.h * B;
        let mut wjobs: HashMap<(u64, u64), Vec<Op>> = HashMap::new();
        let mut sends: Vec<(u64, u64)> = Vec::new();
        self.sink.op(Op::Barrier);
        for slot in slots(&s, pp_rank) {
            let mut recvs = Vec::new();
            for x in &slot {
                match x.pass {
                    Pass::Forward if x.vstage > 0 => recvs.push((holder(x.vstage - 1, x.mb), msg)),
                    Pass::Backward if x.vstage < last => {
                        recvs.push((holder(x.vstage + 1, x.mb), msg))
                    }
                    _ => {}
                }
            }
            self.transfers(std::mem::take(&mut sends), recvs);
            for &x in &slot {
                self.pass(x, &mut wjobs);
                match x.pass {
                    Pass::Forward if x.vstage < last => {
                        sends.push((holder(x.vstage + 1, x.mb), msg))
                    }
                    Pass::Backward if x.vstage > 0 => sends.push((holder(x.vstage - 1, x.mb), msg)),
                    _ => {}
                }
            }
        }
        self.transfers(sends, vec![]);
        self.optimizer();
    }

    /// Units the gradients are reduced and stepped in: every held layer, or with
    /// ZeRO-3 each held virtual stage. (dense, expert) parameters per unit.
    fn units(&self) -> Vec<(u64, u64)> {
        let s = self.s;
        let pp_rank = self.map.ranks[self.rank as usize].pp;
        let held: Vec<usize> = (0..s.schedule.chunks_per_rank(s.vpp()))
            .map(|c| virtual_stage(s.schedule, s.cfg.pp, pp_rank, c) as usize)
            .collect();
        let per: Vec<(u64, u64)> = held.iter().map(|&vs| self.stage_params(vs)).collect();
        if s.cfg.zero == Zero::Zero3 {
            per
        } else {
            vec![per.iter().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))]
        }
    }

    fn optimizer(&mut self) {
        let cfg = self.s.cfg;
        let gb = memory::grad_bytes(cfg) as u64;
        let ob = memory::optimizer_bytes(cfg) as u64;
        let units = self.units();
        if self.s.schedule == Schedule::DualPipe {
            // Every stage sits on two ranks: their gradients are summed.
            let pp = self.members(GroupKind::Pp).to_vec();
            let me = self.map.ranks[self.rank as usize].pp as usize;
            let partner = pp[pp.len() - 1 - me];
            let bytes = units.iter().map(|u| (u.0 + u.1) * gb).sum();
            if partner != self.rank {
                self.sink.op(Op::P2p {
                    kind: CommKind::DpGrad,
                    sends: vec![(partner, bytes)],
                    recvs: vec![(partner, bytes)],
                });
            }
        }
        let sharded = cfg.zero != Zero::None;
        for expert in [false, true] {
            let (grad, param) = if expert {
                (CommKind::EdpGrad, CommKind::EdpParam)
            } else {
                (CommKind::DpGrad, CommKind::DpParam)
            };
            let n = self.group_size(grad.group());
            for &(dense, exp) in &units {
                let elems = if expert { exp } else { dense };
                if elems == 0 {
                    continue;
                }
                let op = if sharded {
                    Coll::ReduceScatter
                } else {
                    Coll::AllReduce
                };
                self.bucketed(grad, op, elems, gb);
                let shard = if sharded { elems / n } else { elems };
                // Adam reads the gradient, reads and writes the FP32 master weights and
                // both moments, and writes the BF16 weights.
                self.mem(OpClass::Optimizer, shard * (gb + 2 * ob + B), false);
                if sharded && cfg.zero != Zero::Zero3 {
                    self.bucketed(param, Coll::AllGather, elems, B);
                }
            }
        }
    }
}
