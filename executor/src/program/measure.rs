//! Measurements: every rank's statistics sent to rank 0 and merged into the
//! measured run (medians, bus bandwidths, the tier each group spans).

use sextant_planner::calibration::{
    CommPoint, GemmPoint, MeasuredRun, RunChecks, RUN_SCHEMA_VERSION,
};
use sextant_planner::cost::CommKind;

use super::{Options, Setup};
use crate::comm::Kind;
use crate::error::ProgramError;
use crate::mesh::Mesh;
use crate::record::RankStats;

const STATS_TAG: u64 = ((Kind::World as u64) << 56) | 0xFF_FFFF;

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
) -> Result<Option<MeasuredRun>, ProgramError> {
    let (rank, world) = (mesh.rank(), mesh.world());
    if rank != 0 {
        let bytes = serde_json::to_vec(&stats).map_err(|e| ProgramError::Json(e.to_string()))?;
        mesh.send(0, STATS_TAG, &bytes)?;
        return Ok(None);
    }
    let mut all = vec![stats];
    for q in 1..world {
        let bytes = mesh.recv(q, STATS_TAG)?;
        all.push(
            serde_json::from_slice(&bytes).map_err(|e| ProgramError::UnreadableStats {
                rank: q,
                detail: e.to_string(),
            })?,
        );
    }
    let gpn = s.gpus_per_node.max(1);
    // `kind`: a communication kind's record name, as the ranks booked it.
    let spans_nodes = |kind: &str| -> bool {
        let Some(k) = CommKind::from_key(kind) else {
            return false;
        };
        map.groups_of(k.group())
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
