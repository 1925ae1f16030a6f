//! Sextant's planner: a pure cost model and an exhaustive search over parallel
//! training layouts (TP, PP with virtual stages, DP, CP, SP, EP and expert-TP,
//! micro-batch, ZeRO stage, recomputation) for dense and mixture-of-experts
//! transformers.
//!
//! Values in, values out: nothing here reads a file, the clock, the environment or
//! the terminal. Built-in hardware profiles are compiled in from `hwprofiles/`;
//! the CLI parses user files and passes their text to the `from_json` functions.
//!
//! Passes: [`search::search`] (enumerate) -> [`config::ParallelConfig::check`] ->
//! [`cost::estimate`] -> rank. A configuration that fails a rule is a
//! [`config::Rejection`] (data, counted by the search), not an error.

#![forbid(unsafe_code)]

pub mod banded;
pub mod bench;
pub mod calibration;
pub mod claims;
pub mod comm;
pub mod config;
pub mod cost;
pub mod error;
pub mod floor;
pub mod format;
pub mod fuzzing;
pub mod hardware;
pub mod hf;
pub mod json;
pub mod kineto;
pub mod logfit;
pub mod memory;
pub mod mixed;
pub mod model;
pub mod notes;
pub mod partition;
pub mod plan;
pub mod presets;
pub mod ranks;
pub mod reach;
pub mod rl;
pub mod routing;
pub mod runs;
pub mod schedule;
pub mod search;
pub mod trainlog;
pub mod uncertainty;
pub mod validate;
pub mod walk;

pub use banded::estimate;
pub use config::{
    Layout, Overlap, ParallelConfig, Precision, Recompute, Rejection, Workload, Zero,
};
pub use cost::Estimate;
pub use error::InputError;
pub use hardware::{Cluster, HardwareProfile};
pub use model::ModelSpec;
