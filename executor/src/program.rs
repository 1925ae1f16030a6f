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
//!
//! The passes live in submodules: `setup` derives the executed sizes from the plan,
//! `rank` holds a rank's state and its pipeline messages, `step` runs one step's
//! passes in the schedule's order, `optimize` reduces gradients and steps Adam,
//! `verify` runs the unsharded reference and the start-up communicator checks, and
//! `measure` merges every rank's measurements into the measured run.

mod measure;
mod optimize;
mod rank;
mod setup;
mod step;
mod verify;

use std::collections::HashMap;
use std::time::Duration;

use sextant_planner::calibration::MeasuredRun;
use sextant_planner::config::Zero;
use sextant_planner::schedule::virtual_stage;

use crate::comm::{Group, Kind};
pub use crate::error::{ExecError, ProgramError, SetupError};
use crate::mesh::Mesh;
use crate::model::LayerParams;
use crate::record::Recorder;
use crate::tensor::Mat;

pub use measure::{collect, incomplete_run};
pub use setup::{plan_hash, prepare, Setup};

use optimize::Adam;
use rank::{Groups, Rank};
use verify::Reference;

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

/// This rank's communicator of `kind`, over its group of that kind in the rank map.
fn group(
    map: &sextant_planner::ranks::RankMap,
    kind: Kind,
    rank: u64,
) -> Result<Group, ProgramError> {
    let k = kind
        .group()
        .ok_or_else(|| ProgramError::NoGroupKind(kind.label().to_string()))?;
    Ok(Group::new(kind, map.group_of(rank, k).to_vec(), rank)?)
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
    let early = |d: &dyn std::fmt::Display| ExecError {
        rank,
        phase: "setting up groups".into(),
        detail: d.to_string(),
    };
    if world != s.cfg.gpus() {
        return Err(early(&format!(
            "the plan needs {} ranks (tp x cp x dp x pp) but {world} were started",
            s.cfg.gpus()
        )));
    }
    let map = s.rank_map().map_err(|e| early(&e))?;
    let g = Groups {
        tp: group(&map, Kind::Tp, rank).map_err(|e| early(&e))?,
        cp: group(&map, Kind::Cp, rank).map_err(|e| early(&e))?,
        dp_cp: group(&map, Kind::DpCp, rank).map_err(|e| early(&e))?,
        pp: group(&map, Kind::Pp, rank).map_err(|e| early(&e))?,
        ep: group(&map, Kind::Ep, rank).map_err(|e| early(&e))?,
        etp: group(&map, Kind::Etp, rank).map_err(|e| early(&e))?,
        edp: group(&map, Kind::Edp, rank).map_err(|e| early(&e))?,
        world: Group::new(Kind::World, (0..world).collect(), rank).map_err(|e| early(&e))?,
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
    let v = s.schedule.interleaving(s.cfg.vpp);
    let mut params: Vec<Option<LayerParams>> = vec![None; d.layers];
    let vstages: Vec<usize> = (0..s.schedule.chunks_per_rank(v))
        .map(|c| virtual_stage(s.schedule, s.cfg.pp, pp_rank as u64, c) as usize)
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
