//! Errors of the planner crate, one enum, grouped by what was wrong.
//!
//! A configuration that does not fit or does not divide is not an error: it is a
//! [`crate::config::Rejection`], which the search counts and `estimate` explains.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum InputError {
    #[error("unknown model '{}'{}", crate::json::one_line(.name, 60), suggest(.suggestions, "models"))]
    UnknownModel {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("unknown hardware profile '{}'{}", crate::json::one_line(.name, 60), suggest(.suggestions, "profiles"))]
    UnknownProfile {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("model '{model}': {field}: {problem}")]
    Model {
        model: String,
        field: String,
        problem: String,
    },
    #[error("hardware profile '{profile}': field '{field}': {problem}")]
    Profile {
        profile: String,
        field: String,
        problem: String,
    },
    #[error("{what} JSON is malformed: {detail}")]
    Json { what: String, detail: String },
    /// Well-formed JSON whose value at `path` (keys joined by '.', indices in
    /// brackets, escaped and cut to one line) does not fit the format.
    #[error("{what}: {at}{detail}")]
    Field {
        what: String,
        /// "key 'a.b[0]': ", or empty for the top level.
        at: String,
        detail: String,
    },
    /// A well-formed hand-written file with a key its format does not have; `key`
    /// is the path of names and array indices, joined by '.'.
    #[error("{what} has an unknown key '{key}'{more}: not a field of this format (check the spelling; ARCHITECTURE.md lists the fields)")]
    UnknownKey {
        what: String,
        key: String,
        more: String,
    },
    #[error("Hugging Face config: {0}")]
    HfConfig(String),
    #[error("{what} file has schema_version {found}; this Sextant reads version {supported}")]
    SchemaVersion {
        what: String,
        found: u32,
        supported: u32,
    },
    #[error("{0}")]
    Workload(String),
}

/// The names nearest to an unknown one, or, with none near it, the command that
/// lists them all.
fn suggest(s: &[String], lister: &str) -> String {
    if s.is_empty() {
        format!(" (`sextant {lister}` lists them)")
    } else {
        format!(" (did you mean {}?)", s.join(", "))
    }
}
