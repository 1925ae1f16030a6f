//! The pipeline: the closed-form pace and bubble of each schedule, the
//! point-to-point transfers between stages and what of them the schedule cannot
//! hide, and [`simulate`], which returns the estimate with the simulated
//! schedule in place of the closed form.

use crate::comm::Collective;
use crate::config::ParallelConfig;
use crate::schedule::Schedule;

use super::kernel::Ctx;
use super::stage::StageCost;
use super::{CommKind, CommTerm, Estimate};

/// The closed-form pipeline of one step.
pub(super) struct ClosedForm {
    /// The rank whose per-micro-batch time sets the pace, and that time.
    pub(super) critical: u64,
    pub(super) t_max: f64,
    /// Fill and drain.
    pub(super) bubble: f64,
}

/// Pipeline: m micro-batches through the slowest rank, plus fill and drain. The
/// bubble is each schedule's closed form on the mean stage, with F = t/3, the
/// full backward 2t/3 and W its weight-gradient GEMMs: (p-1) t for 1F1B and
/// GPipe, (p-1) t / v interleaved, (p-1)(F + B - W) = (p-1)(t - 2W) for ZB-H1
/// (Qi et al. 2023), (p/2-1)(F&B + B - 3W) = (p/2-1)(5t/3 - 3W) for DualPipe
/// (DeepSeek-V3 Table 2, with F&B = F + B: the pair is not credited any overlap).
/// They are exact for identical stages with the ratios the papers draw;
/// `simulate` replaces them with the simulated schedule for the leaders.
pub(super) fn closed_form(
    cfg: &ParallelConfig,
    rank_secs: &[f64],
    costs: &[StageCost],
) -> ClosedForm {
    let (p, v) = (cfg.pp, cfg.vpp);
    let (critical, t_max) =
        rank_secs
            .iter()
            .copied()
            .enumerate()
            .fold(
                (0u64, 0.0f64),
                |acc, (i, x)| if x > acc.1 { (i as u64, x) } else { acc },
            );
    let t_mean = rank_secs.iter().sum::<f64>() / p as f64;
    let w_mean = costs.iter().map(|c| c.weight_secs).sum::<f64>() / p as f64;
    let pm1 = (p - 1) as f64;
    let bubble = match cfg.schedule {
        Schedule::Gpipe | Schedule::OneFOneB => pm1 * t_mean,
        Schedule::Interleaved => pm1 / v as f64 * t_mean,
        Schedule::ZbH1 => pm1 * (t_mean - 2.0 * w_mean),
        Schedule::DualPipe => (p as f64 / 2.0 - 1.0) * (5.0 / 3.0 * t_mean - 3.0 * w_mean),
    }
    .max(0.0);
    ClosedForm {
        critical,
        t_max,
        bubble,
    }
}

/// Pipeline point-to-point: activation forward, gradient backward, per
/// micro-batch and virtual chunk, over `mb` micro-batches. Sharded over TP (SP, or
/// Megatron's scatter-gather of the pipeline tensor without SP). None without a
/// pipeline.
pub(super) fn p2p_term(c: &Ctx, mb: f64) -> Option<CommTerm> {
    let cfg = c.cfg;
    let (p, v) = (cfg.pp, cfg.vpp);
    if p <= 1 {
        return None;
    }
    let t = cfg.tp as f64;
    let act_bytes = c.tokens * c.model.hidden as f64 * 2.0;
    let bytes = act_bytes / t;
    let g = c.pp_group();
    let one = c.coll(Collective::SendRecv, bytes, g);
    let transfers = 2.0 * (mb * v as f64 + (p - 1) as f64);
    let total = transfers * one;
    // The interleaved schedule overlaps its transfers with compute (with
    // --overlap-p2p-communication), and DualPipe overlaps them inside its
    // forward-backward pairs; what stays exposed is the path of the first
    // micro-batch forward and the last one backward: with v chunks per rank
    // that path crosses 2(pv - 1) chunk boundaries, each waiting for its
    // transfer (the simulator's critical path on even stages). Every virtual
    // stage adds two.
    let dual = cfg.schedule == Schedule::DualPipe;
    let boundaries = if dual { p - 1 } else { p * v - 1 };
    let p2p_exposed = if (v > 1 || dual) && cfg.overlap.p2p {
        2.0 * boundaries as f64 * one
    } else {
        total
    };
    Some(CommTerm {
        kind: CommKind::Pp,
        collective: Collective::SendRecv,
        group: g,
        tier: g.tier(),
        bytes_per_call: bytes,
        calls_per_step: transfers,
        total_secs: total,
        exposed_secs: p2p_exposed,
        overlapped_secs: total - p2p_exposed,
    })
}

/// Largest task graph the search simulates (passes of one step).
pub const MAX_SIMULATED_PASSES: u64 = 200_000;

/// `e` with its closed-form pipeline time replaced by the simulated schedule of
/// `cfg` on the estimate's own per-stage times and point-to-point cost: F a third
/// of a stage's micro-batch time, the backward two thirds, of which the stage's
/// weight-gradient GEMMs are split off as W where the schedule defers them (ZB-H1,
/// DualPipe). The step time and what is derived from it (throughput, MFU, HFU,
/// the bubble and exposed-communication fractions) change with it; the band is
/// carried over as it was ([`crate::banded::simulated`] rescales it). `None` when
/// there is no pipeline, it is already simulated, the schedule cannot run this
/// shape, or the graph would be too large.
pub fn simulate(e: &Estimate, cfg: &ParallelConfig) -> Option<Estimate> {
    use crate::schedule::{simulate_schedule, PassCosts};
    let schedule = cfg.schedule;
    let v = schedule.interleaving(cfg.vpp);
    let (p, m) = (cfg.pp, e.micro_batches);
    let kinds = if schedule.splits_weight_grad() { 3 } else { 2 };
    if p < 2
        || e.pipeline_simulated
        || e.stages.len() as u64 != p
        || kinds * p * v * m > MAX_SIMULATED_PASSES
    {
        return None;
    }
    let secs: Vec<f64> = e.stages.iter().map(|s| s.secs_per_micro_batch).collect();
    let split = schedule.splits_weight_grad();
    let weight: Vec<f64> = e
        .stages
        .iter()
        .map(|s| {
            if split {
                s.weight_grad_secs.clamp(0.0, s.secs_per_micro_batch / 3.0) / v as f64
            } else {
                0.0
            }
        })
        .collect();
    let costs = PassCosts {
        forward: secs.iter().map(|s| s / 3.0 / v as f64).collect(),
        backward: secs
            .iter()
            .zip(&weight)
            .map(|(s, w)| 2.0 * s / 3.0 / v as f64 - w)
            .collect(),
        weight,
    };
    let pp = e.comm.iter().find(|t| t.kind == CommKind::Pp);
    let one_p2p = pp
        .map(|t| t.total_secs / t.calls_per_step.max(1.0))
        .unwrap_or(0.0);
    let p2p_exposed = pp.map(|t| t.exposed_secs).unwrap_or(0.0);
    // A transfer overlapped with compute still delays the pass that needs its data:
    // every cross-rank edge carries the transfer time, overlapped or not. What
    // overlap saves is the sender's time, which the graph does not charge anyway.
    // The closed form's exposed transfers are replaced by what lands on the
    // simulated critical path (for interleaving, the chunk boundaries of the fill
    // and the drain).
    let edge = one_p2p;
    let tl = simulate_schedule(schedule, p, v, m, &costs, edge)?;
    // The closed form's pace: the slowest rank (under DualPipe the mean of the two
    // stages a rank runs).
    let rank_secs = |r: usize| {
        if schedule == Schedule::DualPipe {
            0.5 * (secs[r] + secs[p as usize - 1 - r])
        } else {
            secs[r]
        }
    };
    let t_max = (0..p as usize).map(rank_secs).fold(0.0, f64::max);
    let closed = m as f64 * t_max + e.time.bubble + p2p_exposed;
    let new_step = e.step_secs - closed + tl.makespan;
    if !(new_step.is_finite() && new_step > 0.0) {
        return None;
    }
    let ratio = e.step_secs / new_step;
    let mut s = e.clone();
    // The simulated pipeline's time beyond the compute is the schedule's idle and
    // the transfers on its critical path. The schedule's own idle is at least the
    // closed form's bubble (the lower bound it is built on); the transfers get what
    // is left, up to the closed form's exposed share, so that the breakdown sums
    // to the simulated step even where deep interleaving puts more transfers than
    // idle on the path (one layer per virtual stage printed a 0% bubble).
    let beyond = (tl.makespan - m as f64 * t_max).max(0.0);
    let p2p_on_path = p2p_exposed.min(beyond - e.time.bubble.min(beyond));
    s.time.bubble = beyond - p2p_on_path;
    s.time.exposed_comm += p2p_on_path - p2p_exposed;
    // The communication table says the same of the pipeline's transfers.
    if let Some(t) = s.comm.iter_mut().find(|t| t.kind == CommKind::Pp) {
        t.exposed_secs = p2p_on_path;
        t.overlapped_secs = (t.total_secs - p2p_on_path).max(0.0);
    }
    s.step_secs = new_step;
    s.tokens_per_sec_per_gpu *= ratio;
    s.mfu *= ratio;
    s.hfu *= ratio;
    s.model_tflops_per_gpu *= ratio;
    s.bubble_fraction = s.time.bubble / new_step;
    s.exposed_comm_fraction = s.time.exposed_comm / new_step;
    s.pipeline_simulated = true;
    Some(s)
}
