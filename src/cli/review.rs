//! `kavi approve RUN` and `kavi reject RUN`: a person's decision on a run that stopped for review.
//!
//! The decision covers the run a user started and every child run under it (a forge attempt
//! escalates in its own child run), so either id may be given. An approval resumes by default:
//! the stopped run's pipeline runs again, from its file as it is now, with the same parameters,
//! recorded as a new run that names the one it resumed.

use serde_json::Value;

use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::ledger::{Ledger, RunOrigin};
use crate::state::RunStatus;

#[derive(Debug, Clone, Copy)]
pub enum Decision {
    Approve { resume: bool },
    Reject,
}

pub async fn decide(
    workspace: &Workspace,
    run: &str,
    decision: Decision,
    comment: Option<&str>,
) -> Result<i32, Error> {
    let mut ledger = Ledger::open(&workspace.config.ledger)?;
    let root = ledger.root_run(ledger.resolve_run(run)?)?;
    let actor = crate::identity::actor();
    let approve = matches!(decision, Decision::Approve { .. });
    if approve && root.started_by.as_deref() == Some(actor.as_str()) {
        refuse_self_approval(&ledger, root.id, &actor)?;
    }
    let decided = ledger.decide_escalations(root.id, approve, &actor, comment)?;
    for escalation in &decided {
        let triggers: Vec<&str> = escalation
            .triggers
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["trigger"].as_str())
            .collect();
        let verdict = if approve { "approved" } else { "rejected" };
        outln!(
            "{verdict} run {} for `{}` ({}) by {actor}",
            root.id,
            escalation.skill,
            triggers.join(", "),
        );
    }
    match decision {
        Decision::Reject => {
            for escalation in &decided {
                outln!("`{}` is not built again", escalation.skill);
            }
            Ok(exit::SUCCESS)
        }
        Decision::Approve { resume: false } => {
            outln!(
                "not resumed; run `kavi pipeline run {}` to go on",
                root.spec_path
            );
            Ok(exit::SUCCESS)
        }
        Decision::Approve { resume: true } => {
            if root.status != RunStatus::AwaitingReview {
                outln!("run {} is {}: nothing to resume", root.id, root.status);
                return Ok(exit::SUCCESS);
            }
            drop(ledger);
            outln!("resuming run {} ({})", root.id, root.spec_path);
            let sets = param_sets(&root.params);
            let path = workspace.root.join(&root.spec_path);
            super::pipeline::run(
                workspace,
                &path.to_string_lossy(),
                &sets,
                false,
                RunOrigin::Resume { of: root.id },
            )
            .await
        }
    }
}

/// A run's recorded parameters as `--set` pairs: strings as they are, other values as JSON
/// (which each parameter type parses back).
/// Refuses an approval by the account that started the run when the escalation rules that
/// stopped it (as the ledger kept them, not as the workspace has them now) say so.
fn refuse_self_approval(ledger: &Ledger, run: i64, actor: &str) -> Result<(), Error> {
    for escalation in ledger.pending_escalations(run)? {
        let Some(policy) = &escalation.policy else {
            continue;
        };
        let (_, text) = ledger.spec_text(policy)?;
        let rules = crate::diagnostic::SourceFile::new("escalation rules", text);
        let allowed =
            crate::nodes::escalate::self_approval_allowed(&rules).map_err(Error::Usage)?;
        if !allowed {
            return Err(Error::Usage(format!(
                "{actor} started run {run}, and its escalation rules ({}) forbid approving a run \
                 by the account that started it (`self_approval = false`): another account must \
                 approve it",
                crate::ledger::short_hash(policy)
            )));
        }
    }
    Ok(())
}

fn param_sets(params: &Value) -> Vec<(String, String)> {
    params
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, value)| {
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (name.clone(), text)
        })
        .collect()
}
