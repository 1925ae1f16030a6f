use super::*;
use crate::config::{
    Dispatcher, Layout, Overlap, ParallelConfig, Precision, Recompute, RecomputeModules, Workload,
    Zero,
};
use crate::cost::{Assumptions, Framework, LossKernel};
use crate::model::ModelSpec;
use crate::presets::gpt;
use crate::schedule::Schedule;

fn cfg(tp: u64, sp: bool, recompute: Recompute) -> ParallelConfig {
    ParallelConfig {
        tp,
        pp: 1,
        vpp: 1,
        cp: 1,
        ep: 1,
        etp: 1,
        dp: 1,
        sp,
        mbs: 1,
        zero: Zero::None,
        recompute,
        layout: Layout::Even,
        overlap: Overlap::default(),
        bf16_grads: false,
        bf16_moments: false,
        recompute_modules: Default::default(),
        moe_dispatcher: Dispatcher::AllToAll,
        schedule: Schedule::OneFOneB,
    }
}

fn assume(flash: bool) -> Assumptions {
    Assumptions {
        flash_attention: flash,
        ..Assumptions::default()
    }
}

fn w(seq: u64) -> Workload {
    Workload {
        seq,
        global_batch: 1,
        precision: Precision::Bf16,
        moe_imbalance: 1.0,
        moe_capacity: None,
    }
}

/// Korthikanti et al. 2022, Table 2, evaluated for GPT-3 175B (s=2048, h=12288,
/// a=96, b=1, t=8): the per-layer activation bytes of each technique.
#[test]
fn korthikanti_table_2() {
    let m = gpt("gpt3-175b", "test", 96, 12288, 96);
    let (s, h, a, t) = (2048.0, 12288.0, 96.0, 8.0);
    let sbh = s * h;
    let cases = [
        // (tp, sp, recompute, flash, paper formula)
        (
            1,
            false,
            Recompute::None,
            false,
            sbh * (34.0 + 5.0 * a * s / h),
        ),
        (
            8,
            false,
            Recompute::None,
            false,
            sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t)),
        ),
        (
            8,
            true,
            Recompute::None,
            false,
            sbh / t * (34.0 + 5.0 * a * s / h),
        ),
        (
            8,
            false,
            Recompute::Selective,
            false,
            sbh * (10.0 + 24.0 / t),
        ),
        (8, true, Recompute::Selective, false, sbh / t * 34.0),
        (8, true, Recompute::Full, false, 2.0 * sbh / t),
        (8, false, Recompute::Full, false, 2.0 * sbh),
    ];
    for (tp, sp, rc, flash, expect) in cases {
        let got = layer_activations(
            &m,
            &cfg(tp, sp, rc),
            &w(2048),
            LayerKind::Dense,
            assume(flash),
        )
        .stored;
        // The flash-attention statistics (4 bytes per head per token) are
        // counted for selective and are below 0.1% of the total.
        let err = (got - expect).abs() / expect;
        assert!(
            err < 0.001,
            "tp{tp} sp{sp} {rc:?}: got {got}, paper {expect}, err {err}"
        );
    }
}

#[test]
fn in_flight_matches_schedules() {
    let mut c = cfg(1, false, Recompute::None);
    c.pp = 4;
    assert_eq!(in_flight(&c, 16, 0), 4.0);
    assert_eq!(in_flight(&c, 16, 3), 1.0);
    assert_eq!(in_flight(&c, 2, 0), 2.0);
    c.schedule = Schedule::ZbH1;
    assert_eq!(in_flight(&c, 16, 0), 4.0);
    c.schedule = Schedule::DualPipe;
    assert_eq!((in_flight(&c, 16, 0), in_flight(&c, 16, 2)), (5.0, 5.0));
    c.schedule = Schedule::Gpipe;
    assert_eq!(in_flight(&c, 16, 3), 16.0);
    c.vpp = 2;
    c.schedule = Schedule::Interleaved;
    // p + (p-1)/v = 4 + 3/2 for the first stage.
    assert_eq!(in_flight(&c, 16, 0), 5.5);
}

/// Megatron's theoretical memory: 18 bytes per parameter, or 6 + 12/dp with the
/// distributed optimizer.
#[test]
fn model_state_bytes_per_parameter() {
    let mut c = cfg(1, false, Recompute::None);
    c.dp = 8;
    let (wt, g, o) = model_state(&c, 1.0, 0.0, Framework::MegatronCore);
    assert_eq!(wt + g + o, 18.0);
    c.zero = Zero::DistOpt;
    let (wt, g, o) = model_state(&c, 1.0, 0.0, Framework::MegatronCore);
    assert_eq!(wt + g + o, 6.0 + 12.0 / 8.0);
    c.zero = Zero::Zero3;
    let (wt, g, o) = model_state(&c, 1.0, 0.0, Framework::MegatronCore);
    assert_eq!(wt + g + o, 18.0 / 8.0);
}

/// Each fine-grained recompute module drops exactly its tensors, by hand:
/// "layernorm" the two norm outputs (2 bytes x h / t each with SP), MLA's
/// "mla_up_proj" Q, K and V, "moe_act" each routed copy's activation output
/// (2 x expert ffn), "mlp" the dense MLP's inner tensors; BF16 moments cost 8
/// optimizer bytes per parameter instead of 12.
/// Norms after attention and after the MLP keep their inputs (2 bytes x h
/// each per token, split by SP) and nothing else; full recomputation keeps
/// only the layer input either way.
#[test]
fn sandwich_norms_keep_their_inputs() {
    let plain = gpt("gpt", "test", 24, 4096, 32);
    let sandwich = ModelSpec {
        sandwich_norms: true,
        ..plain.clone()
    };
    for (tp, sp, rc) in [
        (1, false, Recompute::None),
        (8, true, Recompute::Selective),
        (8, false, Recompute::Selective),
        (8, true, Recompute::Full),
    ] {
        let c = cfg(tp, sp, rc);
        let per_token = |m: &ModelSpec| {
            layer_activations(m, &c, &w(4096), LayerKind::Dense, assume(true)).stored / 4096.0
        };
        let expect = match rc {
            Recompute::Full => 0.0,
            _ => 2.0 * 2.0 * 4096.0 / if sp { tp as f64 } else { 1.0 },
        };
        let got = per_token(&sandwich) - per_token(&plain);
        assert!((got - expect).abs() < 1e-9, "tp{tp} sp{sp} {rc:?}: {got}");
    }
}

#[test]
fn recompute_modules_drop_their_tensors() {
    use crate::presets::resolve;
    let bytes = |model: &ModelSpec, c: &ParallelConfig, kind| {
        layer_activations(model, c, &w(4096), kind, assume(true)).stored / 4096.0
    };
    let sel = |base: &ParallelConfig, m: &str| ParallelConfig {
        recompute: Recompute::Selective,
        recompute_modules: RecomputeModules::parse(m).unwrap(),
        ..base.clone()
    };

    let g = gpt("gpt", "test", 24, 4096, 32);
    let base = cfg(8, true, Recompute::None);
    let (h, t) = (4096.0, 8.0);
    let none = bytes(&g, &base, LayerKind::Dense);
    assert!(
        (none - bytes(&g, &sel(&base, "layernorm"), LayerKind::Dense) - 2.0 * 2.0 * h / t).abs()
            < 1e-9
    );
    // GeLU MLP: first output 2 x 4h and activation output 2 x 4h, over t.
    assert!(
        (none - bytes(&g, &sel(&base, "mlp"), LayerKind::Dense) - 2.0 * 2.0 * 4.0 * h / t).abs()
            < 1e-9
    );
    // Megatron's default set changes nothing with flash attention.
    assert_eq!(none, bytes(&g, &sel(&base, "core_attn"), LayerKind::Dense));

    let ds = resolve("deepseek-v3").unwrap().spec;
    let mla = ParallelConfig {
        ep: 8,
        ..cfg(1, false, Recompute::None)
    };
    let none = bytes(&ds, &mla, LayerKind::Moe);
    let qkv = 2.0 * (128.0 * 192.0) + 2.0 * (128.0 * 192.0) + 2.0 * (128.0 * 128.0);
    assert!(
        (none - bytes(&ds, &sel(&mla, "mla_up_proj"), LayerKind::Moe) - qkv).abs() < 1e-6,
        "{}",
        none - bytes(&ds, &sel(&mla, "mla_up_proj"), LayerKind::Moe)
    );
    assert!(
        (none - bytes(&ds, &sel(&mla, "moe_act"), LayerKind::Moe) - 8.0 * 2.0 * 2048.0).abs()
            < 1e-6
    );
    // "moe" keeps only the block input: less than any of its parts alone.
    let moe = bytes(&ds, &sel(&mla, "moe"), LayerKind::Moe);
    assert!(moe < bytes(&ds, &sel(&mla, "moe_act"), LayerKind::Moe));
    // The working set of a recomputed layer is the unrecomputed layer.
    assert_eq!(
        layer_activations(
            &ds,
            &sel(&mla, "moe,mla_up_proj"),
            &w(4096),
            LayerKind::Moe,
            assume(true)
        )
        .full,
        none * 4096.0
    );

    let adam = ParallelConfig {
        bf16_moments: true,
        ..cfg(1, false, Recompute::None)
    };
    assert_eq!(model_state(&adam, 1.0, 0.0, Framework::MegatronCore).2, 8.0);
    assert_eq!(
        model_state(
            &cfg(1, false, Recompute::None),
            1.0,
            0.0,
            Framework::MegatronCore
        )
        .2,
        12.0
    );
}

/// The frameworks' memory layouts, by hand for Llama 3 8B (h 4096, FFN 14336,
/// 32 heads, 8 KV heads of 128).
#[test]
fn framework_layouts_by_hand() {
    use crate::presets::resolve;
    let m = resolve("llama3-8b").unwrap().spec;
    let (h, f) = (4096.0, 14336.0);
    let fw = |framework| Assumptions {
        framework,
        ..Assumptions::default()
    };
    // torchtitan's op-level SAC at TP 1: the block input, wq's and wv's outputs
    // (mms 1 and 3), w1's and w2's (mms 5 and 7), the attention output and its
    // log-sum-exp.
    let c1 = cfg(1, false, Recompute::Selective);
    let by_hand = 2.0 * h + 2.0 * h + 2.0 * 1024.0 + 2.0 * f + 2.0 * h + 2.0 * h + 4.0 * 32.0;
    assert_eq!(op_sac_per_token(&m, &c1), by_hand);
    let sac = layer_activations(
        &m,
        &c1,
        &w(8192),
        LayerKind::Dense,
        fw(Framework::Torchtitan),
    );
    assert_eq!(sac.stored, by_hand * 8192.0);
    // At TP 8 with SP: the sharded outputs, w2's full-width partial sum, and
    // both reduce-scatters' outputs.
    let c8 = cfg(8, true, Recompute::Selective);
    let by_hand8 = 2.0 * h / 8.0
        + 2.0 * h / 8.0
        + 2.0 * 128.0
        + 2.0 * f / 8.0
        + 2.0 * h
        + 2.0 * h / 8.0
        + 4.0 * 32.0 / 8.0
        + 2.0 * 2.0 * h / 8.0;
    assert_eq!(op_sac_per_token(&m, &c8), by_hand8);
    // A GLU run as separate ops keeps the activation's output (2 bytes x FFN per
    // token) beside what Megatron-Core's fused SwiGLU keeps.
    let none = cfg(1, false, Recompute::None);
    let act = |framework| {
        layer_activations(&m, &none, &w(4096), LayerKind::Dense, fw(framework)).stored / 4096.0
    };
    assert_eq!(
        act(Framework::Nanotron) - act(Framework::MegatronCore),
        2.0 * f
    );
    assert_eq!(act(Framework::Torchtitan), act(Framework::Nanotron));
    // nanotron's multi-head attention holds K and V twice (the QKV copy its query
    // view keeps, and the concatenated K/V copy); grouped-query attention (this
    // Llama 3) does not.
    let mut mha = m.clone();
    mha.kv_heads = mha.heads;
    let act_mha = |framework| {
        layer_activations(&mha, &none, &w(4096), LayerKind::Dense, fw(framework)).stored / 4096.0
    };
    assert_eq!(
        act_mha(Framework::Nanotron) - act_mha(Framework::MegatronCore),
        2.0 * f + 2.0 * 2.0 * h
    );
    // nanotron's TP buffers in its sequence-parallel mode: two persistent
    // full-sequence gathers, and, reserved only, two row-parallel outputs per
    // layer awaiting their reduce-scatters plus the freed BF16 logits. Without SP
    // (ALL_REDUCE: the output is reduced in place) or at TP 1, the logits only.
    let tokens = 4096.0;
    let c8sp = cfg(8, true, Recompute::None);
    assert_eq!(
        token_buffers(Framework::Nanotron, &c8sp, tokens, h),
        2.0 * tokens * h * 2.0
    );
    assert_eq!(
        cached_blocks(Framework::Nanotron, &c8sp, tokens, h, 32.0, 1000.0),
        2.0 * 32.0 * tokens * h * 2.0 + 2.0 * 1000.0
    );
    for c in [
        cfg(8, false, Recompute::None),
        cfg(1, false, Recompute::None),
    ] {
        assert_eq!(token_buffers(Framework::Nanotron, &c, tokens, h), 0.0);
        assert_eq!(
            cached_blocks(Framework::Nanotron, &c, tokens, h, 32.0, 1000.0),
            2000.0
        );
    }
    for f in [
        Framework::MegatronCore,
        Framework::Torchtitan,
        Framework::ScaleTorch,
    ] {
        assert_eq!(token_buffers(f, &c8sp, tokens, h), 0.0);
        assert_eq!(cached_blocks(f, &c8sp, tokens, h, 32.0, 1000.0), 0.0);
    }
    // Loss buffers per logit.
    assert_eq!(
        [
            logit_bytes(Framework::MegatronCore, LossKernel::Native),
            logit_bytes(Framework::Nanotron, LossKernel::Native),
            logit_bytes(Framework::Torchtitan, LossKernel::Native)
        ],
        [6.0, 8.0, 12.0]
    );
    // torchtitan's loss under torch.compile: the BF16 logits and their gradient.
    assert_eq!(
        logit_bytes(Framework::Torchtitan, LossKernel::Compiled),
        4.0
    );
    // FSDP2's sharded state: FP32 parameter, gradient and two moments.
    let mut z3 = cfg(1, false, Recompute::None);
    z3.zero = Zero::Zero3;
    z3.dp = 8;
    let (wt, g, o) = model_state(&z3, 8.0, 0.0, Framework::Torchtitan);
    assert_eq!((wt, g, o), (4.0, 4.0, 8.0));
    // Buffers: DDP buckets with DP only; FSDP2 per block (two gathered, one
    // block's BF16 and FP32 gradients) and the root, or with PP the stage's
    // BF16 parameters and FP32 gradients.
    let held = HeldParams {
        all: 100.0,
        layer: 10.0,
        root: 5.0,
    };
    let mut ddp = cfg(1, false, Recompute::None);
    assert_eq!(framework_buffers(Framework::Nanotron, &ddp, held), 0.0);
    ddp.dp = 2;
    assert_eq!(framework_buffers(Framework::Nanotron, &ddp, held), 200.0);
    assert_eq!(framework_buffers(Framework::MegatronCore, &ddp, held), 0.0);
    assert_eq!(
        framework_buffers(Framework::Torchtitan, &z3, held),
        40.0 + 60.0 + 10.0
    );
    // In a pipeline stage, whatever the micro-batch count (the sync stays off
    // through the last backward and a separate post-backward reduces): the
    // stage's BF16 parameters and FP32 gradients.
    z3.pp = 4;
    assert_eq!(framework_buffers(Framework::Torchtitan, &z3, held), 600.0);
    // ZeRO-2 (no resharding after the forward): its gathered parameters are the
    // model state's BF16 weights; a pipeline stage still accumulates the FP32
    // gradients whole, and without a pipeline one block's are held for its
    // reduce-scatter.
    let mut z2 = z3.clone();
    z2.zero = Zero::Zero2;
    assert_eq!(framework_buffers(Framework::Torchtitan, &z2, held), 400.0);
    z2.pp = 1;
    assert_eq!(framework_buffers(Framework::Torchtitan, &z2, held), 60.0);
}

/// ScaleTorch trains pure BF16: a BF16 weight and two BF16 Adam moments, and an
/// FP32 gradient bucket with data parallelism (BF16 `param.grad` without), 10
/// bytes per parameter against Megatron-Core's 18; Megatron's BF16 switches do
/// not apply. The BF16 gradient copy the sync leaves counts only at the optimizer
/// step, and the loss keeps the BF16 logits beside torchtitan's FP32 buffers.
#[test]
fn scaletorch_keeps_bf16_state_and_fp32_buckets() {
    let mut c = cfg(1, false, Recompute::None);
    assert_eq!(
        model_state(&c, 8.0, 0.0, Framework::ScaleTorch),
        (16.0, 16.0, 32.0)
    );
    c.dp = 4;
    assert_eq!(
        model_state(&c, 8.0, 0.0, Framework::ScaleTorch),
        (16.0, 32.0, 32.0)
    );
    let (w, g, o) = model_state(&c, 8.0, 0.0, Framework::MegatronCore);
    assert_eq!(w + g + o, 18.0 * 8.0);
    c.bf16_grads = true;
    c.bf16_moments = true;
    assert_eq!(
        model_state(&c, 8.0, 0.0, Framework::ScaleTorch),
        (16.0, 32.0, 32.0)
    );
    assert_eq!(
        sharded_state_floor(80.0, 8, Framework::ScaleTorch, false, false),
        80.0
    );
    let held = HeldParams {
        all: 100.0,
        layer: 10.0,
        root: 5.0,
    };
    assert_eq!(framework_buffers(Framework::ScaleTorch, &c, held), 0.0);
    assert_eq!(step_buffers(Framework::ScaleTorch, &c, held), 200.0);
    assert_eq!(step_buffers(Framework::Nanotron, &c, held), 0.0);
    c.dp = 1;
    assert_eq!(step_buffers(Framework::ScaleTorch, &c, held), 0.0);
    assert_eq!(
        logit_bytes(Framework::ScaleTorch, LossKernel::Unfused),
        14.0
    );
}

/// Aleph Alpha's `scaling` keeps BF16 gradients on the parameters (2 bytes
/// whatever Megatron's switch says) beside the FP32 shard and moments. At the
/// step, with data parallelism, one all-reduce bucket (500M elements and at most
/// one more tensor): under ZeRO-1 its BF16 copy and FP32 cast (6 bytes each), or
/// the owned FP32 gradient shard if larger; under ZeRO-0 every gradient cast to
/// FP32 (2 more bytes each) and the FP32 bucket (4).
#[test]
fn scaling_keeps_bf16_gradients_and_one_fp32_bucket_at_the_step() {
    let mut c = cfg(1, false, Recompute::None);
    c.dp = 4;
    c.zero = Zero::DistOpt;
    let (_, g, _) = model_state(&c, 8.0, 0.0, Framework::Scaling);
    assert_eq!(g, 16.0);
    let (w, _, o) = model_state(&c, 8.0, 0.0, Framework::MegatronCore);
    let (ws, _, os) = model_state(&c, 8.0, 0.0, Framework::Scaling);
    assert_eq!((w, o), (ws, os));
    let small = HeldParams {
        all: 100.0,
        layer: 10.0,
        root: 5.0,
    };
    assert_eq!(step_buffers(Framework::Scaling, &c, small), 600.0);
    // A bucket closes past 500M elements: with a 1.2e9-element layer it holds
    // the 500M and that tensor.
    let big = HeldParams {
        all: 4e9,
        layer: 1.2e9,
        root: 0.0,
    };
    assert_eq!(step_buffers(Framework::Scaling, &c, big), 6.0 * 1.7e9);
    // The owned FP32 shard, when larger than the bucket's copies.
    let wide = HeldParams {
        all: 4e10,
        layer: 1e6,
        root: 0.0,
    };
    assert_eq!(step_buffers(Framework::Scaling, &c, wide), 4.0 * 4e10 / 4.0);
    c.zero = Zero::None;
    assert_eq!(
        step_buffers(Framework::Scaling, &c, big),
        2.0 * 4e9 + 4.0 * 1.7e9
    );
    assert_eq!(framework_buffers(Framework::Scaling, &c, big), 0.0);
    c.dp = 1;
    assert_eq!(step_buffers(Framework::Scaling, &c, big), 0.0);
}
