//! Training logs of the stacks users train with: what one run's log says about its
//! step time, memory and configuration. Pure: the CLI reads the file (bounded, line
//! by line) and hands each line to [`LogReader::line`].
//!
//! Two line formats, written from their sources' format strings:
//! - **Megatron-LM and Megatron-Bridge** (`training_log` in Megatron-LM's
//!   `megatron/training/training.py` and Megatron-Bridge's
//!   `training/utils/train_utils.py`; the same fields): an optional timestamp, then
//!   ` iteration {:8d}/{:8d} |` and fields ` NAME: VALUE |`, among them
//!   `elapsed time per iteration (ms)` (the mean over the log interval),
//!   `throughput per GPU (TFLOP/s/GPU)` and `global batch size`. Every field ends
//!   with `|`, so a field without one was cut off and is not read. Memory reports
//!   are `[Rank R] (after N iterations) memory (MB) | allocated: X | max allocated:
//!   X | reserved: X | max reserved: X` (Megatron-LM, MiB) or `... memory (GB) |
//!   mem-max-allocated-gigabytes: X | ...` (Bridge, 10^9 bytes), one per
//!   data-parallel rank 0.
//! - **NeMo 2** (Lightning's `ProgressPrinter`): `Training epoch E, iteration N/M |
//!   lr: X | global_batch_size: X | ... | train_step_timing in s: X` (interval
//!   means), whose last field has no closing `|`: it is read only when its line
//!   ended with a newline.
//!
//! The configuration a log states is read where it is printed: Megatron-LM's
//! argument dump (`  world_size ........ 8`, `tensor_model_parallel_size`, ...) and
//! its `using world size: N, data-parallel size: ...` line, and Lightning's
//! `Initializing distributed: GLOBAL_RANK: r, MEMBER: k/N`.
//!
//! Anything else on a line (launcher prefixes such as `0:` or `[default3]:`, other
//! ranks' output interleaved into it) is skipped: each record starts at its own
//! marker and ends where the next record starts.

use std::collections::BTreeMap;

mod reader;
#[cfg(test)]
mod tests;

pub use reader::{parse, LogReader};

/// Iteration lines kept from one log (2M lines of a few dozen bytes each).
pub const MAX_ITERATION_LINES: usize = 2_000_000;
/// A step time a log may state: a microsecond to about 11 days.
const STEP_SECS: (f64, f64) = (1e-6, 1e6);
/// The default warm-up: iteration lines logged before the first logged iteration
/// plus this many are not measured (see [`TrainingLog::summary`]).
pub const DEFAULT_WARMUP_ITERS: u64 = 10;

/// Which stack's line format the log's iteration lines are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Megatron-LM's `training_log` line, which Megatron-Bridge prints too.
    Megatron,
    /// NeMo 2's Lightning progress printer.
    Nemo2,
}

impl LogFormat {
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Megatron => "Megatron-LM / Megatron-Bridge",
            LogFormat::Nemo2 => "NeMo 2",
        }
    }
}

/// One logged iteration line: means over its log interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IterationLine {
    pub iteration: u64,
    pub step_secs: f64,
    pub global_batch: Option<u64>,
    /// Megatron's own model-FLOP count per second per GPU, when logged.
    pub tflops_per_gpu: Option<f64>,
    /// A fingerprint of the record's values (its iteration, its step time and
    /// every loss field's number), for telling one run's log copied twice from
    /// two runs whose coarse times happen to agree: runs that differ in their
    /// losses differ here, while a copy whose spacing, number spelling or other
    /// fields were edited does not. A deterministic rerun in a format that prints
    /// coarse times and short losses (NeMo 2: 10 ms, four significant digits) can
    /// still match its first run. In-process only, not stable across builds.
    pub record: u64,
}

/// [`IterationLine::record`] of a record: the iteration, the step time and, of
/// `fields` (key, value), every one whose key names a loss, by its number (keys
/// compared without case or repeated spaces; a value that is no number is left
/// out).
pub fn record_fingerprint(iteration: u64, step_secs: f64, fields: &[(&str, &str)]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    iteration.hash(&mut h);
    step_secs.to_bits().hash(&mut h);
    for (key, value) in fields {
        let key = key
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_ascii_lowercase();
        if !key.contains("loss") {
            continue;
        }
        if let Ok(v) = value.trim().parse::<f64>() {
            key.hash(&mut h);
            v.to_bits().hash(&mut h);
        }
    }
    h.finish()
}

/// The latest memory report of one rank (torch's caching allocator, peaks since
/// the start).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MemoryReport {
    pub after_iterations: u64,
    pub max_allocated_bytes: Option<f64>,
    pub max_reserved_bytes: Option<f64>,
}

/// What the log says about the configuration it ran (absent: not stated).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatedConfig {
    pub world_size: Option<u64>,
    pub tp: Option<u64>,
    pub pp: Option<u64>,
    pub cp: Option<u64>,
    pub ep: Option<u64>,
    pub dp: Option<u64>,
    pub mbs: Option<u64>,
    pub global_batch: Option<u64>,
    pub seq: Option<u64>,
}

impl StatedConfig {
    /// (name as the message shows it, value) of every stated number.
    pub fn stated(&self) -> Vec<(&'static str, u64)> {
        [
            ("world size", self.world_size),
            ("tensor-parallel size", self.tp),
            ("pipeline-parallel size", self.pp),
            ("context-parallel size", self.cp),
            ("expert-parallel size", self.ep),
            ("data-parallel size", self.dp),
            ("micro-batch size", self.mbs),
            ("global batch size", self.global_batch),
            ("sequence length", self.seq),
        ]
        .into_iter()
        .filter_map(|(n, v)| v.map(|v| (n, v)))
        .collect()
    }

    /// The field of a setting, by Megatron-LM's argument name.
    fn slot(&mut self, name: &str) -> Option<&mut Option<u64>> {
        Some(match name {
            "world_size" => &mut self.world_size,
            "tensor_model_parallel_size" => &mut self.tp,
            "pipeline_model_parallel_size" => &mut self.pp,
            "context_parallel_size" => &mut self.cp,
            "expert_model_parallel_size" => &mut self.ep,
            "data_parallel_size" => &mut self.dp,
            "micro_batch_size" => &mut self.mbs,
            "global_batch_size" => &mut self.global_batch,
            "seq_length" => &mut self.seq,
            _ => return None,
        })
    }
}

/// Everything read from one log.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingLog {
    pub format: LogFormat,
    /// In the order logged.
    pub iterations: Vec<IterationLine>,
    /// Rank -> its latest memory report.
    pub memory: BTreeMap<u64, MemoryReport>,
    pub stated: StatedConfig,
    /// Lines that start an iteration record but hold no readable step time (cut
    /// off, or another process's output written into the number).
    pub unreadable_lines: u64,
    /// Lines whose step time reads as a number that is no time: 0, negative,
    /// NaN, infinite or beyond a million seconds.
    pub bad_time_lines: u64,
    pub lines: u64,
}

/// The measured step of a log, by the rule of [`TrainingLog::summary`].
#[derive(Debug, Clone, PartialEq)]
pub struct StepSummary {
    /// Median of the kept lines' step times.
    pub step_secs: f64,
    pub min_secs: f64,
    pub max_secs: f64,
    pub kept: usize,
    /// Lines dropped as warm-up.
    pub warmup: usize,
    /// Lines dropped for a global batch other than the last one (batch-size ramp-up).
    pub rampup: usize,
    pub global_batch: Option<u64>,
    /// Median of the kept lines' logged TFLOP/s per GPU, when every kept line has one.
    pub tflops_per_gpu: Option<f64>,
    pub first_iteration: u64,
    pub last_iteration: u64,
}

impl TrainingLog {
    /// The measured step time. Warm-up rule: with `i0` the first logged iteration,
    /// lines logged for iterations before `i0 + warmup_iters` are dropped (with the
    /// default 10 that is always the first line, which carries start-up, compilation
    /// and allocator growth); so are lines whose global batch differs from the last
    /// line's (a batch-size ramp-up). The step is the median of the rest, which a
    /// few slow intervals (checkpoint saves, evaluation, a straggler) do not move.
    pub fn summary(&self, warmup_iters: u64) -> Result<StepSummary, TrainLogError> {
        let Some(first) = self.iterations.first() else {
            return Err(TrainLogError::NoIteration);
        };
        let i0 = first.iteration;
        let after: Vec<&IterationLine> = self
            .iterations
            .iter()
            .filter(|l| l.iteration >= i0.saturating_add(warmup_iters))
            .collect();
        let warmup = self.iterations.len() - after.len();
        let Some(last) = after.last() else {
            return Err(TrainLogError::AllWarmup {
                lines: self.iterations.len(),
                first: i0,
                last: i0.saturating_add(warmup_iters).saturating_sub(1),
                warmup_iters,
            });
        };
        let gbs = last.global_batch;
        let kept: Vec<&IterationLine> = after
            .iter()
            .copied()
            .filter(|l| l.global_batch == gbs)
            .collect();
        let rampup = after.len() - kept.len();
        let times: Vec<f64> = kept.iter().map(|l| l.step_secs).collect();
        let step = crate::calibration::median(&times).expect("at least the last line");
        let tflops: Vec<f64> = kept.iter().filter_map(|l| l.tflops_per_gpu).collect();
        Ok(StepSummary {
            step_secs: step,
            min_secs: times.iter().copied().fold(f64::INFINITY, f64::min),
            max_secs: times.iter().copied().fold(0.0, f64::max),
            kept: kept.len(),
            warmup,
            rampup,
            global_batch: gbs,
            tflops_per_gpu: if tflops.len() == kept.len() {
                crate::calibration::median(&tflops)
            } else {
                None
            },
            first_iteration: kept[0].iteration,
            last_iteration: last.iteration,
        })
    }

    /// The largest peak over the ranks' latest memory reports: (max allocated,
    /// max reserved) in bytes.
    pub fn peak_memory_bytes(&self) -> (Option<f64>, Option<f64>) {
        let max = |f: fn(&MemoryReport) -> Option<f64>| {
            self.memory
                .values()
                .filter_map(f)
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
        };
        (
            max(|r| r.max_allocated_bytes),
            max(|r| r.max_reserved_bytes),
        )
    }
}

/// Why a log gives no step time ([`LogReader::finish`], [`TrainingLog::summary`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrainLogError {
    #[error("the log holds more than {MAX_ITERATION_LINES} iteration lines; cut it to the part to calibrate from")]
    TooManyLines,
    #[error("the log mixes Megatron-LM iteration lines ({megatron}) and NeMo 2 ones ({nemo}): give one run's log")]
    MixedFormats { megatron: usize, nemo: usize },
    /// `unreadable`: lines that start an iteration record but are cut off.
    #[error("no training iteration line in {lines} line(s){}: expected Megatron-LM / Megatron-Bridge lines (' iteration N/M | ... | elapsed time per iteration (ms): X | ...') or NeMo 2 lines ('Training epoch E, iteration N/M | ... | train_step_timing in s: X'); is this a training log?", cut_off(*.unreadable, *.bad_times))]
    NoTrainingLine {
        lines: u64,
        unreadable: u64,
        bad_times: u64,
    },
    /// Iteration lines were found, but none with a sane step time.
    #[error("no usable step time in {lines} line(s): {bad_times} iteration line(s) read, but {BAD_TIME}{}; a Megatron log gives milliseconds ('elapsed time per iteration (ms): X'), a NeMo 2 log seconds", if *.unreadable > 0 { format!(", and {} more hold no readable time", .unreadable) } else { String::new() })]
    NoSaneTime {
        lines: u64,
        unreadable: u64,
        bad_times: u64,
    },
    /// A setting (its argument name) stated with several values.
    #[error("the log states {} {}: it holds more than one run; give one run's log", .setting.replace('_', " "), joined(.values))]
    SeveralRuns { setting: String, values: Vec<u64> },
    #[error("the log holds no iteration line")]
    NoIteration,
    /// Iterations `first` to `last` are the warm-up.
    #[error("all {lines} iteration line(s) fall in the warm-up (iterations {first} to {last}, the first {warmup_iters} logged): run longer, or lower --warmup-iters")]
    AllWarmup {
        lines: usize,
        first: u64,
        last: u64,
        warmup_iters: u64,
    },
}

fn cut_off(unreadable: u64, bad_times: u64) -> String {
    let mut parts = Vec::new();
    if unreadable > 0 {
        parts.push(format!(
            "{unreadable} line(s) start one but hold no readable time (cut off, or other output written into it)"
        ));
    }
    if bad_times > 0 {
        parts.push(format!("{bad_times} line(s) start one but {}", BAD_TIME));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join("; "))
    }
}

/// What a step time read as a number must be, in the words every message uses.
pub const BAD_TIME: &str =
    "their time is no step time between 1 us and 1e6 s (0, negative, NaN, infinite or out of that range)";

fn joined(values: &[u64]) -> String {
    let shown: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    shown.join(" and ")
}
