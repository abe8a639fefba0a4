//! Invariants: what a built skill must contain, checked by kavi's own code with rules from a
//! policy file. Each rule names a file (a template) and a pattern that must match some line;
//! a `side_effect` rule also requires the captured class to equal the proposal's, and names its
//! `subject`: the file must declare it exactly once and mention it nowhere else, so a second
//! assignment, an alias or a write through `globals()` cannot change the class unnoticed.

use std::path::Path;
use std::sync::Arc;

use regex::Regex;
use serde::Deserialize;
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvariantKind {
    Present,
    SideEffect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInvariants {
    #[serde(rename = "invariant")]
    invariants: Vec<RawInvariant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInvariant {
    id: String,
    kind: InvariantKind,
    file: Spanned<String>,
    pattern: Spanned<String>,
    message: String,
    /// For a `side_effect` rule: the name the declaration assigns. Every line that mentions it
    /// must be the one declaration, so a second assignment or an alias cannot change the class.
    subject: Option<Spanned<String>>,
}

#[derive(Debug, Clone)]
pub struct Invariant {
    pub id: String,
    pub kind: InvariantKind,
    /// A template over the gate's vars and `paths`.
    pub file: Spanned<String>,
    pattern: Regex,
    pub message: String,
    /// Matches a mention of the `subject` as a whole word, anywhere on a line.
    subject: Option<(String, Regex)>,
}

impl Invariant {
    /// Checks one file's text; returns the violation, if any. `class` is the proposal's
    /// side-effect class.
    pub fn check(&self, file: &str, text: &str, class: Option<&str>) -> Option<String> {
        let found = text.lines().find_map(|line| self.pattern.captures(line));
        let Some(captures) = found else {
            return Some(format!(
                "{file}: [{}] it must be true that it {}",
                self.id, self.message
            ));
        };
        if let Some((name, mention)) = &self.subject {
            let mut declarations = 0;
            for (number, line) in text.lines().enumerate() {
                if self.pattern.is_match(line) {
                    declarations += 1;
                    if declarations > 1 {
                        return Some(format!(
                            "{file}:{}: [{}] declares `{name}` a second time; declare it once",
                            number + 1,
                            self.id
                        ));
                    }
                } else if mention.is_match(line) {
                    return Some(format!(
                        "{file}:{}: [{}] mentions `{name}` outside its one declaration: {}",
                        number + 1,
                        self.id,
                        line.trim()
                    ));
                }
            }
        }
        if self.kind == InvariantKind::SideEffect {
            let declared = captures.name("class").map(|m| m.as_str());
            if declared != class {
                return Some(format!(
                    "{file}: [{}] declares {}, but the skill was proposed as {}",
                    self.id,
                    declared.unwrap_or("nothing"),
                    class.unwrap_or("nothing (not proposed)")
                ));
            }
        }
        None
    }
}

/// Parses an invariants policy; a bad pattern, or a `side_effect` rule without a `class` group,
/// is pointed at.
pub fn parse(source: &Arc<SourceFile>) -> Result<Vec<Invariant>, Diagnostic> {
    let raw: RawInvariants =
        toml::from_str(&source.text).map_err(|e| crate::spec::toml_error(source, &e))?;
    raw.invariants
        .into_iter()
        .map(|r| {
            let pattern = Regex::new(r.pattern.get_ref()).map_err(|e| {
                Diagnostic::new(format!("invalid regular expression in invariant `{}`: {e}", r.id))
                    .at(source, r.pattern.span())
            })?;
            if r.kind == InvariantKind::SideEffect && !pattern.capture_names().any(|n| n == Some("class")) {
                return Err(Diagnostic::new(format!(
                    "invariant `{}` checks a side effect, so its pattern needs a `(?P<class>...)` group",
                    r.id
                ))
                .at(source, r.pattern.span()));
            }
            let subject = match (&r.subject, r.kind) {
                (None, InvariantKind::SideEffect) => {
                    return Err(Diagnostic::new(format!(
                        "invariant `{}` checks a side effect, so it needs `subject`: the name its \
                         declaration assigns, such as \"SIDE_EFFECT\"",
                        r.id
                    ))
                    .at(source, r.pattern.span()));
                }
                (None, _) => None,
                (Some(name), _) => {
                    let word = Regex::new(&format!(r"\b{}\b", regex::escape(name.get_ref())))
                        .expect("an escaped name is a valid pattern");
                    Some((name.get_ref().clone(), word))
                }
            };
            Ok(Invariant {
                id: r.id,
                kind: r.kind,
                file: r.file,
                pattern,
                message: r.message,
                subject,
            })
        })
        .collect()
}

/// Reads a file an invariant names; a file that cannot be read is an error, not a pass.
pub fn read(root: &Path, file: &str) -> Result<String, String> {
    std::fs::read_to_string(root.join(file)).map_err(|e| format!("cannot read {file}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Vec<Invariant> {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/policies/invariants.toml"
        ))
        .unwrap();
        parse(&SourceFile::new("policies/invariants.toml", text)).unwrap()
    }

    #[test]
    fn a_declared_side_effect_must_match_the_proposal() {
        let rules = shipped();
        let declared = rules
            .iter()
            .find(|r| r.id == "side-effect-declared")
            .unwrap();
        let source = "SIDE_EFFECT = \"READ_ONLY\"\n\ndef run(data):\n    pass\n";
        assert_eq!(declared.check("s.py", source, Some("READ_ONLY")), None);
        assert_eq!(
            declared.check("s.py", source, Some("FILE_WRITE")).unwrap(),
            "s.py: [side-effect-declared] declares READ_ONLY, but the skill was proposed as FILE_WRITE"
        );
        assert!(
            declared
                .check("s.py", "def run(data): pass\n", Some("READ_ONLY"))
                .unwrap()
                .contains("must be true")
        );
        let entry = rules.iter().find(|r| r.id == "entry-point").unwrap();
        assert_eq!(entry.check("s.py", source, None), None);
    }

    #[test]
    fn a_second_declaration_or_any_other_mention_cannot_change_the_class() {
        let rules = shipped();
        let declared = rules
            .iter()
            .find(|r| r.id == "side-effect-declared")
            .unwrap();
        for (source, expected) in [
            (
                "SIDE_EFFECT = \"READ_ONLY\"\nSIDE_EFFECT = \"NETWORK\"\n",
                "s.py:2: [side-effect-declared] declares `SIDE_EFFECT` a second time",
            ),
            (
                "SIDE_EFFECT = \"READ_ONLY\"\nglobals()[\"SIDE_EFFECT\"] = \"NETWORK\"\n",
                "s.py:2: [side-effect-declared] mentions `SIDE_EFFECT` outside its one declaration",
            ),
            (
                "CLASS = \"NETWORK\"\nSIDE_EFFECT = \"READ_ONLY\"\nSIDE_EFFECT: str = CLASS\n",
                "s.py:3: [side-effect-declared] mentions `SIDE_EFFECT`",
            ),
            (
                "import other as SIDE_EFFECT\nSIDE_EFFECT = \"READ_ONLY\"\n",
                "s.py:1: [side-effect-declared] mentions `SIDE_EFFECT`",
            ),
        ] {
            let found = declared.check("s.py", source, Some("READ_ONLY")).unwrap();
            assert!(found.starts_with(expected), "{found}");
        }
        // The name inside a longer word is not a mention.
        let fine = "SIDE_EFFECT = \"READ_ONLY\"\nMY_SIDE_EFFECTS = 2\n";
        assert_eq!(declared.check("s.py", fine, Some("READ_ONLY")), None);
    }

    #[test]
    fn a_side_effect_rule_without_a_class_group_points_at_its_pattern() {
        let source = SourceFile::new(
            "i.toml",
            "[[invariant]]\nid = \"x\"\nkind = \"side_effect\"\nfile = \"f\"\npattern = 'SIDE'\nmessage = \"m\"\nsubject = \"SIDE\"\n",
        );
        let err = parse(&source).unwrap_err();
        assert!(
            err.message.contains("needs a `(?P<class>...)` group"),
            "{}",
            err.message
        );
        assert_eq!(err.position().as_deref(), Some("i.toml:5:11"));
    }
}
