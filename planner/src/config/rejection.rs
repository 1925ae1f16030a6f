//! [`Rejection`]: why a configuration cannot be used, as a value the search counts
//! by [`RejectKind`] and `estimate` prints.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::MAX_KNOB;
use crate::schedule::Schedule;

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
    TpCommNeedsSp {
        tp: u64,
    },
    GraphsWithFullRecompute,
    CpNeedsFusedAttention {
        cp: u64,
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
            RejectKind::MoeNeedsSp => "MoE with TP > 1 needs sequence parallelism",
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
            | Rejection::TpCommNeedsSp { .. }
            | Rejection::GraphsWithFullRecompute
            | Rejection::CpNeedsFusedAttention { .. }
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
            Rejection::MoeNeedsSp { tp } => write!(f, "a mixture-of-experts model with tensor parallel size {tp} needs sequence parallelism (Megatron-Core's MoE layer refuses to train without it): use --sp"),
            Rejection::TpCommNeedsSp { tp } => write!(f, "overlapping tensor-parallel communication with GEMMs (--tp-comm-overlap) needs sequence parallelism at tensor parallel size {tp} (Megatron-LM asserts it; Transformer Engine pipelines the all-gathers and reduce-scatters of sequence parallelism, not the all-reduce): use --sp or drop --tp-comm-overlap"),
            Rejection::GraphsWithFullRecompute => write!(f, "per-layer CUDA graphs (--cuda-graphs attn, moe_router, moe_preprocess) cannot be combined with full recomputation (Megatron-Core asserts \"full recompute is only supported with full iteration CUDA graph\"): use --recompute selective or none, or --cuda-graphs full_iteration"),
            Rejection::CpNeedsFusedAttention { cp } => write!(f, "context parallelism (cp {cp}) needs a fused attention kernel: Transformer Engine turns its unfused attention off under context parallelism (\"Disabling UnfusedDotProductAttention as it does not support context parallelism\", attention/dot_product_attention/utils.py), which leaves no backend (ScaleTorch's own ring attention is unfused and takes it): drop --no-flash-attention or use --cp 1"),
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
