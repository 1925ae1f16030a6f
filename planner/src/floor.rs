//! Physical floors of a training step: times no schedule can beat, given the
//! cost model's own per-stage work. They are computed from the stage times alone,
//! independently of the closed-form bubbles and of the schedule simulation
//! ([`crate::schedule`]), so that a wrong schedule (one that loses a dependency or
//! double-books a rank) shows up as a plan below its floor instead of a fast plan.
//!
//! For `p` pipeline ranks, `m` micro-batches, rank `r` busy `t_r` per micro-batch
//! (all of its virtual chunks; under DualPipe the mean of its two stages) and the
//! optimizer step after the pipeline:
//! - **busy**: a rank computes one pass at a time, so the pipeline lasts at least
//!   `m * t_r` on every rank;
//! - **path**: one micro-batch runs its forward through every stage and its
//!   backward back through every stage, one after the other: at least the sum of
//!   the stages' times;
//! - **fill and drain** (1F1B, interleaved 1F1B and GPipe, whose backwards run
//!   whole): rank `r` starts only after micro-batch 0 has passed the first chunk of
//!   ranks `0..r`, and after its last backward the gradient must still pass back
//!   through the first chunk of ranks `r-1..0`; a forward and a backward of one
//!   chunk together take that chunk's time, `t_i / v` with even chunks. So at least
//!   `sum_{i<r} t_i / v + m * t_r`. Not applied to uneven layouts (the first
//!   chunk's share is unknown there) nor to schedules that defer weight gradients
//!   (a deferred W may run during another rank's drain).
//!
//! The step floor is the largest of these plus the optimizer step, which runs
//! after the last gradient. Communication is left out: it can only add.

use crate::config::{Layout, ParallelConfig};
use crate::cost::Estimate;
use crate::schedule::Schedule;

/// The floors of one estimate, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floor {
    /// Most micro-batch work on one rank: `max_r m * t_r`.
    pub busy_secs: f64,
    /// One micro-batch's forward and backward through every stage.
    pub path_secs: f64,
    /// Fill, busy time and drain of the worst rank (0 where it does not apply).
    pub fill_drain_secs: f64,
    /// The optimizer step that follows the pipeline.
    pub optimizer_secs: f64,
}

impl Floor {
    /// The step's floor: the largest pipeline floor, plus the optimizer.
    pub fn step_secs(&self) -> f64 {
        self.busy_secs.max(self.path_secs).max(self.fill_drain_secs) + self.optimizer_secs
    }

    /// Which floor binds: `busy`, `path` or `fill/drain`.
    pub fn binding(&self) -> &'static str {
        if self.fill_drain_secs >= self.busy_secs.max(self.path_secs) && self.fill_drain_secs > 0.0
        {
            "fill/drain"
        } else if self.path_secs > self.busy_secs {
            "path"
        } else {
            "busy"
        }
    }
}

/// Pipeline floors for `m` micro-batches over stages taking `stage_secs` each per
/// micro-batch (entry `i` is rank `i`'s work over all its chunks, or under
/// DualPipe model stage `i`), with `v` chunks per rank under interleaving.
pub fn pipeline_floor(
    schedule: Schedule,
    v: u64,
    m: u64,
    stage_secs: &[f64],
    even_chunks: bool,
) -> (f64, f64, f64) {
    let p = stage_secs.len();
    if p == 0 {
        return (0.0, 0.0, 0.0);
    }
    let mf = m as f64;
    let rank = |r: usize| {
        if schedule == Schedule::DualPipe {
            0.5 * (stage_secs[r] + stage_secs[p - 1 - r])
        } else {
            stage_secs[r]
        }
    };
    let busy = (0..p).map(|r| mf * rank(r)).fold(0.0, f64::max);
    let path: f64 = stage_secs.iter().sum();
    let whole_backwards = matches!(
        schedule,
        Schedule::OneFOneB | Schedule::Interleaved | Schedule::Gpipe
    );
    let fill_drain = if whole_backwards && even_chunks && p > 1 {
        let v = schedule.interleaving(v.max(1)) as f64;
        let mut before = 0.0;
        let mut worst = 0.0f64;
        for &t in stage_secs {
            worst = worst.max(before / v + mf * t);
            before += t;
        }
        worst
    } else {
        0.0
    };
    (busy, path, fill_drain)
}

/// The floors of an estimate of `cfg`, from its stages' times.
pub fn floor_of(e: &Estimate, cfg: &ParallelConfig) -> Floor {
    let secs: Vec<f64> = e.stages.iter().map(|s| s.secs_per_micro_batch).collect();
    let even = matches!(cfg.layout, Layout::Even);
    let (busy, path, fill_drain) = if secs.len() > 1 {
        pipeline_floor(cfg.schedule, cfg.vpp, e.micro_batches, &secs, even)
    } else {
        (
            secs.first().copied().unwrap_or(0.0) * e.micro_batches as f64,
            0.0,
            0.0,
        )
    };
    Floor {
        busy_secs: busy,
        path_secs: path,
        fill_drain_secs: fill_drain,
        optimizer_secs: e.time.optimizer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_by_hand() {
        // 4 even stages of 1 s, 8 micro-batches: busy 8, path 4, 1F1B fill/drain 3 + 8.
        let s = [1.0; 4];
        assert_eq!(
            pipeline_floor(Schedule::OneFOneB, 1, 8, &s, true),
            (8.0, 4.0, 11.0)
        );
        // Interleaved with 4 chunks per rank: the fill and drain pass a quarter stage each.
        assert_eq!(
            pipeline_floor(Schedule::Interleaved, 4, 8, &s, true),
            (8.0, 4.0, 8.75)
        );
        // One micro-batch: the path binds.
        let (b, p, f) = pipeline_floor(Schedule::Interleaved, 4, 1, &s, true);
        assert_eq!((b, p), (1.0, 4.0));
        assert!(f < p);
        // ZB-H1 defers weight gradients: no fill/drain floor.
        assert_eq!(pipeline_floor(Schedule::ZbH1, 1, 8, &s, true).2, 0.0);
        // DualPipe: rank r runs stages r and p-1-r for half the micro-batches each.
        let s = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(
            pipeline_floor(Schedule::DualPipe, 1, 8, &s, true),
            (20.0, 10.0, 0.0)
        );
        // Uneven 1F1B: the slow last stage waits for the fill of the three before it.
        assert_eq!(
            pipeline_floor(Schedule::OneFOneB, 1, 8, &s, true).2,
            6.0 + 32.0
        );
    }
}
