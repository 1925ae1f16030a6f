//! Predicted against measured on runs in the `published_runs.csv` schema, with
//! summaries, and leave-one-source-out cross-validation.
//!
//! Calibration is honest by construction: the only thing fitted is one scale per
//! hardware profile on its compute efficiencies (GEMM BF16 and FP8, attention),
//! never anything per row. Cross-validation refits that scale without a source's
//! rows and predicts them.

use serde::Serialize;

use crate::config::Rejection;
use crate::hardware::{HardwareProfile, GIB};
use crate::memory::{MemKind, StageMemory};
use crate::runs::{MemStage, RunCase, Unrepresentable};

/// One row's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RowResult {
    pub id: String,
    /// Short source key: the row id up to its first '-'.
    pub source: String,
    pub profile: String,
    pub gpus: u64,
    pub moe: bool,
    pub measured_secs: f64,
    pub predicted_secs: f64,
    /// predicted / measured - 1.
    pub error: f64,
    /// The framework the run trained with.
    pub framework: crate::cost::Framework,
}

/// Median and maximum absolute error of a group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupSummary {
    pub group: String,
    pub rows: usize,
    pub median_abs: f64,
    pub max_abs: f64,
    pub mean_signed: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub all: GroupSummary,
    pub by_source: Vec<GroupSummary>,
    pub by_profile: Vec<GroupSummary>,
    pub by_kind: Vec<GroupSummary>,
}

pub fn source_key(id: &str) -> String {
    id.split('-').next().unwrap_or(id).to_string()
}

fn predict(case: &RunCase, profile: Option<&HardwareProfile>) -> Result<f64, Rejection> {
    let mut c = case.clone();
    if let Some(p) = profile {
        c.cluster.profile = p.clone();
        // Keep the row's node shape (runs/ may have adjusted it).
        c.cluster.profile.node = case.cluster.profile.node.clone();
    }
    c.estimate().map(|e| e.step_secs)
}

fn row(case: &RunCase, predicted: f64) -> RowResult {
    let measured = case.measured_step_secs();
    RowResult {
        id: case.id.clone(),
        source: source_key(&case.id),
        profile: case.cluster.profile.name.clone(),
        gpus: case.cluster.gpus,
        moe: case.moe,
        measured_secs: measured,
        predicted_secs: predicted,
        error: predicted / measured - 1.0,
        framework: case.assumptions.framework,
    }
}

/// Estimates every case with its own configuration and hardware.
pub fn validate(cases: &[RunCase]) -> (Vec<RowResult>, Vec<Unrepresentable>) {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for c in cases {
        match predict(c, None) {
            Ok(p) => ok.push(row(c, p)),
            Err(r) => bad.push(Unrepresentable {
                id: c.id.clone(),
                reason: format!("configuration rejected: {r}"),
            }),
        }
    }
    (ok, bad)
}

/// One row's predicted against measured peak memory, like with like.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryRow {
    pub id: String,
    pub source: String,
    pub profile: String,
    /// The framework whose memory layout the prediction follows.
    pub framework: String,
    /// What the measurement counts.
    pub kind: MemKind,
    pub stage: MemStage,
    pub measured_gib: f64,
    /// The predicted bytes a measurement of `kind` counts
    /// ([`MemKind::comparable_bytes`]), GiB.
    pub predicted_gib: f64,
    /// predicted / measured - 1.
    pub error: f64,
    /// The predicted stage the measurement is compared with (for `max`, the
    /// stage with the most of what `kind` counts), every component; written as
    /// the plan file writes a stage's memory.
    #[serde(serialize_with = "memory_record")]
    pub memory: StageMemory,
}

/// A stage's memory in `validate --json`: the plan file's record of it, so that the
/// cost model's [`StageMemory`] stays free of serde.
fn memory_record<S: serde::Serializer>(m: &StageMemory, s: S) -> Result<S::Ok, S::Error> {
    crate::format::StageMemory::from(m).serialize(s)
}

/// Predicted against measured peak memory on every case that states one. The
/// prediction is for the configuration the row ran (as [`RunCase::memory_estimate`]
/// settles it), whether or not it fits the profile's HBM.
pub fn memory(cases: &[RunCase]) -> (Vec<MemoryRow>, Vec<Unrepresentable>) {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for c in cases {
        let Some(m) = c.measured_memory else { continue };
        let e = match c.memory_estimate() {
            Ok((_, e)) => e,
            Err(r) => {
                bad.push(Unrepresentable {
                    id: c.id.clone(),
                    reason: format!("configuration rejected: {r}"),
                });
                continue;
            }
        };
        let stage = match m.stage {
            MemStage::Max => e.stages.iter().map(|s| s.memory).max_by(|a, b| {
                m.kind
                    .comparable_bytes(a)
                    .total_cmp(&m.kind.comparable_bytes(b))
            }),
            MemStage::Stage(i) => e.stages.get(i as usize).map(|s| s.memory),
        };
        let Some(memory) = stage else {
            bad.push(Unrepresentable {
                id: c.id.clone(),
                reason: "the estimate has no such pipeline stage".into(),
            });
            continue;
        };
        let predicted_gib = m.kind.comparable_bytes(&memory) / GIB;
        ok.push(MemoryRow {
            id: c.id.clone(),
            source: source_key(&c.id),
            profile: c.cluster.profile.name.clone(),
            framework: c.assumptions.framework.name().to_string(),
            kind: m.kind,
            stage: m.stage,
            measured_gib: m.gib,
            predicted_gib,
            error: predicted_gib / m.gib - 1.0,
            memory,
        });
    }
    (ok, bad)
}

/// Median and maximum absolute memory error, overall, per source and per
/// framework (in that order; the first group is "all").
pub fn memory_summary(rows: &[MemoryRow]) -> Vec<GroupSummary> {
    let as_rows: Vec<RowResult> = rows
        .iter()
        .map(|r| RowResult {
            id: r.id.clone(),
            source: r.source.clone(),
            profile: r.framework.clone(),
            gpus: 0,
            moe: false,
            measured_secs: r.measured_gib,
            predicted_secs: r.predicted_gib,
            error: r.error,
            framework: crate::cost::Framework::parse(&r.framework).unwrap_or_default(),
        })
        .collect();
    let mut out = vec![group("all", &as_rows.iter().collect::<Vec<_>>())];
    out.extend(grouped(&as_rows, |r| format!("source: {}", r.source)));
    out.extend(grouped(&as_rows, |r| format!("framework: {}", r.profile)));
    out
}

/// Median absolute error of a set of errors (NaN for none).
pub fn median_abs(errors: impl IntoIterator<Item = f64>) -> f64 {
    median(errors.into_iter().map(f64::abs).collect())
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn group(name: &str, rows: &[&RowResult]) -> GroupSummary {
    let abs: Vec<f64> = rows.iter().map(|r| r.error.abs()).collect();
    GroupSummary {
        group: name.to_string(),
        rows: rows.len(),
        median_abs: median(abs.clone()),
        max_abs: abs.iter().copied().fold(0.0, f64::max),
        mean_signed: rows.iter().map(|r| r.error).sum::<f64>() / rows.len().max(1) as f64,
    }
}

fn grouped(rows: &[RowResult], key: impl Fn(&RowResult) -> String) -> Vec<GroupSummary> {
    let mut keys: Vec<String> = Vec::new();
    for r in rows {
        let k = key(r);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.iter()
        .map(|k| group(k, &rows.iter().filter(|r| key(r) == *k).collect::<Vec<_>>()))
        .collect()
}

pub fn summarize(rows: &[RowResult]) -> Summary {
    Summary {
        all: group("all", &rows.iter().collect::<Vec<_>>()),
        by_source: grouped(rows, |r| r.source.clone()),
        by_profile: grouped(rows, |r| r.profile.clone()),
        by_kind: grouped(rows, |r| if r.moe { "MoE".into() } else { "dense".into() }),
    }
}

/// Scales a profile's compute efficiencies (capped at 1).
pub fn scaled(profile: &HardwareProfile, k: f64) -> HardwareProfile {
    let mut p = profile.clone();
    let e = &mut p.efficiency;
    e.gemm_bf16 = (e.gemm_bf16 * k).min(1.0);
    e.gemm_fp8 = (e.gemm_fp8 * k).min(1.0);
    e.attention_fwd = (e.attention_fwd * k).min(1.0);
    e.attention_bwd = (e.attention_bwd * k).min(1.0);
    p
}

/// The scales at which [`cross_validate`] predicts every row once: 0.55 to 1.45
/// in steps of 0.01, a margin beyond the 0.6 to 1.4 that [`fit_scale`] searches
/// so that its refinement never leaves the grid.
const GRID_LO: f64 = 0.55;
const GRID_STEP: f64 = 0.01;
const GRID_POINTS: usize = 91;

/// One row's log error as a function of the compute-efficiency scale: its
/// predictions at the grid's scales (`None` where the model rejects it there),
/// read between grid points by linear interpolation in log space. The log of a
/// step time is smooth in the scale (a sum of terms in 1/k and terms that do not
/// move), so the interpolation stays close to a direct prediction: 2.5e-4 in
/// log at most on the published rows tried (the test allows 1e-3); the held-out
/// predictions themselves are direct.
struct ErrorCurve {
    ln_error: Vec<Option<f64>>,
}

impl ErrorCurve {
    fn of(case: &RunCase) -> ErrorCurve {
        let measured = case.measured_step_secs();
        let ln_error = (0..GRID_POINTS)
            .map(|i| {
                let p = scaled(&case.cluster.profile, GRID_LO + i as f64 * GRID_STEP);
                predict(case, Some(&p))
                    .ok()
                    .map(|pred| (pred / measured).ln())
            })
            .collect();
        ErrorCurve { ln_error }
    }

    /// |log error| at scale `k`, or `None` where either neighbouring grid point
    /// was rejected.
    fn abs_at(&self, k: f64) -> Option<f64> {
        let x = ((k - GRID_LO) / GRID_STEP).clamp(0.0, (GRID_POINTS - 1) as f64);
        let i = (x.floor() as usize).min(GRID_POINTS - 2);
        let t = x - i as f64;
        let (a, b) = (self.ln_error[i]?, self.ln_error[i + 1]?);
        Some((a + t * (b - a)).abs())
    }
}

/// The scale (0.6 to 1.4) that minimises the median absolute log error over
/// `curves`, found by a coarse grid and a golden-section refinement.
fn fit_scale(curves: &[&ErrorCurve]) -> f64 {
    let loss = |k: f64| -> f64 { median(curves.iter().filter_map(|c| c.abs_at(k)).collect()) };
    let mut best = (1.0, loss(1.0));
    let mut k = 0.6;
    while k <= 1.4 + 1e-9 {
        let l = loss(k);
        if l < best.1 {
            best = (k, l);
        }
        k += 0.05;
    }
    let (mut a, mut b) = (best.0 - 0.05, best.0 + 0.05);
    let g = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..20 {
        let c = b - g * (b - a);
        let d = a + g * (b - a);
        if loss(c) < loss(d) {
            b = d;
        } else {
            a = c;
        }
    }
    0.5 * (a + b)
}

/// Leave-one-source-out: for each source, refit each profile's scale on the other
/// sources' rows of that profile (or keep the profile as written when no other row
/// uses it) and predict the held-out source. Returns the predictions and, per
/// held-out source and profile, the scale used.
///
/// Every row is predicted once per scale of a fixed grid ([`ErrorCurve`]), in
/// parallel, and each refit reads those curves: the work grows with the rows, not
/// with rows times sources (a row per source made the direct refits quadratic,
/// about a day at the 2,000-row cap). Each scale multiplies the row's own profile;
/// the held-out rows are then predicted directly at their source's fitted scale.
pub fn cross_validate(cases: &[RunCase]) -> (Vec<RowResult>, Vec<(String, String, f64)>) {
    use rayon::prelude::*;
    let curves: Vec<ErrorCurve> = cases.par_iter().map(ErrorCurve::of).collect();
    let mut sources: Vec<String> = Vec::new();
    for c in cases {
        let s = source_key(&c.id);
        if !sources.contains(&s) {
            sources.push(s);
        }
    }
    let keys: Vec<String> = cases.iter().map(|c| source_key(&c.id)).collect();
    let mut out = Vec::new();
    let mut scales = Vec::new();
    for s in &sources {
        let held: Vec<&RunCase> = cases
            .iter()
            .zip(&keys)
            .filter(|(_, k)| *k == s)
            .map(|(c, _)| c)
            .collect();
        // Each profile once, whatever the order of the source's rows (`dedup`
        // alone kept a profile twice when its rows were not adjacent, and
        // predicted those rows twice).
        let mut profiles: Vec<String> = Vec::new();
        for c in &held {
            if !profiles.contains(&c.cluster.profile.name) {
                profiles.push(c.cluster.profile.name.clone());
            }
        }
        for name in profiles {
            let train: Vec<&ErrorCurve> = cases
                .iter()
                .zip(&keys)
                .zip(&curves)
                .filter(|((c, k), _)| *k != s && c.cluster.profile.name == name)
                .map(|(_, curve)| curve)
                .collect();
            let k = if train.is_empty() {
                1.0
            } else {
                fit_scale(&train)
            };
            scales.push((s.clone(), name.clone(), k));
            for c in held.iter().filter(|c| c.cluster.profile.name == name) {
                if let Ok(pred) = predict(c, Some(&scaled(&c.cluster.profile, k))) {
                    out.push(row(c, pred));
                }
            }
        }
    }
    (out, scales)
}

/// What is left out of the errors a row's band is drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOut {
    /// The row itself.
    Row,
    /// Every row of the row's source.
    Source,
}

/// One row's error band, drawn as `plan` and `estimate` draw theirs but from the
/// other rows' errors, and whether the measured step time fell inside it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BandCheck {
    pub id: String,
    pub moe: bool,
    pub measured_secs: f64,
    pub low_secs: f64,
    pub high_secs: f64,
    pub inside: bool,
    /// The probability the band claims ([`crate::uncertainty::Band::coverage`]).
    pub coverage: f64,
    /// Which runs the band came from.
    pub basis: String,
}

/// How many rows of a group fell inside their held-out band.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Coverage {
    pub group: String,
    pub rows: usize,
    pub inside: usize,
    /// The probability the bands claim, averaged over the group's rows.
    pub nominal: f64,
}

/// Checks the error bands against the rows themselves: each row's band is drawn
/// (by [`crate::uncertainty::band_from`], the same rule `plan` uses) from the errors
/// of the other rows, leaving out the row or its whole source, so that no band
/// is judged on the error it was drawn from. Rows for which too few other runs
/// remain get no band and no check.
pub fn band_checks(rows: &[RowResult], hold_out: HoldOut) -> Vec<BandCheck> {
    use crate::uncertainty::{band_from, ErrorSample, ValidationSet};
    rows.iter()
        .filter_map(|r| {
            let samples = rows
                .iter()
                .filter(|o| match hold_out {
                    HoldOut::Row => o.id != r.id,
                    HoldOut::Source => o.source != r.source,
                })
                .map(|o| ErrorSample {
                    id: o.id.clone(),
                    profile: o.profile.clone(),
                    moe: o.moe,
                    rel_error: o.error,
                    shares: None,
                    reach: None,
                    framework: o.framework,
                })
                .collect();
            let set = ValidationSet {
                schema_version: 1,
                source: "held-out rows".into(),
                samples,
                rates: Vec::new(),
            };
            let b = band_from(&set, &r.profile, r.moe, r.framework, r.predicted_secs)?;
            Some(BandCheck {
                id: r.id.clone(),
                moe: r.moe,
                measured_secs: r.measured_secs,
                low_secs: b.low_secs,
                high_secs: b.high_secs,
                inside: (b.low_secs..=b.high_secs).contains(&r.measured_secs),
                coverage: b.coverage,
                basis: b.basis,
            })
        })
        .collect()
}

/// Coverage of all checked rows, then of dense and MoE rows (a kind with no
/// checked row is left out).
pub fn coverage(checks: &[BandCheck]) -> Vec<Coverage> {
    let of = |group: &str, keep: &dyn Fn(&BandCheck) -> bool| {
        let kept: Vec<&BandCheck> = checks.iter().filter(|c| keep(c)).collect();
        let nominal = kept.iter().map(|c| c.coverage).sum::<f64>() / kept.len().max(1) as f64;
        Coverage {
            group: group.to_string(),
            rows: kept.len(),
            inside: kept.iter().filter(|c| c.inside).count(),
            nominal,
        }
    };
    let mut out = vec![of("all", &|_| true)];
    out.extend(
        [of("dense", &|c| !c.moe), of("MoE", &|c| c.moe)]
            .into_iter()
            .filter(|c| c.rows > 0),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refits read each row's error between grid points; read there, it is
    /// within 1e-3 (in log: 0.1%) of predicting the row at that scale.
    #[test]
    fn error_curves_match_direct_predictions_between_grid_points() {
        let text = include_str!("../../tests/data/published_runs.csv");
        let stack = include_str!("../../tests/data/published_runs_stack.csv");
        let cases: Vec<RunCase> = crate::runs::parse_runs_with(text, Some(stack))
            .unwrap()
            .into_iter()
            .filter_map(Result::ok)
            .step_by(4)
            .collect();
        assert!(cases.len() >= 8);
        for c in &cases {
            let curve = ErrorCurve::of(c);
            for k in [0.6137, 0.8745, 1.0, 1.2311, 1.3999] {
                let direct = predict(c, Some(&scaled(&c.cluster.profile, k))).unwrap();
                let want = (direct / c.measured_step_secs()).ln().abs();
                let got = curve.abs_at(k).unwrap();
                assert!(
                    (got - want).abs() < 1e-3,
                    "{} at {k}: {got} vs {want}",
                    c.id
                );
            }
        }
    }

    #[test]
    fn median_and_groups() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        let r = |id: &str, e: f64| RowResult {
            id: id.into(),
            source: source_key(id),
            profile: "p".into(),
            gpus: 8,
            moe: false,
            measured_secs: 1.0,
            predicted_secs: 1.0 + e,
            error: e,
            framework: Default::default(),
        };
        let rows = vec![r("a-1", 0.1), r("a-2", -0.3), r("b-1", 0.05)];
        let s = summarize(&rows);
        assert_eq!(s.by_source.len(), 2);
        assert_eq!(s.by_source[0].rows, 2);
        assert!((s.by_source[0].max_abs - 0.3).abs() < 1e-12);
        assert!((s.all.median_abs - 0.1).abs() < 1e-12);
    }

    fn run(id: &str, profile: &str, error: f64) -> RowResult {
        RowResult {
            id: id.into(),
            source: source_key(id),
            profile: profile.into(),
            gpus: 8,
            moe: false,
            measured_secs: 2.0,
            predicted_secs: 2.0 * (1.0 + error),
            error,
            framework: Default::default(),
        }
    }

    #[test]
    fn held_out_bands_hold_as_often_as_they_claim() {
        // 50 runs with distinct errors in scrambled order. Each band is drawn from
        // the other 49, its ends at ranks 50 x 0.1 = 5 and 50 x 0.9 = 45: the run
        // of rank i among all 50 has i - 1 others below it, so it lies inside when
        // i - 1 >= 5 and i - 1 < 45, for i = 6..=45: 40 of 50 runs, the 80% claimed.
        let rows: Vec<RowResult> = (0..50)
            .map(|i| {
                run(
                    &format!("s{}-{i}", i % 5),
                    "h100-sxm",
                    ((i * 37) % 50) as f64 / 500.0 - 0.05,
                )
            })
            .collect();
        let checks = band_checks(&rows, HoldOut::Row);
        assert_eq!(checks.len(), 50);
        let cov = coverage(&checks);
        assert_eq!((cov[0].rows, cov[0].inside), (50, 40), "{cov:?}");
        assert!((cov[0].nominal - 0.8).abs() < 1e-12);
        assert_eq!(cov.len(), 2, "no MoE row, no MoE group: {cov:?}");
        // Outside are the five smallest and five largest errors.
        let outside: Vec<f64> = rows
            .iter()
            .zip(&checks)
            .filter(|(_, c)| !c.inside)
            .map(|(r, _)| r.error)
            .collect();
        assert!(
            outside.iter().all(|e| *e < -0.04 || *e > 0.0389),
            "{outside:?}"
        );
        // Leaving out a whole source (10 runs) draws each band from the other 40.
        let by_source = band_checks(&rows, HoldOut::Source);
        assert!(
            by_source.iter().all(|c| c.basis.starts_with("40 ")),
            "{:?}",
            by_source[0].basis
        );
    }

    #[test]
    fn a_row_without_enough_other_runs_gets_no_band() {
        let rows: Vec<RowResult> = (0..5)
            .map(|i| run(&format!("a-{i}"), "a100-80g", 0.01 * i as f64))
            .collect();
        // Four others are below the five a band needs.
        assert!(band_checks(&rows, HoldOut::Row).is_empty());
        assert!(coverage(&[]).iter().all(|c| c.rows == 0) && coverage(&[]).len() == 1);
    }
}
