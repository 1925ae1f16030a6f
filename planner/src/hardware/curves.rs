//! Measured throughput curves a profile may carry: GEMM throughput by shape
//! ([`GemmCurve`]) and fused-attention throughput by head width and sequence
//! ([`AttentionCurve`]), each read on a full grid and interpolated in log space.

use serde::{Deserialize, Serialize};

use super::ranges;

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
    type Error = CurveError;
    fn try_from(f: GemmCurveFile) -> Result<GemmCurve, CurveError> {
        if f.source.trim().is_empty() {
            return Err(CurveError::GemmSource);
        }
        for p in &f.points {
            if !p[..3].iter().all(|x| (1.0..=1e7).contains(x))
                || !ranges::CURVE_TFLOPS.contains(p[3])
            {
                return Err(CurveError::GemmPoint(*p));
            }
        }
        let axis = |i: usize| grid_axis(&f.points, i);
        let (ms, ns, ks) = (axis(0), axis(1), axis(2));
        let cells = ms.len() * ns.len() * ks.len();
        if ms.len() < 2 || ns.len() < 2 || ks.len() < 2 || f.points.len() != cells {
            return Err(CurveError::GemmGrid {
                points: f.points.len(),
                axes: [ms.len(), ns.len(), ks.len()],
            });
        }
        let mut tflops = vec![f64::NAN; cells];
        for p in &f.points {
            let i = (grid_index(&ms, p[0]) * ns.len() + grid_index(&ns, p[1])) * ks.len()
                + grid_index(&ks, p[2]);
            if !tflops[i].is_nan() {
                return Err(CurveError::GemmTwice(*p));
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

/// A GEMM or attention throughput curve that is not a full grid of plausible
/// points (a profile's or a benchmark file's).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CurveError {
    #[error("a GEMM curve needs a source")]
    GemmSource,
    /// `[m, n, k, tflops]`.
    #[error("GEMM curve point {0:?}: m, n, k must be 1 to 1e7 and tflops {lo} to {hi}", lo = ranges::CURVE_TFLOPS.lo, hi = ranges::CURVE_TFLOPS.hi)]
    GemmPoint([f64; 4]),
    /// `axes`: the distinct m, n and k values.
    #[error("GEMM curve needs one point for every (m, n, k) of a grid with at least two values per axis; {points} points over {} x {} x {} values", .axes[0], .axes[1], .axes[2])]
    GemmGrid { points: usize, axes: [usize; 3] },
    #[error("GEMM curve lists m={} n={} k={} twice", .0[0], .0[1], .0[2])]
    GemmTwice([f64; 4]),
    #[error("an attention curve needs a source")]
    AttentionSource,
    /// `[head_dim, seq, tflops]`.
    #[error("attention curve point {0:?}: head_dim must be 1 to 4096, seq 1 to 1e8 and tflops {lo} to {hi}", lo = ranges::CURVE_TFLOPS.lo, hi = ranges::CURVE_TFLOPS.hi)]
    AttentionPoint([f64; 3]),
    /// `axes`: the distinct head_dim and seq values.
    #[error("attention curve needs one point for every (head_dim, seq) of a grid with at least two sequence lengths; {points} points over {} x {} values", .axes[0], .axes[1])]
    AttentionGrid { points: usize, axes: [usize; 2] },
    #[error("attention curve lists head_dim={} seq={} twice", .0[0], .0[1])]
    AttentionTwice([f64; 3]),
}

impl TryFrom<AttentionCurveFile> for AttentionCurve {
    type Error = CurveError;
    fn try_from(f: AttentionCurveFile) -> Result<AttentionCurve, CurveError> {
        if f.source.trim().is_empty() {
            return Err(CurveError::AttentionSource);
        }
        for p in &f.points {
            if !(1.0..=4096.0).contains(&p[0])
                || !(1.0..=1e8).contains(&p[1])
                || !ranges::CURVE_TFLOPS.contains(p[2])
            {
                return Err(CurveError::AttentionPoint(*p));
            }
        }
        let (head_dims, seqs) = (grid_axis(&f.points, 0), grid_axis(&f.points, 1));
        if seqs.len() < 2 || f.points.len() != head_dims.len() * seqs.len() {
            return Err(CurveError::AttentionGrid {
                points: f.points.len(),
                axes: [head_dims.len(), seqs.len()],
            });
        }
        let mut tflops = vec![f64::NAN; f.points.len()];
        for p in &f.points {
            let i = grid_index(&head_dims, p[0]) * seqs.len() + grid_index(&seqs, p[1]);
            if !tflops[i].is_nan() {
                return Err(CurveError::AttentionTwice(*p));
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
    ) -> Result<GemmCurve, CurveError> {
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
