//! What each framework holds beyond Megatron's accounting: the loss's bytes per
//! logit, nanotron's DDP buckets, torchtitan's FSDP2 buffers, and ScaleTorch's
//! gradient copy and `scaling`'s reduction buckets at the optimizer step.

use crate::config::{ParallelConfig, Zero};
use crate::cost::{Framework, LossKernel};

/// Bytes per logit (one token, one vocabulary entry on this rank) the loss holds
/// at its peak. Megatron-Core keeps the BF16 logits and an FP32 copy (its unfused
/// loss subtracts the maximum in place). nanotron returns the FP32 cast from the
/// model (the BF16 logits die with the forward) and `sharded_cross_entropy`
/// subtracts the maximum into a second FP32 tensor (nanotron/parallel/
/// tensor_parallel/functional.py): 8. torchtitan's `cross_entropy(pred.float())`
/// keeps the FP32 log-softmax for its backward; after `del pred` that backward
/// holds it with the incoming and the outgoing FP32 gradient (train.py at 9dec370):
/// 12. ScaleTorch (c4c08ac) calls `F.cross_entropy` on the BF16 logits under
/// autocast (trainer/train_step.py:81-103), which runs it in FP32 (PyTorch's
/// autocast op list, not ScaleTorch's code): the FP32 log-softmax and, in its
/// backward, the incoming and outgoing FP32 gradients as torchtitan's, and the
/// BF16 logits besides, which `outputs` keeps until after the backward
/// (train_step.py:117): 14. Its pipeline engines' loss
/// (parallel/pipeline_parallel/pipeline_parallel.py:327) is priced the same.
/// Aleph Alpha's `scaling` (737f855) runs `F.cross_entropy` on BF16 logits, which it
/// first gathers over TP (the caller counts the whole vocabulary on every rank):
/// the gathered logits and the saved BF16 log-softmax, 4.
/// torchtitan's loss under `torch.compile` ([`LossKernel::Compiled`]) keeps the
/// BF16 logits (the compiled graph saves its input and the rows' log-sum-exp) and
/// writes their BF16 gradient: 4. (Measured: two H200 runs at torchtitan e7c0cae
/// with compile on peaked at 47-48 GiB reserved, where the 12-byte eager loss
/// prices 65-67 GiB.)
pub fn logit_bytes(framework: Framework, loss: LossKernel) -> f64 {
    match framework {
        Framework::Torchtitan if loss == LossKernel::Compiled => 2.0 + 2.0,
        Framework::MegatronCore => 2.0 + 4.0,
        Framework::Scaling => 2.0 + 2.0,
        Framework::Nanotron => 4.0 + 4.0,
        Framework::Torchtitan => 4.0 + 4.0 + 4.0,
        Framework::ScaleTorch => 2.0 + 4.0 + 4.0 + 4.0,
    }
}

/// What a stage holds of its parameters, for [`framework_buffers`] (counts per
/// GPU, before data-parallel sharding).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HeldParams {
    /// Every parameter of the rank's stages.
    pub all: f64,
    /// The largest transformer layer.
    pub layer: f64,
    /// The embedding and output layer (FSDP2's root module).
    pub root: f64,
}

/// A framework's buffers beside the model state, bytes.
///
/// - nanotron wraps the model in PyTorch's `DistributedDataParallel` (trainer.py),
///   whose reducer keeps gradient buckets the size of the gradients in the
///   parameters' BF16 unless `gradient_as_bucket_view` is set (PyTorch DDP
///   documentation), which nanotron does not: 2 bytes per parameter with
///   data parallelism.
/// - torchtitan's FSDP2 all-gathers BF16 parameters. ZeRO-3 without pipelining
///   (`reshard_after_forward=True`): each transformer block is its own unit, the
///   block at work and the one prefetched (2 x 2 bytes per block parameter), the
///   block's unsharded gradient in BF16 and its FP32 upcast for the
///   reduce-scatter (2 + 4), and the root module's embedding and output layer,
///   gathered again for the backward (2). In a pipeline stage,
///   torch.distributed.pipelining turns resharding after the backward and the
///   gradient sync off for all but the last micro-batch
///   (`PipelineStage.backward_maybe_with_nosync`: `set_reshard_after_backward`
///   and `set_requires_gradient_sync(False)` before every backward, the last
///   one's included, then a separate post-backward reduces), so every parameter
///   is whole after each backward (2) and FSDP2 holds the stage's unsharded
///   gradients in the FP32 reduce dtype (4), whatever the micro-batch count.
///   ZeRO-2 (`reshard_after_forward=False`) holds the same gradients, and
///   without a pipeline one block's (2 + 4); its gathered parameters are the
///   model state's unsharded BF16 weights.
pub fn framework_buffers(framework: Framework, cfg: &ParallelConfig, held: HeldParams) -> f64 {
    match framework {
        Framework::MegatronCore => 0.0,
        Framework::Nanotron => {
            if cfg.dp * cfg.cp > 1 && matches!(cfg.zero, Zero::None | Zero::DistOpt) {
                2.0 * held.all
            } else {
                0.0
            }
        }
        Framework::Torchtitan if matches!(cfg.zero, Zero::Zero2 | Zero::Zero3) => {
            let block_grads = (2.0 + 4.0) * held.layer;
            let grads = if cfg.pp > 1 {
                4.0 * held.all
            } else {
                block_grads
            };
            // ZeRO-2 (`fsdp_reshard_after_forward = "never"`): every gathered BF16
            // parameter stays whole until its backward, which the model state
            // already counts as unsharded BF16 weights ([`super::model_state`]).
            let params = match (cfg.zero, cfg.pp > 1) {
                (Zero::Zero2, _) => 0.0,
                (_, true) => 2.0 * held.all,
                (_, false) => 2.0 * 2.0 * held.layer + 2.0 * held.root,
            };
            params + grads
        }
        Framework::Torchtitan => 0.0,
        // Its FP32 gradient buckets are the model state's gradients; the BF16
        // copy the sync leaves is held at the optimizer step ([`step_buffers`]).
        Framework::ScaleTorch => 0.0,
        // `scaling`'s reduction buffers exist only at the step ([`step_buffers`]).
        Framework::Scaling => 0.0,
    }
}

/// Elements after which one of `scaling`'s gradient all-reduce buckets closes
/// (`OptimizerConfig.allreduce_bucket_size`, core/optimizer/optimizer_config.py
/// at 737f855): gradients are flattened, cast to FP32 and all-reduced about this
/// many at a time ([`crate::cost::Framework::Scaling`]).
pub const SCALING_BUCKET_ELEMENTS: f64 = 500e6;

/// Bytes a framework holds only from the end of the last backward through the
/// optimizer step, after the activations and logits are freed: a stage's peak
/// is the larger of its model state plus activations and its model state plus
/// these. ScaleTorch's `DataParallelBucket` (with data parallelism), once its
/// FP32 buckets are reduced, sets every `param.grad` to a BF16 copy of its
/// bucket view (`main_grad.to(param.dtype)`, parallel/data_parallel/
/// data_parallel.py:319-323 after the backward, 346-350 after a pipeline's last
/// micro-batch), kept through the optimizer step until `model.reset()`
/// (tools/train.py:365-367): 2 bytes per parameter. `scaling` (737f855), with
/// data parallelism, all-reduces its gradients a bucket at a time after the last
/// backward (`allreduce_no_retain`, core/optimizer/allreduce.py), a bucket closing
/// once it holds more than [`SCALING_BUCKET_ELEMENTS`], so at most that and one
/// more tensor (bounded here by the stage's largest layer or its embedding and
/// output layer): under ZeRO-1 the bucket's flattened BF16 copy and its FP32
/// cast (2 + 4 bytes per element), then the FP32 gradient of the shard it owns
/// (4 per owned parameter), whichever is larger; under ZeRO-0 every gradient is
/// first cast to FP32 (2 more bytes per parameter) and the FP32 bucket is
/// flattened (4 per element). Other frameworks: none.
pub fn step_buffers(framework: Framework, cfg: &ParallelConfig, held: HeldParams) -> f64 {
    match framework {
        Framework::ScaleTorch if cfg.dp > 1 => 2.0 * held.all,
        Framework::Scaling if cfg.dp * cfg.cp > 1 => {
            let bucket = held
                .all
                .min(SCALING_BUCKET_ELEMENTS + held.layer.max(held.root));
            if cfg.zero == Zero::None {
                2.0 * held.all + 4.0 * bucket
            } else {
                ((2.0 + 4.0) * bucket).max(4.0 * held.all / (cfg.dp * cfg.cp) as f64)
            }
        }
        Framework::Scaling
        | Framework::ScaleTorch
        | Framework::MegatronCore
        | Framework::Nanotron
        | Framework::Torchtitan => 0.0,
    }
}

/// A framework's buffers that grow with the micro-batch's tokens, bytes. nanotron
/// (e24d2483) with tensor parallelism in its sequence-parallel mode
/// (`REDUCE_SCATTER`) gathers the column-parallel layers' input into a persistent
/// `MemoryBuffer` ("allgather", `parallel/tensor_parallel/functional.py:154`, with
/// the default `tp_recompute_allgather`) and, with
/// `tp_linear_async_communication` (off by default, `config/parallelism_config.py`;
/// the Ultra-Scale Playbook's runs set it, `scripts/scaling_benchmarks.py:88`),
/// the row-parallel layers' output gradient into a second ("allgather2", `:491`);
/// the singleton never frees them (`parallel/utils.py:14-28`): two full-sequence
/// [tokens, hidden] BF16 tensors, not split by TP, priced as the Playbook ran.
/// Other frameworks: none.
pub fn token_buffers(framework: Framework, cfg: &ParallelConfig, tokens: f64, hidden: f64) -> f64 {
    match framework {
        Framework::Nanotron if cfg.tp > 1 && cfg.sp => 2.0 * tokens * hidden * 2.0,
        _ => 0.0,
    }
}

/// Blocks the caching allocator holds free at a stage's peak beyond the live
/// tensors, bytes ([`super::StageMemory::cached`]), for one micro-batch's
/// forward over `chunk_layers` layers, with `logits` vocabulary entries of the
/// loss on this rank (0 off the last stage). nanotron (e24d2483):
/// - each row-parallel layer (the attention's output projection and the MLP's
///   down projection) computes its full-sequence [tokens, hidden] BF16 output and
///   reduce-scatters it (`_RowLinearAsyncCommunication`, `functional.py:466-469`;
///   `differentiable_reduce_scatter_sum`,
///   `distributed_differentiable_primitives.py:110-119`). PyTorch's NCCL process
///   group records the input on its stream (`recordStream`, on unless
///   `TORCH_NCCL_AVOID_RECORD_STREAMS` is set; the playbook's runs did not set it),
///   so the freed output is reusable only once that reduce-scatter has run on the
///   GPU; nanotron's forward has no host synchronization, so the host issues the
///   whole forward ahead of the GPU and each layer's output takes fresh memory:
///   two such blocks per layer;
/// - the loss casts the BF16 logits to FP32 and frees them before
///   `sharded_cross_entropy` asks for a second FP32 tensor
///   (`models/llama.py:874-911`, `functional.py:43`): the BF16 block, too small
///   for it, stays cached through the peak (2 bytes per logit).
///
/// Other frameworks: none priced.
pub fn cached_blocks(
    framework: Framework,
    cfg: &ParallelConfig,
    tokens: f64,
    hidden: f64,
    chunk_layers: f64,
    logits: f64,
) -> f64 {
    match framework {
        Framework::Nanotron => {
            let pending = if cfg.tp > 1 && cfg.sp {
                2.0 * chunk_layers * tokens * hidden * 2.0
            } else {
                0.0
            };
            pending + 2.0 * logits
        }
        _ => 0.0,
    }
}
