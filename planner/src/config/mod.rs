//! A parallel configuration, the workload it trains, and the rules that make a
//! configuration valid. A configuration that breaks a rule is a [`Rejection`]: a
//! value with a reason, which the search counts and `estimate` prints.
//!
//! This file holds [`ParallelConfig`] and its knobs ([`Zero`], [`Overlap`],
//! [`Dispatcher`]); `workload.rs` the [`Workload`]; `recompute.rs` the
//! recomputation and its module set; `layout.rs` the pipeline layouts and
//! [`ParallelConfig::stage_layers`]; `rules.rs` the validity rules
//! ([`ParallelConfig::check`]); `rejection.rs` the [`Rejection`].

mod layout;
mod recompute;
mod rejection;
mod rules;
#[cfg(test)]
mod tests;
mod workload;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::schedule::Schedule;

pub use layout::{Layout, LayoutError, MegatronLayout};
pub use recompute::{Recompute, RecomputeModules, RecomputeModulesError};
pub use rejection::{RejectKind, Rejection};
pub use rules::divisors;
pub use workload::{Precision, Workload, WorkloadError, MAX_GLOBAL_BATCH, MAX_SEQ};

/// Sharding of model state across the data-parallel group. Spelled in files as on
/// the command line (`--zero 0|1|2|3`); schema-1 plan files' `none`, `dist_opt`,
/// `zero2`, `zero3` are still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Zero {
    /// Plain data parallelism: every rank holds all optimizer state.
    #[serde(rename = "0", alias = "none")]
    None,
    /// Megatron's distributed optimizer (= ZeRO-1): optimizer state sharded.
    #[serde(rename = "1", alias = "dist_opt")]
    DistOpt,
    /// ZeRO-2: optimizer state and gradients sharded.
    #[serde(rename = "2", alias = "zero2")]
    Zero2,
    /// ZeRO-3 / FSDP: parameters too, gathered before use.
    #[serde(rename = "3", alias = "zero3")]
    Zero3,
}

impl fmt::Display for Zero {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Zero::None => "0",
            Zero::DistOpt => "1/DO",
            Zero::Zero2 => "2",
            Zero::Zero3 => "3",
        })
    }
}

/// Communication that Megatron can overlap with compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Overlap {
    /// `--overlap-grad-reduce`: DP gradient reduction overlaps backward.
    pub grad_reduce: bool,
    /// `--overlap-param-gather`: distributed-optimizer all-gather overlaps forward.
    pub param_gather: bool,
    /// `--tp-comm-overlap`: TP/SP collectives pipelined with their GEMMs.
    pub tp_comm: bool,
    /// `--overlap-p2p-communication` (interleaved schedules).
    pub p2p: bool,
    /// `--overlap-moe-expert-parallel-comm` with `--delay-wgrad-compute`: the
    /// forward of one micro-batch and the backward of another run layer by layer
    /// together, each one's all-to-all hidden behind the other's compute.
    /// Megatron allows it with EP > 1, no pipeline or an interleaved one, and
    /// without full recomputation ([`ParallelConfig::ep_overlap`]).
    #[serde(default)]
    pub ep_comm: bool,
}

impl Default for Overlap {
    fn default() -> Self {
        Overlap {
            grad_reduce: true,
            param_gather: true,
            tp_comm: false,
            p2p: true,
            ep_comm: false,
        }
    }
}

/// One point of the search space. `dp` is stored, and checked against the GPU count.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "ParallelConfigFile")]
pub struct ParallelConfig {
    pub tp: u64,
    pub pp: u64,
    /// Virtual pipeline stages per rank (1: not interleaved).
    pub vpp: u64,
    pub cp: u64,
    pub ep: u64,
    /// Expert tensor parallelism (Megatron `--expert-tensor-parallel-size`).
    pub etp: u64,
    pub dp: u64,
    /// Sequence parallelism (only with tp > 1).
    pub sp: bool,
    /// Micro-batch size in sequences.
    pub mbs: u64,
    pub zero: Zero,
    pub recompute: Recompute,
    pub layout: Layout,
    pub overlap: Overlap,
    /// Main gradients kept and reduced in BF16 (Megatron `--no-accumulate-allreduce-grads-in-fp32`
    /// / `grad_reduce_in_fp32=False`, NeMo `grad_sync_dtype=bf16`); FP32 otherwise,
    /// Megatron-LM's default for BF16 training.
    pub bf16_grads: bool,
    /// Adam's two moments kept in BF16 (Megatron `--use-precision-aware-optimizer
    /// --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16`): 8 optimizer bytes per
    /// parameter instead of 12. The FP32 master weight stays.
    pub bf16_moments: bool,
    /// What selective recomputation replays (read only with
    /// [`Recompute::Selective`]; [`RecomputeModules::DEFAULT`] otherwise).
    pub recompute_modules: RecomputeModules,
    /// MoE token dispatcher (ignored for dense models).
    pub moe_dispatcher: Dispatcher,
    /// Pipeline schedule. A plan file without it (written before it existed) reads
    /// as what Megatron-LM runs for its vpp: [`Schedule::default_for`].
    pub schedule: Schedule,
}

/// [`ParallelConfig`] as a file states it: fields added later may be absent.
#[derive(Deserialize)]
struct ParallelConfigFile {
    tp: u64,
    pp: u64,
    vpp: u64,
    cp: u64,
    ep: u64,
    etp: u64,
    dp: u64,
    sp: bool,
    mbs: u64,
    zero: Zero,
    recompute: Recompute,
    layout: Layout,
    overlap: Overlap,
    #[serde(default)]
    bf16_grads: bool,
    #[serde(default)]
    bf16_moments: bool,
    #[serde(default)]
    recompute_modules: RecomputeModules,
    #[serde(default)]
    moe_dispatcher: Dispatcher,
    #[serde(default)]
    schedule: Option<Schedule>,
}

impl From<ParallelConfigFile> for ParallelConfig {
    fn from(f: ParallelConfigFile) -> ParallelConfig {
        ParallelConfig {
            tp: f.tp,
            pp: f.pp,
            vpp: f.vpp,
            cp: f.cp,
            ep: f.ep,
            etp: f.etp,
            dp: f.dp,
            sp: f.sp,
            mbs: f.mbs,
            zero: f.zero,
            recompute: f.recompute,
            layout: f.layout,
            overlap: f.overlap,
            bf16_grads: f.bf16_grads,
            bf16_moments: f.bf16_moments,
            recompute_modules: f.recompute_modules,
            moe_dispatcher: f.moe_dispatcher,
            schedule: f.schedule.unwrap_or(Schedule::default_for(f.vpp)),
        }
    }
}

/// How MoE tokens reach their experts. Spelled in files as on the command line
/// (`alltoall`, `dedup`); schema-1 files' `all_to_all`, `deduplicated` are still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Dispatcher {
    /// Megatron's all-to-all token dispatcher: every (token, expert) copy is sent to
    /// the expert's rank.
    #[default]
    #[serde(rename = "alltoall", alias = "all_to_all")]
    AllToAll,
    /// DeepEP / HybridEP (Megatron's "flex" dispatcher): a token crosses the network
    /// once per destination node and fans out to that node's experts over NVLink.
    #[serde(rename = "dedup", alias = "deduplicated")]
    Deduplicated,
}

impl Dispatcher {
    /// The names [`Dispatcher::parse`] accepts.
    pub const NAMES: &'static str = "alltoall, dedup (deepep, hybridep, flex)";

    /// Megatron's dispatcher names, and the flex backends that deduplicate.
    pub fn parse(s: &str) -> Option<Dispatcher> {
        match s.trim().to_ascii_lowercase().as_str() {
            "alltoall" | "all-to-all" => Some(Dispatcher::AllToAll),
            "dedup" | "deepep" | "hybridep" | "flex" => Some(Dispatcher::Deduplicated),
            _ => None,
        }
    }
}

/// Largest value any parallel size or micro-batch may take.
pub const MAX_KNOB: u64 = 1 << 24;

/// Rank order used to place groups on the machine (Megatron's default).
pub const RANK_ORDER: &str = "tp-cp-ep-dp-pp";

impl ParallelConfig {
    /// Gradient-accumulation steps (micro-batches per step per pipeline).
    pub fn micro_batches(&self, w: &Workload) -> u64 {
        w.global_batch / self.mbs.saturating_mul(self.dp).max(1)
    }

    /// The parallel degrees by their short names, in the order plans print them:
    /// what a comparison of two configurations lists when they differ.
    pub fn named_degrees(&self) -> [(&'static str, u64); 7] {
        [
            ("TP", self.tp),
            ("PP", self.pp),
            ("VPP", self.vpp),
            ("CP", self.cp),
            ("EP", self.ep),
            ("ETP", self.etp),
            ("DP", self.dp),
        ]
    }

    /// tp x pp x cp x dp (saturating: a product past u64 never equals a GPU count).
    pub fn gpus(&self) -> u64 {
        self.tp
            .saturating_mul(self.pp)
            .saturating_mul(self.cp)
            .saturating_mul(self.dp)
    }

    /// Ranks that hold expert data-parallel copies of one expert shard.
    pub fn edp(&self) -> u64 {
        self.tp.saturating_mul(self.cp).saturating_mul(self.dp)
            / self.ep.saturating_mul(self.etp).max(1)
    }

    /// Whether the EP all-to-all is overlapped with compute, and over which
    /// fraction of the layer passes: those whose forward has a backward partner.
    /// DualPipe pairs the two directions by construction (the DeepSeek-V3
    /// report's computation-communication overlap); Megatron's
    /// `--overlap-moe-expert-parallel-comm` pairs micro-batches under its rules.
    /// Unpaired passes are the warm-up forwards (and as many cool-down backwards).
    pub fn ep_overlap(&self, w: &Workload) -> Option<f64> {
        if self.ep < 2 {
            return None;
        }
        let m = self.micro_batches(w) as f64;
        let (p, v) = (self.pp as f64, self.vpp as f64);
        let (chunks, warm) = match self.schedule {
            Schedule::DualPipe => (m, p),
            // Megatron asserts no full recomputation and no "moe" recompute module.
            _ if !self.overlap.ep_comm
                || self.recompute == Recompute::Full
                || self.recomputes(RecomputeModules::MOE) =>
            {
                return None
            }
            _ if self.pp == 1 => (m, 1.0),
            // Megatron's interleaved warm-up on rank r: 2 (p - r - 1) + (v - 1) p
            // forward chunks; (p - 1) + (v - 1) p on average over the ranks.
            Schedule::Interleaved => (m * v, (p - 1.0) + (v - 1.0) * p),
            _ => return None,
        };
        Some(((chunks - warm) / chunks).clamp(0.0, 1.0))
    }

    /// Whether Megatron runs this plan with `--overlap-moe-expert-parallel-comm`:
    /// asked for, and allowed by its rules (DualPipe's own overlap needs no flag).
    pub fn megatron_ep_overlap(&self, w: &Workload) -> bool {
        self.overlap.ep_comm && self.schedule != Schedule::DualPipe && self.ep_overlap(w).is_some()
    }

    /// Whether Megatron overlaps this plan's TP communication with its GEMMs: asked
    /// for, with a TP group to overlap, and with sequence parallelism (which
    /// Megatron asserts for it, `Rejection::TpCommNeedsSp`).
    pub fn megatron_tp_overlap(&self) -> bool {
        self.overlap.tp_comm && self.tp > 1 && self.sp
    }
}
