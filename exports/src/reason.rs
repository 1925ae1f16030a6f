//! Why a plan, or a string in it, cannot be written in a framework's words, before
//! it is known which target asked: the shared rules (layout strings, schedules, rank
//! orders, shell words) return a [`Reason`], and each renderer ties it to its target
//! with [`Reason::at`]. A type of its own, so that a refusal is never mistaken for
//! rendered text (both were `String`s).

use thiserror::Error;

use crate::{ExportError, Target};

#[derive(Debug, Error, Clone, PartialEq)]
#[error("{0}")]
pub struct Reason(pub String);

impl Reason {
    /// The refusal for `target`: [`ExportError::Inexpressible`] with this reason.
    pub fn at(self, target: Target) -> ExportError {
        ExportError::Inexpressible {
            target,
            reason: self.0,
        }
    }
}

impl From<String> for Reason {
    fn from(s: String) -> Self {
        Reason(s)
    }
}

impl From<Reason> for String {
    fn from(r: Reason) -> Self {
        r.0
    }
}
