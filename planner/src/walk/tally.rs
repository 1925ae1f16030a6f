//! A sink that adds the walk up: GEMM FLOPs and element-wise bytes by class,
//! collective and transfer bytes by kind.

use std::collections::BTreeMap;

use super::op::Op;
use super::Sink;

/// Totals of a walked step (one rank, or several walked into the same tally).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// GEMM FLOPs by op class, first run (forward, backward) and replayed.
    pub flops: BTreeMap<&'static str, f64>,
    pub recompute_flops: BTreeMap<&'static str, f64>,
    /// Element-wise bytes read and written, by class.
    pub memory_bytes: BTreeMap<&'static str, u64>,
    /// Collective bytes (nccl-tests' convention, see [`Op::Coll`]) by kind.
    pub collective_bytes: BTreeMap<&'static str, u64>,
    /// Bytes sent point to point, by kind.
    pub sent_bytes: BTreeMap<&'static str, u64>,
    pub ops: usize,
}

impl Tally {
    /// Every GEMM FLOP, replays included.
    pub fn total_flops(&self) -> f64 {
        self.flops
            .values()
            .chain(self.recompute_flops.values())
            .sum()
    }
}

impl Sink for Tally {
    fn op(&mut self, op: Op) {
        self.ops += 1;
        match &op {
            Op::Gemm {
                class, recompute, ..
            } => {
                let to = if *recompute {
                    &mut self.recompute_flops
                } else {
                    &mut self.flops
                };
                *to.entry(class.key()).or_default() += op.flops();
            }
            Op::Memory { class, bytes, .. } => {
                let b = self.memory_bytes.entry(class.key()).or_default();
                *b = b.saturating_add(*bytes);
            }
            Op::Coll { kind, bytes, .. } => {
                let b = self.collective_bytes.entry(kind.key()).or_default();
                *b = b.saturating_add(*bytes);
            }
            Op::P2p { kind, sends, .. } => {
                let sent = sends.iter().fold(0u64, |a, s| a.saturating_add(s.1));
                let b = self.sent_bytes.entry(kind.key()).or_default();
                *b = b.saturating_add(sent);
            }
            Op::Keep { .. } | Op::Free { .. } | Op::Barrier => {}
        }
    }
}
