//! The failure classifier: ordered rules from a policy file decide what kind of failure a
//! failed node run was. Deterministic: the same failure always gets the same kind.
//!
//! The file also declares the failure kinds a workspace knows (`[kinds]`), the vocabulary the
//! other policies share: a rule's `kind` and `failure_kind`, a gate's `failure` and the
//! escalation rules' kind lists are checked against it when a pipeline is checked, so a typo is
//! an error with a location rather than a rule that never fires.

use std::sync::Arc;

use indexmap::IndexMap;
use regex::Regex;
use serde::Deserialize;
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::node::FailureKinds;
use crate::state::NodeState;

/// The failure classifier a `classify` node uses unless it names another.
pub const DEFAULT_POLICY: &str = "policies/classifier.toml";

/// Loads the failure classifier a node's field names (default `policies/classifier.toml`): the
/// rules, and the failure kinds other policies may name. The file then governs the node.
pub fn load(
    config: &mut crate::node::NodeConfig<'_>,
    field: Option<&Spanned<String>>,
) -> Result<Classifier, Diagnostic> {
    let source = config.load_policy_source(field, DEFAULT_POLICY)?;
    let node_kinds: Vec<&str> = config.registry.names().collect();
    Classifier::parse(&source, &node_kinds)
}

/// The default classifier's failure kinds, which `retry.on` names: the registry's
/// [`crate::node::LoadFailureKinds`].
pub fn load_failure_kinds(
    config: &mut crate::node::NodeConfig<'_>,
) -> Result<Box<dyn FailureKinds>, Diagnostic> {
    Ok(Box::new(load(config, None)?))
}

/// The kind when no rule matches.
pub const UNKNOWN: &str = "UNKNOWN";

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawClassifier {
    /// Every failure kind, with what it means.
    kinds: Option<IndexMap<String, String>>,
    #[serde(rename = "rule")]
    rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[schemars(with = "String")]
    kind: Spanned<String>,
    #[schemars(with = "Option<String>")]
    node_kind: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    state: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    failure_kind: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
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
    /// The declared failure kinds, UNKNOWN among them.
    kinds: Vec<String>,
    source: Arc<SourceFile>,
}

/// Checks that `value` is one of `known`, pointing at it in `file` when it is not.
fn one_of(
    value: &Spanned<String>,
    known: &[&str],
    what: &str,
    file: &Arc<SourceFile>,
) -> Result<(), Diagnostic> {
    if known.contains(&value.get_ref().as_str()) {
        return Ok(());
    }
    Err(
        Diagnostic::new(format!("`{}` is not a known {what}", value.get_ref()))
            .at(file, value.span())
            .with_help(format!("known: {}", known.join(", "))),
    )
}

impl Classifier {
    /// Parses the classifier; a rule's `node_kind` must be one of `node_kinds`.
    pub fn parse(source: &Arc<SourceFile>, node_kinds: &[&str]) -> Result<Self, Diagnostic> {
        let raw: RawClassifier =
            toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
        let Some(declared) = raw.kinds else {
            return Err(Diagnostic::new(
                "the classifier must declare its failure kinds in a `[kinds]` table",
            )
            .at(source, 0..0)
            .with_help(
                "add `[kinds]` with one line per kind, such as `TIMEOUT = \"a node ran past its \
                 timeout\"`; rules, gates and escalation rules may name only those",
            ));
        };
        let mut kinds: Vec<String> = declared.into_keys().collect();
        if !kinds.iter().any(|k| k == UNKNOWN) {
            kinds.push(UNKNOWN.to_owned());
        }
        let known_kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
        let states: Vec<&str> = NodeState::ALL.iter().map(|s| s.as_str()).collect();
        let rules = raw
            .rules
            .into_iter()
            .map(|r| {
                one_of(&r.kind, &known_kinds, "failure kind", source)?;
                if let Some(failure_kind) = &r.failure_kind {
                    one_of(failure_kind, &known_kinds, "failure kind", source)?;
                }
                if let Some(node_kind) = &r.node_kind {
                    one_of(node_kind, node_kinds, "node kind", source)?;
                }
                if let Some(state) = &r.state {
                    one_of(state, &states, "node state", source)?;
                }
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
                    kind: r.kind.into_inner(),
                    node_kind: r.node_kind.map(Spanned::into_inner),
                    state: r.state.map(Spanned::into_inner),
                    failure_kind: r.failure_kind.map(Spanned::into_inner),
                    log,
                })
            })
            .collect::<Result<_, Diagnostic>>()?;
        Ok(Self {
            rules,
            kinds,
            source: Arc::clone(source),
        })
    }

    /// Checks a failure kind another policy file names (`file`, where `kind` points) against
    /// the declared kinds.
    pub fn check_kind(
        &self,
        kind: &Spanned<String>,
        file: &Arc<SourceFile>,
    ) -> Result<(), Diagnostic> {
        let known: Vec<&str> = self.kinds.iter().map(String::as_str).collect();
        let what = format!(
            "failure kind (see `[kinds]` in {})",
            self.source.path.display()
        );
        one_of(kind, &known, &what, file)
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

impl FailureKinds for Classifier {
    fn check_kind(&self, kind: &Spanned<String>, file: &Arc<SourceFile>) -> Result<(), Diagnostic> {
        Classifier::check_kind(self, kind, file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node kinds the shipped pipelines run, for the rules to name.
    const NODE_KINDS: &[&str] = &[
        "exec",
        "gate",
        "build",
        "diff_gate",
        "copy_back",
        "pipeline",
    ];

    fn shipped() -> Classifier {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policies/classifier.toml"
        ))
        .unwrap();
        Classifier::parse(
            &SourceFile::new("policies/classifier.toml", text),
            NODE_KINDS,
        )
        .unwrap()
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
        assert_eq!(kind("gate", "failed", Some("TIMEOUT"), ""), "TIMEOUT");
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
        // A test failed on the kernel's refusal: the code under test reached past its view.
        for denial in [
            "E   OSError: [Errno 30] Read-only file system: 'notes.txt'",
            "E   PermissionError: [Errno 1] Operation not permitted",
            "E   PermissionError: [Errno 13] Permission denied: '/proc/1/environ'",
        ] {
            assert_eq!(
                kind("gate", "failed", Some("VERIFY_TEST"), denial),
                "CONFINEMENT_DENIED",
                "{denial}"
            );
        }
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

    fn problem(text: &str) -> crate::diagnostic::Diagnostic {
        Classifier::parse(
            &SourceFile::new("policies/classifier.toml", text),
            NODE_KINDS,
        )
        .unwrap_err()
    }

    #[test]
    fn names_outside_the_declared_vocabularies_are_errors_at_their_place() {
        let kinds = "[kinds]\nTIMEOUT = \"too slow\"\n\n";
        let bogus = problem(&format!("{kinds}[[rule]]\nkind = \"BOGUS\"\n"));
        assert_eq!(bogus.message, "`BOGUS` is not a known failure kind");
        assert_eq!(bogus.position().unwrap(), "policies/classifier.toml:5:8");
        assert_eq!(bogus.help.unwrap(), "known: TIMEOUT, UNKNOWN");

        let matched = problem(&format!(
            "{kinds}[[rule]]\nkind = \"TIMEOUT\"\nfailure_kind = \"VERIFY_TSET\"\n"
        ));
        assert_eq!(matched.position().unwrap(), "policies/classifier.toml:6:16");
        let state = problem(&format!(
            "{kinds}[[rule]]\nkind = \"TIMEOUT\"\nstate = \"timedout\"\n"
        ));
        assert_eq!(state.message, "`timedout` is not a known node state");
        assert!(state.help.unwrap().contains("timed_out"));
        let node_kind = problem(&format!(
            "{kinds}[[rule]]\nkind = \"TIMEOUT\"\nnode_kind = \"biuld\"\n"
        ));
        assert_eq!(node_kind.message, "`biuld` is not a known node kind");
        assert!(node_kind.help.unwrap().contains("build"));

        let undeclared = problem("[[rule]]\nkind = \"TIMEOUT\"\n");
        assert!(undeclared.message.contains("`[kinds]`"), "{undeclared}");
    }

    #[test]
    fn other_policies_are_checked_against_the_declared_kinds() {
        let classifier = shipped();
        let gates = SourceFile::new("policies/gates.toml", "failure = \"VERIFY_TSET\"\n");
        let kind = Spanned::new(10..23, "VERIFY_TSET".to_owned());
        let error = classifier.check_kind(&kind, &gates).unwrap_err();
        assert_eq!(
            error.message,
            "`VERIFY_TSET` is not a known failure kind (see `[kinds]` in policies/classifier.toml)"
        );
        assert_eq!(error.position().unwrap(), "policies/gates.toml:1:11");
        assert!(error.help.unwrap().contains("VERIFY_TEST"));
        let known = Spanned::new(0..1, "VERIFY_TEST".to_owned());
        assert!(classifier.check_kind(&known, &gates).is_ok());
    }
}
