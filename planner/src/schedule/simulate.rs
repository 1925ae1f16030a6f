//! One step simulated: the schedule's passes as a task graph, start times in
//! topological order, then makespan, idle time and activations in flight per rank.

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;

use super::order::rank_program;
use super::{locate, virtual_stage, Op, Pass, PassCosts, Schedule, Task, Timeline};

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
///
/// [`overlapped_with_next`]: super::overlapped_with_next
pub fn simulate_schedule_with(
    schedule: Schedule,
    p: u64,
    v: u64,
    m: u64,
    costs: &PassCosts,
    p2p_secs: f64,
    overlap: f64,
) -> Option<Timeline> {
    let v = schedule.interleaving(v);
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
    let shape = Shape {
        schedule,
        p,
        v,
        m,
        chunks,
        stages,
    };
    let programs: Vec<Vec<(Op, bool)>> =
        (0..p).map(|r| rank_program(schedule, p, v, m, r)).collect();
    let mut step = StepGraph::with_passes(shape, &programs)?;
    let (release, durations) = step.durations(&programs, costs, overlap)?;
    step.add_edges(&programs, &release, p2p_secs)?;
    let tasks = step.start_times(&durations)?;
    let makespan = tasks.iter().map(|t| t.end).fold(0.0, f64::max);
    let mut idle = vec![makespan; pu];
    for t in &tasks {
        idle[t.rank as usize] -= t.end - t.start;
    }
    let peak_in_flight = peak_in_flight(shape, &programs, &step.split);
    Some(Timeline {
        tasks,
        makespan,
        idle_per_rank: idle,
        peak_in_flight,
    })
}

/// The step's shape as the simulator reads it: the schedule, ranks, virtual
/// stages, micro-batches, chunks per rank and model stages.
#[derive(Clone, Copy)]
struct Shape {
    schedule: Schedule,
    p: u64,
    v: u64,
    m: u64,
    chunks: u64,
    stages: u64,
}

impl Shape {
    /// Where a (rank, pass, chunk, micro-batch) lives in the per-pass tables.
    #[inline]
    fn slot(self, r: u64, pass: Pass, c: u64, mb: u64) -> usize {
        let kind = match pass {
            Pass::Forward => 0,
            Pass::Backward => 1,
            Pass::Weight => 2,
        };
        (((r * 3 + kind) * self.chunks + c) * self.m + mb) as usize
    }

    /// How many slots the per-pass tables have.
    fn slots(self) -> usize {
        (self.p * 3 * self.chunks * self.m) as usize
    }

    /// The entry of [`PassCosts`] chunk `c` on rank `r` takes.
    #[inline]
    fn cost_index(self, r: u64, c: u64) -> usize {
        if self.schedule == Schedule::DualPipe {
            virtual_stage(self.schedule, self.p, r, c) as usize
        } else {
            r as usize
        }
    }

    /// The pass another one waits for (its slot), and the transfer time between them.
    #[inline]
    fn dependency(self, r: u64, (pass, c, mb): Op, p2p_secs: f64) -> Option<(usize, f64)> {
        let (schedule, p, m) = (self.schedule, self.p, self.m);
        let s = virtual_stage(schedule, p, r, c);
        let cross = |other: u64| if other == r { 0.0 } else { p2p_secs };
        match pass {
            Pass::Forward if s > 0 => {
                let (rr, cc) = locate(schedule, p, m, s - 1, mb);
                Some((self.slot(rr, Pass::Forward, cc, mb), cross(rr)))
            }
            Pass::Forward => None,
            Pass::Backward if s + 1 < self.stages => {
                let (rr, cc) = locate(schedule, p, m, s + 1, mb);
                Some((self.slot(rr, Pass::Backward, cc, mb), cross(rr)))
            }
            Pass::Backward => Some((self.slot(r, Pass::Forward, c, mb), 0.0)),
            Pass::Weight => Some((self.slot(r, Pass::Backward, c, mb), 0.0)),
        }
    }
}

/// The step as a task graph: one node per pass, found by its slot.
struct StepGraph {
    shape: Shape,
    g: DiGraph<Task, f64>,
    node: Vec<Option<NodeIndex>>,
    /// A backward whose weight gradient runs as a separate W.
    split: Vec<bool>,
}

impl StepGraph {
    /// A node for every pass of every rank's program, in program order. `None`
    /// when a program names a chunk or micro-batch out of range or a pass twice.
    fn with_passes(shape: Shape, programs: &[Vec<(Op, bool)>]) -> Option<StepGraph> {
        let slots = shape.slots();
        let mut node: Vec<Option<NodeIndex>> = vec![None; slots];
        let mut split = vec![false; slots];
        let mut g: DiGraph<Task, f64> = DiGraph::with_capacity(slots, 3 * slots);
        for (r, prog) in programs.iter().enumerate() {
            for &((pass, c, mb), _) in prog {
                if c >= shape.chunks || mb >= shape.m {
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
                let i = shape.slot(r as u64, pass, c, mb);
                if node[i].is_some() {
                    return None;
                }
                node[i] = Some(g.add_node(t));
                if pass == Pass::Weight {
                    split[shape.slot(r as u64, Pass::Backward, c, mb)] = true;
                }
            }
        }
        Some(StepGraph {
            shape,
            g,
            node,
            split,
        })
    }

    #[inline]
    fn get(&self, r: u64, (pass, c, mb): Op) -> Option<NodeIndex> {
        self.node[self.shape.slot(r, pass, c, mb)]
    }

    /// How long a pass on rank `r` runs on its own.
    #[inline]
    fn duration(&self, costs: &PassCosts, r: u64, (pass, c, mb): Op) -> f64 {
        let k = self.shape.cost_index(r, c);
        match pass {
            Pass::Forward => costs.forward[k],
            Pass::Backward if self.split[self.shape.slot(r, Pass::Backward, c, mb)] => {
                costs.backward[k]
            }
            Pass::Backward => costs.backward[k] + costs.weight[k],
            Pass::Weight => costs.weight[k],
        }
    }

    /// Each node's duration (an overlapped pair's two halves scaled to the pair's
    /// time), and by slot the node whose end releases a pass's outputs: the pass
    /// itself, or the second half of the overlapped pair it belongs to.
    fn durations(
        &self,
        programs: &[Vec<(Op, bool)>],
        costs: &PassCosts,
        overlap: f64,
    ) -> Option<(Vec<Option<NodeIndex>>, Vec<f64>)> {
        let shape = self.shape;
        let mut release: Vec<Option<NodeIndex>> = vec![None; shape.slots()];
        let mut durations: Vec<f64> = vec![0.0; self.g.node_count()];
        for (r, prog) in programs.iter().enumerate() {
            let r = r as u64;
            let mut i = 0;
            while i < prog.len() {
                let (a, fused) = prog[i];
                let na = self.get(r, a)?;
                if fused && i + 1 < prog.len() {
                    let b = prog[i + 1].0;
                    let nb = self.get(r, b)?;
                    let (da, db) = (self.duration(costs, r, a), self.duration(costs, r, b));
                    let pair = da + db - overlap * da.min(db);
                    let k = if da + db > 0.0 { pair / (da + db) } else { 1.0 };
                    durations[na.index()] = k * da;
                    durations[nb.index()] = k * db;
                    release[shape.slot(r, a.0, a.1, a.2)] = Some(nb);
                    release[shape.slot(r, b.0, b.1, b.2)] = Some(nb);
                    i += 2;
                } else {
                    durations[na.index()] = self.duration(costs, r, a);
                    release[shape.slot(r, a.0, a.1, a.2)] = Some(na);
                    i += 1;
                }
            }
        }
        Some((release, durations))
    }

    /// The edges: each rank's order, then the data dependencies, weighted by the
    /// transfer time; an overlapped pair starts only when both inputs are in.
    fn add_edges(
        &mut self,
        programs: &[Vec<(Op, bool)>],
        release: &[Option<NodeIndex>],
        p2p_secs: f64,
    ) -> Option<()> {
        let shape = self.shape;
        for (r, prog) in programs.iter().enumerate() {
            let r = r as u64;
            // Rank order.
            for w in prog.windows(2) {
                let (a, b) = (self.get(r, w[0].0)?, self.get(r, w[1].0)?);
                self.g.add_edge(a, b, 0.0);
            }
            // Data dependencies; an overlapped pair starts only when both inputs are in.
            for (i, &(op, fused)) in prog.iter().enumerate() {
                let me = self.get(r, op)?;
                let partner = if fused {
                    prog.get(i + 1)
                        .and_then(|&(next, _)| shape.dependency(r, next, p2p_secs))
                } else {
                    None
                };
                for (d, secs) in [shape.dependency(r, op, p2p_secs), partner]
                    .into_iter()
                    .flatten()
                {
                    let from = release[d]?;
                    if from != me {
                        self.g.add_edge(from, me, secs);
                    }
                }
            }
        }
        Some(())
    }

    /// Start and end times in topological order (each node starts when its last
    /// input arrives); `None` when the graph has a cycle (the schedule deadlocks).
    fn start_times(&mut self, durations: &[f64]) -> Option<Vec<Task>> {
        let g = &mut self.g;
        let sorted = toposort(&*g, None).ok()?;
        for n in sorted {
            let start = g
                .edges_directed(n, petgraph::Direction::Incoming)
                .map(|e| g[e.source()].end + *e.weight())
                .fold(0.0, f64::max);
            let t = &mut g[n];
            t.start = start;
            t.end = start + durations[n.index()];
        }
        Some(g.node_weights().copied().collect())
    }
}

/// Activations live from a chunk's forward until its weight gradient (or its
/// backward when that includes the weight gradient): per rank, the most at once,
/// in units of one model stage's.
fn peak_in_flight(shape: Shape, programs: &[Vec<(Op, bool)>], split: &[bool]) -> Vec<f64> {
    let share = if shape.schedule == Schedule::Interleaved {
        1.0 / shape.v as f64
    } else {
        1.0
    };
    programs
        .iter()
        .enumerate()
        .map(|(r, prog)| {
            let (mut live, mut peak) = (0i64, 0i64);
            for &((pass, c, mb), _) in prog {
                match pass {
                    Pass::Forward => live += 1,
                    Pass::Backward if !split[shape.slot(r as u64, Pass::Backward, c, mb)] => {
                        live -= 1
                    }
                    Pass::Weight => live -= 1,
                    Pass::Backward => {}
                }
                peak = peak.max(live);
            }
            peak as f64 * share
        })
        .collect()
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
