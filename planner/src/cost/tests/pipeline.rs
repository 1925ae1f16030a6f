//! The pipeline: the closed-form bubble, what each schedule changes in bubble and
//! memory, and the per-stage memory (Megatron's formula, multi-token prediction on
//! the last stage).

use super::*;

/// Multi-token prediction loads only the last stage: one more layer of the
/// last layer's kind, a second output pass, the projection and a copy of the
/// embedding; Megatron's FLOP count grows by the same layer and pass.
#[test]
fn mtp_layers_load_the_last_stage() {
    let with = resolve("deepseek-v3").unwrap().spec;
    assert!(with.mtp_layers == 1 && with.mtp_is_moe());
    let without = ModelSpec {
        mtp_layers: 0,
        ..with.clone()
    };
    let c = Cluster::new(builtin_profile("b200").unwrap(), 256).unwrap();
    let w = wl(4096, 512);
    let layout = Layout::from_megatron("Et*7|(t*8|)*6t*6mL", 8).unwrap();
    let k = ParallelConfig {
        ep: 32,
        zero: Zero::DistOpt,
        layout: layout.layout,
        ..cfg(1, 8, 1, 32)
    };
    let (a, b) = (
        evaluate(&without, &c, &w, &k, Assumptions::default()).unwrap(),
        evaluate(&with, &c, &w, &k, Assumptions::default()).unwrap(),
    );
    for i in 0..7 {
        assert!(
            close(
                a.stages[i].secs_per_micro_batch,
                b.stages[i].secs_per_micro_batch
            ) && close(a.stages[i].memory.total, b.stages[i].memory.total),
            "stage {i} changed"
        );
        assert_eq!(b.stages[i].mtp_layers, 0);
    }
    let (sa, sb) = (&a.stages[7], &b.stages[7]);
    assert_eq!((sb.layers, sb.mtp_layers), (6, 1));
    // Time: at least one more MoE layer (a full middle stage has eight).
    let moe_layer = a.stages[1].secs_per_micro_batch / 8.0;
    assert!(
        sb.secs_per_micro_batch - sa.secs_per_micro_batch > moe_layer,
        "{} vs {}",
        sb.secs_per_micro_batch,
        sa.secs_per_micro_batch
    );
    // Parameters: the MTP module (experts sharded over EP) and the embedding copy.
    let p = with.params();
    let added = (with.mtp_params() - p.routed_experts) as f64
        + p.routed_experts as f64 / 32.0
        + p.embedding as f64;
    assert!(
        (sb.memory.params - sa.memory.params - added).abs() < 1.0,
        "{} vs {added}",
        sb.memory.params - sa.memory.params
    );
    // Model FLOPs: Megatron's count with one more MoE layer (about 1/60 of
    // the layers' FLOPs) and one more logits pass (6 x 0.93B FLOPs per token,
    // about 2% of DeepSeek-V3's): 3 to 5 percent more.
    let flops = |e: &Estimate| e.model_tflops_per_gpu * e.step_secs;
    let ratio = flops(&b) / flops(&a);
    assert!(ratio > 1.03 && ratio < 1.05, "{ratio}");
}

/// Megatron-LM `theoretical_memory_usage.py` for Llama 2 7B at TP 2, PP 2 on 8
/// GPUs (DP 2) with the distributed optimizer: the most loaded shard holds
/// (transformer / pp + embedding) / tp parameters at 6 + 12/dp bytes each.
#[test]
fn llama2_7b_tp2_pp2_distributed_optimizer_matches_megatron() {
    let m = resolve("llama2-7b").unwrap().spec;
    let (h, l, f, v) = (4096.0f64, 32.0, 11008.0, 32000.0);
    // Megatron's formula: 2 L h^2 (attention (1 + kv/heads) + mlp ffn/h * 3/2 + norms 2/h + final norm 1/(L h)).
    let transformer = 2.0 * l * h * h * ((1.0 + 1.0) + (f / h) * 1.5 + 2.0 / h + 1.0 / (l * h));
    let shard = (transformer / 2.0 + h * v) / 2.0;
    let megatron_bytes = shard * (6.0 + 12.0 / 2.0);
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 8).unwrap();
    let mut k = cfg(2, 2, 1, 2);
    k.zero = Zero::DistOpt;
    let e = estimate(&m, &c, &wl(4096, 64), &k).unwrap();
    let s0 = &e.stages[0].memory;
    let ours = s0.weights + s0.gradients + s0.optimizer;
    // Megatron counts the final norm on every shard; we put it on the last stage.
    assert!(
        (ours - megatron_bytes).abs() / megatron_bytes < 1e-4,
        "ours {ours} vs Megatron {megatron_bytes}"
    );
    assert!((s0.params - shard).abs() / shard < 1e-4);
}

#[test]
fn uniform_pipeline_bubble_is_the_closed_form() {
    let m = gpt("g", "test", 32, 4096, 32);
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
    for (pp, vpp, gbs) in [(4u64, 1u64, 16u64), (4, 2, 16), (8, 4, 64)] {
        let mut k = cfg(8, pp, 1, 64 / (8 * pp));
        k.vpp = vpp;
        k.schedule = Schedule::default_for(vpp);
        let e = estimate(&m, &c, &wl(2048, gbs), &k).unwrap();
        // Stages are equal except the first (embedding) and last (output layer):
        // the bubble is (p-1)/v passes of the mean stage.
        let mean = e.stages.iter().map(|s| s.secs_per_micro_batch).sum::<f64>() / pp as f64;
        assert!(close(e.time.bubble, (pp - 1) as f64 / vpp as f64 * mean));
    }
}

/// The schedule changes the bubble and the memory, not the work: ZB-H1 keeps
/// 1F1B's memory with the bubble (p-1)(F + B - 2W) (full B); DualPipe holds
/// stages i and p-1-i on rank i (twice the parameters, p+1 micro-batches of
/// activations; DeepSeek-V3 Table 2) with (p/2-1)(F&B + B - 3W), F&B = F + B.
/// The simulator re-scores each, and the zero-bubble schedules come out with
/// less bubble than 1F1B.
#[test]
fn schedules_change_bubble_and_memory() {
    let m = gpt("g", "test", 32, 4096, 32);
    // The schedules' arithmetic on GPU time: these layers (TP 8, 2,048 tokens) are
    // small enough for the host to hold them back, which no schedule changes.
    let mut hw = builtin_profile("h100-sxm").unwrap();
    hw.efficiency.host_layer_kernel_us = 0.0;
    let c = Cluster::new(hw, 64).unwrap();
    let w = wl(2048, 64);
    let base = cfg(8, 4, 1, 2);
    let run = |s: Schedule| {
        let k = ParallelConfig {
            schedule: s,
            ..base.clone()
        };
        (evaluate(&m, &c, &w, &k, Assumptions::default()).unwrap(), k)
    };
    let ((fb, _), (zb, kz), (dp, kd)) = (
        run(Schedule::OneFOneB),
        run(Schedule::ZbH1),
        run(Schedule::DualPipe),
    );
    let mean =
        |e: &Estimate, f: fn(&StageSummary) -> f64| e.stages.iter().map(f).sum::<f64>() / 4.0;
    let (t, wg) = (
        mean(&fb, |s| s.secs_per_micro_batch),
        mean(&fb, |s| s.weight_grad_secs),
    );
    assert!(
        wg > 0.1 * t && wg <= t / 3.0,
        "weight-gradient share {}",
        wg / t
    );
    assert!(close(fb.time.bubble, 3.0 * t));
    assert!(close(zb.time.bubble, 3.0 * (t - 2.0 * wg)));
    assert!(close(
        dp.time.bubble,
        (4.0 / 2.0 - 1.0) * (5.0 / 3.0 * t - 3.0 * wg)
    ));
    for i in 0..4 {
        let (f, z, d) = (
            &fb.stages[i].memory,
            &zb.stages[i].memory,
            &dp.stages[i].memory,
        );
        assert_eq!((z.params, z.activations), (f.params, f.activations));
        assert!(close(d.params, f.params + fb.stages[3 - i].memory.params));
        assert!(close(
            d.weights,
            f.weights + fb.stages[3 - i].memory.weights
        ));
        assert_eq!(d.in_flight, 5.0);
        // Work per rank is unchanged: the mean of the two stages it runs.
        assert_eq!(
            dp.stages[i].secs_per_micro_batch,
            fb.stages[i].secs_per_micro_batch
        );
    }
    // The middle ranks hold 5 micro-batches of one (embedding-free) stage.
    let per_stage = fb.stages[1].memory.activations / fb.stages[1].memory.in_flight;
    assert!(close(dp.stages[1].memory.activations, 5.0 * per_stage));
    // DualPipe sums the two copies' gradients: one all-reduce between mirror ranks.
    assert!(dp
        .comm
        .iter()
        .any(|t| t.kind == CommKind::DpGrad && t.group.size == 2));
    for (e, k) in [(zb, kz), (dp, kd)] {
        let e = simulate(&e, &k).unwrap_or_else(|| panic!("{:?}", k.schedule));
        assert!(
            e.pipeline_simulated && e.time.bubble < fb.time.bubble,
            "{:?}: {} vs 1F1B {}",
            k.schedule,
            e.time.bubble,
            fb.time.bubble
        );
    }
}

/// Deep interleaving puts more transfers than idle on the simulated path: the
/// simulated step's time beyond compute keeps at least the closed-form bubble as
/// the schedule's idle, and the communication table's exposed times add up to the
/// breakdown's exposed communication.
#[test]
fn simulated_bubble_and_transfers_add_up_at_deep_interleaving() {
    let m = gpt("g", "test", 80, 8192, 64);
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
    for vpp in [1u64, 5, 20] {
        let mut k = cfg(4, 4, 1, 4);
        (k.vpp, k.sp, k.zero) = (vpp, true, Zero::DistOpt);
        k.schedule = Schedule::default_for(vpp);
        let e = estimate(&m, &c, &wl(4096, 32), &k).unwrap_or_else(|r| panic!("vpp {vpp}: {r}"));
        let s = simulate(&e, &k).unwrap();
        let mean = s
            .stages
            .iter()
            .map(|st| st.secs_per_micro_batch)
            .sum::<f64>()
            / 4.0;
        assert!(
            s.time.bubble >= 0.99 * 3.0 / vpp as f64 * mean,
            "vpp {vpp}: bubble {} below (p-1)t/v = {}",
            s.time.bubble,
            3.0 / vpp as f64 * mean
        );
        let table: f64 = s.comm.iter().map(|t| t.exposed_secs).sum();
        assert!(
            (table - s.time.exposed_comm).abs() <= 1e-6 * s.step_secs,
            "vpp {vpp}: table {table} against breakdown {}",
            s.time.exposed_comm
        );
    }
}
