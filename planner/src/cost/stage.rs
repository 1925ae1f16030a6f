//! What a stage holds and costs: the per-layer costs with the output layer, the
//! embedding and multi-token prediction beside them (`Pieces`), which layers each
//! stage holds and which stages each rank runs (`StageLayout`), each stage's time
//! per micro-batch, each rank's memory, and the partition problem
//! ([`stage_problem`]) the uneven-layout solver takes.

use crate::comm::Collective;
use crate::config::{ParallelConfig, Recompute, Rejection, Workload};
use crate::hardware::{Cluster, GIB};
use crate::memory::{self, LayerKind, StageMemory};
use crate::model::ModelSpec;
use crate::schedule::Schedule;

use super::kernel::Ctx;
use super::layer::{layer_cost, LayerCost};
use super::Assumptions;

/// The per-layer and per-stage ingredients of an estimate.
pub(super) struct Pieces {
    pub(super) dense: LayerCost,
    pub(super) moe: LayerCost,
    pub(super) vocab_rank: f64,
    /// Vocabulary entries whose logits the loss holds on a rank: `vocab_rank`, or
    /// the whole vocabulary where the framework gathers the logits first
    /// (`scaling`).
    pub(super) loss_vocab: f64,
    pub(super) output_secs: f64,
    /// The logits GEMM's weight-gradient time.
    pub(super) output_wgrad: f64,
    pub(super) output_flops: f64,
    pub(super) embed_secs: f64,
    pub(super) out_tp: f64,
    /// `scaling`'s all-gather of the logits over TP, once per micro-batch (0
    /// elsewhere).
    pub(super) out_gather: f64,
    pub(super) dense_layer_params: f64,
    pub(super) moe_dense_params: f64,
    pub(super) moe_expert_params: f64,
    pub(super) embed_params: f64,
    pub(super) tied_single: bool,
    pub(super) act_dense: memory::LayerActivations,
    pub(super) act_moe: memory::LayerActivations,
    pub(super) mtp: MtpCost,
}

/// One multi-token-prediction layer per micro-batch, beside its transformer layer
/// and its pass through the output layer and loss.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MtpCost {
    /// The 2h -> h projection: forward and both backward GEMMs.
    pub(super) proj_secs: f64,
    /// Its weight-gradient GEMM.
    pub(super) proj_wgrad: f64,
    /// Embedding lookup of the shifted tokens and the embedding and hidden norms.
    pub(super) elementwise_secs: f64,
    pub(super) proj_flops: f64,
    /// Projection and norms per GPU (the embedding copy is counted apart).
    pub(super) params: f64,
    /// Activations kept for the backward: both norms' inputs and the 2h-wide
    /// projection input.
    pub(super) stored: f64,
}

impl Pieces {
    /// The output layer's TP communication per micro-batch: one block's worth
    /// each pass, and `scaling`'s logits gather.
    pub(super) fn out_comm(&self) -> f64 {
        2.0 * self.out_tp + self.out_gather
    }

    /// One MTP layer's work per micro-batch beside its transformer layer: the
    /// projection, norms and embedding lookup, and its pass through the output
    /// layer (with that layer's TP communication).
    pub(super) fn mtp_extra_secs(&self) -> f64 {
        self.output_secs + self.out_comm() + self.mtp.proj_secs + self.mtp.elementwise_secs
    }

    /// The embedding copy MTP looks the shifted tokens up in, on the last of `p`
    /// stages: none without MTP, when the first stage is the last, or when the
    /// output weight already is that copy (tied embeddings).
    pub(super) fn mtp_embedding_copy(&self, model: &ModelSpec, p: u64) -> f64 {
        if model.mtp_layers > 0 && p > 1 && !model.tied_embeddings {
            self.embed_params
        } else {
            0.0
        }
    }
}

pub(super) fn pieces(c: &Ctx) -> Pieces {
    let model = c.model;
    let cfg = c.cfg;
    let w = c.w;
    let t = cfg.tp as f64;
    let h = model.hidden as f64;
    let tokens = c.tokens;
    let p = cfg.pp;
    let a = c.a;
    let dense = layer_cost(c, LayerKind::Dense);
    let moe = if model.moe.is_some() {
        layer_cost(c, LayerKind::Moe)
    } else {
        dense
    };

    // Output layer on the last stage: logits GEMM (BF16), then the cross-entropy's
    // element-wise passes over the FP32 logits (fused or not).
    let vocab_rank = model.vocab as f64 / t;
    let vocab = model.vocab as f64;
    let logits = c.pass(tokens, vocab_rank, h, false);
    let scaling = a.framework == super::Framework::Scaling;
    // Aleph Alpha's `scaling` (737f855) gathers the logits of its column-parallel
    // head over TP (`all_concat`: NCCL's all-gather into a list, copied out, then
    // `torch.cat`: 2 + 2 and 2 + 2 bytes per element; backward `_all_shard` copies
    // the rank's slice, 2 + 2) and every TP rank runs `F.cross_entropy` on the
    // whole BF16 vocabulary (`transformer/model/losses/cross_entropy.py`):
    // log-softmax's maximum, sum and output passes (2, 2, 2 + 2), the backward's
    // zeroed NLL gradient (2) and log-softmax backward (2, then 2 + 2 + 2), 18
    // bytes per element counted pass by pass.
    let (loss_vocab, ce, out_gather) = if scaling {
        let (copies, gather) = if cfg.tp > 1 {
            (
                tokens * (vocab * 8.0 + vocab_rank * 4.0),
                c.coll(Collective::AllGather, tokens * vocab * 2.0, c.tp_group()),
            )
        } else {
            (0.0, 0.0)
        };
        (vocab, c.mem(tokens * vocab * 18.0 + copies), gather)
    } else {
        (
            vocab_rank,
            c.mem(tokens * vocab_rank * c.a.loss.bytes_per_logit()),
            0.0,
        )
    };
    let output_secs = logits.fwd + logits.bwd + ce;
    let output_flops =
        3.0 * 2.0 * (cfg.mbs * w.seq) as f64 * h * model.vocab as f64 / (t * cfg.cp as f64);
    // Embedding lookup on the first stage (gather, and a scatter-add in backward).
    let embed_secs = c.mem(tokens * h * 2.0 * 3.0 / if cfg.sp { t } else { 1.0 });
    // The output layer's TP communication (gather the hidden state or all-reduce
    // its input gradient) is one block's worth.
    let out_tp = if cfg.tp > 1 {
        let act = tokens * h * 2.0;
        let g = c.tp_group();
        if cfg.sp {
            c.coll(Collective::AllGather, act, g) + c.coll(Collective::ReduceScatter, act, g)
        } else {
            c.coll(Collective::AllReduce, act, g)
        }
    } else {
        0.0
    };

    // Parameters per GPU of each stage.
    let params = model.params();
    let router_and_shared = params.moe_non_expert as f64;
    let dense_layer_params = (params.attention + params.dense_mlp) as f64 / t;
    let moe_dense_params = params.attention as f64 / t + router_and_shared / t;
    let moe_expert_params = params.routed_experts as f64 / (cfg.ep * cfg.etp) as f64;
    let embed_params = (model.vocab * model.hidden) as f64 / t;
    let tied_single = model.tied_embeddings && p == 1;

    let act_dense = memory::layer_activations(model, cfg, w, LayerKind::Dense, a);
    let act_moe = memory::layer_activations(model, cfg, w, LayerKind::Moe, a);

    // Multi-token prediction (Megatron's MultiTokenPredictionLayer): the shifted
    // tokens' embedding and the previous hidden state are each normed, concatenated
    // and projected 2h -> h (column-parallel over TP, kept in BF16), then pass one
    // transformer layer and the shared output layer.
    let sp_div = if cfg.sp { t } else { 1.0 };
    let mtp = if model.mtp_layers > 0 {
        let proj = c.pass(tokens, h / t, 2.0 * h, false);
        let norm_bytes = 2.0 * tokens * h * (2.0 + 2.0) / sp_div;
        MtpCost {
            proj_secs: proj.fwd + proj.bwd,
            proj_wgrad: proj.wgrad,
            elementwise_secs: embed_secs + c.mem(3.0 * norm_bytes),
            proj_flops: 3.0 * 2.0 * tokens * 2.0 * h * h / t,
            params: (2.0 * h * h + 2.0 * h) / t + h,
            stored: tokens * h * 2.0 * (1.0 + 1.0 + 2.0) / sp_div,
        }
    } else {
        MtpCost::default()
    };

    Pieces {
        dense,
        moe,
        vocab_rank,
        loss_vocab,
        output_secs,
        output_wgrad: logits.wgrad,
        output_flops,
        embed_secs,
        out_tp,
        out_gather,
        dense_layer_params,
        moe_dense_params,
        moe_expert_params,
        embed_params,
        tied_single,
        act_dense,
        act_moe,
        mtp,
    }
}

/// Which layers each physical stage holds, and which stages each rank runs.
pub(super) struct StageLayout {
    p: u64,
    dual: bool,
    /// Layers of each physical stage (sum over its virtual chunks). Under DualPipe
    /// (one chunk per stage, vpp 1) entry i is model stage i, which runs on rank i
    /// for half of the micro-batches and on rank p-1-i for the other half.
    pub(super) layers: Vec<u64>,
    /// MoE layers among them.
    pub(super) moe: Vec<u64>,
    /// Multi-token-prediction layers run on the last virtual stage (Megatron's
    /// layout rules put them there), which the last rank holds; each is a layer of
    /// the last decoder layer's kind.
    pub(super) mtp: f64,
    pub(super) mtp_dense: f64,
    pub(super) mtp_moe: f64,
}

impl StageLayout {
    pub(super) fn new(model: &ModelSpec, cfg: &ParallelConfig) -> Result<StageLayout, Rejection> {
        let p = cfg.pp;
        let mtp = model.mtp_layers as f64;
        let (mtp_dense, mtp_moe) = if model.mtp_is_moe() {
            (0.0, mtp)
        } else {
            (mtp, 0.0)
        };
        let chunks = cfg.stage_layers(model.layers)?;
        let mut stage_layers = vec![0u64; p as usize];
        let mut stage_moe = vec![0u64; p as usize];
        let mut start = 0u64;
        for (idx, &n) in chunks.iter().enumerate() {
            let stage = idx % p as usize;
            stage_layers[stage] += n;
            stage_moe[stage] += model.moe_layers_in(start, start + n);
            start += n;
        }
        Ok(StageLayout {
            p,
            dual: cfg.schedule == Schedule::DualPipe,
            layers: stage_layers,
            moe: stage_moe,
            mtp,
            mtp_dense,
            mtp_moe,
        })
    }

    /// The stages `rank` runs, with the share of its micro-batches that pass each.
    pub(super) fn hosts(&self, rank: u64) -> Vec<(u64, f64)> {
        if self.dual {
            vec![(rank, 0.5), (self.p - 1 - rank, 0.5)]
        } else {
            vec![(rank, 1.0)]
        }
    }

    /// What `rank` runs per micro-batch, over the stages it hosts.
    pub(super) fn critical(&self, rank: u64) -> CriticalRank {
        let p = self.p;
        let crit_hosts = self.hosts(rank);
        let first: f64 = crit_hosts
            .iter()
            .filter(|&&(s, _)| s == 0)
            .map(|&(_, k)| k)
            .sum();
        let last: f64 = crit_hosts
            .iter()
            .filter(|&&(s, _)| s == p - 1)
            .map(|&(_, k)| k)
            .sum();
        let dense: f64 = crit_hosts
            .iter()
            .map(|&(s, k)| k * (self.layers[s as usize] - self.moe[s as usize]) as f64)
            .sum::<f64>()
            + last * self.mtp_dense;
        let moe: f64 = crit_hosts
            .iter()
            .map(|&(s, k)| k * self.moe[s as usize] as f64)
            .sum::<f64>()
            + last * self.mtp_moe;
        CriticalRank {
            first,
            last,
            dense,
            moe,
        }
    }
}

/// The critical rank per micro-batch: its share of them on the first and on the
/// last stage, and the dense and MoE layers they pass (MTP layers included).
pub(super) struct CriticalRank {
    pub(super) first: f64,
    pub(super) last: f64,
    pub(super) dense: f64,
    pub(super) moe: f64,
}

/// Per stage: time of one micro-batch, its weight-gradient part, the parameters
/// it holds and the activations one micro-batch leaves on it.
pub(super) struct StageCost {
    pub(super) secs: f64,
    pub(super) weight_secs: f64,
    dense_p: f64,
    expert_p: f64,
    stored: f64,
    working: f64,
    dispatch: f64,
}

/// The cost of stage `i` of `layout`.
pub(super) fn stage_cost(c: &Ctx, pc: &Pieces, layout: &StageLayout, i: u64) -> StageCost {
    let (model, cfg, a) = (c.model, c.cfg, c.a);
    let p = cfg.pp;
    let t = cfg.tp as f64;
    let h = model.hidden as f64;
    let (dense, moe) = (&pc.dense, &pc.moe);
    let (mtp_extra_secs, mtp_copy) = (pc.mtp_extra_secs(), pc.mtp_embedding_copy(model, p));
    let iu = i as usize;
    let first = i == 0;
    let last = i == p - 1;
    let (extra_dense, extra_moe, extra_mtp) = if last {
        (layout.mtp_dense, layout.mtp_moe, layout.mtp)
    } else {
        (0.0, 0.0, 0.0)
    };
    let n_moe = layout.moe[iu] as f64 + extra_moe;
    let n_dense = (layout.layers[iu] - layout.moe[iu]) as f64 + extra_dense;
    let mut secs = n_dense * dense.secs() + n_moe * moe.secs();
    let mut weight_secs = n_dense * dense.wgrad + n_moe * moe.wgrad;
    if first {
        secs += pc.embed_secs;
    }
    if last {
        secs += pc.output_secs + pc.out_comm() + extra_mtp * mtp_extra_secs;
        weight_secs += (1.0 + extra_mtp) * pc.output_wgrad + extra_mtp * pc.mtp.proj_wgrad;
    }
    let mut dense_p = n_dense * pc.dense_layer_params + n_moe * pc.moe_dense_params;
    let expert_p = n_moe * pc.moe_expert_params;
    if first {
        dense_p += pc.embed_params;
    }
    if last && !pc.tied_single {
        dense_p += pc.embed_params;
    }
    if last {
        dense_p += h; // final norm
        dense_p += extra_mtp * pc.mtp.params + mtp_copy;
    }
    let stored =
        n_dense * pc.act_dense.stored + n_moe * pc.act_moe.stored + extra_mtp * pc.mtp.stored;
    let held = n_dense + n_moe;
    let per_layer_stored = if held > 0.0 { stored / held } else { 0.0 };
    // Working set: with full recomputation (and torchtitan's op-level selective
    // one, which replays the rest of the block from what it saved), one layer
    // is rebuilt in full for the micro-batch being back-propagated.
    let rebuilt = match cfg.recompute {
        Recompute::Full => true,
        Recompute::Selective => memory::op_sac_applies(model, LayerKind::Dense, a),
        Recompute::None => false,
    };
    let working = if rebuilt {
        pc.act_dense
            .full
            .max(if n_moe > 0.0 { pc.act_moe.full } else { 0.0 })
            - per_layer_stored
    } else {
        0.0
    };
    // MoE token dispatch: send and receive buffers of the layer in flight
    // (routed tokens x h in BF16, each way).
    let dispatch = match &model.moe {
        Some(mo) if n_moe > 0.0 => {
            2.0 * c.tokens / t * mo.top_k as f64 * c.w.moe_rank_load(mo, cfg.ep).factor * h * 2.0
        }
        _ => 0.0,
    };
    // A backward holds its input gradient and weight gradient GEMMs; the weight
    // part is at most half of it.
    StageCost {
        secs,
        weight_secs: weight_secs.min(secs / 3.0),
        dense_p,
        expert_p,
        stored,
        working: working.max(0.0),
        dispatch,
    }
}

/// Memory of rank `i` over `m` micro-batches, and the expert parameters it holds:
/// every stage it runs keeps its parameters (DualPipe holds two stages, so twice
/// the parameters); activations are the rank's in-flight count of its stages'
/// micro-batches.
pub(super) fn rank_memory(
    c: &Ctx,
    pc: &Pieces,
    layout: &StageLayout,
    costs: &[StageCost],
    i: u64,
    m: u64,
) -> (StageMemory, f64) {
    let (model, cfg, a, hw) = (c.model, c.cfg, c.a, c.hw);
    let p = cfg.pp;
    let t = cfg.tp as f64;
    let h = model.hidden as f64;
    let tokens = c.tokens;
    let here = layout.hosts(i);
    let dense_p: f64 = here.iter().map(|&(s, _)| costs[s as usize].dense_p).sum();
    let expert_p: f64 = here.iter().map(|&(s, _)| costs[s as usize].expert_p).sum();
    let (weights, gradients, optimizer) = memory::model_state(cfg, dense_p, expert_p, a.framework);
    let flight = memory::in_flight(cfg, m, i);
    let stored: f64 = here
        .iter()
        .map(|&(s, k)| k * costs[s as usize].stored)
        .sum();
    let working = here
        .iter()
        .map(|&(s, _)| costs[s as usize].working)
        .fold(0.0, f64::max);
    let dispatch = here
        .iter()
        .map(|&(s, _)| costs[s as usize].dispatch)
        .fold(0.0, f64::max);
    let mut activations = stored * flight + working + dispatch;
    if let Some(&(_, k)) = here.iter().find(|&&(s, _)| s == 0) {
        // Embedding output kept for its backward (and dropout mask).
        activations += k * flight * tokens * h * (2.0 + if model.dropout { 1.0 } else { 0.0 })
            / if cfg.sp { t } else { 1.0 };
    }
    // The loss's logits buffers (`memory::logit_bytes`), once for the loss and
    // once per MTP layer.
    let logits = if here.iter().any(|&(s, _)| s == p - 1) {
        (1.0 + layout.mtp) * tokens * pc.loss_vocab * memory::logit_bytes(a.framework, a.loss)
    } else {
        0.0
    };
    let holds = |s: u64| here.iter().any(|&(x, _)| x == s);
    let held = memory::HeldParams {
        all: dense_p + expert_p,
        layer: pc.dense_layer_params.max(if model.moe.is_some() {
            pc.moe_dense_params + pc.moe_expert_params
        } else {
            0.0
        }),
        root: if holds(0) { pc.embed_params } else { 0.0 }
            + if holds(p - 1) && !pc.tied_single {
                pc.embed_params
            } else {
                0.0
            },
    };
    // What is held only at the optimizer step counts where it exceeds the
    // activations and logits freed before it (`memory::step_buffers`).
    let buffers = memory::framework_buffers(a.framework, cfg, held)
        + memory::token_buffers(a.framework, cfg, tokens, h)
        + (memory::step_buffers(a.framework, cfg, held) - activations - logits).max(0.0);
    let fragmentation = hw.memory.fragmentation * (activations + logits + buffers);
    let reserve = hw.memory.reserve_gib * GIB;
    let total =
        weights + gradients + optimizer + activations + logits + buffers + fragmentation + reserve;
    // Reserved-only blocks, within the HBM the rest leaves (`StageMemory::cached`).
    let chunk_layers = here
        .iter()
        .map(|&(s, _)| layout.layers[s as usize].div_ceil(cfg.vpp))
        .max()
        .unwrap_or(0) as f64;
    let logit_elems = if here.iter().any(|&(s, _)| s == p - 1) {
        (1.0 + layout.mtp) * tokens * pc.vocab_rank
    } else {
        0.0
    };
    let cached = memory::cached_blocks(a.framework, cfg, tokens, h, chunk_layers, logit_elems)
        .min((hw.hbm_bytes() - total).max(0.0));
    let mem = StageMemory {
        stage: i,
        params: dense_p + expert_p,
        weights,
        gradients,
        optimizer,
        activations,
        logits,
        buffers,
        fragmentation,
        cached,
        reserve,
        total,
        in_flight: flight,
    };
    (mem, expert_p)
}

/// The partition problem ([`crate::partition`]) of a non-interleaved pipeline:
/// per-layer time and memory from this cost model, the embedding and the output
/// layer as first- and last-stage extras, 1F1B in-flight counts per stage. The
/// model's dominant layer type (dense or MoE) stands for every layer. The
/// configuration's own recomputation applies to every layer.
pub fn stage_problem(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
    a: Assumptions,
) -> Result<crate::partition::StageProblem, Rejection> {
    cfg.check(model, cluster, w)?;
    if cfg.vpp != 1 || cfg.pp < 2 || cfg.schedule == Schedule::DualPipe {
        return Err(Rejection::Layout { detail: "re-partitioning needs a non-interleaved pipeline of at least 2 stages, one per rank (not DualPipe)".into() });
    }
    let hw = &cluster.profile;
    let c = Ctx::new(model, hw, w, cfg, a);
    let pc = pieces(&c);
    let p = cfg.pp as usize;
    let m = cfg.micro_batches(w);
    let h = model.hidden as f64;
    let t = cfg.tp as f64;
    let frag = 1.0 + hw.memory.fragmentation;
    let moe_dominant = 2 * model.moe_layers() > model.layers;
    let (layer, act, dense_p, expert_p) = if moe_dominant {
        (
            pc.moe,
            pc.act_moe,
            pc.moe_dense_params,
            pc.moe_expert_params,
        )
    } else {
        (pc.dense, pc.act_dense, pc.dense_layer_params, 0.0)
    };
    // The partition prices Megatron-Core's own buffers only (none beyond the
    // model state); the search partitions no other framework's plans.
    let state = |d: f64, e: f64| {
        let (wt, g, o) = memory::model_state(cfg, d, e, a.framework);
        wt + g + o
    };
    let working = if cfg.recompute == Recompute::Full {
        (act.full - act.stored).max(0.0) * frag
    } else {
        0.0
    };
    let reserve = hw.memory.reserve_gib * GIB;
    let mut extra_secs = vec![0.0; p];
    let mut extra_bytes = vec![reserve + working; p];
    let flight: Vec<f64> = (0..cfg.pp).map(|i| memory::in_flight(cfg, m, i)).collect();
    extra_secs[0] += pc.embed_secs;
    extra_bytes[0] += state(pc.embed_params, 0.0)
        + flight[0] * c.tokens * h * (2.0 + if model.dropout { 1.0 } else { 0.0 })
            / if cfg.sp { t } else { 1.0 }
            * frag;
    extra_secs[p - 1] += pc.output_secs + pc.out_comm();
    let out_params = if pc.tied_single { 0.0 } else { pc.embed_params } + h;
    extra_bytes[p - 1] += state(out_params, 0.0)
        + c.tokens * pc.loss_vocab * memory::logit_bytes(a.framework, a.loss) * frag;
    // Multi-token prediction on the last stage: its layers (of the last layer's
    // kind), projections, second output pass and embedding copy.
    let mtp = model.mtp_layers as f64;
    if mtp > 0.0 {
        let (m_layer, m_act, m_dense, m_expert) = if model.mtp_is_moe() {
            (
                pc.moe,
                pc.act_moe,
                pc.moe_dense_params,
                pc.moe_expert_params,
            )
        } else {
            (pc.dense, pc.act_dense, pc.dense_layer_params, 0.0)
        };
        extra_secs[p - 1] += mtp * (m_layer.secs() + pc.mtp_extra_secs());
        extra_bytes[p - 1] += state(
            mtp * (m_dense + pc.mtp.params) + pc.mtp_embedding_copy(model, cfg.pp),
            mtp * m_expert,
        ) + flight[p - 1] * mtp * (m_act.stored + pc.mtp.stored) * frag
            + mtp * c.tokens * pc.vocab_rank * 6.0 * frag;
    }
    Ok(crate::partition::StageProblem {
        layers: model.layers,
        layer_secs: layer.secs(),
        recompute_secs: 0.0,
        stage_extra_secs: extra_secs,
        layer_state_bytes: state(dense_p, expert_p),
        layer_act_bytes: act.stored * frag,
        layer_act_recomputed_bytes: act.stored * frag,
        in_flight: flight,
        stage_extra_bytes: extra_bytes,
        classes: vec![crate::partition::GpuClass {
            name: hw.name.clone(),
            slowdown: 1.0,
            capacity_bytes: hw.capacity_bytes(),
            stages: p,
        }],
        allow_recompute: false,
    })
}
