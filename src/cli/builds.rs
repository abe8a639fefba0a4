//! `kavi builds list SKILL`: a skill's build attempts and their lineage.

use super::output::{short_hash, table};
use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::ledger::Ledger;

pub fn list(workspace: &Workspace, skill: &str, json: bool) -> Result<i32, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    ledger.skill(skill)?;
    let builds = ledger.builds(skill)?;
    if json {
        super::print_json(&builds);
        return Ok(exit::SUCCESS);
    }
    if builds.is_empty() {
        outln!("`{skill}` has no builds yet");
        return Ok(exit::SUCCESS);
    }
    let mut rows = vec![
        [
            "BUILD", "ATTEMPT", "AFTER", "RUN", "BUILDER", "FAILURE", "PACKET", "NOTE", "ADVISORY",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for b in &builds {
        rows.push(vec![
            b.id.to_string(),
            b.attempt.to_string(),
            b.parent_build.map_or_else(|| "-".into(), |p| p.to_string()),
            b.run_id.map_or_else(|| "-".into(), |r| r.to_string()),
            b.status.clone(),
            b.failure_kind.clone().unwrap_or_else(|| "-".into()),
            b.packet.as_deref().map_or_else(|| "-".into(), short_hash),
            b.research_note
                .as_deref()
                .map_or_else(|| "-".into(), short_hash),
            match (&b.advisory, &b.advisory_error) {
                (Some(sha), _) => short_hash(sha),
                (None, Some(_)) => "unavailable".into(),
                (None, None) => "-".into(),
            },
        ]);
    }
    out!("{}", table(&rows));
    Ok(exit::SUCCESS)
}
