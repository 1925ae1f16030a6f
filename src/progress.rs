//! A progress line on stderr for searches that take a while: shown only when
//! stderr is a terminal and the search has run for [`DELAY`], cleared when it ends,
//! so pipes, files and quick searches see nothing.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sextant_planner::search::Progress;

/// How long a search runs before the line appears.
const DELAY: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(100);

/// Runs `work` (a search reporting into the `Progress` it is given) and, beside it,
/// the progress line labelled `what`.
pub fn searching<T: Send>(what: &str, work: impl FnOnce(&Progress) -> T + Send) -> T {
    let progress = Progress::default();
    if !std::io::stderr().is_terminal() {
        return work(&progress);
    }
    let finished = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| show(what, &progress, &finished));
        let out = work(&progress);
        finished.store(true, Ordering::Release);
        out
    })
}

fn show(what: &str, progress: &Progress, finished: &AtomicBool) {
    let start = Instant::now();
    let mut bar: Option<ProgressBar> = None;
    while !finished.load(Ordering::Acquire) {
        std::thread::sleep(TICK);
        if bar.is_none() && start.elapsed() >= DELAY {
            let b =
                ProgressBar::with_draw_target(Some(progress.total()), ProgressDrawTarget::stderr());
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {msg} {bar:30} {pos}/{len} ({elapsed})")
            {
                b.set_style(style);
            }
            b.set_message(what.to_string());
            bar = Some(b);
        }
        if let Some(b) = &bar {
            b.set_length(progress.total());
            b.set_position(progress.done());
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}
