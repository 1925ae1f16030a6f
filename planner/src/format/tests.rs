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
//! and not the float parser. They were made by the `write_goldens` test of the
//! commit that added this module, which also compared the records' output with the
//! old derives' on full-precision plans; both left with the derives.

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
        eager: crate::cost::EagerOps {
            norm: true,
            ..Default::default()
        },
        ..Assumptions::default()
    };
    p.rank_by = Some(RankBy::Point);
    let text = p.to_json();
    assert!(text.contains("\"framework\": \"nanotron\""), "{text}");
    assert!(text.contains("\"cuda_graphs\""), "{text}");
    assert!(text.contains("\"eager_ops\""), "{text}");
    let back = PlanFile::from_json(&text).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.to_json(), text);
    let mut plain = p.clone();
    plain.assumptions = Assumptions::default();
    plain.target = None;
    plain.rank_by = None;
    plain.search.as_mut().unwrap().space = None;
    let text = plain.to_json();
    for absent in [
        "framework",
        "cuda_graphs",
        "eager_ops",
        "target",
        "rank_by",
        "space",
    ] {
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
