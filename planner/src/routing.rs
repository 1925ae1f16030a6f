//! MoE routing: how unevenly tokens reach the experts, what a capacity factor
//! caps and drops, and what that means for the busiest expert-parallel rank.
//!
//! The imbalance a user states (or the default below) is the busiest *expert's*
//! load over the mean, the quantity routing papers publish (`MaxVio + 1`). The
//! cost that matters is the busiest *rank's*: it holds `experts / ep` experts,
//! its grouped GEMMs process all their tokens and it receives all of them through
//! the all-to-all. The model for the rank: one expert at the stated load, the
//! other experts sharing the remaining tokens evenly. With a capacity factor
//! `C`, no expert processes more than `C` times the mean (the rest are dropped);
//! padding to capacity makes every expert process exactly `C` times the mean.

use serde::{Deserialize, Serialize};

use crate::model::Moe;

/// How the router keeps expert loads even.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balancing {
    /// An auxiliary load-balancing loss (GShard / Switch; Megatron's default
    /// `--moe-router-load-balancing-type aux_loss`).
    #[default]
    AuxLoss,
    /// Auxiliary-loss-free balancing: a per-expert bias on the routing scores,
    /// updated from recent loads (DeepSeek-V3; Megatron
    /// `--moe-router-enable-expert-bias`; Hugging Face `topk_method: noaux_tc`).
    LossFree,
}

/// Busiest expert's load over the mean (`MaxVio`) under auxiliary-loss balancing.
/// Source: Wang et al., "Auxiliary-Loss-Free Load Balancing Strategy for
/// Mixture-of-Experts" (arXiv:2408.15664), Table 2: `MaxVio_global` 0.52 for the
/// 3B DeepSeekMoE model with loss coefficient 0.001 (0.72 for the 1B model; the
/// larger model is taken as the nearer to production scale).
pub const AUX_LOSS_MAX_VIO: f64 = 0.52;

/// The same statistic under auxiliary-loss-free balancing: 0.04 for both the 1B
/// and the 3B model (same table).
pub const LOSS_FREE_MAX_VIO: f64 = 0.04;

/// Default busiest-expert load over the mean for a model's routing.
///
/// The published figures are over a whole validation set (`MaxVio_global`); the
/// same paper's per-batch figures (its Figure 3) are higher, so this is the
/// optimistic end for one micro-batch. State `--moe-imbalance` when the run's own
/// router logs say otherwise.
pub fn default_imbalance(moe: &Moe) -> f64 {
    1.0 + match moe.balancing {
        Balancing::AuxLoss => AUX_LOSS_MAX_VIO,
        Balancing::LossFree => LOSS_FREE_MAX_VIO,
    }
}

/// Where a capacity factor is set, and what happens to tokens over it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// Tokens an expert may take, as a multiple of the mean (Megatron
    /// `--moe-expert-capacity-factor`).
    pub factor: f64,
    /// Every expert's input is padded to its capacity (Megatron
    /// `--moe-pad-expert-input-to-capacity`): fixed shapes, more work.
    #[serde(default)]
    pub pad: bool,
}

/// Largest capacity factor accepted (a factor above the number of experts over
/// top-k cannot bind).
pub const MAX_CAPACITY_FACTOR: f64 = 64.0;

/// Smallest capacity factor accepted: below it each expert keeps under 1% of its
/// share of the tokens, and the step trains almost nothing (1e-320 was priced
/// and exported as a 322-digit literal).
pub const MIN_CAPACITY_FACTOR: f64 = 0.01;

impl Capacity {
    pub fn validate(&self) -> Result<(), crate::config::WorkloadError> {
        if !(self.factor.is_finite()
            && self.factor >= MIN_CAPACITY_FACTOR
            && self.factor <= MAX_CAPACITY_FACTOR)
        {
            return Err(crate::config::WorkloadError::CapacityFactor(self.factor));
        }
        Ok(())
    }
}

/// What routing costs the busiest expert-parallel rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankLoad {
    /// Tokens the busiest rank's experts process, over the balanced share. Scales
    /// its expert GEMMs, their activations and the all-to-all it receives.
    pub factor: f64,
    /// Fraction of the routed token copies dropped by the capacity (0 dropless).
    pub dropped: f64,
}

/// The largest load one expert can carry: every token routes to it, once.
pub fn max_imbalance(moe: &Moe) -> f64 {
    moe.experts as f64 / moe.top_k.max(1) as f64
}

/// Load on the busiest of `ep` expert-parallel ranks.
pub fn rank_load(moe: &Moe, ep: u64, imbalance: f64, capacity: Option<Capacity>) -> RankLoad {
    let experts = moe.experts.max(1) as f64;
    let local = (moe.experts / ep.max(1)).max(1) as f64;
    let hot = imbalance.clamp(1.0, max_imbalance(moe).max(1.0));
    // The other experts share what the hot one leaves.
    let rest = if experts > 1.0 {
        ((experts - hot) / (experts - 1.0)).max(0.0)
    } else {
        0.0
    };
    match capacity {
        None => RankLoad {
            factor: (hot + (local - 1.0) * rest) / local,
            dropped: 0.0,
        },
        Some(c) => {
            let dropped = ((hot - c.factor).max(0.0)
                + (experts - 1.0) * (rest - c.factor).max(0.0))
                / experts;
            let factor = if c.pad {
                c.factor
            } else {
                (hot.min(c.factor) + (local - 1.0) * rest.min(c.factor)) / local
            };
            RankLoad { factor, dropped }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moe(experts: u64, top_k: u64) -> Moe {
        Moe {
            experts,
            top_k,
            expert_ffn_hidden: 1024,
            shared_experts: 0,
            shared_ffn_hidden: None,
            dense_leading_layers: 0,
            layer_freq: 1,
            balancing: Balancing::AuxLoss,
        }
    }

    #[test]
    fn balanced_routing_costs_nothing_extra() {
        for ep in [1, 2, 8, 64] {
            let r = rank_load(&moe(64, 4), ep, 1.0, None);
            assert!(
                (r.factor - 1.0).abs() < 1e-12 && r.dropped == 0.0,
                "ep {ep}: {r:?}"
            );
        }
    }

    #[test]
    fn one_expert_per_rank_carries_the_whole_imbalance() {
        let r = rank_load(&moe(64, 4), 64, 1.52, None);
        assert!((r.factor - 1.52).abs() < 1e-12);
        // Sixteen experts per rank: the hot expert is diluted by fifteen others
        // that are slightly below the mean.
        let r16 = rank_load(&moe(64, 4), 4, 1.52, None);
        let rest = (64.0 - 1.52) / 63.0;
        assert!((r16.factor - (1.52 + 15.0 * rest) / 16.0).abs() < 1e-12);
        assert!(r16.factor > 1.0 && r16.factor < 1.04, "{r16:?}");
        // With every expert on one rank the load is exactly the mean.
        assert!((rank_load(&moe(64, 4), 1, 1.52, None).factor - 1.0).abs() < 1e-12);
    }

    #[test]
    fn capacity_caps_and_drops() {
        let m = moe(64, 4);
        let c = Capacity {
            factor: 1.25,
            pad: false,
        };
        let r = rank_load(&m, 64, 1.52, Some(c));
        assert!((r.factor - 1.25).abs() < 1e-12);
        // The hot expert drops 0.27 of a mean load out of 64 loads.
        assert!((r.dropped - 0.27 / 64.0).abs() < 1e-12, "{r:?}");
        // A capacity above the load drops nothing and costs nothing.
        let loose = rank_load(
            &m,
            64,
            1.52,
            Some(Capacity {
                factor: 2.0,
                pad: false,
            }),
        );
        assert_eq!(loose, rank_load(&m, 64, 1.52, None));
        // Padding makes every expert do the full capacity, even when balanced.
        let padded = rank_load(
            &m,
            8,
            1.0,
            Some(Capacity {
                factor: 1.25,
                pad: true,
            }),
        );
        assert!((padded.factor - 1.25).abs() < 1e-12 && padded.dropped == 0.0);
        // A capacity below the mean drops from every expert.
        let tight = rank_load(
            &m,
            8,
            1.0,
            Some(Capacity {
                factor: 0.5,
                pad: false,
            }),
        );
        assert!((tight.dropped - 0.5).abs() < 1e-12 && (tight.factor - 0.5).abs() < 1e-12);
    }

    #[test]
    fn imbalance_is_capped_at_every_token_on_one_expert() {
        let m = moe(8, 2);
        assert_eq!(max_imbalance(&m), 4.0);
        assert_eq!(rank_load(&m, 8, 50.0, None), rank_load(&m, 8, 4.0, None));
    }

    #[test]
    fn defaults_come_from_the_balancing_method() {
        let mut m = moe(256, 8);
        assert!((default_imbalance(&m) - 1.52).abs() < 1e-12);
        m.balancing = Balancing::LossFree;
        assert!((default_imbalance(&m) - 1.04).abs() < 1e-12);
    }
}
