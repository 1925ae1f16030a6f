//! The CLI's calls into the C library (Unix only), each behind a safe function: the
//! only `unsafe` of the `sextant` binary (`main.rs` denies it elsewhere). Every
//! `unsafe` block says why it is sound in a `// SAFETY:` line.

#![allow(unsafe_code)]

/// At start-up, before any thread exists: a write past the file-size limit
/// (RLIMIT_FSIZE) fails with EFBIG instead of killing the process with SIGXFSZ.
pub fn ignore_file_size_signal() {
    // SAFETY: setting a signal's disposition to SIG_IGN (no handler runs) at
    // start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// At start-up, before any thread exists: a closed pipe ends the process quietly
/// (SIGPIPE's default), as it does for other Unix tools.
pub fn default_pipe_signal() {
    // SAFETY: restoring a signal's default disposition (no handler runs) at
    // start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Has the kernel SIGKILL the child `cmd` starts when this process (its parent)
/// dies; the child refuses to start if the parent is already gone.
#[cfg(target_os = "linux")]
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // async-signal-safe functions (prctl, getppid), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before the line above took effect.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the launcher exited"));
            }
            Ok(())
        });
    }
}

/// SIGKILL to every process of group `pgid` (errors ignored: the group may be gone).
pub fn kill_group(pgid: libc::pid_t) {
    // SAFETY: killpg takes any group id and reports a bad one as an error; it
    // touches no memory of this process.
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
}

/// This process's real user id.
pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Whether process `pid` (positive: a single process) may exist: signal 0 checks
/// without sending anything, and only "no such process" counts as gone.
pub fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process
    // exists and touches no memory of this process.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}
