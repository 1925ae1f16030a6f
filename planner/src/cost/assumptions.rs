//! Software assumptions that are not search knobs: the attention and loss kernels,
//! the rank order groups are placed by, the framework whose memory layout an
//! estimate follows, and the CUDA graphs the run captures.

/// Software assumptions that are not search knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assumptions {
    /// Fused (flash) attention; `false` models the unfused softmax of 2021-era Megatron.
    pub flash_attention: bool,
    /// The cross-entropy implementation behind the output layer.
    pub loss: LossKernel,
    /// How the framework lays ranks out, which decides which groups share an
    /// NVLink domain.
    pub rank_order: RankOrder,
    /// The framework whose memory layout the estimate follows (Megatron-Core unless
    /// a measured run says otherwise).
    pub framework: Framework,
    /// The CUDA graphs the run captures, which the host then launches whole instead
    /// of kernel by kernel (none unless stated: Megatron-Core's default).
    pub cuda_graphs: CudaGraphs,
    /// The layer's element-wise operations that run as separate eager PyTorch
    /// kernels instead of fused ones (none unless a measured run says so).
    pub eager: EagerOps,
}

impl Default for Assumptions {
    fn default() -> Self {
        Assumptions {
            flash_attention: true,
            loss: LossKernel::default(),
            rank_order: RankOrder::default(),
            framework: Framework::default(),
            cuda_graphs: CudaGraphs::default(),
            eager: EagerOps::default(),
        }
    }
}

/// The element-wise operations of a transformer layer that a run issues as eager
/// PyTorch operators, one kernel per operator, where Transformer Engine, Apex or
/// a compiler fuses each into one pass: what a layer written in plain PyTorch runs
/// without `torch.compile` (torchtitan with compile off; Aleph Alpha's `scaling`
/// without its RMSNorm kernel). Each moves more bytes (`cost::layer`) and issues
/// more kernels (`cost::host`). Published runs state it; no search prices it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EagerOps {
    /// RMSNorm as plain operators after an upcast to FP32 (upcast, square, mean,
    /// rsqrt, product, downcast, product with the weight): torchtitan's own
    /// RMSNorm before PyTorch's, Hugging Face's, PyTorch's composite `rms_norm`.
    pub norm: bool,
    /// RMSNorm as plain operators in the input's BF16 (square, mean, rsqrt,
    /// product), then an FP32 round trip and the product with the weight: Aleph
    /// Alpha's `scaling`. At most one of `norm` and `norm_bf16`.
    pub norm_bf16: bool,
    /// The rotary embedding in plain operators on the query and key: the complex
    /// product in FP32 (upcast, product, downcast), or `rotate_half` in BF16 (the
    /// same bytes in more kernels).
    pub rotary: bool,
    /// A gated MLP's activation as `silu(gate) * up`, two kernels.
    pub glu: bool,
}

impl EagerOps {
    /// The operation names a run states.
    pub const NAMES: [&'static str; 4] = ["norm", "norm-bf16", "rotary", "glu"];

    /// Either eager RMSNorm.
    pub fn any_norm(&self) -> bool {
        self.norm || self.norm_bf16
    }

    pub fn is_none(&self) -> bool {
        *self == EagerOps::default()
    }

    /// Parses a list of [`EagerOps::NAMES`] separated by spaces, commas or `+`;
    /// `none` or an empty string is none.
    pub fn parse(text: &str) -> Result<EagerOps, String> {
        let on = name_list(text, &EagerOps::NAMES).map_err(|e| match e {
            ListError::TooLong(chars) => format!(
                "eager operations must be a short list of {} or none ({chars} characters given)",
                EagerOps::NAMES.join(", ")
            ),
            ListError::Unknown(word) => format!(
                "eager operation '{}' is not one of none, {}",
                crate::json::one_line(&word, 40),
                EagerOps::NAMES.join(", ")
            ),
            ListError::NoneAndNames => format!(
                "eager operations '{}' say none and name operations: give one or the other",
                crate::json::one_line(text, 100)
            ),
        })?;
        if on[0] && on[1] {
            return Err(format!(
                "eager operations '{}' name both norm and norm-bf16: a run's RMSNorm is one of them",
                crate::json::one_line(text, 100)
            ));
        }
        Ok(EagerOps {
            norm: on[0],
            norm_bf16: on[1],
            rotary: on[2],
            glu: on[3],
        })
    }
}

/// Why a short list of names ([`name_list`]) cannot be read.
enum ListError {
    /// Over 100 bytes or holding control characters (its length in characters).
    TooLong(usize),
    /// A word that is neither a name nor `none`.
    Unknown(String),
    /// `none` beside names.
    NoneAndNames,
}

/// Which of `names` a list separated by spaces, commas or `+` holds (`none` or an
/// empty list holds none of them), in `names`' order.
fn name_list(text: &str, names: &[&str]) -> Result<Vec<bool>, ListError> {
    if text.len() > 100 || text.chars().any(char::is_control) {
        return Err(ListError::TooLong(text.chars().count()));
    }
    let mut on = vec![false; names.len()];
    let mut none = false;
    for word in text.split([' ', ',', '+']).filter(|w| !w.is_empty()) {
        match names.iter().position(|n| *n == word) {
            Some(i) => on[i] = true,
            None if word == "none" => none = true,
            None => return Err(ListError::Unknown(word.to_string())),
        }
    }
    if none && on.contains(&true) {
        return Err(ListError::NoneAndNames);
    }
    Ok(on)
}

impl std::fmt::Display for EagerOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = [self.norm, self.norm_bf16, self.rotary, self.glu];
        write_names(f, &EagerOps::NAMES, &on)
    }
}

/// The names that are on, separated by spaces, or `none` (what [`name_list`]
/// reads back).
fn write_names(f: &mut std::fmt::Formatter<'_>, names: &[&str], on: &[bool]) -> std::fmt::Result {
    let set: Vec<&str> = names
        .iter()
        .zip(on)
        .filter(|(_, b)| **b)
        .map(|(n, _)| *n)
        .collect();
    if set.is_empty() {
        f.write_str("none")
    } else {
        f.write_str(&set.join(" "))
    }
}

/// What a run captures in CUDA graphs: Megatron-Core's per-layer scopes
/// (`--cuda-graph-impl transformer_engine --cuda-graph-modules attn moe_router
/// moe_preprocess`; `--cuda-graph-scope` before) or one graph for the whole
/// forward and backward (`full_iteration`, which needs static MoE shapes: a
/// capacity on the expert-parallel ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CudaGraphs {
    /// `TransformerLayer._forward_attention` (norm, projections, attention).
    pub attn: bool,
    /// The MoE router (and shared experts that are not overlapped).
    pub moe_router: bool,
    /// `MoELayer.preprocess` (token counts and split sizes).
    pub moe_preprocess: bool,
    /// The whole forward and backward as one graph.
    pub full_iteration: bool,
}

impl CudaGraphs {
    /// The scope names Megatron accepts.
    pub const SCOPES: [&'static str; 4] =
        ["attn", "moe_router", "moe_preprocess", "full_iteration"];

    pub fn is_none(&self) -> bool {
        *self == CudaGraphs::default()
    }

    /// Per-layer graphs (any scope but `full_iteration`), which Megatron-Core runs
    /// only without full recomputation ("full recompute is only supported with full
    /// iteration CUDA graph", TransformerConfig.__post_init__ at d98e8a6).
    pub fn per_layer(&self) -> bool {
        !self.full_iteration && !self.is_none()
    }

    /// Parses Megatron's scope list, separated by spaces, commas or `+`; `none` or
    /// an empty string is no graphs.
    pub fn parse(text: &str) -> Result<CudaGraphs, CudaGraphsError> {
        let on = name_list(text, &CudaGraphs::SCOPES).map_err(|e| match e {
            ListError::TooLong(chars) => CudaGraphsError::TooLong { chars },
            ListError::Unknown(scope) => CudaGraphsError::Unknown { scope },
            ListError::NoneAndNames => CudaGraphsError::NoneAndScopes(text.to_string()),
        })?;
        let g = CudaGraphs {
            attn: on[0],
            moe_router: on[1],
            moe_preprocess: on[2],
            full_iteration: on[3],
        };
        if g.full_iteration && (g.attn || g.moe_router || g.moe_preprocess) {
            return Err(CudaGraphsError::FullIterationNotAlone);
        }
        Ok(g)
    }
}

impl CudaGraphs {
    /// Megatron-Core's rules for these scopes on `model` with `dispatcher` and the
    /// capacity `capacity` (TransformerConfig.__post_init__ at d98e8a6): the whole
    /// step as one graph alone; router scopes only on an MoE model; the preprocess
    /// only with the router, and not where the all-to-all dispatcher copies token
    /// counts to the host (a capacity factor); a dropless MoE model's whole step
    /// not at all (its shapes change from step to step).
    pub fn check_for(
        &self,
        model: &crate::model::ModelSpec,
        dispatcher: crate::config::Dispatcher,
        capacity: Option<crate::routing::Capacity>,
    ) -> Result<(), String> {
        if self.full_iteration && (self.attn || self.moe_router || self.moe_preprocess) {
            return Err(CudaGraphsError::FullIterationNotAlone.to_string());
        }
        if (self.moe_router || self.moe_preprocess) && model.moe.is_none() {
            return Err(format!("CUDA graph scopes moe_router and moe_preprocess are for mixture-of-experts layers, and {} is dense: graph attn or full_iteration", model.name));
        }
        if self.moe_preprocess && !self.moe_router {
            return Err("CUDA graph scope moe_preprocess runs only with moe_router (Megatron-Core asserts it): give attn,moe_router,moe_preprocess or drop moe_preprocess".into());
        }
        if self.moe_preprocess
            && dispatcher == crate::config::Dispatcher::AllToAll
            && capacity.is_some()
        {
            return Err("CUDA graph scope moe_preprocess cannot be captured with the all-to-all dispatcher and a capacity factor (its preprocess copies token counts to the host; Megatron-Core asserts it): drop moe_preprocess or the capacity factor".into());
        }
        if self.full_iteration && model.moe.is_some() && !capacity.is_some_and(|c| c.pad) {
            return Err("CUDA graph scope full_iteration captures fixed shapes, which a dropless MoE layer does not have: also give a capacity factor with padding to capacity (--moe-capacity-factor, --moe-pad-to-capacity), or graph the per-layer scopes (attn,moe_router,moe_preprocess)".into());
        }
        Ok(())
    }
}

impl std::fmt::Display for CudaGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = [
            self.attn,
            self.moe_router,
            self.moe_preprocess,
            self.full_iteration,
        ];
        write_names(f, &CudaGraphs::SCOPES, &on)
    }
}

/// The training framework whose memory layout an estimate follows. The cost model
/// is Megatron-Core's; measured runs of other frameworks differ in what they keep
/// in memory, and [`crate::memory`] prices each as its code does (see
/// [`Framework::MegatronCore`] and the other variants for what differs and where it
/// is read from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framework {
    /// Megatron-Core (Megatron-LM, NeMo, Megatron-Bridge): gradients live in the
    /// DDP buffer (no second copy), the SwiGLU is fused (it keeps its input and
    /// recomputes the activation), the loss keeps the BF16 logits and an FP32 copy,
    /// selective recomputation is by module (`--recompute-modules`).
    #[default]
    MegatronCore,
    /// Hugging Face nanotron (the Ultra-Scale Playbook's benchmark runs, at
    /// e24d2483): PyTorch DDP keeps its own BF16 gradient buckets beside the FP32
    /// accumulator, the GLU runs as separate ops (`GLUActivation`: the activation's
    /// output is kept beside the product), and the loss (`sharded_cross_entropy`)
    /// holds an FP32 copy of the logits and a shifted FP32 copy.
    Nanotron,
    /// PyTorch torchtitan (FSDP2, torch.distributed.pipelining): sharded FP32
    /// parameters, gradients and Adam moments; FSDP2's unsharded buffers; selective
    /// recomputation is op-level ("op" SAC: every other matmul's output is saved);
    /// the loss is `cross_entropy` over an FP32 copy of the logits.
    Torchtitan,
    /// ScaleTorch (github.com/jianzhnie/ScaleTorch at c4c08ac): pure BF16 training.
    /// The model is cast to BF16 (trainer/model_builder.py:90, dtype from
    /// trainer/dist_setup.py:29-45), so there is no FP32 master copy and torch
    /// AdamW's moments (fused by default, trainer/config.py:253-255) are BF16.
    /// With data parallelism `DataParallelBucket` (model_builder.py:92-93) keeps
    /// FP32 gradient buckets (`grad_type` is not passed on to `BucketManager`,
    /// parallel/data_parallel/data_parallel.py:186-188, which defaults to FP32,
    /// bucket.py:194-196) and after the sync a BF16 `param.grad` copy
    /// (data_parallel.py:319-323, 346-350) until the step's `reset`. The GLU runs
    /// as separate ops (models/llama.py:247-249); the loss is `F.cross_entropy`
    /// under autocast over the BF16 logits, which stay referenced through the
    /// backward (trainer/train_step.py:98-117). Recomputation is whole decoder
    /// layers (llama.py:535-544). Anything not read there (kernels, the
    /// activations' other tensors) is priced as Megatron-Core's.
    #[serde(rename = "scaletorch")]
    ScaleTorch,
    /// Aleph Alpha's `scaling` (github.com/Aleph-Alpha/scaling at 737f855, the
    /// code as open-sourced in 2024; Hagemann et al.'s 2023 runs used its
    /// unpublished predecessor). Its data-parallel synchronisation is its own
    /// (`core/optimizer/optimizer.py` `step`, `allreduce.py`,
    /// `parameter_group.py` `step_sequel`): nothing of it overlaps the backward.
    /// After the last micro-batch the optimizer all-reduces every gradient over the
    /// data-parallel group in FP32 (`allreduce_tensor_in_float32`, buckets of
    /// `allreduce_bucket_size` = 500M elements, flattened, cast and copied back),
    /// an all-reduce even under its ZeRO-1 (`zero: true`), where each rank then
    /// steps the FP32 shard it owns and the updated BF16 parameters are
    /// all-gathered after the step. Gradients accumulate in BF16 on the
    /// parameters. Its pipeline runs DeepSpeed's `TrainSchedule` order, which
    /// steps like 1F1B. Anything not read there (kernels, activations, the loss)
    /// is priced as Megatron-Core's. No search plans for it; published runs
    /// state it.
    Scaling,
}

impl Framework {
    pub const NAMES: &'static str = "megatron-core, nanotron, torchtitan, scaletorch, scaling";

    /// Whether the cost model counts this framework's dense-layer kernels, and so
    /// prices the GPU waiting for its host (`cost/host.rs`).
    pub fn counts_dense_kernels(self) -> bool {
        matches!(
            self,
            Framework::MegatronCore | Framework::Nanotron | Framework::Scaling
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Framework::MegatronCore => "megatron-core",
            Framework::Nanotron => "nanotron",
            Framework::Torchtitan => "torchtitan",
            Framework::ScaleTorch => "scaletorch",
            Framework::Scaling => "scaling",
        }
    }

    /// The framework a plan file or a published row names, spelt exactly.
    pub fn parse(s: &str) -> Option<Framework> {
        [
            Framework::MegatronCore,
            Framework::Nanotron,
            Framework::Torchtitan,
            Framework::ScaleTorch,
            Framework::Scaling,
        ]
        .into_iter()
        .find(|f| f.name() == s)
    }

    pub fn is_megatron_core(&self) -> bool {
        *self == Framework::MegatronCore
    }

    /// What `cfg` asks that this framework cannot run, in one line; `Ok` where it
    /// can. Only Aleph Alpha's `scaling` is checked here (737f855): its optimizer
    /// shards nothing but its own state (`zero: true`, ZeRO-1) and keeps FP32 Adam
    /// moments (torch's AdamW on FP32 shards); its pipeline is DeepSpeed's
    /// `TrainSchedule` (1F1B, no virtual stages); it has no context or expert
    /// parallelism; it checkpoints every layer or none (`every_layer`,
    /// `disabled`; `every_pipe_stage` is not priced). The search and the other
    /// frameworks' rules live elsewhere (`config`, the exports).
    pub fn check_config(self, cfg: &crate::config::ParallelConfig) -> Result<(), String> {
        use crate::config::{Recompute, Zero};
        if self != Framework::Scaling {
            return Ok(());
        }
        let why = if matches!(cfg.zero, Zero::Zero2 | Zero::Zero3) {
            "ZeRO 0 or 1 (its `zero: true` shards the optimizer state only)"
        } else if cfg.vpp > 1 || cfg.schedule != crate::schedule::Schedule::OneFOneB {
            "the 1F1B schedule without virtual stages (DeepSpeed's TrainSchedule)"
        } else if cfg.cp > 1 {
            "no context parallelism"
        } else if cfg.ep > 1 || cfg.etp > 1 {
            "no expert parallelism"
        } else if cfg.recompute == Recompute::Selective {
            "full recomputation of every layer or none"
        } else if cfg.bf16_moments {
            "FP32 Adam moments (torch's AdamW on FP32 shards)"
        } else if cfg.overlap.tp_comm {
            "no TP communication overlap"
        } else {
            return Ok(());
        };
        Err(format!("framework scaling runs {why}"))
    }

    /// Whether sharded gradients are reduced once per step, after the last
    /// micro-batch, instead of after every one: torchtitan's pipeline stages
    /// (torch.distributed.pipelining `PipelineStage.backward_maybe_with_nosync`)
    /// turn FSDP's gradient sync off on every backward but the last, and
    /// torchtitan keeps the parameters unsharded after the forward when
    /// pipelining (so they are gathered once per step too). Megatron-FSDP and
    /// FSDP without pipelining reduce after every micro-batch.
    pub fn defers_sharded_grad_sync(self, pp: u64) -> bool {
        self == Framework::Torchtitan && pp > 1
    }
}

/// The rank layouts the cost model places groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RankOrder {
    /// Megatron-Core's default `tp-cp-ep-dp-pp` (parallel_state.py `order`): TP,
    /// then CP, then DP consecutive, PP slowest.
    #[default]
    Megatron,
    /// ScaleTorch's `ProcessGroupManager` grid `[DP, PP, CP, EP, TP]`
    /// (scaletorch/parallel/process_group.py): TP fastest, then EP, CP, PP, DP, so
    /// a pipeline sits inside each data-parallel replica.
    ScaleTorch,
}

impl RankOrder {
    /// The order as the rank-map and plan files spell it, fastest first.
    pub fn order(self) -> &'static str {
        match self {
            RankOrder::Megatron => crate::config::RANK_ORDER,
            RankOrder::ScaleTorch => crate::ranks::SCALETORCH_ORDER,
        }
    }
}

/// How the loss over the vocabulary-parallel logits runs. The three differ in how many
/// element-wise passes they make over the logits; [`LossKernel::bytes_per_logit`]
/// counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossKernel {
    /// Transformer Engine's Triton kernel (`cross_entropy_fusion_impl = "te"`), as of
    /// the 2026-04 containers: it reads the BF16 logits and writes the gradient in
    /// place.
    Te,
    /// Megatron's own fusion (`--cross-entropy-loss-fusion`, the `native` impl), the
    /// only one Megatron-LM allows since it disabled TE's in June 2026.
    #[default]
    Native,
    /// Without `--cross-entropy-loss-fusion` (Megatron-LM's default), and the only
    /// loss Megatron-LM had before June 2024.
    Unfused,
    /// torchtitan's `cross_entropy(pred.float())` under `torch.compile`: with
    /// `[compile] enable` its loss is compiled by default (`components = ["model",
    /// "loss"]`, torchtitan/config/job_config.py and components/loss.py:33-35 at
    /// v0.2.2; loss.py:27-29 at e7c0cae), so Inductor fuses the FP32 upcast into
    /// the reductions: the BF16 logits and their BF16 gradient only. torchtitan's.
    Compiled,
}

impl Assumptions {
    /// Combinations no framework runs: torchtitan's compiled loss priced with
    /// another framework's layout (a hand-edited plan file or a published row).
    pub fn check(&self) -> Result<(), String> {
        if self.loss == LossKernel::Compiled && self.framework != Framework::Torchtitan {
            return Err(format!(
                "the compiled loss (torchtitan's cross-entropy under torch.compile) is torchtitan's, but the framework is {}; use it only with framework torchtitan",
                self.framework.name()
            ));
        }
        Ok(())
    }
}

impl LossKernel {
    pub const NAMES: &'static str = "te, native, unfused, compiled";

    pub fn name(self) -> &'static str {
        match self {
            LossKernel::Te => "te",
            LossKernel::Native => "native",
            LossKernel::Unfused => "unfused",
            LossKernel::Compiled => "compiled",
        }
    }

    pub fn parse(s: &str) -> Option<LossKernel> {
        [
            LossKernel::Te,
            LossKernel::Native,
            LossKernel::Unfused,
            LossKernel::Compiled,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }

    /// HBM bytes per logit (one token, one vocabulary entry on this rank) that the
    /// loss moves beyond the logits GEMM, forward and backward together.
    ///
    /// - `Te` (transformer_engine/pytorch/triton/cross_entropy.py): the online-softmax
    ///   pass reads the BF16 logits (2), the loss pass reads them again and writes the
    ///   gradient in place (2 + 2), the backward scales it by the loss gradient
    ///   (2 + 2): 10.
    /// - `Native` (megatron/core/fusions/fused_cross_entropy.py), one kernel per fused
    ///   function, the fuser's best case: the FP32 upcast with the row maximum
    ///   (2 + 4), the shifted `exp` with its row sum (4 + 4), the normalisation into the
    ///   saved softmax (4 + 4), and the backward's in-place gradient and BF16 cast
    ///   (4 + 4 + 2): 32.
    /// - `Unfused` (megatron/core/tensor_parallel/cross_entropy.py): `.float()` (2 + 4),
    ///   the max (4), the in-place subtraction (4 + 4), `exp` (4 + 4), the sum (4), the
    ///   in-place division (4 + 4); backward the in-place scaling (4 + 4) and the cast
    ///   back to BF16 (4 + 2): 52.
    /// - `Compiled` (Inductor's code for torchtitan's loss): the forward's reduction
    ///   loops over the BF16 logits for the row maximum and the sum of exponentials
    ///   (2 + 2), the backward's one pointwise kernel reads them and writes the BF16
    ///   gradient (2 + 2): 8. Counted as `Te`'s, pass by pass; no FP32 copy.
    pub fn bytes_per_logit(self) -> f64 {
        match self {
            LossKernel::Te => 2.0 + (2.0 + 2.0) + (2.0 + 2.0),
            LossKernel::Compiled => (2.0 + 2.0) + (2.0 + 2.0),
            LossKernel::Native => (2.0 + 4.0) + (4.0 + 4.0) + (4.0 + 4.0) + (4.0 + 4.0 + 2.0),
            LossKernel::Unfused => {
                (2.0 + 4.0)
                    + 4.0
                    + (4.0 + 4.0)
                    + (4.0 + 4.0)
                    + 4.0
                    + (4.0 + 4.0)
                    + (4.0 + 4.0)
                    + (4.0 + 2.0)
            }
        }
    }
}

/// Why a CUDA graph scope list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaGraphsError {
    #[error("CUDA graph scopes must be a short list of {} or none ({chars} characters given)", CudaGraphs::SCOPES.join(", "))]
    TooLong { chars: usize },
    #[error("CUDA graph scope '{scope}' is not one of none, {}", CudaGraphs::SCOPES.join(", "))]
    Unknown { scope: String },
    #[error("CUDA graph scopes '{0}' say none and name scopes: give one or the other")]
    NoneAndScopes(String),
    #[error("CUDA graph scope full_iteration already holds the per-layer scopes: give it alone")]
    FullIterationNotAlone,
}

/// A framework or target name as the command line compares it: case and the
/// separators `-` and `_` do not count (`Megatron_LM`, `Scale_Torch` and
/// `torchrun_exec` name `megatron-lm`, `scaletorch` and `torchrun-exec`), nor
/// surrounding space.
pub fn spelling_key(s: &str) -> String {
    s.trim()
        .chars()
        .filter(|c| !matches!(c, '-' | '_'))
        .map(|c| c.to_ascii_lowercase())
        .collect()
}
