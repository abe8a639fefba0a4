//! `kavi approve RUN` and `kavi reject RUN`: a person's decision on a run that stopped for review.

use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::ledger::Ledger;

pub fn decide(
    workspace: &Workspace,
    run: &str,
    approve: bool,
    comment: Option<&str>,
) -> Result<i32, Error> {
    let mut ledger = Ledger::open(&workspace.config.ledger)?;
    let run_id = ledger.resolve_run(run)?;
    let actor = crate::skills::actor();
    let decided = ledger.decide_escalations(run_id, approve, &actor, comment)?;
    for escalation in &decided {
        let triggers: Vec<&str> = escalation
            .triggers
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["trigger"].as_str())
            .collect();
        if approve {
            outln!(
                "approved run {run_id} for `{}` ({}) by {actor}: the next forge run builds the next attempt",
                escalation.skill,
                triggers.join(", ")
            );
        } else {
            outln!(
                "rejected run {run_id} for `{}` ({}) by {actor}: `{}` is not built again",
                escalation.skill,
                triggers.join(", "),
                escalation.skill
            );
        }
    }
    Ok(exit::SUCCESS)
}
