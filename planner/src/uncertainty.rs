//! Error bands: how far a prediction may be from a measurement, judged by how the
//! cost model did on comparable measured runs.
//!
//! `hwprofiles/validation.json` holds the signed relative error of every published
//! run (`tests/data/published_runs.csv`) under the current cost model. It is
//! written by the published-runs test (`SEXTANT_BLESS=1`) and that test fails when
//! it is stale, so the band always describes this model. A prediction's band uses
//! the errors of runs on the same hardware profile and of the same kind (dense or
//! MoE); with fewer than [`MIN_SAMPLES`] of those, runs of the same kind on any
//! hardware; then all runs, widened to cover every error seen on runs of the same
//! kind.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

pub use crate::cost::band::{Attribution, Band};
use crate::cost::Framework;

/// Fewest comparable runs a band is drawn from.
pub const MIN_SAMPLES: usize = 5;

/// The probability a band claims: its ends sit at the 10th and 90th percentile
/// ranks of the comparable errors, (n + 1) q. A band widened to cover a kind's
/// own errors (too few runs of that kind for a pool) claims this for the pool it
/// was drawn from, not for the kind.
pub const COVERAGE: f64 = 0.8;

/// One validated run: predicted / measured - 1, and how its predicted step time
/// divided among the terms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorSample {
    pub id: String,
    pub profile: String,
    pub moe: bool,
    pub rel_error: f64,
    #[serde(default)]
    pub shares: Option<Shares>,
    /// Where the run sits on the axes of the validated region ([`crate::reach`]).
    #[serde(default)]
    pub reach: Option<crate::reach::Reach>,
    /// The framework the run trained with; its band pools are its own.
    #[serde(default, skip_serializing_if = "Framework::is_megatron_core")]
    pub framework: Framework,
}

/// Fractions of a predicted step time, summing to 1.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Shares {
    /// Forward, backward and recomputed compute, with the overlap slowdown.
    pub compute: f64,
    /// Communication not hidden behind compute.
    pub communication: f64,
    /// Pipeline fill and drain.
    pub bubble: f64,
    /// Optimizer step.
    pub optimizer: f64,
}

impl Shares {
    pub const TERMS: [&'static str; 4] = ["compute", "communication", "bubble", "optimizer"];

    pub fn of(e: &crate::cost::Estimate) -> Shares {
        let t = &e.time;
        let parts = [
            t.compute.total() + t.recompute + t.overlap_slowdown + t.host_wait,
            t.exposed_comm,
            t.bubble,
            t.optimizer,
        ];
        let sum: f64 = parts.iter().sum();
        // Zero or NaN: nothing to share out.
        if sum.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return Shares::default();
        }
        Shares {
            compute: parts[0] / sum,
            communication: parts[1] / sum,
            bubble: parts[2] / sum,
            optimizer: parts[3] / sum,
        }
    }

    fn array(&self) -> [f64; 4] {
        [
            self.compute,
            self.communication,
            self.bubble,
            self.optimizer,
        ]
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationSet {
    pub schema_version: u32,
    /// What produced the errors.
    pub source: String,
    pub samples: Vec<ErrorSample>,
    /// How fast the error drifts along each axis outside the validated region,
    /// measured on published sweeps ([`crate::reach::axis_rates`]).
    #[serde(default)]
    pub rates: Vec<crate::reach::AxisRate>,
}

/// The compiled-in validation set.
pub fn validation() -> &'static ValidationSet {
    static SET: OnceLock<ValidationSet> = OnceLock::new();
    SET.get_or_init(|| {
        serde_json::from_str(include_str!("../../hwprofiles/validation.json"))
            .expect("compiled-in validation.json parses")
    })
}

/// The compiled-in errors of the published RL iterations
/// (hwprofiles/validation_rl.json, written by tests/it/rl.rs): each run's
/// iteration predicted by `rl-plan`'s model from its stated configuration.
pub fn rl_validation() -> &'static ValidationSet {
    static SET: OnceLock<ValidationSet> = OnceLock::new();
    SET.get_or_init(|| {
        serde_json::from_str(include_str!("../../hwprofiles/validation_rl.json"))
            .expect("compiled-in validation_rl.json parses")
    })
}

/// The band of an RL iteration of `step_secs`, from the published RL runs'
/// errors by the same pooling and ranks as a training step's ([`band_from`]).
/// With five runs it spans them all and claims 4/6; every run on record took
/// longer than predicted, so the band lies above the point.
pub fn rl_band(profile: &str, moe: bool, step_secs: f64) -> Option<Band> {
    band_from(
        rl_validation(),
        profile,
        moe,
        Framework::MegatronCore,
        step_secs,
    )
}

/// Rank (1-based) of a prediction interval's end at probability `q` among `n`
/// sorted errors: (n + 1) q, held to 1..n. If the runs' errors are exchangeable
/// with a new run's, the interval between ranks r_lo and r_hi holds the new run's
/// error with probability (r_hi - r_lo) / (n + 1) (exactly at whole ranks). The
/// plain sample quantile, at rank 1 + (n - 1) q, draws narrower bands that hold
/// less often than they claim: 0.71 of the time for 16 runs at 80%.
fn rank(n: usize, q: f64) -> f64 {
    ((n + 1) as f64 * q).clamp(1.0, n as f64)
}

/// The sorted values at a fractional 1-based rank, interpolated between neighbours.
fn at_rank(sorted: &[f64], r: f64) -> f64 {
    let (lo, hi) = (r.floor() as usize - 1, r.ceil() as usize - 1);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (r - r.floor())
}

/// The band around `step_secs` that holds the measured time with probability
/// [`COVERAGE`] (less where too few runs allow it; [`Band::coverage`] says).
pub fn band(profile: &str, moe: bool, framework: Framework, step_secs: f64) -> Option<Band> {
    band_from(validation(), profile, moe, framework, step_secs)
}

/// The band of a plan on `profile` of kind `moe` trained with `framework`, from
/// the pools of `set` closest to it with enough runs: the same profile, kind and
/// framework; the same kind and framework on all hardware; every run of the
/// framework (every run, for a framework with none). A framework is never pooled
/// with another's runs: torchtitan's measured runs are 10-58% slower than the
/// model, Megatron-Core's within a few percent, and a torchtitan plan must not
/// borrow Megatron-Core's band, nor a Megatron-Core MoE plan nanotron's errors.
pub fn band_from(
    set: &ValidationSet,
    profile: &str,
    moe: bool,
    framework: Framework,
    step_secs: f64,
) -> Option<Band> {
    let kind = if moe { "MoE" } else { "dense" };
    let fw = match framework {
        Framework::MegatronCore => String::new(),
        f => format!(" {}", f.name()),
    };
    // Pools from the closest to the widest: same profile and kind, same kind, all
    // (of this framework, where it has runs).
    let fw_known = set.samples.iter().any(|s| s.framework == framework);
    let labels = [
        format!("{profile} {kind}{fw}"),
        format!("{kind}{fw} (all hardware)"),
        if fw_known {
            format!("published{fw}")
        } else {
            // A framework no published run used: every framework's runs, whose
            // spread is what moving to an unmeasured framework has cost.
            format!("published (every framework; none with{fw})")
        },
    ];
    for (level, label) in labels.into_iter().enumerate() {
        let keep = |s: &ErrorSample| match level {
            0 => s.profile == profile && s.moe == moe && s.framework == framework,
            1 => s.moe == moe && s.framework == framework,
            _ => !fw_known || s.framework == framework,
        };
        let mut errs: Vec<f64> = set
            .samples
            .iter()
            .filter(|s| keep(s))
            .map(|s| s.rel_error)
            .collect();
        if errs.len() < MIN_SAMPLES {
            continue;
        }
        errs.sort_by(f64::total_cmp);
        let tail = (1.0 - COVERAGE) / 2.0;
        let n = errs.len();
        let (r_lo, r_hi) = (rank(n, tail), rank(n, 1.0 - tail));
        let mut coverage = (r_hi - r_lo) / (n + 1) as f64;
        let (mut q10, mut q90) = (at_rank(&errs, r_lo), at_rank(&errs, r_hi));
        let mut basis = format!("{} {label} runs", errs.len());
        // Too few runs of this profile (or kind) for a pool of their own: the band
        // still covers every error seen on that kind (with this framework, where
        // it has runs), so that hardware the model was never checked on does not
        // borrow a narrower band than the hardware it was checked on (nor one kind
        // the other kind's narrower errors).
        // A framework with no runs takes the pooled quantiles of every framework's
        // runs as they are: widened to their whole range it would answer for the
        // worst corner of another framework's runs (nanotron's cross-node TP 32).
        if level >= 1 && fw_known {
            let of_kind = |s: &&ErrorSample| s.moe == moe;
            let same_fw = set
                .samples
                .iter()
                .filter(of_kind)
                .any(|s| s.framework == framework);
            let own: Vec<f64> = set
                .samples
                .iter()
                .filter(of_kind)
                .filter(|s| !same_fw || s.framework == framework)
                .map(|s| s.rel_error)
                .collect();
            if let (Some(lo), Some(hi)) = (
                own.iter().copied().reduce(f64::min),
                own.iter().copied().reduce(f64::max),
            ) {
                if lo < q10 || hi > q90 {
                    // The range of m exchangeable errors holds the next one with
                    // probability (m - 1) / (m + 1): what the widened band claims,
                    // no longer the 80% of the quantiles it replaced.
                    let m = own.len() as f64;
                    coverage = coverage.max((m - 1.0) / (m + 1.0));
                    basis = if own.len() == errs.len() {
                        format!("{basis}, spanning all their errors")
                    } else {
                        format!(
                            "{basis}, widened to the errors of the {} {kind} runs",
                            own.len()
                        )
                    };
                }
                (q10, q90) = (q10.min(lo), q90.max(hi));
            }
        }
        // measured = predicted / (1 + error).
        return Some(Band {
            coverage,
            low_secs: step_secs / (1.0 + q90),
            high_secs: step_secs / (1.0 + q10),
            basis,
            samples: errs.len(),
            attribution: None,
            outside: Vec::new(),
        });
    }
    None
}

/// Non-negative least squares of `y ~ sum_t x_t v_t` by cyclic coordinate descent
/// (few terms, so exact enough after a few hundred sweeps).
fn nnls(rows: &[([f64; 4], f64)]) -> [f64; 4] {
    let mut v = [0.0f64; 4];
    for _ in 0..500 {
        for t in 0..4 {
            let (mut num, mut den) = (0.0, 0.0);
            for (x, y) in rows {
                let others: f64 = (0..4).filter(|&u| u != t).map(|u| x[u] * v[u]).sum();
                num += x[t] * (y - others);
                den += x[t] * x[t];
            }
            v[t] = if den > 0.0 { (num / den).max(0.0) } else { 0.0 };
        }
    }
    v
}

/// Fewest runs of one kind (dense or MoE) that the term fit uses on their own;
/// with fewer, it uses every run.
pub const MIN_FIT_SAMPLES: usize = 12;

/// Per-term relative sigmas fitted on the runs of `set` of the same kind as `moe`
/// (or all runs, with fewer than [`MIN_FIT_SAMPLES`]): each run's squared error
/// against its squared term shares. `None` without shares in the set.
pub fn term_sigmas(set: &ValidationSet, moe: bool) -> Option<[f64; 4]> {
    let same = set
        .samples
        .iter()
        .filter(|s| s.moe == moe && s.shares.is_some())
        .count();
    let rows: Vec<([f64; 4], f64)> = set
        .samples
        .iter()
        .filter(|s| same < MIN_FIT_SAMPLES || s.moe == moe)
        .filter_map(|s| {
            s.shares
                .map(|sh| (sh.array().map(|x| x * x), s.rel_error * s.rel_error))
        })
        .collect();
    if rows.len() < MIN_SAMPLES {
        return None;
    }
    Some(nnls(&rows).map(f64::sqrt))
}

/// Which term dominates the uncertainty of a prediction with `shares`.
pub fn attribute(set: &ValidationSet, shares: &Shares, moe: bool) -> Option<Attribution> {
    attribute_with(term_sigmas(set, moe)?, shares)
}

fn attribute_with(sig: [f64; 4], shares: &Shares) -> Option<Attribution> {
    let var: Vec<f64> = shares
        .array()
        .iter()
        .zip(sig)
        .map(|(s, g)| (s * g).powi(2))
        .collect();
    let total: f64 = var.iter().sum();
    if total.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    let mut variance_shares: Vec<(String, f64)> = Shares::TERMS
        .iter()
        .zip(&var)
        .map(|(t, v)| (t.to_string(), v / total))
        .collect();
    variance_shares.sort_by(|a, b| b.1.total_cmp(&a.1));
    Some(Attribution {
        dominant: variance_shares[0].0.clone(),
        variance_shares,
        term_sigmas: Shares::TERMS
            .iter()
            .zip(sig)
            .map(|(t, g)| (t.to_string(), g))
            .collect(),
    })
}

/// The attribution of an estimate's uncertainty, from the compiled-in validation set.
pub fn attribution_of(e: &crate::cost::Estimate, moe: bool) -> Option<Attribution> {
    // The fit depends only on the compiled-in set: once per kind.
    static SIGMAS: OnceLock<[Option<[f64; 4]>; 2]> = OnceLock::new();
    let sig = SIGMAS.get_or_init(|| {
        [
            term_sigmas(validation(), false),
            term_sigmas(validation(), true),
        ]
    })[usize::from(moe)]?;
    attribute_with(sig, &Shares::of(e))
}

/// The band of an estimate, widened where its configuration is outside the
/// validated runs ([`crate::reach`]), with the dominant term named.
pub fn band_for(
    cluster: &crate::hardware::Cluster,
    cfg: &crate::config::ParallelConfig,
    moe: bool,
    framework: crate::cost::Framework,
    e: &crate::cost::Estimate,
) -> Option<Band> {
    use crate::reach::{grad_reductions, RankBy, Ranker, Reach};
    let ranker = Ranker::builtin(&cluster.profile.name, moe, framework, RankBy::Upper);
    let reductions = grad_reductions(moe, cfg, e.micro_batches, framework);
    let mut b = ranker.band(
        e.step_secs,
        &Reach::of(cluster, cfg, reductions, e.memory.total),
    )?;
    b.attribution = attribution_of(e, moe);
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(profile: &str, moe: bool, e: f64) -> ErrorSample {
        ErrorSample {
            id: "x".into(),
            profile: profile.into(),
            moe,
            rel_error: e,
            shares: None,
            reach: None,
            framework: Framework::MegatronCore,
        }
    }

    #[test]
    fn attribution_recovers_the_noisy_term() {
        // Errors made by communication alone (sigma 0.3), compute exact.
        let samples: Vec<ErrorSample> = (0..12)
            .map(|i| {
                let comm = 0.05 * (i % 6) as f64;
                let sh = Shares {
                    compute: 1.0 - comm - 0.05,
                    communication: comm,
                    bubble: 0.05,
                    optimizer: 0.0,
                };
                let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
                ErrorSample {
                    shares: Some(sh),
                    ..sample("h100-sxm", false, sign * 0.3 * comm)
                }
            })
            .collect();
        let set = ValidationSet {
            schema_version: 1,
            source: "test".into(),
            samples,
            rates: Vec::new(),
        };
        let sig = term_sigmas(&set, false).unwrap();
        assert!((sig[1] - 0.3).abs() < 1e-3 && sig[0] < 1e-3, "{sig:?}");
        let a = attribute(
            &set,
            &Shares {
                compute: 0.6,
                communication: 0.3,
                bubble: 0.1,
                optimizer: 0.0,
            },
            false,
        )
        .unwrap();
        assert_eq!(a.dominant, "communication");
        let total: f64 = a.variance_shares.iter().map(|x| x.1).sum();
        assert!((total - 1.0).abs() < 1e-9);
    }

    #[test]
    fn band_uses_the_closest_pool_with_enough_runs() {
        let mut samples: Vec<ErrorSample> = (0..11)
            .map(|i| sample("a100-80g", false, -0.05 + 0.01 * i as f64))
            .collect();
        samples.push(sample("h100-sxm", true, 0.5));
        let set = ValidationSet {
            schema_version: 1,
            source: "test".into(),
            samples,
            rates: Vec::new(),
        };
        let b = band_from(&set, "a100-80g", false, Framework::MegatronCore, 10.0).unwrap();
        assert_eq!(b.samples, 11);
        // Eleven runs: the ends sit at ranks 12 x 0.1 = 1.2 and 12 x 0.9 = 10.8 of
        // -0.05, -0.04, ..., 0.05, i.e. -0.048 and 0.048, and claim (10.8 - 1.2) / 12.
        assert!(
            (b.low_secs - 10.0 / 1.048).abs() < 1e-9 && (b.high_secs - 10.0 / 0.952).abs() < 1e-9,
            "{b:?}"
        );
        assert!((b.coverage - 0.8).abs() < 1e-12);
        // One MoE run is too few: fall back to every run, widened to cover that
        // run's +50% error (the dense runs' 90th percentile is lower).
        let b = band_from(&set, "h100-sxm", true, Framework::MegatronCore, 10.0).unwrap();
        assert_eq!(b.samples, 12);
        assert!(
            b.basis.contains("published")
                && b.basis.contains("widened to the errors of the 1 MoE runs"),
            "{}",
            b.basis
        );
        assert!((b.low_secs - 10.0 / 1.5).abs() < 1e-9, "{}", b.low_secs);
        assert!(b.high_secs > 10.0 * 0.9);
        // Hardware with no runs of its own takes every dense run, widened to their
        // whole range: -5% to +5%, which claims (11 - 1) / (11 + 1), not 80%.
        let b = band_from(&set, "h200-sxm", false, Framework::MegatronCore, 10.0).unwrap();
        assert!(b.basis.contains("spanning all their errors"), "{}", b.basis);
        assert!(
            (b.low_secs - 10.0 / 1.05).abs() < 1e-9 && (b.high_secs - 10.0 / 0.95).abs() < 1e-9,
            "{b:?}"
        );
        assert!((b.coverage - 10.0 / 12.0).abs() < 1e-12, "{}", b.coverage);
    }

    #[test]
    fn few_runs_span_them_all_and_claim_less() {
        // Six runs cannot place an 80% interval's ends (ranks 0.7 and 6.3): the band
        // spans the smallest to the largest error, which holds a seventh run's
        // error with probability 5/7.
        let samples: Vec<ErrorSample> = [0.03, -0.02, 0.01, -0.06, 0.0, 0.02]
            .iter()
            .map(|&e| sample("b200", true, e))
            .collect();
        let set = ValidationSet {
            schema_version: 1,
            source: "test".into(),
            samples,
            rates: Vec::new(),
        };
        let b = band_from(&set, "b200", true, Framework::MegatronCore, 1.0).unwrap();
        assert!(
            (b.low_secs - 1.0 / 1.03).abs() < 1e-12 && (b.high_secs - 1.0 / 0.94).abs() < 1e-12,
            "{b:?}"
        );
        assert!((b.coverage - 5.0 / 7.0).abs() < 1e-12, "{}", b.coverage);
    }

    /// Hardware with no validated runs of its own (aws-p5-hf, h200-sxm) is never given
    /// a band narrower than hardware that has them.
    #[test]
    fn unvalidated_hardware_borrows_no_narrower_band() {
        for unvalidated in ["aws-p5-hf", "h200-sxm"] {
            let own = band(unvalidated, false, Framework::MegatronCore, 1.0).unwrap();
            assert!(own.basis.contains("all hardware"), "{}", own.basis);
            for validated in ["a100-80g", "h100-sxm"] {
                let b = band(validated, false, Framework::MegatronCore, 1.0).unwrap();
                assert!(b.basis.contains(validated), "{}", b.basis);
                assert!(
                    own.low_secs <= b.low_secs && own.high_secs >= b.high_secs,
                    "{unvalidated} {own:?} vs {validated} {b:?}"
                );
            }
        }
    }

    /// A torchtitan plan takes its band from torchtitan's runs, which the model
    /// prices too fast, and no Megatron-Core band moves for the other frameworks'
    /// runs in the set.
    #[test]
    fn each_framework_draws_on_its_own_runs() {
        let tt = band("h100-sxm", false, Framework::Torchtitan, 1.0).unwrap();
        let mc = band("h100-sxm", false, Framework::MegatronCore, 1.0).unwrap();
        assert!(tt.basis.contains("torchtitan"), "{}", tt.basis);
        assert!(tt.high_secs > mc.high_secs, "{tt:?} vs {mc:?}");
        let set = validation();
        assert!(set.samples.iter().any(|s| !s.framework.is_megatron_core()));
        let megatron_only = ValidationSet {
            samples: set
                .samples
                .iter()
                .filter(|s| s.framework.is_megatron_core())
                .cloned()
                .collect(),
            ..set.clone()
        };
        for (profile, moe) in [("h100-sxm", false), ("h100-sxm", true), ("h200-sxm", false)] {
            assert_eq!(
                band_from(set, profile, moe, Framework::MegatronCore, 1.0),
                band_from(&megatron_only, profile, moe, Framework::MegatronCore, 1.0),
                "{profile} moe {moe}"
            );
        }
    }

    /// A framework no published run used (ScaleTorch) takes the 80% band of every
    /// framework's runs pooled: its slow end no nearer than any measured
    /// framework's own, and the point inside it.
    #[test]
    fn an_unmeasured_framework_takes_every_frameworks_runs() {
        let set = validation();
        assert!(!set
            .samples
            .iter()
            .any(|s| s.framework == Framework::ScaleTorch));
        let st = band("h100-sxm", false, Framework::ScaleTorch, 1.0).unwrap();
        assert!(
            st.basis
                .contains("published (every framework; none with scaletorch)"),
            "{}",
            st.basis
        );
        assert!(st.low_secs <= 1.0, "{st:?}");
        for other in [Framework::MegatronCore, Framework::Torchtitan] {
            let b = band("h100-sxm", false, other, 1.0).unwrap();
            assert!(st.high_secs >= b.high_secs, "{st:?} vs {other:?} {b:?}");
        }
    }

    #[test]
    fn compiled_in_set_gives_bands() {
        let b =
            band("h100-sxm", false, Framework::MegatronCore, 1.0).expect("enough H100 dense runs");
        assert!(b.low_secs < 1.0 + 1e-9 || b.high_secs > 1.0 - 1e-9);
        assert!(b.low_secs <= b.high_secs);
    }
}
