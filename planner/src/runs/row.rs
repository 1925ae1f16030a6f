//! One CSV row to a [`RunCase`], by the mapping rules of the module notes.

use crate::config::{
    Dispatcher, Layout, Overlap, ParallelConfig, Precision, Recompute, RecomputeModules, Workload,
    Zero,
};
use crate::cost::{Assumptions, CudaGraphs, EagerOps, Framework, LossKernel};
use crate::hardware::{builtin_profile, Cluster};
use crate::memory::MemKind;
use crate::model::{MlpKind, ModelSpec, Moe, Norm};
use crate::presets::{gpt, resolve};
use crate::schedule::Schedule;

use super::{get, MeasuredMemory, MemStage, Metric, Row, RowError, RunCase};

fn num(r: &Row, k: &str) -> Result<Option<u64>, RowError> {
    let s = get(r, k);
    if s.is_empty() {
        return Ok(None);
    }
    s.parse::<u64>()
        .map(Some)
        .map_err(|_| RowError::cell(k, s, "a whole number"))
}

/// A positive finite number, or nothing when the cell is blank.
fn positive(r: &Row, k: &str) -> Result<Option<f64>, RowError> {
    let s = get(r, k);
    if s.is_empty() {
        return Ok(None);
    }
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
        _ => Err(RowError::cell(k, s, "a positive number")),
    }
}

/// The measured peak memory of a row, when it states one.
fn measured_memory(r: &Row) -> Result<Option<MeasuredMemory>, RowError> {
    let gib = positive(r, "measured_mem_gib")?;
    let kind = get(r, "mem_kind");
    let stage = get(r, "mem_stage");
    let Some(gib) = gib else {
        if !kind.is_empty() || !stage.is_empty() {
            return Err(RowError::MemoryUnmeasured);
        }
        return Ok(None);
    };
    if gib > 1e6 {
        return Err(RowError::MemoryTooLarge(gib));
    }
    let kind = MemKind::parse(kind).ok_or_else(|| {
        RowError::cell(
            "mem_kind",
            kind,
            format!("{} (what the source's number counts)", MemKind::NAMES),
        )
    })?;
    let stage = match stage {
        "" | "max" => MemStage::Max,
        s => MemStage::Stage(
            s.parse::<u64>()
                .map_err(|_| RowError::cell("mem_stage", s, "max or a pipeline stage number"))?,
        ),
    };
    Ok(Some(MeasuredMemory { gib, kind, stage }))
}

fn req(r: &Row, k: &str) -> Result<u64, RowError> {
    num(r, k)?.ok_or_else(|| RowError::Empty(k.to_string()))
}

/// Hardware name in the CSV -> built-in profile.
fn profile_for(gpu: &str) -> Result<crate::hardware::HardwareProfile, RowError> {
    let key = match gpu {
        "a100-80g" | "a100-80g-sxm" => "a100-80g",
        "h100-sxm" | "h100" => "h100-sxm",
        "h200-sxm" | "h200" => "h200-sxm",
        "gb200" => "gb200-nvl72",
        other => other,
    };
    builtin_profile(key).map_err(RowError::Input)
}

/// A true/false column, or nothing when blank.
fn flag(r: &Row, k: &str) -> Result<Option<bool>, RowError> {
    match get(r, k) {
        "" => Ok(None),
        "true" => Ok(Some(true)),
        "false" => Ok(Some(false)),
        other => Err(RowError::cell(k, other, "true or false")),
    }
}

/// The MLP type from the `gated` and `activation` columns (which must agree when
/// both are given), or nothing when both are blank.
fn mlp_kind(r: &Row) -> Result<Option<MlpKind>, RowError> {
    let from_activation = match get(r, "activation") {
        "" => None,
        "swiglu" | "geglu" | "reglu" => Some(MlpKind::Gated),
        "gelu" | "relu" | "squared_relu" => Some(MlpKind::Plain),
        other => {
            return Err(RowError::cell(
                "activation",
                other,
                "swiglu, geglu, reglu (gated MLPs) or gelu, relu, squared_relu (plain)",
            ))
        }
    };
    let from_gated = flag(r, "gated")?.map(|g| if g { MlpKind::Gated } else { MlpKind::Plain });
    match (from_gated, from_activation) {
        (Some(g), Some(a)) if g != a => Err(RowError::GatedDisagrees {
            gated: get(r, "gated").to_string(),
            activation: get(r, "activation").to_string(),
            kind: a,
        }),
        (g, a) => Ok(g.or(a)),
    }
}

/// The shape columns a row needs when its model is not a built-in preset (nor a
/// `gpt*` shape), beyond the always required layers, hidden and heads.
pub const SHAPE_COLUMNS: [&str; 5] = [
    "ffn_hidden",
    "kv_heads",
    "vocab",
    "gated",
    "tied_embeddings",
];

/// A model built from the row's columns alone: no preset supplies what they leave
/// out, so every column that changes the cost must be stated (`gated` may be
/// given as `activation`); `norm`, `bias` and `dropout` default to Llama's
/// (RMSNorm, no biases, no dropout).
fn shape_model(
    r: &Row,
    name: &str,
    layers: u64,
    hidden: u64,
    heads: u64,
) -> Result<ModelSpec, RowError> {
    let missing = |col: &str| RowError::ShapeColumn {
        model: name.to_string(),
        column: col.to_string(),
    };
    for col in SHAPE_COLUMNS {
        let blank = match col {
            "gated" => get(r, "gated").is_empty() && get(r, "activation").is_empty(),
            c => get(r, c).is_empty(),
        };
        if blank {
            return Err(missing(col));
        }
    }
    if !hidden.is_multiple_of(heads) {
        return Err(RowError::HeadsDivide { heads, hidden });
    }
    Ok(ModelSpec {
        schema_version: crate::model::MODEL_SCHEMA_VERSION,
        name: name.to_string(),
        source: "the run's shape columns".into(),
        layers,
        hidden,
        ffn_hidden: req(r, "ffn_hidden")?,
        heads,
        kv_heads: req(r, "kv_heads")?,
        head_dim: hidden / heads,
        vocab: req(r, "vocab")?,
        tied_embeddings: false,
        mlp: MlpKind::Gated,
        dropout: false,
        bias: false,
        qkv_bias: false,
        norm: Some(Norm::RmsNorm),
        mla: None,
        moe: None,
        sliding_window: None,
        sandwich_norms: false,
        glu_clamp: None,
        attention_sinks: false,
        qk_norm: false,
        yarn_attention_factor: None,
        mtp_layers: 0,
        hf_model_type: None,
    })
}

fn model_for(r: &Row) -> Result<ModelSpec, RowError> {
    let name = get(r, "model");
    let layers = req(r, "layers")?;
    let hidden = req(r, "hidden")?;
    let heads = req(r, "heads")?;
    if heads == 0 {
        return Err(RowError::NoHeads);
    }
    let base = match resolve(name) {
        Ok(p) => p.spec,
        Err(_) if name.starts_with("gpt") => gpt(
            name,
            "GPT shape from the run's columns (Megatron GPT: GeLU 4h MLP, tied embeddings)",
            layers,
            hidden,
            heads,
        ),
        Err(_) => shape_model(r, name, layers, hidden, heads)?,
    };
    let mut m = base.clone();
    m.name = name.to_string();
    m.layers = layers;
    m.hidden = hidden;
    m.heads = heads;
    if let Some(f) = num(r, "ffn_hidden")? {
        m.ffn_hidden = f;
    }
    m.kv_heads = num(r, "kv_heads")?.unwrap_or(heads);
    if let Some(v) = num(r, "vocab")? {
        m.vocab = v;
    }
    // Keep the preset's head_dim when its shape matches; otherwise hidden / heads.
    if base.hidden != hidden || base.heads != heads {
        m.head_dim = hidden / heads;
    }
    // Architecture columns replace the preset's (a row may name a preset only as
    // the base of a model that differs from it).
    let mlp = mlp_kind(r)?;
    if let Some(kind) = mlp {
        m.mlp = kind;
    }
    if let Some(t) = flag(r, "tied_embeddings")? {
        m.tied_embeddings = t;
    }
    if let Some(b) = flag(r, "bias")? {
        m.bias = b;
    }
    if let Some(d) = flag(r, "dropout")? {
        m.dropout = d;
    }
    match get(r, "norm") {
        "" => {}
        "layernorm" => m.norm = Some(Norm::LayerNorm),
        "rmsnorm" => m.norm = Some(Norm::RmsNorm),
        other => return Err(RowError::cell("norm", other, "layernorm or rmsnorm")),
    }
    if let Some(experts) = num(r, "moe_experts")? {
        let prev = base.moe;
        m.moe = Some(Moe {
            experts,
            top_k: req(r, "moe_topk")?,
            expert_ffn_hidden: req(r, "moe_ffn_hidden")?,
            shared_experts: num(r, "moe_shared_experts")?.unwrap_or(0),
            shared_ffn_hidden: None,
            dense_leading_layers: prev.map(|p| p.dense_leading_layers).unwrap_or(0),
            layer_freq: prev.map(|p| p.layer_freq).unwrap_or(1),
            balancing: prev.map(|p| p.balancing).unwrap_or_default(),
        });
        if m.mlp != MlpKind::Gated && prev.is_none() && mlp.is_none() {
            m.mlp = MlpKind::Gated;
        }
    }
    m.validate().map_err(RowError::Input)?;
    Ok(m)
}

pub(super) fn case(r: &Row) -> Result<RunCase, RowError> {
    let id = get(r, "id").to_string();
    let gpu = get(r, "gpu").to_string();
    let cluster = cluster_for(r, &gpu)?;
    let mut model = model_for(r)?;
    if let Some(n) = num(r, "mtp_layers")? {
        model.mtp_layers = n;
        model
            .validate()
            .map_err(|e| RowError::column("mtp_layers", e))?;
    }
    let workload = workload_for(r)?;
    let zero = zero_for(r)?;
    let (recompute, recompute_stated, recompute_modules) = recompute_for(r)?;
    let bf16_moments = match get(r, "optimizer_moments") {
        "" => None,
        "bf16" => Some(true),
        "fp32" => Some(false),
        other => return Err(RowError::cell("optimizer_moments", other, "bf16 or fp32")),
    };
    let modern = zero != Zero::None;
    let ep: u64 = num(r, "ep")?.unwrap_or(1);
    // The attention kernel: stated by the row or its stack, else the stack's era
    // (fused flash attention on the Megatron-Core stack, unfused softmax on 2021-22's).
    let (flash_attention, loss, framework) = kernels_for(r, modern)?;
    // The era defaults are Megatron's; `scaling` runs FlashAttention or its own
    // unfused attention as installed, so its rows say which.
    if framework == Framework::Scaling && get(r, "attention").is_empty() {
        return Err(RowError::column(
            "attention",
            "a scaling row states its attention kernel (flash or unfused): scaling runs either, as installed",
        ));
    }
    if framework == Framework::Scaling {
        // Megatron's and Transformer Engine's switches, which scaling does not
        // have: a row that states one is refused rather than priced as Megatron.
        for (column, neutral) in [
            ("pp_layout", ""),
            ("mtp_layers", "0"),
            ("tp_comm_overlap", "false"),
            ("cuda_graphs", "none"),
            ("cross_entropy", ""),
        ] {
            let v = get(r, column);
            if !v.is_empty() && v != neutral {
                return Err(RowError::column(
                    column,
                    format!(
                        "framework scaling has no such switch (Megatron's): leave it blank{}",
                        if neutral.is_empty() {
                            String::new()
                        } else {
                            format!(" or {neutral}")
                        }
                    ),
                ));
            }
        }
    }
    // Megatron-Core MoE recipes overlap the EP all-to-all when it crosses the
    // NVLink domain (see the module notes); other frameworks only where the row
    // says so.
    let ep_comm = flag(r, "ep_comm_overlap")?.unwrap_or(
        modern
            && framework.is_megatron_core()
            && model.moe.is_some()
            && ep > cluster.profile.node.nvlink_domain,
    );
    // Megatron-Core recipes overlap TP communication, which Megatron allows only
    // with sequence parallelism. Other frameworks overlap it only where the row
    // says so (torchtitan's async TP is opt-in).
    let sp = flag(r, "sp")?.unwrap_or(false);
    let tp_comm =
        flag(r, "tp_comm_overlap")?.unwrap_or(modern && sp && framework.is_megatron_core());
    let cuda_graphs =
        CudaGraphs::parse(get(r, "cuda_graphs")).map_err(|e| RowError::column("cuda_graphs", e))?;
    let eager =
        EagerOps::parse(get(r, "eager_ops")).map_err(|e| RowError::column("eager_ops", e))?;
    let moe_dispatcher = match get(r, "dispatcher") {
        "" => Dispatcher::AllToAll,
        name => Dispatcher::parse(name)
            .ok_or_else(|| RowError::cell("dispatcher", name, Dispatcher::NAMES))?,
    };
    let tp = req(r, "tp")?;
    let pp = req(r, "pp")?;
    let vpp = num(r, "vpp")?.unwrap_or(1).max(1);
    let layout = layout_for(r, &model, pp, vpp)?;
    let config = ParallelConfig {
        tp,
        pp,
        vpp,
        cp: num(r, "cp")?.unwrap_or(1),
        ep,
        etp: 1,
        dp: req(r, "dp")?,
        sp,
        mbs: num(r, "mbs")?.unwrap_or(1),
        zero,
        recompute,
        layout,
        overlap: Overlap {
            grad_reduce: modern,
            param_gather: modern,
            tp_comm,
            p2p: true,
            ep_comm,
        },
        // Megatron-Core's recipes reduce BF16 gradients; nanotron accumulates FP32
        // ones (`accumulate_grad_in_fp32`, set by the Playbook's scaling script)
        // and torchtitan's FSDP2 reduces in FP32 (`mixed_precision_reduce`).
        bf16_grads: modern && framework == Framework::MegatronCore,
        bf16_moments: bf16_moments.unwrap_or(false),
        recompute_modules: recompute_modules.unwrap_or_default(),
        moe_dispatcher,
        // Every published row ran Megatron's schedule for its vpp.
        schedule: Schedule::default_for(vpp),
    };
    framework
        .check_config(&config)
        .map_err(|e| RowError::column("framework", e))?;
    let (metric, value) = metric_for(r)?;
    let moe = model.moe.is_some();
    let moments_stated = bf16_moments.is_some();
    let measured_memory = measured_memory(r)?;
    if let Some(MeasuredMemory {
        stage: MemStage::Stage(s),
        ..
    }) = measured_memory
    {
        if s >= config.pp {
            return Err(RowError::MemStageBeyond {
                stage: s,
                pp: config.pp,
            });
        }
    }
    Ok(RunCase {
        id,
        source: get(r, "source").to_string(),
        gpu,
        model,
        cluster,
        workload,
        config,
        metric,
        value,
        moe,
        assumptions: Assumptions {
            flash_attention,
            loss,
            framework,
            cuda_graphs,
            eager,
            ..Assumptions::default()
        },
        recompute_stated,
        moments_stated,
        measured_memory,
    })
}

/// The row's cluster: the built-in profile of its GPU with the run's node size and
/// HBM, and no planning headroom.
fn cluster_for(r: &Row, gpu: &str) -> Result<Cluster, RowError> {
    let mut profile = profile_for(gpu)?;
    let per_node = req(r, "gpus_per_node")?;
    if per_node != profile.node.gpus_per_node {
        // The node size is a property of the machine the run used.
        if profile.node.nvlink_domain == profile.node.gpus_per_node {
            profile.node.nvlink_domain = per_node;
        }
        profile.node.gpus_per_node = per_node;
        profile.validate().map_err(RowError::Input)?;
    }
    // The HBM of the GPUs the run used, when it differs from the profile's (a
    // part with more memory than the profile's model).
    if let Some(hbm) = positive(r, "hbm_gib")? {
        profile.gpu.hbm_gib = hbm;
        profile
            .validate()
            .map_err(|e| RowError::column("hbm_gib", e))?;
    }
    // The HBM bandwidth of the run's GPUs, when the part differs from the profile's
    // (the HBM2e H100s of Meta's Grand Teton hosts: 2.4 TB/s, not the SXM5's 3.35).
    if let Some(bw) = positive(r, "hbm_tbytes_per_s")? {
        profile.gpu.hbm_tbytes_per_s = bw;
        profile
            .validate()
            .map_err(|e| RowError::column("hbm_tbytes_per_s", e))?;
    }
    // The network of the run's cluster, per GPU, when it differs from the profile's
    // (the same GPUs and nodes with fewer or slower NICs).
    if let Some(nic) = positive(r, "nic_gbytes_per_s")? {
        profile.network.nic_gbytes_per_s = nic;
        profile
            .validate()
            .map_err(|e| RowError::column("nic_gbytes_per_s", e))?;
    }
    let gpus = req(r, "gpus")?;
    // The run was measured, so it fit: no planning headroom applies to it.
    profile.memory.headroom = 0.0;
    let mut cluster = Cluster::new(profile, gpus).map_err(RowError::Input)?;
    // A measured run whose TP group spans NVLink domains ran that way: price it so
    // (the planner only proposes it with --allow-tp-across-nodes).
    cluster.allow_tp_beyond_nvlink = req(r, "tp")? > cluster.profile.node.nvlink_domain;
    Ok(cluster)
}

/// The row's sequence, batch and precision; routing is balanced and dropless.
fn workload_for(r: &Row) -> Result<Workload, RowError> {
    let precision = match get(r, "precision") {
        "bf16" => Precision::Bf16,
        "fp16" | "mixed (fp16/bf16)" => Precision::Fp16,
        "fp8" => Precision::Fp8,
        "mxfp8" => Precision::Mxfp8,
        other => {
            return Err(RowError::not_one_of(
                "precision",
                other,
                "one of bf16, fp16, fp8, mxfp8",
            ))
        }
    };
    Ok(Workload {
        seq: req(r, "seq")?,
        global_batch: req(r, "gbs")?,
        precision,
        moe_imbalance: 1.0,
        moe_capacity: None,
    })
}

fn zero_for(r: &Row) -> Result<Zero, RowError> {
    Ok(match get(r, "zero") {
        "0" | "" => Zero::None,
        "1" | "distributed optimizer" => Zero::DistOpt,
        "2" => Zero::Zero2,
        "3" | "fsdp" => Zero::Zero3,
        other => {
            return Err(RowError::not_one_of(
                "zero",
                other,
                "one of 0, 1, 2, 3, distributed optimizer, fsdp",
            ))
        }
    })
}

/// The row's recomputation, whether the row (or its stack) states it, and its
/// modules when stated (which imply selective recomputation).
fn recompute_for(r: &Row) -> Result<(Recompute, bool, Option<RecomputeModules>), RowError> {
    let recompute_stated = !matches!(get(r, "recompute"), "" | "not stated");
    let recompute = match get(r, "recompute") {
        "" | "none" | "not stated" => Recompute::None,
        "selective" => Recompute::Selective,
        "full" => Recompute::Full,
        other => {
            return Err(RowError::not_one_of(
                "recompute",
                other,
                "one of none, selective, full",
            ))
        }
    };
    // Optional columns beyond the published schema (a `--stack` file supplies them
    // from each run's published configuration); blank: the rules of the module notes.
    let recompute_modules = match get(r, "recompute_modules") {
        "" => None,
        list => Some(
            crate::config::RecomputeModules::parse(list)
                .map_err(|e| RowError::column("recompute_modules", e))?,
        ),
    };
    if recompute_modules.is_some() && recompute_stated && recompute != Recompute::Selective {
        return Err(RowError::ModulesNeedSelective(
            get(r, "recompute").to_string(),
        ));
    }
    let (recompute, recompute_stated) = if recompute_modules.is_some() {
        (Recompute::Selective, true)
    } else {
        (recompute, recompute_stated)
    };
    Ok((recompute, recompute_stated, recompute_modules))
}

/// The attention kernel, the loss kernel and the framework: stated by the row or
/// its stack, else the stack's era (`modern`: the Megatron-Core stack).
fn kernels_for(r: &Row, modern: bool) -> Result<(bool, LossKernel, Framework), RowError> {
    let flash_attention = match get(r, "attention") {
        "" => modern,
        "flash" => true,
        "unfused" => false,
        other => return Err(RowError::cell("attention", other, "flash or unfused")),
    };
    let loss = match get(r, "cross_entropy") {
        "" => {
            if modern {
                LossKernel::Native
            } else {
                LossKernel::Unfused
            }
        }
        name => LossKernel::parse(name)
            .ok_or_else(|| RowError::cell("cross_entropy", name, LossKernel::NAMES))?,
    };
    let framework = match get(r, "framework") {
        "" => Framework::MegatronCore,
        name => Framework::parse(name)
            .ok_or_else(|| RowError::cell("framework", name, Framework::NAMES))?,
    };
    if loss == LossKernel::Compiled && framework != Framework::Torchtitan {
        return Err(RowError::cell(
            "cross_entropy",
            "compiled",
            "te, native or unfused: compiled is torchtitan's loss under torch.compile (framework torchtitan only)",
        ));
    }
    Ok((flash_attention, loss, framework))
}

/// The stage layout: the row's `pp_layout` (which must agree with its vpp and the
/// model's MTP layers), else balanced.
fn layout_for(r: &Row, model: &ModelSpec, pp: u64, vpp: u64) -> Result<Layout, RowError> {
    Ok(match get(r, "pp_layout") {
        "" => Layout::balanced(model.layers, pp, vpp),
        text => {
            let l =
                Layout::from_megatron(text, pp).map_err(|e| RowError::column("pp_layout", e))?;
            if l.vpp != vpp {
                return Err(RowError::LayoutVpp { layout: l.vpp, vpp });
            }
            if l.mtp_layers != model.mtp_layers {
                return Err(RowError::LayoutMtp {
                    layout: l.mtp_layers,
                    model: model.name.clone(),
                    mtp_layers: model.mtp_layers,
                });
            }
            l.layout
        }
    })
}

/// What the run measured and its value.
fn metric_for(r: &Row) -> Result<(Metric, f64), RowError> {
    let metric = match get(r, "metric") {
        "iter_s" => Metric::IterSecs,
        "tok_per_s_per_gpu" => Metric::TokensPerSecPerGpu,
        other => {
            return Err(RowError::not_one_of(
                "metric",
                other,
                "iter_s or tok_per_s_per_gpu",
            ))
        }
    };
    let value: f64 = get(r, "value")
        .parse()
        .map_err(|_| RowError::ValueNotANumber(crate::json::one_line(get(r, "value"), 60)))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(RowError::ValueNotPositive(value));
    }
    // A measurement of a training step: from 0.1 ms to a year per step, or from a
    // thousandth of a token to 100 million tokens per second per GPU.
    let (lo, hi) = match metric {
        Metric::IterSecs => (1e-4, 3.2e7),
        Metric::TokensPerSecPerGpu => (1e-3, 1e8),
    };
    if !(lo..=hi).contains(&value) {
        return Err(RowError::cell(
            "value",
            get(r, "value"),
            format!("a measured {} from {lo:e} to {hi:e}", get(r, "metric")),
        ));
    }
    Ok((metric, value))
}
