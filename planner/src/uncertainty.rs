//! Error bands: how far a prediction may be from a measurement, judged by how the
//! cost model did on comparable measured runs.
//!
//! `hwprofiles/validation.json` holds the signed relative error of every published
//! run (`../shared/data/published_runs.csv`) under the current cost model. It is
//! written by the published-runs test (`SEXTANT_BLESS=1`) and that test fails when
//! it is stale, so the band always describes this model. A prediction's band uses
//! the errors of runs on the same hardware profile and of the same kind (dense or
//! MoE); with fewer than [`MIN_SAMPLES`] of those, runs of the same kind on any
//! hardware; then all runs.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// Fewest comparable runs a band is drawn from.
pub const MIN_SAMPLES: usize = 5;

/// One validated run: predicted / measured - 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorSample {
    pub id: String,
    pub profile: String,
    pub moe: bool,
    pub rel_error: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationSet {
    pub schema_version: u32,
    /// What produced the errors.
    pub source: String,
    pub samples: Vec<ErrorSample>,
}

/// An interval on the step time, with where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Band {
    /// Probability that the measured step time falls inside.
    pub coverage: f64,
    pub low_secs: f64,
    pub high_secs: f64,
    /// Which runs it is drawn from, e.g. "17 h100-sxm dense runs".
    pub basis: String,
    pub samples: usize,
}

fn validation() -> &'static ValidationSet {
    static SET: OnceLock<ValidationSet> = OnceLock::new();
    SET.get_or_init(|| serde_json::from_str(include_str!("../../hwprofiles/validation.json")).expect("compiled-in validation.json parses"))
}

/// Linear-interpolated quantile of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// The 80% band (10th to 90th percentile of comparable errors) around `step_secs`.
pub fn band(profile: &str, moe: bool, step_secs: f64) -> Option<Band> {
    band_from(validation(), profile, moe, step_secs)
}

pub fn band_from(set: &ValidationSet, profile: &str, moe: bool, step_secs: f64) -> Option<Band> {
    let kind = if moe { "MoE" } else { "dense" };
    // Pools from the closest to the widest: same profile and kind, same kind, all.
    let labels = [format!("{profile} {kind}"), format!("{kind} (all hardware)"), "published".to_string()];
    for (level, label) in labels.into_iter().enumerate() {
        let keep = |s: &ErrorSample| match level {
            0 => s.profile == profile && s.moe == moe,
            1 => s.moe == moe,
            _ => true,
        };
        let mut errs: Vec<f64> = set.samples.iter().filter(|s| keep(s)).map(|s| s.rel_error).collect();
        if errs.len() < MIN_SAMPLES {
            continue;
        }
        errs.sort_by(f64::total_cmp);
        let (q10, q90) = (quantile(&errs, 0.1), quantile(&errs, 0.9));
        // measured = predicted / (1 + error).
        return Some(Band {
            coverage: 0.8,
            low_secs: step_secs / (1.0 + q90),
            high_secs: step_secs / (1.0 + q10),
            basis: format!("{} {label} runs", errs.len()),
            samples: errs.len(),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(profile: &str, moe: bool, e: f64) -> ErrorSample {
        ErrorSample { id: "x".into(), profile: profile.into(), moe, rel_error: e }
    }

    #[test]
    fn band_uses_the_closest_pool_with_enough_runs() {
        let mut samples: Vec<ErrorSample> = (0..11).map(|i| sample("a100-80g", false, -0.05 + 0.01 * i as f64)).collect();
        samples.push(sample("h100-sxm", true, 0.5));
        let set = ValidationSet { schema_version: 1, source: "test".into(), samples };
        let b = band_from(&set, "a100-80g", false, 10.0).unwrap();
        assert_eq!(b.samples, 11);
        // 10th and 90th percentiles of -0.05..0.05 are -0.04 and 0.04.
        assert!((b.low_secs - 10.0 / 1.04).abs() < 1e-9 && (b.high_secs - 10.0 / 0.96).abs() < 1e-9);
        // One MoE run is too few: fall back to every run.
        let b = band_from(&set, "h100-sxm", true, 10.0).unwrap();
        assert_eq!(b.samples, 12);
        assert!(b.basis.contains("published"));
        assert!(b.low_secs < 10.0 && b.high_secs > 10.0 * 0.9);
    }

    #[test]
    fn compiled_in_set_gives_bands() {
        let b = band("h100-sxm", false, 1.0).expect("enough H100 dense runs");
        assert!(b.low_secs < 1.0 + 1e-9 || b.high_secs > 1.0 - 1e-9);
        assert!(b.low_secs <= b.high_secs);
    }
}
