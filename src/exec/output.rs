//! The measured-run path, checked before a run starts rather than after it ends:
//! its directory exists, and the path is absent, or (with `--force`) a regular file
//! that is not the plan being run. Links and special files are never replaced.
//! Temporary files that a killed run left beside it are removed.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Result};

fn dir_of(out: &Path) -> PathBuf {
    match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether `a` and `b` are the same file (same device and inode on Unix).
fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (a, b);
        false
    }
}

/// Refuses an `--out` the run could not, or must not, write.
pub fn check_out(out: &Path, plan: &Path, force: bool) -> Result<()> {
    let shown = out.display();
    let dir = dir_of(out);
    match fs::metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!(
            "--out '{shown}': '{}' is not a directory: choose a path in an existing directory",
            dir.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "--out '{shown}': directory '{}' does not exist: create it first, or choose another path",
            dir.display()
        ),
        Err(e) => bail!("--out '{shown}': cannot use directory '{}': {e}", dir.display()),
    }
    let meta = match fs::symlink_metadata(out) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => bail!("--out '{shown}': cannot inspect it: {e}"),
    };
    if meta.file_type().is_symlink() {
        bail!("--out '{shown}' is a symbolic link; not replacing it, even with --force: remove it or choose another path");
    }
    if !meta.is_file() {
        bail!("--out '{shown}' exists and is not a regular file (a directory, FIFO, socket or device); not replacing it: choose another path");
    }
    if let Ok(p) = fs::metadata(plan) {
        if same_file(&meta, &p) {
            bail!(
                "--out '{shown}' is the plan file '{}' itself: the run would replace the plan; choose another path",
                plan.display()
            );
        }
    }
    if !force {
        bail!("'{shown}' exists; not overwriting it (pass --force to replace it)");
    }
    Ok(())
}

/// Temporary files older than this, whatever their name holds, are a killed run's.
const STALE_AFTER: Duration = Duration::from_secs(3600);

/// Removes temporary files that a killed write to `out` left in its directory:
/// hidden regular files named `.NAME.sextant-PID-RANDOM.tmp` (`io::write_new`'s
/// names; NAME being `out`'s), owned by this user, whose writer (PID) is gone, or,
/// for names without a process id, untouched for an hour. Returns how many were removed;
/// anything else is left alone.
pub fn remove_stale_temps(out: &Path) -> usize {
    let Some(name) = out.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return 0;
    };
    let prefix = format!(".{name}.sextant-");
    let Ok(entries) = fs::read_dir(dir_of(out)) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(middle) = file
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".tmp"))
        else {
            continue;
        };
        let Ok(meta) = fs::symlink_metadata(e.path()) else {
            continue;
        };
        if !meta.is_file() || !owned_by_me(&meta) {
            continue;
        }
        let pid = middle.split('-').next().unwrap_or(middle);
        let stale = match pid.parse::<u32>() {
            Ok(pid) => !process_alive(pid),
            Err(_) => meta
                .modified()
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age > STALE_AFTER),
        };
        if stale && fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(unix)]
fn owned_by_me(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.uid() == crate::sys::uid()
}

#[cfg(not(unix))]
fn owned_by_me(_: &fs::Metadata) -> bool {
    true
}

/// Whether process `pid` exists (signal 0 checks without sending anything).
#[cfg(unix)]
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return true; // not a single process: never treat as gone
    }
    crate::sys::process_exists(pid)
}

#[cfg(not(unix))]
fn process_alive(_: u32) -> bool {
    true
}
