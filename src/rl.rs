//! `sextant rl-plan`: an RL iteration (verl, RLinf) searched over both placements,
//! printed as the best of each side by side and the ranked plans, optionally with the
//! chosen plan's verl or RLinf configuration.

use anyhow::{bail, Result};
use clap::Args;
use sextant_exports::rl::{rlinf, verl, RlExport};
use sextant_planner::config::Precision;
use sextant_planner::hardware::{HardwareProfile, GIB};
use sextant_planner::rl::search::{PlacementKind, RlSearch};
use sextant_planner::rl::{plan, Algorithm, Lengths, RlFramework, RlPlan, RlWorkload};

use crate::args::{load_model, load_profile};

#[derive(Args, Debug)]
pub struct RlPlanArgs {
    /// The actor (and reference) model: a preset, a Hugging Face config.json or a model JSON.
    #[arg(long)]
    pub model: String,
    /// PPO's critic (`--critic` with the actor's name for a critic of the same shape).
    #[arg(long)]
    pub critic: Option<String>,
    /// A learned reward model (forward passes only); omit for rule-based rewards.
    #[arg(long)]
    pub reward: Option<String>,
    /// No reference model (no KL term).
    #[arg(long = "no-reference")]
    pub no_reference: bool,
    /// grpo or ppo.
    #[arg(long, default_value = "grpo")]
    pub algorithm: String,
    #[arg(long)]
    pub gpus: u64,
    /// Built-in hardware profile (default h100-sxm).
    #[arg(long, conflicts_with = "cluster")]
    pub gpu: Option<String>,
    /// Your own hardware profile JSON.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Prompts per iteration.
    #[arg(long, default_value_t = 512)]
    pub prompts: u64,
    /// Responses generated per prompt (verl rollout.n, RLinf group_size).
    #[arg(long, default_value_t = 8)]
    pub responses: u64,
    /// Mean prompt tokens.
    #[arg(long = "prompt-len", default_value_t = 512)]
    pub prompt_len: u64,
    /// Longest prompt (the frameworks' prompt-length limit); default the mean.
    #[arg(long = "prompt-max")]
    pub prompt_max: Option<u64>,
    /// Mean response tokens.
    #[arg(long = "response-len", default_value_t = 2048)]
    pub response_len: u64,
    /// Longest response of an iteration (the tail, often the length cap); default the mean.
    #[arg(long = "response-max")]
    pub response_max: Option<u64>,
    /// Optimizer steps per iteration.
    #[arg(long = "mini-batches", default_value_t = 4)]
    pub mini_batches: u64,
    /// Passes over the batch per iteration (ppo_epochs).
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// bf16 or fp16.
    #[arg(long, default_value = "bf16")]
    pub precision: String,
    /// Placements to search: colocated, disaggregated.
    #[arg(long, value_delimiter = ',', default_value = "colocated,disaggregated")]
    pub placement: Vec<String>,
    /// Rollout engine TP sizes to try (default: the divisors of a node).
    #[arg(long = "rollout-tp", value_delimiter = ',')]
    pub rollout_tp: Option<Vec<u64>>,
    /// Training-pool sizes of the disaggregated placement (default: every whole-node split).
    #[arg(long = "train-gpus", value_delimiter = ',')]
    pub train_gpus: Option<Vec<u64>>,
    /// Training TP sizes to search.
    #[arg(long, value_delimiter = ',')]
    pub tp: Option<Vec<u64>>,
    /// Training PP sizes to search.
    #[arg(long, value_delimiter = ',')]
    pub pp: Option<Vec<u64>>,
    /// Training EP sizes to search.
    #[arg(long, value_delimiter = ',')]
    pub ep: Option<Vec<u64>>,
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Also print the best plan's configuration: verl or rlinf.
    #[arg(long)]
    pub emit: Option<String>,
}

fn workload(a: &RlPlanArgs) -> Result<RlWorkload> {
    let (actor, _) = load_model(&a.model)?;
    let critic = match &a.critic {
        Some(m) => Some(load_model(m)?.0),
        None => None,
    };
    let reward = match &a.reward {
        Some(m) => Some(load_model(m)?.0),
        None => None,
    };
    let Some(algorithm) = Algorithm::parse(&a.algorithm) else {
        bail!(
            "unknown --algorithm '{}' (grpo or ppo)",
            sextant_planner::json::one_line(&a.algorithm, 60)
        );
    };
    let precision = match Precision::parse(&a.precision) {
        Some(p @ (Precision::Bf16 | Precision::Fp16)) => p,
        _ => bail!(
            "--precision '{}': RL plans train in bf16 or fp16 (verl and RLinf state no FP8 actor setting)",
            sextant_planner::json::one_line(&a.precision, 60)
        ),
    };
    Ok(RlWorkload {
        actor,
        critic,
        reward,
        reference: !a.no_reference,
        algorithm,
        prompts: a.prompts,
        responses_per_prompt: a.responses,
        lengths: Lengths {
            prompt_mean: a.prompt_len,
            prompt_max: a.prompt_max.unwrap_or(a.prompt_len),
            response_mean: a.response_len,
            response_max: a.response_max.unwrap_or(a.response_len),
        },
        mini_batches: a.mini_batches,
        epochs: a.epochs,
        precision,
    })
}

fn search_of(a: &RlPlanArgs) -> Result<RlSearch> {
    let placements = a
        .placement
        .iter()
        .map(|p| match p.as_str() {
            "colocated" => Ok(PlacementKind::Colocated),
            "disaggregated" => Ok(PlacementKind::Disaggregated),
            other => bail!(
                "unknown --placement '{}' (colocated, disaggregated)",
                sextant_planner::json::one_line(other, 60)
            ),
        })
        .collect::<Result<_>>()?;
    let mut s = RlSearch {
        placements,
        ..RlSearch::default()
    };
    if let Some(v) = &a.rollout_tp {
        if v.contains(&0) {
            bail!("--rollout-tp sizes must be at least 1");
        }
    }
    s.rollout_tp = a.rollout_tp.clone();
    if let Some(v) = &a.train_gpus {
        if a.gpus < 2 {
            bail!(
                "--train-gpus sizes a disaggregated training pool, which needs at least 2 GPUs (one training, one rollout); --gpus is {}",
                a.gpus
            );
        }
        if let Some(&bad) = v.iter().find(|&&t| t == 0 || t >= a.gpus) {
            bail!(
                "--train-gpus {bad}: a disaggregated training pool takes 1 to {} of the {} GPUs (the rest run the rollout)",
                a.gpus.saturating_sub(1),
                a.gpus
            );
        }
        if !s.placements.contains(&PlacementKind::Disaggregated) {
            bail!("--train-gpus sizes the disaggregated placement's training pool, which --placement colocated does not search: add --placement disaggregated or drop --train-gpus");
        }
    }
    s.train_gpus = a.train_gpus.clone();
    for (name, v) in [("tp", &a.tp), ("pp", &a.pp), ("ep", &a.ep)] {
        crate::check_knobs(name, v)?;
    }
    s.space.tp = a.tp.clone();
    s.space.pp = a.pp.clone();
    s.space.ep = a.ep.clone();
    // The same range as plan's: asked for no plan, it printed one.
    if a.top == 0 || a.top > 10_000 {
        bail!("--top {} is out of range: use 1 to 10000", a.top);
    }
    s.top = a.top;
    Ok(s)
}

pub fn cmd_rl_plan(a: RlPlanArgs) -> Result<()> {
    let w = workload(&a)?;
    let hw = load_profile(a.gpu.as_deref(), a.cluster.as_deref())?;
    if a.gpus == 0 {
        bail!("--gpus must be at least 1");
    }
    let most = sextant_planner::hardware::MAX_GPUS;
    if a.gpus > most {
        bail!(
            "--gpus {}: more than Sextant models (at most {most})",
            a.gpus
        );
    }
    // --emit names the framework: the search keeps what it runs and prices its
    // mechanics (RlFramework).
    let framework = match &a.emit {
        Some(e) => Some(RlFramework::parse(e).ok_or_else(|| {
            anyhow::anyhow!(
                "--emit '{}': the RL exports are verl and rlinf",
                sextant_planner::json::one_line(e, 60)
            )
        })?),
        None => None,
    };
    let s = RlSearch {
        framework,
        ..search_of(&a)?
    };
    let r = plan(&w, &hw, a.gpus, &s)?;
    print!("{}", header(&w, &hw, a.gpus));
    match framework {
        Some(f) => println!(
            "searched for {}: only what it runs, with its reference and offload mechanics (docs/rl.md)",
            f.label()
        ),
        None => println!("searched for no framework in particular: --emit verl or rlinf plans for one (docs/rl.md)"),
    }
    let rejected: u64 = r.rejected.values().sum();
    println!(
        "searched {} configurations ({} rejected{})",
        r.evaluated,
        rejected,
        r.reasons
            .iter()
            .map(|(k, why)| format!("; {k}: {} e.g. {why}", r.rejected[k]))
            .collect::<String>()
    );
    println!();
    print!(
        "{}",
        side_by_side(
            r.best_colocated.as_ref(),
            r.best_disaggregated.as_ref(),
            &r.placements,
            &hw.name,
            w.actor.moe.is_some()
        )
    );
    if let Some((p, b)) = r.plans.first().and_then(|p| {
        sextant_planner::uncertainty::rl_band(&hw.name, w.actor.moe.is_some(), p.times.iteration)
            .map(|b| (p, b))
    }) {
        println!(
            "iteration band: the model's errors on {} (NeMo RL's, and RLinf's from its comparison with verl; each from its stated configuration){}",
            b.basis,
            if b.low_secs > p.times.iteration {
                "; every one took longer than predicted, so read the point as optimistic"
            } else {
                ""
            }
        );
    }
    println!();
    print!("{}", ranked(&r.plans));
    if let Some(p) = r.plans.first() {
        let (busy, engines) = (p.rollout.busy_engines, p.rollout.layout.engines);
        if busy < engines {
            eprintln!(
                "note: {} of the first plan's {engines} rollout engines get no response: an iteration has {} responses for {} GPUs; give more --prompts or --responses, or fewer --gpus",
                engines - busy,
                w.sequences(),
                a.gpus
            );
        }
    }
    if let Some(target) = &a.emit {
        let x = RlExport {
            plan: &r.plans[0],
            workload: &w,
            hardware: &hw,
        };
        let text = match RlFramework::parse(target) {
            Some(RlFramework::Verl) => verl(&x),
            _ => rlinf(&x),
        }?;
        println!();
        print!("{text}");
    }
    Ok(())
}

fn header(w: &RlWorkload, hw: &HardwareProfile, gpus: u64) -> String {
    let l = &w.lengths;
    // Names as one line each (a config.json's name may hold anything).
    let name =
        |m: &sextant_planner::model::ModelSpec| sextant_planner::json::one_line(&m.name, 120);
    let mut models = vec![format!("actor {}", name(&w.actor))];
    if w.reference {
        models.push("reference".into());
    }
    if let Some(c) = &w.critic {
        models.push(format!("critic {}", name(c)));
    }
    if let Some(m) = &w.reward {
        models.push(format!("reward {}", name(m)));
    }
    format!(
        "RL iteration ({}): {} on {gpus} x {}\n{} prompts x {} responses; prompt {} tokens, response mean {} / longest {}; {} mini-batches x {} epochs\n",
        w.algorithm.name().to_uppercase(),
        models.join(", "),
        hw.gpu.name,
        w.prompts,
        w.responses_per_prompt,
        l.prompt_mean,
        l.response_mean,
        l.response_max,
        w.mini_batches,
        w.epochs
    )
}

fn layout(p: &RlPlan) -> String {
    let c = &p.train.config;
    let mut s = format!("TP{} PP{}", c.tp, c.pp);
    if c.vpp > 1 {
        s += &format!(" VPP{}", c.vpp);
    }
    s += &format!(" DP{}", c.dp);
    if c.cp > 1 {
        s += &format!(" CP{}", c.cp);
    }
    if c.ep > 1 {
        s += &format!(" EP{}", c.ep);
    }
    if c.etp > 1 {
        s += &format!(" ETP{}", c.etp);
    }
    s += &format!(" mbs{} {}", c.mbs, c.recompute_label());
    s
}

/// The iteration's band from the published RL runs' errors, as a cell.
fn band_cell(p: &RlPlan, profile: &str, moe: bool) -> String {
    match sextant_planner::uncertainty::rl_band(profile, moe, p.times.iteration) {
        Some(b) => format!(
            "{:.1} to {:.1} ({:.0}%)",
            b.low_secs,
            b.high_secs,
            100.0 * b.coverage
        ),
        None => "none".into(),
    }
}

fn gib(b: f64) -> String {
    format!("{:.1}", b / GIB)
}

/// The best plan of each placement, one column each, with each iteration's band
/// (the published RL runs' errors, on `profile` for a model of kind `moe`).
/// The best plan of each placement, column by column; a placement the search
/// left out (`--placement`) says so rather than "none fits".
pub fn side_by_side(
    c: Option<&RlPlan>,
    d: Option<&RlPlan>,
    searched: &[PlacementKind],
    profile: &str,
    moe: bool,
) -> String {
    let empty = |k: PlacementKind| {
        if searched.contains(&k) {
            "none fits"
        } else {
            "not searched (--placement, --emit)"
        }
    };
    let (empty_c, empty_d) = (
        empty(PlacementKind::Colocated),
        empty(PlacementKind::Disaggregated),
    );
    type Row = (&'static str, fn(&RlPlan) -> String);
    let rows: [Row; 14] = [
        ("GPUs train / rollout", |p| {
            format!("{} / {}", p.placement.train_gpus, p.placement.rollout_gpus)
        }),
        ("training layout", layout),
        ("rollout engines", |p| {
            // More engines than sequences: say how many ever get one.
            let busy = if p.rollout.busy_engines < p.rollout.layout.engines {
                format!(" ({} busy)", p.rollout.busy_engines)
            } else {
                String::new()
            };
            format!(
                "TP{} x {}{busy}, {} seqs each",
                p.rollout.layout.tp, p.rollout.layout.engines, p.rollout.concurrent
            )
        }),
        ("engine memory fraction", |p| {
            format!("{:.2}", p.memory_fraction)
        }),
        ("params offloaded", |p| {
            (p.placement.kind == PlacementKind::Colocated && p.offload_params).to_string()
        }),
        ("rollout (s)", |p| format!("{:.1}", p.times.rollout)),
        ("resharding (s)", |p| format!("{:.2}", p.times.reshard)),
        ("offload/onload (s)", |p| format!("{:.2}", p.times.offload)),
        ("forward passes (s)", |p| format!("{:.1}", p.times.forward)),
        ("training (s)", |p| format!("{:.1}", p.times.training)),
        ("iteration (s)", |p| format!("{:.1}", p.times.iteration)),
        ("tokens/s/GPU", |p| {
            format!("{:.0}", p.tokens_per_sec_per_gpu)
        }),
        ("memory GiB roll/fwd/train", |p| {
            // Phases past the three named say their own name (PPO's critic).
            let m: Vec<String> = p
                .memory
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    if i < 3 {
                        gib(m.bytes)
                    } else {
                        format!("{} {}", m.phase, gib(m.bytes))
                    }
                })
                .collect();
            m.join(" / ")
        }),
        ("usable GiB", |p| gib(p.capacity_bytes)),
    ];
    let cell = |p: Option<&RlPlan>, f: fn(&RlPlan) -> String, none: &str| {
        p.map(f).unwrap_or_else(|| none.to_string())
    };
    let mut lines: Vec<(&str, String, String)> = vec![(
        "best of each placement",
        "colocated".into(),
        "disaggregated".into(),
    )];
    for (name, f) in rows {
        lines.push((name, cell(c, f, empty_c), cell(d, f, empty_d)));
        if name == "iteration (s)" {
            let b = |p: Option<&RlPlan>, none: &str| {
                p.map_or_else(|| none.to_string(), |p| band_cell(p, profile, moe))
            };
            lines.push(("iteration band (s)", b(c, empty_c), b(d, empty_d)));
        }
    }
    // The first column is as wide as its widest cell, so a long training layout
    // never runs into the second.
    let width = (lines.iter().map(|l| l.1.len()).max().unwrap_or(0) + 1).max(32);
    lines
        .iter()
        .map(|(name, a, b)| format!("{name:<27} {a:<width$} {b}\n"))
        .collect()
}

/// The ranked plans, one line each.
pub fn ranked(plans: &[RlPlan]) -> String {
    // Every plan of one workload checks the same phases; the ones past the three
    // every plan has (PPO's critic training, a learned reward's pass) are named.
    let mem_header = plans.first().map_or_else(String::new, |p| {
        p.memory
            .iter()
            .skip(3)
            .fold("mem GiB roll/fwd/train".to_string(), |h, m| {
                h + "/" + m.phase.split(' ').next().unwrap_or(m.phase)
            })
    });
    // The pool sizes and layouts as wide as their widest cell, so that a large
    // cluster's columns stay aligned.
    let pools: Vec<String> = plans
        .iter()
        .map(|p| format!("{}/{}", p.placement.train_gpus, p.placement.rollout_gpus))
        .collect();
    let pw = pools.iter().map(String::len).max().unwrap_or(0).max(9);
    let layouts: Vec<String> = plans.iter().map(layout).collect();
    let lw = layouts.iter().map(String::len).max().unwrap_or(0).max(46);
    let mut s = format!(
        "{:<2} {:<13} {:>pw$} {:<lw$} {:>4} {:>5} {:>4} {:>8} {:>8} {:>8} {:>8} {:>8} {}\n",
        "#",
        "placement",
        "trn/roll",
        "training layout",
        "rTP",
        "rmem",
        "poff",
        "iter(s)",
        "rollout",
        "reshard",
        "fwd",
        "train",
        mem_header
    );
    for (i, p) in plans.iter().enumerate() {
        let m: Vec<String> = p.memory.iter().map(|m| gib(m.bytes)).collect();
        s += &format!(
            "{:<2} {:<13} {:>pw$} {:<lw$} {:>4} {:>5.2} {:>4} {:>8.1} {:>8.1} {:>8.2} {:>8.1} {:>8.1} {}\n",
            i + 1,
            p.placement.kind.name(),
            pools[i],
            layouts[i],
            p.rollout.layout.tp,
            p.memory_fraction,
            if p.placement.kind == PlacementKind::Colocated && p.offload_params {
                "y"
            } else {
                "n"
            },
            p.times.iteration,
            p.times.rollout,
            p.times.reshard + p.times.offload,
            p.times.forward,
            p.times.training,
            m.join("/")
        );
    }
    s + "  rTP: rollout engine TP; rmem: engine memory fraction (vLLM gpu_memory_utilization); poff: training parameters offloaded to host during rollout\n  reshard: weight transfer into the engines, plus (colocated) training state to host memory and back\n"
}
