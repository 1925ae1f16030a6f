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
use crate::error::InputError;
use crate::hardware::{
    ranges, show, CollectivePoint, GemmCurve, GemmDtype, HardwareProfile, MAX_GPUS,
};

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
        }
        for p in &self.memory {
            let what = format!("memory {} of {} bytes", p.op.escape_debug(), p.bytes);
            if !matches!(p.op.as_str(), "copy" | "memset") {
                return Err(bad(&what, "op must be copy or memset".into()));
            }
            check_bytes(&what, p.bytes)?;
            check_timed(&what, p.calls, p.median_secs, p.gbytes_per_s)?;
        }
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
            let busbw_ok = if c.ranks == 1 {
                c.busbw_gbytes_per_s == 0.0
            } else {
                c.busbw_gbytes_per_s.is_finite() && c.busbw_gbytes_per_s > 0.0
            };
            if !busbw_ok {
                return Err(bad(
                    &what,
                    format!(
                        "busbw_gbytes_per_s {} must be positive and finite, and 0 on one rank",
                        show(c.busbw_gbytes_per_s)
                    ),
                ));
            }
        }
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

/// A GEMM the benchmark timed, as the measured-run format books it: per product.
fn gemm_point(g: &BenchGemm) -> GemmPoint {
    GemmPoint {
        class: g.class.clone(),
        m: g.m,
        n: g.n,
        k: g.k,
        dtype: "bf16".into(),
        calls: g.calls * g.batch,
        median_secs: g.median_secs / g.batch as f64,
        tflops: g.tflops,
    }
}

fn comm_point(c: &BenchCollective) -> CommPoint {
    CommPoint {
        kind: "bench".into(),
        op: c.op.clone(),
        ranks: c.ranks,
        bytes: c.bytes as f64,
        tier: c.tier.clone(),
        calls: c.calls,
        median_secs: c.median_secs,
        busbw_gbytes_per_s: c.busbw_gbytes_per_s,
    }
}

/// What [`overlay`] took from each file, for the CLI to say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BenchFit {
    /// The plan's GEMM shapes (class not `sweep`): measured TFLOP/s and what the
    /// measured curve interpolates for the shape (the level times its factor).
    pub plan_shapes: Vec<(BenchGemm, f64)>,
    /// The copy the HBM efficiency was read from.
    pub hbm_copy: Option<MemoryPoint>,
    /// Collectives over two or more GPUs in the fit.
    pub collectives_fitted: usize,
    /// One-GPU collectives and peer copies, which no profile constant takes.
    pub not_used: Vec<String>,
}

/// Why benchmark files give no overlay ([`overlay`]). `gpu` asks whether the
/// profile is the benchmarked GPU's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BenchError {
    #[error("no benchmark file given")]
    NoFile,
    /// `device` is escaped as `{:?}` escapes, as in the variants below.
    #[error("the {benchmark} benchmark ran on Sextant's fake CUDA libraries ({device}): they check arguments and measure nothing; benchmark a GPU")]
    FakeLibraries { benchmark: String, device: String },
    #[error("the benchmark files ran on different GPUs ('{0}' and '{1}'): calibrate one kind of GPU at a time")]
    DifferentGpus(String, String),
    #[error("two {0} benchmark files given: give one file per benchmark")]
    TwoFiles(String),
    #[error("the GEMM curve's best point, {tflops:.1} TFLOP/s, is above the BF16 peak of profile '{profile}' ({peak} TFLOP/s): {gpu}")]
    AbovePeak {
        tflops: f64,
        profile: String,
        peak: f64,
        gpu: String,
    },
    #[error("the {bytes}-byte copy moved {gbytes_per_s:.0} GB/s, above the HBM bandwidth of profile '{profile}' ({peak} GB/s): {gpu}")]
    AboveHbm {
        bytes: u64,
        gbytes_per_s: f64,
        profile: String,
        peak: f64,
        gpu: String,
    },
    #[error("the benchmarks give {name} = {error}: no overlay written; {gpu}")]
    OutOfRange {
        name: String,
        error: crate::hardware::OutOfRange,
        gpu: String,
    },
    #[error("{0}")]
    Overlay(InputError),
}

/// The calibration overlay for `profile` from benchmark files of one device, at
/// most one per benchmark. Refuses files from the fake libraries, from different
/// devices, and measurements the profile's ranges rule out (a GEMM above the
/// profile's peak: the wrong profile for the GPU), each in one line.
pub fn overlay(
    files: &[BenchFile],
    profile: &HardwareProfile,
) -> Result<(Overlay, BenchFit), BenchError> {
    let Some(first) = files.first() else {
        return Err(BenchError::NoFile);
    };
    for (i, f) in files.iter().enumerate() {
        if on_fake_libraries(&f.device.name) {
            return Err(BenchError::FakeLibraries {
                benchmark: f.benchmark.clone(),
                device: f.device.name.escape_debug().to_string(),
            });
        }
        if f.device.name != first.device.name {
            return Err(BenchError::DifferentGpus(
                first.device.name.escape_debug().to_string(),
                f.device.name.escape_debug().to_string(),
            ));
        }
        if files[..i].iter().any(|g| g.benchmark == f.benchmark) {
            return Err(BenchError::TwoFiles(f.benchmark.clone()));
        }
    }
    let gpu = format!(
        "is '{}' the profile of this GPU ({})?",
        profile.name,
        first.device.name.escape_debug()
    );
    let mut fit = BenchFit::default();
    let find = |b: &str| files.iter().find(|f| f.benchmark == b);
    let mut gemm_bf16 = None;
    let mut gemm_curve = None;
    let mut gemm_points = Vec::new();
    if let Some(f) = find("gemm") {
        gemm_points = f.gemms.iter().map(gemm_point).collect();
        if let Some(c) = f.gemm_curves.first() {
            let peak = profile.gpu.peak_tflops.bf16;
            let level = c.best_tflops() / peak;
            if level > ranges::EFFICIENCY.hi {
                return Err(BenchError::AbovePeak {
                    tflops: c.best_tflops(),
                    profile: profile.name.clone(),
                    peak,
                    gpu,
                });
            }
            gemm_bf16 = Some(level);
            fit.plan_shapes = f
                .gemms
                .iter()
                .filter(|g| g.class != "sweep")
                .map(|g| {
                    (
                        g.clone(),
                        c.best_tflops() * c.shape_factor(g.m as f64, g.n as f64, g.k as f64),
                    )
                })
                .collect();
            gemm_curve = Some(c.clone());
        } else {
            fit.not_used
                .push("the gemm file has no sweep curve (only a plan's shapes)".into());
        }
    }
    let mut hbm = None;
    if let Some(f) = find("hbm") {
        // The largest copy: the steady state of large element-wise kernels, past
        // any cache.
        if let Some(c) = f
            .memory
            .iter()
            .filter(|p| p.op == "copy")
            .max_by_key(|p| p.bytes)
        {
            let peak = profile.gpu.hbm_tbytes_per_s * 1e3;
            let frac = c.gbytes_per_s / peak;
            if frac > ranges::EFFICIENCY.hi {
                return Err(BenchError::AboveHbm {
                    bytes: c.bytes,
                    gbytes_per_s: c.gbytes_per_s,
                    profile: profile.name.clone(),
                    peak,
                    gpu,
                });
            }
            hbm = Some(frac);
            fit.hbm_copy = Some(c.clone());
        } else {
            fit.not_used
                .push("the hbm file has no copy (only memsets)".into());
        }
    }
    let mut colls = Vec::new();
    if let Some(f) = find("nccl") {
        colls = f
            .collectives
            .iter()
            .filter(|c| c.ranks > 1)
            .map(comm_point)
            .collect();
        let single = f.collectives.iter().filter(|c| c.ranks == 1).count();
        if single > 0 {
            fit.not_used.push(format!(
                "{single} one-GPU collective point(s): nothing crosses a link, so no bus bandwidth"
            ));
        }
    }
    let refs: Vec<&CommPoint> = colls.iter().collect();
    let nvl = fit_collectives(&refs, profile.node.nvlink_gbytes_per_s * 1e9);
    fit.collectives_fitted = colls.len();
    if let Some(f) = find("p2p") {
        fit.not_used.push(format!(
            "{} peer-copy point(s): no profile constant takes them",
            f.p2p.len()
        ));
    }
    let o = Overlay {
        schema_version: OVERLAY_SCHEMA_VERSION,
        profile: profile.name.clone(),
        backend: "cuda".into(),
        device: first.device.name.clone(),
        runs: Vec::new(),
        gemm_bf16,
        attention: None,
        nvlink_busbw: nvl.map(|c| c.0),
        network_busbw: None,
        gemm_overhead_us: None,
        nvlink_latency_us: nvl.map(|c| c.1),
        network_latency_us: None,
        hbm,
        gemm_curve,
        benchmarks: files.iter().map(BenchFile::summary).collect(),
        gemm_points,
        collective_points: colls,
        gemm_scale: None,
        attention_scale: None,
        comm_scale: None,
        log_points: Vec::new(),
    };
    let limits = overlay_ranges("cuda").expect("the cuda backend has ranges");
    for (name, v) in o.values() {
        if let Some(x) = v {
            limits
                .of(name)
                .check(x)
                .map_err(|e| BenchError::OutOfRange {
                    name: name.to_string(),
                    error: e,
                    gpu: gpu.clone(),
                })?;
        }
    }
    o.validate().map_err(BenchError::Overlay)?;
    Ok((o, fit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::builtin_profile;

    fn device(name: &str) -> BenchDevice {
        BenchDevice {
            name: name.into(),
            ordinals: vec![0],
            visible: 1,
            memory_bytes: 80 << 30,
            sms: 132,
            compute_capability: "9.0".into(),
        }
    }

    fn file(benchmark: &str) -> BenchFile {
        BenchFile {
            schema_version: BENCH_SCHEMA_VERSION,
            generator: "test".into(),
            benchmark: benchmark.into(),
            date: "2026-08-01T00:00:00Z".into(),
            device: device("NVIDIA H100 80GB HBM3"),
            versions: BenchVersions {
                cuda: "13.0".into(),
                ..BenchVersions::default()
            },
            method: "test".into(),
            warmup: 1,
            iters: 1,
            gemm_curves: vec![],
            gemms: vec![],
            memory: vec![],
            collective_points: vec![],
            collectives: vec![],
            p2p: vec![],
        }
    }

    /// A sweep at `tflops(m, n, k)` over a 2x2x2 grid, plus one plan shape.
    fn gemm_file(tflops: impl Fn(u64, u64, u64) -> f64) -> BenchFile {
        let mut f = file("gemm");
        let mut points = Vec::new();
        for m in [1024u64, 4096] {
            for n in [1024u64, 4096] {
                for k in [1024u64, 4096] {
                    let t = tflops(m, n, k);
                    points.push([m as f64, n as f64, k as f64, t]);
                    f.gemms.push(BenchGemm {
                        class: "sweep".into(),
                        m,
                        n,
                        k,
                        batch: 1,
                        calls: 10,
                        median_secs: 2.0 * (m * n * k) as f64 / (t * 1e12),
                        tflops: t,
                    });
                }
            }
        }
        f.gemm_curves =
            vec![GemmCurve::from_points(GemmDtype::Bf16, "test".into(), points).unwrap()];
        f.gemms.push(BenchGemm {
            class: "mlp".into(),
            m: 2048,
            n: 2048,
            k: 2048,
            batch: 2,
            calls: 10,
            median_secs: 2.0 * 2.0 * 2048f64.powi(3) / 500e12,
            tflops: 500.0,
        });
        f
    }

    fn collective(op: &str, ranks: u64, bytes: u64, secs: f64) -> BenchCollective {
        let n = ranks as f64;
        let factor = if op == "all_reduce" {
            2.0 * (n - 1.0) / n
        } else {
            (n - 1.0) / n
        };
        let algbw = bytes as f64 / secs / 1e9;
        BenchCollective {
            op: op.into(),
            ranks,
            bytes,
            tier: "nvlink".into(),
            calls: 20,
            median_secs: secs,
            algbw_gbytes_per_s: algbw,
            busbw_gbytes_per_s: algbw * factor,
        }
    }

    /// GEMM curve, HBM copy and 8-GPU collectives become the overlay's constants;
    /// the profile it makes has the measured curve at the measured level.
    #[test]
    fn bench_files_make_an_overlay_the_profile_takes() {
        let h100 = builtin_profile("h100-sxm").unwrap();
        let gemm = gemm_file(|m, n, k| 200.0 + 100.0 * ((m * n * k) as f64).log2() / 36.0 * 5.0);
        let best = gemm.gemm_curves[0].best_tflops();
        let mut hbm = file("hbm");
        for (bytes, gbs) in [(1u64 << 24, 3100.0), (1 << 30, 2800.0)] {
            hbm.memory.push(MemoryPoint {
                op: "copy".into(),
                bytes,
                calls: 10,
                median_secs: 2.0 * bytes as f64 / (gbs * 1e9),
                gbytes_per_s: gbs,
            });
        }
        let mut nccl = file("nccl");
        // An all-reduce at 0.8 of a 450 GB/s link plus 10 us of latency per call,
        // and one single-GPU point that must not enter the fit.
        let steps = 2.0 * crate::comm::latency_steps(8);
        for bytes in [1u64 << 20, 1 << 24, 1 << 28, 1 << 30] {
            let secs = 1.75 * bytes as f64 / (0.8 * 450e9) + steps * 10e-6;
            nccl.collectives
                .push(collective("all_reduce", 8, bytes, secs));
        }
        nccl.collectives
            .push(collective("all_reduce", 1, 1 << 20, 1e-5));
        let mut p2p = file("p2p");
        p2p.p2p.push(P2pPoint {
            src: 0,
            dst: 1,
            peer_access: true,
            bytes: 1 << 30,
            calls: 5,
            median_secs: 0.003,
            gbytes_per_s: 358.0,
        });
        for f in [&gemm, &hbm, &nccl, &p2p] {
            let text = serde_json::to_string(f).unwrap();
            let back = BenchFile::from_json(&text).unwrap();
            assert_eq!(
                (&back.device, &back.versions, back.gemms.len()),
                (&f.device, &f.versions, f.gemms.len())
            );
        }
        let (o, fit) = overlay(&[gemm.clone(), hbm, nccl, p2p], &h100).unwrap();
        assert!((o.gemm_bf16.unwrap() - best / 989.0).abs() < 1e-12);
        assert!((o.hbm.unwrap() - 2800.0 / 3350.0).abs() < 1e-12);
        assert!(
            (o.nvlink_busbw.unwrap() - 0.8).abs() < 1e-6,
            "{:?}",
            o.nvlink_busbw
        );
        assert!((o.nvlink_latency_us.unwrap() - 10.0).abs() < 1e-3);
        assert_eq!(fit.collectives_fitted, 4);
        assert_eq!(fit.plan_shapes.len(), 1);
        assert_eq!(fit.not_used.len(), 2, "{:?}", fit.not_used);
        assert_eq!(o.benchmarks.len(), 4);
        assert!(o.benchmarks[0].starts_with("gemm on NVIDIA H100 80GB HBM3 at 2026-08-01"));
        // A batched plan GEMM is booked per product, as runs book them.
        let mlp = o.gemm_points.iter().find(|g| g.class == "mlp").unwrap();
        assert_eq!(mlp.calls, 20);
        // Through the file format and onto the profile.
        let o = Overlay::from_json(&serde_json::to_string(&o).unwrap()).unwrap();
        let p = crate::calibration::apply(&h100, &o).unwrap();
        assert_eq!(p.gemm_curves, gemm.gemm_curves);
        assert_eq!(p.efficiency.gemm_bf16, o.gemm_bf16.unwrap());
        assert_eq!(p.efficiency.hbm, o.hbm.unwrap());
        assert!(p.sources["efficiency.hbm"].contains("hbm on NVIDIA H100"));
        // The best grid point's shape factor is 1: the level is the curve's best.
        let f = p.gemm_shape_factor(false, 4096.0, 4096.0, 4096.0).unwrap();
        assert!((f - 1.0).abs() < 1e-12);
        p.validate().unwrap();
    }

    /// What the overlay refuses, each in one line.
    #[test]
    fn bench_overlay_refusals() {
        let h100 = builtin_profile("h100-sxm").unwrap();
        let one = |files: &[BenchFile]| {
            let e = overlay(files, &h100).unwrap_err().to_string();
            assert!(!e.contains('\n'), "{e}");
            e
        };
        let mut fake = gemm_file(|_, _, _| 100.0);
        fake.device.name = "sextant fake GPU (tests only)".into();
        assert!(one(&[fake]).contains("fake CUDA libraries"));
        let mut other = file("hbm");
        other.device.name = "NVIDIA H200".into();
        other.memory.push(MemoryPoint {
            op: "copy".into(),
            bytes: 1 << 30,
            calls: 1,
            median_secs: 1e-3,
            gbytes_per_s: 2000.0,
        });
        assert!(one(&[gemm_file(|_, _, _| 100.0), other]).contains("different GPUs"));
        let g = gemm_file(|_, _, _| 100.0);
        assert!(one(&[g.clone(), g]).contains("two gemm benchmark files"));
        // Above the profile's peak: the wrong profile.
        let e = one(&[gemm_file(|_, _, _| 1500.0)]);
        assert!(
            e.contains("above the BF16 peak of profile 'h100-sxm' (989 TFLOP/s)"),
            "{e}"
        );
        let a100 = builtin_profile("a100-80g").unwrap();
        let e = overlay(&[gemm_file(|_, _, _| 700.0)], &a100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is 'a100-80g' the profile of this GPU"), "{e}");
    }

    /// A file that breaks the format is refused with the point named.
    #[test]
    fn bench_file_checks() {
        let ok = gemm_file(|_, _, _| 100.0);
        let check = |edit: &dyn Fn(&mut BenchFile), want: &str| {
            let mut f = ok.clone();
            edit(&mut f);
            let e = BenchFile::from_json(&serde_json::to_string(&f).unwrap())
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "'{want}' missing from: {e}");
        };
        check(
            &|f| f.benchmark = "tpu".into(),
            "is not one of gemm, hbm, nccl, p2p",
        );
        check(
            &|f| f.gemms[0].median_secs = 4e3,
            "median_secs 4000 must be 1e-9 to 3600 s",
        );
        check(&|f| f.gemms[0].median_secs = 0.0, "median_secs 0 must be");
        check(&|f| f.gemms[0].m = 0, "m, n, k must be 1 to 1e7");
        check(&|f| f.gemms[0].tflops = -1.0, "rate -1 must be positive");
        check(&|f| f.gemms.clear(), "holds no measured point");
        check(&|f| f.iters = 0, "iters");
        check(
            &|f| {
                f.memory.push(MemoryPoint {
                    op: "copy".into(),
                    bytes: 1,
                    calls: 1,
                    median_secs: 1e-6,
                    gbytes_per_s: 1.0,
                })
            },
            "a gemm benchmark has no memory",
        );
        let mut nccl = file("nccl");
        nccl.collectives
            .push(collective("all_reduce", 1, 1024, 1e-5));
        BenchFile::from_json(&serde_json::to_string(&nccl).unwrap()).unwrap();
        nccl.collectives[0].busbw_gbytes_per_s = 5.0;
        let e = BenchFile::from_json(&serde_json::to_string(&nccl).unwrap()).unwrap_err();
        assert!(e.to_string().contains("0 on one rank"), "{e}");
        let text = serde_json::to_string(&ok)
            .unwrap()
            .replace("\"schema_version\":1", "\"schema_version\":2");
        assert!(BenchFile::from_json(&text)
            .unwrap_err()
            .to_string()
            .contains("schema_version 2"));
    }
}
