//! The pricing sink: the planner's walk over a step ([`crate::walk`]) charged op
//! by op with the cost model's own roofline (`Ctx::gemm`, HBM traffic, collectives
//! on their groups' placement). The test below holds its linear GEMMs
//! (projections and MLP, forward, input and weight gradients) to the cost model's
//! price of the same layer. The rest is priced with the same functions but not
//! held to the cost model: the attention core is charged as the walk's batched
//! GEMMs (the cost model uses the flash kernel's efficiency), and collectives are
//! charged whole, nothing overlapped.
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
    /// Element-wise and optimizer HBM traffic, by class.
    pub memory: BTreeMap<&'static str, f64>,
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
            Op::Memory { class, bytes, .. } => {
                *self.memory.entry(class.key()).or_default() += c.mem(bytes as f64);
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
    use crate::config::{Dispatcher, Layout, Overlap, Precision, Recompute, Zero};
    use crate::cost::layer::layer_cost;
    use crate::hardware::builtin_profile;
    use crate::memory::LayerKind;
    use crate::presets::resolve;
    use crate::ranks::rank_map;
    use crate::schedule::Schedule;
    use crate::walk::{walk_step, Dims, Step};

    /// One layer, one micro-batch, one rank's walk priced, against the cost model's
    /// price of the same layer: every linear GEMM (projections and MLP, forward,
    /// input and weight gradients) to the same seconds.
    #[test]
    fn the_walk_is_priced_as_the_cost_model_prices_the_layer() {
        let model = resolve("llama3-70b").unwrap().spec;
        let hw = builtin_profile("h100-sxm").unwrap();
        for (tp, cp, seq, precision) in [
            (8, 1, 256, Precision::Bf16),
            (1, 1, 4096, Precision::Bf16),
            (4, 1, 8192, Precision::Bf16),
            (8, 2, 8192, Precision::Fp8),
        ] {
            let cfg = ParallelConfig {
                tp,
                pp: 1,
                vpp: 1,
                cp,
                ep: 1,
                etp: 1,
                dp: 1,
                sp: tp > 1,
                mbs: 1,
                zero: Zero::None,
                recompute: Recompute::None,
                layout: Layout::Even,
                overlap: Overlap::default(),
                bf16_grads: false,
                bf16_moments: false,
                recompute_modules: Default::default(),
                moe_dispatcher: Dispatcher::AllToAll,
                schedule: Schedule::OneFOneB,
            };
            let w = Workload {
                seq,
                global_batch: 1,
                precision,
                moe_imbalance: 1.0,
                moe_capacity: None,
            };
            let a = Assumptions::default();
            let dims = Dims {
                hidden: model.hidden,
                heads: model.heads,
                kv_heads: model.kv_heads,
                head_dim: model.head_dim,
                ffn: model.ffn_hidden,
                experts: 0,
                top_k: 0,
                expert_ffn: 0,
                seq,
                mbs: 1,
            };
            let step = Step {
                cfg: &cfg,
                model: &model,
                workload: &w,
                dims: &dims,
                moe_layer: &[false],
                schedule: Schedule::OneFOneB,
                micro_batches: 1,
                stage_layers: &[1],
                first_layer: &[0],
            };
            let map = rank_map(&cfg, "tp-cp-ep-dp-pp", 8).unwrap();
            let mut priced = Priced::new(&model, &hw, &w, &cfg, a);
            walk_step(step, &map, 0, &mut priced);
            let walked = priced.gemm["attention_proj"] + priced.gemm["mlp"];
            let lc = layer_cost(&Ctx::new(&model, &hw, &w, &cfg, a), LayerKind::Dense);
            let cost = lc.fwd.attention_proj + lc.fwd.mlp + lc.bwd.attention_proj + lc.bwd.mlp;
            assert!(
                (walked - cost).abs() <= 1e-12 * cost,
                "tp {tp} cp {cp}: walked {walked:.9e} s, cost model {cost:.9e} s"
            );
        }
    }
}
