//! One layer's communication for one micro-batch: tensor-parallel collectives
//! (and what `--tp-comm-overlap` hides), the context-parallel ring beside the
//! attention blocks, the expert-parallel all-to-all with its overlap windows, and
//! the expert-TP gathers; recomputation replays them with its blocks. Then the
//! step's per-layer [`CommTerm`]s on the critical rank.

use crate::comm::{collective_secs, Collective, Placement};
use crate::config::{Dispatcher, Recompute, RecomputeModules};
use crate::hardware::HardwareProfile;
use crate::memory::LayerKind;

use super::kernel::Ctx;
use super::layer::{LayerCost, Parts};
use super::stage::{CriticalRank, Pieces};
use super::{CommKind, CommTerm};

/// Adds the layer's TP, CP, EP and expert-TP communication to `lc`, whose compute
/// (`fwd`, `bwd`, `gemm`) is already priced.
pub(super) fn add_layer_comm(c: &Ctx, parts: &Parts, lc: &mut LayerCost) {
    let cfg = c.cfg;
    let kind = parts.kind;
    let sel = |x: RecomputeModules| cfg.recomputes(x);
    let replays = if cfg.recompute == Recompute::Full {
        1.0
    } else {
        0.0
    };
    // Selective modules that replay a whole block replay its communication too:
    // "mlp" (dense layers) and "shared_experts" their TP collectives, "moe" its
    // TP collectives (shared experts), all-to-alls and expert-TP gathers.
    let moe_replay = if kind == LayerKind::Moe && sel(RecomputeModules::MOE) {
        1.0
    } else {
        0.0
    };
    let has_shared = parts.ff.shared_ffn > 0.0;
    let tp_block_replays = match kind {
        _ if cfg.recompute == Recompute::Full => 0.0,
        // torchtitan's op-level policy saves the reduce-scatters' outputs but not
        // the all-gathers': it replays the attention's and the MLP's all-gather
        // (about one block's AG + RS).
        LayerKind::Dense if parts.op_sac => {
            if cfg.sp {
                1.0
            } else {
                0.0
            }
        }
        LayerKind::Dense => {
            if sel(RecomputeModules::MLP) {
                1.0
            } else {
                0.0
            }
        }
        LayerKind::Moe => {
            if has_shared && (moe_replay > 0.0 || sel(RecomputeModules::SHARED_EXPERTS)) {
                1.0
            } else {
                0.0
            }
        }
    };
    if cfg.tp > 1 {
        tp_comm(c, kind, lc, replays, tp_block_replays);
    }
    if cfg.cp > 1 {
        cp_comm(c, parts, lc, replays);
    }
    if kind == LayerKind::Moe && cfg.ep > 1 {
        ep_comm(c, parts, lc, replays, moe_replay);
    }
    if kind == LayerKind::Moe && cfg.etp > 1 {
        let bytes = parts.ff.routed_tokens * c.model.hidden as f64 * 2.0;
        lc.etp_bytes = bytes;
        let g = c.etp_group();
        let one =
            c.coll(Collective::AllGather, bytes, g) + c.coll(Collective::ReduceScatter, bytes, g);
        let calls = 2.0 + replays + moe_replay;
        lc.etp = (calls * one, calls * one);
        lc.etp_calls = 2.0 * calls;
    }
}

/// TP: the activation is tokens x h in BF16. Per layer: attention and MLP each
/// need one all-reduce (or AG + RS with SP) forward and one backward. In an MoE
/// layer with SP, routed experts take their tokens through the all-to-all
/// instead; shared experts still use AG/RS.
fn tp_comm(c: &Ctx, kind: LayerKind, lc: &mut LayerCost, replays: f64, tp_block_replays: f64) {
    let m = c.model;
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let act_bytes = c.tokens * m.hidden as f64 * 2.0;
    let blocks = match (kind, &m.moe) {
        (LayerKind::Moe, Some(moe)) => 1.0 + if moe.shared_hidden() > 0 { 1.0 } else { 0.0 },
        _ => 2.0,
    };
    let g = c.tp_group();
    let per_block = if cfg.sp {
        c.coll(Collective::AllGather, act_bytes, g)
            + c.coll(Collective::ReduceScatter, act_bytes, g)
    } else {
        c.coll(Collective::AllReduce, act_bytes, g)
    };
    let passes = 2.0 + replays;
    let block_passes = blocks * passes + tp_block_replays;
    let total = block_passes * per_block;
    lc.tp_calls = block_passes * if cfg.sp { 2.0 } else { 1.0 };
    // Transformer Engine's comm+GEMM overlap (Userbuffers) needs the TP group
    // inside one NVLink domain: it relies on CUDA multicast / IPC over NVLink
    // (TransformerEngine issue #1071, maintainer's answer; multi-node NVLink
    // domains since PR #1470). Across domains the collectives run exposed.
    let exposed = if cfg.overlap.tp_comm && g.domains == 1 {
        // Userbuffers split each collective into tp chunks pipelined with the
        // GEMM: the first chunk, and whatever outlasts the GEMMs, stays exposed.
        let hide = (lc.gemm * passes / 1.0).max(0.0);
        (total - hide).max(0.0) + total / t
    } else {
        total
    };
    lc.tp = (total, exposed.min(total));
    lc.overlapped += total - lc.tp.1;
}

/// CP: ring of cp - 1 steps sending this rank's K and V; the backward sends K, V
/// and their gradients. Each step overlaps the attention on the previous chunk.
fn cp_comm(c: &Ctx, parts: &Parts, lc: &mut LayerCost, replays: f64) {
    let m = c.model;
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let kv_bytes = c.tokens
        * 2.0
        * parts.proj.kv_rank.max(if m.mla.is_some() {
            m.kv_dim() as f64 / t
        } else {
            0.0
        })
        * 2.0;
    let step = c.coll(Collective::SendRecv, kv_bytes, c.cp_group());
    lc.cp_bytes = kv_bytes;
    let steps = (cfg.cp - 1) as f64;
    let fwd_comm = steps * step;
    let bwd_comm = 2.0 * steps * step;
    let per_step_attn_f = parts.core.fwd / cfg.cp as f64;
    let per_step_attn_b = parts.core.bwd / cfg.cp as f64;
    // Ring attention: transfer k runs while block k is computed on the chunk
    // already held; only what outlasts the block is exposed.
    let exp_f = steps * (step - per_step_attn_f).max(0.0);
    let exp_b = steps * (2.0 * step - per_step_attn_b).max(0.0);
    let total = fwd_comm * (1.0 + replays) + bwd_comm;
    let exposed = (exp_f * (1.0 + replays) + exp_b).min(total);
    lc.cp = (total, exposed);
    lc.cp_calls = steps * (3.0 + replays);
    lc.overlapped += total - exposed;
}

/// EP: dispatch and combine forward, the same backward, and again for each
/// replay (full recomputation, and the "moe" module's `moe_replay`).
fn ep_comm(c: &Ctx, parts: &Parts, lc: &mut LayerCost, replays: f64, moe_replay: f64) {
    let m = c.model;
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let h = m.hidden as f64;
    let tokens = c.tokens;
    let moe_load = parts.ff.moe_load;
    let moe = m.moe.as_ref().expect("MoE layer of an MoE model");
    let bytes = tokens / t * moe.top_k as f64 * h * 2.0 * moe_load;
    let g = c.ep_group();
    let one = match cfg.moe_dispatcher {
        Dispatcher::AllToAll => c.coll(Collective::AllToAll, bytes, g),
        Dispatcher::Deduplicated => dedup_dispatch_secs(
            c.hw,
            tokens / t * moe_load * h * 2.0,
            moe.experts,
            moe.top_k,
            g,
        ),
    };
    let calls = 2.0 * (2.0 + replays + moe_replay);
    let total = calls * one;
    let exposed = match cfg.ep_overlap(c.w) {
        Some(f) => (1.0 - f) * total + f * ep_paired_exposed(lc, one, total).min(total),
        None => total,
    };
    lc.ep = (total, exposed);
    lc.overlapped += total - exposed;
    lc.ep_calls = calls;
}

/// What stays exposed of `total` seconds of all-to-all (calls of `one` second) when
/// passes are paired. Megatron's batch-level overlap
/// (`--overlap-moe-expert-parallel-comm`;
/// megatron/core/models/common/model_chunk_schedule_plan.py,
/// `TransformerLayerSchedulePlan.run`, Megatron-LM d98e8a6) runs one micro-batch's
/// layer forward beside another's layer backward in three windows, each all-to-all
/// hidden only behind the computation of its own:
///   comm: combine bwd        | dispatch fwd, dispatch bwd       | combine fwd
///   comp: pre-dispatch fwd   | MLP bwd (with wgrad), MLP fwd     | pre-dispatch bwd
/// (pre-dispatch: attention and router). DualPipe's F&B pairs overlap the same
/// four pieces (DeepSeek-V3 report, Figure 4). Element-wise passes are left out of
/// the windows: their split between the pieces is not priced. Replayed all-to-alls
/// (recomputation) are not paired.
fn ep_paired_exposed(lc: &LayerCost, one: f64, total: f64) -> f64 {
    let (fwd, bwd) = (&lc.fwd, &lc.bwd);
    let pre_f = fwd.attention_proj + fwd.attention_core + fwd.router;
    let pre_b = bwd.attention_proj + bwd.attention_core + bwd.router;
    let mlp = fwd.moe_experts + fwd.mlp + bwd.moe_experts + bwd.mlp;
    (one - pre_f).max(0.0)
        + (2.0 * one - mlp).max(0.0)
        + (one - pre_b).max(0.0)
        + (total - 4.0 * one).max(0.0)
}

/// The step's per-layer terms (TP, CP, and for MoE models EP and expert TP) on the
/// critical rank: `mb` micro-batches through its dense and MoE layers.
pub(super) fn layer_comm_terms(
    c: &Ctx,
    pc: &Pieces,
    crit: &CriticalRank,
    mb: f64,
) -> Vec<CommTerm> {
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let h = c.model.hidden as f64;
    let (dense, moe) = (&pc.dense, &pc.moe);
    let mut comm: Vec<CommTerm> = Vec::new();
    let mut push_layer_comm = |kind: CommKind,
                               coll: Collective,
                               group: Placement,
                               bytes: f64,
                               d: (f64, f64),
                               mo: (f64, f64),
                               calls_d: f64,
                               calls_m: f64| {
        let total = mb * (crit.dense * d.0 + crit.moe * mo.0);
        if total <= 0.0 {
            return;
        }
        let exposed = mb * (crit.dense * d.1 + crit.moe * mo.1);
        comm.push(CommTerm {
            kind,
            collective: coll,
            group,
            tier: group.tier(),
            bytes_per_call: bytes,
            calls_per_step: mb * (crit.dense * calls_d + crit.moe * calls_m),
            total_secs: total,
            exposed_secs: exposed,
            overlapped_secs: total - exposed,
        });
    };
    let act_bytes = c.tokens * h * 2.0;
    push_layer_comm(
        CommKind::Tp,
        if cfg.sp {
            Collective::AllGather
        } else {
            Collective::AllReduce
        },
        c.tp_group(),
        act_bytes,
        dense.tp,
        moe.tp,
        dense.tp_calls,
        moe.tp_calls,
    );
    push_layer_comm(
        CommKind::Cp,
        Collective::SendRecv,
        c.cp_group(),
        dense.cp_bytes,
        dense.cp,
        moe.cp,
        dense.cp_calls,
        moe.cp_calls,
    );
    if let Some(mo) = &c.model.moe {
        push_layer_comm(
            CommKind::Ep,
            Collective::AllToAll,
            c.ep_group(),
            c.tokens / t * mo.top_k as f64 * h * 2.0,
            (0.0, 0.0),
            moe.ep,
            0.0,
            moe.ep_calls,
        );
        push_layer_comm(
            CommKind::Etp,
            Collective::AllGather,
            c.etp_group(),
            moe.etp_bytes,
            (0.0, 0.0),
            moe.etp,
            0.0,
            moe.etp_calls,
        );
    }
    comm
}

/// Expected number of other NVLink domains a token is sent to when its top-k
/// experts are drawn uniformly (balanced routing) from `experts` spread evenly over
/// `domains` domains: each other domain is missed with probability
/// C(E - E/N, k) / C(E, k).
pub fn expected_remote_domains(experts: u64, top_k: u64, domains: u64) -> f64 {
    if domains <= 1 {
        return 0.0;
    }
    let e = experts as f64;
    let per = e / domains as f64;
    let mut miss = 1.0;
    for i in 0..top_k.min(experts) {
        miss *= ((e - per - i as f64) / (e - i as f64)).max(0.0);
    }
    (domains - 1) as f64 * (1.0 - miss)
}

/// One dispatch (or combine) through a node-deduplicating dispatcher (DeepEP,
/// HybridEP): each token crosses the network once per destination domain, then is
/// copied to that domain's experts over NVLink. `token_bytes` is this rank's
/// tokens x h x 2 (before top-k fan-out).
fn dedup_dispatch_secs(
    hw: &HardwareProfile,
    token_bytes: f64,
    experts: u64,
    top_k: u64,
    g: Placement,
) -> f64 {
    let e = &hw.efficiency;
    let nvl = hw.node.nvlink_gbytes_per_s * 1e9 * e.nvlink_busbw;
    let copies_local = top_k as f64 * (g.per_domain as f64 - 1.0) / g.size as f64;
    if g.domains <= 1 {
        return collective_secs(hw, Collective::AllToAll, token_bytes * top_k as f64, g);
    }
    let remote = expected_remote_domains(experts, top_k, g.domains);
    let net = token_bytes * remote / (hw.network.nic_gbytes_per_s * 1e9 * e.network_busbw);
    // NVLink carries the local copies and the fan-out of tokens arriving from
    // other domains to this domain's other GPUs.
    let fan_out =
        token_bytes * (copies_local + top_k as f64 * (g.domains as f64 - 1.0) / g.domains as f64);
    net.max(fan_out / nvl) + hw.network.latency_us * 1e-6 * 2.0
}
