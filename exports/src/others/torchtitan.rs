//! torchtitan: the TOML job config of its last TOML-configured release.

use std::fmt::Write;

use sextant_planner::config::{Layout, Precision, Recompute, Zero};
use sextant_planner::cost::LossKernel;
use sextant_planner::plan::PlanFile;
use sextant_planner::schedule::Schedule;

use crate::quote;
use crate::{ExportError, Target};

use super::{cannot, describe_layout, TORCHTITAN_VERSION};

/// torchtitan: the TOML sections of `torchtitan/config/job_config.py` at
/// [`TORCHTITAN_VERSION`] (the last TOML-configured release).
pub fn torchtitan(plan: &PlanFile, index: usize) -> Result<String, ExportError> {
    let t = Target::Torchtitan;
    let cfg = &plan.plans[index].config;
    let w = &plan.workload;
    if plan.model.mtp_layers > 0 {
        return Err(cannot(t, "torchtitan's models train no multi-token-prediction layers; re-plan with --mtp-layers 0"));
    }
    if cfg.tp > 1 && !cfg.sp {
        return Err(cannot(
            t,
            "torchtitan applies sequence parallelism whenever TP > 1; this plan has TP without SP",
        ));
    }
    if cfg.etp != 1 && cfg.etp != cfg.tp {
        return Err(cannot(t, format!("torchtitan's expert_tensor_parallel_degree must be 1 or equal to TP ({}); plan has {}", cfg.tp, cfg.etp)));
    }
    let (replicate, shard, reshard) = match cfg.zero {
        Zero::None => (cfg.dp, 1, None),
        Zero::DistOpt => return Err(cannot(t, "torchtitan has no optimizer-only sharding (ZeRO-1 / distributed optimizer); use --zero 0 (DDP), 2 or 3 (FSDP2)")),
        Zero::Zero2 => (1, cfg.dp, Some("never")),
        // torchtitan's default reshards after forward except under a pipeline
        // (llama3/infra/parallelize.py), where ZeRO-3 would run as ZeRO-2.
        Zero::Zero3 => (1, cfg.dp, Some("always")),
    };
    // Schedule names: torch/distributed/pipelining/schedules.py (get_schedule_class).
    let schedule = match cfg.schedule {
        Schedule::OneFOneB => "1F1B",
        Schedule::Interleaved => "Interleaved1F1B",
        Schedule::Gpipe => "GPipe",
        other => {
            return Err(cannot(
                t,
                format!("torchtitan has no {other} schedule with one stage per rank (its ZBVZeroBubble and DualPipeV put two stages on each rank in a V); re-plan with --schedule 1f1b,interleaved,gpipe"),
            ))
        }
    };
    let layers = plan.model.layers;
    let per_stage = match &cfg.layout {
        Layout::Even => layers / (cfg.pp * cfg.vpp),
        _ => return Err(cannot(t, format!("torchtitan splits stages evenly by pipeline_parallel_layers_per_stage; this plan uses {}", describe_layout(plan, cfg)))),
    };
    // torchtitan's loss is `cross_entropy(pred.float())` (components/loss.py), eager
    // or compiled; Transformer Engine's fused kernel is not one of them.
    if plan.assumptions.loss == LossKernel::Te {
        return Err(cannot(t, "torchtitan has no Transformer Engine cross-entropy kernel (--loss te); re-plan with --loss native (its eager loss's passes) or compiled"));
    }
    // Without FSDP, v0.2.2 runs data parallelism only as one-dimensional DDP
    // (llama3/infra/parallelize.py:148-151 raises beside TP, PP or CP) and turns
    // mixed precision off under TP or PP (distributed/utils.py:251-256): the run
    // would fail or train in FP32, not the BF16 plan priced.
    if cfg.zero == Zero::None && (cfg.tp > 1 || cfg.pp > 1 || cfg.cp > 1) {
        return Err(cannot(t, "torchtitan runs TP, PP or CP only beside FSDP: without it, data parallelism is one-dimensional DDP and mixed precision is off (v0.2.2 parallelize.py:148-151, distributed/utils.py:251-256); re-plan with --zero 2,3"));
    }
    // gpt_oss's train spec applies its tensor parallelism with async TP off,
    // whatever the config says (models/gpt_oss/infra/parallelize.py:100 at v0.2.2,
    // `enable_async_tp=False`).
    if cfg.overlap.tp_comm
        && cfg.tp > 1
        && torchtitan_flavor(&plan.model).is_some_and(|(name, _)| name == "gpt_oss")
    {
        return Err(cannot(t, "torchtitan's gpt_oss applies tensor parallelism without async TP whatever the config says (models/gpt_oss/infra/parallelize.py:100 at v0.2.2); re-plan without --tp-comm-overlap"));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# torchtitan job config (TOML, torchtitan/config/job_config.py) for plan #{}: {} on {} GPUs.",
        plan.plans[index].rank,
        quote::comment(&plan.model.name),
        plan.gpus
    );
    let _ = writeln!(s, "# For {TORCHTITAN_VERSION}; later torchtitan is configured in Python and does not read this file.");
    let _ = writeln!(s, "[parallelism]");
    let _ = writeln!(s, "data_parallel_replicate_degree = {replicate}");
    let _ = writeln!(s, "data_parallel_shard_degree = {shard}");
    if let Some(r) = reshard {
        let _ = writeln!(
            s,
            "fsdp_reshard_after_forward = {}",
            quote::double_quoted(r)
        );
    }
    let _ = writeln!(s, "tensor_parallel_degree = {}", cfg.tp);
    let _ = writeln!(
        s,
        "enable_async_tensor_parallel = {}",
        cfg.overlap.tp_comm && cfg.tp > 1
    );
    let _ = writeln!(s, "pipeline_parallel_degree = {}", cfg.pp);
    if cfg.pp > 1 {
        // Schedule names: torch/distributed/pipelining/schedules.py.
        let _ = writeln!(
            s,
            "pipeline_parallel_schedule = {}",
            quote::double_quoted(schedule)
        );
        let _ = writeln!(s, "pipeline_parallel_layers_per_stage = {per_stage}");
        // Even stages, as the plan priced them: torchtitan's defaults (1 and 1,
        // job_config.py) count the embedding and the output layer as a layer each,
        // which changes the stage count pipeline_llm derives and can make it
        // indivisible by the degree (pipeline_parallel.py at v0.2.2).
        let _ = writeln!(s, "pipeline_parallel_first_stage_less_layers = 0");
        let _ = writeln!(s, "pipeline_parallel_last_stage_less_layers = 0");
        let _ = writeln!(s, "pipeline_parallel_microbatch_size = {}", cfg.mbs);
    }
    let _ = writeln!(s, "context_parallel_degree = {}", cfg.cp);
    if plan.model.moe.is_some() {
        let _ = writeln!(s, "expert_parallel_degree = {}", cfg.ep);
        let _ = writeln!(s, "expert_tensor_parallel_degree = {}", cfg.etp);
    }
    let _ = writeln!(s, "\n[training]");
    // torchtitan accumulates global / (local x data-parallel degree) batches per
    // step (train.py:196-215 at v0.2.2); a pipeline splits its local batch into
    // micro-batches of pipeline_parallel_microbatch_size itself. Without a
    // pipeline the local batch is what one forward holds: the plan's micro-batch.
    let local = if cfg.pp > 1 {
        w.global_batch / cfg.dp
    } else {
        cfg.mbs
    };
    let _ = writeln!(s, "local_batch_size = {local}");
    let _ = writeln!(s, "global_batch_size = {}", w.global_batch);
    let _ = writeln!(s, "seq_len = {}", w.seq);
    let _ = writeln!(s, "\n[activation_checkpoint]");
    match cfg.recompute {
        Recompute::None => {
            let _ = writeln!(s, "mode = \"none\"");
        }
        Recompute::Selective => {
            let _ = writeln!(s, "mode = \"selective\"\nselective_ac_option = \"op\"");
        }
        Recompute::Full => {
            let _ = writeln!(s, "mode = \"full\"");
        }
    }
    // The model under torch.compile, as the plan priced it: the cost model charges
    // a layer's element-wise work (norms, rotary embedding, SwiGLU, residuals) as
    // fused passes, which is what torchtitan's published throughput runs measured
    // with the model compiled; eager, each is several kernels (its December 2024
    // benchmark: Llama 3 8B on 8 H100s, 5,762 tokens/s/GPU eager against 6,667
    // compiled, tests/data/published_sweeps.csv). Async TP needs it as well
    // (distributed/tensor_parallel.py:20). The loss joins it where the plan priced
    // the compiled loss (`components` at v0.2.2, torchtitan/config/job_config.py
    // `Compile`, whose default lists both but whose `enable` is false).
    let components = if plan.assumptions.loss == LossKernel::Compiled {
        "[\"model\", \"loss\"]"
    } else {
        "[\"model\"]"
    };
    let _ = writeln!(s, "\n[compile]\nenable = true\ncomponents = {components}");
    // [model]: the train spec and flavor of the plan's model (torchtitan's default
    // is llama3's debugmodel), and the FP8 converters.
    let _ = writeln!(s, "\n[model]");
    match torchtitan_flavor(&plan.model) {
        Some((name, flavor)) => {
            if name == "gpt_oss" {
                let _ = writeln!(s, "# gpt_oss's train spec compiles none of its blocks at v0.2.2 (models/gpt_oss/infra/parallelize.py calls no apply_compile): its element-wise passes run eager, slower than this plan priced");
            }
            let _ = writeln!(s, "name = \"{name}\"\nflavor = \"{flavor}\"");
        }
        None => {
            let m = &plan.model;
            let _ = writeln!(
                s,
                "# name and flavor: torchtitan's train spec for {} ({} layers, hidden {}; v0.2.2 names llama3 8B/70B/405B, qwen3, deepseek_v3 and gpt_oss flavors, and none has this shape): set them to a flavor of this shape you registered; without them torchtitan trains llama3's debugmodel",
                quote::comment(&m.name),
                m.layers,
                m.hidden
            );
        }
    }
    match w.precision {
        Precision::Bf16 => {}
        Precision::Fp16 => {
            return Err(cannot(
                t,
                "torchtitan trains in BF16 (mixed_precision_param); FP16 is not offered",
            ))
        }
        Precision::Fp8 => {
            let _ = writeln!(s, "converters = [\"quantize.linear.float8\"]");
        }
        Precision::Mxfp8 => {
            let _ = writeln!(s, "converters = [\"quantize.linear.mx\"]\n\n[quantize.linear.mx]\nrecipe_name = \"mxfp8_cublas\"");
        }
    }
    Ok(s)
}

/// torchtitan's train spec and flavor for a Sextant preset of the same shape
/// (torchtitan/models/*/__init__.py at v0.2.2: `llama3` 8B, 70B, 405B; `qwen3`
/// 30B-A3B, 235B-A22B; `deepseek_v3` 671B; `gpt_oss` 120b).
/// The name picks the flavor only when the plan's model has the preset's shape
/// (a config.json named like a preset may have other layers or widths):
/// otherwise there is none, and the file says so. The shape is the sizes a
/// flavor fixes (layers, widths, heads, vocabulary, experts, MLA); the MTP
/// layers are not (torchtitan's flavors have none, and the export refuses a
/// plan with them), nor is what a plan file of an older release may lack.
fn torchtitan_flavor(
    model: &sextant_planner::model::ModelSpec,
) -> Option<(&'static str, &'static str)> {
    let preset = sextant_planner::presets::resolve(&model.name).ok()?.spec;
    let shape = |m: &sextant_planner::model::ModelSpec| {
        (
            (
                m.layers,
                m.hidden,
                m.ffn_hidden,
                m.heads,
                m.kv_heads,
                m.head_dim,
                m.vocab,
            ),
            (m.tied_embeddings, m.mlp, m.mla, m.moe),
        )
    };
    if shape(model) != shape(&preset) {
        return None;
    }
    Some(match preset.name.as_str() {
        "llama3-8b" => ("llama3", "8B"),
        "llama3-70b" => ("llama3", "70B"),
        "llama3.1-405b" => ("llama3", "405B"),
        "qwen3-30b-a3b" => ("qwen3", "30B-A3B"),
        "qwen3-235b-a22b" => ("qwen3", "235B-A22B"),
        "deepseek-v3" => ("deepseek_v3", "671B"),
        "gpt-oss-120b" => ("gpt_oss", "120b"),
        _ => return None,
    })
}
