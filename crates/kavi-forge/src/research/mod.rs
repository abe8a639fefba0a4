//! Research on a failed attempt: name its failure kind and write a RESEARCH_NOTE, and (in
//! [`advisory`]) ask an LLM gateway for a revised packet. The `classify` and `advise` node kinds
//! and `kavi research BUILD_ID` share this code, so a note made by hand reads like one the forge
//! made.

pub mod advisory;
pub mod gateway;

use serde_json::{Value, json};

use crate::ledger::{Artifact, ArtifactStore};
use crate::policy::classifier::{Classifier, Failure};

/// How much log text a research note keeps.
const EXCERPT_CHARS: usize = 4000;
/// How many error lines the facts list.
const ERROR_LINES: usize = 10;

/// A step that may have failed: its node id and what a template sees of it (`kind`, `state`,
/// `error`, `outputs`).
pub struct Step<'a> {
    pub id: &'a str,
    pub entry: &'a Value,
}

/// Why no research note was made.
#[derive(Debug, thiserror::Error)]
pub enum ResearchError {
    /// Every step succeeded, was skipped or was blocked.
    #[error("none of {} failed; there is nothing to classify", .0.join(", "))]
    NothingFailed(Vec<String>),
    #[error("failed to store the research note: {0}")]
    Store(std::io::Error),
}

/// A classified failure and its stored note.
pub struct Research {
    /// The node that failed.
    pub node: String,
    pub kind: String,
    pub facts: Value,
    pub note: Artifact,
    /// The build among the steps, if one ran: the note belongs to it.
    pub build_id: Option<i64>,
}

/// Everything a failed step said, as one text: its error, its output, its gates' details and
/// its log artifact.
fn failure_text(artifacts: &ArtifactStore, entry: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    let outputs = &entry["outputs"];
    for text in [&entry["error"], &outputs["stderr"], &outputs["stdout"]] {
        if let Some(text) = text.as_str().filter(|t| !t.is_empty()) {
            parts.push(text.to_owned());
        }
    }
    for gate in outputs["gates"].as_array().into_iter().flatten() {
        if let Some(detail) = gate["detail"].as_str() {
            parts.push(format!(
                "[{}] {detail}",
                gate["gate"].as_str().unwrap_or_default()
            ));
        }
    }
    if let Some(log) = outputs["log"].as_str() {
        // An unreadable or altered log is named where the log would be, not passed over.
        parts.push(artifacts.read_text(log).unwrap_or_else(|e| e));
    }
    parts.join("\n")
}

/// Finds the first step that did not succeed (blocked steps are passed over: they only report
/// another step's failure), classifies it and stores a RESEARCH_NOTE.
pub fn research(
    classifier: &Classifier,
    artifacts: &ArtifactStore,
    steps: &[Step<'_>],
    skill: Option<&str>,
    run_id: i64,
) -> Result<Research, ResearchError> {
    let quiet = ["succeeded", "skipped", "blocked", "cached", "pending"];
    let failed = steps
        .iter()
        .find(|step| {
            step.entry["state"]
                .as_str()
                .is_some_and(|s| !quiet.contains(&s))
        })
        .ok_or_else(|| {
            ResearchError::NothingFailed(steps.iter().map(|s| s.id.to_owned()).collect())
        })?;
    let entry = failed.entry;
    let text = failure_text(artifacts, entry);
    let outputs = &entry["outputs"];
    let failure = Failure {
        node_kind: entry["kind"].as_str().unwrap_or_default(),
        state: entry["state"].as_str().unwrap_or_default(),
        failure_kind: outputs["failure_kind"].as_str(),
        text: &text,
    };
    let kind = classifier.classify(&failure);

    let failing_gates: Vec<&Value> = outputs["gates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["status"] != "passed")
        .collect();
    let paths: Vec<&Value> = ["violations", "missing_required"]
        .iter()
        .flat_map(|field| outputs[*field].as_array().into_iter().flatten())
        .collect();
    let error_lines: Vec<&str> = entry["error"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .take(ERROR_LINES)
        .collect();
    let facts = json!({
        "node": failed.id,
        "node_kind": failure.node_kind,
        "state": failure.state,
        "failing_gates": failing_gates,
        "paths": paths,
        "error_lines": error_lines,
    });
    let excerpt: String = text.chars().take(EXCERPT_CHARS).collect();
    let note = json!({
        "skill": skill,
        "run": run_id,
        "kind": kind,
        "facts": facts,
        "excerpt": excerpt,
        "excerpt_truncated": text.chars().count() > EXCERPT_CHARS,
    });
    let artifact = artifacts
        .put_bytes(
            "RESEARCH_NOTE",
            serde_json::to_string_pretty(&note)
                .expect("note serializes")
                .as_bytes(),
        )
        .map_err(ResearchError::Store)?;
    let build_id = steps
        .iter()
        .find_map(|step| step.entry["outputs"]["build_id"].as_i64());
    Ok(Research {
        node: failed.id.to_owned(),
        kind,
        facts,
        note: artifact,
        build_id,
    })
}
