//! A parallel configuration, the workload it trains, and the rules that make a
//! configuration valid. A configuration that breaks a rule is a [`Rejection`]: a
//! value with a reason, which the search counts and `estimate` prints.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::hardware::Cluster;
use crate::model::ModelSpec;
use crate::schedule::Schedule;

/// Numeric precision of the training GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Bf16,
    Fp16,
    /// FP8 GEMMs with per-tensor (delayed or current) scaling; attention, the output
    /// layer and the router stay in BF16 (Transformer Engine's default recipe).
    Fp8,
    /// FP8 GEMMs with MX block scaling (Blackwell).
    Mxfp8,
}

impl Precision {
    pub fn is_fp8(self) -> bool {
        matches!(self, Precision::Fp8 | Precision::Mxfp8)
    }
    pub fn parse(s: &str) -> Option<Precision> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" => Some(Precision::Bf16),
            "fp16" => Some(Precision::Fp16),
            "fp8" => Some(Precision::Fp8),
            "mxfp8" => Some(Precision::Mxfp8),
            _ => None,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp8 => "fp8",
            Precision::Mxfp8 => "mxfp8",
        })
    }
}

/// What is trained: sequence length, global batch (sequences per step), precision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub seq: u64,
    pub global_batch: u64,
    pub precision: Precision,
    /// Busiest expert's load relative to the mean (1.0: perfectly balanced routing).
    #[serde(default = "one_f64")]
    pub moe_imbalance: f64,
    /// Expert capacity (tokens over it are dropped); `None` is dropless routing.
    #[serde(default)]
    pub moe_capacity: Option<crate::routing::Capacity>,
}

fn one_f64() -> f64 {
    1.0
}

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

/// Activation recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    None,
    /// Recompute only core attention (Korthikanti et al. 2022, section 5).
    Selective,
    /// Store only each layer's input and recompute the layer in backward.
    Full,
}

impl fmt::Display for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Recompute::None => "none",
            Recompute::Selective => "sel",
            Recompute::Full => "full",
        })
    }
}

/// Megatron-Core's `--recompute-modules`: the parts of each layer that selective
/// recomputation discards after the forward and replays in the backward
/// (`TransformerConfig.recompute_modules`, used with `--recompute-granularity
/// selective`; its default is core attention alone). A set, kept as bits so that
/// a configuration stays `Copy`-cheap and hashable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecomputeModules(u8);

impl RecomputeModules {
    /// Core attention (the softmax over the score matrix; nothing to save with a
    /// fused flash kernel).
    pub const CORE_ATTN: RecomputeModules = RecomputeModules(1);
    /// The input and pre-MLP norms: their outputs are not stored.
    pub const LAYERNORM: RecomputeModules = RecomputeModules(2);
    /// MLA's up-projections and rotary: Q, K and V are not stored.
    pub const MLA_UP_PROJ: RecomputeModules = RecomputeModules(4);
    /// The dense MLP of non-MoE layers: only its input is stored.
    pub const MLP: RecomputeModules = RecomputeModules(8);
    /// The routed experts' activation function: its output is not stored.
    pub const MOE_ACT: RecomputeModules = RecomputeModules(16);
    /// The shared experts: only their input is stored.
    pub const SHARED_EXPERTS: RecomputeModules = RecomputeModules(32);
    /// The whole MoE block (router, dispatch, experts, combine): only its input is
    /// stored, and the forward all-to-alls run again.
    pub const MOE: RecomputeModules = RecomputeModules(64);
    /// Megatron's default set.
    pub const DEFAULT: RecomputeModules = RecomputeModules::CORE_ATTN;
    /// Names in Megatron's spelling, in its documentation order.
    pub const NAMES: [(&'static str, RecomputeModules); 7] = [
        ("core_attn", RecomputeModules::CORE_ATTN),
        ("moe_act", RecomputeModules::MOE_ACT),
        ("layernorm", RecomputeModules::LAYERNORM),
        ("mla_up_proj", RecomputeModules::MLA_UP_PROJ),
        ("mlp", RecomputeModules::MLP),
        ("moe", RecomputeModules::MOE),
        ("shared_experts", RecomputeModules::SHARED_EXPERTS),
    ];

    pub fn contains(self, m: RecomputeModules) -> bool {
        self.0 & m.0 == m.0 && m.0 != 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub fn union(self, m: RecomputeModules) -> RecomputeModules {
        RecomputeModules(self.0 | m.0)
    }
    /// The members' names in Megatron's spelling.
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES
            .iter()
            .filter(|(_, m)| self.contains(*m))
            .map(|(n, _)| *n)
            .collect()
    }
    /// Whether every module has something to replay in `model` (see
    /// [`ParallelConfig::check_recompute_modules`]); the error says which does not.
    pub fn check_for(self, model: &ModelSpec) -> Result<(), String> {
        let m = self;
        if m.contains(RecomputeModules::MLA_UP_PROJ) && model.mla.is_none() {
            return Err("mla_up_proj needs multi-latent attention (this model has none)".into());
        }
        let moe = model.moe.as_ref();
        for (name, bit) in [
            ("moe_act", RecomputeModules::MOE_ACT),
            ("moe", RecomputeModules::MOE),
        ] {
            if m.contains(bit) && moe.is_none() {
                return Err(format!("{name} needs an MoE model (this one is dense)"));
            }
        }
        if m.contains(RecomputeModules::SHARED_EXPERTS)
            && moe.is_none_or(|x| x.shared_hidden() == 0)
        {
            return Err("shared_experts needs a model with shared experts".into());
        }
        if m.contains(RecomputeModules::MLP) && model.moe_layers() == model.layers {
            return Err("mlp recomputes dense MLPs only, and every layer of this model is MoE (use moe or moe_act)".into());
        }
        Ok(())
    }

    /// Parses a comma-separated list of Megatron module names.
    pub fn parse(s: &str) -> Result<RecomputeModules, String> {
        let mut set = RecomputeModules(0);
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match Self::NAMES.iter().find(|(n, _)| *n == name) {
                Some((_, m)) => set = set.union(*m),
                None => {
                    let all: Vec<&str> = Self::NAMES.iter().map(|(n, _)| *n).collect();
                    return Err(format!(
                        "unknown recompute module '{name}': use a comma-separated list of {}",
                        all.join(", ")
                    ));
                }
            }
        }
        if set.is_empty() {
            return Err(
                "no recompute module given: name at least one (Megatron's default is core_attn)"
                    .into(),
            );
        }
        Ok(set)
    }
}

impl Default for RecomputeModules {
    fn default() -> Self {
        RecomputeModules::DEFAULT
    }
}

impl fmt::Display for RecomputeModules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names().join(","))
    }
}

impl Serialize for RecomputeModules {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(s)
    }
}

impl<'de> Deserialize<'de> for RecomputeModules {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        RecomputeModules::parse(&names.join(",")).map_err(serde::de::Error::custom)
    }
}

/// How transformer layers are split across pipeline stages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Layout {
    /// Every virtual stage holds layers / (pp * vpp) layers.
    Even,
    /// The embedding and the loss each count as one layer (Megatron's
    /// `--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`):
    /// (layers + 2) / (pp * vpp) per virtual stage, one fewer on the first and last.
    AccountEmbeddingLoss,
    /// Megatron's `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`;
    /// the rest split evenly over the middle stages.
    FirstLast { first: u64, last: u64 },
    /// Layers per virtual stage, in pipeline order (pp * vpp entries).
    Explicit { layers: Vec<u64> },
}

impl Layout {
    /// The simplest layout that states these per-stage layer counts (no virtual
    /// stages): even, first/last counts with an even middle, or an explicit list.
    pub fn from_counts(counts: &[u64]) -> Layout {
        let n = counts.len();
        if counts.iter().all(|&c| c == counts[0]) {
            return Layout::Even;
        }
        if n >= 3 && counts[1..n - 1].iter().all(|&c| c == counts[1]) {
            return Layout::FirstLast {
                first: counts[0],
                last: counts[n - 1],
            };
        }
        if n == 2 {
            return Layout::FirstLast {
                first: counts[0],
                last: counts[1],
            };
        }
        Layout::Explicit {
            layers: counts.to_vec(),
        }
    }

    /// The layout a practitioner would state for `layers` on `pp x vpp` virtual
    /// stages: even when it divides; else with the embedding and loss each counted
    /// as a layer when that divides; else the same idea with the remainder spread
    /// over the middle stages (an explicit per-stage list).
    pub fn balanced(layers: u64, pp: u64, vpp: u64) -> Layout {
        let chunks = pp.saturating_mul(vpp);
        // Zero chunks is for `check` to reject; with more chunks than layers + 2
        // no split below holds every layer, so those are even too (and the list
        // is never allocated).
        if chunks == 0 || chunks > layers.saturating_add(2) || layers.is_multiple_of(chunks) {
            return Layout::Even;
        }
        if chunks > 1 && (layers + 2).is_multiple_of(chunks) && (layers + 2) / chunks >= 2 {
            return Layout::AccountEmbeddingLoss;
        }
        if chunks == 1 {
            return Layout::Even;
        }
        let total = layers + 2;
        let base = total / chunks;
        let rem = total % chunks;
        // Give the extra layers to the middle chunks, keeping the edges light.
        let skip = (chunks - rem) / 2;
        let mut list: Vec<u64> = (0..chunks)
            .map(|i| base + u64::from(i >= skip && i < skip + rem))
            .collect();
        list[0] = list[0].saturating_sub(1);
        let last = list.len() - 1;
        list[last] = list[last].saturating_sub(1);
        // Fix the sum if an edge was already 0 (fewer layers than chunks).
        let sum: u64 = list.iter().sum();
        if sum != layers {
            return Layout::Even;
        }
        Layout::Explicit { layers: list }
    }

    /// Reads Megatron's `--pipeline-model-parallel-layout` string (grammar of
    /// megatron/core/transformer/pipeline_parallel_layer_layout.py): `E` embedding,
    /// `t` decoder layer, `m` multi-token-prediction layer, `L` loss, `|` between
    /// virtual stages in layer order (stage `j * pp + i` on rank `i`), `x*n` and
    /// `(...)*n` repeat, commas and spaces are cosmetic. Megatron's own rules apply
    /// (the embedding first, the loss last, each once; MTP layers after every
    /// decoder layer), and one of Sextant's: MTP layers sit on the last virtual
    /// stage, beside the loss.
    pub fn from_megatron(text: &str, pp: u64) -> Result<MegatronLayout, String> {
        const MAX_ENTRIES: usize = 1 << 20;
        let chars: Vec<char> = text
            .chars()
            .filter(|c| !c.is_whitespace() && *c != ',')
            .collect();
        if chars.is_empty() {
            return Err("the pipeline layout is empty (example: \"Et*4|(t*4|)*14tmL\")".into());
        }
        let mut pos = 0;
        let expanded = expand_layout(&chars, &mut pos, 0, MAX_ENTRIES)?;
        if pos != chars.len() {
            return Err(format!(
                "unmatched ')' at character {} of the pipeline layout",
                pos + 1
            ));
        }
        let stages: Vec<&[char]> = expanded.split(|&c| c == '|').collect();
        let n = stages.len() as u64;
        if pp == 0 || !n.is_multiple_of(pp) {
            return Err(format!(
                "the pipeline layout has {n} virtual stages, not a multiple of pp = {pp}"
            ));
        }
        let count = |c: char| expanded.iter().filter(|&&x| x == c).count();
        if count('E') != 1 || stages[0].first() != Some(&'E') {
            return Err("the pipeline layout must start with the embedding 'E', once".into());
        }
        if count('L') != 1 || stages[stages.len() - 1].last() != Some(&'L') {
            return Err("the pipeline layout must end with the loss 'L', once".into());
        }
        let mtp = count('m') as u64;
        if let Some(first_m) = expanded.iter().position(|&c| c == 'm') {
            if expanded[first_m..].contains(&'t') {
                return Err(
                    "decoder layers 't' must come before the MTP layers 'm' (Megatron's rule)"
                        .into(),
                );
            }
            if stages[..stages.len() - 1].iter().any(|s| s.contains(&'m')) {
                return Err("MTP layers 'm' must be on the last virtual stage, with the loss (Sextant does not model Megatron's standalone MTP stage)".into());
            }
        }
        let layers: Vec<u64> = stages
            .iter()
            .map(|s| s.iter().filter(|&&c| c == 't').count() as u64)
            .collect();
        if layers.iter().sum::<u64>() == 0 {
            return Err("the pipeline layout holds no decoder layer 't'".into());
        }
        Ok(MegatronLayout {
            layout: Layout::Explicit { layers },
            vpp: n / pp,
            mtp_layers: mtp,
        })
    }
}

/// What a Megatron layout string states: the per-virtual-stage decoder layers,
/// the virtual stages per rank it implies and its MTP layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MegatronLayout {
    pub layout: Layout,
    pub vpp: u64,
    pub mtp_layers: u64,
}

/// How deep `(...)` groups of a layout may nest: each level is a stack frame of
/// [`expand_layout`], so an unbounded depth would overflow the stack.
const MAX_LAYOUT_DEPTH: usize = 16;

/// Expands repetitions of a Megatron layout from `pos` to the end or to the
/// closing parenthesis of this group, refusing more than `max` entries.
fn expand_layout(
    chars: &[char],
    pos: &mut usize,
    depth: usize,
    max: usize,
) -> Result<Vec<char>, String> {
    let mut out: Vec<char> = Vec::new();
    while *pos < chars.len() {
        let c = chars[*pos];
        let item: Vec<char> = match c {
            'E' | 't' | 'm' | 'L' | '|' => {
                *pos += 1;
                vec![c]
            }
            '(' if depth >= MAX_LAYOUT_DEPTH => {
                return Err(format!(
                    "the pipeline layout nests parentheses more than {MAX_LAYOUT_DEPTH} deep (character {}); Megatron's layouts need one or two levels",
                    *pos + 1
                ))
            }
            '(' => {
                *pos += 1;
                let inner = expand_layout(chars, pos, depth + 1, max)?;
                if chars.get(*pos) != Some(&')') {
                    return Err("an opening '(' in the pipeline layout is never closed".into());
                }
                *pos += 1;
                if chars.get(*pos) != Some(&'*') {
                    return Err("a parenthesised group in the pipeline layout needs a repeat count, as in (t*4|)*14".into());
                }
                inner
            }
            ')' if depth > 0 => return Ok(out),
            ')' => return Err(format!("unmatched ')' at character {} of the pipeline layout", *pos + 1)),
            '*' => return Err(format!("'*' at character {} repeats nothing", *pos + 1)),
            other => return Err(format!("'{other}' is not a pipeline layout character (E embedding, t decoder layer, m MTP layer, L loss, | stage break, x*n and (...)*n repeats)")),
        };
        let mut times = 1usize;
        if chars.get(*pos) == Some(&'*') {
            *pos += 1;
            let start = *pos;
            while chars.get(*pos).is_some_and(|c| c.is_ascii_digit()) {
                *pos += 1;
            }
            let digits: String = chars[start..*pos].iter().collect();
            times = digits
                .parse()
                .map_err(|_| format!("'*' at character {start} needs a whole repeat count"))?;
        }
        if out.len().saturating_add(item.len().saturating_mul(times)) > max {
            return Err(format!(
                "the pipeline layout expands to more than {max} entries"
            ));
        }
        for _ in 0..times {
            out.extend_from_slice(&item);
        }
    }
    if depth > 0 {
        return Err("an opening '(' in the pipeline layout is never closed".into());
    }
    Ok(out)
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
/// Largest sequence length (tokens) and global batch (sequences) accepted.
pub const MAX_SEQ: u64 = 1 << 24;
pub const MAX_GLOBAL_BATCH: u64 = 1 << 32;

impl Workload {
    /// Tokens the busiest of `ep` expert-parallel ranks processes over the
    /// balanced share, and the fraction dropped ([`crate::routing::rank_load`]).
    pub fn moe_rank_load(&self, moe: &crate::model::Moe, ep: u64) -> crate::routing::RankLoad {
        crate::routing::rank_load(moe, ep, self.moe_imbalance, self.moe_capacity)
    }

    /// Checks the ranges; the message names the field and what would be right.
    pub fn validate(&self) -> Result<(), String> {
        if self.seq < 2 || self.seq > MAX_SEQ {
            return Err(format!(
                "sequence length {} is out of range: use 2 to {MAX_SEQ} tokens",
                self.seq
            ));
        }
        if self.global_batch == 0 || self.global_batch > MAX_GLOBAL_BATCH {
            return Err(format!(
                "global batch {} is out of range: use 1 to {MAX_GLOBAL_BATCH} sequences",
                self.global_batch
            ));
        }
        if !(self.moe_imbalance.is_finite() && (1.0..=64.0).contains(&self.moe_imbalance)) {
            return Err(format!(
                "MoE imbalance {} is out of range: use 1.0 (balanced) up to 64",
                self.moe_imbalance
            ));
        }
        if let Some(c) = &self.moe_capacity {
            c.validate()?;
        }
        Ok(())
    }
}

/// Rank order used to place groups on the machine (Megatron's default).
pub const RANK_ORDER: &str = "tp-cp-ep-dp-pp";

impl ParallelConfig {
    /// Gradient-accumulation steps (micro-batches per step per pipeline).
    pub fn micro_batches(&self, w: &Workload) -> u64 {
        w.global_batch / self.mbs.saturating_mul(self.dp).max(1)
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

    /// Layers held by each virtual stage, in pipeline order (`pp * vpp` entries,
    /// virtual stage `j * pp + i` lives on rank `i`). Errors say why it cannot split.
    pub fn stage_layers(&self, layers: u64) -> Result<Vec<u64>, Rejection> {
        let chunks = self.pp.saturating_mul(self.vpp);
        match &self.layout {
            Layout::Even => {
                if !layers.is_multiple_of(chunks) {
                    return Err(if self.vpp > 1 && layers.is_multiple_of(self.pp) {
                        Rejection::VppLayers {
                            vpp: self.vpp,
                            per_stage: layers / self.pp,
                        }
                    } else {
                        Rejection::PpLayers {
                            pp: self.pp,
                            layers,
                        }
                    });
                }
                Ok(vec![layers / chunks; chunks as usize])
            }
            Layout::AccountEmbeddingLoss => {
                if !(layers + 2).is_multiple_of(chunks) || (layers + 2) / chunks < 2 && chunks > 1 {
                    return Err(Rejection::Layout {
                        detail: format!(
                            "layers + embedding + loss = {} is not a multiple of pp x vpp = {chunks}",
                            layers + 2
                        ),
                    });
                }
                let per = (layers + 2) / chunks;
                let mut v = vec![per; chunks as usize];
                if chunks == 1 {
                    v[0] = layers;
                } else {
                    v[0] -= 1;
                    *v.last_mut().unwrap() -= 1;
                }
                Ok(v)
            }
            Layout::FirstLast { first, last } => {
                if self.vpp != 1 {
                    return Err(Rejection::Layout { detail: "first/last stage layer counts are supported here only without virtual stages".into() });
                }
                if self.pp < 2 || first + last > layers {
                    return Err(Rejection::Layout { detail: format!("first {first} + last {last} layers need pp >= 2 and at most {layers} layers") });
                }
                let middle = layers - first - last;
                let mids = self.pp - 2;
                if (mids == 0 && middle != 0) || (mids > 0 && !middle.is_multiple_of(mids)) {
                    return Err(Rejection::Layout {
                        detail: format!("the {middle} layers left for the {mids} middle stages do not split evenly"),
                    });
                }
                let mut v = vec![*first];
                v.extend(std::iter::repeat_n(
                    middle.checked_div(mids).unwrap_or(0),
                    mids as usize,
                ));
                v.push(*last);
                Ok(v)
            }
            Layout::Explicit { layers: list } => {
                if list.len() as u64 != chunks || list.iter().sum::<u64>() != layers {
                    return Err(Rejection::Layout {
                        detail: format!(
                            "explicit layout has {} entries summing to {}; need pp x vpp = {chunks} entries summing to {layers}",
                            list.len(),
                            list.iter().sum::<u64>()
                        ),
                    });
                }
                Ok(list.clone())
            }
        }
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

    /// Megatron-Core's rules for `recompute_modules` (`TransformerConfig.__post_init__`):
    /// a set other than the default only with selective recomputation;
    /// `mla_up_proj` only with MLA; `moe_act` only with (grouped-GEMM) experts.
    /// Modules that would replay nothing in this model (`moe`, `shared_experts`,
    /// `mlp` with no part to act on) are refused too, so that a plan never names a
    /// saving it does not get.
    pub fn check_recompute_modules(&self, model: &ModelSpec) -> Result<(), Rejection> {
        let m = self.recompute_modules;
        let fail = |detail: String| Err(Rejection::RecomputeModules { detail });
        if self.recompute != Recompute::Selective {
            if m != RecomputeModules::DEFAULT {
                return fail(format!(
                    "{m} needs selective recomputation (the recompute setting is {})",
                    self.recompute
                ));
            }
            return Ok(());
        }
        m.check_for(model)
            .map_err(|detail| Rejection::RecomputeModules { detail })
    }

    /// The recomputation in one short word for tables: none, sel, full, or
    /// sel:MODULES when selective recomputation replays other than Megatron's default.
    pub fn recompute_label(&self) -> String {
        match self.recompute {
            Recompute::Selective if self.recompute_modules != RecomputeModules::DEFAULT => {
                format!("sel:{}", self.recompute_modules)
            }
            r => r.to_string(),
        }
    }

    /// Whether selective recomputation replays module `m`.
    pub fn recomputes(&self, m: RecomputeModules) -> bool {
        self.recompute == Recompute::Selective && self.recompute_modules.contains(m)
    }

    /// Whether Megatron runs this plan with `--overlap-moe-expert-parallel-comm`:
    /// asked for, and allowed by its rules (DualPipe's own overlap needs no flag).
    pub fn megatron_ep_overlap(&self, w: &Workload) -> bool {
        self.overlap.ep_comm && self.schedule != Schedule::DualPipe && self.ep_overlap(w).is_some()
    }

    /// The pipeline schedule's rules: interleaving needs virtual stages and the
    /// others one chunk per rank; ZB-H1, DualPipe and GPipe need a pipeline;
    /// DualPipe needs an even pp and an even number of micro-batches, at least
    /// 2 x pp (deepseek-ai/DualPipe asserts both).
    pub fn check_schedule(&self, w: &Workload) -> Result<(), Rejection> {
        let s = self.schedule;
        let reject = |detail: String| {
            Err(Rejection::Schedule {
                schedule: s,
                detail,
            })
        };
        match s {
            Schedule::Interleaved if self.vpp < 2 => return reject("interleaved 1F1B needs vpp > 1; with vpp 1 use 1f1b".into()),
            // Megatron-Core (schedules.py, forward_backward_pipelining_with_interleaving,
            // main d98e8a6): micro-batches run in groups of
            // `microbatch_group_size_per_vp_stage`, default pp (model_parallel_config.py);
            // a group size above m raises ValueError, and a last group smaller than pp
            // raises RuntimeError. With the default group the rule is m % pp == 0
            // (so m >= pp): what the Megatron-LM, Core, Bridge and NeMo exports run.
            Schedule::Interleaved => {
                let m = self.micro_batches(w);
                if !m.is_multiple_of(self.pp) {
                    return reject(format!(
                        "interleaved 1F1B runs micro-batches in groups of pp = {}; the {m} micro-batches per step must be a multiple of it (Megatron-Core's rule)",
                        self.pp
                    ));
                }
            }
            _ if self.vpp > 1 => {
                return reject(format!("{} runs one model chunk per rank{}; use vpp 1, or the interleaved schedule for virtual stages", s.name(), if s == Schedule::DualPipe { " pair (stages r and pp-1-r)" } else { "" }))
            }
            Schedule::OneFOneB => {}
            _ if self.pp < 2 => return reject(format!("{} needs pipeline parallel size > 1", s.name())),
            _ => {}
        }
        // ZB-H1's schedule (Qi et al. 2023, section 3) is drawn for m >= p: with
        // fewer micro-batches its W's cannot fill the drain it is defined by.
        if s == Schedule::ZbH1 && self.micro_batches(w) < self.pp {
            return reject(format!(
                "ZB-H1 needs at least pp = {} micro-batches per step (has {})",
                self.pp,
                self.micro_batches(w)
            ));
        }
        if s == Schedule::DualPipe {
            let m = self.micro_batches(w);
            if !self.pp.is_multiple_of(2) {
                return reject(format!(
                    "DualPipe needs an even pipeline parallel size (has {})",
                    self.pp
                ));
            }
            if !m.is_multiple_of(2) || m < 2 * self.pp {
                return reject(format!("DualPipe needs an even number of micro-batches, at least 2 x pp = {} (has {m})", 2 * self.pp));
            }
        }
        Ok(())
    }

    /// Checks every structural rule. Memory is checked by the estimator.
    pub fn check(
        &self,
        model: &ModelSpec,
        cluster: &Cluster,
        w: &Workload,
    ) -> Result<(), Rejection> {
        let gpus = cluster.gpus;
        for (name, v) in [
            ("tp", self.tp),
            ("pp", self.pp),
            ("vpp", self.vpp),
            ("cp", self.cp),
            ("ep", self.ep),
            ("etp", self.etp),
            ("dp", self.dp),
            ("mbs", self.mbs),
        ] {
            if v == 0 || v > MAX_KNOB {
                return Err(Rejection::Zero { name: name.into() });
            }
        }
        if let Err(e) = w.validate() {
            return Err(Rejection::Layout { detail: e });
        }
        if self.gpus() != gpus {
            return Err(Rejection::GpuProduct {
                tp: self.tp,
                pp: self.pp,
                cp: self.cp,
                dp: self.dp,
                gpus,
            });
        }
        if self.sp && self.tp == 1 {
            return Err(Rejection::SpWithoutTp);
        }
        if !model.heads.is_multiple_of(self.tp) {
            return Err(Rejection::TpHeads {
                tp: self.tp,
                heads: model.heads,
                valid: divisors(model.heads),
            });
        }
        if model.mla.is_none()
            && !model.kv_heads.is_multiple_of(self.tp)
            && !self.tp.is_multiple_of(model.kv_heads)
        {
            return Err(Rejection::TpKvHeads {
                tp: self.tp,
                kv_heads: model.kv_heads,
            });
        }
        let dense_layers = model.layers - model.moe_layers();
        if dense_layers > 0 && !model.ffn_hidden.is_multiple_of(self.tp) {
            return Err(Rejection::TpFfn {
                tp: self.tp,
                ffn: model.ffn_hidden,
            });
        }
        let domain = cluster.profile.node.nvlink_domain;
        if self.tp > domain && !cluster.allow_tp_beyond_nvlink {
            return Err(Rejection::TpBeyondNvlink {
                tp: self.tp,
                domain,
            });
        }
        if self.pp > model.layers {
            return Err(Rejection::PpLayers {
                pp: self.pp,
                layers: model.layers,
            });
        }
        if self.vpp > 1 && self.pp == 1 {
            return Err(Rejection::VppWithoutPp);
        }
        self.check_schedule(w)?;
        let chunks = self.stage_layers(model.layers)?;
        // Only the first and last virtual stage may be empty (holding just the
        // embedding or the loss), and only when the layout says so.
        let edge_ok = matches!(
            self.layout,
            Layout::AccountEmbeddingLoss | Layout::Explicit { .. }
        );
        let last = chunks.len() - 1;
        if chunks
            .iter()
            .enumerate()
            .any(|(i, &l)| l == 0 && !(edge_ok && (i == 0 || i == last) && last > 0))
        {
            return Err(Rejection::Layout {
                detail: "a pipeline stage would hold no layer".into(),
            });
        }
        if !w.seq.is_multiple_of(2 * self.cp) && self.cp > 1 {
            return Err(Rejection::CpSeq {
                cp: self.cp,
                seq: w.seq,
            });
        }
        match &model.moe {
            None => {
                if self.ep != 1 || self.etp != 1 {
                    return Err(Rejection::EpDenseModel);
                }
            }
            Some(moe) => {
                if moe.experts % self.ep != 0 {
                    return Err(Rejection::EpExperts {
                        ep: self.ep,
                        experts: moe.experts,
                    });
                }
                let span = self.tp * self.cp * self.dp;
                if !span.is_multiple_of(self.ep * self.etp) {
                    return Err(Rejection::EpSpan {
                        ep: self.ep,
                        etp: self.etp,
                        span,
                    });
                }
                if moe.expert_ffn_hidden % self.etp != 0 {
                    return Err(Rejection::EtpFfn {
                        etp: self.etp,
                        ffn: moe.expert_ffn_hidden,
                    });
                }
                if self.etp > domain && !cluster.allow_tp_beyond_nvlink {
                    return Err(Rejection::TpBeyondNvlink {
                        tp: self.etp,
                        domain,
                    });
                }
                // Megatron-Core: "When using expert parallelism and tensor
                // parallelism, sequence parallelism must be used"
                // (ModelParallelConfig.__post_init__, megatron/core/model_parallel_config.py;
                // an error in core_v0.13-0.14, a warning since).
                if self.ep > 1 && self.tp > 1 && !self.sp {
                    return Err(Rejection::MoeNeedsSp { tp: self.tp });
                }
            }
        }
        self.check_recompute_modules(model)?;
        if !w.global_batch.is_multiple_of(self.mbs * self.dp) {
            return Err(Rejection::Batch {
                gbs: w.global_batch,
                mbs: self.mbs,
                dp: self.dp,
            });
        }
        Ok(())
    }
}

/// All divisors of `n`, ascending.
pub fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut i = 1;
    while i * i <= n {
        if n.is_multiple_of(i) {
            small.push(i);
            if i * i != n {
                large.push(n / i);
            }
        }
        i += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// Why a configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Rejection {
    Zero {
        name: String,
    },
    GpuProduct {
        tp: u64,
        pp: u64,
        cp: u64,
        dp: u64,
        gpus: u64,
    },
    SpWithoutTp,
    TpHeads {
        tp: u64,
        heads: u64,
        valid: Vec<u64>,
    },
    TpKvHeads {
        tp: u64,
        kv_heads: u64,
    },
    TpFfn {
        tp: u64,
        ffn: u64,
    },
    TpBeyondNvlink {
        tp: u64,
        domain: u64,
    },
    PpLayers {
        pp: u64,
        layers: u64,
    },
    VppLayers {
        vpp: u64,
        per_stage: u64,
    },
    VppWithoutPp,
    Schedule {
        schedule: Schedule,
        detail: String,
    },
    Layout {
        detail: String,
    },
    CpSeq {
        cp: u64,
        seq: u64,
    },
    EpDenseModel,
    EpExperts {
        ep: u64,
        experts: u64,
    },
    EpSpan {
        ep: u64,
        etp: u64,
        span: u64,
    },
    EtpFfn {
        etp: u64,
        ffn: u64,
    },
    MoeNeedsSp {
        tp: u64,
    },
    Batch {
        gbs: u64,
        mbs: u64,
        dp: u64,
    },
    RecomputeModules {
        detail: String,
    },
    OutOfMemory {
        stage: u64,
        needed_gib: f64,
        usable_gib: f64,
        reserve_gib: f64,
    },
}

/// Rejection reasons without their numbers, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectKind {
    TpHeads,
    TpKvHeads,
    TpFfn,
    TpBeyondNvlink,
    PpLayers,
    VppLayers,
    Schedule,
    Layout,
    CpSeq,
    EpExperts,
    EpSpan,
    EtpFfn,
    MoeNeedsSp,
    Batch,
    OutOfMemory,
    Other,
}

impl RejectKind {
    pub fn describe(self) -> &'static str {
        match self {
            RejectKind::TpHeads => "TP does not divide attention heads",
            RejectKind::TpKvHeads => "TP neither divides nor is a multiple of KV heads",
            RejectKind::TpFfn => "TP does not divide the FFN hidden size",
            RejectKind::TpBeyondNvlink => "TP larger than the NVLink domain",
            RejectKind::PpLayers => "PP does not divide the layers",
            RejectKind::VppLayers => "virtual stages do not divide layers per stage",
            RejectKind::Schedule => "pipeline schedule does not fit the shape",
            RejectKind::Layout => "no valid stage layout",
            RejectKind::CpSeq => "sequence not divisible into 2 x CP chunks",
            RejectKind::EpExperts => "EP does not divide the experts",
            RejectKind::EpSpan => "EP x expert-TP does not divide TP x CP x DP",
            RejectKind::EtpFfn => "expert-TP does not divide the expert FFN",
            RejectKind::MoeNeedsSp => "EP with TP > 1 needs sequence parallelism",
            RejectKind::Batch => "global batch not divisible by micro-batch x DP",
            RejectKind::OutOfMemory => "does not fit in GPU memory",
            RejectKind::Other => "other",
        }
    }
}

impl Rejection {
    pub fn kind(&self) -> RejectKind {
        match self {
            Rejection::TpHeads { .. } => RejectKind::TpHeads,
            Rejection::TpKvHeads { .. } => RejectKind::TpKvHeads,
            Rejection::TpFfn { .. } => RejectKind::TpFfn,
            Rejection::TpBeyondNvlink { .. } => RejectKind::TpBeyondNvlink,
            Rejection::PpLayers { .. } => RejectKind::PpLayers,
            Rejection::VppLayers { .. } | Rejection::VppWithoutPp => RejectKind::VppLayers,
            Rejection::Schedule { .. } => RejectKind::Schedule,
            Rejection::Layout { .. } => RejectKind::Layout,
            Rejection::CpSeq { .. } => RejectKind::CpSeq,
            Rejection::EpExperts { .. } => RejectKind::EpExperts,
            Rejection::EpSpan { .. } => RejectKind::EpSpan,
            Rejection::EtpFfn { .. } => RejectKind::EtpFfn,
            Rejection::MoeNeedsSp { .. } => RejectKind::MoeNeedsSp,
            Rejection::Batch { .. } => RejectKind::Batch,
            Rejection::OutOfMemory { .. } => RejectKind::OutOfMemory,
            Rejection::Zero { .. }
            | Rejection::GpuProduct { .. }
            | Rejection::SpWithoutTp
            | Rejection::EpDenseModel
            | Rejection::RecomputeModules { .. } => RejectKind::Other,
        }
    }
}

fn list(v: &[u64]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Zero { name } => write!(f, "{name} must be between 1 and {MAX_KNOB}"),
            Rejection::GpuProduct { tp, pp, cp, dp, gpus } => write!(
                f,
                "tp x pp x cp x dp = {tp} x {pp} x {cp} x {dp} = {} but the cluster has {gpus} GPUs",
                tp * pp * cp * dp
            ),
            Rejection::SpWithoutTp => write!(f, "sequence parallelism needs tensor parallel size > 1"),
            Rejection::TpHeads { tp, heads, valid } => write!(
                f,
                "tensor parallel size {tp} does not divide {heads} attention heads (valid: {})",
                list(valid)
            ),
            Rejection::TpKvHeads { tp, kv_heads } => write!(
                f,
                "tensor parallel size {tp} neither divides {kv_heads} KV heads nor is a multiple of them (KV heads can only be split or replicated whole)"
            ),
            Rejection::TpFfn { tp, ffn } => write!(f, "tensor parallel size {tp} does not divide FFN hidden size {ffn}"),
            Rejection::TpBeyondNvlink { tp, domain } => write!(
                f,
                "tensor parallel size {tp} spans more than the NVLink domain of {domain} GPUs (TP must stay on NVLink; --allow-tp-across-nodes lifts this)"
            ),
            Rejection::PpLayers { pp, layers } => write!(
                f,
                "pipeline parallel size {pp} does not divide {layers} layers (state an uneven split: --account-embedding-loss, --first-stage-layers/--last-stage-layers, or --layers-per-stage)"
            ),
            Rejection::VppLayers { vpp, per_stage } => write!(
                f,
                "{vpp} virtual stages do not divide the {per_stage} layers per pipeline stage"
            ),
            Rejection::VppWithoutPp => write!(f, "virtual pipeline stages need pipeline parallel size > 1"),
            Rejection::Schedule { schedule, detail } => write!(f, "pipeline schedule {schedule}: {detail}"),
            Rejection::Layout { detail } => write!(f, "stage layout: {detail}"),
            Rejection::CpSeq { cp, seq } => write!(
                f,
                "context parallel size {cp} needs the sequence ({seq}) divisible by 2 x {cp} = {} (two chunks per rank)",
                2 * cp
            ),
            Rejection::EpDenseModel => write!(f, "expert parallelism needs an MoE model (this one is dense): use ep = etp = 1"),
            Rejection::EpExperts { ep, experts } => write!(f, "expert parallel size {ep} does not divide {experts} experts"),
            Rejection::EpSpan { ep, etp, span } => write!(
                f,
                "expert parallel x expert tensor parallel = {} does not divide tp x cp x dp = {span}, the ranks experts are carved from",
                ep * etp
            ),
            Rejection::EtpFfn { etp, ffn } => write!(f, "expert tensor parallel size {etp} does not divide expert FFN hidden size {ffn}"),
            Rejection::MoeNeedsSp { tp } => write!(f, "expert parallelism with tensor parallel size {tp} needs sequence parallelism (Megatron-Core requires it): use --sp"),
            Rejection::Batch { gbs, mbs, dp } => write!(
                f,
                "global batch {gbs} is not divisible by micro-batch {mbs} x data parallel {dp} = {}",
                mbs * dp
            ),
            Rejection::RecomputeModules { detail } => write!(f, "recompute modules: {detail}"),
            Rejection::OutOfMemory { stage, needed_gib, usable_gib, reserve_gib } => write!(
                f,
                "pipeline stage {stage} needs {needed_gib:.1} GiB per GPU (a {reserve_gib:.1} GiB reserve included) but plans may use {usable_gib:.1} GiB (HBM less the allocator headroom, --mem-headroom)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisors_are_complete_and_sorted() {
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(16), vec![1, 2, 4, 8, 16]);
    }

    fn cfg(pp: u64, vpp: u64, layout: Layout) -> ParallelConfig {
        ParallelConfig {
            tp: 1,
            pp,
            vpp,
            cp: 1,
            ep: 1,
            etp: 1,
            dp: 1,
            sp: false,
            mbs: 1,
            zero: Zero::None,
            recompute: Recompute::None,
            layout,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            recompute_modules: Default::default(),
            moe_dispatcher: Dispatcher::AllToAll,
            schedule: Schedule::default_for(vpp),
        }
    }

    #[test]
    fn layouts_split_layers() {
        assert_eq!(
            cfg(4, 2, Layout::Even).stage_layers(80).unwrap(),
            vec![10; 8]
        );
        // Llama 3.1 405B, 126 layers on pp 8 x vpp 8 with embedding and loss counted.
        let v = cfg(8, 8, Layout::AccountEmbeddingLoss)
            .stage_layers(126)
            .unwrap();
        assert_eq!(v.len(), 64);
        assert_eq!(v.iter().sum::<u64>(), 126);
        assert_eq!((v[0], v[1], v[63]), (1, 2, 1));
        assert_eq!(
            cfg(
                4,
                1,
                Layout::FirstLast {
                    first: 30,
                    last: 30
                }
            )
            .stage_layers(126)
            .unwrap(),
            vec![30, 33, 33, 30]
        );
        assert!(cfg(16, 1, Layout::Even).stage_layers(126).is_err());
        assert!(cfg(
            4,
            1,
            Layout::FirstLast {
                first: 30,
                last: 31
            }
        )
        .stage_layers(126)
        .is_err());
    }

    #[test]
    fn megatron_layout_strings() {
        // Megatron-Bridge's DeepSeek-V3 layout for pp 8 x vpp 2 (and pp 4 x vpp 4).
        let l = Layout::from_megatron("Et*4|(t*4|)*14tmL", 8).unwrap();
        let mut want = vec![4u64; 16];
        want[15] = 1;
        assert_eq!(
            (l.layout.clone(), l.vpp, l.mtp_layers),
            (
                Layout::Explicit {
                    layers: want.clone()
                },
                2,
                1
            )
        );
        assert_eq!(cfg(8, 2, l.layout).stage_layers(61).unwrap(), want);
        assert_eq!(
            Layout::from_megatron("Et*4|(t*4|)*14tmL", 4).unwrap().vpp,
            4
        );
        // Megatron's docstring example: commas are cosmetic, an MTP-and-loss-only
        // last stage is allowed.
        let l = Layout::from_megatron("Ettt|(tt|)*29,m|L", 1);
        assert!(l.unwrap_err().contains("last virtual stage"));
        let l = Layout::from_megatron("Et|(tt|)*30mL", 8).unwrap();
        assert_eq!((l.vpp, l.mtp_layers), (4, 1));
        let Layout::Explicit { layers } = &l.layout else {
            panic!()
        };
        assert_eq!(
            (
                layers.len(),
                layers[0],
                layers[31],
                layers.iter().sum::<u64>()
            ),
            (32, 1, 0, 61)
        );
        // Nested groups expand; no MTP.
        let l = Layout::from_megatron("E((t|)*2)*2tL", 5).unwrap();
        assert_eq!(
            (l.layout, l.vpp, l.mtp_layers),
            (
                Layout::Explicit {
                    layers: vec![1, 1, 1, 1, 1]
                },
                1,
                0
            )
        );
        for (bad, why) in [
            ("", "empty"),
            ("tt|ttL", "start with the embedding"),
            ("Ett|tt", "end with the loss"),
            ("Ett|tLL", "end with the loss"),
            ("Etx|tL", "'x' is not a pipeline layout character"),
            ("Et|mtL", "before the MTP layers"),
            ("Et|t|tL", "not a multiple of pp = 2"),
            ("E(t|tL", "never closed"),
            ("Et)|tL", "unmatched ')'"),
            ("E(t|)t|L", "needs a repeat count"),
            (
                format!("E{}tL", "(".repeat(50_000)).as_str(),
                "more than 16 deep",
            ),
            ("E*2t|tL", "start with the embedding"),
            ("Et*|tL", "whole repeat count"),
            ("Et*99999999999999|tL", "more than"),
            ("E|L", "no decoder layer"),
        ] {
            let e = Layout::from_megatron(bad, 2).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn schedule_rules_and_files_without_a_schedule() {
        // A file written before the field existed reads as Megatron-LM's choice.
        for (vpp, expect) in [(1u64, Schedule::OneFOneB), (2, Schedule::Interleaved)] {
            let mut v = serde_json::to_value(cfg(4, vpp, Layout::Even)).unwrap();
            v.as_object_mut().unwrap().remove("schedule");
            let back: ParallelConfig = serde_json::from_value(v).unwrap();
            assert_eq!(back.schedule, expect);
            assert_eq!(back, cfg(4, vpp, Layout::Even));
        }
        let w = |gbs: u64| Workload {
            seq: 4096,
            global_batch: gbs,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        };
        let with = |pp: u64, vpp: u64, s: Schedule| ParallelConfig {
            schedule: s,
            ..cfg(pp, vpp, Layout::Even)
        };
        let why = |c: ParallelConfig, gbs: u64| {
            c.check_schedule(&w(gbs))
                .err()
                .map(|r| r.to_string())
                .unwrap_or_default()
        };
        assert!(why(with(4, 1, Schedule::Interleaved), 8).contains("needs vpp > 1"));
        assert!(why(with(4, 2, Schedule::OneFOneB), 8).contains("use vpp 1"));
        assert!(why(with(4, 2, Schedule::DualPipe), 8).contains("use vpp 1"));
        assert!(why(with(1, 1, Schedule::ZbH1), 8).contains("needs pipeline parallel size > 1"));
        assert!(why(with(3, 1, Schedule::DualPipe), 12).contains("even pipeline parallel size"));
        assert!(why(with(4, 1, Schedule::DualPipe), 6).contains("at least 2 x pp = 8"));
        assert!(why(with(4, 1, Schedule::DualPipe), 9).contains("even number of micro-batches"));
        assert_eq!(with(4, 1, Schedule::DualPipe).check_schedule(&w(8)), Ok(()));
        assert!(why(with(4, 1, Schedule::ZbH1), 3).contains("at least pp = 4 micro-batches"));
        assert_eq!(with(4, 1, Schedule::ZbH1).check_schedule(&w(4)), Ok(()));
        // Megatron-Core's interleaving: micro-batches in groups of pp.
        assert!(why(with(4, 2, Schedule::Interleaved), 2).contains("multiple of it"));
        assert!(why(with(4, 2, Schedule::Interleaved), 6).contains("multiple of it"));
        assert_eq!(
            with(4, 2, Schedule::Interleaved).check_schedule(&w(8)),
            Ok(())
        );
        assert_eq!(with(1, 1, Schedule::OneFOneB).check_schedule(&w(3)), Ok(()));
        assert_eq!(
            with(3, 1, Schedule::DualPipe)
                .check_schedule(&w(12))
                .unwrap_err()
                .kind(),
            RejectKind::Schedule
        );
    }

    /// Module names parse in Megatron's spelling, serialise as a list, and a plan
    /// file written before the field existed reads Megatron's default; Megatron's
    /// rules reject modules the model has nothing to replay for.
    #[test]
    fn recompute_modules_parse_serialise_and_check() {
        let m = RecomputeModules::parse("mla_up_proj, mlp").unwrap();
        assert!(
            m.contains(RecomputeModules::MLP)
                && m.contains(RecomputeModules::MLA_UP_PROJ)
                && !m.contains(RecomputeModules::CORE_ATTN)
        );
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"["mla_up_proj","mlp"]"#
        );
        assert_eq!(
            serde_json::from_str::<RecomputeModules>(r#"["mlp","mla_up_proj"]"#).unwrap(),
            m
        );
        assert!(RecomputeModules::parse("attn")
            .unwrap_err()
            .contains("unknown recompute module 'attn'"));
        assert!(RecomputeModules::parse(" , ").is_err());
        let mut v = serde_json::to_value(cfg(2, 1, Layout::Even)).unwrap();
        v.as_object_mut().unwrap().remove("recompute_modules");
        v.as_object_mut().unwrap().remove("bf16_moments");
        let old: ParallelConfig = serde_json::from_value(v).unwrap();
        assert_eq!(
            (old.recompute_modules, old.bf16_moments),
            (RecomputeModules::DEFAULT, false)
        );

        let dense = crate::presets::resolve("llama3-8b").unwrap().spec;
        let ds = crate::presets::resolve("deepseek-v3").unwrap().spec;
        let sel = |m: &str| ParallelConfig {
            recompute: Recompute::Selective,
            recompute_modules: RecomputeModules::parse(m).unwrap(),
            ..cfg(1, 1, Layout::Even)
        };
        assert!(sel("mla_up_proj")
            .check_recompute_modules(&dense)
            .unwrap_err()
            .to_string()
            .contains("multi-latent attention"));
        assert!(sel("moe_act").check_recompute_modules(&dense).is_err());
        assert!(sel("mla_up_proj,mlp,moe_act,layernorm,shared_experts")
            .check_recompute_modules(&ds)
            .is_ok());
        let not_selective = ParallelConfig {
            recompute: Recompute::Full,
            ..sel("mlp")
        };
        assert!(not_selective
            .check_recompute_modules(&ds)
            .unwrap_err()
            .to_string()
            .contains("needs selective"));
        // Megatron refuses the all-to-all overlap with "moe" recomputed.
        let ep = ParallelConfig {
            ep: 2,
            overlap: Overlap {
                ep_comm: true,
                ..Overlap::default()
            },
            ..sel("moe_act")
        };
        let w = Workload {
            seq: 4096,
            global_batch: 8,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        };
        assert!(ep.ep_overlap(&w).is_some());
        assert!(ParallelConfig {
            recompute_modules: RecomputeModules::parse("moe").unwrap(),
            ..ep
        }
        .ep_overlap(&w)
        .is_none());
    }
}
