//! Megatron-LM command-line arguments and Megatron-Core Python.
//!
//! Flag names as of Megatron-LM main (2026-08, core_v0.19); all are also valid in
//! core_v0.13 except `--use-megatron-fsdp`, which core_v0.13 spelled
//! `--use-custom-fsdp`. Up to core_v0.15 the flags are written out in
//! `megatron/training/arguments.py`; later ones are generated from the config
//! dataclasses named beside each mapping (`--` + field name with `-` for `_`).
//!
//! What both renderings share is here: the layout string, the schedule and rank-order
//! rules, the MoE token fields; `lm` writes the arguments, `mcore` the Python.

use crate::{ExportError, Target};
use sextant_planner::config::{Dispatcher, ParallelConfig, RecomputeModules, Zero};
use sextant_planner::cost::LossKernel;
use sextant_planner::plan::PlanFile;
use sextant_planner::schedule::Schedule;

use crate::quote;
use crate::Reason;

mod lm;
mod mcore;

pub use lm::{args, megatron_lm};
pub use mcore::megatron_core;

pub const MEGATRON_VERSION: &str = "Megatron-LM main 2026-08 (core_v0.19); core_v0.13+ except --use-megatron-fsdp (core_v0.13: --use-custom-fsdp)";

/// Whether a Megatron-LM argument list (`args`, one flag and its values per entry)
/// graphs a weight-gradient GEMM that `--delay-wgrad-compute` defers while
/// `--overlap-grad-reduce` is on: attention, or the router with shared experts
/// not overlapped (validate_args, megatron/training/arguments.py at d98e8a6).
/// Megatron then asks for Transformer Engine 2.12 and refuses attention biases.
pub fn graphs_delayed_wgrad(args: &[String]) -> bool {
    let has = |flag: &str| args.iter().any(|a| a.split(' ').next() == Some(flag));
    let modules: Vec<&str> = args
        .iter()
        .find_map(|a| a.strip_prefix("--cuda-graph-modules "))
        .map(|m| m.split(' ').collect())
        .unwrap_or_default();
    let router_with_shared = modules.contains(&"moe_router")
        && has("--moe-shared-expert-intermediate-size")
        && !has("--moe-shared-expert-overlap");
    (modules.contains(&"attn") || router_with_shared)
        && has("--delay-wgrad-compute")
        && has("--overlap-grad-reduce")
}

/// The release floors the CUDA-graph flags of a Megatron-LM argument list need, or
/// `None` without them. Megatron-LM names the modules `--cuda-graph-modules` and
/// offers `--cuda-graph-impl full_iteration` since core_v0.18 (core_v0.15-0.17:
/// `--cuda-graph-scope`, and `transformer_engine` or `local` as the only
/// implementations; `TransformerConfig.cuda_graph_impl` at each tag).
pub fn cuda_graph_floor(args: &[String]) -> Option<String> {
    if !args.iter().any(|a| a.starts_with("--cuda-graph-impl ")) {
        return None;
    }
    let mut note = "Needs Megatron-Core core_v0.18 or later for its CUDA-graph flags (core_v0.15-0.17 name the modules --cuda-graph-scope and have no full_iteration implementation).".to_string();
    if graphs_delayed_wgrad(args) {
        note.push_str(" Graphing a GEMM whose weight gradient --delay-wgrad-compute defers needs Transformer Engine 2.12 or later, which validate_args asserts.");
    }
    Some(note)
}

/// The release floor a plan needs when its TP exceeds the model's K/V heads:
/// Megatron-Core computes one K/V head per rank there only since f7dfb99
/// (core_v0.16.0; attention.py `num_query_groups < world_size`); before, it
/// asserted TP divides `num_query_groups`.
pub fn kv_heads_below_tp(plan: &PlanFile, index: usize) -> Option<String> {
    let m = &plan.model;
    let tp = plan.plans.get(index)?.config.tp;
    (m.mla.is_none() && m.kv_heads < tp).then(|| {
        format!(
            "Needs Megatron-Core core_v0.16 or later: TP {tp} exceeds the {} key/value heads (earlier releases require TP to divide them).",
            m.kv_heads
        )
    })
}

/// `--pipeline-model-parallel-layout` string for an explicit per-stage list
/// (syntax: megatron/core/transformer/pipeline_parallel_layer_layout.py; `E`
/// embedding, `t` decoder layer, `m` multi-token-prediction layer, `L` loss, `|`
/// between virtual stages, stage index = vpp_rank * PP + pp_rank, which is
/// Sextant's order too). MTP layers go on the last virtual stage, before the loss.
pub fn pipeline_layout(plan: &PlanFile, cfg: &ParallelConfig) -> Result<String, Reason> {
    let chunks = cfg
        .stage_layers(plan.model.layers)
        .map_err(|r| r.to_string())?;
    let last = chunks.len() - 1;
    let parts: Vec<String> = chunks
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut s = String::new();
            if i == 0 {
                s.push('E');
            }
            match n {
                0 => {}
                1 => s.push('t'),
                n => s.push_str(&format!("t*{n}")),
            }
            if i == last {
                match plan.model.mtp_layers {
                    0 => {}
                    1 => s.push('m'),
                    n => s.push_str(&format!("m*{n}")),
                }
                s.push('L');
            }
            s
        })
        .collect();
    Ok(parts.join("|"))
}

/// Megatron-Core runs 1F1B, or interleaved 1F1B with virtual stages, and nothing
/// else: `get_forward_backward_func` (megatron/core/pipeline_parallel/schedules.py)
/// returns forward_backward_no_pipelining, _pipelining_without_interleaving or
/// _pipelining_with_interleaving, and no argument selects another. (The
/// combined_1f1b variants overlap expert-parallel communication inside 1F1B, and
/// `--delay-wgrad-compute` defers weight gradients for that overlap; neither is a
/// zero-bubble or bidirectional schedule.) So GPipe, ZB-H1 and DualPipe plans
/// cannot be stated for Megatron-LM or the frameworks built on Megatron-Core.
pub(crate) fn megatron_schedule(cfg: &ParallelConfig, framework: &str) -> Result<(), Reason> {
    match cfg.schedule {
        Schedule::OneFOneB | Schedule::Interleaved => Ok(()),
        other => Err(format!(
            "{framework} has no {other} pipeline schedule (Megatron-Core's get_forward_backward_func runs 1F1B, or interleaved 1F1B with virtual stages); re-plan with --schedule 1f1b,interleaved"
        ).into()),
    }
}

/// The FP8 scaling recipe for an FP8 plan (Fp8Recipe in megatron/core/enums.py).
/// Delayed scaling, unless selective recomputation replays `moe_act` or
/// `layernorm`: TransformerConfig refuses those with delayed scaling ("Delayed
/// scaling does not support moe_act and layernorm recompute for fp8",
/// transformer_config.py, d98e8a6), so the plan runs with per-tensor current
/// scaling (`tensorwise`), the same FP8 GEMMs.
pub(crate) fn fp8_recipe(cfg: &ParallelConfig) -> &'static str {
    if cfg.recomputes(RecomputeModules::MOE_ACT) || cfg.recomputes(RecomputeModules::LAYERNORM) {
        "tensorwise"
    } else {
        "delayed"
    }
}

/// What a Megatron-LM launch must do with `CUDA_DEVICE_MAX_CONNECTIONS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MaxConnections {
    /// Set it to 1: `validate_args` asserts it with tensor or context parallelism
    /// on GPUs before Blackwell (on Blackwell it is allowed, not required).
    One,
    /// Leave it unset (or above 1): Megatron-FSDP asserts it is not 1, and the
    /// expert-parallel all-to-all overlap needs more than one connection.
    Unset,
}

/// The `CUDA_DEVICE_MAX_CONNECTIONS` this plan needs from its launch, if any
/// (megatron/training/arguments.py validate_args, d98e8a6).
pub(crate) fn cuda_device_max_connections(plan: &PlanFile, index: usize) -> Option<MaxConnections> {
    let cfg = &plan.plans[index].config;
    if matches!(cfg.zero, Zero::Zero2 | Zero::Zero3)
        || (plan.model.moe.is_some() && cfg.megatron_ep_overlap(&plan.workload))
    {
        Some(MaxConnections::Unset)
    } else if cfg.tp > 1 || cfg.cp > 1 {
        Some(MaxConnections::One)
    } else {
        None
    }
}

/// The expert-parallel sizes Megatron-Core is handed for this plan: the plan's
/// for an MoE model; for a dense one the defaults (expert parallel 1, expert
/// tensor parallel = TP: `validate_args` in megatron/training/arguments.py, and
/// `initialize_model_parallel` when given None).
fn expert_sizes(plan: &PlanFile, cfg: &ParallelConfig) -> (u64, u64) {
    if plan.model.moe.is_some() {
        (cfg.ep, cfg.etp)
    } else {
        (1, cfg.tp)
    }
}

/// The rank orders Megatron-Core can build for this plan. `initialize_model_parallel`
/// (megatron/core/parallel_state.py, d98e8a6) asserts
/// `order.endswith("pp") or pipeline_model_parallel_size == 1 or
/// expert_data_parallel_size == data_parallel_size`, where the data-parallel size
/// is world / (TP x PP x CP) and the expert one world / (ETP x EP x PP): with PP > 1,
/// an order that puts PP before DP needs the two equal.
pub(crate) fn check_rank_order(plan: &PlanFile, cfg: &ParallelConfig) -> Result<(), Reason> {
    let order = plan.rank_order.as_str();
    if !sextant_planner::ranks::ORDERS.contains(&order) {
        return Err(format!(
            "rank order {} is not one Megatron-Core supports ({})",
            quote::double_quoted(order),
            sextant_planner::ranks::ORDERS.join(", ")
        )
        .into());
    }
    let (ep, etp) = expert_sizes(plan, cfg);
    let world = plan.gpus;
    let dp = world / (cfg.tp * cfg.pp * cfg.cp).max(1);
    let edp = world / (etp * ep * cfg.pp).max(1);
    if order.ends_with("pp") || cfg.pp == 1 || edp == dp {
        return Ok(());
    }
    Err(format!(
        "rank order {order} with pipeline parallel size {} needs the expert data-parallel size (world / (ETP {etp} x EP {ep} x PP {}) = {edp}) to equal the data-parallel size ({dp}): Megatron-Core's initialize_model_parallel asserts order.endswith(\"pp\") or pipeline_model_parallel_size == 1 or expert_data_parallel_size == data_parallel_size (megatron/core/parallel_state.py); set the plan's rank_order to the default tp-cp-ep-dp-pp",
        cfg.pp, cfg.pp
    ).into())
}

/// Why Megatron-LM's arguments cannot build `m` at all, whatever the plan.
pub fn model_refusal(m: &sextant_planner::model::ModelSpec) -> Option<String> {
    m.sandwich_norms.then(|| format!(
        "{} normalises after each attention and MLP block as well as before it (Gemma 2 and 3, GLM-4), which no Megatron-LM argument builds; use the framework's own model definition (e.g. Megatron-Bridge's) with the parallel sizes of `--to rank-map`",
        m.name
    ))
}

/// The gradient-bucket size, in parameters, Megatron-LM's DDP takes when none is
/// given: max(40M, 1M x the data-parallel group with context parallelism)
/// (megatron/training/training.py and core/distributed/distributed_data_parallel.py
/// at d98e8a6). Frameworks that pick their own (Megatron-Bridge's and NeMo's
/// communication-overlap setups: 128 Mi) are given this one.
pub(crate) fn ddp_bucket_size(cfg: &ParallelConfig) -> u64 {
    40_000_000u64.max(1_000_000 * cfg.dp * cfg.cp)
}

/// TransformerConfig.normalization (Megatron-LM `--normalization`), whose default
/// is LayerNorm.
pub(crate) fn norm_name(n: sextant_planner::model::Norm) -> &'static str {
    match n {
        sextant_planner::model::Norm::LayerNorm => "LayerNorm",
        sextant_planner::model::Norm::RmsNorm => "RMSNorm",
    }
}

/// A sliding-window model's `window_size` left edge (a window of W tokens is
/// W - 1 before the current one, none after) and `window_attn_skip_freq` (every
/// N-th layer full attention; `None` when every layer slides), as
/// TransformerConfig states them and Megatron-LM's `--window-size` /
/// `--window-attn-skip-freq` set them (arguments.py _add_network_size_args);
/// `Ok(None)` without a sliding window. A pattern that is no one-full-layer-in-N
/// cannot be stated.
pub(crate) fn sliding_window(
    m: &sextant_planner::model::ModelSpec,
) -> Result<Option<(u64, Option<u64>)>, Reason> {
    let Some(sw) = &m.sliding_window else {
        return Ok(None);
    };
    let full = m.layers.saturating_sub(sw.layers);
    if full > 0 && !m.layers.is_multiple_of(full) {
        return Err(Reason(format!(
            "{} uses a sliding window on {} of {} layers, which is no one-full-layer-in-N pattern Megatron can state (--window-attn-skip-freq, window_attn_skip_freq)",
            m.name, sw.layers, m.layers
        )));
    }
    Ok(Some((
        sw.window.saturating_sub(1),
        m.layers.checked_div(full),
    )))
}

/// `moe_layer_freq` as a per-layer list (1: MoE, 0: dense) when not every layer
/// is MoE (TransformerConfig.moe_layer_freq); `None` when every layer is.
fn moe_layer_pattern(m: &sextant_planner::model::ModelSpec) -> Option<Vec<&'static str>> {
    let moe = m.moe.as_ref()?;
    (moe.dense_leading_layers > 0 || moe.layer_freq > 1).then(|| {
        (0..m.layers)
            .map(|i| if m.is_moe_layer(i) { "1" } else { "0" })
            .collect()
    })
}

/// A Megatron-Core config value, written as a YAML or Hydra word or as Python.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Word(&'static str),
    Num(String),
    Bool(bool),
}

impl Value {
    pub(crate) fn yaml(&self) -> String {
        match self {
            Value::Word(w) => w.to_string(),
            Value::Num(n) => n.clone(),
            Value::Bool(b) => b.to_string(),
        }
    }

    pub(crate) fn python(&self) -> String {
        match self {
            Value::Word(w) => format!("\"{w}\""),
            Value::Num(n) => n.clone(),
            Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        }
    }
}

/// The MoE token path the plan priced, as Megatron-Core `TransformerConfig` fields
/// (megatron/core/transformer/transformer_config.py): the dispatcher
/// (`moe_token_dispatcher_type`, `moe_flex_dispatcher_backend`) and, when tokens
/// are dropped, the expert capacity (`moe_expert_capacity_factor`,
/// `moe_pad_expert_input_to_capacity`; absent: dropless). Empty for dense models.
pub(crate) fn moe_token_fields(
    plan: &PlanFile,
    cfg: &ParallelConfig,
) -> Vec<(&'static str, Value)> {
    let mut v = Vec::new();
    if plan.model.moe.is_none() {
        return v;
    }
    match cfg.moe_dispatcher {
        Dispatcher::AllToAll => v.push(("moe_token_dispatcher_type", Value::Word("alltoall"))),
        Dispatcher::Deduplicated => {
            v.push(("moe_token_dispatcher_type", Value::Word("flex")));
            v.push(("moe_flex_dispatcher_backend", Value::Word("deepep")));
        }
    }
    if let Some(c) = &plan.workload.moe_capacity {
        v.push((
            "moe_expert_capacity_factor",
            Value::Num(c.factor.to_string()),
        ));
        v.push(("moe_pad_expert_input_to_capacity", Value::Bool(c.pad)));
    }
    v
}

/// The loss the plan priced, as Megatron-Core's `ModelParallelConfig` fields
/// `cross_entropy_loss_fusion` and `cross_entropy_fusion_impl`
/// (megatron/core/model_parallel_config.py); torchtitan's compiled loss has none.
pub fn loss_fields(
    loss: LossKernel,
    target: Target,
) -> Result<(bool, Option<&'static str>), ExportError> {
    match loss {
        LossKernel::Native => Ok((true, Some("native"))),
        LossKernel::Te => Ok((true, Some("te"))),
        LossKernel::Unfused => Ok((false, None)),
        LossKernel::Compiled => Err(compiled_loss(target)),
    }
}

/// The refusal of a plan priced with torchtitan's compiled loss.
pub fn compiled_loss(target: Target) -> ExportError {
    ExportError::Inexpressible {
        target,
        reason: "the plan prices torchtitan's loss under torch.compile (--loss compiled), which Megatron-Core has no switch for; re-plan with --loss native or te".into(),
    }
}
