//! One layer's compute as the cost model prices it: GEMMs at their own shapes,
//! the attention core, the loss kernels, norms, FP8 casts, the deferred weight
//! gradient, recomputation.

use super::*;

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

/// One layer of `kind` of `with` and of `without` on H100s under `k`, 4,096
/// tokens, and the time the second takes to move a number of bytes through HBM.
fn layer_pair(
    with: &ModelSpec,
    without: &ModelSpec,
    k: &ParallelConfig,
    kind: LayerKind,
) -> (
    crate::cost::layer::LayerCost,
    crate::cost::layer::LayerCost,
    impl Fn(f64) -> f64,
) {
    let h100 = builtin_profile("h100-sxm").unwrap();
    let w = wl(4096, 64);
    let ctx = |model| Ctx {
        model,
        hw: &h100,
        w: &w,
        cfg: k,
        a: Assumptions::default(),
        tokens: 4096.0,
        fp8: false,
        domain: 8,
    };
    let (a, b) = (
        layer_cost(&ctx(with), kind),
        layer_cost(&ctx(without), kind),
    );
    let per_byte = ctx(without).mem(1.0);
    (a, b, move |bytes: f64| per_byte * bytes)
}

/// EP 8 on one node of 8.
fn ep8() -> ParallelConfig {
    ParallelConfig {
        ep: 8,
        ..cfg(1, 1, 1, 8)
    }
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
    let k = ParallelConfig {
        sp: true,
        ..cfg(4, 1, 1, 2)
    };
    let (a, b, mem) = layer_pair(&sandwich, &plain, &k, LayerKind::Dense);
    let two_norms = mem(4096.0 * 2.0 * 4.0 * plain.hidden as f64 / 4.0);
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

/// Megatron-Core adds the experts' output bias per local expert in eager PyTorch
/// (`TEGroupedMLP._apply_bias`): 12 bytes per element of each routed row, forward,
/// and twice that backward; the GEMMs do not change, and a model without biases
/// pays nothing.
#[test]
fn expert_output_bias_moves_routed_rows() {
    let biased = resolve("gpt-oss-120b").unwrap().spec;
    assert!(biased.bias);
    let plain = ModelSpec {
        bias: false,
        ..biased.clone()
    };
    let moe = biased.moe.unwrap();
    let (a, b, mem) = layer_pair(&biased, &plain, &ep8(), LayerKind::Moe);
    let routed = 4096.0 * moe.top_k as f64;
    let bias = mem(routed * 12.0 * biased.hidden as f64);
    assert!(close(a.fwd.elementwise - b.fwd.elementwise, bias));
    assert!(close(a.bwd.elementwise - b.bwd.elementwise, 2.0 * bias));
    assert_eq!(a.fwd.moe_experts, b.fwd.moe_experts);
}

/// A clamped GLU (GPT-OSS) runs its clamp eagerly before the fused activation:
/// 16 bytes per element of each routed row's expert FFN forward, 12 backward,
/// and 16 again where `moe_act` is recomputed; the GEMMs do not change.
#[test]
fn clamped_glu_moves_routed_rows() {
    let clamped = resolve("gpt-oss-120b").unwrap().spec;
    assert!(clamped.glu_clamp.is_some());
    let plain = ModelSpec {
        glu_clamp: None,
        ..clamped.clone()
    };
    let moe = clamped.moe.unwrap();
    let routed = 4096.0 * moe.top_k as f64;
    let f = moe.expert_ffn_hidden as f64;
    let (a, b, mem) = layer_pair(&clamped, &plain, &ep8(), LayerKind::Moe);
    assert!(close(
        a.fwd.elementwise - b.fwd.elementwise,
        mem(routed * 16.0 * f)
    ));
    assert!(close(
        a.bwd.elementwise - b.bwd.elementwise,
        mem(routed * 12.0 * f)
    ));
    assert_eq!(a.fwd.moe_experts, b.fwd.moe_experts);
    let act = ParallelConfig {
        recompute: Recompute::Selective,
        recompute_modules: crate::config::RecomputeModules::MOE_ACT,
        ..ep8()
    };
    let (a, b, mem) = layer_pair(&clamped, &plain, &act, LayerKind::Moe);
    assert!(close(a.recompute - b.recompute, mem(routed * 16.0 * f)));
}

/// A YaRN attention factor other than 1 runs Megatron-Core's unfused rotary:
/// 24 bytes per element of Q and K forward instead of the fused kernel's 4, and
/// twice the difference backward; nothing else moves.
#[test]
fn yarn_attention_factor_unfuses_the_rotary() {
    let yarn = resolve("gpt-oss-120b").unwrap().spec;
    assert!(yarn.rotary_unfused());
    let plain = ModelSpec {
        yarn_attention_factor: None,
        ..yarn.clone()
    };
    let (a, b, mem) = layer_pair(&yarn, &plain, &ep8(), LayerKind::Moe);
    let qk = (yarn.q_dim() + yarn.kv_heads * yarn.head_dim) as f64;
    let extra = mem(4096.0 * 20.0 * qk);
    assert!(close(a.fwd.elementwise - b.fwd.elementwise, extra));
    assert!(close(a.bwd.elementwise - b.bwd.elementwise, 2.0 * extra));
    assert_eq!(a.fwd.attention_proj, b.fwd.attention_proj);
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

/// Routed copies a capacity factor drops skip their experts, so they are no
/// model FLOPs: a step that drops most of them cannot report more model FLOPs
/// per second than the GPU's BF16 peak (a factor of 0.01 once printed MFU 255%).
#[test]
fn dropped_tokens_are_not_model_flops() {
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
    let m = resolve("mixtral-8x7b").unwrap().spec;
    let mut k = cfg(2, 1, 1, 32);
    (k.ep, k.etp, k.sp, k.mbs, k.zero) = (8, 2, true, 8, Zero::DistOpt);
    let mut last = f64::INFINITY;
    for factor in [0.01, 0.1, 0.5, 1.0] {
        for pad in [false, true] {
            let mut w = wl(4096, 512);
            w.moe_capacity = Some(crate::routing::Capacity { factor, pad });
            let e = evaluate(&m, &c, &w, &k, Assumptions::default()).unwrap();
            assert!(
                e.mfu > 0.0 && e.mfu <= 1.0,
                "factor {factor} pad {pad}: MFU {}",
                e.mfu
            );
            assert!(e.hfu <= 1.0, "factor {factor} pad {pad}: HFU {}", e.hfu);
            // More kept tokens, more model FLOPs per step.
            let flops = e.model_tflops_per_gpu * e.step_secs;
            if !pad {
                assert!(flops > 0.0 && (last.is_infinite() || flops > last));
                last = flops;
            }
        }
    }
}

/// Eager element-wise operations ([`EagerOps`]): each moves the bytes of its
/// PyTorch operators where the fused kernel moves one pass, replicated on every TP
/// rank without sequence parallelism; a LayerNorm is one kernel either way; the
/// names parse as a list and anything else is refused.
#[test]
fn eager_element_wise_operations_move_their_operators_bytes() {
    let hw = builtin_profile("a100-80g").unwrap();
    let llama = resolve("llama2-13b").unwrap().spec;
    let w = wl(2048, 64);
    let elementwise = |m: &crate::model::ModelSpec, tp: u64, eager: &str| {
        let k = cfg(tp, 1, 1, 64 / tp);
        let c = Ctx {
            model: m,
            hw: &hw,
            w: &w,
            cfg: &k,
            a: Assumptions {
                eager: EagerOps::parse(eager).unwrap(),
                ..Assumptions::default()
            },
            tokens: 2048.0,
            fp8: false,
            domain: 8,
        };
        layer_cost(&c, LayerKind::Dense).fwd.elementwise
    };
    // Forward bytes per token: two norms 2 x 36 h instead of 2 x 4 h, the
    // rotary embedding 20 instead of 4 per query and key element, the gated
    // activation 10 instead of 6 per hidden element; the residual adds as before.
    let (h, f) = (llama.hidden as f64, llama.ffn_hidden as f64);
    let qk = (llama.q_dim() + llama.kv_heads * llama.head_dim) as f64;
    let fused = 2.0 * 4.0 * h + 12.0 * h + 4.0 * qk + 6.0 * f;
    let eager = 2.0 * 36.0 * h + 12.0 * h + 20.0 * qk + 10.0 * f;
    let ratio = elementwise(&llama, 1, "norm rotary glu") / elementwise(&llama, 1, "none");
    assert!(
        (ratio - eager / fused).abs() < 1e-9,
        "{ratio} vs {}",
        eager / fused
    );
    // One operation at a time adds its own bytes only; the norm computed in BF16
    // (Aleph Alpha's) moves 26 where the upcast one moves 36.
    let norm_only = elementwise(&llama, 1, "norm") / elementwise(&llama, 1, "");
    assert!((norm_only - (fused + 64.0 * h) / fused).abs() < 1e-9);
    let bf16 = elementwise(&llama, 1, "norm-bf16") / elementwise(&llama, 1, "");
    assert!((bf16 - (fused + 44.0 * h) / fused).abs() < 1e-9);
    // Without SP the norms are replicated on every TP rank: their eager bytes do
    // not shrink with TP, the rotary's and the activation's do.
    let extra = |tp| elementwise(&llama, tp, "norm") - elementwise(&llama, tp, "none");
    assert!((extra(4) / extra(1) - 1.0).abs() < 1e-9);
    let rot = |tp| elementwise(&llama, tp, "rotary") - elementwise(&llama, tp, "none");
    assert!((rot(4) / rot(1) - 0.25).abs() < 1e-9);
    // GPT's LayerNorm is one native kernel, eager or not.
    let gpt3 = gpt("t", "test", 2, 4096, 32);
    assert_eq!(elementwise(&gpt3, 1, "norm"), elementwise(&gpt3, 1, "none"));
    for bad in [
        "norm,foo",
        "none norm",
        "rms",
        "\u{1b}[2J",
        "norm norm-bf16",
    ] {
        assert!(EagerOps::parse(bad).is_err(), "{bad}");
    }
    let all = EagerOps::parse("glu+norm, rotary").unwrap();
    assert_eq!(all.to_string(), "norm rotary glu");
    assert_eq!(EagerOps::parse("none").unwrap().to_string(), "none");
}
