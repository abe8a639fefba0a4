//! Secret values out of everything kavi keeps: outputs, errors, records, logs and artifacts.
//!
//! A declared secret's value is replaced with `[redacted]` wherever it appears: inside strings,
//! in JSON object keys as well as values, and in whole output streams, however large. Streams
//! are rewritten with an Aho-Corasick automaton, so a secret split across two reads is still
//! found and all secrets are replaced in one pass.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::{Map, Value};

/// How much a stream is read at a time.
const CHUNK: usize = 64 * 1024;

/// What a secret's value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// The fewest characters a secret's value may have, unless `min_secret_chars` in kavi.toml says
/// otherwise. A shorter one cannot be told from ordinary text: redacting a one-character secret
/// would hide that character everywhere kavi keeps.
pub const DEFAULT_MIN_SECRET_CHARS: usize = 4;

/// The lowest `min_secret_chars` may be set to: a single character is never a secret.
pub const LEAST_MIN_SECRET_CHARS: usize = 2;

static MIN_SECRET_CHARS: AtomicUsize = AtomicUsize::new(DEFAULT_MIN_SECRET_CHARS);

/// Sets the fewest characters a secret may have, from the workspace's configuration (never
/// under [`LEAST_MIN_SECRET_CHARS`]).
pub fn set_min_secret_chars(chars: usize) {
    MIN_SECRET_CHARS.store(chars.max(LEAST_MIN_SECRET_CHARS), Ordering::Relaxed);
}

fn min_secret_chars() -> usize {
    MIN_SECRET_CHARS.load(Ordering::Relaxed)
}

/// The value of the secret `name` from kavi's environment: refused when it is unset (a command
/// would run with no value, or an empty one) or too short to redact.
pub fn secret_from_env(name: &str) -> Result<String, String> {
    let value = std::env::var(name)
        .map_err(|_| format!("secret `{name}` is not set in kavi's environment"))?;
    let chars = value.chars().count();
    let least = min_secret_chars();
    if chars < least {
        return Err(format!(
            "secret `{name}` has {chars} character(s); kavi needs at least {least} to redact it \
             without hiding ordinary text (`min_secret_chars` in kavi.toml)"
        ));
    }
    Ok(value)
}

/// Replaces a set of secret values.
#[derive(Debug, Clone)]
pub struct Redactor {
    automaton: AhoCorasick,
    /// The values it hides, to build a line-wise redactor from.
    values: Vec<String>,
}

impl Redactor {
    /// A redactor for `secrets`; `None` when there is no value to hide. A value shorter than
    /// `min_secret_chars` (a line of a secret of several lines, say) is not hidden: it would
    /// hide ordinary text everywhere; a declared secret that short is refused before it is used.
    pub fn new<S: AsRef<str>>(secrets: &[S]) -> Option<Self> {
        let least = min_secret_chars();
        let mut values: Vec<String> = secrets
            .iter()
            .map(AsRef::as_ref)
            .filter(|s| s.chars().count() >= least)
            .map(str::to_owned)
            .collect();
        if values.is_empty() {
            return None;
        }
        values.sort_unstable();
        values.dedup();
        // The longest match wins, so a secret that contains another is hidden whole.
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&values)
            .expect("a handful of literal strings always builds");
        Some(Self { automaton, values })
    }

    /// A redactor for text seen one line at a time (live output): a secret of several lines
    /// never appears whole in one line, so each of its lines is hidden on its own as well.
    pub fn line_wise(&self) -> Self {
        let lines = self.values.iter().flat_map(|value| {
            value
                .split('\n')
                .flat_map(|line| [line, line.trim_end_matches('\r')])
                .map(str::to_owned)
        });
        let all: Vec<String> = self.values.iter().cloned().chain(lines).collect();
        Self::new(&all).expect("it hides at least the values of this one")
    }

    /// `text` with every secret replaced.
    pub fn text(&self, text: &str) -> String {
        self.automaton
            .replace_all(text, &vec![REDACTED; self.automaton.patterns_len()])
    }

    /// Replaces secrets in every string of `value`, object keys included, and every number
    /// whose text holds one (a PIN printed as a number is the secret, digit for digit), which
    /// becomes the string `[redacted]`.
    pub fn json(&self, value: &mut Value) {
        match value {
            Value::String(s) => *s = self.text(s),
            Value::Number(n) if self.automaton.is_match(n.to_string().as_str()) => {
                *value = Value::String(REDACTED.to_owned());
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.json(v)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                *map = entries
                    .into_iter()
                    .map(|(key, mut value)| {
                        self.json(&mut value);
                        (self.text(&key), value)
                    })
                    .collect::<Map<String, Value>>();
            }
            _ => {}
        }
    }

    /// How much of `held`, the start of a stream whose rest has not been read yet, can be shown
    /// redacted now: up to where a secret could still begin that later bytes complete (the
    /// longest secret's length from the end), or past it to the end of a secret that starts
    /// before and lies wholly in `held`. All of it when the stream has `ended`.
    pub fn settled(&self, held: &[u8], ended: bool) -> usize {
        if ended {
            return held.len();
        }
        let settled = held
            .len()
            .saturating_sub(self.automaton.max_pattern_len() - 1);
        self.automaton
            .find_iter(held)
            .take_while(|found| found.start() < settled)
            .last()
            .map_or(settled, |found| found.end().max(settled))
    }

    /// `bytes` with every secret replaced.
    pub fn bytes(&self, bytes: &[u8]) -> Vec<u8> {
        self.automaton
            .replace_all_bytes(bytes, &vec![REDACTED; self.automaton.patterns_len()])
    }

    /// Copies `from` to `to` with every secret replaced; works on bytes, in bounded memory.
    ///
    /// A match is replaced only once everything that could extend it has been read (see
    /// [`Redactor::settled`]), so a secret split across reads, or one that contains another,
    /// is hidden whole.
    pub fn stream(&self, from: &mut dyn Read, to: &mut dyn Write) -> io::Result<()> {
        let mut buffer: Vec<u8> = Vec::with_capacity(CHUNK + self.automaton.max_pattern_len());
        let mut chunk = vec![0u8; CHUNK];
        loop {
            let read = match from.read(&mut chunk) {
                Ok(read) => read,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            buffer.extend_from_slice(&chunk[..read]);
            let end = read == 0;
            let kept = self.settled(&buffer, end);
            to.write_all(&self.bytes(&buffer[..kept]))?;
            buffer.drain(..kept);
            if end {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_hidden_in_keys_values_and_text() {
        let mut value = json!({
            "sk-live-123456": "x",
            "a": "key=hunter2",
            "b": ["hunter2", {"nested-hunter2": 1}],
            "c": 1,
            "pin": 73915284,
            "larger": 1739152840
        });
        let redactor = Redactor::new(&["hunter2", "", "sk-live-123456", "73915284"]).unwrap();
        redactor.json(&mut value);
        assert_eq!(
            value,
            json!({
                "[redacted]": "x",
                "a": "key=[redacted]",
                "b": ["[redacted]", {"nested-[redacted]": 1}],
                "c": 1,
                "pin": "[redacted]",
                "larger": "[redacted]"
            })
        );
        assert_eq!(redactor.text("hunter2hunter2"), "[redacted][redacted]");
        assert!(Redactor::new(&[""]).is_none());
    }

    #[test]
    fn line_wise_a_secret_of_several_lines_is_hidden_line_by_line() {
        let redactor = Redactor::new(&["key-one\r\nkey-two\n", "short"]).unwrap();
        assert_eq!(
            redactor.text("key-one\r\nkey-two\n"),
            "[redacted]",
            "whole, it is hidden whole"
        );
        assert_eq!(redactor.text("key-one"), "key-one");
        let lines = redactor.line_wise();
        assert_eq!(lines.text("the key is key-one\r"), "the key is [redacted]");
        assert_eq!(lines.text("key-two"), "[redacted]");
        assert_eq!(
            lines.text("short and key-one\r\nkey-two\n"),
            "[redacted] and [redacted]"
        );
    }

    /// A value under the minimum, such as a short line of a secret of several lines, would hide
    /// ordinary text wherever it appears: it is not hidden on its own.
    #[test]
    fn a_value_shorter_than_the_minimum_is_never_hidden_on_its_own() {
        assert!(Redactor::new(&["x", "abc"]).is_none());
        let redactor = Redactor::new(&["key-one\nx\n"]).unwrap();
        assert_eq!(redactor.text("key-one\nx\n"), "[redacted]");
        let lines = redactor.line_wise();
        assert_eq!(lines.text("x marks key-one"), "x marks [redacted]");
    }

    #[test]
    fn the_longest_secret_wins_in_text_and_in_streams() {
        let redactor = Redactor::new(&["abcd", "abcdefg"]).unwrap();
        assert_eq!(redactor.text("xabcdefgx abcd"), "x[redacted]x [redacted]");
        let mut out = Vec::new();
        redactor
            .stream(&mut Trickle(b"xabcdefgx abcd"), &mut out)
            .unwrap();
        assert_eq!(out, b"x[redacted]x [redacted]");
    }

    /// A reader that hands out one byte at a time, so every secret straddles reads.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let Some((first, rest)) = self.0.split_first() else {
                return Ok(0);
            };
            buf[0] = *first;
            self.0 = rest;
            Ok(1)
        }
    }

    #[test]
    fn a_secret_split_across_reads_is_still_hidden_in_a_stream() {
        let redactor = Redactor::new(&["hunter2"]).unwrap();
        let mut input = b"before hunter2 between \xff hunter2".repeat(3);
        input.extend(vec![b'a'; 100_000]);
        input.extend(b"hunter2");
        let mut out = Vec::new();
        redactor.stream(&mut Trickle(&input), &mut out).unwrap();
        assert!(!out.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(
            out.windows(REDACTED.len())
                .filter(|w| *w == REDACTED.as_bytes())
                .count(),
            7
        );
        // What is not a secret, invalid UTF-8 included, passes through unchanged.
        assert!(out.windows(3).any(|w| w == b" \xff "));
    }
}
