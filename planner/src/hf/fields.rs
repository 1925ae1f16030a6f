//! Reading one configuration object's fields: numbers, flags, the class defaults
//! a field may fall back on, and a missing field as an error naming it.

use serde_json::Value;

use crate::error::InputError;

/// `Gemma3TextConfig.__init__`'s defaults (transformers
/// `models/gemma3/configuration_gemma3.py`), which a gemma3 `text_config` leaves
/// out when they hold: gemma-3-4b's omits its 8 heads and 4 KV heads, every size
/// omits the 262,208-entry vocabulary. `sliding_window_pattern` is the class's
/// backward-compatible default (five sliding layers, then a global one).
pub(super) const GEMMA3_TEXT_DEFAULTS: &[(&str, u64)] = &[
    ("vocab_size", 262_208),
    ("hidden_size", 2304),
    ("intermediate_size", 9216),
    ("num_hidden_layers", 26),
    ("num_attention_heads", 8),
    ("num_key_value_heads", 4),
    ("head_dim", 256),
    ("sliding_window", 4096),
    ("sliding_window_pattern", 6),
];

/// One configuration object: the top level of config.json, or gemma3's
/// `text_config` with its class defaults.
pub(super) struct Cfg<'a> {
    pub(super) v: &'a Value,
    pub(super) model_type: &'a str,
    /// Prefix of field names in messages ("text_config.").
    pub(super) at: &'static str,
    pub(super) defaults: &'static [(&'static str, u64)],
}

impl Cfg<'_> {
    pub(super) fn err(&self, msg: String) -> InputError {
        InputError::HfConfig(msg)
    }

    fn default_of(&self, key: &str) -> Option<u64> {
        self.defaults
            .iter()
            .find(|(k, _)| *k == key)
            .map(|&(_, d)| d)
    }

    /// A non-negative integer field: its value, the class default of a nested
    /// config, or `None` when absent or null.
    pub(super) fn opt(&self, key: &str) -> Result<Option<u64>, InputError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(self.default_of(key)),
            Some(x) => x.as_u64().map(Some).ok_or_else(|| {
                self.err(format!(
                    "field '{}{key}' is {}, expected a non-negative integer",
                    self.at,
                    shown(x)
                ))
            }),
        }
    }

    /// A field the family cannot do without.
    pub(super) fn field(&self, key: &str) -> Result<u64, InputError> {
        self.opt(key)?.ok_or_else(|| self.missing(key))
    }

    pub(super) fn missing(&self, key: &str) -> InputError {
        self.err(format!(
            "required field '{}{key}' is missing for model_type '{}' (a config.json saved by transformers always has it)",
            self.at, self.model_type
        ))
    }

    /// The first of several spellings of one field.
    pub(super) fn first_of(&self, keys: &[&str]) -> Result<u64, InputError> {
        for k in keys {
            if let Some(x) = self.opt(k)? {
                return Ok(x);
            }
        }
        Err(self.missing(&keys.join("' or '")))
    }

    /// A positive finite number, `default` when absent or null.
    pub(super) fn number(&self, key: &str, default: f64) -> Result<f64, InputError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x
                .as_f64()
                .filter(|f| f.is_finite() && *f > 0.0)
                .ok_or_else(|| {
                    self.err(format!(
                        "field '{}{key}' is {}, expected a positive number",
                        self.at,
                        shown(x)
                    ))
                }),
        }
    }

    /// A boolean field, `default` when absent or null.
    pub(super) fn flag(&self, key: &str, default: bool) -> Result<bool, InputError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(x) => Err(self.err(format!(
                "field '{}{key}' is {}, expected true or false",
                self.at,
                shown(x)
            ))),
        }
    }
}

/// A JSON value as echoed in an error: one line, cut (a field may hold megabytes).
fn shown(x: &Value) -> String {
    crate::json::one_line(&x.to_string(), 60)
}
