//! The leaders: the screening's best plans re-partitioned, priced with the
//! schedule simulated, and ranked again; the `top` of them are the search's answer.

use super::{Candidate, Inputs, Point, Progress};
use crate::banded::{estimate_with, simulated};
use crate::config::{Layout, ParallelConfig, Workload};
use crate::cost::{Assumptions, Estimate};
use crate::hardware::Cluster;
use crate::model::ModelSpec;
use crate::reach::RankBy;
use crate::schedule::Schedule;

/// Re-partitions the layers of a non-interleaved pipeline with the integer program
/// ([`crate::partition`]) and keeps the uneven split when the cost model finds it
/// faster (by more than 0.1%) and it fits.
pub fn repartition(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
    a: Assumptions,
    current: &Estimate,
) -> Option<Candidate> {
    if cfg.pp < 2 || cfg.vpp != 1 || cfg.schedule == Schedule::DualPipe {
        return None;
    }
    let problem = crate::cost::stage_problem(model, cluster, w, cfg, a).ok()?;
    let part = crate::partition::solve(&problem)?;
    let layout = Layout::from_counts(&part.layers);
    if cfg.stage_layers(model.layers).ok()? == part.layers {
        return None;
    }
    let config = ParallelConfig {
        layout,
        ..cfg.clone()
    };
    let estimate = estimate_with(model, cluster, w, &config, a).ok()?;
    (estimate.step_secs < current.step_secs * 0.999).then_some(Candidate { config, estimate })
}

/// The closed form screened everything; the leaders are re-partitioned and
/// re-scored with the schedule simulator, then ranked again, and the first `top`
/// kept. `all` is the screened points in rank order.
pub(super) fn leaders(
    inputs: &Inputs,
    all: &[(Point, ParallelConfig)],
    top: usize,
    progress: &Progress,
) -> Vec<Candidate> {
    let Inputs {
        model,
        cluster,
        w,
        space,
        ref ranker,
    } = *inputs;
    let reductions =
        |cfg: &ParallelConfig, micro_batches: u64| inputs.reductions(cfg, micro_batches);
    // The leaders: the first 3 x top by the screening's key and, when ranking by
    // the band's upper end, also the first 3 x top inside the validated runs, so
    // that an inside plan the re-partitioning and simulation would improve is
    // priced beside the outside plans it competes with.
    let depth = top.saturating_mul(3);
    let inside = |(p, cfg): &(Point, ParallelConfig)| {
        ranker.is_inside(
            cluster,
            cfg,
            reductions(cfg, cfg.micro_batches(w)),
            p.peak_gib * crate::hardware::GIB,
        )
    };
    let mut picked: Vec<usize> = (0..all.len().min(depth)).collect();
    if space.rank_by == RankBy::Upper {
        // As many inside plans as there are outside leaders (none when every
        // leader is inside: the simulations are the search's largest cost).
        let outside = picked.iter().filter(|&&i| !inside(&all[i])).count();
        picked.extend(
            (depth..all.len())
                .filter(|&i| inside(&all[i]))
                .take(outside),
        );
    }
    progress.plan(picked.len());
    let price = |i: usize| -> Candidate {
        let cfg = &all[i].1;
        let estimate = estimate_with(model, cluster, w, cfg, space.assumptions)
            .expect("configuration was valid a moment ago");
        let repartitioned = if space.even_layers {
            None
        } else {
            repartition(model, cluster, w, cfg, space.assumptions, &estimate)
        };
        let Candidate { config, estimate } = repartitioned.unwrap_or(Candidate {
            config: cfg.clone(),
            estimate,
        });
        let estimate = simulated(estimate, &config);
        progress.tick();
        Candidate { config, estimate }
    };
    let mut leaders: Vec<Candidate> = picked.iter().map(|&i| price(i)).collect();
    let key = |c: &Candidate| {
        ranker.key(
            cluster,
            &c.config,
            reductions(&c.config, c.estimate.micro_batches),
            c.estimate.step_secs,
            c.estimate.memory.total,
        )
    };
    let rank = |leaders: &mut Vec<Candidate>| {
        leaders.sort_by(|a, b| {
            key(a)
                .total_cmp(&key(b))
                .then(a.estimate.step_secs.total_cmp(&b.estimate.step_secs))
        })
    };
    rank(&mut leaders);
    // An outside plan leads: before it wins, price more inside plans, since the
    // screening's order among them is the closed form's and the simulation or
    // the re-partitioning can lift one far down it. Only here does this cost
    // anything: when every leader is inside, or no plan is, nothing is added.
    let outside_leads = |l: &[Candidate]| {
        l.first().is_some_and(|c| {
            !ranker.is_inside(
                cluster,
                &c.config,
                reductions(&c.config, c.estimate.micro_batches),
                c.estimate.memory.total,
            )
        })
    };
    if space.rank_by == RankBy::Upper && outside_leads(&leaders) {
        let more: Vec<usize> = (0..all.len())
            .filter(|i| !picked.contains(i) && inside(&all[*i]))
            .take(depth.saturating_mul(3))
            .collect();
        progress.plan(more.len());
        leaders.extend(more.into_iter().map(price));
        rank(&mut leaders);
    }
    leaders.truncate(top);
    leaders
}
