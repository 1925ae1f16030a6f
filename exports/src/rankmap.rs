//! The rank map of a plan as a table and as JSON.

use std::fmt::Write;

use sextant_planner::plan::PlanFile;
use sextant_planner::ranks::{rank_map, GroupKind, RankEntry, RankMap};

use crate::{ExportError, Target};

/// Most ranks a rank map is written for: about 0.6 GB of JSON (one line per
/// rank with its groups' members), which a text file can still be read as. The
/// planner goes to 16,777,216 GPUs, whose map (10 GB of JSON, twice that in
/// memory while it is built) no one reads.
pub const MAX_MAP_RANKS: u64 = 1 << 20;

/// The rank map Megatron-Core would build, or the reason it would refuse the plan's
/// order (`megatron::check_rank_order`); a refusal names `target`, the form asked
/// for (the table or the JSON).
pub fn build(
    plan: &PlanFile,
    index: usize,
    order: &str,
    target: Target,
) -> Result<RankMap, ExportError> {
    let cfg = &plan.plans[index].config;
    if plan.gpus > MAX_MAP_RANKS {
        return Err(ExportError::Inexpressible {
            target,
            reason: format!(
                "a rank map of {} ranks would be gigabytes of text; rank maps are written for up to {MAX_MAP_RANKS} ranks (the groups repeat: export a plan of the same layout on fewer GPUs, e.g. with a smaller --gpus and data-parallel size)",
                plan.gpus
            ),
        });
    }
    // ScaleTorch's grid is its own; Megatron-Core's order rule does not apply.
    if order != sextant_planner::ranks::SCALETORCH_ORDER {
        crate::megatron::check_rank_order(plan, cfg).map_err(|r| r.at(target))?;
    }
    rank_map(cfg, order, plan.hardware.node.gpus_per_node).map_err(|reason| {
        ExportError::Inexpressible {
            target,
            reason: reason.to_string(),
        }
    })
}

/// The members of `e`'s group of `kind`.
fn members(m: &RankMap, e: &RankEntry, kind: GroupKind) -> String {
    let g = &m.groups_of(kind)[e.group_index_of(kind)];
    if g.len() <= 8 {
        format!("{g:?}").replace(' ', "")
    } else {
        format!("[{},{},..,{}]({})", g[0], g[1], g[g.len() - 1], g.len())
    }
}

/// One row per rank: node, local GPU, coordinates, and the members of its TP, CP,
/// DP, PP and EP groups (long groups abbreviated with their size).
pub fn table(m: &RankMap) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# rank map: {} ranks, order {}, {} GPUs per node",
        m.world_size, m.order, m.gpus_per_node
    );
    let _ = writeln!(
        s,
        "{:>6} {:>5} {:>3} {:>3} {:>3} {:>5} {:>3} {:>3} {:>3} {:>5}  {:<20} {:<20} {:<24} {:<24} {:<24}",
        "rank", "node", "gpu", "tp", "cp", "dp", "pp", "ep", "etp", "edp", "tp group", "cp group", "dp group", "pp group", "ep group"
    );
    for e in &m.ranks {
        let _ = writeln!(
            s,
            "{:>6} {:>5} {:>3} {:>3} {:>3} {:>5} {:>3} {:>3} {:>3} {:>5}  {:<20} {:<20} {:<24} {:<24} {:<24}",
            e.rank,
            e.node,
            e.local_gpu,
            e.tp,
            e.cp,
            e.dp,
            e.pp,
            e.ep,
            e.etp,
            e.edp,
            members(m, e, GroupKind::Tp),
            members(m, e, GroupKind::Cp),
            members(m, e, GroupKind::Dp),
            members(m, e, GroupKind::Pp),
            members(m, e, GroupKind::Ep),
        );
    }
    s
}

pub fn json(m: &RankMap) -> String {
    serde_json::to_string_pretty(m).expect("rank map serialises")
}
