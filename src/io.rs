//! Files: reading inputs with a clear error, and writing outputs safely (a temporary
//! file beside the target, renamed into place; never over an existing file without
//! `--force`).

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Largest input file Sextant reads (configs and plans are kilobytes).
const MAX_INPUT_BYTES: u64 = 256 * 1024 * 1024;

pub fn read_text(path: &Path, what: &str) -> Result<String> {
    let meta =
        fs::metadata(path).with_context(|| format!("cannot read {what} '{}'", path.display()))?;
    if meta.is_dir() {
        bail!(
            "{what} '{}' is a directory, expected a file",
            path.display()
        );
    }
    if meta.len() > MAX_INPUT_BYTES {
        bail!(
            "{what} '{}' is {} bytes; at most {MAX_INPUT_BYTES} is accepted",
            path.display(),
            meta.len()
        );
    }
    let bytes =
        fs::read(path).with_context(|| format!("cannot read {what} '{}'", path.display()))?;
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{what} '{}' is not UTF-8 text", path.display()))
}

/// Writes `text` to `path` atomically. Refuses to replace an existing file unless
/// `force`; on any failure the old file (if any) is left as it was.
pub fn write_new(path: &Path, text: &str, force: bool) -> Result<()> {
    if path.exists() && !force {
        bail!(
            "'{}' exists; not overwriting it (pass --force to replace it)",
            path.display()
        );
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = dir.join(format!(".{name}.sextant-{}.tmp", std::process::id()));
    let result = (|| -> Result<()> {
        let mut f = fs::File::create(&tmp)
            .with_context(|| format!("cannot write in '{}'", dir.display()))?;
        f.write_all(text.as_bytes())
            .with_context(|| format!("cannot write '{}'", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("cannot flush '{}'", tmp.display()))?;
        fs::rename(&tmp, path)
            .with_context(|| format!("cannot move the new file into '{}'", path.display()))?;
        Ok(())
    })();
    match result {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            let kept = if path.exists() {
                format!("'{}' is unchanged", path.display())
            } else {
                "nothing was written".to_string()
            };
            Err(e.context(format!("writing '{}' failed ({kept})", path.display())))
        }
    }
}
