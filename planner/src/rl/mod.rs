//! Reinforcement-learning iterations (verl, RLinf): actor training, rollout
//! generation, the forward-only passes of the other models, and the resharding of
//! the actor's weights into the rollout engine's layout, priced and searched
//! together.
//!
//! One RL iteration is: the rollout engines generate `prompts x responses_per_prompt`
//! responses ([`rollout`]); the actor's weights move from the training layout into
//! the engines' ([`reshard`]); the actor (old log-probabilities), the reference, the
//! critic (values) and the reward model run forward passes; the actor (and, for
//! PPO, the critic) train on the batch. The training and forward passes are priced by
//! the pre-training cost model ([`crate::cost`]) and searched by
//! [`crate::search::search`]; nothing here re-derives a GEMM or a collective.
//!
//! Two placements are searched ([`search`]): colocated (every GPU runs every phase
//! in turn, training state offloaded to host memory while the engines generate) and
//! disaggregated (a rollout pool and a training pool, the split searched, finished
//! responses streamed to training mini-batch by mini-batch as RLinf's pipeline
//! does).
//!
//! Pure: values in, values out.

pub mod constants;
pub mod phases;
pub mod reshard;
pub mod rollout;
pub mod search;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::Precision;
use crate::model::ModelSpec;

pub use search::{plan, RlPlan, RlSearch};

/// Which models run which passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Group-relative advantages: actor, reference; no critic.
    Grpo,
    /// Actor, critic (values and its own update), reference.
    Ppo,
}

impl Algorithm {
    pub fn parse(s: &str) -> Option<Algorithm> {
        match s.to_ascii_lowercase().as_str() {
            "grpo" => Some(Algorithm::Grpo),
            "ppo" => Some(Algorithm::Ppo),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Grpo => "grpo",
            Algorithm::Ppo => "ppo",
        }
    }
}

/// The RL framework a plan is searched and priced for, where its mechanics differ
/// (`None` in [`RlSearch::framework`]: neither's, as NeMo RL's published runs are
/// priced). Each difference is named where it is priced ([`search::evaluate`],
/// [`search::plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RlFramework {
    Verl,
    Rlinf,
}

impl RlFramework {
    /// The training layouts the framework's Megatron backend can load and run:
    /// RLinf converts a Hugging Face checkpoint with even pipeline stages only and
    /// writes no virtual-pipeline chunks (its converter's `vpp` schedule raises,
    /// rlinf/utils/ckpt_convertor/megatron_convertor/convert_middle_file_to_mg.py:102-103 at
    /// [`constants::RLINF_COMMIT`]; `num_layers % PP` is asserted,
    /// rlinf/config.py:1604-1608); verl's Megatron bridge turns sequence parallelism
    /// on wherever TP > 1 (its default `vanilla_mbridge` path: mbridge
    /// mbridge/core/llm_bridge.py:78 at 10cb17f, `"sequence_parallel": tp_size > 1`),
    /// so a plan without it would not run as priced.
    pub fn restrict(self, mut space: crate::search::SearchSpace) -> crate::search::SearchSpace {
        match self {
            RlFramework::Rlinf => {
                space.vpp = Some(vec![1]);
                space.even_layers = true;
            }
            RlFramework::Verl => space.sp = Some(vec![true]),
        }
        space
    }

    /// RLinf's name for the actor's architecture (`rollout.model.model_type`),
    /// which picks its checkpoint converter and weight resharding: the reasoning
    /// path reshards only these (`get_pp_reshard_fn`,
    /// rlinf/utils/resharding/utils.py:60-73), keyed by the Hugging Face
    /// `model_type` ([`ModelSpec::hf_model_type`]).
    pub fn rlinf_model_type(model: &ModelSpec) -> Option<&'static str> {
        match model.hf_model_type.as_deref()? {
            "qwen2" => Some("qwen2.5"),
            "qwen3" => Some("qwen3"),
            "qwen3_moe" => Some("qwen3_moe"),
            "deepseek_v3" => Some("deepseek_v3"),
            _ => None,
        }
    }

    /// The entry of RLinf's checkpoint converter that holds `model`'s shape
    /// (`explict_model` in
    /// rlinf/utils/ckpt_convertor/megatron_convertor/default_args.yaml at
    /// [`constants::RLINF_COMMIT`]: its type, layers, heads, KV heads and experts),
    /// which a model converted without Megatron-Bridge (the PPO critic, whose value
    /// head Megatron-Bridge's path does not build) must name.
    pub fn rlinf_converter_entry(model: &ModelSpec) -> Option<&'static str> {
        // (entry, converter type, layers, heads, KV heads, routed experts, tied
        // embeddings where the entry sets them: otherwise the checkpoint's own)
        type Entry = (&'static str, &'static str, u64, u64, u64, u64, Option<bool>);
        const ENTRIES: [Entry; 14] = [
            ("DeepSeek-V3", "deepseek_v3", 61, 128, 128, 256, None),
            ("Qwen2.5-1.5B", "qwen2", 28, 12, 2, 0, Some(true)),
            ("Qwen2.5-3B", "qwen2", 36, 16, 2, 0, Some(true)),
            ("Qwen2.5-7B", "qwen2", 28, 28, 4, 0, None),
            ("qwen_2.5_14b", "qwen2", 48, 40, 8, 0, Some(false)),
            ("Qwen2.5-32B", "qwen2", 64, 40, 8, 0, None),
            ("Qwen3-30B-A3B", "qwen3_moe", 48, 32, 4, 128, None),
            ("Qwen3-0.6B", "qwen3", 28, 16, 8, 0, Some(false)),
            ("Qwen3-4B", "qwen3", 36, 32, 8, 0, Some(true)),
            ("Qwen3-8B", "qwen3", 36, 32, 8, 0, Some(false)),
            ("Qwen3-14B", "qwen3", 40, 40, 8, 0, Some(false)),
            ("DeepSeek-R1-Distill-Qwen-1.5B", "qwen2", 28, 12, 2, 0, None),
            ("DeepSeek-R1-Distill-Qwen-7B", "qwen2", 28, 28, 4, 0, None),
            ("DeepSeek-R1-Distill-Qwen-32B", "qwen2", 64, 40, 8, 0, None),
        ];
        let t = model.hf_model_type.as_deref()?;
        let experts = model.moe.as_ref().map_or(0, |m| m.experts);
        ENTRIES
            .iter()
            .find(|e| {
                e.1 == t
                    && e.2 == model.layers
                    && e.3 == model.heads
                    && e.4 == model.kv_heads
                    && e.5 == experts
                    && e.6.is_none_or(|tied| tied == model.tied_embeddings)
            })
            .map(|e| e.0)
    }

    /// What the framework cannot run at all, whatever the layout.
    pub fn check(self, w: &RlWorkload) -> Result<(), RlError> {
        let refuse = |reason: String| {
            Err(RlError::Framework {
                framework: self.label(),
                reason,
            })
        };
        match self {
            RlFramework::Rlinf => {
                if w.reward.is_some() {
                    // reward_worker.py:68-69 raises NotImplementedError.
                    return refuse("its reasoning reward worker has no learned reward model (rlinf/workers/reward/reward_worker.py:68-69); drop --reward".into());
                }
                if w.epochs > 1 {
                    return refuse(format!("it steps once per mini-batch with no epoch loop (rlinf/workers/megatron_worker.py:158); --epochs {} cannot be run", w.epochs));
                }
                if let Some(c) = &w.critic {
                    // Its critic is built from the rollout's checkpoint: the actor's
                    // shape (rlinf/config.py:1559-1561).
                    if c.layers != w.actor.layers
                        || c.hidden != w.actor.hidden
                        || c.heads != w.actor.heads
                        || c.moe.is_some() != w.actor.moe.is_some()
                    {
                        return refuse(format!("it builds the critic from the actor's checkpoint (rlinf/config.py:1559-1561), not {}; give --critic with the actor's name", crate::json::one_line(&c.name, 80)));
                    }
                    if c.moe.is_some() {
                        // Its only PPO example converts a dense critic; the
                        // converter's expert-parallel settings for one are not
                        // stated there (qwen2.5-1.5b-ppo-megatron.yaml:370-380).
                        return refuse(format!("its PPO critic goes through a converter configured for dense models only; a mixture-of-experts critic ({}) is not exported", crate::json::one_line(&c.name, 80)));
                    }
                    if Self::rlinf_model_type(c).is_some()
                        && Self::rlinf_converter_entry(c).is_none()
                    {
                        return refuse(format!("its critic is converted by its own checkpoint converter, which has no entry for {}'s shape (rlinf/utils/ckpt_convertor/megatron_convertor/default_args.yaml)", crate::json::one_line(&c.name, 80)));
                    }
                }
                for (role, m) in [("actor", Some(&w.actor)), ("critic", w.critic.as_ref())] {
                    if let Some(m) = m {
                        if Self::rlinf_model_type(m).is_none() {
                            return refuse(format!("its Megatron path converts and reshards Qwen2.5, Qwen3, Qwen3-MoE and DeepSeek-V3 checkpoints only (rlinf/utils/resharding/utils.py:60-73); the {role} {} is {}", crate::json::one_line(&m.name, 80), m.hf_model_type.as_deref().map_or("of no named architecture (give its Hugging Face config.json)".to_string(), |t| format!("a {t} model"))));
                        }
                    }
                }
                Ok(())
            }
            RlFramework::Verl => {
                if !w.prompts.is_multiple_of(w.mini_batches) {
                    return refuse(format!("it counts mini-batches in prompts: {} prompts do not split into {} mini-batches (--mini-batches)", w.prompts, w.mini_batches));
                }
                Ok(())
            }
        }
    }

    /// The framework as its project spells it.
    pub fn label(self) -> &'static str {
        match self {
            RlFramework::Verl => "verl",
            RlFramework::Rlinf => "RLinf",
        }
    }

    pub fn parse(s: &str) -> Option<RlFramework> {
        match crate::cost::spelling_key(s).as_str() {
            "verl" => Some(RlFramework::Verl),
            "rlinf" => Some(RlFramework::Rlinf),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RlFramework::Verl => "verl",
            RlFramework::Rlinf => "rlinf",
        }
    }
}

/// Token lengths of one iteration. The mean sets the work; the longest response
/// sets how long a synchronous rollout runs after the batch has drained.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Lengths {
    pub prompt_mean: u64,
    /// The longest prompt (what the frameworks' prompt-length limits must admit).
    pub prompt_max: u64,
    pub response_mean: u64,
    /// The longest response of the iteration (the tail; often the length cap).
    pub response_max: u64,
}

impl Lengths {
    /// Mean tokens of one trained sequence (prompt and response).
    pub fn sequence_mean(&self) -> u64 {
        self.prompt_mean + self.response_mean
    }
}

/// What one RL iteration does.
#[derive(Debug, Clone, PartialEq)]
pub struct RlWorkload {
    pub actor: ModelSpec,
    /// PPO's value model (trained); `None` for GRPO.
    pub critic: Option<ModelSpec>,
    /// A learned reward model (forward only); `None` for rule-based rewards.
    pub reward: Option<ModelSpec>,
    /// A frozen reference policy for the KL term (the actor's architecture).
    pub reference: bool,
    pub algorithm: Algorithm,
    pub prompts: u64,
    pub responses_per_prompt: u64,
    pub lengths: Lengths,
    /// Optimizer steps per iteration (`ppo_mini_batch_size` divides the batch).
    pub mini_batches: u64,
    /// Passes over the batch per iteration (`ppo_epochs`).
    pub epochs: u64,
    pub precision: Precision,
}

impl RlWorkload {
    /// Responses generated and trained per iteration (saturating: [`Self::check`]
    /// refuses a product beyond [`MAX_SEQUENCES`]).
    pub fn sequences(&self) -> u64 {
        self.prompts.saturating_mul(self.responses_per_prompt)
    }

    /// Sequences per optimizer step.
    pub fn mini_batch(&self) -> u64 {
        self.sequences() / self.mini_batches
    }

    /// Checks the workload; every problem is one [`RlError`].
    pub fn check(&self) -> Result<(), RlError> {
        let pos = |name: &'static str, v: u64| {
            if v == 0 {
                Err(RlError::Zero { name })
            } else {
                Ok(())
            }
        };
        pos("prompts", self.prompts)?;
        pos("responses per prompt", self.responses_per_prompt)?;
        pos("prompt length", self.lengths.prompt_mean)?;
        pos("response length", self.lengths.response_mean)?;
        pos("mini-batches", self.mini_batches)?;
        pos("epochs", self.epochs)?;
        if self.lengths.response_max < self.lengths.response_mean {
            return Err(RlError::TailBelowMean {
                mean: self.lengths.response_mean,
                max: self.lengths.response_max,
            });
        }
        if self.lengths.prompt_max < self.lengths.prompt_mean {
            return Err(RlError::PromptTailBelowMean {
                mean: self.lengths.prompt_mean,
                max: self.lengths.prompt_max,
            });
        }
        // Saturating: lengths near u64::MAX must not wrap below the bound.
        let longest = self
            .lengths
            .prompt_max
            .saturating_add(self.lengths.response_max);
        if longest > 1 << 20 {
            return Err(RlError::TooLong { tokens: longest });
        }
        if self.epochs > MAX_EPOCHS {
            return Err(RlError::TooManyEpochs {
                epochs: self.epochs,
            });
        }
        if self.sequences() > MAX_SEQUENCES {
            return Err(RlError::TooManySequences {
                prompts: self.prompts,
                responses: self.responses_per_prompt,
            });
        }
        if !self.sequences().is_multiple_of(self.mini_batches) {
            return Err(RlError::MiniBatches {
                sequences: self.sequences(),
                mini_batches: self.mini_batches,
            });
        }
        if self.algorithm == Algorithm::Ppo && self.critic.is_none() {
            return Err(RlError::PpoWithoutCritic);
        }
        if self.algorithm == Algorithm::Grpo && self.critic.is_some() {
            return Err(RlError::GrpoWithCritic);
        }
        Ok(())
    }
}

/// The most sequences (prompts x responses) one iteration may generate: 2^24,
/// far above any published RL batch (thousands), and small enough that token
/// counts and batch sizes derived from it stay exact in `u64` and `f64`.
pub const MAX_SEQUENCES: u64 = 1 << 24;

/// The most passes over one iteration's batch (`ppo_epochs`): published recipes
/// run 1 to 4; the bound keeps optimizer steps per iteration exact.
pub const MAX_EPOCHS: u64 = 1024;

/// A workload or request that cannot be planned.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum RlError {
    #[error("{name} must be at least 1")]
    Zero { name: &'static str },
    #[error("the longest response ({max} tokens) is shorter than the mean response ({mean} tokens); give --response-max >= --response-len")]
    TailBelowMean { mean: u64, max: u64 },
    #[error("the longest prompt ({max} tokens) is shorter than the mean prompt ({mean} tokens); give --prompt-max >= --prompt-len")]
    PromptTailBelowMean { mean: u64, max: u64 },
    #[error("a sequence of {tokens} tokens is beyond what Sextant prices (at most 1048576)")]
    TooLong { tokens: u64 },
    #[error("{prompts} prompts x {responses} responses per prompt is beyond what Sextant plans (at most 16777216 sequences per iteration); give smaller --prompts or --responses")]
    TooManySequences { prompts: u64, responses: u64 },
    #[error("{epochs} epochs per iteration is beyond what Sextant plans (at most 1024); give a smaller --epochs")]
    TooManyEpochs { epochs: u64 },
    #[error("{sequences} sequences per iteration do not split into {mini_batches} mini-batches; choose --mini-batches dividing prompts x responses per prompt")]
    MiniBatches { sequences: u64, mini_batches: u64 },
    #[error("rollout TP {tp}: {reason}; within one node these run: {valid}")]
    RolloutTp {
        tp: u64,
        reason: String,
        valid: String,
    },
    #[error("PPO trains a critic; give --critic MODEL (the actor's name for a critic of the same shape)")]
    PpoWithoutCritic,
    #[error("GRPO has no critic; drop --critic or use --algorithm ppo")]
    GrpoWithCritic,
    #[error("{gpus} GPUs cannot be split into a rollout pool and a training pool of whole nodes ({per_node} GPUs each)")]
    NoSplit { gpus: u64, per_node: u64 },
    #[error("no RL plan fits: {reason}")]
    NothingFits { reason: String },
    #[error("{framework}: {reason}")]
    Framework {
        framework: &'static str,
        reason: String,
    },
}

/// Why one RL configuration was not kept: data, counted by the search.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Reject {
    #[error("rollout TP {tp}: weights {weights_gib:.1} GiB, the engine's share {budget_gib:.1} GiB holds no KV cache for the longest sequence (needs {needed_gib:.1} GiB)")]
    KvCache {
        tp: u64,
        weights_gib: f64,
        budget_gib: f64,
        needed_gib: f64,
    },
    #[error("training layout: {0}")]
    Training(crate::config::Rejection),
    #[error("{model} on the actor's layout: {rejection}")]
    OtherModel {
        model: &'static str,
        rejection: crate::config::Rejection,
    },
    #[error("{phase}: {needed_gib:.1} GiB per GPU over the {capacity_gib:.1} GiB a plan may use")]
    Memory {
        phase: &'static str,
        needed_gib: f64,
        capacity_gib: f64,
    },
}

impl Reject {
    /// A short name to count rejections by.
    pub fn kind(&self) -> &'static str {
        match self {
            Reject::KvCache { .. } => "rollout KV cache",
            Reject::Training(_) => "training layout",
            Reject::OtherModel { .. } => "critic/reference/reward layout",
            Reject::Memory { .. } => "phase memory",
        }
    }
}
