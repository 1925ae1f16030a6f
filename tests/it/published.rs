//! Every row of ../shared/data/published_runs.csv, estimated with its exact
//! configuration and hardware: a table of predicted vs measured, and a bound on
//! the median absolute error.

use sextant_planner::runs::parse_runs;
use sextant_planner::uncertainty::{ErrorSample, ValidationSet};

fn shared_csv() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/data/published_runs.csv");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e} (the shared data must sit beside the project root)"))
}

#[test]
fn published_runs_median_error_within_15_percent() {
    let rows = parse_runs(&shared_csv()).expect("CSV parses");
    assert!(rows.len() >= 30, "expected the full published set, got {} rows", rows.len());
    let mut errors = Vec::new();
    let mut samples = Vec::new();
    println!("{:<44} {:>5} {:>10} {:>10} {:>8}  breakdown", "run", "gpus", "measured", "predicted", "error");
    for row in &rows {
        let case = match row {
            Ok(c) => c,
            Err(u) => panic!("row {} cannot be represented: {}", u.id, u.reason),
        };
        let est = match case.estimate() {
            Ok(e) => e,
            Err(r) => panic!("row {}: configuration rejected: {r}", case.id),
        };
        let measured = case.measured_step_secs();
        let err = (est.step_secs - measured) / measured;
        errors.push(err.abs());
        samples.push(ErrorSample { id: case.id.clone(), profile: case.cluster.profile.name.clone(), moe: case.moe, rel_error: (err * 1e4).round() / 1e4 });
        println!(
            "{:<44} {:>5} {:>9.3}s {:>9.3}s {:>+7.1}%  bubble {:.0}% comm {:.0}% mfu {:.0}%",
            case.id, case.cluster.gpus, measured, est.step_secs, 100.0 * err, 100.0 * est.bubble_fraction, 100.0 * est.exposed_comm_fraction, 100.0 * est.mfu
        );
    }
    errors.sort_by(f64::total_cmp);
    let median = errors[errors.len() / 2];
    let max = errors[errors.len() - 1];
    println!("rows {}  median |error| {:.1}%  max |error| {:.1}%", errors.len(), 100.0 * median, 100.0 * max);
    assert!(median <= 0.15, "median absolute error {:.1}% exceeds 15%", 100.0 * median);
    check_validation_file(samples);
}

/// hwprofiles/validation.json feeds the error bands; it must describe this model.
fn check_validation_file(samples: Vec<ErrorSample>) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/hwprofiles/validation.json");
    let fresh = ValidationSet {
        schema_version: 1,
        source: "signed step-time error (predicted / measured - 1) of every row of shared/data/published_runs.csv, written by tests/it/published.rs".into(),
        samples,
    };
    if std::env::var_os("SEXTANT_BLESS").is_some() {
        std::fs::write(path, serde_json::to_string_pretty(&fresh).unwrap() + "\n").unwrap();
        return;
    }
    let committed: ValidationSet = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(committed.samples.len(), fresh.samples.len(), "hwprofiles/validation.json is stale: run SEXTANT_BLESS=1 cargo test --release --test it published");
    for (a, b) in committed.samples.iter().zip(&fresh.samples) {
        assert!(a.id == b.id && (a.rel_error - b.rel_error).abs() < 0.005, "hwprofiles/validation.json is stale for {} ({} vs {}): run SEXTANT_BLESS=1 cargo test --release --test it published", b.id, a.rel_error, b.rel_error);
    }
}
