//! Files: reading inputs with a clear error and a bound on what is read, and
//! writing outputs safely (a temporary file with a random name beside the target,
//! published without replacing anything unless `--force`, and then only a regular
//! file; never through a link or onto a device).

use std::fs::{self, FileType, Metadata, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

/// Largest JSON input Sextant reads (configs are kilobytes; a plan file of 10,000
/// ranked plans is tens of megabytes).
const MAX_INPUT_BYTES: u64 = 256 * 1024 * 1024;

/// Largest CSV `validate` reads: the published runs are 15 KB. Its rows are held
/// about 16 times their size in memory, so the cap bounds that too.
pub const MAX_CSV_BYTES: u64 = 8 * 1024 * 1024;

/// Largest training log `calibrate --log` reads. It is read a line at a time, so
/// this bounds the time, not the memory.
pub const MAX_LOG_BYTES: u64 = 16 * 1024 * 1024 * 1024;

/// Longest log line kept; the rest of a longer line is skipped, and the line is
/// handed on as cut off.
pub const MAX_LOG_LINE_BYTES: usize = 1024 * 1024;

/// Largest Kineto trace read (its text is held while its events are folded).
pub const MAX_TRACE_BYTES: u64 = 1024 * 1024 * 1024;

/// What a file type is, for a message.
fn kind(t: &FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a named pipe (FIFO)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

fn regular(meta: &Metadata, path: &Path, what: &str) -> Result<()> {
    if !meta.is_file() {
        bail!(
            "{what} '{}' is {}, expected a regular file",
            path.display(),
            kind(&meta.file_type())
        );
    }
    Ok(())
}

pub fn read_text(path: &Path, what: &str) -> Result<String> {
    read_text_capped(path, what, MAX_INPUT_BYTES)
}

/// Reads a regular file (links followed) of at most `max_bytes` as UTF-8 text.
/// Devices, FIFOs and sockets are refused before they are opened: opening a FIFO
/// waits for a writer, and `/dev/zero` has no length to check.
pub fn read_text_capped(path: &Path, what: &str, max_bytes: u64) -> Result<String> {
    let cannot = || format!("cannot read {what} '{}'", path.display());
    let (file, len) = open_regular(path, what)?;
    let too_big = |n: u64| {
        anyhow!(
            "{what} '{}' is {n} bytes; at most {max_bytes} is accepted",
            path.display()
        )
    };
    if len > max_bytes {
        return Err(too_big(len));
    }
    // The length may change while reading: read at most one byte past the cap.
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .with_context(cannot)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|_| anyhow!("{what} '{}' is not UTF-8 text", path.display()))
}

/// Hands each line of a regular file to `f`, without its newline (and a `\r`
/// before it), with `true` when the line ended with a newline. At most
/// `max_bytes` are read (more is an error) and at most `max_line` bytes of a line
/// are kept: a longer line is handed on cut, as not ended. Bytes that are not
/// UTF-8 are replaced (a log may hold a progress bar's control bytes).
pub fn for_each_line(
    path: &Path,
    what: &str,
    max_bytes: u64,
    max_line: usize,
    mut f: impl FnMut(&str, bool),
) -> Result<()> {
    use std::io::BufRead;
    let cannot = || format!("cannot read {what} '{}'", path.display());
    let (file, len) = open_regular(path, what)?;
    let too_big = |n: u64| {
        anyhow!(
            "{what} '{}' is {n} bytes; at most {max_bytes} is accepted",
            path.display()
        )
    };
    if len > max_bytes {
        return Err(too_big(len));
    }
    let mut r = std::io::BufReader::with_capacity(1 << 16, file.take(max_bytes + 1));
    let mut line: Vec<u8> = Vec::new();
    let (mut total, mut overlong) = (0u64, false);
    let emit = |line: &mut Vec<u8>, ended: bool, f: &mut dyn FnMut(&str, bool)| {
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        f(&String::from_utf8_lossy(line), ended);
        line.clear();
    };
    loop {
        let buf = r.fill_buf().with_context(cannot)?;
        if buf.is_empty() {
            break;
        }
        let (chunk, newline) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], true),
            None => (buf, false),
        };
        let room = max_line.saturating_sub(line.len());
        if chunk.len() > room {
            overlong = true;
        }
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = chunk.len() + usize::from(newline);
        r.consume(used);
        total += used as u64;
        if total > max_bytes {
            return Err(too_big(total));
        }
        if newline {
            emit(&mut line, !overlong, &mut f);
            overlong = false;
        }
    }
    if !line.is_empty() || overlong {
        emit(&mut line, false, &mut f);
    }
    Ok(())
}

/// Opens a regular file (links followed) for reading and returns it with its
/// length. Devices, FIFOs and sockets are refused before they are opened: opening
/// a FIFO waits for a writer, and `/dev/zero` has no length to check.
fn open_regular(path: &Path, what: &str) -> Result<(fs::File, u64)> {
    let cannot = || format!("cannot read {what} '{}'", path.display());
    regular(&fs::metadata(path).with_context(cannot)?, path, what)?;
    let mut opts = OpenOptions::new();
    opts.read(true);
    // Should the path become a FIFO between the check and the open, O_NONBLOCK
    // makes the open return at once (the check below then refuses it); on a
    // regular file it changes nothing.
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let file = opts.open(path).with_context(cannot)?;
    let meta = file.metadata().with_context(cannot)?;
    regular(&meta, path, what)?;
    Ok((file, meta.len()))
}

/// Refuses a target that exists and is not a regular file (a device, a FIFO, a
/// directory, a symbolic link: the link itself, not what it points at), and one
/// that exists at all unless `force`.
fn check_target(path: &Path, force: bool) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() => bail!(
            "'{}' is {}; Sextant replaces only regular files, with or without --force (choose another path)",
            path.display(),
            kind(&m.file_type())
        ),
        Ok(_) if !force => bail!(
            "'{}' exists; not overwriting it (pass --force to replace it)",
            path.display()
        ),
        _ => Ok(()),
    }
}

/// Writes `text` to `path` atomically. The new file is made under a random name in
/// the target's directory (created exclusively, so a planted link is never
/// followed) and then published: without `force` by a rename that fails if the
/// target exists (of two writers racing for one new path, exactly one succeeds);
/// with `force` by a rename over the target, which must be a regular file. On any
/// failure the old file (if any) is left as it was and the temporary removed.
pub fn write_new(path: &Path, text: &str, force: bool) -> Result<()> {
    check_target(path, force)?;
    let Some(name) = path.file_name() else {
        bail!("'{}' names no file to write", path.display());
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let exists = |path: &Path| fs::symlink_metadata(path).is_ok();
    let result = (|| -> Result<()> {
        // `.NAME.sextant-PID-RANDOM.tmp`: unpredictable (created exclusively), and
        // the process id lets `exec` remove what a killed writer left
        // (`exec::output::remove_stale_temps`).
        let prefix = format!(
            ".{}.sextant-{}-",
            name.to_string_lossy(),
            std::process::id()
        );
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        // What `File::create` gives a new file: 0o666 less the umask (the open
        // applies it), not the temporary file's default 0o600.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(fs::Permissions::from_mode(0o666));
        }
        let mut tmp = builder
            .tempfile_in(&dir)
            .with_context(|| format!("cannot write in '{}'", dir.display()))?;
        // Errors name the target, not the temporary file the user never asked for
        // (and which is removed on the way out): written through the file, not the
        // NamedTempFile, whose errors add its path.
        tmp.as_file_mut()
            .write_all(text.as_bytes())
            .with_context(|| format!("cannot write the new contents of '{}'", path.display()))?;
        tmp.as_file()
            .sync_all()
            .with_context(|| format!("cannot flush the new contents of '{}'", path.display()))?;
        let published = if force {
            // Checked again just before the rename; a target swapped for a link or a
            // device between this check and the rename is the remaining race, which
            // only an attacker already able to write in the directory can win.
            check_target(path, true)?;
            // A replaced file keeps its permissions (a 0600 plan stays private).
            #[cfg(unix)]
            if let Ok(old) = fs::symlink_metadata(path) {
                use std::os::unix::fs::PermissionsExt;
                let mode = old.permissions().mode() & 0o7777;
                tmp.as_file()
                    .set_permissions(fs::Permissions::from_mode(mode))
                    .with_context(|| {
                        format!(
                            "cannot give the new '{}' the old file's mode",
                            path.display()
                        )
                    })?;
            }
            tmp.persist(path)
        } else {
            tmp.persist_noclobber(path)
        };
        // A failed publish drops the temporary file (`e.file`), which removes it.
        published.map_err(|e| {
            if e.error.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow!(
                    "'{}' appeared while it was being written; not overwriting it (pass --force to replace it)",
                    path.display()
                )
            } else {
                anyhow!(e.error)
                    .context(format!("cannot move the new file into '{}'", path.display()))
            }
        })?;
        Ok(())
    })();
    result.map_err(|e| {
        let kept = if exists(path) {
            format!("'{}' is unchanged", path.display())
        } else {
            "nothing was written".to_string()
        };
        e.context(format!("writing '{}' failed ({kept})", path.display()))
    })
}

/// Which file a path names: the device and inode of an existing file (links
/// followed), else the canonical parent directory joined with the file name.
#[derive(PartialEq)]
enum Identity {
    Inode(u64, u64),
    Path(PathBuf),
}

fn identity(path: &Path) -> Option<Identity> {
    if let Ok(m) = fs::metadata(path) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            return Some(Identity::Inode(m.dev(), m.ino()));
        }
        #[cfg(not(unix))]
        {
            let _ = m;
            return fs::canonicalize(path).ok().map(Identity::Path);
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(Identity::Path(
        fs::canonicalize(dir).ok()?.join(path.file_name()?),
    ))
}

/// Whether two paths name the same file (a link, a `./` spelling, a hard link);
/// false where either cannot be resolved.
pub fn same_file(a: &str, b: &str) -> bool {
    match (identity(Path::new(a)), identity(Path::new(b))) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

/// Checks a command's output paths before it does any work: each must be a place a
/// regular file can be written (see [`write_new`]; an existing one only with
/// `force`), no two may be the same file, and none may be one of the inputs
/// (`--out plan.json` over the `--model` it reads). Each entry is (flag, path).
/// `exec --out` can use it too.
pub fn check_outputs(outputs: &[(&str, &str)], inputs: &[(&str, &str)], force: bool) -> Result<()> {
    let ids: Vec<Option<Identity>> = outputs
        .iter()
        .map(|(_, p)| identity(Path::new(p)))
        .collect();
    for (i, (flag, path)) in outputs.iter().enumerate() {
        check_target(Path::new(path), force)?;
        let Some(id) = &ids[i] else { continue };
        for (j, (other, other_path)) in outputs.iter().enumerate().take(i) {
            if ids[j].as_ref() == Some(id) {
                bail!("{flag} '{path}' and {other} '{other_path}' are the same file: give each output its own path");
            }
        }
        for (input, input_path) in inputs {
            if identity(Path::new(input_path)).as_ref() == Some(id) {
                bail!("{flag} '{path}' is the same file as the input {input} '{input_path}': write the output elsewhere");
            }
        }
    }
    Ok(())
}
