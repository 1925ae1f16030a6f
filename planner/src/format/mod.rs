//! The plan file's schema: the on-disk records of a plan, its estimates and its
//! assumptions, and the schema's version.
//!
//! The cost model, the search and the uncertainty bands keep their values free of
//! serde; what reaches a file is one of the records here, converted at the edge
//! (`convert.rs`). Renaming a field inside the cost model therefore does not change
//! a file on a user's disk: the compiler points at the conversion instead. The
//! records import only values that are themselves inputs the user writes (the
//! model, the hardware profile, the workload, the parallel configuration and its
//! enums); every field is documented in `docs/plan-format.md`.
//!
//! - `plan.rs`: [`PlanFile`], [`RankedPlan`], [`SearchSummary`], [`SpaceRecord`],
//!   [`RankBy`].
//! - `assumptions.rs`: [`Assumptions`] and the kernels, rank order, framework and
//!   CUDA graphs it names.
//! - `estimate.rs`: [`Estimate`] and its parts (time, communication, memory,
//!   stages, error band, MoE routing).
//! - `convert.rs`: to and from the cost model's, the search's and the bands'
//!   values.
//!
//! The record types carry the names of the values they record, so that a reader's
//! parse error ("expected struct Estimate") reads as it always has.

mod assumptions;
mod convert;
mod estimate;
mod plan;

pub use assumptions::{Assumptions, CudaGraphs, EagerOps, Framework, LossKernel, RankOrder};
pub use estimate::{
    Attribution, Band, Collective, CommKind, CommTerm, Estimate, MoeRouting, OpClasses, Outside,
    Placement, StageMemory, StageSummary, Tier, TimeBreakdown,
};
pub use plan::{PlanFile, RankBy, RankedPlan, SearchSummary, SpaceRecord};

use serde::Deserialize;

use crate::error::InputError;

/// Version 2 spells the schedule, ZeRO stage and MoE dispatcher as the command line
/// does (`1f1b`, `"1"`, `alltoall`); version 1 files (`one_f_one_b`, `dist_opt`,
/// `all_to_all`) are read and migrated.
pub const PLAN_SCHEMA_VERSION: u32 = 2;

/// Plan-file versions this build reads.
const READS: [u32; 2] = [1, 2];

/// Reads a plan file's records: the version first, so that a file of another
/// version is refused by its number rather than by whichever field changed, then
/// the records, migrated to [`PLAN_SCHEMA_VERSION`]. Checks no more than the
/// schema; [`crate::plan::PlanFile::from_json`] checks that the plans are coherent.
pub fn read_plan(text: &str) -> Result<PlanFile, InputError> {
    #[derive(Deserialize)]
    #[serde(expecting = "a JSON object (a Sextant plan file)")]
    struct Version {
        schema_version: u32,
    }
    let v: Version = crate::json::from_str(text, "plan")?;
    if !READS.contains(&v.schema_version) {
        return Err(InputError::SchemaVersion {
            what: "plan".into(),
            found: v.schema_version,
            supported: PLAN_SCHEMA_VERSION,
        });
    }
    let mut p: PlanFile = crate::json::from_str(text, "plan")?;
    // Version 1 differs only in the spellings of the configuration's enums, which
    // they still accept as aliases.
    p.schema_version = PLAN_SCHEMA_VERSION;
    Ok(p)
}

/// The plan file's text: the records, pretty-printed.
pub fn write_plan(p: &PlanFile) -> String {
    serde_json::to_string_pretty(p).expect("plan serialises")
}

#[cfg(test)]
mod tests;
