use super::*;
use crate::model::{MlpKind, SlidingWindow};
use crate::routing::Balancing;

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
    // Per-head query and key norms: Qwen3 and Gemma 3 always, GLM-4.5 as stated.
    assert!(q3.qk_norm);
    assert!(load("qwen3-30b-a3b.json").qk_norm);
    assert!(load("gemma-3-27b.json").qk_norm);
    assert!(!load("glm-4.5-air.json").qk_norm);
    assert!(!load("llama-3.1-8b.json").qk_norm && !load("olmo-2-1124-7b.json").qk_norm);
    assert!(
        crate::presets::resolve("qwen3-235b-a22b")
            .unwrap()
            .spec
            .qk_norm
    );
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
    // YaRN's attention factor: gpt-oss states factor 32 and no mscale (0.1 ln 32
    // + 1), as the preset has; DeepSeek-V3's mscale / mscale_all_dim is 1, and
    // Llama 3.1's rope_type llama3 is not YaRN.
    let af = g.yarn_attention_factor.unwrap();
    assert!((af - 1.3466).abs() < 1e-4, "{af}");
    assert_eq!(preset.yarn_attention_factor, g.yarn_attention_factor);
    assert!(g.rotary_unfused());
    assert_eq!(load("deepseek-v3.json").yarn_attention_factor, None);
    assert_eq!(load("llama-3.1-8b.json").yarn_attention_factor, None);
    // transformers reads `mscale and mscale_all_dim` as Python truth values: a zero
    // mscale_all_dim falls back to 0.1 ln(factor) + 1, and is no error.
    let path = format!(
        "{}/../tests/data/hf/gpt-oss-120b.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["rope_scaling"]["mscale"] = serde_json::json!(1.0);
    v["rope_scaling"]["mscale_all_dim"] = serde_json::json!(0);
    let z = from_hf_config(&v.to_string(), "zero mscale_all_dim").unwrap();
    assert_eq!(z.yarn_attention_factor, g.yarn_attention_factor);
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
    // A sparse step of 0 divides by zero in Hugging Face's Qwen MoE layers; it was
    // read as 1.
    let path = format!(
        "{}/../tests/data/hf/qwen3-30b-a3b.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["decoder_sparse_step"] = 0.into();
    let e = from_hf_config(&v.to_string(), "x").unwrap_err().to_string();
    assert!(e.contains("decoder_sparse_step' is 0"), "{e}");
    // Hugging Face's sparse layers for a step above 1 are not Megatron's.
    v["decoder_sparse_step"] = 5.into();
    let e = from_hf_config(&v.to_string(), "x").unwrap_err().to_string();
    assert!(e.contains("decoder_sparse_step' is 5"), "{e}");
    v["decoder_sparse_step"] = 1.into();
    v["mlp_only_layers"] = "all".into();
    let e = from_hf_config(&v.to_string(), "x").unwrap_err().to_string();
    assert!(e.contains("mlp_only_layers' is \"all\""), "{e}");
    v["mlp_only_layers"] = serde_json::Value::Null;
    // Numbers and flags are echoed cut too.
    v["tie_word_embeddings"] = "x".repeat(100_000).into();
    let e = from_hf_config(&v.to_string(), "x").unwrap_err().to_string();
    assert!(
        e.contains("tie_word_embeddings") && e.len() < 400,
        "{}",
        e.len()
    );
    v["tie_word_embeddings"] = false.into();
    // Gemma 3's inner model type is echoed escaped and cut.
    let g = serde_json::json!({
        "model_type": "gemma3",
        "text_config": {"model_type": format!("\u{1b}[31m{}", "y".repeat(100_000))}
    });
    let e = from_hf_config(&g.to_string(), "x").unwrap_err().to_string();
    assert!(
        e.contains("text_config.model_type") && e.len() < 400 && !e.contains('\u{1b}'),
        "{}",
        e.len()
    );
    // A wrong-typed value is echoed cut to one line.
    v["decoder_sparse_step"] = format!("\u{1b}[31m{}", "9".repeat(100_000)).into();
    let e = from_hf_config(&v.to_string(), "x").unwrap_err().to_string();
    assert!(
        e.contains("decoder_sparse_step") && e.len() < 400 && !e.contains('\u{1b}'),
        "{}",
        &e[..e.len().min(400)]
    );
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

/// An unsupported `model_type` is echoed escaped and cut: a terminal escape or a
/// megabyte of it must not reach the one-line error whole.
#[test]
fn an_unknown_model_type_is_echoed_escaped_and_cut() {
    let hostile = format!("qwen3_moe\n\u{1b}[31m{}", "x".repeat(1_000_000));
    let text = serde_json::json!({ "model_type": hostile }).to_string();
    let e = from_hf_config(&text, "config.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not supported"), "{e}");
    assert!(
        e.len() < 600 && !e.contains('\u{1b}') && !e.contains('\n'),
        "{} bytes",
        e.len()
    );
}
