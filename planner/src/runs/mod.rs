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
//!   recipes overlap gradient reduction, parameter gathering and TP communication
//!   (the last only with sequence parallelism, which Megatron asserts; rows of
//!   other frameworks overlap TP communication only where they say so: torchtitan's
//!   async TP is opt-in, `parallelism.enable_async_tensor_parallel: bool = False` in
//!   torchtitan/config_manager.py at 820504e), with fused (flash) attention and BF16 gradient reduction (NeMo launcher's
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
//! - Element-wise kernels: fused unless a row states in `eager_ops` which of `norm`,
//!   `rotary` and `glu` its code runs as eager PyTorch operators
//!   ([`crate::cost::EagerOps`]).
//!
//! Optional columns (`recompute_modules`, `optimizer_moments`, `dispatcher`,
//! `ep_comm_overlap`, `tp_comm_overlap`, `pp_layout` in Megatron's layout syntax,
//! `mtp_layers`, `cross_entropy`, `cuda_graphs`), in the CSV or from a stack file
//! ([`parse_runs_with`]), replace these rules for the rows that state them.

use serde::Serialize;

use crate::config::{ParallelConfig, Recompute, RecomputeModules, Workload};
use crate::cost::Assumptions;
use crate::hardware::Cluster;
use crate::memory::MemKind;
use crate::model::ModelSpec;

mod error;
mod row;
#[cfg(test)]
mod tests;

pub use error::{CsvError, RowError, RunsError};
pub use row::SHAPE_COLUMNS;

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
            crate::banded::estimate_with(
                &self.model,
                &self.cluster,
                &self.workload,
                cfg,
                self.assumptions,
            )
            .map(|e| crate::banded::simulated(e, cfg))
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

type Row = std::collections::HashMap<String, String>;

fn get<'a>(r: &'a Row, k: &str) -> &'a str {
    r.get(k).map(|s| s.trim()).unwrap_or("")
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

/// Every column a runs CSV may have: the published_runs.csv schema, the shape,
/// memory and network columns that override a preset or a profile, the stack
/// columns, and the sweeps file's `sweep`, `axis` and `note`. Anything else would
/// be read by nothing, so a misspelt column is refused rather than ignored.
pub const RUN_COLUMNS: [&str; 58] = [
    "id",
    "source",
    "note",
    "sweep",
    "axis",
    "gpu",
    "gpus_per_node",
    "gpus",
    "model",
    "layers",
    "hidden",
    "ffn_hidden",
    "heads",
    "kv_heads",
    "vocab",
    "seq",
    "moe_experts",
    "moe_topk",
    "moe_ffn_hidden",
    "moe_shared_experts",
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "sp",
    "dp",
    "mbs",
    "gbs",
    "recompute",
    "zero",
    "precision",
    "metric",
    "value",
    "attention",
    "tp_comm_overlap",
    "cross_entropy",
    "measured_mem_gib",
    "mem_kind",
    "mem_stage",
    "hbm_gib",
    "gated",
    "activation",
    "bias",
    "tied_embeddings",
    "norm",
    "dropout",
    "framework",
    "optimizer_moments",
    "nic_gbytes_per_s",
    "hbm_tbytes_per_s",
    "recompute_modules",
    "dispatcher",
    "ep_comm_overlap",
    "pp_layout",
    "mtp_layers",
    "cuda_graphs",
    "eager_ops",
];

/// The known column nearest to `name` (at most two edits away), for the error line.
fn nearest_column(name: &str) -> Option<&'static str> {
    let name: Vec<char> = name.chars().take(64).collect();
    let distance = |b: &str| {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in name.iter().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, cb) in b.iter().enumerate() {
                cur[j + 1] = (prev[j] + usize::from(ca != cb))
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    };
    RUN_COLUMNS
        .iter()
        .map(|&c| (distance(c), c))
        .filter(|&(d, _)| d <= 2)
        .min()
        .map(|(_, c)| c)
}

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
    // A repeated column would silently take its last cell.
    let mut seen = std::collections::HashSet::with_capacity(headers.len());
    if let Some(dup) = headers.iter().find(|h| !seen.insert(h.as_str())) {
        return Err(CsvError::Header(format!(
            "column '{}' appears twice; keep one",
            crate::json::one_line(dup, 60)
        )));
    }
    // Two rows under one id would both be counted by validate, and a stack row
    // would complete only the first. Ids compare as every reader takes them,
    // trimmed ([`get`]); rows are numbered as the other row errors number them
    // (the header is row 1).
    let id_column = headers.iter().position(|h| h == "id");
    let mut ids: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut rows = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        if i == MAX_ROWS {
            return Err(CsvError::TooManyRows);
        }
        let rec = rec.map_err(|e| CsvError::Row {
            line: i + 2,
            error: e.to_string(),
        })?;
        let line = i + 2;
        if let Some(id) = id_column.and_then(|c| rec.get(c)).map(str::trim) {
            if let Some(first) = ids.insert(id.to_string(), line) {
                return Err(CsvError::Row {
                    line,
                    error: format!(
                        "id '{}' is already row {first}'s; give every row its own id",
                        crate::json::one_line(id, 60)
                    ),
                });
            }
        }
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
    if let Some(bad) = headers.iter().find(|h| !RUN_COLUMNS.contains(&h.as_str())) {
        return Err(RunsError::UnknownColumn {
            column: crate::json::one_line(bad, 60),
            hint: nearest_column(bad)
                .map(|c| format!("; did you mean '{c}'?"))
                .unwrap_or_default(),
        });
    }
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
            return Err(RunsError::StackColumn(crate::json::one_line(bad, 60)));
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
            row::case(row).map_err(|reason| Unrepresentable {
                id: get(row, "id").to_string(),
                reason: reason.to_string(),
            })
        })
        .collect())
}
