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
