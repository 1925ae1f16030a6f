//! The built-in profiles, compiled in from `hwprofiles/`, and lookup by name or
//! alias.

use super::HardwareProfile;
use crate::error::InputError;
use crate::presets::suggestions;

/// Built-in profiles, compiled in from hwprofiles/.
pub(super) const BUILTIN: &[(&str, &str)] = &[
    (
        "a100-80g",
        include_str!("../../../hwprofiles/a100-80g.json"),
    ),
    (
        "a100-40g",
        include_str!("../../../hwprofiles/a100-40g.json"),
    ),
    (
        "h100-sxm",
        include_str!("../../../hwprofiles/h100-sxm.json"),
    ),
    (
        "h200-sxm",
        include_str!("../../../hwprofiles/h200-sxm.json"),
    ),
    (
        "aws-p5-hf",
        include_str!("../../../hwprofiles/aws-p5-hf.json"),
    ),
    ("h800", include_str!("../../../hwprofiles/h800.json")),
    ("b200", include_str!("../../../hwprofiles/b200.json")),
    (
        "gb200-nvl72",
        include_str!("../../../hwprofiles/gb200-nvl72.json"),
    ),
    ("mi300x", include_str!("../../../hwprofiles/mi300x.json")),
];

/// The default cluster: DGX H100.
pub const DEFAULT_PROFILE: &str = "h100-sxm";

/// Efficiency fields that every profile must justify in `sources`.
pub const SOURCED_FIELDS: &[&str] = &[
    "gpu.peak_tflops",
    "gpu.hbm_gib",
    "gpu.hbm_tbytes_per_s",
    "node.nvlink_gbytes_per_s",
    "network.nic_gbytes_per_s",
    "efficiency.gemm_bf16",
    "efficiency.attention_fwd",
    "efficiency.hbm",
    "efficiency.host_op_us",
    "efficiency.host_kernel_us",
    "efficiency.host_layer_kernel_us",
    "efficiency.nvlink_busbw",
    "efficiency.network_busbw",
    "memory.reserve_gib",
    "memory.headroom",
];

/// All built-in profiles, parsed. Panics only if a compiled-in file is broken, which
/// the unit tests rule out.
pub fn builtin_profiles() -> Vec<HardwareProfile> {
    BUILTIN
        .iter()
        .map(|(name, text)| {
            HardwareProfile::from_json(text)
                .unwrap_or_else(|e| panic!("built-in profile {name} is invalid: {e}"))
        })
        .collect()
}

/// Finds a built-in profile by name or alias.
pub fn builtin_profile(name: &str) -> Result<HardwareProfile, InputError> {
    let key = name.trim().to_ascii_lowercase();
    let all = builtin_profiles();
    if let Some(p) = all
        .iter()
        .find(|p| p.name == key || p.aliases.contains(&key))
    {
        return Ok(p.clone());
    }
    let names: Vec<&str> = all
        .iter()
        .flat_map(|p| std::iter::once(p.name.as_str()).chain(p.aliases.iter().map(|a| a.as_str())))
        .collect();
    Err(InputError::UnknownProfile {
        name: name.to_string(),
        suggestions: suggestions(&key, names.into_iter()),
    })
}
