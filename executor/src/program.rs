//! The per-rank program: build this rank's groups from the plan's rank order, its
//! shard of every layer it holds, and run steps in the plan's pipeline schedule
//! (the simulator's own per-rank pass order): forwards and backwards per virtual
//! stage and micro-batch with the pipeline sends and receives, then the data-parallel
//! gradient reduction (all-reduce, or reduce-scatter + all-gather with the
//! distributed optimizer) and an Adam step.
//!
//! With `verify`, every rank also runs the whole model unsharded (the reference, the
//! same layer code with groups of one) and compares: each stage input and output,
//! each gradient crossing a stage boundary, the reduced weight gradients and the
//! weights after the step; replicas must hold bit-identical weights. Start-up checks
//! every communicator with known data.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sextant_planner::calibration::{
    CommPoint, GemmPoint, MeasuredRun, RunChecks, RUN_SCHEMA_VERSION,
};
use sextant_planner::config::{Layout, ParallelConfig, Recompute, Workload, Zero};
use sextant_planner::model::ModelSpec;
use sextant_planner::plan::PlanFile;
use sextant_planner::ranks::rank_map;
use sextant_planner::schedule::{locate, rank_order, virtual_stage, Pass, Schedule};

use crate::comm::{from_bytes, to_bytes, Group, Kind};
use crate::error::ExecError;
use crate::mesh::Mesh;
use crate::model::{self, input_rows, Dims, LayerParams, Saved, Shard, WJob};
use crate::record::{RankStats, Recorder};
use crate::tensor::{rel_diff, Mat};

/// Relative tolerance of every comparison with the reference (f32, different
/// summation orders).
pub const TOLERANCE: f32 = 2e-3;
const LR: f32 = 1e-5;

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Which ranked plan to run (1 = best).
    pub plan_rank: usize,
    pub steps: u64,
    pub warmup: u64,
    pub micro_batches: Option<u64>,
    pub scale_layers: Option<u64>,
    pub verify: bool,
    /// Sizes: true runs the plan's real sizes, false the CPU backend's small ones.
    pub full_size: bool,
    pub timeout: Duration,
    /// Testing hook: (rank, step) at which that rank exits abruptly mid-step.
    pub die_at: Option<(u64, u64)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            plan_rank: 1,
            steps: 2,
            warmup: 1,
            micro_batches: None,
            scale_layers: None,
            verify: true,
            full_size: false,
            timeout: Duration::from_secs(300),
            die_at: None,
        }
    }
}

/// Everything a rank needs, derived from the plan alone.
#[derive(Debug, Clone)]
pub struct Setup {
    pub cfg: ParallelConfig,
    pub dims: Dims,
    pub micro_batches: u64,
    pub schedule: Schedule,
    /// Layers per virtual stage and the first layer of each.
    pub stage_layers: Vec<usize>,
    pub first_layer: Vec<usize>,
    pub model: ModelSpec,
    pub workload: Workload,
    pub plan_hash: u64,
    pub profile: String,
    pub gpus_per_node: u64,
    pub rank_order: String,
    /// The plan's predicted peak memory per GPU, bytes (for out-of-memory messages).
    pub predicted_bytes: f64,
}

/// Room in a message for one rank's measurements (JSON: at most 4096 samples per
/// GEMM shape and collective size).
const STATS_ALLOWANCE_BYTES: u64 = 64 << 20;

impl Setup {
    /// The plan's rank map: every rank's coordinates and groups.
    pub fn rank_map(&self) -> Result<sextant_planner::ranks::RankMap, String> {
        rank_map(&self.cfg, &self.rank_order, self.gpus_per_node.max(1))
    }

    /// The longest message a rank of this plan can send another, with room to
    /// spare: twice every executed parameter (a DualPipe mirror sends all it holds,
    /// a ZeRO-3 gather a whole stage) plus twice a micro-batch's widest activation
    /// over all routed copies, as f32, plus the measurements sent to rank 0. The
    /// mesh refuses longer frames from their header.
    pub fn max_message_bytes(&self) -> u64 {
        let d = &self.dims;
        let n = |x: usize| x as u64;
        let (h, q) = (n(d.hidden), n(d.heads.max(d.kv_heads)) * n(d.head_dim));
        let dense = 4 * h * q + 2 * h * n(d.ffn) + 4 * h + 4 * q;
        let experts = n(d.experts) * (2 * h * n(d.expert_ffn) + h + n(d.expert_ffn));
        let params = n(d.layers).saturating_mul(dense.saturating_add(experts));
        let width = h.max(q).max(n(d.ffn)).max(n(d.expert_ffn));
        let rows = n(d.mbs) * n(d.seq) * n(d.top_k.max(1));
        let activations = rows.saturating_mul(width);
        params
            .saturating_add(activations)
            .saturating_mul(2 * 4)
            .saturating_add(STATS_ALLOWANCE_BYTES)
    }
}

/// FNV-1a of the plan file's bytes: what ranks compare at the rendezvous.
pub fn plan_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// `n` layers split in proportion to `counts`, every entry at least 1.
fn rescale(counts: &[u64], n: usize) -> Result<Vec<usize>, String> {
    let k = counts.len();
    if n < k {
        return Err(format!("--scale-layers {n} is fewer than the plan's {k} virtual pipeline stages (each needs a layer)"));
    }
    let total: u64 = counts.iter().sum();
    let spare = n - k;
    let exact: Vec<f64> = counts
        .iter()
        .map(|&c| spare as f64 * c.saturating_sub(1) as f64 / (total - k as u64).max(1) as f64)
        .collect();
    let mut out: Vec<usize> = exact.iter().map(|x| 1 + x.floor() as usize).collect();
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&a, &b| {
        (exact[b] - exact[b].floor())
            .total_cmp(&(exact[a] - exact[a].floor()))
            .then(a.cmp(&b))
    });
    let mut left = n - out.iter().sum::<usize>();
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    Ok(out)
}

/// Derives the executed sizes and layout from the plan; refuses what the executor
/// cannot run, with the reason.
pub fn prepare(plan: &PlanFile, hash: u64, o: &Options) -> Result<Setup, String> {
    let ranked = plan.plans.get(o.plan_rank.wrapping_sub(1)).ok_or_else(|| {
        format!(
            "--plan {} : the file holds plans 1 to {}",
            o.plan_rank,
            plan.plans.len()
        )
    })?;
    let cfg = ranked.config.clone();
    let m0 = &plan.model;
    if m0.mla.is_some() && o.full_size {
        return Err("MLA attention is executed as standard multi-head attention; full-size runs of MLA models are refused".into());
    }
    let schedule = cfg.schedule;
    let (p, v) = (cfg.pp as usize, cfg.vpp as usize);
    let plan_counts = cfg.stage_layers(m0.layers).map_err(|r| r.to_string())?;
    let layers = match o.scale_layers {
        Some(n) => n as usize,
        None if o.full_size => m0.layers as usize,
        None => (2 * p * v).min(m0.layers as usize).max(p * v),
    };
    if layers == 0 || layers > 100_000 {
        return Err(format!(
            "{layers} layers: choose --scale-layers between {} and {}",
            p * v,
            m0.layers
        ));
    }
    let stage_layers = if layers as u64 == m0.layers {
        plan_counts.iter().map(|&c| c as usize).collect()
    } else {
        rescale(&plan_counts, layers)?
    };
    let mut first_layer = vec![0usize; stage_layers.len()];
    for i in 1..stage_layers.len() {
        first_layer[i] = first_layer[i - 1] + stage_layers[i - 1];
    }
    let (tp, cp) = (cfg.tp as usize, cfg.cp as usize);
    let moe_layer: Vec<bool> = (0..layers)
        .map(|i| m0.is_moe_layer((i as u64 * m0.layers) / layers as u64))
        .collect();
    let dims = if o.full_size {
        let moe = m0.moe.as_ref();
        Dims {
            layers,
            hidden: m0.hidden as usize,
            heads: m0.heads as usize,
            kv_heads: m0.kv_heads as usize,
            head_dim: m0.head_dim as usize,
            ffn: m0.ffn_hidden as usize,
            experts: moe.map_or(0, |x| x.experts as usize),
            top_k: moe.map_or(0, |x| x.top_k as usize),
            expert_ffn: moe.map_or(0, |x| x.expert_ffn_hidden as usize),
            seq: plan.workload.seq as usize,
            mbs: cfg.mbs as usize,
            moe_layer,
        }
    } else {
        let heads = 2 * tp;
        let head_dim = 8;
        let hidden = heads * head_dim;
        let experts = if m0.moe.is_some() {
            2 * cfg.ep as usize
        } else {
            0
        };
        Dims {
            layers,
            hidden,
            heads,
            kv_heads: heads,
            head_dim,
            ffn: 2 * hidden,
            experts,
            top_k: m0
                .moe
                .as_ref()
                .map_or(0, |x| (x.top_k as usize).min(experts)),
            // A multiple of etp, which splits each expert's FFN columns.
            expert_ffn: hidden * cfg.etp as usize,
            seq: 4 * cp * tp,
            mbs: (cfg.mbs as usize).min(2),
            moe_layer,
        }
    };
    let etp = cfg.etp as usize;
    if dims.heads % tp != 0
        || dims.ffn % tp != 0
        || dims.seq % (cp * tp) != 0
        || (dims.experts > 0 && (dims.experts % cfg.ep as usize != 0 || dims.expert_ffn % etp != 0))
    {
        return Err(format!(
            "sizes do not divide: heads {} and ffn {} by tp {tp}, seq {} by cp x tp, experts {} by ep {}, expert ffn {} by etp {etp}",
            dims.heads, dims.ffn, dims.seq, dims.experts, cfg.ep, dims.expert_ffn
        ));
    }
    let plan_m = cfg.micro_batches(&plan.workload);
    let mut m = match o.micro_batches {
        Some(m) => m,
        None if o.full_size => plan_m,
        None => plan_m.min(2 * cfg.pp).max(1),
    };
    if schedule == Schedule::Interleaved && !m.is_multiple_of(cfg.pp) {
        if o.micro_batches.is_some() {
            return Err(format!("interleaved schedule needs the micro-batch count to be a multiple of pp {}; {m} is not", cfg.pp));
        }
        m = m.div_ceil(cfg.pp) * cfg.pp;
    }
    if m == 0 || m >= 1 << 20 || o.steps + o.warmup >= 4096 || stage_layers.len() >= 8192 {
        return Err(format!("micro-batches {m} (1 to 2^20), steps {} (below 4096) and virtual stages {} (below 8192) bound the executor's message tags", o.steps + o.warmup, stage_layers.len()));
    }
    let mut exec_cfg = cfg.clone();
    exec_cfg.mbs = dims.mbs as u64;
    exec_cfg.layout = Layout::Explicit {
        layers: stage_layers.iter().map(|&c| c as u64).collect(),
    };
    let model = dims.to_model(m0);
    let mut workload = plan.workload.clone();
    workload.seq = dims.seq as u64;
    workload.global_batch = m * cfg.dp * dims.mbs as u64;
    Ok(Setup {
        cfg: exec_cfg,
        dims,
        micro_batches: m,
        schedule,
        stage_layers,
        first_layer,
        model,
        workload,
        plan_hash: hash,
        profile: plan.hardware.name.clone(),
        gpus_per_node: plan.hardware.node.gpus_per_node,
        rank_order: plan.rank_order.clone(),
        predicted_bytes: ranked.estimate.memory.total,
    })
}

/// Tags of pipeline messages: kind | step (12 bits) | direction (1) | virtual stage (13) | micro-batch (30).
fn pp_tag(step: u64, backward: bool, vstage: usize, mb: u64) -> u64 {
    ((Kind::Pp as u64) << 56)
        | (step << 44)
        | ((backward as u64) << 43)
        | ((vstage as u64) << 30)
        | mb
}

const STATS_TAG: u64 = ((Kind::World as u64) << 56) | 0xFF_FFFF;

struct Groups {
    tp: Group,
    cp: Group,
    dp_cp: Group,
    pp: Group,
    ep: Group,
    etp: Group,
    edp: Group,
    world: Group,
}

/// This rank's live state.
struct Rank<'a> {
    s: &'a Setup,
    o: &'a Options,
    mesh: &'a Mesh,
    rank: u64,
    g: Groups,
    dp_rank: u64,
    pp_rank: usize,
    rec: Recorder,
    params: Vec<Option<LayerParams>>,
    grads: Vec<Option<LayerParams>>,
    /// The virtual stages this rank holds, in chunk order.
    vstages: Vec<usize>,
    /// Adam state per (expert, unit): one unit of all own layers, or with ZeRO-3
    /// one per held virtual stage (the unit its parameters are gathered in).
    adam: HashMap<(bool, usize), Adam>,
    reference: Option<Reference>,
    phase: String,
    /// First position of this rank's CP chunk and its own rows (positions) of it.
    q0: usize,
    own: (usize, usize),
}

#[derive(Default)]
struct Adam {
    m: Vec<f32>,
    v: Vec<f32>,
    t: i32,
}

impl Adam {
    fn step(&mut self, w: &mut [f32], g: &[f32]) {
        if self.m.len() != w.len() {
            self.m = vec![0.0; w.len()];
            self.v = vec![0.0; w.len()];
        }
        self.t += 1;
        let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
        let (c1, c2) = (1.0 - b1.powi(self.t), 1.0 - b2.powi(self.t));
        for i in 0..w.len() {
            self.m[i] = b1 * self.m[i] + (1.0 - b1) * g[i];
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * g[i] * g[i];
            w[i] -= LR * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + eps);
        }
    }
}

/// The unsharded model and what it computed for the current step.
struct Reference {
    params: Vec<LayerParams>,
    adam_dense: Adam,
    adam_expert: Adam,
    /// (dp rank, micro-batch) -> input of every layer and the output (L + 1 entries).
    acts: HashMap<(u64, u64), Vec<Mat>>,
    /// (dp rank, micro-batch) -> gradient of every layer's input and of the output.
    dacts: HashMap<(u64, u64), Vec<Mat>>,
    grads: Vec<LayerParams>,
}

struct Live {
    input: Mat,
    saved: Vec<Saved>,
    dy_last: Option<Mat>,
}

fn flatten(v: &[&Mat]) -> Vec<f32> {
    v.iter().flat_map(|m| m.data.iter().copied()).collect()
}

/// Copies `flat` back into `mats` in order: the inverse of [`flatten`].
fn unflatten<'a>(mats: impl IntoIterator<Item = &'a mut Mat>, flat: &[f32]) {
    let mut i = 0;
    for m in mats {
        let n = m.data.len();
        m.data.copy_from_slice(&flat[i..i + n]);
        i += n;
    }
}

/// A layer's dense or expert trainable tensors, mutably.
fn tensors_mut(lp: &mut LayerParams, expert: bool) -> Vec<&mut Mat> {
    if expert {
        lp.expert_mut()
    } else {
        lp.dense_mut()
    }
}

/// The same slices [`LayerParams::init`] takes, from full tensors.
fn shard_of(
    full: &LayerParams,
    d: &Dims,
    (t, tp): (usize, usize),
    (e, ep): (usize, usize),
    (et, etp): (usize, usize),
) -> LayerParams {
    let hl = d.heads * d.head_dim / tp;
    let full_h = d.heads * d.head_dim;
    let q = full.wqkv.cols_range(t * hl, (t + 1) * hl);
    let k = full.wqkv.cols_range(full_h + t * hl, full_h + (t + 1) * hl);
    let v = full
        .wqkv
        .cols_range(2 * full_h + t * hl, 2 * full_h + (t + 1) * hl);
    let fl = full.w1.cols / tp;
    let per = full.experts.len() / ep.max(1);
    let fe = d.expert_ffn / etp.max(1);
    LayerParams {
        wqkv: Mat::hstack(&[&q, &k, &v]),
        wo: full.wo.rows_range(t * hl, (t + 1) * hl),
        w1: full.w1.cols_range(t * fl, (t + 1) * fl),
        w2: full.w2.rows_range(t * fl, (t + 1) * fl),
        router: full.router.clone(),
        experts: full.experts[e * per..(e + 1) * per]
            .iter()
            .map(|(w1, w2)| {
                (
                    w1.cols_range(et * fe, (et + 1) * fe),
                    w2.rows_range(et * fe, (et + 1) * fe),
                )
            })
            .collect(),
    }
}

fn group(
    map: &sextant_planner::ranks::RankMap,
    name: &str,
    kind: Kind,
    rank: u64,
) -> Result<Group, String> {
    let k =
        sextant_planner::ranks::group_kind(name).ok_or_else(|| format!("no group kind {name}"))?;
    Group::new(kind, map.group_of(rank, k).to_vec(), rank)
}

impl<'a> Rank<'a> {
    fn err(&self, detail: impl Into<String>) -> ExecError {
        ExecError {
            rank: self.rank,
            phase: self.phase.clone(),
            detail: detail.into(),
        }
    }

    fn shard(&self) -> Shard<'_> {
        Shard {
            mesh: self.mesh,
            tp: &self.g.tp,
            cp: &self.g.cp,
            ep: &self.g.ep,
            etp: &self.g.etp,
            sp: self.s.cfg.sp,
            rec: &self.rec,
        }
    }

    fn check(&self, what: &str, got: &[f32], want: &[f32]) -> Result<f32, ExecError> {
        let e = rel_diff(got, want);
        if e.is_nan() || e > TOLERANCE {
            return Err(self.err(format!("{what} differs from the unsharded reference by {e:.2e} (tolerance {TOLERANCE:.0e}): the groups or collectives are wrong")));
        }
        self.rec
            .check(|c| c.max_rel_error = c.max_rel_error.max(e as f64));
        Ok(e)
    }

    /// This rank's rows of a full (positions x mbs) reference activation.
    fn own_rows(&self, full: &Mat) -> Mat {
        let mbs = self.s.dims.mbs;
        full.rows_range(self.own.0 * mbs, self.own.1 * mbs)
    }

    /// Known-data checks of every communicator this rank belongs to.
    fn self_test(&self) -> Result<(), ExecError> {
        let me = self.rank as f32;
        for g in [
            &self.g.tp,
            &self.g.cp,
            &self.g.dp_cp,
            &self.g.pp,
            &self.g.ep,
            &self.g.etp,
            &self.g.edp,
            &self.g.world,
        ] {
            let label = g.kind.label();
            let n = g.size();
            let members: Vec<f32> = g.members.iter().map(|&r| r as f32).collect();
            let got = g.all_gather(self.mesh, &[me]).map_err(|e| self.err(e))?;
            if got != members {
                return Err(self.err(format!("{label} group: members report ranks {got:?} but this rank expects {members:?}: the ranks disagree on the layout")));
            }
            let mut sum = vec![me, 1.0];
            g.all_reduce(self.mesh, &mut sum).map_err(|e| self.err(e))?;
            let want = [members.iter().sum::<f32>(), n as f32];
            if sum != want {
                return Err(self.err(format!(
                    "{label} all-reduce of known data gave {sum:?}, expected {want:?}"
                )));
            }
            let data: Vec<f32> = (0..3 * n).map(|j| me * 1000.0 + j as f32).collect();
            let got = g
                .reduce_scatter(self.mesh, &data)
                .map_err(|e| self.err(e))?;
            let want: Vec<f32> = (3 * g.me..3 * g.me + 3)
                .map(|j| members.iter().map(|r| r * 1000.0 + j as f32).sum())
                .collect();
            if got != want {
                return Err(self.err(format!(
                    "{label} reduce-scatter of known data gave {got:?}, expected {want:?}"
                )));
            }
            let parts: Vec<Vec<f32>> = (0..n).map(|j| vec![me * 100.0 + j as f32; j + 1]).collect();
            let got = g.all_to_all(self.mesh, parts).map_err(|e| self.err(e))?;
            for (i, part) in got.iter().enumerate() {
                if *part != vec![members[i] * 100.0 + g.me as f32; g.me + 1] {
                    return Err(self.err(format!(
                        "{label} all-to-all: part from member {i} is {part:?}"
                    )));
                }
            }
            self.rec.check(|c| c.collectives += 4);
        }
        Ok(())
    }

    /// The rank (in this rank's pipeline group) that runs model stage `vstage` for
    /// micro-batch `mb`: under DualPipe the second half of the micro-batches runs
    /// the pipeline from the other end.
    fn holder(&self, vstage: usize, mb: u64) -> u64 {
        let (r, _) = locate(
            self.s.schedule,
            self.s.cfg.pp,
            self.s.micro_batches,
            vstage as u64,
            mb,
        );
        self.g.pp.members[r as usize]
    }

    fn layers_of(&self, vstage: usize) -> std::ops::Range<usize> {
        self.s.first_layer[vstage]..self.s.first_layer[vstage] + self.s.stage_layers[vstage]
    }

    fn first_sample(&self, step: u64, dp: u64, mb: u64) -> u64 {
        ((step * self.s.micro_batches + mb) * self.s.cfg.dp + dp) * self.s.dims.mbs as u64
    }

    /// Runs the layers of `vstage` forward from `x`.
    fn forward_chunk(&self, vstage: usize, mut x: Mat) -> Result<(Mat, Vec<Saved>), ExecError> {
        let keep = self.s.cfg.recompute != Recompute::Selective;
        let mut saved = Vec::new();
        for l in self.layers_of(vstage) {
            let p = self.params[l].as_ref().expect("own layer");
            let (y, sv) = model::forward(
                &self.shard(),
                &self.s.dims,
                p,
                self.s.dims.moe_layer[l],
                &x,
                self.q0,
                keep,
            )
            .map_err(|e| self.err(e))?;
            x = y;
            saved.push(sv);
        }
        Ok((x, saved))
    }

    fn send(&self, to: u64, tag: u64, header: [f32; 4], m: &Mat) -> Result<(), ExecError> {
        let t = self.rec.start();
        let mut payload = header.to_vec();
        payload.extend_from_slice(&m.data);
        self.mesh
            .send(to, tag, &to_bytes(&payload))
            .map_err(|e| self.err(e))?;
        self.rec.comm("pp", "send_recv", 2, m.bytes(), t);
        Ok(())
    }

    fn recv(&self, from: u64, tag: u64, header: [f32; 4], rows: usize) -> Result<Mat, ExecError> {
        let t = self.rec.start();
        let v = from_bytes(&self.mesh.recv(from, tag).map_err(|e| self.err(e))?)
            .map_err(|e| self.err(e))?;
        if v.len() < 4 || v[..4] != header {
            return Err(self.err(format!("pipeline message from rank {from} is for (step, micro-batch, stage, backward) = {:?}, expected {header:?}", &v[..v.len().min(4)])));
        }
        self.rec.check(|c| c.p2p_messages += 1);
        let m =
            Mat::from_vec(rows, self.s.dims.hidden, v[4..].to_vec()).map_err(|e| self.err(e))?;
        self.rec.comm("pp", "send_recv", 2, m.bytes(), t);
        Ok(m)
    }

    fn run_reference(&mut self, step: u64) -> Result<(), ExecError> {
        let Some(mut r) = self.reference.take() else {
            return Ok(());
        };
        let d = &self.s.dims;
        let mesh = self.mesh;
        let solo = |k| Group::new(k, vec![self.rank], self.rank).expect("own group");
        let (tp, cp, ep, etp) = (
            solo(Kind::Tp),
            solo(Kind::Cp),
            solo(Kind::Ep),
            solo(Kind::Etp),
        );
        let quiet = Recorder::new(self.rank, false);
        let sh = Shard {
            mesh,
            tp: &tp,
            cp: &cp,
            ep: &ep,
            etp: &etp,
            sp: false,
            rec: &quiet,
        };
        let tokens = (d.seq * d.mbs) as f32 * (self.s.micro_batches * self.s.cfg.dp) as f32;
        let mut grads: Vec<LayerParams> = r.params.iter().map(LayerParams::zeros_like).collect();
        r.acts.clear();
        r.dacts.clear();
        for dp in 0..self.s.cfg.dp {
            for mb in 0..self.s.micro_batches {
                let mut x = input_rows(d, self.first_sample(step, dp, mb), (0, d.seq));
                let mut acts = vec![x.clone()];
                let mut saved = Vec::new();
                for l in 0..d.layers {
                    let (y, sv) = model::forward(&sh, d, &r.params[l], d.moe_layer[l], &x, 0, true)
                        .map_err(|e| self.err(e))?;
                    x = y;
                    acts.push(x.clone());
                    saved.push(sv);
                }
                let mut dy = x.clone();
                dy.scale(1.0 / tokens);
                let mut dacts = vec![dy.clone()];
                for l in (0..d.layers).rev() {
                    let mut jobs = Vec::new();
                    dy = model::backward(&sh, d, &r.params[l], l, &saved[l], &dy, 0, &mut jobs)
                        .map_err(|e| self.err(e))?;
                    for j in jobs {
                        model::run_wjob(&sh, &mut grads, 0, j);
                    }
                    dacts.push(dy.clone());
                }
                dacts.reverse();
                r.acts.insert((dp, mb), acts);
                r.dacts.insert((dp, mb), dacts);
            }
        }
        r.grads = grads;
        self.reference = Some(r);
        Ok(())
    }

    fn step(&mut self, step: u64) -> Result<(), ExecError> {
        let s = self.s;
        let (p, v, m) = (
            s.cfg.pp,
            if s.schedule == Schedule::Interleaved {
                s.cfg.vpp
            } else {
                1
            },
            s.micro_batches,
        );
        let last_vstage = s.stage_layers.len() - 1;
        let rows = (self.own.1 - self.own.0) * s.dims.mbs;
        let tokens = (s.dims.seq * s.dims.mbs) as f32 * (m * s.cfg.dp) as f32;
        self.phase = format!("step {step}, reference");
        self.run_reference(step)?;
        for g in self.grads.iter_mut().flatten() {
            *g = g.zeros_like();
        }
        self.phase = format!("step {step}, start barrier");
        self.g.world.barrier(self.mesh).map_err(|e| self.err(e))?;
        let t_step = Instant::now();
        let order = rank_order(s.schedule, p, v, m, self.pp_rank as u64);
        let mut live: HashMap<(u64, u64), Live> = HashMap::new();
        // Backward passes whose weight gradient the schedule runs later, as its own pass.
        let deferred: std::collections::HashSet<(u64, u64)> = order
            .iter()
            .filter(|o| o.0 == Pass::Weight)
            .map(|o| (o.1, o.2))
            .collect();
        let mut wjobs: HashMap<(u64, u64), Vec<WJob>> = HashMap::new();
        let (mut live_bytes, mut first_op) = (0usize, true);
        for (pass, c, mb) in order {
            let vstage = virtual_stage(s.schedule, p, v, self.pp_rank as u64, c) as usize;
            if s.schedule == Schedule::DualPipe && c != u64::from(mb >= m / 2) {
                return Err(self.err(format!(
                    "DualPipe runs micro-batch {mb} on chunk {c}, which is the other direction's"
                )));
            }
            if first_op {
                first_op = false;
            } else if self.o.die_at == Some((self.rank, step)) {
                // Testing hook: die abruptly in the middle of the step, as a killed
                // process would (no goodbye to the peers).
                eprintln!(
                    "rank {}: exiting abruptly in step {step} (--die-at testing hook)",
                    self.rank
                );
                std::process::exit(137);
            }
            let key_ref = (self.dp_rank, mb);
            match pass {
                Pass::Forward => {
                    self.phase =
                        format!("step {step}, forward of micro-batch {mb}, virtual stage {vstage}");
                    let header = [step as f32, mb as f32, vstage as f32, 0.0];
                    let x = if vstage == 0 {
                        input_rows(&s.dims, self.first_sample(step, self.dp_rank, mb), self.own)
                    } else {
                        self.recv(
                            self.holder(vstage - 1, mb),
                            pp_tag(step, false, vstage, mb),
                            header,
                            rows,
                        )?
                    };
                    let first = self.layers_of(vstage).start;
                    if let Some(r) = &self.reference {
                        self.check(
                            "stage input",
                            &x.data,
                            &self.own_rows(&r.acts[&key_ref][first]).data,
                        )?;
                        self.rec.check(|c| c.activations += 1);
                    }
                    self.gather(vstage)?;
                    let (y, saved) = self.forward_chunk(vstage, x.clone())?;
                    self.release(vstage);
                    let saved = if s.cfg.recompute == Recompute::Full {
                        Vec::new()
                    } else {
                        saved
                    };
                    live_bytes += x.bytes() + saved.iter().map(Saved::bytes).sum::<usize>();
                    let mut dy_last = None;
                    if vstage == last_vstage {
                        if let Some(r) = &self.reference {
                            self.check(
                                "model output",
                                &y.data,
                                &self.own_rows(&r.acts[&key_ref][s.dims.layers]).data,
                            )?;
                            self.rec.check(|c| c.activations += 1);
                        }
                        let mut dy = y;
                        dy.scale(1.0 / tokens);
                        dy_last = Some(dy);
                    } else {
                        self.send(
                            self.holder(vstage + 1, mb),
                            pp_tag(step, false, vstage + 1, mb),
                            [step as f32, mb as f32, (vstage + 1) as f32, 0.0],
                            &y,
                        )?;
                    }
                    live.insert(
                        (c, mb),
                        Live {
                            input: x,
                            saved,
                            dy_last,
                        },
                    );
                    let n = live.len() as u64;
                    self.rec.with(|st| {
                        st.peak_live_chunks = st.peak_live_chunks.max(n);
                        st.peak_activation_bytes = st.peak_activation_bytes.max(live_bytes as u64);
                    });
                }
                Pass::Backward => {
                    self.phase = format!(
                        "step {step}, backward of micro-batch {mb}, virtual stage {vstage}"
                    );
                    let entry = live.remove(&(c, mb)).ok_or_else(|| {
                        self.err("backward before its forward: the schedule is inconsistent")
                    })?;
                    let mut dy = match entry.dy_last {
                        Some(dy) => dy,
                        None => self.recv(
                            self.holder(vstage + 1, mb),
                            pp_tag(step, true, vstage, mb),
                            [step as f32, mb as f32, vstage as f32, 1.0],
                            rows,
                        )?,
                    };
                    let range = self.layers_of(vstage);
                    if let Some(r) = &self.reference {
                        self.check(
                            "stage output gradient",
                            &dy.data,
                            &self.own_rows(&r.dacts[&key_ref][range.end]).data,
                        )?;
                        self.rec.check(|c| c.gradients += 1);
                    }
                    self.gather(vstage)?;
                    let saved = if entry.saved.is_empty() {
                        let t = self.rec.start();
                        let out = self.forward_chunk(vstage, entry.input.clone())?.1;
                        self.rec.add("recompute", t);
                        out
                    } else {
                        entry.saved
                    };
                    live_bytes = live_bytes.saturating_sub(
                        entry.input.bytes() + saved.iter().map(Saved::bytes).sum::<usize>(),
                    );
                    let mut jobs = Vec::new();
                    for (i, l) in range.clone().enumerate().rev() {
                        let p = self.params[l].as_ref().expect("own layer");
                        dy = model::backward(
                            &self.shard(),
                            &s.dims,
                            p,
                            l,
                            &saved[i],
                            &dy,
                            self.q0,
                            &mut jobs,
                        )
                        .map_err(|e| self.err(e))?;
                    }
                    self.release(vstage);
                    if deferred.contains(&(c, mb)) {
                        wjobs.insert((c, mb), jobs);
                    } else {
                        self.run_jobs(jobs);
                    }
                    if vstage == 0 {
                        if let Some(r) = &self.reference {
                            self.check(
                                "input gradient",
                                &dy.data,
                                &self.own_rows(&r.dacts[&key_ref][0]).data,
                            )?;
                            self.rec.check(|c| c.gradients += 1);
                        }
                    } else {
                        self.send(
                            self.holder(vstage - 1, mb),
                            pp_tag(step, true, vstage - 1, mb),
                            [step as f32, mb as f32, (vstage - 1) as f32, 1.0],
                            &dy,
                        )?;
                    }
                }
                Pass::Weight => {
                    self.phase = format!("step {step}, weight gradient of micro-batch {mb}");
                    let jobs = wjobs
                        .remove(&(c, mb))
                        .ok_or_else(|| self.err("weight-gradient pass before its backward"))?;
                    self.run_jobs(jobs);
                }
            }
        }
        if !live.is_empty() {
            return Err(self.err(format!(
                "{} forward passes never got their backward",
                live.len()
            )));
        }
        if !wjobs.is_empty() {
            return Err(self.err(format!(
                "{} deferred weight-gradient passes never ran",
                wjobs.len()
            )));
        }
        if s.schedule == Schedule::DualPipe {
            self.phase = format!("step {step}, DualPipe mirror gradient sum");
            self.sum_mirror_gradients(step)?;
        }
        self.phase = format!("step {step}, gradient reduction and optimizer");
        self.optimize()?;
        let secs = t_step.elapsed().as_secs_f64();
        self.rec.step_time(secs);
        Ok(())
    }

    /// DualPipe holds every stage twice (rank r and rank p-1-r): the two copies' weight
    /// gradients are summed between the mirror ranks before the data-parallel reduction.
    fn sum_mirror_gradients(&mut self, step: u64) -> Result<(), ExecError> {
        let p = self.s.cfg.pp as usize;
        let partner = self.g.pp.members[p - 1 - self.pp_rank];
        // Every dense tensor of the held layers, then every expert tensor.
        let held = || self.grads.iter().flatten();
        let flat: Vec<f32> = held()
            .flat_map(|g| flatten(&g.dense()))
            .chain(held().flat_map(|g| flatten(&g.expert())))
            .collect();
        let tag = ((Kind::Pp as u64) << 56) | (step << 44) | ((1 << 30) - 1);
        let t = self.rec.start();
        self.mesh
            .send(partner, tag, &to_bytes(&flat))
            .map_err(|e| self.err(e))?;
        let theirs = from_bytes(&self.mesh.recv(partner, tag).map_err(|e| self.err(e))?)
            .map_err(|e| self.err(e))?;
        if theirs.len() != flat.len() {
            return Err(self.err(format!("mirror rank {partner} holds {} gradient values, this rank {}: the stages are not mirrored", theirs.len(), flat.len())));
        }
        self.rec.comm("dp_grad", "all_reduce", 2, flat.len() * 4, t);
        let summed: Vec<f32> = flat.iter().zip(&theirs).map(|(a, b)| a + b).collect();
        let dense_len: usize = self
            .grads
            .iter()
            .flatten()
            .map(|g| g.dense().iter().map(|m| m.data.len()).sum::<usize>())
            .sum();
        unflatten(
            self.grads
                .iter_mut()
                .flatten()
                .flat_map(|g| tensors_mut(g, false)),
            &summed[..dense_len],
        );
        unflatten(
            self.grads
                .iter_mut()
                .flatten()
                .flat_map(|g| tensors_mut(g, true)),
            &summed[dense_len..],
        );
        Ok(())
    }

    fn run_jobs(&mut self, jobs: Vec<WJob>) {
        let sh = Shard {
            mesh: self.mesh,
            tp: &self.g.tp,
            cp: &self.g.cp,
            ep: &self.g.ep,
            etp: &self.g.etp,
            sp: self.s.cfg.sp,
            rec: &self.rec,
        };
        for j in jobs {
            let l = j.layer;
            if let Some(g) = self.grads[l].as_mut() {
                model::run_wjob(&sh, std::slice::from_mut(g), l, j);
            }
        }
    }

    /// The units parameters are sharded, gathered and stepped in: all own layers
    /// at once, or with ZeRO-3 each held virtual stage.
    fn units(&self) -> Vec<Vec<usize>> {
        if self.s.cfg.zero == Zero::Zero3 {
            self.vstages
                .iter()
                .map(|&v| self.layers_of(v).collect::<Vec<_>>())
                .filter(|u| !u.is_empty())
                .collect()
        } else {
            vec![(0..self.s.dims.layers)
                .filter(|&l| self.params[l].is_some())
                .collect()]
        }
    }

    /// The replica group and the parameter class of one side (dense or expert).
    fn side(&self, expert: bool) -> (&Group, fn(&LayerParams) -> Vec<f32>) {
        if expert {
            (&self.g.edp, |lp| flatten(&lp.expert()))
        } else {
            (&self.g.dp_cp, |lp| flatten(&lp.dense()))
        }
    }

    /// One side of `unit`'s layers from `of` (parameters or gradients), flattened.
    fn flat(
        of: &[Option<LayerParams>],
        unit: &[usize],
        pick: fn(&LayerParams) -> Vec<f32>,
    ) -> Vec<f32> {
        unit.iter()
            .flat_map(|&l| pick(of[l].as_ref().expect("own layer")))
            .collect()
    }

    /// Writes `flat` back into the layers of `unit` (one side).
    fn store(&mut self, unit: &[usize], expert: bool, flat: &[f32]) {
        unflatten(
            self.params
                .iter_mut()
                .enumerate()
                .filter(|(l, _)| unit.contains(l))
                .filter_map(|(_, p)| p.as_mut())
                .flat_map(|lp| tensors_mut(lp, expert)),
            flat,
        );
    }

    /// ZeRO-3: all-gathers the parameters of `vstage` from the replica group
    /// before a pass uses them, and checks them against the reference.
    fn gather(&mut self, vstage: usize) -> Result<(), ExecError> {
        if self.s.cfg.zero != Zero::Zero3 {
            return Ok(());
        }
        let unit: Vec<usize> = self.layers_of(vstage).collect();
        for expert in [false, true] {
            let (g, pick) = self.side(expert);
            let n = g.size();
            let mut flat = Self::flat(&self.params, &unit, pick);
            if flat.is_empty() || n == 1 {
                continue;
            }
            let t = self.rec.start();
            g.all_gather_chunks(self.mesh, &mut flat)
                .map_err(|e| self.err(e))?;
            self.rec.comm(
                if expert { "edp_param" } else { "dp_param" },
                "all_gather",
                n,
                flat.len() * 4,
                t,
            );
            if let Some(r) = &self.reference {
                let (d, tp, ep, etp) = (
                    &self.s.dims,
                    (self.g.tp.me, self.g.tp.size()),
                    (self.g.ep.me, self.g.ep.size()),
                    (self.g.etp.me, self.g.etp.size()),
                );
                let want: Vec<f32> = unit
                    .iter()
                    .flat_map(|&l| pick(&shard_of(&r.params[l], d, tp, ep, etp)))
                    .collect();
                self.check("parameters gathered for a pass (ZeRO-3)", &flat, &want)?;
                self.rec.check(|c| c.param_gathers += 1);
            }
            self.store(&unit, expert, &flat);
        }
        Ok(())
    }

    /// ZeRO-3: drops the parameters of `vstage` that other replicas own. They are
    /// overwritten with NaN, so a pass that ran without its gather could not pass
    /// the reference checks.
    fn release(&mut self, vstage: usize) {
        if self.s.cfg.zero != Zero::Zero3 {
            return;
        }
        let unit: Vec<usize> = self.layers_of(vstage).collect();
        for expert in [false, true] {
            let (g, pick) = self.side(expert);
            let (n, me) = (g.size(), g.me);
            let mut flat = Self::flat(&self.params, &unit, pick);
            let (a, b) = (flat.len() * me / n, flat.len() * (me + 1) / n);
            flat[..a].fill(f32::NAN);
            flat[b..].fill(f32::NAN);
            self.store(&unit, expert, &flat);
        }
    }

    /// Reduces gradients over the replicas and takes an Adam step (sharded with the
    /// distributed optimizer and ZeRO-3); checks against the reference and across
    /// replicas.
    fn optimize(&mut self) -> Result<(), ExecError> {
        let sharded = self.s.cfg.zero != Zero::None;
        let zero3 = self.s.cfg.zero == Zero::Zero3;
        let units = self.units();
        for expert in [false, true] {
            let (kind_grad, kind_param) = if expert {
                ("edp_grad", "edp_param")
            } else {
                ("dp_grad", "dp_param")
            };
            let (_, pick) = self.side(expert);
            // The unsharded reference: this rank's shard of the reduced gradient,
            // then the whole model's step and this rank's shard of its weights.
            let mut want = None;
            if let Some(r) = &mut self.reference {
                let d = &self.s.dims;
                let (tp, ep, etp) = (
                    (self.g.tp.me, self.g.tp.size()),
                    (self.g.ep.me, self.g.ep.size()),
                    (self.g.etp.me, self.g.etp.size()),
                );
                let of = |lps: &[LayerParams], u: &[usize]| -> Vec<f32> {
                    u.iter()
                        .flat_map(|&l| pick(&shard_of(&lps[l], d, tp, ep, etp)))
                        .collect()
                };
                let want_g: Vec<Vec<f32>> = units.iter().map(|u| of(&r.grads, u)).collect();
                let mut full_w: Vec<f32> = r.params.iter().flat_map(pick).collect();
                let full_g: Vec<f32> = r.grads.iter().flat_map(pick).collect();
                let adam = if expert {
                    &mut r.adam_expert
                } else {
                    &mut r.adam_dense
                };
                adam.step(&mut full_w, &full_g);
                unflatten(
                    r.params.iter_mut().flat_map(|lp| tensors_mut(lp, expert)),
                    &full_w,
                );
                let want_w: Vec<Vec<f32>> = units.iter().map(|u| of(&r.params, u)).collect();
                want = Some((want_g, want_w));
            }
            for (ui, unit) in units.iter().enumerate() {
                let (g, _) = self.side(expert);
                let mut flat_g = Self::flat(&self.grads, unit, pick);
                let mut flat_w = Self::flat(&self.params, unit, pick);
                if flat_w.is_empty() {
                    continue;
                }
                let n = g.size();
                let split = sharded && n > 1;
                let (a, b) = if split {
                    (flat_w.len() * g.me / n, flat_w.len() * (g.me + 1) / n)
                } else {
                    (0, flat_w.len())
                };
                let t = self.rec.start();
                let part = if split {
                    let part = g
                        .reduce_scatter(self.mesh, &flat_g)
                        .map_err(|e| self.err(e))?;
                    self.rec
                        .comm(kind_grad, "reduce_scatter", n, flat_g.len() * 4, t);
                    part
                } else {
                    if n > 1 {
                        g.all_reduce(self.mesh, &mut flat_g)
                            .map_err(|e| self.err(e))?;
                        self.rec
                            .comm(kind_grad, "all_reduce", n, flat_g.len() * 4, t);
                    }
                    flat_g
                };
                if let Some((want_g, _)) = &want {
                    let e = rel_diff(&part, &want_g[ui][a..b]);
                    if e.is_nan() || e > TOLERANCE {
                        return Err(self.err(format!(
                            "{} weight gradients differ from the reference by {e:.2e}",
                            if expert { "expert" } else { "dense" }
                        )));
                    }
                    self.rec.check(|c| {
                        c.gradients += 1;
                        c.max_rel_error = c.max_rel_error.max(e as f64);
                    });
                }
                let t = self.rec.start();
                self.adam
                    .entry((expert, ui))
                    .or_default()
                    .step(&mut flat_w[a..b], &part);
                self.rec.add("optimizer", t);
                if split && !zero3 {
                    let t = self.rec.start();
                    let (g, _) = self.side(expert);
                    g.all_gather_chunks(self.mesh, &mut flat_w)
                        .map_err(|e| self.err(e))?;
                    self.rec
                        .comm(kind_param, "all_gather", n, flat_w.len() * 4, t);
                }
                self.store(unit, expert, &flat_w);
                if let Some((_, want_w)) = &want {
                    self.check(
                        "weights after the optimizer step",
                        &flat_w[a..b],
                        &want_w[ui][a..b],
                    )?;
                }
                if zero3 {
                    // Replicas hold different shares; the next pass's gather checks
                    // the assembled weights against the reference.
                    continue;
                }
                let (g, _) = self.side(expert);
                let sum: f64 = flat_w.iter().map(|&x| x as f64).sum();
                let sq: f64 = flat_w.iter().map(|&x| (x as f64) * (x as f64)).sum();
                let digest = [sum as f32, sq as f32, flat_w[0], flat_w[flat_w.len() - 1]];
                let all = g.all_gather(self.mesh, &digest).map_err(|e| self.err(e))?;
                if all.chunks(4).any(|c| {
                    c.iter()
                        .zip(&digest)
                        .any(|(x, y)| x.to_bits() != y.to_bits())
                }) {
                    return Err(self.err(format!(
                        "{} replicas hold different weights after the step",
                        g.kind.label()
                    )));
                }
                self.rec.check(|c| c.replicas += 1);
            }
        }
        Ok(())
    }
}

/// The skeleton of a measured run, before any measurement.
fn run_header(s: &Setup, o: &Options, backend: &str, device: &str, world: u64) -> MeasuredRun {
    MeasuredRun {
        schema_version: RUN_SCHEMA_VERSION,
        generator: format!("sextant {}", env!("CARGO_PKG_VERSION")),
        complete: false,
        failure: None,
        backend: backend.into(),
        device: device.into(),
        plan_hash: format!("{:016x}", s.plan_hash),
        plan_rank: o.plan_rank,
        profile: s.profile.clone(),
        model: s.model.clone(),
        workload: s.workload.clone(),
        config: s.cfg.clone(),
        schedule: format!("{:?}", s.schedule),
        world_size: world,
        gpus_per_node: s.gpus_per_node,
        warmup_steps: o.warmup,
        steps: o.steps,
        step_secs: vec![],
        components: Default::default(),
        gemms: vec![],
        collectives: vec![],
        peak_live_chunks: vec![],
        peak_activation_bytes: 0,
        param_bytes: 0,
        optimizer_bytes: 0,
        checks: RunChecks::default(),
        device_memory: vec![],
    }
}

/// What rank 0 writes when the run failed: no numbers, and the reason.
pub fn incomplete_run(
    s: &Setup,
    o: &Options,
    backend: &str,
    device: &str,
    world: u64,
    failure: &str,
) -> MeasuredRun {
    let mut r = run_header(s, o, backend, device, world);
    r.failure = Some(failure.to_string());
    r
}

fn median(v: &[f64]) -> f64 {
    sextant_planner::calibration::median(v).unwrap_or(0.0)
}

/// Merges every rank's statistics into the measured run (rank 0).
fn merge(
    s: &Setup,
    o: &Options,
    (backend, dtype): (&str, &str),
    device: &str,
    all: &[RankStats],
    world: u64,
    tier_of: impl Fn(&str) -> String,
) -> MeasuredRun {
    let mut run = run_header(s, o, backend, device, world);
    let steps = o.steps.max(1) as f64;
    run.complete = true;
    let nsteps = all.iter().map(|r| r.step_secs.len()).max().unwrap_or(0);
    run.step_secs = (0..nsteps)
        .map(|i| {
            all.iter()
                .filter_map(|r| r.step_secs.get(i))
                .fold(0.0, |a: f64, &b| a.max(b))
        })
        .collect();
    for r in all {
        for (k, v) in &r.components {
            let e = run.components.entry(k.clone()).or_insert(0.0);
            *e = e.max(v / steps);
        }
    }
    let mut gemms: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut calls: std::collections::BTreeMap<&str, u64> = Default::default();
    for r in all {
        for (k, smp) in &r.gemms {
            gemms.entry(k).or_default().extend(&smp.secs);
            *calls.entry(k).or_default() =
                calls.get(k.as_str()).copied().unwrap_or(0).max(smp.calls);
        }
    }
    for (k, secs) in gemms {
        let f: Vec<&str> = k.split(' ').collect();
        let (m, n, kk) = (
            f[1].parse().unwrap_or(0u64),
            f[2].parse().unwrap_or(0u64),
            f[3].parse().unwrap_or(0u64),
        );
        let med = median(&secs);
        run.gemms.push(GemmPoint {
            class: f[0].into(),
            m,
            n,
            k: kk,
            dtype: dtype.into(),
            calls: (calls[k] as f64 / steps).round() as u64,
            median_secs: med,
            tflops: if med > 0.0 {
                2.0 * (m * n * kk) as f64 / med / 1e12
            } else {
                0.0
            },
        });
    }
    let mut comms: std::collections::BTreeMap<&str, (Vec<f64>, u64)> = Default::default();
    for r in all {
        for (k, smp) in &r.comms {
            let e = comms.entry(k).or_default();
            e.0.extend(&smp.secs);
            e.1 = e.1.max(smp.calls);
        }
    }
    for (k, (secs, c)) in comms {
        let f: Vec<&str> = k.split(' ').collect();
        let (ranks, bytes) = (
            f[2].parse().unwrap_or(1u64),
            f[3].parse().unwrap_or(0u64) as f64,
        );
        let med = median(&secs);
        let nf = ranks as f64;
        // nccl-tests bus-bandwidth factors.
        let factor = match f[1] {
            "all_reduce" => 2.0 * (nf - 1.0) / nf,
            "all_gather" | "reduce_scatter" | "all_to_all" => (nf - 1.0) / nf,
            _ => 1.0,
        };
        run.collectives.push(CommPoint {
            kind: f[0].into(),
            op: f[1].into(),
            ranks,
            bytes,
            tier: tier_of(f[0]),
            calls: (c as f64 / steps).round() as u64,
            median_secs: med,
            busbw_gbytes_per_s: if med > 0.0 {
                bytes * factor / med / 1e9
            } else {
                0.0
            },
        });
    }
    run.peak_activation_bytes = all
        .iter()
        .map(|r| r.peak_activation_bytes)
        .max()
        .unwrap_or(0);
    run.param_bytes = all.iter().map(|r| r.param_bytes).max().unwrap_or(0);
    run.optimizer_bytes = all.iter().map(|r| r.optimizer_bytes).max().unwrap_or(0);
    run.device_memory = all.iter().filter_map(|r| r.device_memory.clone()).collect();
    for r in all {
        let c = &r.checks;
        run.checks.activations += c.activations;
        run.checks.gradients += c.gradients;
        run.checks.collectives += c.collectives;
        run.checks.replicas += c.replicas;
        run.checks.p2p_messages += c.p2p_messages;
        run.checks.param_gathers += c.param_gathers;
        run.checks.gemm_results += c.gemm_results;
        run.checks.max_rel_error = run.checks.max_rel_error.max(c.max_rel_error);
    }
    run
}

/// Sends this rank's statistics to rank 0, which merges every rank's into the
/// measured run and returns it (the others return `None`). `backend` and `dtype`
/// label the run and its GEMMs.
pub fn collect(
    s: &Setup,
    o: &Options,
    mesh: &Mesh,
    map: &sextant_planner::ranks::RankMap,
    stats: RankStats,
    (backend, dtype): (&str, &str),
    device: &str,
) -> Result<Option<MeasuredRun>, String> {
    let (rank, world) = (mesh.rank(), mesh.world());
    if rank != 0 {
        let bytes = serde_json::to_vec(&stats).map_err(|e| e.to_string())?;
        mesh.send(0, STATS_TAG, &bytes)?;
        return Ok(None);
    }
    let mut all = vec![stats];
    for q in 1..world {
        let bytes = mesh.recv(q, STATS_TAG)?;
        all.push(
            serde_json::from_slice(&bytes)
                .map_err(|e| format!("rank {q} sent unreadable measurements: {e}"))?,
        );
    }
    let gpn = s.gpus_per_node.max(1);
    let spans_nodes = |kind: &str| -> bool {
        let name = match kind {
            "dp_grad" | "dp_param" => "dp_cp",
            "edp_grad" | "edp_param" => "edp",
            k => k,
        };
        let Some(k) = sextant_planner::ranks::group_kind(name) else {
            return false;
        };
        map.groups[k]
            .1
            .iter()
            .any(|g| g.iter().any(|&q| q / gpn != g[0] / gpn))
    };
    let cpu = backend == "cpu";
    let mut run = merge(s, o, (backend, dtype), device, &all, world, |kind| {
        if cpu {
            "loopback".into()
        } else if spans_nodes(kind) {
            "network".into()
        } else {
            "nvlink".into()
        }
    });
    run.peak_live_chunks = vec![0; s.cfg.pp as usize];
    for st in &all {
        let p = map.ranks[st.rank as usize].pp as usize;
        run.peak_live_chunks[p] = run.peak_live_chunks[p].max(st.peak_live_chunks);
    }
    Ok(Some(run))
}

/// Runs this rank's part of the plan over `mesh`. Rank 0 returns the measured run.
pub fn run(
    s: &Setup,
    o: &Options,
    mesh: &Mesh,
    device: &str,
) -> Result<Option<MeasuredRun>, ExecError> {
    let rank = mesh.rank();
    let world = mesh.world();
    let early = |d: String| ExecError {
        rank,
        phase: "setting up groups".into(),
        detail: d,
    };
    if world != s.cfg.gpus() {
        return Err(early(format!(
            "the plan needs {} ranks (tp x cp x dp x pp) but {world} were started",
            s.cfg.gpus()
        )));
    }
    let map = s.rank_map().map_err(early)?;
    let g = Groups {
        tp: group(&map, "tp", Kind::Tp, rank).map_err(early)?,
        cp: group(&map, "cp", Kind::Cp, rank).map_err(early)?,
        dp_cp: group(&map, "dp_cp", Kind::DpCp, rank).map_err(early)?,
        pp: group(&map, "pp", Kind::Pp, rank).map_err(early)?,
        ep: group(&map, "ep", Kind::Ep, rank).map_err(early)?,
        etp: group(&map, "etp", Kind::Etp, rank).map_err(early)?,
        edp: group(&map, "edp", Kind::Edp, rank).map_err(early)?,
        world: Group::new(Kind::World, (0..world).collect(), rank).map_err(early)?,
    };
    let entry = &map.ranks[rank as usize];
    let d = &s.dims;
    let (tp, cp) = (s.cfg.tp as usize, s.cfg.cp as usize);
    let chunk = d.seq / cp;
    let q0 = entry.cp as usize * chunk;
    let own = if s.cfg.sp {
        (
            q0 + entry.tp as usize * chunk / tp,
            q0 + (entry.tp as usize + 1) * chunk / tp,
        )
    } else {
        (q0, q0 + chunk)
    };
    let pp_rank = entry.pp as usize;
    let v = if s.schedule == Schedule::Interleaved {
        s.cfg.vpp
    } else {
        1
    };
    let mut params: Vec<Option<LayerParams>> = vec![None; d.layers];
    let vstages: Vec<usize> = (0..s.schedule.chunks_per_rank(v))
        .map(|c| virtual_stage(s.schedule, s.cfg.pp, v, pp_rank as u64, c) as usize)
        .collect();
    for &vs in &vstages {
        for (l, slot) in params
            .iter_mut()
            .enumerate()
            .skip(s.first_layer[vs])
            .take(s.stage_layers[vs])
        {
            *slot = Some(LayerParams::init(
                d,
                l,
                (entry.tp as usize, tp),
                (g.ep.me, g.ep.size()),
                (g.etp.me, g.etp.size()),
            ));
        }
    }
    let grads = params
        .iter()
        .map(|p| p.as_ref().map(LayerParams::zeros_like))
        .collect();
    let reference = o.verify.then(|| Reference {
        params: (0..d.layers)
            .map(|l| LayerParams::init(d, l, (0, 1), (0, 1), (0, 1)))
            .collect(),
        adam_dense: Adam::default(),
        adam_expert: Adam::default(),
        acts: HashMap::new(),
        dacts: HashMap::new(),
        grads: vec![],
    });
    let bytes_of = |mats: Vec<&Mat>| mats.iter().map(|m| m.bytes()).sum::<usize>();
    let (dense_bytes, expert_bytes) = params.iter().flatten().fold((0, 0), |(a, b), p| {
        (a + bytes_of(p.dense()), b + bytes_of(p.expert()))
    });
    // ZeRO-3 keeps only this rank's share between uses.
    let param_bytes = if s.cfg.zero == Zero::Zero3 {
        dense_bytes / g.dp_cp.size() + expert_bytes / g.edp.size()
    } else {
        dense_bytes + expert_bytes
    };
    let mut r = Rank {
        s,
        o,
        mesh,
        rank,
        g,
        dp_rank: entry.dp,
        pp_rank,
        rec: Recorder::new(rank, false),
        params,
        grads,
        vstages,
        adam: HashMap::new(),
        reference,
        phase: "start-up collective checks".into(),
        q0,
        own,
    };
    r.self_test()?;
    for vs in r.vstages.clone() {
        r.release(vs);
    }
    for step in 0..o.warmup + o.steps {
        r.rec.set_enabled(step >= o.warmup);
        r.step(step)?;
    }
    r.phase = "gathering measurements".into();
    let opt_bytes = r
        .adam
        .values()
        .map(|a| a.m.len() + a.v.len())
        .sum::<usize>()
        * 4;
    let mut stats = std::mem::replace(&mut r.rec, Recorder::new(rank, false)).take();
    stats.param_bytes = param_bytes as u64;
    stats.optimizer_bytes = opt_bytes as u64;
    let out = collect(s, o, mesh, &map, stats, ("cpu", "f32"), device).map_err(|e| r.err(e))?;
    r.phase = "final barrier".into();
    r.g.world.barrier(mesh).map_err(|e| r.err(e))?;
    let unmatched = mesh.unmatched();
    if !unmatched.is_empty() {
        let (from, tag, n) = unmatched[0];
        return Err(r.err(format!("{} message(s) were sent here and never received, e.g. {n} from rank {from} with tag {tag:#x}: a send without a matching receive", unmatched.len())));
    }
    Ok(out)
}
