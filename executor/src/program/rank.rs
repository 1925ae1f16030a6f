//! A rank's live state: its groups, its shard of the layers, and the pipeline
//! messages it sends and receives.

use std::collections::HashMap;

use sextant_planner::config::Recompute;
use sextant_planner::cost::CommKind;
use sextant_planner::schedule::locate;

use super::optimize::Adam;
use super::verify::Reference;
use super::{Options, Setup};
use crate::comm::{from_bytes, to_bytes, Group};
use crate::error::ExecError;
use crate::mesh::Mesh;
use crate::model::{self, LayerParams, Saved, Shard, WJob};
use crate::record::Recorder;
use crate::tensor::Mat;

pub(super) struct Groups {
    pub(super) tp: Group,
    pub(super) cp: Group,
    pub(super) dp_cp: Group,
    pub(super) pp: Group,
    pub(super) ep: Group,
    pub(super) etp: Group,
    pub(super) edp: Group,
    pub(super) world: Group,
}

/// This rank's live state.
pub(super) struct Rank<'a> {
    pub(super) s: &'a Setup,
    pub(super) o: &'a Options,
    pub(super) mesh: &'a Mesh,
    pub(super) rank: u64,
    pub(super) g: Groups,
    pub(super) dp_rank: u64,
    pub(super) pp_rank: usize,
    pub(super) rec: Recorder,
    pub(super) params: Vec<Option<LayerParams>>,
    pub(super) grads: Vec<Option<LayerParams>>,
    /// The virtual stages this rank holds, in chunk order.
    pub(super) vstages: Vec<usize>,
    /// Adam state per (expert, unit): one unit of all own layers, or with ZeRO-3
    /// one per held virtual stage (the unit its parameters are gathered in).
    pub(super) adam: HashMap<(bool, usize), Adam>,
    pub(super) reference: Option<Reference>,
    pub(super) phase: String,
    /// First position of this rank's CP chunk and its own rows (positions) of it.
    pub(super) q0: usize,
    pub(super) own: (usize, usize),
}

pub(super) struct Live {
    pub(super) input: Mat,
    pub(super) saved: Vec<Saved>,
    pub(super) dy_last: Option<Mat>,
}

impl<'a> Rank<'a> {
    pub(super) fn err(&self, detail: impl std::fmt::Display) -> ExecError {
        ExecError {
            rank: self.rank,
            phase: self.phase.clone(),
            detail: detail.to_string(),
        }
    }

    pub(super) fn shard(&self) -> Shard<'_> {
        Shard {
            mesh: self.mesh,
            tp: &self.g.tp,
            cp: &self.g.cp,
            ep: &self.g.ep,
            etp: &self.g.etp,
            sp: self.s.cfg.sp,
            rec: &self.rec,
        }
    }

    /// The rank (in this rank's pipeline group) that runs model stage `vstage` for
    /// micro-batch `mb`: under DualPipe the second half of the micro-batches runs
    /// the pipeline from the other end.
    pub(super) fn holder(&self, vstage: usize, mb: u64) -> u64 {
        let (r, _) = locate(
            self.s.schedule,
            self.s.cfg.pp,
            self.s.micro_batches,
            vstage as u64,
            mb,
        );
        self.g.pp.members[r as usize]
    }

    pub(super) fn layers_of(&self, vstage: usize) -> std::ops::Range<usize> {
        self.s.first_layer[vstage]..self.s.first_layer[vstage] + self.s.stage_layers[vstage]
    }

    pub(super) fn first_sample(&self, step: u64, dp: u64, mb: u64) -> u64 {
        ((step * self.s.micro_batches + mb) * self.s.cfg.dp + dp) * self.s.dims.mbs as u64
    }

    /// Runs the layers of `vstage` forward from `x`.
    pub(super) fn forward_chunk(
        &self,
        vstage: usize,
        mut x: Mat,
    ) -> Result<(Mat, Vec<Saved>), ExecError> {
        let keep = self.s.cfg.recompute != Recompute::Selective;
        let mut saved = Vec::new();
        for l in self.layers_of(vstage) {
            let p = self.params[l].as_ref().expect("own layer");
            let (y, sv) = model::forward(
                &self.shard(),
                &self.s.dims,
                p,
                self.s.dims.moe_layer[l],
                &x,
                self.q0,
                keep,
            )
            .map_err(|e| self.err(e))?;
            x = y;
            saved.push(sv);
        }
        Ok((x, saved))
    }

    pub(super) fn send(
        &self,
        to: u64,
        tag: u64,
        header: [f32; 4],
        m: &Mat,
    ) -> Result<(), ExecError> {
        let t = self.rec.start();
        let mut payload = header.to_vec();
        payload.extend_from_slice(&m.data);
        self.mesh
            .send(to, tag, &to_bytes(&payload))
            .map_err(|e| self.err(e))?;
        self.rec.comm(CommKind::Pp, "send_recv", 2, m.bytes(), t);
        Ok(())
    }

    pub(super) fn recv(
        &self,
        from: u64,
        tag: u64,
        header: [f32; 4],
        rows: usize,
    ) -> Result<Mat, ExecError> {
        let t = self.rec.start();
        let v = from_bytes(&self.mesh.recv(from, tag).map_err(|e| self.err(e))?)
            .map_err(|e| self.err(e))?;
        if v.len() < 4 || v[..4] != header {
            return Err(self.err(format!("pipeline message from rank {from} is for (step, micro-batch, stage, backward) = {:?}, expected {header:?}", &v[..v.len().min(4)])));
        }
        self.rec.check(|c| c.p2p_messages += 1);
        let m =
            Mat::from_vec(rows, self.s.dims.hidden, v[4..].to_vec()).map_err(|e| self.err(e))?;
        self.rec.comm(CommKind::Pp, "send_recv", 2, m.bytes(), t);
        Ok(m)
    }

    pub(super) fn run_jobs(&mut self, jobs: Vec<WJob>) {
        let sh = Shard {
            mesh: self.mesh,
            tp: &self.g.tp,
            cp: &self.g.cp,
            ep: &self.g.ep,
            etp: &self.g.etp,
            sp: self.s.cfg.sp,
            rec: &self.rec,
        };
        for j in jobs {
            let l = j.layer;
            if let Some(g) = self.grads[l].as_mut() {
                model::run_wjob(&sh, std::slice::from_mut(g), l, j);
            }
        }
    }
}
