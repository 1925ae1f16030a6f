//! Model state: weights, main gradients and optimizer state per GPU, sharded as
//! the ZeRO stage and the framework shard them.

use super::{GRAD_BYTES, OPTIMIZER_BYTES, OPTIMIZER_BYTES_BF16_MOMENTS, WEIGHT_BYTES};
use crate::config::{ParallelConfig, Zero};
use crate::cost::Framework;

/// Bytes per main-gradient element.
pub fn grad_bytes(cfg: &ParallelConfig) -> f64 {
    if cfg.bf16_grads {
        2.0
    } else {
        GRAD_BYTES
    }
}

/// Optimizer bytes per parameter.
pub fn optimizer_bytes(cfg: &ParallelConfig) -> f64 {
    if cfg.bf16_moments {
        OPTIMIZER_BYTES_BF16_MOMENTS
    } else {
        OPTIMIZER_BYTES
    }
}

/// The least model state (weights, gradients, optimizer) a GPU can hold: every
/// parameter sharded over all `gpus` (ZeRO-3), before activations, buffers and the
/// runtime reserve. When it exceeds what a plan may use, no layout fits on that
/// many GPUs of that kind.
pub fn sharded_state_floor(
    params: f64,
    gpus: u64,
    framework: Framework,
    bf16_grads: bool,
    bf16_moments: bool,
) -> f64 {
    // ScaleTorch never shards: the least it keeps is without data parallelism.
    let dp = if framework == Framework::ScaleTorch {
        1
    } else {
        gpus
    };
    let (w, g, o) = state_bytes(framework, Zero::Zero3, dp, bf16_grads, bf16_moments);
    (w + g + o) * params / gpus.max(1) as f64
}

/// ScaleTorch's bytes per parameter (weight, gradient, optimizer) with `dp`
/// data-parallel replicas ([`Framework::ScaleTorch`], at c4c08ac). It trains pure
/// BF16: the model is cast to BF16 (trainer/model_builder.py:90) and torch AdamW's
/// two moments follow the parameter's dtype (2 + 2), with no FP32 master copy.
/// With `dp` > 1 the model is wrapped in `DataParallelBucket`
/// (model_builder.py:92-93), whose `BucketManager` is built with the `grad_type`
/// argument left unset (parallel/data_parallel/data_parallel.py:186-188) and so
/// allocates FP32 buckets (bucket.py:194-196, 301-304) that every parameter's
/// `main_grad` views (bucket.py:320-327): 4 bytes; the BF16 `param.grad` is freed
/// as soon as it is added in (data_parallel.py:264-267). Without data parallelism
/// the gradient stays PyTorch's BF16 `param.grad`: 2. The BF16 copy of the
/// buckets the sync leaves in `param.grad` is [`crate::memory::step_buffers`].
/// Megatron's `--bf16-grads` and `--bf16-moments` do not apply: ScaleTorch has
/// neither switch.
pub fn scaletorch_bytes(dp: u64) -> (f64, f64, f64) {
    let grad = if dp > 1 { 4.0 } else { 2.0 };
    (2.0, grad, 2.0 + 2.0)
}

/// Bytes per parameter of weights, gradients and optimizer state before sharding,
/// as `framework` keeps them under `zero` with `dp` data-parallel ranks: the one
/// rule [`model_state`] and [`sharded_state_floor`] share.
fn state_bytes(
    framework: Framework,
    zero: Zero,
    dp: u64,
    bf16_grads: bool,
    bf16_moments: bool,
) -> (f64, f64, f64) {
    match framework {
        // FSDP2's FP32 parameter and gradient shards, Adam's moments (below).
        Framework::Torchtitan if zero == Zero::Zero3 => {
            (4.0, 4.0, if bf16_moments { 4.0 } else { 8.0 })
        }
        Framework::ScaleTorch => scaletorch_bytes(dp),
        // `scaling` accumulates BF16 gradients on the parameters themselves
        // (`param.grad`); the FP32 shard and Adam's moments are the optimizer's.
        Framework::Scaling => (
            WEIGHT_BYTES,
            2.0,
            if bf16_moments {
                OPTIMIZER_BYTES_BF16_MOMENTS
            } else {
                OPTIMIZER_BYTES
            },
        ),
        Framework::MegatronCore | Framework::Nanotron | Framework::Torchtitan => (
            WEIGHT_BYTES,
            if bf16_grads { 2.0 } else { GRAD_BYTES },
            if bf16_moments {
                OPTIMIZER_BYTES_BF16_MOMENTS
            } else {
                OPTIMIZER_BYTES
            },
        ),
    }
}

/// Model state bytes (weights, gradients, optimizer) for `dense` and `expert`
/// parameters held by one GPU.
///
/// torchtitan's FSDP2 (`fully_shard` with `MixedPrecisionPolicy(param_dtype=bf16,
/// reduce_dtype=fp32)`, parallelize_llama.py) keeps the sharded parameter in FP32
/// as the optimizer's own, the sharded gradient in FP32 and Adam's two FP32
/// moments: 4 + 4 + 8 bytes per parameter over the shard group, with no BF16 copy
/// at rest (its all-gathered BF16 copies are [`framework_buffers`]).
pub fn model_state(
    cfg: &ParallelConfig,
    dense: f64,
    expert: f64,
    framework: Framework,
) -> (f64, f64, f64) {
    let dp_dense = (cfg.dp * cfg.cp) as f64;
    let dp_expert = cfg.edp() as f64;
    let (w_bytes, g_bytes, o_bytes) = state_bytes(
        framework,
        cfg.zero,
        cfg.dp,
        cfg.bf16_grads,
        cfg.bf16_moments,
    );
    let shard = |params: f64, dp: f64, sharded: bool| if sharded { params / dp } else { params };
    let (w_shard, g_shard, o_shard) = match cfg.zero {
        Zero::None => (false, false, false),
        Zero::DistOpt => (false, false, true),
        Zero::Zero2 => (false, true, true),
        Zero::Zero3 => (true, true, true),
    };
    // FP8 weight casts are transient workspaces, as in Megatron's own accounting;
    // the BF16 weight stays the stored copy.
    let weights = w_bytes * (shard(dense, dp_dense, w_shard) + shard(expert, dp_expert, w_shard));
    let grads = g_bytes * (shard(dense, dp_dense, g_shard) + shard(expert, dp_expert, g_shard));
    let optim = o_bytes * (shard(dense, dp_dense, o_shard) + shard(expert, dp_expert, o_shard));
    (weights, grads, optim)
}
