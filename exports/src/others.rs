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

use sextant_planner::config::{Layout, ParallelConfig, Recompute, RecomputeModules};
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

fn recompute_fields(cfg: &ParallelConfig) -> Vec<(&'static str, String)> {
    match cfg.recompute {
        Recompute::None => vec![],
        Recompute::Selective if cfg.recompute_modules != RecomputeModules::DEFAULT => {
            // No spaces: one Hydra override must stay one shell word.
            let names: Vec<String> = cfg
                .recompute_modules
                .names()
                .iter()
                .map(|n| format!("\"{n}\""))
                .collect();
            vec![
                ("recompute_granularity", "selective".into()),
                ("recompute_modules", format!("[{}]", names.join(","))),
            ]
        }
        Recompute::Selective => vec![("recompute_granularity", "selective".into())],
        Recompute::Full => vec![
            ("recompute_granularity", "full".into()),
            ("recompute_method", "uniform".into()),
            ("recompute_num_layers", "1".into()),
        ],
    }
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
