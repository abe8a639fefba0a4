//! `kavi drill isolation`: the attack corpus, run against the workspace's own policies; `kavi
//! drill gates`: the neutralisation attempts, run against its gate set.

use serde::Serialize;

use super::output::table;
use crate::config::Workspace;
use crate::drill::{self, Role, Verdict};
use crate::error::{Error, exit};
use crate::template::TemplateEngine;

pub async fn isolation(
    workspace: &Workspace,
    role: Option<&str>,
    json: bool,
) -> Result<i32, Error> {
    let templates = TemplateEngine::new(&workspace.templates_dir());
    // The drill shows what the files on disk would allow, a weakening nobody adopted included.
    let policy = super::read_confinement(&templates, |path| {
        let on_disk = workspace.root.join(path).is_file();
        on_disk
            .then(|| super::read_policy(workspace, path))
            .transpose()
    })?;
    let only = role.map(|role| match role {
        "builder" => Role::Builder,
        "gate" => Role::Gate,
        _ => Role::Skill,
    });
    let outcomes = drill::isolation(&workspace.root, &policy, &templates, only)
        .await
        .map_err(|e| Error::Unusable(e.to_string()))?;
    let rows = outcomes.iter().map(|o| {
        vec![
            match o.verdict {
                Verdict::Refused => "refused",
                Verdict::Allowed => "ALLOWED",
                Verdict::NotRun => "NOT RUN",
            }
            .to_owned(),
            o.role.name().to_owned(),
            o.what.to_owned(),
            o.mechanism.clone(),
        ]
    });
    let refused = outcomes
        .iter()
        .filter(|o| o.verdict == Verdict::Refused)
        .count();
    Ok(report(
        &outcomes,
        ["verdict", "role", "attack", "refused by / what happened"],
        rows,
        refused,
        (
            "attacks refused",
            "the others were allowed or could not run",
        ),
        json,
    ))
}

pub async fn gates(workspace: &Workspace, case: Option<&str>, json: bool) -> Result<i32, Error> {
    let outcomes = drill::gates::run(workspace, case)
        .await
        .map_err(|e| Error::Unusable(e.to_string()))?;
    let rows = outcomes.iter().map(|o| {
        vec![
            match o.verdict {
                drill::gates::Verdict::Caught => "caught",
                drill::gates::Verdict::Missed => "MISSED",
                drill::gates::Verdict::NotRun => "NOT RUN",
            }
            .to_owned(),
            o.targets.join(", "),
            o.what.to_owned(),
            o.detail.clone(),
        ]
    });
    let caught = outcomes
        .iter()
        .filter(|o| o.verdict == drill::gates::Verdict::Caught)
        .count();
    Ok(report(
        &outcomes,
        ["verdict", "gate", "attempt", "caught by / what happened"],
        rows,
        caught,
        ("attempts caught", "the others were missed or could not run"),
        json,
    ))
}

/// Prints a drill's outcomes, as JSON or as a table with a count of the `good` ones, and
/// returns the exit code: success only when every outcome is good.
fn report<T: Serialize>(
    outcomes: &[T],
    header: [&str; 4],
    rows: impl Iterator<Item = Vec<String>>,
    good: usize,
    (counted, others): (&str, &str),
    json: bool,
) -> i32 {
    let passed = good == outcomes.len();
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(outcomes).unwrap_or_default()
        );
    } else {
        let mut table_rows = vec![header.map(str::to_owned).to_vec()];
        table_rows.extend(rows);
        outln!("{}", table(&table_rows));
        outln!(
            "{good} of {} {counted}{}",
            outcomes.len(),
            if passed {
                String::new()
            } else {
                format!("; {others}")
            }
        );
    }
    if passed {
        exit::SUCCESS
    } else {
        exit::RUN_FAILED
    }
}
