//! Moving the actor's weights from the training layout into the rollout engines'
//! every iteration, and training state to host memory and back where training and
//! generation share GPUs.
//!
//! - Gather: verl's Megatron workers (`per_tensor_generator` in
//!   verl/utils/megatron_utils.py) and RLinf's actor (`rlinf/workers/actor`)
//!   assemble each full tensor from its tensor-, pipeline- and expert-parallel shards
//!   before handing it to the engine: an all-gather of the whole model (BF16) over
//!   the model-parallel group, priced by [`crate::comm::collective_secs`].
//! - Load: the engine copies its `1/tp` slice into place (read and write at HBM
//!   bandwidth).
//! - Disaggregated pools: the rollout GPUs receive their slice over the network;
//!   the transfer is bound by each receiver's NIC and by the senders' NICs together.
//! - Offload: in the colocated placement the optimizer state (and, when chosen, the
//!   parameters) leave HBM for host memory before generation and return before
//!   training, over the host link ([`super::constants::host_link_gbytes_per_s`]).
//!   The gradient buffer is freed, not copied: the next step zeroes it
//!   (Megatron-LM@76065f17, the commit NeMo RL v0.4 pins,
//!   megatron/core/distributed/param_and_grad_buffer.py:881-887 `offload_to_cpu`
//!   resizes the gradient storage to 0; `reload_from_cpu` zeroes it). The engine's
//!   own weights go to host memory when it sleeps after generating and come back
//!   when it wakes for the next refit (vLLM's sleep level 1 keeps the weights in
//!   host memory and drops the KV cache; NVIDIA-NeMo/RL@06beed91
//!   nemo_rl/models/generation/vllm/vllm_worker.py:725 `sleep(level=1)`,
//!   nemo_rl/algorithms/grpo.py:891-892 `wake_up` of the weights before the refit).

use super::constants::{host_link_gbytes_per_s, ROLLOUT_BYTES};
use crate::comm::{collective_secs, Collective, Placement};
use crate::config::ParallelConfig;
use crate::hardware::HardwareProfile;
use crate::model::ModelSpec;

/// Seconds to assemble full tensors from the training layout on every rank of a
/// model-parallel group (all-gather of the whole BF16 model).
pub fn gather_secs(model: &ModelSpec, hw: &HardwareProfile, train: &ParallelConfig) -> f64 {
    let bytes = model.params().total as f64 * ROLLOUT_BYTES;
    let group = train.tp * train.pp * train.ep.max(1);
    collective_secs(
        hw,
        Collective::AllGather,
        bytes,
        Placement::new(group, 1, hw.node.nvlink_domain),
    )
}

/// Seconds for an engine rank to copy its slice into place.
fn load_secs(model: &ModelSpec, hw: &HardwareProfile, rollout_tp: u64) -> f64 {
    let slice = model.params().total as f64 * ROLLOUT_BYTES / rollout_tp as f64;
    2.0 * slice / (hw.gpu.hbm_tbytes_per_s * 1e12 * hw.efficiency.hbm)
}

/// Colocated: gather on the training ranks, load on the same GPUs.
pub fn colocated_secs(
    model: &ModelSpec,
    hw: &HardwareProfile,
    train: &ParallelConfig,
    rollout_tp: u64,
) -> f64 {
    gather_secs(model, hw, train) + load_secs(model, hw, rollout_tp)
}

/// Disaggregated: gather on the training pool, send every engine its slices over
/// the network, load.
pub fn disaggregated_secs(
    model: &ModelSpec,
    hw: &HardwareProfile,
    train: &ParallelConfig,
    train_gpus: u64,
    rollout_gpus: u64,
    rollout_tp: u64,
) -> f64 {
    let slice = model.params().total as f64 * ROLLOUT_BYTES / rollout_tp as f64;
    let nic = hw.network.nic_gbytes_per_s * 1e9 * hw.efficiency.network_busbw;
    let receive = slice / nic;
    let send = slice * rollout_gpus as f64 / (train_gpus as f64 * nic);
    gather_secs(model, hw, train)
        + receive.max(send)
        + hw.network.latency_us * 1e-6
        + load_secs(model, hw, rollout_tp)
}

/// Seconds to move `bytes` per GPU to host memory and back.
pub fn offload_secs(hw: &HardwareProfile, bytes: f64) -> f64 {
    2.0 * bytes / (host_link_gbytes_per_s(hw) * 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::builtin_profile;
    use crate::presets::resolve;

    fn cfg(tp: u64, pp: u64) -> ParallelConfig {
        crate::rl::phases::fixed_config(tp, pp, 1, 1, 64 / (tp * pp))
    }

    #[test]
    fn rl_gather_over_the_network_costs_more_than_within_a_node() {
        let m = resolve("70b").unwrap().spec;
        let hw = builtin_profile("h100-sxm").unwrap();
        assert!(gather_secs(&m, &hw, &cfg(8, 4)) > gather_secs(&m, &hw, &cfg(8, 1)));
        assert_eq!(gather_secs(&m, &hw, &cfg(1, 1)), 0.0);
    }

    #[test]
    fn rl_few_senders_bound_the_transfer() {
        let m = resolve("8b").unwrap().spec;
        let hw = builtin_profile("h100-sxm").unwrap();
        let few = disaggregated_secs(&m, &hw, &cfg(1, 1), 8, 56, 1);
        let many = disaggregated_secs(&m, &hw, &cfg(1, 1), 56, 8, 1);
        assert!(few > many);
    }
}
