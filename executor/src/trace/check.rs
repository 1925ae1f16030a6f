//! Every rank's program run against the others on the CPU, the way NCCL pairs
//! them: what would hang on the GPUs is found before any GPU time is spent.

use sextant_planner::ranks::{RankMap, GROUP_KINDS};

pub use crate::error::TraceError;

use super::op::Op;

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
        } => format!(
            "{} of {bytes} bytes over its {} group",
            op.label(),
            GROUP_KINDS[*group]
        ),
        Op::P2p { kind, sends, recvs } => {
            format!("{kind} transfers (sends {sends:?}, receives {recvs:?})")
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
    let mut pos = vec![0usize; n];
    // Transfers of each rank's current P2p group already matched: (sends, recvs).
    let mut done: Vec<(Vec<bool>, Vec<bool>)> = vec![(vec![], vec![]); n];
    let mut out = Checked::default();
    let head = |pos: &[usize], r: usize| programs[r].get(pos[r]);
    loop {
        let mut progress = false;
        for (r, d) in done.iter_mut().enumerate() {
            open_group(d, head(&pos, r));
        }
        for r in 0..n {
            let Some(op) = head(&pos, r) else { continue };
            match op {
                Op::Gemm { .. } | Op::Memory { .. } | Op::Keep { .. } | Op::Free { .. } => {
                    out.ops += 1;
                    pos[r] += 1;
                    progress = true;
                }
                Op::Barrier => {
                    if (0..n).all(|q| matches!(head(&pos, q), Some(Op::Barrier))) {
                        out.ops += n;
                        pos.iter_mut().for_each(|p| *p += 1);
                        progress = true;
                    }
                }
                Op::Coll {
                    group,
                    op: c,
                    bytes,
                    ..
                } => {
                    let k = *group;
                    let members = map.group_of(r as u64, k);
                    let mut ready = true;
                    for &q in members {
                        match head(&pos, q as usize) {
                            Some(Op::Coll {
                                group: g2,
                                op: c2,
                                bytes: b2,
                                ..
                            }) if *g2 == k => {
                                if c2 != c || b2 != bytes {
                                    return Err(TraceError::Collectives {
                                        first: r,
                                        second: q,
                                        group: GROUP_KINDS[k],
                                        first_op: pos[r],
                                        first_issues: describe(op),
                                        second_op: pos[q as usize],
                                        second_issues: describe(
                                            &programs[q as usize][pos[q as usize]],
                                        ),
                                    });
                                }
                            }
                            _ => ready = false,
                        }
                    }
                    if ready {
                        for &q in members {
                            pos[q as usize] += 1;
                        }
                        out.ops += members.len();
                        out.collectives += 1;
                        progress = true;
                    }
                }
                Op::P2p { sends, .. } => {
                    for (i, &(to, bytes)) in sends.iter().enumerate() {
                        if done[r].0[i] {
                            continue;
                        }
                        let q = to as usize;
                        if q >= n || q == r {
                            return Err(TraceError::NotAPeer {
                                rank: r,
                                op: pos[r],
                                to,
                            });
                        }
                        if let Some(Op::P2p { recvs: their, .. }) = head(&pos, q) {
                            open_group(&mut done[q], head(&pos, q));
                            if let Some(j) =
                                (0..their.len()).find(|&j| !done[q].1[j] && their[j].0 == r as u64)
                            {
                                if their[j].1 != bytes {
                                    return Err(TraceError::Sizes {
                                        rank: r,
                                        op: pos[r],
                                        bytes,
                                        to: q,
                                        received: their[j].1,
                                        their_op: pos[q],
                                    });
                                }
                                done[r].0[i] = true;
                                done[q].1[j] = true;
                                out.p2p += 1;
                                progress = true;
                            }
                        }
                    }
                }
            }
        }
        // Retire completed P2p groups.
        for r in 0..n {
            if let Some(Op::P2p { sends, recvs, .. }) = head(&pos, r) {
                let (s, v) = &done[r];
                if s.len() == sends.len() && v.len() == recvs.len() && s.iter().chain(v).all(|&x| x)
                {
                    pos[r] += 1;
                    out.ops += 1;
                    done[r] = (vec![], vec![]);
                    progress = true;
                }
            }
        }
        if !progress {
            break;
        }
    }
    let stuck: Vec<String> = (0..n)
        .filter(|&r| pos[r] < programs[r].len())
        .map(|r| {
            format!(
                "rank {r} at op {} of {}: {}",
                pos[r],
                programs[r].len(),
                describe(&programs[r][pos[r]])
            )
        })
        .collect();
    if !stuck.is_empty() {
        return Err(TraceError::Hang { stuck });
    }
    for p in programs {
        let f: f64 = p.iter().map(Op::flops).sum();
        out.total_flops += f;
        out.max_rank_flops = out.max_rank_flops.max(f);
    }
    Ok(out)
}
