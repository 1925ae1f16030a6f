//! ScaleTorch (github.com/jianzhnie/ScaleTorch at c4c08ac, 2026-07-14): the flags of
//! its trainer, `train.py`, which parses `ScaleTorchArguments` with Hugging Face's
//! `HfArgumentParser` (scaletorch/trainer/config.py), launched by torchrun.
//!
//! What ScaleTorch runs, and so what this target states:
//! - ranks on the grid `[DP, PP, CP, EP, TP]` of its `ProcessGroupManager`
//!   (scaletorch/parallel/process_group.py); the plan must be priced in that order
//!   (`plan --target scaletorch` does), since the DP and PP groups sit elsewhere
//!   than in Megatron's;
//! - plain data parallelism with bucketed gradient all-reduce over the CP x DP
//!   group (parallel/data_parallel/data_parallel.py): no ZeRO, no distributed
//!   optimizer;
//! - tensor parallelism without sequence parallelism (the trainer never turns on
//!   `enable_sequence_parallel`), ring attention for CP, no expert parallelism in
//!   this target (its EP is a fifth grid dimension of its own, not yet priced);
//! - `pipeline_parallel_engine` `1f1b` or `afab` (all forward, all backward: GPipe),
//!   no virtual stages;
//! - `gradient_checkpointing`, which checkpoints whole decoder layers (full
//!   recomputation) or nothing, and only without a pipeline;
//! - BF16 on GPUs that support it (trainer/dist_setup.py `get_dtype`), an
//!   unfused `F.cross_entropy`, and flash attention through SDPA unless the
//!   environment sets `FLASH_ATTEN=0` (scaletorch/env.py); ring attention under
//!   context parallelism only where `CONTEXT_PARALLEL=1` is set before the model
//!   is built.

use sextant_planner::config::{Precision, Recompute, Zero};
use sextant_planner::cost::{LossKernel, RankOrder};
use sextant_planner::plan::PlanFile;
use sextant_planner::schedule::Schedule;

use crate::{ExportError, Target};

/// The schedules ScaleTorch's `pipeline_parallel_engine` runs.
pub const SCHEDULES: &[Schedule] = &[Schedule::OneFOneB, Schedule::Gpipe];

/// Environment variables a run needs, as (name, value) plain words.
pub type Env = Vec<(String, String)>;

/// The trainer's arguments (one flag with its value per entry, already shell
/// words), and the environment the run needs, for plan `index`; or why
/// ScaleTorch cannot run it.
pub fn args(plan: &PlanFile, index: usize) -> Result<(Vec<String>, Env), ExportError> {
    let cannot = |reason: String| ExportError::Inexpressible {
        target: Target::ScaleTorch,
        reason,
    };
    let cfg = &plan.plans[index].config;
    let w = &plan.workload;
    if plan.assumptions.rank_order != RankOrder::ScaleTorch {
        return Err(cannot(format!(
            "the plan was priced with rank order {}, and ScaleTorch places ranks as [DP, PP, CP, EP, TP]; re-plan with --target scaletorch",
            plan.assumptions.rank_order.order()
        )));
    }
    if plan.model.moe.is_some() || cfg.ep > 1 || cfg.etp > 1 {
        return Err(cannot("mixture-of-experts layers: ScaleTorch's expert parallelism is a grid dimension of its own that this target does not price yet".into()));
    }
    if cfg.zero != Zero::None {
        return Err(cannot(format!(
            "ZeRO stage {}: ScaleTorch has plain data parallelism only; re-plan with --zero 0",
            cfg.zero
        )));
    }
    if cfg.sp {
        return Err(cannot(
            "sequence parallelism: ScaleTorch's trainer does not turn it on; re-plan with --sp false".into(),
        ));
    }
    if cfg.vpp > 1 || cfg.layout != sextant_planner::config::Layout::Even {
        return Err(cannot("virtual stages or an uneven stage layout: ScaleTorch splits layers evenly over its stages".into()));
    }
    let engine = match cfg.schedule {
        Schedule::OneFOneB => "1f1b",
        Schedule::Gpipe => "afab",
        s => {
            return Err(cannot(format!(
                "the {} schedule: ScaleTorch runs 1f1b and afab (GPipe)",
                s.name()
            )))
        }
    };
    let checkpointing =
        match cfg.recompute {
            Recompute::None => "False",
            Recompute::Full => "True",
            Recompute::Selective => return Err(cannot(
                "selective recomputation: ScaleTorch checkpoints whole layers (full) or nothing"
                    .into(),
            )),
        };
    // Its pipeline engines run the layers as they are; gradient_checkpointing
    // reaches only the step without a pipeline (tools/train.py:301-327 at c4c08ac).
    if cfg.recompute == Recompute::Full && cfg.pp > 1 {
        return Err(cannot("full recomputation with pipeline parallelism: ScaleTorch's pipeline engines (1f1b, afab) run without checkpointing, which only its step without a pipeline applies (tools/train.py:301-327); re-plan with --recompute none or --pp 1".into()));
    }
    if w.precision != Precision::Bf16 {
        return Err(cannot(format!(
            "{} precision: ScaleTorch trains in BF16",
            w.precision
        )));
    }
    if plan.assumptions.loss != LossKernel::Unfused {
        return Err(cannot("a fused cross-entropy: ScaleTorch computes F.cross_entropy over the gathered logits; re-plan with --loss unfused".into()));
    }
    if cfg.bf16_moments {
        return Err(cannot(
            "--bf16-moments: ScaleTorch has no such switch (its AdamW keeps the moments in the parameters' BF16 whatever the plan says, and a ScaleTorch plan prices them so); re-plan without --bf16-moments".into(),
        ));
    }
    if cfg.bf16_grads {
        return Err(cannot(
            "--bf16-grads: ScaleTorch has no such switch (with data parallelism its gradient buckets are FP32); re-plan without --bf16-grads".into(),
        ));
    }
    if cfg.overlap.tp_comm && cfg.tp > 1 {
        return Err(cannot(
            "--tp-comm-overlap: ScaleTorch runs its tensor-parallel collectives unoverlapped; re-plan without --tp-comm-overlap".into(),
        ));
    }
    let m = plan.plans[index].estimate.micro_batches;
    let v = vec![
        "--model_name_or_path \"${MODEL_PATH:?set MODEL_PATH to the Hugging Face id or directory of the planned model}\"".to_string(),
        format!("--tensor_parallel_size {}", cfg.tp),
        format!("--pipeline_parallel_size {}", cfg.pp),
        format!("--data_parallel_size {}", cfg.dp),
        format!("--context_parallel_size {}", cfg.cp),
        format!("--pipeline_parallel_engine {engine}"),
        format!("--micro_batch_size {}", cfg.mbs),
        format!("--gradient_accumulation_steps {m}"),
        format!("--gradient_checkpointing {checkpointing}"),
        format!("--sequence_length {}", w.seq),
        "\"$@\"".to_string(),
    ];
    let flash = if plan.assumptions.flash_attention {
        "1"
    } else {
        "0"
    };
    // Under context parallelism its attention is its ring attention, which builds
    // each block's score and probability matrices in full (context_parallel.py
    // ring attention at c4c08ac) whatever FLASH_ATTEN says: unfused attention.
    if cfg.cp > 1 && plan.assumptions.flash_attention {
        return Err(cannot("context parallelism priced with flash attention: ScaleTorch's ring attention computes each block's full score matrices (parallel/context_parallel/context_parallel.py), unfused; re-plan with --no-flash-attention or --cp 1".into()));
    }
    // The attention reads CONTEXT_PARALLEL when the model is built
    // (models/llama.py:117-122), before the trainer sets it for the CP group
    // (parallel/context_parallel/context_parallel.py:72): without it each rank
    // would attend within its own chunk, not ring attention.
    let mut env = vec![("FLASH_ATTEN".to_string(), flash.to_string())];
    if cfg.cp > 1 {
        env.push(("CONTEXT_PARALLEL".to_string(), "1".to_string()));
    }
    Ok((v, env))
}
