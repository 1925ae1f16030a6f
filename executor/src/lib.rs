//! Sextant's executor: runs one plan from a plan file, one process per rank.
//!
//! It reads the plan format and never calls the search. Ranks find each other at a
//! TCP rendezvous ([`rendezvous`]), connect a mesh ([`mesh`]), build their groups
//! from the plan's rank order and run [`program::run`]. The CPU backend moves real
//! data over loopback TCP with f32 GEMMs at small sizes: it proves a plan's layout
//! and schedule are consistent. The CUDA backend (feature `cuda`) is in the `cuda` and
//! `device` modules and the benchmarks' timing in `bench`; without the feature,
//! modules of the same names (`nocuda.rs`, `bench`'s stand-ins) have the same
//! functions and types, each function returning one error saying so.
//!
//! `unsafe` is denied everywhere but in `cuda::ffi` (the CUDA backend's raw calls,
//! behind safe functions) and `tensor`'s call of `matrixmultiply`'s GEMM; each
//! `unsafe` block there says why it is sound in a `// SAFETY:` line (clippy's
//! `undocumented_unsafe_blocks`).

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod auth;
pub mod bench;
pub mod comm;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod culibs;
#[cfg(feature = "cuda")]
pub mod cuload;
#[cfg(feature = "cuda")]
pub mod device;
pub mod error;
pub mod mesh;
pub mod model;
#[cfg(not(feature = "cuda"))]
mod nocuda;
pub mod program;
pub mod record;
pub mod rendezvous;
pub mod tensor;
pub mod trace;

pub use error::ExecError;
#[cfg(not(feature = "cuda"))]
pub use nocuda::{cuda, device};
