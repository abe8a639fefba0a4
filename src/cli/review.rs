//! `kavi approve RUN` and `kavi reject RUN`: prints what `kavi_governance::review` decided, and
//! resumes an approved run. An approval resumes by default: the stopped run's pipeline runs
//! again, from its file as it is now, with the same parameters, recorded as a new run that names
//! the one it resumed. A run stopped only for a lifecycle move's approvals goes on from the move
//! instead, which the decision makes.

use serde_json::Value;

use kavi_governance::review::{self, Decided, Outcome, Verdict};

use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::ledger::{RunOrigin, RunRow};
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
    let verdict = match decision {
        Decision::Approve { .. } => Verdict::Approve,
        Decision::Reject => Verdict::Reject,
    };
    let review::Review {
        root,
        actor,
        outcome,
    } = review::decide(workspace, run, verdict, comment, &mut |line| {
        outln!("{line}")
    })?;
    let Decided {
        escalations: decided,
        undone: cleaned_up,
        only_moves,
        reached_trust,
    } = match outcome {
        Outcome::NeedsApprovals(missing) => {
            outln!(
                "recorded the approval of run {} by {actor}; it stays awaiting review: {missing}",
                root.id
            );
            return Ok(exit::SUCCESS);
        }
        Outcome::Waiting => return Ok(exit::AWAITING_REVIEW),
        Outcome::Decided(decided) => decided,
    };
    let verdict = if verdict == Verdict::Approve {
        "approved"
    } else {
        "rejected"
    };
    for escalation in &decided {
        let triggers: Vec<&str> = escalation
            .triggers
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["trigger"].as_str())
            .collect();
        outln!(
            "{verdict} run {} for `{}` ({}) by {actor}",
            root.id,
            escalation.skill,
            triggers.join(", "),
        );
    }
    match decision {
        Decision::Approve { resume: true } if only_moves && reached_trust => {
            outln!(
                "the promotion run {} stopped for is complete: nothing is left to resume",
                root.id
            );
            Ok(exit::SUCCESS)
        }
        Decision::Approve { resume: true } if only_moves => {
            outln!(
                "the approved moves are made; run `kavi pipeline run {}` to go on",
                root.spec_path
            );
            Ok(exit::SUCCESS)
        }
        Decision::Reject => {
            for line in &cleaned_up {
                outln!("{line}");
            }
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
            super::progress::note(format_args!(
                "resuming run {} ({})",
                root.id, root.spec_path
            ));
            resume(workspace, &root).await
        }
    }
}

/// Runs an approved run's pipeline again, from its file as it is now, with the same parameters,
/// recorded as a new run that names the one it resumes: `kavi approve` and the review page.
pub(super) async fn resume(workspace: &Workspace, root: &RunRow) -> Result<i32, Error> {
    let sets = param_sets(&root.params);
    let path = workspace.root.join(&root.spec_path);
    super::pipeline::run(
        workspace,
        &path.to_string_lossy(),
        &sets,
        kavi_cli::RunOptions::default(),
        RunOrigin::Resume { of: root.id }.into(),
        None,
    )
    .await
}

/// A run's recorded parameters as `--set` pairs: strings as they are, other values as JSON
/// (which each parameter type parses back).
pub(super) fn param_sets(params: &Value) -> Vec<(String, String)> {
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
