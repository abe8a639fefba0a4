//! `kavi drill isolation`: the attack corpus, run against the workspace's own policies.

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
    let policy = super::read_confinement(workspace, &templates)?;
    let only = role.map(|role| match role {
        "builder" => Role::Builder,
        "gate" => Role::Gate,
        _ => Role::Skill,
    });
    let outcomes = drill::isolation(&workspace.root, &policy, &templates, only)
        .await
        .map_err(|e| Error::Unusable(e.to_string()))?;
    let passed = outcomes.iter().all(|o| o.verdict == Verdict::Refused);
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&outcomes).unwrap_or_default()
        );
    } else {
        let mut rows = vec![vec![
            "verdict".to_owned(),
            "role".to_owned(),
            "attack".to_owned(),
            "refused by / what happened".to_owned(),
        ]];
        rows.extend(outcomes.iter().map(|o| {
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
        }));
        outln!("{}", table(&rows));
        let refused = outcomes
            .iter()
            .filter(|o| o.verdict == Verdict::Refused)
            .count();
        outln!(
            "{refused} of {} attacks refused{}",
            outcomes.len(),
            if passed {
                ""
            } else {
                "; the others were allowed or could not run"
            }
        );
    }
    Ok(if passed {
        exit::SUCCESS
    } else {
        exit::RUN_FAILED
    })
}
