//! How transformer layers are split across pipeline stages: even, with the
//! embedding and loss counted as layers, stated first/last stages, an explicit
//! list, or a Megatron `--pipeline-model-parallel-layout` string; and the layers
//! of each virtual stage ([`ParallelConfig::stage_layers`]).

use serde::{Deserialize, Serialize};

use super::{ParallelConfig, Rejection};

/// How transformer layers are split across pipeline stages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Layout {
    /// Every virtual stage holds layers / (pp * vpp) layers.
    Even,
    /// The embedding and the loss each count as one layer (Megatron's
    /// `--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`):
    /// (layers + 2) / (pp * vpp) per virtual stage, one fewer on the first and last.
    AccountEmbeddingLoss,
    /// Megatron's `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`;
    /// the rest split evenly over the middle stages.
    FirstLast { first: u64, last: u64 },
    /// Layers per virtual stage, in pipeline order (pp * vpp entries).
    Explicit { layers: Vec<u64> },
}

impl Layout {
    /// The simplest layout that states these per-stage layer counts (no virtual
    /// stages): even, first/last counts with an even middle, or an explicit list.
    pub fn from_counts(counts: &[u64]) -> Layout {
        let n = counts.len();
        if counts.iter().all(|&c| c == counts[0]) {
            return Layout::Even;
        }
        if n >= 3 && counts[1..n - 1].iter().all(|&c| c == counts[1]) {
            return Layout::FirstLast {
                first: counts[0],
                last: counts[n - 1],
            };
        }
        if n == 2 {
            return Layout::FirstLast {
                first: counts[0],
                last: counts[1],
            };
        }
        Layout::Explicit {
            layers: counts.to_vec(),
        }
    }

    /// The layout a practitioner would state for `layers` on `pp x vpp` virtual
    /// stages: even when it divides; else with the embedding and loss each counted
    /// as a layer when that divides; else the same idea with the remainder spread
    /// over the middle stages (an explicit per-stage list).
    pub fn balanced(layers: u64, pp: u64, vpp: u64) -> Layout {
        let chunks = pp.saturating_mul(vpp);
        // Zero chunks is for `check` to reject; with more chunks than layers + 2
        // no split below holds every layer, so those are even too (and the list
        // is never allocated).
        if chunks == 0 || chunks > layers.saturating_add(2) || layers.is_multiple_of(chunks) {
            return Layout::Even;
        }
        if chunks > 1 && (layers + 2).is_multiple_of(chunks) && (layers + 2) / chunks >= 2 {
            return Layout::AccountEmbeddingLoss;
        }
        if chunks == 1 {
            return Layout::Even;
        }
        let total = layers + 2;
        let base = total / chunks;
        let rem = total % chunks;
        // Give the extra layers to the middle chunks, keeping the edges light.
        let skip = (chunks - rem) / 2;
        let mut list: Vec<u64> = (0..chunks)
            .map(|i| base + u64::from(i >= skip && i < skip + rem))
            .collect();
        list[0] = list[0].saturating_sub(1);
        let last = list.len() - 1;
        list[last] = list[last].saturating_sub(1);
        // Fix the sum if an edge was already 0 (fewer layers than chunks).
        let sum: u64 = list.iter().sum();
        if sum != layers {
            return Layout::Even;
        }
        Layout::Explicit { layers: list }
    }

    /// Reads Megatron's `--pipeline-model-parallel-layout` string (grammar of
    /// megatron/core/transformer/pipeline_parallel_layer_layout.py): `E` embedding,
    /// `t` decoder layer, `m` multi-token-prediction layer, `L` loss, `|` between
    /// virtual stages in layer order (stage `j * pp + i` on rank `i`), `x*n` and
    /// `(...)*n` repeat, commas and spaces are cosmetic. Megatron's own rules apply
    /// (the embedding first, the loss last, each once; MTP layers after every
    /// decoder layer), and one of Sextant's: MTP layers sit on the last virtual
    /// stage, beside the loss.
    pub fn from_megatron(text: &str, pp: u64) -> Result<MegatronLayout, LayoutError> {
        const MAX_ENTRIES: usize = 1 << 20;
        let chars: Vec<char> = text
            .chars()
            .filter(|c| !c.is_whitespace() && *c != ',')
            .collect();
        if chars.is_empty() {
            return Err(LayoutError::Empty);
        }
        let mut pos = 0;
        let expanded = expand_layout(&chars, &mut pos, 0, MAX_ENTRIES)?;
        if pos != chars.len() {
            return Err(LayoutError::UnmatchedClose(pos + 1));
        }
        let stages: Vec<&[char]> = expanded.split(|&c| c == '|').collect();
        let n = stages.len() as u64;
        if pp == 0 || !n.is_multiple_of(pp) {
            return Err(LayoutError::StagesNotMultiple { stages: n, pp });
        }
        let count = |c: char| expanded.iter().filter(|&&x| x == c).count();
        if count('E') != 1 || stages[0].first() != Some(&'E') {
            return Err(LayoutError::Embedding);
        }
        if count('L') != 1 || stages[stages.len() - 1].last() != Some(&'L') {
            return Err(LayoutError::Loss);
        }
        let mtp = count('m') as u64;
        if let Some(first_m) = expanded.iter().position(|&c| c == 'm') {
            if expanded[first_m..].contains(&'t') {
                return Err(LayoutError::MtpBeforeDecoder);
            }
            if stages[..stages.len() - 1].iter().any(|s| s.contains(&'m')) {
                return Err(LayoutError::MtpNotLast);
            }
        }
        let layers: Vec<u64> = stages
            .iter()
            .map(|s| s.iter().filter(|&&c| c == 't').count() as u64)
            .collect();
        if layers.iter().sum::<u64>() == 0 {
            return Err(LayoutError::NoDecoder);
        }
        Ok(MegatronLayout {
            layout: Layout::Explicit { layers },
            vpp: n / pp,
            mtp_layers: mtp,
        })
    }
}

/// Why a Megatron `--pipeline-model-parallel-layout` string cannot be read
/// ([`Layout::from_megatron`]); positions count characters from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("the pipeline layout is empty (example: \"Et*4|(t*4|)*14tmL\")")]
    Empty,
    #[error("unmatched ')' at character {0} of the pipeline layout")]
    UnmatchedClose(usize),
    #[error("the pipeline layout has {stages} virtual stages, not a multiple of pp = {pp}")]
    StagesNotMultiple { stages: u64, pp: u64 },
    #[error("the pipeline layout must start with the embedding 'E', once")]
    Embedding,
    #[error("the pipeline layout must end with the loss 'L', once")]
    Loss,
    #[error("decoder layers 't' must come before the MTP layers 'm' (Megatron's rule)")]
    MtpBeforeDecoder,
    #[error("MTP layers 'm' must be on the last virtual stage, with the loss (Sextant does not model Megatron's standalone MTP stage)")]
    MtpNotLast,
    #[error("the pipeline layout holds no decoder layer 't'")]
    NoDecoder,
    #[error("the pipeline layout nests parentheses more than {MAX_LAYOUT_DEPTH} deep (character {0}); Megatron's layouts need one or two levels")]
    TooDeep(usize),
    #[error("an opening '(' in the pipeline layout is never closed")]
    Unclosed,
    #[error("a parenthesised group in the pipeline layout needs a repeat count, as in (t*4|)*14")]
    GroupWithoutCount,
    #[error("'*' at character {0} repeats nothing")]
    RepeatsNothing(usize),
    #[error("'{0}' is not a pipeline layout character (E embedding, t decoder layer, m MTP layer, L loss, | stage break, x*n and (...)*n repeats)")]
    BadChar(char),
    /// At the first character after the `*`.
    #[error("'*' at character {0} needs a whole repeat count")]
    BadCount(usize),
    #[error("the pipeline layout expands to more than {0} entries")]
    TooLong(usize),
}

/// What a Megatron layout string states: the per-virtual-stage decoder layers,
/// the virtual stages per rank it implies and its MTP layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MegatronLayout {
    pub layout: Layout,
    pub vpp: u64,
    pub mtp_layers: u64,
}

/// How deep `(...)` groups of a layout may nest: each level is a stack frame of
/// [`expand_layout`], so an unbounded depth would overflow the stack.
const MAX_LAYOUT_DEPTH: usize = 16;

/// Expands repetitions of a Megatron layout from `pos` to the end or to the
/// closing parenthesis of this group, refusing more than `max` entries.
fn expand_layout(
    chars: &[char],
    pos: &mut usize,
    depth: usize,
    max: usize,
) -> Result<Vec<char>, LayoutError> {
    let mut out: Vec<char> = Vec::new();
    while *pos < chars.len() {
        let c = chars[*pos];
        let item: Vec<char> = match c {
            'E' | 't' | 'm' | 'L' | '|' => {
                *pos += 1;
                vec![c]
            }
            '(' if depth >= MAX_LAYOUT_DEPTH => return Err(LayoutError::TooDeep(*pos + 1)),
            '(' => {
                *pos += 1;
                let inner = expand_layout(chars, pos, depth + 1, max)?;
                if chars.get(*pos) != Some(&')') {
                    return Err(LayoutError::Unclosed);
                }
                *pos += 1;
                if chars.get(*pos) != Some(&'*') {
                    return Err(LayoutError::GroupWithoutCount);
                }
                inner
            }
            ')' if depth > 0 => return Ok(out),
            ')' => return Err(LayoutError::UnmatchedClose(*pos + 1)),
            '*' => return Err(LayoutError::RepeatsNothing(*pos + 1)),
            other => return Err(LayoutError::BadChar(other)),
        };
        let mut times = 1usize;
        if chars.get(*pos) == Some(&'*') {
            *pos += 1;
            let start = *pos;
            while chars.get(*pos).is_some_and(|c| c.is_ascii_digit()) {
                *pos += 1;
            }
            let digits: String = chars[start..*pos].iter().collect();
            times = digits.parse().map_err(|_| LayoutError::BadCount(start))?;
        }
        if out.len().saturating_add(item.len().saturating_mul(times)) > max {
            return Err(LayoutError::TooLong(max));
        }
        for _ in 0..times {
            out.extend_from_slice(&item);
        }
    }
    if depth > 0 {
        return Err(LayoutError::Unclosed);
    }
    Ok(out)
}

impl ParallelConfig {
    /// Layers held by each virtual stage, in pipeline order (`pp * vpp` entries,
    /// virtual stage `j * pp + i` lives on rank `i`). Errors say why it cannot split.
    pub fn stage_layers(&self, layers: u64) -> Result<Vec<u64>, Rejection> {
        let chunks = self.pp.saturating_mul(self.vpp);
        match &self.layout {
            Layout::Even => {
                if !layers.is_multiple_of(chunks) {
                    return Err(if self.vpp > 1 && layers.is_multiple_of(self.pp) {
                        Rejection::VppLayers {
                            vpp: self.vpp,
                            per_stage: layers / self.pp,
                        }
                    } else {
                        Rejection::PpLayers {
                            pp: self.pp,
                            layers,
                        }
                    });
                }
                Ok(vec![layers / chunks; chunks as usize])
            }
            Layout::AccountEmbeddingLoss => {
                if !(layers + 2).is_multiple_of(chunks) {
                    return Err(Rejection::Layout {
                        detail: format!(
                            "layers + embedding + loss = {} is not a multiple of pp x vpp = {chunks}",
                            layers + 2
                        ),
                    });
                }
                // The first virtual stage holds the embedding and the last the loss,
                // each beside at least one transformer layer.
                if (layers + 2) / chunks < 2 && chunks > 1 {
                    return Err(Rejection::Layout {
                        detail: format!(
                            "layers + embedding + loss = {} over pp x vpp = {chunks} virtual stages leaves the first and last without a transformer layer: use at most {} virtual stages in all (or --pp-layout)",
                            layers + 2,
                            (layers + 2) / 2
                        ),
                    });
                }
                let per = (layers + 2) / chunks;
                let mut v = vec![per; chunks as usize];
                if chunks == 1 {
                    v[0] = layers;
                } else {
                    v[0] -= 1;
                    *v.last_mut().unwrap() -= 1;
                }
                Ok(v)
            }
            Layout::FirstLast { first, last } => {
                if self.vpp != 1 {
                    return Err(Rejection::Layout { detail: "first/last stage layer counts are supported here only without virtual stages".into() });
                }
                // Checked: a plan file's counts are input, and a wrapped sum would pass.
                if self.pp < 2 || first.checked_add(*last).is_none_or(|s| s > layers) {
                    return Err(Rejection::Layout { detail: format!("first {first} + last {last} layers need pp >= 2 and at most {layers} layers") });
                }
                let middle = layers - first - last;
                let mids = self.pp - 2;
                if (mids == 0 && middle != 0) || (mids > 0 && !middle.is_multiple_of(mids)) {
                    return Err(Rejection::Layout {
                        detail: format!("the {middle} layers left for the {mids} middle stages do not split evenly"),
                    });
                }
                let mut v = vec![*first];
                v.extend(std::iter::repeat_n(
                    middle.checked_div(mids).unwrap_or(0),
                    mids as usize,
                ));
                v.push(*last);
                Ok(v)
            }
            Layout::Explicit { layers: list } => {
                // Checked: entries near u64::MAX must not wrap around to the right total.
                let total = list.iter().try_fold(0u64, |a, &x| a.checked_add(x));
                if list.len() as u64 != chunks || total != Some(layers) {
                    return Err(Rejection::Layout {
                        detail: format!(
                            "explicit layout has {} entries summing to {}; need pp x vpp = {chunks} entries summing to {layers}",
                            list.len(),
                            total.map_or("more than 2^64".to_string(), |t| t.to_string())
                        ),
                    });
                }
                Ok(list.clone())
            }
        }
    }
}
