//! Transformer model description: the shapes that change the cost of training.
//!
//! A [`ModelSpec`] is a plain value. It can come from a built-in preset
//! ([`crate::presets`]), from a Hugging Face `config.json` ([`crate::hf`]) or from
//! Sextant's own JSON model format (this type, serialised with `schema_version`).

use serde::{Deserialize, Serialize};

use crate::error::InputError;

/// Version of Sextant's own model JSON format.
pub const MODEL_SCHEMA_VERSION: u32 = 1;

/// Most parameters a model may have (2^50, about 1.1e15): far beyond any trained
/// model, and low enough that parameter and byte counts never overflow a u64.
pub const MAX_PARAMS: u64 = 1 << 50;

/// Feed-forward block type. Gated MLPs (SwiGLU, GeGLU) have three weight matrices,
/// plain ones (GeLU, squared ReLU) two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MlpKind {
    /// `down(act(gate(x)) * up(x))`: Llama, Mistral, Qwen, DeepSeek, GPT-OSS.
    Gated,
    /// `down(act(up(x)))`: GPT-3 (GeLU), Nemotron-4 (squared ReLU).
    Plain,
}

impl MlpKind {
    /// Number of `hidden x ffn` weight matrices.
    pub fn matrices(self) -> u64 {
        match self {
            MlpKind::Gated => 3,
            MlpKind::Plain => 2,
        }
    }
}

/// Normalisation layer type. Only its parameters differ in cost: LayerNorm has a
/// weight and a bias per channel, RMSNorm a weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    LayerNorm,
    RmsNorm,
}

/// Multi-head latent attention (DeepSeek-V2/V3) dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mla {
    /// Rank of the query down-projection; 0 means queries are projected directly.
    pub q_lora_rank: u64,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

/// Mixture-of-experts feed-forward layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moe {
    /// Routed experts per MoE layer.
    pub experts: u64,
    /// Experts each token is routed to.
    pub top_k: u64,
    /// FFN hidden size of one routed expert.
    pub expert_ffn_hidden: u64,
    /// Shared experts applied to every token (each of `expert_ffn_hidden`, unless
    /// `shared_ffn_hidden` is set).
    #[serde(default)]
    pub shared_experts: u64,
    /// Total FFN hidden size of the shared expert(s), when it differs from
    /// `shared_experts * expert_ffn_hidden` (Qwen2-MoE style).
    #[serde(default)]
    pub shared_ffn_hidden: Option<u64>,
    /// Leading layers that use a dense MLP of `ffn_hidden` (DeepSeek-V3: 3).
    #[serde(default)]
    pub dense_leading_layers: u64,
    /// Every `layer_freq`-th layer after the dense ones is MoE (1: all of them).
    #[serde(default = "one")]
    pub layer_freq: u64,
    /// How the router balances expert loads; sets the default imbalance.
    #[serde(default)]
    pub balancing: crate::routing::Balancing,
}

fn one() -> u64 {
    1
}

impl Moe {
    pub fn shared_hidden(&self) -> u64 {
        self.shared_ffn_hidden
            .unwrap_or(self.shared_experts.saturating_mul(self.expert_ffn_hidden))
    }
}

/// Sliding-window attention on some of the layers (GPT-OSS alternates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlidingWindow {
    pub window: u64,
    /// How many of the layers use the window (the others attend to everything).
    pub layers: u64,
}

/// Everything about a model that changes the cost of training it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    #[serde(default = "model_schema")]
    pub schema_version: u32,
    pub name: String,
    /// Where the numbers come from (paper, model card, config.json).
    #[serde(default)]
    pub source: String,
    pub layers: u64,
    pub hidden: u64,
    /// Dense MLP hidden size (used by all layers of a dense model and by the dense
    /// leading layers of an MoE model).
    pub ffn_hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    #[serde(default)]
    pub tied_embeddings: bool,
    pub mlp: MlpKind,
    /// Dropout on attention probabilities and hidden states (GPT-3 era: yes; Llama: no).
    /// Changes activation memory (the masks) and element-wise traffic.
    #[serde(default)]
    pub dropout: bool,
    /// Linear layers carry biases (GPT-3) or not (Llama).
    #[serde(default)]
    pub bias: bool,
    /// Only the query, key and value projections carry biases (Qwen2, GLM;
    /// Megatron's --add-qkv-bias); `bias` puts them on every linear layer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qkv_bias: bool,
    /// The normalisation layers; absent: LayerNorm when the linear layers carry
    /// biases (GPT-3, BLOOM), RMSNorm otherwise (Llama and its kin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm: Option<Norm>,
    #[serde(default)]
    pub mla: Option<Mla>,
    #[serde(default)]
    pub moe: Option<Moe>,
    #[serde(default)]
    pub sliding_window: Option<SlidingWindow>,
    /// Each block's output is normed again before the residual add ("sandwich"
    /// norms: Gemma 2 and 3, GLM-4): four norms per layer instead of two. Adds
    /// their weights, two more element-wise norm passes per layer and the two
    /// norms' inputs kept for the backward.
    #[serde(default)]
    pub sandwich_norms: bool,
    /// GPT-OSS's gated MLP: `x * sigmoid(1.702 x)` on the gate, both halves
    /// clamped to this limit and the linear half offset by 1 (Hugging Face
    /// `swiglu_limit`; Megatron --quick-geglu --activation-func-clamp-value
    /// --glu-linear-offset). The same FLOPs as SwiGLU; Megatron-Core runs the
    /// clamp as eager passes before its fused activation (priced in `cost::layer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub glu_clamp: Option<f64>,
    /// A learned sink logit per head in the attention softmax (GPT-OSS; Megatron
    /// --softmax-type learnable). Priced as plain attention.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_sinks: bool,
    /// An RMSNorm over each head's query and key before the rotary embedding
    /// (Qwen3, Gemma 3, GLM-4.5 with `use_qk_norm`; Megatron --qk-layernorm,
    /// TransformerConfig.qk_layernorm). Priced as plain attention: two small
    /// element-wise passes per layer. OLMo 2's norm over the whole query and key
    /// projections is not this one and is not represented.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    /// YaRN's attention factor, multiplied into the rotary embedding's cosine and
    /// sine (Hugging Face `rope_scaling` with `rope_type: yarn`: `attention_factor`,
    /// or `0.1 ln(factor) + 1` scaled by `mscale / mscale_all_dim`; Megatron's
    /// concentration factor). Absent for plain RoPE and where it is 1 (DeepSeek-V3).
    /// Transformer Engine's fused RoPE takes no such factor, so Megatron-Core runs
    /// the unfused rotary where it is not 1 (`cost::layer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yarn_attention_factor: Option<f64>,
    /// Multi-token-prediction layers (DeepSeek-V3's MTP; Megatron's
    /// `--mtp-num-layers`, Hugging Face `num_nextn_predict_layers`). Each is one
    /// more transformer layer of the last layer's kind, with its own embedding
    /// lookup, two norms, a 2h -> h projection and a second pass through the
    /// output layer and loss, all on the last pipeline stage. Not in
    /// [`ParamCounts::total`], which counts the main model as model cards do.
    #[serde(default)]
    pub mtp_layers: u64,
    /// The architecture's Hugging Face `model_type` (`llama`, `qwen3_moe`,
    /// `deepseek_v3`, ...): a preset's own config.json, or the config.json given.
    /// Nothing is priced from it; exports that must name the architecture (RLinf's
    /// `rollout.model.model_type`, which picks its weight converters) read it.
    /// `None` for a model given only by its shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_model_type: Option<String>,
}

fn model_schema() -> u32 {
    MODEL_SCHEMA_VERSION
}

/// Parameter counts, split the way sharding treats them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ParamCounts {
    /// Attention block of one layer (projections and its norm).
    pub attention: u64,
    /// Dense MLP of one layer (and its norm).
    pub dense_mlp: u64,
    /// Routed experts of one MoE layer (all of them).
    pub routed_experts: u64,
    /// Shared experts, router and norm of one MoE layer.
    pub moe_non_expert: u64,
    pub embedding: u64,
    /// Output projection (0 if tied).
    pub output: u64,
    pub total: u64,
    /// Parameters one token touches (MoE: top-k experts only), the input
    /// embedding included, as Mistral's, Qwen's and DeepSeek's model cards count
    /// (Mixtral 8x7B: 12.9B).
    pub active: u64,
    /// [`ParamCounts::active`] less the input embedding, which a token only looks
    /// up, as OpenAI's gpt-oss model card counts (gpt-oss-120b: 5.1B active). With
    /// tied embeddings the shared matrix stays: the output layer multiplies by it.
    pub active_without_embedding: u64,
}

impl ModelSpec {
    /// Width of the query projection output (heads x head_dim, or MLA's).
    pub fn q_dim(&self) -> u64 {
        match &self.mla {
            Some(m) => self.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim),
            None => self.heads * self.head_dim,
        }
    }

    /// Width of the key (and, without MLA, value) projection output.
    pub fn kv_dim(&self) -> u64 {
        match &self.mla {
            Some(m) => self.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim),
            None => self.kv_heads * self.head_dim,
        }
    }

    /// Width of the attention output fed to the output projection.
    pub fn attn_out_dim(&self) -> u64 {
        match &self.mla {
            Some(m) => self.heads * m.v_head_dim,
            None => self.heads * self.head_dim,
        }
    }

    /// Megatron-Core applies the rotary embedding unfused: a YaRN attention factor
    /// other than 1, which Transformer Engine's fused RoPE does not take (GQA/MHA
    /// attention; MLA has its own rotary path).
    pub fn rotary_unfused(&self) -> bool {
        self.mla.is_none() && self.yarn_attention_factor.is_some_and(|f| f != 1.0)
    }

    /// Head dimension used in the QK^T product.
    pub fn qk_head_dim(&self) -> u64 {
        match &self.mla {
            Some(m) => m.qk_nope_head_dim + m.qk_rope_head_dim,
            None => self.head_dim,
        }
    }

    /// Head dimension of values.
    pub fn v_head_dim(&self) -> u64 {
        match &self.mla {
            Some(m) => m.v_head_dim,
            None => self.head_dim,
        }
    }

    /// The normalisation layers the model has: the stated one, or, absent,
    /// LayerNorm when the linear layers carry biases and RMSNorm otherwise.
    pub fn norm_kind(&self) -> Norm {
        match self.norm {
            Some(n) => n,
            None if self.bias => Norm::LayerNorm,
            None => Norm::RmsNorm,
        }
    }

    /// Parameters of one normalisation layer.
    fn norm_params(&self) -> u128 {
        let h = u128::from(self.hidden);
        match self.norm_kind() {
            Norm::LayerNorm => 2 * h,
            Norm::RmsNorm => h,
        }
    }

    /// Whether layer `index` (0-based) has an MoE feed-forward block.
    pub fn is_moe_layer(&self, index: u64) -> bool {
        match &self.moe {
            Some(m) => {
                index >= m.dense_leading_layers
                    && (index - m.dense_leading_layers).is_multiple_of(m.layer_freq.max(1))
            }
            None => false,
        }
    }

    /// Number of MoE layers among layers `[start, end)`.
    pub fn moe_layers_in(&self, start: u64, end: u64) -> u64 {
        let Some(m) = &self.moe else { return 0 };
        let first = m.dense_leading_layers.max(start);
        if first >= end {
            return 0;
        }
        let f = m.layer_freq.max(1);
        // Count k >= dense with (k - dense) % f == 0 in [first, end).
        let lo = (first - m.dense_leading_layers).div_ceil(f);
        let hi = (end - m.dense_leading_layers).div_ceil(f);
        hi - lo
    }

    pub fn moe_layers(&self) -> u64 {
        self.moe_layers_in(0, self.layers)
    }

    /// Whether a multi-token-prediction layer is an MoE layer: Megatron builds it
    /// with the last decoder layer's spec.
    pub fn mtp_is_moe(&self) -> bool {
        self.moe_layers_in(self.layers.saturating_sub(1), self.layers) > 0
    }

    /// Parameters of the multi-token-prediction module, beside the shared
    /// embedding and output layer: per MTP layer one transformer layer of the last
    /// layer's kind, the 2h -> h projection and three norms (embedding, hidden and
    /// final).
    pub fn mtp_params(&self) -> u64 {
        if self.mtp_layers == 0 {
            return 0;
        }
        let [attention, dense_mlp, routed, non_expert, ..] = self.params_wide();
        let h = u128::from(self.hidden);
        let norm = self.norm_params();
        let block = attention
            + if self.mtp_is_moe() {
                routed + non_expert
            } else {
                dense_mlp
            };
        let one = block + 2 * h * h + 3 * norm;
        u64::try_from(u128::from(self.mtp_layers) * one).unwrap_or(u64::MAX)
    }

    /// Parameters of the attention projections of one layer (no norm). Counted in
    /// u128 so that [`ModelSpec::validate`] can bound the total without overflow.
    fn attention_projection_params(&self) -> u128 {
        let w = u128::from;
        let h = w(self.hidden);
        let proj = match &self.mla {
            Some(m) => {
                let q = if m.q_lora_rank > 0 {
                    h * w(m.q_lora_rank) + w(m.q_lora_rank) + w(m.q_lora_rank) * w(self.q_dim())
                } else {
                    h * w(self.q_dim())
                };
                let kv = h * (w(m.kv_lora_rank) + w(m.qk_rope_head_dim))
                    + w(m.kv_lora_rank)
                    + w(m.kv_lora_rank) * w(self.heads) * (w(m.qk_nope_head_dim) + w(m.v_head_dim));
                q + kv + w(self.attn_out_dim()) * h
            }
            None => h * (w(self.q_dim()) + 2 * w(self.kv_dim())) + w(self.attn_out_dim()) * h,
        };
        let bias = if self.bias {
            w(self.q_dim()) + 2 * w(self.kv_dim()) + h
        } else if self.qkv_bias {
            w(self.q_dim()) + 2 * w(self.kv_dim())
        } else {
            0
        };
        proj + bias
    }

    fn mlp_params(&self, ffn: u64) -> u128 {
        let (m, h, f) = (
            u128::from(self.mlp.matrices()),
            u128::from(self.hidden),
            u128::from(ffn),
        );
        let b = if self.bias { (m - 1) * f + h } else { 0 };
        m * h * f + b
    }

    pub fn params(&self) -> ParamCounts {
        let [attention, dense_mlp, routed_experts, moe_non_expert, embedding, output, total, active] =
            self.params_wide()
                .map(|n| u64::try_from(n).unwrap_or(u64::MAX));
        let active_without_embedding = if self.tied_embeddings {
            active
        } else {
            active.saturating_sub(embedding)
        };
        ParamCounts {
            attention,
            dense_mlp,
            routed_experts,
            moe_non_expert,
            embedding,
            output,
            total,
            active,
            active_without_embedding,
        }
    }

    /// [`ModelSpec::params`] in u128, in the field order of [`ParamCounts`]: no
    /// shape within the per-field bounds of `validate` overflows it.
    fn params_wide(&self) -> [u128; 8] {
        let w = u128::from;
        let h = w(self.hidden);
        let norm = self.norm_params();
        // The norm before each block, and with sandwich norms the one after it.
        let block_norms = if self.sandwich_norms { 2 * norm } else { norm };
        let attention = self.attention_projection_params() + block_norms;
        let dense_mlp = self.mlp_params(self.ffn_hidden) + block_norms;
        let (routed_experts, moe_non_expert, active_expert) = match &self.moe {
            Some(m) => {
                let one_expert = self.mlp_params(m.expert_ffn_hidden);
                let shared = if m.shared_hidden() > 0 {
                    self.mlp_params(m.shared_hidden())
                } else {
                    0
                };
                let router = h * w(m.experts);
                (
                    w(m.experts) * one_expert,
                    shared + router + block_norms,
                    w(m.top_k) * one_expert,
                )
            }
            None => (0, 0, 0),
        };
        let embedding = w(self.vocab) * h;
        let output = if self.tied_embeddings {
            0
        } else {
            w(self.vocab) * h
        };
        let moe_layers = w(self.moe_layers());
        let dense_layers = w(self.layers) - moe_layers;
        let layers = w(self.layers);
        let final_norm = norm;
        let total = layers * attention
            + dense_layers * dense_mlp
            + moe_layers * (routed_experts + moe_non_expert)
            + embedding
            + output
            + final_norm;
        let active = layers * attention
            + dense_layers * dense_mlp
            + moe_layers * (active_expert + moe_non_expert)
            + embedding
            + output
            + final_norm;
        [
            attention,
            dense_mlp,
            routed_experts,
            moe_non_expert,
            embedding,
            output,
            total,
            active,
        ]
    }

    /// Checks that the numbers describe a buildable model. Returns the first problem.
    pub fn validate(&self) -> Result<(), InputError> {
        let bad = |field: &str, why: String| {
            Err(InputError::Model {
                model: self.name.clone(),
                field: field.to_string(),
                problem: why,
            })
        };
        const MAX: u64 = 1 << 40;
        for (field, v) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("ffn_hidden", self.ffn_hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("vocab", self.vocab),
        ] {
            if v == 0 {
                return bad(field, "must be at least 1".into());
            }
            if v > MAX {
                return bad(
                    field,
                    format!("{v} is beyond any trainable model (at most {MAX})"),
                );
            }
        }
        if self.layers > 100_000 {
            return bad(
                "layers",
                format!(
                    "{} layers is not a real model (at most 100000)",
                    self.layers
                ),
            );
        }
        if self.heads > 1 << 20 || self.hidden > 1 << 24 || self.head_dim > 1 << 16 {
            return bad(
                "hidden",
                "hidden size, heads or head_dim is absurdly large".into(),
            );
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(
                "kv_heads",
                format!(
                    "{} KV heads do not divide {} attention heads (grouped-query attention needs heads % kv_heads == 0)",
                    self.kv_heads, self.heads
                ),
            );
        }
        if let Some(m) = &self.moe {
            if m.experts == 0 || m.top_k == 0 || m.expert_ffn_hidden == 0 {
                return bad(
                    "moe",
                    "experts, top_k and expert_ffn_hidden must be at least 1".into(),
                );
            }
            if m.experts > 1 << 20
                || m.expert_ffn_hidden > MAX
                || m.shared_experts > 1 << 20
                || m.shared_hidden() > MAX
            {
                return bad(
                    "moe",
                    "expert count, shared-expert count or expert size is absurdly large".into(),
                );
            }
            if m.top_k > m.experts {
                return bad(
                    "moe.top_k",
                    format!("top-k {} exceeds the {} experts", m.top_k, m.experts),
                );
            }
            if m.dense_leading_layers >= self.layers {
                return bad(
                    "moe.dense_leading_layers",
                    format!(
                        "{} dense leading layers leave no MoE layer among {}",
                        m.dense_leading_layers, self.layers
                    ),
                );
            }
            if m.layer_freq == 0 {
                return bad("moe.layer_freq", "must be at least 1".into());
            }
        }
        if let Some(m) = &self.mla {
            if m.kv_lora_rank == 0
                || m.v_head_dim == 0
                || m.qk_nope_head_dim + m.qk_rope_head_dim == 0
            {
                return bad(
                    "mla",
                    "kv_lora_rank, v_head_dim and qk head dims must be positive".into(),
                );
            }
            if [m.q_lora_rank, m.kv_lora_rank].iter().any(|&r| r > 1 << 24)
                || [m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim]
                    .iter()
                    .any(|&d| d > 1 << 16)
            {
                return bad(
                    "mla",
                    "a LoRA rank above 2^24 or a head dim above 2^16 is absurdly large".into(),
                );
            }
        }
        if self.mtp_layers > 16 {
            return bad("mtp_layers", format!("{} multi-token-prediction layers is not a real model (DeepSeek-V3 has 1; at most 16)", self.mtp_layers));
        }
        if let Some(w) = &self.sliding_window {
            if w.window == 0 || w.layers > self.layers {
                return bad(
                    "sliding_window",
                    format!("window must be positive and layers at most {}", self.layers),
                );
            }
        }
        let total = self.params_wide()[6];
        if total > u128::from(MAX_PARAMS) {
            return bad("params", format!("{total} parameters is beyond any trainable model (at most {MAX_PARAMS}, about 1.1 quadrillion)"));
        }
        Ok(())
    }

    /// Parses Sextant's own model JSON.
    pub fn from_json(text: &str) -> Result<ModelSpec, InputError> {
        let spec: ModelSpec = crate::json::from_str_known(text, "Sextant model")?;
        if spec.schema_version != MODEL_SCHEMA_VERSION {
            return Err(InputError::SchemaVersion {
                what: "model".into(),
                found: spec.schema_version,
                supported: MODEL_SCHEMA_VERSION,
            });
        }
        spec.validate()?;
        Ok(spec)
    }

    /// One line: "80 layers, hidden 8192, 64 heads (8 KV), 70.6B params", then what
    /// sets the model apart (MoE, MLA, head dim, sliding window, sandwich norms).
    pub fn summary(&self) -> String {
        let p = self.params();
        let mut s = format!(
            "{} layers, hidden {}, {} heads ({} KV), ffn {}, vocab {}, {:.1}B params",
            self.layers,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.ffn_hidden,
            self.vocab,
            p.total as f64 / 1e9
        );
        if let Some(m) = &self.moe {
            s.push_str(&format!(
                " ({:.1}B active, {:.1}B without the input embedding; {} experts top-{}, expert ffn {}",
                p.active as f64 / 1e9,
                p.active_without_embedding as f64 / 1e9,
                m.experts,
                m.top_k,
                m.expert_ffn_hidden
            ));
            if m.shared_experts > 0 {
                s.push_str(&format!(", {} shared", m.shared_experts));
            }
            if m.dense_leading_layers > 0 {
                s.push_str(&format!(", first {} dense", m.dense_leading_layers));
            }
            s.push(')');
        }
        if self.mla.is_some() {
            s.push_str(", MLA");
        } else if self.head_dim * self.heads != self.hidden {
            s.push_str(&format!(", head dim {}", self.head_dim));
        }
        if let Some(w) = &self.sliding_window {
            s.push_str(&format!(
                ", window {} on {} of {} layers",
                w.window, w.layers, self.layers
            ));
        }
        if self.sandwich_norms {
            s.push_str(", norms after each block");
        }
        s
    }
}
