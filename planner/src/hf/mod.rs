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
//! six; Mistral, Phi-3, StarCoder2: every layer), priced as windowed attention; and
//! YaRN's attention factor (`rope_scaling`, any family), whose rotary Megatron-Core
//! runs unfused where it is not 1 (gpt-oss). Left
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
use crate::model::ModelSpec;

mod build;
mod fields;

use build::build;
use fields::{Cfg, GEMMA3_TEXT_DEFAULTS};

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
                    "text_config.model_type is '{}', expected 'gemma3_text'",
                    crate::json::one_line(inner, 60)
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
        // From the user's file: escaped and cut before it is echoed.
        let model_type = crate::json::one_line(model_type, 60);
        let inner = v
            .get("text_config")
            .and_then(|t| t.get("model_type"))
            .and_then(Value::as_str)
            .map(|t| crate::json::one_line(t, 60));
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

#[cfg(test)]
mod tests;
