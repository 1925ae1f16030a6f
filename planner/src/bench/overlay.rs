//! Benchmark files to a calibration overlay: the measured points booked as a
//! measured run's, and the GEMM curve, HBM copy and NVLink fit checked against the
//! profile.

use super::*;

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
    /// The device's model names none of the profile GPU's (both escaped).
    #[error("the benchmarks ran on '{device}', but profile '{profile}' is for '{profile_gpu}': calibrate the profile of the GPU you measured (--hardware), or benchmark the profile's GPU")]
    OtherGpu {
        device: String,
        profile: String,
        profile_gpu: String,
    },
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

/// The files of one device, one per benchmark, none from the fake libraries.
fn check_files(files: &[BenchFile], first: &BenchFile) -> Result<(), BenchError> {
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
    Ok(())
}

/// The model names in a GPU's name: words of one or two capitals, then two to
/// four digits, then at most one capital (`H100`, `GB200`, `MI300X`, `A100`), as
/// CUDA's device names ("NVIDIA H100 80GB HBM3") and the profiles' ("H100 SXM5
/// 80GB") both carry them. Sizes ("80GB") and memory kinds ("HBM3") are not
/// model names.
pub(super) fn gpu_models(name: &str) -> Vec<String> {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            let letters = w.chars().take_while(|c| c.is_ascii_uppercase()).count();
            let digits = w[letters..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .count();
            let rest = &w[letters + digits..];
            (1..=2).contains(&letters)
                && (2..=4).contains(&digits)
                && rest.len() <= 1
                && rest.chars().all(|c| c.is_ascii_uppercase())
        })
        .map(str::to_string)
        .collect()
}

/// The HBM efficiency of the largest copy of an `hbm` file, when it has a copy.
fn hbm_level(
    f: &BenchFile,
    profile: &HardwareProfile,
    gpu: &str,
    fit: &mut BenchFit,
) -> Result<Option<f64>, BenchError> {
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
                gpu: gpu.to_string(),
            });
        }
        fit.hbm_copy = Some(c.clone());
        return Ok(Some(frac));
    } else {
        fit.not_used
            .push("the hbm file has no copy (only memsets)".into());
    }
    Ok(None)
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
    check_files(files, first)?;
    let (on, of) = (
        gpu_models(&first.device.name),
        gpu_models(&profile.gpu.name),
    );
    if !on.is_empty() && !of.is_empty() && on.iter().all(|m| !of.contains(m)) {
        return Err(BenchError::OtherGpu {
            device: first.device.name.escape_debug().to_string(),
            profile: profile.name.escape_debug().to_string(),
            profile_gpu: profile.gpu.name.escape_debug().to_string(),
        });
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
    let hbm = match find("hbm") {
        Some(f) => hbm_level(f, profile, &gpu, &mut fit)?,
        None => None,
    };
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
