//! The training-side phases of an RL iteration, priced by the pre-training cost
//! model: the actor's (and critic's) update, and the forward-only passes (old
//! log-probabilities, reference, values, reward) on the same layout.
//!
//! A forward pass is a third of a training step's forward and backward work
//! (backward is twice the forward's FLOPs; its communication and pipeline fill scale
//! the same way), without the optimizer and recomputation: `(step - optimizer -
//! recompute) / 3`. Its memory is the model state that stays resident, the
//! log-probability micro-batch's logits (BF16 logits, an FP32 copy and the FP32
//! log-softmax, `vocab / tp` wide) and the reserve.

use super::{Reject, RlFramework, RlWorkload};
use crate::banded::estimate_with;
use crate::config::{Layout, Overlap, ParallelConfig, Recompute, RecomputeModules, Workload, Zero};
use crate::cost::{Assumptions, Estimate, LossKernel};
use crate::hardware::{Cluster, GIB};
use crate::model::ModelSpec;
use crate::schedule::Schedule;

/// Log-probability micro-batch sizes tried, largest first.
pub const LOGPROB_MBS: [u64; 6] = [32, 16, 8, 4, 2, 1];

/// The cost model's assumptions for an RL framework's Megatron backend: verl and
/// RLinf compute log-probabilities with Megatron-Core's unfused
/// `vocab_parallel_cross_entropy` (see exports/src/others.rs).
pub fn assumptions() -> Assumptions {
    Assumptions {
        loss: LossKernel::Unfused,
        ..Assumptions::default()
    }
}

/// The training workload of one optimizer step: a mini-batch of sequences of the
/// mean length (verl and RLinf pack sequences without padding), rounded up to 64.
pub fn train_workload(w: &RlWorkload) -> Workload {
    let seq = w.lengths.sequence_mean().div_ceil(64) * 64;
    Workload {
        seq,
        global_batch: w.mini_batch(),
        precision: w.precision,
        moe_imbalance: w
            .actor
            .moe
            .as_ref()
            .map(crate::routing::default_imbalance)
            .unwrap_or(1.0),
        moe_capacity: None,
    }
}

/// A Megatron configuration with the RL frameworks' defaults for what is not given.
pub fn fixed_config(tp: u64, pp: u64, cp: u64, ep: u64, dp: u64) -> ParallelConfig {
    ParallelConfig {
        tp,
        pp,
        vpp: 1,
        cp,
        ep,
        etp: 1,
        dp,
        sp: tp > 1,
        mbs: 1,
        zero: Zero::DistOpt,
        recompute: Recompute::Full,
        layout: Layout::Even,
        overlap: Overlap::default(),
        bf16_grads: false,
        bf16_moments: false,
        recompute_modules: RecomputeModules::DEFAULT,
        moe_dispatcher: Default::default(),
        schedule: Schedule::OneFOneB,
    }
}

/// The training-side passes of one iteration on one layout.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSide {
    pub config: ParallelConfig,
    /// One optimizer step of the actor (one mini-batch).
    pub estimate: Estimate,
    pub actor_train_secs: f64,
    pub critic_train_secs: f64,
    pub old_logprob_secs: f64,
    pub reference_secs: f64,
    pub values_secs: f64,
    pub reward_secs: f64,
    pub logprob_mbs: u64,
    /// Peak bytes per GPU of a forward pass (model state resident, logits).
    pub forward_bytes: f64,
    /// Tokens of one training micro-batch per data-parallel rank: the frameworks
    /// form micro-batches by a token budget (verl `ppo_max_token_len_per_gpu`,
    /// RLinf `max_tokens_per_mbs`), which must admit the longest sequence. The time
    /// is priced at the mean; the memory at this budget ([`token_budget`]).
    pub train_tokens: u64,
    /// Tokens of one log-probability micro-batch (the same rule).
    pub logprob_tokens: u64,
    /// Peak bytes per GPU of a training micro-batch at `train_tokens`.
    pub train_bytes: f64,
    /// Bytes per GPU of the critic's weights and optimizer state (PPO), which leave
    /// HBM between its own passes (offloaded in either placement).
    pub critic_state_bytes: f64,
    /// Peak bytes per GPU of the critic's own training step (PPO).
    pub critic_train_bytes: f64,
    /// Bytes per GPU of the reward model's weights (a learned reward), likewise.
    pub reward_weight_bytes: f64,
    /// Peak bytes per GPU of the reward model's forward pass: its weights beside
    /// what the actor keeps during its own forward passes (a scalar head: no
    /// vocabulary logits). Zero without a learned reward.
    pub reward_forward_bytes: f64,
}

/// The tokens of a micro-batch of `mbs` sequences. verl and RLinf, as exported,
/// form micro-batches by a token budget (verl `use_dynamic_bsz` with
/// `ppo_max_token_len_per_gpu`, RLinf `enable_dynamic_batch_size` with
/// `max_tokens_per_mbs`): what `mbs` mean sequences give, raised to the longest
/// sequence (a budget below it could not hold that sequence at all), in whole
/// 64-token blocks. Without a framework (a published run's stated configuration)
/// the micro-batch is `mbs` mean sequences, as priced before budgets.
pub fn token_budget(w: &RlWorkload, mbs: u64, framework: Option<RlFramework>) -> u64 {
    let mean = w.lengths.sequence_mean().div_ceil(64) * 64;
    match framework {
        Some(_) => {
            let longest = w.lengths.prompt_max + w.lengths.response_max;
            (mbs * mean).max(longest.div_ceil(64) * 64)
        }
        None => mbs * mean,
    }
}

impl TrainSide {
    pub fn train_secs(&self) -> f64 {
        self.actor_train_secs + self.critic_train_secs
    }

    pub fn forward_secs(&self) -> f64 {
        self.old_logprob_secs + self.reference_secs + self.values_secs + self.reward_secs
    }
}

fn forward_of(e: &Estimate) -> f64 {
    (e.step_secs - e.time.optimizer - e.time.recompute).max(0.0) / 3.0
}

/// The actor's layout for another model (critic, reward): its stage split is the
/// actor's layers', so a model of another depth splits its own layers over the
/// same stages (Megatron's balanced split).
fn other_layout(model: &ModelSpec, actor: &ModelSpec, cfg: &ParallelConfig) -> ParallelConfig {
    let mut c = cfg.clone();
    if model.layers != actor.layers {
        c.layout = Layout::balanced(model.layers, c.pp, c.vpp);
    }
    c
}

fn other(
    model: &ModelSpec,
    name: &'static str,
    cluster: &Cluster,
    tw: &Workload,
    cfg: &ParallelConfig,
) -> Result<Estimate, Reject> {
    estimate_with(model, cluster, tw, cfg, assumptions()).map_err(|rejection| Reject::OtherModel {
        model: name,
        rejection,
    })
}

/// Prices the training-side passes of `w` on `cfg` over `cluster` (the GPUs that
/// train). `resident_state` says whether the actor's training state stays in HBM
/// during the forward passes (it does unless the placement offloads it).
pub fn train_side(
    w: &RlWorkload,
    cluster: &Cluster,
    cfg: &ParallelConfig,
    framework: Option<RlFramework>,
) -> Result<TrainSide, Reject> {
    let tw = train_workload(w);
    let e = estimate_with(&w.actor, cluster, &tw, cfg, assumptions()).map_err(Reject::Training)?;
    let steps = (w.mini_batches * w.epochs) as f64;
    let batches = w.mini_batches as f64;
    let fwd = forward_of(&e) * batches;
    // The memory of a micro-batch at the token budget: the same layout with each
    // sequence as long as the budget's share (the mean-length workload's memory is
    // what a micro-batch of mean sequences needs, not the longest one's).
    let train_tokens = token_budget(w, cfg.mbs, framework);
    let train_bytes = if train_tokens > cfg.mbs * tw.seq {
        let peak = Workload {
            seq: train_tokens.div_ceil(cfg.mbs).div_ceil(64) * 64,
            ..tw
        };
        estimate_with(&w.actor, cluster, &peak, cfg, assumptions())
            .map_err(Reject::Training)?
            .memory
            .total
    } else {
        e.memory.total
    };
    let mut side = TrainSide {
        config: cfg.clone(),
        actor_train_secs: e.step_secs * steps,
        critic_train_secs: 0.0,
        old_logprob_secs: fwd,
        reference_secs: if w.reference { fwd } else { 0.0 },
        values_secs: 0.0,
        reward_secs: 0.0,
        logprob_mbs: 1,
        forward_bytes: 0.0,
        train_tokens,
        logprob_tokens: 0,
        train_bytes,
        critic_state_bytes: 0.0,
        critic_train_bytes: 0.0,
        reward_weight_bytes: 0.0,
        reward_forward_bytes: 0.0,
        estimate: e,
    };
    if let Some(critic) = &w.critic {
        let c = other(
            critic,
            "critic",
            cluster,
            &tw,
            &other_layout(critic, &w.actor, cfg),
        )?;
        side.critic_train_secs = c.step_secs * steps;
        side.values_secs = forward_of(&c) * batches;
        side.critic_state_bytes = c.memory.weights + c.memory.optimizer;
        side.critic_train_bytes = c.memory.total;
    }
    if let Some(reward) = &w.reward {
        // Forward passes only: its training memory is beside the point (the
        // "reward forward" phase checks what the pass holds); shape rejections
        // (heads TP does not divide, ...) still apply.
        let rcfg = other_layout(reward, &w.actor, cfg);
        let r = crate::cost::evaluate(reward, cluster, &tw, &rcfg, assumptions()).map_err(
            |rejection| Reject::OtherModel {
                model: "reward model",
                rejection,
            },
        )?;
        side.reward_secs = forward_of(&r) * batches;
        side.reward_weight_bytes = r.memory.weights;
    }
    let capacity = cluster.profile.capacity_bytes();
    let m = &side.estimate.memory;
    // verl's reference policy is a second model in the actor's process; its
    // weights count beside the log-probability pass (search::evaluate).
    let reference = if framework == Some(RlFramework::Verl) && w.reference {
        m.weights
    } else {
        0.0
    };
    let state = m.weights + m.gradients + m.optimizer + m.reserve + reference;
    if w.reward.is_some() {
        side.reward_forward_bytes = state + side.reward_weight_bytes;
    }
    let per_rank = (w.sequences() / (cfg.dp * cfg.cp).max(1)).max(1);
    // Logits of a micro-batch at its token budget (the longest sequence at least).
    // RLinf's forward-only passes split by the training budget too
    // (`max_tokens_per_mbs`, rlinf/workers/megatron_worker.py:450-458).
    let budget = |b: u64| {
        if framework == Some(RlFramework::Rlinf) {
            train_tokens
        } else {
            token_budget(w, b, framework)
        }
    };
    let logits =
        |b: u64| (budget(b) / cfg.cp) as f64 * (w.actor.vocab / cfg.tp) as f64 * (2.0 + 4.0 + 4.0);
    let fit = LOGPROB_MBS
        .iter()
        .copied()
        .filter(|&b| b <= per_rank)
        .find(|&b| state + logits(b) <= capacity);
    match fit {
        Some(b) => {
            side.logprob_mbs = b;
            side.logprob_tokens = budget(b);
            side.forward_bytes = state + logits(b);
            Ok(side)
        }
        None => Err(Reject::Memory {
            phase: "log-prob forward",
            needed_gib: (state + logits(1)) / GIB,
            capacity_gib: capacity / GIB,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Precision;
    use crate::hardware::builtin_profile;
    use crate::presets::resolve;
    use crate::rl::{Algorithm, Lengths};

    pub fn grpo(model: &str) -> RlWorkload {
        RlWorkload {
            actor: resolve(model).unwrap().spec,
            critic: None,
            reward: None,
            reference: true,
            algorithm: Algorithm::Grpo,
            prompts: 256,
            responses_per_prompt: 8,
            lengths: Lengths {
                prompt_mean: 512,
                prompt_max: 1024,
                response_mean: 1536,
                response_max: 4096,
            },
            mini_batches: 4,
            epochs: 1,
            precision: Precision::Bf16,
        }
    }

    #[test]
    fn rl_forward_passes_cost_less_than_training() {
        let w = grpo("8b");
        let cluster = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
        let s = train_side(&w, &cluster, &fixed_config(2, 1, 1, 1, 32), None).unwrap();
        assert!(s.old_logprob_secs > 0.0);
        assert!(s.old_logprob_secs < s.actor_train_secs / 2.0);
        assert_eq!(s.reference_secs, s.old_logprob_secs);
        assert!(s.forward_bytes <= cluster.profile.capacity_bytes());
    }

    #[test]
    fn rl_ppo_adds_the_critic() {
        let mut w = grpo("8b");
        let cluster = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
        let cfg = fixed_config(2, 1, 1, 1, 32);
        let g = train_side(&w, &cluster, &cfg, None).unwrap();
        w.algorithm = Algorithm::Ppo;
        w.critic = Some(w.actor.clone());
        let p = train_side(&w, &cluster, &cfg, None).unwrap();
        assert!(p.train_secs() > 1.9 * g.train_secs());
        assert!(p.values_secs > 0.0);
    }
}
