//! Import of Hugging Face `config.json` files.
//!
//! Supported `model_type`s: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3,
//! qwen3_moe, deepseek_v3 (and deepseek_v2), gpt_oss. Field names follow the
//! `transformers` configuration classes of each family. Unknown fields are ignored;
//! a missing required field is an error naming it.

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
];

fn field(v: &Value, key: &str) -> Result<u64, InputError> {
    match v.get(key) {
        Some(x) => x.as_u64().ok_or_else(|| {
            InputError::HfConfig(format!(
                "field '{key}' is {x}, expected a non-negative integer"
            ))
        }),
        None => Err(InputError::HfConfig(format!(
            "required field '{key}' is missing"
        ))),
    }
}

fn opt(v: &Value, key: &str) -> Result<Option<u64>, InputError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => field(v, key).map(Some),
    }
}

fn first_of(v: &Value, keys: &[&str]) -> Result<u64, InputError> {
    for k in keys {
        if let Some(x) = opt(v, k)? {
            return Ok(x);
        }
    }
    Err(InputError::HfConfig(format!(
        "required field '{}' is missing",
        keys.join("' or '")
    )))
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
    let model_type = v
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            InputError::HfConfig(
                "field 'model_type' is missing; cannot tell the model family".into(),
            )
        })?
        .to_string();
    if !SUPPORTED_TYPES.contains(&model_type.as_str()) {
        return Err(InputError::HfConfig(format!(
            "model_type '{model_type}' is not supported (supported: {})",
            SUPPORTED_TYPES.join(", ")
        )));
    }
    let hidden = field(&v, "hidden_size")?;
    let layers = field(&v, "num_hidden_layers")?;
    let heads = field(&v, "num_attention_heads")?;
    let kv_heads = opt(&v, "num_key_value_heads")?.unwrap_or(heads);
    let vocab = field(&v, "vocab_size")?;
    let ffn = opt(&v, "intermediate_size")?;
    if heads == 0 {
        return Err(InputError::HfConfig("num_attention_heads is 0".into()));
    }
    let head_dim = opt(&v, "head_dim")?.unwrap_or(hidden / heads);
    let tied = v
        .get("tie_word_embeddings")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let bias = v
        .get("attention_bias")
        .and_then(Value::as_bool)
        .unwrap_or(model_type == "qwen2");
    let display = v
        .get("_name_or_path")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(name)
        .to_string();

    let mut spec = ModelSpec {
        schema_version: MODEL_SCHEMA_VERSION,
        name: display,
        source: format!("Hugging Face config.json (model_type {model_type})"),
        layers,
        hidden,
        ffn_hidden: ffn.unwrap_or(hidden.saturating_mul(4)),
        heads,
        kv_heads,
        head_dim,
        vocab,
        tied_embeddings: tied,
        mlp: MlpKind::Gated,
        dropout: false,
        bias,
        norm: None,
        mla: None,
        moe: None,
        sliding_window: None,
        // DeepSeek-V3, GLM-4.5 and MiMo state their multi-token-prediction layers.
        mtp_layers: opt(&v, "num_nextn_predict_layers")?.unwrap_or(0),
    };

    match model_type.as_str() {
        "mixtral" => {
            spec.moe = Some(Moe {
                experts: field(&v, "num_local_experts")?,
                top_k: field(&v, "num_experts_per_tok")?,
                expert_ffn_hidden: field(&v, "intermediate_size")?,
                shared_experts: 0,
                shared_ffn_hidden: None,
                dense_leading_layers: 0,
                layer_freq: 1,
                balancing: Balancing::AuxLoss,
            });
        }
        "qwen2_moe" | "qwen3_moe" => {
            let shared = opt(&v, "shared_expert_intermediate_size")?.unwrap_or(0);
            let step = opt(&v, "decoder_sparse_step")?.unwrap_or(1);
            let dense_only = v
                .get("mlp_only_layers")
                .and_then(Value::as_array)
                .map(|a| a.len())
                .unwrap_or(0);
            if dense_only > 0 {
                return Err(InputError::HfConfig(
                    "mlp_only_layers lists dense layers at arbitrary positions; Sextant models only leading dense layers".into(),
                ));
            }
            spec.moe = Some(Moe {
                experts: field(&v, "num_experts")?,
                top_k: field(&v, "num_experts_per_tok")?,
                expert_ffn_hidden: field(&v, "moe_intermediate_size")?,
                shared_experts: u64::from(shared > 0),
                shared_ffn_hidden: if shared > 0 { Some(shared) } else { None },
                dense_leading_layers: 0,
                layer_freq: step.max(1),
                balancing: Balancing::AuxLoss,
            });
        }
        "deepseek_v2" | "deepseek_v3" => {
            spec.mla = Some(Mla {
                q_lora_rank: opt(&v, "q_lora_rank")?.unwrap_or(0),
                kv_lora_rank: field(&v, "kv_lora_rank")?,
                qk_nope_head_dim: field(&v, "qk_nope_head_dim")?,
                qk_rope_head_dim: field(&v, "qk_rope_head_dim")?,
                v_head_dim: field(&v, "v_head_dim")?,
            });
            spec.head_dim = field(&v, "v_head_dim")?;
            if let Some(experts) = opt(&v, "n_routed_experts")? {
                spec.moe = Some(Moe {
                    experts,
                    top_k: field(&v, "num_experts_per_tok")?,
                    expert_ffn_hidden: field(&v, "moe_intermediate_size")?,
                    shared_experts: opt(&v, "n_shared_experts")?.unwrap_or(0),
                    shared_ffn_hidden: None,
                    dense_leading_layers: opt(&v, "first_k_dense_replace")?.unwrap_or(0),
                    layer_freq: opt(&v, "moe_layer_freq")?.unwrap_or(1).max(1),
                    // DeepSeek-V3's bias-corrected routing; V2 uses auxiliary losses.
                    balancing: if v.get("topk_method").and_then(Value::as_str) == Some("noaux_tc") {
                        Balancing::LossFree
                    } else {
                        Balancing::AuxLoss
                    },
                });
            }
        }
        "gpt_oss" => {
            let experts = first_of(&v, &["num_local_experts", "num_experts"])?;
            spec.moe = Some(Moe {
                experts,
                top_k: first_of(&v, &["num_experts_per_tok", "experts_per_token"])?,
                expert_ffn_hidden: field(&v, "intermediate_size")?,
                shared_experts: 0,
                shared_ffn_hidden: None,
                dense_leading_layers: 0,
                layer_freq: 1,
                balancing: Balancing::AuxLoss,
            });
        }
        _ => {}
    }

    // Sliding-window attention: explicit per-layer types (gpt_oss), or one window
    // for every layer (mistral; qwen2 only when use_sliding_window is true).
    if let Some(types) = v.get("layer_types").and_then(Value::as_array) {
        let sliding = types
            .iter()
            .filter(|t| t.as_str() == Some("sliding_attention"))
            .count() as u64;
        if sliding > 0 {
            spec.sliding_window = Some(SlidingWindow {
                window: field(&v, "sliding_window")?,
                layers: sliding,
            });
        }
    } else if let Some(w) = opt(&v, "sliding_window")? {
        let enabled = v
            .get("use_sliding_window")
            .and_then(Value::as_bool)
            .unwrap_or(model_type == "mistral");
        if enabled {
            spec.sliding_window = Some(SlidingWindow { window: w, layers });
        }
    }
    spec.validate()?;
    Ok(spec)
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
        assert!(q2.bias && q2.sliding_window.is_none());
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
}
