//! `classify`: name what kind of failure the first failed node was, and write a research note.
//!
//! Run it as a failure handler (`trigger = "failure"`) after the steps it watches, listed in
//! `from`. The first of them that did not succeed is the failure; blocked nodes are passed over,
//! since they only report someone else's failure. Ordered rules from a policy (default
//! `policies/classifier.toml`) decide the kind. The RESEARCH_NOTE artifact holds the kind, the
//! facts (failing gates, offending paths, first error lines) and a bounded excerpt of the log.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};
use toml::Spanned;

use super::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::policy::classifier::{Classifier, Failure};

pub const KIND: NodeKind = NodeKind {
    name: "classify",
    parse,
};

pub const DEFAULT_POLICY: &str = "policies/classifier.toml";

/// How much log text a research note keeps.
const EXCERPT_CHARS: usize = 4000;
/// How many error lines the facts list.
const ERROR_LINES: usize = 10;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassifyConfig {
    /// The nodes to look at, in order; each must be upstream.
    from: Vec<Spanned<String>>,
    rules: Option<Spanned<String>>,
    /// The skill the note is about, recorded in it.
    skill: Option<Spanned<String>>,
}

#[derive(Debug)]
struct Classify {
    from: Vec<String>,
    skill: Option<String>,
    classifier: Classifier,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: ClassifyConfig = config.deserialize()?;
    if raw.from.is_empty() {
        return Err(config.error(
            "`from` needs at least one node to look at",
            config.span.clone(),
        ));
    }
    // Reading a node is what makes its state and outputs part of this node's context, and the
    // DAG check then insists it is upstream.
    for id in &raw.from {
        config
            .reads
            .push((format!("nodes.{}", id.get_ref()), id.span()));
    }
    if let Some(skill) = &raw.skill {
        config.check_template(skill)?;
    }
    let source = config.load_policy_source(raw.rules.as_ref(), DEFAULT_POLICY)?;
    Ok(Arc::new(Classify {
        from: raw.from.into_iter().map(Spanned::into_inner).collect(),
        skill: raw.skill.map(Spanned::into_inner),
        classifier: Classifier::parse(&source)?,
    }))
}

/// Everything a failed node said, as one text: its error, its output, its gates' details and
/// its log artifact.
fn failure_text(ctx: &NodeContext<'_>, entry: &Value) -> String {
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
    if let Some(log) = outputs["log"].as_str()
        && let Ok(text) = std::fs::read_to_string(ctx.env.artifacts.path_of_sha256(log))
    {
        parts.push(text);
    }
    parts.join("\n")
}

impl Classify {
    fn classify(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let nodes = serde_json::to_value(ctx.vars.get_attr("nodes").map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let quiet = ["succeeded", "skipped", "blocked", "cached"];
        let (id, entry) = self
            .from
            .iter()
            .map(|id| (id, &nodes[id]))
            .find(|(_, entry)| entry["state"].as_str().is_some_and(|s| !quiet.contains(&s)))
            .ok_or_else(|| {
                format!(
                    "none of {} failed; there is nothing to classify",
                    self.from.join(", ")
                )
            })?;
        let text = failure_text(ctx, entry);
        let outputs = &entry["outputs"];
        let failure = Failure {
            node_kind: entry["kind"].as_str().unwrap_or_default(),
            state: entry["state"].as_str().unwrap_or_default(),
            failure_kind: outputs["failure_kind"].as_str(),
            text: &text,
        };
        let kind = self.classifier.classify(&failure);

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
            "node": id,
            "node_kind": failure.node_kind,
            "state": failure.state,
            "failing_gates": failing_gates,
            "paths": paths,
            "error_lines": error_lines,
        });
        let skill = self
            .skill
            .as_ref()
            .map(|s| ctx.render("skill", s))
            .transpose()?;
        let excerpt: String = text.chars().take(EXCERPT_CHARS).collect();
        let note = json!({
            "skill": skill,
            "run": ctx.run_id,
            "kind": kind,
            "facts": facts,
            "excerpt": excerpt,
            "excerpt_truncated": text.chars().count() > EXCERPT_CHARS,
        });
        let artifact = ctx
            .env
            .artifacts
            .put_bytes(
                "RESEARCH_NOTE",
                serde_json::to_string_pretty(&note)
                    .expect("note serializes")
                    .as_bytes(),
            )
            .map_err(|e| format!("failed to store the research note: {e}"))?;
        // The attempt's build (if one ran) carries the analysis to the next attempt's packet.
        let build_id = self
            .from
            .iter()
            .find_map(|id| nodes[id]["outputs"]["build_id"].as_i64());
        if let Some(build_id) = build_id {
            Ledger::open(&ctx.env.ledger)
                .and_then(|mut ledger| ledger.record_research(build_id, &kind, &artifact))
                .map_err(|e| format!("failed to record the research note: {e}"))?;
        }
        let mut outcome = NodeOutcome::succeeded(json!({
            "build_id": build_id,
            "kind": kind,
            "facts": facts,
            "note": artifact.sha256,
            "note_path": ctx.env.artifacts.path_of(&artifact),
        }));
        outcome.artifacts.push(("note", artifact));
        Ok(outcome)
    }
}

#[async_trait::async_trait]
impl NodeAction for Classify {
    fn describe(&self) -> String {
        format!("classify the first failure among {}", self.from.join(", "))
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.classify(ctx).unwrap_or_else(NodeOutcome::failed)
    }
}
