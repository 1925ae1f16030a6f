//! The validity rules a configuration must pass before it is priced: the GPU
//! product, the divisibility of heads, FFN, layers, experts and batch, the
//! NVLink-domain bound on TP, the pipeline schedule's rules and Megatron-Core's
//! MoE rules. The first rule broken is returned as a [`Rejection`].

use super::{Layout, ParallelConfig, Rejection, Workload, MAX_KNOB};
use crate::hardware::Cluster;
use crate::model::ModelSpec;
use crate::schedule::Schedule;

impl ParallelConfig {
    /// The pipeline schedule's rules: interleaving needs virtual stages and the
    /// others one chunk per rank; ZB-H1, DualPipe and GPipe need a pipeline;
    /// DualPipe needs an even pp and an even number of micro-batches, at least
    /// 2 x pp (deepseek-ai/DualPipe asserts both).
    pub fn check_schedule(&self, w: &Workload) -> Result<(), Rejection> {
        let s = self.schedule;
        let reject = |detail: String| {
            Err(Rejection::Schedule {
                schedule: s,
                detail,
            })
        };
        match s {
            Schedule::Interleaved if self.vpp < 2 => return reject("interleaved 1F1B needs vpp > 1; with vpp 1 use 1f1b".into()),
            // Megatron-Core (schedules.py, forward_backward_pipelining_with_interleaving,
            // main d98e8a6): micro-batches run in groups of
            // `microbatch_group_size_per_vp_stage`, default pp (model_parallel_config.py);
            // a group size above m raises ValueError, and a last group smaller than pp
            // raises RuntimeError. With the default group the rule is m % pp == 0
            // (so m >= pp): what the Megatron-LM, Core, Bridge and NeMo exports run.
            Schedule::Interleaved => {
                let m = self.micro_batches(w);
                if !m.is_multiple_of(self.pp) {
                    return reject(format!(
                        "interleaved 1F1B runs micro-batches in groups of pp = {}; the {m} micro-batches per step must be a multiple of it (Megatron-Core's rule)",
                        self.pp
                    ));
                }
            }
            _ if self.vpp > 1 => {
                return reject(format!("{} runs one model chunk per rank{}; use vpp 1, or the interleaved schedule for virtual stages", s.name(), if s == Schedule::DualPipe { " pair (stages r and pp-1-r)" } else { "" }))
            }
            Schedule::OneFOneB => {}
            _ if self.pp < 2 => return reject(format!("{} needs pipeline parallel size > 1", s.name())),
            _ => {}
        }
        // ZB-H1's schedule (Qi et al. 2023, section 3) is drawn for m >= p: with
        // fewer micro-batches its W's cannot fill the drain it is defined by.
        if s == Schedule::ZbH1 && self.micro_batches(w) < self.pp {
            return reject(format!(
                "ZB-H1 needs at least pp = {} micro-batches per step (has {})",
                self.pp,
                self.micro_batches(w)
            ));
        }
        if s == Schedule::DualPipe {
            let m = self.micro_batches(w);
            if !self.pp.is_multiple_of(2) {
                return reject(format!(
                    "DualPipe needs an even pipeline parallel size (has {})",
                    self.pp
                ));
            }
            if !m.is_multiple_of(2) || m < 2 * self.pp {
                return reject(format!("DualPipe needs an even number of micro-batches, at least 2 x pp = {} (has {m})", 2 * self.pp));
            }
        }
        Ok(())
    }

    /// Checks every structural rule. Memory is checked by the estimator.
    pub fn check(
        &self,
        model: &ModelSpec,
        cluster: &Cluster,
        w: &Workload,
    ) -> Result<(), Rejection> {
        let gpus = cluster.gpus;
        for (name, v) in [
            ("tp", self.tp),
            ("pp", self.pp),
            ("vpp", self.vpp),
            ("cp", self.cp),
            ("ep", self.ep),
            ("etp", self.etp),
            ("dp", self.dp),
            ("mbs", self.mbs),
        ] {
            if v == 0 || v > MAX_KNOB {
                return Err(Rejection::Zero { name: name.into() });
            }
        }
        if let Err(e) = w.validate() {
            return Err(Rejection::Layout {
                detail: e.to_string(),
            });
        }
        if self.gpus() != gpus {
            return Err(Rejection::GpuProduct {
                tp: self.tp,
                pp: self.pp,
                cp: self.cp,
                dp: self.dp,
                gpus,
            });
        }
        if self.sp && self.tp == 1 {
            return Err(Rejection::SpWithoutTp);
        }
        // megatron/training/arguments.py at d98e8a6, validate_args: "Tensor parallel
        // communication/GEMM overlap can happen only when sequence parallelism is
        // enabled".
        if self.overlap.tp_comm && self.tp > 1 && !self.sp {
            return Err(Rejection::TpCommNeedsSp { tp: self.tp });
        }
        if !model.heads.is_multiple_of(self.tp) {
            return Err(Rejection::TpHeads {
                tp: self.tp,
                heads: model.heads,
                valid: divisors(model.heads),
            });
        }
        if model.mla.is_none()
            && !model.kv_heads.is_multiple_of(self.tp)
            && !self.tp.is_multiple_of(model.kv_heads)
        {
            return Err(Rejection::TpKvHeads {
                tp: self.tp,
                kv_heads: model.kv_heads,
            });
        }
        let dense_layers = model.layers - model.moe_layers();
        if dense_layers > 0 && !model.ffn_hidden.is_multiple_of(self.tp) {
            return Err(Rejection::TpFfn {
                tp: self.tp,
                ffn: model.ffn_hidden,
            });
        }
        let domain = cluster.profile.node.nvlink_domain;
        if self.tp > domain && !cluster.allow_tp_beyond_nvlink {
            return Err(Rejection::TpBeyondNvlink {
                tp: self.tp,
                domain,
            });
        }
        if self.pp > model.layers {
            return Err(Rejection::PpLayers {
                pp: self.pp,
                layers: model.layers,
            });
        }
        if self.vpp > 1 && self.pp == 1 {
            return Err(Rejection::VppWithoutPp);
        }
        self.check_schedule(w)?;
        let chunks = self.stage_layers(model.layers)?;
        // Only the first and last virtual stage may be empty (holding just the
        // embedding or the loss), and only when the layout says so.
        let edge_ok = matches!(
            self.layout,
            Layout::AccountEmbeddingLoss | Layout::Explicit { .. }
        );
        let last = chunks.len() - 1;
        if chunks
            .iter()
            .enumerate()
            .any(|(i, &l)| l == 0 && !(edge_ok && (i == 0 || i == last) && last > 0))
        {
            return Err(Rejection::Layout {
                detail: "a pipeline stage would hold no layer".into(),
            });
        }
        if !w.seq.is_multiple_of(2 * self.cp) && self.cp > 1 {
            return Err(Rejection::CpSeq {
                cp: self.cp,
                seq: w.seq,
            });
        }
        self.check_moe(model, cluster)?;
        self.check_recompute_modules(model)?;
        if !w.global_batch.is_multiple_of(self.mbs * self.dp) {
            return Err(Rejection::Batch {
                gbs: w.global_batch,
                mbs: self.mbs,
                dp: self.dp,
            });
        }
        Ok(())
    }

    /// The expert-parallel rules: no EP on a dense model; EP divides the experts,
    /// EP x expert-TP the ranks of a stage, expert-TP the expert FFN; expert TP
    /// within an NVLink domain; SP with EP and TP.
    fn check_moe(&self, model: &ModelSpec, cluster: &Cluster) -> Result<(), Rejection> {
        let domain = cluster.profile.node.nvlink_domain;
        match &model.moe {
            None => {
                if self.ep != 1 || self.etp != 1 {
                    return Err(Rejection::EpDenseModel);
                }
            }
            Some(moe) => {
                if moe.experts % self.ep != 0 {
                    return Err(Rejection::EpExperts {
                        ep: self.ep,
                        experts: moe.experts,
                    });
                }
                let span = self.tp * self.cp * self.dp;
                if !span.is_multiple_of(self.ep * self.etp) {
                    return Err(Rejection::EpSpan {
                        ep: self.ep,
                        etp: self.etp,
                        span,
                    });
                }
                if moe.expert_ffn_hidden % self.etp != 0 {
                    return Err(Rejection::EtpFfn {
                        etp: self.etp,
                        ffn: moe.expert_ffn_hidden,
                    });
                }
                if self.etp > domain && !cluster.allow_tp_beyond_nvlink {
                    return Err(Rejection::TpBeyondNvlink {
                        tp: self.etp,
                        domain,
                    });
                }
                // Megatron-Core's MoE layer raises in training when attention TP
                // is above 1 without sequence parallelism, whatever the EP size
                // (`MoELayer.forward`, megatron/core/transformer/moe/moe_layer.py,
                // line 636 at d98e8a6; since 28c8dd7, May 2024). torchtitan's TP plan
                // always shards the norms' sequence, so this refuses nothing it runs.
                if self.tp > 1 && !self.sp {
                    return Err(Rejection::MoeNeedsSp { tp: self.tp });
                }
            }
        }
        Ok(())
    }
}

/// All divisors of `n`, ascending.
pub fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut i = 1;
    while i * i <= n {
        if n.is_multiple_of(i) {
            small.push(i);
            if i * i != n {
                large.push(n / i);
            }
        }
        i += 1;
    }
    small.extend(large.into_iter().rev());
    small
}
