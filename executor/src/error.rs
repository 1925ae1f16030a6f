//! The executor's one error type: which rank failed, in which phase, and why.

/// A failure of one rank. Displayed as one line: `rank 3, step 2 forward
/// micro-batch 1 layer 4 (TP all-gather): rank 5 closed its connection ...`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("rank {rank}, {phase}: {detail}")]
pub struct ExecError {
    pub rank: u64,
    pub phase: String,
    pub detail: String,
}
