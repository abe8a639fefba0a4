//! `kavi pipeline start|step|end`: a run whose nodes another scheduler orders (an Argo
//! Workflows DAG, see `kavi pipeline export`), one process per node, recorded in the same
//! ledger as any run (see [`crate::executor::execute_step`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::pipeline::{
    check_named_files, environment, load, report_run, resolve_params, run_exit_code,
};
use super::progress::Screen;
use crate::config::Workspace;
use crate::dag::{self, Dag};
use crate::error::{Error, exit};
use crate::executor::{self, Progress, StepWork};
use crate::ledger::{EXTERNAL_OWNER, Ledger, RunDetail, RunOrigin};
use crate::spec::governing::Role;
use crate::spec::{FanOut, Pipeline};
use crate::state::{NodeState, RunStatus};
use crate::template::TemplateEngine;
use kavi_cli::RunOptions;

/// `kavi pipeline start`: records a run with every node pending, and prints its id (alone on
/// stdout, for the scheduler to hand to the steps; also into `id_file` when given).
pub fn start(
    workspace: &Workspace,
    file: &str,
    sets: &[(String, String)],
    id_file: Option<&Path>,
) -> Result<i32, Error> {
    let (pipeline, templates) = load(workspace, file)?;
    dag::compile(&pipeline)?;
    let params = resolve_params(&pipeline, sets)?;
    check_named_files(
        workspace,
        &pipeline,
        &templates,
        &params,
        &Default::default(),
    )?;
    let mut ledger = Ledger::open(&workspace.config.ledger)?;
    // As `pipeline run` does: a promotion by one of its steps needs an adopted rule set.
    super::policy::adopt_on_first_use(workspace, &mut ledger)?;
    let config = workspace.run_config();
    let governing = pipeline.governing.resolved(&config, &workspace.root);
    let run_id = ledger.create_run(&executor::new_run(
        &pipeline,
        &serde_json::Value::Object(params),
        &governing.members(),
        RunOrigin::User,
        EXTERNAL_OWNER,
        &config,
    ))?;
    if let Some(path) = id_file {
        std::fs::write(path, format!("{run_id}\n")).map_err(|source| Error::Io {
            context: format!("failed to write the run id to {}", path.display()),
            source,
        })?;
    }
    outln!("{run_id}");
    Ok(exit::SUCCESS)
}

/// A run started with `kavi pipeline start` that is still open, loaded with its pipeline, which
/// must be governed as it was when the run started: a step under other rules would record
/// results the run's governing set does not vouch for.
fn open_run(workspace: &Workspace, file: &str, run_id: i64) -> Result<OpenRun, Error> {
    let (pipeline, templates) = load(workspace, file)?;
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let run = ledger.run_detail(ledger.resolve_run(&run_id.to_string())?)?;
    if ledger.run_owner(run_id)? != EXTERNAL_OWNER {
        return Err(Error::Usage(format!(
            "run {run_id} is run by kavi itself, not node by node: steps are for runs started \
             with `kavi pipeline start`"
        )));
    }
    if run.run.spec_hash != pipeline.spec_hash {
        return Err(Error::Usage(format!(
            "run {run_id} is a run of {} ({}), not of {file} as it is now ({})",
            run.run.spec_path, run.run.spec_hash, pipeline.spec_hash
        )));
    }
    let changed = changed_rules(workspace, &pipeline, &ledger, run_id)?;
    if !changed.is_empty() {
        return Err(Error::Usage(format!(
            "the files that govern run {run_id} changed since it started:\n  {}\nits steps must \
             run under the rules it started with (`kavi policy diff {run_id}` shows the change)",
            changed.join("\n  ")
        )));
    }
    Ok(OpenRun {
        pipeline,
        templates,
        ledger,
        run,
    })
}

/// What changed since run `run_id` started in the rules `pipeline` runs under: its pipeline
/// files, chains, policies, templates and configuration, one line each. The workspace files its
/// commands name (`script` members) are left out: the run's own nodes write some of them (a
/// log, an output a later command names), and a run kavi schedules itself reads them once, when
/// it starts, too.
fn changed_rules(
    workspace: &Workspace,
    pipeline: &Pipeline,
    ledger: &Ledger,
    run_id: i64,
) -> Result<Vec<String>, Error> {
    let script = Role::Script.as_str();
    let mut recorded: BTreeMap<String, (String, String)> = ledger
        .governing(run_id)?
        .into_iter()
        .filter(|file| file.role != script)
        .map(|file| (file.path, (file.role, file.spec_hash)))
        .collect();
    let governing = pipeline
        .governing
        .resolved(&workspace.run_config(), &workspace.root);
    let mut changed = Vec::new();
    for (role, path, hash, _) in governing.members() {
        if role == Role::Script {
            continue;
        }
        match recorded.remove(&path) {
            Some((_, then)) if then == hash => {}
            Some(_) => changed.push(format!("changed {path} ({role})")),
            None => changed.push(format!("added {path} ({role})")),
        }
    }
    changed.extend(
        recorded
            .into_iter()
            .map(|(path, (role, _))| format!("removed {path} ({role})")),
    );
    Ok(changed)
}

struct OpenRun {
    pipeline: Pipeline,
    templates: Arc<TemplateEngine>,
    ledger: Ledger,
    run: RunDetail,
}

/// `kavi pipeline step`: decides one node of an open run and runs it once; for a node that
/// runs once per item, decides it (`instances_file`), runs one instance (`NODE[N]`) or ends it.
pub async fn step(
    workspace: &Workspace,
    (file, run_id, node): (&str, i64, &str),
    instances_file: Option<&Path>,
    options: RunOptions,
) -> Result<i32, Error> {
    let OpenRun {
        pipeline,
        templates,
        mut ledger,
        mut run,
    } = open_run(workspace, file, run_id)?;
    let dag = dag::compile(&pipeline)?;
    let instance = FanOut::instance_of(node);
    let named = instance.map_or(node, |(of, _)| of);
    let Some(index) = pipeline.nodes.iter().position(|n| n.id == named) else {
        return Err(Error::NotFound(format!(
            "pipeline `{}` has no node `{named}`",
            pipeline.name
        )));
    };
    let fans_out = pipeline.nodes[index].fan_out.is_some();
    let work = match (instance, instances_file) {
        (Some(_), _) if !fans_out => {
            return Err(Error::NotFound(format!(
                "`{named}` does not run once per item (`for_each`): it has no instance `{node}`"
            )));
        }
        (Some(_), Some(_)) | (None, Some(_)) if !fans_out || instance.is_some() => {
            return Err(Error::Usage(format!(
                "--instances-file is for a node that runs once per item (`for_each`), not `{node}`"
            )));
        }
        (None, Some(_)) => StepWork::Expand,
        (Some((_, position)), _) => StepWork::Run {
            instance: Some(position),
        },
        (None, None) if fans_out => StepWork::Gather,
        (None, None) => StepWork::Run { instance: None },
    };
    if run.run.status != RunStatus::Running {
        return Err(Error::Usage(format!(
            "run {run_id} is {}: its steps are over",
            run.run.status
        )));
    }
    check_needs(&dag, &run, index)?;
    check_instances(&dag, &run, index, work)?;
    let screen = Screen::new();
    let env = environment(workspace, templates, options, &screen)?;
    let cancel = super::cancel_on_signals("the node");
    let mut console: Box<dyn executor::Observer + Send> = if options.json {
        Box::new(super::progress::Silent)
    } else {
        Box::new(super::progress::Console::new(Arc::clone(&screen), 0))
    };
    let env = Arc::new(env);
    let claimant = crate::ledger::claimant_name();
    let mut waiting = false;
    let outcome = loop {
        let outcome = executor::execute_step(
            &dag,
            Arc::clone(&env),
            &mut ledger,
            console.as_mut(),
            cancel.clone(),
            executor::StepOf {
                run: &run,
                index,
                work,
                claimant: &claimant,
            },
        )
        .await?;
        let Some(by) = &outcome.claimed_by else {
            break outcome;
        };
        // Another step runs the node: this one waits for its end and exits as it does, or
        // takes the node over should its lease run out.
        if !std::mem::replace(&mut waiting, true) {
            errln!(
                "run {run_id}: `{node}` attempt {} is claimed by {by}, which runs it; waiting for its end",
                outcome.attempt
            );
        }
        tokio::select! {
            () = tokio::time::sleep(CLAIM_POLL) => {}
            () = cancel.cancelled() => return Ok(super::cancelled_exit_code()),
        }
        run = ledger.run_detail(run_id)?;
    };
    if let Some(path) = instances_file {
        let instances = outcome.instances.clone().unwrap_or_default();
        let list = serde_json::Value::Array(instances).to_string();
        std::fs::write(path, list).map_err(|source| Error::Io {
            context: format!("failed to write the instances to {}", path.display()),
            source,
        })?;
    }
    if options.json {
        super::print_json(&json!({
            "run_id": run_id,
            "node": node,
            "attempt": outcome.attempt,
            "state": outcome.state,
            "retry": outcome.retry,
            "instances": outcome.instances,
        }));
    } else if let Some(instances) = &outcome.instances {
        outln!(
            "run {run_id}: `{node}` runs once per item: {} instance(s) recorded",
            instances.len()
        );
    } else if outcome.retry {
        outln!(
            "run {run_id}: `{node}` attempt {} {}; its retry policy tries again (exit {})",
            outcome.attempt,
            outcome.state,
            exit::RETRY
        );
    } else {
        outln!(
            "run {run_id}: `{node}` {} (attempt {})",
            outcome.state,
            outcome.attempt
        );
    }
    Ok(if outcome.retry {
        exit::RETRY
    } else if work == StepWork::Expand && !cancel.is_cancelled() {
        // Decided: whether it ran to success is its end's to say, once its instances have.
        exit::SUCCESS
    } else if cancel.is_cancelled() {
        super::cancelled_exit_code()
    } else {
        step_exit_code(outcome.state)
    })
}

/// How often a step whose node another step runs looks whether it has ended.
const CLAIM_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// What a step exits with for a node that ended in `state`: 0 when it succeeded or was
/// skipped, 6 when it waits for a person, 1 when it did not run to success (failed, timed out,
/// blocked, cancelled or interrupted), even when the run goes on without it: the scheduler shows
/// the node as it was (an exported workflow continues on through an `on_failure = "continue"`
/// node's failure).
fn step_exit_code(state: NodeState) -> i32 {
    match state {
        NodeState::AwaitingReview => exit::AWAITING_REVIEW,
        state if state.is_success() || state == NodeState::Skipped => exit::SUCCESS,
        _ => exit::RUN_FAILED,
    }
}

/// Refuses a step whose node needs one that has not finished in the run: the scheduler runs
/// steps in the graph's order, so this is a step started out of turn.
fn check_needs(dag: &Dag<'_>, run: &RunDetail, index: usize) -> Result<(), Error> {
    let rows = executor::rows_by_node(run);
    let nodes = &dag.pipeline.nodes;
    for dep in dag.dependencies(index) {
        let rows = rows
            .get(nodes[dep].id.as_str())
            .map_or(&[][..], Vec::as_slice);
        if !matches!(executor::progress(&nodes[dep], rows), Progress::Finished(_)) {
            return Err(Error::Usage(format!(
                "`{}` needs `{}`, which has not finished in run {}: its step comes first",
                nodes[index].id, nodes[dep].id, run.run.id
            )));
        }
    }
    Ok(())
}

/// Refuses a step of a fan-out's instance or end out of turn: an instance its fan-out's step
/// did not record, an end before every instance finished.
fn check_instances(
    dag: &Dag<'_>,
    run: &RunDetail,
    index: usize,
    work: StepWork,
) -> Result<(), Error> {
    let rows = executor::rows_by_node(run);
    let node = &dag.pipeline.nodes[index];
    let decided = |id: &str| {
        let rows = rows.get(id).map_or(&[][..], Vec::as_slice);
        matches!(executor::progress(node, rows), Progress::Finished(_))
    };
    let first = FanOut::instance_id(&node.id, 0);
    match work {
        StepWork::Run {
            instance: Some(position),
        } => {
            let id = FanOut::instance_id(&node.id, position);
            if !rows.contains_key(id.as_str()) {
                return Err(Error::Usage(format!(
                    "run {} recorded no instance `{id}`: `{}`'s step with --instances-file \
                     records its instances first",
                    run.run.id, node.id
                )));
            }
        }
        StepWork::Gather if !decided(&node.id) => {
            if !rows.contains_key(first.as_str()) {
                return Err(Error::Usage(format!(
                    "`{}` has no instances recorded in run {}: its step with --instances-file \
                     comes first",
                    node.id, run.run.id
                )));
            }
            for position in 0.. {
                let id = FanOut::instance_id(&node.id, position);
                if !rows.contains_key(id.as_str()) {
                    break;
                }
                if !decided(&id) {
                    return Err(Error::Usage(format!(
                        "`{id}` has not finished in run {}: `{}` ends once its instances have",
                        run.run.id, node.id
                    )));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// `kavi pipeline end`: closes an open run once its steps are over, recording the nodes no step
/// decided, and exits as `kavi pipeline run` would have.
pub fn end(workspace: &Workspace, file: &str, run_id: i64, json: bool) -> Result<i32, Error> {
    let OpenRun {
        pipeline,
        mut ledger,
        run,
        ..
    } = open_run(workspace, file, run_id)?;
    let dag = dag::compile(&pipeline)?;
    let status = if run.run.status == RunStatus::Running {
        executor::settle_external_run(&dag, &mut ledger, &run)?
    } else {
        // Ended before: say how, again.
        run.run.status
    };
    let detail = ledger.run_detail(run_id)?;
    if json {
        super::print_json(&detail);
    } else {
        report_run(
            &ledger,
            &detail,
            status,
            detail.run.duration_ms.unwrap_or(0),
        )?;
    }
    Ok(run_exit_code(status))
}
