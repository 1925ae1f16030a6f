use super::*;
use crate::config::{Dispatcher, Layout};
use crate::cost::LossKernel;
use crate::model::{MlpKind, Norm};

const RUNS: &str = "id,source,gpu,gpus_per_node,gpus,model,layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq,moe_experts,moe_topk,moe_ffn_hidden,moe_shared_experts,tp,pp,vpp,cp,ep,sp,dp,mbs,gbs,recompute,zero,precision,metric,value,note\n\
r1,test,h100-sxm,8,64,qwen3-30b-a3b,48,2048,6144,32,4,151936,4096,128,8,768,0,1,1,1,1,8,false,64,1,512,not stated,distributed optimizer,bf16,iter_s,10,\n";

/// A stack file fills what the row leaves out, refuses to contradict it, and
/// names what it cannot match.
#[test]
fn stack_file_completes_rows_and_refuses_contradictions() {
    let plain = parse_runs(RUNS).unwrap().remove(0).unwrap();
    assert_eq!(plain.config.moe_dispatcher, Dispatcher::AllToAll);
    assert!(!plain.recompute_stated && !plain.moments_stated);
    let stack = "id,recompute_modules,optimizer_moments,dispatcher,ep_comm_overlap,tp_comm_overlap,source\nr1,\"layernorm,moe_act\",bf16,deepep,true,false,recipe\n";
    let c = parse_runs_with(RUNS, Some(stack))
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(
        (c.config.recompute, c.config.recompute_modules),
        (
            Recompute::Selective,
            RecomputeModules::parse("layernorm,moe_act").unwrap()
        )
    );
    assert!(c.config.bf16_moments && c.recompute_stated && c.moments_stated);
    assert_eq!(c.config.moe_dispatcher, Dispatcher::Deduplicated);
    assert!(c.config.overlap.ep_comm && !c.config.overlap.tp_comm);
    let e = c.estimate_config().unwrap();
    assert_eq!(e.0, c.config);
    let clash = RUNS.replace("not stated", "full");
    let err = parse_runs_with(&clash, Some("id,recompute\nr1,none\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("recompute = 'none' for run 'r1', but the runs CSV says 'full'"),
        "{err}"
    );
    assert!(parse_runs_with(RUNS, Some("id,dispatcher\nr9,deepep\n"))
        .unwrap_err()
        .to_string()
        .contains("'r9' names no run"));
    assert!(parse_runs_with(RUNS, Some("id,zero\nr1,3\n"))
        .unwrap_err()
        .to_string()
        .contains("column 'zero' is not one of"));
    let bad = parse_runs_with(RUNS, Some("id,dispatcher\nr1,nccl\n"))
        .unwrap()
        .remove(0)
        .unwrap_err();
    assert!(
        bad.reason.contains("column 'dispatcher' is 'nccl'"),
        "{}",
        bad.reason
    );
    // Cross-entropy fusion: on for the Megatron-Core stack unless the stack file
    // says otherwise, off for the 2021-22 stack (plain data parallelism).
    assert_eq!(plain.assumptions.loss, LossKernel::Native);
    let te = parse_runs_with(RUNS, Some("id,cross_entropy\nr1,te\n"))
        .unwrap()
        .remove(0)
        .unwrap();
    assert!(te.assumptions.loss == LossKernel::Te && te.assumptions.flash_attention);
    let old_stack = parse_runs(&RUNS.replace("distributed optimizer", "0"))
        .unwrap()
        .remove(0)
        .unwrap();
    assert!(
        old_stack.assumptions.loss == LossKernel::Unfused && !old_stack.assumptions.flash_attention
    );
    // CUDA graphs: none unless stated; a scope Megatron does not have is refused.
    assert!(plain.assumptions.cuda_graphs.is_none());
    let graphed = parse_runs_with(RUNS, Some("id,cuda_graphs\nr1,moe_router moe_preprocess\n"))
        .unwrap()
        .remove(0)
        .unwrap();
    let g = graphed.assumptions.cuda_graphs;
    assert!(g.moe_router && g.moe_preprocess && !g.attn && !g.full_iteration);
    let wrong = parse_runs_with(RUNS, Some("id,cuda_graphs\nr1,everything\n"))
        .unwrap()
        .remove(0)
        .unwrap_err();
    assert!(
        wrong.reason.contains("column 'cuda_graphs'") && wrong.reason.contains("'everything'"),
        "{}",
        wrong.reason
    );
    let bad = parse_runs_with(RUNS, Some("id,cross_entropy\nr1,fused\n"))
        .unwrap()
        .remove(0)
        .unwrap_err();
    assert!(
        bad.reason
            .contains("column 'cross_entropy' is 'fused', expected te, native, unfused"),
        "{}",
        bad.reason
    );
    // A Megatron layout and MTP layers, on the row made two pipeline stages.
    let pp2 = RUNS.replace(",1,1,1,1,8,false,64,", ",1,2,1,1,8,false,32,");
    let c = parse_runs_with(&pp2, Some("id,pp_layout,mtp_layers\nr1,Et*23|t*25mL,1\n"))
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(
        (c.config.layout.clone(), c.model.mtp_layers),
        (
            Layout::Explicit {
                layers: vec![23, 25]
            },
            1
        )
    );
    for (stack, why) in [
        (
            "id,pp_layout\nr1,Et*23|t*25mL\n",
            "places 1 MTP layers; qwen3-30b-a3b has 0",
        ),
        (
            "id,pp_layout\nr1,Et*11|t*12|t*12|t*13L\n",
            "has 2 virtual stages per rank, but vpp is 1",
        ),
        ("id,pp_layout\nr1,Et*24|t*25L\n", "column 'pp_layout'"),
        ("id,mtp_layers\nr1,40\n", "column 'mtp_layers'"),
    ] {
        let bad = parse_runs_with(&pp2, Some(stack)).unwrap().remove(0);
        let reason = match bad {
            Ok(c) => c
                .config
                .check(&c.model, &c.cluster, &c.workload)
                .map(|_| String::new())
                .unwrap_or_else(|r| format!("column 'pp_layout': {r}")),
            Err(u) => u.reason,
        };
        assert!(reason.contains(why), "{stack}: {reason}");
    }
}

/// One row from (column, value) pairs.
fn csv(cols: &[(&str, &str)]) -> String {
    let (h, v): (Vec<&str>, Vec<&str>) = cols.iter().copied().unzip();
    format!("{}\n{}\n", h.join(","), v.join(","))
}

/// Nemotron-4 15B (arXiv 2402.16819: 32 layers, hidden 6144, 48 heads, 8 KV
/// heads, squared-ReLU MLP of 24576, vocabulary 256000, untied, LayerNorm, no
/// biases), which is no preset.
fn nemotron_row() -> Vec<(&'static str, &'static str)> {
    vec![
        ("id", "n15"),
        ("gpu", "h100-sxm"),
        ("gpus_per_node", "8"),
        ("gpus", "64"),
        ("model", "nemotron-4-15b"),
        ("layers", "32"),
        ("hidden", "6144"),
        ("ffn_hidden", "24576"),
        ("heads", "48"),
        ("kv_heads", "8"),
        ("vocab", "256000"),
        ("seq", "4096"),
        ("tp", "4"),
        ("pp", "1"),
        ("dp", "16"),
        ("gbs", "256"),
        ("zero", "distributed optimizer"),
        ("precision", "bf16"),
        ("metric", "iter_s"),
        ("value", "5"),
        ("activation", "squared_relu"),
        ("tied_embeddings", "false"),
        ("norm", "layernorm"),
    ]
}

/// The Nemotron row with `extra` columns set (replacing the row's own), parsed.
fn nemotron_with(extra: &[(&'static str, &'static str)]) -> Result<RunCase, Unrepresentable> {
    let mut row = nemotron_row();
    for &(k, v) in extra {
        match row.iter_mut().find(|(name, _)| *name == k) {
            Some(cell) => cell.1 = v,
            None => row.push((k, v)),
        }
    }
    parse_runs(&csv(&row)).unwrap().remove(0)
}

/// A model that is no preset comes from the row's shape columns and is priced;
/// a row leaving out a column the shape needs is refused, naming the column.
#[test]
fn unknown_models_are_built_from_shape_columns() {
    let c = parse_runs(&csv(&nemotron_row()))
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(
        (
            c.model.mlp,
            c.model.tied_embeddings,
            c.model.norm,
            c.model.head_dim
        ),
        (MlpKind::Plain, false, Some(Norm::LayerNorm), 128)
    );
    // 12.5B in the layers and 3.1B in the two embeddings, as the paper counts.
    let total = c.model.params().total as f64;
    assert!((total / 15.6e9 - 1.0).abs() < 0.01, "{total}");
    assert!(c.estimate().is_ok());
    for col in ["ffn_hidden", "kv_heads", "vocab", "tied_embeddings"] {
        let row: Vec<_> = nemotron_row()
            .into_iter()
            .map(|(k, v)| (k, if k == col { "" } else { v }))
            .collect();
        let err = parse_runs(&csv(&row)).unwrap().remove(0).unwrap_err();
        assert!(
            err.reason
                .contains("'nemotron-4-15b' is not a built-in preset")
                && err.reason.contains(&format!("column '{col}' is empty")),
            "{col}: {}",
            err.reason
        );
    }
    // The MLP type: `gated` or `activation`, which must agree.
    let row: Vec<_> = nemotron_row()
        .into_iter()
        .filter(|(k, _)| *k != "activation")
        .collect();
    let err = parse_runs(&csv(&row)).unwrap().remove(0).unwrap_err();
    assert!(
        err.reason.contains("column 'gated' is empty"),
        "{}",
        err.reason
    );
    let mut row = nemotron_row();
    row.push(("gated", "true"));
    let err = parse_runs(&csv(&row)).unwrap().remove(0).unwrap_err();
    assert!(
        err.reason
            .contains("column 'gated' is 'true' but activation 'squared_relu' is a plain MLP"),
        "{}",
        err.reason
    );
    // The same columns change a preset-based row: Llama 3 8B with tied
    // embeddings has one vocabulary-sized matrix fewer.
    let mut llama = nemotron_row();
    for (k, v) in llama.iter_mut() {
        match *k {
            "model" => *v = "llama3-8b",
            "hidden" => *v = "4096",
            "ffn_hidden" => *v = "14336",
            "heads" => *v = "32",
            "vocab" => *v = "128256",
            "activation" => *v = "swiglu",
            _ => {}
        }
    }
    let untied = parse_runs(&csv(&llama)).unwrap().remove(0).unwrap();
    for (k, v) in llama.iter_mut() {
        if *k == "tied_embeddings" {
            *v = "true";
        }
    }
    let tied = parse_runs(&csv(&llama)).unwrap().remove(0).unwrap();
    assert_eq!(
        untied.model.params().total - tied.model.params().total,
        128256 * 4096
    );
}

/// The measured-memory columns: a number, what it counts and whose it is; an
/// `hbm_gib` column sets the GPUs' memory.
#[test]
fn measured_memory_columns() {
    let with = nemotron_with;
    let c = with(&[
        ("measured_mem_gib", "61.5"),
        ("mem_kind", "peak_reserved"),
        ("mem_stage", "0"),
        ("hbm_gib", "94"),
    ])
    .unwrap();
    assert_eq!(
        c.measured_memory,
        Some(MeasuredMemory {
            gib: 61.5,
            kind: MemKind::PeakReserved,
            stage: MemStage::Stage(0)
        })
    );
    assert_eq!(c.cluster.profile.gpu.hbm_gib, 94.0);
    assert_eq!(with(&[]).unwrap().measured_memory, None);
    for (extra, why) in [
        (
            vec![("measured_mem_gib", "61.5")],
            "column 'mem_kind' is '', expected peak_allocated, peak_reserved, peak_active",
        ),
        (
            vec![("measured_mem_gib", "61.5"), ("mem_kind", "nvidia-smi")],
            "column 'mem_kind' is 'nvidia-smi'",
        ),
        (
            vec![("mem_kind", "peak_reserved")],
            "describe 'measured_mem_gib', which is empty",
        ),
        (
            vec![("measured_mem_gib", "-3"), ("mem_kind", "peak_reserved")],
            "column 'measured_mem_gib' is '-3', expected a positive number",
        ),
        (
            vec![
                ("measured_mem_gib", "61.5"),
                ("mem_kind", "peak_reserved"),
                ("mem_stage", "1"),
            ],
            "column 'mem_stage' is 1, but the run has 1 pipeline stages",
        ),
        (vec![("hbm_gib", "1e9")], "column 'hbm_gib'"),
    ] {
        let err = with(&extra).unwrap_err();
        assert!(err.reason.contains(why), "{extra:?}: {}", err.reason);
    }
}

/// A measured value outside what a training step can be is refused naming the
/// column, and a hostile cell is echoed escaped and cut, never whole.
#[test]
fn measured_values_have_a_range_and_cells_are_cut() {
    for (metric, value) in [
        ("iter_s", "1e-320"),
        ("iter_s", "1e9"),
        ("tok_per_s_per_gpu", "1e308"),
    ] {
        let err = nemotron_with(&[("metric", metric), ("value", value)]).unwrap_err();
        assert!(
            err.reason.contains("column 'value'"),
            "{value}: {}",
            err.reason
        );
    }
    let long = Box::leak(format!("bf16\u{1b}[2J{}", "x".repeat(100_000)).into_boxed_str());
    let err = nemotron_with(&[("precision", long)]).unwrap_err();
    assert!(
        err.reason.len() < 300 && !err.reason.contains('\u{1b}'),
        "{}",
        err.reason
    );
}

/// `nic_gbytes_per_s` sets the network per GPU of the run's cluster (vTrain's
/// A100 nodes have 800 Gb/s, half a DGX A100's), and the step it prices is
/// slower for it; a value the profile cannot hold is refused naming the column.
#[test]
fn network_column_sets_the_nic() {
    let with = nemotron_with;
    let base = with(&[]).unwrap();
    let slow = with(&[("nic_gbytes_per_s", "12.5")]).unwrap();
    assert_ne!(base.cluster.profile.network.nic_gbytes_per_s, 12.5);
    assert_eq!(slow.cluster.profile.network.nic_gbytes_per_s, 12.5);
    assert!(slow.estimate().unwrap().step_secs > base.estimate().unwrap().step_secs);
    for bad in ["0", "-1", "fast"] {
        let err = with(&[("nic_gbytes_per_s", bad)]).unwrap_err();
        assert!(
            err.reason.contains("column 'nic_gbytes_per_s'"),
            "{bad}: {}",
            err.reason
        );
    }
}

/// `cross_entropy = compiled` is torchtitan's loss under torch.compile: a row of
/// another framework that states it is refused, naming the column; a torchtitan
/// row is priced with it.
#[test]
fn compiled_loss_only_for_torchtitan_rows() {
    let with = nemotron_with;
    let e = with(&[("cross_entropy", "compiled")]).unwrap_err().reason;
    assert!(
        e.contains("column 'cross_entropy' is 'compiled'")
            && e.contains("framework torchtitan only"),
        "{e}"
    );
    let c = with(&[("cross_entropy", "compiled"), ("framework", "torchtitan")]).unwrap();
    assert_eq!(c.assumptions.loss, crate::cost::LossKernel::Compiled);
}

/// `framework = scaling` (Aleph Alpha's) runs ZeRO 0 or 1, 1F1B without
/// virtual stages, no CP or EP, full recomputation or none and FP32 moments
/// (`Framework::check_config`): a row that states anything else is refused,
/// naming what scaling runs; with ZeRO-1 it is priced as scaling.
#[test]
fn scaling_rows_state_what_scaling_runs() {
    let with = nemotron_with;
    // A scaling row (ZeRO-1, flash attention) with one more column set: the reason
    // it is refused.
    let refused = |col: &'static str, value: &'static str| {
        with(&[
            ("framework", "scaling"),
            ("zero", "1"),
            ("attention", "flash"),
            (col, value),
        ])
        .unwrap_err()
        .reason
    };
    for (col, value, says) in [
        ("zero", "2", "ZeRO 0 or 1"),
        ("zero", "3", "ZeRO 0 or 1"),
        ("vpp", "2", "without virtual stages"),
        (
            "recompute",
            "selective",
            "full recomputation of every layer or none",
        ),
        ("optimizer_moments", "bf16", "FP32 Adam moments"),
    ] {
        let e = refused(col, value);
        assert!(
            e.contains("column 'framework'") && e.contains(says),
            "{col} {value}: {e}"
        );
    }
    // Megatron's and Transformer Engine's switches are refused, naming the column.
    for (col, value) in [
        ("pp_layout", "Et*30|t*10L"),
        ("mtp_layers", "1"),
        ("tp_comm_overlap", "true"),
        ("cuda_graphs", "full_iteration"),
        ("cross_entropy", "te"),
    ] {
        let e = refused(col, value);
        assert!(
            e.contains(&format!("column '{col}'"))
                && e.contains("framework scaling has no such switch"),
            "{col} {value}: {e}"
        );
    }
    let c = with(&[
        ("framework", "scaling"),
        ("zero", "1"),
        ("attention", "flash"),
    ])
    .unwrap();
    assert_eq!(c.assumptions.framework, crate::cost::Framework::Scaling);
    // Its attention kernel is stated, not taken from Megatron's era defaults.
    let e = with(&[("framework", "scaling"), ("zero", "1"), ("attention", "")])
        .unwrap_err()
        .reason;
    assert!(
        e.contains("column 'attention'") && e.contains("scaling"),
        "{e}"
    );
}

/// `eager_ops` names the layer's element-wise operations that a row's code runs as
/// eager PyTorch operators: priced slower than fused; a name that is not one of
/// them is refused, naming the column.
#[test]
fn eager_ops_column_prices_the_named_operations() {
    let with = nemotron_with;
    let fused = with(&[]).unwrap();
    let eager = with(&[("eager_ops", "norm rotary glu")]).unwrap();
    assert!(eager.assumptions.eager.norm && eager.assumptions.eager.glu);
    assert!(fused.assumptions.eager.is_none());
    assert!(eager.estimate().unwrap().step_secs > fused.estimate().unwrap().step_secs);
    for bad in ["rmsnorm", "none norm", "norm;glu"] {
        let err = with(&[("eager_ops", bad)]).unwrap_err();
        assert!(
            err.reason.contains("column 'eager_ops'"),
            "{bad}: {}",
            err.reason
        );
    }
}

/// A modern-stack row (a sharded optimizer) without sequence parallelism does not
/// get Transformer Engine's TP overlap by default: Megatron runs it only with
/// sequence parallelism. With it, the overlap stays the default.
#[test]
fn tp_overlap_defaults_follow_sequence_parallelism() {
    let dense = |sp: &str| {
        RUNS.replace(
            "qwen3-30b-a3b,48,2048,6144,32,4,151936,4096,128,8,768,0,1,1,1,1,8,false,64",
            &format!("llama3-8b,32,4096,14336,32,8,128256,4096,,,,,2,1,1,1,1,{sp},32"),
        )
    };
    for (sp, want) in [("false", false), ("true", true)] {
        let c = parse_runs(&dense(sp)).unwrap().remove(0).unwrap();
        assert_eq!(
            (c.config.sp, c.config.overlap.tp_comm),
            (sp == "true", want)
        );
        assert!(c.estimate().is_ok());
    }
    // Anything but true, false or blank is refused, not read as false.
    for bad in ["TRUE", "yes", "1"] {
        let e = parse_runs(&dense(bad)).unwrap().remove(0).unwrap_err();
        assert!(
            e.reason.contains("expected true or false"),
            "{bad}: {}",
            e.reason
        );
    }
}

/// `hbm_tbytes_per_s` sets the HBM bandwidth of the run's GPUs (torchtitan's
/// Grand Teton H100s: 96 GB of HBM2e at 2.4 TB/s), and the memory-bound work it
/// prices takes longer for it; a value the profile cannot hold is refused naming
/// the column.
#[test]
fn hbm_bandwidth_column_sets_the_gpu() {
    let with = nemotron_with;
    let base = with(&[]).unwrap();
    let slow = with(&[("hbm_tbytes_per_s", "2.4")]).unwrap();
    assert_ne!(base.cluster.profile.gpu.hbm_tbytes_per_s, 2.4);
    assert_eq!(slow.cluster.profile.gpu.hbm_tbytes_per_s, 2.4);
    assert!(slow.estimate().unwrap().step_secs > base.estimate().unwrap().step_secs);
    for bad in ["0", "-1", "fast", "1e12"] {
        let err = with(&[("hbm_tbytes_per_s", bad)]).unwrap_err();
        assert!(
            err.reason.contains("column 'hbm_tbytes_per_s'"),
            "{bad}: {}",
            err.reason
        );
    }
}

/// The Megatron-Core rule (TP overlap with sequence parallelism) is Megatron's:
/// a torchtitan row with sequence parallelism and a blank `tp_comm_overlap` ran
/// vanilla TP (async TP is opt-in), and is priced slower than the same row stating
/// async TP.
#[test]
fn tp_overlap_is_megatron_cores_default_only() {
    let tp4 = [("sp", "true"), ("zero", "fsdp")];
    let mcore = nemotron_with(&[("sp", "true")]).unwrap();
    assert!(mcore.config.overlap.tp_comm);
    let titan = |extra: &[(&'static str, &'static str)]| {
        let mut cols = vec![("framework", "torchtitan")];
        cols.extend_from_slice(&tp4);
        cols.extend_from_slice(extra);
        nemotron_with(&cols).unwrap()
    };
    let vanilla = titan(&[]);
    assert!(vanilla.config.sp && !vanilla.config.overlap.tp_comm);
    let nano = nemotron_with(&[("sp", "true"), ("framework", "nanotron")]).unwrap();
    assert!(nano.config.sp && !nano.config.overlap.tp_comm);
    let asynctp = titan(&[("tp_comm_overlap", "true")]);
    assert!(asynctp.config.overlap.tp_comm);
    let (v, a) = (vanilla.estimate().unwrap(), asynctp.estimate().unwrap());
    assert!(
        v.step_secs > a.step_secs,
        "{} vs {}",
        v.step_secs,
        a.step_secs
    );
}

/// A column given twice is refused: the parser would keep its last cell silently.
#[test]
fn a_repeated_column_is_refused() {
    let text =
        RUNS.replacen("note\n", "note,sp\n", 1)
            .replacen("iter_s,10,\n", "iter_s,10,,true\n", 1);
    let e = parse_runs(&text).unwrap_err().to_string();
    assert!(e.contains("column 'sp' appears twice"), "{e}");
}

/// A column no part of the parser reads is refused, with the nearest known name,
/// escaped: a misspelt stack column would otherwise be dropped silently.
#[test]
fn an_unknown_column_is_refused_with_the_nearest_name() {
    let text = RUNS
        .replacen("note\n", "note,tp_comm_overlp\n", 1)
        .replacen("iter_s,10,\n", "iter_s,10,,true\n", 1);
    let e = parse_runs(&text).unwrap_err().to_string();
    assert!(
        e.contains("'tp_comm_overlp'") && e.contains("did you mean 'tp_comm_overlap'"),
        "{e}"
    );
    let hostile = RUNS.replacen("note\n", "note,\u{1b}[2Jx\n", 1).replacen(
        "iter_s,10,\n",
        "iter_s,10,,1\n",
        1,
    );
    let e = parse_runs(&hostile).unwrap_err().to_string();
    assert!(!e.contains('\u{1b}') && !e.contains("did you mean"), "{e}");
}

/// Two rows under one id are refused, in the runs CSV and in a stack file:
/// validate would count both, and a stack row would complete only the first.
#[test]
fn an_id_given_twice_is_refused() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/published_runs.csv"
    ))
    .unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let first = lines.next().unwrap();
    // Line ends as written (the file is CRLF), a padded id, the rows numbered as
    // every row error numbers them.
    for doubled in [
        format!("{header}\n{first}\n{first}\n"),
        format!("{header}\r\n{first}\r\n{first}\r\n"),
        format!("{header}\n{first}\n {first}\n"),
    ] {
        let e = parse_runs(&doubled).unwrap_err().to_string();
        assert!(
            e.contains("CSV row 3: id '") && e.contains("is already row 2's"),
            "{e}"
        );
    }
    let id = first.split(',').next().unwrap();
    let stack = format!("id,recompute\n{id},full\n{id} ,full\n");
    let e = parse_runs_with(&format!("{header}\n{first}\n"), Some(&stack))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("stack file: CSV row 3") && e.contains("already row 2's"),
        "{e}"
    );
}
