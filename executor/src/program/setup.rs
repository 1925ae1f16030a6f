//! Preparing a run: the executed sizes, layout and micro-batches derived from the
//! plan alone, and what the executor refuses to run.

use sextant_planner::config::{Layout, ParallelConfig, Workload};
use sextant_planner::model::ModelSpec;
use sextant_planner::plan::PlanFile;
use sextant_planner::ranks::rank_map;
use sextant_planner::schedule::Schedule;
use sextant_planner::walk;

use super::Options;
use crate::error::SetupError;
use crate::model::Dims;

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
    /// The executed sizes as the planner's walk takes them.
    pub fn walk_dims(&self) -> walk::Dims {
        let d = &self.dims;
        let n = |x: usize| x as u64;
        walk::Dims {
            hidden: n(d.hidden),
            heads: n(d.heads),
            kv_heads: n(d.kv_heads),
            head_dim: n(d.head_dim),
            ffn: n(d.ffn),
            experts: n(d.experts),
            top_k: n(d.top_k),
            expert_ffn: n(d.expert_ffn),
            seq: n(d.seq),
            mbs: n(d.mbs),
        }
    }

    /// This plan's step as the planner's walk takes it (at the sizes `dims`, from
    /// [`Self::walk_dims`]).
    pub fn walk<'a>(&'a self, dims: &'a walk::Dims) -> walk::Step<'a> {
        walk::Step {
            cfg: &self.cfg,
            model: &self.model,
            workload: &self.workload,
            dims,
            moe_layer: &self.dims.moe_layer,
            schedule: self.schedule,
            micro_batches: self.micro_batches,
            stage_layers: &self.stage_layers,
            first_layer: &self.first_layer,
        }
    }

    /// The plan's rank map: every rank's coordinates and groups.
    pub fn rank_map(&self) -> Result<sextant_planner::ranks::RankMap, SetupError> {
        rank_map(&self.cfg, &self.rank_order, self.gpus_per_node.max(1))
            .map_err(|e| SetupError::RankMap(e.to_string()))
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
fn rescale(counts: &[u64], n: usize) -> Result<Vec<usize>, SetupError> {
    let k = counts.len();
    if n < k {
        return Err(SetupError::FewerLayersThanStages {
            layers: n,
            stages: k,
        });
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
pub fn prepare(plan: &PlanFile, hash: u64, o: &Options) -> Result<Setup, SetupError> {
    let ranked = plan
        .plans
        .get(o.plan_rank.wrapping_sub(1))
        .ok_or(SetupError::NoSuchPlan {
            rank: o.plan_rank,
            count: plan.plans.len(),
        })?;
    let cfg = ranked.config.clone();
    let m0 = &plan.model;
    if m0.mla.is_some() && o.full_size {
        return Err(SetupError::FullSizeMla);
    }
    let schedule = cfg.schedule;
    let (layers, stage_layers) = layer_split(&cfg, m0, o)?;
    let mut first_layer = vec![0usize; stage_layers.len()];
    for i in 1..stage_layers.len() {
        first_layer[i] = first_layer[i - 1] + stage_layers[i - 1];
    }
    let dims = executed_dims(plan, &cfg, layers, o.full_size);
    check_divisible(&dims, &cfg)?;
    check_sizes(&dims, &cfg)?;
    let m = micro_batches(plan, &cfg, o, stage_layers.len())?;
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

/// Bytes above which no GPU holds one micro-batch's tensor (1 PiB). Below it every
/// size the walk multiplies out (a GEMM's rows x width, a collective's bytes)
/// stays far inside u64.
const MAX_TENSOR_BYTES: u64 = 1 << 50;

/// Refuses sizes whose single micro-batch tensors no GPU could hold: a plan file's
/// sequence and micro-batch are each within range, but their product is not
/// bounded, and the program's sizes would wrap around u64.
fn check_sizes(d: &Dims, cfg: &ParallelConfig) -> Result<(), SetupError> {
    let n = |x: usize| x as u64;
    let width = [
        n(d.hidden),
        n(d.ffn) * 2,
        n(d.heads.max(d.kv_heads)) * n(d.head_dim) * 3,
        n(d.experts),
        n(d.expert_ffn) * 2 * n(d.top_k.max(1)),
        n(d.hidden) * n(d.top_k.max(1)),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let tokens = n(d.mbs).checked_mul(n(d.seq));
    let activation = tokens.and_then(|t| t.checked_mul(width)?.checked_mul(4));
    // The walk's attention core per rank: its heads, its CP chunk of queries
    // against half a chunk of keys.
    let chunk = n(d.seq) / cfg.cp.max(1);
    let scores = n(d.mbs)
        .checked_mul(n(d.heads) / cfg.tp.max(1))
        .and_then(|x| x.checked_mul(chunk)?.checked_mul(chunk / 2)?.checked_mul(4));
    for (what, bytes) in [
        ("widest activation", activation),
        ("attention scores", scores),
    ] {
        if bytes.is_none_or(|b| b > MAX_TENSOR_BYTES) {
            return Err(SetupError::TooLarge {
                what,
                mbs: d.mbs,
                seq: d.seq,
            });
        }
    }
    Ok(())
}

/// The executed layer count and its split over the virtual stages: the plan's own
/// at full size, otherwise `--scale-layers` (default: two per virtual stage, at
/// most the model's) split in proportion to the plan's layout.
fn layer_split(
    cfg: &ParallelConfig,
    m0: &ModelSpec,
    o: &Options,
) -> Result<(usize, Vec<usize>), SetupError> {
    let (p, v) = (cfg.pp as usize, cfg.vpp as usize);
    let plan_counts = cfg
        .stage_layers(m0.layers)
        .map_err(|r| SetupError::Layout(r.to_string()))?;
    let layers = match o.scale_layers {
        Some(n) => n as usize,
        None if o.full_size => m0.layers as usize,
        None => (2 * p * v).min(m0.layers as usize).max(p * v),
    };
    if layers == 0 || layers > 100_000 {
        return Err(SetupError::Layers {
            layers,
            min: p * v,
            max: m0.layers,
        });
    }
    let stage_layers = if layers as u64 == m0.layers {
        plan_counts.iter().map(|&c| c as usize).collect()
    } else {
        rescale(&plan_counts, layers)?
    };
    Ok((layers, stage_layers))
}

/// The executed sizes: the model's own at full size, otherwise small ones that
/// keep every split of the plan (heads and FFN by tp, sequence by cp x tp, experts
/// by ep, expert FFN by etp).
fn executed_dims(plan: &PlanFile, cfg: &ParallelConfig, layers: usize, full_size: bool) -> Dims {
    let m0 = &plan.model;
    let (tp, cp) = (cfg.tp as usize, cfg.cp as usize);
    let moe_layer: Vec<bool> = (0..layers)
        .map(|i| m0.is_moe_layer((i as u64 * m0.layers) / layers as u64))
        .collect();
    if full_size {
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
    }
}

/// Refuses sizes the plan's splits do not divide.
// `%` kept as `prepare` had it: `is_multiple_of` would not panic on a degree of 0.
#[allow(clippy::manual_is_multiple_of)]
fn check_divisible(dims: &Dims, cfg: &ParallelConfig) -> Result<(), SetupError> {
    let (tp, cp, etp) = (cfg.tp as usize, cfg.cp as usize, cfg.etp as usize);
    if dims.heads % tp != 0
        || dims.ffn % tp != 0
        || dims.seq % (cp * tp) != 0
        || (dims.experts > 0 && (dims.experts % cfg.ep as usize != 0 || dims.expert_ffn % etp != 0))
    {
        return Err(SetupError::Indivisible {
            heads: dims.heads,
            ffn: dims.ffn,
            tp,
            seq: dims.seq,
            experts: dims.experts,
            ep: cfg.ep,
            expert_ffn: dims.expert_ffn,
            etp,
        });
    }
    Ok(())
}

/// The message tags' bounds: micro-batches per step, steps (timed and warm-up)
/// and virtual stages must each fit their field of a tag.
const MAX_MICRO_BATCHES: u64 = 1 << 20;
const MAX_STEPS: u64 = 4096;
const MAX_STAGES: usize = 8192;

/// The executed micro-batches per step: `--micro-batches`, the plan's at full size,
/// otherwise at most two per pipeline stage; rounded up to a multiple of pp for the
/// interleaved schedule where not given. Refuses counts beyond the message tags'
/// bounds (with the steps and the `stages` virtual stages).
fn micro_batches(
    plan: &PlanFile,
    cfg: &ParallelConfig,
    o: &Options,
    stages: usize,
) -> Result<u64, SetupError> {
    let plan_m = cfg.micro_batches(&plan.workload);
    let mut m = match o.micro_batches {
        Some(m) => m,
        None if o.full_size => plan_m,
        None => plan_m.min(2 * cfg.pp).max(1),
    };
    // The tag bounds first: a count beyond them gets no interleaving suggestion.
    if let Some(why) = tag_bounds(m, o, stages) {
        return Err(SetupError::TagBounds(why));
    }
    if cfg.schedule == Schedule::Interleaved && !m.is_multiple_of(cfg.pp) {
        let up = m.div_ceil(cfg.pp) * cfg.pp;
        if o.micro_batches.is_some() {
            let down = m / cfg.pp * cfg.pp;
            return Err(SetupError::Interleaved {
                pp: cfg.pp,
                micro_batches: m,
                suggest: if up < MAX_MICRO_BATCHES || down == 0 {
                    up
                } else {
                    down
                },
            });
        }
        m = up;
    }
    match tag_bounds(m, o, stages) {
        Some(why) => Err(SetupError::TagBounds(why)),
        None => Ok(m),
    }
}

/// Which bound of the message tags `m` micro-batches per step, the steps of `o`
/// and `stages` virtual stages cross, in words naming the flag to change.
fn tag_bounds(m: u64, o: &Options, stages: usize) -> Option<String> {
    // Saturating: --max-steps near u64::MAX must not wrap below the bound.
    let steps = o.steps.saturating_add(o.warmup);
    let given = if o.micro_batches.is_some() {
        "--micro-batches"
    } else {
        "the plan's micro-batches per step,"
    };
    if m == 0 {
        Some(format!("{given} 0: run at least one micro-batch"))
    } else if m >= MAX_MICRO_BATCHES {
        Some(format!(
            "{given} {m}: the executor numbers at most {} micro-batches per step; give --micro-batches {} or fewer (the pairing and the per-micro-batch timings do not depend on the count)",
            MAX_MICRO_BATCHES - 1,
            MAX_MICRO_BATCHES - 1
        ))
    } else if steps >= MAX_STEPS {
        // Steps are numbered together, timed and warm-up: the larger of the two
        // is the one to lower, to what the other leaves.
        let most = MAX_STEPS - 1;
        Some(if o.warmup >= o.steps && o.steps < most {
            format!(
                "--warmup {} with --max-steps {}: the executor numbers at most {most} steps in all, warm-up included; use --warmup {} or fewer",
                o.warmup,
                o.steps,
                most - o.steps
            )
        } else if o.steps > o.warmup && o.warmup < most {
            format!(
                "--max-steps {} with --warmup {}: the executor numbers at most {most} steps in all, warm-up included; use --max-steps {} or fewer",
                o.steps,
                o.warmup,
                most - o.warmup
            )
        } else {
            format!(
                "--max-steps {} with --warmup {}: the executor numbers at most {most} steps in all, warm-up included; give two that add up to {most} or fewer",
                o.steps, o.warmup
            )
        })
    } else if stages >= MAX_STAGES {
        Some(format!(
            "the plan's {stages} virtual pipeline stages (pp x vpp): the executor numbers fewer than {MAX_STAGES}; re-plan with a smaller pp x vpp"
        ))
    } else {
        None
    }
}
