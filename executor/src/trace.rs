//! The device program: what one rank issues in one training step at the plan's real
//! sizes, as a flat list of [`Op`]s in issue order. The CUDA backend runs it on one
//! stream (GEMMs through cuBLAS, collectives and sends through NCCL); [`check()`] runs
//! every rank's list against the others on the CPU, the way NCCL would pair them,
//! and finds what would hang on the GPUs (a send nobody receives, a collective the
//! members reach in different orders or with different sizes) before any GPU time
//! is spent.
//!
//! The ops come from the planner's walk over the step ([`sextant_planner::walk`]),
//! the same walk whose pass order the CPU program ([`crate::program`]) runs with
//! data; this one carries no data, only sizes and order, so it can describe a 70B
//! model's step in a few thousand ops. What each layer issues is described there.
//!
//! The module's parts: [`Op`] and its sizes (`op`), the walk collected per
//! rank (`build`: [`program`], [`footprint`], [`tally`]), the pairing check ([`check()`]),
//! device scratch sizes ([`Scratch`]) and the booking of measured op times into a
//! rank's statistics ([`book()`], [`peaks`]).

mod book;
mod build;
mod check;
mod op;
mod scratch;

pub use book::{book, peaks};
pub use build::{footprint, program, programs, tally};
pub use check::{check, Checked};
pub use op::{Coll, CommKind, Op};
pub use scratch::{coll_sides, Scratch, COPY_PIECE};
