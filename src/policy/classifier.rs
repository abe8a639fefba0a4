//! The failure classifier: ordered rules from a policy file decide what kind of failure a
//! failed node run was. Deterministic: the same failure always gets the same kind.

use std::sync::Arc;

use regex::Regex;
use serde::Deserialize;
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};

/// The kind when no rule matches.
pub const UNKNOWN: &str = "UNKNOWN";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClassifier {
    #[serde(rename = "rule")]
    rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    kind: String,
    node_kind: Option<String>,
    state: Option<String>,
    failure_kind: Option<String>,
    log: Option<Spanned<String>>,
}

#[derive(Debug, Clone)]
struct Rule {
    kind: String,
    node_kind: Option<String>,
    state: Option<String>,
    failure_kind: Option<String>,
    log: Option<Regex>,
}

/// What the classifier looks at.
#[derive(Debug, Clone, Default)]
pub struct Failure<'a> {
    pub node_kind: &'a str,
    pub state: &'a str,
    pub failure_kind: Option<&'a str>,
    pub text: &'a str,
}

#[derive(Debug, Clone)]
pub struct Classifier {
    rules: Vec<Rule>,
}

impl Classifier {
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let raw: RawClassifier =
            toml::from_str(&source.text).map_err(|e| crate::spec::toml_error(source, &e))?;
        let rules = raw
            .rules
            .into_iter()
            .map(|r| {
                let log = r
                    .log
                    .map(|log| {
                        Regex::new(log.get_ref()).map_err(|e| {
                            Diagnostic::new(format!("invalid regular expression: {e}"))
                                .at(source, log.span())
                        })
                    })
                    .transpose()?;
                Ok(Rule {
                    kind: r.kind,
                    node_kind: r.node_kind,
                    state: r.state,
                    failure_kind: r.failure_kind,
                    log,
                })
            })
            .collect::<Result<_, Diagnostic>>()?;
        Ok(Self { rules })
    }

    /// The kind of a failure: the first rule whose every set field matches, else UNKNOWN.
    pub fn classify(&self, failure: &Failure<'_>) -> String {
        self.rules
            .iter()
            .find(|rule| {
                rule.node_kind
                    .as_deref()
                    .is_none_or(|k| k == failure.node_kind)
                    && rule.state.as_deref().is_none_or(|s| s == failure.state)
                    && rule
                        .failure_kind
                        .as_deref()
                        .is_none_or(|f| Some(f) == failure.failure_kind)
                    && rule.log.as_ref().is_none_or(|re| re.is_match(failure.text))
            })
            .map_or_else(|| UNKNOWN.to_owned(), |rule| rule.kind.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Classifier {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/policies/classifier.toml"
        ))
        .unwrap();
        Classifier::parse(&SourceFile::new("policies/classifier.toml", text)).unwrap()
    }

    fn kind(node_kind: &str, state: &str, failure_kind: Option<&str>, text: &str) -> String {
        shipped().classify(&Failure {
            node_kind,
            state,
            failure_kind,
            text,
        })
    }

    #[test]
    fn each_failure_class_is_named_by_the_shipped_rules() {
        assert_eq!(kind("build", "timed_out", None, ""), "TIMEOUT");
        assert_eq!(
            kind(
                "diff_gate",
                "failed",
                None,
                "changed outside the allowlist: x"
            ),
            "GATE_VIOLATION"
        );
        assert_eq!(kind("copy_back", "failed", None, ""), "GATE_VIOLATION");
        assert_eq!(
            kind("build", "failed", None, "the builder exited with code 1"),
            "BUILD_ERROR"
        );
        assert_eq!(
            kind(
                "build",
                "failed",
                None,
                "sh: 1: cannot create /w/PWNED: Permission denied"
            ),
            "CONFINEMENT_DENIED"
        );
        assert_eq!(
            kind("gate", "failed", Some("VERIFY_POLICY"), ""),
            "VERIFY_POLICY"
        );
        assert_eq!(
            kind("gate", "failed", Some("VERIFY_INVARIANT"), ""),
            "VERIFY_INVARIANT"
        );
        assert_eq!(
            kind("gate", "failed", Some("VERIFY_LINT"), ""),
            "VERIFY_LINT"
        );
        assert_eq!(
            kind("gate", "failed", Some("VERIFY_TEST"), ""),
            "VERIFY_TEST"
        );
        assert_eq!(
            kind(
                "exec",
                "failed",
                None,
                "  File \"x.py\"\nSyntaxError: invalid syntax"
            ),
            "VERIFY_LINT"
        );
        assert_eq!(kind("exec", "failed", None, "something else"), UNKNOWN);
    }
}
