//! Replays the committed fuzz inputs on the stable toolchain (CI has no nightly
//! and no libFuzzer): every file under `fuzz/corpus/<target>/` and
//! `fuzz/regressions/<target>/` goes through `sextant_planner::fuzzing`, the same
//! functions the cargo-fuzz targets call. A panic fails the test and names the file.

use std::path::{Path, PathBuf};

/// Inputs replayed per target, in the order of `fuzzing::TARGETS`. Panics (naming
/// every file that panicked) when an input panics or a target has no input.
pub fn replay_all() -> Vec<(&'static str, usize)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut counts = Vec::new();
    let mut panicked = Vec::new();
    for &target in sextant_planner::fuzzing::TARGETS {
        let mut files: Vec<PathBuf> = Vec::new();
        for kind in ["corpus", "regressions"] {
            let Ok(dir) = std::fs::read_dir(root.join(kind).join(target)) else {
                continue;
            };
            files.extend(
                dir.map(|e| e.expect("readable fuzz directory").path())
                    .filter(|p| p.is_file()),
            );
        }
        files.sort();
        for path in &files {
            let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if std::panic::catch_unwind(|| sextant_planner::fuzzing::run(target, &bytes)).is_err() {
                panicked.push(path.display().to_string());
            }
        }
        assert!(
            !files.is_empty(),
            "no committed fuzz inputs for target {target} under {}",
            root.display()
        );
        counts.push((target, files.len()));
    }
    assert!(
        panicked.is_empty(),
        "{} fuzz input(s) panicked:\n{}",
        panicked.len(),
        panicked.join("\n")
    );
    counts
}

#[test]
fn fuzz_corpus_and_regressions_replay_without_panic() {
    let counts = replay_all();
    let total: usize = counts.iter().map(|c| c.1).sum();
    let each: Vec<String> = counts
        .iter()
        .map(|(t, n)| format!("{t} {n} inputs"))
        .collect();
    println!("fuzz replay: {}, total {total}", each.join(", "));
}
