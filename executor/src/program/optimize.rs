//! The data-parallel side of a step: gradients reduced over the replicas
//! (all-reduce, or reduce-scatter + all-gather with the distributed optimizer),
//! ZeRO-3's per-pass parameter gathers and releases, and Adam.

use sextant_planner::config::Zero;
use sextant_planner::cost::CommKind;

use super::rank::Rank;
use super::verify::shard_of;
use super::{LR, TOLERANCE};
use crate::comm::Group;
use crate::error::ExecError;
use crate::model::LayerParams;
use crate::tensor::{rel_diff, Mat};

#[derive(Default)]
pub(super) struct Adam {
    pub(super) m: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) t: i32,
}

impl Adam {
    fn step(&mut self, w: &mut [f32], g: &[f32]) {
        if self.m.len() != w.len() {
            self.m = vec![0.0; w.len()];
            self.v = vec![0.0; w.len()];
        }
        self.t += 1;
        let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
        let (c1, c2) = (1.0 - b1.powi(self.t), 1.0 - b2.powi(self.t));
        for i in 0..w.len() {
            self.m[i] = b1 * self.m[i] + (1.0 - b1) * g[i];
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * g[i] * g[i];
            w[i] -= LR * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + eps);
        }
    }
}

pub(super) fn flatten(v: &[&Mat]) -> Vec<f32> {
    v.iter().flat_map(|m| m.data.iter().copied()).collect()
}

/// Copies `flat` back into `mats` in order: the inverse of [`flatten`].
pub(super) fn unflatten<'a>(mats: impl IntoIterator<Item = &'a mut Mat>, flat: &[f32]) {
    let mut i = 0;
    for m in mats {
        let n = m.data.len();
        m.data.copy_from_slice(&flat[i..i + n]);
        i += n;
    }
}

/// A layer's dense or expert trainable tensors, mutably.
pub(super) fn tensors_mut(lp: &mut LayerParams, expert: bool) -> Vec<&mut Mat> {
    if expert {
        lp.expert_mut()
    } else {
        lp.dense_mut()
    }
}

impl Rank<'_> {
    /// The units parameters are sharded, gathered and stepped in: all own layers
    /// at once, or with ZeRO-3 each held virtual stage.
    pub(super) fn units(&self) -> Vec<Vec<usize>> {
        if self.s.cfg.zero == Zero::Zero3 {
            self.vstages
                .iter()
                .map(|&v| self.layers_of(v).collect::<Vec<_>>())
                .filter(|u| !u.is_empty())
                .collect()
        } else {
            vec![(0..self.s.dims.layers)
                .filter(|&l| self.params[l].is_some())
                .collect()]
        }
    }

    /// The replica group and the parameter class of one side (dense or expert).
    pub(super) fn side(&self, expert: bool) -> (&Group, fn(&LayerParams) -> Vec<f32>) {
        if expert {
            (&self.g.edp, |lp| flatten(&lp.expert()))
        } else {
            (&self.g.dp_cp, |lp| flatten(&lp.dense()))
        }
    }

    /// One side of `unit`'s layers from `of` (parameters or gradients), flattened.
    pub(super) fn flat(
        of: &[Option<LayerParams>],
        unit: &[usize],
        pick: fn(&LayerParams) -> Vec<f32>,
    ) -> Vec<f32> {
        unit.iter()
            .flat_map(|&l| pick(of[l].as_ref().expect("own layer")))
            .collect()
    }

    /// Writes `flat` back into the layers of `unit` (one side).
    pub(super) fn store(&mut self, unit: &[usize], expert: bool, flat: &[f32]) {
        unflatten(
            self.params
                .iter_mut()
                .enumerate()
                .filter(|(l, _)| unit.contains(l))
                .filter_map(|(_, p)| p.as_mut())
                .flat_map(|lp| tensors_mut(lp, expert)),
            flat,
        );
    }

    /// ZeRO-3: all-gathers the parameters of `vstage` from the replica group
    /// before a pass uses them, and checks them against the reference.
    pub(super) fn gather(&mut self, vstage: usize) -> Result<(), ExecError> {
        if self.s.cfg.zero != Zero::Zero3 {
            return Ok(());
        }
        let unit: Vec<usize> = self.layers_of(vstage).collect();
        for expert in [false, true] {
            let (g, pick) = self.side(expert);
            let n = g.size();
            let mut flat = Self::flat(&self.params, &unit, pick);
            if flat.is_empty() || n == 1 {
                continue;
            }
            let t = self.rec.start();
            g.all_gather_chunks(self.mesh, &mut flat)
                .map_err(|e| self.err(e))?;
            self.rec.comm(
                if expert {
                    CommKind::EdpParam
                } else {
                    CommKind::DpParam
                },
                "all_gather",
                n,
                flat.len() * 4,
                t,
            );
            if let Some(r) = &self.reference {
                let (d, tp, ep, etp) = (
                    &self.s.dims,
                    (self.g.tp.me, self.g.tp.size()),
                    (self.g.ep.me, self.g.ep.size()),
                    (self.g.etp.me, self.g.etp.size()),
                );
                let want: Vec<f32> = unit
                    .iter()
                    .flat_map(|&l| pick(&shard_of(&r.params[l], d, tp, ep, etp)))
                    .collect();
                self.check("parameters gathered for a pass (ZeRO-3)", &flat, &want)?;
                self.rec.check(|c| c.param_gathers += 1);
            }
            self.store(&unit, expert, &flat);
        }
        Ok(())
    }

    /// ZeRO-3: drops the parameters of `vstage` that other replicas own. They are
    /// overwritten with NaN, so a pass that ran without its gather could not pass
    /// the reference checks.
    pub(super) fn release(&mut self, vstage: usize) {
        if self.s.cfg.zero != Zero::Zero3 {
            return;
        }
        let unit: Vec<usize> = self.layers_of(vstage).collect();
        for expert in [false, true] {
            let (g, pick) = self.side(expert);
            let (n, me) = (g.size(), g.me);
            let mut flat = Self::flat(&self.params, &unit, pick);
            let (a, b) = (flat.len() * me / n, flat.len() * (me + 1) / n);
            flat[..a].fill(f32::NAN);
            flat[b..].fill(f32::NAN);
            self.store(&unit, expert, &flat);
        }
    }

    /// Reduces gradients over the replicas and takes an Adam step (sharded with the
    /// distributed optimizer and ZeRO-3); checks against the reference and across
    /// replicas.
    pub(super) fn optimize(&mut self) -> Result<(), ExecError> {
        let sharded = self.s.cfg.zero != Zero::None;
        let zero3 = self.s.cfg.zero == Zero::Zero3;
        let units = self.units();
        for expert in [false, true] {
            let (kind_grad, kind_param) = if expert {
                (CommKind::EdpGrad, CommKind::EdpParam)
            } else {
                (CommKind::DpGrad, CommKind::DpParam)
            };
            let (_, pick) = self.side(expert);
            // The unsharded reference: this rank's shard of the reduced gradient,
            // then the whole model's step and this rank's shard of its weights.
            let mut want = None;
            if let Some(r) = &mut self.reference {
                let d = &self.s.dims;
                let (tp, ep, etp) = (
                    (self.g.tp.me, self.g.tp.size()),
                    (self.g.ep.me, self.g.ep.size()),
                    (self.g.etp.me, self.g.etp.size()),
                );
                let of = |lps: &[LayerParams], u: &[usize]| -> Vec<f32> {
                    u.iter()
                        .flat_map(|&l| pick(&shard_of(&lps[l], d, tp, ep, etp)))
                        .collect()
                };
                let want_g: Vec<Vec<f32>> = units.iter().map(|u| of(&r.grads, u)).collect();
                let mut full_w: Vec<f32> = r.params.iter().flat_map(pick).collect();
                let full_g: Vec<f32> = r.grads.iter().flat_map(pick).collect();
                let adam = if expert {
                    &mut r.adam_expert
                } else {
                    &mut r.adam_dense
                };
                adam.step(&mut full_w, &full_g);
                unflatten(
                    r.params.iter_mut().flat_map(|lp| tensors_mut(lp, expert)),
                    &full_w,
                );
                let want_w: Vec<Vec<f32>> = units.iter().map(|u| of(&r.params, u)).collect();
                want = Some((want_g, want_w));
            }
            for (ui, unit) in units.iter().enumerate() {
                let (g, _) = self.side(expert);
                let mut flat_g = Self::flat(&self.grads, unit, pick);
                let mut flat_w = Self::flat(&self.params, unit, pick);
                if flat_w.is_empty() {
                    continue;
                }
                let n = g.size();
                let split = sharded && n > 1;
                let (a, b) = if split {
                    (flat_w.len() * g.me / n, flat_w.len() * (g.me + 1) / n)
                } else {
                    (0, flat_w.len())
                };
                let t = self.rec.start();
                let part = if split {
                    let part = g
                        .reduce_scatter(self.mesh, &flat_g)
                        .map_err(|e| self.err(e))?;
                    self.rec
                        .comm(kind_grad, "reduce_scatter", n, flat_g.len() * 4, t);
                    part
                } else {
                    if n > 1 {
                        g.all_reduce(self.mesh, &mut flat_g)
                            .map_err(|e| self.err(e))?;
                        self.rec
                            .comm(kind_grad, "all_reduce", n, flat_g.len() * 4, t);
                    }
                    flat_g
                };
                if let Some((want_g, _)) = &want {
                    let e = rel_diff(&part, &want_g[ui][a..b]);
                    if e.is_nan() || e > TOLERANCE {
                        return Err(self.err(format!(
                            "{} weight gradients differ from the reference by {e:.2e}",
                            if expert { "expert" } else { "dense" }
                        )));
                    }
                    self.rec.check(|c| {
                        c.gradients += 1;
                        c.max_rel_error = c.max_rel_error.max(e as f64);
                    });
                }
                let t = self.rec.start();
                self.adam
                    .entry((expert, ui))
                    .or_default()
                    .step(&mut flat_w[a..b], &part);
                self.rec.add("optimizer", t);
                if split && !zero3 {
                    let t = self.rec.start();
                    let (g, _) = self.side(expert);
                    g.all_gather_chunks(self.mesh, &mut flat_w)
                        .map_err(|e| self.err(e))?;
                    self.rec
                        .comm(kind_param, "all_gather", n, flat_w.len() * 4, t);
                }
                self.store(unit, expert, &flat_w);
                if let Some((_, want_w)) = &want {
                    self.check(
                        "weights after the optimizer step",
                        &flat_w[a..b],
                        &want_w[ui][a..b],
                    )?;
                }
                if zero3 {
                    // Replicas hold different shares; the next pass's gather checks
                    // the assembled weights against the reference.
                    continue;
                }
                let (g, _) = self.side(expert);
                let sum: f64 = flat_w.iter().map(|&x| x as f64).sum();
                let sq: f64 = flat_w.iter().map(|&x| (x as f64) * (x as f64)).sum();
                let digest = [sum as f32, sq as f32, flat_w[0], flat_w[flat_w.len() - 1]];
                let all = g.all_gather(self.mesh, &digest).map_err(|e| self.err(e))?;
                if all.chunks(4).any(|c| {
                    c.iter()
                        .zip(&digest)
                        .any(|(x, y)| x.to_bits() != y.to_bits())
                }) {
                    return Err(self.err(format!(
                        "{} replicas hold different weights after the step",
                        g.kind.label()
                    )));
                }
                self.rec.check(|c| c.replicas += 1);
            }
        }
        Ok(())
    }
}
