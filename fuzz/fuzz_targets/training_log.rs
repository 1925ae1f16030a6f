//! cargo +nightly fuzz run training_log (see README.md, "Fuzzing"); the body is shared with
//! the replay test through sextant_planner::fuzzing.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| sextant_planner::fuzzing::fuzz_training_log(data));
