//! Pipeline schedules simulated as task graphs (petgraph): one training step is a
//! DAG of forward (F), backward (B, the input gradient) and, for zero-bubble
//! schedules, weight-gradient (W) passes per rank, virtual chunk and micro-batch.
//! Edges are the data dependencies — F needs the previous virtual stage's F, B the
//! next one's B (the last virtual stage's B its own F), W its own B — weighted by
//! the point-to-point time when they cross ranks, plus the order each schedule
//! imposes on each rank. Start times follow the topological order; a cycle means
//! the schedule would deadlock.
//!
//! Schedules (per-rank orders as in Megatron-LM's `pipeline_parallel/schedules.py`,
//! the zero-bubble authors' hand schedule, Qi et al. 2023, and DeepSeek-V3's
//! DualPipe): GPipe (all forwards, then all backwards), 1F1B, interleaved 1F1B
//! (virtual stages), ZB-H1 (1F1B with the backward split into B and W, stage i
//! issuing each W i backward steps late so that the W's fill the drain), and
//! DualPipe.
//!
//! DualPipe (DeepSeek-V3 technical report, 2024, section 3.2.1; the phase structure
//! of `DualPipe.step` in deepseek-ai/DualPipe) needs an even number of ranks p and
//! an even number of micro-batches m >= 2p. Rank r holds two model chunks: model
//! stage r (chunk 0) and model stage p-1-r (chunk 1), so every stage's parameters
//! are held twice. Half of the micro-batches (0..m/2, direction 0) enter at rank 0
//! and flow up through chunk 0; the other half (m/2..m, direction 1) enter at rank
//! p-1 and flow down through chunk 1. Each rank runs eight phases: forwards of its
//! nearer direction, paired forwards of both, B-W-F steps with the weight gradient
//! deferred, the steady state of overlapped forward-backward pairs (F of one
//! direction with B of the other, [`overlapped_with_next`]), then the drain, where
//! half of the backwards defer their W to fill the tail. An overlapped pair is one
//! block: it starts when both inputs are there and both outputs leave at its end.
//! The simulator gives the pair the time F + B − overlap · min(F, B)
//! ([`simulate_schedule_with`]); the planner uses overlap 0 (back to back), so it
//! does not credit the communication that DualPipe hides inside a pair. Its
//! blocking sends (`_commit_and_wait_comm`) are not modelled: transfers are
//! edges, as for the other schedules.

mod order;
mod simulate;

pub use order::{overlapped_with_next, rank_order};
pub use simulate::{simulate, simulate_schedule, simulate_schedule_with};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Pass {
    Forward,
    /// Backward; includes the weight gradient unless the schedule splits it off.
    Backward,
    /// Weight gradient (zero-bubble schedules).
    Weight,
}

/// Spelled in files as on the command line (`1f1b`, `zb-h1`, `dualpipe`); plan files
/// of schema version 1 spelled them `one_f_one_b`, `zb_h1`, `dual_pipe`, still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Schedule {
    #[serde(rename = "gpipe")]
    Gpipe,
    #[serde(rename = "1f1b", alias = "one_f_one_b")]
    OneFOneB,
    /// Megatron's interleaved 1F1B (needs v > 1 and m a multiple of p).
    #[serde(rename = "interleaved")]
    Interleaved,
    /// Zero-bubble ZB-H1: bubble (p-1)(T_F + T_B - T_W) at 1F1B's peak memory.
    #[serde(rename = "zb-h1", alias = "zb_h1")]
    ZbH1,
    /// DeepSeek-V3's bidirectional DualPipe: bubble (p/2-1)(T_F&B + T_B,full - 3 T_W),
    /// two copies of every stage's parameters, p+1 stages' worth of activations
    /// (DeepSeek-V3 report, Table 2). Needs even p and an even m >= 2p.
    #[serde(rename = "dualpipe", alias = "dual_pipe")]
    DualPipe,
}

impl Schedule {
    pub const ALL: [Schedule; 5] = [
        Schedule::Gpipe,
        Schedule::OneFOneB,
        Schedule::Interleaved,
        Schedule::ZbH1,
        Schedule::DualPipe,
    ];

    /// Name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Gpipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved",
            Schedule::ZbH1 => "zb-h1",
            Schedule::DualPipe => "dualpipe",
        }
    }

    /// Parses a name ([`Schedule::name`], or the serde spelling).
    pub fn parse(s: &str) -> Option<Schedule> {
        let key = s.trim().to_ascii_lowercase().replace('_', "-");
        Some(match key.as_str() {
            "gpipe" => Schedule::Gpipe,
            "1f1b" | "one-f-one-b" => Schedule::OneFOneB,
            "interleaved" | "interleaved-1f1b" | "vpp" => Schedule::Interleaved,
            "zb-h1" | "zbh1" | "zb1p" => Schedule::ZbH1,
            "dualpipe" | "dual-pipe" => Schedule::DualPipe,
            _ => return None,
        })
    }

    /// What a configuration without a stated schedule runs (Megatron-LM's choice):
    /// interleaved 1F1B with virtual stages, 1F1B without.
    pub fn default_for(vpp: u64) -> Schedule {
        if vpp > 1 {
            Schedule::Interleaved
        } else {
            Schedule::OneFOneB
        }
    }

    /// Virtual stages per rank that the schedule interleaves: `v` under the
    /// interleaved schedule, 1 under every other (a `vpp` elsewhere is ignored).
    pub fn interleaving(self, v: u64) -> u64 {
        if self == Schedule::Interleaved {
            v
        } else {
            1
        }
    }

    /// Model chunks each rank holds: v interleaved, 2 for DualPipe, else 1.
    pub fn chunks_per_rank(self, v: u64) -> u64 {
        match self {
            Schedule::Interleaved => v,
            Schedule::DualPipe => 2,
            _ => 1,
        }
    }

    /// Whether (some) backwards are split into an input-gradient B and a later W.
    pub fn splits_weight_grad(self) -> bool {
        matches!(self, Schedule::ZbH1 | Schedule::DualPipe)
    }

    /// Why `p` ranks, `v` virtual stages and `m` micro-batches cannot run this
    /// schedule in the simulator, if they cannot.
    pub fn shape_error(self, p: u64, v: u64, m: u64) -> Option<String> {
        if p == 0 || m == 0 {
            return Some("needs at least one rank and one micro-batch".into());
        }
        match self {
            Schedule::Interleaved if v < 2 => Some("interleaved 1F1B needs more than one virtual stage per rank".into()),
            Schedule::Interleaved if !m.is_multiple_of(p) => Some(format!("interleaved 1F1B needs the {m} micro-batches to be a multiple of the {p} pipeline ranks")),
            Schedule::ZbH1 if m < p => Some(format!("ZB-H1 needs at least pp = {p} micro-batches (has {m})")),
            Schedule::DualPipe if p < 2 || !p.is_multiple_of(2) => Some(format!("DualPipe needs an even number of pipeline ranks (has {p})")),
            Schedule::DualPipe if !m.is_multiple_of(2) || m < 2 * p => {
                Some(format!("DualPipe needs an even number of micro-batches, at least 2 x pp = {} (has {m})", 2 * p))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub rank: u64,
    /// Model chunk on this rank (0 without interleaving; DualPipe: the direction).
    pub chunk: u64,
    pub micro_batch: u64,
    pub pass: Pass,
    pub start: f64,
    pub end: f64,
}

/// Durations of one chunk's passes. Entry r is rank r's, for each of its chunks;
/// under DualPipe, whose two chunks on a rank are different model stages, entry s
/// is model stage s's (chunk c on rank r takes entry
/// [`virtual_stage`]`(DualPipe, p, v, r, c)`).
#[derive(Debug, Clone, PartialEq)]
pub struct PassCosts {
    pub forward: Vec<f64>,
    /// Input-gradient part of the backward.
    pub backward: Vec<f64>,
    /// Weight-gradient part of the backward.
    pub weight: Vec<f64>,
}

/// A simulated step.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    pub tasks: Vec<Task>,
    pub makespan: f64,
    /// Idle time of each rank within the step.
    pub idle_per_rank: Vec<f64>,
    /// Most micro-batches, in units of one model stage's activations (layers / p),
    /// whose activations a rank holds at once: forwards done minus activations
    /// freed (at W where the weight gradient is split off, else at B), times the
    /// chunk's share of a stage (1/v interleaved, 1 for DualPipe's whole-stage chunks).
    pub peak_in_flight: Vec<f64>,
}

/// One pass on a rank: (pass, model chunk on the rank, micro-batch). Under DualPipe
/// the chunk is the direction and micro-batches are numbered 0..m over both
/// directions (direction 0 runs 0..m/2, direction 1 runs m/2..m).
pub type Op = (Pass, u64, u64);

/// Which model stage chunk `chunk` on `rank` runs. 1F1B, GPipe, ZB-H1 and
/// interleaved 1F1B: `chunk * p + rank` (Megatron's virtual-stage order, so with
/// v = 1 the stage is the rank). DualPipe: chunk 0 is stage `rank` and chunk 1 is
/// stage `p - 1 - rank` (of p stages), so every stage sits on two ranks.
pub fn virtual_stage(schedule: Schedule, p: u64, rank: u64, chunk: u64) -> u64 {
    match schedule {
        Schedule::DualPipe if chunk == 1 => p - 1 - rank,
        Schedule::DualPipe => rank,
        _ => chunk * p + rank,
    }
}

/// The (rank, chunk) that runs model stage `stage` for micro-batch `mb`: the
/// inverse of [`virtual_stage`] (under DualPipe it depends on the micro-batch's
/// direction).
pub fn locate(schedule: Schedule, p: u64, m: u64, stage: u64, mb: u64) -> (u64, u64) {
    match schedule {
        Schedule::DualPipe if mb >= m / 2 => (p - 1 - stage, 1),
        Schedule::DualPipe => (stage, 0),
        _ => (stage % p, stage / p),
    }
}

/// Makespan of a simulated step.
pub fn makespan(tasks: &[Task]) -> f64 {
    tasks.iter().map(|t| t.end).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests;
