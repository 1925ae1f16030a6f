//! A [`ModelSpec`] from one configuration object: the shape, the MoE block and
//! which layers attend through a sliding window.

use serde_json::Value;

use super::fields::Cfg;
use crate::error::InputError;
use crate::model::{Mla, MlpKind, ModelSpec, Moe, SlidingWindow, MODEL_SCHEMA_VERSION};
use crate::routing::Balancing;

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

pub(super) fn build(c: &Cfg, display: String) -> Result<ModelSpec, InputError> {
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
        // q_norm and k_norm over each head's dimension: Qwen3Attention and
        // Gemma3Attention always, Glm4MoeAttention where use_qk_norm says so.
        qk_norm: match mt {
            "qwen3" | "qwen3_moe" | "gemma3_text" => true,
            "glm4_moe" => c.flag("use_qk_norm", false)?,
            _ => false,
        },
        yarn_attention_factor: yarn_attention_factor(c)?,
        // DeepSeek-V3, GLM-4.5 and MiMo state their multi-token-prediction layers.
        mtp_layers: c.opt("num_nextn_predict_layers")?.unwrap_or(0),
        hf_model_type: Some(mt.to_string()),
    };
    spec.validate()?;
    Ok(spec)
}

/// YaRN's attention factor from `rope_scaling` (`rope_type` or the older `type`
/// "yarn"), as transformers computes it (`_compute_yarn_parameters`): the stated
/// `attention_factor`, else `get_mscale(factor, mscale) / get_mscale(factor,
/// mscale_all_dim)` when both are given, else `get_mscale(factor)`, where
/// `get_mscale(s, m) = 0.1 m ln(s) + 1` for `s > 1`. `None` without YaRN or
/// where the factor is 1.
fn yarn_attention_factor(c: &Cfg) -> Result<Option<f64>, InputError> {
    let Some(rs) = c.v.get("rope_scaling").filter(|v| v.is_object()) else {
        return Ok(None);
    };
    let kind = rs
        .get("rope_type")
        .or_else(|| rs.get("type"))
        .and_then(|v| v.as_str());
    if kind != Some("yarn") {
        return Ok(None);
    }
    let r = Cfg {
        v: rs,
        model_type: c.model_type,
        at: "rope_scaling.",
        defaults: &[],
    };
    let factor = r.number("factor", 1.0)?;
    let mscale = |m: f64| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    };
    // transformers tests `if mscale and mscale_all_dim`: a zero counts as absent.
    let present = |k: &str| {
        rs.get(k)
            .is_some_and(|v| !v.is_null() && v.as_f64() != Some(0.0))
    };
    let af = if present("attention_factor") {
        r.number("attention_factor", 1.0)?
    } else if present("mscale") && present("mscale_all_dim") {
        mscale(r.number("mscale", 1.0)?) / mscale(r.number("mscale_all_dim", 1.0)?)
    } else {
        mscale(1.0)
    };
    Ok(((af - 1.0).abs() > 1e-9).then_some(af))
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
            // Hugging Face's Qwen2-MoE and Qwen3-MoE make layer i sparse when
            // (i + 1) % decoder_sparse_step == 0 (a step of 0 divides by zero);
            // Megatron's moe_layer_freq, which Sextant follows, starts at layer 0.
            // Only a step of 1 (every released model's) means the same layers.
            if step != 1 {
                return Err(c.err(format!(
                    "field '{}decoder_sparse_step' is {step}: Hugging Face places an MoE layer where (layer + 1) is a multiple of it, Sextant only every layer (1, every released Qwen MoE model's value)",
                    c.at
                )));
            }
            let dense_only = match c.v.get("mlp_only_layers") {
                None | Some(Value::Null) => 0,
                Some(Value::Array(a)) => a.len(),
                Some(x) => {
                    return Err(c.err(format!(
                        "field '{}mlp_only_layers' is {}, expected a list of layer indices",
                        c.at,
                        crate::json::one_line(&x.to_string(), 60)
                    )))
                }
            };
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
                layer_freq: 1,
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
