//! One layer's ops, forward, backward and recomputed, and the parameter-sized
//! collectives around a stage (ZeRO-3 gathers, bucketed reductions).

use super::op::{Coll, CommKind, Op, OpClass, B};
use super::{Sink, Step};
use crate::config::{Dispatcher, RecomputeModules, Zero};
use crate::cost::BUCKET_PARAMS;
use crate::ranks::{GroupKind, RankMap};

/// Sizes one rank works with.
pub(super) struct Sizes {
    /// Rows per micro-batch on this CP rank, and outside the TP region.
    pub(super) t: u64,
    pub(super) tl: u64,
    pub(super) h: u64,
    pub(super) hd: u64,
    /// Local query/output width, local K (or V) width.
    pub(super) hl: u64,
    pub(super) kvl: u64,
    /// Local MLP width and the number of input-side matrices (1 plain, 2 gated).
    pub(super) f: u64,
    pub(super) up: u64,
    pub(super) heads_l: u64,
    pub(super) seq: u64,
    pub(super) mbs: u64,
    /// MoE: experts, local experts, top-k, expert width on this rank.
    pub(super) experts: u64,
    pub(super) local_experts: u64,
    pub(super) top_k: u64,
    pub(super) e: u64,
}

/// One rank's walk: its step, its groups, its sizes, and where its ops go.
pub(super) struct Walker<'a> {
    pub(super) s: Step<'a>,
    pub(super) map: &'a RankMap,
    pub(super) rank: u64,
    pub(super) z: Sizes,
    tp: u64,
    cp: u64,
    etp: u64,
    sp: bool,
    pub(super) sink: &'a mut dyn Sink,
}

impl<'a> Walker<'a> {
    pub(super) fn new(s: Step<'a>, map: &'a RankMap, rank: u64, sink: &'a mut dyn Sink) -> Self {
        let cfg = s.cfg;
        let d = s.dims;
        let (tp, cp, etp) = (cfg.tp, cfg.cp, cfg.etp);
        let t = d.mbs * d.seq / cp;
        let z = Sizes {
            t,
            tl: if cfg.sp { t / tp } else { t },
            h: d.hidden,
            hd: d.head_dim,
            hl: d.heads * d.head_dim / tp,
            // With fewer K/V heads than TP ranks (TP a multiple of them) each rank
            // computes one: Megatron-Core since f7dfb99 (Dec 2025; attention.py
            // `num_query_groups < world_size`), as `memory::kv_dim_per_rank` prices.
            kvl: (d.kv_heads / tp).max(1) * d.head_dim,
            f: d.ffn / tp,
            up: s.model.mlp.matrices() - 1,
            heads_l: d.heads / tp,
            seq: d.seq,
            mbs: d.mbs,
            experts: d.experts,
            local_experts: d.experts / cfg.ep.max(1),
            top_k: d.top_k,
            e: d.expert_ffn / etp.max(1),
        };
        Walker {
            s,
            map,
            rank,
            z,
            tp,
            cp,
            etp,
            sp: cfg.sp,
            sink,
        }
    }

    pub(super) fn group_size(&self, kind: GroupKind) -> u64 {
        self.members(kind).len() as u64
    }

    pub(super) fn members(&self, kind: GroupKind) -> &[u64] {
        self.map.group_of(self.rank, kind)
    }

    pub(super) fn gemm(
        &mut self,
        class: OpClass,
        (m, n, k): (u64, u64, u64),
        batch: u64,
        count: u64,
        recompute: bool,
    ) {
        if [m, n, k, batch, count].iter().all(|&x| x > 0) {
            self.sink.op(Op::Gemm {
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

    pub(super) fn mem(&mut self, class: OpClass, bytes: u64, recompute: bool) {
        if bytes > 0 {
            self.sink.op(Op::Memory {
                class,
                bytes,
                recompute,
            });
        }
    }

    /// A collective of `kind` over this rank's group for it; nothing for a group of one.
    pub(super) fn coll(&mut self, kind: CommKind, op: Coll, bytes: u64) {
        if self.group_size(kind.group()) > 1 && bytes > 0 {
            self.sink.op(Op::Coll {
                kind,
                group: kind.group(),
                op,
                bytes,
            });
        }
    }

    /// Into the column-parallel region (forward), or the conjugate out of it (backward).
    pub(super) fn enter_tp(&mut self, backward: bool) {
        let bytes = self.z.t * self.z.h * B;
        match (self.sp, backward) {
            (true, false) => self.coll(CommKind::Tp, Coll::AllGather, bytes),
            (true, true) => self.coll(CommKind::Tp, Coll::ReduceScatter, bytes),
            (false, false) => {}
            (false, true) => self.coll(CommKind::Tp, Coll::AllReduce, bytes),
        }
    }

    pub(super) fn leave_tp(&mut self, backward: bool) {
        let bytes = self.z.t * self.z.h * B;
        match (self.sp, backward) {
            (true, false) => self.coll(CommKind::Tp, Coll::ReduceScatter, bytes),
            (true, true) => self.coll(CommKind::Tp, Coll::AllGather, bytes),
            (false, false) => self.coll(CommKind::Tp, Coll::AllReduce, bytes),
            (false, true) => {}
        }
    }

    /// The forward GEMM `[m, k] · [k, n]`'s backward: input gradient now, weight
    /// gradient into `w` (this pass, or the W pass).
    pub(super) fn linear_bwd(
        &mut self,
        class: OpClass,
        (m, n, k): (u64, u64, u64),
        count: u64,
        w: &mut Vec<Op>,
    ) {
        self.gemm(class, (m, k, n), 1, count, false);
        if [m, n, k, count].iter().all(|&x| x > 0) {
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

    /// One CP ring step's transfers: K and V to the next CP rank, from the
    /// previous; in the backward also their gradients, as a second exchange
    /// (Transformer Engine's ring attention passes K/V and dK/dV separately).
    pub(super) fn ring_step(&mut self, backward: bool) {
        let cp = self.members(GroupKind::Cp).to_vec();
        if cp.len() < 2 {
            return;
        }
        let me = cp
            .iter()
            .position(|&r| r == self.rank)
            .expect("own CP group");
        let bytes = self.z.t * 2 * self.z.kvl * B;
        let (next, prev) = (cp[(me + 1) % cp.len()], cp[(me + cp.len() - 1) % cp.len()]);
        for _ in 0..if backward { 2 } else { 1 } {
            self.sink.op(Op::P2p {
                kind: CommKind::Cp,
                sends: vec![(next, bytes)],
                recvs: vec![(prev, bytes)],
            });
        }
    }

    /// Core attention over the CP ring: per step a batched `QKᵀ` and `PV` over half
    /// the chunk's keys (the causal average); the backward's five GEMMs per step.
    pub(super) fn core(&mut self, backward: bool, recompute: bool) {
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
                self.gemm(OpClass::AttentionCore, (sq, keys, hd), batch, 1, false);
                self.gemm(OpClass::AttentionCore, (sq, keys, hd), batch, 1, false);
                self.gemm(OpClass::AttentionCore, (keys, hd, sq), batch, 1, false);
                self.gemm(OpClass::AttentionCore, (sq, hd, keys), batch, 1, false);
                self.gemm(OpClass::AttentionCore, (keys, hd, sq), batch, 1, false);
            } else {
                self.gemm(OpClass::AttentionCore, (sq, keys, hd), batch, 1, recompute);
                self.gemm(OpClass::AttentionCore, (sq, hd, keys), batch, 1, recompute);
            }
        }
    }

    /// Rows this rank routes: its SP shard, or without SP its 1/tp slice of the
    /// replicated rows (gathered back over TP after the experts).
    pub(super) fn routed_in(&self) -> u64 {
        if self.sp || self.tp == 1 {
            self.z.tl
        } else {
            self.z.t / self.tp
        }
    }

    /// 1 where Megatron's all-to-all dispatcher sorts the received rows by local
    /// expert and restores their order before the return (`sort_chunks_by_idxs`,
    /// run when a rank holds more than one expert), else 0.
    fn sorts_chunks(&self) -> u64 {
        u64::from(self.s.cfg.moe_dispatcher == Dispatcher::AllToAll && self.z.local_experts > 1)
    }

    /// Rows each local expert computes on (balanced routing, the ETP group's rows).
    pub(super) fn per_expert(&self) -> u64 {
        (self.routed_in() * self.z.top_k * self.etp).div_ceil(self.z.local_experts.max(1))
    }

    /// The rotary's traffic over the fused kernel's: 6 where Megatron-Core runs it
    /// unfused (`cost::layer`'s `rotary_bytes`: 24 bytes per element against 4).
    fn rotary_passes(&self) -> u64 {
        if self.s.model.rotary_unfused() {
            6
        } else {
            1
        }
    }

    pub(super) fn layer_forward(&mut self, moe: bool, rc: bool) {
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
        self.mem(OpClass::Elementwise, tl * h * B * 2, rc);
        self.enter_tp(false);
        self.gemm(OpClass::AttentionProj, (t, hl + 2 * kvl, h), 1, 1, rc);
        self.mem(
            OpClass::Elementwise,
            self.rotary_passes() * t * (hl + kvl) * B * 2,
            rc,
        );
        self.core(false, rc);
        self.gemm(OpClass::AttentionProj, (t, h, hl), 1, 1, rc);
        self.leave_tp(false);
        self.mem(OpClass::Elementwise, tl * h * B * 5, rc);
        if moe {
            self.moe_forward(rc);
        } else {
            self.enter_tp(false);
            self.gemm(OpClass::Mlp, (t, up * f, h), 1, 1, rc);
            self.mem(OpClass::Elementwise, t * f * B * (up + 1), rc);
            self.gemm(OpClass::Mlp, (t, h, f), 1, 1, rc);
            self.leave_tp(false);
        }
        self.mem(OpClass::Elementwise, tl * h * B * 3, rc);
    }

    pub(super) fn moe_forward(&mut self, rc: bool) {
        let z = &self.z;
        let (h, top_k, e, n_local, experts) = (z.h, z.top_k, z.e, z.local_experts, z.experts);
        let r_in = self.routed_in();
        let rows = r_in * top_k;
        let per = self.per_expert();
        let up = z.up;
        let sort = self.sorts_chunks();
        self.gemm(OpClass::Router, (r_in, experts, h), 1, 1, rc);
        self.mem(OpClass::Elementwise, rows * h * B * 2, rc);
        self.coll(CommKind::Ep, Coll::AllToAll, rows * h * B);
        self.coll(CommKind::Etp, Coll::AllGather, rows * self.etp * h * B);
        self.mem(OpClass::Elementwise, sort * rows * h * B * 2, rc);
        self.gemm(OpClass::MoeExperts, (per, up * e, h), 1, n_local, rc);
        self.mem(OpClass::Elementwise, per * n_local * e * B * (up + 1), rc);
        // A clamped GLU's eager clamp (`cost::layer`'s `glu_clamp`: 16 bytes per
        // element of the expert FFN).
        let clamp = u64::from(self.s.model.glu_clamp.is_some());
        self.mem(OpClass::Elementwise, clamp * per * n_local * e * B * 8, rc);
        self.gemm(OpClass::MoeExperts, (per, h, e), 1, n_local, rc);
        // fc2's bias, scaled by the routing probability, added per local expert
        // (`cost::layer`'s `expert_bias`: 12 bytes per element).
        let bias = u64::from(self.s.model.bias);
        self.mem(OpClass::Elementwise, bias * per * n_local * h * B * 6, rc);
        self.mem(OpClass::Elementwise, sort * rows * h * B * 2, rc);
        self.coll(CommKind::Etp, Coll::ReduceScatter, rows * self.etp * h * B);
        self.coll(CommKind::Ep, Coll::AllToAll, rows * h * B);
        self.mem(OpClass::Elementwise, rows * h * B * 2, rc);
        if !self.sp {
            self.coll(CommKind::Tp, Coll::AllGather, self.z.t * h * B);
        }
    }

    /// What selective recomputation replays of one layer before its backward.
    pub(super) fn selective(&mut self, moe: bool) {
        let cfg = self.s.cfg;
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
            self.mem(OpClass::Elementwise, 2 * tl * h * B * 2, true);
        }
        match moe {
            // The replayed block's collectives run again: Megatron checkpoints the
            // MLP module, whose linears gather and scatter over TP themselves, and
            // the whole MoE block with its all-to-alls.
            false if cfg.recomputes(RecomputeModules::MLP) => {
                self.enter_tp(false);
                self.gemm(OpClass::Mlp, (t, up * f, h), 1, 1, true);
                self.mem(OpClass::Elementwise, t * f * B * (up + 1), true);
                self.gemm(OpClass::Mlp, (t, h, f), 1, 1, true);
                self.leave_tp(false);
            }
            true if cfg.recomputes(RecomputeModules::MOE) => self.moe_forward(true),
            true if cfg.recomputes(RecomputeModules::MOE_ACT) => {
                let per = self.per_expert();
                let clamp = 8 * u64::from(self.s.model.glu_clamp.is_some());
                self.mem(
                    OpClass::Elementwise,
                    per * self.z.local_experts * self.z.e * B * (up + 1 + clamp),
                    true,
                );
            }
            _ => {}
        }
    }

    pub(super) fn layer_backward(&mut self, moe: bool, w: &mut Vec<Op>) {
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
        self.mem(OpClass::Elementwise, tl * h * B * 6, false);
        if moe {
            let z = &self.z;
            let (top_k, e, n_local, experts) = (z.top_k, z.e, z.local_experts, z.experts);
            let r_in = self.routed_in();
            let rows = r_in * top_k;
            let per = self.per_expert();
            if !self.sp {
                self.coll(CommKind::Tp, Coll::ReduceScatter, t * h * B);
            }
            let sort = self.sorts_chunks();
            self.mem(OpClass::Elementwise, rows * h * B * 4, false);
            self.coll(CommKind::Ep, Coll::AllToAll, rows * h * B);
            self.coll(CommKind::Etp, Coll::AllGather, rows * self.etp * h * B);
            self.mem(OpClass::Elementwise, sort * rows * h * B * 4, false);
            let bias = u64::from(self.s.model.bias);
            self.mem(
                OpClass::Elementwise,
                bias * per * n_local * h * B * 12,
                false,
            );
            self.linear_bwd(OpClass::MoeExperts, (per, h, e), n_local, w);
            // The clamp's backward: 12 bytes per element (`cost::layer`).
            let clamp = 6 * u64::from(self.s.model.glu_clamp.is_some());
            self.mem(
                OpClass::Elementwise,
                per * n_local * e * B * (2 * (up + 1) + clamp),
                false,
            );
            self.linear_bwd(OpClass::MoeExperts, (per, up * e, h), n_local, w);
            self.mem(OpClass::Elementwise, sort * rows * h * B * 4, false);
            self.coll(CommKind::Etp, Coll::ReduceScatter, rows * self.etp * h * B);
            self.coll(CommKind::Ep, Coll::AllToAll, rows * h * B);
            self.mem(OpClass::Elementwise, rows * h * B * 4, false);
            self.linear_bwd(OpClass::Router, (r_in, experts, h), 1, w);
        } else {
            self.leave_tp(true);
            self.linear_bwd(OpClass::Mlp, (t, h, f), 1, w);
            self.mem(OpClass::Elementwise, t * f * B * 2 * (up + 1), false);
            self.linear_bwd(OpClass::Mlp, (t, up * f, h), 1, w);
            self.enter_tp(true);
        }
        self.mem(OpClass::Elementwise, tl * h * B * 10, false);
        self.leave_tp(true);
        self.linear_bwd(OpClass::AttentionProj, (t, h, hl), 1, w);
        self.core(true, false);
        self.mem(
            OpClass::Elementwise,
            self.rotary_passes() * t * (hl + kvl) * B * 4,
            false,
        );
        self.linear_bwd(OpClass::AttentionProj, (t, hl + 2 * kvl, h), 1, w);
        self.enter_tp(true);
        self.mem(OpClass::Elementwise, tl * h * B * 4, false);
    }

    /// Dense and expert parameters of one layer on this rank.
    pub(super) fn layer_params(&self, moe: bool) -> (u64, u64) {
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

    pub(super) fn stage_params(&self, vstage: usize) -> (u64, u64) {
        let first = self.s.first_layer[vstage];
        (first..first + self.s.stage_layers[vstage])
            .map(|l| self.layer_params(self.s.moe_layer[l]))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// A data-parallel collective over `elems` parameters of `bytes_per` bytes, in
    /// Megatron's 40M-parameter buckets.
    pub(super) fn bucketed(&mut self, kind: CommKind, op: Coll, elems: u64, bytes_per: u64) {
        let bucket = BUCKET_PARAMS as u64;
        let mut left = elems;
        while left > 0 {
            let n = left.min(bucket);
            self.coll(kind, op, n * bytes_per);
            left -= n;
        }
    }

    /// ZeRO-3: the stage's parameters gathered before a pass.
    pub(super) fn gather(&mut self, vstage: usize) {
        if self.s.cfg.zero == Zero::Zero3 {
            let (dense, expert) = self.stage_params(vstage);
            self.bucketed(CommKind::DpParam, Coll::AllGather, dense, B);
            self.bucketed(CommKind::EdpParam, Coll::AllGather, expert, B);
        }
    }

    /// One NCCL group of pipeline transfers (nothing when both lists are empty).
    pub(super) fn transfers(&mut self, sends: Vec<(u64, u64)>, recvs: Vec<(u64, u64)>) {
        if !sends.is_empty() || !recvs.is_empty() {
            self.sink.op(Op::P2p {
                kind: CommKind::Pp,
                sends,
                recvs,
            });
        }
    }
}
