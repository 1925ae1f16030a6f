//! One rank's device program: the planner's walk over its step
//! ([`sextant_planner::walk`]) at the plan's executed sizes, collected into a list.

use sextant_planner::memory;
use sextant_planner::ranks::RankMap;
use sextant_planner::walk::{self, held_params, walk_step};

use super::op::Op;
use crate::program::Setup;

/// One step of `rank`'s device program.
pub fn program(s: &Setup, map: &RankMap, rank: u64) -> Vec<Op> {
    let dims = s.walk_dims();
    let mut ops = Vec::new();
    walk_step(s.walk(&dims), map, rank, &mut ops);
    ops
}

/// Bytes of model state `rank` holds: (weights, gradients, optimizer), sharded as
/// the plan's ZeRO stage says.
pub fn footprint(s: &Setup, map: &RankMap, rank: u64) -> (u64, u64, u64) {
    let dims = s.walk_dims();
    let (dense, expert) = held_params(s.walk(&dims), map, rank);
    let (w, g, o) = memory::model_state(
        &s.cfg,
        dense as f64,
        expert as f64,
        sextant_planner::cost::Framework::MegatronCore,
    );
    (w as u64, g as u64, o as u64)
}

/// Every rank's program for one step.
pub fn programs(s: &Setup, map: &RankMap) -> Vec<Vec<Op>> {
    (0..map.world_size).map(|r| program(s, map, r)).collect()
}

/// What every rank's step adds up to.
pub fn tally(s: &Setup, map: &RankMap) -> walk::Tally {
    let dims = s.walk_dims();
    let mut t = walk::Tally::default();
    for r in 0..map.world_size {
        walk_step(s.walk(&dims), map, r, &mut t);
    }
    t
}
