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

use std::collections::VecDeque;

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;
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
pub fn virtual_stage(schedule: Schedule, p: u64, v: u64, rank: u64, chunk: u64) -> u64 {
    let _ = v;
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

/// Virtual micro-batch k -> (chunk, micro-batch) in Megatron's interleaving, which
/// groups micro-batches p at a time.
fn interleaved_fwd(p: u64, v: u64, k: u64) -> (u64, u64) {
    if v == 1 {
        (0, k)
    } else {
        ((k / p) % v, (k / (p * v)) * p + k % p)
    }
}

/// The order of passes on `rank` under `s` (what the simulator and the executor
/// both follow). Chunk `c` on rank `r` runs model stage [`virtual_stage`]`(s, p, v, r, c)`.
pub fn rank_order(s: Schedule, p: u64, v: u64, m: u64, rank: u64) -> Vec<Op> {
    rank_program(s, p, v, m, rank)
        .into_iter()
        .map(|(op, _)| op)
        .collect()
}

/// For each entry of [`rank_order`]: whether it runs overlapped with the next one
/// as one forward-backward block (DualPipe's steady state: the forward of one
/// direction with the backward of the other, their computation and communication
/// interleaved). Running the two back to back instead is correct, only slower.
pub fn overlapped_with_next(s: Schedule, p: u64, v: u64, m: u64, rank: u64) -> Vec<bool> {
    rank_program(s, p, v, m, rank)
        .into_iter()
        .map(|(_, fused)| fused)
        .collect()
}

/// The rank's passes, each with whether it is overlapped with the next.
fn rank_program(s: Schedule, p: u64, v: u64, m: u64, rank: u64) -> Vec<(Op, bool)> {
    let mut order = Vec::new();
    match s {
        Schedule::Gpipe => {
            order.extend((0..m).map(|j| (Pass::Forward, 0, j)));
            order.extend((0..m).map(|j| (Pass::Backward, 0, j)));
        }
        Schedule::DualPipe => return dualpipe_program(p, m, rank),
        Schedule::OneFOneB | Schedule::Interleaved | Schedule::ZbH1 => {
            let v = if s == Schedule::Interleaved { v } else { 1 };
            let total = m * v;
            let bwd = |k: u64| {
                let (c, mb) = interleaved_fwd(p, v, k);
                (v - 1 - c, mb)
            };
            let warmup = if v == 1 {
                (p - rank - 1).min(m)
            } else {
                ((p - rank - 1) * 2 + (v - 1) * p).min(total)
            };
            // ZB-H1: stage `rank` runs W(j - rank) right after B(j) once j >= rank,
            // and the last `rank` W's after its final B.
            let lag = if s == Schedule::ZbH1 { rank } else { 0 };
            let mut backs = 0u64;
            let mut weights = 0u64;
            let mut push_b = |order: &mut Vec<Op>, i: u64| {
                let (c, mb) = bwd(i);
                order.push((Pass::Backward, c, mb));
                backs += 1;
                if s == Schedule::ZbH1 && backs > lag {
                    order.push((Pass::Weight, 0, weights));
                    weights += 1;
                }
            };
            for k in 0..warmup {
                let (c, mb) = interleaved_fwd(p, v, k);
                order.push((Pass::Forward, c, mb));
            }
            for i in 0..(total - warmup) {
                let (c, mb) = interleaved_fwd(p, v, warmup + i);
                order.push((Pass::Forward, c, mb));
                push_b(&mut order, i);
            }
            for i in (total - warmup)..total {
                push_b(&mut order, i);
            }
            if s == Schedule::ZbH1 {
                while weights < m {
                    order.push((Pass::Weight, 0, weights));
                    weights += 1;
                }
            }
        }
    }
    order.into_iter().map(|op| (op, false)).collect()
}

/// DualPipe's eight phases on one rank. "Near" is the direction in which this rank
/// is in the first half of the path (direction 0 on ranks 0..p/2, direction 1 on
/// the others), "far" the other one; `h` = p/2 and `d` = min(rank, p-1-rank) is
/// the rank's distance from its end of the pipeline.
fn dualpipe_program(p: u64, m: u64, rank: u64) -> Vec<(Op, bool)> {
    struct State {
        per_dir: u64,
        next_f: [u64; 2],
        next_b: [u64; 2],
        /// Deferred weight gradients, run first in first out.
        deferred: VecDeque<(u64, u64)>,
        out: Vec<(Op, bool)>,
    }
    impl State {
        fn f(&mut self, dir: u64, fused: bool) {
            let mb = dir * self.per_dir + self.next_f[dir as usize];
            self.next_f[dir as usize] += 1;
            self.out.push(((Pass::Forward, dir, mb), fused));
        }
        fn b(&mut self, dir: u64, defer_w: bool) {
            let mb = dir * self.per_dir + self.next_b[dir as usize];
            self.next_b[dir as usize] += 1;
            self.out.push(((Pass::Backward, dir, mb), false));
            if defer_w {
                self.deferred.push_back((dir, mb));
            }
        }
        fn w(&mut self) {
            if let Some((dir, mb)) = self.deferred.pop_front() {
                self.out.push(((Pass::Weight, dir, mb), false));
            }
        }
    }
    if p < 2 || m < 2 {
        return Vec::new();
    }
    let h = p / 2;
    let d = rank.min(p - 1 - rank);
    let middle = d + 1 == h;
    let near = u64::from(rank >= h);
    let far = 1 - near;
    let mut st = State {
        per_dir: m / 2,
        next_f: [0, 0],
        next_b: [0, 0],
        deferred: VecDeque::new(),
        out: Vec::new(),
    };
    let outer = h - d - 1;
    // 1. Forwards of the near direction fill the pipe.
    for _ in 0..2 * outer {
        st.f(near, false);
    }
    // 2. Forwards of both directions, alternating.
    for _ in 0..=d {
        st.f(near, false);
        st.f(far, false);
    }
    // 3. Far backward (weight gradient deferred), a deferred W, far forward.
    for _ in 0..outer {
        st.b(far, true);
        st.w();
        st.f(far, false);
    }
    // 4. Steady state: near forward with far backward, far forward with near
    //    backward, each pair overlapped (the middle ranks run their first pair
    //    back to back).
    for i in 0..(st.per_dir + d + 1).saturating_sub(p) {
        st.f(near, !(i == 0 && middle));
        st.b(far, false);
        st.f(far, true);
        st.b(near, false);
    }
    // 5. Far backward, then far forward overlapped with near backward.
    for _ in 0..outer {
        st.b(far, false);
        st.f(far, true);
        st.b(near, false);
    }
    // 6. Backwards of both directions; from halfway on they defer their W.
    let (mut defer, halfway, odd) = (false, d.div_ceil(2), !d.is_multiple_of(2));
    for i in 0..=d {
        if i == halfway && odd {
            defer = true;
        }
        st.b(far, defer);
        if i == halfway && !odd {
            defer = true;
        }
        st.b(near, defer);
    }
    // 7. A deferred W, then a near backward that defers its own.
    for _ in 0..outer {
        st.w();
        st.b(near, true);
    }
    // 8. The remaining deferred W's.
    while !st.deferred.is_empty() {
        st.w();
    }
    st.out
}

/// Simulates one step of `schedule`. `None` when the shape is not one the schedule
/// supports ([`Schedule::shape_error`]) or it would deadlock. Overlapped
/// forward-backward pairs (DualPipe) run back to back: [`simulate_schedule_with`]
/// with overlap 0.
pub fn simulate_schedule(
    schedule: Schedule,
    p: u64,
    v: u64,
    m: u64,
    costs: &PassCosts,
    p2p_secs: f64,
) -> Option<Timeline> {
    simulate_schedule_with(schedule, p, v, m, costs, p2p_secs, 0.0)
}

/// [`simulate_schedule`] where an overlapped forward-backward pair ([`overlapped_with_next`])
/// lasts T_F + T_B − `overlap` · min(T_F, T_B): `overlap` 0 runs them back to back,
/// 1 hides the shorter one entirely (the paper's T_F&B). The pair's two passes are
/// drawn as its two halves, scaled to the pair's time.
pub fn simulate_schedule_with(
    schedule: Schedule,
    p: u64,
    v: u64,
    m: u64,
    costs: &PassCosts,
    p2p_secs: f64,
    overlap: f64,
) -> Option<Timeline> {
    let v = if schedule == Schedule::Interleaved {
        v
    } else {
        1
    };
    if schedule.shape_error(p, v, m).is_some() || v == 0 || !(0.0..=1.0).contains(&overlap) {
        return None;
    }
    let pu = p as usize;
    if costs.forward.len() != pu || costs.backward.len() != pu || costs.weight.len() != pu {
        return None;
    }
    let chunks = schedule.chunks_per_rank(v);
    let stages = if schedule == Schedule::DualPipe {
        p
    } else {
        p * chunks
    };
    let programs: Vec<Vec<(Op, bool)>> =
        (0..p).map(|r| rank_program(schedule, p, v, m, r)).collect();
    let idx = |r: u64, pass: Pass, c: u64, mb: u64| -> usize {
        let kind = match pass {
            Pass::Forward => 0,
            Pass::Backward => 1,
            Pass::Weight => 2,
        };
        (((r * 3 + kind) * chunks + c) * m + mb) as usize
    };
    let slots = (p * 3 * chunks * m) as usize;
    let mut node: Vec<Option<NodeIndex>> = vec![None; slots];
    // A backward whose weight gradient runs as a separate W.
    let mut split = vec![false; slots];
    let mut g: DiGraph<Task, f64> = DiGraph::with_capacity(slots, 3 * slots);
    for (r, prog) in programs.iter().enumerate() {
        for &((pass, c, mb), _) in prog {
            if c >= chunks || mb >= m {
                return None;
            }
            let t = Task {
                rank: r as u64,
                chunk: c,
                micro_batch: mb,
                pass,
                start: 0.0,
                end: 0.0,
            };
            let i = idx(r as u64, pass, c, mb);
            if node[i].is_some() {
                return None;
            }
            node[i] = Some(g.add_node(t));
            if pass == Pass::Weight {
                split[idx(r as u64, Pass::Backward, c, mb)] = true;
            }
        }
    }
    let get = |r: u64, pass: Pass, c: u64, mb: u64| node[idx(r, pass, c, mb)];
    let cost_index = |r: u64, c: u64| {
        if schedule == Schedule::DualPipe {
            virtual_stage(schedule, p, v, r, c) as usize
        } else {
            r as usize
        }
    };
    let dur = |r: u64, (pass, c, mb): Op| -> f64 {
        let k = cost_index(r, c);
        match pass {
            Pass::Forward => costs.forward[k],
            Pass::Backward if split[idx(r, Pass::Backward, c, mb)] => costs.backward[k],
            Pass::Backward => costs.backward[k] + costs.weight[k],
            Pass::Weight => costs.weight[k],
        }
    };
    // The node whose end releases a pass's outputs: the pass itself, or the
    // second half of the overlapped pair it belongs to.
    let mut release: Vec<Option<NodeIndex>> = vec![None; slots];
    let mut durations: Vec<f64> = vec![0.0; g.node_count()];
    for (r, prog) in programs.iter().enumerate() {
        let r = r as u64;
        let mut i = 0;
        while i < prog.len() {
            let (a, fused) = prog[i];
            let na = get(r, a.0, a.1, a.2)?;
            if fused && i + 1 < prog.len() {
                let b = prog[i + 1].0;
                let nb = get(r, b.0, b.1, b.2)?;
                let (da, db) = (dur(r, a), dur(r, b));
                let pair = da + db - overlap * da.min(db);
                let k = if da + db > 0.0 { pair / (da + db) } else { 1.0 };
                durations[na.index()] = k * da;
                durations[nb.index()] = k * db;
                release[idx(r, a.0, a.1, a.2)] = Some(nb);
                release[idx(r, b.0, b.1, b.2)] = Some(nb);
                i += 2;
            } else {
                durations[na.index()] = dur(r, a);
                release[idx(r, a.0, a.1, a.2)] = Some(na);
                i += 1;
            }
        }
    }
    // The pass another one waits for (its slot), and the transfer time between them.
    let dependency = |r: u64, (pass, c, mb): Op| -> Option<(usize, f64)> {
        let s = virtual_stage(schedule, p, v, r, c);
        let cross = |other: u64| if other == r { 0.0 } else { p2p_secs };
        match pass {
            Pass::Forward if s > 0 => {
                let (rr, cc) = locate(schedule, p, m, s - 1, mb);
                Some((idx(rr, Pass::Forward, cc, mb), cross(rr)))
            }
            Pass::Forward => None,
            Pass::Backward if s + 1 < stages => {
                let (rr, cc) = locate(schedule, p, m, s + 1, mb);
                Some((idx(rr, Pass::Backward, cc, mb), cross(rr)))
            }
            Pass::Backward => Some((idx(r, Pass::Forward, c, mb), 0.0)),
            Pass::Weight => Some((idx(r, Pass::Backward, c, mb), 0.0)),
        }
    };
    for (r, prog) in programs.iter().enumerate() {
        let r = r as u64;
        // Rank order.
        for w in prog.windows(2) {
            let (a, b) = (w[0].0, w[1].0);
            g.add_edge(get(r, a.0, a.1, a.2)?, get(r, b.0, b.1, b.2)?, 0.0);
        }
        // Data dependencies; an overlapped pair starts only when both inputs are in.
        for (i, &(op, fused)) in prog.iter().enumerate() {
            let me = get(r, op.0, op.1, op.2)?;
            let partner = if fused {
                prog.get(i + 1).and_then(|&(next, _)| dependency(r, next))
            } else {
                None
            };
            for (d, secs) in [dependency(r, op), partner].into_iter().flatten() {
                let from = release[d]?;
                if from != me {
                    g.add_edge(from, me, secs);
                }
            }
        }
    }
    let sorted = toposort(&g, None).ok()?;
    for n in sorted {
        let start = g
            .edges_directed(n, petgraph::Direction::Incoming)
            .map(|e| g[e.source()].end + *e.weight())
            .fold(0.0, f64::max);
        let t = &mut g[n];
        t.start = start;
        t.end = start + durations[n.index()];
    }
    let tasks: Vec<Task> = g.node_weights().copied().collect();
    let makespan = tasks.iter().map(|t| t.end).fold(0.0, f64::max);
    let mut idle = vec![makespan; pu];
    for t in &tasks {
        idle[t.rank as usize] -= t.end - t.start;
    }
    // Activations live from a chunk's forward until its weight gradient (or its
    // backward when that includes the weight gradient).
    let share = if schedule == Schedule::Interleaved {
        1.0 / v as f64
    } else {
        1.0
    };
    let peak_in_flight = programs
        .iter()
        .enumerate()
        .map(|(r, prog)| {
            let (mut live, mut peak) = (0i64, 0i64);
            for &((pass, c, mb), _) in prog {
                match pass {
                    Pass::Forward => live += 1,
                    Pass::Backward if !split[idx(r as u64, Pass::Backward, c, mb)] => live -= 1,
                    Pass::Weight => live -= 1,
                    Pass::Backward => {}
                }
                peak = peak.max(live);
            }
            peak as f64 * share
        })
        .collect();
    Some(Timeline {
        tasks,
        makespan,
        idle_per_rank: idle,
        peak_in_flight,
    })
}

/// 1F1B (v = 1) or interleaved 1F1B: the timeline the report draws. `None` when
/// interleaving's shape rules are not met or the schedule would deadlock.
pub fn simulate(
    p: u64,
    v: u64,
    m: u64,
    fwd_secs: &[f64],
    bwd_secs: &[f64],
    p2p_secs: f64,
) -> Option<Vec<Task>> {
    let schedule = Schedule::default_for(v);
    let costs = PassCosts {
        forward: fwd_secs.to_vec(),
        backward: bwd_secs.to_vec(),
        weight: vec![0.0; fwd_secs.len()],
    };
    simulate_schedule(schedule, p, v, m, &costs, p2p_secs).map(|t| t.tasks)
}

/// Makespan of a simulated step.
pub fn makespan(tasks: &[Task]) -> f64 {
    tasks.iter().map(|t| t.end).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uniform(p: u64, f: f64, b: f64, w: f64) -> PassCosts {
        PassCosts {
            forward: vec![f; p as usize],
            backward: vec![b; p as usize],
            weight: vec![w; p as usize],
        }
    }

    /// Identical stages, free communication: the bubble equals the closed form
    /// (p-1)/m for 1F1B and GPipe and (p-1)/(v m) interleaved, relative to the ideal
    /// m (t_f + t_b).
    #[test]
    fn bubble_matches_closed_form() {
        for (s, p, v, m) in [
            (Schedule::OneFOneB, 4u64, 1u64, 8u64),
            (Schedule::OneFOneB, 8, 1, 32),
            (Schedule::Gpipe, 4, 1, 8),
            (Schedule::Interleaved, 4, 2, 8),
            (Schedule::Interleaved, 8, 4, 16),
            (Schedule::Interleaved, 2, 3, 4),
        ] {
            let costs = uniform(p, 1.0 / v as f64, 2.0 / v as f64, 0.0);
            let tl = simulate_schedule(s, p, v, m, &costs, 0.0).unwrap();
            assert_eq!(tl.tasks.len() as u64, 2 * p * v * m);
            let ideal = m as f64 * 3.0;
            let bubble = (tl.makespan - ideal) / ideal;
            let closed = (p - 1) as f64 / (v * m) as f64;
            assert!(
                (bubble - closed).abs() <= 0.005 * closed,
                "{s:?} p{p} v{v} m{m}: simulated {bubble}, closed form {closed}"
            );
        }
    }

    /// ZB-H1's bubble is (p-1)(T_F + T_B - T_W) (Qi et al. 2023), a third of
    /// 1F1B's (p-1)(T_F + T_B + T_W) when the three passes cost the same; its peak
    /// in-flight count (on the first stage) is 1F1B's.
    #[test]
    fn zero_bubble_h1() {
        for (p, m, f, b, w) in [
            (4u64, 8u64, 1.0, 1.0, 1.0),
            (4, 16, 1.0, 1.0, 1.0),
            (8, 24, 1.0, 1.2, 0.8),
            (2, 4, 1.0, 1.0, 0.5),
        ] {
            let costs = uniform(p, f, b, w);
            let zb = simulate_schedule(Schedule::ZbH1, p, 1, m, &costs, 0.0).unwrap();
            let fb = simulate_schedule(Schedule::OneFOneB, p, 1, m, &costs, 0.0).unwrap();
            let work = m as f64 * (f + b + w);
            let (pm1, eps) = ((p - 1) as f64, 1e-9);
            assert!(
                (zb.makespan - (work + pm1 * (f + b - w))).abs() < eps,
                "p{p} m{m}: ZB-H1 makespan {}",
                zb.makespan
            );
            assert!(
                (fb.makespan - (work + pm1 * (f + b + w))).abs() < eps,
                "p{p} m{m}: 1F1B makespan {}",
                fb.makespan
            );
            assert_eq!(zb.peak_in_flight[0], fb.peak_in_flight[0]);
        }
    }

    #[test]
    fn in_flight_micro_batches_per_stage() {
        let (p, m) = (4u64, 8u64);
        let costs = uniform(p, 1.0, 2.0, 0.0);
        let fb = simulate_schedule(Schedule::OneFOneB, p, 1, m, &costs, 0.0).unwrap();
        assert_eq!(fb.peak_in_flight, vec![4.0, 3.0, 2.0, 1.0]);
        let gp = simulate_schedule(Schedule::Gpipe, p, 1, m, &costs, 0.0).unwrap();
        assert!(gp.peak_in_flight.iter().all(|&x| x == m as f64));
        // Interleaved: p + (p-1)/v stage-worths on the first rank (Korthikanti et al.).
        let il = simulate_schedule(
            Schedule::Interleaved,
            p,
            2,
            m,
            &uniform(p, 0.5, 1.0, 0.0),
            0.0,
        )
        .unwrap();
        assert_eq!(il.peak_in_flight[0], 4.0 + 3.0 / 2.0);
    }

    #[test]
    fn no_rank_overlaps_itself_and_dependencies_hold() {
        let costs = PassCosts {
            forward: vec![1.0, 1.2, 1.0, 0.9],
            backward: vec![2.0, 2.1, 2.0, 2.4],
            weight: vec![0.0; 4],
        };
        let tasks = simulate_schedule(Schedule::Interleaved, 4, 2, 8, &costs, 0.05)
            .unwrap()
            .tasks;
        for r in 0..4 {
            let mut mine: Vec<&Task> = tasks.iter().filter(|t| t.rank == r).collect();
            mine.sort_by(|a, b| a.start.total_cmp(&b.start));
            for w in mine.windows(2) {
                assert!(w[0].end <= w[1].start + 1e-12);
            }
        }
        for t in tasks.iter().filter(|t| t.pass == Pass::Backward) {
            let f = tasks
                .iter()
                .find(|f| {
                    f.pass == Pass::Forward
                        && f.rank == t.rank
                        && f.chunk == t.chunk
                        && f.micro_batch == t.micro_batch
                })
                .unwrap();
            assert!(f.end <= t.start + 1e-12);
        }
        assert!(
            simulate(4, 2, 6, &[1.0; 4], &[2.0; 4], 0.0).is_none(),
            "m not a multiple of p with interleaving"
        );
    }

    /// DualPipe's bubble in DeepSeek-V3's Table 2 (and the DualPipe README):
    /// (PP/2 - 1)(F&B + B - 3W), with B the full backward (input and weight
    /// gradient) and F&B the time of an overlapped forward-backward pair. With
    /// identical stages and free communication, every rank does the same work, so
    /// the bubble is each rank's idle time; the paper's expression is the largest
    /// of them (the middle ranks'). It holds exactly when the input-gradient pass
    /// costs what the forward does (T_B,input = T_F, as the paper's figure draws
    /// them) and T_W <= T_F, for any overlap of the pair; other ratios move the
    /// critical path off the paper's count.
    #[test]
    fn dualpipe_bubble_matches_paper() {
        for (p, m) in [
            (2u64, 4u64),
            (4, 8),
            (4, 20),
            (6, 12),
            (8, 16),
            (8, 20),
            (8, 32),
            (12, 30),
            (16, 32),
            (16, 48),
        ] {
            for (f, w) in [(1.0, 1.0), (1.0, 0.5), (1.0, 0.0), (0.7, 0.3)] {
                for overlap in [0.0, 0.5, 1.0] {
                    let b = f;
                    let costs = uniform(p, f, b, w);
                    let tl =
                        simulate_schedule_with(Schedule::DualPipe, p, 1, m, &costs, 0.0, overlap)
                            .unwrap();
                    let full_b = b + w;
                    let f_and_b = f + full_b - overlap * f64::min(f, full_b);
                    let paper = (p as f64 / 2.0 - 1.0) * (f_and_b + full_b - 3.0 * w);
                    let bubble = tl.idle_per_rank.iter().copied().fold(0.0, f64::max);
                    assert!((bubble - paper).abs() < 1e-9, "p{p} m{m} f{f} w{w} overlap {overlap}: simulated bubble {bubble}, paper {paper}");
                }
            }
        }
        // Against 1F1B's (p-1)(F+B) and ZB-H1's (p-1)(F+B-2W) (full B) at the same
        // per-stage costs, pairs back to back: p = 8, F = B = W = 1 gives 6 vs 21 vs 7.
        let costs = uniform(8, 1.0, 1.0, 1.0);
        let bubble = |s: Schedule| {
            let tl = simulate_schedule(s, 8, 1, 32, &costs, 0.0).unwrap();
            tl.idle_per_rank.iter().copied().fold(0.0, f64::max)
        };
        assert!((bubble(Schedule::DualPipe) - 6.0).abs() < 1e-9);
        assert!((bubble(Schedule::OneFOneB) - 21.0).abs() < 1e-9);
        assert!((bubble(Schedule::ZbH1) - 7.0).abs() < 1e-9);
    }

    /// Every (p, m) DualPipe accepts simulates without a cycle, with uneven stages
    /// and a transfer cost; each micro-batch passes every stage once forward and
    /// once backward, in its own direction, and the dependencies hold.
    #[test]
    fn dualpipe_never_deadlocks() {
        for p in [2u64, 4, 6, 8, 10, 12, 16] {
            for m in [
                2 * p,
                2 * p + 2,
                2 * p + 4,
                3 * p + (3 * p) % 2,
                4 * p,
                4 * p + 6,
                8 * p,
            ] {
                let costs = PassCosts {
                    forward: (0..p).map(|s| 1.0 + 0.1 * (s % 3) as f64).collect(),
                    backward: (0..p).map(|s| 1.1 + 0.2 * (s % 2) as f64).collect(),
                    weight: (0..p).map(|s| 0.6 + 0.05 * s as f64).collect(),
                };
                for overlap in [0.0, 0.7] {
                    let tl =
                        simulate_schedule_with(Schedule::DualPipe, p, 1, m, &costs, 0.05, overlap)
                            .unwrap_or_else(|| panic!("p{p} m{m}: deadlock"));
                    for r in 0..p {
                        let mine: Vec<&Task> = tl.tasks.iter().filter(|t| t.rank == r).collect();
                        assert_eq!(
                            mine.iter().filter(|t| t.pass == Pass::Forward).count() as u64,
                            m
                        );
                        assert_eq!(
                            mine.iter().filter(|t| t.pass == Pass::Backward).count() as u64,
                            m
                        );
                        let mut sorted = mine.clone();
                        sorted.sort_by(|a, b| a.start.total_cmp(&b.start));
                        for w in sorted.windows(2) {
                            assert!(
                                w[0].end <= w[1].start + 1e-9,
                                "p{p} m{m}: rank {r} overlaps itself"
                            );
                        }
                    }
                    let find = |pass: Pass, stage: u64, mb: u64| {
                        let (r, c) = locate(Schedule::DualPipe, p, m, stage, mb);
                        tl.tasks
                            .iter()
                            .find(|t| {
                                t.pass == pass && t.rank == r && t.chunk == c && t.micro_batch == mb
                            })
                            .unwrap_or_else(|| {
                                panic!(
                                    "p{p} m{m}: no {pass:?} of micro-batch {mb} at stage {stage}"
                                )
                            })
                    };
                    for mb in 0..m {
                        assert_eq!(find(Pass::Forward, 0, mb).chunk, u64::from(mb >= m / 2));
                        for s in 1..p {
                            assert!(
                                find(Pass::Forward, s, mb).start
                                    >= find(Pass::Forward, s - 1, mb).end + 0.05 - 1e-9
                            );
                            assert!(
                                find(Pass::Backward, s - 1, mb).start
                                    >= find(Pass::Backward, s, mb).end + 0.05 - 1e-9
                            );
                        }
                        assert!(
                            find(Pass::Backward, p - 1, mb).start
                                >= find(Pass::Forward, p - 1, mb).end - 1e-9
                        );
                    }
                }
            }
        }
        let costs = uniform(4, 1.0, 1.0, 1.0);
        assert!(
            simulate_schedule(Schedule::DualPipe, 4, 1, 6, &costs, 0.0).is_none(),
            "m < 2p"
        );
        assert!(
            simulate_schedule(Schedule::DualPipe, 4, 1, 9, &costs, 0.0).is_none(),
            "odd m"
        );
        assert!(
            simulate_schedule(
                Schedule::DualPipe,
                3,
                1,
                12,
                &uniform(3, 1.0, 1.0, 1.0),
                0.0
            )
            .is_none(),
            "odd p"
        );
    }

    /// DeepSeek-V3 Table 2: DualPipe keeps 2x the parameters (each rank holds
    /// stages r and p-1-r, so every stage sits on two ranks) and PP+1 stages'
    /// worth of activations per rank, against 1F1B's 1x and PP (first stage).
    #[test]
    fn dualpipe_memory_relation() {
        for (p, m) in [(2u64, 4u64), (4, 8), (4, 16), (8, 16), (8, 40), (16, 32)] {
            let mut copies = vec![0u64; p as usize];
            for r in 0..p {
                for c in 0..Schedule::DualPipe.chunks_per_rank(1) {
                    copies[virtual_stage(Schedule::DualPipe, p, 1, r, c) as usize] += 1;
                }
            }
            assert!(copies.iter().all(|&n| n == 2), "p{p}: {copies:?}");
            let costs = uniform(p, 1.0, 1.0, 0.8);
            let dp = simulate_schedule(Schedule::DualPipe, p, 1, m, &costs, 0.0).unwrap();
            assert!(
                dp.peak_in_flight.iter().all(|&x| x == (p + 1) as f64),
                "p{p} m{m}: {:?}",
                dp.peak_in_flight
            );
            let fb = simulate_schedule(Schedule::OneFOneB, p, 1, m, &costs, 0.0).unwrap();
            assert_eq!(fb.peak_in_flight[0], p as f64);
        }
    }

    #[test]
    fn virtual_stages_and_overlapped_pairs() {
        assert_eq!(virtual_stage(Schedule::Interleaved, 4, 2, 1, 1), 5);
        assert_eq!(virtual_stage(Schedule::OneFOneB, 4, 1, 3, 0), 3);
        assert_eq!(
            (
                virtual_stage(Schedule::DualPipe, 8, 1, 2, 0),
                virtual_stage(Schedule::DualPipe, 8, 1, 2, 1)
            ),
            (2, 5)
        );
        for s in Schedule::ALL {
            assert_eq!(Schedule::parse(s.name()), Some(s));
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<Schedule>(&json).unwrap(), s);
        }
        // Only DualPipe overlaps pairs; its pairs are a forward then a backward of
        // the other direction, and the order holds every pass once.
        assert!(overlapped_with_next(Schedule::ZbH1, 4, 1, 8, 0)
            .iter()
            .all(|&x| !x));
        let (p, m) = (8u64, 20u64);
        for r in 0..p {
            let order = rank_order(Schedule::DualPipe, p, 1, m, r);
            let fused = overlapped_with_next(Schedule::DualPipe, p, 1, m, r);
            assert_eq!(order.len(), fused.len());
            let pairs = fused.iter().filter(|&&x| x).count() as u64;
            let middle = r == p / 2 - 1 || r == p / 2;
            let outer = p / 2 - r.min(p - 1 - r) - 1;
            assert_eq!(
                pairs,
                2 * (m / 2 + r.min(p - 1 - r) + 1 - p) + outer - u64::from(middle),
                "rank {r}"
            );
            for (i, _) in fused.iter().enumerate().filter(|(_, &x)| x) {
                let (a, b) = (order[i], order[i + 1]);
                assert!(
                    a.0 == Pass::Forward && b.0 == Pass::Backward && a.1 != b.1,
                    "rank {r}: {a:?} with {b:?}"
                );
            }
            let mut seen = std::collections::HashSet::new();
            assert!(
                order.iter().all(|op| seen.insert(*op)),
                "rank {r} repeats a pass"
            );
        }
    }
}
