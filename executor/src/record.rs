//! Timing of every component on one rank. The CPU backend times with the
//! monotonic clock around each operation (it runs one at a time, so nothing
//! overlaps); the CUDA backend records events around kernels and calls instead.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sextant_planner::cost::CommKind;

/// Per-shape totals over the timed steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Samples {
    pub calls: u64,
    pub secs: Vec<f64>,
}

impl Samples {
    fn add(&mut self, s: f64) {
        self.calls += 1;
        if self.secs.len() < 4096 {
            self.secs.push(s);
        }
    }
}

/// What one rank measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankStats {
    pub rank: u64,
    /// Component -> seconds, summed over timed steps.
    pub components: BTreeMap<String, f64>,
    /// "class m n k" -> samples.
    pub gemms: BTreeMap<String, Samples>,
    /// "kind op ranks bytes" -> samples.
    pub comms: BTreeMap<String, Samples>,
    pub step_secs: Vec<f64>,
    /// Largest number of (chunk, micro-batch) activations held at once.
    pub peak_live_chunks: u64,
    pub peak_activation_bytes: u64,
    pub param_bytes: u64,
    pub optimizer_bytes: u64,
    pub checks: Checks,
    /// Measured device memory (CUDA backend).
    #[serde(default)]
    pub device_memory: Option<DeviceMemory>,
}

pub use sextant_planner::calibration::DeviceMemory;
/// What the checks counted: the measured-run format's own type.
pub use sextant_planner::calibration::RunChecks as Checks;

pub struct Recorder {
    enabled: bool,
    stats: RefCell<RankStats>,
}

impl Recorder {
    pub fn new(rank: u64, enabled: bool) -> Recorder {
        Recorder {
            enabled,
            stats: RefCell::new(RankStats {
                rank,
                ..RankStats::default()
            }),
        }
    }
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
    }
    pub fn start(&self) -> Instant {
        Instant::now()
    }
    pub fn add(&self, component: &str, t: Instant) {
        if self.enabled {
            *self
                .stats
                .borrow_mut()
                .components
                .entry(component.to_string())
                .or_default() += t.elapsed().as_secs_f64();
        }
    }
    pub fn gemm(&self, class: &'static str, m: usize, n: usize, k: usize, t: Instant) {
        if self.enabled {
            let s = t.elapsed().as_secs_f64();
            let mut st = self.stats.borrow_mut();
            *st.components.entry(class.to_string()).or_default() += s;
            st.gemms
                .entry(format!("{class} {m} {n} {k}"))
                .or_default()
                .add(s);
        }
    }
    /// A collective or transfer of `kind`, booked under its record name
    /// ([`CommKind::key`]).
    pub fn comm(&self, kind: CommKind, op: &'static str, ranks: usize, bytes: usize, t: Instant) {
        if self.enabled {
            let s = t.elapsed().as_secs_f64();
            let mut st = self.stats.borrow_mut();
            let kind = kind.key();
            *st.components.entry(kind.to_string()).or_default() += s;
            st.comms
                .entry(format!("{kind} {op} {ranks} {bytes}"))
                .or_default()
                .add(s);
        }
    }
    pub fn step_time(&self, secs: f64) {
        if self.enabled {
            self.stats.borrow_mut().step_secs.push(secs);
        }
    }
    pub fn with<T>(&self, f: impl FnOnce(&mut RankStats) -> T) -> T {
        f(&mut self.stats.borrow_mut())
    }
    pub fn check(&self, f: impl FnOnce(&mut Checks)) {
        f(&mut self.stats.borrow_mut().checks)
    }
    pub fn take(self) -> RankStats {
        self.stats.into_inner()
    }
}
