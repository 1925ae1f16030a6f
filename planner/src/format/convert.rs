//! The records to and from the values they record: the cost model's estimate and
//! assumptions, the search's space, the uncertainty bands, the ranking end.
//!
//! Each conversion from a value takes it apart field by field without `..`, so a
//! field added to the cost model does not compile until someone decides here
//! whether and how the file records it.

use super::*;
use crate::cost;
use crate::reach;
use crate::search::SearchSpace;
use crate::uncertainty;

/// `From` both ways between a record enum and the value enum it records, variant
/// by variant (the variants carry the same names).
macro_rules! both_ways {
    ($record:ty, $value:ty, [$($v:ident),+ $(,)?]) => {
        impl From<$value> for $record {
            fn from(v: $value) -> Self {
                type V = $value;
                type R = $record;
                match v {
                    $(V::$v => R::$v,)+
                }
            }
        }
        impl From<$record> for $value {
            fn from(r: $record) -> Self {
                type V = $value;
                type R = $record;
                match r {
                    $(R::$v => V::$v,)+
                }
            }
        }
    };
}

both_ways!(
    LossKernel,
    cost::LossKernel,
    [Te, Native, Unfused, Compiled]
);
both_ways!(RankOrder, cost::RankOrder, [Megatron, ScaleTorch]);
both_ways!(
    Framework,
    cost::Framework,
    [MegatronCore, Nanotron, Torchtitan, ScaleTorch, Scaling]
);
both_ways!(RankBy, reach::RankBy, [Point, Upper]);
both_ways!(
    CommKind,
    cost::CommKind,
    [Tp, Cp, Ep, Etp, Pp, DpGrad, DpParam, EdpGrad, EdpParam]
);
both_ways!(
    Collective,
    crate::comm::Collective,
    [AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv]
);
both_ways!(Tier, crate::comm::Tier, [Nvlink, Network, Local]);

// Assumptions.

impl From<cost::CudaGraphs> for CudaGraphs {
    fn from(g: cost::CudaGraphs) -> Self {
        let cost::CudaGraphs {
            attn,
            moe_router,
            moe_preprocess,
            full_iteration,
        } = g;
        CudaGraphs {
            attn,
            moe_router,
            moe_preprocess,
            full_iteration,
        }
    }
}

impl From<CudaGraphs> for cost::CudaGraphs {
    fn from(g: CudaGraphs) -> Self {
        cost::CudaGraphs {
            attn: g.attn,
            moe_router: g.moe_router,
            moe_preprocess: g.moe_preprocess,
            full_iteration: g.full_iteration,
        }
    }
}

impl From<cost::EagerOps> for EagerOps {
    fn from(e: cost::EagerOps) -> Self {
        let cost::EagerOps {
            norm,
            norm_bf16,
            rotary,
            glu,
        } = e;
        EagerOps {
            norm,
            norm_bf16,
            rotary,
            glu,
        }
    }
}

impl From<EagerOps> for cost::EagerOps {
    fn from(e: EagerOps) -> Self {
        cost::EagerOps {
            norm: e.norm,
            norm_bf16: e.norm_bf16,
            rotary: e.rotary,
            glu: e.glu,
        }
    }
}

impl From<cost::Assumptions> for Assumptions {
    fn from(a: cost::Assumptions) -> Self {
        let cost::Assumptions {
            flash_attention,
            loss,
            rank_order,
            framework,
            cuda_graphs,
            eager,
        } = a;
        Assumptions {
            flash_attention,
            loss: loss.into(),
            rank_order: rank_order.into(),
            framework: framework.into(),
            cuda_graphs: cuda_graphs.into(),
            eager_ops: eager.into(),
        }
    }
}

impl From<Assumptions> for cost::Assumptions {
    fn from(a: Assumptions) -> Self {
        cost::Assumptions {
            flash_attention: a.flash_attention,
            loss: a.loss.into(),
            rank_order: a.rank_order.into(),
            framework: a.framework.into(),
            cuda_graphs: a.cuda_graphs.into(),
            eager: a.eager_ops.into(),
        }
    }
}

// The search space.

impl SpaceRecord {
    /// The record of `space`, searched with TP across nodes allowed or not.
    pub fn of(space: &SearchSpace, allow_tp_across_nodes: bool) -> SpaceRecord {
        SpaceRecord {
            tp: space.tp.clone(),
            pp: space.pp.clone(),
            vpp: space.vpp.clone(),
            cp: space.cp.clone(),
            ep: space.ep.clone(),
            etp: space.etp.clone(),
            sp: space.sp.clone(),
            schedule: space.schedule.clone(),
            mbs: space.mbs.clone(),
            zero: space.zero.clone(),
            recompute: space.recompute.clone(),
            recompute_modules: space.recompute_modules.clone(),
            overlap: space.overlap,
            bf16_grads: space.bf16_grads,
            bf16_moments: space.bf16_moments,
            moe_dispatcher: space.moe_dispatcher,
            even_layers: space.even_layers,
            plain_dp_alone: space.plain_dp_alone,
            allow_tp_across_nodes,
        }
    }

    /// The search space again, priced with `assumptions` and ranked by `rank_by`.
    pub fn space(&self, assumptions: cost::Assumptions, rank_by: reach::RankBy) -> SearchSpace {
        SearchSpace {
            tp: self.tp.clone(),
            pp: self.pp.clone(),
            vpp: self.vpp.clone(),
            cp: self.cp.clone(),
            ep: self.ep.clone(),
            etp: self.etp.clone(),
            sp: self.sp.clone(),
            schedule: self.schedule.clone(),
            mbs: self.mbs.clone(),
            zero: self.zero.clone(),
            recompute: self.recompute.clone(),
            recompute_modules: self.recompute_modules.clone(),
            overlap: self.overlap,
            bf16_grads: self.bf16_grads,
            bf16_moments: self.bf16_moments,
            moe_dispatcher: self.moe_dispatcher,
            assumptions,
            rank_by,
            even_layers: self.even_layers,
            plain_dp_alone: self.plain_dp_alone,
        }
    }
}

// The estimate, part by part.

impl From<&cost::OpClasses> for OpClasses {
    fn from(o: &cost::OpClasses) -> Self {
        let cost::OpClasses {
            attention_proj,
            attention_core,
            mlp,
            moe_experts,
            router,
            output_layer,
            elementwise,
        } = *o;
        OpClasses {
            attention_proj,
            attention_core,
            mlp,
            moe_experts,
            router,
            output_layer,
            elementwise,
        }
    }
}

impl From<&OpClasses> for cost::OpClasses {
    fn from(o: &OpClasses) -> Self {
        cost::OpClasses {
            attention_proj: o.attention_proj,
            attention_core: o.attention_core,
            mlp: o.mlp,
            moe_experts: o.moe_experts,
            router: o.router,
            output_layer: o.output_layer,
            elementwise: o.elementwise,
        }
    }
}

impl From<&cost::TimeBreakdown> for TimeBreakdown {
    fn from(t: &cost::TimeBreakdown) -> Self {
        let cost::TimeBreakdown {
            compute,
            recompute,
            exposed_comm,
            bubble,
            optimizer,
            overlap_slowdown,
            host_wait,
        } = t;
        TimeBreakdown {
            compute: compute.into(),
            recompute: *recompute,
            exposed_comm: *exposed_comm,
            bubble: *bubble,
            optimizer: *optimizer,
            overlap_slowdown: *overlap_slowdown,
            host_wait: *host_wait,
        }
    }
}

impl From<&TimeBreakdown> for cost::TimeBreakdown {
    fn from(t: &TimeBreakdown) -> Self {
        cost::TimeBreakdown {
            compute: (&t.compute).into(),
            recompute: t.recompute,
            exposed_comm: t.exposed_comm,
            bubble: t.bubble,
            optimizer: t.optimizer,
            overlap_slowdown: t.overlap_slowdown,
            host_wait: t.host_wait,
        }
    }
}

impl From<crate::comm::Placement> for Placement {
    fn from(p: crate::comm::Placement) -> Self {
        let crate::comm::Placement {
            size,
            per_domain,
            domains,
        } = p;
        Placement {
            size,
            per_domain,
            domains,
        }
    }
}

impl From<Placement> for crate::comm::Placement {
    fn from(p: Placement) -> Self {
        crate::comm::Placement {
            size: p.size,
            per_domain: p.per_domain,
            domains: p.domains,
        }
    }
}

impl From<&cost::CommTerm> for CommTerm {
    fn from(c: &cost::CommTerm) -> Self {
        let cost::CommTerm {
            kind,
            collective,
            group,
            tier,
            bytes_per_call,
            calls_per_step,
            total_secs,
            exposed_secs,
            overlapped_secs,
        } = *c;
        CommTerm {
            kind: kind.into(),
            collective: collective.into(),
            group: group.into(),
            tier: tier.into(),
            bytes_per_call,
            calls_per_step,
            total_secs,
            exposed_secs,
            overlapped_secs,
        }
    }
}

impl From<&CommTerm> for cost::CommTerm {
    fn from(c: &CommTerm) -> Self {
        cost::CommTerm {
            kind: c.kind.into(),
            collective: c.collective.into(),
            group: c.group.into(),
            tier: c.tier.into(),
            bytes_per_call: c.bytes_per_call,
            calls_per_step: c.calls_per_step,
            total_secs: c.total_secs,
            exposed_secs: c.exposed_secs,
            overlapped_secs: c.overlapped_secs,
        }
    }
}

impl From<&crate::memory::StageMemory> for StageMemory {
    fn from(m: &crate::memory::StageMemory) -> Self {
        let crate::memory::StageMemory {
            stage,
            params,
            weights,
            gradients,
            optimizer,
            activations,
            logits,
            buffers,
            fragmentation,
            cached,
            reserve,
            total,
            in_flight,
        } = *m;
        StageMemory {
            stage,
            params,
            weights,
            gradients,
            optimizer,
            activations,
            logits,
            buffers,
            fragmentation,
            cached,
            reserve,
            total,
            in_flight,
        }
    }
}

impl From<&StageMemory> for crate::memory::StageMemory {
    fn from(m: &StageMemory) -> Self {
        crate::memory::StageMemory {
            stage: m.stage,
            params: m.params,
            weights: m.weights,
            gradients: m.gradients,
            optimizer: m.optimizer,
            activations: m.activations,
            logits: m.logits,
            buffers: m.buffers,
            fragmentation: m.fragmentation,
            cached: m.cached,
            reserve: m.reserve,
            total: m.total,
            in_flight: m.in_flight,
        }
    }
}

impl From<&cost::StageSummary> for StageSummary {
    fn from(s: &cost::StageSummary) -> Self {
        let cost::StageSummary {
            stage,
            layers,
            moe_layers,
            mtp_layers,
            secs_per_micro_batch,
            weight_grad_secs,
            memory,
        } = s;
        StageSummary {
            stage: *stage,
            layers: *layers,
            moe_layers: *moe_layers,
            mtp_layers: *mtp_layers,
            secs_per_micro_batch: *secs_per_micro_batch,
            weight_grad_secs: *weight_grad_secs,
            memory: memory.into(),
        }
    }
}

impl From<&StageSummary> for cost::StageSummary {
    fn from(s: &StageSummary) -> Self {
        cost::StageSummary {
            stage: s.stage,
            layers: s.layers,
            moe_layers: s.moe_layers,
            mtp_layers: s.mtp_layers,
            secs_per_micro_batch: s.secs_per_micro_batch,
            weight_grad_secs: s.weight_grad_secs,
            memory: (&s.memory).into(),
        }
    }
}

impl From<&uncertainty::Attribution> for Attribution {
    fn from(a: &uncertainty::Attribution) -> Self {
        let uncertainty::Attribution {
            dominant,
            variance_shares,
            term_sigmas,
        } = a;
        Attribution {
            dominant: dominant.clone(),
            variance_shares: variance_shares.clone(),
            term_sigmas: term_sigmas.clone(),
        }
    }
}

impl From<&Attribution> for uncertainty::Attribution {
    fn from(a: &Attribution) -> Self {
        uncertainty::Attribution {
            dominant: a.dominant.clone(),
            variance_shares: a.variance_shares.clone(),
            term_sigmas: a.term_sigmas.clone(),
        }
    }
}

impl From<&reach::Outside> for Outside {
    fn from(o: &reach::Outside) -> Self {
        let reach::Outside {
            axis,
            value,
            validated,
            doublings,
            per_doubling,
        } = o;
        Outside {
            axis: axis.clone(),
            value: *value,
            validated: *validated,
            doublings: *doublings,
            per_doubling: *per_doubling,
        }
    }
}

impl From<&Outside> for reach::Outside {
    fn from(o: &Outside) -> Self {
        reach::Outside {
            axis: o.axis.clone(),
            value: o.value,
            validated: o.validated,
            doublings: o.doublings,
            per_doubling: o.per_doubling,
        }
    }
}

impl From<&uncertainty::Band> for Band {
    fn from(b: &uncertainty::Band) -> Self {
        let uncertainty::Band {
            coverage,
            low_secs,
            high_secs,
            basis,
            samples,
            attribution,
            outside,
        } = b;
        Band {
            coverage: *coverage,
            low_secs: *low_secs,
            high_secs: *high_secs,
            basis: basis.clone(),
            samples: *samples,
            attribution: attribution.as_ref().map(Into::into),
            outside: outside.iter().map(Into::into).collect(),
        }
    }
}

impl From<&Band> for uncertainty::Band {
    fn from(b: &Band) -> Self {
        uncertainty::Band {
            coverage: b.coverage,
            low_secs: b.low_secs,
            high_secs: b.high_secs,
            basis: b.basis.clone(),
            samples: b.samples,
            attribution: b.attribution.as_ref().map(Into::into),
            outside: b.outside.iter().map(Into::into).collect(),
        }
    }
}

impl From<&cost::MoeRouting> for MoeRouting {
    fn from(r: &cost::MoeRouting) -> Self {
        let cost::MoeRouting {
            imbalance,
            capacity_factor,
            pad_to_capacity,
            busiest_rank_load,
            dropped_fraction,
        } = *r;
        MoeRouting {
            imbalance,
            capacity_factor,
            pad_to_capacity,
            busiest_rank_load,
            dropped_fraction,
        }
    }
}

impl From<&MoeRouting> for cost::MoeRouting {
    fn from(r: &MoeRouting) -> Self {
        cost::MoeRouting {
            imbalance: r.imbalance,
            capacity_factor: r.capacity_factor,
            pad_to_capacity: r.pad_to_capacity,
            busiest_rank_load: r.busiest_rank_load,
            dropped_fraction: r.dropped_fraction,
        }
    }
}

impl From<&cost::Estimate> for Estimate {
    fn from(e: &cost::Estimate) -> Self {
        let cost::Estimate {
            schema_version,
            step_secs,
            tokens_per_sec_per_gpu,
            mfu,
            hfu,
            model_tflops_per_gpu,
            micro_batches,
            bubble_fraction,
            exposed_comm_fraction,
            time,
            comm,
            memory,
            hbm_bytes,
            usable_bytes,
            stages,
            critical_stage,
            band,
            pipeline_simulated,
            moe_routing,
        } = e;
        Estimate {
            schema_version: *schema_version,
            step_secs: *step_secs,
            tokens_per_sec_per_gpu: *tokens_per_sec_per_gpu,
            mfu: *mfu,
            hfu: *hfu,
            model_tflops_per_gpu: *model_tflops_per_gpu,
            micro_batches: *micro_batches,
            bubble_fraction: *bubble_fraction,
            exposed_comm_fraction: *exposed_comm_fraction,
            time: time.into(),
            comm: comm.iter().map(Into::into).collect(),
            memory: memory.into(),
            hbm_bytes: *hbm_bytes,
            usable_bytes: *usable_bytes,
            stages: stages.iter().map(Into::into).collect(),
            critical_stage: *critical_stage,
            band: band.as_ref().map(Into::into),
            pipeline_simulated: *pipeline_simulated,
            moe_routing: moe_routing.as_ref().map(Into::into),
        }
    }
}

impl From<&Estimate> for cost::Estimate {
    fn from(e: &Estimate) -> Self {
        cost::Estimate {
            schema_version: e.schema_version,
            step_secs: e.step_secs,
            tokens_per_sec_per_gpu: e.tokens_per_sec_per_gpu,
            mfu: e.mfu,
            hfu: e.hfu,
            model_tflops_per_gpu: e.model_tflops_per_gpu,
            micro_batches: e.micro_batches,
            bubble_fraction: e.bubble_fraction,
            exposed_comm_fraction: e.exposed_comm_fraction,
            time: (&e.time).into(),
            comm: e.comm.iter().map(Into::into).collect(),
            memory: (&e.memory).into(),
            hbm_bytes: e.hbm_bytes,
            usable_bytes: e.usable_bytes,
            stages: e.stages.iter().map(Into::into).collect(),
            critical_stage: e.critical_stage,
            band: e.band.as_ref().map(Into::into),
            pipeline_simulated: e.pipeline_simulated,
            moe_routing: e.moe_routing.as_ref().map(Into::into),
        }
    }
}
