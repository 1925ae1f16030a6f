//! The RL placement search: colocated and disaggregated placements, the pool split,
//! the training layout (from [`crate::search::search`]), the rollout engines' tensor
//! parallel size and, colocated, whether the parameters leave HBM during generation.
//! Every phase's memory is checked; a configuration that fails is a [`Reject`],
//! counted by kind.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::constants::MAX_MEMORY_FRACTION;
use super::phases::{assumptions, train_side, train_workload, TrainSide};
use super::reshard;
use super::rollout::{rollout_cost, RolloutCost, RolloutLayout};
use super::{Reject, RlError, RlFramework, RlWorkload};
use crate::config::{divisors, ParallelConfig, Recompute, Workload, Zero};
use crate::hardware::{Cluster, HardwareProfile, GIB};
use crate::schedule::Schedule;
use crate::search::{search, SearchSpace};

/// Where the phases run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlacementKind {
    /// Every GPU trains and generates, in turn.
    Colocated,
    /// A rollout pool and a training pool.
    Disaggregated,
}

impl PlacementKind {
    pub fn name(self) -> &'static str {
        match self {
            PlacementKind::Colocated => "colocated",
            PlacementKind::Disaggregated => "disaggregated",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub kind: PlacementKind,
    pub train_gpus: u64,
    pub rollout_gpus: u64,
}

impl Placement {
    /// GPUs of the whole job.
    pub fn gpus(&self) -> u64 {
        match self.kind {
            PlacementKind::Colocated => self.train_gpus,
            PlacementKind::Disaggregated => self.train_gpus + self.rollout_gpus,
        }
    }
}

/// Seconds per phase of one iteration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PhaseTimes {
    pub rollout: f64,
    pub reshard: f64,
    /// Training state to host memory and back (colocated only).
    pub offload: f64,
    /// Old log-probabilities, reference, values, reward: forward passes.
    pub forward: f64,
    /// Actor and critic updates.
    pub training: f64,
    /// The iteration: the sum, or with separate pools the overlapped time.
    pub iteration: f64,
}

/// Peak bytes per GPU in one phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PhaseMemory {
    pub phase: &'static str,
    pub bytes: f64,
}

/// One priced RL configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RlPlan {
    pub placement: Placement,
    pub train: TrainSide,
    pub rollout: RolloutCost,
    /// Colocated: the actor's parameters leave HBM while the engines generate.
    pub offload_params: bool,
    /// The engine's share of HBM (vLLM / SGLang memory fraction).
    pub memory_fraction: f64,
    pub times: PhaseTimes,
    pub memory: Vec<PhaseMemory>,
    pub capacity_bytes: f64,
    /// Tokens (prompt and response) trained per second per GPU of the whole job.
    pub tokens_per_sec_per_gpu: f64,
}

/// What to search.
#[derive(Debug, Clone, PartialEq)]
pub struct RlSearch {
    pub placements: Vec<PlacementKind>,
    /// Rollout TP sizes; `None`: the divisors of a node.
    pub rollout_tp: Option<Vec<u64>>,
    /// Training-pool sizes of the disaggregated placement; `None`: every whole-node split.
    pub train_gpus: Option<Vec<u64>>,
    /// The training search's space (TP, PP, ... restrictions).
    pub space: SearchSpace,
    /// Training layouts kept from each training search.
    pub layouts: usize,
    pub top: usize,
    /// The framework the plans are for (its mechanics priced, its limits kept).
    pub framework: Option<RlFramework>,
}

impl Default for RlSearch {
    fn default() -> Self {
        RlSearch {
            placements: vec![PlacementKind::Colocated, PlacementKind::Disaggregated],
            rollout_tp: None,
            train_gpus: None,
            space: default_space(),
            layouts: 3,
            top: 10,
            framework: None,
        }
    }
}

/// The training space verl's and RLinf's Megatron backends run: 1F1B or interleaved,
/// the distributed optimizer, the unfused loss.
pub fn default_space() -> SearchSpace {
    SearchSpace {
        schedule: Some(vec![Schedule::OneFOneB, Schedule::Interleaved]),
        zero: vec![Zero::DistOpt],
        mbs: vec![1, 2, 4],
        recompute: vec![Recompute::None, Recompute::Selective, Recompute::Full],
        assumptions: assumptions(),
        ..SearchSpace::default()
    }
}

/// The searched plans.
#[derive(Debug, Clone, PartialEq)]
pub struct RlResult {
    /// Fastest first.
    pub plans: Vec<RlPlan>,
    pub best_colocated: Option<RlPlan>,
    pub best_disaggregated: Option<RlPlan>,
    pub evaluated: u64,
    /// The placements searched (the request's, less what the framework cannot run).
    pub placements: Vec<PlacementKind>,
    pub rejected: BTreeMap<&'static str, u64>,
    /// An example reason per rejection kind.
    pub reasons: BTreeMap<&'static str, String>,
}

/// Prices one RL configuration. `memory_fraction` is the engine's share of HBM when
/// the run states it (vLLM's `gpu_memory_utilization`, SGLang's `mem_fraction_static`);
/// `None` derives it: what the resident training state leaves, at most
/// [`MAX_MEMORY_FRACTION`].
///
/// Where the frameworks differ (`framework`):
/// - verl keeps the reference policy as a second Megatron model in the actor's
///   process whose parameters are offloaded only with the actor's
///   (`ref.megatron.param_offload` follows `actor.megatron.param_offload`,
///   verl/trainer/config/ref/megatron_ref.yaml:27 at [`VERL`]): resident in every
///   phase unless the parameters are offloaded, and then moved in and out once an
///   iteration. It frees the actor's gradient buffer only on the parameter-offload
///   path (`offload_megatron_model_to_cpu`, verl/utils/megatron_utils.py:432-435,
///   called only under `_is_offload_param`, verl/workers/megatron_workers.py:595),
///   so without it the FP32 gradients stay beside the engine. Its separate-pool
///   trainer takes the old log-probabilities from the engine
///   (`rollout_correction.bypass_mode`,
///   verl/experimental/one_step_off_policy/ray_trainer.py:545-552): no actor pass.
/// - RLinf keeps the reference weights in host memory and swaps them into the
///   actor's model for the reference pass (`cpu_weight_swap`,
///   rlinf/workers/megatron_worker.py:1243 at [`RLINF`]): the actor's weights out
///   to host, the reference's in, the actor's back, once an iteration colocated.
/// - Otherwise (no framework) the reference is priced as a forward pass only.
///
/// [`VERL`]: crate::rl::constants::VERL_COMMIT
/// [`RLINF`]: crate::rl::constants::RLINF_COMMIT
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    w: &RlWorkload,
    hw: &HardwareProfile,
    placement: Placement,
    side: &TrainSide,
    rollout_tp: u64,
    offload_params: bool,
    memory_fraction: Option<f64>,
    framework: Option<RlFramework>,
) -> Result<RlPlan, Reject> {
    let capacity = hw.capacity_bytes();
    let m = &side.estimate.memory;
    let colocated = placement.kind == PlacementKind::Colocated;
    let verl = framework == Some(RlFramework::Verl);
    // verl's reference weights, when they stay in HBM (every phase).
    let reference_resident = if verl && w.reference && !(colocated && offload_params) {
        m.weights
    } else {
        0.0
    };
    // Colocated, the engine gets what the resident training state leaves.
    let resident = if colocated && !offload_params {
        m.weights + reference_resident + if verl { m.gradients } else { 0.0 }
    } else {
        0.0
    };
    // A derived fraction in the hundredths the exports write (floored, so that the
    // engine never takes more than was checked).
    let fraction = memory_fraction.unwrap_or_else(|| {
        (((capacity - resident) / hw.hbm_bytes()).min(MAX_MEMORY_FRACTION) * 100.0).floor() / 100.0
    });
    let layout = RolloutLayout {
        tp: rollout_tp,
        engines: placement.rollout_gpus / rollout_tp,
        budget_bytes: fraction * hw.hbm_bytes(),
    };
    let rollout = rollout_cost(&w.actor, hw, &w.lengths, w.prompts, w.sequences(), layout)?;
    let cfg = &side.config;
    let (reshard, offload) = if colocated {
        // The gradient buffer is freed, not copied; the engine's weights go out
        // when it sleeps and come back when it wakes (reshard.rs). The critic's
        // and the reward model's state leave HBM while the engines generate.
        // verl's hybrid engine sleeps vLLM at level 2, which discards the engine's
        // weights instead of copying them out (the refit brings them back:
        // verl/workers/rollout/vllm_rollout/vllm_async_server.py:566-569).
        let engine_weights = if verl {
            0.0
        } else {
            rollout.weight_bytes_per_gpu
        };
        let mut moved =
            m.optimizer + engine_weights + side.critic_state_bytes + side.reward_weight_bytes;
        if offload_params {
            moved += m.weights;
            if verl && w.reference {
                moved += m.weights;
            }
        }
        if framework == Some(RlFramework::Rlinf) && w.reference {
            // Three copies (the actor's weights out, the reference's in, the
            // actor's back); `offload_secs` counts each byte out and back, two.
            moved += 1.5 * m.weights;
        }
        (
            reshard::colocated_secs(&w.actor, hw, cfg, rollout_tp),
            reshard::offload_secs(hw, moved),
        )
    } else {
        let secs = reshard::disaggregated_secs(
            &w.actor,
            hw,
            cfg,
            placement.train_gpus,
            placement.rollout_gpus,
            rollout_tp,
        );
        // The critic's and the reward model's state leave HBM between their own
        // passes here too (the exports offload them), so that the actor's passes
        // have the pool's memory.
        let others = side.critic_state_bytes + side.reward_weight_bytes;
        let offload = if others > 0.0 {
            reshard::offload_secs(hw, others)
        } else {
            0.0
        };
        (secs, offload)
    };
    let forward = if verl && !colocated {
        side.forward_secs() - side.old_logprob_secs
    } else {
        side.forward_secs()
    };
    let training = side.train_secs();
    let iteration = if colocated {
        rollout.secs + reshard + offload + forward + training
    } else {
        // Responses stream to the training pool mini-batch by mini-batch.
        let gen = rollout.secs;
        let rest = forward + training;
        gen.max(rest) + gen.min(rest) / w.mini_batches as f64 + reshard
    };
    let memory = vec![
        PhaseMemory {
            phase: "rollout",
            bytes: resident + layout.budget_bytes,
        },
        PhaseMemory {
            phase: "forward",
            // verl's reference weights are in the pass's own peak (phases::train_side).
            bytes: side.forward_bytes,
        },
        PhaseMemory {
            phase: "training",
            bytes: side.train_bytes + reference_resident,
        },
    ];
    let mut memory = memory;
    if w.critic.is_some() {
        // The critic trains beside what the actor keeps in HBM between its own
        // passes: colocated, its weights unless offloaded (verl: and the gradients
        // it frees only with them); in a training pool of its own, all its state.
        let actor = if colocated && offload_params {
            0.0
        } else if colocated {
            m.weights + if verl { m.gradients } else { 0.0 }
        } else {
            m.weights + m.gradients + m.optimizer
        };
        memory.push(PhaseMemory {
            phase: "critic training",
            bytes: side.critic_train_bytes + actor + reference_resident,
        });
    }
    if w.reward.is_some() {
        // The learned reward model's weights come back for its pass, beside the
        // actor's state (as the log-probability passes see it).
        memory.push(PhaseMemory {
            phase: "reward forward",
            bytes: side.reward_forward_bytes,
        });
    }
    for p in &memory {
        if p.bytes > capacity * (1.0 + 1e-9) {
            return Err(Reject::Memory {
                phase: p.phase,
                needed_gib: p.bytes / GIB,
                capacity_gib: capacity / GIB,
            });
        }
    }
    let tokens = (w.sequences() * w.lengths.sequence_mean()) as f64;
    let rollout_secs = rollout.secs;
    Ok(RlPlan {
        placement,
        train: side.clone(),
        rollout,
        offload_params,
        memory_fraction: fraction,
        times: PhaseTimes {
            rollout: rollout_secs,
            reshard,
            offload,
            forward,
            training,
            iteration,
        },
        memory,
        capacity_bytes: capacity,
        tokens_per_sec_per_gpu: tokens / iteration / placement.gpus() as f64,
    })
}

/// Most disaggregated splits searched: each one runs a training-layout search.
const MAX_SPLITS: u64 = 64;

/// Whole-node training-pool sizes of a disaggregated split: every one up to
/// [`MAX_SPLITS`] nodes, beyond that [`MAX_SPLITS`] - 1 evenly spaced in nodes
/// (a split to within 1/64 of the cluster), so that the search's work does not
/// grow with the cluster.
fn splits(gpus: u64, per_node: u64) -> Vec<u64> {
    let nodes = gpus / per_node.max(1);
    if nodes <= MAX_SPLITS {
        return (1..nodes).map(|n| n * per_node).collect();
    }
    let mut out: Vec<u64> = (1..MAX_SPLITS)
        .map(|i| (nodes as u128 * i as u128 / MAX_SPLITS as u128) as u64 * per_node)
        .filter(|&t| t > 0)
        .collect();
    out.dedup();
    out
}

/// The best few training layouts of `w` on `gpus` GPUs.
fn layouts(
    w: &RlWorkload,
    hw: &HardwareProfile,
    gpus: u64,
    s: &RlSearch,
    space: &SearchSpace,
    tally: &mut Tally,
) -> Vec<TrainSide> {
    let cluster = match Cluster::new(hw.clone(), gpus) {
        Ok(c) => c,
        Err(e) => {
            tally.note("training pool", format!("{gpus} GPUs: {e}"));
            return vec![];
        }
    };
    let tw = train_workload(w);
    // The fastest layouts at the mean sequence, then, if too few hold a
    // micro-batch at its framework's token budget, the fastest one-sequence micro-batches
    // that hold the longest sequence (for those the budget is that sequence, so
    // the search's own memory check is the budget's).
    let found = search(&w.actor, &cluster, &tw, space, 4 * s.layouts);
    let mut valid = found.valid;
    let mut out: Vec<TrainSide> = Vec::new();
    let keep = |configs: Vec<ParallelConfig>, out: &mut Vec<TrainSide>, tally: &mut Tally| {
        for c in configs {
            if out.len() >= s.layouts {
                break;
            }
            if out.iter().any(|o| o.config == c) {
                continue;
            }
            match train_side(w, &cluster, &c, s.framework) {
                Ok(side) => out.push(side),
                Err(r) => tally.reject(&r),
            }
        }
    };
    keep(
        found.top.into_iter().map(|c| c.config).collect(),
        &mut out,
        tally,
    );
    if out.len() < s.layouts && s.framework.is_some() {
        let longest = (w.lengths.prompt_max + w.lengths.response_max).div_ceil(64) * 64;
        let tail = Workload {
            seq: longest,
            ..tw.clone()
        };
        let one = SearchSpace {
            mbs: vec![1],
            ..space.clone()
        };
        let found = search(&w.actor, &cluster, &tail, &one, s.layouts);
        valid += found.valid;
        keep(
            found.top.into_iter().map(|c| c.config).collect(),
            &mut out,
            tally,
        );
    }
    if out.is_empty() && valid == 0 {
        tally.note(
            "training layout",
            format!("no training layout of {} fits on {gpus} GPUs", w.actor.name),
        );
    }
    out
}

/// The training space for rollout engines of TP `rollout_tp`: RLinf reshards the
/// actor's TP shards into the engine's and needs the engine's TP to divide the
/// actor's (`ReshardConfig.__post_init__`,
/// rlinf/utils/resharding/reshard_config.py:77-82), so its training TPs are the
/// multiples of the engine's; other frameworks gather whole weights and take any.
fn space_for(s: &RlSearch, rollout_tp: u64, per_node: u64) -> SearchSpace {
    let mut space = s.space.clone();
    if s.framework == Some(RlFramework::Rlinf) {
        let tps: Vec<u64> = match &space.tp {
            Some(v) => v.clone(),
            None => divisors(per_node),
        };
        space.tp = Some(
            tps.into_iter()
                .filter(|t| t.is_multiple_of(rollout_tp))
                .collect(),
        );
    }
    space
}

#[derive(Default)]
struct Tally {
    evaluated: u64,
    rejected: BTreeMap<&'static str, u64>,
    reasons: BTreeMap<&'static str, String>,
    /// The widest rollout engine refused for its KV cache.
    widest_kv: u64,
}

impl Tally {
    fn reject(&mut self, r: &Reject) {
        *self.rejected.entry(r.kind()).or_default() += 1;
        // Of the engines whose KV cache did not fit, the widest is the one closest
        // to fitting: its numbers say how far off the search was.
        if let Reject::KvCache { tp, .. } = r {
            if *tp > self.widest_kv {
                self.widest_kv = *tp;
                self.reasons.insert(r.kind(), r.to_string());
            }
        }
        self.reasons
            .entry(r.kind())
            .or_insert_with(|| r.to_string());
    }

    fn note(&mut self, kind: &'static str, reason: String) {
        *self.rejected.entry(kind).or_default() += 1;
        self.reasons.entry(kind).or_insert(reason);
    }
}

/// The profile as a job of `gpus` GPUs sees it: on a multi-node NVLink domain,
/// segments of whole nodes ([`Cluster::job_domain`]), for the rollout engines and
/// the refit as for the training pools.
fn job_profile(hw: &HardwareProfile, gpus: u64) -> HardwareProfile {
    let mut p = hw.clone();
    p.node.nvlink_domain = Cluster::job_domain(hw, gpus);
    p
}

/// Searches both placements and ranks the plans by iteration time.
pub fn plan(
    w: &RlWorkload,
    hw: &HardwareProfile,
    gpus: u64,
    s: &RlSearch,
) -> Result<RlResult, RlError> {
    w.check()?;
    let hw = &job_profile(hw, gpus);
    let per_node = hw.node.gpus_per_node;
    // Each size once, whatever the lists repeat: a repeated value would be searched
    // once per copy (a million copies, a million searches). The training search
    // makes its own space distinct (`SearchSpace::normalized`).
    let distinct = |v: &[u64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.dedup();
        v
    };
    // One engine spans part of a node (an NVLink domain) or whole ones (the
    // searched default: the sizes that divide the node), and vLLM and SGLang
    // split the attention heads evenly over its GPUs, the KV heads too or each
    // one replicated over whole groups of ranks (vLLM
    // `ModelConfig.verify_with_parallel_config`: heads divisible by TP;
    // `QKVParallelLinear`: KV heads divisible by TP or TP by them).
    let domain = per_node.min(hw.node.nvlink_domain);
    let runs = |tp: u64| -> Result<(), String> {
        let (heads, kv) = (w.actor.heads, w.actor.kv_heads.max(1));
        if !(domain.is_multiple_of(tp) || tp.is_multiple_of(domain)) {
            Err(format!("an engine spans part of one {domain}-GPU node or whole nodes, so TP divides {domain} or is a multiple of it"))
        } else if !heads.is_multiple_of(tp) {
            Err(format!(
                "{heads} attention heads do not split evenly over {tp} GPUs"
            ))
        } else if !(kv.is_multiple_of(tp) || tp.is_multiple_of(kv)) {
            Err(format!(
                "{kv} KV heads neither split over {tp} GPUs nor replicate evenly on them"
            ))
        } else {
            Ok(())
        }
    };
    let valid = divisors(domain)
        .into_iter()
        .filter(|&t| runs(t).is_ok())
        .collect::<Vec<_>>();
    let tps: Vec<u64> = match s.rollout_tp.as_deref().map(distinct) {
        Some(v) => {
            if let Some((tp, reason)) = v.iter().find_map(|&t| runs(t).err().map(|r| (t, r))) {
                return Err(RlError::RolloutTp {
                    tp,
                    reason,
                    valid: valid
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            v
        }
        None => valid,
    };
    let mut s = RlSearch {
        train_gpus: s.train_gpus.as_deref().map(distinct),
        ..s.clone()
    };
    if let Some(f) = s.framework {
        f.check(w)?;
        s.space = f.restrict(s.space);
    }
    // RLinf's disaggregated mode computes log-probabilities on a third, separate
    // inference pool (rlinf/utils/placement.py:254-271, examples/reasoning/main_grpo.py)
    // that the two-pool placement does not price: colocated only.
    if s.framework == Some(RlFramework::Rlinf) {
        if !s.placements.contains(&PlacementKind::Colocated) {
            return Err(RlError::Framework {
                framework: RlFramework::Rlinf.label(),
                reason: "its disaggregated mode runs the log-probability passes on a third GPU pool (inference) that Sextant does not price; plan with --placement colocated".into(),
            });
        }
        s.placements = vec![PlacementKind::Colocated];
    }
    let s = &s;
    let mut tally = Tally::default();
    let mut plans = Vec::new();
    let mut try_one = |tally: &mut Tally, p: Placement, side: &TrainSide, tp: u64, off: bool| {
        tally.evaluated += 1;
        match evaluate(w, hw, p, side, tp, off, None, s.framework) {
            Ok(plan) => plans.push(plan),
            Err(r) => tally.reject(&r),
        }
    };
    if s.placements.contains(&PlacementKind::Colocated) {
        let p = Placement {
            kind: PlacementKind::Colocated,
            train_gpus: gpus,
            rollout_gpus: gpus,
        };
        let engine_tps: Vec<u64> = tps
            .iter()
            .copied()
            .filter(|&tp| gpus.is_multiple_of(tp))
            .collect();
        // RLinf: one training search per engine TP, over the training TPs it can
        // reshard from ([`space_for`]); otherwise one search for every engine.
        let groups: Vec<(SearchSpace, Vec<u64>)> = if s.framework == Some(RlFramework::Rlinf) {
            engine_tps
                .iter()
                .map(|&tp| (space_for(s, tp, per_node), vec![tp]))
                .collect()
        } else {
            vec![(s.space.clone(), engine_tps)]
        };
        for (space, engine_tps) in groups {
            for side in layouts(w, hw, gpus, s, &space, &mut tally) {
                for &tp in &engine_tps {
                    for off in [false, true] {
                        try_one(&mut tally, p, &side, tp, off);
                    }
                }
            }
        }
    }
    if s.placements.contains(&PlacementKind::Disaggregated) {
        let sizes = s
            .train_gpus
            .clone()
            .unwrap_or_else(|| splits(gpus, per_node));
        if sizes.is_empty() && s.placements == [PlacementKind::Disaggregated] {
            return Err(RlError::NoSplit { gpus, per_node });
        }
        for t in sizes.into_iter().filter(|&t| t > 0 && t < gpus) {
            let p = Placement {
                kind: PlacementKind::Disaggregated,
                train_gpus: t,
                rollout_gpus: gpus - t,
            };
            for side in layouts(w, hw, t, s, &s.space, &mut tally) {
                for &tp in tps.iter().filter(|&&tp| (gpus - t).is_multiple_of(tp)) {
                    try_one(&mut tally, p, &side, tp, false);
                }
            }
        }
    }
    plans.sort_by(|a, b| a.times.iteration.total_cmp(&b.times.iteration));
    let best = |k: PlacementKind| plans.iter().find(|p| p.placement.kind == k).cloned();
    let best_colocated = best(PlacementKind::Colocated);
    let best_disaggregated = best(PlacementKind::Disaggregated);
    if plans.is_empty() {
        let mut reason = tally
            .reasons
            .values()
            .next()
            .cloned()
            .unwrap_or_else(|| "nothing was searched".into());
        // The engines' memory is the reason given: wider engines spread the
        // weights further.
        if tally.reasons.keys().next() == Some(&"rollout KV cache") {
            reason.push_str(&format!(
                "; a wider engine holds more: give --rollout-tp sizes above {} (divisors of the node's {per_node} GPUs, or whole nodes)",
                tally.widest_kv
            ));
        }
        return Err(RlError::NothingFits { reason });
    }
    plans.truncate(s.top.max(1));
    Ok(RlResult {
        plans,
        best_colocated,
        best_disaggregated,
        evaluated: tally.evaluated,
        placements: s.placements.clone(),
        rejected: tally.rejected,
        reasons: tally.reasons,
    })
}

/// Prices a stated configuration (a published run's): the training layout as
/// given, colocated unless `rollout_gpus < gpus`, the engine's memory fraction
/// when the run states it, and the framework's mechanics when it ran on verl or
/// RLinf (`None`: as priced for no framework in particular).
#[allow(clippy::too_many_arguments)]
pub fn evaluate_stated(
    w: &RlWorkload,
    hw: &HardwareProfile,
    gpus: u64,
    train: &ParallelConfig,
    rollout_tp: u64,
    rollout_gpus: u64,
    memory_fraction: Option<f64>,
    framework: Option<RlFramework>,
) -> Result<RlPlan, RlError> {
    w.check()?;
    if let Some(f) = framework {
        f.check(w)?;
    }
    let hw = &job_profile(hw, gpus);
    let colocated = rollout_gpus >= gpus;
    let train_gpus = if colocated { gpus } else { gpus - rollout_gpus };
    let cluster = Cluster::new(hw.clone(), train_gpus).map_err(|e| RlError::NothingFits {
        reason: e.to_string(),
    })?;
    let nothing = |r: Reject| RlError::NothingFits {
        reason: r.to_string(),
    };
    let side = train_side(w, &cluster, train, framework).map_err(nothing)?;
    let placement = Placement {
        kind: if colocated {
            PlacementKind::Colocated
        } else {
            PlacementKind::Disaggregated
        },
        train_gpus,
        rollout_gpus: rollout_gpus.min(gpus),
    };
    let price = |off: bool| {
        evaluate(
            w,
            hw,
            placement,
            &side,
            rollout_tp,
            off,
            memory_fraction,
            framework,
        )
    };
    price(false).or_else(|_| price(true)).map_err(nothing)
}

#[cfg(test)]
mod tests {

    #[test]
    fn rl_splits_stay_few_on_large_clusters() {
        assert_eq!(splits(32, 8), vec![8, 16, 24]);
        assert_eq!(splits(8 * 64, 8).len(), 63);
        for gpus in [8 * 65, 8 * 4096, 1 << 24] {
            let s = splits(gpus, 8);
            assert_eq!(s.len(), 63, "{gpus}");
            assert!(s.windows(2).all(|w| w[0] < w[1]));
            assert!(s.iter().all(|&t| t % 8 == 0 && t > 0 && t < gpus));
        }
    }
    use super::*;
    use crate::config::Precision;
    use crate::hardware::builtin_profile;
    use crate::presets::resolve;
    use crate::rl::{phases, Algorithm, Lengths};

    fn workload() -> RlWorkload {
        RlWorkload {
            actor: resolve("8b").unwrap().spec,
            critic: None,
            reward: None,
            reference: true,
            algorithm: Algorithm::Grpo,
            prompts: 128,
            responses_per_prompt: 8,
            lengths: Lengths {
                prompt_mean: 512,
                prompt_max: 1024,
                response_mean: 1024,
                response_max: 4096,
            },
            mini_batches: 4,
            epochs: 1,
            precision: Precision::Bf16,
        }
    }

    fn small_search() -> RlSearch {
        let mut s = RlSearch::default();
        s.space.tp = Some(vec![1, 2]);
        s.space.pp = Some(vec![1]);
        s.space.mbs = vec![1];
        s.space.recompute = vec![Recompute::Full];
        s.layouts = 1;
        s
    }

    fn qwen(w: &mut RlWorkload) {
        // RLinf names the architecture by its Hugging Face model_type.
        w.actor.hf_model_type = Some("qwen3".into());
    }

    /// RLinf plans are colocated, without virtual stages, with even stages and an
    /// engine TP dividing the actor's; the reference's weight swap is priced.
    #[test]
    fn rl_rlinf_plans_only_what_it_runs() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let mut w = workload();
        qwen(&mut w);
        let mut s = RlSearch {
            framework: Some(RlFramework::Rlinf),
            ..RlSearch::default()
        };
        s.layouts = 2;
        let r = plan(&w, &hw, 32, &s).unwrap();
        assert_eq!(r.placements, vec![PlacementKind::Colocated]);
        assert!(r.best_disaggregated.is_none());
        assert!(!r.plans.is_empty());
        for p in &r.plans {
            let c = &p.train.config;
            assert_eq!(c.vpp, 1);
            assert_eq!(c.layout, crate::config::Layout::Even);
            assert_eq!(w.actor.layers % c.pp, 0);
            assert_eq!(c.tp % p.rollout.layout.tp, 0, "{c:?}");
        }
        // The same plan priced for no framework moves less through host memory:
        // RLinf swaps the actor's weights out and the reference's in and back.
        let p = &r.plans[0];
        let bare = evaluate(
            &w,
            &hw,
            p.placement,
            &p.train,
            p.rollout.layout.tp,
            p.offload_params,
            Some(p.memory_fraction),
            None,
        )
        .unwrap();
        // Three copies of the weights over the host link.
        let swap = 3.0 * p.train.estimate.memory.weights
            / (crate::rl::constants::host_link_gbytes_per_s(&hw) * 1e9);
        assert!(
            (p.times.offload - bare.times.offload - swap).abs() < 1e-9 * p.times.offload.max(1.0)
        );
        // Only colocated, only what it converts: one clear refusal each.
        s.placements = vec![PlacementKind::Disaggregated];
        assert!(matches!(
            plan(&w, &hw, 32, &s),
            Err(RlError::Framework { .. })
        ));
        s.placements = vec![PlacementKind::Colocated];
        let mut llama = workload();
        llama.actor.hf_model_type = Some("llama".into());
        let e = plan(&llama, &hw, 32, &s).unwrap_err().to_string();
        assert!(e.contains("a llama model"), "{e}");
        let mut two = w.clone();
        two.epochs = 2;
        assert!(plan(&two, &hw, 32, &s).is_err());
        let mut rm = w.clone();
        rm.reward = Some(w.actor.clone());
        assert!(plan(&rm, &hw, 32, &s)
            .unwrap_err()
            .to_string()
            .contains("reward"));
    }

    /// verl keeps the reference's weights and, without the parameter offload, the
    /// FP32 gradients beside the engine; its separate pools run no old
    /// log-probability pass.
    #[test]
    fn rl_verl_prices_what_stays_in_hbm() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let w = workload();
        let s = RlSearch {
            framework: Some(RlFramework::Verl),
            ..small_search()
        };
        let r = plan(&w, &hw, 32, &s).unwrap();
        let c = r.best_colocated.unwrap();
        let m = &c.train.estimate.memory;
        let price = |off: bool, f: Option<RlFramework>, p: &RlPlan| {
            evaluate(
                &w,
                &hw,
                p.placement,
                &p.train,
                p.rollout.layout.tp,
                off,
                None,
                f,
            )
            .unwrap()
        };
        let (bare, verl) = (
            price(false, None, &c),
            price(false, Some(RlFramework::Verl), &c),
        );
        let rollout = |p: &RlPlan| p.memory[0].bytes;
        let training = |p: &RlPlan| p.memory[2].bytes;
        // The engine gets what stays less: the reference's weights and the gradients.
        let resident = (bare.memory_fraction - verl.memory_fraction) * hw.hbm_bytes();
        // (to the hundredth the fraction is written in)
        assert!(
            verl.memory_fraction < 0.9
                && (resident - m.weights - m.gradients).abs() <= 0.01 * hw.hbm_bytes()
        );
        assert!((training(&verl) - training(&bare) - m.weights).abs() < 1.0);
        // With the parameters offloaded the reference goes too: nothing stays, and
        // its weights move in and out.
        let (bare, verl) = (
            price(true, None, &c),
            price(true, Some(RlFramework::Verl), &c),
        );
        assert_eq!(rollout(&verl), rollout(&bare));
        // The reference's weights move; the engine's are discarded (sleep level 2).
        let moved = m.weights - c.rollout.weight_bytes_per_gpu;
        let diff = verl.times.offload - bare.times.offload;
        assert!(
            (diff - reshard::offload_secs(&hw, moved)).abs() < 1e-9,
            "{diff}"
        );
        let d = r.best_disaggregated.unwrap();
        let (bare, verl) = (
            price(false, None, &d),
            price(false, Some(RlFramework::Verl), &d),
        );
        assert!((bare.times.forward - verl.times.forward - d.train.old_logprob_secs).abs() < 1e-9);
    }

    /// A micro-batch's token budget holds the longest sequence, and the
    /// frameworks' training memory is checked at it.
    #[test]
    fn rl_token_budget_holds_the_longest_sequence() {
        let w = workload();
        assert_eq!(phases::token_budget(&w, 1, None), 1536);
        assert_eq!(phases::token_budget(&w, 1, Some(RlFramework::Verl)), 5120);
        assert_eq!(phases::token_budget(&w, 4, Some(RlFramework::Verl)), 6144);
        let hw = builtin_profile("h100-sxm").unwrap();
        let cluster = Cluster::new(hw, 32).unwrap();
        let cfg = phases::fixed_config(2, 1, 1, 1, 16);
        let bare = train_side(&w, &cluster, &cfg, None).unwrap();
        let verl = train_side(&w, &cluster, &cfg, Some(RlFramework::Verl)).unwrap();
        assert_eq!(bare.train_bytes, bare.estimate.memory.total);
        assert!(verl.train_bytes > bare.train_bytes);
        assert_eq!(verl.train_tokens, 5120);
        assert!(verl.logprob_tokens >= 5120);
        assert_eq!(
            verl.logprob_tokens,
            phases::token_budget(&w, verl.logprob_mbs, Some(RlFramework::Verl))
        );
        assert_eq!(verl.actor_train_secs, bare.actor_train_secs);
    }

    /// PPO's critic trains beside what the actor keeps in HBM: a phase of its own.
    #[test]
    fn rl_critic_training_is_a_memory_phase() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let mut w = workload();
        w.algorithm = Algorithm::Ppo;
        w.critic = Some(w.actor.clone());
        let r = plan(&w, &hw, 32, &small_search()).unwrap();
        for p in &r.plans {
            let c = p
                .memory
                .iter()
                .find(|m| m.phase == "critic training")
                .unwrap();
            assert!(c.bytes >= p.train.critic_train_bytes && c.bytes <= p.capacity_bytes);
        }
    }

    /// A learned reward model's pass is a memory phase: its weights come back
    /// beside the actor's state, and a plan whose pass would not fit is refused.
    #[test]
    fn rl_reward_forward_is_a_memory_phase() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let mut w = workload();
        w.reward = Some(w.actor.clone());
        let r = plan(&w, &hw, 32, &small_search()).unwrap();
        let p = &r.plans[0];
        let phase = |p: &RlPlan| {
            p.memory
                .iter()
                .find(|m| m.phase == "reward forward")
                .map(|m| m.bytes)
        };
        let bytes = phase(p).expect("the reward pass is checked");
        let m = &p.train.estimate.memory;
        let state = m.weights + m.gradients + m.optimizer + m.reserve;
        assert!((bytes - state - p.train.reward_weight_bytes).abs() <= 1e-6 * bytes);
        assert!(p.train.reward_weight_bytes > 0.0 && bytes <= p.capacity_bytes);
        // The same layout with a reward model's pass past the capacity: refused,
        // naming the phase.
        let mut side = p.train.clone();
        side.reward_forward_bytes = 1.01 * hw.capacity_bytes();
        let e = evaluate(
            &w,
            &hw,
            p.placement,
            &side,
            p.rollout.layout.tp,
            p.offload_params,
            None,
            None,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("reward forward:"), "{e}");
        // No learned reward, no such phase.
        let bare = plan(&workload(), &hw, 32, &small_search()).unwrap();
        assert!(bare.plans.iter().all(|p| phase(p).is_none()));
        // A reward model far larger than the actor is planned when its pass fits,
        // though training it on the actor's layout would not (its forward pass is
        // all it runs).
        let mut big = workload();
        big.reward = Some(resolve("70b").unwrap().spec);
        let mut s = small_search();
        s.space.tp = Some(vec![8]);
        let r = plan(&big, &hw, 32, &s).unwrap();
        let p = &r.plans[0];
        assert!(phase(p).unwrap() <= p.capacity_bytes);
        let train_big = crate::cost::estimate(
            big.reward.as_ref().unwrap(),
            &Cluster::new(hw.clone(), 32).unwrap(),
            &phases::train_workload(&big),
            &p.train.config,
        );
        assert!(train_big.is_err(), "the check would not be needed");
        // On an actor layout whose stages split the actor's 32 layers 11/11/10,
        // the 70B reward splits its own 80 (it took the actor's split and failed).
        let mut k = phases::fixed_config(1, 3, 1, 1, 8);
        k.layout = crate::config::Layout::balanced(32, 3, 1);
        let side = phases::train_side(&big, &Cluster::new(hw.clone(), 24).unwrap(), &k, None);
        assert!(side.is_ok_and(|s| s.reward_weight_bytes > 0.0));
    }

    #[test]
    fn rl_both_placements_are_searched_and_every_phase_fits() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let r = plan(&workload(), &hw, 32, &small_search()).unwrap();
        let c = r.best_colocated.expect("a colocated plan");
        let d = r.best_disaggregated.expect("a disaggregated plan");
        assert_eq!(c.placement.train_gpus, 32);
        assert_eq!(d.placement.train_gpus + d.placement.rollout_gpus, 32);
        for p in r.plans.iter().chain([&c, &d]) {
            for m in &p.memory {
                assert!(m.bytes <= p.capacity_bytes * (1.0 + 1e-9), "{}", m.phase);
            }
            assert!(p.times.iteration.is_finite() && p.times.iteration > 0.0);
        }
        assert!(r
            .plans
            .windows(2)
            .all(|p| p[0].times.iteration <= p[1].times.iteration));
    }

    /// Repeated pool sizes and engine TPs are searched once each.
    #[test]
    fn rl_repeated_sizes_are_searched_once() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let mut once = small_search();
        once.placements = vec![PlacementKind::Disaggregated];
        once.train_gpus = Some(vec![16]);
        once.rollout_tp = Some(vec![1, 2]);
        let mut many = once.clone();
        many.train_gpus = Some(vec![16; 1000]);
        many.rollout_tp = Some(vec![2, 1, 2, 1, 1]);
        many.space.tp = Some(vec![2, 1, 2, 2]);
        let (a, b) = (
            plan(&workload(), &hw, 32, &once).unwrap(),
            plan(&workload(), &hw, 32, &many).unwrap(),
        );
        assert_eq!(a.evaluated, b.evaluated);
        assert_eq!(a.plans.len(), b.plans.len());
    }

    #[test]
    fn rl_colocated_iteration_is_the_sum_of_its_phases() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let mut s = small_search();
        s.placements = vec![PlacementKind::Colocated];
        let r = plan(&workload(), &hw, 16, &s).unwrap();
        let t = r.plans[0].times;
        let sum = t.rollout + t.reshard + t.offload + t.forward + t.training;
        assert!((t.iteration - sum).abs() < 1e-9 * sum);
    }

    #[test]
    fn rl_disaggregated_overlaps_generation_with_training() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let mut s = small_search();
        s.placements = vec![PlacementKind::Disaggregated];
        let r = plan(&workload(), &hw, 16, &s).unwrap();
        let t = r.plans[0].times;
        assert!(t.iteration < t.rollout + t.forward + t.training + t.reshard);
        assert!(t.iteration >= t.rollout.max(t.forward + t.training));
    }

    #[test]
    fn rl_a_stated_memory_fraction_is_the_engines_share() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let w = workload();
        let cfg = crate::rl::phases::fixed_config(1, 1, 1, 1, 16);
        let derived = evaluate_stated(&w, &hw, 16, &cfg, 1, 16, None, None).unwrap();
        let stated = evaluate_stated(&w, &hw, 16, &cfg, 1, 16, Some(0.5), None).unwrap();
        assert_eq!(stated.memory_fraction, 0.5);
        assert!(derived.memory_fraction > 0.5);
        assert!(stated.rollout.kv_bytes_per_gpu < derived.rollout.kv_bytes_per_gpu);
    }

    #[test]
    fn rl_colocated_offload_moves_optimizer_and_engine_weights_not_gradients() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let w = workload();
        let cfg = crate::rl::phases::fixed_config(1, 1, 1, 1, 16);
        let p = evaluate_stated(&w, &hw, 16, &cfg, 1, 16, None, None).unwrap();
        assert!(!p.offload_params);
        let m = &p.train.estimate.memory;
        let moved = m.optimizer + p.rollout.weight_bytes_per_gpu;
        assert!(m.gradients > 0.0);
        assert_eq!(p.times.offload, reshard::offload_secs(&hw, moved));
    }

    #[test]
    fn rl_bad_workloads_are_errors() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let mut w = workload();
        w.mini_batches = 3;
        assert!(matches!(
            plan(&w, &hw, 16, &small_search()),
            Err(RlError::MiniBatches { .. })
        ));
        let mut w = workload();
        w.lengths.response_max = 10;
        assert!(plan(&w, &hw, 16, &small_search()).is_err());
        // Epochs whose product with the mini-batches would overflow.
        let mut w = workload();
        w.epochs = 1 << 62;
        assert!(matches!(
            plan(&w, &hw, 16, &small_search()),
            Err(RlError::TooManyEpochs { .. })
        ));
        let mut s = small_search();
        s.placements = vec![PlacementKind::Disaggregated];
        assert!(matches!(
            plan(&workload(), &hw, 8, &s),
            Err(RlError::NoSplit { .. })
        ));
    }
}
