//! What the search claims over the experts: for each published run, the plan the
//! search ranks first for the same model, machine, global batch and software stack,
//! priced against the experts' own configuration and against the measurement.
//!
//! A search maximises, so an optimistic error of the cost model becomes its top
//! recommendation. `validate` checks the model at the experts' configurations; this
//! checks where the search goes from there. For each run it walks from the experts'
//! configuration to the top plan one knob group at a time (recomputation,
//! micro-batch, optimizer sharding, then the parallel shape and schedule), pricing
//! each intermediate configuration with the same model the search ranks with, so that
//! the claimed gain splits into named factors whose product is the whole claim.
//!
//! The search is held to what the run's stack offered: the row's software
//! assumptions, overlaps, gradient and moment precisions and dispatcher; Megatron's
//! schedules (1F1B and interleaved 1F1B, all the published runs' frameworks run);
//! and, for the 2021-22 Megatron-LM stack (plain data parallelism, see
//! [`crate::runs`]), no sharded optimizer and no context parallelism, which that
//! stack did not have, and sequence parallelism and selective recomputation only
//! where the run used them.

use serde::Serialize;

use crate::banded::{estimate_with, simulated};
use crate::calibration::median;
use crate::config::{ParallelConfig, Recompute, Rejection, Zero};
use crate::cost::Estimate;
use crate::runs::RunCase;
use crate::schedule::Schedule;
use crate::search::{search, SearchSpace};

/// One knob group the walk from the experts' configuration to the top plan changes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// What changed, e.g. "recompute full -> none" or "TP 8 -> 2, PP 1 -> 4".
    pub change: String,
    /// Predicted step after the change over before it (below 1: faster). Steps
    /// whose intermediate configuration is invalid on its own (it does not fit, or
    /// breaks a rule) are merged into the next one.
    pub factor: f64,
}

/// The search's claim for one run.
#[derive(Debug, Clone, Serialize)]
pub struct Claim {
    pub id: String,
    pub source: String,
    pub moe: bool,
    pub measured_secs: f64,
    /// Predicted at the experts' configuration (what `validate` prints).
    pub experts_secs: f64,
    /// Predicted for the search's first plan.
    pub top_secs: f64,
    /// The first plan, in one line.
    pub top: String,
    /// The experts' configuration, in one line.
    pub experts: String,
    /// Top plan predicted over the measurement: what a user is promised against
    /// what the experts achieved.
    pub top_over_measured: f64,
    /// Top plan predicted over the experts' configuration predicted: the gain the
    /// cost model claims for the search's choices alone.
    pub top_over_experts: f64,
    /// The experts' configuration predicted over measured: the model's own error
    /// there (negative: too fast).
    pub model_error: f64,
    /// The claimed gain split into knob groups, in walk order.
    pub steps: Vec<Step>,
}

/// Why a run has no claim.
#[derive(Debug, Clone, Serialize)]
pub struct NoClaim {
    pub id: String,
    pub reason: String,
}

/// The space the search may use for `case`: everything Sextant searches, less what
/// the run's software stack did not offer (module doc).
pub fn stack_space(case: &RunCase) -> SearchSpace {
    let c = &case.config;
    let old_stack = c.zero == Zero::None && case.assumptions.framework.is_megatron_core();
    let mut space = SearchSpace {
        schedule: Some(vec![Schedule::OneFOneB, Schedule::Interleaved]),
        overlap: c.overlap,
        bf16_grads: c.bf16_grads,
        bf16_moments: c.bf16_moments,
        moe_dispatcher: c.moe_dispatcher,
        assumptions: case.assumptions,
        ..SearchSpace::default()
    };
    // Aleph Alpha's `scaling` runs only what `Framework::check_config` allows.
    if case.assumptions.framework == crate::cost::Framework::Scaling {
        space.schedule = Some(vec![Schedule::OneFOneB]);
        space.vpp = Some(vec![1]);
        space.cp = Some(vec![1]);
        space.ep = Some(vec![1]);
        space.etp = Some(vec![1]);
        space.zero = vec![Zero::None, Zero::DistOpt];
        space.recompute = vec![Recompute::None, Recompute::Full];
        space.bf16_moments = false;
    }
    if old_stack {
        space.zero = vec![Zero::None];
        space.cp = Some(vec![1]);
        // Sequence parallelism and selective recomputation arrived with
        // Korthikanti et al. (2022): a run of that stack without them (SC'21's, and
        // that paper's own full-recomputation baselines) searches without them.
        if !c.sp {
            space.sp = Some(vec![false]);
        }
        if c.recompute != Recompute::Selective {
            space.recompute = vec![Recompute::None, Recompute::Full];
        }
    }
    space
}

fn priced(case: &RunCase, cfg: &ParallelConfig) -> Result<Estimate, Rejection> {
    estimate_with(
        &case.model,
        &case.cluster,
        &case.workload,
        cfg,
        case.assumptions,
    )
    .map(|e| simulated(e, cfg))
}

/// One line for a configuration, in the plan table's words.
pub fn describe(c: &ParallelConfig) -> String {
    let mut s = format!("TP {} PP {}", c.tp, c.pp);
    if c.vpp > 1 {
        s += &format!(" VPP {}", c.vpp);
    }
    if c.cp > 1 {
        s += &format!(" CP {}", c.cp);
    }
    if c.ep > 1 {
        s += &format!(" EP {}", c.ep);
    }
    if c.etp > 1 {
        s += &format!(" ETP {}", c.etp);
    }
    s += &format!(
        " DP {}, mbs {}, ZeRO {}, recompute {}",
        c.dp, c.mbs, c.zero, c.recompute
    );
    if c.pp > 1 {
        s += &format!(", {}", c.schedule);
    }
    s
}

/// The knob groups of the walk, each a function moving `from` toward `to` and the
/// words for the change (None when the group does not differ).
type Move = fn(&mut ParallelConfig, &ParallelConfig) -> Option<String>;

fn move_recompute(c: &mut ParallelConfig, t: &ParallelConfig) -> Option<String> {
    if c.recompute == t.recompute && c.recompute_modules == t.recompute_modules {
        return None;
    }
    let words = if c.recompute == t.recompute {
        format!(
            "recomputed modules {} -> {}",
            c.recompute_modules, t.recompute_modules
        )
    } else {
        format!("recompute {} -> {}", c.recompute, t.recompute)
    };
    c.recompute = t.recompute;
    c.recompute_modules = t.recompute_modules;
    Some(words)
}

fn move_mbs(c: &mut ParallelConfig, t: &ParallelConfig) -> Option<String> {
    (c.mbs != t.mbs).then(|| {
        let words = format!("micro-batch {} -> {}", c.mbs, t.mbs);
        c.mbs = t.mbs;
        words
    })
}

fn move_zero(c: &mut ParallelConfig, t: &ParallelConfig) -> Option<String> {
    (c.zero != t.zero).then(|| {
        let words = format!("ZeRO {} -> {}", c.zero, t.zero);
        c.zero = t.zero;
        words
    })
}

fn move_shape(c: &mut ParallelConfig, t: &ParallelConfig) -> Option<String> {
    let mut parts = Vec::new();
    for ((name, a), (_, b)) in c.named_degrees().into_iter().zip(t.named_degrees()) {
        if a != b {
            parts.push(format!("{name} {a} -> {b}"));
        }
    }
    if c.sp != t.sp {
        parts.push(format!("SP {} -> {}", on_off(c.sp), on_off(t.sp)));
    }
    if c.schedule != t.schedule {
        parts.push(format!("{} -> {}", c.schedule, t.schedule));
    }
    if parts.is_empty() && c.layout == t.layout {
        return None;
    }
    if parts.is_empty() {
        parts.push("stage layout".into());
    }
    let (mbs, zero, recompute, modules) = (c.mbs, c.zero, c.recompute, c.recompute_modules);
    *c = t.clone();
    // The knobs moved by the earlier groups stay as they were moved.
    c.mbs = mbs;
    c.zero = zero;
    c.recompute = recompute;
    c.recompute_modules = modules;
    Some(parts.join(", "))
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// The walk from `experts` to `top`: one step per knob group that differs, each
/// intermediate priced by `price` (None: the model rejects it, and the step merges
/// into the next). The factors multiply to `top` over `experts` exactly.
pub fn walk(
    price: impl Fn(&ParallelConfig) -> Option<f64>,
    experts: (&ParallelConfig, f64),
    top: (&ParallelConfig, f64),
) -> Vec<Step> {
    let moves: [Move; 4] = [move_recompute, move_mbs, move_zero, move_shape];
    let mut steps = Vec::new();
    let mut cfg = experts.0.clone();
    let mut last = experts.1;
    let mut pending: Vec<String> = Vec::new();
    for m in moves {
        let Some(words) = m(&mut cfg, top.0) else {
            continue;
        };
        pending.push(words);
        // Once every group has moved, the configuration is the top plan's.
        let now = if cfg == *top.0 {
            Some(top.1)
        } else {
            price(&cfg)
        };
        if let Some(now) = now {
            steps.push(Step {
                change: pending.join("; "),
                factor: now / last,
            });
            pending.clear();
            last = now;
        }
    }
    if !pending.is_empty() {
        // The last groups' intermediate was rejected and the shape did not differ:
        // the top plan closes the walk.
        steps.push(Step {
            change: pending.join("; "),
            factor: top.1 / last,
        });
    }
    steps
}

/// The search's claim for one run (module doc), or why there is none.
pub fn claim(case: &RunCase) -> Result<Claim, NoClaim> {
    let no = |reason: String| NoClaim {
        id: case.id.clone(),
        reason,
    };
    let (ecfg, est) = case
        .estimate_config()
        .map_err(|r| no(format!("the experts' configuration is rejected: {r}")))?;
    let res = search(
        &case.model,
        &case.cluster,
        &case.workload,
        &stack_space(case),
        1,
    );
    let Some(best) = res.top.first() else {
        return Err(no(format!(
            "no configuration fits ({} enumerated)",
            res.enumerated
        )));
    };
    let measured = case.measured_step_secs();
    Ok(Claim {
        id: case.id.clone(),
        source: case.source.clone(),
        moe: case.moe,
        measured_secs: measured,
        experts_secs: est.step_secs,
        top_secs: best.estimate.step_secs,
        top: describe(&best.config),
        experts: describe(&ecfg),
        top_over_measured: best.estimate.step_secs / measured,
        top_over_experts: best.estimate.step_secs / est.step_secs,
        model_error: est.step_secs / measured - 1.0,
        steps: walk(
            |c| priced(case, c).ok().map(|e| e.step_secs),
            (&ecfg, est.step_secs),
            (&best.config, best.estimate.step_secs),
        ),
    })
}

/// [`claim`] for every run, in order, with the runs that have none.
pub fn claims(cases: &[RunCase]) -> (Vec<Claim>, Vec<NoClaim>) {
    let mut ok = Vec::new();
    let mut none = Vec::new();
    for c in cases {
        match claim(c) {
            Ok(x) => ok.push(x),
            Err(n) => none.push(n),
        }
    }
    (ok, none)
}

/// Medians over the runs with a claim.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Summary {
    pub runs: usize,
    pub median_top_over_measured: f64,
    pub median_top_over_experts: f64,
    /// Runs whose first plan is predicted more than 15% faster than measured.
    pub below_085: usize,
}

/// [`Summary`] of `claims` (None for none).
pub fn summarize(claims: &[Claim]) -> Option<Summary> {
    let med = |f: fn(&Claim) -> f64| median(&claims.iter().map(f).collect::<Vec<_>>());
    Some(Summary {
        runs: claims.len(),
        median_top_over_measured: med(|c| c.top_over_measured)?,
        median_top_over_experts: med(|c| c.top_over_experts)?,
        below_085: claims.iter().filter(|c| c.top_over_measured < 0.85).count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "id,source,gpu,gpus_per_node,gpus,model,layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq,moe_experts,moe_topk,moe_ffn_hidden,moe_shared_experts,tp,pp,vpp,cp,ep,sp,dp,mbs,gbs,recompute,zero,precision,metric,value,note\n\
k22,test,a100-80g,8,8,gpt-22b,48,6144,24576,64,64,51200,2048,,,,,8,1,1,1,1,false,1,4,4,full,0,fp16,iter_s,1.42,\n";

    fn case() -> RunCase {
        crate::runs::parse_runs_with(CSV, None)
            .unwrap()
            .into_iter()
            .next()
            .unwrap()
            .unwrap()
    }

    #[test]
    fn old_stack_searches_neither_sharded_optimizers_nor_cp() {
        let s = stack_space(&case());
        assert_eq!(s.zero, vec![Zero::None]);
        assert_eq!(s.cp, Some(vec![1]));
        // The full-recomputation baseline had neither SP nor selective recomputation.
        assert_eq!(s.sp, Some(vec![false]));
        assert_eq!(s.recompute, vec![Recompute::None, Recompute::Full]);
        assert_eq!(
            s.schedule,
            Some(vec![Schedule::OneFOneB, Schedule::Interleaved])
        );
        assert!(!s.assumptions.flash_attention);
    }

    /// The space `validate --search` gives an Aleph Alpha `scaling` row holds
    /// only what `Framework::check_config` accepts: the two statements of what
    /// scaling runs agree.
    #[test]
    fn scaling_searches_only_what_scaling_runs() {
        let csv = CSV
            .replace(",note\n", ",note,framework,attention\n")
            .replace(
                ",1,4,4,full,0,fp16,iter_s,1.42,\n",
                ",1,4,4,full,1,bf16,iter_s,1.42,,scaling,flash\n",
            );
        let c = crate::runs::parse_runs_with(&csv, None)
            .unwrap()
            .remove(0)
            .unwrap();
        assert_eq!(c.assumptions.framework, crate::cost::Framework::Scaling);
        let r = crate::search::search(&c.model, &c.cluster, &c.workload, &stack_space(&c), 50);
        assert!(!r.top.is_empty());
        for cand in &r.top {
            assert_eq!(c.assumptions.framework.check_config(&cand.config), Ok(()));
        }
    }

    #[test]
    fn walk_factors_multiply_to_the_claim() {
        let c = claim(&case()).unwrap();
        let product: f64 = c.steps.iter().map(|s| s.factor).product();
        assert!(
            (product - c.top_over_experts).abs() < 1e-9,
            "{product} vs {}",
            c.top_over_experts
        );
        // The experts ran full recomputation at TP 8; the first plan differs.
        assert!(!c.steps.is_empty());
        assert!(c.top_over_experts <= 1.0 + 1e-9, "{c:?}");
    }

    #[test]
    fn walk_merges_a_rejected_intermediate_into_the_next_step() {
        let c = case();
        let (ecfg, est) = c.estimate_config().unwrap();
        let mut top = ecfg.clone();
        top.recompute = Recompute::None;
        top.mbs = 1;
        top.tp = 4;
        top.pp = 2;
        // A made-up price that accepts everything: one step per knob group.
        let made_up = |cfg: &ParallelConfig| {
            Some(1.0 + cfg.mbs as f64 + cfg.tp as f64 / 10.0 + cfg.recompute as u8 as f64)
        };
        let (e0, t0) = (made_up(&ecfg).unwrap(), made_up(&top).unwrap());
        let all = walk(made_up, (&ecfg, e0), (&top, t0));
        let changes: Vec<&str> = all.iter().map(|s| s.change.as_str()).collect();
        assert_eq!(
            changes,
            [
                "recompute full -> none",
                "micro-batch 4 -> 1",
                "TP 8 -> 4, PP 1 -> 2"
            ]
        );
        // The cost model itself rejects the first intermediate: no recomputation
        // at the experts' TP 8 and micro-batch 4 does not fit the 22B model in
        // 80 GB, so that step merges into the micro-batch one.
        let price = |cfg: &ParallelConfig| priced(&c, cfg).ok().map(|e| e.step_secs);
        let top_secs = price(&top).unwrap();
        let merged = walk(price, (&ecfg, est.step_secs), (&top, top_secs));
        let changes: Vec<&str> = merged.iter().map(|s| s.change.as_str()).collect();
        assert_eq!(
            changes,
            [
                "recompute full -> none; micro-batch 4 -> 1",
                "TP 8 -> 4, PP 1 -> 2"
            ]
        );
        for (steps, whole) in [(&all, t0 / e0), (&merged, top_secs / est.step_secs)] {
            let product: f64 = steps.iter().map(|s| s.factor).product();
            assert!((product - whole).abs() < 1e-9);
        }
        // Nothing differs: no steps.
        assert!(walk(price, (&ecfg, est.step_secs), (&ecfg, est.step_secs)).is_empty());
    }
}
