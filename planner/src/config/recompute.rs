//! Activation recomputation: none, selective (the modules of Megatron's
//! `--recompute-modules`) or full, and Megatron-Core's rules for the module set.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{ParallelConfig, Rejection};
use crate::model::ModelSpec;

/// Activation recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    None,
    /// Recompute only core attention (Korthikanti et al. 2022, section 5).
    Selective,
    /// Store only each layer's input and recompute the layer in backward.
    Full,
}

impl fmt::Display for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Recompute::None => "none",
            Recompute::Selective => "sel",
            Recompute::Full => "full",
        })
    }
}

/// Megatron-Core's `--recompute-modules`: the parts of each layer that selective
/// recomputation discards after the forward and replays in the backward
/// (`TransformerConfig.recompute_modules`, used with `--recompute-granularity
/// selective`; its default is core attention alone). A set, kept as bits so that
/// a configuration stays `Copy`-cheap and hashable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecomputeModules(u8);

impl RecomputeModules {
    /// Core attention (the softmax over the score matrix; nothing to save with a
    /// fused flash kernel).
    pub const CORE_ATTN: RecomputeModules = RecomputeModules(1);
    /// The input and pre-MLP norms: their outputs are not stored.
    pub const LAYERNORM: RecomputeModules = RecomputeModules(2);
    /// MLA's up-projections and rotary: Q, K and V are not stored.
    pub const MLA_UP_PROJ: RecomputeModules = RecomputeModules(4);
    /// The dense MLP of non-MoE layers: only its input is stored.
    pub const MLP: RecomputeModules = RecomputeModules(8);
    /// The routed experts' activation function: its output is not stored.
    pub const MOE_ACT: RecomputeModules = RecomputeModules(16);
    /// The shared experts: only their input is stored.
    pub const SHARED_EXPERTS: RecomputeModules = RecomputeModules(32);
    /// The whole MoE block (router, dispatch, experts, combine): only its input is
    /// stored, and the forward all-to-alls run again.
    pub const MOE: RecomputeModules = RecomputeModules(64);
    /// Megatron's default set.
    pub const DEFAULT: RecomputeModules = RecomputeModules::CORE_ATTN;
    /// Names in Megatron's spelling, in its documentation order.
    pub const NAMES: [(&'static str, RecomputeModules); 7] = [
        ("core_attn", RecomputeModules::CORE_ATTN),
        ("moe_act", RecomputeModules::MOE_ACT),
        ("layernorm", RecomputeModules::LAYERNORM),
        ("mla_up_proj", RecomputeModules::MLA_UP_PROJ),
        ("mlp", RecomputeModules::MLP),
        ("moe", RecomputeModules::MOE),
        ("shared_experts", RecomputeModules::SHARED_EXPERTS),
    ];

    pub fn contains(self, m: RecomputeModules) -> bool {
        self.0 & m.0 == m.0 && m.0 != 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub fn union(self, m: RecomputeModules) -> RecomputeModules {
        RecomputeModules(self.0 | m.0)
    }
    /// The members' names in Megatron's spelling.
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES
            .iter()
            .filter(|(_, m)| self.contains(*m))
            .map(|(n, _)| *n)
            .collect()
    }
    /// Whether every module has something to replay in `model` (see
    /// [`ParallelConfig::check_recompute_modules`]); the error says which does not.
    pub fn check_for(self, model: &ModelSpec) -> Result<(), RecomputeModulesError> {
        let m = self;
        if m.contains(RecomputeModules::MLA_UP_PROJ) && model.mla.is_none() {
            return Err(RecomputeModulesError::NoMla);
        }
        let moe = model.moe.as_ref();
        for (name, bit) in [
            ("moe_act", RecomputeModules::MOE_ACT),
            ("moe", RecomputeModules::MOE),
        ] {
            if m.contains(bit) && moe.is_none() {
                return Err(RecomputeModulesError::Dense(name));
            }
        }
        if m.contains(RecomputeModules::SHARED_EXPERTS)
            && moe.is_none_or(|x| x.shared_hidden() == 0)
        {
            return Err(RecomputeModulesError::NoSharedExperts);
        }
        if m.contains(RecomputeModules::MLP) && model.moe_layers() == model.layers {
            return Err(RecomputeModulesError::NoDenseMlp);
        }
        Ok(())
    }

    /// Parses a comma-separated list of Megatron module names.
    pub fn parse(s: &str) -> Result<RecomputeModules, RecomputeModulesError> {
        let mut set = RecomputeModules(0);
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match Self::NAMES.iter().find(|(n, _)| *n == name) {
                Some((_, m)) => set = set.union(*m),
                None => {
                    return Err(RecomputeModulesError::Unknown(name.to_string()));
                }
            }
        }
        if set.is_empty() {
            return Err(RecomputeModulesError::Empty);
        }
        Ok(set)
    }
}

/// A recompute module list that cannot be read, or names a module with nothing
/// to replay in the model ([`RecomputeModules::parse`], [`RecomputeModules::check_for`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecomputeModulesError {
    #[error(
        "unknown recompute module '{0}': use a comma-separated list of {names}",
        names = module_names()
    )]
    Unknown(String),
    #[error("no recompute module given: name at least one (Megatron's default is core_attn)")]
    Empty,
    #[error("mla_up_proj needs multi-latent attention (this model has none)")]
    NoMla,
    /// `moe_act` or `moe` on a dense model.
    #[error("{0} needs an MoE model (this one is dense)")]
    Dense(&'static str),
    #[error("shared_experts needs a model with shared experts")]
    NoSharedExperts,
    #[error(
        "mlp recomputes dense MLPs only, and every layer of this model is MoE (use moe or moe_act)"
    )]
    NoDenseMlp,
}

fn module_names() -> String {
    let all: Vec<&str> = RecomputeModules::NAMES.iter().map(|(n, _)| *n).collect();
    all.join(", ")
}

impl Default for RecomputeModules {
    fn default() -> Self {
        RecomputeModules::DEFAULT
    }
}

impl fmt::Display for RecomputeModules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names().join(","))
    }
}

impl Serialize for RecomputeModules {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(s)
    }
}

impl<'de> Deserialize<'de> for RecomputeModules {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        RecomputeModules::parse(&names.join(",")).map_err(serde::de::Error::custom)
    }
}

impl ParallelConfig {
    /// Megatron-Core's rules for `recompute_modules` (`TransformerConfig.__post_init__`):
    /// a set other than the default only with selective recomputation;
    /// `mla_up_proj` only with MLA; `moe_act` only with (grouped-GEMM) experts.
    /// Modules that would replay nothing in this model (`moe`, `shared_experts`,
    /// `mlp` with no part to act on) are refused too, so that a plan never names a
    /// saving it does not get.
    pub fn check_recompute_modules(&self, model: &ModelSpec) -> Result<(), Rejection> {
        let m = self.recompute_modules;
        let fail = |detail: String| Err(Rejection::RecomputeModules { detail });
        if self.recompute != Recompute::Selective {
            if m != RecomputeModules::DEFAULT {
                return fail(format!(
                    "{m} needs selective recomputation (the recompute setting is {})",
                    self.recompute
                ));
            }
            return Ok(());
        }
        m.check_for(model).map_err(|e| Rejection::RecomputeModules {
            detail: e.to_string(),
        })
    }

    /// The recomputation in one short word for tables: none, sel, full, or
    /// sel:MODULES when selective recomputation replays other than Megatron's default.
    pub fn recompute_label(&self) -> String {
        match self.recompute {
            Recompute::Selective if self.recompute_modules != RecomputeModules::DEFAULT => {
                format!("sel:{}", self.recompute_modules)
            }
            r => r.to_string(),
        }
    }

    /// Whether selective recomputation replays module `m`.
    pub fn recomputes(&self, m: RecomputeModules) -> bool {
        self.recompute == Recompute::Selective && self.recompute_modules.contains(m)
    }
}
