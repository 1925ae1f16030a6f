//! Exports: golden files for every target on a dense and an MoE plan, Megatron-LM
//! flags checked against the verified argument table, and plans that a framework
//! cannot express.

use crate::common::{fails_with_one_line, saved, sextant, stderr, words, TempDir};
use std::path::PathBuf;

use sextant_exports::{export, LaunchOptions, Target, TARGETS};
use sextant_planner::config::{
    Dispatcher, Layout, Overlap, ParallelConfig, Precision, Recompute, Workload, Zero,
};
use sextant_planner::cost::{evaluate, Assumptions, LossKernel};
use sextant_planner::hardware::{builtin_profile, Cluster};
use sextant_planner::plan::PlanFile;
use sextant_planner::presets::resolve;
use sextant_planner::schedule::Schedule;

fn plan(
    model: &str,
    gpus: u64,
    seq: u64,
    gbs: u64,
    precision: Precision,
    cfg: ParallelConfig,
) -> PlanFile {
    priced(
        model,
        gpus,
        Workload {
            seq,
            global_batch: gbs,
            precision,
            moe_imbalance: 1.0,
            moe_capacity: None,
        },
        cfg,
        Assumptions::default(),
    )
}

/// A plan file for one configuration on H100s, priced under `a`.
fn priced(model: &str, gpus: u64, w: Workload, cfg: ParallelConfig, a: Assumptions) -> PlanFile {
    priced_on("h100-sxm", model, gpus, w, cfg, a)
}

/// A plan file for one configuration on `profile`'s GPUs, priced under `a`.
fn priced_on(
    profile: &str,
    model: &str,
    gpus: u64,
    w: Workload,
    cfg: ParallelConfig,
    a: Assumptions,
) -> PlanFile {
    let m = resolve(model).unwrap().spec;
    let c = Cluster::new(builtin_profile(profile).unwrap(), gpus).unwrap();
    let e = evaluate(&m, &c, &w, &cfg, a).unwrap_or_else(|r| panic!("{model}: {r}"));
    let mut p = PlanFile::new(m, c.profile, gpus, w, a, None, vec![(cfg, e)]);
    p.generator = "sextant (test)".into();
    p
}

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
        zero: Zero::DistOpt,
        recompute: Recompute::None,
        layout: Layout::Even,
        overlap: Overlap::default(),
        bf16_grads: false,
        bf16_moments: false,
        recompute_modules: Default::default(),
        moe_dispatcher: Dispatcher::AllToAll,
        schedule: Schedule::default_for(vpp),
    }
}

/// Llama 3 70B on 64 H100s, as NeMo's recipe runs it: TP4 PP4 VPP5 CP2, selective.
fn dense() -> PlanFile {
    let mut c = cfg(4, 4, 5, 2, 2);
    c.recompute = Recompute::Selective;
    c.overlap.tp_comm = true;
    plan("llama3-70b", 64, 8192, 128, Precision::Bf16, c)
}

/// Mixtral 8x7B on 32 H100s: TP2 PP2 EP4, FP8, full recomputation (BF16
/// gradient reduction, which Megatron-Bridge's presets cannot state, is its own
/// case in `exports_launch_what_the_plan_priced_or_refuse`).
fn moe() -> PlanFile {
    let mut c = cfg(2, 2, 1, 1, 8);
    c.ep = 4;
    c.recompute = Recompute::Full;
    c.mbs = 2;
    plan("mixtral-8x7b", 32, 4096, 256, Precision::Fp8, c)
}

/// The two plans as an RL framework's Megatron backend runs them: the unfused
/// loss (verl and RLinf compute log-probabilities themselves), no TP overlap, BF16
/// with FP32 gradient reduction.
fn rl_ready(p: &PlanFile) -> PlanFile {
    unfused_bf16(p, sextant_planner::cost::RankOrder::Megatron, |cfg| {
        cfg.overlap.tp_comm = false;
        cfg.bf16_grads = false;
    })
}

/// The dense plan as ScaleTorch runs it, priced with its memory layout: its rank
/// grid, plain data parallelism, no sequence parallelism or virtual stages, no
/// recomputation (its pipeline engines do not checkpoint), the unfused loss and
/// the unfused ring attention of its context parallelism.
fn scaletorch_ready(p: &PlanFile) -> PlanFile {
    let mut p = unfused_bf16(p, sextant_planner::cost::RankOrder::ScaleTorch, |cfg| {
        cfg.zero = Zero::None;
        cfg.sp = false;
        cfg.overlap.tp_comm = false;
        cfg.vpp = 1;
        cfg.layout = Layout::Even;
        cfg.recompute = Recompute::None;
        cfg.schedule = Schedule::OneFOneB;
    });
    p.assumptions.framework = sextant_planner::cost::Framework::ScaleTorch;
    // Its ring attention under CP is unfused.
    p.assumptions.flash_attention = false;
    reprice(&p)
}

/// The plans as torchtitan runs them, priced with its memory layout: FSDP
/// (ZeRO-3), no async TP, torchtitan's eager loss.
fn torchtitan_ready(p: &PlanFile) -> PlanFile {
    let mut p = p.clone();
    p.plans[0].config.zero = Zero::Zero3;
    // Plain TP (async TP: cli.rs `torchtitan_compiled_loss_is_priced_and_exported`).
    p.plans[0].config.overlap.tp_comm = false;
    p.assumptions.framework = sextant_planner::cost::Framework::Torchtitan;
    p.assumptions.loss = LossKernel::Native;
    reprice(&p)
}

/// Plan `p`'s first configuration priced again under its own assumptions.
fn reprice(p: &PlanFile) -> PlanFile {
    priced(
        &p.model.name,
        p.gpus,
        p.workload.clone(),
        p.plans[0].config.clone(),
        p.assumptions,
    )
}

/// Plan `p`'s first configuration, edited, priced again in BF16 with the unfused
/// loss and the given rank order.
fn unfused_bf16(
    p: &PlanFile,
    rank_order: sextant_planner::cost::RankOrder,
    edit: impl FnOnce(&mut ParallelConfig),
) -> PlanFile {
    let mut cfg = p.plans[0].config.clone();
    edit(&mut cfg);
    let w = Workload {
        precision: Precision::Bf16,
        ..p.workload.clone()
    };
    priced(
        &p.model.name,
        p.gpus,
        w,
        cfg,
        Assumptions {
            loss: LossKernel::Unfused,
            rank_order,
            ..Assumptions::default()
        },
    )
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden")
}

/// Compares with the golden file; `SEXTANT_BLESS=1` rewrites it instead.
fn check(name: &str, got: &str) {
    let path = golden_dir().join(name);
    if std::env::var_os("SEXTANT_BLESS").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with SEXTANT_BLESS=1 to create it)",
            path.display()
        )
    });
    if want != got {
        let line = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(got.lines().count()));
        panic!(
            "{name} differs from the golden file at line {}:\n  want: {:?}\n  got:  {:?}\n(SEXTANT_BLESS=1 rewrites the golden files after a deliberate change)",
            line + 1,
            want.lines().nth(line),
            got.lines().nth(line)
        );
    }
}

#[test]
fn golden_exports_for_every_target() {
    let opts = LaunchOptions {
        plan_path: "plan.json".into(),
    };
    for (label, p) in [("dense", dense()), ("moe", moe())] {
        for (name, target) in TARGETS {
            let p = match target {
                Target::Verl | Target::Rlinf => rl_ready(&p),
                Target::ScaleTorch if label == "dense" => scaletorch_ready(&p),
                Target::Torchtitan => torchtitan_ready(&p),
                _ => p.clone(),
            };
            let text = match export(&p, 1, *target, &opts) {
                Ok(t) => t,
                Err(e) => format!("error: {e}\n"),
            };
            check(&format!("{label}-{name}.txt"), &text);
        }
    }
}

/// Every Megatron-LM flag Sextant can emit, with the file that defines it
/// (Megatron-LM main 2026-08; generated flags come from the dataclass named).
const MEGATRON_FLAGS: &[(&str, &str)] = &[
    ("tensor-model-parallel-size", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("pipeline-model-parallel-size", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("context-parallel-size", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("sequence-parallel", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("expert-model-parallel-size", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("expert-tensor-parallel-size", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("num-layers-per-virtual-pipeline-stage", "megatron/training/arguments.py _add_distributed_args"),
    ("num-virtual-stages-per-pipeline-rank", "megatron/training/arguments.py _add_distributed_args"),
    ("decoder-first-pipeline-num-layers", "megatron/training/arguments.py _add_distributed_args"),
    ("decoder-last-pipeline-num-layers", "megatron/training/arguments.py _add_distributed_args"),
    ("account-for-embedding-in-pipeline-split", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("account-for-loss-in-pipeline-split", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("pipeline-model-parallel-layout", "megatron/training/arguments.py _add_distributed_args"),
    ("use-tp-pp-dp-mapping", "megatron/training/config/common_config.py DistributedInitConfig"),
    ("micro-batch-size", "megatron/training/config/training_config.py TrainingConfig"),
    ("global-batch-size", "megatron/training/config/training_config.py TrainingConfig"),
    ("seq-length", "megatron/training/arguments.py _add_data_args"),
    ("max-position-embeddings", "megatron/training/arguments.py _add_network_size_args"),
    ("recompute-granularity", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("recompute-method", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("recompute-num-layers", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("use-distributed-optimizer", "megatron/training/arguments.py _add_distributed_args"),
    ("use-megatron-fsdp", "megatron/training/config/common_config.py DistributedInitConfig"),
    ("data-parallel-sharding-strategy", "megatron/training/arguments.py _add_distributed_args"),
    ("ckpt-format", "megatron/training/config/training_config.py CheckpointConfig"),
    ("overlap-grad-reduce", "megatron/training/arguments.py _add_distributed_args"),
    ("overlap-param-gather", "megatron/training/arguments.py _add_distributed_args"),
    ("tp-comm-overlap", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("no-overlap-p2p-communication", "megatron/training/arguments.py _add_distributed_args"),
    ("bf16", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("fp16", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("fp8-format", "megatron/core/transformer/transformer_config.py TransformerConfig.fp8 (argparse_meta)"),
    ("fp8-recipe", "megatron/core/transformer/transformer_config.py TransformerConfig; values in megatron/core/enums.py Fp8Recipe"),
    ("grad-reduce-in-bf16", "megatron/training/arguments.py _add_mixed_precision_args"),
    ("accumulate-allreduce-grads-in-fp32", "megatron/training/arguments.py _add_mixed_precision_args"),
    ("attention-backend", "megatron/core/transformer/transformer_config.py TransformerConfig; values in megatron/core/transformer/enums.py AttnBackend"),
    ("cuda-graph-impl", "megatron/core/transformer/transformer_config.py TransformerConfig (none, local, transformer_engine, full_iteration)"),
    ("cuda-graph-modules", "megatron/training/arguments.py (nargs '+', _parse_cuda_graph_modules_arg)"),
    ("no-check-for-nan-in-loss-and-grad", "megatron/training/arguments.py (store_false, dest check_for_nan_in_loss_and_grad; validate_args requires it with --cuda-graph-impl full_iteration)"),
    ("cross-entropy-loss-fusion", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("num-layers", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("mtp-num-layers", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("moe-router-enable-expert-bias", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("moe-router-score-function", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("moe-layer-freq", "megatron/training/arguments.py _add_moe_args (type moe_freq_type: an int or a Python list)"),
    ("multi-latent-attention", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("q-lora-rank", "megatron/training/arguments.py _add_mla_args"),
    ("kv-lora-rank", "megatron/training/arguments.py _add_mla_args"),
    ("qk-head-dim", "megatron/training/arguments.py _add_mla_args"),
    ("qk-pos-emb-head-dim", "megatron/training/arguments.py _add_mla_args"),
    ("v-head-dim", "megatron/training/arguments.py _add_mla_args"),
    ("hidden-size", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("ffn-hidden-size", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("num-attention-heads", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("group-query-attention", "megatron/training/arguments.py _add_network_size_args"),
    ("num-query-groups", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("kv-channels", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("swiglu", "megatron/training/arguments.py _add_network_size_args"),
    ("add-qkv-bias", "megatron/training/arguments.py (store_true, dest add_qkv_bias, beside --disable-bias-linear: biases on the QKV projection only)"),
    ("quick-geglu", "megatron/training/arguments.py _add_network_size_args (quick GELU activation; GPT-OSS)"),
    ("activation-func-clamp-value", "megatron/training/arguments.py _add_network_size_args (clamp of linear_fc1's output, with quick_gelu)"),
    ("glu-linear-offset", "megatron/training/arguments.py _add_network_size_args (activation(x[0]) * (x[1] + offset))"),
    ("softmax-type", "megatron/training/arguments.py _add_network_size_args (vanilla, off-by-one, learnable)"),
    ("qk-layernorm", "megatron/training/arguments.py _add_network_size_args (generated from TransformerConfig.qk_layernorm: the model's normalization over each head's query and key)"),
    ("normalization", "megatron/training/arguments.py _add_network_size_args (generated from TransformerConfig.normalization: LayerNorm, the default, or RMSNorm)"),
    ("window-size", "megatron/training/arguments.py _add_network_size_args (tuple_type: left,right)"),
    ("window-attn-skip-freq", "megatron/training/arguments.py _add_network_size_args (N: one full-attention layer after N-1 windowed ones)"),
    ("untie-embeddings-and-output-weights", "megatron/training/arguments.py _add_network_size_args"),
    ("disable-bias-linear", "megatron/core/transformer/transformer_config.py TransformerConfig.add_bias_linear (argparse_meta)"),
    ("attention-dropout", "megatron/core/transformer/transformer_config.py TransformerConfig.attention_dropout (default 0.1)"),
    ("hidden-dropout", "megatron/core/transformer/transformer_config.py TransformerConfig.hidden_dropout (default 0.1)"),
    ("num-experts", "megatron/training/arguments.py _add_moe_args"),
    ("moe-router-topk", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("moe-ffn-hidden-size", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("moe-grouped-gemm", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("position-embedding-type", "megatron/training/arguments.py _add_network_size_args"),
    ("overlap-moe-expert-parallel-comm", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("delay-wgrad-compute", "megatron/core/model_parallel_config.py ModelParallelConfig"),
    ("use-precision-aware-optimizer", "megatron/training/arguments.py _add_experimental_args"),
    ("exp-avg-dtype", "megatron/training/arguments.py _add_experimental_args"),
    ("exp-avg-sq-dtype", "megatron/training/arguments.py _add_experimental_args"),
    ("moe-expert-capacity-factor", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("moe-pad-expert-input-to-capacity", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("recompute-modules", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("moe-shared-expert-intermediate-size", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("moe-layer-freq", "megatron/training/arguments.py _add_moe_args"),
    ("moe-token-dispatcher-type", "megatron/core/transformer/transformer_config.py TransformerConfig"),
    ("moe-flex-dispatcher-backend", "megatron/core/transformer/transformer_config.py TransformerConfig"),
];

/// Plans that between them reach every Megatron-LM flag Sextant writes: the two
/// golden plans, uneven splits, FSDP, FP16, MXFP8, the other rank order, no P2P
/// overlap, an explicit layout, DeepEP, MTP with MLA, FP8 with the recomputation
/// delayed scaling refuses, and the expert-parallel overlap.
fn megatron_variants() -> Vec<PlanFile> {
    let mut variants = vec![dense(), moe()];
    let mut c = cfg(8, 8, 2, 1, 1);
    c.layout = Layout::AccountEmbeddingLoss;
    c.zero = Zero::Zero3;
    // MXFP8 runs on Blackwell only.
    variants.push(priced_on(
        "b200",
        "llama3.1-405b",
        64,
        Workload {
            seq: 4096,
            global_batch: 64,
            precision: Precision::Mxfp8,
            moe_imbalance: 1.0,
            moe_capacity: None,
        },
        c,
        Assumptions::default(),
    ));
    let mut c = cfg(8, 4, 1, 1, 2);
    c.layout = Layout::FirstLast {
        first: 30,
        last: 30,
    };
    c.overlap.p2p = false;
    c.zero = Zero::Zero2;
    let mut p = plan("llama3.1-405b", 64, 4096, 64, Precision::Fp16, c);
    p.rank_order = "tp-cp-ep-pp-dp".into();
    variants.push(p);
    let mut c = cfg(1, 2, 1, 1, 4);
    c.layout = Layout::Explicit {
        layers: vec![15, 17],
    };
    variants.push(plan("llama3-8b", 8, 4096, 64, Precision::Bf16, c));
    let mut c = cfg(1, 1, 1, 1, 16);
    c.ep = 16;
    c.moe_dispatcher = Dispatcher::Deduplicated;
    variants.push(plan("qwen3-30b-a3b", 16, 4096, 64, Precision::Bf16, c));
    variants.push(deepseek_with_mtp());
    variants.push(fp8_moe_act_recompute());
    variants.push(ep_overlap());
    variants.push(plan("gpt-oss-120b", 64, 4096, 64, Precision::Bf16, {
        let mut c = cfg(1, 1, 1, 1, 64);
        c.ep = 8;
        c
    }));
    variants
}

/// Sliding-window attention reaches Megatron-LM as --window-size and
/// --window-attn-skip-freq (GPT-OSS: a 128-token window on every other layer);
/// sandwich norms, which no argument builds, are refused in one line.
#[test]
fn sliding_windows_are_exported_and_sandwich_norms_refused() {
    let mut c = cfg(1, 1, 1, 1, 64);
    c.ep = 8;
    let p = plan("gpt-oss-120b", 64, 4096, 64, Precision::Bf16, c);
    let text = export(&p, 1, Target::MegatronLm, &LaunchOptions::default()).unwrap();
    assert!(text.contains("--window-size 127,0"), "{text}");
    assert!(text.contains("--window-attn-skip-freq 2"), "{text}");
    // Its clamped GLU and attention sinks, not SwiGLU.
    for f in [
        "--quick-geglu",
        "--activation-func-clamp-value 7",
        "--glu-linear-offset 1",
        "--softmax-type learnable",
    ] {
        assert!(text.contains(f), "{f}: {text}");
    }
    assert!(!text.contains("--swiglu"), "{text}");
    let mut p = plan(
        "llama3-8b",
        8,
        4096,
        64,
        Precision::Bf16,
        cfg(1, 1, 1, 1, 8),
    );
    let text = export(&p, 1, Target::MegatronLm, &LaunchOptions::default()).unwrap();
    assert!(!text.contains("--window-size"), "{text}");
    p.model.sandwich_norms = true;
    let err = export(&p, 1, Target::MegatronLm, &LaunchOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("normalises after each attention and MLP block") && !err.contains('\n'),
        "{err}"
    );
    // A window on 5 of 8 layers is no one-in-N pattern.
    p.model.sandwich_norms = false;
    p.model.sliding_window = Some(sextant_planner::model::SlidingWindow {
        window: 4096,
        layers: 5 * p.model.layers / 8,
    });
    let err = export(&p, 1, Target::MegatronLm, &LaunchOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("--window-attn-skip-freq"), "{err}");
}

/// Mixtral in FP8 replaying the experts' activation and the norms: Megatron's
/// TransformerConfig refuses that with delayed scaling.
fn fp8_moe_act_recompute() -> PlanFile {
    use sextant_planner::config::RecomputeModules;
    let mut c = cfg(2, 2, 1, 1, 8);
    c.ep = 4;
    c.recompute = Recompute::Selective;
    c.recompute_modules = RecomputeModules::MOE_ACT.union(RecomputeModules::LAYERNORM);
    plan("mixtral-8x7b", 32, 4096, 256, Precision::Fp8, c)
}

/// Qwen3-30B-A3B with TP 2 and the expert-parallel all-to-all overlapped.
fn ep_overlap() -> PlanFile {
    let mut c = cfg(2, 1, 1, 1, 8);
    c.ep = 8;
    c.overlap.ep_comm = true;
    plan("qwen3-30b-a3b", 16, 4096, 64, Precision::Bf16, c)
}

#[test]
fn every_megatron_flag_is_a_verified_argument() {
    let variants = megatron_variants();
    let mut seen = std::collections::BTreeSet::new();
    for p in &variants {
        let text = export(p, 1, Target::MegatronLm, &LaunchOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", p.model.name));
        let args = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join(" ");
        for word in args.split_whitespace().filter(|w| w.starts_with("--")) {
            let name = &word[2..];
            assert!(
                MEGATRON_FLAGS.iter().any(|(f, _)| *f == name),
                "flag --{name} is not in the verified table"
            );
            seen.insert(name.to_string());
        }
    }
    // The variants exercise most of the table.
    assert!(
        seen.len() >= 40,
        "only {} distinct flags exercised: {seen:?}",
        seen.len()
    );
}

/// What Megatron-LM's validate_args and TransformerConfig refused in exports of
/// searched plans (tools/megatron_args_check.py over tools/megatron_sweep.sh),
/// each stated here so that the CI, which has no Megatron-LM checkout, holds it.
#[test]
fn megatron_lm_exports_meet_megatron_validation_rules() {
    let lm = |p: &PlanFile| export(p, 1, Target::MegatronLm, &LaunchOptions::default()).unwrap();
    let core =
        |p: &PlanFile| export(p, 1, Target::MegatronCore, &LaunchOptions::default()).unwrap();
    let env_one = "# Environment: export CUDA_DEVICE_MAX_CONNECTIONS=1 ";
    let env_unset = "# Environment: unset CUDA_DEVICE_MAX_CONNECTIONS ";
    // TP > 1 with the distributed optimizer: validate_args asserts the variable is 1.
    let text = lm(&dense());
    assert!(
        text.contains(env_one) && !text.contains(env_unset),
        "{text}"
    );
    // Megatron-FSDP with TP 8: it asserts the variable is not 1.
    let fsdp = &megatron_variants()[2];
    assert_eq!(fsdp.plans[0].config.zero, Zero::Zero3);
    let text = lm(fsdp);
    assert!(
        text.contains(env_unset) && !text.contains(env_one),
        "{text}"
    );
    // The expert-parallel overlap wants more than one connection, TP or not.
    let text = lm(&ep_overlap());
    assert!(
        text.contains("--overlap-moe-expert-parallel-comm"),
        "{text}"
    );
    assert!(
        text.contains(env_unset) && !text.contains(env_one),
        "{text}"
    );
    // No TP or CP, nothing to say.
    let mut c = cfg(1, 2, 1, 1, 4);
    c.layout = Layout::Explicit {
        layers: vec![15, 17],
    };
    let text = lm(&plan("llama3-8b", 8, 4096, 64, Precision::Bf16, c));
    assert!(!text.contains("CUDA_DEVICE_MAX_CONNECTIONS"), "{text}");
    // moe_act recomputation needs grouped GEMMs (the experts the plan priced).
    let p = fp8_moe_act_recompute();
    let (text, py) = (lm(&p), core(&p));
    assert!(text.contains("--moe-grouped-gemm"), "{text}");
    assert!(py.contains("    moe_grouped_gemm=True,\n"), "{py}");
    // Delayed scaling refuses moe_act and layernorm recomputation: current scaling.
    assert!(text.contains("--fp8-recipe tensorwise"), "{text}");
    assert!(py.contains("fp8_recipe=\"tensorwise\","), "{py}");
    assert!(lm(&moe()).contains("--fp8-recipe delayed"));
    // MTP needs rotary (or no) position embeddings; Megatron-LM's default is learned.
    let text = lm(&deepseek_with_mtp());
    assert!(text.contains("--position-embedding-type rope"), "{text}");
    assert!(!lm(&dense()).contains("--position-embedding-type"));
}

/// Runs tools/megatron_args_check.py (Megatron-LM's parse_args, validate_args and
/// TransformerConfig, torch stubbed) over the Megatron-LM export of every variant
/// plan, when `MEGATRON_LM` names a Megatron-LM checkout; its Python is
/// `MEGATRON_LM_PYTHON` (default python3; Megatron-LM main needs 3.12 with numpy
/// and packaging). Prints SKIPPED otherwise: the CI has no checkout. A broken
/// export is checked too, so the checker is seen to refuse.
#[test]
fn megatron_lm_exports_pass_megatron_own_validation() {
    let Some(megatron) = std::env::var_os("MEGATRON_LM") else {
        println!("SKIPPED: set MEGATRON_LM to a Megatron-LM checkout to run Megatron's own argument validation");
        return;
    };
    let python = std::env::var_os("MEGATRON_LM_PYTHON").unwrap_or_else(|| "python3".into());
    if std::process::Command::new(&python)
        .arg("--version")
        .output()
        .is_err()
    {
        println!(
            "SKIPPED: no {} to run tools/megatron_args_check.py",
            python.to_string_lossy()
        );
        return;
    }
    let dir = TempDir::new("megatron-check");
    let mut files = Vec::new();
    for (i, p) in megatron_variants().iter().enumerate() {
        let path = dir.path(&format!("variant-{i}.txt"));
        std::fs::write(
            &path,
            export(p, 1, Target::MegatronLm, &LaunchOptions::default()).unwrap(),
        )
        .unwrap();
        // --core: the Megatron-Core export of the same plan builds the same
        // TransformerConfig.
        std::fs::write(
            dir.path(&format!("variant-{i}.core.py")),
            export(p, 1, Target::MegatronCore, &LaunchOptions::default()).unwrap(),
        )
        .unwrap();
        files.push(path);
    }
    let checker = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/megatron_args_check.py");
    let run = |files: &[PathBuf]| {
        std::process::Command::new(&python)
            .arg(&checker)
            .arg("--core")
            .arg(&megatron)
            .args(files)
            .output()
            .expect("checker runs")
    };
    let o = run(&files);
    let out = String::from_utf8_lossy(&o.stdout);
    println!("{out}{}", String::from_utf8_lossy(&o.stderr));
    let n = files.len();
    assert!(
        o.status.success() && out.contains(&format!("{n} checked, {n} passed, 0 failed")),
        "{out}"
    );
    // A layer count no pipeline split divides: Megatron refuses, so must the checker.
    let bad = dir.path("broken.txt");
    let text = export(&dense(), 1, Target::MegatronLm, &LaunchOptions::default()).unwrap();
    std::fs::write(&bad, text.replace("--num-layers 80", "--num-layers 81")).unwrap();
    std::fs::write(
        dir.path("broken.core.py"),
        export(&dense(), 1, Target::MegatronCore, &LaunchOptions::default()).unwrap(),
    )
    .unwrap();
    let o = run(&[bad]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !o.status.success()
            && out.contains("FAIL [validate_args]")
            && out.contains("1 checked, 0 passed, 1 failed"),
        "{out}"
    );
    // A Core export that builds another model than the Megatron-LM one (the
    // default GeLU MLP instead of SwiGLU) fails the comparison, naming the field.
    let lm = dir.path("other-model.txt");
    std::fs::write(&lm, &text).unwrap();
    let core = export(&dense(), 1, Target::MegatronCore, &LaunchOptions::default()).unwrap();
    assert!(core.contains("gated_linear_unit=True"), "{core}");
    std::fs::write(
        dir.path("other-model.core.py"),
        core.replace("gated_linear_unit=True", "gated_linear_unit=False"),
    )
    .unwrap();
    let o = run(&[lm]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !o.status.success()
            && out.contains("FAIL [megatron-core against megatron-lm] gated_linear_unit: megatron-lm True, megatron-core False"),
        "{out}"
    );
}

/// The Megatron-Core export builds the model the plan priced, the one the
/// Megatron-LM export's flags build: every model flag of the Megatron-LM export
/// has its TransformerConfig field in the Core export (TransformerConfig's
/// defaults are a GeLU MLP with biases, LayerNorm, hidden / heads channels per
/// head and full attention; `tools/megatron_args_check.py --core` compares the two
/// configurations Megatron itself builds).
#[test]
fn megatron_core_export_builds_the_priced_model() {
    let field = |flag: &str, value: &str| -> Vec<String> {
        match flag {
            "--kv-channels" => vec![format!("kv_channels={value},")],
            "--swiglu" => vec![
                "gated_linear_unit=True,".into(),
                "activation_func=F.silu,".into(),
            ],
            "--quick-geglu" => vec![
                "gated_linear_unit=True,".into(),
                "activation_func=quick_gelu,".into(),
            ],
            "--activation-func-clamp-value" => {
                vec![format!("activation_func_clamp_value={value}")]
            }
            "--glu-linear-offset" => vec![format!("glu_linear_offset={value}")],
            "--disable-bias-linear" => vec!["add_bias_linear=False,".into()],
            "--add-qkv-bias" => vec!["add_qkv_bias=True,".into()],
            "--normalization" => vec![format!("normalization=\"{value}\",")],
            "--window-size" => vec![format!("window_size=({}),", value.replace(',', ", "))],
            "--window-attn-skip-freq" => vec![format!("window_attn_skip_freq={value},")],
            "--softmax-type" => vec![format!("softmax_type=\"{value}\",")],
            "--attention-backend" => vec![format!("attention_backend=AttnBackend.{value},")],
            "--num-query-groups" => vec![format!("num_query_groups={value},")],
            "--qk-layernorm" => vec!["qk_layernorm=True,".into()],
            _ => vec![],
        }
    };
    let mut variants = megatron_variants();
    variants.push(plan(
        "gpt3-175b",
        64,
        2048,
        64,
        Precision::Bf16,
        cfg(8, 8, 1, 1, 1),
    ));
    // Biases on the QKV projection only (Qwen2).
    let mut qkv = variants[4].clone();
    qkv.model.qkv_bias = true;
    variants.push(qkv);
    let mut seen = std::collections::BTreeSet::new();
    for p in &variants {
        let lm = export(p, 1, Target::MegatronLm, &LaunchOptions::default()).unwrap();
        let core = export(p, 1, Target::MegatronCore, &LaunchOptions::default()).unwrap();
        for line in lm.lines().filter(|l| l.starts_with("--")) {
            let line = line.trim_end_matches(" \\").trim();
            let (flag, value) = line.split_once(' ').unwrap_or((line, ""));
            for f in field(flag, value) {
                assert!(
                    core.contains(&f),
                    "{}: the Megatron-LM export says {line}, the Core export lacks {f}:\n{core}",
                    p.model.name
                );
                seen.insert(flag.to_string());
            }
        }
        // And nothing the Megatron-LM export does not say.
        for (field, flag) in [
            ("gated_linear_unit=True", "--swiglu"),
            ("add_bias_linear=False", "--disable-bias-linear"),
            ("window_size=", "--window-size"),
            ("softmax_type=", "--softmax-type"),
            ("qk_layernorm=True", "--qk-layernorm"),
        ] {
            if core.contains(field) {
                assert!(
                    lm.contains(flag) || (flag == "--swiglu" && lm.contains("--quick-geglu")),
                    "{}: the Core export says {field}, the Megatron-LM export has no {flag}",
                    p.model.name
                );
            }
        }
    }
    // The variants cover every model flag mapped above.
    for flag in [
        "--kv-channels",
        "--swiglu",
        "--quick-geglu",
        "--activation-func-clamp-value",
        "--glu-linear-offset",
        "--disable-bias-linear",
        "--add-qkv-bias",
        "--normalization",
        "--window-size",
        "--window-attn-skip-freq",
        "--softmax-type",
        "--attention-backend",
        "--num-query-groups",
        "--qk-layernorm",
    ] {
        assert!(seen.contains(flag), "no variant exports {flag}");
    }
    // Qwen3-30B-A3B's 32 heads of 128 are 4096 wide on a 2048 hidden size: the
    // default (hidden / heads = 64) would build another attention.
    let qwen = &variants[5];
    assert_eq!(qwen.model.name, "qwen3-30b-a3b");
    let core = export(qwen, 1, Target::MegatronCore, &LaunchOptions::default()).unwrap();
    for f in [
        "kv_channels=128,",
        "qk_layernorm=True,",
        "normalization=\"RMSNorm\",",
        "import torch.nn.functional as F",
        "share_embeddings_and_output_weights=False",
    ] {
        assert!(core.contains(f), "{f}: {core}");
    }
}

#[test]
fn explicit_layout_uses_megatron_layout_syntax() {
    let mut c = cfg(1, 2, 1, 1, 4);
    c.layout = Layout::Explicit {
        layers: vec![15, 17],
    };
    let p = plan("llama3-8b", 8, 4096, 64, Precision::Bf16, c);
    let text = export(&p, 1, Target::MegatronLm, &LaunchOptions::default()).unwrap();
    assert!(
        text.contains("--pipeline-model-parallel-layout 'Et*15|t*17L'"),
        "{text}"
    );
}

/// DeepSeek-V3 (one MTP layer) in Megatron-Bridge's layout for pp 8 x vpp 2.
fn deepseek_with_mtp() -> PlanFile {
    let l = Layout::from_megatron("Et*4|(t*4|)*14tmL", 8).unwrap();
    let mut c = cfg(1, 8, l.vpp, 1, 32);
    c.ep = 32;
    c.layout = l.layout;
    plan("deepseek-v3", 256, 4096, 4096, Precision::Bf16, c)
}

#[test]
fn mtp_layers_reach_every_megatron_target() {
    let p = deepseek_with_mtp();
    let opts = LaunchOptions::default();
    let lm = export(&p, 1, Target::MegatronLm, &opts).unwrap();
    assert!(lm.contains("--mtp-num-layers 1"), "{lm}");
    // The exported layout reads back as the plan's layout, MTP on the last stage.
    let quoted = lm
        .split("--pipeline-model-parallel-layout '")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .unwrap();
    assert!(quoted.ends_with("|tmL"), "{quoted}");
    let back = Layout::from_megatron(quoted, 8).unwrap();
    assert_eq!(
        (back.layout, back.vpp, back.mtp_layers),
        (p.plans[0].config.layout.clone(), 2, 1)
    );
    assert!(
        lm.contains("--multi-latent-attention")
            && lm.contains("--q-lora-rank 1536")
            && lm.contains("--kv-lora-rank 512")
            && lm.contains("--qk-head-dim 128")
            && lm.contains("--qk-pos-emb-head-dim 64")
            && lm.contains("--v-head-dim 128"),
        "{lm}"
    );
    let core = export(&p, 1, Target::MegatronCore, &opts).unwrap();
    assert!(
        core.contains("mtp_num_layers=1,")
            && core.contains("config = MLATransformerConfig(")
            && core.contains("q_lora_rank=1536,"),
        "{core}"
    );
    assert!(export(&p, 1, Target::MegatronBridge, &opts)
        .unwrap()
        .contains("model.mtp_num_layers=1\n"));
    assert!(export(&rl_ready(&p), 1, Target::Verl, &opts)
        .unwrap()
        .contains("mtp_num_layers: 1"));
    for t in [Target::Rlinf, Target::Torchtitan] {
        let e = export(&p, 1, t, &opts).unwrap_err().to_string();
        assert!(e.contains("--mtp-layers 0"), "{e}");
    }
    // A plan without MTP says so to Bridge, whose DeepSeek-V3 recipe turns it on.
    let mut m = p.clone();
    m.model.mtp_layers = 0;
    assert!(export(&m, 1, Target::MegatronBridge, &opts)
        .unwrap()
        .contains("model.mtp_num_layers=null\n"));
    assert!(!export(&m, 1, Target::MegatronLm, &opts)
        .unwrap()
        .contains("mtp"));
}

#[test]
fn inexpressible_plans_fail_with_the_reason() {
    let opts = LaunchOptions::default();
    let err = |p: &PlanFile, t: Target| {
        export(p, 1, t, &opts)
            .expect_err("should refuse")
            .to_string()
    };
    // torchtitan has no ZeRO-1.
    assert!(err(&dense(), Target::Torchtitan).contains("optimizer-only sharding"));
    // RLinf's converter writes no virtual-pipeline chunks and splits the layers
    // evenly.
    let mut c = cfg(8, 8, 2, 1, 1);
    c.layout = Layout::AccountEmbeddingLoss;
    let p = plan("llama3.1-405b", 64, 4096, 64, Precision::Bf16, c.clone());
    assert!(err(&rl_ready(&p), Target::Rlinf).contains("virtual-pipeline"));
    c.vpp = 1;
    c.schedule = Schedule::OneFOneB;
    let p = plan("llama3.1-405b", 64, 4096, 64, Precision::Bf16, c);
    assert!(err(&rl_ready(&p), Target::Rlinf).contains("evenly"));
    // verl has no confirmed FP8 setting.
    assert!(err(&moe(), Target::Verl).contains("FP8"));
    // A plan with MTP layers where the framework names no MTP setting.
    assert!(err(&deepseek_with_mtp(), Target::Torchtitan).contains("multi-token-prediction"));
    // Plan numbers are checked.
    assert!(export(&dense(), 2, Target::MegatronLm, &opts)
        .unwrap_err()
        .to_string()
        .contains("plan #2"));
    assert!(Target::parse("deepspeed")
        .unwrap_err()
        .to_string()
        .contains("unknown export target"));
    // Spellings that differ in case and separators name the same target.
    for (spelt, t) in [
        ("Megatron_LM", Target::MegatronLm),
        ("Scale_Torch", Target::ScaleTorch),
        ("scale-torch", Target::ScaleTorch),
        ("TORCHRUN_EXEC", Target::TorchrunExec),
        ("rank_map_json", Target::RankMapJson),
        ("mcore", Target::MegatronCore),
    ] {
        assert_eq!(Target::parse(spelt).unwrap(), t, "{spelt}");
    }
    assert!(Target::parse("megatron--lm-x").is_err());
    // A plan priced with eager element-wise operations (a published run's own
    // code) runs fused on every framework: refused, the rank map still drawn.
    let mut eager = dense();
    eager.assumptions.eager = sextant_planner::cost::EagerOps::parse("norm glu").unwrap();
    for t in [
        Target::MegatronLm,
        Target::MegatronBridge,
        Target::Torchtitan,
    ] {
        assert!(
            err(&eager, t).contains("norm glu as eager PyTorch operators"),
            "{t}"
        );
    }
    assert!(export(&eager, 1, Target::RankMap, &opts).is_ok());
    // verl's Megatron backend turns sequence parallelism on wherever TP > 1: a
    // plan priced without it would not run as priced.
    let mut no_sp = rl_ready(&dense());
    no_sp.plans[0].config.sp = false;
    assert!(err(&no_sp, Target::Verl).contains("re-plan without --sp false"));
    assert!(export(&rl_ready(&dense()), 1, Target::Verl, &opts).is_ok());
}

/// Megatron-LM and the frameworks on Megatron-Core run 1F1B and interleaved 1F1B
/// only (no flag selects another schedule), so ZB-H1 and DualPipe plans are
/// refused with the reason; torchtitan has no one-stage-per-rank form of them
/// either. The exec launchers and the rank map, which do not name a schedule,
/// still render.
#[test]
fn zero_bubble_and_dualpipe_plans_are_refused_where_no_flag_states_them() {
    let opts = LaunchOptions::default();
    for s in [Schedule::ZbH1, Schedule::DualPipe] {
        let mut c = cfg(8, 4, 1, 1, 2);
        c.schedule = s;
        c.zero = Zero::None;
        let p = plan("llama3-70b", 64, 4096, 64, Precision::Bf16, c);
        for t in [
            Target::MegatronLm,
            Target::MegatronCore,
            Target::MegatronBridge,
            Target::Nemo,
            Target::Verl,
            Target::Rlinf,
            Target::Torchrun,
            Target::Slurm,
            Target::Torchtitan,
        ] {
            let e = export(&p, 1, t, &opts).expect_err("should refuse");
            assert!(
                matches!(e, sextant_exports::ExportError::Inexpressible { .. }),
                "{t}: {e}"
            );
            assert!(e.to_string().contains(s.name()), "{t}: {e}");
        }
        for t in [
            Target::TorchrunExec,
            Target::SlurmExec,
            Target::RankMap,
            Target::RankMapJson,
        ] {
            export(&p, 1, t, &opts).unwrap_or_else(|e| panic!("{t}: {e}"));
        }
    }
    // GPipe: torchtitan names it, Megatron does not.
    let mut c = cfg(8, 4, 1, 1, 2);
    c.schedule = Schedule::Gpipe;
    let p = plan("llama3-70b", 64, 4096, 64, Precision::Bf16, c);
    assert!(export(&p, 1, Target::MegatronLm, &opts)
        .unwrap_err()
        .to_string()
        .contains("gpipe"));
}

/// A plan file written before configurations carried a schedule reads as the
/// schedule Megatron-LM runs for its vpp, and exports exactly as before.
#[test]
fn plan_files_without_a_schedule_still_load() {
    for (p, want) in [
        (dense(), Schedule::Interleaved),
        (moe(), Schedule::OneFOneB),
    ] {
        let mut v: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
        v["plans"][0]["config"]
            .as_object_mut()
            .unwrap()
            .remove("schedule")
            .expect("schedule is written");
        let old = PlanFile::from_json(&v.to_string()).unwrap();
        assert_eq!(old.plans[0].config.schedule, want);
        assert_eq!(old.plans[0].config, p.plans[0].config);
        let opts = LaunchOptions::default();
        assert_eq!(
            export(&old, 1, Target::MegatronLm, &opts).unwrap(),
            export(&p, 1, Target::MegatronLm, &opts).unwrap()
        );
    }
}

/// Exports launch the kernels the plan priced; a plan file from before they were
/// recorded reads the defaults (flash attention, Megatron's fused loss).
#[test]
fn exports_follow_the_priced_loss_and_attention_kernels() {
    let opts = LaunchOptions::default();
    let lm = |p: &PlanFile| export(p, 1, Target::MegatronLm, &opts);
    let (core, bridge) = (
        |p: &PlanFile| export(p, 1, Target::MegatronCore, &opts).unwrap(),
        |p: &PlanFile| export(p, 1, Target::MegatronBridge, &opts).unwrap(),
    );
    let native = dense();
    assert!(
        lm(&native).unwrap().contains("--cross-entropy-loss-fusion")
            && lm(&native).unwrap().contains("--attention-backend flash")
    );
    assert!(core(&native)
        .contains("cross_entropy_loss_fusion=True,\n    cross_entropy_fusion_impl=\"native\","));
    assert!(bridge(&native).contains(
        "model.cross_entropy_loss_fusion=true\nmodel.cross_entropy_fusion_impl=native\n"
    ));

    let mut unfused = dense();
    unfused.assumptions = Assumptions {
        flash_attention: false,
        loss: LossKernel::Unfused,
        ..Assumptions::default()
    };
    let text = lm(&unfused).unwrap();
    assert!(
        !text.contains("cross-entropy") && text.contains("--attention-backend unfused"),
        "{text}"
    );
    assert!(
        core(&unfused).contains("cross_entropy_loss_fusion=False,")
            && !core(&unfused).contains("cross_entropy_fusion_impl")
    );
    assert!(
        bridge(&unfused).contains("model.cross_entropy_loss_fusion=false\n")
            && !bridge(&unfused).contains("fusion_impl")
    );

    // Megatron-LM's arguments reject TE's kernel; Megatron-Core and Bridge take it.
    let mut te = moe();
    te.assumptions.loss = LossKernel::Te;
    let err = lm(&te).unwrap_err().to_string();
    assert!(
        err.contains("--loss te") && err.contains("--loss native") && !err.contains('\n'),
        "{err}"
    );
    assert!(core(&te).contains("cross_entropy_fusion_impl=\"te\","));
    assert!(bridge(&te).contains("model.cross_entropy_fusion_impl=te\n"));

    // Round trip, and an old plan file without the field.
    assert_eq!(
        PlanFile::from_json(&te.to_json()).unwrap().assumptions,
        te.assumptions
    );
    let mut v: serde_json::Value = serde_json::from_str(&te.to_json()).unwrap();
    v.as_object_mut()
        .unwrap()
        .remove("assumptions")
        .expect("assumptions are written");
    assert_eq!(
        PlanFile::from_json(&v.to_string()).unwrap().assumptions,
        Assumptions::default()
    );
}

#[test]
fn cli_export_round_trip() {
    let dir = std::env::temp_dir().join(format!("sextant-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan_path = dir.join("plan.json");
    let bin = env!("CARGO_BIN_EXE_sextant");
    let o = std::process::Command::new(bin)
        .args([
            "plan",
            "--model",
            "8x7b",
            "--gpus",
            "32",
            "--global-batch",
            "256",
            "--top",
            "3",
            "--out",
            plan_path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for target in ["megatron-lm", "rank-map", "slurm-exec"] {
        let o = std::process::Command::new(bin)
            .args(["export", plan_path.to_str().unwrap(), "--to", target])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{target}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!o.stdout.is_empty());
    }
    let o = std::process::Command::new(bin)
        .args(["export", plan_path.to_str().unwrap(), "--to", "deepspeed"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown export target"));
    let o = std::process::Command::new(bin)
        .args([
            "plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--top",
            "1",
            "--emit",
            "torchtitan",
            "--zero",
            "0,3",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("[parallelism]"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// What one Megatron-family export must show for a priced setting: every
/// `Has` marker (a leading `!` means the text must not contain it), or a one-line
/// refusal naming the re-plan flag.
enum Expect {
    Has(&'static [&'static str]),
    Refused(&'static str),
}

/// Every setting the cost model prices reaches the launch of each Megatron-family
/// framework, or the export refuses in one line and says how to re-plan: a plan
/// priced one way is never launched another.
#[test]
fn exports_launch_what_the_plan_priced_or_refuse() {
    use Expect::{Has, Refused};
    // Qwen3-30B-A3B on 16 H100s, EP 8, priced with the unfused loss (what the RL
    // frameworks run); each case changes one setting.
    let base = || {
        let mut c = cfg(1, 1, 1, 1, 16);
        c.ep = 8;
        let w = Workload {
            seq: 4096,
            global_batch: 64,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        };
        (
            c,
            w,
            Assumptions {
                loss: LossKernel::Unfused,
                ..Assumptions::default()
            },
        )
    };
    type Case = (
        &'static str,
        fn(&mut ParallelConfig, &mut Workload, &mut Assumptions),
        [Expect; 6],
    );
    let cases: Vec<Case> = vec![
        (
            "unfused loss, alltoall",
            |_, _, _| {},
            [
                Has(&["--moe-token-dispatcher-type alltoall", "!--cross-entropy-loss-fusion"]),
                Has(&["cross_entropy_loss_fusion=False,", "moe_token_dispatcher_type=\"alltoall\","]),
                Has(&["model.cross_entropy_loss_fusion=false\n", "model.moe_token_dispatcher_type=alltoall\n"]),
                Has(&["recipe.model.config.cross_entropy_loss_fusion = False\n", "recipe.model.config.moe_token_dispatcher_type = \"alltoall\"\n"]),
                Has(&["        moe_token_dispatcher_type: alltoall\n", "        overlap_grad_reduce: true\n", "        overlap_param_gather: true\n"]),
                Has(&["    moe_token_dispatcher_type: alltoall\n"]),
            ],
        ),
        (
            "Megatron's fused loss",
            |_, _, a| a.loss = LossKernel::Native,
            [
                Has(&["--cross-entropy-loss-fusion"]),
                Has(&["cross_entropy_fusion_impl=\"native\","]),
                Has(&["model.cross_entropy_fusion_impl=native\n"]),
                Has(&["recipe.model.config.cross_entropy_loss_fusion = True\nrecipe.model.config.cross_entropy_fusion_impl = \"native\"\n"]),
                Refused("--loss unfused"),
                Refused("--loss unfused"),
            ],
        ),
        (
            "Transformer Engine's loss",
            |_, _, a| a.loss = LossKernel::Te,
            [
                Refused("--loss native"),
                Has(&["cross_entropy_fusion_impl=\"te\","]),
                Has(&["model.cross_entropy_fusion_impl=te\n"]),
                Has(&["recipe.model.config.cross_entropy_fusion_impl = \"te\"\n"]),
                Refused("--loss unfused"),
                Refused("--loss unfused"),
            ],
        ),
        (
            "unfused attention",
            |_, _, a| a.flash_attention = false,
            [
                Has(&["--attention-backend unfused"]),
                Has(&["from megatron.core.transformer.enums import AttnBackend\n", "    attention_backend=AttnBackend.unfused,\n"]),
                Has(&["'model.attention_backend={_target_:megatron.core.transformer.enums.AttnBackend.unfused,_call_:false}'\n"]),
                Has(&["from megatron.core.transformer.enums import AttnBackend\n", "recipe.model.config.attention_backend = AttnBackend.unfused\n"]),
                Has(&["        attention_backend: unfused\n"]),
                Refused("--no-flash-attention"),
            ],
        ),
        (
            "DeepEP dispatcher",
            |c, _, _| c.moe_dispatcher = Dispatcher::Deduplicated,
            [
                Has(&["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]),
                Has(&["moe_token_dispatcher_type=\"flex\",\n    moe_flex_dispatcher_backend=\"deepep\","]),
                Has(&["model.moe_token_dispatcher_type=flex\nmodel.moe_flex_dispatcher_backend=deepep\n"]),
                Has(&["moe_token_dispatcher_type = \"flex\"\nrecipe.model.config.moe_enable_deepep = True\n"]),
                Has(&["        moe_token_dispatcher_type: flex\n        moe_flex_dispatcher_backend: deepep\n"]),
                Has(&["    moe_token_dispatcher_type: flex\n    moe_flex_dispatcher_backend: deepep\n"]),
            ],
        ),
        (
            "expert capacity with padding",
            |_, w, _| w.moe_capacity = Some(sextant_planner::routing::Capacity { factor: 1.25, pad: true }),
            [
                Has(&["--moe-expert-capacity-factor 1.25", "--moe-pad-expert-input-to-capacity"]),
                Has(&["moe_expert_capacity_factor=1.25,\n    moe_pad_expert_input_to_capacity=True,"]),
                Has(&["model.moe_expert_capacity_factor=1.25\nmodel.moe_pad_expert_input_to_capacity=true\n"]),
                Has(&["recipe.model.config.moe_expert_capacity_factor = 1.25\nrecipe.model.config.moe_pad_expert_input_to_capacity = True\n"]),
                Has(&["        moe_expert_capacity_factor: 1.25\n        moe_pad_expert_input_to_capacity: true\n"]),
                Has(&["    moe_expert_capacity_factor: 1.25\n    moe_pad_expert_input_to_capacity: true\n"]),
            ],
        ),
        (
            "expert-parallel communication overlap",
            |c, _, _| c.overlap.ep_comm = true,
            [
                Has(&["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]),
                Has(&["overlap_moe_expert_parallel_comm=True,\n    delay_wgrad_compute=True,"]),
                Has(&["overlap_moe_expert_parallel_comm:true,delay_wgrad_compute:true}"]),
                Refused("--ep-comm-overlap"),
                Refused("--ep-comm-overlap"),
                Refused("--ep-comm-overlap"),
            ],
        ),
        (
            "BF16 optimizer moments",
            |c, _, _| c.bf16_moments = true,
            [
                Has(&["--use-precision-aware-optimizer", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"]),
                Has(&["exp_avg_dtype=torch.bfloat16,"]),
                Has(&["optimizer.use_precision_aware_optimizer=true\n", "optimizer.exp_avg_dtype=bf16\noptimizer.exp_avg_sq_dtype=bf16\n"]),
                Has(&["import torch\n", "recipe.optim.config.exp_avg_dtype = torch.bfloat16\n"]),
                Refused("--bf16-moments"),
                Refused("--bf16-moments"),
            ],
        ),
        (
            "BF16 gradient reduction",
            |c, _, _| c.bf16_grads = true,
            [
                Has(&["--grad-reduce-in-bf16"]),
                Has(&["grad_reduce_in_fp32=False,"]),
                // Bridge's precision config sets the DDP field from its own.
                Has(&["ddp.grad_reduce_in_fp32=false\n", ",grad_reduce_in_fp32:false,"]),
                // NeMo's plugin does the same at connect: stated on the plugin too.
                Has(&["recipe.trainer.strategy.ddp.grad_reduce_in_fp32 = False\n", "recipe.trainer.plugins.grad_reduce_in_fp32 = False\n"]),
                Has(&["        grad_reduce_in_fp32: false\n"]),
                Refused("--bf16-grads"),
            ],
        ),
        (
            "TP communication overlap",
            |c, _, _| {
                (c.tp, c.dp, c.sp) = (2, 8, true);
                c.overlap.tp_comm = true;
            },
            [
                Has(&["--tp-comm-overlap"]),
                Has(&["tp_comm_overlap=True,"]),
                Has(&["CommOverlapConfig,tp_comm_overlap:true,"]),
                Has(&["recipe.trainer.callbacks.append(run.Config(MegatronCommOverlapCallback, tp_comm_overlap=True, overlap_grad_reduce=True, overlap_param_gather=True, bucket_size=40000000))\n"]),
                Refused("--tp-comm-overlap"),
                Refused("--tp-comm-overlap"),
            ],
        ),
    ];
    let targets = [
        Target::MegatronLm,
        Target::MegatronCore,
        Target::MegatronBridge,
        Target::Nemo,
        Target::Verl,
        Target::Rlinf,
    ];
    let opts = LaunchOptions::default();
    for (name, change, expects) in &cases {
        let (mut c, mut w, mut a) = base();
        change(&mut c, &mut w, &mut a);
        let p = priced("qwen3-30b-a3b", 16, w, c, a);
        for (target, expect) in targets.iter().zip(expects) {
            let got = export(&p, 1, *target, &opts);
            match (expect, got) {
                (Has(markers), Ok(text)) => {
                    for m in *markers {
                        match m.strip_prefix('!') {
                            Some(absent) => assert!(
                                !text.contains(absent),
                                "{name}, {target:?}: must not contain {absent:?}:\n{text}"
                            ),
                            None => assert!(
                                text.contains(m),
                                "{name}, {target:?}: missing {m:?}:\n{text}"
                            ),
                        }
                    }
                }
                (Refused(hint), Err(e)) => {
                    let e = e.to_string();
                    assert!(
                        e.contains(hint) && !e.contains('\n'),
                        "{name}, {target:?}: refusal should be one line naming {hint}: {e}"
                    );
                }
                (Has(_), Err(e)) => panic!("{name}, {target:?}: refused: {e}"),
                (Refused(_), Ok(text)) => {
                    panic!("{name}, {target:?}: exported a run it cannot launch as priced:\n{text}")
                }
            }
        }
    }
}

/// The fields of ScaleTorch's `ScaleTorchArguments` the export sets, as they are
/// declared in scaletorch/trainer/config.py at c4c08ac (2026-07-14), read there.
const SCALETORCH_FIELDS: &[&str] = &[
    "model_name_or_path",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "context_parallel_size",
    "pipeline_parallel_engine",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "sequence_length",
];

/// `plan --target scaletorch` prices ScaleTorch's rank grid and exports a torchrun
/// script whose flags are all ScaleTorch's, whose sizes pass its own checks
/// (`validate_world_size`: world = TP x PP x DP x CP x EP; global batch = DP x
/// micro-batch x accumulation), and that `bash -n` accepts. A plan priced in
/// Megatron's order is refused for ScaleTorch, and a ScaleTorch plan for
/// Megatron, each in one line.
#[test]
fn scaletorch_export_states_what_scaletorch_runs() {
    let dir = TempDir::new("scaletorch");
    let plan_path = saved(
        &dir,
        "st.json",
        &[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "64",
            "--target",
            "scaletorch",
            "--top",
            "3",
        ],
    );
    let plan = PlanFile::from_json(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    assert_eq!(plan.rank_order, "tp-ep-cp-pp-dp");
    for (i, p) in plan.plans.iter().enumerate() {
        let text = export(&plan, i + 1, Target::ScaleTorch, &LaunchOptions::default()).unwrap();
        let script = dir.path(&format!("st{i}.sh"));
        std::fs::write(&script, &text).unwrap();
        let n = std::process::Command::new("bash")
            .arg("-n")
            .arg(&script)
            .output()
            .unwrap();
        assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
        let flag = |name: &str| -> u64 {
            let at = text
                .find(&format!("--{name} "))
                .unwrap_or_else(|| panic!("no --{name}"));
            text[at + name.len() + 3..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        for word in text
            .split_whitespace()
            .filter(|w| w.starts_with("--") && w.contains('_'))
        {
            assert!(
                SCALETORCH_FIELDS.contains(&&word[2..]),
                "{word} is not a ScaleTorch argument"
            );
        }
        let (tp, pp, dp, cp) = (
            flag("tensor_parallel_size"),
            flag("pipeline_parallel_size"),
            flag("data_parallel_size"),
            flag("context_parallel_size"),
        );
        assert_eq!(tp * pp * dp * cp, plan.gpus);
        assert_eq!(
            dp * flag("micro_batch_size") * flag("gradient_accumulation_steps"),
            plan.workload.global_batch
        );
        assert_eq!(
            (p.config.tp, p.config.pp, p.config.dp, p.config.cp),
            (tp, pp, dp, cp)
        );
        assert!(
            text.contains("--pipeline_parallel_engine 1f1b")
                || text.contains("--pipeline_parallel_engine afab")
        );
    }
    fails_with_one_line(
        &["export", plan_path.to_str().unwrap(), "--to", "megatron-lm"],
        "tp-ep-cp-pp-dp",
    );
    // Switches ScaleTorch does not have: a plan file edited to carry them is not
    // exported as if they held, and the search refuses them before it starts.
    for (edit, flag) in [
        (
            (|c: &mut ParallelConfig| c.bf16_grads = true) as fn(&mut ParallelConfig),
            "--bf16-grads",
        ),
        (
            |c: &mut ParallelConfig| c.overlap.tp_comm = true,
            "--tp-comm-overlap",
        ),
    ] {
        // The first plan runs TP above 1, where a TP overlap would apply.
        assert!(plan.plans[0].config.tp > 1);
        let mut edited = plan.clone();
        edit(&mut edited.plans[0].config);
        let e = export(&edited, 1, Target::ScaleTorch, &LaunchOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains(flag), "{e}");
        fails_with_one_line(
            &[
                "plan",
                "--model",
                "8b",
                "--gpus",
                "64",
                "--target",
                "scaletorch",
                flag,
            ],
            &format!("--target scaletorch has no {flag}"),
        );
    }
    let mega = dir.path("mega.json");
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "64",
        "--zero",
        "0",
        "--top",
        "1",
        "--out",
        mega.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    fails_with_one_line(
        &["export", mega.to_str().unwrap(), "--to", "scaletorch"],
        "--target scaletorch",
    );
}

/// ScaleTorch's context parallelism is its unfused ring attention: under flash
/// attention (the default) `plan --target scaletorch` searches CP 1 only, so every
/// plan it returns exports (70B on 128 H100s once ranked CP 2 plans first and found
/// none to export); an explicit CP without 1 is refused before the search, and with
/// `--no-flash-attention` CP plans are priced unfused and export.
#[test]
fn scaletorch_target_searches_context_parallelism_it_can_run() {
    let dir = TempDir::new("scaletorch-cp");
    let base = [
        "plan",
        "--model",
        "70b",
        "--gpus",
        "128",
        "--target",
        "scaletorch",
    ];
    let flash = saved(&dir, "flash.json", &[&base[..], &["--top", "3"]].concat());
    let plan = PlanFile::from_json(&std::fs::read_to_string(&flash).unwrap()).unwrap();
    assert!(!plan.plans.is_empty());
    for (i, p) in plan.plans.iter().enumerate() {
        assert_eq!(p.config.cp, 1);
        export(&plan, i + 1, Target::ScaleTorch, &LaunchOptions::default()).unwrap();
    }
    fails_with_one_line(
        &[&base[..], &["--cp", "2"]].concat(),
        "include 1 in --cp, or price it so with --no-flash-attention",
    );
    let unfused = saved(
        &dir,
        "unfused.json",
        &[
            &base[..],
            &["--no-flash-attention", "--cp", "2", "--top", "2"],
        ]
        .concat(),
    );
    let plan = PlanFile::from_json(&std::fs::read_to_string(&unfused).unwrap()).unwrap();
    for (i, p) in plan.plans.iter().enumerate() {
        assert_eq!(p.config.cp, 2);
        export(&plan, i + 1, Target::ScaleTorch, &LaunchOptions::default()).unwrap();
    }
    // A search that finds nothing at CP 1 says how to search CP too.
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "64",
            "--target",
            "scaletorch",
            "--seq",
            "131072",
            "--global-batch",
            "64",
            "--top",
            "2",
        ],
        "--no-flash-attention searches context parallelism too",
    );
}

/// The Megatron-LM launchers set what `validate_args` checks before the ranks
/// start: `CUDA_DEVICE_MAX_CONNECTIONS=1` with TP or CP (the dense plan, TP 4
/// CP 2), and leave it unset where Megatron-FSDP needs more than one.
#[test]
fn megatron_launchers_set_cuda_device_max_connections() {
    let opts = LaunchOptions::default();
    for target in [Target::Torchrun, Target::Slurm] {
        let text = export(&dense(), 1, target, &opts).unwrap();
        let set = text
            .find("export CUDA_DEVICE_MAX_CONNECTIONS=1")
            .expect("set");
        let launch = text.find("pretrain_gpt.py").unwrap();
        assert!(set < launch, "{target}: set after the launch");
        let mut fsdp = dense();
        fsdp.plans[0].config.zero = Zero::Zero3;
        let text = export(&fsdp, 1, target, &opts).unwrap();
        assert!(
            text.contains("unset CUDA_DEVICE_MAX_CONNECTIONS"),
            "{target}"
        );
    }
}

/// A target that cannot state the plan's stage layout says which layout in words or
/// Megatron's layout syntax, never in Rust's debug form.
#[test]
fn layout_refusals_name_the_layout_in_the_users_terms() {
    let dir = TempDir::new("layout-refusal");
    let p = dir.path("explicit.json");
    let o = sextant(&[
        "estimate",
        "--model",
        "8b",
        "--gpus",
        "8",
        "--tp",
        "2",
        "--pp",
        "2",
        "--zero",
        "3",
        "--pp-layout",
        "Et*15|t*17L",
        "--global-batch",
        "64",
        "--json",
        "--out",
        p.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for target in ["torchtitan", "nemo"] {
        fails_with_one_line(
            &["export", p.to_str().unwrap(), "--to", target],
            "this plan uses the explicit layout \"Et*15|t*17L\"",
        );
    }
}

/// Qwen2's biases sit on the query, key and value projections only: the
/// Megatron-LM export disables the others and adds those (--disable-bias-linear
/// --add-qkv-bias), as Megatron's own Qwen2 recipes do; Llama has none.
#[test]
fn qwen2_exports_qkv_biases_only() {
    let qwen2 = crate::common::data("hf/qwen2-7b.json");
    for (model, qkv) in [(qwen2.as_str(), true), ("llama3-8b", false)] {
        let o = sextant(&[
            "plan",
            "--model",
            model,
            "--gpus",
            "8",
            "--global-batch",
            "64",
            "--emit",
            "megatron-lm",
        ]);
        assert!(o.status.success(), "{model}: {}", stderr(&o));
        let out = crate::common::stdout(&o);
        assert!(out.contains("--disable-bias-linear"), "{model}: {out}");
        assert_eq!(out.contains("--add-qkv-bias"), qkv, "{model}: {out}");
    }
}

/// CUDA graphs the plan priced: the Megatron-LM export (and the launchers built on
/// its arguments) and the Megatron-Bridge overrides pass Transformer Engine's
/// per-layer graphs over the priced scopes, and a dense model's full-iteration
/// graph; an MoE model's full-iteration graph, and every other framework's export,
/// is refused in one line; the plan file keeps the scopes.
#[test]
fn exports_carry_or_refuse_the_priced_cuda_graphs() {
    let opts = LaunchOptions::default();
    let mut p = moe();
    // Megatron-Core graphs layers only without full recomputation.
    p.plans[0].config.recompute = Recompute::Selective;
    p.assumptions.cuda_graphs =
        sextant_planner::cost::CudaGraphs::parse("attn moe_router moe_preprocess").unwrap();
    let text = export(&p, 1, Target::MegatronLm, &opts).unwrap();
    assert!(
        text.contains("--cuda-graph-impl transformer_engine")
            && text.contains("--cuda-graph-modules attn moe_router moe_preprocess"),
        "{text}"
    );
    assert!(export(&p, 1, Target::Torchrun, &opts)
        .unwrap()
        .contains("--cuda-graph-modules attn moe_router moe_preprocess"));
    // Megatron-Bridge: the overrides its performance scripts set (the TE RNG
    // tracker that capture needs included); the plan's scopes only.
    let bridge = export(&p, 1, Target::MegatronBridge, &opts).unwrap();
    assert!(
        bridge.contains("\nmodel.cuda_graph_impl=transformer_engine\n")
            && bridge.contains("'model.cuda_graph_modules=[attn,moe_router,moe_preprocess]'")
            && bridge.contains("\nrng.te_rng_tracker=true\n"),
        "{bridge}"
    );
    let mut attn_only = p.clone();
    attn_only.assumptions.cuda_graphs = sextant_planner::cost::CudaGraphs::parse("attn").unwrap();
    assert!(export(&attn_only, 1, Target::MegatronBridge, &opts)
        .unwrap()
        .contains("'model.cuda_graph_modules=[attn]'"));
    for target in [Target::MegatronCore, Target::Torchtitan] {
        let e = export(&p, 1, target, &opts).unwrap_err().to_string();
        assert!(
            e.contains("CUDA graphs (attn moe_router moe_preprocess)") && !e.contains('\n'),
            "{target:?}: {e}"
        );
    }
    let back = PlanFile::from_json(&p.to_json()).unwrap();
    assert_eq!(back.assumptions.cuda_graphs, p.assumptions.cuda_graphs);
    p.assumptions.cuda_graphs = sextant_planner::cost::CudaGraphs::parse("full_iteration").unwrap();
    let e = export(&p, 1, Target::MegatronLm, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("full-iteration"), "{e}");
    // A dense model's whole-step graph is exported: Megatron-LM's full_iteration
    // implementation with the NaN check off (validate_args asks for it), and
    // Bridge's the way set_full_iteration_cuda_graph sets it.
    let mut d = dense();
    d.assumptions.cuda_graphs = p.assumptions.cuda_graphs;
    let lm = export(&d, 1, Target::MegatronLm, &opts).unwrap();
    assert!(
        lm.contains("--cuda-graph-impl full_iteration")
            && lm.contains("--no-check-for-nan-in-loss-and-grad")
            && !lm.contains("--cuda-graph-modules"),
        "{lm}"
    );
    let flags: Vec<&str> = lm
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(str::split_whitespace)
        .filter(|w| w.starts_with("--"))
        .collect();
    for word in flags {
        assert!(
            MEGATRON_FLAGS.iter().any(|(f, _)| *f == &word[2..]),
            "flag {word} is not in the verified table"
        );
    }
    let bridge = export(&d, 1, Target::MegatronBridge, &opts).unwrap();
    assert!(
        bridge.contains("\nmodel.cuda_graph_impl=full_iteration\n")
            && bridge.contains("'model.cuda_graph_modules=[]'")
            && bridge.contains("\nrerun_state_machine.check_for_nan_in_loss=false\n"),
        "{bridge}"
    );
    let e = export(&p, 1, Target::MegatronBridge, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("full-iteration") && !e.contains('\n'), "{e}");
    // Without graphs nothing is written.
    assert!(!export(&moe(), 1, Target::MegatronLm, &opts)
        .unwrap()
        .contains("cuda-graph"));
    // Bridge clears a recipe's own graphs: none, and no deprecated scope.
    let bridge = export(&moe(), 1, Target::MegatronBridge, &opts).unwrap();
    assert!(
        bridge.contains("\nmodel.cuda_graph_impl=none\n")
            && bridge.contains("\nmodel.cuda_graph_scope=null\n")
            && !bridge.contains("cuda_graph_modules"),
        "{bridge}"
    );
}

/// torchtitan derives its stage count from `pipeline_parallel_layers_per_stage`
/// and the first and last stages' "less layers" (pipeline_parallel.py at v0.2.2:
/// ceil((layers + first + last) / per_stage) stages, which must be a multiple of
/// the degree). The export states both as 0, so the stages it builds are the
/// plan's: pp x vpp even stages.
#[test]
fn torchtitan_pipeline_stages_are_the_plans() {
    for (pp, vpp, schedule) in [(2, 8, Schedule::Interleaved), (4, 1, Schedule::OneFOneB)] {
        let mut c = cfg(2, pp, vpp, 1, 8 / pp);
        c.zero = Zero::Zero3;
        c.schedule = schedule;
        let p = priced(
            "llama3-8b",
            16,
            Workload {
                seq: 4096,
                global_batch: 64,
                precision: Precision::Bf16,
                moe_imbalance: 1.0,
                moe_capacity: None,
            },
            c,
            Assumptions {
                framework: sextant_planner::cost::Framework::Torchtitan,
                loss: LossKernel::Native,
                ..Assumptions::default()
            },
        );
        let toml = export(&p, 1, Target::Torchtitan, &LaunchOptions::default()).unwrap();
        let value = |key: &str| -> u64 {
            toml.lines()
                .find_map(|l| l.strip_prefix(&format!("{key} = ")))
                .unwrap_or_else(|| panic!("{key} missing:\n{toml}"))
                .parse()
                .unwrap()
        };
        let per_stage = value("pipeline_parallel_layers_per_stage");
        let first = value("pipeline_parallel_first_stage_less_layers");
        let last = value("pipeline_parallel_last_stage_less_layers");
        let stages = (32 + first + last).div_ceil(per_stage);
        assert_eq!(stages, pp * vpp, "{toml}");
    }
}

/// From an outside review: TP above the model's K/V heads runs only on
/// Megatron-Core releases that compute one K/V head per rank (core_v0.16+); the
/// Megatron exports say so on such plans and only there.
#[test]
fn megatron_exports_name_the_release_tp_above_the_kv_heads_needs() {
    let dir = TempDir::new("kv-heads-tp");
    let note = "Needs Megatron-Core core_v0.16 or later: TP 8 exceeds the 4 key/value heads";
    for (tp, wanted) in [("8", true), ("4", false)] {
        let p = saved(
            &dir,
            &format!("q{tp}.json"),
            &[
                "plan",
                "--model",
                "qwen3-30b-a3b",
                "--gpus",
                "64",
                "--tp",
                tp,
                "--top",
                "1",
            ],
        );
        for to in ["megatron-lm", "megatron-core"] {
            let o = sextant(&["export", p.to_str().unwrap(), "--to", to]);
            assert!(o.status.success(), "{}", stderr(&o));
            let out = String::from_utf8_lossy(&o.stdout);
            assert_eq!(out.contains(note), wanted, "TP {tp}, {to}:\n{out}");
        }
    }
}

/// Dropout as the plan priced it: TransformerConfig defaults both dropouts to 0.1,
/// which a Llama-style model (priced without masks) does not train with.
#[test]
fn megatron_exports_state_the_priced_dropout() {
    let opts = LaunchOptions::default();
    let lm = export(&dense(), 1, Target::MegatronLm, &opts).unwrap();
    assert!(
        lm.contains("--attention-dropout 0.0") && lm.contains("--hidden-dropout 0.0"),
        "{lm}"
    );
    let core = export(&dense(), 1, Target::MegatronCore, &opts).unwrap();
    assert!(
        core.contains("attention_dropout=0.0,") && core.contains("hidden_dropout=0.0,"),
        "{core}"
    );
    let mut gpt3 = dense();
    gpt3.model.dropout = true;
    let lm = export(&gpt3, 1, Target::MegatronLm, &opts).unwrap();
    assert!(lm.contains("--attention-dropout 0.1"), "{lm}");
}

/// The CUDA-graph flags' release floor is said in the header, and a plan Megatron
/// refuses (attention graphed while the expert-parallel overlap defers weight
/// gradients, on a model with biases: validate_args at d98e8a6) is refused in one
/// line instead of exported.
#[test]
fn megatron_lm_cuda_graphs_say_their_floor_and_refuse_what_megatron_refuses() {
    let dir = TempDir::new("graph-floor");
    let dsv3 = saved(
        &dir,
        "dsv3.json",
        &words("estimate --model deepseek-v3 --gpus 256 --gpu b200 --tp 1 --pp 8 --ep 32 --global-batch 4096 --pp-layout Et*4|(t*4|)*14tmL --precision mxfp8 --recompute selective --recompute-modules mla_up_proj,mlp --bf16-moments --moe-dispatcher deepep --ep-comm-overlap --cuda-graphs attn,moe_router,moe_preprocess"),
    );
    let out = dir.path("dsv3.txt");
    let o = sextant(&[
        "export",
        dsv3.to_str().unwrap(),
        "--to",
        "megatron-lm",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    let header: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    assert!(
        header
            .iter()
            .any(|l| l.contains("core_v0.18 or later")
                && l.contains("Transformer Engine 2.12 or later")),
        "{header:?}"
    );
    assert!(text.contains("--delay-wgrad-compute"), "{text}");
    let goss = saved(
        &dir,
        "goss.json",
        &words("estimate --model gpt-oss-120b --gpus 64 --tp 1 --pp 1 --ep 64 --dp 64 --global-batch 512 --ep-comm-overlap --cuda-graphs attn,moe_router --recompute selective"),
    );
    fails_with_one_line(
        &["export", goss.to_str().unwrap(), "--to", "megatron-lm"],
        "refuses for a model with linear or QKV biases",
    );
}

/// A plan file's CUDA-graph scopes are checked when read: a scope the format does
/// not know, full_iteration beside per-layer scopes, router scopes on a dense model
/// and per-layer graphs with full recomputation are each one line, not an export
/// Megatron refuses at start-up.
#[test]
fn plan_files_with_contradictory_cuda_graphs_are_refused() {
    let mut p = dense();
    p.plans[0].config.recompute = Recompute::Selective;
    p.assumptions.cuda_graphs = sextant_planner::cost::CudaGraphs::parse("attn").unwrap();
    let good = p.to_json();
    assert!(PlanFile::from_json(&good).is_ok());
    let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
    let cases = [
        (
            serde_json::json!({"attn": true, "evil": true}),
            "unknown field `evil`",
        ),
        (
            serde_json::json!({"attn": true, "full_iteration": true}),
            "give it alone",
        ),
        (serde_json::json!({"moe_router": true}), "is dense"),
    ];
    for (graphs, needle) in cases {
        v["assumptions"]["cuda_graphs"] = graphs;
        let e = PlanFile::from_json(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains(needle) && !e.contains('\n'), "{e}");
    }
    let mut full = p.clone();
    full.plans[0].config.recompute = Recompute::Full;
    let e = PlanFile::from_json(&full.to_json())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot be combined with full recomputation"),
        "{e}"
    );
}

/// The exports that overlay a recipe (Megatron-Bridge's overrides, NeMo's
/// attribute sets, RLinf's and verl's TransformerConfig entries) state every
/// recomputation and stage-layout field, clearing what the plan does not use: a
/// Qwen3 or DeepSeek-V3 recipe's full, uniform, one-layer recomputation or its
/// own pipeline layout would otherwise stay under a selective plan, which
/// Megatron-Core refuses, or under one without recomputation, which would run
/// recomputing (outside review of the exports).
#[test]
fn overlay_exports_clear_what_a_recipe_may_have_set() {
    let opts = LaunchOptions::default();
    let mut c = cfg(2, 2, 1, 1, 4);
    c.ep = 4;
    c.recompute = Recompute::Selective;
    c.layout = Layout::FirstLast {
        first: 23,
        last: 25,
    };
    let p = plan("qwen3-30b-a3b", 16, 4096, 64, Precision::Bf16, c.clone());
    let bridge = export(&p, 1, Target::MegatronBridge, &opts).unwrap();
    for line in [
        "model.recompute_granularity=selective\n",
        "model.recompute_method=null\n",
        "model.recompute_num_layers=null\n",
        "'model.recompute_modules=[\"core_attn\"]'\n",
        "model.pipeline_model_parallel_layout=null\n",
        "model.num_layers_in_first_pipeline_stage=23\n",
        "model.num_layers_in_last_pipeline_stage=25\n",
        "model.account_for_embedding_in_pipeline_split=false\n",
        "model.account_for_loss_in_pipeline_split=false\n",
    ] {
        assert!(bridge.contains(line), "{line}: {bridge}");
    }
    let nemo_plan = {
        let mut c = c.clone();
        c.layout = Layout::Even;
        c.recompute = Recompute::None;
        plan("qwen3-30b-a3b", 16, 4096, 64, Precision::Bf16, c)
    };
    let nemo = export(&nemo_plan, 1, Target::Nemo, &opts).unwrap();
    for line in [
        "recipe.model.config.recompute_granularity = None\n",
        "recipe.model.config.recompute_method = None\n",
        "recipe.model.config.recompute_num_layers = None\n",
    ] {
        assert!(nemo.contains(line), "{line}: {nemo}");
    }
    assert!(
        nemo.contains("recipe.trainer.strategy.num_layers_in_first_pipeline_stage = None\n")
            && nemo
                .contains("recipe.trainer.strategy.account_for_loss_in_pipeline_split = False\n"),
        "{nemo}"
    );
    // NeMo's strategy takes first and last stage counts (megatron_strategy.py:123).
    let nemo = export(&p, 1, Target::Nemo, &opts).unwrap();
    crate::common::has_lines(
        &nemo,
        &[
            "recipe.trainer.strategy.num_layers_in_first_pipeline_stage = 23\n",
            "recipe.trainer.strategy.num_layers_in_last_pipeline_stage = 25\n",
            "recipe.model.config.recompute_method = None\n",
            "recipe.model.config.recompute_modules = [\"core_attn\"]\n",
        ],
    );
    let mut rl = rl_ready(&p);
    rl.plans[0].config.recompute = Recompute::Selective;
    // RLinf's converter and resharding split the layers evenly: the first/last
    // layout is refused, an even one states the recomputation fields whole.
    let refused = export(&rl, 1, Target::Rlinf, &opts)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("evenly"), "{refused}");
    rl.plans[0].config.layout = Layout::Even;
    rl.plans[0].config.vpp = 1;
    let rlinf = export(&rl, 1, Target::Rlinf, &opts).unwrap();
    crate::common::has_lines(
        &rlinf,
        &[
            "recompute_method: null\n",
            "recompute_num_layers: null\n",
            "bf16: true\n",
            "fp16: false\n",
        ],
    );
    assert!(!rlinf.contains("decoder_first"), "{rlinf}");
}

/// Megatron-Bridge: the communication-overlap section is stated whole as a
/// _target_ added with ++ (a recipe may leave it None, where a dotted override
/// fails); Megatron-FSDP asks for its checkpoint format; the optimizer's
/// distributed-optimizer switch follows the plan's (the config validator turns it
/// back on from either side); FP8 with norm or expert-activation recomputation
/// takes the current-scaling preset, as the Megatron-LM export's tensorwise recipe.
#[test]
fn megatron_bridge_states_what_its_validator_would_otherwise_change() {
    let opts = LaunchOptions::default();
    let bridge = export(&dense(), 1, Target::MegatronBridge, &opts).unwrap();
    // Every CommOverlapConfig field: a ++ dict merges into a recipe's section.
    assert!(
        bridge.contains("'++comm_overlap={_target_:megatron.bridge.training.comm_overlap.CommOverlapConfig,tp_comm_overlap:true,tp_comm_overlap_cfg:null,tp_comm_bootstrap_backend:nccl,overlap_p2p_comm:null,batch_p2p_comm:null,overlap_grad_reduce:true,overlap_param_gather:true,overlap_param_gather_with_optimizer_step:false,align_param_gather:null,bucket_size:40000000,defer_embedding_wgrad_compute:false,wgrad_deferral_limit:null,data_parallel_size:null,overlap_moe_expert_parallel_comm:false,delay_wgrad_compute:false}'\n"),
        "{bridge}"
    );
    assert!(!bridge.contains("\ncomm_overlap."), "{bridge}");
    // The mixed-precision config whole, BF16 weights (no FP8 parameter gather).
    assert!(
        bridge.contains("'++mixed_precision={_target_:megatron.bridge.training.mixed_precision.MixedPrecisionConfig,fp32:false,fp16:false,bf16:true,params_dtype:{_target_:torch.bfloat16,_call_:false},")
            && bridge.contains(",grad_reduce_in_fp32:true,fp8:null,"),
        "{bridge}"
    );
    let mut c = cfg(2, 1, 1, 1, 32);
    c.zero = Zero::Zero3;
    let fsdp = plan("llama3-8b", 64, 4096, 64, Precision::Bf16, c);
    let text = export(&fsdp, 1, Target::MegatronBridge, &opts).unwrap();
    assert!(
        text.contains("checkpoint.ckpt_format=fsdp_dtensor\n"),
        "{text}"
    );
    let mut c = cfg(2, 1, 1, 1, 32);
    c.zero = Zero::None;
    let plain = plan("llama3-8b", 64, 4096, 64, Precision::Bf16, c);
    let text = export(&plain, 1, Target::MegatronBridge, &opts).unwrap();
    for line in [
        "ddp.use_distributed_optimizer=false\n",
        "optimizer.use_distributed_optimizer=false\n",
        "ddp.overlap_param_gather=false\n",
        "overlap_param_gather:false,",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    let mut c = cfg(2, 1, 1, 1, 32);
    c.recompute = Recompute::Selective;
    c.recompute_modules = sextant_planner::config::RecomputeModules::LAYERNORM;
    let fp8 = plan("llama3-8b", 64, 4096, 64, Precision::Fp8, c);
    let text = export(&fp8, 1, Target::MegatronBridge, &opts).unwrap();
    assert!(
        text.contains(",fp8:hybrid,fp8_recipe:tensorwise,first_last_layers_bf16:false,")
            && text.contains(",fp8_param:false,fp8_param_gather:false,"),
        "{text}"
    );
    assert!(export(&fp8, 1, Target::MegatronLm, &opts)
        .unwrap()
        .contains("--fp8-recipe tensorwise"));
    let nemo = export(&fp8, 1, Target::Nemo, &opts).unwrap();
    assert!(
        nemo.contains("recipe.trainer.plugins = bf16_with_fp8_current_scaling_mixed()\n")
            && nemo.contains("recipe.trainer.plugins.fp8_recipe = \"tensorwise\"\n")
            && nemo.contains("recipe.trainer.plugins.fp8_amax_history_len = 1\n")
            && nemo.contains("recipe.trainer.plugins.fp8_param_gather = False\n")
            && nemo.contains("recipe.trainer.plugins.first_last_layers_bf16 = False\n"),
        "{nemo}"
    );
    // NeMo: a recipe's own overlap and DeepEP callbacks give way to the plan's
    // (a second TP-overlap callback would initialise userbuffers twice; the
    // callbacks turn data-parallel overlap on and pick 128 Mi buckets), the
    // strategy's layout string is cleared, and DeepSeek's shared-expert overlap
    // (NeMo's default) is off as priced.
    let mut c = cfg(2, 2, 1, 1, 4);
    c.ep = 4;
    c.overlap.grad_reduce = false;
    let moe_nemo = export(
        &plan("qwen3-30b-a3b", 16, 4096, 64, Precision::Bf16, c),
        1,
        Target::Nemo,
        &opts,
    )
    .unwrap();
    for line in [
        "recipe.trainer.callbacks = [c for c in (recipe.trainer.callbacks or []) if getattr(c, \"__fn_or_cls__\", None) is not MegatronCommOverlapCallback]\n",
        "recipe.trainer.callbacks.append(run.Config(MegatronCommOverlapCallback, tp_comm_overlap=False, overlap_grad_reduce=False, overlap_param_gather=True, bucket_size=40000000))\n",
        "is not DeepEPCallback]\n",
        "recipe.trainer.strategy.pipeline_model_parallel_layout = None\n",
        "recipe.model.config.moe_shared_expert_overlap = False\n",
    ] {
        assert!(moe_nemo.contains(line), "{line}: {moe_nemo}");
    }
}

/// A plan is exported only to a framework it was priced for: a torchtitan plan
/// (FSDP2's memory, op-level recomputation) is not a Megatron-LM plan and the
/// other way round; the target's own reasons come first. torchtitan's batch is
/// the plan's micro-batch without a pipeline (it accumulates global / (local x
/// DP)), its ZeRO-3 reshards after forward even beside a pipeline, and its model
/// is named.
#[test]
fn exports_go_only_to_the_framework_the_plan_was_priced_for() {
    let dir = TempDir::new("framework-mismatch");
    let titan = saved(
        &dir,
        "titan.json",
        &words("plan --model llama3-8b --gpus 16 --target torchtitan --pp 1"),
    );
    let t = titan.to_str().unwrap();
    fails_with_one_line(
        &["export", t, "--to", "megatron-lm"],
        "the plan was priced for torchtitan (its memory layout, recomputation and pipeline), not for Megatron-Core; plan again with --target megatron-lm",
    );
    let toml = crate::common::stdout(&sextant(&["export", t, "--to", "torchtitan"]));
    let plan = PlanFile::from_json(&std::fs::read_to_string(&titan).unwrap()).unwrap();
    let c = &plan.plans[0].config;
    assert_eq!(c.pp, 1);
    assert!(
        toml.contains(&format!("local_batch_size = {}\n", c.mbs))
            && toml.contains(&format!(
                "global_batch_size = {}\n",
                plan.workload.global_batch
            )),
        "{toml}"
    );
    assert!(
        toml.contains("[model]\nname = \"llama3\"\nflavor = \"8B\"\n"),
        "{toml}"
    );
    // A model named like the preset but of another shape gets no flavor: 8B's
    // would train 32 layers where the plan priced 48.
    let deeper = dir.path("llama3-8b.json");
    std::fs::write(
        &deeper,
        r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}"#,
    )
    .unwrap();
    let d = saved(
        &dir,
        "deeper.json",
        &[
            "plan",
            "--model",
            deeper.to_str().unwrap(),
            "--gpus",
            "16",
            "--target",
            "torchtitan",
        ],
    );
    let toml = crate::common::stdout(&sextant(&[
        "export",
        d.to_str().unwrap(),
        "--to",
        "torchtitan",
    ]));
    assert!(!toml.contains("flavor = "), "{toml}");
    assert!(toml.contains("(48 layers, hidden 4096;"), "{toml}");
    // The MoE presets keep their flavors; DeepSeek-V3's once its MTP layer is
    // dropped, as the export asks (torchtitan's flavor has none).
    for (args, flavor) in [
        (
            "plan --model deepseek-v3 --gpus 256 --target torchtitan --mtp-layers 0 --top 1",
            "name = \"deepseek_v3\"\nflavor = \"671B\"\n",
        ),
        (
            "plan --model qwen3-30b-a3b --gpus 16 --target torchtitan --top 1",
            "name = \"qwen3\"\nflavor = \"30B-A3B\"\n",
        ),
    ] {
        let p = saved(&dir, "moe-flavor.json", &words(args));
        let toml = crate::common::stdout(&sextant(&[
            "export",
            p.to_str().unwrap(),
            "--to",
            "torchtitan",
        ]));
        assert!(toml.contains(flavor), "{args}: {toml}");
        std::fs::remove_file(&p).unwrap();
    }
    let mega = saved(
        &dir,
        "mega.json",
        &words(
            "estimate --model llama3-8b --gpus 16 --tp 2 --pp 2 --dp 4 --global-batch 64 --zero 3",
        ),
    );
    fails_with_one_line(
        &["export", mega.to_str().unwrap(), "--to", "torchtitan"],
        "the plan was priced for Megatron-Core (its memory layout, recomputation and pipeline), not for torchtitan; plan again with --target torchtitan",
    );
    let p = torchtitan_ready(&plan_with_pipeline());
    let toml = export(&p, 1, Target::Torchtitan, &LaunchOptions::default()).unwrap();
    assert!(
        toml.contains("fsdp_reshard_after_forward = \"always\"\n"),
        "{toml}"
    );
}

fn plan_with_pipeline() -> PlanFile {
    let mut c = cfg(2, 2, 1, 1, 4);
    c.zero = Zero::Zero3;
    plan("llama3-8b", 16, 4096, 64, Precision::Bf16, c)
}

/// ScaleTorch: its attention runs ring attention only where CONTEXT_PARALLEL=1 is
/// set before the model is built, that ring attention is unfused (a plan priced
/// with flash attention under CP is refused), and its pipeline engines do not
/// checkpoint.
#[test]
fn scaletorch_launch_sets_context_parallel_and_refuses_pipelined_recomputation() {
    let p = scaletorch_ready(&dense());
    assert!(p.plans[0].config.cp > 1);
    let text = export(&p, 1, Target::ScaleTorch, &LaunchOptions::default()).unwrap();
    assert!(text.contains("\nexport CONTEXT_PARALLEL=1\n"), "{text}");
    let mut flash = p.clone();
    flash.assumptions.flash_attention = true;
    let e = export(&flash, 1, Target::ScaleTorch, &LaunchOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("ring attention") && !e.contains('\n'), "{e}");
    // Its ring attention keeps q, k, v, the output and the log-sum-exp and
    // recomputes the scores in the backward: no score matrices held, as with flash.
    let mut flash = p.clone();
    flash.assumptions.flash_attention = true;
    let (ring, fl) = (
        p.plans[0].estimate.memory.activations,
        reprice(&flash).plans[0].estimate.memory.activations,
    );
    assert!((ring - fl).abs() <= 1e-9 * fl, "{ring} vs {fl}");
    let mut full = p.clone();
    full.plans[0].config.recompute = Recompute::Full;
    let e = export(&full, 1, Target::ScaleTorch, &LaunchOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("full recomputation with pipeline parallelism") && !e.contains('\n'),
        "{e}"
    );
}

/// A plan file that pairs MXFP8 with a GPU without it (hand-edited, or an H100
/// plan's precision changed) is refused by every training export in one line:
/// Transformer Engine refuses the recipe at start-up. The rank maps, which
/// launch nothing, still render.
#[test]
fn mxfp8_on_a_gpu_without_it_is_refused() {
    let opts = LaunchOptions::default();
    let mut p = dense();
    assert!(!p.hardware.gpu.mxfp8, "the H100 profile has no MXFP8");
    p.workload.precision = Precision::Mxfp8;
    for target in [
        Target::MegatronLm,
        Target::MegatronCore,
        Target::MegatronBridge,
        Target::Torchrun,
        Target::Slurm,
    ] {
        let e = export(&p, 1, target, &opts).unwrap_err().to_string();
        assert!(
            e.contains("no block-scaled FP8") && !e.contains('\n'),
            "{target:?}: {e}"
        );
    }
    assert!(export(&p, 1, Target::RankMap, &opts).is_ok());
    // On Blackwell the same plan exports its recipe.
    p.hardware = sextant_planner::hardware::builtin_profile("b200").unwrap();
    assert!(export(&p, 1, Target::MegatronLm, &opts)
        .unwrap()
        .contains("--fp8-recipe mxfp8"));
    // A B200 plan file written before the flag existed has no `mxfp8` key: read
    // by its built-in profile's name, it still exports.
    p.hardware.gpu.mxfp8 = false;
    assert!(export(&p, 1, Target::MegatronLm, &opts).is_ok());
    p.hardware.name = "my-b200".into();
    let e = export(&p, 1, Target::MegatronLm, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sets gpu.mxfp8: true"), "{e}");
}

/// A GB200 plan beyond one rack is priced with the job in equal segments of whole
/// trays (64 GPUs for 512): the Slurm script asks for them (`--segment`), and a plan
/// file written with the whole 72-GPU domain asks for the same valid segment; a
/// plan on one-node domains asks for none.
#[test]
fn slurm_scripts_request_the_priced_segments() {
    let opts = LaunchOptions::default();
    let segment = |p: &PlanFile| {
        export(p, 1, Target::Slurm, &opts)
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("#SBATCH --segment=").map(str::to_string))
    };
    let mut c = cfg(8, 1, 1, 1, 64);
    c.sp = true;
    let mut p = priced_on(
        "gb200",
        "llama3-70b",
        512,
        Workload {
            seq: 4096,
            global_batch: 512,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        },
        c,
        Assumptions::default(),
    );
    assert_eq!(p.hardware.node.nvlink_domain, 64);
    assert_eq!(segment(&p).as_deref(), Some("16"));
    p.hardware.node.nvlink_domain = 72;
    assert_eq!(segment(&p).as_deref(), Some("16"));
    assert_eq!(segment(&dense()), None);
}

/// A rank map is written for up to 2^20 ranks: past that it is gigabytes of text
/// (and twice that in memory), refused in one line before it is built.
#[test]
fn a_rank_map_past_a_million_ranks_is_refused() {
    let dir = crate::common::TempDir::new("rankmap-huge");
    let p = saved(
        &dir,
        "huge.json",
        &words("plan --model 8b --gpus 2097152 --global-batch 8388608 --top 1"),
    );
    for target in ["rank-map", "rank-map-json"] {
        fails_with_one_line(
            &["export", p.to_str().unwrap(), "--to", target],
            "a rank map of 2097152 ranks would be gigabytes of text",
        );
        // The refusal names the form asked for.
        let err = stderr(&sextant(&["export", p.to_str().unwrap(), "--to", target]));
        assert!(err.contains(&format!("{target}:")), "{target}: {err}");
        if target == "rank-map" {
            assert!(!err.contains("rank-map-json"), "{err}");
        }
    }
}
