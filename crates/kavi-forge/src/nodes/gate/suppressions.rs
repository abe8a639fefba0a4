//! The suppressions kavi looks for itself, because the gate's tools honour them without a rule
//! that flags them: each silences a whole file or function, so the code under review could
//! switch its own gate off.
//!
//! The others are the tools' own rules, set in kavi's configuration of them: ruff's `PGH004`
//! (a `# noqa`, `# ruff: noqa` or `# flake8: noqa` without codes) and `RUF100` (a `# noqa`
//! that silences nothing); mypy's `ignore-without-code` (a `# type: ignore` without codes) and
//! `warn_unused_ignores`. A skipped test shows in the test gate's report.

use std::path::Path;

use serde::Serialize;

/// A kind of suppression kavi checks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `# ruff: noqa: F401` or `# flake8: noqa: F401` on a line of its own: ruff then skips
    /// those rules in the whole file (the blanket form is ruff's PGH004). Any other ruff
    /// directive on a line of its own too: `# ruff: disable[F401]` skips them to its
    /// `# ruff: enable[F401]` or the end of the file, `# ruff: file-ignore[F401]` in the whole
    /// file. (A trailing `# ruff: ignore[F401]` is a `# noqa: F401`, one line's.)
    FileNoqa,
    /// `# mypy: ignore-errors`, or any other `# mypy:` line: configuration the checked file
    /// gives mypy, over kavi's.
    MypyInlineConfig,
    /// `# type: ignore` on a line of its own: at the top of a file, mypy checks none of it.
    ModuleTypeIgnore,
    /// `typing.no_type_check`: mypy checks nothing in the function it decorates.
    NoTypeCheck,
    /// `# noqa: F401` (or `# ruff: ignore[F401]`) after code: ruff skips those rules on that
    /// line. Narrow, and RUF100 fails one that silences nothing, but a reviewer should see it.
    LineNoqa,
    /// `# type: ignore[code]` after code: mypy skips that error on that line.
    LineTypeIgnore,
}

pub const KINDS: &[Kind] = &[
    Kind::FileNoqa,
    Kind::MypyInlineConfig,
    Kind::ModuleTypeIgnore,
    Kind::NoTypeCheck,
    Kind::LineNoqa,
    Kind::LineTypeIgnore,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::FileNoqa => "file_noqa",
            Kind::MypyInlineConfig => "mypy_inline_config",
            Kind::ModuleTypeIgnore => "module_type_ignore",
            Kind::NoTypeCheck => "no_type_check",
            Kind::LineNoqa => "line_noqa",
            Kind::LineTypeIgnore => "line_type_ignore",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        KINDS.iter().copied().find(|k| k.name() == name)
    }

    /// Whether `line` holds this suppression.
    fn matches(self, line: &str) -> bool {
        if matches!(self, Kind::LineNoqa | Kind::LineTypeIgnore) {
            return trailing_comments(line).any(|body| match self {
                Kind::LineNoqa => {
                    body.strip_prefix("noqa").is_some_and(|rest| {
                        rest.is_empty() || rest.starts_with(':') || rest.starts_with(' ')
                    }) || directive(&body, "ruff").is_some_and(|rest| rest.starts_with("ignore"))
                }
                _ => directive(&body, "type").is_some_and(|rest| rest.starts_with("ignore")),
            });
        }
        let comment = line.trim_start();
        let Some(body) = comment.strip_prefix('#') else {
            return self == Kind::NoTypeCheck && mentions_no_type_check(line);
        };
        let body = body.trim_start().to_ascii_lowercase();
        match self {
            Kind::FileNoqa => ["ruff", "flake8"].iter().any(|tool| {
                body.strip_prefix(tool)
                    .map(str::trim_start)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .is_some_and(|rest| *tool == "ruff" || rest.trim_start().starts_with("noqa"))
            }),
            Kind::MypyInlineConfig => body
                .strip_prefix("mypy")
                .is_some_and(|rest| rest.trim_start().starts_with(':')),
            Kind::ModuleTypeIgnore => body
                .strip_prefix("type")
                .map(str::trim_start)
                .and_then(|rest| rest.strip_prefix(':'))
                .is_some_and(|rest| rest.trim_start().starts_with("ignore")),
            Kind::NoTypeCheck | Kind::LineNoqa | Kind::LineTypeIgnore => false,
        }
    }
}

/// The comments after code on `line`, each lowercased from after its `#`: every `#` counts (one
/// in a string too), so that none is missed; a false finding fails safe.
fn trailing_comments(line: &str) -> impl Iterator<Item = String> + '_ {
    line.match_indices('#')
        .filter(|(at, _)| !line[..*at].trim().is_empty())
        .map(|(at, _)| line[at + 1..].trim_start().to_ascii_lowercase())
}

/// What follows `tool:` at the start of a comment's `body`, trimmed.
fn directive<'a>(body: &'a str, tool: &str) -> Option<&'a str> {
    body.strip_prefix(tool)
        .map(str::trim_start)
        .and_then(|rest| rest.strip_prefix(':'))
        .map(str::trim_start)
}

fn mentions_no_type_check(line: &str) -> bool {
    let code = line.split('#').next().unwrap_or_default();
    code.match_indices("no_type_check").any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + "no_type_check".len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric())
    })
}

/// One suppression found: where, which kind, and the line.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    pub file: String,
    pub line: usize,
    pub kind: Kind,
    pub text: String,
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: suppression `{}` ({}) is not allowed by the gate set's [suppressions]",
            self.file,
            self.line,
            self.text,
            self.kind.name()
        )
    }
}

/// Every suppression of `kinds` in `text`, the file `file`.
pub fn find_in(file: &str, text: &str, kinds: &[Kind]) -> Vec<Found> {
    // The tools read past a byte order mark: the first line is a comment for them too.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut found = Vec::new();
    for (index, line) in crate::policy::python_lines(text).enumerate() {
        for &kind in kinds {
            if kind.matches(line) {
                found.push(Found {
                    file: file.to_owned(),
                    line: index + 1,
                    kind,
                    text: line.trim().chars().take(120).collect(),
                });
            }
        }
    }
    found
}

/// Every suppression of `kinds` in the `files` (relative to `cwd`). A file that does not exist
/// has none (the tool says it is missing); one that cannot be read is an error.
pub fn find(cwd: &Path, files: &[String], kinds: &[Kind]) -> Result<Vec<Found>, String> {
    let mut found = Vec::new();
    for file in files {
        let path = cwd.join(file);
        match super::junit::read_regular(&path) {
            Ok(bytes) => found.extend(find_in(file, &String::from_utf8_lossy(&bytes), kinds)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("could not read {file} for suppressions: {e}")),
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<&'static str> {
        find_in("f.py", text, KINDS)
            .iter()
            .map(|f| f.kind.name())
            .collect()
    }

    #[test]
    fn each_kind_is_found_in_its_spellings() {
        assert_eq!(kinds("# ruff: noqa: F401\n"), ["file_noqa"]);
        assert_eq!(kinds("#flake8:NOQA\n"), ["file_noqa"]);
        assert_eq!(kinds("# ruff: disable[F401]\n"), ["file_noqa"]);
        assert_eq!(kinds("    # ruff : enable[F401]\n"), ["file_noqa"]);
        assert_eq!(kinds("#ruff:file-ignore[unused-import]\n"), ["file_noqa"]);
        assert_eq!(kinds("# ruff: isort: skip_file\n"), ["file_noqa"]);
        assert_eq!(kinds("# mypy: ignore-errors\n"), ["mypy_inline_config"]);
        assert_eq!(
            kinds("  #mypy : disable-error-code=\"arg-type\"\n"),
            ["mypy_inline_config"]
        );
        assert_eq!(kinds("# type: ignore\n"), ["module_type_ignore"]);
        assert_eq!(kinds("#type:ignore[misc]\n"), ["module_type_ignore"]);
        assert_eq!(
            kinds("from typing import no_type_check\n@typing.no_type_check\n"),
            ["no_type_check", "no_type_check"]
        );
    }

    /// A suppression after code, of one line's rules, in its spellings; not a comment that
    /// only starts like one, nor one on a line of its own.
    #[test]
    fn a_line_suppression_is_found_after_code() {
        let line = |text: &str| -> Vec<&str> {
            find_in("x.py", text, &[Kind::LineNoqa, Kind::LineTypeIgnore])
                .iter()
                .map(|f| f.kind.name())
                .collect()
        };
        assert_eq!(line("import os  # noqa: F401\n"), ["line_noqa"]);
        assert_eq!(line("import os  #NOQA\n"), ["line_noqa"]);
        assert_eq!(line("x = 1  # ruff: ignore[F841]\n"), ["line_noqa"]);
        assert_eq!(
            line("x: int = y  # type: ignore[assignment]\n"),
            ["line_type_ignore"]
        );
        assert_eq!(
            line("x = 1  # a comment # type:ignore\n"),
            ["line_type_ignore"]
        );
        assert!(line("x = 1  # noqaish\n").is_empty());
        assert!(line("# type: ignore\n").is_empty());
    }

    #[test]
    fn code_and_ordinary_comments_are_not_suppressions() {
        assert!(kinds("# noqa: F401\n").is_empty());
        assert!(kinds("# ruffian: noqa\n").is_empty());
        assert!(kinds("# the type: of this\n# mypy is strict\n# ruff rules\n").is_empty());
        assert!(kinds("no_type_checker = 1\n# no_type_check is banned\n").is_empty());
    }

    /// Python (and ruff and mypy) end a line at a bare carriage return too: a suppression after
    /// one is a line of its own, numbered as they number it.
    #[test]
    fn a_suppression_after_a_bare_carriage_return_is_found() {
        let found = find_in(
            "skill.py",
            "#x\r# type: ignore\r# ruff: noqa: F401\nimport os\r\n",
            KINDS,
        );
        let seen: Vec<_> = found.iter().map(|f| (f.line, f.kind.name())).collect();
        assert_eq!(seen, [(2, "module_type_ignore"), (3, "file_noqa")]);
    }

    #[test]
    fn a_suppression_after_a_byte_order_mark_is_found() {
        assert_eq!(
            kinds("\u{feff}# ruff: disable[F401]\nimport os\n"),
            ["file_noqa"]
        );
    }

    #[test]
    fn lines_are_numbered_from_one() {
        let found = find_in("skill.py", "import os\n\n# mypy: ignore-errors\n", KINDS);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].line, 3);
        assert!(found[0].to_string().starts_with("skill.py:3: suppression"));
    }
}
