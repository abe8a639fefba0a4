//! `kavi runs resume RUN`: run a pipeline again after a failure, taking the outputs of the nodes
//! that succeeded from the run it resumes, and running only the rest.

use std::collections::{HashMap, HashSet};

use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::executor::{Reused, RunStart};
use crate::ledger::{Ledger, RunOrigin};
use crate::state::{NodeState, RunStatus};
use kavi_cli::RunOptions;

pub async fn run(
    workspace: &Workspace,
    reference: &str,
    allow_changed: bool,
    options: RunOptions,
) -> Result<i32, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let id = ledger.resolve_run(reference)?;
    let detail = ledger.run_detail(id)?;
    let old = &detail.run;
    if let Some(parent) = old.parent_run {
        return Err(Error::Usage(format!(
            "run {id} is a child run of run {parent}: resume that one (`kavi runs resume {parent}`)"
        )));
    }
    match old.status {
        RunStatus::Succeeded | RunStatus::Approved => {
            outln!("run {id} {}: nothing to resume", old.status);
            return Ok(exit::SUCCESS);
        }
        RunStatus::Running => {
            return Err(Error::Usage(format!("run {id} is still running")));
        }
        RunStatus::AwaitingReview => {
            return Err(Error::Usage(format!(
                "run {id} waits for a person: decide with `kavi approve {id}` or `kavi reject {id}`"
            )));
        }
        RunStatus::Failed | RunStatus::Cancelled | RunStatus::Interrupted | RunStatus::Rejected => {
        }
    }
    // What ran then was governed by the files then; outputs made under other rules are not
    // reused unless the user says they may be.
    let changed = super::policy::changed_since(workspace, &ledger, id)?;
    if !changed.is_empty() && !allow_changed {
        return Err(Error::Usage(format!(
            "the files that govern run {id} changed since it ran:\n  {}\nits outputs were made \
             under the old ones; `kavi policy diff {id}` shows the change, and `--allow-changed` \
             resumes anyway",
            changed.join("\n  ")
        )));
    }
    let reuse: HashMap<String, Reused> = crate::ledger::final_attempts(&detail.nodes)
        .into_iter()
        .filter(|node| matches!(node.state, NodeState::Succeeded | NodeState::Reused))
        .map(|node| {
            (
                node.node_id.clone(),
                Reused {
                    node_run_id: node.id,
                    run_id: id,
                    outputs: node.outputs.clone().unwrap_or_default(),
                },
            )
        })
        .collect();
    let again: HashSet<&str> = detail
        .nodes
        .iter()
        .map(|node| node.node_id.as_str())
        .filter(|node| !reuse.contains_key(*node))
        .collect();
    outln!(
        "resuming run {id} ({}): {} of its nodes succeeded and are reused, {} run again",
        old.spec_path,
        reuse.len(),
        again.len()
    );
    let sets = super::review::param_sets(&old.params);
    let path = workspace.root.join(&old.spec_path);
    drop(ledger);
    super::pipeline::run(
        workspace,
        &path.to_string_lossy(),
        &sets,
        options,
        RunStart {
            origin: RunOrigin::Resume { of: id },
            reuse,
        },
        None,
    )
    .await
}
