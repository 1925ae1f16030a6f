//! Rollout generation from its mechanisms.
//!
//! - Prefill is compute-bound: `2 x active parameters` FLOPs per prompt token plus
//!   causal attention, at the profile's BF16 GEMM efficiency. With prefix caching
//!   (on in verl's and RLinf's rollout configurations) a prompt is prefilled once
//!   for all of its responses.
//! - Decode is bound by memory bandwidth: every step reads the engine's weights
//!   (for MoE, the experts some token of the batch routes to) and each running
//!   sequence's KV cache, at `hbm_tbytes_per_s x efficiency.hbm`; or by its FLOPs
//!   when the batch is large enough. Each step also pays the launch overhead of its
//!   kernels (`efficiency.gemm_overhead_us`) and two tensor-parallel all-reduces per
//!   layer ([`crate::comm::collective_secs`]). Between steps the GPU waits for the
//!   engine's host work, per running sequence
//!   ([`super::constants::ENGINE_HOST_SECS_PER_SEQ_STEP`]: vLLM schedules
//!   synchronously up to v0.11).
//! - The KV cache left after the weights, inside the engine's memory fraction,
//!   decides how many sequences run at once. A synchronous rollout hands the engine
//!   all of its requests at once, so they are admitted together and grow together:
//!   the cache must hold each running sequence at its prompt plus the mean response
//!   when the batch peaks, not at its lifetime average (vLLM preempts the latest
//!   admitted request when a running one finds no free block and runs it again
//!   later, `vllm/v1/core/sched/scheduler.py`). Each step reads, on average, the
//!   prompt and half the response of every running sequence.
//! - A synchronous rollout ends with its longest response: the engine runs at least
//!   `response_max` steps, and the sequences admitted last finish `response_max -
//!   response_mean` steps after the batch would have drained at the mean.

use serde::{Deserialize, Serialize};

use super::constants::{DECODE_KERNELS_PER_LAYER, ENGINE_HOST_SECS_PER_SEQ_STEP, ROLLOUT_BYTES};
use super::{Lengths, Reject};
use crate::comm::{collective_secs, Collective, Placement};
use crate::hardware::{HardwareProfile, GIB};
use crate::model::ModelSpec;

/// How the rollout engines are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RolloutLayout {
    /// Tensor parallel size of one engine (one engine spans `tp` GPUs of a node).
    pub tp: u64,
    /// Engines generating at once.
    pub engines: u64,
    /// Bytes per GPU the engine may take (weights, KV cache, workspace).
    pub budget_bytes: f64,
}

/// What one iteration's rollout costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutCost {
    pub layout: RolloutLayout,
    pub weight_bytes_per_gpu: f64,
    pub kv_bytes_per_gpu: f64,
    /// Sequences one engine runs at once.
    pub concurrent: u64,
    /// Engines that get at least one sequence: all of them unless an iteration
    /// has fewer sequences than engines.
    #[serde(default)]
    pub busy_engines: u64,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    pub decode_steps: f64,
    /// Prefill and decode.
    pub secs: f64,
}

/// Bytes of the engine's weights on one GPU (all parameters, BF16, split by TP).
pub fn weight_bytes_per_gpu(model: &ModelSpec, tp: u64) -> f64 {
    model.params().total as f64 * ROLLOUT_BYTES / tp as f64
}

/// KV-cache bytes per token on one GPU. Grouped-query attention splits the KV heads
/// over TP and replicates them when TP exceeds their count; MLA keeps the compressed
/// latent and the rotary key, whole on every TP rank.
pub fn kv_bytes_per_token(model: &ModelSpec, tp: u64) -> f64 {
    let per_layer = match &model.mla {
        Some(m) => (m.kv_lora_rank + m.qk_rope_head_dim) as f64,
        None => {
            let heads = (model.kv_heads / tp).max(1);
            2.0 * (heads * model.head_dim) as f64
        }
    };
    model.layers as f64 * per_layer * ROLLOUT_BYTES
}

/// Weight bytes one decode step of `batch` sequences reads on one GPU: all dense
/// weights, and of each MoE layer's routed experts the share that some token of the
/// batch selects (`1 - (1 - k/E)^batch`, uniform routing).
fn step_weight_bytes(model: &ModelSpec, tp: u64, batch: f64) -> f64 {
    let p = model.params();
    let experts = (p.routed_experts * model.moe_layers()) as f64;
    let dense = p.total as f64 - experts;
    let touched = match &model.moe {
        Some(m) => 1.0 - (1.0 - m.top_k as f64 / m.experts as f64).powf(batch.max(1.0)),
        None => 0.0,
    };
    (dense + experts * touched) * ROLLOUT_BYTES / tp as f64
}

/// Prices one iteration's rollout of `sequences` responses to `prompts` prompts.
pub fn rollout_cost(
    model: &ModelSpec,
    hw: &HardwareProfile,
    lengths: &Lengths,
    prompts: u64,
    sequences: u64,
    layout: RolloutLayout,
) -> Result<RolloutCost, Reject> {
    let tp = layout.tp;
    let weights = weight_bytes_per_gpu(model, tp);
    let workspace = hw.memory.reserve_gib * GIB;
    let kv_bytes = layout.budget_bytes - weights - workspace;
    let kv_token = kv_bytes_per_token(model, tp);
    let longest = (lengths.prompt_max + lengths.response_max) as f64;
    if kv_bytes < longest * kv_token {
        return Err(Reject::KvCache {
            tp,
            weights_gib: weights / GIB,
            budget_gib: layout.budget_bytes / GIB,
            needed_gib: (weights + workspace + longest * kv_token) / GIB,
        });
    }
    let per_engine = (sequences as f64 / layout.engines as f64).ceil();
    let prompts_per_engine = (prompts as f64 / layout.engines as f64).ceil();
    let held = lengths.prompt_mean as f64 + lengths.response_mean as f64 / 2.0;
    let peak = lengths.sequence_mean() as f64;
    let concurrent = (kv_bytes / (peak * kv_token))
        .floor()
        .min(per_engine)
        .max(1.0);

    let peak = hw.peak_flops(false);
    let active = model.params().active_without_embedding as f64;
    let q_dim = model.q_dim() as f64;
    let layers = model.layers as f64;
    // Prefill: GEMMs plus causal attention (QK^T and PV over half the square).
    let prompt = lengths.prompt_mean as f64;
    let prefill_flops_per_prompt = 2.0 * active * prompt + 2.0 * layers * q_dim * prompt * prompt;
    let prefill_secs = prompts_per_engine * prefill_flops_per_prompt
        / (tp as f64 * peak * hw.efficiency.gemm_bf16);

    // Decode steps: the batch's tokens at full concurrency, then the tail.
    let tokens = per_engine * lengths.response_mean as f64;
    let tail = (lengths.response_max - lengths.response_mean) as f64;
    let steps = (tokens / concurrent + tail).max(lengths.response_max as f64);
    let batch = tokens / steps;
    let bw = hw.gpu.hbm_tbytes_per_s * 1e12 * hw.efficiency.hbm;
    let kv_read = batch * held * kv_token;
    let memory_secs = (step_weight_bytes(model, tp, batch) + kv_read) / bw;
    let flops = batch * (2.0 * active + 4.0 * layers * q_dim * held);
    let compute_secs = flops / (tp as f64 * peak * hw.efficiency.gemm_bf16);
    let launch_secs = layers * DECODE_KERNELS_PER_LAYER * hw.efficiency.gemm_overhead_us * 1e-6;
    let allreduce = collective_secs(
        hw,
        Collective::AllReduce,
        batch * model.hidden as f64 * ROLLOUT_BYTES,
        Placement::new(tp, 1, hw.node.nvlink_domain),
    );
    let host_secs = batch * ENGINE_HOST_SECS_PER_SEQ_STEP;
    let step_secs =
        memory_secs.max(compute_secs) + launch_secs + 2.0 * layers * allreduce + host_secs;
    let decode_secs = steps * step_secs;
    Ok(RolloutCost {
        layout,
        weight_bytes_per_gpu: weights,
        kv_bytes_per_gpu: kv_bytes,
        concurrent: concurrent as u64,
        busy_engines: layout.engines.min(sequences),
        prefill_secs,
        decode_secs,
        decode_steps: steps,
        secs: prefill_secs + decode_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::builtin_profile;
    use crate::presets::resolve;

    fn lengths(mean: u64, max: u64) -> Lengths {
        Lengths {
            prompt_mean: 512,
            prompt_max: 512,
            response_mean: mean,
            response_max: max,
        }
    }

    fn cost(tp: u64, l: Lengths, seqs: u64) -> RolloutCost {
        let m = resolve("8b").unwrap().spec;
        let hw = builtin_profile("h100-sxm").unwrap();
        let layout = RolloutLayout {
            tp,
            engines: 8 / tp,
            budget_bytes: 0.7 * hw.hbm_bytes(),
        };
        rollout_cost(&m, &hw, &l, seqs / 8, seqs, layout).unwrap()
    }

    #[test]
    fn rl_longer_tail_costs_more_at_the_same_mean() {
        let a = cost(1, lengths(1000, 1000), 1024);
        let b = cost(1, lengths(1000, 8000), 1024);
        assert!(b.secs > a.secs, "{} vs {}", b.secs, a.secs);
        assert!(b.decode_steps >= 8000.0);
    }

    #[test]
    fn rl_decode_step_is_at_least_one_weight_read() {
        let c = cost(1, lengths(1000, 1000), 8);
        let hw = builtin_profile("h100-sxm").unwrap();
        let read = c.weight_bytes_per_gpu / (hw.gpu.hbm_tbytes_per_s * 1e12);
        assert!(c.decode_secs / c.decode_steps > read);
    }

    #[test]
    fn rl_kv_cache_bounds_concurrency() {
        let short = cost(1, lengths(500, 500), 8192);
        let long = cost(1, lengths(8000, 8000), 8192);
        assert!(long.concurrent < short.concurrent);
    }

    #[test]
    fn rl_a_synchronous_batch_holds_whole_sequences() {
        // Half of each response fits for every sequence, the whole mean response does
        // not: the batch, admitted together, runs in more than one wave.
        let m = resolve("8b").unwrap().spec;
        let hw = builtin_profile("h100-sxm").unwrap();
        let l = lengths(3000, 3000);
        let per_token = kv_bytes_per_token(&m, 1);
        let seqs = 64.0;
        let kv = seqs * (512.0 + 2000.0) * per_token;
        let layout = RolloutLayout {
            tp: 1,
            engines: 1,
            budget_bytes: weight_bytes_per_gpu(&m, 1) + hw.memory.reserve_gib * GIB + kv,
        };
        let c = rollout_cost(&m, &hw, &l, 8, 64, layout).unwrap();
        assert!(c.concurrent < 64, "{}", c.concurrent);
        assert_eq!(c.concurrent, (kv / (3512.0 * per_token)) as u64);
        assert!(c.decode_steps > 3000.0);
    }

    #[test]
    fn rl_host_time_grows_with_the_running_batch() {
        // The same weights and tokens in fewer, fuller steps: the per-sequence host
        // time is charged for every running sequence of every step.
        let small = cost(1, lengths(1000, 1000), 8);
        let large = cost(1, lengths(1000, 1000), 1024);
        let per_step = |c: &RolloutCost| c.decode_secs / c.decode_steps;
        let floor = 127.0 * ENGINE_HOST_SECS_PER_SEQ_STEP;
        assert!(per_step(&large) - per_step(&small) > floor);
    }

    #[test]
    fn rl_mla_cache_is_the_latent() {
        let m = resolve("deepseek-v3").unwrap().spec;
        // 61 layers x (512 + 64) x 2 bytes, whatever the TP.
        assert_eq!(kv_bytes_per_token(&m, 8), 61.0 * 576.0 * 2.0);
        assert_eq!(kv_bytes_per_token(&m, 1), kv_bytes_per_token(&m, 8));
    }

    #[test]
    fn rl_refuses_a_budget_below_one_sequence() {
        let m = resolve("70b").unwrap().spec;
        let hw = builtin_profile("h100-sxm").unwrap();
        let layout = RolloutLayout {
            tp: 1,
            engines: 8,
            budget_bytes: 0.9 * hw.hbm_bytes(),
        };
        let r = rollout_cost(&m, &hw, &lengths(1000, 2000), 8, 64, layout);
        assert!(matches!(r, Err(Reject::KvCache { .. })));
    }
}
