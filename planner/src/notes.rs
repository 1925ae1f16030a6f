//! Sanity notes on a workload and a plan: things a practitioner would question
//! before running it. They never change a number; `plan` and `estimate` print them.

use crate::config::{ParallelConfig, Workload};

/// Notes on the workload alone (`gpus` GPUs) and, when given, on one plan.
pub fn sanity_notes(
    w: &Workload,
    gpus: u64,
    default_seq: u64,
    cfg: Option<&ParallelConfig>,
) -> Vec<String> {
    let mut out = Vec::new();
    let tokens = w.global_batch.saturating_mul(w.seq);
    let per_gpu = tokens as f64 / gpus.max(1) as f64;
    // Below one sequence per GPU the batch cannot fill data parallelism without
    // splitting sequences (CP or TP), and every GPU waits on collectives sized for more.
    if w.global_batch < gpus {
        out.push(format!(
            "global batch {} sequences is smaller than the {gpus} GPUs: {per_gpu:.0} tokens per GPU per step; a step this small is dominated by communication and pipeline fill (raise --global-batch, or plan on fewer GPUs)",
            w.global_batch
        ));
    }
    if w.seq != default_seq {
        out.push(format!(
            "--seq {} makes each of the {} sequences {} tokens: {:.2}M tokens per step, {:.1}x the tokens of --seq {default_seq} at the same --global-batch",
            w.seq,
            w.global_batch,
            w.seq,
            tokens as f64 / 1e6,
            w.seq as f64 / default_seq as f64
        ));
    }
    if let Some(c) = cfg {
        let m = c.micro_batches(w);
        if c.pp > 1 && m == 1 {
            out.push(format!(
                "one micro-batch per step with pp {}: the stages run one after another, so the pipeline is idle (pp-1)/pp = {:.0}% of the time",
                c.pp,
                100.0 * (c.pp - 1) as f64 / c.pp as f64
            ));
        } else if c.pp > 1 && m < c.pp {
            out.push(format!("{m} micro-batches per step on {} pipeline stages: fewer micro-batches than stages leaves most of the pipeline idle", c.pp));
        }
    }
    out
}

/// A note when a mixture-of-experts plan is priced on a profile that states no host
/// costs: its MoE layers are then priced as if the host never held the GPU back
/// (`cost/host.rs`), which is optimistic at small micro-batches.
pub fn host_notes(moe: bool, profile: &crate::hardware::HardwareProfile) -> Vec<String> {
    let e = &profile.efficiency;
    if moe && e.host_op_us <= 0.0 && e.host_kernel_us <= 0.0 {
        vec![format!(
            "profile {} states no host costs (efficiency.host_op_us, host_kernel_us): its MoE layers are priced as if the GPU never waited for the host, optimistic at small micro-batches (the built-in profiles carry 90 and 3 us)",
            profile.name
        )]
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Precision;

    fn w(seq: u64, gbs: u64) -> Workload {
        Workload {
            seq,
            global_batch: gbs,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        }
    }

    #[test]
    fn notes_name_the_problem() {
        assert!(sanity_notes(&w(4096, 1024), 128, 4096, None).is_empty());
        let n = sanity_notes(&w(4096, 64), 128, 4096, None);
        assert!(
            n.len() == 1 && n[0].contains("2048 tokens per GPU"),
            "{n:?}"
        );
        let n = sanity_notes(&w(8192, 1024), 128, 4096, None);
        assert!(
            n.len() == 1 && n[0].contains("8.39M tokens") && n[0].contains("2.0x"),
            "{n:?}"
        );
        use crate::config::{Dispatcher, Layout, Overlap, Recompute, Zero};
        let c = ParallelConfig {
            tp: 8,
            pp: 4,
            vpp: 1,
            cp: 1,
            ep: 1,
            etp: 1,
            dp: 4,
            sp: true,
            mbs: 1,
            zero: Zero::DistOpt,
            recompute: Recompute::None,
            layout: Layout::Even,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            recompute_modules: Default::default(),
            moe_dispatcher: Dispatcher::AllToAll,
            schedule: crate::schedule::Schedule::OneFOneB,
        };
        let n = sanity_notes(&w(4096, 4), 128, 4096, Some(&c));
        assert_eq!(c.micro_batches(&w(4096, 4)), 1);
        assert!(
            n.iter()
                .any(|s| s.contains("one micro-batch per step with pp 4") && s.contains("75%")),
            "{n:?}"
        );
        let n = sanity_notes(&w(4096, 8), 128, 4096, Some(&c));
        assert_eq!(c.micro_batches(&w(4096, 8)), 2);
        assert!(
            n.iter()
                .any(|s| s.contains("2 micro-batches per step on 4 pipeline stages")),
            "{n:?}"
        );
    }

    #[test]
    fn a_profile_without_host_costs_is_named_for_moe_plans() {
        let mut p = crate::hardware::builtin_profile("h100-sxm").unwrap();
        assert!(host_notes(true, &p).is_empty());
        p.efficiency.host_op_us = 0.0;
        p.efficiency.host_kernel_us = 0.0;
        assert!(host_notes(false, &p).is_empty());
        let n = host_notes(true, &p);
        assert!(n.len() == 1 && n[0].contains("host_op_us"), "{n:?}");
    }
}
