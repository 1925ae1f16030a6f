//! Built-in model presets and the resolution of size aliases (`70b`, `8x7b`).
//!
//! Every preset names its source. Numbers are the published configuration of the
//! model (its config.json or paper table), not fitted values.

use crate::error::InputError;
use crate::model::{Mla, MlpKind, ModelSpec, Moe, SlidingWindow, MODEL_SCHEMA_VERSION};
use crate::routing::Balancing;

/// A preset: its canonical name, other names it answers to, and the spec.
pub struct Preset {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub spec: fn() -> ModelSpec,
}

#[allow(clippy::too_many_arguments)]
fn dense(
    name: &str,
    source: &str,
    layers: u64,
    hidden: u64,
    ffn: u64,
    heads: u64,
    kv_heads: u64,
    vocab: u64,
    mlp: MlpKind,
) -> ModelSpec {
    ModelSpec {
        schema_version: MODEL_SCHEMA_VERSION,
        name: name.into(),
        source: source.into(),
        layers,
        hidden,
        ffn_hidden: ffn,
        heads,
        kv_heads,
        head_dim: hidden / heads,
        vocab,
        tied_embeddings: false,
        mlp,
        dropout: false,
        bias: false,
        qkv_bias: false,
        norm: None,
        mla: None,
        moe: None,
        sliding_window: None,
        sandwich_norms: false,
        glu_clamp: None,
        attention_sinks: false,
        qk_norm: false,
        yarn_attention_factor: None,
        mtp_layers: 0,
        hf_model_type: preset_model_type(name).map(String::from),
    }
}

/// The Hugging Face `model_type` of each preset's config.json (its source); the
/// SC'21 GPT shapes are Megatron-LM's own and have none.
fn preset_model_type(name: &str) -> Option<&'static str> {
    let families: [(&str, &str); 6] = [
        ("llama", "llama"),
        ("mixtral-", "mixtral"),
        ("deepseek-v3", "deepseek_v3"),
        ("qwen3-", "qwen3_moe"),
        ("gpt-oss-", "gpt_oss"),
        ("nemotron4-", "nemotron"),
    ];
    families
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map(|&(_, t)| t)
}

/// GPT-style model as in Megatron-LM's papers: GeLU 4h MLP, biases, dropout,
/// tied input/output embeddings, vocabulary padded to 51200.
pub fn gpt(name: &str, source: &str, layers: u64, hidden: u64, heads: u64) -> ModelSpec {
    ModelSpec {
        tied_embeddings: true,
        dropout: true,
        bias: true,
        qkv_bias: false,
        ..dense(
            name,
            source,
            layers,
            hidden,
            hidden.saturating_mul(4),
            heads,
            heads,
            51200,
            MlpKind::Plain,
        )
    }
}

const SC21: &str = "Narayanan et al., SC'21 (arXiv 2104.04473), Table 1";

fn llama2_7b() -> ModelSpec {
    dense(
        "llama2-7b",
        "Llama 2 paper (arXiv 2307.09288) and meta-llama/Llama-2-7b-hf config.json",
        32,
        4096,
        11008,
        32,
        32,
        32000,
        MlpKind::Gated,
    )
}
fn llama2_13b() -> ModelSpec {
    dense(
        "llama2-13b",
        "meta-llama/Llama-2-13b-hf config.json",
        40,
        5120,
        13824,
        40,
        40,
        32000,
        MlpKind::Gated,
    )
}
fn llama2_70b() -> ModelSpec {
    dense(
        "llama2-70b",
        "meta-llama/Llama-2-70b-hf config.json",
        80,
        8192,
        28672,
        64,
        8,
        32000,
        MlpKind::Gated,
    )
}
fn llama3_8b() -> ModelSpec {
    dense(
        "llama3-8b",
        "meta-llama/Meta-Llama-3-8B config.json (Llama 3.1 8B identical shapes)",
        32,
        4096,
        14336,
        32,
        8,
        128256,
        MlpKind::Gated,
    )
}
fn llama3_70b() -> ModelSpec {
    dense(
        "llama3-70b",
        "meta-llama/Meta-Llama-3-70B config.json (Llama 3.1 70B identical shapes)",
        80,
        8192,
        28672,
        64,
        8,
        128256,
        MlpKind::Gated,
    )
}
fn llama31_405b() -> ModelSpec {
    dense(
        "llama3.1-405b",
        "meta-llama/Llama-3.1-405B config.json; Llama 3 herd paper (arXiv 2407.21783) Table 3",
        126,
        16384,
        53248,
        128,
        8,
        128256,
        MlpKind::Gated,
    )
}
fn mixtral_8x7b() -> ModelSpec {
    let mut m = dense(
        "mixtral-8x7b",
        "mistralai/Mixtral-8x7B-v0.1 config.json",
        32,
        4096,
        14336,
        32,
        8,
        32000,
        MlpKind::Gated,
    );
    m.moe = Some(Moe {
        experts: 8,
        top_k: 2,
        expert_ffn_hidden: 14336,
        shared_experts: 0,
        shared_ffn_hidden: None,
        dense_leading_layers: 0,
        layer_freq: 1,
        balancing: Balancing::AuxLoss,
    });
    m
}
fn mixtral_8x22b() -> ModelSpec {
    let mut m = dense(
        "mixtral-8x22b",
        "mistralai/Mixtral-8x22B-v0.1 config.json",
        56,
        6144,
        16384,
        48,
        8,
        32768,
        MlpKind::Gated,
    );
    m.moe = Some(Moe {
        experts: 8,
        top_k: 2,
        expert_ffn_hidden: 16384,
        shared_experts: 0,
        shared_ffn_hidden: None,
        dense_leading_layers: 0,
        layer_freq: 1,
        balancing: Balancing::AuxLoss,
    });
    m
}
fn deepseek_v3() -> ModelSpec {
    let mut m = dense("deepseek-v3", "deepseek-ai/DeepSeek-V3 config.json (num_nextn_predict_layers 1: one MTP layer); DeepSeek-V3 report (arXiv 2412.19437) sections 2.2 and 4.2", 61, 7168, 18432, 128, 128, 129280, MlpKind::Gated);
    m.head_dim = 128;
    m.mla = Some(Mla {
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
    });
    m.moe = Some(Moe {
        experts: 256,
        top_k: 8,
        expert_ffn_hidden: 2048,
        shared_experts: 1,
        shared_ffn_hidden: None,
        dense_leading_layers: 3,
        layer_freq: 1,
        balancing: Balancing::LossFree,
    });
    m.mtp_layers = 1;
    m
}
fn qwen3_30b_a3b() -> ModelSpec {
    let mut m = dense(
        "qwen3-30b-a3b",
        "Qwen/Qwen3-30B-A3B config.json",
        48,
        2048,
        6144,
        32,
        4,
        151936,
        MlpKind::Gated,
    );
    m.head_dim = 128;
    // q_norm and k_norm over each head (Qwen3Attention).
    m.qk_norm = true;
    m.moe = Some(Moe {
        experts: 128,
        top_k: 8,
        expert_ffn_hidden: 768,
        shared_experts: 0,
        shared_ffn_hidden: None,
        dense_leading_layers: 0,
        layer_freq: 1,
        balancing: Balancing::AuxLoss,
    });
    m
}
fn qwen3_235b_a22b() -> ModelSpec {
    let mut m = dense(
        "qwen3-235b-a22b",
        "Qwen/Qwen3-235B-A22B config.json",
        94,
        4096,
        12288,
        64,
        4,
        151936,
        MlpKind::Gated,
    );
    m.head_dim = 128;
    // q_norm and k_norm over each head (Qwen3Attention).
    m.qk_norm = true;
    m.moe = Some(Moe {
        experts: 128,
        top_k: 8,
        expert_ffn_hidden: 1536,
        shared_experts: 0,
        shared_ffn_hidden: None,
        dense_leading_layers: 0,
        layer_freq: 1,
        balancing: Balancing::AuxLoss,
    });
    m
}
fn gpt_oss_120b() -> ModelSpec {
    let mut m = dense(
        "gpt-oss-120b",
        "openai/gpt-oss-120b config.json (alternating 128-token sliding window)",
        36,
        2880,
        2880,
        64,
        8,
        201088,
        MlpKind::Gated,
    );
    m.head_dim = 64;
    m.bias = true;
    m.moe = Some(Moe {
        experts: 128,
        top_k: 4,
        expert_ffn_hidden: 2880,
        shared_experts: 0,
        shared_ffn_hidden: None,
        dense_leading_layers: 0,
        layer_freq: 1,
        balancing: Balancing::AuxLoss,
    });
    m.sliding_window = Some(SlidingWindow {
        window: 128,
        layers: 18,
    });
    // config.json swiglu_limit 7.0; the attention's per-head sinks.
    m.glu_clamp = Some(7.0);
    m.attention_sinks = true;
    // rope_scaling: yarn, factor 32, no mscale: 0.1 ln(32) + 1.
    m.yarn_attention_factor = Some(0.1 * 32f64.ln() + 1.0);
    m
}
fn nemotron4_340b() -> ModelSpec {
    // Squared-ReLU (not gated) MLP, untied embeddings, 256k vocabulary.
    dense(
        "nemotron4-340b",
        "Nemotron-4 340B technical report (arXiv 2406.11704) Table 1",
        96,
        18432,
        73728,
        96,
        8,
        256000,
        MlpKind::Plain,
    )
}
fn gpt3_175b() -> ModelSpec {
    gpt(
        "gpt3-175b",
        "Brown et al. 2020 (arXiv 2005.14165) Table 2.1; vocabulary padded to 51200 as in Megatron",
        96,
        12288,
        96,
    )
}

macro_rules! gpt_size {
    ($f:ident, $name:expr, $l:expr, $h:expr, $a:expr) => {
        fn $f() -> ModelSpec {
            gpt($name, SC21, $l, $h, $a)
        }
    };
}
gpt_size!(gpt_1_7b, "gpt-1.7b", 24, 2304, 24);
gpt_size!(gpt_3_6b, "gpt-3.6b", 30, 3072, 32);
gpt_size!(gpt_7_5b, "gpt-7.5b", 36, 4096, 32);
gpt_size!(gpt_18_4b, "gpt-18.4b", 40, 6144, 48);
gpt_size!(gpt_39_1b, "gpt-39.1b", 48, 8192, 64);
gpt_size!(gpt_76_1b, "gpt-76.1b", 60, 10240, 80);
gpt_size!(gpt_145_6b, "gpt-145.6b", 80, 12288, 96);
gpt_size!(gpt_310_1b, "gpt-310.1b", 96, 16384, 128);
gpt_size!(gpt_529_6b, "gpt-529.6b", 105, 20480, 128);
gpt_size!(gpt_1008b, "gpt-1008b", 128, 25600, 160);
fn gpt_22b() -> ModelSpec {
    gpt(
        "gpt-22b",
        "Korthikanti et al. 2022 (arXiv 2205.05198) Table 3",
        48,
        6144,
        64,
    )
}

/// All built-in presets, in the order `sextant models` lists them.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "gpt3-175b",
        aliases: &["gpt-175b", "175b", "gpt3"],
        spec: gpt3_175b,
    },
    Preset {
        name: "llama2-7b",
        aliases: &["llama-2-7b"],
        spec: llama2_7b,
    },
    Preset {
        name: "llama2-13b",
        aliases: &["llama-2-13b", "13b"],
        spec: llama2_13b,
    },
    Preset {
        name: "llama2-70b",
        aliases: &["llama-2-70b"],
        spec: llama2_70b,
    },
    Preset {
        name: "llama3-8b",
        aliases: &["llama3.1-8b", "llama-3-8b", "llama-3.1-8b", "8b"],
        spec: llama3_8b,
    },
    Preset {
        name: "llama3-70b",
        aliases: &["llama3.1-70b", "llama-3-70b", "llama-3.1-70b", "70b"],
        spec: llama3_70b,
    },
    Preset {
        name: "llama3.1-405b",
        aliases: &["llama3-405b", "llama-3.1-405b", "405b"],
        spec: llama31_405b,
    },
    Preset {
        name: "mixtral-8x7b",
        aliases: &["8x7b", "mixtral"],
        spec: mixtral_8x7b,
    },
    Preset {
        name: "mixtral-8x22b",
        aliases: &["8x22b"],
        spec: mixtral_8x22b,
    },
    Preset {
        name: "deepseek-v3",
        aliases: &["dsv3", "671b", "deepseek-v3-671b"],
        spec: deepseek_v3,
    },
    Preset {
        name: "qwen3-30b-a3b",
        aliases: &["30b-a3b"],
        spec: qwen3_30b_a3b,
    },
    Preset {
        name: "qwen3-235b-a22b",
        aliases: &["235b-a22b", "235b"],
        spec: qwen3_235b_a22b,
    },
    Preset {
        name: "gpt-oss-120b",
        aliases: &["gptoss-120b", "120b"],
        spec: gpt_oss_120b,
    },
    Preset {
        name: "nemotron4-340b",
        aliases: &["nemotron-4-340b", "340b"],
        spec: nemotron4_340b,
    },
    Preset {
        name: "gpt-1.7b",
        aliases: &[],
        spec: gpt_1_7b,
    },
    Preset {
        name: "gpt-3.6b",
        aliases: &[],
        spec: gpt_3_6b,
    },
    Preset {
        name: "gpt-7.5b",
        aliases: &[],
        spec: gpt_7_5b,
    },
    Preset {
        name: "gpt-18.4b",
        aliases: &[],
        spec: gpt_18_4b,
    },
    Preset {
        name: "gpt-22b",
        aliases: &[],
        spec: gpt_22b,
    },
    Preset {
        name: "gpt-39.1b",
        aliases: &[],
        spec: gpt_39_1b,
    },
    Preset {
        name: "gpt-76.1b",
        aliases: &[],
        spec: gpt_76_1b,
    },
    Preset {
        name: "gpt-145.6b",
        aliases: &[],
        spec: gpt_145_6b,
    },
    Preset {
        name: "gpt-310.1b",
        aliases: &["gpt-310b"],
        spec: gpt_310_1b,
    },
    Preset {
        name: "gpt-529.6b",
        aliases: &["gpt-530b"],
        spec: gpt_529_6b,
    },
    Preset {
        name: "gpt-1008b",
        aliases: &["gpt-1t"],
        spec: gpt_1008b,
    },
];

/// How a name was resolved: the preset it maps to and whether it was an alias.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub spec: ModelSpec,
    /// "70b -> llama3-70b" when an alias was used; `None` for an exact name.
    pub via_alias: Option<String>,
}

fn normalise(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('_', "-")
}

/// Looks up a preset by name or alias (case-insensitive; `_` and `-` are the same).
pub fn resolve(name: &str) -> Result<Resolved, InputError> {
    let key = normalise(name);
    for p in PRESETS {
        if p.name == key {
            return Ok(Resolved {
                spec: (p.spec)(),
                via_alias: None,
            });
        }
    }
    for p in PRESETS {
        if p.aliases.contains(&key.as_str()) {
            return Ok(Resolved {
                spec: (p.spec)(),
                via_alias: Some(format!("{name} -> {}", p.name)),
            });
        }
    }
    Err(InputError::UnknownModel {
        name: name.to_string(),
        suggestions: suggestions(
            &key,
            PRESETS
                .iter()
                .flat_map(|p| std::iter::once(p.name).chain(p.aliases.iter().copied())),
        ),
    })
}

/// Up to three candidate names closest to `key` by edit distance, or that contain it.
pub fn suggestions<'a>(key: &str, names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut scored: Vec<(usize, &str)> = names
        .map(|n| {
            let d = edit_distance(key, n);
            // The same family before the first '-' (h100-pcie: h100-sxm) counts
            // as close, as does a name that contains the key.
            let family = |s: &str| s.split('-').next().unwrap_or("").to_string();
            let same_family = family(key).len() >= 3 && family(key) == family(n);
            let d = if n.contains(key) || same_family {
                d.min(1)
            } else {
                d
            };
            (d, n)
        })
        .collect();
    scored.sort();
    let limit = (key.len() / 3).max(2);
    let mut out: Vec<String> = Vec::new();
    for (d, n) in scored {
        if d <= limit && !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
        if out.len() == 3 {
            break;
        }
    }
    out
}

/// Levenshtein distance over bytes (names are ASCII).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a = a.as_bytes();
    let b = b.as_bytes();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let sub = prev[j - 1] + usize::from(a[i - 1] != b[j - 1]);
            cur[j] = sub.min(prev[j] + 1).min(cur[j - 1] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid_and_names_its_source() {
        for p in PRESETS {
            let s = (p.spec)();
            assert_eq!(s.name, p.name);
            // The architecture is named wherever a config.json is the source.
            assert_eq!(
                s.hf_model_type.is_some(),
                s.source.contains("config.json") || s.name.starts_with("nemotron4"),
                "{}",
                p.name
            );
            if s.name.starts_with("qwen3-") {
                assert!(s.moe.is_some(), "{}: qwen3_moe needs experts", p.name);
            }
            assert!(!s.source.is_empty(), "{} has no source", p.name);
            s.validate().unwrap();
        }
    }

    #[test]
    fn published_parameter_counts() {
        // Published totals, to the precision the model cards give.
        let check = |name: &str, billions: f64, tol: f64| {
            let p = resolve(name).unwrap().spec.params();
            let got = p.total as f64 / 1e9;
            assert!(
                (got - billions).abs() / billions < tol,
                "{name}: {got:.2}B vs {billions}B"
            );
        };
        check("llama2-7b", 6.74, 0.01);
        check("llama2-70b", 68.98, 0.01);
        check("llama3-8b", 8.03, 0.01);
        check("llama3-70b", 70.55, 0.01);
        check("llama3.1-405b", 405.85, 0.01);
        check("mixtral-8x7b", 46.70, 0.01);
        check("mixtral-8x22b", 140.6, 0.01);
        check("deepseek-v3", 671.0, 0.02);
        check("qwen3-30b-a3b", 30.5, 0.02);
        check("qwen3-235b-a22b", 235.0, 0.02);
        check("gpt-oss-120b", 116.8, 0.02);
        check("nemotron4-340b", 341.0, 0.02);
        check("gpt3-175b", 174.6, 0.01);
        // Active parameters of MoE models.
        let a = |name: &str| resolve(name).unwrap().spec.params().active as f64 / 1e9;
        assert!((a("mixtral-8x7b") - 12.9).abs() < 0.2);
        assert!((a("deepseek-v3") - 37.0).abs() < 1.0);
        assert!((a("qwen3-235b-a22b") - 22.0).abs() < 0.5);
        // DeepSeek-V3's model card: 671B main model and 14B of MTP module, whose
        // checkpoint also holds its own embedding and output head.
        let d = resolve("deepseek-v3").unwrap().spec;
        let mtp = (d.mtp_params() + 2 * d.vocab * d.hidden) as f64 / 1e9;
        assert!(
            (mtp - 14.0).abs() / 14.0 < 0.05,
            "MTP module {mtp:.2}B vs 14B"
        );
        assert_eq!(resolve("llama3-70b").unwrap().spec.mtp_params(), 0);
    }

    #[test]
    fn aliases_resolve_and_say_so() {
        let r = resolve("70b").unwrap();
        assert_eq!(r.spec.name, "llama3-70b");
        assert_eq!(r.via_alias.as_deref(), Some("70b -> llama3-70b"));
        assert_eq!(resolve("8x7b").unwrap().spec.name, "mixtral-8x7b");
        assert_eq!(resolve("405b").unwrap().spec.name, "llama3.1-405b");
        assert_eq!(resolve("8B").unwrap().spec.name, "llama3-8b");
        assert!(resolve("Llama3_70B").unwrap().via_alias.is_none());
    }

    #[test]
    fn unknown_model_suggests_close_names() {
        let e = resolve("lama3-70b").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("llama3-70b"), "{msg}");
    }
}
