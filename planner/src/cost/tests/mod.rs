use super::kernel::Ctx;
use super::layer::layer_cost;
use super::stage::pieces;
use super::*;
use crate::comm::{collective_secs, Tier};
use crate::config::{Dispatcher, Layout, Overlap, Precision, Recompute, Zero};
use crate::hardware::builtin_profile;
use crate::memory::LayerKind;
use crate::presets::{gpt, resolve};
use crate::schedule::Schedule;

mod communication;
mod compute;
mod host;
mod pipeline;
mod properties;

fn cfg(tp: u64, pp: u64, cp: u64, dp: u64) -> ParallelConfig {
    ParallelConfig {
        tp,
        pp,
        vpp: 1,
        cp,
        ep: 1,
        etp: 1,
        dp,
        sp: false,
        mbs: 1,
        zero: Zero::None,
        recompute: Recompute::None,
        layout: Layout::Even,
        overlap: Overlap::default(),
        bf16_grads: false,
        bf16_moments: false,
        recompute_modules: Default::default(),
        moe_dispatcher: Dispatcher::AllToAll,
        schedule: Schedule::OneFOneB,
    }
}

fn wl(seq: u64, gbs: u64) -> Workload {
    Workload {
        seq,
        global_batch: gbs,
        precision: Precision::Bf16,
        moe_imbalance: 1.0,
        moe_capacity: None,
    }
}

fn term(e: &Estimate, kind: CommKind) -> &CommTerm {
    e.comm.iter().find(|t| t.kind == kind).unwrap_or_else(|| {
        panic!(
            "no {kind:?} term in {:?}",
            e.comm.iter().map(|t| t.kind).collect::<Vec<_>>()
        )
    })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-30)
}

/// nanotron's reserved-only blocks are in a reserved peak, not in what a plan
/// needs (the allocator gives them back before it runs out of memory), and never
/// beyond the HBM the rest leaves; the allocated peak does not see them.
#[test]
fn cached_blocks_count_in_the_reserved_peak_only() {
    use crate::memory::MemKind;
    let m = resolve("llama3-8b").unwrap().spec;
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 8).unwrap();
    let k = |mbs| ParallelConfig {
        sp: true,
        mbs,
        ..cfg(8, 1, 1, 1)
    };
    let at = |k: &ParallelConfig, framework| {
        let a = Assumptions {
            framework,
            ..Assumptions::default()
        };
        evaluate(&m, &c, &wl(4096, 64), k, a).unwrap().memory
    };
    let nano = at(&k(1), Framework::Nanotron);
    assert!(nano.cached > 0.0);
    let parts = nano.weights
        + nano.gradients
        + nano.optimizer
        + nano.activations
        + nano.logits
        + nano.buffers
        + nano.fragmentation
        + nano.reserve;
    assert!((nano.total - parts).abs() <= 1e-6 * nano.total);
    assert_eq!(
        MemKind::PeakReserved.comparable_bytes(&nano)
            - MemKind::PeakAllocated.comparable_bytes(&nano),
        nano.fragmentation + nano.cached
    );
    assert_eq!(at(&k(1), Framework::MegatronCore).cached, 0.0);
    // Sixteen sequences per micro-batch: the blocks would outgrow the HBM,
    // and stop where it ends.
    let big = at(&k(16), Framework::Nanotron);
    assert!(big.total < c.profile.hbm_bytes(), "{big:?}");
    let hbm = c.profile.hbm_bytes();
    assert!(big.cached > 0.0 && (big.total + big.cached - hbm).abs() <= 1e-6 * hbm);
}
