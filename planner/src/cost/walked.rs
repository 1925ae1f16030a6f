//! The pricing sink: the planner's walk over a step ([`crate::walk`]) charged op
//! by op with the cost model's own roofline (`Ctx::gemm`, HBM traffic, collectives
//! on their groups' placement). The tests below hold it, for every preset as the
//! executor runs it, to the cost model's price of the same layer class by class:
//! each GEMM class (forward, input and weight gradients), the element-wise traffic
//! (BF16), each layer collective (TP, CP ring, EP all-to-all) before overlap, and
//! what full and selective recomputation replay.
//! What is priced but not run, and so not held: the attention core (the cost model
//! prices the fused kernel at its measured efficiency, the executor runs batched
//! GEMMs), FP8 casts (the executor's GEMMs are BF16), DeepEP's deduplicated
//! dispatch across nodes (the executor runs NCCL's all-to-all), and the parts
//! of a model the executor leaves out (MLA, sliding windows, shared experts).
//!
//! The walk prices what runs, not the schedule: waiting, overlap and the bubble
//! stay with the cost model's pipeline pass and simulation.

use std::collections::BTreeMap;

use super::kernel::Ctx;
use super::Assumptions;
use crate::comm::Collective;
use crate::config::{ParallelConfig, Workload};
use crate::hardware::HardwareProfile;
use crate::model::ModelSpec;
use crate::walk::{Coll, CommKind, Op, OpClass, Sink};

/// Seconds of a walked step (one rank's), by what they are spent on.
pub struct Priced<'a> {
    ctx: Ctx<'a>,
    /// GEMM seconds by op class: first run (forward and backward), and replayed.
    pub gemm: BTreeMap<&'static str, f64>,
    pub recompute: BTreeMap<&'static str, f64>,
    /// Element-wise and optimizer HBM traffic, by class, and of it what
    /// recomputation replays.
    pub memory: BTreeMap<&'static str, f64>,
    pub memory_replayed: BTreeMap<&'static str, f64>,
    /// Collectives on their groups, by kind (none of them overlapped).
    pub collective: BTreeMap<&'static str, f64>,
}

impl<'a> Priced<'a> {
    pub fn new(
        model: &'a ModelSpec,
        hw: &'a HardwareProfile,
        w: &'a Workload,
        cfg: &'a ParallelConfig,
        a: Assumptions,
    ) -> Self {
        Priced {
            ctx: Ctx::new(model, hw, w, cfg, a),
            gemm: BTreeMap::new(),
            recompute: BTreeMap::new(),
            memory: BTreeMap::new(),
            memory_replayed: BTreeMap::new(),
            collective: BTreeMap::new(),
        }
    }

    /// Every second charged: compute and communication back to back.
    pub fn total(&self) -> f64 {
        [&self.gemm, &self.recompute, &self.memory, &self.collective]
            .iter()
            .flat_map(|m| m.values())
            .sum()
    }
}

impl Sink for Priced<'_> {
    fn op(&mut self, op: Op) {
        let c = &self.ctx;
        match op {
            Op::Gemm {
                class,
                m,
                n,
                k,
                batch,
                count,
                recompute,
            } => {
                // The cost model runs the projections, MLP and experts in the
                // workload's precision and the router and attention core in BF16.
                let fp8 = matches!(
                    class,
                    OpClass::AttentionProj | OpClass::Mlp | OpClass::MoeExperts
                );
                let secs = (batch * count) as f64 * c.gemm(m as f64, n as f64, k as f64, fp8);
                let to = if recompute {
                    &mut self.recompute
                } else {
                    &mut self.gemm
                };
                *to.entry(class.key()).or_default() += secs;
            }
            Op::Memory {
                class,
                bytes,
                recompute,
            } => {
                let secs = c.mem(bytes as f64);
                *self.memory.entry(class.key()).or_default() += secs;
                if recompute {
                    *self.memory_replayed.entry(class.key()).or_default() += secs;
                }
            }
            Op::Coll {
                kind, op, bytes, ..
            } => {
                let placement = match kind {
                    CommKind::Tp => c.tp_group(),
                    CommKind::Cp => c.cp_group(),
                    CommKind::DpGrad | CommKind::DpParam => c.dp_group(),
                    CommKind::Ep => c.ep_group(),
                    CommKind::Etp => c.etp_group(),
                    CommKind::EdpGrad | CommKind::EdpParam => c.edp_group(),
                    CommKind::Pp => c.pp_group(),
                };
                let collective = match op {
                    Coll::AllGather => Collective::AllGather,
                    Coll::ReduceScatter => Collective::ReduceScatter,
                    Coll::AllReduce => Collective::AllReduce,
                    Coll::AllToAll => Collective::AllToAll,
                };
                *self.collective.entry(kind.key()).or_default() +=
                    c.coll(collective, bytes as f64, placement);
            }
            Op::P2p { kind, sends, recvs } => {
                let bytes = sends.iter().chain(&recvs).map(|s| s.1).max().unwrap_or(0);
                // The CP ring's neighbours sit TP apart; pipeline neighbours, and
                // (approximately) DualPipe's mirror partner, on the PP stride.
                let placement = if kind == CommKind::Cp {
                    c.cp_group()
                } else {
                    c.pp_group()
                };
                *self.collective.entry(kind.key()).or_default() +=
                    c.coll(Collective::SendRecv, bytes as f64, placement);
            }
            Op::Keep { .. } | Op::Free { .. } | Op::Barrier => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{
        Dispatcher, Layout, Overlap, Precision, Recompute, RecomputeModules, Zero,
    };
    use crate::cost::layer::layer_cost;
    use crate::hardware::builtin_profile;
    use crate::memory::LayerKind;
    use crate::presets::PRESETS;
    use crate::ranks::rank_map;
    use crate::schedule::Schedule;
    use crate::walk::{walk_step, Dims, Step};

    /// The model as the executor runs it (`Dims::to_model` in the executor): what
    /// the walk has no op for is left out: MLA, sliding windows, sandwich norms,
    /// dropout masks, attention sinks, shared experts.
    fn executed(name: &str) -> ModelSpec {
        let mut m = (PRESETS.iter().find(|p| p.name == name).unwrap().spec)();
        m.mla = None;
        m.sliding_window = None;
        m.sandwich_norms = false;
        m.dropout = false;
        m.attention_sinks = false;
        m.glu_clamp = None;
        if let Some(moe) = &mut m.moe {
            moe.shared_experts = 0;
            moe.shared_ffn_hidden = None;
        }
        m
    }

    fn config(
        tp: u64,
        cp: u64,
        ep: u64,
        mbs: u64,
        dispatcher: Dispatcher,
        (recompute, recompute_modules): (Recompute, RecomputeModules),
    ) -> ParallelConfig {
        ParallelConfig {
            tp,
            pp: 1,
            vpp: 1,
            cp,
            ep,
            etp: 1,
            dp: ep,
            sp: tp > 1,
            mbs,
            zero: Zero::None,
            recompute,
            layout: Layout::Even,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            recompute_modules,
            moe_dispatcher: dispatcher,
            schedule: Schedule::OneFOneB,
        }
    }

    /// Checks one layer of `model` at `cfg`, walked and priced, against the cost
    /// model's price of it, class by class; returns how many classes were compared.
    fn check(model: &ModelSpec, cfg: &ParallelConfig, seq: u64, precision: Precision) -> usize {
        let hw = builtin_profile("h100-sxm").unwrap();
        let w = Workload {
            seq,
            global_batch: 1,
            precision,
            moe_imbalance: 1.0,
            moe_capacity: None,
        };
        let a = Assumptions::default();
        let moe = model.moe.as_ref();
        let dims = Dims {
            hidden: model.hidden,
            heads: model.heads,
            kv_heads: model.kv_heads,
            head_dim: model.head_dim,
            ffn: model.ffn_hidden,
            experts: moe.map_or(0, |x| x.experts),
            top_k: moe.map_or(0, |x| x.top_k),
            expert_ffn: moe.map_or(0, |x| x.expert_ffn_hidden),
            seq,
            mbs: cfg.mbs,
        };
        let is_moe = moe.is_some();
        let step = Step {
            cfg,
            model,
            workload: &w,
            dims: &dims,
            moe_layer: &[is_moe],
            schedule: Schedule::OneFOneB,
            micro_batches: 1,
            stage_layers: &[1],
            first_layer: &[0],
        };
        let map = rank_map(cfg, "tp-cp-ep-dp-pp", 8).unwrap();
        let mut priced = Priced::new(model, &hw, &w, cfg, a);
        walk_step(step, &map, 0, &mut priced);
        let kind = if is_moe {
            LayerKind::Moe
        } else {
            LayerKind::Dense
        };
        let lc = layer_cost(&Ctx::new(model, &hw, &w, cfg, a), kind);
        let get = |m: &BTreeMap<&str, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
        let mut pairs = vec![
            (
                "attention_proj",
                get(&priced.gemm, "attention_proj"),
                lc.fwd.attention_proj + lc.bwd.attention_proj,
            ),
            ("mlp", get(&priced.gemm, "mlp"), lc.fwd.mlp + lc.bwd.mlp),
            (
                "moe_experts",
                get(&priced.gemm, "moe_experts"),
                lc.fwd.moe_experts + lc.bwd.moe_experts,
            ),
            (
                "router",
                get(&priced.gemm, "router"),
                lc.fwd.router + lc.bwd.router,
            ),
            ("tp", get(&priced.collective, "tp"), lc.tp.0),
            ("cp", get(&priced.collective, "cp"), lc.cp.0),
            ("ep", get(&priced.collective, "ep"), lc.ep.0),
        ];
        // FP8 casts are priced but not run: the executor's GEMMs are BF16.
        if !precision.is_fp8() {
            pairs.push((
                "elementwise",
                get(&priced.memory, "elementwise") - get(&priced.memory_replayed, "elementwise"),
                lc.fwd.elementwise + lc.bwd.elementwise,
            ));
            // What recomputation replays: its GEMMs and element-wise traffic, less
            // the attention core (the fused kernel is priced, batched GEMMs run).
            let core = if cfg.recompute == Recompute::Full
                || cfg.recomputes(RecomputeModules::CORE_ATTN)
            {
                lc.attn_core_fwd
            } else {
                0.0
            };
            let replayed: f64 = priced
                .recompute
                .iter()
                .filter(|(k, _)| **k != "attention_core")
                .map(|(_, v)| v)
                .sum::<f64>()
                + get(&priced.memory_replayed, "elementwise");
            pairs.push(("replayed", replayed, lc.recompute - core));
        }
        for (class, walked, cost) in &pairs {
            assert!(
                (walked - cost).abs() <= 1e-9 * cost.abs().max(1e-12),
                "{} tp {} cp {} ep {} mbs {} {precision:?}: {class} walked {walked:.9e} s, \
                 cost model {cost:.9e} s",
                model.name,
                cfg.tp,
                cfg.cp,
                cfg.ep,
                cfg.mbs
            );
        }
        pairs.iter().filter(|p| p.2 > 0.0).count()
    }

    /// No recomputation, full, Megatron's default selective set, and the other
    /// modules together.
    fn replays() -> [(Recompute, RecomputeModules); 4] {
        let m = RecomputeModules::LAYERNORM
            .union(RecomputeModules::MLP)
            .union(RecomputeModules::MOE);
        [
            (Recompute::None, RecomputeModules::DEFAULT),
            (Recompute::Full, RecomputeModules::DEFAULT),
            (Recompute::Selective, RecomputeModules::DEFAULT),
            (Recompute::Selective, m),
        ]
    }

    /// Every preset as the executor runs it, at every TP that splits it, with and
    /// without CP and EP, under each recomputation: the walk's ops priced one by
    /// one cost what the cost model charges the layer, for each GEMM class, the
    /// element-wise traffic, each layer collective (total, before overlap) and the
    /// replayed work. The attention core is left out: the
    /// cost model prices the fused kernel, the executor runs batched GEMMs (its
    /// FLOPs are held by `walk::tests`).
    #[test]
    fn the_walk_is_priced_as_the_cost_model_prices_the_layer() {
        let mut compared = 0;
        let mut moe_models = 0;
        for p in PRESETS {
            let model = executed(p.name);
            let experts = model.moe.as_ref().map_or(1, |m| m.experts);
            if model.moe.is_some() {
                moe_models += 1;
            }
            for tp in [1, 2, 4, 8] {
                let kv_ok = model.kv_heads.is_multiple_of(tp) || tp.is_multiple_of(model.kv_heads);
                if !model.heads.is_multiple_of(tp) || !model.ffn_hidden.is_multiple_of(tp) || !kv_ok
                {
                    continue;
                }
                for (cp, ep, mbs) in [(1, 1, 1), (2, 1, 2), (1, 8, 1), (2, 4, 1), (1, 16, 1)] {
                    if !experts.is_multiple_of(ep) || (model.moe.is_none() && ep > 1) {
                        continue;
                    }
                    for d in [Dispatcher::AllToAll, Dispatcher::Deduplicated] {
                        // Across nodes the cost model prices DeepEP's deduplicated
                        // dispatch; the executor runs NCCL's all-to-all.
                        if d == Dispatcher::Deduplicated && (ep == 1 || ep > 8) {
                            continue;
                        }
                        for rc in replays() {
                            let cfg = config(tp, cp, ep, mbs, d, rc);
                            compared += check(&model, &cfg, 4096, Precision::Bf16);
                        }
                    }
                }
            }
            // FP8 GEMMs (projections, MLP, experts; router in BF16).
            compared += check(
                &model,
                &config(1, 1, 1, 1, Dispatcher::AllToAll, replays()[0]),
                2048,
                Precision::Fp8,
            );
        }
        assert!(moe_models >= 3, "{moe_models} MoE presets");
        assert!(compared > 1500, "{compared} prices compared");
    }
}
