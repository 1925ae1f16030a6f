//! The line reader: where each record starts on a line, its fields, and what the
//! reader keeps of them.

use super::*;

/// Reads a log line by line.
#[derive(Debug, Default)]
pub struct LogReader {
    megatron: Vec<IterationLine>,
    nemo: Vec<IterationLine>,
    memory: BTreeMap<u64, MemoryReport>,
    stated: BTreeMap<&'static str, Vec<u64>>,
    unreadable: u64,
    bad_times: u64,
    lines: u64,
    too_many: bool,
}

/// A step-time field as read.
enum Time {
    Ok(f64),
    /// A number, but no step time: 0, negative, NaN, infinite or beyond
    /// `STEP_SECS`.
    Insane,
    /// Not a number: cut off, or another process's output written into it.
    Unread,
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

    /// The step time of an iteration record's time field (`None`: no such field),
    /// or `None` with the line counted as unreadable or as holding no step time.
    fn counted(&mut self, time: Option<Time>) -> Option<f64> {
        match time {
            Some(Time::Ok(step)) => Some(step),
            Some(Time::Insane) => {
                self.bad_times += 1;
                None
            }
            None | Some(Time::Unread) => {
                self.unreadable += 1;
                None
            }
        }
    }

    fn iteration_record(&mut self, iteration: u64, text: &str, last_ok: bool) {
        // Megatron's fields all end with `|`; NeMo 2's last one does not.
        let fields = fields_from(text, false);
        let nemo_fields = fields_from(text, last_ok);
        // A field that reads as a number but is no step time (0, negative, NaN,
        // beyond STEP_SECS) is told apart from one that does not read at all.
        let secs = |v: &str, scale: f64| -> Time {
            match v.parse::<f64>() {
                Ok(x) if (STEP_SECS.0..=STEP_SECS.1).contains(&(x * scale)) => Time::Ok(x * scale),
                Ok(_) => Time::Insane,
                Err(_) => Time::Unread,
            }
        };
        let count = |v: Option<&str>| {
            v.and_then(|v| v.parse::<f64>().ok())
                .filter(|x| x.is_finite() && *x >= 1.0 && x.fract() == 0.0 && *x < 1e15)
                .map(|x| x as u64)
        };
        let (list, line) = if text.contains("elapsed time per iteration (ms)") {
            let Some(step) = self
                .counted(get(&fields, "elapsed time per iteration (ms)").map(|v| secs(v, 1e-3)))
            else {
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
                    record: super::record_fingerprint(iteration, step, &fields),
                },
            )
        } else if text.contains("train_step_timing in s") {
            let Some(step) =
                self.counted(get(&nemo_fields, "train_step_timing in s").map(|v| secs(v, 1.0)))
            else {
                return;
            };
            (
                &mut self.nemo,
                IterationLine {
                    iteration,
                    step_secs: step,
                    global_batch: count(get(&nemo_fields, "global_batch_size")),
                    tflops_per_gpu: None,
                    record: super::record_fingerprint(iteration, step, &nemo_fields),
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
            (true, true) if self.bad_times > 0 => {
                return Err(TrainLogError::NoSaneTime {
                    lines: self.lines,
                    unreadable: self.unreadable,
                    bad_times: self.bad_times,
                });
            }
            (true, true) => {
                return Err(TrainLogError::NoTrainingLine {
                    lines: self.lines,
                    unreadable: self.unreadable,
                    bad_times: self.bad_times,
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
            bad_time_lines: self.bad_times,
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
