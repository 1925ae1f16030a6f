//! Sextant's integration tests: one test binary (see ARCHITECTURE.md, "Tests").
//! The few `unsafe` blocks (libc calls: pipes, FIFOs, signals) each say why they
//! are sound in a `// SAFETY:` line.

#![deny(clippy::undocumented_unsafe_blocks)]

mod bench;
#[cfg(target_os = "linux")]
mod browser;
mod calibrate_log;
mod claims;
mod cli;
mod common;
mod cuda_libs;
mod device;
mod exec;
mod exec_security;
mod export_safety;
mod exports;
mod files;
mod fuzz_replay;
mod gpu_runs;
mod profiles;
mod properties;
mod published;
mod reliability;
mod report;
mod rl;
