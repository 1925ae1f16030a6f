//! The constants the RL model needs beyond a hardware profile, each with its source.
//! No constant here was fitted to a published RL run.

use crate::hardware::HardwareProfile;

/// verl commit whose code and configuration the verl mechanics and keys were read
/// from (2026-01-29).
pub const VERL_COMMIT: &str = "b178a3cd56f58b2d502255daba591e92833930a7";
/// RLinf commit whose code and configuration the RLinf mechanics and keys were read
/// from (2026-08-22).
pub const RLINF_COMMIT: &str = "a3816b596478dcd8a5c69a6ec1468c9519f77b5b";

/// Bytes per element of the rollout engine's weights and KV cache (BF16, verl's
/// `rollout.dtype` default and RLinf's `rollout.model.precision` in its examples).
pub const ROLLOUT_BYTES: f64 = 2.0;

/// Host link of one GPU, GB/s per direction, for offloading training state to host
/// memory and back: the interface's signalling rate, a floor on the copy time.
/// Sources: PCI-SIG, PCIe 4.0 x16 = 32 GB/s and PCIe 5.0 x16 = 64 GB/s per direction;
/// NVIDIA A100 and H100/H200/H800 SXM datasheets (host interface PCIe Gen4 / Gen5
/// x16); B200 HGX: PCIe Gen5 x16 (NVIDIA HGX B200 datasheet); GB200: NVLink-C2C
/// 900 GB/s bidirectional = 450 GB/s per direction (NVIDIA GB200 NVL72 page);
/// MI300X: PCIe Gen5 x16 (AMD Instinct MI300X datasheet).
pub fn host_link_gbytes_per_s(hw: &HardwareProfile) -> f64 {
    let name = hw.name.to_ascii_lowercase();
    if name.starts_with("a100") {
        32.0
    } else if name.starts_with("gb200") {
        450.0
    } else {
        64.0
    }
}

/// GEMM launches per transformer layer in one decode step (QKV, attention output,
/// fused gate/up, down projection), each charged the profile's
/// `efficiency.gemm_overhead_us`; the attention kernel is charged the same once.
pub const DECODE_KERNELS_PER_LAYER: f64 = 5.0;

/// Host time per running sequence per decode step that the GPU waits for when the
/// engine schedules synchronously: between two decode steps the host schedules the
/// next step, prepares its inputs and processes the last step's outputs, request by
/// request, while the GPU idles.
///
/// Source: 5-6 ms between two decode steps at 256 running sequences (Llama-2-7B,
/// ShareGPT, vLLM's V1 engine), vllm-project/vllm issue #10634; overlapping that
/// host work with the forward pass cut the gap to 0.15-0.17 ms (vllm-project/vllm
/// PR #11133). The midpoint, 5.5 ms, over the 256 sequences it was measured at.
/// Synchronous scheduling is vLLM's default up to v0.11 (`async_scheduling: bool =
/// False`, vllm/config/scheduler.py; PR #27614 made asynchronous scheduling the
/// default after v0.11.0), the version NeMo RL v0.4 pins (`vllm==0.11.0`,
/// NVIDIA-NeMo/RL@06beed91:pyproject.toml).
pub const ENGINE_HOST_SECS_PER_SEQ_STEP: f64 = 5.5e-3 / 256.0;

/// The largest rollout memory fraction exported: vLLM refuses more than the free
/// memory at start-up, and verl's perf-tuning guide (docs/perf/perf_tuning.rst,
/// "gpu_memory_utilization") calls 0.5 to 0.7 the usual range; 0.9 is vLLM's own
/// default (`EngineArgs.gpu_memory_utilization`).
pub const MAX_MEMORY_FRACTION: f64 = 0.9;

/// Host time per weight tensor of a refit beyond moving its bytes: the gather, the
/// conversion and the engine's `load_weights` run tensor by tensor (collective
/// launches, Python calls).
///
/// Source: NeMo RL's refit post (NVIDIA-NeMo/.github
/// blog/posts/nemo-rl-refit-performance/index.md, 2025-08-12, Table 1): DeepSeek-V3,
/// training EP64 PP8, generation TP64, NeMo RL v0.3: the parameter gather took
/// 12.2 s against a speed of light (full network and HBM bandwidth, no CPU
/// overhead) of 3.3 s and the engine's update 1.5 s against 0.01 s: 10.39 s over
/// the 45,337 tensors [`super::reshard::weight_tensors`] counts for DeepSeek-V3, so
/// that the model charges its source run what was measured. The post says "over 90
/// thousand" tensors, about twice that count: DeepSeek-V3's published FP8 checkpoint
/// carries a `weight_scale_inv` beside each quantized weight, which a BF16 refit
/// does not move; dividing by the post's figure would charge the source run half
/// its measured time (review of 112c27a). The post's middle step (the CUDA IPC
/// handles passed through Ray, 33.5 s there) is left out: NeMo RL v0.4 streams the
/// packed buffers over ZMQ instead (NVIDIA-NeMo/RL@06beed91
/// nemo_rl/algorithms/grpo.py:918 `update_weights_via_ipc_zmq`).
pub const REFIT_SECS_PER_TENSOR: f64 = (12.2 - 3.3 + 1.5 - 0.01) / 45_337.0;
