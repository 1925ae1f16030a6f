//! Data-parallel synchronisation per stage: the dense and expert gradients'
//! reduction and the parameters' gathers (by ZeRO stage, in Megatron's buckets, or
//! per layer under ZeRO-3), what the backward, the forward and the pipeline's
//! drain hide of them, DualPipe's sum of a stage's two copies, and the optimizer
//! step on the shard each rank owns. The step waits for the slowest stage.

use crate::comm::{Collective, Placement};
use crate::config::Zero;
use crate::memory;

use super::kernel::Ctx;
use super::{CommKind, CommTerm, Framework, StageSummary, BUCKET_PARAMS};

/// The step's data-parallel synchronisation and optimizer.
pub(super) struct DpSync {
    /// The terms of the stage whose exposed synchronisation delays the step most.
    pub(super) terms: Vec<CommTerm>,
    /// What of it delays the step.
    pub(super) exposed: f64,
    /// The overlapped communication of the step: the layers' (given) and that
    /// stage's.
    pub(super) overlapped: f64,
    /// The slowest rank's optimizer step.
    pub(super) optimizer_secs: f64,
}

/// One stage's synchronisation, before the drain's slack.
#[derive(Default)]
struct StageSync {
    terms: Vec<CommTerm>,
    exposed: f64,
    overlapped: f64,
    /// What follows a synchronisation of the whole step (`scaling`'s parameter
    /// gather comes after its gradient norm is summed over every stage), which
    /// no drain slack hides, and its terms.
    after_step: f64,
    after_terms: Vec<CommTerm>,
}

/// The compute a stage's synchronisation can hide behind: one micro-batch's
/// forward and backward on its rank, over `mb` micro-batches and `units` layers.
struct Window {
    t_f: f64,
    t_b: f64,
    mb: f64,
    units: f64,
}

/// One group's parameters to synchronise, and the kinds its terms are reported as.
struct Shard {
    params: f64,
    group: Placement,
    grad_kind: CommKind,
    param_kind: CommKind,
}

/// Data-parallel synchronisation, per stage; the step waits for the slowest.
/// Stage i finishes its last backward i micro-batch-backwards before stage 0
/// (the drain of 1F1B), which hides that much of its reduction. Under ZB-H1 and
/// DualPipe the deferred W's fill the drain, so every rank computes weight
/// gradients until the end of the step and nothing is hidden that way.
/// `overlapped_layers` is the layers' overlapped communication, which the
/// chosen stage's is added to.
pub(super) fn dp_sync(
    c: &Ctx,
    stages: &[StageSummary],
    rank_expert_params: &[f64],
    rank_secs: &[f64],
    mb: f64,
    overlapped_layers: f64,
) -> DpSync {
    let cfg = c.cfg;
    let drains = !cfg.schedule.splits_weight_grad();
    let mut dp_exposed_max = 0.0f64;
    let mut dp_terms: Vec<CommTerm> = Vec::new();
    let mut after_max = 0.0f64;
    let mut after_terms: Vec<CommTerm> = Vec::new();
    let mut overlapped_total = overlapped_layers;
    let mut optimizer_secs = 0.0f64;
    for s in stages {
        let mem = &s.memory;
        let expert_p = rank_expert_params[s.stage as usize];
        let dense_p = mem.params - expert_p;
        let win = Window {
            t_b: rank_secs[s.stage as usize] * 2.0 / 3.0,
            t_f: rank_secs[s.stage as usize] / 3.0,
            mb,
            units: (s.layers + s.mtp_layers).max(1) as f64,
        };
        let slack = if drains {
            s.stage as f64 * win.t_b
        } else {
            0.0
        };
        let StageSync {
            mut terms,
            exposed,
            overlapped,
            after_step,
            after_terms: after,
        } = stage_sync(c, s, dense_p, expert_p, &win);
        // The slowest stage's, after every stage's slack-hidden part.
        if after_step > after_max || (after_terms.is_empty() && !after.is_empty()) {
            after_max = after_max.max(after_step);
            after_terms = after;
        }
        // Exposure beyond this stage's drain slack delays the step.
        let stage_exposed = (exposed - slack).max(0.0);
        if stage_exposed >= dp_exposed_max && (!terms.is_empty() || dp_terms.is_empty()) {
            dp_exposed_max = stage_exposed;
            for term in &mut terms {
                // Attribute the slack proportionally so the terms add up.
                if exposed > 0.0 {
                    let kept = stage_exposed / exposed;
                    let hidden = term.exposed_secs * (1.0 - kept);
                    term.exposed_secs -= hidden;
                    term.overlapped_secs += hidden;
                }
            }
            dp_terms = terms;
            overlapped_total += overlapped;
        }
        // Optimizer: Adam reads and writes the FP32 master weight, momentum and
        // variance, reads the FP32 gradient and writes the BF16 weight (~30 bytes
        // per parameter), plus the gradient-norm pass (4 bytes): on the shard this
        // rank owns. BF16 moments move 8 bytes fewer.
        let (_, _, opt_bytes) =
            memory::model_state(cfg, dense_p, expert_p, Framework::MegatronCore);
        let owned = opt_bytes / memory::optimizer_bytes(cfg);
        // `scaling`'s passes over the whole stage's gradients, not the shard
        // (parameter_group.py, allreduce.py at 737f855): each all-reduce bucket
        // flattened, divided, (ZeRO-1: cast to FP32 and back,) and copied into the
        // gradients: 24 bytes either way; the loss-scale division and the norm
        // (`mul_`, `norm`) of the BF16 gradients (ZeRO-1: 2 + 2 + 2) or of their
        // FP32 copies (ZeRO-0: 4 + 4 + 4); under ZeRO-1 the gathered shards
        // copied out of the list all-gather's buffer (2 + 2).
        let stage_passes = if c.a.framework == Framework::Scaling {
            let per = if cfg.zero == Zero::None {
                24.0 + 12.0
            } else {
                24.0 + 6.0 + 4.0
            };
            per * mem.params
        } else {
            0.0
        };
        let per_param = match c.a.framework {
            // ScaleTorch's pure-BF16 AdamW (`Framework::ScaleTorch`) reads the
            // weight and gradient and writes the weight (2 + 2 + 2), reads and
            // writes both BF16 moments (8); clipping reads the gradients and
            // scales them in place (2 + 4); with data parallelism the FP32
            // buckets are first copied to BF16 gradients (4 + 2).
            Framework::ScaleTorch => 14.0 + 6.0 + if cfg.dp > 1 { 6.0 } else { 0.0 },
            // `scaling` on the parameters it steps (parameter_group.py at
            // 737f855): under ZeRO-1 a zeroed FP32 gradient for its shard (4) and
            // the BF16 gradient copied into it (2 + 4), under ZeRO-0 every
            // gradient cast to FP32 (2 + 4); torch's multi-tensor AdamW, its
            // default: the decoupled weight decay (4 + 4), `lerp_` of the first
            // moment (4 + 4 + 4), `mul_` and `addcmul_` of the second (4 + 4, and
            // 4 + 4 + 4 + 4), its `sqrt`, bias correction and `eps` (3 x (4 + 4)),
            // `addcdiv_` into the weight (4 + 4 + 4 + 4): 84; clipping (4 + 4,
            // counted every step though it runs only above the threshold); the
            // FP32 weight copied to the BF16 one (4 + 2). Its moments are FP32
            // (`Framework::check_config`).
            Framework::Scaling => {
                if cfg.zero == Zero::None {
                    6.0 + 84.0 + 8.0 + 6.0
                } else {
                    10.0 + 84.0 + 8.0 + 6.0
                }
            }
            Framework::MegatronCore | Framework::Nanotron | Framework::Torchtitan => {
                if cfg.bf16_moments {
                    26.0
                } else {
                    34.0
                }
            }
        };
        optimizer_secs = optimizer_secs.max(c.mem(owned * per_param + stage_passes));
    }
    dp_terms.extend(after_terms);
    DpSync {
        terms: dp_terms,
        exposed: dp_exposed_max + after_max,
        overlapped: overlapped_total,
        optimizer_secs,
    }
}

/// Stage `s`'s dense and expert synchronisation and, under DualPipe, the sum of
/// its two copies.
fn stage_sync(c: &Ctx, s: &StageSummary, dense_p: f64, expert_p: f64, win: &Window) -> StageSync {
    let cfg = c.cfg;
    let mut sync = StageSync::default();
    for (params_local, group, grad_kind, param_kind) in [
        (dense_p, c.dp_group(), CommKind::DpGrad, CommKind::DpParam),
        (
            expert_p,
            c.edp_group(),
            CommKind::EdpGrad,
            CommKind::EdpParam,
        ),
    ] {
        if params_local <= 0.0 || group.size <= 1 {
            continue;
        }
        let shard = Shard {
            params: params_local,
            group,
            grad_kind,
            param_kind,
        };
        group_sync(c, &shard, win, &mut sync);
    }
    // DualPipe: the two copies of each stage (on ranks i and p-1-i) sum their
    // gradients, an all-reduce between the pair of the gradient shard each rank
    // keeps, after the backward.
    if cfg.schedule == crate::schedule::Schedule::DualPipe {
        let shard = if cfg.zero == Zero::None {
            1.0
        } else {
            (cfg.dp * cfg.cp) as f64
        };
        let bytes = s.memory.params * memory::grad_bytes(cfg) / shard;
        let g = c.pp_group();
        let secs = c.coll(Collective::AllReduce, bytes, g);
        sync.exposed += secs;
        sync.terms.push(unhidden(
            CommKind::DpGrad,
            Collective::AllReduce,
            g,
            (bytes, 1.0),
            secs,
        ));
    }
    sync
}

/// One group's gradient reduction and parameter gathers, bucketed (ZeRO-0/1/2),
/// or per layer under ZeRO-3.
fn group_sync(c: &Ctx, sh: &Shard, win: &Window, sync: &mut StageSync) {
    let cfg = c.cfg;
    let (group, mb) = (sh.group, win.mb);
    let grad_bytes = sh.params * memory::grad_bytes(cfg);
    let param_bytes = sh.params * memory::WEIGHT_BYTES;
    if c.a.framework == Framework::Scaling {
        scaling_sync(c, sh, sync);
        return;
    }
    let deferred = c.a.framework.defers_sharded_grad_sync(cfg.pp);
    if let Some(pattern) = PerLayer::of(c.a.framework, cfg.zero, deferred) {
        per_layer_sync(c, sh, win, pattern, (grad_bytes, param_bytes), sync);
        return;
    }
    let (grad_coll, grad_calls, gather_calls) = match cfg.zero {
        Zero::None => (Collective::AllReduce, 1.0, 0.0),
        Zero::DistOpt => (Collective::ReduceScatter, 1.0, 1.0),
        // Megatron-FSDP's optim_grads: sharded gradients cannot accumulate
        // locally, so a reduce-scatter after every micro-batch's backward; the
        // parameters, kept whole, are gathered once after the optimizer step.
        // (torchtitan's ZeRO-2 is priced per layer, [`PerLayer`].)
        Zero::Zero2 => (Collective::ReduceScatter, mb, 1.0),
        // Per layer ([`PerLayer`]); not reached.
        Zero::Zero3 => (Collective::ReduceScatter, mb, 2.0 * mb),
    };
    let buckets = (sh.params / BUCKET_PARAMS).ceil().max(1.0);
    let grad_one = c.coll(grad_coll, grad_bytes / buckets, group) * buckets;
    let grad_total = grad_one * grad_calls;
    let last_bucket = grad_one / buckets;
    let grad_exposed = if matches!(cfg.zero, Zero::Zero2 | Zero::Zero3) && !deferred {
        // Per micro-batch reduction overlaps that micro-batch's backward.
        ((grad_one - win.t_b).max(last_bucket) * mb).min(grad_total)
    } else if cfg.overlap.grad_reduce {
        (grad_total - win.t_b).max(last_bucket).min(grad_total)
    } else {
        grad_total
    };
    let gather_one = if gather_calls > 0.0 {
        c.coll(Collective::AllGather, param_bytes / buckets, group) * buckets
    } else {
        0.0
    };
    let gather_total = gather_one * gather_calls;
    let gather_exposed = if gather_calls == 0.0 {
        0.0
    } else if cfg.zero == Zero::Zero3 {
        ((gather_one - win.t_f).max(gather_one / buckets) * gather_calls).min(gather_total)
    } else if cfg.overlap.param_gather {
        (gather_total - win.t_f)
            .max(gather_one / buckets)
            .min(gather_total)
    } else {
        gather_total
    };
    sync.exposed += grad_exposed + gather_exposed;
    sync.overlapped += grad_total - grad_exposed + gather_total - gather_exposed;
    sync.terms.push(CommTerm {
        kind: sh.grad_kind,
        collective: grad_coll,
        group,
        tier: group.tier(),
        bytes_per_call: grad_bytes / buckets,
        calls_per_step: grad_calls * buckets,
        total_secs: grad_total,
        exposed_secs: grad_exposed,
        overlapped_secs: grad_total - grad_exposed,
    });
    if gather_calls > 0.0 {
        sync.terms.push(CommTerm {
            kind: sh.param_kind,
            collective: Collective::AllGather,
            group,
            tier: group.tier(),
            bytes_per_call: param_bytes / buckets,
            calls_per_step: gather_calls * buckets,
            total_secs: gather_total,
            exposed_secs: gather_exposed,
            overlapped_secs: gather_total - gather_exposed,
        });
    }
}

/// `scaling`'s synchronisation ([`Framework::Scaling`]), none of it overlapped:
/// after the last backward every gradient is all-reduced in FP32, about
/// [`memory::SCALING_BUCKET_ELEMENTS`] at a time (`allreduce.py`; the buckets'
/// copies are the optimizer's passes, [`dp_sync`]), which the stage's drain
/// slack may hide. Under its ZeRO-1 (`zero: true`) the step's updated BF16
/// parameters are then all-gathered in pieces of the same size (`step_sequel`),
/// after the gradient norm has been summed over every stage (`.item()` on the
/// model- and pipe-parallel groups): no stage's slack hides that.
fn scaling_sync(c: &Ctx, sh: &Shard, sync: &mut StageSync) {
    let group = sh.group;
    let buckets = (sh.params / memory::SCALING_BUCKET_ELEMENTS)
        .ceil()
        .max(1.0);
    // `bytes` in `buckets` calls of one collective: its time and its term.
    let bucketed = |kind, op, bytes: f64| {
        let total = c.coll(op, bytes / buckets, group) * buckets;
        (
            total,
            unhidden(kind, op, group, (bytes / buckets, buckets), total),
        )
    };
    let (grad_total, grad_term) = bucketed(sh.grad_kind, Collective::AllReduce, sh.params * 4.0);
    sync.exposed += grad_total;
    sync.terms.push(grad_term);
    if c.cfg.zero != Zero::None {
        let (gather_total, gather_term) = bucketed(
            sh.param_kind,
            Collective::AllGather,
            sh.params * memory::WEIGHT_BYTES,
        );
        sync.after_step += gather_total;
        sync.after_terms.push(gather_term);
    }
}

/// A term none of whose `secs` is hidden: `calls` (bytes per call, calls per
/// step) of `collective` over `group`.
fn unhidden(
    kind: CommKind,
    collective: Collective,
    group: Placement,
    calls: (f64, f64),
    secs: f64,
) -> CommTerm {
    CommTerm {
        kind,
        collective,
        group,
        tier: group.tier(),
        bytes_per_call: calls.0,
        calls_per_step: calls.1,
        total_secs: secs,
        exposed_secs: secs,
        overlapped_secs: 0.0,
    }
}

/// How a framework that shards parameters by layer (FSDP's units) gathers and
/// reduces them over a step's micro-batches.
#[derive(Debug, Clone, Copy, PartialEq)]
enum PerLayer {
    /// Gathered before every forward and again before every backward, reduced
    /// after every backward: ZeRO-3 (Megatron-FSDP `optim_grads_params`, FSDP2
    /// resharding after the forward).
    EveryPass,
    /// Gathered before every forward and kept through its backward (resharded
    /// after it), reduced after every backward: torchtitan's ZeRO-2 without a
    /// pipeline (FSDP2 `reshard_after_forward=False`; the backward reshards).
    EveryForward,
    /// torchtitan's ZeRO-3 in a pipeline stage (`reshard_after_forward=True`):
    /// torch.distributed.pipelining turns resharding after the backward and the
    /// gradient sync off (`PipelineStage.backward_maybe_with_nosync`), reducing
    /// once after the last backward. Each backward gathers the parameters its
    /// forward freed; a forward that follows a backward finds them whole, but the
    /// warm-up forwards before the stage's first backward (up to pp of them on the
    /// first stage under 1F1B) each gather.
    PipelinedResharding,
    /// torchtitan's ZeRO-2 in a pipeline stage (`reshard_after_forward=False`,
    /// torchtitan's own default under a pipeline): gathered in the first
    /// forward and kept, reduced once after the last backward.
    PipelinedKept,
}

impl PerLayer {
    /// The pattern of `zero` under `framework`, `deferred` when the framework
    /// holds the gradients until the last micro-batch; `None` where parameters
    /// are not sharded by layer (ZeRO-0/1, Megatron-FSDP's `optim_grads`, which
    /// keeps them whole and gathers once per step after the optimizer).
    fn of(framework: Framework, zero: Zero, deferred: bool) -> Option<PerLayer> {
        let titan = framework == Framework::Torchtitan;
        match zero {
            Zero::Zero3 if deferred => Some(PerLayer::PipelinedResharding),
            Zero::Zero3 => Some(PerLayer::EveryPass),
            Zero::Zero2 if titan && deferred => Some(PerLayer::PipelinedKept),
            Zero::Zero2 if titan => Some(PerLayer::EveryForward),
            _ => None,
        }
    }

    /// (forward passes that gather, backward passes that gather, backward
    /// passes that reduce) over `mb` micro-batches on `pp` stages, for the
    /// first stage (the most warm-up forwards); a backward that gathers and
    /// reduces is counted in both.
    fn counts(self, mb: f64, pp: f64) -> (f64, f64, f64) {
        match self {
            PerLayer::EveryPass => (mb, mb, mb),
            PerLayer::EveryForward => (mb, 0.0, mb),
            PerLayer::PipelinedResharding => (mb.min(pp), mb, 1.0),
            PerLayer::PipelinedKept => (1.0, 0.0, 1.0),
        }
    }
}

/// Parameters sharded by layer ([`PerLayer`]): each layer's parameters are
/// all-gathered before a pass that needs them whole and its gradient
/// reduce-scattered after a backward that syncs. With one layer prefetched
/// (FSDP2's default), a gather hides behind the previous layer's pass only; in
/// the backward the gather and the reduce-scatter share the rank's links. The
/// first gather of each pass and the last reduce-scatter wait in the open.
/// Latency counts once per layer, so it grows with DP (see collective_secs).
/// `bytes`: the gradient's and the parameters' bytes on this rank.
fn per_layer_sync(
    c: &Ctx,
    sh: &Shard,
    win: &Window,
    pattern: PerLayer,
    bytes: (f64, f64),
    sync: &mut StageSync,
) {
    let (group, mb, units) = (sh.group, win.mb, win.units);
    let (grad_bytes, param_bytes) = bytes;
    let ag = c.coll(Collective::AllGather, param_bytes / units, group);
    let rs = c.coll(Collective::ReduceScatter, grad_bytes / units, group);
    let (f_u, b_u) = (win.t_f / units, win.t_b / units);
    // One pass's time waiting on its transfers, by what it moves.
    let fwd = ag + (units - 1.0) * (ag - f_u).max(0.0);
    let bwd_both = ag + (units - 1.0) * (ag + rs - b_u).max(0.0) + rs;
    let bwd_gather = ag + (units - 1.0) * (ag - b_u).max(0.0);
    let bwd_reduce = units * (rs - b_u).max(0.0) + rs;
    let (fwd_gathers, bwd_gathers, reductions) = pattern.counts(mb, c.cfg.pp as f64);
    // Backward passes that do both are the ones that gather and reduce: every
    // one (EveryPass) or the last (PipelinedResharding).
    let both = bwd_gathers.min(reductions);
    let busy = fwd_gathers * fwd
        + both * bwd_both
        + (bwd_gathers - both) * bwd_gather
        + (reductions - both) * bwd_reduce;
    let gathers = fwd_gathers + bwd_gathers;
    let gather_total = gathers * units * ag;
    let grad_total = reductions * units * rs;
    // Split the exposed time between the two terms by their share of the traffic.
    let share = gather_total / (gather_total + grad_total).max(f64::MIN_POSITIVE);
    let gather_exposed = (busy * share).min(gather_total);
    let grad_exposed = (busy * (1.0 - share)).min(grad_total);
    sync.exposed += grad_exposed + gather_exposed;
    sync.overlapped += grad_total - grad_exposed + gather_total - gather_exposed;
    sync.terms.push(CommTerm {
        kind: sh.grad_kind,
        collective: Collective::ReduceScatter,
        group,
        tier: group.tier(),
        bytes_per_call: grad_bytes / units,
        calls_per_step: reductions * units,
        total_secs: grad_total,
        exposed_secs: grad_exposed,
        overlapped_secs: grad_total - grad_exposed,
    });
    sync.terms.push(CommTerm {
        kind: sh.param_kind,
        collective: Collective::AllGather,
        group,
        tier: group.tier(),
        bytes_per_call: param_bytes / units,
        calls_per_step: gathers * units,
        total_secs: gather_total,
        exposed_secs: gather_exposed,
        overlapped_secs: gather_total - gather_exposed,
    });
}
