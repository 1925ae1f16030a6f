//! Why a runs CSV, or one of its rows, cannot be read.

use crate::model::MlpKind;
use crate::InputError;

use super::{MAX_ROWS, STACK_COLUMNS};

/// Why a row cannot be turned into a case; [`super::Unrepresentable::reason`] is its
/// message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RowError {
    /// A cell that does not read as its column's kind of value.
    #[error("column '{column}' is '{value}', expected {expected}")]
    Cell {
        column: String,
        value: String,
        expected: String,
    },
    /// A value outside a short list (`allowed` says which, "one of ..." or "a or b").
    #[error("{what} '{value}' is not {allowed}")]
    NotOneOf {
        what: &'static str,
        value: String,
        allowed: &'static str,
    },
    #[error("column '{0}' is empty")]
    Empty(String),
    /// A column whose value the planner refuses, with the planner's reason.
    #[error("column '{column}': {reason}")]
    Column {
        column: &'static str,
        reason: String,
    },
    /// The row's hardware, model or cluster, refused by the planner.
    #[error("{0}")]
    Input(InputError),
    #[error("columns 'mem_kind' and 'mem_stage' describe 'measured_mem_gib', which is empty")]
    MemoryUnmeasured,
    #[error("column 'measured_mem_gib' is {}, more than any GPU holds (at most 1000000 GiB)", crate::hardware::ranges::show(*.0))]
    MemoryTooLarge(f64),
    #[error(
        "column 'mem_stage' is {stage}, but the run has {pp} pipeline stages (numbered from 0)"
    )]
    MemStageBeyond { stage: u64, pp: u64 },
    /// `kind`: what the activation makes the MLP.
    #[error("column 'gated' is '{gated}' but activation '{activation}' is {}", if *.kind == MlpKind::Gated { "a gated MLP" } else { "a plain MLP" })]
    GatedDisagrees {
        gated: String,
        activation: String,
        kind: MlpKind,
    },
    #[error("model '{model}' is not a built-in preset (see `sextant models`), so its shape comes from the columns, and column '{column}' is empty")]
    ShapeColumn { model: String, column: String },
    #[error("column 'heads': {heads} heads do not divide hidden {hidden}, so the head width is not whole")]
    HeadsDivide { heads: u64, hidden: u64 },
    #[error("column 'heads' is 0; a model needs at least one attention head")]
    NoHeads,
    /// The row's `recompute`, which is not selective.
    #[error("column 'recompute_modules' needs recompute 'selective' (the row says '{0}')")]
    ModulesNeedSelective(String),
    #[error("column 'pp_layout' has {layout} virtual stages per rank, but vpp is {vpp}")]
    LayoutVpp { layout: u64, vpp: u64 },
    #[error("column 'pp_layout' places {layout} MTP layers; {model} has {mtp_layers} (state mtp_layers)")]
    LayoutMtp {
        layout: u64,
        model: String,
        mtp_layers: u64,
    },
    #[error("value '{0}' is not a number")]
    ValueNotANumber(String),
    #[error("value {} must be a positive finite number", crate::hardware::ranges::show(*.0))]
    ValueNotPositive(f64),
}

impl RowError {
    pub(super) fn cell(column: &str, value: &str, expected: impl ToString) -> RowError {
        RowError::Cell {
            column: column.to_string(),
            // From the user's file: escaped and cut to one short line.
            value: crate::json::one_line(value, 60),
            expected: expected.to_string(),
        }
    }

    pub(super) fn not_one_of(what: &'static str, value: &str, allowed: &'static str) -> RowError {
        RowError::NotOneOf {
            what,
            value: crate::json::one_line(value, 60),
            allowed,
        }
    }

    pub(super) fn column(column: &'static str, reason: impl ToString) -> RowError {
        RowError::Column {
            column,
            reason: reason.to_string(),
        }
    }
}

/// A CSV text that cannot be read as rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsvError {
    #[error("CSV header: {0}")]
    Header(String),
    #[error("CSV has more than {MAX_ROWS} rows; split it into files of at most {MAX_ROWS}")]
    TooManyRows,
    /// `line`: the row's line in the file (the header is line 1).
    #[error("CSV row {line}: {error}")]
    Row { line: usize, error: String },
}

/// Why a runs CSV (with its stack file) cannot be read at all ([`super::parse_runs_with`]);
/// a row that cannot be represented is an [`super::Unrepresentable`] instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunsError {
    #[error("{0}")]
    Csv(CsvError),
    #[error("CSV has no '{0}' column (expected the published_runs.csv schema)")]
    MissingColumn(&'static str),
    #[error("stack file: {0}")]
    StackCsv(CsvError),
    #[error("CSV column '{column}' is not one a runs CSV has{hint} (its columns: docs/reference.md); a column it does not read would be ignored")]
    UnknownColumn { column: String, hint: String },
    #[error("stack file has no 'id' column")]
    StackNoId,
    #[error("stack file column '{0}' is not one of id, source, {columns}", columns = STACK_COLUMNS.join(", "))]
    StackColumn(String),
    #[error("stack file row '{0}' names no run in the runs CSV")]
    StackRow(String),
    #[error("stack file says {column} = '{stack}' for run '{id}', but the runs CSV says '{runs}'")]
    StackContradicts {
        column: &'static str,
        stack: String,
        id: String,
        runs: String,
    },
}

impl RunsError {
    /// Whether the fault is the stack file's alone (its own CSV, columns or rows),
    /// so that the error names that file rather than the runs CSV.
    pub fn in_stack_file(&self) -> bool {
        matches!(
            self,
            RunsError::StackCsv(_) | RunsError::StackNoId | RunsError::StackColumn(_)
        )
    }
}
