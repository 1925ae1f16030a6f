//! `assumptions`: the software choices the estimates priced that are not search
//! knobs (kernels, rank order, framework, CUDA graphs). The exports launch what is
//! recorded here.

use serde::{Deserialize, Serialize};

/// The record of [`crate::cost::Assumptions`]. A plan file without it reads the
/// defaults: flash attention, the native loss, Megatron's rank order,
/// Megatron-Core's memory layout, no CUDA graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assumptions {
    pub flash_attention: bool,
    #[serde(default)]
    pub loss: LossKernel,
    #[serde(default)]
    pub rank_order: RankOrder,
    /// Written only when it is not Megatron-Core.
    #[serde(default, skip_serializing_if = "Framework::is_megatron_core")]
    pub framework: Framework,
    /// Written only when some scope is captured.
    #[serde(default, skip_serializing_if = "CudaGraphs::is_none")]
    pub cuda_graphs: CudaGraphs,
    /// Written only when some element-wise operation was priced eager.
    #[serde(default, skip_serializing_if = "EagerOps::is_none")]
    pub eager_ops: EagerOps,
}

impl Default for Assumptions {
    fn default() -> Self {
        Assumptions {
            flash_attention: true,
            loss: LossKernel::default(),
            rank_order: RankOrder::default(),
            framework: Framework::default(),
            cuda_graphs: CudaGraphs::default(),
            eager_ops: EagerOps::default(),
        }
    }
}

/// The element-wise operations priced as eager PyTorch kernels; each false (fused)
/// when absent. An operation this layer does not know is refused, not dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EagerOps {
    #[serde(default)]
    pub norm: bool,
    #[serde(default)]
    pub norm_bf16: bool,
    #[serde(default)]
    pub rotary: bool,
    #[serde(default)]
    pub glu: bool,
}

impl EagerOps {
    fn is_none(&self) -> bool {
        *self == EagerOps::default()
    }
}

/// The cross-entropy kernel: `te`, `native` (when absent), `unfused` or `compiled`
/// (torchtitan's loss under `torch.compile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossKernel {
    Te,
    #[default]
    Native,
    Unfused,
    Compiled,
}

/// The rank layout groups were placed by: `megatron` (when absent) or
/// `scaletorch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RankOrder {
    #[default]
    Megatron,
    ScaleTorch,
}

/// The framework whose memory layout the estimate follows: `megatron-core` (when
/// absent), `nanotron`, `torchtitan`, `scaletorch` or `scaling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framework {
    #[default]
    MegatronCore,
    Nanotron,
    Torchtitan,
    #[serde(rename = "scaletorch")]
    ScaleTorch,
    Scaling,
}

impl Framework {
    fn is_megatron_core(&self) -> bool {
        *self == Framework::MegatronCore
    }
}

/// Megatron-Core's CUDA-graph scopes the run captures; each false when absent. A
/// scope this layer does not know is refused, not dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaGraphs {
    #[serde(default)]
    pub attn: bool,
    #[serde(default)]
    pub moe_router: bool,
    #[serde(default)]
    pub moe_preprocess: bool,
    #[serde(default)]
    pub full_iteration: bool,
}

impl CudaGraphs {
    fn is_none(&self) -> bool {
        *self == CudaGraphs::default()
    }
}
