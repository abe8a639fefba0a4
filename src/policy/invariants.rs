//! Invariants: what a built skill must contain, checked by kavi's own code with rules from a
//! policy file. Each rule names a file (a template) and a pattern that must match some line;
//! a `side_effect` rule also requires the captured class to equal the proposal's.

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
}

#[derive(Debug, Clone)]
pub struct Invariant {
    pub id: String,
    pub kind: InvariantKind,
    /// A template over the gate's vars and `paths`.
    pub file: Spanned<String>,
    pattern: Regex,
    pub message: String,
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
            Ok(Invariant {
                id: r.id,
                kind: r.kind,
                file: r.file,
                pattern,
                message: r.message,
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
    fn a_side_effect_rule_without_a_class_group_points_at_its_pattern() {
        let source = SourceFile::new(
            "i.toml",
            "[[invariant]]\nid = \"x\"\nkind = \"side_effect\"\nfile = \"f\"\npattern = 'SIDE'\nmessage = \"m\"\n",
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
