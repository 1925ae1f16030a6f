//! Published (or measured) training runs in the schema of
//! `tests/data/published_runs.csv` (a copy of shared/data/published_runs.csv), turned into estimator inputs.
//!
//! Each row names its model; a row's columns give the shapes, and the model's
//! published configuration (a built-in preset, when the name resolves) gives what
//! the columns leave out (gated MLP, head_dim, MLA, dense leading layers, tied
//! embeddings). Rows that cannot be represented come back as errors with the
//! reason, never dropped.
//!
//! Mapping rules that are not in the columns, applied to every row alike:
//! - blank micro-batch: 1; blank virtual stages: 1;
//! - blank or "not stated" recomputation: the least memory saving under which the
//!   configuration fits (none, Megatron's default selective set, the model's
//!   fine-grained modules, full; at each, FP32 then BF16 Adam moments). The run was
//!   measured, so it fit;
//! - stage layout: [`Layout::balanced`];
//! - multi-token prediction: the model's published configuration (DeepSeek-V3:
//!   one MTP layer, which Megatron-Bridge's recipe trains too);
//! - the `zero` column tells the software stack. `distributed optimizer` rows ran
//!   Megatron-Core (NeMo, Megatron-Bridge, Megatron-LM 2024+), whose performance
//!   recipes overlap gradient reduction, parameter gathering and TP communication,
//!   with fused (flash) attention and BF16 gradient reduction (NeMo launcher's
//!   `optim.grad_sync_dtype=bf16`, Megatron-Bridge `grad_reduce_in_fp32=False`). Plain data parallelism (`zero = 0`) is the
//!   2021-22 Megatron-LM stack of SC'21 and Korthikanti et al.: gradients reduced
//!   after the backward, no TP overlap, unfused softmax attention (FlashAttention
//!   appeared in May 2022 and reached Megatron-LM in 2023);
//! - MoE routing is balanced (imbalance 1.0), expert-TP is 1;
//! - MoE rows use Megatron's alltoall dispatcher, the `moe_token_dispatcher_type`
//!   the Megatron-Bridge recipes set before a performance config names a flex
//!   backend (DeepEP / HybridEP);
//! - MoE rows on the Megatron-Core stack whose expert-parallel group spans more than one NVLink
//!   domain overlap the all-to-all with compute (`overlap_moe_expert_parallel_comm`
//!   with `delay_wgrad_compute`). The Megatron-Bridge performance configurations of
//!   the data set's date (scripts/performance/configs/*/*_workload_base_configs.py,
//!   April 2026) set `moe_a2a_overlap` exactly there: on for DeepSeek-V3 MXFP8 on
//!   256 B200 (EP 32 over 8-GPU nodes) and Qwen3-235B on 256 H100 (EP 32); off for
//!   DeepSeek-V3 on GB200 (EP 64 inside the 72-GPU rack) and GPT-OSS-120B on H100
//!   (EP 8 in a node);
//! - Attention: a blank `attention` column is fused flash attention on the
//!   Megatron-Core stack and unfused softmax on the 2021-22 stack; a row or its stack
//!   may state `flash` or `unfused` (other frameworks' rows must: their era is not
//!   their ZeRO stage);
//! - Cross-entropy: a blank `cross_entropy` is Megatron's fused loss (`native`) on the
//!   Megatron-Core stack and `unfused` on the 2021-22 stack, which had no other.
//!   Megatron-LM's `--cross-entropy-loss-fusion` is off by default and Bridge's
//!   performance scripts pick TE's kernel, so tests/data/published_runs_stack.csv
//!   states it for every Megatron-Core row from its recipe.
//!
//! - CUDA graphs: none unless a row or its stack states Megatron's scopes in
//!   `cuda_graphs` (`attn moe_router moe_preprocess`, or `full_iteration`).
//!
//! Optional columns (`recompute_modules`, `optimizer_moments`, `dispatcher`,
//! `ep_comm_overlap`, `tp_comm_overlap`, `pp_layout` in Megatron's layout syntax,
//! `mtp_layers`, `cross_entropy`, `cuda_graphs`), in the CSV or from a stack file
//! ([`parse_runs_with`]), replace these rules for the rows that state them.

use serde::Serialize;

use crate::config::{
    Dispatcher, Layout, Overlap, ParallelConfig, Precision, Recompute, RecomputeModules, Workload,
    Zero,
};
use crate::cost::{Assumptions, CudaGraphs, Framework, LossKernel};
use crate::hardware::{builtin_profile, Cluster};
use crate::memory::MemKind;
use crate::model::{MlpKind, ModelSpec, Moe, Norm};
use crate::presets::{gpt, resolve};
use crate::schedule::Schedule;
use crate::InputError;

/// What a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    IterSecs,
    TokensPerSecPerGpu,
}

/// One row ready to estimate.
#[derive(Debug, Clone)]
pub struct RunCase {
    pub id: String,
    pub source: String,
    pub gpu: String,
    pub model: ModelSpec,
    pub cluster: Cluster,
    pub workload: Workload,
    pub config: ParallelConfig,
    pub metric: Metric,
    pub value: f64,
    pub moe: bool,
    /// Software assumptions implied by the row's stack.
    pub assumptions: Assumptions,
    /// Whether the row states its recomputation (otherwise [`RunCase::estimate`]
    /// picks the least that fits).
    pub recompute_stated: bool,
    /// Whether the row states the optimizer's moment precision (otherwise FP32,
    /// or BF16 where only that fits).
    pub moments_stated: bool,
    /// The peak memory the source states for the run, if it does.
    pub measured_memory: Option<MeasuredMemory>,
}

/// A peak memory a source states for a run (columns `measured_mem_gib`,
/// `mem_kind` and `mem_stage`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MeasuredMemory {
    pub gib: f64,
    /// What the number counts ([`MemKind::comparable_bytes`] says which of the
    /// model's components that is).
    pub kind: MemKind,
    /// Whose memory: the maximum over every GPU, or one pipeline stage's (a
    /// source that logs rank 0 only reports the first stage).
    pub stage: MemStage,
}

/// Which GPUs a measured peak describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemStage {
    /// The largest over all GPUs (the model's worst stage).
    Max,
    /// The GPUs of one pipeline stage.
    Stage(u64),
}

impl RunCase {
    /// Estimates the row with its exact configuration and stack.
    pub fn estimate(&self) -> Result<crate::cost::Estimate, crate::config::Rejection> {
        self.estimate_config().map(|(_, e)| e)
    }

    /// [`RunCase::estimate`], with the configuration it settled on (the row's, with
    /// the recomputation chosen when the row does not state it).
    pub fn estimate_config(
        &self,
    ) -> Result<(ParallelConfig, crate::cost::Estimate), crate::config::Rejection> {
        // The same model the search ranks with: closed form, then the pipeline
        // re-scored by the schedule simulator.
        let run = |cfg: &ParallelConfig| {
            crate::cost::estimate_with(
                &self.model,
                &self.cluster,
                &self.workload,
                cfg,
                self.assumptions,
            )
            .map(|mut e| {
                crate::cost::apply_simulation(&mut e, cfg);
                e
            })
        };
        // The run was measured, so it fit: what the row leaves out is the least
        // memory saving under which it fits, recomputation first (none, Megatron's
        // default selective set, the model's fine-grained set, full), then BF16
        // Adam moments at each level (they cost no time).
        let mut last = None;
        for cfg in self.attempts() {
            match run(&cfg) {
                Ok(e) => return Ok((cfg, e)),
                Err(r @ crate::config::Rejection::OutOfMemory { .. }) => last = Some(r),
                Err(r) => return Err(r),
            }
        }
        Err(last.expect("at least one attempt made"))
    }

    /// The configurations [`RunCase::estimate_config`] tries, in order: the row's
    /// own, with what it leaves out (recomputation, then the optimizer moments'
    /// precision) from the least memory saving to the most.
    fn attempts(&self) -> Vec<ParallelConfig> {
        let recomputes: Vec<(Recompute, RecomputeModules)> = if self.recompute_stated {
            vec![(self.config.recompute, self.config.recompute_modules)]
        } else {
            let fine =
                crate::search::fine_grained_modules(&self.model, self.assumptions.flash_attention);
            vec![
                (Recompute::None, RecomputeModules::DEFAULT),
                (Recompute::Selective, RecomputeModules::DEFAULT),
                (Recompute::Selective, fine),
                (Recompute::Full, RecomputeModules::DEFAULT),
            ]
        };
        let moments: &[bool] = if self.moments_stated {
            &[self.config.bf16_moments]
        } else {
            &[false, true]
        };
        let mut out = Vec::new();
        for &(recompute, recompute_modules) in &recomputes {
            for &bf16_moments in moments {
                out.push(ParallelConfig {
                    recompute,
                    recompute_modules,
                    bf16_moments,
                    ..self.config.clone()
                });
            }
        }
        out
    }

    /// The predicted memory of the configuration the row ran, fitting or not: the
    /// configuration [`RunCase::estimate_config`] settles on, or, when none fits
    /// the profile's HBM, the most memory-saving one it tried (the prediction is
    /// then above HBM, which is what a memory check wants to see).
    pub fn memory_estimate(
        &self,
    ) -> Result<(ParallelConfig, crate::cost::Estimate), crate::config::Rejection> {
        match self.estimate_config() {
            Err(crate::config::Rejection::OutOfMemory { .. }) => {
                let cfg = self.attempts().pop().expect("at least one attempt is made");
                crate::cost::evaluate(
                    &self.model,
                    &self.cluster,
                    &self.workload,
                    &cfg,
                    self.assumptions,
                )
                .map(|e| (cfg, e))
            }
            other => other,
        }
    }

    /// The measured step time, seconds (converted from tokens/s/GPU when needed).
    pub fn measured_step_secs(&self) -> f64 {
        match self.metric {
            Metric::IterSecs => self.value,
            Metric::TokensPerSecPerGpu => {
                (self.workload.global_batch * self.workload.seq) as f64
                    / (self.value * self.cluster.gpus as f64)
            }
        }
    }
}

/// A row that could not be turned into a case, with the reason.
#[derive(Debug, Clone, Serialize)]
pub struct Unrepresentable {
    pub id: String,
    pub reason: String,
}

/// Why a row cannot be turned into a case; [`Unrepresentable::reason`] is its
/// message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RowError {
    /// A cell that does not read as its column's kind of value.
    #[error("column '{column}' is '{value}', expected {expected}")]
    Cell {
        column: String,
        value: String,
        expected: String,
    },
    /// A value outside a short list (`allowed` says which, "one of ..." or "a or b").
    #[error("{what} '{value}' is not {allowed}")]
    NotOneOf {
        what: &'static str,
        value: String,
        allowed: &'static str,
    },
    #[error("column '{0}' is empty")]
    Empty(String),
    /// A column whose value the planner refuses, with the planner's reason.
    #[error("column '{column}': {reason}")]
    Column {
        column: &'static str,
        reason: String,
    },
    /// The row's hardware, model or cluster, refused by the planner.
    #[error("{0}")]
    Input(InputError),
    #[error("columns 'mem_kind' and 'mem_stage' describe 'measured_mem_gib', which is empty")]
    MemoryUnmeasured,
    #[error("column 'measured_mem_gib' is {0}, more than any GPU holds (at most 1000000 GiB)")]
    MemoryTooLarge(f64),
    #[error(
        "column 'mem_stage' is {stage}, but the run has {pp} pipeline stages (numbered from 0)"
    )]
    MemStageBeyond { stage: u64, pp: u64 },
    /// `kind`: what the activation makes the MLP.
    #[error("column 'gated' is '{gated}' but activation '{activation}' is {}", if *.kind == MlpKind::Gated { "a gated MLP" } else { "a plain MLP" })]
    GatedDisagrees {
        gated: String,
        activation: String,
        kind: MlpKind,
    },
    #[error("model '{model}' is not a built-in preset (see `sextant models`), so its shape comes from the columns, and column '{column}' is empty")]
    ShapeColumn { model: String, column: String },
    #[error("column 'heads': {heads} heads do not divide hidden {hidden}, so the head width is not whole")]
    HeadsDivide { heads: u64, hidden: u64 },
    #[error("column 'heads' is 0; a model needs at least one attention head")]
    NoHeads,
    /// The row's `recompute`, which is not selective.
    #[error("column 'recompute_modules' needs recompute 'selective' (the row says '{0}')")]
    ModulesNeedSelective(String),
    #[error("column 'pp_layout' has {layout} virtual stages per rank, but vpp is {vpp}")]
    LayoutVpp { layout: u64, vpp: u64 },
    #[error("column 'pp_layout' places {layout} MTP layers; {model} has {mtp_layers} (state mtp_layers)")]
    LayoutMtp {
        layout: u64,
        model: String,
        mtp_layers: u64,
    },
    #[error("value '{0}' is not a number")]
    ValueNotANumber(String),
    #[error("value {0} must be positive")]
    ValueNotPositive(f64),
}

impl RowError {
    fn cell(column: &str, value: &str, expected: impl ToString) -> RowError {
        RowError::Cell {
            column: column.to_string(),
            value: value.to_string(),
            expected: expected.to_string(),
        }
    }

    fn not_one_of(what: &'static str, value: &str, allowed: &'static str) -> RowError {
        RowError::NotOneOf {
            what,
            value: value.to_string(),
            allowed,
        }
    }

    fn column(column: &'static str, reason: impl ToString) -> RowError {
        RowError::Column {
            column,
            reason: reason.to_string(),
        }
    }
}

/// A CSV text that cannot be read as rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsvError {
    #[error("CSV header: {0}")]
    Header(String),
    #[error("CSV has more than {MAX_ROWS} rows; split it into files of at most {MAX_ROWS}")]
    TooManyRows,
    /// `line`: the row's line in the file (the header is line 1).
    #[error("CSV row {line}: {error}")]
    Row { line: usize, error: String },
}

/// Why a runs CSV (with its stack file) cannot be read at all ([`parse_runs_with`]);
/// a row that cannot be represented is an [`Unrepresentable`] instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunsError {
    #[error("{0}")]
    Csv(CsvError),
    #[error("CSV has no '{0}' column (expected the published_runs.csv schema)")]
    MissingColumn(&'static str),
    #[error("stack file: {0}")]
    StackCsv(CsvError),
    #[error("stack file has no 'id' column")]
    StackNoId,
    #[error("stack file column '{0}' is not one of id, source, {columns}", columns = STACK_COLUMNS.join(", "))]
    StackColumn(String),
    #[error("stack file row '{0}' names no run in the runs CSV")]
    StackRow(String),
    #[error("stack file says {column} = '{stack}' for run '{id}', but the runs CSV says '{runs}'")]
    StackContradicts {
        column: &'static str,
        stack: String,
        id: String,
        runs: String,
    },
}

type Row = std::collections::HashMap<String, String>;

fn get<'a>(r: &'a Row, k: &str) -> &'a str {
    r.get(k).map(|s| s.trim()).unwrap_or("")
}

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
        mtp_layers: 0,
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

fn case(r: &Row) -> Result<RunCase, RowError> {
    let id = get(r, "id").to_string();
    let gpu = get(r, "gpu").to_string();
    let mut profile = profile_for(&gpu)?;
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
    let gpus = req(r, "gpus")?;
    // The run was measured, so it fit: no planning headroom applies to it.
    profile.memory.headroom = 0.0;
    let mut cluster = Cluster::new(profile, gpus).map_err(RowError::Input)?;
    // A measured run whose TP group spans NVLink domains ran that way: price it so
    // (the planner only proposes it with --allow-tp-across-nodes).
    cluster.allow_tp_beyond_nvlink = req(r, "tp")? > cluster.profile.node.nvlink_domain;
    let mut model = model_for(r)?;
    if let Some(n) = num(r, "mtp_layers")? {
        model.mtp_layers = n;
        model
            .validate()
            .map_err(|e| RowError::column("mtp_layers", e))?;
    }
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
    let workload = Workload {
        seq: req(r, "seq")?,
        global_batch: req(r, "gbs")?,
        precision,
        moe_imbalance: 1.0,
        moe_capacity: None,
    };
    let zero = match get(r, "zero") {
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
    };
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
    let bf16_moments = match get(r, "optimizer_moments") {
        "" => None,
        "bf16" => Some(true),
        "fp32" => Some(false),
        other => return Err(RowError::cell("optimizer_moments", other, "bf16 or fp32")),
    };
    let modern = zero != Zero::None;
    let ep: u64 = num(r, "ep")?.unwrap_or(1);
    // Megatron-Core MoE recipes overlap the EP all-to-all when it crosses the
    // NVLink domain (see the module notes).
    let ep_comm = flag(r, "ep_comm_overlap")?
        .unwrap_or(modern && model.moe.is_some() && ep > cluster.profile.node.nvlink_domain);
    let tp_comm = flag(r, "tp_comm_overlap")?.unwrap_or(modern);
    // The attention kernel: stated by the row or its stack, else the stack's era
    // (fused flash attention on the Megatron-Core stack, unfused softmax on 2021-22's).
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
    let cuda_graphs =
        CudaGraphs::parse(get(r, "cuda_graphs")).map_err(|e| RowError::column("cuda_graphs", e))?;
    let moe_dispatcher = match get(r, "dispatcher") {
        "" => Dispatcher::AllToAll,
        name => Dispatcher::parse(name)
            .ok_or_else(|| RowError::cell("dispatcher", name, Dispatcher::NAMES))?,
    };
    let tp = req(r, "tp")?;
    let pp = req(r, "pp")?;
    let vpp = num(r, "vpp")?.unwrap_or(1).max(1);
    let layout = match get(r, "pp_layout") {
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
    };
    let config = ParallelConfig {
        tp,
        pp,
        vpp,
        cp: num(r, "cp")?.unwrap_or(1),
        ep,
        etp: 1,
        dp: req(r, "dp")?,
        sp: get(r, "sp") == "true",
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
        .map_err(|_| RowError::ValueNotANumber(get(r, "value").to_string()))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(RowError::ValueNotPositive(value));
    }
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
            ..Assumptions::default()
        },
        recompute_stated,
        moments_stated,
        measured_memory,
    })
}

/// Parses the CSV text. Each row becomes a case or an explanation.
pub fn parse_runs(csv_text: &str) -> Result<Vec<Result<RunCase, Unrepresentable>>, RunsError> {
    parse_runs_with(csv_text, None)
}

/// Optional columns a stack file may add to a run (see [`parse_runs_with`]).
pub const STACK_COLUMNS: [&str; 12] = [
    "framework",
    "recompute",
    "attention",
    "recompute_modules",
    "optimizer_moments",
    "dispatcher",
    "ep_comm_overlap",
    "tp_comm_overlap",
    "pp_layout",
    "mtp_layers",
    "cross_entropy",
    "cuda_graphs",
];

/// Most rows a runs or stack CSV may hold: the published runs are 39, and
/// `validate` estimates every row and compares each with all the others (2,000
/// rows took 4 s on a 2-core machine, 10,000 rows 35 s: time grows faster than the
/// rows).
pub const MAX_ROWS: usize = 2_000;

fn read_rows(csv_text: &str) -> Result<(Vec<String>, Vec<Row>), CsvError> {
    let mut rdr = csv::ReaderBuilder::new()
        .flexible(false)
        .from_reader(csv_text.as_bytes());
    let headers: Vec<String> = rdr
        .headers()
        .map_err(|e| CsvError::Header(e.to_string()))?
        .iter()
        .map(str::to_string)
        .collect();
    let mut rows = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        if i == MAX_ROWS {
            return Err(CsvError::TooManyRows);
        }
        let rec = rec.map_err(|e| CsvError::Row {
            line: i + 2,
            error: e.to_string(),
        })?;
        rows.push(
            headers
                .iter()
                .zip(rec.iter())
                .map(|(h, v)| (h.clone(), v.to_string()))
                .collect(),
        );
    }
    Ok((headers, rows))
}

/// Parses the runs CSV, completed by an optional stack CSV: an `id` column naming
/// runs, a `source` column saying where each value was read, and any of
/// [`STACK_COLUMNS`] — what the runs' own columns leave out of their software
/// configuration. A stack value fills a blank (or "not stated") run column and may
/// not contradict a stated one; a stack row naming no run is an error.
pub fn parse_runs_with(
    csv_text: &str,
    stack: Option<&str>,
) -> Result<Vec<Result<RunCase, Unrepresentable>>, RunsError> {
    let (headers, mut rows) = read_rows(csv_text).map_err(RunsError::Csv)?;
    for needed in [
        "id",
        "gpu",
        "gpus_per_node",
        "gpus",
        "model",
        "layers",
        "hidden",
        "heads",
        "seq",
        "tp",
        "pp",
        "dp",
        "gbs",
        "metric",
        "value",
    ] {
        if !headers.iter().any(|h| h == needed) {
            return Err(RunsError::MissingColumn(needed));
        }
    }
    if let Some(text) = stack {
        let (sh, srows) = read_rows(text).map_err(RunsError::StackCsv)?;
        if !sh.iter().any(|h| h == "id") {
            return Err(RunsError::StackNoId);
        }
        if let Some(bad) = sh.iter().find(|h| {
            !(h.as_str() == "id" || h.as_str() == "source" || STACK_COLUMNS.contains(&h.as_str()))
        }) {
            return Err(RunsError::StackColumn(bad.clone()));
        }
        for srow in &srows {
            let id = get(srow, "id");
            let Some(row) = rows.iter_mut().find(|r| get(r, "id") == id) else {
                return Err(RunsError::StackRow(id.to_string()));
            };
            for k in STACK_COLUMNS {
                let v = get(srow, k).to_string();
                if v.is_empty() {
                    continue;
                }
                match get(row, k) {
                    "" | "not stated" => {
                        row.insert(k.to_string(), v);
                    }
                    same if same == v => {}
                    other => {
                        return Err(RunsError::StackContradicts {
                            column: k,
                            stack: v,
                            id: id.to_string(),
                            runs: other.to_string(),
                        })
                    }
                }
            }
        }
    }
    Ok(rows
        .iter()
        .map(|row| {
            case(row).map_err(|reason| Unrepresentable {
                id: get(row, "id").to_string(),
                reason: reason.to_string(),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNS: &str = "id,source,gpu,gpus_per_node,gpus,model,layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq,moe_experts,moe_topk,moe_ffn_hidden,moe_shared_experts,tp,pp,vpp,cp,ep,sp,dp,mbs,gbs,recompute,zero,precision,metric,value,note\n\
r1,test,h100-sxm,8,64,qwen3-30b-a3b,48,2048,6144,32,4,151936,4096,128,8,768,0,1,1,1,1,8,false,64,1,512,not stated,distributed optimizer,bf16,iter_s,10,\n";

    /// A stack file fills what the row leaves out, refuses to contradict it, and
    /// names what it cannot match.
    #[test]
    fn stack_file_completes_rows_and_refuses_contradictions() {
        let plain = parse_runs(RUNS).unwrap().remove(0).unwrap();
        assert_eq!(plain.config.moe_dispatcher, Dispatcher::AllToAll);
        assert!(!plain.recompute_stated && !plain.moments_stated);
        let stack = "id,recompute_modules,optimizer_moments,dispatcher,ep_comm_overlap,tp_comm_overlap,source\nr1,\"layernorm,moe_act\",bf16,deepep,true,false,recipe\n";
        let c = parse_runs_with(RUNS, Some(stack))
            .unwrap()
            .remove(0)
            .unwrap();
        assert_eq!(
            (c.config.recompute, c.config.recompute_modules),
            (
                Recompute::Selective,
                RecomputeModules::parse("layernorm,moe_act").unwrap()
            )
        );
        assert!(c.config.bf16_moments && c.recompute_stated && c.moments_stated);
        assert_eq!(c.config.moe_dispatcher, Dispatcher::Deduplicated);
        assert!(c.config.overlap.ep_comm && !c.config.overlap.tp_comm);
        let e = c.estimate_config().unwrap();
        assert_eq!(e.0, c.config);
        let clash = RUNS.replace("not stated", "full");
        let err = parse_runs_with(&clash, Some("id,recompute\nr1,none\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("recompute = 'none' for run 'r1', but the runs CSV says 'full'"),
            "{err}"
        );
        assert!(parse_runs_with(RUNS, Some("id,dispatcher\nr9,deepep\n"))
            .unwrap_err()
            .to_string()
            .contains("'r9' names no run"));
        assert!(parse_runs_with(RUNS, Some("id,zero\nr1,3\n"))
            .unwrap_err()
            .to_string()
            .contains("column 'zero' is not one of"));
        let bad = parse_runs_with(RUNS, Some("id,dispatcher\nr1,nccl\n"))
            .unwrap()
            .remove(0)
            .unwrap_err();
        assert!(
            bad.reason.contains("column 'dispatcher' is 'nccl'"),
            "{}",
            bad.reason
        );
        // Cross-entropy fusion: on for the Megatron-Core stack unless the stack file
        // says otherwise, off for the 2021-22 stack (plain data parallelism).
        assert_eq!(plain.assumptions.loss, LossKernel::Native);
        let te = parse_runs_with(RUNS, Some("id,cross_entropy\nr1,te\n"))
            .unwrap()
            .remove(0)
            .unwrap();
        assert!(te.assumptions.loss == LossKernel::Te && te.assumptions.flash_attention);
        let old_stack = parse_runs(&RUNS.replace("distributed optimizer", "0"))
            .unwrap()
            .remove(0)
            .unwrap();
        assert!(
            old_stack.assumptions.loss == LossKernel::Unfused
                && !old_stack.assumptions.flash_attention
        );
        // CUDA graphs: none unless stated; a scope Megatron does not have is refused.
        assert!(plain.assumptions.cuda_graphs.is_none());
        let graphed = parse_runs_with(RUNS, Some("id,cuda_graphs\nr1,moe_router moe_preprocess\n"))
            .unwrap()
            .remove(0)
            .unwrap();
        let g = graphed.assumptions.cuda_graphs;
        assert!(g.moe_router && g.moe_preprocess && !g.attn && !g.full_iteration);
        let wrong = parse_runs_with(RUNS, Some("id,cuda_graphs\nr1,everything\n"))
            .unwrap()
            .remove(0)
            .unwrap_err();
        assert!(
            wrong.reason.contains("column 'cuda_graphs'") && wrong.reason.contains("'everything'"),
            "{}",
            wrong.reason
        );
        let bad = parse_runs_with(RUNS, Some("id,cross_entropy\nr1,fused\n"))
            .unwrap()
            .remove(0)
            .unwrap_err();
        assert!(
            bad.reason
                .contains("column 'cross_entropy' is 'fused', expected te, native, unfused"),
            "{}",
            bad.reason
        );
        // A Megatron layout and MTP layers, on the row made two pipeline stages.
        let pp2 = RUNS.replace(",1,1,1,1,8,false,64,", ",1,2,1,1,8,false,32,");
        let c = parse_runs_with(&pp2, Some("id,pp_layout,mtp_layers\nr1,Et*23|t*25mL,1\n"))
            .unwrap()
            .remove(0)
            .unwrap();
        assert_eq!(
            (c.config.layout.clone(), c.model.mtp_layers),
            (
                Layout::Explicit {
                    layers: vec![23, 25]
                },
                1
            )
        );
        for (stack, why) in [
            (
                "id,pp_layout\nr1,Et*23|t*25mL\n",
                "places 1 MTP layers; qwen3-30b-a3b has 0",
            ),
            (
                "id,pp_layout\nr1,Et*11|t*12|t*12|t*13L\n",
                "has 2 virtual stages per rank, but vpp is 1",
            ),
            ("id,pp_layout\nr1,Et*24|t*25L\n", "column 'pp_layout'"),
            ("id,mtp_layers\nr1,40\n", "column 'mtp_layers'"),
        ] {
            let bad = parse_runs_with(&pp2, Some(stack)).unwrap().remove(0);
            let reason = match bad {
                Ok(c) => c
                    .config
                    .check(&c.model, &c.cluster, &c.workload)
                    .map(|_| String::new())
                    .unwrap_or_else(|r| format!("column 'pp_layout': {r}")),
                Err(u) => u.reason,
            };
            assert!(reason.contains(why), "{stack}: {reason}");
        }
    }

    /// One row from (column, value) pairs.
    fn csv(cols: &[(&str, &str)]) -> String {
        let (h, v): (Vec<&str>, Vec<&str>) = cols.iter().copied().unzip();
        format!("{}\n{}\n", h.join(","), v.join(","))
    }

    /// Nemotron-4 15B (arXiv 2402.16819: 32 layers, hidden 6144, 48 heads, 8 KV
    /// heads, squared-ReLU MLP of 24576, vocabulary 256000, untied, LayerNorm, no
    /// biases), which is no preset.
    fn nemotron_row() -> Vec<(&'static str, &'static str)> {
        vec![
            ("id", "n15"),
            ("gpu", "h100-sxm"),
            ("gpus_per_node", "8"),
            ("gpus", "64"),
            ("model", "nemotron-4-15b"),
            ("layers", "32"),
            ("hidden", "6144"),
            ("ffn_hidden", "24576"),
            ("heads", "48"),
            ("kv_heads", "8"),
            ("vocab", "256000"),
            ("seq", "4096"),
            ("tp", "4"),
            ("pp", "1"),
            ("dp", "16"),
            ("gbs", "256"),
            ("zero", "distributed optimizer"),
            ("precision", "bf16"),
            ("metric", "iter_s"),
            ("value", "5"),
            ("activation", "squared_relu"),
            ("tied_embeddings", "false"),
            ("norm", "layernorm"),
        ]
    }

    /// A model that is no preset comes from the row's shape columns and is priced;
    /// a row leaving out a column the shape needs is refused, naming the column.
    #[test]
    fn unknown_models_are_built_from_shape_columns() {
        let c = parse_runs(&csv(&nemotron_row()))
            .unwrap()
            .remove(0)
            .unwrap();
        assert_eq!(
            (
                c.model.mlp,
                c.model.tied_embeddings,
                c.model.norm,
                c.model.head_dim
            ),
            (MlpKind::Plain, false, Some(Norm::LayerNorm), 128)
        );
        // 12.5B in the layers and 3.1B in the two embeddings, as the paper counts.
        let total = c.model.params().total as f64;
        assert!((total / 15.6e9 - 1.0).abs() < 0.01, "{total}");
        assert!(c.estimate().is_ok());
        for col in ["ffn_hidden", "kv_heads", "vocab", "tied_embeddings"] {
            let row: Vec<_> = nemotron_row()
                .into_iter()
                .map(|(k, v)| (k, if k == col { "" } else { v }))
                .collect();
            let err = parse_runs(&csv(&row)).unwrap().remove(0).unwrap_err();
            assert!(
                err.reason
                    .contains("'nemotron-4-15b' is not a built-in preset")
                    && err.reason.contains(&format!("column '{col}' is empty")),
                "{col}: {}",
                err.reason
            );
        }
        // The MLP type: `gated` or `activation`, which must agree.
        let row: Vec<_> = nemotron_row()
            .into_iter()
            .filter(|(k, _)| *k != "activation")
            .collect();
        let err = parse_runs(&csv(&row)).unwrap().remove(0).unwrap_err();
        assert!(
            err.reason.contains("column 'gated' is empty"),
            "{}",
            err.reason
        );
        let mut row = nemotron_row();
        row.push(("gated", "true"));
        let err = parse_runs(&csv(&row)).unwrap().remove(0).unwrap_err();
        assert!(
            err.reason
                .contains("column 'gated' is 'true' but activation 'squared_relu' is a plain MLP"),
            "{}",
            err.reason
        );
        // The same columns change a preset-based row: Llama 3 8B with tied
        // embeddings has one vocabulary-sized matrix fewer.
        let mut llama = nemotron_row();
        for (k, v) in llama.iter_mut() {
            match *k {
                "model" => *v = "llama3-8b",
                "hidden" => *v = "4096",
                "ffn_hidden" => *v = "14336",
                "heads" => *v = "32",
                "vocab" => *v = "128256",
                "activation" => *v = "swiglu",
                _ => {}
            }
        }
        let untied = parse_runs(&csv(&llama)).unwrap().remove(0).unwrap();
        for (k, v) in llama.iter_mut() {
            if *k == "tied_embeddings" {
                *v = "true";
            }
        }
        let tied = parse_runs(&csv(&llama)).unwrap().remove(0).unwrap();
        assert_eq!(
            untied.model.params().total - tied.model.params().total,
            128256 * 4096
        );
    }

    /// The measured-memory columns: a number, what it counts and whose it is; an
    /// `hbm_gib` column sets the GPUs' memory.
    #[test]
    fn measured_memory_columns() {
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut row = nemotron_row();
            row.extend_from_slice(extra);
            parse_runs(&csv(&row)).unwrap().remove(0)
        };
        let c = with(&[
            ("measured_mem_gib", "61.5"),
            ("mem_kind", "peak_reserved"),
            ("mem_stage", "0"),
            ("hbm_gib", "94"),
        ])
        .unwrap();
        assert_eq!(
            c.measured_memory,
            Some(MeasuredMemory {
                gib: 61.5,
                kind: MemKind::PeakReserved,
                stage: MemStage::Stage(0)
            })
        );
        assert_eq!(c.cluster.profile.gpu.hbm_gib, 94.0);
        assert_eq!(with(&[]).unwrap().measured_memory, None);
        for (extra, why) in [
            (
                vec![("measured_mem_gib", "61.5")],
                "column 'mem_kind' is '', expected peak_allocated, peak_reserved, peak_active",
            ),
            (
                vec![("measured_mem_gib", "61.5"), ("mem_kind", "nvidia-smi")],
                "column 'mem_kind' is 'nvidia-smi'",
            ),
            (
                vec![("mem_kind", "peak_reserved")],
                "describe 'measured_mem_gib', which is empty",
            ),
            (
                vec![("measured_mem_gib", "-3"), ("mem_kind", "peak_reserved")],
                "column 'measured_mem_gib' is '-3', expected a positive number",
            ),
            (
                vec![
                    ("measured_mem_gib", "61.5"),
                    ("mem_kind", "peak_reserved"),
                    ("mem_stage", "1"),
                ],
                "column 'mem_stage' is 1, but the run has 1 pipeline stages",
            ),
            (vec![("hbm_gib", "1e9")], "column 'hbm_gib'"),
        ] {
            let err = with(&extra).unwrap_err();
            assert!(err.reason.contains(why), "{extra:?}: {}", err.reason);
        }
    }
}
