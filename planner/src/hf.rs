//! Import of Hugging Face `config.json` files.
//!
//! Supported `model_type`s: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3,
//! qwen3_moe, deepseek_v3 (and deepseek_v2), gpt_oss; gemma, gemma2, gemma3_text and
//! the multimodal gemma3 (its `text_config`; the vision tower is left out); phi3
//! (Phi-3, Phi-3.5-mini, Phi-4); glm (GLM-4 in transformers), glm4 (GLM-4-0414),
//! glm4_moe (GLM-4.5, 4.6), chatglm (THUDM's own GLM-4 and ChatGLM3 code); olmo2;
//! granite; starcoder2. Field names follow the `transformers` configuration classes
//! of each family; unknown fields are ignored.
//!
//! Missing fields: a config.json saved by transformers holds every field of its
//! class (`save_pretrained` leaves out only the generic `PretrainedConfig` fields,
//! such as `tie_word_embeddings`, when they equal the class default), so a missing
//! shape field means a file cut by hand and is an error naming it. Defaults apply
//! only where the class gives the absence a meaning: `num_key_value_heads` (one KV
//! head per attention head), `head_dim` (`hidden_size / num_attention_heads`),
//! `tie_word_embeddings` and the bias flags (each class's default, below); and in
//! gemma3's `text_config`, which transformers writes as a difference from
//! `Gemma3TextConfig`, every field defaults as that class does.
//!
//! What the import keeps of each family: head_dim apart from hidden / heads (Gemma,
//! GLM-4.5), grouped-query KV heads, tied embeddings, gated or plain MLPs (fused
//! QKV and gate/up projections, Phi-3's and GLM's, are the same FLOPs as separate
//! ones), the norms after each block (Gemma 2 and 3, GLM-4-0414), and which layers
//! use a sliding window and how wide (Gemma 2: every other layer; Gemma 3: five of
//! six; Mistral, Phi-3, StarCoder2: every layer), priced as windowed attention. Left
//! out, as element-wise work too small to change a plan: logit soft-capping (Gemma
//! 2's tanh on the attention scores inside the fused kernel and on the logits),
//! query/key norms (Qwen3, Gemma 3, OLMo 2, GLM-4.5), partial rotary embeddings
//! (GLM, Phi-4-mini; rotary is priced over the whole head), Granite's scalar
//! multipliers. Biases on the query, key and value projections only (Qwen2, GLM) are
//! `qkv_bias` (Megatron's --add-qkv-bias); Llama-style `attention_bias` (Q, K, V and
//! the output projection) is counted as biases on every linear layer and norm
//! (under 0.1% of the parameters).

use serde_json::Value;

use crate::error::InputError;
use crate::model::{Mla, MlpKind, ModelSpec, Moe, SlidingWindow, MODEL_SCHEMA_VERSION};
use crate::routing::Balancing;

pub const SUPPORTED_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "phi3",
    "glm",
    "glm4",
    "glm4_moe",
    "chatglm",
    "olmo2",
    "granite",
    "starcoder2",
];

/// Families whose shape Sextant cannot represent, and why.
const REFUSED: &[(&[&str], &str)] = &[
    (
        &["cohere", "cohere2", "phi", "gptj", "gpt_neox"],
        "its layers run attention and the MLP side by side from one norm (a parallel block), which Sextant does not model",
    ),
    (
        &["llama4", "llama4_text"],
        "it mixes chunked local attention, layers without positions and interleaved MoE layers, which Sextant does not model",
    ),
    (
        &[
            "qwen3_next",
            "jamba",
            "mamba",
            "mamba2",
            "falcon_h1",
            "nemotron_h",
            "granitemoehybrid",
            "zamba2",
            "lfm2",
        ],
        "it mixes attention with linear-attention or state-space layers, which Sextant does not model",
    ),
    (
        &["gemma3n"],
        "its per-layer embeddings and AltUp streams are not modelled",
    ),
];

/// `Gemma3TextConfig.__init__`'s defaults (transformers
/// `models/gemma3/configuration_gemma3.py`), which a gemma3 `text_config` leaves
/// out when they hold: gemma-3-4b's omits its 8 heads and 4 KV heads, every size
/// omits the 262,208-entry vocabulary. `sliding_window_pattern` is the class's
/// backward-compatible default (five sliding layers, then a global one).
const GEMMA3_TEXT_DEFAULTS: &[(&str, u64)] = &[
    ("vocab_size", 262_208),
    ("hidden_size", 2304),
    ("intermediate_size", 9216),
    ("num_hidden_layers", 26),
    ("num_attention_heads", 8),
    ("num_key_value_heads", 4),
    ("head_dim", 256),
    ("sliding_window", 4096),
    ("sliding_window_pattern", 6),
];

/// One configuration object: the top level of config.json, or gemma3's
/// `text_config` with its class defaults.
struct Cfg<'a> {
    v: &'a Value,
    model_type: &'a str,
    /// Prefix of field names in messages ("text_config.").
    at: &'static str,
    defaults: &'static [(&'static str, u64)],
}

impl Cfg<'_> {
    fn err(&self, msg: String) -> InputError {
        InputError::HfConfig(msg)
    }

    fn default_of(&self, key: &str) -> Option<u64> {
        self.defaults
            .iter()
            .find(|(k, _)| *k == key)
            .map(|&(_, d)| d)
    }

    /// A non-negative integer field: its value, the class default of a nested
    /// config, or `None` when absent or null.
    fn opt(&self, key: &str) -> Result<Option<u64>, InputError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(self.default_of(key)),
            Some(x) => x.as_u64().map(Some).ok_or_else(|| {
                self.err(format!(
                    "field '{}{key}' is {x}, expected a non-negative integer",
                    self.at
                ))
            }),
        }
    }

    /// A field the family cannot do without.
    fn field(&self, key: &str) -> Result<u64, InputError> {
        self.opt(key)?.ok_or_else(|| self.missing(key))
    }

    fn missing(&self, key: &str) -> InputError {
        self.err(format!(
            "required field '{}{key}' is missing for model_type '{}' (a config.json saved by transformers always has it)",
            self.at, self.model_type
        ))
    }

    /// The first of several spellings of one field.
    fn first_of(&self, keys: &[&str]) -> Result<u64, InputError> {
        for k in keys {
            if let Some(x) = self.opt(k)? {
                return Ok(x);
            }
        }
        Err(self.missing(&keys.join("' or '")))
    }

    /// A positive finite number, `default` when absent or null.
    fn number(&self, key: &str, default: f64) -> Result<f64, InputError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x
                .as_f64()
                .filter(|f| f.is_finite() && *f > 0.0)
                .ok_or_else(|| {
                    self.err(format!(
                        "field '{}{key}' is {x}, expected a positive number",
                        self.at
                    ))
                }),
        }
    }

    /// A boolean field, `default` when absent or null.
    fn flag(&self, key: &str, default: bool) -> Result<bool, InputError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(x) => Err(self.err(format!(
                "field '{}{key}' is {x}, expected true or false",
                self.at
            ))),
        }
    }
}

/// Builds a [`ModelSpec`] from the text of a Hugging Face `config.json`.
/// `name` is used when the file does not say (`_name_or_path`).
pub fn from_hf_config(text: &str, name: &str) -> Result<ModelSpec, InputError> {
    let v: Value = crate::json::from_str(text, "Hugging Face config")?;
    if !v.is_object() {
        return Err(InputError::HfConfig(
            "expected a JSON object at the top level".into(),
        ));
    }
    let model_type = v.get("model_type").and_then(Value::as_str).ok_or_else(|| {
        InputError::HfConfig("field 'model_type' is missing; cannot tell the model family".into())
    })?;
    let display = v
        .get("_name_or_path")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(name)
        .to_string();
    if model_type == "gemma3" {
        // Gemma 3 4B, 12B and 27B: a vision tower and the text model of
        // `text_config`, which is what Sextant plans.
        let text = v.get("text_config").filter(|t| t.is_object()).ok_or_else(|| {
            InputError::HfConfig(
                "model_type 'gemma3' keeps its text model in the object 'text_config', which is missing".into(),
            )
        })?;
        if let Some(inner) = text.get("model_type").and_then(Value::as_str) {
            if inner != "gemma3_text" {
                return Err(InputError::HfConfig(format!(
                    "text_config.model_type is '{inner}', expected 'gemma3_text'"
                )));
            }
        }
        let cfg = Cfg {
            v: text,
            model_type: "gemma3_text",
            at: "text_config.",
            defaults: GEMMA3_TEXT_DEFAULTS,
        };
        let mut spec = build(&cfg, display)?;
        spec.source = "Hugging Face config.json (model_type gemma3: the text model of text_config; the vision tower is not modelled)".into();
        return Ok(spec);
    }
    if let Some((_, why)) = REFUSED
        .iter()
        .find(|(types, _)| types.contains(&model_type))
    {
        return Err(InputError::HfConfig(format!(
            "model_type '{model_type}' is not supported: {why}"
        )));
    }
    if !SUPPORTED_TYPES.contains(&model_type) {
        let inner = v
            .get("text_config")
            .and_then(|t| t.get("model_type"))
            .and_then(Value::as_str);
        return Err(InputError::HfConfig(match inner {
            Some(inner) => format!(
                "model_type '{model_type}' is not supported; its text model is 'text_config' (model_type '{inner}'): save that object as a config.json of its own and pass it"
            ),
            None => format!(
                "model_type '{model_type}' is not supported (supported: {})",
                SUPPORTED_TYPES.join(", ")
            ),
        }));
    }
    let cfg = Cfg {
        v: &v,
        model_type,
        at: "",
        defaults: &[],
    };
    build(&cfg, display)
}

/// `tie_word_embeddings` when absent: the class default, which `save_pretrained`
/// does not write when it matches `PretrainedConfig`'s own (true). GemmaConfig,
/// Gemma2Config, Gemma3TextConfig and Starcoder2Config tie; every other supported
/// class defaults to untied (ChatGLM's own code has a separate `output_layer`).
fn ties_by_default(model_type: &str) -> bool {
    matches!(
        model_type,
        "gemma" | "gemma2" | "gemma3_text" | "starcoder2"
    )
}

fn build(c: &Cfg, display: String) -> Result<ModelSpec, InputError> {
    let mt = c.model_type;
    // THUDM's own ChatGLM code names the shape fields after Megatron.
    let chatglm = mt == "chatglm";
    let key = |hf: &'static str, glm: &'static str| if chatglm { glm } else { hf };
    let hidden = c.field("hidden_size")?;
    let layers = c.field(key("num_hidden_layers", "num_layers"))?;
    let heads = c.field("num_attention_heads")?;
    if heads == 0 {
        return Err(c.err(format!("{}num_attention_heads is 0", c.at)));
    }
    let vocab = c.field(key("vocab_size", "padded_vocab_size"))?;
    let kv_heads = if chatglm {
        if c.flag("multi_query_attention", false)? {
            c.field("multi_query_group_num")?
        } else {
            heads
        }
    } else {
        c.opt("num_key_value_heads")?.unwrap_or(heads)
    };
    let head_dim = c
        .opt(key("head_dim", "kv_channels"))?
        .unwrap_or(hidden / heads);
    let ffn = c.opt(key("intermediate_size", "ffn_hidden_size"))?;
    let tied = c.flag("tie_word_embeddings", ties_by_default(mt))?;
    // (biases on every linear layer, on the query/key/value projections only).
    let (bias, qkv_bias) = match mt {
        // Starcoder2Config.use_bias: every linear layer and LayerNorm.
        "starcoder2" => (c.flag("use_bias", true)?, false),
        "chatglm" => (
            c.flag("add_bias_linear", false)?,
            c.flag("add_qkv_bias", false)?,
        ),
        // Qwen2's attention hard-codes Q, K and V biases (o_proj has none).
        "qwen2" => (false, c.flag("attention_bias", true)?),
        // GlmConfig and Glm4Config default to Q, K and V biases.
        "glm" | "glm4" => (false, c.flag("attention_bias", true)?),
        // Llama-style attention_bias: Q, K, V and the output projection, counted
        // as biases on every linear layer.
        _ => (c.flag("attention_bias", false)?, false),
    };
    let moe = moe(c)?;
    // The dense MLP's width, needed by every layer without experts.
    let all_moe = moe
        .as_ref()
        .is_some_and(|m| m.dense_leading_layers == 0 && m.layer_freq == 1);
    let ffn_hidden = match (ffn, &moe) {
        (Some(f), _) => f,
        (None, Some(m)) if all_moe => m.expert_ffn_hidden,
        (None, _) => return Err(c.missing(key("intermediate_size", "ffn_hidden_size"))),
    };
    let mla = match mt {
        "deepseek_v2" | "deepseek_v3" => Some(Mla {
            q_lora_rank: c.opt("q_lora_rank")?.unwrap_or(0),
            kv_lora_rank: c.field("kv_lora_rank")?,
            qk_nope_head_dim: c.field("qk_nope_head_dim")?,
            qk_rope_head_dim: c.field("qk_rope_head_dim")?,
            v_head_dim: c.field("v_head_dim")?,
        }),
        _ => None,
    };
    let spec = ModelSpec {
        schema_version: MODEL_SCHEMA_VERSION,
        name: display,
        source: format!("Hugging Face config.json (model_type {mt})"),
        layers,
        hidden,
        ffn_hidden,
        heads,
        kv_heads,
        head_dim: match &mla {
            Some(m) => m.v_head_dim,
            None => head_dim,
        },
        vocab,
        tied_embeddings: tied,
        // StarCoder2's c_fc / c_proj; every other family gates (SwiGLU, GeGLU).
        mlp: if mt == "starcoder2" {
            MlpKind::Plain
        } else {
            MlpKind::Gated
        },
        dropout: false,
        bias,
        qkv_bias,
        norm: None,
        mla,
        moe,
        sliding_window: sliding_window(c, layers)?,
        // post_attention_layernorm after attention and post_feedforward_layernorm
        // (Gemma 2, 3); post_self_attn_layernorm and post_mlp_layernorm (GLM-4-0414).
        sandwich_norms: matches!(mt, "gemma2" | "gemma3_text" | "glm4"),
        // GptOssConfig.swiglu_limit (default 7.0) and GptOssAttention's sinks.
        glu_clamp: if mt == "gpt_oss" {
            Some(c.number("swiglu_limit", 7.0)?)
        } else {
            None
        },
        attention_sinks: mt == "gpt_oss",
        // DeepSeek-V3, GLM-4.5 and MiMo state their multi-token-prediction layers.
        mtp_layers: c.opt("num_nextn_predict_layers")?.unwrap_or(0),
    };
    spec.validate()?;
    Ok(spec)
}

fn moe(c: &Cfg) -> Result<Option<Moe>, InputError> {
    let m = match c.model_type {
        "mixtral" => Moe {
            experts: c.field("num_local_experts")?,
            top_k: c.field("num_experts_per_tok")?,
            expert_ffn_hidden: c.field("intermediate_size")?,
            shared_experts: 0,
            shared_ffn_hidden: None,
            dense_leading_layers: 0,
            layer_freq: 1,
            balancing: Balancing::AuxLoss,
        },
        "qwen2_moe" | "qwen3_moe" => {
            let shared = c.opt("shared_expert_intermediate_size")?.unwrap_or(0);
            let step = c.opt("decoder_sparse_step")?.unwrap_or(1);
            let dense_only =
                c.v.get("mlp_only_layers")
                    .and_then(Value::as_array)
                    .map(|a| a.len())
                    .unwrap_or(0);
            if dense_only > 0 {
                return Err(c.err(
                    "mlp_only_layers lists dense layers at arbitrary positions; Sextant models only leading dense layers".into(),
                ));
            }
            Moe {
                experts: c.field("num_experts")?,
                top_k: c.field("num_experts_per_tok")?,
                expert_ffn_hidden: c.field("moe_intermediate_size")?,
                shared_experts: u64::from(shared > 0),
                shared_ffn_hidden: if shared > 0 { Some(shared) } else { None },
                dense_leading_layers: 0,
                layer_freq: step.max(1),
                balancing: Balancing::AuxLoss,
            }
        }
        "deepseek_v2" | "deepseek_v3" => {
            let Some(experts) = c.opt("n_routed_experts")? else {
                return Ok(None);
            };
            Moe {
                experts,
                top_k: c.field("num_experts_per_tok")?,
                expert_ffn_hidden: c.field("moe_intermediate_size")?,
                shared_experts: c.opt("n_shared_experts")?.unwrap_or(0),
                shared_ffn_hidden: None,
                dense_leading_layers: c.opt("first_k_dense_replace")?.unwrap_or(0),
                layer_freq: c.opt("moe_layer_freq")?.unwrap_or(1).max(1),
                // DeepSeek-V3's bias-corrected routing; V2 uses auxiliary losses.
                balancing: if c.v.get("topk_method").and_then(Value::as_str) == Some("noaux_tc") {
                    Balancing::LossFree
                } else {
                    Balancing::AuxLoss
                },
            }
        }
        "glm4_moe" => Moe {
            experts: c.field("n_routed_experts")?,
            top_k: c.field("num_experts_per_tok")?,
            expert_ffn_hidden: c.field("moe_intermediate_size")?,
            shared_experts: c.field("n_shared_experts")?,
            shared_ffn_hidden: None,
            dense_leading_layers: c.field("first_k_dense_replace")?,
            layer_freq: 1,
            // Glm4MoeTopkRouter keeps DeepSeek-V3's per-expert score bias
            // (e_score_correction_bias): auxiliary-loss-free balancing.
            balancing: Balancing::LossFree,
        },
        "gpt_oss" => Moe {
            experts: c.first_of(&["num_local_experts", "num_experts"])?,
            top_k: c.first_of(&["num_experts_per_tok", "experts_per_token"])?,
            expert_ffn_hidden: c.field("intermediate_size")?,
            shared_experts: 0,
            shared_ffn_hidden: None,
            dense_leading_layers: 0,
            layer_freq: 1,
            balancing: Balancing::AuxLoss,
        },
        _ => return Ok(None),
    };
    Ok(Some(m))
}

/// Which layers attend through a sliding window, and its width.
fn sliding_window(c: &Cfg, layers: u64) -> Result<Option<SlidingWindow>, InputError> {
    let listed = c.v.get("layer_types").filter(|t| !t.is_null());
    let sliding = if let Some(types) = listed {
        // Explicit per-layer types: gpt_oss, and Gemma 2 and 3 (and the Qwens)
        // saved by transformers 4.53 or later.
        let types = types
            .as_array()
            .ok_or_else(|| c.err(format!("field '{}layer_types' is not a list", c.at)))?;
        if types.len() as u64 != layers {
            return Err(c.err(format!(
                "{}layer_types lists {} layers, but the model has {layers}",
                c.at,
                types.len()
            )));
        }
        let mut sliding = 0;
        for t in types {
            match t.as_str() {
                Some("sliding_attention") => sliding += 1,
                Some("full_attention") => {}
                _ => {
                    return Err(c.err(format!(
                        "{}layer_types holds {t}; Sextant models only 'full_attention' and 'sliding_attention' layers",
                        c.at
                    )))
                }
            }
        }
        sliding
    } else {
        match c.model_type {
            // Gemma2Config: layer i slides when (i + 1) % 2 != 0, every other layer
            // from the first.
            "gemma2" => layers.div_ceil(2),
            // Gemma3TextConfig: layer i slides unless (i + 1) is a multiple of
            // sliding_window_pattern (absent: 6, five local layers to one global).
            "gemma3_text" => {
                let pattern = c.opt("sliding_window_pattern")?.unwrap_or(6);
                if pattern == 0 {
                    return Err(c.err(format!("{}sliding_window_pattern is 0", c.at)));
                }
                layers - layers / pattern
            }
            // One window on every layer when set: MistralConfig, Phi3Config and
            // Starcoder2Config use it as given; Qwen2 and Qwen3 only with
            // use_sliding_window.
            "mistral" | "phi3" | "starcoder2" => {
                if c.flag("use_sliding_window", true)? {
                    layers
                } else {
                    0
                }
            }
            _ => {
                if c.flag("use_sliding_window", false)? {
                    layers
                } else {
                    0
                }
            }
        }
    };
    if sliding == 0 {
        return Ok(None);
    }
    // Where layers are typed (listed, or by the Gemma pattern) the window is a
    // shape field; a null one leaves every layer attending to everything, as it
    // does where a single window is optional.
    let typed = listed.is_some() || matches!(c.model_type, "gemma2" | "gemma3_text");
    let window = if c.v.get("sliding_window").is_some_and(Value::is_null) {
        None
    } else if typed {
        Some(c.field("sliding_window")?)
    } else {
        c.opt("sliding_window")?
    };
    Ok(window.map(|window| SlidingWindow {
        window,
        layers: sliding,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(file: &str) -> ModelSpec {
        let path = format!("{}/../tests/data/hf/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        from_hf_config(&text, file).unwrap()
    }

    #[test]
    fn each_family_imports_with_published_shapes() {
        let l = load("llama-3.1-8b.json");
        assert_eq!(
            (
                l.layers,
                l.hidden,
                l.ffn_hidden,
                l.heads,
                l.kv_heads,
                l.head_dim,
                l.vocab
            ),
            (32, 4096, 14336, 32, 8, 128, 128256)
        );
        assert!((l.params().total as f64 / 1e9 - 8.03).abs() < 0.01);

        let m = load("mistral-7b-v0.1.json");
        assert_eq!(m.sliding_window.unwrap().window, 4096);
        assert!((m.params().total as f64 / 1e9 - 7.24).abs() < 0.01);

        let x = load("mixtral-8x7b-v0.1.json");
        let moe = x.moe.unwrap();
        assert_eq!((moe.experts, moe.top_k), (8, 2));
        assert!((x.params().total as f64 / 1e9 - 46.7).abs() < 0.1);

        let q2 = load("qwen2-7b.json");
        assert!(q2.qkv_bias && !q2.bias && q2.sliding_window.is_none());
        assert!((q2.params().total as f64 / 1e9 - 7.62).abs() < 0.02);

        let q3 = load("qwen3-8b.json");
        assert_eq!(q3.head_dim, 128);
        assert!((q3.params().total as f64 / 1e9 - 8.19).abs() < 0.02);

        let qm = load("qwen3-30b-a3b.json");
        assert_eq!(qm.moe.unwrap().expert_ffn_hidden, 768);
        assert!((qm.params().total as f64 / 1e9 - 30.5).abs() < 0.3);

        let d = load("deepseek-v3.json");
        let dm = d.moe.unwrap();
        assert_eq!(
            (
                dm.experts,
                dm.top_k,
                dm.shared_experts,
                dm.dense_leading_layers
            ),
            (256, 8, 1, 3)
        );
        assert_eq!(d.mla.unwrap().kv_lora_rank, 512);
        assert!((d.params().total as f64 / 1e9 - 671.0).abs() < 10.0);

        let g = load("gpt-oss-120b.json");
        assert_eq!(
            g.sliding_window.unwrap(),
            SlidingWindow {
                window: 128,
                layers: 18
            }
        );
        assert!((g.params().total as f64 / 1e9 - 116.8).abs() < 1.5);
        // Its clamped GLU (swiglu_limit) and attention sinks, as the preset has.
        assert_eq!((g.glu_clamp, g.attention_sinks), (Some(7.0), true));
        let preset = crate::presets::resolve("gpt-oss-120b").unwrap().spec;
        assert_eq!(
            (preset.glu_clamp, preset.attention_sinks),
            (Some(7.0), true)
        );
        assert_eq!(load("qwen3-8b.json").glu_clamp, None);
    }

    /// Parameters in billions, and its relative distance from a published count.
    fn off(m: &ModelSpec, published_billions: f64) -> f64 {
        (m.params().total as f64 / 1e9 - published_billions).abs() / published_billions
    }

    #[test]
    fn gemma_families_import_with_published_counts() {
        // Gemma 2 technical report (arXiv 2408.00118), Table 2: 9B has 917,504,000
        // embedding and 8,324,201,984 non-embedding parameters; the model card:
        // 9.24B. The non-embedding count holds only with four norms per layer.
        let g2 = load("gemma-2-9b.json");
        let p = g2.params();
        assert!(g2.tied_embeddings && g2.sandwich_norms && g2.head_dim == 256);
        assert_eq!(p.embedding, 917_504_000);
        assert_eq!(p.total - p.embedding, 8_324_201_984);
        assert!(off(&g2, 9.24) < 0.01);
        // Gemma2Config alternates: layers 0, 2, 4, ... slide over 4,096 tokens.
        assert_eq!(
            g2.sliding_window,
            Some(SlidingWindow {
                window: 4096,
                layers: 21
            })
        );

        // Gemma 3 technical report (arXiv 2503.19786), Table 1: 27B has 1,416M
        // embedding and 25,600M non-embedding parameters (and a 417M vision
        // encoder, which is not planned). Read from the multimodal config's
        // text_config, whose vocabulary is Gemma3TextConfig's default.
        let g3 = load("gemma-3-27b.json");
        let p = g3.params();
        assert_eq!((g3.vocab, g3.head_dim, g3.kv_heads), (262_208, 128, 16));
        assert!(((p.total - p.embedding) as f64 / 1e6 - 25_600.0).abs() / 25_600.0 < 0.001);
        assert!(off(&g3, 1.416 + 25.600) < 0.01);
        assert!(g3.source.contains("vision tower is not modelled"));
        // Five local layers to one global: 62 layers, 10 global.
        assert_eq!(
            g3.sliding_window,
            Some(SlidingWindow {
                window: 1024,
                layers: 52
            })
        );
        // Gemma 3 4B's text_config leaves out its 8 heads, 4 KV heads and head
        // dimension 256, which equal the class defaults; Table 1: 3,209M
        // non-embedding parameters.
        let g34 = load("gemma-3-4b.json");
        assert_eq!((g34.heads, g34.kv_heads, g34.head_dim), (8, 4, 256));
        let p = g34.params();
        assert!(((p.total - p.embedding) as f64 / 1e6 - 3_209.0).abs() / 3_209.0 < 0.001);

        // Gemma technical report (arXiv 2403.08295), Table 2: 7B has 7,751,248,896
        // non-embedding parameters; heads x head_dim (4,096) exceeds hidden (3,072).
        let g1 = load("gemma-7b.json");
        let p = g1.params();
        assert!(g1.tied_embeddings && !g1.sandwich_norms);
        assert_eq!(p.total - p.embedding, 7_751_248_896);
    }

    #[test]
    fn phi3_glm_olmo_granite_import_with_published_counts() {
        // microsoft/Phi-3-mini-4k-instruct's model card: "a 3.8B parameters ...
        // model"; every layer slides over 2,047 tokens.
        let phi = load("phi-3-mini-4k-instruct.json");
        assert!(off(&phi, 3.8) < 0.01, "{}", phi.params().total);
        assert_eq!(
            phi.sliding_window,
            Some(SlidingWindow {
                window: 2047,
                layers: 32
            })
        );
        assert!(!phi.tied_embeddings && phi.head_dim == 96);

        // zai-org/GLM-4-9B-0414: 9.4B parameters on its Hugging Face page (from
        // its safetensors); the glm4 layout adds norms after attention and MLP.
        let glm4 = load("glm-4-9b-0414.json");
        assert!(glm4.sandwich_norms && glm4.qkv_bias && !glm4.bias && glm4.kv_heads == 2);
        assert!(off(&glm4, 9.4) < 0.01);
        // THUDM/glm-4-9b-chat in THUDM's own code (model_type chatglm): the same
        // shape under Megatron-style names, two norms per layer: 9.4B too.
        let chat = load("glm-4-9b-chat.json");
        assert_eq!(
            (
                chat.layers,
                chat.ffn_hidden,
                chat.kv_heads,
                chat.head_dim,
                chat.vocab
            ),
            (40, 13696, 2, 128, 151_552)
        );
        assert!(!chat.sandwich_norms && off(&chat, 9.4) < 0.01);
        // The four norms of a GLM-4-0414 layer against the two of GLM-4: RMSNorms
        // of `hidden` weights each (the Q, K, V biases no longer make them count
        // as LayerNorms).
        assert_eq!(glm4.params().total - chat.params().total, 40 * 2 * 4096);

        // zai-org/GLM-4.5-Air's model card: 106B total parameters. Its MTP layer is
        // read (num_nextn_predict_layers) but, as model cards do, not counted.
        let air = load("glm-4.5-air.json");
        let moe = air.moe.unwrap();
        assert_eq!(
            (
                moe.experts,
                moe.top_k,
                moe.shared_experts,
                moe.dense_leading_layers
            ),
            (128, 8, 1, 1)
        );
        assert_eq!((air.head_dim, air.mtp_layers), (128, 1));
        assert_eq!(moe.balancing, Balancing::LossFree);
        assert!(off(&air, 106.0) < 0.01, "{}", air.params().total);

        // allenai/OLMo-2-1124-7B: 7.30B on its Hugging Face page.
        assert!(off(&load("olmo-2-1124-7b.json"), 7.30) < 0.01);
        // ibm-granite/granite-3.1-8b-base: 8.17B on its Hugging Face page; tied.
        let granite = load("granite-3.1-8b-base.json");
        assert!(granite.tied_embeddings && off(&granite, 8.17) < 0.01);
    }

    #[test]
    fn starcoder2_has_a_plain_mlp_biases_and_a_window() {
        let m = from_hf_config(
            r#"{"model_type":"starcoder2","hidden_size":6144,"intermediate_size":24576,"num_hidden_layers":40,"num_attention_heads":48,"num_key_value_heads":4,"vocab_size":49152,"sliding_window":4096}"#,
            "sc2",
        )
        .unwrap();
        assert_eq!(m.mlp, MlpKind::Plain);
        // Starcoder2Config defaults: biases on, embeddings tied.
        assert!(m.bias && m.tied_embeddings);
        assert_eq!(m.sliding_window.unwrap().layers, 40);
    }

    /// Model cards count active parameters two ways; both are kept.
    #[test]
    fn active_parameters_both_ways() {
        // OpenAI's gpt-oss model card (arXiv 2508.10925), Table 1: 5.13B active
        // for gpt-oss-120b, which leaves out the input embedding (0.58B) but
        // keeps the unembedding.
        let g = load("gpt-oss-120b.json").params();
        assert!(
            (g.active_without_embedding as f64 / 1e9 - 5.13).abs() < 0.02,
            "{}",
            g.active_without_embedding
        );
        assert_eq!(g.active - g.active_without_embedding, g.embedding);
        // Qwen3-30B-A3B's model card: 3.3B activated, which counts the input
        // embedding: 3.35B with it, 3.04B without.
        let q = load("qwen3-30b-a3b.json").params();
        assert!(
            (q.active as f64 / 1e9 - 3.3).abs() / 3.3 < 0.02,
            "{}",
            q.active
        );
        assert!((q.active_without_embedding as f64 / 1e9 - 3.3).abs() / 3.3 > 0.05);
        // Tied embeddings: the matrix is the output layer's too, so it stays.
        let t = load("gemma-2-9b.json").params();
        assert_eq!(t.active_without_embedding, t.active);
    }

    #[test]
    fn hf_import_matches_presets() {
        use crate::presets::resolve;
        for (file, preset) in [
            ("llama-3.1-8b.json", "llama3-8b"),
            ("mixtral-8x7b-v0.1.json", "mixtral-8x7b"),
            ("qwen3-30b-a3b.json", "qwen3-30b-a3b"),
            ("deepseek-v3.json", "deepseek-v3"),
            ("gpt-oss-120b.json", "gpt-oss-120b"),
        ] {
            let a = load(file).params();
            let b = resolve(preset).unwrap().spec.params();
            assert_eq!(a.total, b.total, "{file} vs {preset}");
        }
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let e = from_hf_config("{not json", "x").unwrap_err().to_string();
        assert!(e.contains("malformed"), "{e}");
        let e = from_hf_config(r#"{"model_type":"bert"}"#, "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not supported"), "{e}");
        let e = from_hf_config(r#"{"model_type":"llama","hidden_size":4096}"#, "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_hidden_layers"), "{e}");
        let e = from_hf_config(
            r#"{"model_type":"llama","hidden_size":-1,"num_hidden_layers":2,"num_attention_heads":2,"vocab_size":10}"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("hidden_size"), "{e}");
        let e = from_hf_config(
            r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":0,"vocab_size":10}"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("num_attention_heads"), "{e}");
    }

    #[test]
    fn missing_fields_are_errors_unless_the_class_defaults_them() {
        // No intermediate_size: once silently 4 x hidden, now named.
        let e = from_hf_config(
            r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100}"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "Hugging Face config: required field 'intermediate_size' is missing for model_type 'llama' (a config.json saved by transformers always has it)");
        // An all-MoE model needs no dense width.
        let m = from_hf_config(
            r#"{"model_type":"mixtral","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"num_local_experts":4,"num_experts_per_tok":2,"intermediate_size":128}"#,
            "x",
        )
        .unwrap();
        assert_eq!(m.ffn_hidden, 128);
        let e = from_hf_config(
            r#"{"model_type":"glm4_moe","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"n_routed_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":32,"n_shared_experts":1}"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("'first_k_dense_replace' is missing"), "{e}");
        // gemma3's text_config defaults as Gemma3TextConfig; its absence is named.
        let e = from_hf_config(r#"{"model_type":"gemma3"}"#, "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'text_config'"), "{e}");
        let e = from_hf_config(
            r#"{"model_type":"gemma3","text_config":{"hidden_size":"big"}}"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("text_config.hidden_size"), "{e}");
        // A flag of the wrong type is named, not read as its default.
        let e = from_hf_config(
            r#"{"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"tie_word_embeddings":"yes"}"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("tie_word_embeddings") && e.contains("true or false"),
            "{e}"
        );
        // layer_types must cover the layers, with kinds Sextant models.
        let e = from_hf_config(
            r#"{"model_type":"gemma2","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"sliding_window":16,"layer_types":["sliding_attention"]}"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("lists 1 layers, but the model has 2"), "{e}");
    }

    #[test]
    fn unrepresentable_families_say_why() {
        let e = from_hf_config(r#"{"model_type":"cohere"}"#, "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("parallel block"), "{e}");
        let e = from_hf_config(
            r#"{"model_type":"mistral3","text_config":{"model_type":"mistral"}}"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("text_config") && e.contains("'mistral'"), "{e}");
    }
}
