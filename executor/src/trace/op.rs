//! The ops of a device program: the planner's walk emits them
//! ([`sextant_planner::walk`]); this crate issues, checks and books them.

pub use sextant_planner::walk::{Coll, CommKind, GroupKind, Op, B};
