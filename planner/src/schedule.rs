//! Pipeline schedules simulated as task graphs (petgraph): one training step is a
//! DAG of forward (F), backward (B, the input gradient) and, for zero-bubble
//! schedules, weight-gradient (W) passes per rank, virtual chunk and micro-batch.
//! Edges are the data dependencies — F needs the previous virtual stage's F, B the
//! next one's B (the last virtual stage's B its own F), W its own B — weighted by
//! the point-to-point time when they cross ranks, plus the order each schedule
//! imposes on each rank. Start times follow the topological order; a cycle means
//! the schedule would deadlock.
//!
//! Schedules (per-rank orders as in Megatron-LM's `pipeline_parallel/schedules.py`
//! and the zero-bubble authors' hand schedule, Qi et al. 2023): GPipe (all
//! forwards, then all backwards), 1F1B, interleaved 1F1B (virtual stages), and
//! ZB-H1 (1F1B with the backward split into B and W, stage i issuing each W i
//! backward steps late so that the W's fill the drain). DualPipe is not
//! implemented.

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pass {
    Forward,
    /// Backward; includes the weight gradient unless the schedule splits it off.
    Backward,
    /// Weight gradient (zero-bubble schedules).
    Weight,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    Gpipe,
    OneFOneB,
    /// Megatron's interleaved 1F1B (needs v > 1 and m a multiple of p).
    Interleaved,
    /// Zero-bubble ZB-H1: bubble (p-1)(T_F + T_B - T_W) at 1F1B's peak memory.
    ZbH1,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub rank: u64,
    /// Virtual chunk on this rank (0 without interleaving).
    pub chunk: u64,
    pub micro_batch: u64,
    pub pass: Pass,
    pub start: f64,
    pub end: f64,
}

/// Per-rank durations of one chunk's passes.
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
    /// Most micro-batches (in units of a whole stage) whose activations a rank
    /// holds at once: forwards done minus activations freed, over chunks / v.
    pub peak_in_flight: Vec<f64>,
}

/// One pass on a rank: (pass, virtual chunk, micro-batch).
pub type Op = (Pass, u64, u64);

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
/// both follow). Chunk `c` on rank `r` is virtual stage `c * p + r`.
pub fn rank_order(s: Schedule, p: u64, v: u64, m: u64, rank: u64) -> Vec<Op> {
    let mut order = Vec::new();
    match s {
        Schedule::Gpipe => {
            order.extend((0..m).map(|j| (Pass::Forward, 0, j)));
            order.extend((0..m).map(|j| (Pass::Backward, 0, j)));
        }
        Schedule::OneFOneB | Schedule::Interleaved | Schedule::ZbH1 => {
            let v = if s == Schedule::Interleaved { v } else { 1 };
            let total = m * v;
            let bwd = |k: u64| {
                let (c, mb) = interleaved_fwd(p, v, k);
                (v - 1 - c, mb)
            };
            let warmup = if v == 1 { (p - rank - 1).min(m) } else { ((p - rank - 1) * 2 + (v - 1) * p).min(total) };
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
    order
}

/// Simulates one step of `schedule`. `None` when the shape is not one the schedule
/// supports (interleaving needs v > 1 and m a multiple of p) or it would deadlock.
pub fn simulate_schedule(schedule: Schedule, p: u64, v: u64, m: u64, costs: &PassCosts, p2p_secs: f64) -> Option<Timeline> {
    let v = if schedule == Schedule::Interleaved { v } else { 1 };
    if p == 0 || v == 0 || m == 0 || (schedule == Schedule::Interleaved && (v < 2 || !m.is_multiple_of(p))) {
        return None;
    }
    let pu = p as usize;
    if costs.forward.len() != pu || costs.backward.len() != pu || costs.weight.len() != pu {
        return None;
    }
    let split_w = schedule == Schedule::ZbH1;
    let orders: Vec<Vec<Op>> = (0..p).map(|r| rank_order(schedule, p, v, m, r)).collect();
    let mut g: DiGraph<Task, f64> = DiGraph::new();
    let idx = |r: u64, pass: Pass, c: u64, mb: u64| -> usize {
        let kind = match pass {
            Pass::Forward => 0,
            Pass::Backward => 1,
            Pass::Weight => 2,
        };
        (((r * 3 + kind) * v + c) * m + mb) as usize
    };
    let mut node: Vec<Option<NodeIndex>> = vec![None; (p * 3 * v * m) as usize];
    for (r, order) in orders.iter().enumerate() {
        for &(pass, c, mb) in order {
            let t = Task { rank: r as u64, chunk: c, micro_batch: mb, pass, start: 0.0, end: 0.0 };
            node[idx(r as u64, pass, c, mb)] = Some(g.add_node(t));
        }
    }
    let get = |r: u64, pass: Pass, c: u64, mb: u64| node[idx(r, pass, c, mb)];
    for (r, order) in orders.iter().enumerate() {
        let r = r as u64;
        // Rank order.
        for w in order.windows(2) {
            let (a, b) = (get(r, w[0].0, w[0].1, w[0].2)?, get(r, w[1].0, w[1].1, w[1].2)?);
            g.add_edge(a, b, 0.0);
        }
        // Data dependencies.
        for &(pass, c, mb) in order {
            let me = get(r, pass, c, mb)?;
            let dep = match pass {
                Pass::Forward if r > 0 => Some((get(r - 1, Pass::Forward, c, mb)?, p2p_secs)),
                Pass::Forward if c > 0 => Some((get(p - 1, Pass::Forward, c - 1, mb)?, p2p_secs)),
                Pass::Forward => None,
                Pass::Backward if r + 1 < p => Some((get(r + 1, Pass::Backward, c, mb)?, p2p_secs)),
                Pass::Backward if c + 1 < v => Some((get(0, Pass::Backward, c + 1, mb)?, p2p_secs)),
                Pass::Backward => Some((get(r, Pass::Forward, c, mb)?, 0.0)),
                Pass::Weight => Some((get(r, Pass::Backward, c, mb)?, 0.0)),
            };
            if let Some((d, w)) = dep {
                g.add_edge(d, me, w);
            }
        }
    }
    let sorted = toposort(&g, None).ok()?;
    let dur = |t: &Task| -> f64 {
        let r = t.rank as usize;
        match t.pass {
            Pass::Forward => costs.forward[r],
            Pass::Backward if split_w => costs.backward[r],
            Pass::Backward => costs.backward[r] + costs.weight[r],
            Pass::Weight => costs.weight[r],
        }
    };
    for n in sorted {
        let start = g.neighbors_directed(n, petgraph::Direction::Incoming).map(|pred| {
            let e = g.find_edge(pred, n).expect("edge to a predecessor");
            g[pred].end + g[e]
        });
        let start = start.fold(0.0, f64::max);
        let d = dur(&g[n]);
        let t = &mut g[n];
        t.start = start;
        t.end = start + d;
    }
    let tasks: Vec<Task> = g.node_weights().copied().collect();
    let makespan = tasks.iter().map(|t| t.end).fold(0.0, f64::max);
    let mut idle = vec![makespan; pu];
    for t in &tasks {
        idle[t.rank as usize] -= t.end - t.start;
    }
    // Activations live from a chunk's forward until its weight gradient (or its
    // backward when that includes the weight gradient).
    let peak_in_flight = orders
        .iter()
        .map(|order| {
            let (mut live, mut peak) = (0i64, 0i64);
            for &(pass, _, _) in order {
                match pass {
                    Pass::Forward => live += 1,
                    Pass::Backward if !split_w => live -= 1,
                    Pass::Weight => live -= 1,
                    Pass::Backward => {}
                }
                peak = peak.max(live);
            }
            peak as f64 / v as f64
        })
        .collect();
    Some(Timeline { tasks, makespan, idle_per_rank: idle, peak_in_flight })
}

/// 1F1B (v = 1) or interleaved 1F1B: the timeline the report draws. `None` when
/// interleaving's shape rules are not met or the schedule would deadlock.
pub fn simulate(p: u64, v: u64, m: u64, fwd_secs: &[f64], bwd_secs: &[f64], p2p_secs: f64) -> Option<Vec<Task>> {
    let schedule = if v > 1 { Schedule::Interleaved } else { Schedule::OneFOneB };
    let costs = PassCosts { forward: fwd_secs.to_vec(), backward: bwd_secs.to_vec(), weight: vec![0.0; fwd_secs.len()] };
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
        PassCosts { forward: vec![f; p as usize], backward: vec![b; p as usize], weight: vec![w; p as usize] }
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
            assert!((bubble - closed).abs() <= 0.005 * closed, "{s:?} p{p} v{v} m{m}: simulated {bubble}, closed form {closed}");
        }
    }

    /// ZB-H1's bubble is (p-1)(T_F + T_B - T_W) (Qi et al. 2023), a third of
    /// 1F1B's (p-1)(T_F + T_B + T_W) when the three passes cost the same; its peak
    /// in-flight count (on the first stage) is 1F1B's.
    #[test]
    fn zero_bubble_h1() {
        for (p, m, f, b, w) in [(4u64, 8u64, 1.0, 1.0, 1.0), (4, 16, 1.0, 1.0, 1.0), (8, 24, 1.0, 1.2, 0.8), (2, 4, 1.0, 1.0, 0.5)] {
            let costs = uniform(p, f, b, w);
            let zb = simulate_schedule(Schedule::ZbH1, p, 1, m, &costs, 0.0).unwrap();
            let fb = simulate_schedule(Schedule::OneFOneB, p, 1, m, &costs, 0.0).unwrap();
            let work = m as f64 * (f + b + w);
            let (pm1, eps) = ((p - 1) as f64, 1e-9);
            assert!((zb.makespan - (work + pm1 * (f + b - w))).abs() < eps, "p{p} m{m}: ZB-H1 makespan {}", zb.makespan);
            assert!((fb.makespan - (work + pm1 * (f + b + w))).abs() < eps, "p{p} m{m}: 1F1B makespan {}", fb.makespan);
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
        let il = simulate_schedule(Schedule::Interleaved, p, 2, m, &uniform(p, 0.5, 1.0, 0.0), 0.0).unwrap();
        assert_eq!(il.peak_in_flight[0], 4.0 + 3.0 / 2.0);
    }

    #[test]
    fn no_rank_overlaps_itself_and_dependencies_hold() {
        let costs = PassCosts { forward: vec![1.0, 1.2, 1.0, 0.9], backward: vec![2.0, 2.1, 2.0, 2.4], weight: vec![0.0; 4] };
        let tasks = simulate_schedule(Schedule::Interleaved, 4, 2, 8, &costs, 0.05).unwrap().tasks;
        for r in 0..4 {
            let mut mine: Vec<&Task> = tasks.iter().filter(|t| t.rank == r).collect();
            mine.sort_by(|a, b| a.start.total_cmp(&b.start));
            for w in mine.windows(2) {
                assert!(w[0].end <= w[1].start + 1e-12);
            }
        }
        for t in tasks.iter().filter(|t| t.pass == Pass::Backward) {
            let f = tasks.iter().find(|f| f.pass == Pass::Forward && f.rank == t.rank && f.chunk == t.chunk && f.micro_batch == t.micro_batch).unwrap();
            assert!(f.end <= t.start + 1e-12);
        }
        assert!(simulate(4, 2, 6, &[1.0; 4], &[2.0; 4], 0.0).is_none(), "m not a multiple of p with interleaving");
    }
}
