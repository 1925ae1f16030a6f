//! Helpers shared by the integration tests that run the binary.

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn sextant(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sextant"))
        .args(args)
        // The plan table fits itself to COLUMNS; tests read the full table.
        .env_remove("COLUMNS")
        .output()
        .expect("binary runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn data(rel: &str) -> String {
    format!("{}/tests/data/{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// A fresh directory under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("sextant-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

thread_local! {
    static HOSTILE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// How many hostile command lines this thread has checked.
pub fn hostile_count() -> u32 {
    HOSTILE.with(|c| c.get())
}

/// Counts one hostile case that a test checks with its own runner.
pub fn count_hostile() {
    HOSTILE.with(|c| c.set(c.get() + 1));
}

/// Bad input: non-zero exit, exactly one line on stderr naming the problem, no panic.
pub fn fails_with_one_line(args: &[&str], needle: &str) {
    HOSTILE.with(|c| c.set(c.get() + 1));
    let o = sextant(args);
    let err = stderr(&o);
    assert!(
        !o.status.success(),
        "{args:?} succeeded; stdout: {}",
        stdout(&o)
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?} printed more than one line:\n{err}"
    );
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: expected '{needle}' in: {err}"
    );
}

/// Runs `sextant ARGS --out DIR/NAME`, which must succeed, and returns the path of
/// the file it wrote (a plan from `plan` or `estimate`).
pub fn saved(dir: &TempDir, name: &str, args: &[&str]) -> std::path::PathBuf {
    let path = dir.path(name);
    let mut a = args.to_vec();
    a.extend_from_slice(&["--out", path.to_str().unwrap()]);
    let o = sextant(&a);
    assert!(o.status.success(), "{a:?}: {}", stderr(&o));
    path
}

/// Runs `sextant ARGS --json`, which must succeed, and returns the plan file it
/// printed.
pub fn planned(args: &[&str]) -> sextant_planner::plan::PlanFile {
    let mut a = args.to_vec();
    a.push("--json");
    let o = sextant(&a);
    assert!(o.status.success(), "{a:?}: {}", stderr(&o));
    sextant_planner::plan::PlanFile::from_json(&stdout(&o)).unwrap_or_else(|e| panic!("{a:?}: {e}"))
}

/// The Chromium binary the browser tests drive, when one is installed (`.ci/run`
/// installs Debian's `chromium`).
pub fn chromium() -> Option<PathBuf> {
    [
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
        "/usr/bin/google-chrome",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// A command line split at whitespace (for arguments without spaces).
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Every one of `lines` is in `text` (a rendered export or command output).
pub fn has_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.contains(line), "{line:?}: {text}");
    }
}
