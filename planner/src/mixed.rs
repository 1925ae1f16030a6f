//! Pipelines over mixed clusters (for example 64 H100 + 64 A100): which GPU class
//! each stage runs on and how many layers each stage holds, from the integer
//! program of [`crate::partition`] fed with each class's costs from this cost
//! model.
//!
//! Each class hosts whole pipeline stages (its GPU count divided by the GPUs of one
//! stage, tp x cp x dp) as one contiguous block. Per-layer time on a class is the
//! cost model's time on that class's profile; memory limits are each class's HBM.
//! The slower class's extras (embedding, output layer) scale with the same
//! slowdown. Traffic between the classes is costed as on the first class.

use serde::Serialize;

use crate::config::{ParallelConfig, Workload};
use crate::cost::{stage_problem, Assumptions};
use crate::hardware::{Cluster, HardwareProfile};
use crate::model::ModelSpec;
use crate::partition::{solve, GpuClass, Partition, StageProblem};
use crate::schedule::{simulate_schedule, PassCosts, Schedule};

#[derive(Debug, Clone, Serialize)]
pub struct MixedStage {
    pub stage: usize,
    pub class: String,
    pub layers: u64,
    pub secs_per_micro_batch: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MixedPlan {
    pub stages: Vec<MixedStage>,
    /// Pipeline time of one step (simulated 1F1B), optimised partition.
    pub pipeline_secs: f64,
    /// The same with layers split evenly over the same stage blocks (None when an
    /// even split does not fit).
    pub even_pipeline_secs: Option<f64>,
}

fn pipeline_secs(
    p: &StageProblem,
    part: &Partition,
    m: u64,
) -> Result<(Vec<f64>, f64), MixedError> {
    let secs: Vec<f64> = (0..p.stages())
        .map(|s| {
            p.classes[part.class[s]].slowdown
                * (part.layers[s] as f64 * p.layer_secs
                    + part.recomputed[s] as f64 * p.recompute_secs
                    + p.stage_extra_secs[s])
        })
        .collect();
    let costs = PassCosts {
        forward: secs.iter().map(|x| x / 3.0).collect(),
        backward: secs.iter().map(|x| 2.0 * x / 3.0).collect(),
        weight: vec![0.0; secs.len()],
    };
    let span = simulate_schedule(Schedule::OneFOneB, p.stages() as u64, 1, m, &costs, 0.0)
        .map(|t| t.makespan)
        .ok_or(MixedError::NotSimulated)?;
    Ok((secs, span))
}

/// Why a configuration cannot be partitioned over a mixed cluster ([`plan_mixed`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MixedError {
    #[error("a mixed cluster needs at least two GPU classes")]
    OneClass,
    #[error("tp x pp x cp x dp = {config} but the classes add up to {classes} GPUs")]
    GpuCount { config: u64, classes: u64 },
    #[error("mixed clusters are simulated under 1F1B only (this configuration uses {0})")]
    Schedule(Schedule),
    #[error(
        "{gpus} {class} GPUs do not make whole pipeline stages of tp x cp x dp = {per_stage} GPUs"
    )]
    PartialStage {
        gpus: u64,
        class: String,
        per_stage: u64,
    },
    #[error("{0}")]
    Cluster(crate::InputError),
    #[error("{class}: {why}")]
    Rejected {
        class: String,
        why: crate::config::Rejection,
    },
    #[error("no partition fits the classes' memory")]
    NoPartition,
    #[error("{micro_batches} micro-batches on {stages} stages is more than the simulator takes (at most {} passes): use a smaller global batch", crate::cost::MAX_SIMULATED_PASSES)]
    TooManyPasses { micro_batches: u64, stages: usize },
    #[error("the 1F1B schedule could not be simulated for this shape")]
    NotSimulated,
}

/// Partitions `cfg`'s pipeline over `classes` (profile, GPU count). `cfg.gpus()` must
/// equal the total, `cfg.vpp` must be 1 and the schedule 1F1B.
pub fn plan_mixed(
    model: &ModelSpec,
    classes: &[(HardwareProfile, u64)],
    w: &Workload,
    cfg: &ParallelConfig,
    a: Assumptions,
) -> Result<MixedPlan, MixedError> {
    // Saturating: counts near u64::MAX must not wrap to a total that matches.
    let total = classes.iter().fold(0u64, |t, (_, n)| t.saturating_add(*n));
    if classes.len() < 2 {
        return Err(MixedError::OneClass);
    }
    if cfg.gpus() != total {
        return Err(MixedError::GpuCount {
            config: cfg.gpus(),
            classes: total,
        });
    }
    if cfg.schedule != Schedule::OneFOneB {
        return Err(MixedError::Schedule(cfg.schedule));
    }
    let per_stage = cfg.tp * cfg.cp * cfg.dp;
    let mut gpu_classes = Vec::new();
    let mut problems: Vec<StageProblem> = Vec::new();
    for (profile, n) in classes {
        if n % per_stage != 0 {
            return Err(MixedError::PartialStage {
                gpus: *n,
                class: profile.name.clone(),
                per_stage,
            });
        }
        let cluster = Cluster::new(profile.clone(), total).map_err(MixedError::Cluster)?;
        let prob = stage_problem(model, &cluster, w, cfg, a).map_err(|r| MixedError::Rejected {
            class: profile.name.clone(),
            why: r,
        })?;
        gpu_classes.push(GpuClass {
            name: profile.name.clone(),
            slowdown: 1.0,
            capacity_bytes: profile.capacity_bytes(),
            stages: (n / per_stage) as usize,
        });
        problems.push(prob);
    }
    let mut problem = problems[0].clone();
    for (k, c) in gpu_classes.iter_mut().enumerate() {
        c.slowdown = problems[k].layer_secs / problem.layer_secs;
    }
    problem.classes = gpu_classes;
    let part = solve(&problem).ok_or(MixedError::NoPartition)?;
    let m = cfg.micro_batches(w);
    if 2 * problem.stages() as u64 * m > crate::cost::MAX_SIMULATED_PASSES {
        return Err(MixedError::TooManyPasses {
            micro_batches: m,
            stages: problem.stages(),
        });
    }
    let (secs, span) = pipeline_secs(&problem, &part, m)?;
    // Even split on the same blocks, for comparison.
    let p = problem.stages();
    let even_layers: Vec<u64> = (0..p)
        .map(|s| model.layers / p as u64 + u64::from((s as u64) < model.layers % p as u64))
        .collect();
    let even = Partition {
        layers: even_layers.clone(),
        recomputed: vec![0; p],
        class: part.class.clone(),
        slowest_secs: 0.0,
    };
    let fits = (0..p).all(|s| {
        let bytes = even.layers[s] as f64
            * (problem.layer_state_bytes + problem.in_flight[s] * problem.layer_act_bytes)
            + problem.stage_extra_bytes[s];
        bytes <= problem.classes[even.class[s]].capacity_bytes
    });
    let even_pipeline_secs = if fits {
        Some(pipeline_secs(&problem, &even, m)?.1)
    } else {
        None
    };
    Ok(MixedPlan {
        stages: (0..p)
            .map(|s| MixedStage {
                stage: s,
                class: problem.classes[part.class[s]].name.clone(),
                layers: part.layers[s],
                secs_per_micro_batch: secs[s],
            })
            .collect(),
        pipeline_secs: span,
        even_pipeline_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Dispatcher, Layout, Overlap, Precision, Recompute, Zero};
    use crate::hardware::builtin_profile;
    use crate::presets::resolve;

    /// 64 H100 + 64 A100 training Llama 3 70B at TP 8, PP 16: the H100 stages take
    /// more layers, and the pipeline beats an even split on the same stages.
    #[test]
    fn h100_and_a100_share_a_pipeline() {
        let m = resolve("llama3-70b").unwrap().spec;
        let cfg = ParallelConfig {
            tp: 8,
            pp: 16,
            vpp: 1,
            cp: 1,
            ep: 1,
            etp: 1,
            dp: 1,
            sp: true,
            mbs: 1,
            zero: Zero::DistOpt,
            recompute: Recompute::Selective,
            layout: Layout::Even,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            recompute_modules: Default::default(),
            moe_dispatcher: Dispatcher::AllToAll,
            schedule: Schedule::OneFOneB,
        };
        let w = Workload {
            seq: 4096,
            global_batch: 64,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        };
        let classes = [
            (builtin_profile("h100-sxm").unwrap(), 64),
            (builtin_profile("a100-80g").unwrap(), 64),
        ];
        let plan = plan_mixed(&m, &classes, &w, &cfg, Assumptions::default()).unwrap();
        assert_eq!(plan.stages.len(), 16);
        assert_eq!(plan.stages.iter().map(|s| s.layers).sum::<u64>(), 80);
        let avg = |name: &str| {
            let v: Vec<f64> = plan
                .stages
                .iter()
                .filter(|s| s.class == name)
                .map(|s| s.layers as f64)
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        assert!(
            avg("h100-sxm") > avg("a100-80g") + 1.0,
            "H100 stages should hold more layers: {:?}",
            plan.stages
        );
        let even = plan.even_pipeline_secs.expect("even split fits");
        assert!(
            plan.pipeline_secs < 0.9 * even,
            "optimised {} vs even {even}",
            plan.pipeline_secs
        );
        assert!(plan_mixed(&m, &classes[..1], &w, &cfg, Assumptions::default()).is_err());
    }
}
