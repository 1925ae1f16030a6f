//! [`evaluate`]: runs the passes on one configuration (per-layer costs, stages,
//! pipeline, per-layer communication, data-parallel synchronisation) and assembles
//! the [`Estimate`]: the step time, its breakdown on the critical rank, the
//! communication terms, the memory of every rank, MFU and HFU.

use crate::config::{ParallelConfig, Rejection, Workload};
use crate::hardware::Cluster;
use crate::memory::StageMemory;
use crate::model::ModelSpec;

use super::dp_sync::dp_sync;
use super::kernel::Ctx;
use super::layer_comm::layer_comm_terms;
use super::pipeline::{closed_form, p2p_term};
use super::stage::{pieces, rank_memory, stage_cost, CriticalRank, Pieces, StageCost, StageLayout};
use super::{
    Assumptions, CommKind, CommTerm, Estimate, MoeRouting, OpClasses, StageSummary, TimeBreakdown,
    ESTIMATE_SCHEMA_VERSION,
};

/// Like [`estimate_with`](super::estimate_with) but returns the estimate even when
/// it does not fit in memory (so that the caller can show why); structural rules
/// still apply.
pub fn evaluate(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
    a: Assumptions,
) -> Result<Estimate, Rejection> {
    cfg.check(model, cluster, w)?;
    if a.cuda_graphs.per_layer() && cfg.recompute == crate::config::Recompute::Full {
        return Err(Rejection::GraphsWithFullRecompute);
    }
    if !a.flash_attention && cfg.cp > 1 && a.framework != super::Framework::ScaleTorch {
        return Err(Rejection::CpNeedsFusedAttention { cp: cfg.cp });
    }
    let hw = &cluster.profile;
    let c = Ctx::new(model, hw, w, cfg, a);
    let m = cfg.micro_batches(w);
    let p = cfg.pp;
    let pc = pieces(&c);
    let layout = StageLayout::new(model, cfg)?;

    let costs: Vec<StageCost> = (0..p).map(|i| stage_cost(&c, &pc, &layout, i)).collect();
    // Time of one micro-batch on each rank (the mean over the stages it runs).
    let rank_secs: Vec<f64> = (0..p)
        .map(|r| {
            layout
                .hosts(r)
                .iter()
                .map(|&(s, k)| k * costs[s as usize].secs)
                .sum()
        })
        .collect();

    let mut stages = Vec::with_capacity(p as usize);
    let mut worst_mem = StageMemory::default();
    let mut rank_expert_params = Vec::with_capacity(p as usize);
    for i in 0..p {
        let iu = i as usize;
        let (mem, expert_p) = rank_memory(&c, &pc, &layout, &costs, i, m);
        if mem.total > worst_mem.total {
            worst_mem = mem;
        }
        rank_expert_params.push(expert_p);
        stages.push(StageSummary {
            stage: i,
            layers: layout.layers[iu],
            moe_layers: layout.moe[iu],
            mtp_layers: if i == p - 1 { model.mtp_layers } else { 0 },
            secs_per_micro_batch: costs[iu].secs,
            weight_grad_secs: costs[iu].weight_secs,
            memory: mem,
        });
    }

    let pipe_form = closed_form(cfg, &rank_secs, &costs);
    let (critical, bubble) = (pipe_form.critical, pipe_form.bubble);
    let pipe = m as f64 * pipe_form.t_max + bubble;

    let mb = m as f64;
    // The critical rank's layers, with the share of its micro-batches on each stage.
    let crit = layout.critical(critical);
    let mut comm: Vec<CommTerm> = layer_comm_terms(&c, &pc, &crit, mb);
    let p2p = p2p_term(&c, mb);
    let p2p_exposed = p2p.as_ref().map_or(0.0, |t| t.exposed_secs);
    comm.extend(p2p);

    let overlapped_layers = mb * (crit.dense * pc.dense.overlapped + crit.moe * pc.moe.overlapped);
    let sync = dp_sync(
        &c,
        &stages,
        &rank_expert_params,
        &rank_secs,
        mb,
        overlapped_layers,
    );
    comm.extend(sync.terms);
    let (dp_exposed_max, optimizer_secs) = (sync.exposed, sync.optimizer_secs);

    let slowdown = hw.efficiency.overlap_slowdown * sync.overlapped;
    let step = pipe + p2p_exposed + dp_exposed_max + optimizer_secs + slowdown;

    let (compute, recompute, host_wait) = critical_compute(&pc, &crit, &layout, mb);
    let exposed_layer_comm = exposed_layer_comm(&mut comm, &pc, &crit, &layout, mb);
    let exposed_comm = exposed_layer_comm + p2p_exposed + dp_exposed_max;
    let (model_flops, recompute_flops) = step_flops(&c, &pc, &layout);
    let peak = hw.peak_flops(false);
    let mfu = model_flops / (step * peak);
    let hfu = (model_flops + recompute_flops) / (step * peak);
    let tokens_per_step = (w.global_batch * w.seq) as f64;

    Ok(Estimate {
        schema_version: ESTIMATE_SCHEMA_VERSION,
        step_secs: step,
        tokens_per_sec_per_gpu: tokens_per_step / step / cluster.gpus as f64,
        mfu,
        hfu,
        model_tflops_per_gpu: model_flops / step / 1e12,
        micro_batches: m,
        bubble_fraction: bubble / step,
        exposed_comm_fraction: exposed_comm / step,
        time: TimeBreakdown {
            compute,
            recompute,
            exposed_comm,
            bubble,
            optimizer: optimizer_secs,
            overlap_slowdown: slowdown,
            host_wait,
        },
        comm,
        memory: worst_mem,
        hbm_bytes: hw.hbm_bytes(),
        usable_bytes: hw.usable_bytes(),
        stages,
        critical_stage: critical,
        band: None,
        pipeline_simulated: false,
        moe_routing: model.moe.as_ref().map(|moe| {
            let load = w.moe_rank_load(moe, cfg.ep);
            MoeRouting {
                imbalance: w.moe_imbalance,
                capacity_factor: w.moe_capacity.map(|c| c.factor),
                pad_to_capacity: w.moe_capacity.is_some_and(|c| c.pad),
                busiest_rank_load: load.factor,
                dropped_fraction: load.dropped,
            }
        }),
    })
}

/// Compute and recomputation of the step on the critical rank, by operation class,
/// and the time its GPU waits for the host.
fn critical_compute(
    pc: &Pieces,
    crit: &CriticalRank,
    layout: &StageLayout,
    mb: f64,
) -> (OpClasses, f64, f64) {
    let (dense, moe, mtp) = (&pc.dense, &pc.moe, layout.mtp);
    let mut compute = OpClasses::default();
    compute.add_scaled(&dense.fwd, mb * crit.dense);
    compute.add_scaled(&dense.bwd, mb * crit.dense);
    compute.add_scaled(&moe.fwd, mb * crit.moe);
    compute.add_scaled(&moe.bwd, mb * crit.moe);
    compute.elementwise += crit.first * mb * pc.embed_secs;
    compute.output_layer +=
        crit.last * mb * ((1.0 + mtp) * pc.output_secs + mtp * pc.mtp.proj_secs);
    compute.elementwise += crit.last * mb * mtp * pc.mtp.elementwise_secs;
    let recompute = mb * (crit.dense * dense.recompute + crit.moe * moe.recompute);
    let host_wait = mb * (crit.dense * dense.host_wait + crit.moe * moe.host_wait);
    (compute, recompute, host_wait)
}

/// The exposed per-layer communication on the critical rank, the output layer's
/// TP communication (once per MTP layer too) included; that is added to the TP
/// term in `comm`.
fn exposed_layer_comm(
    comm: &mut [CommTerm],
    pc: &Pieces,
    crit: &CriticalRank,
    layout: &StageLayout,
    mb: f64,
) -> f64 {
    let out_tp_secs = crit.last * mb * pc.out_comm() * (1.0 + layout.mtp);
    let exposed = comm
        .iter()
        .filter(|t| {
            matches!(
                t.kind,
                CommKind::Tp | CommKind::Cp | CommKind::Ep | CommKind::Etp
            )
        })
        .map(|t| t.exposed_secs)
        .sum::<f64>()
        + out_tp_secs;
    if out_tp_secs > 0.0 {
        if let Some(tp) = comm.iter_mut().find(|t| t.kind == CommKind::Tp) {
            tp.total_secs += out_tp_secs;
            tp.exposed_secs += out_tp_secs;
        }
    }
    exposed
}

/// FLOPs of the whole model per step, per GPU: the model's (for MFU) and the
/// recomputed ones (for HFU).
fn step_flops(c: &Ctx, pc: &Pieces, layout: &StageLayout) -> (f64, f64) {
    let (model, cfg, w) = (c.model, c.cfg, c.w);
    let (dense, moe, mtp) = (&pc.dense, &pc.moe, layout.mtp);
    let moe_layers = model.moe_layers() as f64;
    let dense_layers = model.layers as f64 - moe_layers;
    // Layer FLOPs are already per GPU of a TP x CP group; every micro-batch of the
    // step passes all layers once, spread over the PP stages and the DP replicas.
    let per_gpu_div = (cfg.pp * cfg.dp) as f64;
    let total_micro = (w.global_batch / cfg.mbs) as f64;
    // Megatron's FLOP count includes the MTP layers, their projections and their
    // second output-layer pass (num_floating_point_operations, megatron/training).
    let (dense_layers, moe_layers) = (dense_layers + layout.mtp_dense, moe_layers + layout.mtp_moe);
    let model_flops = total_micro
        * (dense_layers * dense.model_flops
            + moe_layers * moe.model_flops
            + (1.0 + mtp) * pc.output_flops
            + mtp * pc.mtp.proj_flops)
        / per_gpu_div;
    let recompute_flops = total_micro
        * (dense_layers * dense.recompute_flops + moe_layers * moe.recompute_flops)
        / per_gpu_div;
    (model_flops, recompute_flops)
}
