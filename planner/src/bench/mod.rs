//! Microbenchmark results as `sextant bench` writes them, and the calibration
//! overlay built from them (`sextant calibrate --bench`). Pure: the CLI runs the
//! benchmarks, reads the clock and writes the files.
//!
//! A file holds one benchmark (`gemm`, `hbm`, `nccl` or `p2p`) on one device: its
//! name, the driver and library versions, the date, how it was timed, and every
//! point measured. Where a hardware profile has a place for the measurement, the
//! file also states it in the profile's own format: the GEMM sweep as a
//! `gemm_curves` entry (`[m, n, k, tflops]` over a full grid) and the collectives'
//! bus bandwidths over two or more GPUs as `collective_points`, so either can be
//! pasted into a profile.
//!
//! The overlay takes what the cost model has a constant for: the measured BF16
//! curve in place of the profile's (with `gemm_bf16` its best point over the
//! peak), the HBM efficiency of the largest device copy, and the intra-node bus
//! bandwidth and latency fitted to the collectives over two or more GPUs. A
//! one-GPU collective moves no data between GPUs, and peer copies have no profile
//! constant; both stay in the file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::calibration::{
    fit_collectives, on_fake_libraries, overlay_ranges, CommPoint, GemmPoint, Overlay,
    OVERLAY_SCHEMA_VERSION,
};

mod overlay;
#[cfg(test)]
mod tests;

use crate::error::InputError;
use crate::hardware::{
    ranges, show, CollectivePoint, GemmCurve, GemmDtype, HardwareProfile, MAX_GPUS,
};
pub use overlay::{overlay, BenchError, BenchFit};

pub const BENCH_SCHEMA_VERSION: u32 = 1;

/// The benchmarks, as `sextant bench` names them.
pub const BENCHMARKS: [&str; 4] = ["gemm", "hbm", "nccl", "p2p"];

/// A time a benchmark may record: a nanosecond (the events' resolution is about
/// half a microsecond) to an hour per call.
const SECS: (f64, f64) = (1e-9, 3600.0);
/// The largest buffer a benchmark may record: 1 PB.
const MAX_BYTES: u64 = 1_000_000_000_000_000;
/// Timed calls per point.
const MAX_CALLS: u64 = 1_000_000_000;
/// Points per section: far more than any sweep (a 16-value GEMM grid is 4,096).
const MAX_POINTS: usize = 100_000;

/// One benchmark's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchFile {
    pub schema_version: u32,
    pub generator: String,
    /// `gemm`, `hbm`, `nccl` or `p2p`.
    pub benchmark: String,
    /// When it ran: UTC, RFC 3339.
    pub date: String,
    pub device: BenchDevice,
    pub versions: BenchVersions,
    /// How the points were timed, in words.
    pub method: String,
    /// Untimed calls before each point's timed ones.
    pub warmup: u32,
    /// Timed calls per point.
    pub iters: u32,
    /// `gemm`: the sweep as a profile's measured curve (one BF16 curve).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gemm_curves: Vec<GemmCurve>,
    /// `gemm`: every shape timed, the sweep's (class `sweep`) and a plan's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gemms: Vec<BenchGemm>,
    /// `hbm`: device copies and memsets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory: Vec<MemoryPoint>,
    /// `nccl`: the bus bandwidths over two or more GPUs, as a profile states them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collective_points: Vec<CollectivePoint>,
    /// `nccl`: every collective and size timed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collectives: Vec<BenchCollective>,
    /// `p2p`: copies from one GPU to another.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub p2p: Vec<P2pPoint>,
}

/// The GPU a benchmark ran on (the first, where it used several).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchDevice {
    /// As the driver names it, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// The CUDA ordinals used: one per NCCL rank; the source and the destination of
    /// peer copies.
    pub ordinals: Vec<u64>,
    /// Devices the process could see.
    pub visible: u64,
    pub memory_bytes: u64,
    pub sms: u64,
    /// e.g. "9.0".
    pub compute_capability: String,
}

/// What the benchmark ran on, beyond the GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchVersions {
    /// The NVIDIA kernel module's version (e.g. "580.65.06"), where the machine
    /// says it.
    #[serde(default)]
    pub driver: Option<String>,
    /// The CUDA version the driver supports (`cuDriverGetVersion`), e.g. "13.0".
    pub cuda: String,
    #[serde(default)]
    pub cublas: Option<String>,
    #[serde(default)]
    pub nccl: Option<String>,
    /// Library -> the file loaded, or "system loader" where it was found by name.
    #[serde(default)]
    pub libraries: BTreeMap<String, String>,
}

/// One GEMM shape: row-major `C[m,n] = A[m,k] · B[k,n]` in BF16 with FP32
/// accumulation, `batch` products per call (strided batched above 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchGemm {
    /// `sweep`, or the plan's operation class (attention_proj, mlp, ...).
    pub class: String,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    /// Timed calls.
    pub calls: u64,
    /// Median seconds of one call (all `batch` products).
    pub median_secs: f64,
    /// `2·m·n·k·batch / median_secs / 1e12`.
    pub tflops: f64,
}

/// One device-memory operation over `bytes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryPoint {
    /// `copy` (device to device on one GPU) or `memset`.
    pub op: String,
    pub bytes: u64,
    pub calls: u64,
    pub median_secs: f64,
    /// HBM traffic per second, GB/s: a copy reads and writes `bytes` (2 x bytes, as
    /// the cost model counts element-wise traffic), a memset writes them.
    pub gbytes_per_s: f64,
}

/// One collective and size, in nccl-tests' conventions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchCollective {
    /// `all_reduce`, `all_gather` or `reduce_scatter` (BF16; sum).
    pub op: String,
    pub ranks: u64,
    /// The all-reduce's buffer, the all-gather's output, the reduce-scatter's input.
    pub bytes: u64,
    /// `nvlink`: GPUs of one node (the profile's intra-node tier).
    pub tier: String,
    pub calls: u64,
    /// Median over calls of the slowest rank's time.
    pub median_secs: f64,
    /// `bytes / median_secs`, GB/s.
    pub algbw_gbytes_per_s: f64,
    /// The algorithm bandwidth times 2(n-1)/n (all-reduce) or (n-1)/n: 0 on one GPU,
    /// where nothing crosses a link.
    pub busbw_gbytes_per_s: f64,
}

/// A copy of `bytes` from GPU `src` to GPU `dst` (`cuMemcpyPeerAsync`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct P2pPoint {
    pub src: u64,
    pub dst: u64,
    /// Whether peer access was enabled (direct NVLink/PCIe), else staged by the driver.
    pub peer_access: bool,
    pub bytes: u64,
    pub calls: u64,
    pub median_secs: f64,
    /// `bytes / median_secs`, GB/s, one direction.
    pub gbytes_per_s: f64,
}

fn bad(what: &str, detail: String) -> InputError {
    InputError::Workload(format!("benchmark file: {what}: {detail}"))
}

/// Checks a timed point's common numbers.
fn check_timed(what: &str, calls: u64, secs: f64, rate: f64) -> Result<(), InputError> {
    if !(1..=MAX_CALLS).contains(&calls) {
        return Err(bad(what, format!("calls {calls} must be 1 to {MAX_CALLS}")));
    }
    if !(secs.is_finite() && (SECS.0..=SECS.1).contains(&secs)) {
        return Err(bad(
            what,
            format!(
                "median_secs {} must be {} to {} s",
                show(secs),
                show(SECS.0),
                show(SECS.1)
            ),
        ));
    }
    if !(rate.is_finite() && rate > 0.0) {
        return Err(bad(
            what,
            format!("rate {} must be positive and finite", show(rate)),
        ));
    }
    Ok(())
}

/// A point's rate against the one its own size and median time give, as
/// `sextant bench` computes it (`unit`: the rate's name; `work` over `secs` in
/// that unit): a file edited to claim another bandwidth than it timed is refused.
/// 0.1% allows for the printed digits.
fn check_rate(what: &str, unit: &str, rate: f64, work: f64, secs: f64) -> Result<(), InputError> {
    let expected = work / secs;
    if (rate / expected - 1.0).abs() > 1e-3 {
        return Err(bad(
            what,
            format!(
                "{unit} {} is not what its size and median_secs give ({}): the file's numbers disagree",
                show(rate),
                show(expected)
            ),
        ));
    }
    Ok(())
}

/// nccl-tests' bus-bandwidth factor: 2(n-1)/n of the algorithm bandwidth for an
/// all-reduce over `ranks`, (n-1)/n for the others.
pub fn busbw_factor(op: &str, ranks: u64) -> f64 {
    let n = ranks as f64;
    let phases = if op == "all_reduce" { 2.0 } else { 1.0 };
    phases * (n - 1.0) / n
}

/// The `[m, n, k, tflops]` points of a GEMM file's sweep (class `sweep`), which
/// its curve is built from.
pub fn sweep_points(gemms: &[BenchGemm]) -> Vec<[f64; 4]> {
    gemms
        .iter()
        .filter(|g| g.class == "sweep")
        .map(|g| [g.m as f64, g.n as f64, g.k as f64, g.tflops])
        .collect()
}

fn check_bytes(what: &str, bytes: u64) -> Result<(), InputError> {
    if (1..=MAX_BYTES).contains(&bytes) {
        Ok(())
    } else {
        Err(bad(what, format!("bytes {bytes} must be 1 to 1e15")))
    }
}

impl BenchFile {
    /// Parses and checks a benchmark file; errors name the point.
    pub fn from_json(text: &str) -> Result<BenchFile, InputError> {
        let f: BenchFile = crate::json::from_str(text, "benchmark file")?;
        if f.schema_version != BENCH_SCHEMA_VERSION {
            return Err(InputError::SchemaVersion {
                what: "benchmark".into(),
                found: f.schema_version,
                supported: BENCH_SCHEMA_VERSION,
            });
        }
        f.validate()?;
        Ok(f)
    }

    /// Every number in its range, and each section where its benchmark puts it.
    pub fn validate(&self) -> Result<(), InputError> {
        if !BENCHMARKS.contains(&self.benchmark.as_str()) {
            return Err(bad(
                "benchmark",
                format!(
                    "'{}' is not one of {}",
                    self.benchmark.escape_debug(),
                    BENCHMARKS.join(", ")
                ),
            ));
        }
        if self.device.name.trim().is_empty() || self.date.trim().is_empty() {
            return Err(bad("device and date", "both must be given".into()));
        }
        if self.device.ordinals.is_empty() || self.device.ordinals.len() > 1024 {
            return Err(bad("device.ordinals", "give 1 to 1024 ordinals".into()));
        }
        if self.iters == 0 {
            return Err(bad("iters", "at least one timed call per point".into()));
        }
        self.check_sections()?;
        for g in &self.gemms {
            let what = format!(
                "GEMM {} {}x{}x{} (batch {})",
                g.class.escape_debug(),
                g.m,
                g.n,
                g.k,
                g.batch
            );
            if ![g.m, g.n, g.k].iter().all(|d| (1..=10_000_000).contains(d))
                || !(1..=1_000_000).contains(&g.batch)
            {
                return Err(bad(
                    &what,
                    "m, n, k must be 1 to 1e7 and batch 1 to 1e6".into(),
                ));
            }
            check_timed(&what, g.calls, g.median_secs, g.tflops)?;
            let flops = 2.0 * g.m as f64 * g.n as f64 * g.k as f64 * g.batch as f64;
            check_rate(&what, "tflops", g.tflops, flops / 1e12, g.median_secs)?;
        }
        // The curve calibration reads is the sweep's points as `sextant bench`
        // builds it: an edited curve would calibrate what no point measured.
        if let Some(c) = self.gemm_curves.first() {
            let rebuilt =
                GemmCurve::from_points(c.dtype, c.source.clone(), sweep_points(&self.gemms));
            if rebuilt.as_ref() != Ok(c) {
                return Err(bad(
                    "gemm_curves",
                    "the curve is not the one the file's sweep points (class 'sweep') make: the file's numbers disagree".into(),
                ));
            }
        }
        for p in &self.memory {
            let what = format!("memory {} of {} bytes", p.op.escape_debug(), p.bytes);
            if !matches!(p.op.as_str(), "copy" | "memset") {
                return Err(bad(&what, "op must be copy or memset".into()));
            }
            check_bytes(&what, p.bytes)?;
            check_timed(&what, p.calls, p.median_secs, p.gbytes_per_s)?;
            // A copy reads and writes its bytes; a memset writes them.
            let traffic = if p.op == "copy" { 2.0 } else { 1.0 } * p.bytes as f64;
            check_rate(
                &what,
                "gbytes_per_s",
                p.gbytes_per_s,
                traffic / 1e9,
                p.median_secs,
            )?;
        }
        self.check_collectives()?;
        for (i, c) in self.collective_points.iter().enumerate() {
            let what = format!("collective_points[{i}]");
            if !(2..=MAX_GPUS).contains(&c.ranks)
                || !ranges::COLLECTIVE_BYTES.contains(c.bytes)
                || !ranges::MEASURED_BUSBW_GBYTES_PER_S.contains(c.busbw_gbytes_per_s)
                || c.tier != "nvlink"
                || c.source.trim().is_empty()
            {
                return Err(bad(
                    &what,
                    format!(
                        "ranks must be 2 to {MAX_GPUS}, bytes 1 to 1e15, busbw_gbytes_per_s {} to {}, tier 'nvlink', and a source given",
                        ranges::MEASURED_BUSBW_GBYTES_PER_S.lo,
                        ranges::MEASURED_BUSBW_GBYTES_PER_S.hi
                    ),
                ));
            }
        }
        for p in &self.p2p {
            let what = format!("p2p {} -> {} of {} bytes", p.src, p.dst, p.bytes);
            if p.src == p.dst {
                return Err(bad(&what, "source and destination must differ".into()));
            }
            check_bytes(&what, p.bytes)?;
            check_timed(&what, p.calls, p.median_secs, p.gbytes_per_s)?;
            check_rate(
                &what,
                "gbytes_per_s",
                p.gbytes_per_s,
                p.bytes as f64 / 1e9,
                p.median_secs,
            )?;
        }
        Ok(())
    }

    /// Each section within its size and in the benchmark that writes it, the
    /// benchmark's own section not empty, and at most one BF16 GEMM curve.
    fn check_sections(&self) -> Result<(), InputError> {
        let sections = [
            ("gemm_curves", self.gemm_curves.len(), "gemm"),
            ("gemms", self.gemms.len(), "gemm"),
            ("memory", self.memory.len(), "hbm"),
            ("collective_points", self.collective_points.len(), "nccl"),
            ("collectives", self.collectives.len(), "nccl"),
            ("p2p", self.p2p.len(), "p2p"),
        ];
        for (name, len, owner) in sections {
            if len > MAX_POINTS {
                return Err(bad(name, format!("{len} points; at most {MAX_POINTS}")));
            }
            if len > 0 && owner != self.benchmark {
                return Err(bad(
                    name,
                    format!(
                        "a {} benchmark has no {name} (that section is the {owner} benchmark's)",
                        self.benchmark
                    ),
                ));
            }
        }
        let main = match self.benchmark.as_str() {
            "gemm" => self.gemms.len(),
            "hbm" => self.memory.len(),
            "nccl" => self.collectives.len(),
            _ => self.p2p.len(),
        };
        if main == 0 {
            return Err(bad(
                &self.benchmark,
                "the file holds no measured point".into(),
            ));
        }
        if self.gemm_curves.len() > 1 || self.gemm_curves.iter().any(|c| c.dtype != GemmDtype::Bf16)
        {
            return Err(bad(
                "gemm_curves",
                "one BF16 curve at most (the benchmark times BF16 GEMMs)".into(),
            ));
        }
        Ok(())
    }

    /// Each collective's operation, ranks, tier, size, times and bus bandwidth.
    fn check_collectives(&self) -> Result<(), InputError> {
        for c in &self.collectives {
            let what = format!(
                "{} of {} bytes on {} ranks",
                c.op.escape_debug(),
                c.bytes,
                c.ranks
            );
            if !matches!(
                c.op.as_str(),
                "all_reduce" | "all_gather" | "reduce_scatter"
            ) {
                return Err(bad(
                    &what,
                    "op must be all_reduce, all_gather or reduce_scatter".into(),
                ));
            }
            if !(1..=MAX_GPUS).contains(&c.ranks) || c.tier != "nvlink" {
                return Err(bad(
                    &what,
                    format!("ranks must be 1 to {MAX_GPUS} and tier 'nvlink' (one node)"),
                ));
            }
            check_bytes(&what, c.bytes)?;
            check_timed(&what, c.calls, c.median_secs, c.algbw_gbytes_per_s)?;
            check_rate(
                &what,
                "algbw_gbytes_per_s",
                c.algbw_gbytes_per_s,
                c.bytes as f64 / 1e9,
                c.median_secs,
            )?;
            // nccl-tests' bus bandwidth: 2(n-1)/n of the algorithm bandwidth for an
            // all-reduce, (n-1)/n otherwise; 0 on one rank.
            let factor = busbw_factor(&c.op, c.ranks);
            let busbw_ok = if c.ranks == 1 {
                c.busbw_gbytes_per_s == 0.0
            } else {
                c.busbw_gbytes_per_s.is_finite()
                    && c.busbw_gbytes_per_s > 0.0
                    && (c.busbw_gbytes_per_s / (c.algbw_gbytes_per_s * factor) - 1.0).abs() <= 1e-3
            };
            if !busbw_ok {
                return Err(bad(
                    &what,
                    format!(
                        "busbw_gbytes_per_s {} must be the algorithm bandwidth times nccl-tests' factor (2(n-1)/n for all_reduce, (n-1)/n otherwise), and 0 on one rank",
                        show(c.busbw_gbytes_per_s)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// One line naming the benchmark, device, date and versions (an overlay's
    /// `benchmarks` entry and the sources it writes into a profile).
    pub fn summary(&self) -> String {
        let v = &self.versions;
        let mut s = format!(
            "{} on {} at {}: driver {}, CUDA {}",
            self.benchmark,
            self.device.name,
            self.date,
            v.driver.as_deref().unwrap_or("unknown"),
            v.cuda
        );
        if let Some(b) = &v.cublas {
            s.push_str(&format!(", cuBLAS {b}"));
        }
        if let Some(n) = &v.nccl {
            s.push_str(&format!(", NCCL {n}"));
        }
        s
    }
}
