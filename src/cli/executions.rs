//! `kavi executions tail`, `kavi replay` and `kavi session`: reading and re-running the records
//! that skill runs leave.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::output::{duration_ms, one_line, table};
use super::skills::{SkillEnv, report, require_confirmation};
use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::executions::{Lineage, Refusal, log};
use crate::ledger::{ExecutionRecord, Ledger};

/// The first eight characters of an id, for tables and trees.
fn short_id(id: &str) -> &str {
    &id[..id.len().min(8)]
}

fn mark(record: &ExecutionRecord) -> &'static str {
    if record.success { "ok" } else { "FAIL" }
}

/// Which records `tail` shows.
pub struct TailFilter<'a> {
    pub count: usize,
    pub only_failures: bool,
    pub skill: Option<&'a str>,
}

/// The newest records of the JSONL log. Malformed lines are skipped, and counted on stderr.
pub fn tail(workspace: &Workspace, filter: &TailFilter<'_>, json: bool) -> Result<i32, Error> {
    let path = &workspace.config.executions_log;
    let contents = log::read(path).map_err(|source| Error::Io {
        context: format!("failed to read {}", path.display()),
        source,
    })?;
    if contents.skipped > 0 {
        let shown = path.strip_prefix(&workspace.root).unwrap_or(path);
        errln!(
            "skipped {} malformed line{} in {}",
            contents.skipped,
            if contents.skipped == 1 { "" } else { "s" },
            shown.display()
        );
    }
    let selected: Vec<&ExecutionRecord> = contents
        .records
        .iter()
        .filter(|r| !filter.only_failures || !r.success)
        .filter(|r| filter.skill.is_none_or(|s| r.skill == s))
        .collect();
    let shown = &selected[selected.len().saturating_sub(filter.count)..];
    if json {
        super::print_json(shown);
        return Ok(exit::SUCCESS);
    }
    if shown.is_empty() {
        outln!("no executions recorded");
        return Ok(exit::SUCCESS);
    }
    // Who asked (an MCP client) is a column only when someone other than a kavi command did.
    let callers = shown.iter().any(|r| r.caller.is_some());
    let mut header = vec!["", "EXECUTION", "SKILL", "STARTED", "DURATION"];
    header.extend(callers.then_some("CALLER"));
    header.push("ERROR");
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for record in shown {
        let mut row = vec![
            mark(record).to_owned(),
            short_id(&record.execution_id).to_owned(),
            record.skill.clone(),
            record.started_at.clone(),
            duration_ms(record.duration_ms),
        ];
        if callers {
            row.push(record.caller.clone().unwrap_or_default());
        }
        row.push(record.error.as_deref().map(one_line).unwrap_or_default());
        rows.push(row);
    }
    out!("{}", table(&rows));
    Ok(exit::SUCCESS)
}

/// Runs a recorded execution again with the same input, after three checks: the record exists,
/// the skill is still TRUSTED, and its files hash to the hash recorded then. The new record's
/// parent is the original.
pub async fn replay(
    workspace: &Workspace,
    id: &str,
    yes: bool,
    no_log: bool,
) -> Result<i32, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let original = match id {
        "latest" => ledger.latest_execution()?.ok_or_else(|| {
            Error::NotFound("no executions recorded yet; nothing to replay".into())
        })?,
        id => ledger.execution(id)?,
    };
    let id = original.execution_id.as_str();
    let refused = |check: &str, detail: String| {
        Error::Usage(format!(
            "replay of {id} refused: the {check} check failed: {detail}"
        ))
    };
    let env = SkillEnv::load(workspace)?;
    let runner = env.runner(workspace, !no_log);
    let ready = runner
        .ready(&original.skill)
        .map_err(|refusal| match refusal {
            Refusal::Trust(detail) => refused("trust", detail),
            Refusal::Hash(detail) => refused("hash", detail),
            other => Error::from(other),
        })?;
    match &original.source_hash {
        Some(then) if *then == ready.hash => {}
        Some(then) => {
            return Err(refused(
                "hash",
                format!(
                    "`{}` ran at {} then and is trusted at {} now; run it anew with `kavi skill run`",
                    original.skill,
                    crate::hash::short_hash(then),
                    crate::hash::short_hash(&ready.hash)
                ),
            ));
        }
        None => {
            return Err(refused(
                "hash",
                "the original never reached its skill, so no hash was recorded".to_owned(),
            ));
        }
    }
    let input = original.input.clone().ok_or_else(|| {
        Error::Usage(format!("replay of {id} refused: the record holds no input"))
    })?;
    require_confirmation(&original.skill, ready.proposal.side_effect, yes)?;
    let lineage = Lineage {
        parent: Some(original.execution_id.clone()),
        ..Lineage::default()
    };
    let cancel = super::cancel_on_signals("the skill");
    let record = runner.run(&ready, input, &lineage, &cancel).await?;
    Ok(report(&record, &cancel))
}

/// Which execution's tree `session` shows.
pub enum SessionOf<'a> {
    Execution(&'a str),
    Latest,
}

/// The tree an execution belongs to: from its root through every descendant, by start time.
pub fn session(workspace: &Workspace, of: SessionOf<'_>, json: bool) -> Result<i32, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let id = match of {
        SessionOf::Execution(id) => id.to_owned(),
        SessionOf::Latest => match ledger.latest_execution()? {
            Some(record) => record.execution_id,
            None => {
                return Err(Error::Usage(
                    "no executions recorded yet; run a skill with `kavi skill run` or a chain with `kavi chain run`"
                        .into(),
                ));
            }
        },
    };
    let records = ledger.execution_tree(&id)?;
    let ids: std::collections::HashSet<&str> =
        records.iter().map(|r| r.execution_id.as_str()).collect();
    let mut children: HashMap<Option<&str>, Vec<&ExecutionRecord>> = HashMap::new();
    for record in &records {
        // A parent outside the tree cannot happen in one ledger; treat it as a root all the same.
        let parent = record
            .parent_execution_id
            .as_deref()
            .filter(|p| ids.contains(p));
        children.entry(parent).or_default().push(record);
    }
    if json {
        fn nest(
            record: &ExecutionRecord,
            children: &HashMap<Option<&str>, Vec<&ExecutionRecord>>,
        ) -> Value {
            let mut value = serde_json::to_value(record).expect("a record serializes");
            value["children"] = children
                .get(&Some(record.execution_id.as_str()))
                .into_iter()
                .flatten()
                .map(|child| nest(child, children))
                .collect();
            value
        }
        let roots: Vec<Value> = children
            .get(&None)
            .into_iter()
            .flatten()
            .map(|root| nest(root, &children))
            .collect();
        super::print_json(&json!(roots));
        return Ok(exit::SUCCESS);
    }
    fn print(
        record: &ExecutionRecord,
        children: &HashMap<Option<&str>, Vec<&ExecutionRecord>>,
        prefix: &str,
        connector: &str,
    ) {
        let mut line = format!(
            "{prefix}{connector}{} {} {} {}",
            if record.success { "✓" } else { "✗" },
            record.skill,
            short_id(&record.execution_id),
            duration_ms(record.duration_ms)
        );
        if let Some(step) = &record.step {
            line.push_str(&format!(" (step {step})"));
        }
        if let Some(error) = &record.error {
            line.push_str(&format!(": {}", one_line(error)));
        }
        outln!("{line}");
        let kids = children
            .get(&Some(record.execution_id.as_str()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let below = match connector {
            "" => prefix.to_owned(),
            "└─ " => format!("{prefix}   "),
            _ => format!("{prefix}│  "),
        };
        for (i, child) in kids.iter().enumerate() {
            let connector = if i + 1 == kids.len() {
                "└─ "
            } else {
                "├─ "
            };
            print(child, children, &below, connector);
        }
    }
    for root in children.get(&None).into_iter().flatten() {
        print(root, &children, "", "");
    }
    Ok(exit::SUCCESS)
}
