//! What a run records from a device program: measured op times booked into a
//! rank's statistics, and the activations held at once.

use std::collections::HashMap;

use super::op::{GroupKind, Op};
use crate::record::RankStats;

/// Books one op's measured seconds into a rank's statistics, the way the CPU
/// backend books its own: GEMMs per call under "class m n k" (a batched or repeated
/// GEMM counts each product), collectives under "kind op ranks bytes", and each
/// class or kind as a component; recomputed work also under "recompute".
pub fn book(st: &mut RankStats, op: &Op, secs: f64, group_size: impl Fn(GroupKind) -> u64) {
    let mut component =
        |name: &str, secs: f64| *st.components.entry(name.to_string()).or_default() += secs;
    match *op {
        Op::Gemm {
            class,
            m,
            n,
            k,
            batch,
            count,
            recompute,
        } => {
            component(class.key(), secs);
            if recompute {
                component("recompute", secs);
            }
            let calls = batch * count;
            let smp = st.gemms.entry(format!("{class} {m} {n} {k}")).or_default();
            smp.calls += calls;
            if smp.secs.len() < 4096 {
                smp.secs.push(secs / calls as f64);
            }
        }
        Op::Memory {
            class, recompute, ..
        } => {
            component(class.key(), secs);
            if recompute {
                component("recompute", secs);
            }
        }
        Op::Coll {
            kind,
            group,
            op,
            bytes,
        } => {
            component(kind.key(), secs);
            let smp = st
                .comms
                .entry(format!(
                    "{} {} {} {bytes}",
                    kind.key(),
                    op.label(),
                    group_size(group)
                ))
                .or_default();
            smp.calls += 1;
            if smp.secs.len() < 4096 {
                smp.secs.push(secs);
            }
        }
        Op::P2p {
            kind,
            ref sends,
            ref recvs,
        } => {
            component(kind.key(), secs);
            let bytes = sends
                .iter()
                .map(|x| x.1)
                .sum::<u64>()
                .max(recvs.iter().map(|x| x.1).sum());
            let smp = st
                .comms
                .entry(format!("{} send_recv 2 {bytes}", kind.key()))
                .or_default();
            smp.calls += 1;
            if smp.secs.len() < 4096 {
                smp.secs.push(secs);
            }
        }
        Op::Keep { .. } | Op::Free { .. } | Op::Barrier => {}
    }
}

/// Most (chunk, micro-batch) activations held at once, and their bytes.
pub fn peaks(program: &[Op]) -> (u64, u64) {
    let (mut live, mut bytes, mut peak_live, mut peak_bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut held: HashMap<(u64, u64), u64> = HashMap::new();
    for op in program {
        match *op {
            Op::Keep { key, bytes: b } => {
                held.insert(key, b);
                live += 1;
                bytes += b;
                peak_live = peak_live.max(live);
                peak_bytes = peak_bytes.max(bytes);
            }
            Op::Free { key } => {
                if let Some(b) = held.remove(&key) {
                    live -= 1;
                    bytes -= b;
                }
            }
            _ => {}
        }
    }
    (peak_live, peak_bytes)
}
