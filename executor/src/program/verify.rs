//! The checks of a run: known-data tests of every communicator at start-up, and
//! the unsharded reference (the whole model with groups of one) that every stage
//! input and output, boundary gradient, reduced gradient and updated weight is
//! compared with.

use std::collections::HashMap;

use super::optimize::Adam;
use super::rank::Rank;
use super::TOLERANCE;
use crate::comm::{Group, Kind};
use crate::error::ExecError;
use crate::model::{self, input_rows, Dims, LayerParams, Shard};
use crate::record::Recorder;
use crate::tensor::{rel_diff, Mat};

/// The unsharded model and what it computed for the current step.
pub(super) struct Reference {
    pub(super) params: Vec<LayerParams>,
    pub(super) adam_dense: Adam,
    pub(super) adam_expert: Adam,
    /// (dp rank, micro-batch) -> input of every layer and the output (L + 1 entries).
    pub(super) acts: HashMap<(u64, u64), Vec<Mat>>,
    /// (dp rank, micro-batch) -> gradient of every layer's input and of the output.
    pub(super) dacts: HashMap<(u64, u64), Vec<Mat>>,
    pub(super) grads: Vec<LayerParams>,
}

pub(super) fn shard_of(
    full: &LayerParams,
    d: &Dims,
    (t, tp): (usize, usize),
    (e, ep): (usize, usize),
    (et, etp): (usize, usize),
) -> LayerParams {
    let hl = d.heads * d.head_dim / tp;
    let full_h = d.heads * d.head_dim;
    let q = full.wqkv.cols_range(t * hl, (t + 1) * hl);
    let k = full.wqkv.cols_range(full_h + t * hl, full_h + (t + 1) * hl);
    let v = full
        .wqkv
        .cols_range(2 * full_h + t * hl, 2 * full_h + (t + 1) * hl);
    let fl = full.w1.cols / tp;
    let per = full.experts.len() / ep.max(1);
    let fe = d.expert_ffn / etp.max(1);
    LayerParams {
        wqkv: Mat::hstack(&[&q, &k, &v]),
        wo: full.wo.rows_range(t * hl, (t + 1) * hl),
        w1: full.w1.cols_range(t * fl, (t + 1) * fl),
        w2: full.w2.rows_range(t * fl, (t + 1) * fl),
        router: full.router.clone(),
        experts: full.experts[e * per..(e + 1) * per]
            .iter()
            .map(|(w1, w2)| {
                (
                    w1.cols_range(et * fe, (et + 1) * fe),
                    w2.rows_range(et * fe, (et + 1) * fe),
                )
            })
            .collect(),
    }
}

impl Rank<'_> {
    pub(super) fn check(&self, what: &str, got: &[f32], want: &[f32]) -> Result<f32, ExecError> {
        let e = rel_diff(got, want);
        if e.is_nan() || e > TOLERANCE {
            return Err(self.err(format!("{what} differs from the unsharded reference by {e:.2e} (tolerance {TOLERANCE:.0e}): the groups or collectives are wrong")));
        }
        self.rec
            .check(|c| c.max_rel_error = c.max_rel_error.max(e as f64));
        Ok(e)
    }

    /// This rank's rows of a full (positions x mbs) reference activation.
    pub(super) fn own_rows(&self, full: &Mat) -> Mat {
        let mbs = self.s.dims.mbs;
        full.rows_range(self.own.0 * mbs, self.own.1 * mbs)
    }

    /// Known-data checks of every communicator this rank belongs to.
    pub(super) fn self_test(&self) -> Result<(), ExecError> {
        let me = self.rank as f32;
        for g in [
            &self.g.tp,
            &self.g.cp,
            &self.g.dp_cp,
            &self.g.pp,
            &self.g.ep,
            &self.g.etp,
            &self.g.edp,
            &self.g.world,
        ] {
            let label = g.kind.label();
            let n = g.size();
            let members: Vec<f32> = g.members.iter().map(|&r| r as f32).collect();
            let got = g.all_gather(self.mesh, &[me]).map_err(|e| self.err(e))?;
            if got != members {
                return Err(self.err(format!("{label} group: members report ranks {got:?} but this rank expects {members:?}: the ranks disagree on the layout")));
            }
            let mut sum = vec![me, 1.0];
            g.all_reduce(self.mesh, &mut sum).map_err(|e| self.err(e))?;
            let want = [members.iter().sum::<f32>(), n as f32];
            if sum != want {
                return Err(self.err(format!(
                    "{label} all-reduce of known data gave {sum:?}, expected {want:?}"
                )));
            }
            let data: Vec<f32> = (0..3 * n).map(|j| me * 1000.0 + j as f32).collect();
            let got = g
                .reduce_scatter(self.mesh, &data)
                .map_err(|e| self.err(e))?;
            let want: Vec<f32> = (3 * g.me..3 * g.me + 3)
                .map(|j| members.iter().map(|r| r * 1000.0 + j as f32).sum())
                .collect();
            if got != want {
                return Err(self.err(format!(
                    "{label} reduce-scatter of known data gave {got:?}, expected {want:?}"
                )));
            }
            let parts: Vec<Vec<f32>> = (0..n).map(|j| vec![me * 100.0 + j as f32; j + 1]).collect();
            let got = g.all_to_all(self.mesh, parts).map_err(|e| self.err(e))?;
            for (i, part) in got.iter().enumerate() {
                if *part != vec![members[i] * 100.0 + g.me as f32; g.me + 1] {
                    return Err(self.err(format!(
                        "{label} all-to-all: part from member {i} is {part:?}"
                    )));
                }
            }
            self.rec.check(|c| c.collectives += 4);
        }
        Ok(())
    }

    pub(super) fn run_reference(&mut self, step: u64) -> Result<(), ExecError> {
        let Some(mut r) = self.reference.take() else {
            return Ok(());
        };
        let d = &self.s.dims;
        let mesh = self.mesh;
        let solo = |k| Group::new(k, vec![self.rank], self.rank).expect("own group");
        let (tp, cp, ep, etp) = (
            solo(Kind::Tp),
            solo(Kind::Cp),
            solo(Kind::Ep),
            solo(Kind::Etp),
        );
        let quiet = Recorder::new(self.rank, false);
        let sh = Shard {
            mesh,
            tp: &tp,
            cp: &cp,
            ep: &ep,
            etp: &etp,
            sp: false,
            rec: &quiet,
        };
        let tokens = (d.seq * d.mbs) as f32 * (self.s.micro_batches * self.s.cfg.dp) as f32;
        let mut grads: Vec<LayerParams> = r.params.iter().map(LayerParams::zeros_like).collect();
        r.acts.clear();
        r.dacts.clear();
        for dp in 0..self.s.cfg.dp {
            for mb in 0..self.s.micro_batches {
                let mut x = input_rows(d, self.first_sample(step, dp, mb), (0, d.seq));
                let mut acts = vec![x.clone()];
                let mut saved = Vec::new();
                for l in 0..d.layers {
                    let (y, sv) = model::forward(&sh, d, &r.params[l], d.moe_layer[l], &x, 0, true)
                        .map_err(|e| self.err(e))?;
                    x = y;
                    acts.push(x.clone());
                    saved.push(sv);
                }
                let mut dy = x.clone();
                dy.scale(1.0 / tokens);
                let mut dacts = vec![dy.clone()];
                for l in (0..d.layers).rev() {
                    let mut jobs = Vec::new();
                    dy = model::backward(&sh, d, &r.params[l], l, &saved[l], &dy, 0, &mut jobs)
                        .map_err(|e| self.err(e))?;
                    for j in jobs {
                        model::run_wjob(&sh, &mut grads, 0, j);
                    }
                    dacts.push(dy.clone());
                }
                dacts.reverse();
                r.acts.insert((dp, mb), acts);
                r.dacts.insert((dp, mb), dacts);
            }
        }
        r.grads = grads;
        self.reference = Some(r);
        Ok(())
    }
}
