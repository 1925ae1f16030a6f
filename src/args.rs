//! Inputs shared by `plan` and `estimate`: model, cluster, workload, settings.

use std::path::Path;

use anyhow::{bail, Result};
use clap::Args;

use crate::flags::{DispatcherFlag, LossFlag, PrecisionFlag, ScheduleFlag};
use sextant_planner::calibration::Target;
use sextant_planner::config::{Dispatcher, Overlap, Precision, RecomputeModules, Workload};
use sextant_planner::cost::{Assumptions, CudaGraphs, LossKernel};
use sextant_planner::hardware::ranges::show;
use sextant_planner::hardware::{builtin_profile, Cluster, HardwareProfile, DEFAULT_PROFILE};
use sextant_planner::hf::from_hf_config;
use sextant_planner::model::ModelSpec;
use sextant_planner::presets::resolve;
use sextant_planner::schedule::Schedule;

use crate::io::read_text;

use sextant_planner::config::{MAX_GLOBAL_BATCH, MAX_SEQ};

/// `--seq` when not given.
pub const DEFAULT_SEQ: u64 = 4096;

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Model: a preset or alias (see `sextant models`), a Hugging Face config.json,
    /// or a Sextant model JSON file.
    #[arg(long)]
    pub model: String,
    /// Number of GPUs.
    #[arg(long)]
    pub gpus: u64,
    /// Built-in hardware profile (see `sextant profiles`).
    #[arg(long, conflicts_with = "cluster")]
    pub gpu: Option<String>,
    /// Hardware profile JSON file describing the cluster's GPU, node and network.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Sequence length in tokens.
    #[arg(long, default_value_t = DEFAULT_SEQ)]
    pub seq: u64,
    /// Global batch in sequences per optimizer step.
    #[arg(long = "global-batch", default_value_t = 1024)]
    pub global_batch: u64,
    /// GEMM precision.
    #[arg(long, value_enum, ignore_case = true, default_value = "bf16")]
    pub precision: PrecisionFlag,
    /// Busiest expert's load over the mean (MoE); 1.0 is perfectly balanced.
    /// Default: 1.52 with auxiliary-loss balancing, 1.04 with loss-free balancing
    /// (DeepSeek-V3), the MaxVio of Wang et al. 2024 (arXiv:2408.15664) Table 2.
    #[arg(long = "moe-imbalance")]
    pub moe_imbalance: Option<f64>,
    /// Expert capacity factor (MoE): tokens beyond it are dropped. Default:
    /// dropless.
    #[arg(long = "moe-capacity-factor")]
    pub moe_capacity_factor: Option<f64>,
    /// Pad every expert's input to its capacity (needs --moe-capacity-factor).
    #[arg(long = "moe-pad-to-capacity")]
    pub moe_pad_to_capacity: bool,
    /// Keep and reduce main gradients in BF16 instead of FP32.
    #[arg(long = "bf16-grads")]
    pub bf16_grads: bool,
    /// Keep Adam's moments in BF16 (Megatron --use-precision-aware-optimizer
    /// --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16): 8 optimizer bytes per parameter
    /// instead of 12.
    #[arg(long = "bf16-moments")]
    pub bf16_moments: bool,
    /// What selective recomputation replays, as Megatron's --recompute-modules
    /// (comma-separated: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe,
    /// shared_experts). Needs --recompute selective. Default: `plan` tries core_attn
    /// and the model's fine-grained set; `estimate` uses core_attn.
    #[arg(long = "recompute-modules", value_name = "LIST")]
    pub recompute_modules: Option<String>,
    /// Multi-token-prediction layers (Megatron --mtp-num-layers), replacing the
    /// model's own (DeepSeek-V3: 1; 0 trains without MTP).
    #[arg(long = "mtp-layers", value_name = "N")]
    pub mtp_layers: Option<u64>,
    /// Overlap TP communication with GEMMs (Megatron --tp-comm-overlap).
    #[arg(long = "tp-comm-overlap")]
    pub tp_comm_overlap: bool,
    /// Overlap the MoE all-to-all with another micro-batch's compute (Megatron
    /// --overlap-moe-expert-parallel-comm --delay-wgrad-compute), on plans where
    /// Megatron allows it: EP > 1, no pipeline or an interleaved one, no full
    /// recomputation. DualPipe overlaps it by construction.
    #[arg(long = "ep-comm-overlap")]
    pub ep_comm_overlap: bool,
    /// Do not overlap DP gradient reduction with the backward pass.
    #[arg(long = "no-overlap-grad-reduce")]
    pub no_overlap_grad_reduce: bool,
    /// Do not overlap the distributed optimizer's parameter all-gather.
    #[arg(long = "no-overlap-param-gather")]
    pub no_overlap_param_gather: bool,
    /// Model unfused softmax attention instead of a flash-attention kernel.
    #[arg(long = "no-flash-attention")]
    pub no_flash_attention: bool,
    /// CUDA graphs the run captures, as Megatron's scopes (`attn moe_router
    /// moe_preprocess`, any of them, or `full_iteration`): the host then launches
    /// them whole, which the model prices as a shorter host-bound layer (MoE layers,
    /// and dense layers too small to outlast their kernels' issue; one
    /// published A/B measured no gain; see docs/trust.md). Default: none.
    #[arg(long = "cuda-graphs", value_name = "SCOPES", value_parser = parse_cuda_graphs, default_value = "none")]
    pub cuda_graphs: CudaGraphs,
    /// Cross-entropy kernel: native (Megatron's `--cross-entropy-loss-fusion`), te
    /// (Transformer Engine's, as Megatron-Bridge's performance scripts pick),
    /// unfused (Megatron-LM without the flag) or compiled (torchtitan's loss under
    /// torch.compile, `--target torchtitan` only: exported with the loss in
    /// `[compile]`'s components beside the model).
    #[arg(
        long = "loss",
        value_enum,
        ignore_case = true,
        default_value = "native"
    )]
    pub loss: LossFlag,
    /// MoE token dispatcher: alltoall (Megatron's) or dedup (DeepEP / HybridEP:
    /// one network copy per destination node).
    #[arg(
        long = "moe-dispatcher",
        value_enum,
        ignore_case = true,
        default_value = "alltoall"
    )]
    pub moe_dispatcher: DispatcherFlag,
    /// Pipeline schedules (comma-separated): 1f1b, interleaved, zb-h1, dualpipe,
    /// gpipe. `plan` searches only these (default: all but gpipe); `estimate` takes
    /// one (default: interleaved with --vpp > 1, else 1f1b).
    #[arg(long, value_enum, ignore_case = true, value_delimiter = ',')]
    pub schedule: Option<Vec<ScheduleFlag>>,
    /// Allow tensor parallelism to span NVLink domains (over the network).
    #[arg(long = "allow-tp-across-nodes")]
    pub allow_tp_across_nodes: bool,
    /// Fraction of HBM kept free of every plan (allocator and memory-model
    /// margin), from 0 to 0.5. Default: the profile's `memory.headroom` (0.05 in
    /// the built-in profiles).
    #[arg(long = "mem-headroom")]
    pub mem_headroom: Option<f64>,
    /// Replace the profile's efficiency constants with those measured by
    /// `sextant calibrate` (an overlay for the same profile, from GPU runs).
    #[arg(long)]
    pub calibration: Option<String>,
    /// Print the result as JSON (the plan file format).
    #[arg(long)]
    pub json: bool,
    /// Also write the result as a plan file.
    #[arg(long)]
    pub out: Option<String>,
    /// Replace the --out file if it exists.
    #[arg(long)]
    pub force: bool,
}

/// Everything resolved from [`Common`].
pub struct Inputs {
    pub model: ModelSpec,
    /// "70b -> llama3-70b", or where the model came from.
    pub model_note: String,
    pub cluster: Cluster,
    pub workload: Workload,
    pub overlap: Overlap,
    pub bf16_grads: bool,
    pub bf16_moments: bool,
    /// `--recompute-modules`, parsed and checked against the model.
    pub recompute_modules: Option<RecomputeModules>,
    pub moe_dispatcher: Dispatcher,
    pub assumptions: Assumptions,
    /// `--schedule`, parsed.
    pub schedules: Option<Vec<Schedule>>,
}

impl Inputs {
    /// The one schedule `estimate` runs: the --schedule given, or Megatron-LM's
    /// choice for `vpp`.
    pub fn schedule_for(&self, vpp: u64) -> Result<Schedule> {
        match self.schedules.as_deref() {
            None => Ok(Schedule::default_for(vpp)),
            Some([one]) => Ok(*one),
            Some(_) => bail!("estimate takes one --schedule"),
        }
    }
}

fn looks_like_file(s: &str) -> bool {
    s.ends_with(".json") || s.contains('/') || s.contains('\\') || Path::new(s).is_file()
}

pub fn load_model(arg: &str) -> Result<(ModelSpec, String)> {
    if looks_like_file(arg) {
        // The path as the messages show it: one line, control characters escaped.
        let shown = sextant_planner::json::one_line(arg, 300);
        let text = read_text(Path::new(arg), "model file")?;
        let value: serde_json::Value = sextant_planner::json::from_str(&text, "model file")
            .map_err(|e| match e {
                sextant_planner::InputError::Json { detail, .. } => {
                    anyhow::anyhow!("model file '{shown}' is not valid JSON: {detail}")
                }
                sextant_planner::InputError::Field { at, detail, .. } => {
                    anyhow::anyhow!("model file '{shown}': {at}{detail}")
                }
                other => anyhow::anyhow!("model file '{shown}': {other}"),
            })?;
        let stem = Path::new(arg)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if value.get("plans").is_some() && value.get("schema_version").is_some() {
            bail!("'{shown}' is a Sextant plan file, not a model: pass it to `sextant export`, `report` or `exec`, or give --model a preset name, a Hugging Face config.json or a model JSON");
        }
        let spec = if value.get("model_type").is_some() {
            from_hf_config(&text, &stem).map_err(|e| anyhow::anyhow!("'{shown}': {e}"))?
        } else {
            ModelSpec::from_json(&text).map_err(|e| anyhow::anyhow!("'{shown}': {e} (expected a Hugging Face config.json with model_type, or a Sextant model JSON)"))?
        };
        return Ok((spec, format!("from {shown}")));
    }
    let r = resolve(arg)?;
    let note = r.via_alias.unwrap_or_else(|| "preset".into());
    Ok((r.spec, note))
}

pub fn load_profile(gpu: Option<&str>, cluster: Option<&str>) -> Result<HardwareProfile> {
    if let Some(path) = cluster {
        let text = read_text(Path::new(path), "cluster profile")?;
        return HardwareProfile::from_json(&text).map_err(|e| anyhow::anyhow!("'{path}': {e}"));
    }
    Ok(builtin_profile(gpu.unwrap_or(DEFAULT_PROFILE))?)
}

impl Common {
    /// The files this command writes, as (flag, path).
    pub fn outputs(&self) -> Vec<(&'static str, &str)> {
        self.out.iter().map(|p| ("--out", p.as_str())).collect()
    }

    /// The files this command reads, as (flag, path).
    pub fn input_files(&self) -> Vec<(&'static str, &str)> {
        let mut v = Vec::new();
        if looks_like_file(&self.model) {
            v.push(("--model", self.model.as_str()));
        }
        v.extend(self.cluster.iter().map(|p| ("--cluster", p.as_str())));
        v.extend(
            self.calibration
                .iter()
                .map(|p| ("--calibration", p.as_str())),
        );
        v
    }

    pub fn resolve(&self) -> Result<Inputs> {
        let (mut model, model_note) = load_model(&self.model)?;
        if let Some(n) = self.mtp_layers {
            model.mtp_layers = n;
            model
                .validate()
                .map_err(|e| anyhow::anyhow!("--mtp-layers {n}: {e}"))?;
        }
        let mut profile = load_profile(self.gpu.as_deref(), self.cluster.as_deref())?;
        if let Some(path) = &self.calibration {
            let overlay = crate::exec::read_overlay(path)?;
            if overlay.backend == "cpu" {
                bail!("--calibration '{path}' was measured by the CPU test backend on '{}': it describes that CPU, not {}; calibrate from a CUDA run", overlay.device, profile.gpu.name);
            }
            profile = sextant_planner::calibration::apply(&profile, &overlay, Target::Stack)
                .map_err(|e| anyhow::anyhow!("--calibration '{path}': {e}"))?;
        }
        if let Some(h) = self.mem_headroom {
            if !(h.is_finite() && (0.0..=0.5).contains(&h)) {
                bail!("--mem-headroom {} is not a fraction of HBM from 0 to 0.5 (e.g. 0.05 keeps 5% free)", show(h));
            }
            profile.memory.headroom = h;
        }
        let mut cluster = Cluster::new(profile, self.gpus)?;
        cluster.allow_tp_beyond_nvlink = self.allow_tp_across_nodes;
        let precision = Precision::from(self.precision);
        if precision.is_fp8() && cluster.profile.gpu.peak_tflops.fp8 <= 0.0 {
            bail!(
                "--precision {precision}: {} has no FP8 tensor cores; use bf16 or fp16",
                cluster.profile.gpu.name
            );
        }
        if precision == Precision::Mxfp8 && !cluster.profile.runs_mxfp8() {
            bail!(
                "--precision mxfp8: {} has no block-scaled FP8 (Transformer Engine runs MXFP8 on Blackwell, compute capability 10.0, only; a profile for such a GPU sets \"gpu\": {{\"mxfp8\": true}}); use fp8",
                cluster.profile.gpu.name
            );
        }
        if self.seq < 2 || self.seq > MAX_SEQ {
            bail!(
                "--seq {} is out of range: use 2 to {MAX_SEQ} tokens",
                self.seq
            );
        }
        if self.global_batch == 0 || self.global_batch > MAX_GLOBAL_BATCH {
            bail!(
                "--global-batch {} is out of range: use 1 to {MAX_GLOBAL_BATCH} sequences",
                self.global_batch
            );
        }
        if model.moe.is_none()
            && (self.moe_imbalance.is_some() || self.moe_capacity_factor.is_some())
        {
            bail!("--moe-imbalance and --moe-capacity-factor describe expert routing, but '{}' is a dense model; drop them", model.name);
        }
        if self.moe_pad_to_capacity && self.moe_capacity_factor.is_none() {
            bail!("--moe-pad-to-capacity pads to a capacity: also give --moe-capacity-factor (for example 1.25)");
        }
        let moe_imbalance = match (self.moe_imbalance, &model.moe) {
            (Some(x), Some(moe)) if x > sextant_planner::routing::max_imbalance(moe) => {
                bail!("--moe-imbalance {} is more than one expert can carry: with {} experts and top-{} routing the busiest expert takes at most {} times the mean", show(x), moe.experts, moe.top_k, sextant_planner::routing::max_imbalance(moe))
            }
            (Some(x), _) => x,
            (None, Some(moe)) => sextant_planner::routing::default_imbalance(moe)
                .min(sextant_planner::routing::max_imbalance(moe))
                .max(1.0),
            (None, None) => 1.0,
        };
        let moe_capacity =
            self.moe_capacity_factor
                .map(|factor| sextant_planner::routing::Capacity {
                    factor,
                    pad: self.moe_pad_to_capacity,
                });
        self.cuda_graphs
            .check_for(&model, Dispatcher::from(self.moe_dispatcher), moe_capacity)
            .map_err(|e| anyhow::anyhow!("--cuda-graphs: {e}"))?;
        let workload = Workload {
            seq: self.seq,
            global_batch: self.global_batch,
            precision,
            moe_imbalance,
            moe_capacity,
        };
        workload.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        let overlap = Overlap {
            grad_reduce: !self.no_overlap_grad_reduce,
            param_gather: !self.no_overlap_param_gather,
            tp_comm: self.tp_comm_overlap,
            p2p: true,
            ep_comm: self.ep_comm_overlap,
        };
        let schedules = self
            .schedule
            .as_ref()
            .map(|list| list.iter().map(|&f| Schedule::from(f)).collect());
        let recompute_modules = match &self.recompute_modules {
            None => None,
            Some(list) => {
                let m = RecomputeModules::parse(list)
                    .map_err(|e| anyhow::anyhow!("--recompute-modules: {e}"))?;
                m.check_for(&model)
                    .map_err(|e| anyhow::anyhow!("--recompute-modules: {e}"))?;
                Some(m)
            }
        };
        Ok(Inputs {
            model,
            model_note,
            cluster,
            workload,
            overlap,
            bf16_grads: self.bf16_grads,
            bf16_moments: self.bf16_moments,
            recompute_modules,
            moe_dispatcher: Dispatcher::from(self.moe_dispatcher),
            assumptions: Assumptions {
                flash_attention: !self.no_flash_attention,
                loss: LossKernel::from(self.loss),
                cuda_graphs: self.cuda_graphs,
                ..Assumptions::default()
            },
            schedules,
        })
    }
}

fn parse_cuda_graphs(text: &str) -> Result<CudaGraphs, String> {
    CudaGraphs::parse(text).map_err(|e| e.to_string())
}
