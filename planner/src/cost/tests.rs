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

/// The backward prices its two GEMMs at their own shapes. Without a curve that is
/// twice the forward; with one, the weight gradient of a short-row GEMM reduces
/// over few rows and costs more than its forward.
#[test]
fn backward_gemms_at_their_own_shapes() {
    let model = gpt("t", "test", 2, 4096, 32);
    let (k, w) = (cfg(1, 1, 1, 8), wl(4096, 64));
    let ctx = |hw| Ctx {
        model: &model,
        hw,
        w: &w,
        cfg: &k,
        a: Assumptions::default(),
        tokens: 4096.0,
        fp8: false,
        domain: 8,
    };
    let a100 = builtin_profile("a100-80g").unwrap();
    let p = ctx(&a100).pass(4096.0, 12288.0, 4096.0, false);
    assert!((p.bwd / p.fwd - 2.0).abs() < 0.01, "{p:?}");
    let h100 = builtin_profile("h100-sxm").unwrap();
    let c = ctx(&h100);
    // 1024 routed rows through a 2880 -> 5760 expert GEMM (GPT-OSS-120B, EP 8).
    let p = c.pass(1024.0, 5760.0, 2880.0, false);
    assert!(p.bwd > 2.03 * p.fwd, "{p:?}");
    assert!(close(
        p.bwd,
        c.gemm(1024.0, 2880.0, 5760.0, false) + c.gemm(2880.0, 5760.0, 1024.0, false)
    ));
    assert!(close(p.wgrad, c.gemm(2880.0, 5760.0, 1024.0, false)));
}

/// With a measured attention curve the core's time follows the kernel's
/// efficiency at the head width and the per-rank sequence: the same FLOPs in
/// 64-wide heads take 518/363 as long as in 128-wide ones at 4096 tokens, and CP 2
/// runs its 2048-token shards at the 2048-token point.
#[test]
fn attention_core_follows_the_measured_curve() {
    let h100 = builtin_profile("h100-sxm").unwrap();
    let w = wl(4096, 64);
    let core = |heads: u64, cp: u64| {
        let model = gpt("t", "test", 2, 4096, heads);
        let k = cfg(1, 1, cp, 8 / cp);
        let lc = layer_cost(
            &Ctx {
                model: &model,
                hw: &h100,
                w: &w,
                cfg: &k,
                a: Assumptions::default(),
                tokens: 4096.0 / cp as f64,
                fp8: false,
                domain: 8,
            },
            LayerKind::Dense,
        );
        let launch = h100.efficiency.gemm_overhead_us * 1e-6;
        (lc.attn_core_fwd - launch, lc.attn_core_bwd - launch)
    };
    let ((f128, b128), (f64_, b64)) = (core(32, 1), core(64, 1));
    assert!(
        (f64_ / f128 - 518.0 / 363.0).abs() < 1e-9 && (b64 / b128 - 499.0 / 417.0).abs() < 1e-9
    );
    // CP 2: half of the causal (query, key) pairs on each rank, at the 2048-token point.
    let (f_cp, _) = core(32, 2);
    assert!(
        (f_cp / f128 - 0.5 * 518.0 / 484.0).abs() < 1e-3,
        "{}",
        f_cp / f128
    );
}

/// The loss kernels differ only in the bytes they move over the logits: the
/// unfused loss 20 more per logit than Megatron's fused one, on the last stage.
#[test]
fn loss_kernels_differ_by_their_passes_over_the_logits() {
    let bytes =
        [LossKernel::Te, LossKernel::Native, LossKernel::Unfused].map(LossKernel::bytes_per_logit);
    assert_eq!(bytes, [10.0, 32.0, 52.0]);
    let model = resolve("llama3-8b").unwrap().spec;
    let h100 = builtin_profile("h100-sxm").unwrap();
    let (k, w) = (
        ParallelConfig {
            zero: Zero::DistOpt,
            ..cfg(2, 1, 1, 4)
        },
        wl(4096, 64),
    );
    let ctx = |loss| Ctx {
        model: &model,
        hw: &h100,
        w: &w,
        cfg: &k,
        a: Assumptions {
            loss,
            ..Assumptions::default()
        },
        tokens: 4096.0,
        fp8: false,
        domain: 8,
    };
    let output = |loss| pieces(&ctx(loss)).output_secs;
    // 4096 tokens x half of the 128256-entry vocabulary on each TP rank.
    let c = ctx(LossKernel::Native);
    assert!(close(
        output(LossKernel::Unfused) - output(LossKernel::Native),
        c.mem(4096.0 * 64128.0 * 20.0)
    ));
    assert!(close(
        output(LossKernel::Native) - output(LossKernel::Te),
        c.mem(4096.0 * 64128.0 * 22.0)
    ));
    let cluster = Cluster::new(h100.clone(), 8).unwrap();
    let step = |loss| {
        estimate_with(
            &model,
            &cluster,
            &w,
            &k,
            Assumptions {
                loss,
                ..Assumptions::default()
            },
        )
        .unwrap()
        .step_secs
    };
    assert!(
        step(LossKernel::Unfused) > step(LossKernel::Native)
            && step(LossKernel::Native) > step(LossKernel::Te)
    );
}

/// ScaleTorch's grid `[DP, PP, CP, EP, TP]` puts a pipeline inside each
/// data-parallel replica: with TP 2, PP 4, DP 8 on 8-GPU nodes its stages are
/// neighbours on NVLink and its DP group has one member per node, the reverse
/// of Megatron's `tp-cp-ep-dp-pp`.
#[test]
fn scaletorch_order_places_pp_inside_and_dp_across_nodes() {
    let model = resolve("8b").unwrap().spec;
    let h100 = builtin_profile("h100-sxm").unwrap();
    let w = wl(4096, 256);
    let k = cfg(2, 4, 1, 8);
    let ctx = |rank_order| Ctx {
        model: &model,
        hw: &h100,
        w: &w,
        cfg: &k,
        a: Assumptions {
            rank_order,
            ..Assumptions::default()
        },
        tokens: 4096.0,
        fp8: false,
        domain: 8,
    };
    let (mega, st) = (ctx(RankOrder::Megatron), ctx(RankOrder::ScaleTorch));
    assert_eq!(mega.pp_group().tier(), Tier::Network);
    assert_eq!(st.pp_group().tier(), Tier::Nvlink);
    assert_eq!(
        (mega.dp_group().per_domain, mega.dp_group().domains),
        (4, 2)
    );
    assert_eq!((st.dp_group().per_domain, st.dp_group().domains), (1, 8));
    // Same groups for TP and CP.
    assert_eq!(mega.tp_group(), st.tp_group());
    assert_eq!(mega.cp_group(), st.cp_group());
}

/// Megatron's all-to-all dispatcher sorts the received tokens by local expert and
/// back (8h bytes per routed token beyond the permute and un-permute); with one
/// expert per rank, or DeepEP-style dispatch, it does not.
#[test]
fn all_to_all_dispatch_sorts_chunks_by_local_expert() {
    let model = resolve("gpt-oss-120b").unwrap().spec;
    let h100 = builtin_profile("h100-sxm").unwrap();
    let w = wl(4096, 64);
    let elementwise = |ep: u64, d: Dispatcher| {
        let k = ParallelConfig {
            ep,
            moe_dispatcher: d,
            ..cfg(1, 1, 1, 8)
        };
        layer_cost(
            &Ctx {
                model: &model,
                hw: &h100,
                w: &w,
                cfg: &k,
                a: Assumptions::default(),
                tokens: 4096.0,
                fp8: false,
                domain: 8,
            },
            LayerKind::Moe,
        )
        .fwd
        .elementwise
    };
    let c = Ctx {
        model: &model,
        hw: &h100,
        w: &w,
        cfg: &cfg(1, 1, 1, 8),
        a: Assumptions::default(),
        tokens: 4096.0,
        fp8: false,
        domain: 8,
    };
    // 4096 tokens x top-4 routed rows of 2880 BF16 values.
    let sort = c.mem(4096.0 * 4.0 * 8.0 * 2880.0);
    assert!(close(
        elementwise(8, Dispatcher::AllToAll) - elementwise(8, Dispatcher::Deduplicated),
        sort
    ));
    // 128 experts on 128 ranks: one local expert, nothing to sort.
    assert!(close(
        elementwise(128, Dispatcher::AllToAll),
        elementwise(128, Dispatcher::Deduplicated)
    ));
}

/// Sandwich norms (Gemma 2 and 3, GLM-4-0414) add two norm passes per layer
/// (read 2h, write 2h per token, split by SP), forward and, twice over,
/// backward; nothing else moves.
#[test]
fn sandwich_norms_add_two_norm_passes() {
    let plain = resolve("llama3-8b").unwrap().spec;
    let sandwich = ModelSpec {
        sandwich_norms: true,
        ..plain.clone()
    };
    let h100 = builtin_profile("h100-sxm").unwrap();
    let w = wl(4096, 64);
    let k = ParallelConfig {
        sp: true,
        ..cfg(4, 1, 1, 2)
    };
    let ctx = |model| Ctx {
        model,
        hw: &h100,
        w: &w,
        cfg: &k,
        a: Assumptions::default(),
        tokens: 4096.0,
        fp8: false,
        domain: 8,
    };
    let (a, b) = (
        layer_cost(&ctx(&sandwich), LayerKind::Dense),
        layer_cost(&ctx(&plain), LayerKind::Dense),
    );
    let two_norms = ctx(&plain).mem(4096.0 * 2.0 * 4.0 * plain.hidden as f64 / 4.0);
    assert!(close(a.fwd.elementwise - b.fwd.elementwise, two_norms));
    assert!(close(
        a.bwd.elementwise - b.bwd.elementwise,
        2.0 * two_norms
    ));
    assert_eq!(a.fwd.mlp, b.fwd.mlp);
    assert_eq!(a.fwd.attention_proj, b.fwd.attention_proj);
}

/// FP8 casts every GEMM input: in an MoE layer the routed experts' inputs over
/// their routed rows (h into FC1, the expert FFN width into FC2), not a dense
/// MLP's.
#[test]
fn fp8_casts_routed_expert_inputs() {
    let model = resolve("qwen3-235b-a22b").unwrap().spec;
    let moe = model.moe.unwrap();
    assert_eq!(moe.shared_hidden(), 0);
    let h100 = builtin_profile("h100-sxm").unwrap();
    let w = wl(4096, 64);
    let k = ParallelConfig {
        ep: 8,
        ..cfg(1, 1, 1, 8)
    };
    let ctx = |fp8| Ctx {
        model: &model,
        hw: &h100,
        w: &w,
        cfg: &k,
        a: Assumptions::default(),
        tokens: 4096.0,
        fp8,
        domain: 8,
    };
    let extra = layer_cost(&ctx(true), LayerKind::Moe).fwd.elementwise
        - layer_cost(&ctx(false), LayerKind::Moe).fwd.elementwise;
    let (h, routed) = (model.hidden as f64, 4096.0 * moe.top_k as f64);
    let elems =
        4096.0 * (h + model.attn_out_dim() as f64) + routed * (h + moe.expert_ffn_hidden as f64);
    assert!(
        close(extra, ctx(true).mem(3.0 * elems)),
        "{extra} vs {}",
        ctx(true).mem(3.0 * elems)
    );
}

/// ZB-H1 and DualPipe defer each stage's weight-gradient GEMMs as the W pass:
/// a middle stage's W time is its layers' `X^T dY` GEMMs at their own shapes,
/// not the forward GEMMs' time.
#[test]
fn weight_grad_pass_is_the_weight_gradient_gemms() {
    let model = gpt("t", "test", 8, 2048, 16);
    let h100 = builtin_profile("h100-sxm").unwrap();
    let c = Cluster::new(h100.clone(), 8).unwrap();
    let k = ParallelConfig {
        schedule: Schedule::ZbH1,
        ..cfg(2, 4, 1, 1)
    };
    let w = wl(4096, 16);
    let e = evaluate(&model, &c, &w, &k, Assumptions::default()).unwrap();
    let ctx = Ctx {
        model: &model,
        hw: &h100,
        w: &w,
        cfg: &k,
        a: Assumptions::default(),
        tokens: 4096.0,
        fp8: false,
        domain: 8,
    };
    let (h, f, t) = (2048.0, model.ffn_hidden as f64, 2.0);
    // QKV (MHA: 3h), output projection, and the MLP's two matrices.
    let wgrad = ctx.gemm(h, 3.0 * h / t, 4096.0, false)
        + ctx.gemm(h / t, h, 4096.0, false)
        + ctx.gemm(h, f / t, 4096.0, false)
        + ctx.gemm(f / t, h, 4096.0, false);
    let fwd = ctx.gemm(4096.0, 3.0 * h / t, h, false)
        + ctx.gemm(4096.0, h, h / t, false)
        + ctx.gemm(4096.0, f / t, h, false)
        + ctx.gemm(4096.0, h, f / t, false);
    assert_eq!(model.mlp.matrices(), 2);
    assert!(
        close(e.stages[1].weight_grad_secs, 2.0 * wgrad),
        "{} vs {}",
        e.stages[1].weight_grad_secs,
        2.0 * wgrad
    );
    assert!(
        (wgrad / fwd - 1.0).abs() > 1e-3,
        "the shapes should differ in efficiency: {wgrad} vs {fwd}"
    );
}

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

/// EP all-to-all overlap: hidden behind the partner pass's compute where
/// Megatron allows it (interleaved or no pipeline, no full recomputation) and
/// under DualPipe by construction; never elsewhere.
#[test]
fn ep_all_to_all_overlap_follows_megatrons_rules() {
    let m = resolve("qwen3-235b-a22b").unwrap().spec;
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 256).unwrap();
    let w = wl(4096, 1024);
    let base = ParallelConfig {
        tp: 2,
        pp: 8,
        vpp: 4,
        ep: 32,
        dp: 16,
        sp: true,
        zero: Zero::DistOpt,
        schedule: Schedule::Interleaved,
        moe_dispatcher: Dispatcher::Deduplicated,
        layout: Layout::AccountEmbeddingLoss,
        ..cfg(2, 8, 1, 16)
    };
    let on = |k: &ParallelConfig| ParallelConfig {
        overlap: Overlap {
            ep_comm: true,
            ..k.overlap
        },
        ..k.clone()
    };
    // The overlap's own mechanics, without the host: at micro-batch 1 this layer is
    // host-bound (`super::host`), and hiding its all-to-all then gains nothing.
    let mut quiet = c.profile.clone();
    quiet.efficiency.host_op_us = 0.0;
    quiet.efficiency.host_kernel_us = 0.0;
    let c = Cluster::new(quiet, 256).unwrap();
    let run = |k: &ParallelConfig| evaluate(&m, &c, &w, k, Assumptions::default()).unwrap();
    let (off_e, on_e) = (run(&base), run(&on(&base)));
    let (t_off, t_on) = (term(&off_e, CommKind::Ep), term(&on_e, CommKind::Ep));
    assert!(
        close(t_off.total_secs, t_on.total_secs),
        "the bytes do not change"
    );
    assert!(close(t_off.exposed_secs, t_off.total_secs));
    assert!(
        t_on.exposed_secs < 0.5 * t_off.exposed_secs && t_on.overlapped_secs > 0.0,
        "{t_on:?}"
    );
    assert!(on_e.step_secs < off_e.step_secs);
    // Paired fraction: 64 micro-batches x 4 chunks less the warm-up 7 + 3 x 8.
    assert_eq!(base.micro_batches(&w), 64);
    let f = on(&base).ep_overlap(&w).unwrap();
    assert!(close(f, (256.0 - 31.0) / 256.0), "{f}");
    // Megatron refuses the overlap with full recomputation and with a
    // non-interleaved pipeline: nothing changes there.
    for k in [
        ParallelConfig {
            recompute: Recompute::Full,
            ..on(&base)
        },
        ParallelConfig {
            vpp: 1,
            schedule: Schedule::OneFOneB,
            layout: Layout::Even,
            ..on(&base)
        },
    ] {
        assert_eq!(k.ep_overlap(&w), None);
    }
    // Without a pipeline every micro-batch but the first forward has a partner.
    let flat = ParallelConfig {
        pp: 1,
        vpp: 1,
        dp: 128,
        schedule: Schedule::OneFOneB,
        layout: Layout::Even,
        ..on(&base)
    };
    let mb = flat.micro_batches(&w) as f64;
    assert!(close(flat.ep_overlap(&w).unwrap(), (mb - 1.0) / mb));
    // DualPipe overlaps without the flag.
    let dual = ParallelConfig {
        vpp: 1,
        schedule: Schedule::DualPipe,
        layout: Layout::Even,
        ..base.clone()
    };
    assert!(dual.ep_overlap(&w).is_some() && base.ep_overlap(&w).is_none());
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
fn tp_all_reduce_and_sp_collectives_per_layer() {
    let m = gpt("g", "test", 4, 4096, 32);
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 8).unwrap();
    let w = wl(2048, 4);
    let e = estimate(&m, &c, &w, &cfg(8, 1, 1, 1)).unwrap();
    let bytes = 2048.0 * 4096.0 * 2.0;
    let g = Placement::new(8, 1, 8);
    let ar = collective_secs(&c.profile, Collective::AllReduce, bytes, g);
    // 4 micro-batches x (4 layers x 4 all-reduces + 2 for the output layer).
    let t = term(&e, CommKind::Tp);
    assert!(
        close(t.total_secs, 4.0 * (4.0 * 4.0 + 2.0) * ar),
        "{} vs {}",
        t.total_secs,
        4.0 * 18.0 * ar
    );
    assert!(
        close(t.exposed_secs, t.total_secs),
        "TP is exposed without --tp-comm-overlap"
    );
    // With SP: an all-gather and a reduce-scatter in place of each all-reduce.
    let mut k = cfg(8, 1, 1, 1);
    k.sp = true;
    let e = estimate(&m, &c, &w, &k).unwrap();
    let agrs = collective_secs(&c.profile, Collective::AllGather, bytes, g)
        + collective_secs(&c.profile, Collective::ReduceScatter, bytes, g);
    assert!(close(term(&e, CommKind::Tp).total_secs, 4.0 * 18.0 * agrs));
    // Overlap hides some of it.
    k.overlap.tp_comm = true;
    let e2 = estimate(&m, &c, &w, &k).unwrap();
    assert!(term(&e2, CommKind::Tp).exposed_secs < term(&e, CommKind::Tp).exposed_secs);
}

#[test]
fn dp_pp_cp_and_ep_terms_are_hand_computable() {
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 16).unwrap();
    let hw = &c.profile;
    // DP all-reduce of FP32 gradients, in 40M-parameter buckets, over 16 GPUs.
    let m = resolve("llama3-8b").unwrap().spec;
    let mut k = cfg(1, 1, 1, 16);
    k.overlap.grad_reduce = false;
    let w = wl(4096, 32);
    let e = evaluate(&m, &c, &w, &k, Assumptions::default()).unwrap();
    let params = e.stages[0].memory.params;
    let buckets = (params / BUCKET_PARAMS).ceil();
    let g = Placement::new(16, 1, 8);
    let expect = buckets * collective_secs(hw, Collective::AllReduce, params * 4.0 / buckets, g);
    let t = term(&e, CommKind::DpGrad);
    assert!(close(t.total_secs, expect), "{} vs {expect}", t.total_secs);
    assert!(close(t.exposed_secs, expect), "no overlap requested");

    // PP: 2 (m v + p - 1) transfers of tokens x h x 2 / tp bytes between nodes.
    let k = cfg(8, 2, 1, 1);
    let e = estimate(&m, &c, &wl(4096, 8), &k).unwrap();
    let bytes = 4096.0 * 4096.0 * 2.0 / 8.0;
    let one = collective_secs(hw, Collective::SendRecv, bytes, Placement::new(2, 8, 8));
    let t = term(&e, CommKind::Pp);
    assert!(close(t.total_secs, 2.0 * (8.0 + 1.0) * one));
    assert_eq!(t.tier, Tier::Network);

    // CP: (cp - 1) ring steps of this rank's K and V, 3 passes (fwd, and K/V +
    // their gradients in bwd), per layer and micro-batch.
    let k = cfg(1, 1, 2, 8);
    let e = evaluate(&m, &c, &wl(8192, 8), &k, Assumptions::default()).unwrap();
    let kv = 4096.0 * 2.0 * (8.0 * 128.0) * 2.0;
    let step = collective_secs(hw, Collective::SendRecv, kv, Placement::new(2, 1, 8));
    let t = term(&e, CommKind::Cp);
    assert!(
        close(t.total_secs, 1.0 * 32.0 * 3.0 * step),
        "{} vs {}",
        t.total_secs,
        96.0 * step
    );

    // EP: dispatch + combine, forward and backward, of tokens/tp x top-k x h x 2.
    let m = resolve("mixtral-8x7b").unwrap().spec;
    let mut k = cfg(1, 1, 1, 16);
    k.ep = 8;
    k.zero = Zero::DistOpt;
    // Communication only: whether it fits does not matter here.
    let e = evaluate(&m, &c, &wl(4096, 16), &k, Assumptions::default()).unwrap();
    let bytes = 4096.0 * 2.0 * 4096.0 * 2.0;
    let a2a = collective_secs(hw, Collective::AllToAll, bytes, Placement::new(8, 1, 8));
    let t = term(&e, CommKind::Ep);
    assert!(close(t.total_secs, 1.0 * 32.0 * 4.0 * a2a));
    assert_eq!(t.tier, Tier::Nvlink);
    // Expert gradients reduce over the expert-DP group: 16 / 8 = 2 ranks.
    assert_eq!(term(&e, CommKind::EdpGrad).group.size, 2);

    // A deduplicating dispatcher sends fewer bytes over the network when the
    // EP group spans nodes: Qwen3-30B-A3B (128 experts, top-8) over 16 ranks
    // on 2 nodes.
    let m = resolve("qwen3-30b-a3b").unwrap().spec;
    k.ep = 16;
    k.dp = 16;
    let a2a = evaluate(&m, &c, &wl(4096, 16), &k, Assumptions::default()).unwrap();
    k.moe_dispatcher = Dispatcher::Deduplicated;
    let dedup = evaluate(&m, &c, &wl(4096, 16), &k, Assumptions::default()).unwrap();
    let (ta, td) = (
        term(&a2a, CommKind::Ep).total_secs,
        term(&dedup, CommKind::Ep).total_secs,
    );
    assert!(td < ta, "dedup {td} vs all-to-all {ta}");
}

#[test]
fn expected_remote_domains_by_hand() {
    // 8 experts on 2 domains, top-2: the other domain is missed with
    // probability C(4,2)/C(8,2) = 6/28.
    assert!((expected_remote_domains(8, 2, 2) - (1.0 - 6.0 / 28.0)).abs() < 1e-12);
    // One domain: nothing crosses the network.
    assert_eq!(expected_remote_domains(256, 8, 1), 0.0);
    // Top-k of all experts reaches every domain.
    assert!((expected_remote_domains(8, 8, 4) - 3.0).abs() < 1e-12);
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
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
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
    for (mut e, k) in [(zb, kz), (dp, kd)] {
        assert!(apply_simulation(&mut e, &k), "{:?}", k.schedule);
        assert!(
            e.pipeline_simulated && e.time.bubble < fb.time.bubble,
            "{:?}: {} vs 1F1B {}",
            k.schedule,
            e.time.bubble,
            fb.time.bubble
        );
    }
}

#[test]
fn recompute_ordering_and_fp8_speed() {
    let m = resolve("llama3-70b").unwrap().spec;
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
    let w = wl(4096, 128);
    let mut k = cfg(8, 4, 1, 2);
    k.sp = true;
    let t = |rc: Recompute, w: &Workload| {
        evaluate(
            &m,
            &c,
            w,
            &ParallelConfig {
                recompute: rc,
                ..k.clone()
            },
            Assumptions::default(),
        )
        .unwrap()
    };
    let none = t(Recompute::None, &w);
    let sel = t(Recompute::Selective, &w);
    let full = t(Recompute::Full, &w);
    assert!(none.step_secs < sel.step_secs && sel.step_secs < full.step_secs);
    assert!(
        none.memory.activations > sel.memory.activations * 0.99
            && sel.memory.activations > full.memory.activations
    );
    assert!(full.hfu > full.mfu);
    let fp8 = t(
        Recompute::None,
        &Workload {
            precision: Precision::Fp8,
            ..w.clone()
        },
    );
    assert!(fp8.step_secs < none.step_secs);
    assert!(fp8.memory.activations < none.memory.activations);
    // MFU is about model FLOPs / time: 6 N tokens dominates for a 70B model.
    let tokens = (w.global_batch * w.seq) as f64;
    let six_n = 6.0 * m.params().total as f64 * tokens
        / 64.0
        / none.step_secs
        / c.profile.peak_flops(false);
    assert!(
        none.mfu > six_n && none.mfu < 1.3 * six_n,
        "mfu {} vs 6N {}",
        none.mfu,
        six_n
    );
}

mod properties;

/// A mixture-of-experts layer whose forward blocks the host waits for the host
/// when issuing it takes longer than running it: Qwen3-30B-A3B at micro-batch 1
/// with 16 local experts is host-bound on an H100; a larger micro-batch, CUDA
/// graphs over the attention and router, a profile without host costs, a
/// full-iteration graph and a dense model are not (or less). The breakdown still
/// sums to the step.
#[test]
fn host_wait_bounds_fine_grained_moe_layers() {
    let m = resolve("qwen3-30b-a3b").unwrap().spec;
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 8).unwrap();
    let k = |mbs| ParallelConfig {
        ep: 8,
        dp: 8,
        mbs,
        zero: Zero::DistOpt,
        ..cfg(1, 1, 1, 8)
    };
    let w = wl(4096, 512);
    let run = |k: &ParallelConfig, a: Assumptions, c: &Cluster| evaluate(&m, c, &w, k, a).unwrap();
    let eager = run(&k(1), Assumptions::default(), &c);
    assert!(eager.time.host_wait > 0.0, "{:?}", eager.time);
    // The breakdown sums to the step.
    let t = &eager.time;
    let parts = t.compute.total()
        + t.recompute
        + t.exposed_comm
        + t.bubble
        + t.optimizer
        + t.overlap_slowdown
        + t.host_wait;
    assert!(
        (parts - eager.step_secs).abs() < 1e-6 * eager.step_secs,
        "{parts} vs {}",
        eager.step_secs
    );
    // Four times the tokens per micro-batch: more GPU time to hide the host behind.
    let big = run(&k(4), Assumptions::default(), &c);
    assert!(
        big.time.host_wait < 0.5 * eager.time.host_wait,
        "{} vs {}",
        big.time.host_wait,
        eager.time.host_wait
    );
    // Graphed scopes cost the host one launch each.
    let graphs = |g: &str| Assumptions {
        cuda_graphs: CudaGraphs::parse(g).unwrap(),
        ..Assumptions::default()
    };
    let partial = run(&k(1), graphs("attn moe_router moe_preprocess"), &c);
    assert!(partial.time.host_wait < eager.time.host_wait);
    assert!(partial.step_secs < eager.step_secs);
    let full = run(&k(1), graphs("full_iteration"), &c);
    assert_eq!(full.time.host_wait, 0.0);
    // A profile that prices no host time.
    let mut quiet = builtin_profile("h100-sxm").unwrap();
    quiet.efficiency.host_op_us = 0.0;
    quiet.efficiency.host_kernel_us = 0.0;
    let quiet = Cluster::new(quiet, 8).unwrap();
    let none = run(&k(1), Assumptions::default(), &quiet);
    assert_eq!(none.time.host_wait, 0.0);
    assert!(close(
        eager.step_secs - eager.time.host_wait,
        none.step_secs
    ));
    // Drop-and-pad routing has fixed shapes and no sync; other frameworks' MoE
    // layers are not priced with Megatron's counts.
    let padded = Workload {
        moe_capacity: Some(crate::routing::Capacity {
            factor: 1.25,
            pad: true,
        }),
        ..w.clone()
    };
    let pad = evaluate(&m, &c, &padded, &k(1), Assumptions::default()).unwrap();
    assert_eq!(pad.time.host_wait, 0.0);
    let titan = Assumptions {
        framework: Framework::Torchtitan,
        ..Assumptions::default()
    };
    assert_eq!(run(&k(1), titan, &c).time.host_wait, 0.0);
    // Recomputing the expert activation replays one checkpointed call, not one per
    // expert: a few hundred microseconds per layer at most.
    let moe_act = ParallelConfig {
        recompute: Recompute::Selective,
        recompute_modules: crate::config::RecomputeModules::MOE_ACT,
        ..k(1)
    };
    let act = run(&moe_act, Assumptions::default(), &c);
    let layers = m.moe_layers() as f64 * moe_act.micro_batches(&w) as f64;
    assert!(
        act.time.host_wait - eager.time.host_wait < layers * 400e-6,
        "{} vs {}",
        act.time.host_wait,
        eager.time.host_wait
    );
    // Dense layers do not block the host.
    let dense = resolve("llama3-8b").unwrap().spec;
    let d = evaluate(&dense, &c, &w, &cfg(1, 1, 1, 8), Assumptions::default()).unwrap();
    assert_eq!(d.time.host_wait, 0.0);
}

#[test]
fn cuda_graph_scopes_parse_and_print() {
    let g = CudaGraphs::parse("attn,moe_router+moe_preprocess").unwrap();
    assert!(g.attn && g.moe_router && g.moe_preprocess && !g.full_iteration);
    assert_eq!(g.to_string(), "attn moe_router moe_preprocess");
    assert_eq!(CudaGraphs::parse(&g.to_string()).unwrap(), g);
    assert!(CudaGraphs::parse("none").unwrap().is_none());
    assert!(CudaGraphs::parse("").unwrap().is_none());
    assert_eq!(CudaGraphs::default().to_string(), "none");
    let e = CudaGraphs::parse("attn mlp").unwrap_err();
    assert!(e.contains("'mlp'") && e.contains("moe_preprocess"), "{e}");
    let e = CudaGraphs::parse("full_iteration attn").unwrap_err();
    assert!(e.contains("alone"), "{e}");
    let e = CudaGraphs::parse("none,attn").unwrap_err();
    assert!(e.contains("one or the other"), "{e}");
    let e = CudaGraphs::parse(&"attn ".repeat(1000)).unwrap_err();
    assert!(e.contains("5000 characters") && e.len() < 200, "{e}");
    assert!(CudaGraphs::parse("attn\nmoe_router").is_err());
}
