//! The device scratch a program needs.

use super::op::{Coll, GroupKind, Op, B};

/// Device scratch a program needs, bytes: GEMM operands (A, B, C) and the send and
/// receive sides of every transfer; element-wise work is copied through A and B
/// in pieces of at most [`COPY_PIECE`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scratch {
    pub a: u64,
    pub b: u64,
    pub c: u64,
}

/// Largest single device-to-device copy of element-wise traffic.
pub const COPY_PIECE: u64 = 256 << 20;

/// What each side of a collective holds on one rank of `n`: (send, receive) bytes.
pub fn coll_sides(op: Coll, bytes: u64, n: u64) -> (u64, u64) {
    match op {
        Coll::AllGather => (bytes / n.max(1), bytes),
        Coll::ReduceScatter => (bytes, bytes / n.max(1)),
        Coll::AllReduce | Coll::AllToAll => (bytes, bytes),
    }
}

impl Scratch {
    pub fn of(program: &[Op], group_size: impl Fn(GroupKind) -> u64) -> Scratch {
        let mut s = Scratch::default();
        for op in program {
            let (a, b, c) = match *op {
                Op::Gemm { m, n, k, batch, .. } => {
                    (m * k * batch * B, k * n * batch * B, m * n * batch * B)
                }
                Op::Memory { bytes, .. } => {
                    let piece = (bytes / 2).min(COPY_PIECE);
                    (piece, piece, 0)
                }
                Op::Coll {
                    group, op, bytes, ..
                } => {
                    let (snd, rcv) = coll_sides(op, bytes, group_size(group));
                    (snd, rcv, 0)
                }
                Op::P2p {
                    ref sends,
                    ref recvs,
                    ..
                } => (
                    sends.iter().map(|x| x.1).max().unwrap_or(0),
                    recvs.iter().map(|x| x.1).sum(),
                    0,
                ),
                Op::Barrier => (B, B, 0),
                Op::Keep { .. } | Op::Free { .. } => (0, 0, 0),
            };
            s.a = s.a.max(a);
            s.b = s.b.max(b);
            s.c = s.c.max(c);
        }
        s
    }
}
