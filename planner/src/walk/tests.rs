//! The walk against counts written from the model's sizes alone: GEMM FLOPs per
//! step, every pass of the schedule exactly once, slots as Megatron groups them.

use super::*;
use crate::config::{Dispatcher, Layout, Overlap, Precision, Recompute, RecomputeModules, Zero};
use crate::presets::resolve;
use crate::ranks::rank_map;
use crate::schedule::Pass;

fn cfg(tp: u64, pp: u64, vpp: u64, cp: u64, dp: u64) -> ParallelConfig {
    ParallelConfig {
        tp,
        pp,
        vpp,
        cp,
        ep: 1,
        etp: 1,
        dp,
        sp: tp > 1,
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

fn workload(seq: u64) -> Workload {
    Workload {
        seq,
        global_batch: 64,
        precision: Precision::Bf16,
        moe_imbalance: 1.0,
        moe_capacity: None,
    }
}

fn dims(seq: u64) -> Dims {
    Dims {
        hidden: 512,
        heads: 8,
        kv_heads: 4,
        head_dim: 64,
        ffn: 1024,
        experts: 0,
        top_k: 0,
        expert_ffn: 0,
        seq,
        mbs: 1,
    }
}

/// Every rank's walk of one step, tallied together.
fn tally_all(c: &ParallelConfig, schedule: Schedule, m: u64, layers: usize) -> Tally {
    let model = resolve("llama3-8b").unwrap().spec;
    let w = workload(256);
    let d = dims(256);
    let stages = (c.pp * schedule.interleaving(c.vpp)) as usize;
    let per = layers / stages;
    let stage_layers = vec![per; stages];
    let first_layer: Vec<usize> = (0..stages).map(|i| i * per).collect();
    let moe_layer = vec![false; layers];
    let step = Step {
        cfg: c,
        model: &model,
        workload: &w,
        dims: &d,
        moe_layer: &moe_layer,
        schedule,
        micro_batches: m,
        stage_layers: &stage_layers,
        first_layer: &first_layer,
    };
    let map = rank_map(c, "tp-cp-ep-dp-pp", 8).unwrap();
    let mut t = Tally::default();
    for r in 0..map.world_size {
        walk_step(step, &map, r, &mut t);
    }
    t
}

/// GEMM FLOPs of a step over every rank from the sizes alone: per token and layer,
/// 6x the linear weights (gated MLP: three matrices) and the causal attention core
/// (forward 4 · seq/2 · head_dim · heads, backward 2.5x that), plus `replays`
/// forward passes of the core.
fn expected_flops(d: &Dims, layers: u64, tokens: f64, replays: f64) -> f64 {
    let (h, q, kv) = (
        d.hidden as f64,
        (d.heads * d.head_dim) as f64,
        (d.kv_heads * d.head_dim) as f64,
    );
    let linear = h * (q + 2.0 * kv) + q * h + 3.0 * d.ffn as f64 * h;
    let attention = 4.0 * (d.seq / 2) as f64 * d.head_dim as f64 * d.heads as f64;
    tokens * layers as f64 * (6.0 * linear + (3.5 + replays) * attention)
}

#[test]
fn walked_gemm_flops_are_the_models() {
    let d = dims(256);
    for (c, schedule, replays) in [
        (cfg(2, 2, 1, 2, 1), Schedule::OneFOneB, 0.0),
        (cfg(2, 2, 2, 1, 2), Schedule::Interleaved, 0.0),
        (cfg(1, 4, 1, 1, 2), Schedule::ZbH1, 0.0),
        (
            ParallelConfig {
                recompute: Recompute::Selective,
                recompute_modules: RecomputeModules::CORE_ATTN,
                ..cfg(4, 2, 1, 1, 1)
            },
            Schedule::OneFOneB,
            1.0,
        ),
    ] {
        let m = 8;
        let t = tally_all(&c, schedule, m, 8);
        let tokens = (d.seq * d.mbs * m * c.dp) as f64;
        let want = expected_flops(&d, 8, tokens, replays);
        let got = t.total_flops();
        assert!(
            (got - want).abs() / want < 1e-12,
            "{c:?} {schedule:?}: walked {got:.6e} vs sizes {want:.6e}"
        );
    }
}

#[test]
fn full_recomputation_replays_every_forward_gemm() {
    let c = ParallelConfig {
        recompute: Recompute::Full,
        ..cfg(2, 2, 1, 1, 2)
    };
    let t = tally_all(&c, Schedule::OneFOneB, 4, 4);
    let plain = tally_all(&cfg(2, 2, 1, 1, 2), Schedule::OneFOneB, 4, 4);
    // The forward is a third of the linear FLOPs and 1/3.5 of the core's.
    assert_eq!(plain.recompute_flops.values().sum::<f64>(), 0.0);
    let fwd_linear = (plain.flops["attention_proj"] + plain.flops["mlp"]) / 3.0;
    let fwd_core = plain.flops["attention_core"] / 3.5;
    let replayed: f64 = t.recompute_flops.values().sum();
    assert!((replayed - fwd_linear - fwd_core).abs() / replayed < 1e-12);
    assert_eq!(t.flops, plain.flops);
}

#[test]
fn every_pass_is_walked_once_per_chunk_and_micro_batch() {
    let model = resolve("llama3-8b").unwrap().spec;
    let w = workload(256);
    let d = dims(256);
    for (schedule, vpp, m) in [
        (Schedule::OneFOneB, 1, 8),
        (Schedule::Interleaved, 2, 8),
        (Schedule::ZbH1, 1, 8),
        (Schedule::DualPipe, 1, 8),
        (Schedule::Gpipe, 1, 3),
    ] {
        let c = cfg(1, 4, vpp, 1, 1);
        let stages = 4 * schedule.chunks_per_rank(vpp).max(vpp) as usize;
        let stage_layers = vec![1; stages];
        let first_layer: Vec<usize> = (0..stages).collect();
        let moe_layer = vec![false; stages];
        let step = Step {
            cfg: &c,
            model: &model,
            workload: &w,
            dims: &d,
            moe_layer: &moe_layer,
            schedule,
            micro_batches: m,
            stage_layers: &stage_layers,
            first_layer: &first_layer,
        };
        for rank in 0..4 {
            let passes: Vec<Slot> = slots(&step, rank).into_iter().flatten().collect();
            let chunks = schedule.chunks_per_rank(step.vpp());
            for pass in [Pass::Forward, Pass::Backward] {
                let n = passes.iter().filter(|s| s.pass == pass).count() as u64;
                let want = if schedule == Schedule::DualPipe {
                    m
                } else {
                    m * chunks
                };
                assert_eq!(n, want, "{schedule:?} rank {rank} {pass:?}");
            }
            // Only the zero-bubble schedules defer weight gradients.
            let defers = matches!(schedule, Schedule::ZbH1 | Schedule::DualPipe);
            assert_eq!(passes.iter().any(|s| s.deferred), defers, "{schedule:?}");
            // A slot is one pass, or a forward and a backward, plus weight passes.
            for slot in slots(&step, rank) {
                let fb = slot.iter().filter(|s| s.pass != Pass::Weight).count();
                assert!(
                    fb == 1 || (fb == 2 && slot[0].pass == Pass::Forward),
                    "{slot:?}"
                );
                if !matches!(schedule, Schedule::Interleaved | Schedule::DualPipe) {
                    assert_eq!(fb, 1, "{schedule:?}: {slot:?}");
                }
            }
            // A deferred weight pass follows its backward, once.
            for s in passes
                .iter()
                .filter(|s| s.deferred && s.pass == Pass::Backward)
            {
                let b = passes.iter().position(|x| x == s).unwrap();
                let w: Vec<usize> = passes
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.pass == Pass::Weight && (x.chunk, x.mb) == (s.chunk, s.mb))
                    .map(|(i, _)| i)
                    .collect();
                assert!(w.len() == 1 && w[0] > b, "{schedule:?} rank {rank}: {s:?}");
            }
        }
    }
}
