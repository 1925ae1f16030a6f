//! The one JSON reader of every Sextant file format (model, Hugging Face config,
//! hardware profile, plan, measured run, calibration overlay).
//!
//! It differs from a bare `serde_json::from_str` in two ways: a leading UTF-8
//! byte-order mark (which some editors write) is skipped, and a key given twice in
//! one object is an error naming the key. serde_json keeps the last of two equal
//! keys without a word, so a config edited by appending a field would be read with
//! whichever copy came last; a derived struct already refuses a repeated field, but
//! maps (`sources`) and the untyped Hugging Face config do not.

use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::error::InputError;

/// The byte-order mark some editors put at the start of a UTF-8 file.
const BOM: char = '\u{feff}';

/// Parses `text` as `T`, after skipping a leading byte-order mark and checking that
/// no object repeats a key. `what` names the format in the error.
pub fn from_str<T: DeserializeOwned>(text: &str, what: &str) -> Result<T, InputError> {
    let text = text.strip_prefix(BOM).unwrap_or(text);
    let err = |e: serde_json::Error| syntax(what, e);
    // serde_json's recursion limit (128 levels) bounds this walk's stack as it
    // bounds the typed parse's.
    serde_json::from_str::<NoDuplicateKeys>(text).map_err(err)?;
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| mismatch(what, e))?;
    de.end().map_err(err)?;
    Ok(value)
}

/// The error of reading `text` as JSON at all. JSON has no limit on a number's
/// size; serde_json's f64 has: such a file is well-formed, so the error says which
/// number is too large, not that the file is invalid.
fn syntax(what: &str, e: serde_json::Error) -> InputError {
    if e.to_string().starts_with("number out of range") {
        return InputError::Field {
            what: what.into(),
            at: String::new(),
            detail: format!(
                "the number at line {} column {} is beyond what a 64-bit float holds (about 1.8e308); no value of a {what} needs one that large",
                e.line(),
                e.column()
            ),
        };
    }
    InputError::Json {
        what: what.into(),
        detail: one_line(&e.to_string(), DETAIL_SHOWN),
    }
}

/// The error of a typed parse of text already known to be well-formed JSON: the
/// text is not malformed, a value in it does not fit the format, so the error says
/// which key holds it. serde_json's own message for a number where a name is
/// expected ("expected value at line 1 column 16190") would otherwise read as a
/// syntax error in a file that has none.
fn mismatch(what: &str, e: serde_path_to_error::Error<serde_json::Error>) -> InputError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    let detail = match inner.classify() {
        serde_json::error::Category::Syntax if inner.to_string().starts_with("expected value") => {
            format!(
                "a value of the wrong type at line {} column {}",
                inner.line(),
                inner.column()
            )
        }
        _ => inner.to_string(),
    };
    InputError::Field {
        what: what.into(),
        at: if path == "." {
            String::new()
        } else {
            format!("key '{}': ", one_line(&path, KEY_SHOWN))
        },
        detail: one_line(&detail, DETAIL_SHOWN),
    }
}

/// An ignored key's path as the typed errors write theirs (serde_path_to_error):
/// keys joined by '.', array indices in brackets (`points[0].bus_bw`), where
/// serde_ignored writes `points.0.bus_bw`.
fn bracketed(path: &serde_ignored::Path) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", bracketed(parent)),
        Path::Map { parent, key } => match bracketed(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => bracketed(parent),
    }
}

/// Characters of an error's detail shown: serde's message quotes the offending
/// value, which a hostile file may make megabytes long.
const DETAIL_SHOWN: usize = 300;

/// `text` on one line (control characters escaped) and at most `max` characters
/// of it, marked "..." where cut: what an error may echo of a file.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::new();
    for c in text.chars().take(max) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if text.chars().nth(max).is_some() {
        out.push_str("...");
    }
    out
}

/// Characters of an unknown key that [`from_str_known`]'s error shows.
const KEY_SHOWN: usize = 120;

/// [`from_str`] for the formats people write by hand (hardware profile, calibration
/// overlay, Sextant model): a key the format does not have is an error naming it
/// (`network.by_domain`), where serde would skip it and the file would silently
/// mean its defaults. Plan files and measured runs, which Sextant writes and older
/// releases wrote with keys since retired, keep [`from_str`].
pub fn from_str_known<T: DeserializeOwned>(text: &str, what: &str) -> Result<T, InputError> {
    let text = text.strip_prefix(BOM).unwrap_or(text);
    serde_json::from_str::<NoDuplicateKeys>(text).map_err(|e| syntax(what, e))?;
    let mut unknown: Vec<String> = Vec::new();
    let mut de = serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(
        &mut de,
        &mut |path: serde_ignored::Path| unknown.push(bracketed(&path)),
    ))
    .map_err(|e| mismatch(what, e))?;
    de.end().map_err(|e| syntax(what, e))?;
    if let Some(first) = unknown.first() {
        let more = match unknown.len() {
            1 => String::new(),
            n => format!(" and {} more", n - 1),
        };
        // A hostile file's key may be megabytes long: name at most its first
        // KEY_SHOWN characters, so the error stays one readable line.
        return Err(InputError::UnknownKey {
            what: what.into(),
            key: one_line(first, KEY_SHOWN),
            more,
        });
    }
    Ok(value)
}

/// Any JSON value, walked only to refuse an object that repeats a key.
struct NoDuplicateKeys;

impl<'de> Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Walk)
    }
}

struct Walk;

impl<'de> Visitor<'de> for Walk {
    type Value = NoDuplicateKeys;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(NoDuplicateKeys)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!(
                    "key '{key}' appears twice in one object (keep one)"
                )));
            }
            map.next_value::<NoDuplicateKeys>()?;
        }
        Ok(NoDuplicateKeys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn bom_is_skipped_and_repeated_keys_are_named() {
        let v: Value = from_str("\u{feff}{\"a\": 1}", "test").unwrap();
        assert_eq!(v["a"], 1);
        let e = from_str::<Value>("{\"a\": 1, \"b\": {\"c\": 1, \"c\": 2}}", "test")
            .unwrap_err()
            .to_string();
        assert!(e.contains("key 'c' appears twice"), "{e}");
        // The same key in two different objects is fine, in arrays too.
        from_str::<Value>("[{\"a\": 1}, {\"a\": 2}, {\"b\": {\"a\": 3}}]", "test").unwrap();
        // A mark in the middle is not skipped.
        assert!(from_str::<Value>("{\"a\": 1}\u{feff}", "test").is_err());
        // Deep nesting is an error, not a stack overflow.
        let deep = "[".repeat(100_000);
        assert!(from_str::<Value>(&deep, "test").is_err());
        // A number too large for an f64 is well-formed JSON: said so, not "invalid".
        let e = from_str::<Value>("{\"a\": 1e400}", "test").unwrap_err();
        assert!(matches!(e, InputError::Field { .. }), "{e:?}");
        assert!(e.to_string().contains("line 1 column"), "{e}");
        assert!(e.to_string().contains("64-bit float"), "{e}");
        // The hand-written formats say the same.
        let e = from_str_known::<Outer>(
            "{\"name\": \"x\", \"points\": [{\"busbw\": 1e400}]}",
            "test",
        )
        .unwrap_err();
        assert!(matches!(e, InputError::Field { .. }), "{e:?}");
        assert!(e.to_string().contains("64-bit float"), "{e}");
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        busbw: f64,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        #[serde(default)]
        points: Vec<Inner>,
    }

    #[test]
    fn hand_written_formats_name_an_unknown_key() {
        let ok: Outer =
            from_str_known("{\"name\": \"x\", \"points\": [{\"busbw\": 1}]}", "test").unwrap();
        assert_eq!(ok.name, "x");
        let e = from_str_known::<Outer>("{\"name\": \"x\", \"point\": []}", "test")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown key 'point'"), "{e}");
        let e = from_str_known::<Outer>(
            "{\"name\": \"x\", \"points\": [{\"busbw\": 1, \"bus_bw\": 2}], \"z\": 1}",
            "test",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("unknown key 'points[0].bus_bw' and 1 more"),
            "{e}"
        );
        // A key with a control character is printed escaped, on one line.
        let e = from_str_known::<Outer>("{\"name\": \"x\", \"a\\nb\": 1}", "test")
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n'), "{e}");
        // A huge key is cut, not echoed whole.
        let long = format!("{{\"name\": \"x\", \"{}\": 1}}", "k".repeat(100_000));
        let e = from_str_known::<Outer>(&long, "test")
            .unwrap_err()
            .to_string();
        assert!(e.len() < 400 && e.contains("kkk...'"), "{}", e.len());
        // Trailing text is still an error; the lenient reader still skips keys.
        assert!(from_str_known::<Outer>("{\"name\": \"x\"} x", "test").is_err());
        from_str::<Outer>("{\"name\": \"x\", \"point\": []}", "test").unwrap();
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "lowercase")]
    #[allow(dead_code)]
    enum Kind {
        Ring,
        Tree,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Typed {
        kind: Kind,
        points: Vec<Inner>,
        #[serde(default)]
        extra: std::collections::BTreeMap<String, f64>,
    }

    /// Well-formed JSON with a value of the wrong type is not called malformed: the
    /// error names the key that holds the value, for both readers. A number where
    /// a name is expected is serde_json's "expected value", said as a wrong type.
    #[test]
    fn a_value_that_does_not_fit_names_its_key() {
        for read in [from_str::<Typed>, from_str_known::<Typed>] {
            let e = read("{\"kind\": 42, \"points\": []}", "test")
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("test: key 'kind': a value of the wrong type at line 1"),
                "{e}"
            );
            assert!(!e.contains("malformed"), "{e}");
            let e = read(
                "{\"kind\": \"ring\", \"points\": [{\"busbw\": 1}, {\"busbw\": \"x\"}]}",
                "test",
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("key 'points[1].busbw': invalid type"), "{e}");
            let e = read("{\"kind\": \"star\", \"points\": []}", "test")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("key 'kind': unknown variant `star`, expected `ring` or `tree`"),
                "{e}"
            );
            // A hostile key or value is escaped and cut: the error stays one short line.
            let key = format!("a\\n\\u001b[31m{}", "k".repeat(100_000));
            let text =
                format!("{{\"kind\": \"ring\", \"points\": [], \"extra\": {{\"{key}\": \"x\"}}}}");
            let e = read(&text, "test").unwrap_err().to_string();
            assert!(
                !e.contains('\n') && !e.contains('\u{1b}') && e.len() < 800,
                "{}",
                e.len()
            );
            assert!(
                e.contains("key 'extra.a\\n\\u{1b}[31mkkk") && e.contains("kkk..."),
                "{e}"
            );
            let text = format!(
                "{{\"kind\": \"{}\\n\", \"points\": []}}",
                "s".repeat(100_000)
            );
            let e = read(&text, "test").unwrap_err().to_string();
            assert!(
                !e.contains('\n') && e.len() < 800 && e.contains("..."),
                "{}",
                e.len()
            );
            // Broken syntax is still malformed.
            let e = read("{\"kind\": ", "test").unwrap_err().to_string();
            assert!(e.contains("JSON is malformed"), "{e}");
        }
    }
}
