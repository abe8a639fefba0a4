//! Stopping a run for a person's decision, shared by the nodes that do: `escalate` when its
//! rules fire, and `transition` and `promote` when the lifecycle says a move needs an approval.
//!
//! A move with an `approval` stops the run `awaiting_review` with an APPROVAL escalation that
//! names the move; `kavi approve RUN` records each approval and makes the move once the
//! approvals it needs are given.

use serde_json::{Map, Value, json};

use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::node::{NodeConfig, NodeContext, NodeOutcome};
use crate::skills::Lifecycle;
use crate::state::NodeState;

/// Raises an escalation for `skill` with `triggers` (each `{trigger, reason}`) and returns the
/// node's outcome: `awaiting_review`, its outputs with the triggers and the escalation id, and
/// an error saying how to decide. `policy` is the spec hash of the escalation rules in force,
/// which decide whether the account that started the run may approve it.
pub(super) fn stop_for_review(
    ctx: &NodeContext<'_>,
    ledger: &mut Ledger,
    skill: &str,
    triggers: Value,
    policy: Option<&str>,
    mut outputs: Map<String, Value>,
) -> Result<NodeOutcome, String> {
    let id = ledger
        .raise_escalation(skill, ctx.run_id, ctx.node_id, &triggers, policy)
        .map_err(|e| e.to_string())?;
    let names: Vec<String> = triggers
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            format!(
                "{} ({})",
                t["trigger"].as_str().unwrap_or_default(),
                t["reason"].as_str().unwrap_or_default()
            )
        })
        .collect();
    outputs.insert("triggers".into(), triggers);
    outputs.insert("escalation".into(), json!(id));
    let mut outcome = NodeOutcome::succeeded(Value::Object(outputs));
    outcome.state = NodeState::AwaitingReview;
    // A person decides on the run they started, which may be this run's parent.
    let run = ledger.root_run(ctx.run_id).map_err(|e| e.to_string())?.id;
    outcome.error = Some(format!(
        "awaiting review: {}; decide with `kavi approve {run}` or `kavi reject {run}`",
        names.join(", "),
    ));
    Ok(outcome)
}

/// The escalation rules that govern approvals of lifecycle moves (whether the account that
/// started a run may approve it), loaded only when the lifecycle has a move that needs one; and
/// the roles, when a move needs approvals by a role, which must be ones someone can give.
/// Returns their spec hash, which the escalation records.
pub(super) fn approval_rules(
    config: &mut NodeConfig<'_>,
    lifecycle: &Lifecycle,
) -> Result<Option<String>, Diagnostic> {
    if !lifecycle.has_approvals() {
        return Ok(None);
    }
    // Roles govern who may approve, so they are read (and governed) with the lifecycle.
    if lifecycle.has_role_approvals() {
        let source = config.load_policy_source(None, crate::policy::roles::DEFAULT_POLICY)?;
        let roles = crate::policy::roles::Roles::parse(&source)?;
        if let Some(problem) = lifecycle.role_problems(Some(&roles)).into_iter().next() {
            return Err(problem);
        }
    }
    let source = config.load_policy_source(None, super::escalate::DEFAULT_POLICY)?;
    Ok(Some(source.spec_hash().to_owned()))
}

/// Stops the run for a person when the lifecycle says moving `skill` to `to` needs an
/// approval: raises an APPROVAL escalation that names the move and returns the node's
/// `awaiting_review` outcome. `None`: the move needs no approval.
pub(super) fn approval(
    ctx: &NodeContext<'_>,
    ledger: &mut Ledger,
    lifecycle: &Lifecycle,
    skill: &str,
    to: &str,
    policy: Option<&str>,
) -> Result<Option<NodeOutcome>, String> {
    let from = ledger.skill(skill).map_err(|e| e.to_string())?.state;
    if lifecycle.needs_approval(&from, to).is_none() {
        return Ok(None);
    }
    let triggers = approval_triggers(lifecycle, &from, to, None);
    stop_for_approval(ctx, ledger, skill, triggers, policy).map(Some)
}

/// Stops the run for the approval `triggers` ask for (see [`approval_triggers`]).
pub(super) fn stop_for_approval(
    ctx: &NodeContext<'_>,
    ledger: &mut Ledger,
    skill: &str,
    triggers: Value,
    policy: Option<&str>,
) -> Result<NodeOutcome, String> {
    let outputs = Map::from_iter([("skill".to_owned(), json!(skill))]);
    stop_for_review(ctx, ledger, skill, triggers, policy, outputs)
}

/// The triggers of an escalation that asks for the move `from -> to`, with the approvals it
/// requires (`requires`: the role and count, or null for one recorded approval). `source`, the
/// tree a promotion reads the skill from, marks a move on the way to TRUSTED: once it is
/// approved, `kavi approve` walks on from there as `promote` would have.
pub fn approval_triggers(
    lifecycle: &Lifecycle,
    from: &str,
    to: &str,
    source: Option<&str>,
) -> Value {
    let approval = lifecycle.needs_approval(from, to);
    let needs = approval.map_or_else(|| "a recorded approval".to_owned(), ToString::to_string);
    // What the move needs is kept with the stop: an edit of the lifecycle afterwards does not
    // lower the approvals this run waits for.
    let requires = match approval {
        Some(crate::skills::Approval::Roles(requirement)) => json!(requirement),
        _ => Value::Null,
    };
    json!([{
        "trigger": crate::ledger::APPROVAL,
        "reason": format!(
            "the transition {from} -> {to} needs {needs} ({})",
            lifecycle.source.path.display()
        ),
        "from": from,
        "to": to,
        "source": source,
        "requires": requires,
    }])
}
