//! The executed model: a transformer whose layers have the plan's structure
//! (attention with heads split over TP and the sequence over CP, dense MLP or
//! routed experts split over EP, residual stream sharded by SP) at sizes chosen by
//! the backend, with weights and inputs generated from their global indices so that
//! every rank can build its own shard, and a full copy, without communication.
//!
//! The same layer code runs sharded (real groups) and as the reference (groups of
//! one): the reference is what the sharded run must reproduce. Simplifications, all
//! stated in ARCHITECTURE.md: no norms, SiLU MLPs, no embedding or output layer (the
//! first stage generates its input, the last takes loss = sum(x^2) / 2N), top-k
//! routing with the gates treated as constants (the router is frozen), dropless.
//!
//! The routed-expert layer (router, EP all-to-all, expert TP) is in `moe`.

mod moe;

use sextant_planner::cost::CommKind;
use sextant_planner::model::ModelSpec;

use crate::comm::Group;
use crate::mesh::Mesh;
use crate::record::Recorder;
use crate::tensor::{matmul, Mat};

pub use moe::top_k;
use moe::{moe_backward, moe_forward};

/// Sizes the program runs at.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Dims {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    /// Key/value heads: the CPU program runs multi-head attention (equal to
    /// `heads`); the device program ([`crate::trace`]) uses it for the plan's real
    /// projection shapes.
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    /// Routed experts (0: dense model).
    pub experts: usize,
    pub top_k: usize,
    pub expert_ffn: usize,
    pub seq: usize,
    pub mbs: usize,
    pub moe_layer: Vec<bool>,
}

impl Dims {
    /// The model as a [`ModelSpec`], so that the planner can predict this run.
    pub fn to_model(&self, base: &ModelSpec) -> ModelSpec {
        let mut m = base.clone();
        m.name = format!(
            "{} (executed at {} layers, hidden {})",
            base.name, self.layers, self.hidden
        );
        m.layers = self.layers as u64;
        m.hidden = self.hidden as u64;
        m.heads = self.heads as u64;
        m.kv_heads = self.kv_heads as u64;
        m.head_dim = self.head_dim as u64;
        m.ffn_hidden = self.ffn as u64;
        m.mla = None;
        m.sliding_window = None;
        // The executed layers have no norms, so none after each block either.
        m.sandwich_norms = false;
        m.glu_clamp = None;
        m.attention_sinks = false;
        m.yarn_attention_factor = None;
        // Nor does a multi-token-prediction layer.
        m.mtp_layers = 0;
        m.mlp = sextant_planner::model::MlpKind::Plain;
        m.bias = false;
        m.qkv_bias = false;
        // No embedding or output layer runs: a one-token vocabulary makes them vanish
        // from the prediction too.
        m.vocab = 1;
        m.tied_embeddings = true;
        if let Some(moe) = &mut m.moe {
            moe.experts = self.experts as u64;
            moe.top_k = self.top_k as u64;
            moe.expert_ffn_hidden = self.expert_ffn as u64;
            moe.shared_experts = 0;
            moe.shared_ffn_hidden = None;
            moe.dense_leading_layers = self.moe_layer.iter().take_while(|x| !**x).count() as u64;
            moe.layer_freq = 1;
        }
        m
    }
}

/// A value in [-1, 1) from a 64-bit key (splitmix64).
pub fn hash_unit(mut x: u64) -> f32 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    ((x >> 40) as f32 / (1u64 << 23) as f32) - 1.0
}

fn key(a: u64, b: u64, c: u64, d: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in [a, b, c, d] {
        h = (h ^ v).wrapping_mul(0x0000_0100_0000_01B3).rotate_left(17);
    }
    h
}

/// Parameter ids inside a layer.
pub mod pid {
    pub const WQ: u64 = 1;
    pub const WK: u64 = 2;
    pub const WV: u64 = 3;
    pub const WO: u64 = 4;
    pub const W1: u64 = 5;
    pub const W2: u64 = 6;
    pub const ROUTER: u64 = 7;
    /// Expert e's matrices are `EXPERT + 2e` and `EXPERT + 2e + 1`.
    pub const EXPERT: u64 = 16;
}

/// Element (r, c) of full parameter `param` of `layer`, scaled by 1/sqrt(fan_in).
fn weight(layer: usize, param: u64, r: usize, c: usize, fan_in: usize) -> f32 {
    0.5 * hash_unit(key(layer as u64, param, r as u64, c as u64)) / (fan_in as f32).sqrt()
}

/// Rows `r0..r1`, columns `c0..c1` of a full `fan_in`-row parameter.
fn block(
    layer: usize,
    param: u64,
    (r0, r1): (usize, usize),
    (c0, c1): (usize, usize),
    fan_in: usize,
) -> Mat {
    let mut m = Mat::zeros(r1 - r0, c1 - c0);
    for r in r0..r1 {
        for c in c0..c1 {
            m.data[(r - r0) * (c1 - c0) + (c - c0)] = weight(layer, param, r, c, fan_in);
        }
    }
    m
}

/// The input of sample `sample` at sequence positions `p0..p1` (row = pos * mbs + b
/// within a micro-batch of `mbs` samples starting at `sample`).
pub fn input_rows(d: &Dims, first_sample: u64, (p0, p1): (usize, usize)) -> Mat {
    let mut m = Mat::zeros((p1 - p0) * d.mbs, d.hidden);
    for p in p0..p1 {
        for b in 0..d.mbs {
            let row = (p - p0) * d.mbs + b;
            for c in 0..d.hidden {
                m.data[row * d.hidden + c] =
                    hash_unit(key(u64::MAX, first_sample + b as u64, p as u64, c as u64));
            }
        }
    }
    m
}

/// Where this rank sits in the layer's groups. Size-1 groups make the reference.
pub struct Shard<'a> {
    pub mesh: &'a Mesh,
    pub tp: &'a Group,
    pub cp: &'a Group,
    pub ep: &'a Group,
    /// Expert tensor parallelism: the ranks that split each local expert's FFN.
    pub etp: &'a Group,
    pub sp: bool,
    pub rec: &'a Recorder,
}

impl Shard<'_> {
    fn tp_n(&self) -> usize {
        self.tp.size()
    }
}

/// One layer's parameters as held by one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerParams {
    /// [Wq | Wk | Wv] columns of this rank's heads: hidden x 3 * local heads * head_dim.
    pub wqkv: Mat,
    /// Rows of this rank's heads: local heads * head_dim x hidden.
    pub wo: Mat,
    /// Dense MLP: hidden x ffn / tp and ffn / tp x hidden.
    pub w1: Mat,
    pub w2: Mat,
    /// Replicated router, hidden x experts (frozen).
    pub router: Mat,
    /// This rank's experts: (hidden x expert_ffn / etp, expert_ffn / etp x hidden).
    pub experts: Vec<(Mat, Mat)>,
}

impl LayerParams {
    /// The shard of layer `layer` at TP rank `t` of `tp`, EP rank `e` of `ep` and
    /// expert-TP rank `et` of `etp` (FFN columns of each expert).
    pub fn init(
        d: &Dims,
        layer: usize,
        (t, tp): (usize, usize),
        (e, ep): (usize, usize),
        (et, etp): (usize, usize),
    ) -> LayerParams {
        let h = d.hidden;
        let full = d.heads * d.head_dim;
        let hl = full / tp;
        let cols = (t * hl, (t + 1) * hl);
        let q = block(layer, pid::WQ, (0, h), cols, h);
        let k = block(layer, pid::WK, (0, h), cols, h);
        let v = block(layer, pid::WV, (0, h), cols, h);
        let wqkv = Mat::hstack(&[&q, &k, &v]);
        let wo = block(layer, pid::WO, cols, (0, h), full);
        let moe = d.moe_layer[layer];
        let (w1, w2) = if moe {
            (Mat::zeros(0, 0), Mat::zeros(0, 0))
        } else {
            let fl = d.ffn / tp;
            (
                block(layer, pid::W1, (0, h), (t * fl, (t + 1) * fl), h),
                block(layer, pid::W2, (t * fl, (t + 1) * fl), (0, h), d.ffn),
            )
        };
        let (router, experts) = if moe {
            let per = d.experts / ep;
            let fe = d.expert_ffn / etp;
            let f = (et * fe, (et + 1) * fe);
            let experts = (e * per..(e + 1) * per)
                .map(|x| {
                    let base = pid::EXPERT + 2 * x as u64;
                    (
                        block(layer, base, (0, h), f, h),
                        block(layer, base + 1, f, (0, h), d.expert_ffn),
                    )
                })
                .collect();
            (
                block(layer, pid::ROUTER, (0, h), (0, d.experts), h),
                experts,
            )
        } else {
            (Mat::zeros(0, 0), vec![])
        };
        LayerParams {
            wqkv,
            wo,
            w1,
            w2,
            router,
            experts,
        }
    }

    pub fn zeros_like(&self) -> LayerParams {
        let z = |m: &Mat| Mat::zeros(m.rows, m.cols);
        LayerParams {
            wqkv: z(&self.wqkv),
            wo: z(&self.wo),
            w1: z(&self.w1),
            w2: z(&self.w2),
            router: z(&self.router),
            experts: self.experts.iter().map(|(a, b)| (z(a), z(b))).collect(),
        }
    }

    /// Dense (non-expert) trainable tensors, in a fixed order. The router is frozen.
    pub fn dense_mut(&mut self) -> Vec<&mut Mat> {
        vec![&mut self.wqkv, &mut self.wo, &mut self.w1, &mut self.w2]
    }
    pub fn dense(&self) -> Vec<&Mat> {
        vec![&self.wqkv, &self.wo, &self.w1, &self.w2]
    }
    pub fn expert_mut(&mut self) -> Vec<&mut Mat> {
        self.experts.iter_mut().flat_map(|(a, b)| [a, b]).collect()
    }
    pub fn expert(&self) -> Vec<&Mat> {
        self.experts.iter().flat_map(|(a, b)| [a, b]).collect()
    }
}

/// What a layer's forward keeps for its backward.
#[derive(Debug, Clone)]
pub struct Saved {
    xf: Mat,
    q: Mat,
    k_all: Mat,
    v_all: Mat,
    /// Attention probabilities per (batch item, head); empty when recomputed.
    probs: Vec<Mat>,
    o: Mat,
    /// MLP: gathered input and pre-activation. MoE: per local expert, the rows it
    /// received and their pre-activation.
    x1f: Mat,
    h: Mat,
    moe: Option<MoeSaved>,
}

#[derive(Debug, Clone)]
struct MoeSaved {
    /// Per token of this rank's slice: (expert, gate) choices.
    routes: Vec<Vec<(usize, f32)>>,
    /// Per local expert: its input rows (with expert TP, those of the whole
    /// group) and this rank's columns of the pre-activation.
    rows: Vec<(Mat, Mat)>,
    /// Per EP member: how many rows it sent to each of this rank's experts.
    counts: Vec<Vec<usize>>,
    /// Per expert-TP member: how many rows it gave each local expert.
    etp_counts: Vec<Vec<usize>>,
}

impl Saved {
    pub fn bytes(&self) -> usize {
        let mut b = self.xf.bytes()
            + self.q.bytes()
            + self.k_all.bytes()
            + self.v_all.bytes()
            + self.o.bytes()
            + self.x1f.bytes()
            + self.h.bytes();
        b += self.probs.iter().map(Mat::bytes).sum::<usize>();
        if let Some(m) = &self.moe {
            b += m
                .rows
                .iter()
                .map(|(a, c)| a.bytes() + c.bytes())
                .sum::<usize>();
        }
        b
    }
}

type R<T> = Result<T, crate::error::CommError>;

fn gemm(s: &Shard, class: &'static str, a: &Mat, ta: bool, b: &Mat, tb: bool) -> Mat {
    let t = s.rec.start();
    let c = matmul(a, ta, b, tb);
    let k = if ta { a.rows } else { a.cols };
    s.rec.gemm(class, c.rows, c.cols, k, t);
    c
}

fn gather_rows(s: &Shard, g: &Group, kind: CommKind, x: &Mat) -> R<Mat> {
    if g.size() == 1 {
        return Ok(x.clone());
    }
    let t = s.rec.start();
    let out = g.all_gather(s.mesh, &x.data)?;
    s.rec.comm(kind, "all_gather", g.size(), out.len() * 4, t);
    Mat::from_vec(x.rows * g.size(), x.cols, out)
}

fn scatter_rows(s: &Shard, g: &Group, kind: CommKind, x: &Mat) -> R<Mat> {
    if g.size() == 1 {
        return Ok(x.clone());
    }
    let t = s.rec.start();
    let out = g.reduce_scatter(s.mesh, &x.data)?;
    s.rec
        .comm(kind, "reduce_scatter", g.size(), x.data.len() * 4, t);
    Mat::from_vec(x.rows / g.size(), x.cols, out)
}

fn all_reduce(s: &Shard, g: &Group, kind: CommKind, x: &mut Mat) -> R<()> {
    if g.size() == 1 {
        return Ok(());
    }
    let t = s.rec.start();
    g.all_reduce(s.mesh, &mut x.data)?;
    s.rec
        .comm(kind, "all_reduce", g.size(), x.data.len() * 4, t);
    Ok(())
}

/// Into the column-parallel region: SP gathers the sequence, else the input is replicated.
fn enter_tp(s: &Shard, x: &Mat) -> R<Mat> {
    if s.sp {
        gather_rows(s, s.tp, CommKind::Tp, x)
    } else {
        Ok(x.clone())
    }
}

/// Out of the row-parallel region: SP reduce-scatters, else all-reduces.
fn leave_tp(s: &Shard, mut y: Mat) -> R<Mat> {
    if s.sp {
        scatter_rows(s, s.tp, CommKind::Tp, &y)
    } else {
        all_reduce(s, s.tp, CommKind::Tp, &mut y)?;
        Ok(y)
    }
}

/// Rows of batch item `b` in a (pos * mbs + b) layout.
fn item_rows(m: &Mat, mbs: usize, b: usize, col0: usize, cols: usize) -> Mat {
    let n = m.rows / mbs;
    let mut out = Mat::zeros(n, cols);
    for p in 0..n {
        out.row_mut(p)
            .copy_from_slice(&m.row(p * mbs + b)[col0..col0 + cols]);
    }
    out
}

fn put_item_rows(dst: &mut Mat, src: &Mat, mbs: usize, b: usize, col0: usize, add: bool) {
    for p in 0..src.rows {
        let row = &mut dst.row_mut(p * mbs + b)[col0..col0 + src.cols];
        if add {
            for (x, y) in row.iter_mut().zip(src.row(p)) {
                *x += y;
            }
        } else {
            row.copy_from_slice(src.row(p));
        }
    }
}

/// Causal softmax(q k^T / sqrt(d)) for query positions starting at `q0`.
fn probs(s: &Shard, q: &Mat, k: &Mat, q0: usize) -> Mat {
    let mut sc = gemm(s, "attention_core", q, false, k, true);
    let t = s.rec.start();
    let scale = 1.0 / (q.cols as f32).sqrt();
    for i in 0..sc.rows {
        let row = sc.row_mut(i);
        let last = q0 + i;
        let mut mx = f32::NEG_INFINITY;
        for (j, x) in row.iter_mut().enumerate() {
            *x = if j <= last {
                *x * scale
            } else {
                f32::NEG_INFINITY
            };
            mx = mx.max(*x);
        }
        let mut sum = 0.0;
        for x in row.iter_mut() {
            *x = (*x - mx).exp();
            sum += *x;
        }
        for x in row.iter_mut() {
            *x /= sum;
        }
    }
    s.rec.add("attention_core", t);
    sc
}

/// Forward of one layer on this rank's rows `x`. `q0` is the first sequence position
/// of this rank's CP chunk. `keep_probs` false recomputes them in the backward.
pub fn forward(
    s: &Shard,
    d: &Dims,
    p: &LayerParams,
    moe: bool,
    x: &Mat,
    q0: usize,
    keep_probs: bool,
) -> R<(Mat, Saved)> {
    let hd = d.head_dim;
    let heads = d.heads / s.tp_n();
    let hl = heads * hd;
    // Attention.
    let xf = enter_tp(s, x)?;
    let qkv = gemm(s, "attention_proj", &xf, false, &p.wqkv, false);
    let (q, k, v) = (
        qkv.cols_range(0, hl),
        qkv.cols_range(hl, 2 * hl),
        qkv.cols_range(2 * hl, 3 * hl),
    );
    let k_all = gather_rows(s, s.cp, CommKind::Cp, &k)?;
    let v_all = gather_rows(s, s.cp, CommKind::Cp, &v)?;
    let mut o = Mat::zeros(q.rows, hl);
    let mut kept = Vec::new();
    for b in 0..d.mbs {
        for hh in 0..heads {
            let qh = item_rows(&q, d.mbs, b, hh * hd, hd);
            let kh = item_rows(&k_all, d.mbs, b, hh * hd, hd);
            let vh = item_rows(&v_all, d.mbs, b, hh * hd, hd);
            let pr = probs(s, &qh, &kh, q0);
            let oh = gemm(s, "attention_core", &pr, false, &vh, false);
            put_item_rows(&mut o, &oh, d.mbs, b, hh * hd, false);
            if keep_probs {
                kept.push(pr);
            }
        }
    }
    let y = leave_tp(s, gemm(s, "attention_proj", &o, false, &p.wo, false))?;
    let mut x1 = x.clone();
    x1.add_assign(&y);
    // MLP or experts.
    let (y2, x1f, h, moe_saved) = if moe {
        let (y, saved) = moe_forward(s, d, p, &x1)?;
        (y, Mat::zeros(0, 0), Mat::zeros(0, 0), Some(saved))
    } else {
        let x1f = enter_tp(s, &x1)?;
        let h = gemm(s, "mlp", &x1f, false, &p.w1, false);
        let t = s.rec.start();
        let mut a = h.clone();
        a.data.iter_mut().for_each(|z| *z = silu(*z));
        s.rec.add("elementwise", t);
        let y = leave_tp(s, gemm(s, "mlp", &a, false, &p.w2, false))?;
        (y, x1f, h, None)
    };
    let mut out = x1.clone();
    out.add_assign(&y2);
    Ok((
        out,
        Saved {
            xf,
            q,
            k_all,
            v_all,
            probs: kept,
            o,
            x1f,
            h,
            moe: moe_saved,
        },
    ))
}

/// The MLPs' and experts' activation, SiLU (`z * sigmoid(z)`). Its derivative is
/// continuous: under ReLU's step, a pre-activation within rounding of zero took
/// the sign the summation order gave it, so a sharded run and its reference
/// (orders that sharding changes) could switch a unit on in one and off in the
/// other, and one token's gradient differed by a whole unit's share (0.6% on an
/// interleaved TP 4 x DP 2 run, past the checks' tolerance) with no layout error.
pub(crate) fn silu(z: f32) -> f32 {
    z / (1.0 + (-z).exp())
}

/// d silu / dz = sigmoid(z) (1 + z (1 - sigmoid(z))).
pub(crate) fn silu_grad(z: f32) -> f32 {
    let sg = 1.0 / (1.0 + (-z).exp());
    sg * (1.0 + z * (1.0 - sg))
}

/// Weight-gradient work: `grad += a^T g`, run at once or deferred (zero-bubble W).
pub struct WJob {
    pub layer: usize,
    /// Index into [`LayerParams::dense_mut`] (0..4) or 100 + index into `expert_mut`.
    pub slot: usize,
    pub class: &'static str,
    pub a: Mat,
    pub g: Mat,
}

/// Backward of one layer: returns the gradient of its input; weight gradients go
/// to `wjobs`. `dout` is the gradient of the layer's output.
// The arguments are what one layer's backward reads; a struct for them would be
// built and taken apart at its one call site.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    s: &Shard,
    d: &Dims,
    p: &LayerParams,
    layer: usize,
    sv: &Saved,
    dout: &Mat,
    q0: usize,
    wjobs: &mut Vec<WJob>,
) -> R<Mat> {
    let hd = d.head_dim;
    let heads = d.heads / s.tp_n();
    let hl = heads * hd;
    // MLP / experts: output = x1 + f(x1).
    let mut dx1 = dout.clone();
    if let Some(m) = &sv.moe {
        dx1.add_assign(&moe_backward(s, d, p, layer, m, dout, wjobs)?);
    } else {
        let dyf = enter_tp(s, dout)?;
        let mut da = gemm(s, "mlp", &dyf, false, &p.w2, true);
        let mut a = sv.h.clone();
        a.data.iter_mut().for_each(|z| *z = silu(*z));
        wjobs.push(WJob {
            layer,
            slot: 3,
            class: "mlp",
            a,
            g: dyf,
        });
        for (g, h) in da.data.iter_mut().zip(&sv.h.data) {
            *g *= silu_grad(*h);
        }
        let dxf = gemm(s, "mlp", &da, false, &p.w1, true);
        wjobs.push(WJob {
            layer,
            slot: 2,
            class: "mlp",
            a: sv.x1f.clone(),
            g: da,
        });
        dx1.add_assign(&leave_tp(s, dxf)?);
    }
    // Attention: x1 = x + attn(x).
    let dyf = enter_tp(s, &dx1)?;
    let dout_h = gemm(s, "attention_proj", &dyf, false, &p.wo, true);
    wjobs.push(WJob {
        layer,
        slot: 1,
        class: "attention_proj",
        a: sv.o.clone(),
        g: dyf,
    });
    let mut dq = Mat::zeros(sv.q.rows, hl);
    let mut dk_all = Mat::zeros(sv.k_all.rows, hl);
    let mut dv_all = Mat::zeros(sv.v_all.rows, hl);
    let scale = 1.0 / (hd as f32).sqrt();
    for b in 0..d.mbs {
        for hh in 0..heads {
            let qh = item_rows(&sv.q, d.mbs, b, hh * hd, hd);
            let kh = item_rows(&sv.k_all, d.mbs, b, hh * hd, hd);
            let vh = item_rows(&sv.v_all, d.mbs, b, hh * hd, hd);
            let doh = item_rows(&dout_h, d.mbs, b, hh * hd, hd);
            let pr = match sv.probs.get(b * heads + hh) {
                Some(p) => p.clone(),
                None => probs(s, &qh, &kh, q0),
            };
            let dvh = gemm(s, "attention_core", &pr, true, &doh, false);
            let dp = gemm(s, "attention_core", &doh, false, &vh, true);
            let t = s.rec.start();
            let mut ds = dp;
            for i in 0..ds.rows {
                let prow = pr.row(i);
                let dot: f32 = ds.row(i).iter().zip(prow).map(|(a, b)| a * b).sum();
                for (x, pv) in ds.row_mut(i).iter_mut().zip(prow) {
                    *x = pv * (*x - dot) * scale;
                }
            }
            s.rec.add("attention_core", t);
            let dqh = gemm(s, "attention_core", &ds, false, &kh, false);
            let dkh = gemm(s, "attention_core", &ds, true, &qh, false);
            put_item_rows(&mut dq, &dqh, d.mbs, b, hh * hd, false);
            put_item_rows(&mut dk_all, &dkh, d.mbs, b, hh * hd, true);
            put_item_rows(&mut dv_all, &dvh, d.mbs, b, hh * hd, true);
        }
    }
    // Every CP rank's queries contributed to every chunk's K and V gradients.
    let dk = scatter_rows(s, s.cp, CommKind::Cp, &dk_all)?;
    let dv = scatter_rows(s, s.cp, CommKind::Cp, &dv_all)?;
    let dqkv = Mat::hstack(&[&dq, &dk, &dv]);
    let dxf = gemm(s, "attention_proj", &dqkv, false, &p.wqkv, true);
    wjobs.push(WJob {
        layer,
        slot: 0,
        class: "attention_proj",
        a: sv.xf.clone(),
        g: dqkv,
    });
    let mut dx = dx1;
    dx.add_assign(&leave_tp(s, dxf)?);
    Ok(dx)
}

/// Runs a weight-gradient job into `grads`.
pub fn run_wjob(s: &Shard, grads: &mut [LayerParams], first_layer: usize, job: WJob) {
    let g = gemm(s, job.class, &job.a, true, &job.g, false);
    let lp = &mut grads[job.layer - first_layer];
    let dst = if job.slot >= 100 {
        lp.expert_mut().into_iter().nth(job.slot - 100)
    } else {
        lp.dense_mut().into_iter().nth(job.slot)
    };
    if let Some(dst) = dst {
        dst.add_assign(&g);
    }
}
