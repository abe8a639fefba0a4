//! Invariants: what a built skill must contain, checked by kavi's own code with rules from a
//! policy file. Each rule names a file (a template) and a pattern that must match some line;
//! a `side_effect` rule also requires the captured class to equal the proposal's, and names its
//! `subject`: the file must declare it exactly once and mention it nowhere else, so a second
//! assignment, an alias or a write through `globals()` cannot change the class unnoticed.
//!
//! A `capability` rule works the other way round: its pattern is a use of something only some
//! classes may do (a network library, a file write), and a line that matches it fails a skill
//! proposed as any other class. The kernel's confinement is the real enforcement; this is the
//! early refusal, with the line that gave the skill away.

use std::path::Path;
use std::sync::Arc;

use regex::Regex;
use serde::Deserialize;
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InvariantKind {
    Present,
    SideEffect,
    Capability,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawInvariants {
    #[serde(rename = "invariant")]
    invariants: Vec<RawInvariant>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawInvariant {
    id: String,
    kind: InvariantKind,
    #[schemars(with = "String")]
    file: Spanned<String>,
    #[schemars(with = "String")]
    pattern: Spanned<String>,
    message: String,
    /// For a `side_effect` rule: the name the declaration assigns. Every line that mentions it
    /// must be the one declaration, so a second assignment or an alias cannot change the class.
    #[schemars(with = "Option<String>")]
    subject: Option<Spanned<String>>,
    /// For a `capability` rule: the classes a skill must be proposed as to match the pattern.
    #[schemars(with = "Option<Vec<crate::skills::SideEffect>>")]
    classes: Option<Spanned<Vec<crate::skills::SideEffect>>>,
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
    /// For a `capability` rule: the classes allowed to match the pattern.
    classes: Vec<crate::skills::SideEffect>,
}

impl Invariant {
    /// Checks one file's text; returns the violation, if any. `class` is the proposal's
    /// side-effect class.
    pub fn check(&self, file: &str, text: &str, class: Option<&str>) -> Option<String> {
        if self.kind == InvariantKind::Capability {
            return self.check_capability(file, text, class);
        }
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
            // A set may be declared in any order (`SECRET_READ+NETWORK`); compare it as a set.
            let declared = captures.name("class").map(|m| {
                crate::skills::SideEffects::parse(m.as_str())
                    .map_or_else(|_| m.as_str().to_owned(), |set| set.to_string())
            });
            let declared = declared.as_deref();
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

    /// The first line that uses the capability, unless the skill was proposed as a class that
    /// may.
    fn check_capability(&self, file: &str, text: &str, class: Option<&str>) -> Option<String> {
        let proposed: Vec<&str> = class.map(|c| c.split('+').collect()).unwrap_or_default();
        if self
            .classes
            .iter()
            .any(|allowed| proposed.contains(&allowed.as_str()))
        {
            return None;
        }
        let (number, line) = text
            .lines()
            .enumerate()
            .find(|(_, line)| self.pattern.is_match(line))?;
        let allowed: Vec<&str> = self.classes.iter().map(|c| c.as_str()).collect();
        Some(format!(
            "{file}:{}: [{}] {}, which only a skill proposed as {} may, and this one was \
             proposed as {}: {}",
            number + 1,
            self.id,
            self.message,
            allowed.join(" or "),
            class.unwrap_or("nothing (not proposed)"),
            line.trim()
        ))
    }
}

/// Parses an invariants policy; a bad pattern, or a `side_effect` rule without a `class` group,
/// is pointed at.
pub fn parse(source: &Arc<SourceFile>) -> Result<Vec<Invariant>, Diagnostic> {
    let raw: RawInvariants =
        toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
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
            let classes = match (r.classes, r.kind) {
                (Some(classes), InvariantKind::Capability) if !classes.get_ref().is_empty() => {
                    classes.into_inner()
                }
                (_, InvariantKind::Capability) => {
                    return Err(Diagnostic::new(format!(
                        "invariant `{}` checks a capability, so it needs `classes`: the side-effect \
                         classes that may use it, such as [\"NETWORK\"]",
                        r.id
                    ))
                    .at(source, r.pattern.span()));
                }
                (Some(classes), _) => {
                    return Err(Diagnostic::new(format!(
                        "`classes` is for `capability` invariants; `{}` is not one",
                        r.id
                    ))
                    .at(source, classes.span()));
                }
                (None, _) => Vec::new(),
            };
            Ok(Invariant {
                id: r.id,
                kind: r.kind,
                file: r.file,
                pattern,
                message: r.message,
                subject,
                classes,
            })
        })
        .collect()
}

/// Reads a file an invariant or a scan names; a file that cannot be read is an error, not a
/// pass. Only a regular file is read, as long as it was when opened: the root is often a
/// builder's sandbox, and a FIFO put in a file's place would hold the gate (and the loop it
/// runs on) forever.
pub fn read(root: &Path, file: &str) -> Result<String, String> {
    use std::io::Read as _;
    let mut text = String::new();
    crate::files::open_regular(&root.join(file))
        .and_then(|mut opened| opened.read_to_string(&mut text))
        .map_err(|e| format!("cannot read {file}: {e}"))?;
    Ok(text)
}

/// Like [`read`], for a file that may not be text.
pub fn read_bytes(root: &Path, file: &str) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    crate::files::open_regular(&root.join(file))
        .and_then(|mut opened| opened.read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read {file}: {e}"))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Vec<Invariant> {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policies/invariants.toml"
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

    fn capability_violations(source: &str, class: &str) -> Vec<String> {
        shipped()
            .iter()
            .filter(|r| r.kind == InvariantKind::Capability)
            .filter_map(|r| r.check("s.py", source, Some(class)))
            .collect()
    }

    #[test]
    fn a_skill_of_several_classes_declares_the_set_in_any_order() {
        let rules = shipped();
        let declared = rules
            .iter()
            .find(|r| r.id == "side-effect-declared")
            .unwrap();
        let source = "SIDE_EFFECT = \"SECRET_READ+NETWORK\"\n";
        assert_eq!(
            declared.check("s.py", source, Some("NETWORK+SECRET_READ")),
            None
        );
        let narrower = declared.check("s.py", source, Some("NETWORK")).unwrap();
        assert!(
            narrower
                .contains("declares NETWORK+SECRET_READ, but the skill was proposed as NETWORK"),
            "{narrower}"
        );
        // Any of its classes may use what that class may.
        assert!(capability_violations("import urllib.request\n", "NETWORK+SECRET_READ").is_empty());
        assert!(!capability_violations("open(p, 'w')\n", "NETWORK+SECRET_READ").is_empty());
    }

    #[test]
    fn code_that_uses_the_network_or_writes_files_needs_the_class_that_may() {
        for (source, rule) in [
            ("import urllib.request as r\n", "network-needs-network"),
            ("from http import client\n", "network-needs-network"),
            ("import json, http.client\n", "network-needs-network"),
            ("    import requests as r\n", "network-needs-network"),
            (
                "reader, writer = await asyncio.open_connection(h, p)\n",
                "network-needs-network",
            ),
            (
                "pathlib.Path(p).write_text(body)\n",
                "writes-need-file-write",
            ),
            ("with open(p, \"w\") as out:\n", "writes-need-file-write"),
            (
                "with open(p, mode='a+') as out:\n",
                "writes-need-file-write",
            ),
            ("with open(p, \"r+\") as out:\n", "writes-need-file-write"),
            ("os.remove(p)\n", "writes-need-file-write"),
            ("shutil.copyfile(a, b)\n", "writes-need-file-write"),
        ] {
            let found = capability_violations(source, "READ_ONLY");
            assert!(
                found.len() == 1 && found[0].contains(&format!("[{rule}]")),
                "{source:?}: {found:?}"
            );
            assert!(found[0].contains("proposed as READ_ONLY"), "{found:?}");
        }
        // The class that may, may.
        assert!(capability_violations("import urllib.request\n", "NETWORK").is_empty());
        assert!(capability_violations("open(p, 'w')\n", "FILE_WRITE").is_empty());
        // Reading, and strings that merely look alike, are not writes.
        for source in [
            "with open(p) as f:\n",
            "with open(p, \"rb\") as f:\n",
            "with open(p, encoding=\"ascii\") as f:\n",
            "text = body.replace(\"a\", \"b\")\n",
            "# see https://example.org/http\n",
            "import json\n",
        ] {
            assert!(
                capability_violations(source, "READ_ONLY").is_empty(),
                "{source:?}"
            );
        }
    }

    /// The shipped example skills pass the shipped rules as the classes they are proposed as.
    #[test]
    fn the_prepared_example_skills_keep_to_their_classes() {
        let repo = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        for skill in ["word_count", "write_note", "find_notes", "summarize_note"] {
            let proposal =
                std::fs::read_to_string(repo.join(format!("proposals/{skill}.toml"))).unwrap();
            let class = crate::skills::Proposal::parse(&SourceFile::new("p.toml", proposal))
                .unwrap()
                .side_effect;
            let source =
                std::fs::read_to_string(repo.join(format!("builders/prepared/{skill}/skill.py")))
                    .unwrap();
            assert_eq!(
                capability_violations(&source, &class.to_string()),
                Vec::<String>::new(),
                "{skill}"
            );
            // And each, proposed as READ_ONLY instead, is caught if it writes.
            if class.contains(crate::skills::SideEffect::FileWrite) {
                assert!(!capability_violations(&source, "READ_ONLY").is_empty());
            }
        }
    }
}
