//! Moving the actor's weights from the training layout into the rollout engines'
//! every iteration, and training state to host memory and back where training and
//! generation share GPUs.
//!
//! - Gather: verl's Megatron workers (`per_tensor_generator` in
//!   verl/utils/megatron_utils.py), RLinf's actor (`rlinf/workers/actor`) and NeMo
//!   RL's (Megatron-Bridge's `export_hf_weights`, streamed by
//!   `stream_weights_via_ipc_zmq`, NVIDIA-NeMo/RL@06beed91
//!   nemo_rl/models/policy/megatron_policy_worker.py:1998-2018) assemble each full
//!   tensor from its tensor-, pipeline- and expert-parallel shards before handing it
//!   to the engine: an all-gather of the whole model (BF16) over the model-parallel
//!   group, priced by [`crate::comm::collective_secs`].
//! - Per tensor: the gather, the conversion to the engine's names and the engine's
//!   `load_weights` run tensor by tensor, each tensor its own collectives (a
//!   broadcast from the pipeline stage that holds it, an all-gather over TP, for an
//!   expert an all-gather over EP: NVIDIA-NeMo/Megatron-Bridge@8aa287df
//!   src/megatron/bridge/models/conversion/param_mapping.py:284, :503, :605) and its
//!   own Python calls; NeMo RL measured that work beyond the bandwidth
//!   ([`super::constants::REFIT_SECS_PER_TENSOR`], [`tensor_secs`]).
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

use super::constants::{host_link_gbytes_per_s, REFIT_SECS_PER_TENSOR, ROLLOUT_BYTES};
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

/// Weight tensors the refit hands over, as the engine names them (Hugging Face
/// layout): per layer the attention's projections (Q, K, V and the output; MLA's
/// down and up projections of Q and of K/V, their two norms and the output) and two
/// norms; the dense MLP's gate, up and down projections, or per MoE layer the
/// router, three per routed expert and three for the shared experts; the embedding,
/// the final norm and the output layer.
pub fn weight_tensors(model: &ModelSpec) -> f64 {
    let attention = if model.mla.is_some() { 7.0 } else { 4.0 } + 2.0;
    let moe_layers = model.moe_layers() as f64;
    let dense_layers = model.layers as f64 - moe_layers;
    let moe_mlp = match &model.moe {
        Some(m) => {
            let shared = m.shared_experts > 0 || m.shared_ffn_hidden.is_some();
            1.0 + 3.0 * m.experts as f64 + if shared { 3.0 } else { 0.0 }
        }
        None => 0.0,
    };
    model.layers as f64 * attention + dense_layers * 3.0 + moe_layers * moe_mlp + 3.0
}

/// Seconds of host work the tensor-by-tensor refit spends beyond moving bytes
/// ([`REFIT_SECS_PER_TENSOR`] per tensor).
pub fn tensor_secs(model: &ModelSpec) -> f64 {
    weight_tensors(model) * REFIT_SECS_PER_TENSOR
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
    gather_secs(model, hw, train) + load_secs(model, hw, rollout_tp) + tensor_secs(model)
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
        + tensor_secs(model)
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
    fn rl_refit_pays_per_tensor_and_experts_are_many() {
        // Llama 3.1 8B: 32 x (4 + 2 + 3) + 3 = 291 tensors, as its checkpoint lists.
        assert_eq!(weight_tensors(&resolve("8b").unwrap().spec), 291.0);
        // DeepSeek-V3 in BF16: 3 dense layers, 58 MoE layers of 256 experts.
        let dsv3 = weight_tensors(&resolve("deepseek-v3").unwrap().spec);
        assert_eq!(
            dsv3,
            61.0 * 9.0 + 3.0 * 3.0 + 58.0 * (1.0 + 768.0 + 3.0) + 3.0
        );
        // The constant's source run (NeMo RL's refit post, DeepSeek-V3): its host
        // time beyond the bytes, 12.2 - 3.3 + 1.5 - 0.01 s, is what is charged.
        let t = tensor_secs(&resolve("deepseek-v3").unwrap().spec);
        assert!((t - 10.39).abs() < 1e-9, "{t}");
        let m = resolve("8b").unwrap().spec;
        let hw = builtin_profile("h100-sxm").unwrap();
        let c = colocated_secs(&m, &hw, &cfg(1, 1), 1);
        assert!(c > tensor_secs(&m) && tensor_secs(&m) > 0.0);
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
