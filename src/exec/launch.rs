//! `exec --ranks N`: starts N local ranks of this same command and waits for them,
//! bounded. The ranks share a fresh random job secret (`SEXTANT_JOB_SECRET`, passed
//! in their environment, never on a command line), run in a process group of their
//! own, and do not outlive the launcher: SIGTERM, SIGINT or SIGHUP to it kills the
//! group, and on Linux each rank also gets SIGKILL when the launcher dies
//! (`PR_SET_PDEATHSIG`), even by SIGKILL.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use sextant_executor::auth::{JobKey, SECRET_VAR};

/// The signals that stop the launcher and its ranks.
#[cfg(unix)]
const STOP: [(i32, &str); 3] = [
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGINT, "SIGINT"),
    (libc::SIGHUP, "SIGHUP"),
];

/// Records the last stop signal received (0: none).
fn watch_signals() -> Result<Arc<AtomicUsize>> {
    let got = Arc::new(AtomicUsize::new(0));
    #[cfg(unix)]
    for (sig, _) in STOP {
        signal_hook::flag::register_usize(sig, got.clone(), sig as usize)
            .with_context(|| format!("installing a handler for signal {sig}"))?;
    }
    Ok(got)
}

fn signal_name(sig: usize) -> String {
    #[cfg(unix)]
    if let Some((_, n)) = STOP.iter().find(|(s, _)| *s as usize == sig) {
        return n.to_string();
    }
    format!("signal {sig}")
}

/// Puts the child in process group `pgid` (0: a new one led by itself) and, on
/// Linux, has the kernel kill it when this launcher dies.
#[cfg(unix)]
fn confine(cmd: &mut Command, pgid: i32) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(pgid);
    #[cfg(target_os = "linux")]
    crate::sys::die_with_parent(cmd);
}

/// Kills every started rank (the whole group at once, then each by id) and reaps them.
fn kill_all(children: &mut [(u64, Child)], pgid: Option<u32>) {
    #[cfg(unix)]
    if let Some(g) = pgid.and_then(|g| libc::pid_t::try_from(g).ok()) {
        // The group this launcher created for its ranks.
        crate::sys::kill_group(g);
    }
    #[cfg(not(unix))]
    let _ = pgid;
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
}

/// Starts `n` local ranks of this same command (its arguments minus `--ranks`) and
/// waits for them, bounded by `2 x timeout + 10` seconds.
pub fn launch_local(n: u64, timeout_secs: u64) -> Result<()> {
    let stop = watch_signals()?;
    let secret = JobKey::generate().map_err(|e| anyhow!(e))?;
    let port = TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .context("finding a free port for the rendezvous")?
        .port();
    let exe = std::env::current_exe().context("locating the sextant binary")?;
    let mut args: Vec<String> = Vec::new();
    let mut skip = false;
    for x in std::env::args().skip(1) {
        if skip {
            skip = false;
        } else if x == "--ranks" {
            skip = true;
        } else if !x.starts_with("--ranks=") {
            args.push(x);
        }
    }
    let mut children: Vec<(u64, Child)> = Vec::new();
    let mut pgid: Option<u32> = None;
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(SECRET_VAR, &secret)
            .stdin(Stdio::null());
        #[cfg(unix)]
        confine(&mut cmd, pgid.map_or(0, |g| g as i32));
        let started = cmd.spawn();
        match started {
            Ok(c) => {
                pgid.get_or_insert(c.id());
                children.push((r, c));
            }
            Err(e) => {
                kill_all(&mut children, pgid);
                bail!(
                    "starting local rank {r} failed: {e} (the {} started before it were stopped)",
                    children.len()
                );
            }
        }
        if stop.load(Ordering::Relaxed) != 0 {
            break;
        }
    }
    // Every rank bounds its own waits by --timeout; allow the rendezvous plus one
    // more timeout before killing stragglers.
    let limit = 2 * timeout_secs + 10;
    let deadline = Instant::now() + Duration::from_secs(limit);
    let mut failed: Vec<String> = Vec::new();
    let mut running = children;
    while !running.is_empty() {
        let sig = stop.load(Ordering::Relaxed);
        if sig != 0 {
            let k = running.len();
            kill_all(&mut running, pgid);
            bail!(
                "stopped by {}: killed the {k} local rank{} still running",
                signal_name(sig),
                if k == 1 { "" } else { "s" }
            );
        }
        let mut still = Vec::new();
        for (r, mut c) in running {
            match c.try_wait() {
                Ok(Some(st)) if st.success() => {}
                Ok(Some(st)) => failed.push(format!(
                    "rank {r} exited with {}",
                    st.code()
                        .map_or("a signal".to_string(), |c| format!("status {c}"))
                )),
                Ok(None) if Instant::now() >= deadline => {
                    let _ = c.kill();
                    let _ = c.wait();
                    failed.push(format!(
                        "rank {r} was still running after {limit} s and was killed"
                    ));
                }
                Ok(None) => still.push((r, c)),
                Err(e) => failed.push(format!("rank {r}: {e}")),
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(10));
    }
    if !failed.is_empty() {
        bail!(
            "{} of {n} local ranks failed: {}",
            failed.len(),
            failed.join("; ")
        );
    }
    Ok(())
}
