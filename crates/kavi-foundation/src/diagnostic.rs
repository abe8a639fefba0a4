//! Errors that point into a source file.
//!
//! Every error that comes from a spec file carries the file and a byte span, attached where the
//! error is made (as `just` does), so rendering can always show `file:line:col`, the source line
//! and carets under the offending text.

use std::fmt;
use std::io::Read as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use globset::{Glob, GlobSet, GlobSetBuilder};
use toml::Spanned;

/// The largest spec file (pipeline, chain, policy, `kavi.toml`) kavi reads, in KiB, unless
/// `max_spec_kib` in kavi.toml says otherwise.
pub const DEFAULT_MAX_SPEC_KIB: u64 = 4096;

static MAX_SPEC_KIB: AtomicU64 = AtomicU64::new(DEFAULT_MAX_SPEC_KIB);

/// Sets the largest spec file [`read_spec`] reads, from the workspace's configuration.
pub fn set_max_spec_kib(kib: u64) {
    MAX_SPEC_KIB.store(kib, Ordering::Relaxed);
}

/// Reads a spec file's text, refusing one over the size limit: parsing holds several times a
/// file's size in memory, so a file of tens of MiB (generated, or hostile) would take gigabytes.
/// Reads at most one byte past the limit, so a file that grows while read is refused too.
pub fn read_spec(path: &Path) -> std::io::Result<String> {
    let kib = MAX_SPEC_KIB.load(Ordering::Relaxed);
    let limit = kib.saturating_mul(1024);
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(limit.saturating_add(1))
        .read_to_string(&mut text)?;
    if text.len() as u64 > limit {
        let size = std::fs::metadata(path).map_or(text.len() as u64, |m| m.len());
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "it is {} KiB, over the {kib} KiB a spec file may be (`max_spec_kib` in \
                 kavi.toml)",
                size.div_ceil(1024)
            ),
        ));
    }
    Ok(text)
}

/// The text of one spec file, shared by every diagnostic that points into it.
#[derive(Debug)]
pub struct SourceFile {
    /// The path as the user named it (kept relative so messages stay short and stable).
    pub path: PathBuf,
    pub text: String,
    /// `sha256:<hex>` of the text, made on the first ask and kept: one file is named by it in
    /// several places (a cached node's key, the run's governing set, the ledger's spec rows).
    hash: OnceLock<String>,
}

impl SourceFile {
    pub fn new(path: impl Into<PathBuf>, text: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            path: path.into(),
            text: text.into(),
            hash: OnceLock::new(),
        })
    }

    /// The text's spec hash, as [`crate::hash::spec_hash`] gives it.
    pub fn spec_hash(&self) -> &str {
        self.hash.get_or_init(|| crate::hash::spec_hash(&self.text))
    }

    /// One-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = floor_char_boundary(&self.text, offset.min(self.text.len()));
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = self.text[line_start..offset].chars().count() + 1;
        (line, col)
    }
}

fn floor_char_boundary(text: &str, mut offset: usize) -> usize {
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

/// A message, optionally located in a file, with an optional hint on how to fix it.
#[derive(Debug, Clone)]
pub struct Diagnostic {
    pub message: String,
    pub location: Option<(Arc<SourceFile>, Range<usize>)>,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            location: None,
            help: None,
        }
    }

    pub fn at(mut self, file: &Arc<SourceFile>, span: Range<usize>) -> Self {
        self.location = Some((Arc::clone(file), span));
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// `path:line:col` of the diagnostic, if it has a location.
    pub fn position(&self) -> Option<String> {
        self.location.as_ref().map(|(file, span)| {
            let (line, col) = file.line_col(span.start);
            format!("{}:{line}:{col}", file.path.display())
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.location.as_ref().map(|(file, _)| file.path.as_path())
    }

    /// What the text shows, for scripts and editors: the message, where it starts and ends
    /// (lines and columns from 1, the end exclusive), and the help. `null` where it has none.
    pub fn to_json(&self) -> serde_json::Value {
        let place = self.location.as_ref().map(|(file, span)| {
            (
                &file.path,
                file.line_col(span.start),
                file.line_col(span.end),
            )
        });
        serde_json::json!({
            "message": self.message,
            "file": place.map(|(path, _, _)| path),
            "line": place.map(|(_, (line, _), _)| line),
            "column": place.map(|(_, (_, column), _)| column),
            "end_line": place.map(|(_, _, (line, _))| line),
            "end_column": place.map(|(_, _, (_, column))| column),
            "help": self.help,
        })
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        // `= help` lines up with the `|` of the source line above it.
        let mut help_pad = " ".to_owned();
        if let Some((file, span)) = &self.location {
            let (line, col) = file.line_col(span.start);
            let gutter = line.to_string().len();
            let pad = " ".repeat(gutter);
            help_pad = pad.clone();
            let source_line = file.text.lines().nth(line - 1).unwrap_or("");
            // Carets cover the span, but never run past the end of the first line it touches.
            let line_chars = source_line.chars().count();
            let span_chars = file
                .text
                .get(span.clone())
                .map_or(1, |s| s.lines().next().unwrap_or("").chars().count());
            let width = span_chars.clamp(1, (line_chars + 1).saturating_sub(col).max(1));
            write!(
                f,
                "\n{pad}--> {}:{line}:{col}\n{pad} |\n{line} | {source_line}\n{pad} | {}{}",
                file.path.display(),
                " ".repeat(col - 1),
                "^".repeat(width),
            )?;
        }
        if let Some(help) = &self.help {
            write!(f, "\n{help_pad} = help: {help}")?;
        }
        Ok(())
    }
}

/// The candidate closest to a mistyped `word`, when one is close enough to be what was meant.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let allowed = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|candidate| (strsim::damerau_levenshtein(word, candidate), candidate))
        .filter(|(distance, _)| *distance <= allowed)
        .min()
        .map(|(_, candidate)| candidate)
}

/// For serde's "unknown field `x`, expected one of `a`, `b`" (or "unknown variant ..."): `did you
/// mean `a`?` when one of the expected names is close to the one written.
pub fn suggest_expected(message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("unknown variant `"))?;
    let (word, expected) = rest.split_once('`')?;
    let expected = expected.split_once("expected")?.1;
    let names: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    closest(word, names).map(|close| format!("did you mean `{close}`?"))
}

/// `did you mean `x`?`, or what the choices are when none is close.
pub fn suggest(word: &str, candidates: &[&str]) -> String {
    match closest(word, candidates.iter().copied()) {
        Some(close) => format!("did you mean `{close}`?"),
        None => format!(
            "known: {}",
            candidates
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `problems` with each one said once: the same message at the same place is one problem, as
/// when two nodes read one broken policy. The first of them is kept, in its place.
pub fn said_once(problems: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut seen = std::collections::HashSet::with_capacity(problems.len());
    problems
        .into_iter()
        .filter(|problem| {
            let place = problem
                .location
                .as_ref()
                .map(|(file, span)| (file.path.clone(), span.start, span.end));
            seen.insert((problem.message.clone(), place))
        })
        .collect()
}

/// A list of diagnostics, reported together so one `check` shows every problem it found.
#[derive(Debug, Clone)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, diagnostic) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, "\n\nerror: ")?;
            }
            write!(f, "{diagnostic}")?;
        }
        Ok(())
    }
}

/// serde's message with TOML's words for Rust's types ("expected u32", "expected a sequence",
/// "expected struct RawRetry"): the operator wrote TOML, not Rust.
fn in_toml_terms(message: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        (
            "expected a nonzero u8",
            "expected a whole number from 1 to 255",
        ),
        (
            "expected a nonzero u16",
            "expected a whole number from 1 to 65535",
        ),
        (
            "expected a nonzero u32",
            "expected a whole number from 1 to 4294967295",
        ),
        (
            "expected a nonzero u64",
            "expected a whole number from 1 up",
        ),
        (
            "expected a nonzero usize",
            "expected a whole number from 1 up",
        ),
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        (
            "expected u32",
            "expected a whole number from 0 to 4294967295",
        ),
        ("expected u64", "expected a whole number from 0 up"),
        ("expected usize", "expected a whole number from 0 up"),
        ("expected i32", "expected a whole number"),
        ("expected i64", "expected a whole number"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected a table"),
    ];
    let mut message = message.to_owned();
    for (rust, toml) in WORDS {
        if let Some(at) = message.find(rust) {
            let end = at + rust.len();
            // Whole words only: `u8` is not the start of `u80`.
            if !message[end..].starts_with(|c: char| c.is_ascii_alphanumeric()) {
                message.replace_range(at..end, toml);
            }
        }
    }
    if let Some(at) = message.find("expected struct ") {
        let name = at + "expected struct ".len();
        let end = message[name..]
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .map_or(message.len(), |n| name + n);
        message.replace_range(at..end, "expected a table");
    }
    message
}

/// A TOML error as a diagnostic located in `file`.
pub fn toml_error(file: &Arc<SourceFile>, err: &toml::de::Error) -> Diagnostic {
    let mut message = in_toml_terms(err.message().trim_end());
    if message == "duplicate key"
        && let Some(key) = err.span().and_then(|span| file.text.get(span))
    {
        message = format!("duplicate key `{key}`: it is defined twice");
    }
    let help = suggest_expected(&message);
    let diagnostic = match err.span() {
        Some(span) => Diagnostic::new(message).at(file, span),
        None => Diagnostic::new(format!("{message} (in {})", file.path.display())),
    };
    match help {
        Some(help) => diagnostic.with_help(help),
        None => diagnostic,
    }
}

/// Reads `table` (at `span` of `file`) as a `T`, with every problem of its fields, not only
/// serde's first: the field at fault is taken out and the table read again, once per field at
/// most, as rustc goes on past an error. The field taken out is the innermost one the problem
/// points into, so a nested table (`[limits]`, an `[[transition]]`, a node's `retry`) has every
/// problem of its own reported too. A field taken out is then not reported missing too, nor is
/// one a misspelt field was said to mean. The value is the table read without the fields at
/// fault, when it then reads: what those that remain say can still be checked, in the same pass.
pub fn read_table<T: serde::de::DeserializeOwned>(
    file: &Arc<SourceFile>,
    span: Range<usize>,
    mut table: toml::de::DeTable<'_>,
) -> (Option<T>, Vec<Diagnostic>) {
    let mut problems = Vec::new();
    // The names of the fields taken out or meant, at whatever depth.
    let mut taken_out: Vec<String> = Vec::new();
    loop {
        let read = T::deserialize(toml::de::Deserializer::from(Spanned::new(
            span.clone(),
            table.clone(),
        )));
        let error = match read {
            Ok(value) => return (Some(value), problems),
            Err(error) => error,
        };
        if let Some(missing) = error.message().strip_prefix("missing field `") {
            if !taken_out
                .iter()
                .any(|f| missing.starts_with(&format!("{f}`")))
            {
                problems.push(toml_error(file, &error));
            }
            // A nested table that misses a field is taken out, and the rest read on; a field
            // the whole table misses leaves nothing to read it as.
            match error
                .span()
                .filter(|at| *at != span)
                .and_then(|at| take_out(&mut table, at.start))
            {
                Some(field) => {
                    taken_out.push(field);
                    continue;
                }
                None => return (None, problems),
            }
        }
        let problem = toml_error(file, &error);
        // "did you mean `initial`?": the field it names is taken as written, not missing.
        if let Some(meant) = problem
            .help
            .as_deref()
            .and_then(|help| help.strip_prefix("did you mean `"))
            .and_then(|rest| rest.split('`').next())
        {
            taken_out.push(meant.to_owned());
        }
        problems.push(problem);
        match error.span().and_then(|at| take_out(&mut table, at.start)) {
            Some(field) => taken_out.push(field),
            None => return (None, problems),
        }
    }
}

/// Takes out of `table` the innermost field whose key or value holds byte `at`, looking into
/// nested tables and the tables of arrays, and returns its name; `None` when no field holds it.
/// A `[table]` header's span is the header alone, so nested tables are searched whatever their
/// span; an array's item cannot be taken out alone, so a problem of the item itself takes out
/// the array.
fn take_out(table: &mut toml::de::DeTable<'_>, at: usize) -> Option<String> {
    let names: Vec<String> = table
        .iter()
        .map(|(key, _)| key.get_ref().to_string())
        .collect();
    for name in names {
        let Some((key, value)) = table.get_key_value(name.as_str()) else {
            continue;
        };
        let mut holds =
            key.span().start <= at && at < value.span().end || value.span().contains(&at);
        let value = table.get_mut(name.as_str())?;
        let inner = match value.get_mut() {
            toml::de::DeValue::Table(nested) => take_out(nested, at),
            toml::de::DeValue::Array(items) => items.iter_mut().find_map(|item| {
                holds |= item.span().contains(&at);
                match item.get_mut() {
                    toml::de::DeValue::Table(nested) => take_out(nested, at),
                    _ => None,
                }
            }),
            _ => None,
        };
        if inner.is_some() {
            return inner;
        }
        if holds {
            table.remove(name.as_str());
            return Some(name);
        }
    }
    None
}

/// Compiles glob patterns, pointing at the one that does not parse.
pub fn glob_set(
    patterns: &[Spanned<String>],
    source: &Arc<SourceFile>,
) -> Result<GlobSet, Diagnostic> {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        let glob = Glob::new(pattern.get_ref()).map_err(|e| {
            Diagnostic::new(format!("invalid glob pattern: {}", e.kind()))
                .at(source, pattern.span())
        })?;
        builder.add(glob);
    }
    builder
        .build()
        .map_err(|e| Diagnostic::new(format!("invalid glob patterns: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_s_every_field_problem_is_reported_in_one_pass() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        struct Step {
            id: String,
            skill: String,
            retries: Option<u32>,
        }
        let text = "[step]\nid = \"a\"\nskil = \"x\"\nretries = \"two\"\nfrmo = 1\nskill = \"b\"\n";
        let file = SourceFile::new("chains/x.toml", text);
        let read = |text: &str| {
            let file = SourceFile::new("chains/x.toml", text);
            let mut root = toml::de::DeTable::parse(text).unwrap().into_inner();
            let step = root.remove("step").unwrap();
            let span = step.span();
            let toml::de::DeValue::Table(table) = step.into_inner() else {
                panic!("a table")
            };
            match read_table::<Step>(&file, span, table) {
                (Some(step), problems) if problems.is_empty() => Ok(step),
                (_, problems) => Err(problems),
            }
        };
        let problems = read(&file.text).unwrap_err();
        let found: Vec<_> = problems
            .iter()
            .map(|p| {
                (
                    p.message.split(',').next().unwrap().to_owned(),
                    p.position().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            found,
            [
                (
                    "unknown field `skil`".to_owned(),
                    "chains/x.toml:3:1".to_owned()
                ),
                (
                    "invalid type: string \"two\"".to_owned(),
                    "chains/x.toml:4:11".to_owned()
                ),
                (
                    "unknown field `frmo`".to_owned(),
                    "chains/x.toml:5:1".to_owned()
                ),
            ]
        );
        assert_eq!(problems[0].help.as_deref(), Some("did you mean `skill`?"));
        // What remains is read, for what its fields say to be checked too.
        let mut root = toml::de::DeTable::parse(&file.text).unwrap().into_inner();
        let step = root.remove("step").unwrap();
        let span = step.span();
        let toml::de::DeValue::Table(table) = step.into_inner() else {
            panic!("a table")
        };
        let (remaining, problems) = read_table::<Step>(&file, span, table);
        assert_eq!(problems.len(), 3);
        let step = remaining.unwrap();
        assert_eq!(
            (step.id.as_str(), step.skill.as_str(), step.retries),
            ("a", "b", None)
        );
        // A field missing for want of being written is reported; one taken out for its type
        // is not reported twice.
        let problems = read("[step]\nid = 3\nskill = \"b\"\n").unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        let problems = read("[step]\nskil = \"b\"\n").unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[1].message.starts_with("missing field `id`"));
        // `skil` meant `skill`: that one is not reported missing as well.
        let problems = read("[step]\nid = \"a\"\nskil = \"b\"\n").unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(read("[step]\nid = \"a\"\nskill = \"b\"\n").is_ok());
    }

    #[test]
    fn a_nested_table_s_every_problem_is_reported_in_one_pass() {
        #[derive(serde::Deserialize, Debug)]
        #[expect(dead_code, reason = "only how the file reads is checked")]
        #[serde(deny_unknown_fields)]
        struct Limits {
            memory: u32,
            cpus: Option<u32>,
        }
        #[derive(serde::Deserialize, Debug)]
        #[expect(dead_code, reason = "only how the file reads is checked")]
        #[serde(deny_unknown_fields)]
        struct Step {
            id: String,
        }
        #[derive(serde::Deserialize, Debug)]
        #[expect(dead_code, reason = "only how the file reads is checked")]
        #[serde(deny_unknown_fields)]
        struct Policy {
            name: String,
            limits: Limits,
            step: Vec<Step>,
        }
        let text = "name = \"p\"\n\n[limits]\nmemroy = 1\ncpus = \"two\"\nswap = 3\n\n\
                    [[step]]\nid = \"a\"\n\n[[step]]\nid = 2\ndi = \"b\"\n";
        let file = SourceFile::new("policies/p.toml", text);
        let root = toml::de::DeTable::parse(text).unwrap();
        let span = root.span();
        let (read, problems) = read_table::<Policy>(&file, span, root.into_inner());
        let found: Vec<_> = problems
            .iter()
            .map(|p| {
                (
                    p.message.split(',').next().unwrap().to_owned(),
                    p.position().unwrap(),
                    p.help.clone(),
                )
            })
            .collect();
        let at = |line: usize, col: usize| format!("policies/p.toml:{line}:{col}");
        assert_eq!(
            found,
            [
                (
                    "unknown field `memroy`".to_owned(),
                    at(4, 1),
                    Some("did you mean `memory`?".to_owned())
                ),
                ("invalid type: string \"two\"".to_owned(), at(5, 8), None),
                ("unknown field `swap`".to_owned(), at(6, 1), None),
                ("invalid type: integer `2`".to_owned(), at(12, 6), None),
                (
                    "unknown field `di`".to_owned(),
                    at(13, 1),
                    Some("did you mean `id`?".to_owned())
                ),
            ],
            "{problems:#?}"
        );
        assert!(read.is_none(), "`memory` is missing once `memroy` is out");
    }

    #[test]
    fn the_same_message_at_the_same_place_is_said_once() {
        let file = SourceFile::new("policies/p.toml", "a = 1\nb = 2\n");
        let other = SourceFile::new("policies/q.toml", "a = 1\nb = 2\n");
        let problems = vec![
            Diagnostic::new("bad").at(&file, 0..1),
            // Read again by a second node: another text, the same file and place.
            Diagnostic::new("bad")
                .at(&SourceFile::new("policies/p.toml", "a = 1\nb = 2\n"), 0..1)
                .with_help("a note"),
            Diagnostic::new("bad").at(&file, 6..7),
            Diagnostic::new("bad").at(&other, 0..1),
            Diagnostic::new("worse").at(&file, 0..1),
            Diagnostic::new("bad"),
            Diagnostic::new("bad"),
        ];
        let kept: Vec<_> = said_once(problems)
            .iter()
            .map(|p| (p.message.clone(), p.position(), p.help.clone()))
            .collect();
        let at = |place: &str| Some(place.to_owned());
        assert_eq!(
            kept,
            [
                ("bad".to_owned(), at("policies/p.toml:1:1"), None),
                ("bad".to_owned(), at("policies/p.toml:2:1"), None),
                ("bad".to_owned(), at("policies/q.toml:1:1"), None),
                ("worse".to_owned(), at("policies/p.toml:1:1"), None),
                ("bad".to_owned(), None, None),
            ]
        );
    }

    #[test]
    fn serde_s_rust_type_names_are_said_in_toml_s_words() {
        assert_eq!(
            in_toml_terms("invalid type: string \"x\", expected u32"),
            "invalid type: string \"x\", expected a whole number from 0 to 4294967295"
        );
        assert_eq!(
            in_toml_terms("invalid type: string \"true\", expected a sequence"),
            "invalid type: string \"true\", expected an array"
        );
        assert_eq!(
            in_toml_terms("invalid type: integer `3`, expected struct RawRetry"),
            "invalid type: integer `3`, expected a table"
        );
        assert_eq!(in_toml_terms("expected u80 things"), "expected u80 things");
        assert_eq!(
            in_toml_terms("invalid value: integer `0`, expected a nonzero u32"),
            "invalid value: integer `0`, expected a whole number from 1 to 4294967295"
        );
    }

    #[test]
    fn a_spec_file_over_the_limit_is_refused_before_it_is_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let limit = (DEFAULT_MAX_SPEC_KIB * 1024) as usize;
        let at = dir.path().join("at.toml");
        std::fs::write(&at, "#".repeat(limit)).unwrap();
        assert_eq!(read_spec(&at).unwrap().len(), limit);
        let over = dir.path().join("over.toml");
        std::fs::write(&over, "#".repeat(limit + 1)).unwrap();
        let refused = read_spec(&over).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(
            refused.to_string().contains("4097 KiB, over the 4096 KiB"),
            "{refused}"
        );
    }

    #[test]
    fn an_unknown_field_or_variant_close_to_an_expected_one_is_suggested() {
        for (message, help) in [
            (
                "unknown field `runn`, expected one of `run`, `shell`, `env`",
                Some("did you mean `run`?"),
            ),
            (
                "unknown variant `READ_ONY`, expected one of `READ_ONLY`, `FILE_WRITE`",
                Some("did you mean `READ_ONLY`?"),
            ),
            (
                "unknown field `reed`, expected `read`",
                Some("did you mean `read`?"),
            ),
            (
                "unknown field `zzzzzz`, expected one of `run`, `shell`",
                None,
            ),
            ("invalid type: integer `5`, expected a string", None),
        ] {
            assert_eq!(suggest_expected(message).as_deref(), help, "{message}");
        }
    }

    /// The hash a file keeps is the one the ledger names texts by, the same on every ask: the
    /// journal's verification recomputes it from the stored text.
    #[test]
    fn a_files_kept_hash_is_its_spec_hash() {
        let file = SourceFile::new("p.toml", "[pipeline]\nname = \"p\"\n");
        assert_eq!(file.spec_hash(), crate::hash::spec_hash(&file.text));
        assert_eq!(file.spec_hash(), file.spec_hash());
        assert_eq!(
            SourceFile::new("out/1", "").spec_hash(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn line_and_column_are_one_based_and_count_characters() {
        let file = SourceFile::new("p.toml", "a = 1\nbé = 2\n");
        assert_eq!(file.line_col(0), (1, 1));
        assert_eq!(file.line_col(6), (2, 1));
        // 'é' is two bytes: the '=' after "bé " is column 4.
        assert_eq!(file.line_col(10), (2, 4));
    }

    #[test]
    fn a_close_name_is_suggested_and_a_far_one_is_not() {
        let known = ["outputs", "state", "kind", "error"];
        assert_eq!(closest("ouputs", known), Some("outputs"));
        assert_eq!(closest("stat", known), Some("state"));
        assert_eq!(closest("banana", known), None);
        assert_eq!(suggest("x", &["id", "pipeline"]), "known: `id`, `pipeline`");
    }

    #[test]
    fn rendering_shows_position_source_line_and_carets() {
        let file = SourceFile::new("pipelines/x.toml", "[nodes.a]\nrn = [\"true\"]\n");
        let d = Diagnostic::new("unknown field `rn`")
            .at(&file, 10..12)
            .with_help("did you mean `run`?");
        assert_eq!(
            d.to_string(),
            "unknown field `rn`\n --> pipelines/x.toml:2:1\n  |\n2 | rn = [\"true\"]\n  | ^^\n  = help: did you mean `run`?"
        );
        assert_eq!(d.position().as_deref(), Some("pipelines/x.toml:2:1"));
    }
}
