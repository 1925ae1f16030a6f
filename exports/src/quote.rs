//! Quoting, one function per place a value lands: every string a user controls
//! (model, GPU and profile names, the generator, the plan path, the rank order)
//! goes through here before it is written into a script or a config, so that it
//! stays data in the language that reads it.
//!
//! - [`comment`]: the text of a `#` comment in shell, Python, YAML or TOML. Nothing
//!   can end the line early.
//! - [`shell`]: one bash/POSIX-sh word, single-quoted when it is not plain.
//! - [`double_quoted`]: a double-quoted string that Python, TOML (basic string) and
//!   YAML (double-quoted scalar) all read back as the same text.
//! - [`slurm_job_name`]: a job name for an `#SBATCH` directive line.

use std::fmt::Write;

use crate::Reason;

/// Characters written as escapes in comments and double-quoted strings: control
/// characters (C0, DEL, C1, which TOML comments refuse, Python refuses as NUL,
/// and YAML 1.1 reads NEL as a line break), YAML 1.1's other line breaks (U+2028,
/// U+2029), characters PyYAML refuses in a stream (U+FEFF inside it, U+FFFE,
/// U+FFFF), and invisible formatting or bidirectional controls that would make a
/// line read differently from what it does (U+061C, U+200B..U+200F,
/// U+202A..U+202E, U+2060..U+2069).
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{2069}'
                | '\u{FEFF}'
                | '\u{FFFE}'
                | '\u{FFFF}'
        )
}

/// `\uXXXX` or `\UXXXXXXXX`: the escape form Python, TOML and YAML share.
fn push_escape(out: &mut String, c: char) {
    let n = c as u32;
    if n <= 0xFFFF {
        let _ = write!(out, "\\u{n:04x}");
    } else {
        let _ = write!(out, "\\U{n:08x}");
    }
}

/// The text of a one-line `#` comment (shell, Python, YAML, TOML): backslashes
/// doubled and every character of [`needs_escape`] written as `\uXXXX`, so the
/// comment holds the whole value on its one line and reads back unambiguously.
pub fn comment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if needs_escape(c) {
            push_escape(&mut out, c);
        } else {
            out.push(c);
        }
    }
    out
}

/// A double-quoted string literal read back as `s` by Python (a `"..."` str),
/// TOML (a basic string) and YAML (a double-quoted scalar): `"` and `\` escaped,
/// every character of [`needs_escape`] as `\uXXXX` / `\UXXXXXXXX`.
pub fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if needs_escape(c) => push_escape(&mut out, c),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Characters a shell word may hold without quotes: none of them is special to
/// bash or POSIX sh anywhere in an argument (no expansion, globbing, splitting,
/// comment or history character).
fn plain_shell(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c)
}

/// One shell word that bash and POSIX sh read back as exactly `s`: left as it is
/// when every character is plain, otherwise single-quoted (inside single quotes
/// nothing is special; a `'` is written `'\''`). A NUL byte cannot be passed in
/// an argument at all, so it is refused.
pub fn shell(s: &str) -> Result<String, Reason> {
    if s.contains('\0') {
        return Err(format!(
            "{} holds a NUL byte, which no shell word (and no command-line argument) can carry",
            double_quoted(s)
        )
        .into());
    }
    if !s.is_empty() && s.chars().all(plain_shell) {
        return Ok(s.to_string());
    }
    Ok(format!("'{}'", s.replace('\'', "'\\''")))
}

/// A Slurm job name: sbatch reads `#SBATCH` lines itself, splitting on white
/// space and quotes, so the name keeps only ASCII letters, digits, `.`, `_` and
/// `-` (anything else becomes `-`). The name is a label: the model name is written
/// in full, escaped, in the script's header comment.
pub fn slurm_job_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_stay_on_one_line() {
        let s = comment("m\ntouch PWNED #\r\u{85}\u{2028}\\n\u{202E}");
        assert!(!s.contains(['\n', '\r', '\u{85}', '\u{2028}', '\u{202E}']));
        assert_eq!(s, "m\\u000atouch PWNED #\\u000d\\u0085\\u2028\\\\n\\u202e");
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell("plan.json").unwrap(), "plan.json");
        assert_eq!(shell("").unwrap(), "''");
        assert_eq!(shell("a b").unwrap(), "'a b'");
        assert_eq!(
            shell("p$(touch X)'.json").unwrap(),
            "'p$(touch X)'\\''.json'"
        );
        assert!(shell("a\0b").unwrap_err().0.contains("NUL"));
    }

    #[test]
    fn double_quoted_strings() {
        assert_eq!(double_quoted("tp-cp-ep-dp-pp"), "\"tp-cp-ep-dp-pp\"");
        assert_eq!(double_quoted("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        assert_eq!(double_quoted("\u{1F600}"), "\"\u{1F600}\"");
    }

    #[test]
    fn job_names() {
        assert_eq!(slurm_job_name("llama3-70b"), "llama3-70b");
        assert_eq!(slurm_job_name("a b/c\n#SBATCH"), "a-b-c--SBATCH");
    }
}
