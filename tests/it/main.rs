//! Sextant's integration tests: one test binary (see ARCHITECTURE.md, "Tests").

mod cli;
mod exports;
mod fuzz_replay;
mod published;
mod report;
mod common;
mod exec;
mod device;
mod reliability;
mod properties;
