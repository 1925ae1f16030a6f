//! Hardware profiles: what one GPU, one node and the network can do, with the
//! efficiency constants the cost model uses and the source of each.
//!
//! Profiles are JSON (schema in ARCHITECTURE.md); the built-in ones live in
//! `hwprofiles/` and are compiled in. A user-written profile goes through the same
//! [`HardwareProfile::from_json`] and is rejected with the offending field named.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::InputError;
use crate::presets::suggestions;

pub const PROFILE_SCHEMA_VERSION: u32 = 1;

/// Dense (non-sparse) peak throughput per data type, TFLOP/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PeakTflops {
    pub bf16: f64,
    pub fp16: f64,
    /// 0 when the GPU has no FP8 tensor cores (A100).
    #[serde(default)]
    pub fp8: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub name: String,
    pub peak_tflops: PeakTflops,
    /// Usable HBM as the driver reports it, GiB.
    pub hbm_gib: f64,
    pub hbm_tbytes_per_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub gpus_per_node: u64,
    /// GPUs that share one NVLink (or Infinity Fabric) domain. Equal to
    /// `gpus_per_node` for DGX-style nodes, 72 for a GB200 NVL72 rack.
    pub nvlink_domain: u64,
    /// NVLink bandwidth per GPU, one direction, GB/s.
    pub nvlink_gbytes_per_s: f64,
    /// NVLink SHARP (in-switch reduction) available for all-reduce.
    #[serde(default)]
    pub nvls: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Network {
    /// Scale-out (InfiniBand / RoCE / EFA) bandwidth per GPU, one direction, GB/s.
    pub nic_gbytes_per_s: f64,
    /// One-hop latency across the network, microseconds.
    pub latency_us: f64,
}

/// Achieved fractions of peak. Each one is named in `sources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Efficiency {
    /// Fraction of BF16/FP16 peak that large training GEMMs sustain.
    pub gemm_bf16: f64,
    /// Fraction of FP8 peak that large FP8 training GEMMs sustain.
    #[serde(default)]
    pub gemm_fp8: f64,
    /// Fixed cost per GEMM launch (fill/drain of the tile pipeline), microseconds.
    pub gemm_overhead_us: f64,
    /// Fraction of BF16 peak that the fused attention kernel reaches, forward.
    pub attention_fwd: f64,
    /// Fraction of BF16 peak that the fused attention kernel reaches, backward.
    pub attention_bwd: f64,
    /// Fraction of HBM bandwidth reached by element-wise and optimizer kernels.
    pub hbm: f64,
    /// Ring bus bandwidth inside the NVLink domain as a fraction of `nvlink_gbytes_per_s`.
    pub nvlink_busbw: f64,
    /// NVLS all-reduce bus bandwidth as a fraction of `nvlink_gbytes_per_s` (above 1:
    /// the switch does the reduction). Used only when `node.nvls`.
    #[serde(default)]
    pub nvls_busbw: f64,
    /// Per-step latency of an NVLink collective, microseconds.
    pub nvlink_latency_us: f64,
    /// Fraction of the NIC bandwidth that collectives across nodes reach.
    pub network_busbw: f64,
    /// Fraction by which compute slows when communication overlaps it on the same
    /// GPU (SM and memory contention).
    pub overlap_slowdown: f64,
}

/// Memory that the model cannot use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryReserve {
    /// CUDA context, NCCL buffers, cuBLAS workspaces: GiB per GPU.
    pub reserve_gib: f64,
    /// Allocator fragmentation, as a fraction of the bytes the model allocates.
    pub fragmentation: f64,
    /// Fraction of HBM no plan may use: the margin against the memory model's
    /// own error, so that no recommended plan sits at the edge of HBM. A
    /// profile without it reads [`DEFAULT_HEADROOM`]; `--mem-headroom` overrides it.
    #[serde(default = "default_headroom")]
    pub headroom: f64,
}

/// The headroom of a profile that does not state one (see the built-in profiles'
/// `memory.headroom` source).
pub const DEFAULT_HEADROOM: f64 = 0.05;

fn default_headroom() -> f64 {
    DEFAULT_HEADROOM
}

/// A published bus-bandwidth measurement, kept beside the constants it supports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectivePoint {
    pub collective: String,
    pub ranks: u64,
    pub bytes: f64,
    pub busbw_gbytes_per_s: f64,
    /// "nvlink", "nvls" or "network".
    pub tier: String,
    pub source: String,
}

/// Data type of a measured GEMM curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmDtype {
    Bf16,
    Fp8,
}

/// Measured GEMM throughput over a grid of shapes for one data type: the shape
/// dependence of GEMM efficiency (tile and wave quantization, fill and drain).
///
/// In the file, `points` lists `[m, n, k, tflops]` (an `m x k` by `k x n` product)
/// and must cover every combination of the `m`, `n` and `k` values it uses. The
/// cost model reads only ratios to the curve's best point ([`GemmCurve::shape_factor`]);
/// the profile's `gemm_bf16` / `gemm_fp8` give the level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "GemmCurveFile", into = "GemmCurveFile")]
pub struct GemmCurve {
    pub dtype: GemmDtype,
    pub source: String,
    /// Grid axes, ascending.
    ms: Vec<f64>,
    ns: Vec<f64>,
    ks: Vec<f64>,
    /// TFLOP/s at `[i_m][i_n][i_k]`, flattened, and its logarithm.
    tflops: Vec<f64>,
    ln_tflops: Vec<f64>,
    best_tflops: f64,
}

#[derive(Serialize, Deserialize)]
struct GemmCurveFile {
    dtype: GemmDtype,
    source: String,
    points: Vec<[f64; 4]>,
}

impl TryFrom<GemmCurveFile> for GemmCurve {
    type Error = String;
    fn try_from(f: GemmCurveFile) -> Result<GemmCurve, String> {
        if f.source.trim().is_empty() {
            return Err("a GEMM curve needs a source".into());
        }
        for p in &f.points {
            if !p[..3].iter().all(|x| (1.0..=1e7).contains(x))
                || !ranges::CURVE_TFLOPS.contains(p[3])
            {
                return Err(format!(
                    "GEMM curve point {p:?}: m, n, k must be 1 to 1e7 and tflops {} to {}",
                    ranges::CURVE_TFLOPS.lo,
                    ranges::CURVE_TFLOPS.hi
                ));
            }
        }
        let axis = |i: usize| grid_axis(&f.points, i);
        let (ms, ns, ks) = (axis(0), axis(1), axis(2));
        let cells = ms.len() * ns.len() * ks.len();
        if ms.len() < 2 || ns.len() < 2 || ks.len() < 2 || f.points.len() != cells {
            return Err(format!(
                "GEMM curve needs one point for every (m, n, k) of a grid with at least two values per axis; {} points over {} x {} x {} values",
                f.points.len(),
                ms.len(),
                ns.len(),
                ks.len()
            ));
        }
        let mut tflops = vec![f64::NAN; cells];
        for p in &f.points {
            let i = (grid_index(&ms, p[0]) * ns.len() + grid_index(&ns, p[1])) * ks.len()
                + grid_index(&ks, p[2]);
            if !tflops[i].is_nan() {
                return Err(format!(
                    "GEMM curve lists m={} n={} k={} twice",
                    p[0], p[1], p[2]
                ));
            }
            tflops[i] = p[3];
        }
        let ln_tflops = tflops.iter().map(|t| t.ln()).collect();
        let best_tflops = f.points.iter().map(|p| p[3]).fold(0.0, f64::max);
        Ok(GemmCurve {
            dtype: f.dtype,
            source: f.source,
            ms,
            ns,
            ks,
            tflops,
            ln_tflops,
            best_tflops,
        })
    }
}

impl From<GemmCurve> for GemmCurveFile {
    fn from(c: GemmCurve) -> GemmCurveFile {
        let mut points = Vec::with_capacity(c.tflops.len());
        for (a, m) in c.ms.iter().enumerate() {
            for (b, n) in c.ns.iter().enumerate() {
                for (d, k) in c.ks.iter().enumerate() {
                    points.push([*m, *n, *k, c.tflops[(a * c.ns.len() + b) * c.ks.len() + d]]);
                }
            }
        }
        GemmCurveFile {
            dtype: c.dtype,
            source: c.source,
            points,
        }
    }
}

/// Which pass of the fused attention kernel a curve measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionPass {
    Fwd,
    Bwd,
}

/// Measured throughput of the fused attention kernel for one pass, over head
/// dimension and sequence length: short sequences leave tiles idle along the causal
/// diagonal and narrow heads do less work per load.
///
/// In the file, `points` lists `[head_dim, seq, tflops]` and must cover every
/// combination of the head dimensions and sequence lengths it uses. The cost model
/// reads only ratios to the curve's best point ([`AttentionCurve::factor`]); the
/// profile's `attention_fwd` / `attention_bwd` give the level at that point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "AttentionCurveFile", into = "AttentionCurveFile")]
pub struct AttentionCurve {
    pub pass: AttentionPass,
    /// Measured with a causal mask.
    pub causal: bool,
    pub source: String,
    /// Grid axes, ascending.
    head_dims: Vec<f64>,
    seqs: Vec<f64>,
    /// TFLOP/s at `[i_head_dim][i_seq]`, flattened.
    tflops: Vec<f64>,
    best_tflops: f64,
}

#[derive(Serialize, Deserialize)]
struct AttentionCurveFile {
    pass: AttentionPass,
    causal: bool,
    source: String,
    points: Vec<[f64; 3]>,
}

impl TryFrom<AttentionCurveFile> for AttentionCurve {
    type Error = String;
    fn try_from(f: AttentionCurveFile) -> Result<AttentionCurve, String> {
        if f.source.trim().is_empty() {
            return Err("an attention curve needs a source".into());
        }
        for p in &f.points {
            if !(1.0..=4096.0).contains(&p[0])
                || !(1.0..=1e8).contains(&p[1])
                || !ranges::CURVE_TFLOPS.contains(p[2])
            {
                return Err(format!("attention curve point {p:?}: head_dim must be 1 to 4096, seq 1 to 1e8 and tflops {} to {}", ranges::CURVE_TFLOPS.lo, ranges::CURVE_TFLOPS.hi));
            }
        }
        let (head_dims, seqs) = (grid_axis(&f.points, 0), grid_axis(&f.points, 1));
        if seqs.len() < 2 || f.points.len() != head_dims.len() * seqs.len() {
            return Err(format!(
                "attention curve needs one point for every (head_dim, seq) of a grid with at least two sequence lengths; {} points over {} x {} values",
                f.points.len(),
                head_dims.len(),
                seqs.len()
            ));
        }
        let mut tflops = vec![f64::NAN; f.points.len()];
        for p in &f.points {
            let i = grid_index(&head_dims, p[0]) * seqs.len() + grid_index(&seqs, p[1]);
            if !tflops[i].is_nan() {
                return Err(format!(
                    "attention curve lists head_dim={} seq={} twice",
                    p[0], p[1]
                ));
            }
            tflops[i] = p[2];
        }
        let best_tflops = tflops.iter().copied().fold(0.0, f64::max);
        Ok(AttentionCurve {
            pass: f.pass,
            causal: f.causal,
            source: f.source,
            head_dims,
            seqs,
            tflops,
            best_tflops,
        })
    }
}

impl From<AttentionCurve> for AttentionCurveFile {
    fn from(c: AttentionCurve) -> AttentionCurveFile {
        let mut points = Vec::with_capacity(c.tflops.len());
        for (a, d) in c.head_dims.iter().enumerate() {
            for (b, s) in c.seqs.iter().enumerate() {
                points.push([*d, *s, c.tflops[a * c.seqs.len() + b]]);
            }
        }
        AttentionCurveFile {
            pass: c.pass,
            causal: c.causal,
            source: c.source,
            points,
        }
    }
}

impl AttentionCurve {
    /// Throughput at this head dimension and sequence length over the curve's best
    /// point, in (0, 1]: log-linear interpolation inside the grid, the nearest edge
    /// outside it (the published grids start at 512 tokens and stop at 16k).
    pub fn factor(&self, head_dim: f64, seq: f64) -> f64 {
        let (a0, a1, wa, _) = locate(&self.head_dims, head_dim);
        let (b0, b1, wb, _) = locate(&self.seqs, seq);
        let ns = self.seqs.len();
        let mut ln = 0.0;
        for (a, fa) in [(a0, 1.0 - wa), (a1, wa)] {
            for (b, fb) in [(b0, 1.0 - wb), (b1, wb)] {
                let f = fa * fb;
                if f > 0.0 {
                    ln += f * self.tflops[a * ns + b].ln();
                }
            }
        }
        (ln.exp() / self.best_tflops).min(1.0)
    }
}

/// The distinct values of coordinate `i` over a measured grid's points, ascending.
fn grid_axis<const N: usize>(points: &[[f64; N]], i: usize) -> Vec<f64> {
    let mut v: Vec<f64> = points.iter().map(|p| p[i]).collect();
    v.sort_by(f64::total_cmp);
    v.dedup();
    v
}

/// The position of a point's coordinate on its axis (built by [`grid_axis`] from the
/// same points, so it is there).
fn grid_index(axis: &[f64], x: f64) -> usize {
    axis.iter()
        .position(|y| *y == x)
        .expect("axis value from the points")
}

/// Where `x` falls on an axis: the two neighbouring indices, the weight of the
/// upper one (interpolating in log space) and, below the axis, the factor by which
/// throughput falls (a GEMM narrower than the smallest measured one takes as long).
fn locate(axis: &[f64], x: f64) -> (usize, usize, f64, f64) {
    let last = axis.len() - 1;
    if x <= axis[0] {
        return (0, 0, 0.0, x / axis[0]);
    }
    if x >= axis[last] {
        return (last, last, 0.0, 1.0);
    }
    let i = axis
        .iter()
        .rposition(|v| *v <= x)
        .expect("x is above the first value");
    let w = (x.ln() - axis[i].ln()) / (axis[i + 1].ln() - axis[i].ln());
    (i, i + 1, w, 1.0)
}

impl GemmCurve {
    /// A curve from `[m, n, k, tflops]` points on a full grid (the file's form),
    /// checked as a profile's curve is.
    pub fn from_points(
        dtype: GemmDtype,
        source: String,
        points: Vec<[f64; 4]>,
    ) -> Result<GemmCurve, String> {
        GemmCurve::try_from(GemmCurveFile {
            dtype,
            source,
            points,
        })
    }

    /// The curve's highest throughput, TFLOP/s.
    pub fn best_tflops(&self) -> f64 {
        self.best_tflops
    }

    /// Throughput of an `m x k` by `k x n` GEMM over the curve's best point, in (0, 1].
    /// Log-linear interpolation inside the grid; above it the edge value (a larger
    /// GEMM is at least as efficient); below it, proportionally less.
    pub fn shape_factor(&self, m: f64, n: f64, k: f64) -> f64 {
        let (a0, a1, wa, sa) = locate(&self.ms, m);
        let (b0, b1, wb, sb) = locate(&self.ns, n);
        let (c0, c1, wc, sc) = locate(&self.ks, k);
        let (nn, nk) = (self.ns.len(), self.ks.len());
        let mut ln = 0.0;
        for (a, fa) in [(a0, 1.0 - wa), (a1, wa)] {
            for (b, fb) in [(b0, 1.0 - wb), (b1, wb)] {
                for (c, fc) in [(c0, 1.0 - wc), (c1, wc)] {
                    let f = fa * fb * fc;
                    if f > 0.0 {
                        ln += f * self.ln_tflops[(a * nn + b) * nk + c];
                    }
                }
            }
        }
        (ln.exp() * sa * sb * sc / self.best_tflops).min(1.0)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareProfile {
    pub schema_version: u32,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    pub gpu: Gpu,
    pub node: Node,
    pub network: Network,
    pub efficiency: Efficiency,
    pub memory: MemoryReserve,
    #[serde(default)]
    pub collective_points: Vec<CollectivePoint>,
    /// Measured GEMM throughput by shape, at most one per data type. Without one, GEMM
    /// efficiency does not depend on shape (beyond the memory roofline).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gemm_curves: Vec<GemmCurve>,
    /// Measured fused-attention throughput by head dimension and sequence length, at
    /// most one per (pass, causal). Without one for a pass, attention efficiency does
    /// not depend on shape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention_curves: Vec<AttentionCurve>,
    /// Field path -> where its value comes from.
    #[serde(default)]
    pub sources: BTreeMap<String, String>,
}

/// A physical range for one number of a profile or a calibration overlay, with the
/// reason for its ends. Both ends are inclusive; NaN and the infinities are outside
/// every range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range {
    pub lo: f64,
    pub hi: f64,
    /// Zero is also accepted (a feature the hardware lacks, or no cost at all).
    pub zero_ok: bool,
    pub why: &'static str,
}

impl Range {
    const fn new(lo: f64, hi: f64, why: &'static str) -> Range {
        Range {
            lo,
            hi,
            zero_ok: false,
            why,
        }
    }

    /// The same range, with 0 also accepted.
    pub const fn or_zero(self) -> Range {
        Range {
            zero_ok: true,
            ..self
        }
    }

    pub fn contains(&self, v: f64) -> bool {
        v.is_finite() && ((self.lo..=self.hi).contains(&v) || (self.zero_ok && v == 0.0))
    }

    /// `Err` says what is wrong and what would be right, in one line.
    pub fn check(&self, v: f64) -> Result<(), String> {
        if self.contains(v) {
            return Ok(());
        }
        let zero = if self.zero_ok { "0 or " } else { "" };
        Err(format!(
            "{} is out of range: expected {zero}{} to {} ({})",
            show(v),
            show(self.lo),
            show(self.hi),
            self.why
        ))
    }
}

/// A number as a person writes it: `1e-308`, not 308 zeros.
pub fn show(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// The physical range of every number in a profile. The ends are wide enough for
/// every built-in profile (A100 to GB200 and MI300X, `hwprofiles/`) and for GPUs up
/// to about ten times a B200, and tight enough that no accepted value can make an
/// estimate NaN or infinite. Published specs: `shared/data/gpu_specs.csv`.
pub mod ranges {
    use super::Range;

    /// Dense BF16/FP16 peak: 0.1x a V100-class part (125) to 10x a GB200 (2450).
    pub const PEAK_TFLOPS: Range =
        Range::new(10.0, 25_000.0, "TFLOP/s: 0.1x a V100 to 10x a GB200");
    /// Dense FP8 peak, twice the BF16 range (0 when the GPU has no FP8 tensor cores).
    pub const FP8_PEAK_TFLOPS: Range = Range::new(
        20.0,
        50_000.0,
        "TFLOP/s: 0.1x an H100's FP8 to 10x a GB200's",
    );
    /// HBM per GPU: a quarter of a 16 GB V100 to 20x an MI300X (192 GB).
    pub const HBM_GIB: Range = Range::new(4.0, 4096.0, "GiB per GPU");
    /// HBM bandwidth: 0.1x an A100 (2.0 TB/s) to over 10x a B200 (8 TB/s).
    pub const HBM_TBYTES_PER_S: Range = Range::new(0.2, 100.0, "TB/s: 0.1x an A100 to 10x a B200");
    /// Scale-up link per GPU, one direction: PCIe Gen3 (16 GB/s) to 10x NVLink 5 (900).
    pub const NVLINK_GBYTES_PER_S: Range =
        Range::new(10.0, 10_000.0, "GB/s per GPU: PCIe Gen3 to 10x NVLink 5");
    /// Scale-out NIC per GPU, one direction: 10 GbE (1.25 GB/s) to 20x a 400 Gb/s NIC.
    pub const NIC_GBYTES_PER_S: Range =
        Range::new(1.0, 1000.0, "GB/s per GPU: 10 GbE to 20x a 400 Gb/s NIC");
    /// A latency is added, never divided by: 0 is an ideal link; a millisecond per
    /// hop is no training fabric.
    pub const LATENCY_US: Range = Range::new(0.0, 1000.0, "microseconds per hop");
    /// A GEMM launch and its tile fill: added per call, never divided by.
    pub const GEMM_OVERHEAD_US: Range = Range::new(0.0, 1000.0, "microseconds per GEMM call");
    /// An achieved fraction of a peak: no kernel beats the peak, and one below 1% of
    /// it is a broken kernel or a wrong peak (built-ins: 0.3 to 0.85).
    pub const EFFICIENCY: Range = Range::new(0.01, 1.0, "a fraction of peak");
    /// Bus bandwidth over the link's one-way rate: a ring reaches at most 1; with the
    /// switch reducing (NVLS) up to 2 (built-ins: 0.76 to 1.07).
    pub const NVLINK_BUSBW: Range = Range::new(
        0.01,
        2.0,
        "a fraction of the link; above 1 only with in-switch reduction",
    );
    /// Bus bandwidth over the NIC's rate: no NIC carries more than its line rate.
    pub const NETWORK_BUSBW: Range = Range::new(0.01, 1.0, "a fraction of the NIC's rate");
    /// Compute slowdown while communication overlaps it: none to twice as slow.
    pub const OVERLAP_SLOWDOWN: Range = Range::new(0.0, 1.0, "a fraction of compute time");
    /// CUDA context, NCCL buffers and workspaces: a few GiB (built-ins: 3 to 4).
    pub const RESERVE_GIB: Range = Range::new(0.0, 64.0, "GiB per GPU");
    /// Allocator fragmentation over the allocated bytes: none to doubling.
    pub const FRAGMENTATION: Range = Range::new(0.0, 1.0, "a fraction of allocated bytes");
    /// HBM no plan may use: none to half (what `--mem-headroom` accepts).
    pub const HEADROOM: Range = Range::new(0.0, 0.5, "a fraction of HBM");
    /// A published collective's size: one byte to 1 PB.
    pub const COLLECTIVE_BYTES: Range = Range::new(1.0, 1e15, "bytes");
    /// A measured bus bandwidth: 0.1 GB/s to 20x NVLink 5, hierarchical ones included.
    pub const MEASURED_BUSBW_GBYTES_PER_S: Range = Range::new(0.1, 20_000.0, "GB/s");
    /// A measured GEMM or attention throughput in a curve: 10 GFLOP/s to the FP8
    /// peak range's top. The cost model reads ratios to the best point, so this
    /// bounds the smallest ratio (and with it every time) away from 0.
    pub const CURVE_TFLOPS: Range = Range::new(0.01, 50_000.0, "TFLOP/s");
}

/// Built-in profiles, compiled in from hwprofiles/.
const BUILTIN: &[(&str, &str)] = &[
    ("a100-80g", include_str!("../../hwprofiles/a100-80g.json")),
    ("a100-40g", include_str!("../../hwprofiles/a100-40g.json")),
    ("h100-sxm", include_str!("../../hwprofiles/h100-sxm.json")),
    ("h200-sxm", include_str!("../../hwprofiles/h200-sxm.json")),
    ("h800", include_str!("../../hwprofiles/h800.json")),
    ("b200", include_str!("../../hwprofiles/b200.json")),
    (
        "gb200-nvl72",
        include_str!("../../hwprofiles/gb200-nvl72.json"),
    ),
    ("mi300x", include_str!("../../hwprofiles/mi300x.json")),
];

/// The default cluster: DGX H100.
pub const DEFAULT_PROFILE: &str = "h100-sxm";

/// Efficiency fields that every profile must justify in `sources`.
pub const SOURCED_FIELDS: &[&str] = &[
    "gpu.peak_tflops",
    "gpu.hbm_gib",
    "gpu.hbm_tbytes_per_s",
    "node.nvlink_gbytes_per_s",
    "network.nic_gbytes_per_s",
    "efficiency.gemm_bf16",
    "efficiency.attention_fwd",
    "efficiency.hbm",
    "efficiency.nvlink_busbw",
    "efficiency.network_busbw",
    "memory.reserve_gib",
    "memory.headroom",
];

impl HardwareProfile {
    /// Parses and checks a profile. Errors name the field.
    pub fn from_json(text: &str) -> Result<HardwareProfile, InputError> {
        let p: HardwareProfile = crate::json::from_str(text, "hardware profile")?;
        if p.schema_version != PROFILE_SCHEMA_VERSION {
            return Err(InputError::SchemaVersion {
                what: "hardware profile".into(),
                found: p.schema_version,
                supported: PROFILE_SCHEMA_VERSION,
            });
        }
        p.validate()?;
        Ok(p)
    }

    /// Checks every number against its physical range ([`ranges`]) and the rules
    /// between fields; the error names the field. A profile that passes gives finite
    /// estimates (no NaN, no infinity).
    pub fn validate(&self) -> Result<(), InputError> {
        let err = |field: &str, problem: String| {
            Err(InputError::Profile {
                profile: self.name.clone(),
                field: field.into(),
                problem,
            })
        };
        use ranges::*;
        let (g, n, w, e, m) = (
            &self.gpu,
            &self.node,
            &self.network,
            &self.efficiency,
            &self.memory,
        );
        let checks: [(&str, f64, Range); 22] = [
            ("gpu.peak_tflops.bf16", g.peak_tflops.bf16, PEAK_TFLOPS),
            ("gpu.peak_tflops.fp16", g.peak_tflops.fp16, PEAK_TFLOPS),
            (
                "gpu.peak_tflops.fp8",
                g.peak_tflops.fp8,
                FP8_PEAK_TFLOPS.or_zero(),
            ),
            ("gpu.hbm_gib", g.hbm_gib, HBM_GIB),
            ("gpu.hbm_tbytes_per_s", g.hbm_tbytes_per_s, HBM_TBYTES_PER_S),
            (
                "node.nvlink_gbytes_per_s",
                n.nvlink_gbytes_per_s,
                NVLINK_GBYTES_PER_S,
            ),
            (
                "network.nic_gbytes_per_s",
                w.nic_gbytes_per_s,
                NIC_GBYTES_PER_S,
            ),
            ("network.latency_us", w.latency_us, LATENCY_US),
            ("efficiency.gemm_bf16", e.gemm_bf16, EFFICIENCY),
            ("efficiency.gemm_fp8", e.gemm_fp8, EFFICIENCY.or_zero()),
            (
                "efficiency.gemm_overhead_us",
                e.gemm_overhead_us,
                GEMM_OVERHEAD_US,
            ),
            ("efficiency.attention_fwd", e.attention_fwd, EFFICIENCY),
            ("efficiency.attention_bwd", e.attention_bwd, EFFICIENCY),
            ("efficiency.hbm", e.hbm, EFFICIENCY),
            ("efficiency.nvlink_busbw", e.nvlink_busbw, NVLINK_BUSBW),
            (
                "efficiency.nvls_busbw",
                e.nvls_busbw,
                NVLINK_BUSBW.or_zero(),
            ),
            (
                "efficiency.nvlink_latency_us",
                e.nvlink_latency_us,
                LATENCY_US,
            ),
            ("efficiency.network_busbw", e.network_busbw, NETWORK_BUSBW),
            (
                "efficiency.overlap_slowdown",
                e.overlap_slowdown,
                OVERLAP_SLOWDOWN,
            ),
            ("memory.reserve_gib", m.reserve_gib, RESERVE_GIB),
            ("memory.fragmentation", m.fragmentation, FRAGMENTATION),
            ("memory.headroom", m.headroom, HEADROOM),
        ];
        for (field, v, range) in checks {
            if let Err(problem) = range.check(v) {
                return err(field, problem);
            }
        }
        if self.memory.reserve_gib >= self.gpu.hbm_gib {
            return err(
                "memory.reserve_gib",
                format!(
                    "reserve {} GiB leaves nothing of {} GiB HBM",
                    self.memory.reserve_gib, self.gpu.hbm_gib
                ),
            );
        }
        for (i, c) in self.collective_points.iter().enumerate() {
            let field = |f: &str| format!("collective_points[{i}].{f}");
            if !(1..=MAX_GPUS).contains(&c.ranks) {
                return err(
                    &field("ranks"),
                    format!("{} must be between 1 and {MAX_GPUS}", c.ranks),
                );
            }
            for (f, v, range) in [
                ("bytes", c.bytes, COLLECTIVE_BYTES),
                (
                    "busbw_gbytes_per_s",
                    c.busbw_gbytes_per_s,
                    MEASURED_BUSBW_GBYTES_PER_S,
                ),
            ] {
                if let Err(problem) = range.check(v) {
                    return err(&field(f), problem);
                }
            }
            if !matches!(c.tier.as_str(), "nvlink" | "nvls" | "network") {
                return err(
                    &field("tier"),
                    format!(
                        "'{}' is not one of nvlink, nvls, network",
                        c.tier.escape_debug()
                    ),
                );
            }
        }
        for (i, c) in self.gemm_curves.iter().enumerate() {
            if self.gemm_curves[..i].iter().any(|d| d.dtype == c.dtype) {
                return err(
                    "gemm_curves",
                    format!("two curves for {:?}; give one per data type", c.dtype),
                );
            }
        }
        for (i, c) in self.attention_curves.iter().enumerate() {
            if self.attention_curves[..i]
                .iter()
                .any(|d| d.pass == c.pass && d.causal == c.causal)
            {
                return err(
                    "attention_curves",
                    format!(
                        "two curves for the {:?} pass with causal = {}; give one per pass and mask",
                        c.pass, c.causal
                    ),
                );
            }
        }
        if self.gpu.peak_tflops.fp8 > 0.0 && self.efficiency.gemm_fp8 <= 0.0 {
            return err(
                "efficiency.gemm_fp8",
                "the GPU has FP8 peak throughput but no FP8 GEMM efficiency".into(),
            );
        }
        if self.node.nvls && self.efficiency.nvls_busbw == 0.0 {
            return err(
                "efficiency.nvls_busbw",
                format!(
                    "0 with node.nvls true: give the NVLS all-reduce bus bandwidth as a fraction of the link ({} to {})",
                    NVLINK_BUSBW.lo, NVLINK_BUSBW.hi
                ),
            );
        }
        if self.node.gpus_per_node == 0 || self.node.gpus_per_node > 1024 {
            return err(
                "node.gpus_per_node",
                format!("{} must be between 1 and 1024", self.node.gpus_per_node),
            );
        }
        if self.node.nvlink_domain == 0
            || !self
                .node
                .nvlink_domain
                .is_multiple_of(self.node.gpus_per_node)
            || self.node.nvlink_domain > 1 << 16
        {
            return err(
                "node.nvlink_domain",
                format!(
                    "{} must be a positive multiple of gpus_per_node ({})",
                    self.node.nvlink_domain, self.node.gpus_per_node
                ),
            );
        }
        Ok(())
    }

    /// The shape factor of a GEMM ([`GemmCurve::shape_factor`]) from the curve of its
    /// data type, or the BF16 curve for FP8 when only that one was measured; `None`
    /// without a curve.
    pub fn gemm_shape_factor(&self, fp8: bool, m: f64, n: f64, k: f64) -> Option<f64> {
        let want = if fp8 { GemmDtype::Fp8 } else { GemmDtype::Bf16 };
        let curve = self
            .gemm_curves
            .iter()
            .find(|c| c.dtype == want)
            .or_else(|| self.gemm_curves.iter().find(|c| c.dtype == GemmDtype::Bf16));
        curve.map(|c| c.shape_factor(m, n, k))
    }

    /// The shape factor of a causal attention pass ([`AttentionCurve::factor`]) from
    /// the causal curve of that pass, or the unmasked one where only that was
    /// measured; `None` without a curve for the pass.
    pub fn attention_factor(&self, pass: AttentionPass, head_dim: f64, seq: f64) -> Option<f64> {
        let of_pass = |causal: bool| {
            self.attention_curves
                .iter()
                .find(|c| c.pass == pass && c.causal == causal)
        };
        of_pass(true)
            .or_else(|| of_pass(false))
            .map(|c| c.factor(head_dim, seq))
    }

    /// Peak dense throughput for GEMMs in the given precision, FLOP/s.
    pub fn peak_flops(&self, fp8: bool) -> f64 {
        if fp8 && self.gpu.peak_tflops.fp8 > 0.0 {
            self.gpu.peak_tflops.fp8 * 1e12
        } else {
            self.gpu.peak_tflops.bf16 * 1e12
        }
    }

    pub fn hbm_bytes(&self) -> f64 {
        self.gpu.hbm_gib * GIB
    }

    /// What a plan may use: HBM less the headroom (the reserve is inside it, in
    /// each plan's own memory).
    pub fn capacity_bytes(&self) -> f64 {
        self.hbm_bytes() * (1.0 - self.memory.headroom)
    }

    /// Usable bytes for the model: HBM less the reserve.
    pub fn usable_bytes(&self) -> f64 {
        (self.gpu.hbm_gib - self.memory.reserve_gib) * GIB
    }
}

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// All built-in profiles, parsed. Panics only if a compiled-in file is broken, which
/// the unit tests rule out.
pub fn builtin_profiles() -> Vec<HardwareProfile> {
    BUILTIN
        .iter()
        .map(|(name, text)| {
            HardwareProfile::from_json(text)
                .unwrap_or_else(|e| panic!("built-in profile {name} is invalid: {e}"))
        })
        .collect()
}

/// Finds a built-in profile by name or alias.
pub fn builtin_profile(name: &str) -> Result<HardwareProfile, InputError> {
    let key = name.trim().to_ascii_lowercase();
    let all = builtin_profiles();
    if let Some(p) = all
        .iter()
        .find(|p| p.name == key || p.aliases.contains(&key))
    {
        return Ok(p.clone());
    }
    let names: Vec<&str> = all
        .iter()
        .flat_map(|p| std::iter::once(p.name.as_str()).chain(p.aliases.iter().map(|a| a.as_str())))
        .collect();
    Err(InputError::UnknownProfile {
        name: name.to_string(),
        suggestions: suggestions(&key, names.into_iter()),
    })
}

/// A set of identical GPUs described by one profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub profile: HardwareProfile,
    pub gpus: u64,
    /// Let tensor parallelism span more than one NVLink domain (off by default:
    /// TP's per-layer collectives need NVLink bandwidth).
    pub allow_tp_beyond_nvlink: bool,
}

/// Largest cluster Sextant reasons about.
pub const MAX_GPUS: u64 = 1 << 24;

impl Cluster {
    /// Checks the GPU count against the node size.
    pub fn new(profile: HardwareProfile, gpus: u64) -> Result<Cluster, InputError> {
        let per_node = profile.node.gpus_per_node;
        if per_node == 0 {
            return Err(InputError::Profile {
                profile: profile.name.clone(),
                field: "node.gpus_per_node".into(),
                problem: "0 must be between 1 and 1024".into(),
            });
        }
        if gpus == 0 {
            return Err(InputError::Workload("--gpus must be at least 1".into()));
        }
        if gpus > MAX_GPUS {
            return Err(InputError::Workload(format!(
                "{gpus} GPUs is more than Sextant models (at most {MAX_GPUS})"
            )));
        }
        let ok = if gpus < per_node {
            per_node.is_multiple_of(gpus)
        } else {
            gpus.is_multiple_of(per_node)
        };
        if !ok {
            let lower = if gpus < per_node {
                (1..=gpus)
                    .rev()
                    .find(|d| per_node.is_multiple_of(*d))
                    .unwrap_or(1)
            } else {
                gpus / per_node * per_node
            };
            return Err(InputError::Workload(format!(
                "{gpus} GPUs do not fill {} nodes of {per_node} GPUs: use a multiple of {per_node} (e.g. {} or {}), or a divisor of {per_node} for a single node",
                profile.name,
                lower,
                lower.max(per_node) + if gpus < per_node { 0 } else { per_node },
            )));
        }
        Ok(Cluster {
            profile,
            gpus,
            allow_tp_beyond_nvlink: false,
        })
    }

    pub fn nodes(&self) -> u64 {
        self.gpus.div_ceil(self.profile.node.gpus_per_node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_parse_and_cite_sources() {
        let all = builtin_profiles();
        assert_eq!(all.len(), BUILTIN.len());
        for p in &all {
            for field in SOURCED_FIELDS {
                assert!(
                    p.sources.keys().any(|k| k == field),
                    "profile {} gives no source for {field}",
                    p.name
                );
            }
        }
    }

    #[test]
    fn lookup_by_alias_and_suggestion() {
        assert_eq!(builtin_profile("h100").unwrap().name, "h100-sxm");
        let e = builtin_profile("h10").unwrap_err().to_string();
        assert!(e.contains("h100"), "{e}");
    }

    #[test]
    fn wrong_profile_names_the_field() {
        let text = include_str!("../../hwprofiles/h100-sxm.json");
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        v["efficiency"]["gemm_bf16"] = serde_json::json!(1.7);
        let e = HardwareProfile::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("efficiency.gemm_bf16"), "{e}");
        v["efficiency"]["gemm_bf16"] = serde_json::json!(0.7);
        v["node"]["gpus_per_node"] = serde_json::json!(0);
        let e = HardwareProfile::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpus_per_node"), "{e}");
        v["node"].as_object_mut().unwrap().remove("gpus_per_node");
        let e = HardwareProfile::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpus_per_node"), "{e}");
    }

    fn curve(points: serde_json::Value) -> Result<GemmCurve, String> {
        serde_json::from_value(
            serde_json::json!({"dtype": "bf16", "source": "test grid", "points": points}),
        )
        .map_err(|e| e.to_string())
    }

    /// A 2x2x2 grid whose throughput is 100 * m * n * k / 1024^3 TFLOP/s.
    fn cube() -> GemmCurve {
        let mut pts = Vec::new();
        for m in [256.0, 1024.0] {
            for n in [256.0, 1024.0] {
                for k in [256.0, 1024.0] {
                    pts.push(serde_json::json!([
                        m,
                        n,
                        k,
                        100.0 * m * n * k / 1024f64.powi(3)
                    ]));
                }
            }
        }
        curve(serde_json::Value::Array(pts)).unwrap()
    }

    #[test]
    fn gemm_curve_interpolates_in_log_space_and_saturates() {
        let c = cube();
        // At the grid points: the ratio to the best point.
        assert!((c.shape_factor(1024.0, 1024.0, 1024.0) - 1.0).abs() < 1e-12);
        assert!((c.shape_factor(256.0, 1024.0, 1024.0) - 0.25).abs() < 1e-12);
        // Between them: log-linear, so a power law is reproduced exactly.
        assert!((c.shape_factor(512.0, 1024.0, 1024.0) - 0.5).abs() < 1e-12);
        assert!((c.shape_factor(512.0, 512.0, 512.0) - 0.125).abs() < 1e-12);
        // Above the grid: the edge value, never above 1.
        assert_eq!(c.shape_factor(65536.0, 1e6, 4096.0), 1.0);
        // Below the grid: the smallest GEMM's time, so throughput falls with the size.
        let s = c.shape_factor(64.0, 1024.0, 1024.0);
        assert!((s - 0.25 * 64.0 / 256.0).abs() < 1e-12, "{s}");
        // Round trip through the file form.
        let back: GemmCurve = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn gemm_curve_rejects_holes_duplicates_and_bad_values() {
        let e = curve(serde_json::json!([
            [256, 256, 256, 5.0],
            [256, 256, 512, 9.0],
            [256, 512, 256, 9.0]
        ]))
        .unwrap_err();
        assert!(e.contains("one point for every (m, n, k)"), "{e}");
        let e = curve(serde_json::json!([[256, 256, 256, -5.0]])).unwrap_err();
        assert!(e.contains("tflops 0.01 to 50000"), "{e}");
        // A point near 0 would make a shape factor 0 and a GEMM's time infinite.
        let e = curve(serde_json::json!([[256, 256, 256, 1e-300]])).unwrap_err();
        assert!(e.contains("tflops 0.01 to 50000"), "{e}");
        let e = curve(serde_json::json!([[0.5, 256, 256, 5.0]])).unwrap_err();
        assert!(e.contains("m, n, k must be 1 to 1e7"), "{e}");
        let mut pts: Vec<serde_json::Value> = Vec::new();
        for m in [256, 512] {
            for n in [256, 512] {
                for k in [256, 512] {
                    pts.push(serde_json::json!([m, n, k, 1.0]));
                }
            }
        }
        pts[7] = pts[0].clone();
        let e = curve(serde_json::Value::Array(pts)).unwrap_err();
        assert!(e.contains("m=256 n=256 k=256 twice"), "{e}");
        // Two curves of one data type in a profile.
        let text = include_str!("../../hwprofiles/h100-sxm.json");
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        let first = v["gemm_curves"][0].clone();
        v["gemm_curves"].as_array_mut().unwrap().push(first);
        let e = HardwareProfile::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("gemm_curves"), "{e}");
    }

    /// The built-in curves: published points, and what they say about shapes that
    /// training runs use.
    #[test]
    fn builtin_gemm_curves() {
        let h100 = builtin_profile("h100-sxm").unwrap();
        let s = |m: f64, n: f64, k: f64| h100.gemm_shape_factor(false, m, n, k).unwrap();
        // A GPT-3 175B TP-8 QKV GEMM runs near the best shape; a 256-row GEMM does not.
        assert!(s(8192.0, 4608.0, 12288.0) > 0.97);
        assert!(s(256.0, 4096.0, 4096.0) < 0.6);
        // More rows, columns or depth never make a GEMM less efficient per FLOP by
        // much (the table has measurement noise of a few percent).
        for (m, n, k) in [
            (1024.0, 1024.0, 1024.0),
            (2048.0, 512.0, 4096.0),
            (4096.0, 2048.0, 1024.0),
        ] {
            assert!(
                s(2.0 * m, n, k) > 0.95 * s(m, n, k)
                    && s(m, 2.0 * n, k) > 0.95 * s(m, n, k)
                    && s(m, n, 2.0 * k) > 0.95 * s(m, n, k)
            );
        }
        // FP8 GEMMs on Hopper use the BF16 shape (its FP8 entries are above the peak).
        assert_eq!(
            h100.gemm_shape_factor(true, 1024.0, 2048.0, 4096.0),
            h100.gemm_shape_factor(false, 1024.0, 2048.0, 4096.0)
        );
        let b200 = builtin_profile("b200").unwrap();
        assert_ne!(
            b200.gemm_shape_factor(true, 1024.0, 2048.0, 4096.0),
            b200.gemm_shape_factor(false, 1024.0, 2048.0, 4096.0)
        );
        assert!(builtin_profile("a100-80g")
            .unwrap()
            .gemm_shape_factor(false, 256.0, 256.0, 256.0)
            .is_none());
    }

    fn attention_curve(
        pass: &str,
        causal: bool,
        points: serde_json::Value,
    ) -> Result<AttentionCurve, String> {
        serde_json::from_value(serde_json::json!({"pass": pass, "causal": causal, "source": "test grid", "points": points})).map_err(|e| e.to_string())
    }

    /// Grid points are exact, between them the curve is log-linear in head width and
    /// sequence length, and outside the grid it holds the nearest edge.
    #[test]
    fn attention_curve_interpolates_and_holds_its_edges() {
        let c = attention_curve(
            "fwd",
            true,
            serde_json::json!([
                [64, 1024, 100],
                [64, 4096, 200],
                [128, 1024, 200],
                [128, 4096, 400]
            ]),
        )
        .unwrap();
        let near = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(near(c.factor(128.0, 4096.0), 1.0) && near(c.factor(64.0, 1024.0), 0.25));
        // 2048 tokens sit halfway between 1024 and 4096 on a log axis: the geometric
        // mean; a head width of sqrt(64 x 128) likewise between the two widths.
        assert!(near(
            c.factor(128.0, 2048.0),
            (200.0f64 * 400.0).sqrt() / 400.0
        ));
        assert!(near(
            c.factor((64.0f64 * 128.0).sqrt(), 4096.0),
            (200.0f64 * 400.0).sqrt() / 400.0
        ));
        assert!(near(c.factor(256.0, 65536.0), 1.0) && near(c.factor(32.0, 256.0), 0.25));
        let back: AttentionCurve =
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        for (points, why) in [
            (
                serde_json::json!([[64, 1024, 100], [64, 4096, 200], [128, 1024, 200]]),
                "one point for every (head_dim, seq)",
            ),
            (
                serde_json::json!([[64, 1024, 100], [64, 1024, 200]]),
                "at least two sequence lengths",
            ),
            (
                serde_json::json!([[64, 1024, 100], [64, 4096, -2]]),
                "tflops 0.01 to 50000",
            ),
        ] {
            let e = attention_curve("bwd", false, points).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("../../hwprofiles/h100-sxm.json")).unwrap();
        let first = v["attention_curves"][0].clone();
        v["attention_curves"].as_array_mut().unwrap().push(first);
        let e = HardwareProfile::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("attention_curves") && e.contains("two curves"),
            "{e}"
        );
    }

    /// The built-in H100 curves (cuDNN's fused attention in FlashAttention-3's
    /// benchmark): 64-wide heads and short sequences run well below the best point;
    /// the backward, measured only without a mask, stands in for the causal one.
    #[test]
    fn builtin_attention_curves() {
        let h100 = builtin_profile("h100-sxm").unwrap();
        let f = |pass, d: f64, s: f64| h100.attention_factor(pass, d, s).unwrap();
        assert!((f(AttentionPass::Fwd, 128.0, 4096.0) - 518.0 / 539.0).abs() < 1e-12);
        assert!((f(AttentionPass::Bwd, 128.0, 4096.0) - 499.0 / 518.0).abs() < 1e-12);
        assert!(
            f(AttentionPass::Fwd, 64.0, 4096.0) < 0.7 && f(AttentionPass::Fwd, 128.0, 512.0) < 0.6
        );
        for pass in [AttentionPass::Fwd, AttentionPass::Bwd] {
            for d in [64.0, 128.0] {
                assert!(
                    f(pass, d, 1024.0) < f(pass, d, 4096.0)
                        && f(pass, 64.0, 4096.0) < f(pass, 128.0, 4096.0)
                );
            }
        }
        assert!(builtin_profile("b200")
            .unwrap()
            .attention_factor(AttentionPass::Fwd, 128.0, 4096.0)
            .is_none());
    }

    #[test]
    fn gpu_counts_must_fill_nodes() {
        let p = builtin_profile("h100-sxm").unwrap();
        assert!(Cluster::new(p.clone(), 128).is_ok());
        assert!(Cluster::new(p.clone(), 1).is_ok());
        assert!(Cluster::new(p.clone(), 4).is_ok());
        let e = Cluster::new(p.clone(), 7).unwrap_err().to_string();
        assert!(e.contains("7 GPUs"), "{e}");
        assert!(Cluster::new(p.clone(), 12).is_err());
        assert!(Cluster::new(p, 0).is_err());
    }
}
