//! Every rank's program run against the others on the CPU, the way NCCL pairs
//! them: what would hang on the GPUs is found before any GPU time is spent.

use sextant_planner::ranks::{GroupKind, RankMap};

pub use crate::error::TraceError;

use super::op::{Coll, Op};

/// What [`check`] found: every op paired, and totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checked {
    pub ops: usize,
    pub collectives: usize,
    pub p2p: usize,
    /// Largest per-rank GEMM FLOPs of the step.
    pub max_rank_flops: f64,
    pub total_flops: f64,
}

fn describe(op: &Op) -> String {
    match op {
        Op::Coll {
            op, group, bytes, ..
        } => format!("{} of {bytes} bytes over its {group} group", op.label()),
        Op::P2p { kind, sends, recvs } => {
            format!(
                "{} transfers (sends {sends:?}, receives {recvs:?})",
                kind.key()
            )
        }
        Op::Barrier => "the step's barrier".into(),
        other => format!("{other:?}"),
    }
}

/// Starts tracking the transfers of a rank's P2p group when it reaches one.
fn open_group(done: &mut (Vec<bool>, Vec<bool>), head: Option<&Op>) {
    if let Some(Op::P2p { sends, recvs, .. }) = head {
        if done.0.is_empty() && done.1.is_empty() {
            *done = (vec![false; sends.len()], vec![false; recvs.len()]);
        }
    }
}

/// Runs the ranks' programs against each other the way NCCL on one stream per rank
/// would: each rank blocks at its next collective until every member of that group
/// is at a collective on the same group, which must be the same operation with the
/// same size; a group of sends and receives completes when each of its transfers
/// meets the matching transfer (same peer pair and size) at the head of the peer's
/// program (sends are taken as blocking, which NCCL's large messages are).
/// Errors name the ranks, their positions and what they were waiting for.
pub fn check(programs: &[Vec<Op>], map: &RankMap) -> Result<Checked, TraceError> {
    let n = programs.len();
    if n as u64 != map.world_size {
        return Err(TraceError::Programs {
            programs: n,
            world: map.world_size,
        });
    }
    let mut run = Pairing {
        programs,
        map,
        pos: vec![0usize; n],
        done: vec![(vec![], vec![]); n],
        out: Checked::default(),
    };
    while run.pass()? {}
    let stuck = run.stuck();
    if !stuck.is_empty() {
        return Err(TraceError::Hang { stuck });
    }
    let mut out = run.out;
    for p in programs {
        let f: f64 = p.iter().map(Op::flops).sum();
        out.total_flops += f;
        out.max_rank_flops = out.max_rank_flops.max(f);
    }
    Ok(out)
}

/// Where [`check`] stands: each rank's position in its program, the transfers of
/// each rank's current P2p group already matched (sends, recvs), and the totals.
struct Pairing<'a> {
    programs: &'a [Vec<Op>],
    map: &'a RankMap,
    pos: Vec<usize>,
    done: Vec<(Vec<bool>, Vec<bool>)>,
    out: Checked,
}

impl<'a> Pairing<'a> {
    /// Rank `r`'s next op.
    fn head(&self, r: usize) -> Option<&'a Op> {
        self.programs[r].get(self.pos[r])
    }

    /// One pass over the ranks, each advancing as far as its peers let it once, then
    /// the completed P2p groups retired; whether any rank moved.
    fn pass(&mut self) -> Result<bool, TraceError> {
        let n = self.programs.len();
        let mut progress = false;
        for r in 0..n {
            let head = self.head(r);
            open_group(&mut self.done[r], head);
        }
        for r in 0..n {
            let Some(op) = self.head(r) else { continue };
            progress |= match op {
                Op::Gemm { .. } | Op::Memory { .. } | Op::Keep { .. } | Op::Free { .. } => {
                    self.out.ops += 1;
                    self.pos[r] += 1;
                    true
                }
                Op::Barrier => self.barrier(),
                Op::Coll {
                    group,
                    op: c,
                    bytes,
                    ..
                } => self.collective(r, op, (*group, *c, *bytes))?,
                Op::P2p { sends, .. } => self.sends(r, sends)?,
            };
        }
        progress |= self.retire();
        Ok(progress)
    }

    /// Every rank past the barrier, once all of them are at it.
    fn barrier(&mut self) -> bool {
        let n = self.programs.len();
        if (0..n).all(|q| matches!(self.head(q), Some(Op::Barrier))) {
            self.out.ops += n;
            self.pos.iter_mut().for_each(|p| *p += 1);
            true
        } else {
            false
        }
    }

    /// Rank `r`'s collective `op` (`(group kind, operation, bytes)`): every member
    /// past it once all of them are at a collective on the same group, which must be
    /// the same one.
    fn collective(
        &mut self,
        r: usize,
        op: &Op,
        (k, c, bytes): (GroupKind, Coll, u64),
    ) -> Result<bool, TraceError> {
        let members = self.map.group_of(r as u64, k);
        let mut ready = true;
        for &q in members {
            match self.head(q as usize) {
                Some(Op::Coll {
                    group: g2,
                    op: c2,
                    bytes: b2,
                    ..
                }) if *g2 == k => {
                    if *c2 != c || *b2 != bytes {
                        return Err(TraceError::Collectives {
                            first: r,
                            second: q,
                            group: k,
                            first_op: self.pos[r],
                            first_issues: describe(op),
                            second_op: self.pos[q as usize],
                            second_issues: describe(
                                &self.programs[q as usize][self.pos[q as usize]],
                            ),
                        });
                    }
                }
                _ => ready = false,
            }
        }
        if ready {
            for &q in members {
                self.pos[q as usize] += 1;
            }
            self.out.ops += members.len();
            self.out.collectives += 1;
        }
        Ok(ready)
    }

    /// Rank `r`'s unmatched sends, each matched with a receive from `r` of the same
    /// size in the group at the head of its peer's program.
    fn sends(&mut self, r: usize, sends: &[(u64, u64)]) -> Result<bool, TraceError> {
        let n = self.programs.len();
        let mut progress = false;
        for (i, &(to, bytes)) in sends.iter().enumerate() {
            if self.done[r].0[i] {
                continue;
            }
            let q = to as usize;
            if q >= n || q == r {
                return Err(TraceError::NotAPeer {
                    rank: r,
                    op: self.pos[r],
                    to,
                });
            }
            if let Some(Op::P2p { recvs: their, .. }) = self.head(q) {
                let head = self.head(q);
                open_group(&mut self.done[q], head);
                let done = &self.done[q].1;
                if let Some(j) = (0..their.len()).find(|&j| !done[j] && their[j].0 == r as u64) {
                    if their[j].1 != bytes {
                        return Err(TraceError::Sizes {
                            rank: r,
                            op: self.pos[r],
                            bytes,
                            to: q,
                            received: their[j].1,
                            their_op: self.pos[q],
                        });
                    }
                    self.done[r].0[i] = true;
                    self.done[q].1[j] = true;
                    self.out.p2p += 1;
                    progress = true;
                }
            }
        }
        Ok(progress)
    }

    /// Retires the P2p groups whose transfers all matched.
    fn retire(&mut self) -> bool {
        let mut progress = false;
        for r in 0..self.programs.len() {
            if let Some(Op::P2p { sends, recvs, .. }) = self.head(r) {
                let (s, v) = &self.done[r];
                if s.len() == sends.len() && v.len() == recvs.len() && s.iter().chain(v).all(|&x| x)
                {
                    self.pos[r] += 1;
                    self.out.ops += 1;
                    self.done[r] = (vec![], vec![]);
                    progress = true;
                }
            }
        }
        progress
    }

    /// Each rank that did not finish, where it stopped and what it waits for.
    fn stuck(&self) -> Vec<String> {
        (0..self.programs.len())
            .filter(|&r| self.pos[r] < self.programs[r].len())
            .map(|r| {
                format!(
                    "rank {r} at op {} of {}: {}",
                    self.pos[r],
                    self.programs[r].len(),
                    describe(&self.programs[r][self.pos[r]])
                )
            })
            .collect()
    }
}
