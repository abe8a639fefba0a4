//! `kavi explain RUN NODE`: why a node of a recorded run ran, was skipped, blocked, cancelled,
//! reused or cached, from what the ledger holds: the node's attempts, the spec text the run kept
//! (its `needs` and `when`), what its dependencies did, and for a node that declares its inputs,
//! its key against the one recorded the time before (which input, parameter or policy changed).

use serde_json::{Value, json};

use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::ledger::{Ledger, NodeRunRow, final_attempts};
use crate::state::NodeState;

pub fn run(workspace: &Workspace, reference: &str, node: &str, json: bool) -> Result<i32, Error> {
    let Explanation { pipeline, report } = explanation(workspace, reference, node)?;
    if json {
        super::print_json(&report);
        return Ok(exit::SUCCESS);
    }
    outln!(
        "node `{node}` of run {} ({pipeline}): {}",
        report["run"],
        report["state"].as_str().unwrap_or_default()
    );
    outln!("  {}", report["because"].as_str().unwrap_or_default());
    for need in report["needs"].as_array().into_iter().flatten() {
        let state = need["state"].as_str().unwrap_or("not recorded");
        outln!(
            "  needs `{}`: {state}",
            need["node"].as_str().unwrap_or_default()
        );
    }
    let cache = &report["cache"];
    if let Some(summary) = cache["summary"].as_str() {
        outln!("  cache: {summary}");
    }
    for change in cache["changed"].as_array().into_iter().flatten() {
        outln!("    {}", change.as_str().unwrap_or_default());
    }
    Ok(exit::SUCCESS)
}

/// Why a node ran or did not, as `kavi explain --json` prints it, with its run's pipeline.
pub(super) struct Explanation {
    pub pipeline: String,
    pub report: Value,
}

pub(super) fn explanation(
    workspace: &Workspace,
    reference: &str,
    node: &str,
) -> Result<Explanation, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let detail = ledger.run_detail(ledger.resolve_run(reference)?)?;
    let run = &detail.run;
    let attempts: Vec<&NodeRunRow> = detail.nodes.iter().filter(|n| n.node_id == node).collect();
    let Some(last) = attempts.last() else {
        let known: Vec<&str> = final_attempts(&detail.nodes)
            .iter()
            .map(|n| n.node_id.as_str())
            .collect();
        return Err(Error::NotFound(format!(
            "run {} has no node `{node}`; {}",
            run.id,
            crate::diagnostic::suggest(node, &known)
        )));
    };
    // The spec the run kept says what the node needs and when it runs.
    let (_, spec) = ledger.spec_text(&run.spec_hash)?;
    let declared: Value = toml::from_str::<Value>(&spec).unwrap_or_default()["nodes"][node].clone();
    let when = declared["when"].as_str();
    let needs: Vec<(String, Option<NodeState>)> = declared["needs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|dep| {
            let state = final_attempts(&detail.nodes)
                .iter()
                .find(|n| n.node_id == dep)
                .map(|n| n.state);
            (dep.to_owned(), state)
        })
        .collect();
    let because = match last.state {
        // The run it resumes succeeded at it, or reused it in turn from the one before.
        NodeState::Reused => format!(
            "it was not run: it took the outputs of node run {} of run {}, which this run \
             resumes, as did everything it needs",
            last.reused_from.unwrap_or_default(),
            run.resumed_from
                .map_or_else(|| "?".to_owned(), |r| r.to_string()),
        ),
        NodeState::Cached => format!(
            "it was not run: {}",
            last.reason
                .as_deref()
                .unwrap_or("an earlier result was taken")
        ),
        NodeState::Skipped | NodeState::Blocked | NodeState::Cancelled => format!(
            "it did not run: {}",
            last.reason
                .as_deref()
                .or(last.error.as_deref())
                .unwrap_or("no reason recorded")
        ),
        NodeState::Pending | NodeState::Running => "it has not finished".to_owned(),
        _ => {
            // A failure handler ran because what it needs failed, which then did not block it.
            let failed = needs.iter().find(|(_, state)| {
                state.is_some_and(|s| !s.is_success() && s != NodeState::Skipped)
            });
            let mut text = match (declared["trigger"].as_str(), failed) {
                (Some("failure"), Some((dep, _))) => {
                    format!("it ran: `{dep}` failed, and it runs only on failure")
                }
                _ if needs.is_empty() => "it ran: it needs nothing".to_owned(),
                _ => "it ran: what it needs finished without blocking it".to_owned(),
            };
            text.push_str(&match when {
                Some(when) => format!(", and `when` ({when}) was true"),
                None => ", and it has no `when`".to_owned(),
            });
            if attempts.len() > 1 {
                text.push_str(&format!("; {} attempts", attempts.len()));
            }
            if let Some(error) = &last.error {
                text.push_str(&format!("; it ended: {error}"));
            }
            text
        }
    };
    let cache = cache_explanation(&ledger, &run.pipeline, last, &declared)?;
    let report = json!({
        "run": run.id,
        "node": node,
        "state": last.state,
        "attempts": attempts.len(),
        "needs": needs.iter().map(|(dep, state)| json!({ "node": dep, "state": state })).collect::<Vec<_>>(),
        "when": when,
        "reused_from": last.reused_from,
        "because": because,
        "cache": cache,
    });
    Ok(Explanation {
        pipeline: run.pipeline.clone(),
        report,
    })
}

/// What the node's key says: why an earlier result was or was not taken, and which parts of the
/// key differ from the one its previous run recorded.
fn cache_explanation(
    ledger: &Ledger,
    pipeline: &str,
    last: &NodeRunRow,
    declared: &Value,
) -> Result<Value, Error> {
    let Some(recorded) = ledger.recorded_key(last.id)? else {
        let summary = if declared.get("inputs").is_none() {
            "it declares no `inputs`, so it is never cached"
        } else {
            "no key was recorded: it did not become ready to run"
        };
        return Ok(json!({ "summary": summary }));
    };
    if last.state == NodeState::Cached {
        let source = recorded.source.unwrap_or_default();
        return Ok(json!({
            "key": recorded.key,
            "summary": format!("its key is the one node run {source} recorded"),
            "source": source,
        }));
    }
    let note = recorded.note.as_deref().unwrap_or("it ran");
    let Some(previous) = ledger.previous_key(pipeline, &last.node_id, last.id)? else {
        return Ok(json!({
            "key": recorded.key,
            "summary": format!("{note}; no earlier run of it recorded a key"),
        }));
    };
    let changed = crate::cache::differences(&previous.parts, &recorded.parts);
    let against = format!(
        "node run {} of run {}",
        previous.node_run_id, previous.run_id
    );
    let summary = if changed.is_empty() {
        format!("{note}; its key is the one {against} recorded")
    } else {
        format!("{note}; against {against}:")
    };
    Ok(json!({
        "key": recorded.key,
        "summary": summary,
        "compared_with": { "run": previous.run_id, "node_run": previous.node_run_id },
        "changed": changed,
    }))
}
