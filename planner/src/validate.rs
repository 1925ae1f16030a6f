//! Predicted against measured on runs in the `published_runs.csv` schema, with
//! summaries, and leave-one-source-out cross-validation.
//!
//! Calibration is honest by construction: the only thing fitted is one scale per
//! hardware profile on its compute efficiencies (GEMM BF16 and FP8, attention),
//! never anything per row. Cross-validation refits that scale without a source's
//! rows and predicts them.

use serde::Serialize;

use crate::hardware::HardwareProfile;
use crate::runs::{RunCase, Unrepresentable};

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

fn predict(case: &RunCase, profile: Option<&HardwareProfile>) -> Result<f64, String> {
    let mut c = case.clone();
    if let Some(p) = profile {
        c.cluster.profile = p.clone();
        // Keep the row's node shape (runs.rs may have adjusted it).
        c.cluster.profile.node = case.cluster.profile.node.clone();
    }
    c.estimate().map(|e| e.step_secs).map_err(|r| format!("configuration rejected: {r}"))
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
    }
}

/// Estimates every case with its own configuration and hardware.
pub fn validate(cases: &[RunCase]) -> (Vec<RowResult>, Vec<Unrepresentable>) {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for c in cases {
        match predict(c, None) {
            Ok(p) => ok.push(row(c, p)),
            Err(reason) => bad.push(Unrepresentable { id: c.id.clone(), reason }),
        }
    }
    (ok, bad)
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
    keys.iter().map(|k| group(k, &rows.iter().filter(|r| key(r) == *k).collect::<Vec<_>>())).collect()
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

/// The scale (0.6 to 1.4) that minimises the median absolute log error over
/// `cases`, found by a coarse grid and a golden-section refinement.
pub fn fit_scale(cases: &[&RunCase], profile: &HardwareProfile) -> f64 {
    let loss = |k: f64| -> f64 {
        let p = scaled(profile, k);
        median(cases.iter().filter_map(|c| predict(c, Some(&p)).ok().map(|pred| (pred / c.measured_step_secs()).ln().abs())).collect())
    };
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
pub fn cross_validate(cases: &[RunCase]) -> (Vec<RowResult>, Vec<(String, String, f64)>) {
    let mut sources: Vec<String> = Vec::new();
    for c in cases {
        let s = source_key(&c.id);
        if !sources.contains(&s) {
            sources.push(s);
        }
    }
    let mut out = Vec::new();
    let mut scales = Vec::new();
    for s in &sources {
        let held: Vec<&RunCase> = cases.iter().filter(|c| source_key(&c.id) == *s).collect();
        let mut profiles: Vec<String> = held.iter().map(|c| c.cluster.profile.name.clone()).collect();
        profiles.dedup();
        for name in profiles {
            let train: Vec<&RunCase> = cases.iter().filter(|c| source_key(&c.id) != *s && c.cluster.profile.name == name).collect();
            let base = &held.iter().find(|c| c.cluster.profile.name == name).expect("held row of this profile").cluster.profile;
            let k = if train.is_empty() { 1.0 } else { fit_scale(&train, base) };
            scales.push((s.clone(), name.clone(), k));
            let p = scaled(base, k);
            for c in held.iter().filter(|c| c.cluster.profile.name == name) {
                if let Ok(pred) = predict(c, Some(&p)) {
                    out.push(row(c, pred));
                }
            }
        }
    }
    (out, scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_groups() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        let r = |id: &str, e: f64| RowResult { id: id.into(), source: source_key(id), profile: "p".into(), gpus: 8, moe: false, measured_secs: 1.0, predicted_secs: 1.0 + e, error: e };
        let rows = vec![r("a-1", 0.1), r("a-2", -0.3), r("b-1", 0.05)];
        let s = summarize(&rows);
        assert_eq!(s.by_source.len(), 2);
        assert_eq!(s.by_source[0].rows, 2);
        assert!((s.by_source[0].max_abs - 0.3).abs() < 1e-12);
        assert!((s.all.median_abs - 0.1).abs() < 1e-12);
    }
}
