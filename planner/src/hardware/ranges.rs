//! The physical range of every number in a profile. The ends are wide enough for
//! every built-in profile (A100 to GB200 and MI300X, `hwprofiles/`) and for GPUs up
//! to about ten times a B200, and tight enough that no accepted value can make an
//! estimate NaN or infinite. Published specs: `shared/data/gpu_specs.csv`.
//!
//! Also [`Range`] itself, and [`show`], which writes a number as a person would.

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
    pub fn check(&self, v: f64) -> Result<(), OutOfRange> {
        if self.contains(v) {
            return Ok(());
        }
        Err(OutOfRange {
            value: v,
            range: *self,
        })
    }
}

/// A number outside its [`Range`] ([`Range::check`]).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error(
    "{} is out of range: expected {}{} to {} ({})",
    show(*.value),
    if .range.zero_ok { "0 or " } else { "" },
    show(.range.lo),
    show(.range.hi),
    .range.why
)]
pub struct OutOfRange {
    pub value: f64,
    pub range: Range,
}

/// A number as a person writes it: `1e-308`, not 308 zeros.
pub fn show(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// Dense BF16/FP16 peak: 0.1x a V100-class part (125) to 10x a GB200 (2450).
pub const PEAK_TFLOPS: Range = Range::new(10.0, 25_000.0, "TFLOP/s: 0.1x a V100 to 10x a GB200");
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
pub const HOST_US: Range = Range::new(0.0, 1000.0, "host microseconds per operation");
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
