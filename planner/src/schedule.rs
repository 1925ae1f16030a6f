//! A timeline of one training step under Megatron's 1F1B schedule (interleaved when
//! there are virtual stages), for drawing and for checking the closed-form bubble.
//!
//! Each rank runs its forward and backward passes in the order Megatron's schedule
//! gives them (`megatron/core/pipeline_parallel/schedules.py`): a warm-up of
//! forwards, one-forward-one-backward in the steady state, then the remaining
//! backwards. A pass starts when its rank is free and its input has arrived: the
//! forward of a chunk needs the same micro-batch's forward on the previous virtual
//! stage, the backward needs the backward of the next one (the last virtual
//! stage's backward needs its own forward). Transfers between ranks take `p2p_secs`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pass {
    Forward,
    Backward,
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

/// The order of (pass, chunk, micro-batch) on `rank`.
fn rank_order(p: u64, v: u64, m: u64, rank: u64) -> Vec<(Pass, u64, u64)> {
    let total = m * v;
    // Virtual micro-batch k -> (chunk, micro-batch), Megatron's interleaving groups
    // micro-batches p at a time (m must be a multiple of p when v > 1).
    let fwd = |k: u64| {
        if v == 1 {
            (0, k)
        } else {
            ((k / p) % v, (k / (p * v)) * p + k % p)
        }
    };
    let bwd = |k: u64| {
        let (c, mb) = fwd(k);
        (v - 1 - c, mb)
    };
    let warmup = if v == 1 { (p - rank - 1).min(m) } else { ((p - rank - 1) * 2 + (v - 1) * p).min(total) };
    let mut order = Vec::with_capacity(2 * total as usize);
    for k in 0..warmup {
        let (c, mb) = fwd(k);
        order.push((Pass::Forward, c, mb));
    }
    for i in 0..(total - warmup) {
        let (c, mb) = fwd(warmup + i);
        order.push((Pass::Forward, c, mb));
        let (c, mb) = bwd(i);
        order.push((Pass::Backward, c, mb));
    }
    for i in (total - warmup)..total {
        let (c, mb) = bwd(i);
        order.push((Pass::Backward, c, mb));
    }
    order
}

/// Simulates one step. `fwd_secs[r]` / `bwd_secs[r]` are one chunk's forward and
/// backward time on rank `r`. Returns every task, or `None` if `v > 1` and `m` is
/// not a multiple of `p` (Megatron requires it).
pub fn simulate(p: u64, v: u64, m: u64, fwd_secs: &[f64], bwd_secs: &[f64], p2p_secs: f64) -> Option<Vec<Task>> {
    if p == 0 || v == 0 || m == 0 || (v > 1 && !m.is_multiple_of(p)) || fwd_secs.len() != p as usize || bwd_secs.len() != p as usize {
        return None;
    }
    let orders: Vec<Vec<(Pass, u64, u64)>> = (0..p).map(|r| rank_order(p, v, m, r)).collect();
    let idx = |c: u64, mb: u64| (c * m + mb) as usize;
    let n = (v * m) as usize;
    // finish[rank][chunk*m + mb] for forward and backward.
    let mut f_end = vec![vec![f64::NAN; n]; p as usize];
    let mut b_end = vec![vec![f64::NAN; n]; p as usize];
    let mut next = vec![0usize; p as usize];
    let mut free = vec![0.0f64; p as usize];
    let mut tasks = Vec::with_capacity(2 * n * p as usize);
    loop {
        let mut progressed = false;
        for r in 0..p as usize {
            while next[r] < orders[r].len() {
                let (pass, c, mb) = orders[r][next[r]];
                // When the input is ready.
                let ready = match pass {
                    Pass::Forward => {
                        if r > 0 {
                            f_end[r - 1][idx(c, mb)] + p2p_secs
                        } else if c > 0 {
                            f_end[p as usize - 1][idx(c - 1, mb)] + p2p_secs
                        } else {
                            0.0
                        }
                    }
                    Pass::Backward => {
                        if r + 1 < p as usize {
                            b_end[r + 1][idx(c, mb)] + p2p_secs
                        } else if c + 1 < v {
                            b_end[0][idx(c + 1, mb)] + p2p_secs
                        } else {
                            f_end[r][idx(c, mb)]
                        }
                    }
                };
                if ready.is_nan() {
                    break;
                }
                let start = free[r].max(ready);
                let dur = if pass == Pass::Forward { fwd_secs[r] } else { bwd_secs[r] };
                let end = start + dur;
                match pass {
                    Pass::Forward => f_end[r][idx(c, mb)] = end,
                    Pass::Backward => b_end[r][idx(c, mb)] = end,
                }
                free[r] = end;
                tasks.push(Task { rank: r as u64, chunk: c, micro_batch: mb, pass, start, end });
                next[r] += 1;
                progressed = true;
            }
        }
        if next.iter().zip(&orders).all(|(i, o)| *i == o.len()) {
            return Some(tasks);
        }
        if !progressed {
            // A schedule that waits on itself: cannot happen for Megatron's orders.
            return None;
        }
    }
}

/// Makespan of a simulated step.
pub fn makespan(tasks: &[Task]) -> f64 {
    tasks.iter().map(|t| t.end).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Identical stages, free communication: the bubble equals the closed form
    /// (p-1)/m for 1F1B and (p-1)/(v m) interleaved, relative to the ideal m (t_f + t_b).
    #[test]
    fn bubble_matches_closed_form() {
        for (p, v, m) in [(4u64, 1u64, 8u64), (8, 1, 32), (4, 2, 8), (8, 4, 16), (2, 3, 4)] {
            let tf = 1.0 / v as f64;
            let tb = 2.0 / v as f64;
            let tasks = simulate(p, v, m, &vec![tf; p as usize], &vec![tb; p as usize], 0.0).unwrap();
            assert_eq!(tasks.len() as u64, 2 * p * v * m);
            let ideal = m as f64 * 3.0;
            let bubble = (makespan(&tasks) - ideal) / ideal;
            let closed = (p - 1) as f64 / (v * m) as f64;
            assert!((bubble - closed).abs() <= 0.005 * closed.max(1e-9) + 1e-9, "p{p} v{v} m{m}: simulated {bubble}, closed form {closed}");
        }
    }

    #[test]
    fn no_rank_overlaps_itself_and_dependencies_hold() {
        let tasks = simulate(4, 2, 8, &[1.0, 1.2, 1.0, 0.9], &[2.0, 2.1, 2.0, 2.4], 0.05).unwrap();
        for r in 0..4 {
            let mut mine: Vec<&Task> = tasks.iter().filter(|t| t.rank == r).collect();
            mine.sort_by(|a, b| a.start.total_cmp(&b.start));
            for w in mine.windows(2) {
                assert!(w[0].end <= w[1].start + 1e-12);
            }
        }
        // Every backward starts after its own forward.
        for t in tasks.iter().filter(|t| t.pass == Pass::Backward) {
            let f = tasks.iter().find(|f| f.pass == Pass::Forward && f.rank == t.rank && f.chunk == t.chunk && f.micro_batch == t.micro_batch).unwrap();
            assert!(f.end <= t.start + 1e-12);
        }
        assert!(simulate(4, 2, 6, &[1.0; 4], &[2.0; 4], 0.0).is_none(), "m not a multiple of p with interleaving");
    }
}
