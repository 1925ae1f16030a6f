//! A PyTorch profiler (Kineto) Chrome trace of a few training steps: GPU kernel
//! time per step by class. Pure: the CLI reads the file and hands its text over.
//!
//! The format is Kineto's `ChromeTraceLogger` (libkineto `output_json.cpp`): a JSON
//! object whose `traceEvents` array holds complete events `{"ph": "X", "cat":
//! CATEGORY, "name": ..., "pid": DEVICE, "tid": STREAM, "ts": us, "dur": us,
//! "args": {...}}`. GPU kernels have category `kernel` (libkineto
//! `ActivityType.cpp`); `torch.profiler.profile` wraps each step in a
//! `ProfilerStep#N` `user_annotation`, which is how the steps are counted. Only
//! kernels are summed (copies and memsets are `gpu_memcpy` / `gpu_memset`), and the
//! events are folded one at a time as they are parsed, so a large trace costs its
//! text and not a copy of every event.
//!
//! Kernels are classified by name ([`classify`], first match wins):
//! 1. NCCL: a name starting `ncclDevKernel` (NCCL 2.19+) or `ncclKernel` (older).
//!    `SendRecv`, `Send` or `Recv` in it: a point-to-point transfer (pipeline sends,
//!    and all-to-alls, which NCCL runs as grouped sends); any other: a collective
//!    (`AllReduce`, `AllGather`, `ReduceScatter`, `Broadcast`, `Reduce`).
//! 2. Attention: `flash` (FlashAttention 2/3, PyTorch's flash SDPA), `fmha`
//!    (CUTLASS / TensorRT fused multi-head attention, PyTorch's memory-efficient
//!    SDPA), `sdpa` (cuDNN's fused attention, which Transformer Engine calls),
//!    `fused_attn`; case-insensitive.
//! 3. GEMM: `gemm` (cuBLAS `*_xmma_gemm_*`, `*s16816gemm*`, CUTLASS `GemmUniversal`,
//!    grouped GEMMs), `cutlass`, `xmma`, `nvjet` (cuBLAS 12.8+ Hopper/Blackwell
//!    kernels), `cublas`; case-insensitive. Attention is checked first: its CUTLASS
//!    kernels carry `cutlass` in their names.
//! 4. Everything else (element-wise, norms, softmax, optimizer, copies as kernels).
//!
//! A collective kernel's duration includes the time it waits for the slowest
//! member to arrive, so its sum is the time the GPU spent in collectives, an upper
//! bound on the transfer itself.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::error::InputError;

/// Steps a trace may hold (a profiler window is a few).
const MAX_STEPS: usize = 100_000;

/// What a kernel's name says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelClass {
    Gemm,
    Attention,
    /// NCCL all-reduce, all-gather, reduce-scatter, broadcast, reduce.
    Collective,
    /// NCCL send/receive: pipeline transfers and all-to-alls.
    SendRecv,
    Other,
}

/// Name fragments of attention kernels (lower case).
pub const ATTENTION_MARKS: &[&str] = &["flash", "fmha", "sdpa", "fused_attn"];
/// Name fragments of GEMM kernels (lower case).
pub const GEMM_MARKS: &[&str] = &["gemm", "cutlass", "xmma", "nvjet", "cublas"];

/// The class of a kernel by its name (the rules of the module doc).
pub fn classify(name: &str) -> KernelClass {
    if name.starts_with("ncclDevKernel") || name.starts_with("ncclKernel") {
        let p2p = ["SendRecv", "_Send", "_Recv"]
            .iter()
            .any(|m| name.contains(m));
        return if p2p {
            KernelClass::SendRecv
        } else {
            KernelClass::Collective
        };
    }
    let lower = name.to_ascii_lowercase();
    if ATTENTION_MARKS.iter().any(|m| lower.contains(m)) {
        KernelClass::Attention
    } else if GEMM_MARKS.iter().any(|m| lower.contains(m)) {
        KernelClass::Gemm
    } else {
        KernelClass::Other
    }
}

/// Kernel seconds per step, by class, on the traced GPU.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KernelTimes {
    /// `ProfilerStep#N` annotations in the trace.
    pub steps: u64,
    pub kernels: u64,
    pub gemm_secs: f64,
    pub attention_secs: f64,
    pub collective_secs: f64,
    pub send_recv_secs: f64,
    pub other_secs: f64,
}

impl KernelTimes {
    /// Parses a trace and divides each class's kernel time by its step count.
    pub fn from_json(text: &str) -> Result<KernelTimes, InputError> {
        let t: Trace = crate::json::from_str(text, "Kineto trace")?;
        let Some(f) = t.trace_events else {
            return Err(InputError::Workload(
                "Kineto trace has no traceEvents array: export it with torch.profiler's export_chrome_trace (or tensorboard_trace_handler)".into(),
            ));
        };
        if f.devices.len() > 1 {
            return Err(InputError::Workload(format!(
                "Kineto trace holds kernels of {} devices ({}): give one rank's trace",
                f.devices.len(),
                f.devices.iter().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        if f.kernels == 0 {
            return Err(InputError::Workload(
                "Kineto trace holds no GPU kernel (no event with \"cat\": \"kernel\"): profile with ProfilerActivity.CUDA".into(),
            ));
        }
        if f.steps.is_empty() {
            return Err(InputError::Workload(
                "Kineto trace holds no ProfilerStep#N annotation, so its kernels cannot be divided into steps: call prof.step() once per iteration".into(),
            ));
        }
        let n = f.steps.len() as f64;
        Ok(KernelTimes {
            steps: f.steps.len() as u64,
            kernels: f.kernels,
            gemm_secs: f.us[0] * 1e-6 / n,
            attention_secs: f.us[1] * 1e-6 / n,
            collective_secs: f.us[2] * 1e-6 / n,
            send_recv_secs: f.us[3] * 1e-6 / n,
            other_secs: f.us[4] * 1e-6 / n,
        })
    }

    /// Total kernel time per step (streams overlap, so this can exceed the step).
    pub fn total_secs(&self) -> f64 {
        self.gemm_secs
            + self.attention_secs
            + self.collective_secs
            + self.send_recv_secs
            + self.other_secs
    }
}

#[derive(Deserialize)]
struct Trace {
    #[serde(rename = "traceEvents", default, deserialize_with = "fold_events")]
    trace_events: Option<Folded>,
}

/// Sums over the events, in microseconds by class (order of [`KernelClass`]).
#[derive(Default)]
struct Folded {
    us: [f64; 5],
    kernels: u64,
    devices: BTreeSet<String>,
    steps: BTreeSet<String>,
}

/// One event, only the fields read (the rest is skipped unparsed).
#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    ph: Option<String>,
    #[serde(default)]
    cat: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    dur: Option<f64>,
    #[serde(default)]
    pid: Option<serde_json::Value>,
}

fn fold_events<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Folded>, D::Error> {
    struct Fold;
    impl<'de> Visitor<'de> for Fold {
        type Value = Folded;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an array of trace events")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Folded, A::Error> {
            let mut f = Folded::default();
            while let Some(e) = seq.next_element::<Event>()? {
                if e.ph.as_deref() != Some("X") {
                    continue;
                }
                let name = e.name.unwrap_or_default();
                match e.cat.as_deref() {
                    Some("kernel") => {
                        let dur = e.dur.unwrap_or(0.0);
                        // A kernel longer than a day is no kernel.
                        if !(dur.is_finite() && (0.0..=86_400e6).contains(&dur)) {
                            return Err(serde::de::Error::custom(format!(
                                "kernel '{}' has duration {dur} us: expected 0 to 8.64e10",
                                name.escape_debug()
                            )));
                        }
                        let i = match classify(&name) {
                            KernelClass::Gemm => 0,
                            KernelClass::Attention => 1,
                            KernelClass::Collective => 2,
                            KernelClass::SendRecv => 3,
                            KernelClass::Other => 4,
                        };
                        f.us[i] += dur;
                        f.kernels += 1;
                        if let Some(p) = e.pid {
                            if f.devices.len() < 64 {
                                f.devices.insert(p.to_string());
                            }
                        }
                    }
                    Some("user_annotation") if name.starts_with("ProfilerStep#") => {
                        if f.steps.len() >= MAX_STEPS {
                            return Err(serde::de::Error::custom(format!(
                                "more than {MAX_STEPS} ProfilerStep annotations"
                            )));
                        }
                        f.steps.insert(name);
                    }
                    _ => {}
                }
            }
            Ok(f)
        }
    }
    d.deserialize_seq(Fold).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernel names as the libraries name them, each with its class.
    #[test]
    fn kernels_are_classified_by_the_documented_list() {
        let cases = [
            ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", KernelClass::Gemm),
            ("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNT", KernelClass::Gemm),
            ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", KernelClass::Gemm),
            ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<int>>(int)", KernelClass::Gemm),
            ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>(Flash_fwd_params)", KernelClass::Attention),
            ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1", KernelClass::Attention),
            ("fmha_cutlassB_bf16_aligned_64x64_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)", KernelClass::Attention),
            ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", KernelClass::Collective),
            ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", KernelClass::Collective),
            ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", KernelClass::Collective),
            ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", KernelClass::SendRecv),
            ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", KernelClass::SendRecv),
            ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)", KernelClass::Other),
            ("void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<float>(int)", KernelClass::Other),
        ];
        for (name, class) in cases {
            assert_eq!(classify(name), class, "{name}");
        }
    }

    #[test]
    fn a_trace_is_summed_per_step_and_bad_traces_are_named() {
        let ev = |cat: &str, name: &str, dur: f64| {
            format!(
                r#"{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": 0, "tid": 7, "ts": 1.5, "dur": {dur}, "args": {{"stream": 7, "grid": [1, 2, 3]}}}}"#
            )
        };
        let events = [
            ev("user_annotation", "ProfilerStep#4", 900.0),
            ev("user_annotation", "ProfilerStep#5", 900.0),
            ev("kernel", "nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNT", 300.0),
            ev("kernel", "nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNT", 100.0),
            ev("kernel", "flash_fwd_kernel", 80.0),
            ev(
                "kernel",
                "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)",
                40.0,
            ),
            ev("kernel", "ncclDevKernel_SendRecv(x)", 20.0),
            ev("kernel", "elementwise_kernel", 10.0),
            ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 5000.0),
            ev("cpu_op", "aten::mm", 7000.0),
        ];
        let text = format!(
            r#"{{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [{}, {{"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 9.0}}], "traceName": "t.json"}}"#,
            events.join(", ")
        );
        let k = KernelTimes::from_json(&text).unwrap();
        assert_eq!((k.steps, k.kernels), (2, 6));
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(k.gemm_secs, 200e-6), "{k:?}");
        assert!(close(k.attention_secs, 40e-6));
        assert!(close(k.collective_secs, 20e-6));
        assert!(close(k.send_recv_secs, 10e-6));
        assert!(close(k.other_secs, 5e-6));
        // No steps, no kernels, two devices, no events array, a negative duration.
        let no_steps = text.replace("ProfilerStep#", "Step");
        let e = KernelTimes::from_json(&no_steps).unwrap_err().to_string();
        assert!(e.contains("no ProfilerStep#N"), "{e}");
        let e = KernelTimes::from_json(&text.replace("\"kernel\"", "\"cpu_op\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no GPU kernel"), "{e}");
        let two = text.replacen("\"pid\": 0", "\"pid\": 1", 3);
        let e = KernelTimes::from_json(&two).unwrap_err().to_string();
        assert!(e.contains("2 devices"), "{e}");
        let e = KernelTimes::from_json(r#"{"traceName": "x"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no traceEvents"), "{e}");
        let e = KernelTimes::from_json(&text.replace("300", "-300"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("duration -300"), "{e}");
    }
}
