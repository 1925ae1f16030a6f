//! The order of passes on each rank under each schedule: what the simulator and
//! the executor both follow, and which neighbouring passes DualPipe overlaps.

use std::collections::VecDeque;

use super::{Op, Pass, Schedule};

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
pub(super) fn rank_program(s: Schedule, p: u64, v: u64, m: u64, rank: u64) -> Vec<(Op, bool)> {
    let mut order = Vec::new();
    match s {
        Schedule::Gpipe => {
            order.extend((0..m).map(|j| (Pass::Forward, 0, j)));
            order.extend((0..m).map(|j| (Pass::Backward, 0, j)));
        }
        Schedule::DualPipe => return dualpipe_program(p, m, rank),
        Schedule::OneFOneB | Schedule::Interleaved | Schedule::ZbH1 => {
            let v = s.interleaving(v);
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
