//! The device program: what one rank issues in one training step at the plan's real
//! sizes, as a flat list of [`Op`]s in issue order. The CUDA backend runs it on one
//! stream (GEMMs through cuBLAS, collectives and sends through NCCL); [`check`] runs
//! every rank's list against the others on the CPU, the way NCCL would pair them,
//! and finds what would hang on the GPUs (a send nobody receives, a collective the
//! members reach in different orders or with different sizes) before any GPU time
//! is spent.
//!
//! It is built from the same plan and schedule as the CPU program
//! ([`crate::program`]), which checks the numbers; this one carries no data, only
//! sizes and order, so it can describe a 70B model's step in a few thousand ops.
//!
//! # What each layer issues
//!
//! Rows are the micro-batch's tokens on this CP rank, `t = mbs · seq / cp`
//! (`t / tp` outside the tensor-parallel region with sequence parallelism).
//! Activations are BF16 (2 bytes).
//!
//! - Attention: input norm; with SP an all-gather over TP; the QKV projection
//!   `[t, h] · [h, q + 2kv]`; rotary; the core over `cp` ring steps, each a
//!   batched `QKᵀ` and `PV` over half the chunk's keys (the causal average), with
//!   the K/V chunk passed to the next CP rank between steps; the output projection;
//!   a reduce-scatter (SP) or all-reduce over TP; the residual add.
//! - MLP: norm, the same TP entry/exit, `up` and `down` GEMMs, the activation.
//! - MoE: router; permute; all-to-all over EP (balanced routing, `top_k` rows per
//!   token); with expert TP an all-gather / reduce-scatter over ETP; the local
//!   experts' GEMMs; the return all-to-all; un-permute.
//! - Backward: per forward GEMM `[m, k] · [k, n]` an input gradient `(m, k, n)` and
//!   a weight gradient `(k, n, m)` (deferred to the W pass under ZB-H1 and
//!   DualPipe); the core's five GEMMs (2.5x the forward); each TP collective's
//!   conjugate; the CP ring carries K/V and their gradients.
//! - Recomputation replays the forward (full) or the selected modules.
//!
//! Pipeline transfers follow Megatron's p2p batching: a pass's outgoing send is
//! issued in one NCCL group with the next pass's incoming receive
//! (`send_forward_recv_backward` and kin), which is what keeps 1F1B from deadlocking
//! on blocking sends. The step ends with the DualPipe mirror sum, the data-parallel
//! gradient reduction per replica group (reduce-scatter with a sharded optimizer,
//! else all-reduce), the Adam update's HBM traffic and the parameter all-gather.

use std::collections::HashMap;

use sextant_planner::config::{Recompute, RecomputeModules, Zero};
use sextant_planner::cost::{Assumptions, BUCKET_PARAMS};
use sextant_planner::memory::{self, LayerKind};
use sextant_planner::ranks::{group_kind, RankMap, GROUP_KINDS};
use sextant_planner::schedule::{locate, rank_order, virtual_stage, Pass, Schedule};

use crate::program::Setup;
use crate::record::RankStats;

/// Bytes of a BF16 element.
const B: u64 = 2;

/// A collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Coll {
    AllGather,
    ReduceScatter,
    AllReduce,
    AllToAll,
}

impl Coll {
    pub fn label(self) -> &'static str {
        match self {
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllReduce => "all_reduce",
            Coll::AllToAll => "all_to_all",
        }
    }
}

/// One thing a rank issues, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Row-major `C[m, n] = A[m, k] · B[k, n]`, `batch` independent products
    /// (strided), issued `count` times in a row (one per local expert).
    Gemm {
        class: &'static str,
        m: u64,
        n: u64,
        k: u64,
        batch: u64,
        count: u64,
        recompute: bool,
    },
    /// Element-wise work: `bytes` read and written in HBM in all.
    Memory {
        class: &'static str,
        bytes: u64,
        recompute: bool,
    },
    /// A collective over this rank's group of kind `GROUP_KINDS[group]`. `bytes`
    /// follows nccl-tests: the all-gather's output, the reduce-scatter's input,
    /// the all-reduce's buffer, everything an all-to-all sends.
    Coll {
        kind: &'static str,
        group: usize,
        op: Coll,
        bytes: u64,
    },
    /// One NCCL group of sends and receives: `(peer rank, bytes)`.
    P2p {
        kind: &'static str,
        sends: Vec<(u64, u64)>,
        recvs: Vec<(u64, u64)>,
    },
    /// Activations of (chunk, micro-batch) kept until its backward.
    Keep { key: (u64, u64), bytes: u64 },
    /// Their release after the backward.
    Free { key: (u64, u64) },
    /// Every rank: the step's start.
    Barrier,
}

impl Op {
    /// FLOPs of a GEMM (0 for anything else).
    pub fn flops(&self) -> f64 {
        match *self {
            Op::Gemm {
                m,
                n,
                k,
                batch,
                count,
                ..
            } => 2.0 * (m * n * k) as f64 * (batch * count) as f64,
            _ => 0.0,
        }
    }
}

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

/// What [`check`] found: every op paired, and totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checked {
    pub ops: usize,
    pub collectives: usize,
    pub p2p: usize,
    /// Largest per-rank GEMM FLOPs of the step.
    pub max_rank_flops: f64,
    pub total_flops: f64,
}

fn describe(op: &Op) -> String {
    match op {
        Op::Coll {
            op, group, bytes, ..
        } => format!(
            "{} of {bytes} bytes over its {} group",
            op.label(),
            GROUP_KINDS[*group]
        ),
        Op::P2p { kind, sends, recvs } => {
            format!("{kind} transfers (sends {sends:?}, receives {recvs:?})")
        }
        Op::Barrier => "the step's barrier".into(),
        other => format!("{other:?}"),
    }
}

/// Starts tracking the transfers of a rank's P2p group when it reaches one.
fn open_group(done: &mut (Vec<bool>, Vec<bool>), head: Option<&Op>) {
    if let Some(Op::P2p { sends, recvs, .. }) = head {
        if done.0.is_empty() && done.1.is_empty() {
            *done = (vec![false; sends.len()], vec![false; recvs.len()]);
        }
    }
}

/// Runs the ranks' programs against each other the way NCCL on one stream per rank
/// would: each rank blocks at its next collective until every member of that group
/// is at a collective on the same group, which must be the same operation with the
/// same size; a group of sends and receives completes when each of its transfers
/// meets the matching transfer (same peer pair and size) at the head of the peer's
/// program (sends are taken as blocking, which NCCL's large messages are).
/// Errors name the ranks, their positions and what they were waiting for.
pub fn check(programs: &[Vec<Op>], map: &RankMap) -> Result<Checked, String> {
    let n = programs.len();
    if n as u64 != map.world_size {
        return Err(format!(
            "{n} programs for a world of {} ranks",
            map.world_size
        ));
    }
    let mut pos = vec![0usize; n];
    // Transfers of each rank's current P2p group already matched: (sends, recvs).
    let mut done: Vec<(Vec<bool>, Vec<bool>)> = vec![(vec![], vec![]); n];
    let mut out = Checked::default();
    let head = |pos: &[usize], r: usize| programs[r].get(pos[r]);
    loop {
        let mut progress = false;
        for (r, d) in done.iter_mut().enumerate() {
            open_group(d, head(&pos, r));
        }
        for r in 0..n {
            let Some(op) = head(&pos, r) else { continue };
            match op {
                Op::Gemm { .. } | Op::Memory { .. } | Op::Keep { .. } | Op::Free { .. } => {
                    out.ops += 1;
                    pos[r] += 1;
                    progress = true;
                }
                Op::Barrier => {
                    if (0..n).all(|q| matches!(head(&pos, q), Some(Op::Barrier))) {
                        out.ops += n;
                        pos.iter_mut().for_each(|p| *p += 1);
                        progress = true;
                    }
                }
                Op::Coll {
                    group,
                    op: c,
                    bytes,
                    ..
                } => {
                    let k = *group;
                    let members = map.group_of(r as u64, k);
                    let mut ready = true;
                    for &q in members {
                        match head(&pos, q as usize) {
                            Some(Op::Coll {
                                group: g2,
                                op: c2,
                                bytes: b2,
                                ..
                            }) if *g2 == k => {
                                if c2 != c || b2 != bytes {
                                    return Err(format!(
                                        "ranks {r} and {q} meet on their {} group with different collectives: rank {r} op {} issues {}, rank {q} op {} issues {}",
                                        GROUP_KINDS[k],
                                        pos[r],
                                        describe(op),
                                        pos[q as usize],
                                        describe(&programs[q as usize][pos[q as usize]])
                                    ));
                                }
                            }
                            _ => ready = false,
                        }
                    }
                    if ready {
                        for &q in members {
                            pos[q as usize] += 1;
                        }
                        out.ops += members.len();
                        out.collectives += 1;
                        progress = true;
                    }
                }
                Op::P2p { sends, .. } => {
                    for (i, &(to, bytes)) in sends.iter().enumerate() {
                        if done[r].0[i] {
                            continue;
                        }
                        let q = to as usize;
                        if q >= n || q == r {
                            return Err(format!(
                                "rank {r} op {} sends to rank {to}, which is not a peer",
                                pos[r]
                            ));
                        }
                        if let Some(Op::P2p { recvs: their, .. }) = head(&pos, q) {
                            open_group(&mut done[q], head(&pos, q));
                            if let Some(j) =
                                (0..their.len()).find(|&j| !done[q].1[j] && their[j].0 == r as u64)
                            {
                                if their[j].1 != bytes {
                                    return Err(format!("rank {r} op {} sends {bytes} bytes to rank {q}, which receives {} bytes from it at op {}", pos[r], their[j].1, pos[q]));
                                }
                                done[r].0[i] = true;
                                done[q].1[j] = true;
                                out.p2p += 1;
                                progress = true;
                            }
                        }
                    }
                }
            }
        }
        // Retire completed P2p groups.
        for r in 0..n {
            if let Some(Op::P2p { sends, recvs, .. }) = head(&pos, r) {
                let (s, v) = &done[r];
                if s.len() == sends.len() && v.len() == recvs.len() && s.iter().chain(v).all(|&x| x)
                {
                    pos[r] += 1;
                    out.ops += 1;
                    done[r] = (vec![], vec![]);
                    progress = true;
                }
            }
        }
        if !progress {
            break;
        }
    }
    let stuck: Vec<String> = (0..n)
        .filter(|&r| pos[r] < programs[r].len())
        .map(|r| {
            format!(
                "rank {r} at op {} of {}: {}",
                pos[r],
                programs[r].len(),
                describe(&programs[r][pos[r]])
            )
        })
        .collect();
    if !stuck.is_empty() {
        let more = if stuck.len() > 4 {
            format!(" (and {} more ranks)", stuck.len() - 4)
        } else {
            String::new()
        };
        return Err(format!(
            "the device programs would hang: {}{more}",
            stuck.into_iter().take(4).collect::<Vec<_>>().join("; ")
        ));
    }
    for p in programs {
        let f: f64 = p.iter().map(Op::flops).sum();
        out.total_flops += f;
        out.max_rank_flops = out.max_rank_flops.max(f);
    }
    Ok(out)
}

/// Device scratch a program needs, bytes: GEMM operands (A, B, C) and the send and
/// receive sides of every transfer; element-wise work is copied through A and B
/// in pieces of at most [`COPY_PIECE`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scratch {
    pub a: u64,
    pub b: u64,
    pub c: u64,
}

/// Largest single device-to-device copy of element-wise traffic.
pub const COPY_PIECE: u64 = 256 << 20;

/// What each side of a collective holds on one rank of `n`: (send, receive) bytes.
pub fn coll_sides(op: Coll, bytes: u64, n: u64) -> (u64, u64) {
    match op {
        Coll::AllGather => (bytes / n.max(1), bytes),
        Coll::ReduceScatter => (bytes, bytes / n.max(1)),
        Coll::AllReduce | Coll::AllToAll => (bytes, bytes),
    }
}

impl Scratch {
    pub fn of(program: &[Op], group_size: impl Fn(usize) -> u64) -> Scratch {
        let mut s = Scratch::default();
        for op in program {
            let (a, b, c) = match *op {
                Op::Gemm { m, n, k, batch, .. } => {
                    (m * k * batch * B, k * n * batch * B, m * n * batch * B)
                }
                Op::Memory { bytes, .. } => {
                    let piece = (bytes / 2).min(COPY_PIECE);
                    (piece, piece, 0)
                }
                Op::Coll {
                    group, op, bytes, ..
                } => {
                    let (snd, rcv) = coll_sides(op, bytes, group_size(group));
                    (snd, rcv, 0)
                }
                Op::P2p {
                    ref sends,
                    ref recvs,
                    ..
                } => (
                    sends.iter().map(|x| x.1).max().unwrap_or(0),
                    recvs.iter().map(|x| x.1).sum(),
                    0,
                ),
                Op::Barrier => (B, B, 0),
                Op::Keep { .. } | Op::Free { .. } => (0, 0, 0),
            };
            s.a = s.a.max(a);
            s.b = s.b.max(b);
            s.c = s.c.max(c);
        }
        s
    }
}

/// Books one op's measured seconds into a rank's statistics, the way the CPU
/// backend books its own: GEMMs per call under "class m n k" (a batched or repeated
/// GEMM counts each product), collectives under "kind op ranks bytes", and each
/// class or kind as a component; recomputed work also under "recompute".
pub fn book(st: &mut RankStats, op: &Op, secs: f64, group_size: impl Fn(usize) -> u64) {
    let mut component =
        |name: &str, secs: f64| *st.components.entry(name.to_string()).or_default() += secs;
    match *op {
        Op::Gemm {
            class,
            m,
            n,
            k,
            batch,
            count,
            recompute,
        } => {
            component(class, secs);
            if recompute {
                component("recompute", secs);
            }
            let calls = batch * count;
            let smp = st.gemms.entry(format!("{class} {m} {n} {k}")).or_default();
            smp.calls += calls;
            if smp.secs.len() < 4096 {
                smp.secs.push(secs / calls as f64);
            }
        }
        Op::Memory {
            class, recompute, ..
        } => {
            component(class, secs);
            if recompute {
                component("recompute", secs);
            }
        }
        Op::Coll {
            kind,
            group,
            op,
            bytes,
        } => {
            component(kind, secs);
            let smp = st
                .comms
                .entry(format!(
                    "{kind} {} {} {bytes}",
                    op.label(),
                    group_size(group)
                ))
                .or_default();
            smp.calls += 1;
            if smp.secs.len() < 4096 {
                smp.secs.push(secs);
            }
        }
        Op::P2p {
            kind,
            ref sends,
            ref recvs,
        } => {
            component(kind, secs);
            let bytes = sends
                .iter()
                .map(|x| x.1)
                .sum::<u64>()
                .max(recvs.iter().map(|x| x.1).sum());
            let smp = st
                .comms
                .entry(format!("{kind} send_recv 2 {bytes}"))
                .or_default();
            smp.calls += 1;
            if smp.secs.len() < 4096 {
                smp.secs.push(secs);
            }
        }
        Op::Keep { .. } | Op::Free { .. } | Op::Barrier => {}
    }
}

/// Most (chunk, micro-batch) activations held at once, and their bytes.
pub fn peaks(program: &[Op]) -> (u64, u64) {
    let (mut live, mut bytes, mut peak_live, mut peak_bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut held: HashMap<(u64, u64), u64> = HashMap::new();
    for op in program {
        match *op {
            Op::Keep { key, bytes: b } => {
                held.insert(key, b);
                live += 1;
                bytes += b;
                peak_live = peak_live.max(live);
                peak_bytes = peak_bytes.max(bytes);
            }
            Op::Free { key } => {
                if let Some(b) = held.remove(&key) {
                    live -= 1;
                    bytes -= b;
                }
            }
            _ => {}
        }
    }
    (peak_live, peak_bytes)
}
