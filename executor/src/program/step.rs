//! One training step: the schedule's passes in this rank's order (forwards and
//! backwards per virtual stage and micro-batch, deferred weight-gradient passes),
//! the pipeline sends and receives, DualPipe's mirror gradient sum, then the
//! optimizer.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use sextant_planner::config::Recompute;
use sextant_planner::cost::CommKind;
use sextant_planner::schedule::{Pass, Schedule};
use sextant_planner::walk::{slots, Slot};

use super::optimize::{flatten, tensors_mut, unflatten};
use super::rank::{Live, Rank};
use crate::comm::{from_bytes, to_bytes, Kind};
use crate::error::ExecError;
use crate::model::{self, input_rows, Saved, WJob};

/// Tags of pipeline messages: kind | step (12 bits) | direction (1) | virtual stage (13) | micro-batch (30).
fn pp_tag(step: u64, backward: bool, vstage: usize, mb: u64) -> u64 {
    ((Kind::Pp as u64) << 56)
        | (step << 44)
        | ((backward as u64) << 43)
        | ((vstage as u64) << 30)
        | mb
}

/// What one step carries from pass to pass.
struct InFlight {
    /// Forward passes awaiting their backward, by (chunk, micro-batch).
    live: HashMap<(u64, u64), Live>,
    /// Backward passes whose weight gradient the schedule runs as its own pass.
    deferred: HashSet<(u64, u64)>,
    wjobs: HashMap<(u64, u64), Vec<WJob>>,
    live_bytes: usize,
    /// This rank's rows of a micro-batch's activations.
    rows: usize,
    /// Tokens the loss is averaged over (every micro-batch of every replica).
    tokens: f32,
}

impl Rank<'_> {
    pub(super) fn step(&mut self, step: u64) -> Result<(), ExecError> {
        let s = self.s;
        let m = s.micro_batches;
        self.phase = format!("step {step}, reference");
        self.run_reference(step)?;
        for g in self.grads.iter_mut().flatten() {
            *g = g.zeros_like();
        }
        self.phase = format!("step {step}, start barrier");
        self.g.world.barrier(self.mesh).map_err(|e| self.err(e))?;
        let t_step = Instant::now();
        // The device program's pass order, slot by slot (the planner's walk).
        let dims = s.walk_dims();
        let order: Vec<Slot> = slots(&s.walk(&dims), self.pp_rank as u64)
            .into_iter()
            .flatten()
            .collect();
        let mut f = InFlight {
            live: HashMap::new(),
            // Backward passes whose weight gradient the schedule runs later, as its own pass.
            deferred: order
                .iter()
                .filter(|o| o.deferred)
                .map(|o| (o.chunk, o.mb))
                .collect(),
            wjobs: HashMap::new(),
            live_bytes: 0,
            rows: (self.own.1 - self.own.0) * s.dims.mbs,
            tokens: (s.dims.seq * s.dims.mbs) as f32 * (m * s.cfg.dp) as f32,
        };
        let mut first_op = true;
        for Slot {
            pass,
            chunk: c,
            mb,
            vstage,
            ..
        } in order
        {
            if s.schedule == Schedule::DualPipe && c != u64::from(mb >= m / 2) {
                return Err(self.err(format!(
                    "DualPipe runs micro-batch {mb} on chunk {c}, which is the other direction's"
                )));
            }
            if first_op {
                first_op = false;
            } else if self.o.die_at == Some((self.rank, step)) {
                // Testing hook: die abruptly in the middle of the step, as a killed
                // process would (no goodbye to the peers).
                eprintln!(
                    "rank {}: exiting abruptly in step {step} (--die-at testing hook)",
                    self.rank
                );
                std::process::exit(137);
            }
            match pass {
                Pass::Forward => self.forward(step, c, mb, vstage, &mut f)?,
                Pass::Backward => self.backward(step, c, mb, vstage, &mut f)?,
                Pass::Weight => {
                    self.phase = format!("step {step}, weight gradient of micro-batch {mb}");
                    let jobs = f
                        .wjobs
                        .remove(&(c, mb))
                        .ok_or_else(|| self.err("weight-gradient pass before its backward"))?;
                    self.run_jobs(jobs);
                }
            }
        }
        if !f.live.is_empty() {
            return Err(self.err(format!(
                "{} forward passes never got their backward",
                f.live.len()
            )));
        }
        if !f.wjobs.is_empty() {
            return Err(self.err(format!(
                "{} deferred weight-gradient passes never ran",
                f.wjobs.len()
            )));
        }
        if s.schedule == Schedule::DualPipe {
            self.phase = format!("step {step}, DualPipe mirror gradient sum");
            self.sum_mirror_gradients(step)?;
        }
        self.phase = format!("step {step}, gradient reduction and optimizer");
        self.optimize()?;
        let secs = t_step.elapsed().as_secs_f64();
        self.rec.step_time(secs);
        Ok(())
    }

    /// One forward pass: the stage input received (or generated on the first
    /// stage), checked, run, and sent on (or kept as the loss gradient on the last).
    fn forward(
        &mut self,
        step: u64,
        c: u64,
        mb: u64,
        vstage: usize,
        f: &mut InFlight,
    ) -> Result<(), ExecError> {
        let s = self.s;
        let key_ref = (self.dp_rank, mb);
        self.phase = format!("step {step}, forward of micro-batch {mb}, virtual stage {vstage}");
        let header = [step as f32, mb as f32, vstage as f32, 0.0];
        let x = if vstage == 0 {
            input_rows(&s.dims, self.first_sample(step, self.dp_rank, mb), self.own)
        } else {
            self.recv(
                self.holder(vstage - 1, mb),
                pp_tag(step, false, vstage, mb),
                header,
                f.rows,
            )?
        };
        let first = self.layers_of(vstage).start;
        if let Some(r) = &self.reference {
            self.check(
                "stage input",
                &x.data,
                &self.own_rows(&r.acts[&key_ref][first]).data,
            )?;
            self.rec.check(|c| c.activations += 1);
        }
        self.gather(vstage)?;
        let (y, saved) = self.forward_chunk(vstage, x.clone())?;
        self.release(vstage);
        let saved = if s.cfg.recompute == Recompute::Full {
            Vec::new()
        } else {
            saved
        };
        f.live_bytes += x.bytes() + saved.iter().map(Saved::bytes).sum::<usize>();
        let mut dy_last = None;
        if vstage == s.stage_layers.len() - 1 {
            if let Some(r) = &self.reference {
                self.check(
                    "model output",
                    &y.data,
                    &self.own_rows(&r.acts[&key_ref][s.dims.layers]).data,
                )?;
                self.rec.check(|c| c.activations += 1);
            }
            let mut dy = y;
            dy.scale(1.0 / f.tokens);
            dy_last = Some(dy);
        } else {
            self.send(
                self.holder(vstage + 1, mb),
                pp_tag(step, false, vstage + 1, mb),
                [step as f32, mb as f32, (vstage + 1) as f32, 0.0],
                &y,
            )?;
        }
        f.live.insert(
            (c, mb),
            Live {
                input: x,
                saved,
                dy_last,
            },
        );
        let n = f.live.len() as u64;
        self.rec.with(|st| {
            st.peak_live_chunks = st.peak_live_chunks.max(n);
            st.peak_activation_bytes = st.peak_activation_bytes.max(f.live_bytes as u64);
        });
        Ok(())
    }

    /// One backward pass: the output gradient received (or the loss gradient),
    /// the forward recomputed when its activations were dropped, the layers run
    /// backward, the weight gradients run now or deferred, the input gradient sent.
    fn backward(
        &mut self,
        step: u64,
        c: u64,
        mb: u64,
        vstage: usize,
        f: &mut InFlight,
    ) -> Result<(), ExecError> {
        let s = self.s;
        let key_ref = (self.dp_rank, mb);
        self.phase = format!("step {step}, backward of micro-batch {mb}, virtual stage {vstage}");
        let entry = f
            .live
            .remove(&(c, mb))
            .ok_or_else(|| self.err("backward before its forward: the schedule is inconsistent"))?;
        let mut dy = match entry.dy_last {
            Some(dy) => dy,
            None => self.recv(
                self.holder(vstage + 1, mb),
                pp_tag(step, true, vstage, mb),
                [step as f32, mb as f32, vstage as f32, 1.0],
                f.rows,
            )?,
        };
        let range = self.layers_of(vstage);
        if let Some(r) = &self.reference {
            self.check(
                "stage output gradient",
                &dy.data,
                &self.own_rows(&r.dacts[&key_ref][range.end]).data,
            )?;
            self.rec.check(|c| c.gradients += 1);
        }
        self.gather(vstage)?;
        let saved = if entry.saved.is_empty() {
            let t = self.rec.start();
            let out = self.forward_chunk(vstage, entry.input.clone())?.1;
            self.rec.add("recompute", t);
            out
        } else {
            entry.saved
        };
        f.live_bytes = f
            .live_bytes
            .saturating_sub(entry.input.bytes() + saved.iter().map(Saved::bytes).sum::<usize>());
        let mut jobs = Vec::new();
        for (i, l) in range.clone().enumerate().rev() {
            let p = self.params[l].as_ref().expect("own layer");
            dy = model::backward(
                &self.shard(),
                &s.dims,
                p,
                l,
                &saved[i],
                &dy,
                self.q0,
                &mut jobs,
            )
            .map_err(|e| self.err(e))?;
        }
        self.release(vstage);
        if f.deferred.contains(&(c, mb)) {
            f.wjobs.insert((c, mb), jobs);
        } else {
            self.run_jobs(jobs);
        }
        if vstage == 0 {
            if let Some(r) = &self.reference {
                self.check(
                    "input gradient",
                    &dy.data,
                    &self.own_rows(&r.dacts[&key_ref][0]).data,
                )?;
                self.rec.check(|c| c.gradients += 1);
            }
        } else {
            self.send(
                self.holder(vstage - 1, mb),
                pp_tag(step, true, vstage - 1, mb),
                [step as f32, mb as f32, (vstage - 1) as f32, 1.0],
                &dy,
            )?;
        }
        Ok(())
    }

    /// DualPipe holds every stage twice (rank r and rank p-1-r): the two copies' weight
    /// gradients are summed between the mirror ranks before the data-parallel reduction.
    pub(super) fn sum_mirror_gradients(&mut self, step: u64) -> Result<(), ExecError> {
        let p = self.s.cfg.pp as usize;
        let partner = self.g.pp.members[p - 1 - self.pp_rank];
        // Every dense tensor of the held layers, then every expert tensor.
        let held = || self.grads.iter().flatten();
        let flat: Vec<f32> = held()
            .flat_map(|g| flatten(&g.dense()))
            .chain(held().flat_map(|g| flatten(&g.expert())))
            .collect();
        let tag = ((Kind::Pp as u64) << 56) | (step << 44) | ((1 << 30) - 1);
        let t = self.rec.start();
        self.mesh
            .send(partner, tag, &to_bytes(&flat))
            .map_err(|e| self.err(e))?;
        let theirs = from_bytes(&self.mesh.recv(partner, tag).map_err(|e| self.err(e))?)
            .map_err(|e| self.err(e))?;
        if theirs.len() != flat.len() {
            return Err(self.err(format!("mirror rank {partner} holds {} gradient values, this rank {}: the stages are not mirrored", theirs.len(), flat.len())));
        }
        self.rec
            .comm(CommKind::DpGrad, "all_reduce", 2, flat.len() * 4, t);
        let summed: Vec<f32> = flat.iter().zip(&theirs).map(|(a, b)| a + b).collect();
        let dense_len: usize = self
            .grads
            .iter()
            .flatten()
            .map(|g| g.dense().iter().map(|m| m.data.len()).sum::<usize>())
            .sum();
        unflatten(
            self.grads
                .iter_mut()
                .flatten()
                .flat_map(|g| tensors_mut(g, false)),
            &summed[..dense_len],
        );
        unflatten(
            self.grads
                .iter_mut()
                .flatten()
                .flat_map(|g| tensors_mut(g, true)),
            &summed[dense_len..],
        );
        Ok(())
    }
}
