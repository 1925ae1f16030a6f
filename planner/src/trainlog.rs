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
    /// Lines that start an iteration record but hold no complete, sane step time
    /// (cut off, or another process's output written into the number).
    pub unreadable_lines: u64,
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

/// Reads a log line by line.
#[derive(Debug, Default)]
pub struct LogReader {
    megatron: Vec<IterationLine>,
    nemo: Vec<IterationLine>,
    memory: BTreeMap<u64, MemoryReport>,
    stated: BTreeMap<&'static str, Vec<u64>>,
    unreadable: u64,
    lines: u64,
    too_many: bool,
}

/// Where a record starts on a line.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Record {
    /// `iteration N/M |`: the fields start at the offset.
    Iteration { iteration: u64, fields: usize },
    /// `[Rank R] (after N iterations) memory (MB|GB)`.
    Memory {
        rank: u64,
        after: u64,
        unit_bytes: f64,
        fields: usize,
    },
}

impl LogReader {
    pub fn new() -> LogReader {
        LogReader::default()
    }

    /// One line, without its newline. `complete`: the line ended with a newline
    /// (false for the last line of a file that was cut off while being written).
    pub fn line(&mut self, line: &str, complete: bool) {
        self.lines += 1;
        if complete {
            self.stated_line(line);
        }
        let mut starts: Vec<(usize, Record)> = iteration_starts(line);
        starts.extend(memory_starts(line));
        starts.sort_by_key(|s| s.0);
        for (i, (_, rec)) in starts.iter().enumerate() {
            let end = starts.get(i + 1).map_or(line.len(), |s| s.0);
            // A record that runs to the end of the line may read its last,
            // unterminated field only when the line is complete (NeMo 2's format).
            let last_ok = complete && end == line.len();
            match *rec {
                Record::Iteration { iteration, fields } => {
                    self.iteration_record(iteration, &line[fields..end.max(fields)], last_ok)
                }
                Record::Memory {
                    rank,
                    after,
                    unit_bytes,
                    fields,
                } => self.memory_record(rank, after, unit_bytes, &line[fields..end.max(fields)]),
            }
        }
    }

    fn iteration_record(&mut self, iteration: u64, text: &str, last_ok: bool) {
        // Megatron's fields all end with `|`; NeMo 2's last one does not.
        let fields = fields_from(text, false);
        let nemo_fields = fields_from(text, last_ok);
        let secs = |v: &str, scale: f64| {
            v.parse::<f64>()
                .ok()
                .map(|x| x * scale)
                .filter(|x| (STEP_SECS.0..=STEP_SECS.1).contains(x))
        };
        let count = |v: Option<&str>| {
            v.and_then(|v| v.parse::<f64>().ok())
                .filter(|x| x.is_finite() && *x >= 1.0 && x.fract() == 0.0 && *x < 1e15)
                .map(|x| x as u64)
        };
        let (list, line) = if text.contains("elapsed time per iteration (ms)") {
            let Some(step) =
                get(&fields, "elapsed time per iteration (ms)").and_then(|v| secs(v, 1e-3))
            else {
                self.unreadable += 1;
                return;
            };
            let tflops = get(&fields, "throughput per GPU (TFLOP/s/GPU)")
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|x| x.is_finite() && *x > 0.0);
            (
                &mut self.megatron,
                IterationLine {
                    iteration,
                    step_secs: step,
                    global_batch: count(get(&fields, "global batch size")),
                    tflops_per_gpu: tflops,
                },
            )
        } else if text.contains("train_step_timing in s") {
            let Some(step) = get(&nemo_fields, "train_step_timing in s").and_then(|v| secs(v, 1.0))
            else {
                self.unreadable += 1;
                return;
            };
            (
                &mut self.nemo,
                IterationLine {
                    iteration,
                    step_secs: step,
                    global_batch: count(get(&nemo_fields, "global_batch_size")),
                    tflops_per_gpu: None,
                },
            )
        } else {
            // An iteration marker whose time field never came: cut off.
            self.unreadable += 1;
            return;
        };
        if list.len() >= MAX_ITERATION_LINES {
            self.too_many = true;
            return;
        }
        list.push(line);
    }

    fn memory_record(&mut self, rank: u64, after: u64, unit: f64, text: &str) {
        let fields = fields_from(text, false);
        let value = |keys: &[&str]| {
            fields
                .iter()
                .find(|(k, _)| keys.contains(k))
                .and_then(|(_, v)| v.parse::<f64>().ok())
                .filter(|x| x.is_finite() && *x >= 0.0 && *x < 1e9)
                .map(|x| x * unit)
        };
        let report = MemoryReport {
            after_iterations: after,
            max_allocated_bytes: value(&["max allocated", "mem-max-allocated-gigabytes"]),
            max_reserved_bytes: value(&["max reserved", "mem-max-reserved-gigabytes"]),
        };
        if report.max_allocated_bytes.is_none() && report.max_reserved_bytes.is_none() {
            return;
        }
        let e = self.memory.entry(rank).or_default();
        if after >= e.after_iterations {
            *e = report;
        }
    }

    /// Megatron-LM's argument dump and world-size line, Lightning's member line.
    fn stated_line(&mut self, line: &str) {
        if let Some(i) = line.find("using world size: ") {
            for part in line[i + "using ".len()..].split(", ") {
                if let Some((k, v)) = part.split_once(": ") {
                    self.state(k.trim(), v.trim());
                }
            }
            return;
        }
        if let Some(i) = line.find("Initializing distributed: GLOBAL_RANK: ") {
            if let Some((_, n)) = line[i..]
                .split_once("MEMBER: ")
                .and_then(|(_, m)| m.split_once('/'))
            {
                self.state("world_size", n.trim());
            }
            return;
        }
        // `  NAME .......... VALUE` (48 - len(NAME) dots, at least one).
        let t = line.trim_end();
        let Some((head, value)) = t.rsplit_once(' ') else {
            return;
        };
        let Some(head) = head.strip_suffix('.') else {
            return;
        };
        let head = head.trim_end_matches('.');
        let Some(name) = head.strip_suffix(' ') else {
            return;
        };
        let name = name.rsplit(char::is_whitespace).next().unwrap_or("");
        self.state(name, value);
    }

    fn state(&mut self, key: &str, value: &str) {
        let Some(name) = STATED_KEYS
            .iter()
            .find(|(keys, _)| keys.contains(&key))
            .map(|(_, n)| *n)
        else {
            return;
        };
        let Ok(v) = value.parse::<u64>() else {
            return; // "None", or cut off
        };
        let seen = self.stated.entry(name).or_default();
        if !seen.contains(&v) {
            seen.push(v);
        }
    }

    /// The log as read; `Err` (one line) when it holds no iteration line of either
    /// format, both formats, or states one setting twice with different values.
    pub fn finish(self) -> Result<TrainingLog, TrainLogError> {
        if self.too_many {
            return Err(TrainLogError::TooManyLines);
        }
        let (format, iterations) = match (self.megatron.is_empty(), self.nemo.is_empty()) {
            (false, true) => (LogFormat::Megatron, self.megatron),
            (true, false) => (LogFormat::Nemo2, self.nemo),
            (false, false) => {
                return Err(TrainLogError::MixedFormats {
                    megatron: self.megatron.len(),
                    nemo: self.nemo.len(),
                })
            }
            (true, true) => {
                return Err(TrainLogError::NoTrainingLine {
                    lines: self.lines,
                    unreadable: self.unreadable,
                });
            }
        };
        let mut stated = StatedConfig::default();
        for (name, values) in &self.stated {
            if values.len() > 1 {
                return Err(TrainLogError::SeveralRuns {
                    setting: name.to_string(),
                    values: values.clone(),
                });
            }
            if let Some(slot) = stated.slot(name) {
                *slot = Some(values[0]);
            }
        }
        Ok(TrainingLog {
            format,
            iterations,
            memory: self.memory,
            stated,
            unreadable_lines: self.unreadable,
            lines: self.lines,
        })
    }
}

/// Every spelling of a stated setting (argument dump, `using world size` line),
/// under the argument name [`StatedConfig::slot`] takes.
const STATED_KEYS: &[(&[&str], &str)] = &[
    (&["world_size", "world size"], "world_size"),
    (
        &["tensor_model_parallel_size", "tensor-model-parallel size"],
        "tensor_model_parallel_size",
    ),
    (
        &[
            "pipeline_model_parallel_size",
            "pipeline-model-parallel size",
        ],
        "pipeline_model_parallel_size",
    ),
    (
        &["context_parallel_size", "context-parallel size"],
        "context_parallel_size",
    ),
    (
        &["expert_model_parallel_size"],
        "expert_model_parallel_size",
    ),
    (
        &["data_parallel_size", "data-parallel size"],
        "data_parallel_size",
    ),
    (&["micro_batch_size"], "micro_batch_size"),
    (&["global_batch_size"], "global_batch_size"),
    (&["seq_length"], "seq_length"),
];

/// Why a log gives no step time ([`LogReader::finish`], [`TrainingLog::summary`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrainLogError {
    #[error("the log holds more than {MAX_ITERATION_LINES} iteration lines; cut it to the part to calibrate from")]
    TooManyLines,
    #[error("the log mixes Megatron-LM iteration lines ({megatron}) and NeMo 2 ones ({nemo}): give one run's log")]
    MixedFormats { megatron: usize, nemo: usize },
    /// `unreadable`: lines that start an iteration record but are cut off.
    #[error("no training iteration line in {lines} line(s){}: expected Megatron-LM / Megatron-Bridge lines (' iteration N/M | ... | elapsed time per iteration (ms): X | ...') or NeMo 2 lines ('Training epoch E, iteration N/M | ... | train_step_timing in s: X'); is this a training log?", cut_off(*.unreadable))]
    NoTrainingLine { lines: u64, unreadable: u64 },
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

fn cut_off(unreadable: u64) -> String {
    if unreadable > 0 {
        format!(" ({unreadable} line(s) start one but are cut off or garbled)")
    } else {
        String::new()
    }
}

fn joined(values: &[u64]) -> String {
    let shown: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    shown.join(" and ")
}

/// Parses a whole text (the last line counts as complete only when the text ends
/// with a newline).
pub fn parse(text: &str) -> Result<TrainingLog, TrainLogError> {
    let mut r = LogReader::new();
    let mut rest = text;
    while !rest.is_empty() {
        match rest.find('\n') {
            Some(i) => {
                r.line(rest[..i].trim_end_matches('\r'), true);
                rest = &rest[i + 1..];
            }
            None => {
                r.line(rest, false);
                rest = "";
            }
        }
    }
    r.finish()
}

/// The value of field `key`.
fn get<'a>(fields: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    fields.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// `NAME: VALUE |` fields: every segment followed by `|`, split at its last `": "`.
fn fields_from(text: &str, last_ok: bool) -> Vec<(&str, &str)> {
    let mut segs: Vec<&str> = text.split('|').collect();
    // The piece after the last `|` has no terminator: read only when allowed.
    let tail = segs.pop();
    if last_ok {
        segs.extend(tail);
    }
    segs.into_iter()
        .filter_map(|s| s.rsplit_once(": "))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect()
}

/// `iteration N/M |` markers (M any token: NeMo prints `inf` without a step limit).
fn iteration_starts(line: &str) -> Vec<(usize, Record)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = line[from..].find("iteration ") {
        let at = from + i;
        from = at + "iteration ".len();
        let rest = &line[from..];
        let t = rest.trim_start();
        let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 || digits > 19 {
            continue;
        }
        let Ok(iteration) = t[..digits].parse::<u64>() else {
            continue;
        };
        let Some(after_slash) = t[digits..].strip_prefix('/') else {
            continue;
        };
        let total = after_slash.trim_start();
        let total_len = total.len()
            - total
                .trim_start_matches(|c: char| !c.is_whitespace() && c != '|')
                .len();
        if total_len == 0 {
            continue;
        }
        let after_total = total[total_len..].trim_start();
        if !after_total.starts_with('|') {
            continue;
        }
        let fields_at = line.len() - after_total.len() + 1;
        out.push((
            at,
            Record::Iteration {
                iteration,
                fields: fields_at,
            },
        ));
        from = fields_at;
    }
    out
}

/// `[Rank R] (after N iterations) memory (MB)` / `(GB)` markers.
fn memory_starts(line: &str) -> Vec<(usize, Record)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = line[from..].find("[Rank ") {
        let at = from + i;
        from = at + "[Rank ".len();
        let rest = &line[from..];
        let Some((rank, rest)) = rest.split_once("] (after ") else {
            continue;
        };
        let Some((after, rest)) = rest.split_once(" iterations) memory (") else {
            continue;
        };
        let (Ok(rank), Ok(after)) = (rank.parse::<u64>(), after.parse::<u64>()) else {
            continue;
        };
        let unit = if rest.starts_with("MB)") {
            1024.0 * 1024.0
        } else if rest.starts_with("GB)") {
            1e9
        } else {
            continue;
        };
        let fields_at = line.len() - rest.len() + 3;
        out.push((
            at,
            Record::Memory {
                rank,
                after,
                unit_bytes: unit,
                fields: fields_at,
            },
        ));
        from = fields_at;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Megatron-LM iteration line as `training_log` formats it.
    fn megatron(iter: u64, ms: f64, gbs: u64) -> String {
        format!(
            " [2026-08-20 10:00:{:02}.123456] iteration {iter:8}/{:8} | consumed samples: {:12} | elapsed time per iteration (ms): {ms:.1} | throughput per GPU (TFLOP/s/GPU): {:.1} | learning rate: 3.000000E-04 | global batch size: {gbs:5} | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |",
            iter % 60,
            100,
            iter * gbs,
            400_000.0 / ms
        )
    }

    #[test]
    fn megatron_lines_memory_and_arguments_are_read() {
        let mut text = String::from(
            "------------------------ arguments ------------------------\n  global_batch_size ............................... 256\n  micro_batch_size ................................ 1\n  num_layers ...................................... 32\n  pipeline_model_parallel_size .................... 2\n  seq_length ...................................... 4096\n  tensor_model_parallel_size ...................... 2\n  world_size ...................................... 8\n-------------------- end of arguments ---------------------\nusing world size: 8, data-parallel size: 2, context-parallel size: 1, hierarchical context-parallel sizes: None, tensor-model-parallel size: 2, pipeline-model-parallel size: 2\n",
        );
        for i in 1..=30 {
            text += &megatron(i, if i <= 2 { 5000.0 } else { 1000.0 + i as f64 }, 256);
            text.push('\n');
            if i == 2 {
                // Two ranks' memory reports written into one line.
                text += "[Rank 0] (after 2 iterations) memory (MB) | allocated: 20000.50 | max allocated: 40000.25 | reserved: 42000.00 | max reserved: 44000.00[Rank 4] (after 2 iterations) memory (MB) | allocated: 21000.00 | max allocated: 50000.00 | reserved: 52000.00 | max reserved: 54000.00\n";
            }
        }
        let log = parse(&text).unwrap();
        assert_eq!(log.format, LogFormat::Megatron);
        assert_eq!(log.iterations.len(), 30);
        assert_eq!(log.unreadable_lines, 0);
        let s = &log.stated;
        assert_eq!(
            (
                s.world_size,
                s.tp,
                s.pp,
                s.dp,
                s.cp,
                s.mbs,
                s.global_batch,
                s.seq
            ),
            (
                Some(8),
                Some(2),
                Some(2),
                Some(2),
                Some(1),
                Some(1),
                Some(256),
                Some(4096)
            )
        );
        // Rank 0's last field is cut by rank 4's report: its max reserved is not read.
        assert_eq!(log.memory[&0].max_reserved_bytes, None);
        assert_eq!(
            log.memory[&0].max_allocated_bytes,
            Some(40000.25 * 1048576.0)
        );
        let (alloc, _) = log.peak_memory_bytes();
        assert_eq!(alloc, Some(50000.0 * 1048576.0));
        // Warm-up: iterations 1..=10 dropped, the median of 11..=30 kept.
        let sum = log.summary(10).unwrap();
        assert_eq!((sum.kept, sum.warmup, sum.rampup), (20, 10, 0));
        assert!((sum.step_secs - 1.0205).abs() < 1e-9, "{}", sum.step_secs);
        assert_eq!(sum.global_batch, Some(256));
        assert!(sum.tflops_per_gpu.unwrap() > 0.0);
        // Without the warm-up rule the two slow lines are kept (the median barely moves).
        assert_eq!(log.summary(0).unwrap().kept, 30);
        let e = log.summary(100).unwrap_err().to_string();
        assert!(
            e.contains("all 30 iteration line(s) fall in the warm-up"),
            "{e}"
        );
    }

    #[test]
    fn truncated_and_garbled_lines_are_skipped_not_misread() {
        let mut text = String::new();
        for i in 1..=20 {
            text += &megatron(i, 2000.0, 128);
            text.push('\n');
        }
        // Cut in the middle of the time: "elapsed time per iteration (ms): 20" of 2000.0.
        let full = megatron(21, 2000.0, 128);
        let cut = &full[..full.find("(ms): 2").unwrap() + "(ms): 20".len()];
        text += cut;
        text.push('\n');
        // Another process's output written into the number.
        text += &megatron(22, 2000.0, 128).replace("2000.0 |", "20[rank3]: warning 00.0 |");
        text.push('\n');
        // Cut before the time field.
        text += &full[..full.find("elapsed").unwrap()];
        text.push('\n');
        // The file ends inside the last line's time.
        let last = megatron(23, 2000.0, 128);
        text += &last[..last.find("(ms): 2").unwrap() + "(ms): 200".len()];
        let log = parse(&text).unwrap();
        assert_eq!(log.iterations.len(), 20);
        assert_eq!(log.unreadable_lines, 4);
        assert_eq!(log.summary(10).unwrap().step_secs, 2.0);
    }

    #[test]
    fn a_batch_size_rampup_is_dropped() {
        let mut text = String::new();
        for i in 1..=40 {
            text += &megatron(
                i,
                if i < 20 { 500.0 } else { 1000.0 },
                if i < 20 { 64 } else { 128 },
            );
            text.push('\n');
        }
        let s = parse(&text).unwrap().summary(10).unwrap();
        assert_eq!((s.kept, s.rampup, s.global_batch), (21, 9, Some(128)));
        assert_eq!(s.step_secs, 1.0);
    }

    #[test]
    fn bridge_memory_and_nemo2_lines_are_read() {
        // Megatron-Bridge: the same iteration line (timestamp without fraction),
        // its own step-time line and a memory report in GB.
        let mut text = String::new();
        for i in 1..=15 {
            text += &format!(" [2026-08-20 10:00:00] iteration {i:8}/{:8} | consumed samples: {:12} | elapsed time per iteration (ms): 3000.0 | throughput per GPU (TFLOP/s/GPU): 400.0 | learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 9.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\nStep Time : 3.00s GPU utilization: 400.0MODEL_TFLOP/s/GPU\n", 15, i * 64);
        }
        text += "[Rank 0] (after 2 iterations) memory (GB) | mem-allocated-gigabytes: 20.5 | mem-active-gigabytes: 20.5 | mem-inactive-gigabytes: 1.0 | mem-reserved-gigabytes: 30.0 | mem-max-allocated-gigabytes: 60.25 | mem-max-active-gigabytes: 60.25 | mem-max-inactive-gigabytes: 2.0 | mem-max-reserved-gigabytes: 70.0 | mem-alloc-retires: 0 | mem-allocated-count: 1234\n";
        let log = parse(&text).unwrap();
        assert_eq!(log.format, LogFormat::Megatron);
        assert_eq!(log.summary(10).unwrap().step_secs, 3.0);
        assert_eq!(log.peak_memory_bytes(), (Some(60.25e9), Some(70.0e9)));

        // NeMo 2: Lightning's progress printer; its last field has no `|`.
        let mut text = String::from("Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/16\nInitializing distributed: GLOBAL_RANK: 3, MEMBER: 4/16\n");
        for i in 0..20 {
            text += &format!("Training epoch 0, iteration {i}/99 | lr: 1.961e-06 | global_batch_size: 256 | global_step: {i} | reduced_train_loss: 1.315 | train_step_timing in s: {} | consumed_samples: {}\n", if i < 3 { "9.126" } else { "2.5" }, (i + 1) * 256);
        }
        text += "Validation: iteration 5/10\n";
        // A last line cut after its time: the unterminated last field is not read.
        text += "Training epoch 0, iteration 20/99 | lr: 1.961e-06 | global_batch_size: 256 | global_step: 20 | reduced_train_loss: 1.315 | train_step_timing in s: 2.5";
        let log = parse(&text).unwrap();
        assert_eq!(log.format, LogFormat::Nemo2);
        assert_eq!(log.stated.world_size, Some(16));
        assert_eq!((log.iterations.len(), log.unreadable_lines), (20, 1));
        let s = log.summary(10).unwrap();
        assert_eq!((s.step_secs, s.global_batch, s.kept), (2.5, Some(256), 10));
    }

    #[test]
    fn foreign_mixed_and_contradictory_logs_are_refused() {
        let pip = "Collecting torch\n  Downloading torch-2.9.0-cp312-cp312-manylinux_2_28_x86_64.whl (899.7 MB)\nSuccessfully installed torch-2.9.0\n";
        let e = parse(pip).unwrap_err().to_string();
        assert!(e.contains("no training iteration line in 3 line(s)"), "{e}");
        assert!(parse("")
            .unwrap_err()
            .to_string()
            .contains("no training iteration line"));
        let json = "{\"traceEvents\": [{\"name\": \"iteration 5/10 |\"}]}";
        let e = parse(json).unwrap_err().to_string();
        assert!(e.contains("1 line(s) start one but are cut off"), "{e}");
        let mixed = format!(
            "{}\nTraining epoch 0, iteration 1/9 | global_batch_size: 8 | train_step_timing in s: 1.0\n",
            megatron(1, 1000.0, 8)
        );
        assert!(parse(&mixed)
            .unwrap_err()
            .to_string()
            .contains("mixes Megatron-LM"));
        let two = format!(
            "  world_size ...... 8\n{}\n  world_size ...... 16\n",
            megatron(1, 1000.0, 8)
        );
        let e = parse(&two).unwrap_err().to_string();
        assert!(e.contains("states world size 8 and 16"), "{e}");
        // Times that are no step time are unreadable lines.
        let e = parse(&megatron(1, 0.0, 8)).unwrap_err().to_string();
        assert!(e.contains("cut off or garbled"), "{e}");
    }

    /// Lines spliced from the formats' own pieces, numbers and junk: reading them
    /// never panics, and every step it keeps is a sane time.
    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        fn piece() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("iteration ".to_string()),
                Just(" | ".to_string()),
                Just("|".to_string()),
                Just("/".to_string()),
                Just(": ".to_string()),
                Just("elapsed time per iteration (ms): ".to_string()),
                Just("train_step_timing in s: ".to_string()),
                Just("global batch size: ".to_string()),
                Just("global_batch_size: ".to_string()),
                Just("throughput per GPU (TFLOP/s/GPU): ".to_string()),
                Just("[Rank ".to_string()),
                Just("] (after ".to_string()),
                Just(" iterations) memory (".to_string()),
                Just("MB)".to_string()),
                Just("GB)".to_string()),
                Just("max allocated: ".to_string()),
                Just("  world_size ....... ".to_string()),
                Just("using world size: ".to_string()),
                Just("MEMBER: ".to_string()),
                Just("Initializing distributed: GLOBAL_RANK: ".to_string()),
                any::<u64>().prop_map(|n| n.to_string()),
                any::<f64>().prop_map(|x| x.to_string()),
                "[0-9.eE+-]{1,12}",
                "\\PC{0,6}",
            ]
        }

        proptest! {
            #[test]
            fn spliced_lines_never_panic(lines in proptest::collection::vec(
                (proptest::collection::vec(piece(), 0..24), any::<bool>()), 0..40)
            ) {
                let mut r = LogReader::new();
                for (parts, complete) in &lines {
                    r.line(&parts.concat(), *complete);
                }
                if let Ok(log) = r.finish() {
                    for l in &log.iterations {
                        prop_assert!((STEP_SECS.0..=STEP_SECS.1).contains(&l.step_secs));
                    }
                    for w in [0, 10, u64::MAX] {
                        if let Ok(s) = log.summary(w) {
                            prop_assert!(s.step_secs.is_finite() && s.kept > 0);
                        }
                    }
                    let _ = log.peak_memory_bytes();
                }
            }
        }
    }
}
