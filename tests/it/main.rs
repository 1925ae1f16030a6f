//! Sextant's integration tests: one test binary (see ARCHITECTURE.md, "Tests").

mod published;
