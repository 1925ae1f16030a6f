//! The plan file through the format layer: golden files written by the serialiser
//! before the layer existed read and write back byte for byte, a plan with every
//! optional field goes round the file unchanged, version 1 migrates and other
//! versions are refused by their number.
//!
//! The golden files' numbers have at most 12 significant digits. serde_json (without
//! its `float_roundtrip` feature) may read a 17-digit number one unit in the last
//! place off, so a file of the cost model's full-precision numbers can come back
//! from a read and a write with a last digit changed, before and after the format
//! layer alike; numbers of 12 digits read exactly, so these files test the format
//! and not the float parser.

use crate::cost::{Assumptions, CudaGraphs, Framework, LossKernel};
use crate::error::InputError;
use crate::plan::PlanFile;
use crate::reach::RankBy;

/// `sextant estimate --model llama3-8b --gpus 16 --tp 2 --pp 2 --vpp 2
/// --global-batch 64 --loss unfused --json`, its numbers rounded to 12 significant
/// digits and written by the serialiser before the format layer (the cost model's
/// types' own derives): one dense plan with an error band.
const DENSE: &str = include_str!("../../../tests/data/golden/plan-dense.json");

/// `sextant plan --model mixtral-8x7b --gpus 32 --global-batch 256 --top 2
/// --cuda-graphs attn --out`, rounded and written likewise: two MoE plans from a
/// search, with the search's counts and space, the target, the ranking end, MoE
/// routing and CUDA graphs.
const MOE: &str = include_str!("../../../tests/data/golden/plan-moe.json");

/// The plan JSON written for the estimates a golden file holds is that file, byte
/// for byte: the records write what the internal types wrote before them.
#[test]
fn golden_plan_files_read_and_write_back_unchanged() {
    for (name, golden) in [("plan-dense.json", DENSE), ("plan-moe.json", MOE)] {
        let p = PlanFile::from_json(golden).unwrap_or_else(|e| panic!("{name}: {e}"));
        let written = p.to_json();
        if written != golden.trim_end() {
            let line = written
                .lines()
                .zip(golden.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(written.lines().count().min(golden.lines().count()));
            panic!(
                "{name}: the plan written differs from the golden file at line {}:\n  want: {:?}\n  got:  {:?}",
                line + 1,
                golden.lines().nth(line),
                written.lines().nth(line)
            );
        }
    }
}

/// The MoE golden file exercises what its doc comment says it does.
#[test]
fn golden_files_hold_the_optional_fields() {
    let p = PlanFile::from_json(MOE).unwrap();
    assert_eq!(p.plans.len(), 2);
    let space = p.search.as_ref().and_then(|s| s.space.as_ref());
    assert!(space.is_some(), "search.space");
    assert!(p.target.is_some() && p.rank_by.is_some());
    assert!(p.assumptions.cuda_graphs.attn);
    assert!(p.plans[0].estimate.moe_routing.is_some());
    assert!(p.plans[0].estimate.band.is_some());
    let d = PlanFile::from_json(DENSE).unwrap();
    assert!(d.search.is_none() && d.target.is_none() && d.rank_by.is_none());
    assert_eq!(d.assumptions.loss, LossKernel::Unfused);
    assert!(d.plans[0].estimate.band.is_some());
    assert!(
        DENSE.contains("\"search\": null"),
        "search is written as null"
    );
}

/// Write, read, write: the same text, and the same plan in memory, with every
/// optional field set and assumptions other than the defaults; and the defaults
/// left out of the text as before the format layer.
#[test]
fn a_plan_goes_round_the_file_unchanged() {
    let mut p = PlanFile::from_json(MOE).unwrap();
    p.assumptions = Assumptions {
        loss: LossKernel::Te,
        framework: Framework::Nanotron,
        cuda_graphs: CudaGraphs {
            attn: true,
            moe_router: true,
            ..CudaGraphs::default()
        },
        ..Assumptions::default()
    };
    p.rank_by = Some(RankBy::Point);
    let text = p.to_json();
    assert!(text.contains("\"framework\": \"nanotron\""), "{text}");
    assert!(text.contains("\"cuda_graphs\""), "{text}");
    let back = PlanFile::from_json(&text).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.to_json(), text);
    let mut plain = p.clone();
    plain.assumptions = Assumptions::default();
    plain.target = None;
    plain.rank_by = None;
    plain.search.as_mut().unwrap().space = None;
    let text = plain.to_json();
    for absent in ["framework", "cuda_graphs", "target", "rank_by", "space"] {
        assert!(!text.contains(&format!("\"{absent}\"")), "{absent}");
    }
    let back = PlanFile::from_json(&text).unwrap();
    assert_eq!(back, plain);
    assert_eq!(back.to_json(), text);
}

/// Version 1 spellings read and write back as version 2; version 3 is refused in
/// one line naming it.
#[test]
fn version_1_migrates_and_other_versions_are_refused() {
    let v2 = DENSE.trim_end();
    let v1 = v2
        .replacen("\"schema_version\": 2", "\"schema_version\": 1", 1)
        .replace("\"zero\": \"1\"", "\"zero\": \"dist_opt\"")
        .replace("\"alltoall\"", "\"all_to_all\"");
    assert!(v1.contains("dist_opt") && v1.contains("all_to_all"));
    assert_eq!(PlanFile::from_json(&v1).unwrap().to_json(), v2);
    for version in [0, 3, 99] {
        let text = v2.replacen(
            "\"schema_version\": 2",
            &format!("\"schema_version\": {version}"),
            1,
        );
        let e = PlanFile::from_json(&text).unwrap_err();
        assert!(
            matches!(e, InputError::SchemaVersion { found, .. } if found == version),
            "{e}"
        );
        let line = e.to_string();
        assert!(line.contains(&format!("schema_version {version}")) && !line.contains('\n'));
    }
}

/// Before the cost model's types lost their serde derives: the plan file as those
/// derives wrote it, beside the format layer's, for the golden files and for a plan
/// of full-precision numbers straight from the cost model with every optional field
/// set. (Removed with the derives; the golden files carry the comparison on.)
mod before_the_records {
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::config::{Layout, Overlap, ParallelConfig, Precision, Recompute, Workload, Zero};
    use crate::cost;
    use crate::hardware::{builtin_profile, Cluster, HardwareProfile};
    use crate::model::ModelSpec;
    use crate::plan::{SearchSummary, SpaceRecord};
    use crate::presets::resolve;
    use crate::schedule::Schedule;
    use crate::search::SearchSpace;

    /// `plan::PlanFile` as it was declared before the format layer.
    #[derive(Serialize, Deserialize)]
    struct OldPlanFile {
        schema_version: u32,
        generator: String,
        model: ModelSpec,
        hardware: HardwareProfile,
        gpus: u64,
        workload: Workload,
        #[serde(default)]
        assumptions: cost::Assumptions,
        rank_order: String,
        #[serde(default)]
        search: Option<SearchSummary>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank_by: Option<crate::reach::RankBy>,
        plans: Vec<OldRankedPlan>,
    }

    #[derive(Serialize, Deserialize)]
    struct OldRankedPlan {
        rank: usize,
        config: ParallelConfig,
        estimate: cost::Estimate,
    }

    fn old_json(p: &PlanFile) -> String {
        let old = OldPlanFile {
            schema_version: p.schema_version,
            generator: p.generator.clone(),
            model: p.model.clone(),
            hardware: p.hardware.clone(),
            gpus: p.gpus,
            workload: p.workload.clone(),
            assumptions: p.assumptions,
            rank_order: p.rank_order.clone(),
            search: p.search.clone(),
            target: p.target.clone(),
            rank_by: p.rank_by,
            plans: p
                .plans
                .iter()
                .map(|rp| OldRankedPlan {
                    rank: rp.rank,
                    config: rp.config.clone(),
                    estimate: rp.estimate.clone(),
                })
                .collect(),
        };
        serde_json::to_string_pretty(&old).unwrap()
    }

    fn config(tp: u64, pp: u64, vpp: u64, ep: u64, dp: u64) -> ParallelConfig {
        ParallelConfig {
            tp,
            pp,
            vpp,
            cp: 1,
            ep,
            etp: 1,
            dp,
            sp: tp > 1,
            mbs: 1,
            zero: Zero::DistOpt,
            recompute: Recompute::Selective,
            layout: Layout::Even,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            recompute_modules: Default::default(),
            moe_dispatcher: Default::default(),
            schedule: Schedule::default_for(vpp),
        }
    }

    /// Two MoE plans priced by the cost model and simulated as `plan` does, with
    /// every optional field set and assumptions other than the defaults.
    fn full_plan() -> PlanFile {
        let model = resolve("mixtral-8x7b").unwrap().spec;
        let cluster = Cluster::new(builtin_profile("h100-sxm").unwrap(), 32).unwrap();
        let workload = Workload {
            seq: 4096,
            global_batch: 256,
            precision: Precision::Bf16,
            moe_imbalance: 1.2,
            moe_capacity: None,
        };
        let a = cost::Assumptions {
            loss: cost::LossKernel::Te,
            framework: cost::Framework::Nanotron,
            cuda_graphs: cost::CudaGraphs {
                attn: true,
                moe_router: true,
                ..cost::CudaGraphs::default()
            },
            ..cost::Assumptions::default()
        };
        let plans = [config(2, 4, 1, 4, 4), config(2, 4, 2, 4, 4)]
            .into_iter()
            .map(|cfg| {
                let mut e = cost::estimate_with(&model, &cluster, &workload, &cfg, a)
                    .unwrap_or_else(|r| panic!("{cfg:?}: {r}"));
                cost::apply_simulation(&mut e, &cfg);
                (cfg, e)
            })
            .collect();
        let mut p = PlanFile::new(model, cluster.profile, 32, workload, a, None, plans);
        p.search = Some(SearchSummary {
            enumerated: 10,
            valid: 2,
            rejected: [(crate::config::RejectKind::OutOfMemory, 8)].into(),
            space: Some(SpaceRecord::of(&SearchSpace::default(), true)),
        });
        p.target = Some("megatron-lm".into());
        p.rank_by = Some(RankBy::Point);
        p
    }

    #[test]
    fn the_records_write_what_the_derives_wrote() {
        let full = full_plan();
        assert!(full.plans.iter().all(|rp| rp.estimate.band.is_some()));
        assert!(full.plans[0].estimate.moe_routing.is_some());
        let mut plain = full.clone();
        plain.assumptions = cost::Assumptions::default();
        plain.target = None;
        plain.rank_by = None;
        plain.search = None;
        let goldens = [DENSE, MOE].map(|g| PlanFile::from_json(g).unwrap());
        for p in goldens.iter().chain([&full, &plain]) {
            assert_eq!(p.to_json(), old_json(p));
        }
        // And they read what the derives read.
        let full_text = full.to_json();
        for text in [DENSE, MOE, full_text.as_str()] {
            let old: OldPlanFile = serde_json::from_str(text).unwrap();
            let new = PlanFile::from_json(text).unwrap();
            assert_eq!(serde_json::to_string_pretty(&old).unwrap(), new.to_json());
        }
    }

    /// Run once by hand (`SEXTANT_PLAN_GOLDENS=dir`): the CLI's plan files in `dir`,
    /// their floats rounded to 12 significant digits, written by the derives.
    #[test]
    fn write_goldens() {
        let Some(dir) = std::env::var_os("SEXTANT_PLAN_GOLDENS") else {
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        fn round(v: &mut serde_json::Value) {
            match v {
                serde_json::Value::Number(n) if n.is_f64() => {
                    let x = n.as_f64().unwrap();
                    let r: f64 = format!("{x:.11e}").parse().unwrap();
                    *v = serde_json::json!(r);
                }
                serde_json::Value::Array(a) => a.iter_mut().for_each(round),
                serde_json::Value::Object(o) => o.values_mut().for_each(round),
                _ => {}
            }
        }
        for name in ["plan-dense.json", "plan-moe.json"] {
            let text = std::fs::read_to_string(dir.join(name)).unwrap();
            let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
            round(&mut v);
            let old: OldPlanFile = serde_json::from_value(v).unwrap();
            let g = serde_json::to_string_pretty(&old).unwrap();
            let again: OldPlanFile = serde_json::from_str(&g).unwrap();
            assert_eq!(serde_json::to_string_pretty(&again).unwrap(), g, "{name}");
            std::fs::write(dir.join(format!("{name}.out")), g + "\n").unwrap();
        }
    }
}
