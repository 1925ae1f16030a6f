//! Building one rank's device program: the walk over its step in the schedule's
//! order (layers forward and backward, recomputation, pipeline transfers in
//! Megatron's p2p batches, the data-parallel reduction and the optimizer).

use std::collections::HashMap;

use sextant_planner::config::{Recompute, RecomputeModules, Zero};
use sextant_planner::cost::{Assumptions, BUCKET_PARAMS};
use sextant_planner::memory::{self, LayerKind};
use sextant_planner::ranks::{group_kind, RankMap};
use sextant_planner::schedule::{locate, rank_order, virtual_stage, Pass, Schedule};

use super::op::{Coll, Op, B};
use crate::program::Setup;

fn kind_index(name: &str) -> usize {
    group_kind(name).expect("a group kind of the rank map")
}

/// Sizes one rank works with.
struct Sizes {
    /// Rows per micro-batch on this CP rank, and outside the TP region.
    t: u64,
    tl: u64,
    h: u64,
    hd: u64,
    /// Local query/output width, local K (or V) width.
    hl: u64,
    kvl: u64,
    /// Local MLP width and the number of input-side matrices (1 plain, 2 gated).
    f: u64,
    up: u64,
    heads_l: u64,
    seq: u64,
    mbs: u64,
    /// MoE: experts, local experts, top-k, expert width on this rank.
    experts: u64,
    local_experts: u64,
    top_k: u64,
    e: u64,
}

struct Builder<'a> {
    s: &'a Setup,
    map: &'a RankMap,
    rank: u64,
    z: Sizes,
    tp: u64,
    cp: u64,
    etp: u64,
    sp: bool,
    ops: Vec<Op>,
}

impl Builder<'_> {
    fn group_size(&self, name: &str) -> u64 {
        self.members(name).len() as u64
    }

    fn members(&self, name: &str) -> &[u64] {
        self.map.group_of(self.rank, kind_index(name))
    }

    fn gemm(
        &mut self,
        class: &'static str,
        (m, n, k): (u64, u64, u64),
        batch: u64,
        count: u64,
        recompute: bool,
    ) {
        if m * n * k * batch * count > 0 {
            self.ops.push(Op::Gemm {
                class,
                m,
                n,
                k,
                batch,
                count,
                recompute,
            });
        }
    }

    fn mem(&mut self, class: &'static str, bytes: u64, recompute: bool) {
        if bytes > 0 {
            self.ops.push(Op::Memory {
                class,
                bytes,
                recompute,
            });
        }
    }

    /// A collective over this rank's group `name`, booked under `kind`; nothing for a group of one.
    fn coll(&mut self, kind: &'static str, name: &str, op: Coll, bytes: u64) {
        if self.group_size(name) > 1 && bytes > 0 {
            self.ops.push(Op::Coll {
                kind,
                group: kind_index(name),
                op,
                bytes,
            });
        }
    }

    /// Into the column-parallel region (forward), or the conjugate out of it (backward).
    fn enter_tp(&mut self, backward: bool) {
        let bytes = self.z.t * self.z.h * B;
        match (self.sp, backward) {
            (true, false) => self.coll("tp", "tp", Coll::AllGather, bytes),
            (true, true) => self.coll("tp", "tp", Coll::ReduceScatter, bytes),
            (false, false) => {}
            (false, true) => self.coll("tp", "tp", Coll::AllReduce, bytes),
        }
    }

    fn leave_tp(&mut self, backward: bool) {
        let bytes = self.z.t * self.z.h * B;
        match (self.sp, backward) {
            (true, false) => self.coll("tp", "tp", Coll::ReduceScatter, bytes),
            (true, true) => self.coll("tp", "tp", Coll::AllGather, bytes),
            (false, false) => self.coll("tp", "tp", Coll::AllReduce, bytes),
            (false, true) => {}
        }
    }

    /// The forward GEMM `[m, k] · [k, n]`'s backward: input gradient now, weight
    /// gradient into `w` (this pass, or the W pass).
    fn linear_bwd(
        &mut self,
        class: &'static str,
        (m, n, k): (u64, u64, u64),
        count: u64,
        w: &mut Vec<Op>,
    ) {
        self.gemm(class, (m, k, n), 1, count, false);
        if m * n * k * count > 0 {
            w.push(Op::Gemm {
                class,
                m: k,
                n,
                k: m,
                batch: 1,
                count,
                recompute: false,
            });
        }
    }

    /// One CP ring step's transfer: K and V (and in the backward their gradients)
    /// to the next CP rank, from the previous.
    fn ring_step(&mut self, backward: bool) {
        let cp = self.members("cp").to_vec();
        if cp.len() < 2 {
            return;
        }
        let me = cp
            .iter()
            .position(|&r| r == self.rank)
            .expect("own CP group");
        let bytes = self.z.t * 2 * self.z.kvl * B * if backward { 2 } else { 1 };
        let (next, prev) = (cp[(me + 1) % cp.len()], cp[(me + cp.len() - 1) % cp.len()]);
        self.ops.push(Op::P2p {
            kind: "cp",
            sends: vec![(next, bytes)],
            recvs: vec![(prev, bytes)],
        });
    }

    /// Core attention over the CP ring: per step a batched `QKᵀ` and `PV` over half
    /// the chunk's keys (the causal average); the backward's five GEMMs per step.
    fn core(&mut self, backward: bool, recompute: bool) {
        let z = &self.z;
        let (sq, keys, hd, batch) = (
            z.seq / self.cp,
            (z.seq / self.cp / 2).max(1),
            z.hd,
            z.mbs * z.heads_l,
        );
        for i in 0..self.cp {
            if i > 0 {
                self.ring_step(backward);
            }
            if backward {
                self.gemm("attention_core", (sq, keys, hd), batch, 1, false);
                self.gemm("attention_core", (sq, keys, hd), batch, 1, false);
                self.gemm("attention_core", (keys, hd, sq), batch, 1, false);
                self.gemm("attention_core", (sq, hd, keys), batch, 1, false);
                self.gemm("attention_core", (keys, hd, sq), batch, 1, false);
            } else {
                self.gemm("attention_core", (sq, keys, hd), batch, 1, recompute);
                self.gemm("attention_core", (sq, hd, keys), batch, 1, recompute);
            }
        }
    }

    /// Rows this rank routes: its SP shard, or without SP its 1/tp slice of the
    /// replicated rows (gathered back over TP after the experts).
    fn routed_in(&self) -> u64 {
        if self.sp || self.tp == 1 {
            self.z.tl
        } else {
            self.z.t / self.tp
        }
    }

    /// Rows each local expert computes on (balanced routing, the ETP group's rows).
    fn per_expert(&self) -> u64 {
        (self.routed_in() * self.z.top_k * self.etp).div_ceil(self.z.local_experts.max(1))
    }

    fn layer_forward(&mut self, moe: bool, rc: bool) {
        let Sizes {
            t,
            tl,
            h,
            hl,
            kvl,
            f,
            up,
            ..
        } = self.z;
        self.mem("elementwise", tl * h * B * 2, rc);
        self.enter_tp(false);
        self.gemm("attention_proj", (t, hl + 2 * kvl, h), 1, 1, rc);
        self.mem("elementwise", t * (hl + kvl) * B * 2, rc);
        self.core(false, rc);
        self.gemm("attention_proj", (t, h, hl), 1, 1, rc);
        self.leave_tp(false);
        self.mem("elementwise", tl * h * B * 5, rc);
        if moe {
            self.moe_forward(rc, true);
        } else {
            self.enter_tp(false);
            self.gemm("mlp", (t, up * f, h), 1, 1, rc);
            self.mem("elementwise", t * f * B * (up + 1), rc);
            self.gemm("mlp", (t, h, f), 1, 1, rc);
            self.leave_tp(false);
        }
        self.mem("elementwise", tl * h * B * 3, rc);
    }

    fn moe_forward(&mut self, rc: bool, comms: bool) {
        let z = &self.z;
        let (h, top_k, e, n_local, experts) = (z.h, z.top_k, z.e, z.local_experts, z.experts);
        let r_in = self.routed_in();
        let rows = r_in * top_k;
        let per = self.per_expert();
        let up = z.up;
        self.gemm("router", (r_in, experts, h), 1, 1, rc);
        self.mem("elementwise", rows * h * B * 2, rc);
        if comms {
            self.coll("ep", "ep", Coll::AllToAll, rows * h * B);
            self.coll("etp", "etp", Coll::AllGather, rows * self.etp * h * B);
        }
        self.gemm("moe_experts", (per, up * e, h), 1, n_local, rc);
        self.mem("elementwise", per * n_local * e * B * (up + 1), rc);
        self.gemm("moe_experts", (per, h, e), 1, n_local, rc);
        if comms {
            self.coll("etp", "etp", Coll::ReduceScatter, rows * self.etp * h * B);
            self.coll("ep", "ep", Coll::AllToAll, rows * h * B);
        }
        self.mem("elementwise", rows * h * B * 2, rc);
        if comms && !self.sp {
            self.coll("tp", "tp", Coll::AllGather, self.z.t * h * B);
        }
    }

    /// What selective recomputation replays of one layer before its backward.
    fn selective(&mut self, moe: bool) {
        let cfg = &self.s.cfg;
        let Sizes {
            t, tl, h, f, up, ..
        } = self.z;
        if cfg.recomputes(RecomputeModules::CORE_ATTN) {
            let cp = self.cp;
            // The replay needs no ring: the K/V chunks are kept.
            self.cp = 1;
            let seq = self.z.seq;
            self.z.seq = seq / cp;
            for _ in 0..cp {
                self.core(false, true);
            }
            self.z.seq = seq;
            self.cp = cp;
        }
        if cfg.recomputes(RecomputeModules::LAYERNORM) {
            self.mem("elementwise", 2 * tl * h * B * 2, true);
        }
        match moe {
            false if cfg.recomputes(RecomputeModules::MLP) => {
                self.gemm("mlp", (t, up * f, h), 1, 1, true);
                self.mem("elementwise", t * f * B * (up + 1), true);
                self.gemm("mlp", (t, h, f), 1, 1, true);
            }
            true if cfg.recomputes(RecomputeModules::MOE) => self.moe_forward(true, false),
            true if cfg.recomputes(RecomputeModules::MOE_ACT) => {
                let per = self.per_expert();
                self.mem(
                    "elementwise",
                    per * self.z.local_experts * self.z.e * B * (up + 1),
                    true,
                );
            }
            _ => {}
        }
    }

    fn layer_backward(&mut self, moe: bool, w: &mut Vec<Op>) {
        let Sizes {
            t,
            tl,
            h,
            hl,
            kvl,
            f,
            up,
            ..
        } = self.z;
        self.mem("elementwise", tl * h * B * 6, false);
        if moe {
            let z = &self.z;
            let (top_k, e, n_local, experts) = (z.top_k, z.e, z.local_experts, z.experts);
            let r_in = self.routed_in();
            let rows = r_in * top_k;
            let per = self.per_expert();
            if !self.sp {
                self.coll("tp", "tp", Coll::ReduceScatter, t * h * B);
            }
            self.mem("elementwise", rows * h * B * 2, false);
            self.coll("ep", "ep", Coll::AllToAll, rows * h * B);
            self.coll("etp", "etp", Coll::AllGather, rows * self.etp * h * B);
            self.linear_bwd("moe_experts", (per, h, e), n_local, w);
            self.mem("elementwise", per * n_local * e * B * 2 * (up + 1), false);
            self.linear_bwd("moe_experts", (per, up * e, h), n_local, w);
            self.coll("etp", "etp", Coll::ReduceScatter, rows * self.etp * h * B);
            self.coll("ep", "ep", Coll::AllToAll, rows * h * B);
            self.mem("elementwise", rows * h * B * 2, false);
            self.linear_bwd("router", (r_in, experts, h), 1, w);
        } else {
            self.leave_tp(true);
            self.linear_bwd("mlp", (t, h, f), 1, w);
            self.mem("elementwise", t * f * B * 2 * (up + 1), false);
            self.linear_bwd("mlp", (t, up * f, h), 1, w);
            self.enter_tp(true);
        }
        self.mem("elementwise", tl * h * B * 10, false);
        self.leave_tp(true);
        self.linear_bwd("attention_proj", (t, h, hl), 1, w);
        self.core(true, false);
        self.mem("elementwise", t * (hl + kvl) * B * 2, false);
        self.linear_bwd("attention_proj", (t, hl + 2 * kvl, h), 1, w);
        self.enter_tp(true);
    }

    /// Dense and expert parameters of one layer on this rank.
    fn layer_params(&self, moe: bool) -> (u64, u64) {
        let z = &self.z;
        let attn = z.h * (z.hl + 2 * z.kvl) + z.hl * z.h;
        if moe {
            (
                attn + z.h * z.experts,
                z.local_experts * (z.up + 1) * z.e * z.h,
            )
        } else {
            (attn + (z.up + 1) * z.f * z.h, 0)
        }
    }

    fn stage_params(&self, vstage: usize) -> (u64, u64) {
        let first = self.s.first_layer[vstage];
        (first..first + self.s.stage_layers[vstage])
            .map(|l| self.layer_params(self.s.dims.moe_layer[l]))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// A data-parallel collective over `elems` parameters of `bytes_per` bytes, in
    /// Megatron's 40M-parameter buckets.
    fn bucketed(&mut self, kind: &'static str, name: &str, op: Coll, elems: u64, bytes_per: u64) {
        let bucket = BUCKET_PARAMS as u64;
        let mut left = elems;
        while left > 0 {
            let n = left.min(bucket);
            self.coll(kind, name, op, n * bytes_per);
            left -= n;
        }
    }

    /// ZeRO-3: the stage's parameters gathered before a pass.
    fn gather(&mut self, vstage: usize) {
        if self.s.cfg.zero == Zero::Zero3 {
            let (dense, expert) = self.stage_params(vstage);
            self.bucketed("dp_param", "dp_cp", Coll::AllGather, dense, B);
            self.bucketed("edp_param", "edp", Coll::AllGather, expert, B);
        }
    }

    /// One NCCL group of pipeline transfers (nothing when both lists are empty).
    fn transfers(&mut self, sends: Vec<(u64, u64)>, recvs: Vec<(u64, u64)>) {
        if !sends.is_empty() || !recvs.is_empty() {
            self.ops.push(Op::P2p {
                kind: "pp",
                sends,
                recvs,
            });
        }
    }

    /// The compute of one pass (its transfers are issued by [`Self::step`]).
    fn pass(
        &mut self,
        pass: Pass,
        c: u64,
        mb: u64,
        vstage: usize,
        deferred: bool,
        wjobs: &mut HashMap<(u64, u64), Vec<Op>>,
    ) {
        let s = self.s;
        let cfg = &s.cfg;
        let layers = s.first_layer[vstage]..s.first_layer[vstage] + s.stage_layers[vstage];
        match pass {
            Pass::Forward => {
                self.gather(vstage);
                let mut kept = 0.0;
                for l in layers {
                    let moe = s.dims.moe_layer[l];
                    self.layer_forward(moe, false);
                    let kind = if moe {
                        LayerKind::Moe
                    } else {
                        LayerKind::Dense
                    };
                    kept += memory::layer_activations(
                        &s.model,
                        cfg,
                        &s.workload,
                        kind,
                        Assumptions::default(),
                    )
                    .stored;
                }
                self.ops.push(Op::Keep {
                    key: (c, mb),
                    bytes: kept as u64,
                });
            }
            Pass::Backward => {
                self.gather(vstage);
                if cfg.recompute == Recompute::Full {
                    for l in layers.clone() {
                        self.layer_forward(s.dims.moe_layer[l], true);
                    }
                }
                let mut w = Vec::new();
                for l in layers.rev() {
                    let moe = s.dims.moe_layer[l];
                    if cfg.recompute == Recompute::Selective {
                        self.selective(moe);
                    }
                    self.layer_backward(moe, &mut w);
                }
                self.ops.push(Op::Free { key: (c, mb) });
                if deferred {
                    wjobs.insert((c, mb), w);
                } else {
                    self.ops.append(&mut w);
                }
            }
            Pass::Weight => {
                let mut w = wjobs.remove(&(c, mb)).unwrap_or_default();
                self.ops.append(&mut w);
            }
        }
    }

    /// One step. The rank's passes are grouped into slots the way Megatron
    /// communicates: under the interleaved schedule (and DualPipe) a forward
    /// followed by the backward of another micro-batch or chunk share a slot
    /// (`send_forward_backward_recv_forward_backward`); weight passes join the slot
    /// they follow; every other pass is a slot of its own
    /// (`send_forward_recv_backward` and kin). Between two slots one NCCL group
    /// sends what the first produced and receives what the second needs.
    fn step(&mut self) {
        let s = self.s;
        let cfg = &s.cfg;
        let (p, m) = (cfg.pp, s.micro_batches);
        let v = if s.schedule == Schedule::Interleaved {
            cfg.vpp
        } else {
            1
        };
        let pp_rank = self.map.ranks[self.rank as usize].pp;
        let pp_members = self.members("pp").to_vec();
        let holder = |vstage: usize, mb: u64| {
            pp_members[locate(s.schedule, p, m, vstage as u64, mb).0 as usize]
        };
        let last = s.stage_layers.len() - 1;
        let msg = self.z.tl * self.z.h * B;
        let order = rank_order(s.schedule, p, v, m, pp_rank);
        let deferred: std::collections::HashSet<(u64, u64)> = order
            .iter()
            .filter(|o| o.0 == Pass::Weight)
            .map(|o| (o.1, o.2))
            .collect();
        // Slots of (pass, chunk, micro-batch, virtual stage). Only the interleaved
        // schedule and DualPipe pair a forward with an independent backward; under
        // GPipe a later backward can depend on the forward before it.
        let pairs = matches!(s.schedule, Schedule::Interleaved | Schedule::DualPipe);
        let mut slots: Vec<Vec<(Pass, u64, u64, usize)>> = Vec::new();
        for &(pass, c, mb) in &order {
            let vstage = virtual_stage(s.schedule, p, v, pp_rank, c) as usize;
            let joins = match (slots.last().and_then(|x| x.last()), pass) {
                (Some(_), Pass::Weight) => true,
                (Some(&(Pass::Forward, c0, mb0, _)), Pass::Backward) => {
                    pairs && (c0, mb0) != (c, mb) && slots.last().is_some_and(|x| x.len() == 1)
                }
                _ => false,
            };
            if joins {
                slots
                    .last_mut()
                    .expect("a slot")
                    .push((pass, c, mb, vstage));
            } else {
                slots.push(vec![(pass, c, mb, vstage)]);
            }
        }
        let mut wjobs: HashMap<(u64, u64), Vec<Op>> = HashMap::new();
        let mut sends: Vec<(u64, u64)> = Vec::new();
        self.ops.push(Op::Barrier);
        for slot in slots {
            let mut recvs = Vec::new();
            for &(pass, _, mb, vstage) in &slot {
                match pass {
                    Pass::Forward if vstage > 0 => recvs.push((holder(vstage - 1, mb), msg)),
                    Pass::Backward if vstage < last => recvs.push((holder(vstage + 1, mb), msg)),
                    _ => {}
                }
            }
            self.transfers(std::mem::take(&mut sends), recvs);
            for &(pass, c, mb, vstage) in &slot {
                self.pass(pass, c, mb, vstage, deferred.contains(&(c, mb)), &mut wjobs);
                match pass {
                    Pass::Forward if vstage < last => sends.push((holder(vstage + 1, mb), msg)),
                    Pass::Backward if vstage > 0 => sends.push((holder(vstage - 1, mb), msg)),
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
        let v = if s.schedule == Schedule::Interleaved {
            s.cfg.vpp
        } else {
            1
        };
        let pp_rank = self.map.ranks[self.rank as usize].pp;
        let held: Vec<usize> = (0..s.schedule.chunks_per_rank(v))
            .map(|c| virtual_stage(s.schedule, s.cfg.pp, v, pp_rank, c) as usize)
            .collect();
        let per: Vec<(u64, u64)> = held.iter().map(|&vs| self.stage_params(vs)).collect();
        if s.cfg.zero == Zero::Zero3 {
            per
        } else {
            vec![per.iter().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))]
        }
    }

    fn optimizer(&mut self) {
        let cfg = &self.s.cfg;
        let gb = memory::grad_bytes(cfg) as u64;
        let ob = memory::optimizer_bytes(cfg) as u64;
        let units = self.units();
        if self.s.schedule == Schedule::DualPipe {
            // Every stage sits on two ranks: their gradients are summed.
            let pp = self.members("pp").to_vec();
            let me = self.map.ranks[self.rank as usize].pp as usize;
            let partner = pp[pp.len() - 1 - me];
            let bytes = units.iter().map(|u| (u.0 + u.1) * gb).sum();
            if partner != self.rank {
                self.ops.push(Op::P2p {
                    kind: "dp_grad",
                    sends: vec![(partner, bytes)],
                    recvs: vec![(partner, bytes)],
                });
            }
        }
        let sharded = cfg.zero != Zero::None;
        for expert in [false, true] {
            let (group, grad, param) = if expert {
                ("edp", "edp_grad", "edp_param")
            } else {
                ("dp_cp", "dp_grad", "dp_param")
            };
            let n = self.group_size(group);
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
                self.bucketed(grad, group, op, elems, gb);
                let shard = if sharded { elems / n } else { elems };
                // Adam reads the gradient, reads and writes the FP32 master weights and
                // both moments, and writes the BF16 weights.
                self.mem("optimizer", shard * (gb + 2 * ob + B), false);
                if sharded && cfg.zero != Zero::Zero3 {
                    self.bucketed(param, group, Coll::AllGather, elems, B);
                }
            }
        }
    }
}

/// One step of `rank`'s device program.
pub fn program(s: &Setup, map: &RankMap, rank: u64) -> Vec<Op> {
    let mut b = builder(s, map, rank);
    b.step();
    b.ops
}

/// Bytes of model state `rank` holds: (weights, gradients, optimizer), sharded as
/// the plan's ZeRO stage says.
pub fn footprint(s: &Setup, map: &RankMap, rank: u64) -> (u64, u64, u64) {
    let b = builder(s, map, rank);
    let (dense, expert) = b.units().iter().fold((0, 0), |a, u| (a.0 + u.0, a.1 + u.1));
    let (w, g, o) = memory::model_state(
        &s.cfg,
        dense as f64,
        expert as f64,
        sextant_planner::cost::Framework::MegatronCore,
    );
    (w as u64, g as u64, o as u64)
}

fn builder<'a>(s: &'a Setup, map: &'a RankMap, rank: u64) -> Builder<'a> {
    let cfg = &s.cfg;
    let d = &s.dims;
    let (tp, cp, etp) = (cfg.tp, cfg.cp, cfg.etp);
    let t = (d.mbs * d.seq) as u64 / cp;
    let experts = d.experts as u64;
    let z = Sizes {
        t,
        tl: if cfg.sp { t / tp } else { t },
        h: d.hidden as u64,
        hd: d.head_dim as u64,
        hl: (d.heads * d.head_dim) as u64 / tp,
        kvl: (d.kv_heads * d.head_dim) as u64 / tp,
        f: d.ffn as u64 / tp,
        up: s.model.mlp.matrices() - 1,
        heads_l: d.heads as u64 / tp,
        seq: d.seq as u64,
        mbs: d.mbs as u64,
        experts,
        local_experts: experts / cfg.ep.max(1),
        top_k: d.top_k as u64,
        e: d.expert_ffn as u64 / etp.max(1),
    };
    Builder {
        s,
        map,
        rank,
        z,
        tp,
        cp,
        etp,
        sp: cfg.sp,
        ops: Vec::new(),
    }
}

/// Every rank's program for one step.
pub fn programs(s: &Setup, map: &RankMap) -> Vec<Vec<Op>> {
    (0..map.world_size).map(|r| program(s, map, r)).collect()
}
