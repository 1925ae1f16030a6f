//! Megatron-Bridge / NeMo 2.0, verl, RLinf and torchtitan.
//!
//! Every key below names the file of the framework that defines it. Versions read:
//! Megatron-Bridge 0.7.0, NeMo 2.0 (2025-09), verl 0.8.0.dev, RLinf 0.4.0,
//! torchtitan v0.2.2 ([`TORCHTITAN_VERSION`]: its last TOML-configured release;
//! commit 9810191 of 2026-02-23 replaced TOML with Python config).
//!
//! One module per framework (`bridge`, `nemo`, `rl`: verl and RLinf, `torchtitan`);
//! the helpers they share are here.

mod bridge;
mod nemo;
mod rl;
mod torchtitan;

use sextant_planner::config::{Layout, ParallelConfig, Recompute};
use sextant_planner::plan::PlanFile;

use crate::megatron::pipeline_layout;
use crate::quote;
use crate::{ExportError, Reason, Target};

pub use bridge::megatron_bridge;
pub use nemo::nemo;
pub use rl::{rlinf, verl};
pub use torchtitan::torchtitan;

/// The torchtitan release whose TOML job config the torchtitan export writes: the
/// last before "Config System Refactor: TOML to Python Dataclass Registry"
/// (pytorch/torchtitan#2386, commit 9810191bb, 2026-02-23).
pub const TORCHTITAN_VERSION: &str =
    "torchtitan v0.2.2 (2026-02-20, commit 73a0e6979dd1), the last release configured by TOML";

/// A stage layout in words, for refusals: `Layout`'s own form is Rust syntax.
fn describe_layout(plan: &PlanFile, cfg: &ParallelConfig) -> String {
    match &cfg.layout {
        Layout::Even => "equal stages".into(),
        Layout::AccountEmbeddingLoss => "stages that count the embedding and loss as layers".into(),
        Layout::FirstLast { first, last } => {
            format!("{first} layers on the first stage and {last} on the last")
        }
        Layout::Explicit { .. } => match pipeline_layout(plan, cfg) {
            Ok(l) => format!("the explicit layout \"{l}\""),
            Err(_) => "an explicit per-stage layout".into(),
        },
    }
}

fn cannot(target: Target, reason: impl Into<String>) -> ExportError {
    ExportError::Inexpressible {
        target,
        reason: reason.into(),
    }
}

///
/// Every field is stated, those the plan does not use as `null`: these exports
/// are overlays on a recipe or a framework's defaults, and a recipe that
/// recomputes (NeMo's and Megatron-Bridge's Qwen3 and DeepSeek-V3 recipes, RLinf's
/// Qwen3 example: full, uniform, one layer) would otherwise keep its method and
/// layer count under a selective or no-recomputation plan, which Megatron-Core
/// refuses or runs as full recomputation. Selective recomputation names its
/// modules even when they are Megatron's default.
fn recompute_fields(cfg: &ParallelConfig) -> Vec<(&'static str, String)> {
    let null = || "null".to_string();
    match cfg.recompute {
        Recompute::None => vec![
            ("recompute_granularity", null()),
            ("recompute_method", null()),
            ("recompute_num_layers", null()),
        ],
        Recompute::Selective => {
            // No spaces: one Hydra override must stay one shell word.
            let names: Vec<String> = cfg
                .recompute_modules
                .names()
                .iter()
                .map(|n| format!("\"{n}\""))
                .collect();
            vec![
                ("recompute_granularity", "selective".into()),
                ("recompute_method", null()),
                ("recompute_num_layers", null()),
                ("recompute_modules", format!("[{}]", names.join(","))),
            ]
        }
        Recompute::Full => vec![
            ("recompute_granularity", "full".into()),
            ("recompute_method", "uniform".into()),
            ("recompute_num_layers", "1".into()),
        ],
    }
}

/// [`layout_fields`] for an overlay on a recipe: every stage-layout field, those
/// the plan does not use cleared (`null`, or `false` for the two flags).
fn overlay_layout_fields(
    plan: &PlanFile,
    cfg: &ParallelConfig,
) -> Result<Vec<(&'static str, String)>, Reason> {
    let set = layout_fields(plan, cfg)?;
    let all = [
        ("pipeline_model_parallel_layout", "null"),
        ("num_layers_in_first_pipeline_stage", "null"),
        ("num_layers_in_last_pipeline_stage", "null"),
        ("account_for_embedding_in_pipeline_split", "false"),
        ("account_for_loss_in_pipeline_split", "false"),
    ];
    Ok(all
        .iter()
        .map(|&(k, cleared)| {
            let v = set
                .iter()
                .find(|(s, _)| *s == k)
                .map_or_else(|| cleared.to_string(), |(_, v)| v.clone());
            (k, v)
        })
        .collect())
}

/// Megatron-Core TransformerConfig fields that state the stage layout
/// (megatron/core/transformer/transformer_config.py).
fn layout_fields(
    plan: &PlanFile,
    cfg: &ParallelConfig,
) -> Result<Vec<(&'static str, String)>, Reason> {
    Ok(match &cfg.layout {
        Layout::Even => vec![],
        Layout::AccountEmbeddingLoss => vec![
            ("account_for_embedding_in_pipeline_split", "true".into()),
            ("account_for_loss_in_pipeline_split", "true".into()),
        ],
        Layout::FirstLast { first, last } => vec![
            ("num_layers_in_first_pipeline_stage", first.to_string()),
            ("num_layers_in_last_pipeline_stage", last.to_string()),
        ],
        Layout::Explicit { .. } => vec![(
            "pipeline_model_parallel_layout",
            quote::double_quoted(&pipeline_layout(plan, cfg)?),
        )],
    })
}

/// TransformerConfig.mtp_num_layers: stated even when 0 (as null), because
/// recipes such as Megatron-Bridge's DeepSeek-V3 switch MTP on by default.
fn mtp_value(plan: &PlanFile) -> String {
    match plan.model.mtp_layers {
        0 => "null".into(),
        n => n.to_string(),
    }
}

fn vpp_value(cfg: &ParallelConfig) -> String {
    if cfg.vpp > 1 {
        cfg.vpp.to_string()
    } else {
        "null".into()
    }
}
