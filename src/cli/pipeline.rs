//! `kavi pipeline run|check|plan|graph`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::output::{duration_ms, plural, short_hash, table};
use super::progress::{Console, Screen, Silent, StreamPrinter};
use crate::config::Workspace;
use crate::dag::{self, Dag, GraphFormat};
use crate::diagnostic::Diagnostics;
use crate::error::{Error, exit};
use crate::executor::{self, ChildRunner};
use crate::ledger::{Ledger, Owner};
use crate::node::Environment;
use crate::spec::{self, Pipeline};
use crate::state::{NodeState, RunStatus};
use crate::template::TemplateEngine;
use kavi_cli::RunOptions;

/// What watches a run at `depth`: nothing for `--json`, else the console.
fn observer(json: bool, screen: &Arc<Screen>, depth: usize) -> Box<dyn executor::Observer + Send> {
    if json {
        Box::new(Silent)
    } else {
        Box::new(Console::new(Arc::clone(screen), depth))
    }
}

/// How a pipeline file is named in messages: relative to the workspace when inside it.
/// `jobs`, or fewer where the open-file limit leaves room for fewer nodes at once (said on
/// stderr); refused where it leaves room for none.
fn jobs_within_open_files(jobs: usize) -> Result<usize, Error> {
    let limit = crate::process::open_file_limit();
    let allowed = crate::process::jobs_within_open_files(limit, jobs).map_err(Error::Unusable)?;
    if allowed < jobs {
        errln!(
            "warning: the open-file limit ({limit}) leaves room for {allowed} nodes at once; \
             running {allowed}, not {jobs} (raise it with `ulimit -n`)"
        );
    }
    Ok(allowed)
}

fn display_path(root: &Path, path: &Path) -> PathBuf {
    let absolute = std::env::current_dir().map_or_else(|_| path.to_owned(), |cwd| cwd.join(path));
    let real = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_owned());
    // A file outside the workspace is named by its whole path: named as typed, it would pass
    // for the workspace's file of that name (the trust policy names promoting pipelines so).
    real(&absolute)
        .strip_prefix(real(root))
        .map_or_else(|_| real(&absolute), Path::to_owned)
}

pub(super) fn load(
    workspace: &Workspace,
    file: &str,
) -> Result<(Pipeline, Arc<TemplateEngine>), Error> {
    let path = spec::resolve_pipeline_path(&workspace.root, file)?;
    let templates = Arc::new(TemplateEngine::new(&workspace.templates_dir()));
    let context = spec::LoadContext {
        root: &workspace.root,
        templates: &templates,
        including: &[],
        registry: crate::nodes::registry(),
    };
    let pipeline = spec::load_pipeline(&path, &display_path(&workspace.root, &path), &context)?;
    Ok((pipeline, templates))
}

pub(super) fn resolve_params(
    pipeline: &Pipeline,
    sets: &[(String, String)],
) -> Result<serde_json::Map<String, Value>, Error> {
    spec::resolve_params(&pipeline.params, sets)
        .map_err(|problems| Error::Usage(Diagnostics(problems).to_string()))
}

/// Refuses parameters that name a file the pipeline's nodes read (`--set skill=nosuch`, whose
/// proposal is `proposals/nosuch.toml`) when it is not there, before a run is recorded: a run
/// would only fail at that node. Names the file once, with the values that do name a file.
/// Nodes in `reused` do not run, and read nothing.
pub(super) fn check_named_files(
    workspace: &Workspace,
    pipeline: &Pipeline,
    templates: &TemplateEngine,
    params: &serde_json::Map<String, Value>,
    reused: &std::collections::HashMap<String, executor::Reused>,
) -> Result<(), Error> {
    for node in pipeline
        .nodes
        .iter()
        .filter(|n| !reused.contains_key(&n.id))
    {
        let Some(template) = node.action.reads_file() else {
            continue;
        };
        let Ok(reads) = templates.check_str(template) else {
            continue;
        };
        // Only a file the parameters alone name is known before the run.
        let named_by: Vec<&str> = reads
            .iter()
            .filter_map(|read| read.strip_prefix("params."))
            .collect();
        if named_by.is_empty() || named_by.len() != reads.len() {
            continue;
        }
        let Ok(relative) = templates.render_str(
            template,
            &minijinja::Value::from_serialize(json!({ "params": params })),
        ) else {
            continue;
        };
        // A path that leaves the workspace is the node's to refuse, saying why.
        if crate::sandbox::unsafe_path_reason(&relative).is_some()
            || workspace.root.join(&relative).exists()
        {
            continue;
        }
        let mut message = format!(
            "node `{}` reads {relative}, which does not exist; nothing was run",
            node.id
        );
        if let [name] = named_by[..]
            && let Some(Value::String(value)) = params.get(name)
        {
            message = format!("parameter `{name}` is `{value}`: {message}");
            let values = named_values(workspace, templates, template, params, name);
            if let Some(close) =
                crate::diagnostic::closest(value, values.iter().map(String::as_str))
            {
                message.push_str(&format!("\n  = help: did you mean `--set {name}={close}`?"));
            }
            if !values.is_empty() {
                message.push_str(&format!(
                    "\n  = help: `{name}` names a file for each of: {}",
                    values.join(", ")
                ));
            }
        }
        return Err(Error::NotFound(message));
    }
    Ok(())
}

/// The values of parameter `name` for which `template` names a file that exists: the files of
/// the folder it points into that fit around the parameter (`proposals/*.toml`), sorted.
fn named_values(
    workspace: &Workspace,
    templates: &TemplateEngine,
    template: &str,
    params: &serde_json::Map<String, Value>,
    name: &str,
) -> Vec<String> {
    // Rendered with a marker for the parameter, the path splits around where its value goes.
    const MARK: &str = "\u{1}";
    let mut marked = params.clone();
    marked.insert(name.to_owned(), Value::String(MARK.to_owned()));
    let Ok(path) = templates.render_str(
        template,
        &minijinja::Value::from_serialize(json!({ "params": marked })),
    ) else {
        return Vec::new();
    };
    let Some((before, after)) = path.split_once(MARK) else {
        return Vec::new();
    };
    let (folder, start) = before.rsplit_once('/').unwrap_or(("", before));
    if after.contains(['/', '\u{1}']) {
        return Vec::new();
    }
    let mut values: Vec<String> = std::fs::read_dir(workspace.root.join(folder))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let file = entry.file_name().into_string().ok()?;
            let value = file.strip_prefix(start)?.strip_suffix(after)?;
            (!value.is_empty()).then(|| value.to_owned())
        })
        .collect();
    values.sort();
    values
}

pub async fn run(
    workspace: &Workspace,
    file: &str,
    sets: &[(String, String)],
    options: RunOptions,
    start: executor::RunStart,
    junit: Option<&Path>,
) -> Result<i32, Error> {
    run_subset(
        workspace,
        file,
        sets,
        options,
        start,
        Subset::default(),
        junit,
    )
    .await
}

/// Which of a pipeline's nodes a run runs: all of them, or targets (`pipeline run FILE
/// NODE...`) with what they need, as make runs a target.
#[derive(Debug, Default, Clone, Copy)]
pub struct Subset<'t> {
    pub targets: &'t [String],
    /// `--only`: what the targets need is not run but taken from the cache, so it must be up
    /// to date.
    pub only: bool,
}

/// The index of node `id`, or an error that names the pipeline and the flag it came from.
fn node_named(pipeline: &Pipeline, id: &str, named_by: &str) -> Result<usize, Error> {
    pipeline
        .nodes
        .iter()
        .position(|n| n.id == id)
        .ok_or_else(|| {
            Error::NotFound(format!(
                "{named_by}: pipeline `{}` has no node `{id}`",
                pipeline.name
            ))
        })
}

/// The ids of the nodes a run of `subset` keeps: its targets and everything they need. With
/// `--only`, what they need must be up to date (see [`executor::status`]): the run takes it
/// from the cache.
pub(super) fn subset_nodes(
    workspace: &Workspace,
    pipeline: &Pipeline,
    subset: Subset<'_>,
    params: &serde_json::Map<String, Value>,
    ledger: &Ledger,
) -> Result<std::collections::HashSet<String>, Error> {
    let dag = dag::compile(pipeline)?;
    let mut keep = vec![false; dag.len()];
    let mut pending = Vec::new();
    for target in subset.targets {
        let index = node_named(pipeline, target, "a target")?;
        keep[index] = true;
        pending.push(index);
    }
    while let Some(index) = pending.pop() {
        for dep in dag.dependencies(index) {
            if !keep[dep] {
                keep[dep] = true;
                pending.push(dep);
            }
        }
    }
    if subset.only {
        let store = super::open_store(workspace)?;
        let memo = crate::cache::DigestMemo::of_store(&store);
        let inputs = executor::Inputs {
            workspace: &workspace.root,
            state_paths: &workspace.state_paths(),
            memo: &memo,
        };
        let params = Value::Object(params.clone());
        let statuses = executor::status(&dag, &params, &workspace.run_config(), &inputs, ledger)?;
        // Statuses come in the DAG's order, as `dag.order` has the nodes.
        let stale = dag.order.iter().zip(&statuses).find(|(index, status)| {
            keep[**index] && !status.fresh && !subset.targets.contains(&status.node)
        });
        if let Some((_, stale)) = stale {
            let mut why = stale.reason.clone();
            if !stale.changed.is_empty() {
                why = format!("{why} {}", stale.changed.join(", "));
            }
            return Err(Error::Usage(format!(
                "--only runs the targets alone, but they need `{}`, which has no result to take \
                 from the cache ({why}); run it too (drop --only), or bring it up to date first",
                stale.node
            )));
        }
    }
    Ok(dag
        .order
        .iter()
        .filter(|&&i| keep[i])
        .map(|&i| pipeline.nodes[i].id.clone())
        .collect())
}

/// [`run`] of a subset of the pipeline's nodes (see [`Subset`]).
pub async fn run_subset(
    workspace: &Workspace,
    file: &str,
    sets: &[(String, String)],
    options: RunOptions,
    start: executor::RunStart,
    subset: Subset<'_>,
    junit: Option<&Path>,
) -> Result<i32, Error> {
    let json = options.json;
    // A new ledger takes milliseconds of schema and syncs: it opens while the pipeline loads.
    let (loaded, ledger) =
        crate::ledger::open_during(&workspace.config.ledger, || load(workspace, file));
    let (mut pipeline, templates) = loaded?;
    for id in &start.rerun {
        node_named(&pipeline, id, &format!("--rerun {id}"))?;
    }
    let params = resolve_params(&pipeline, sets)?;
    let mut ledger = ledger?;
    if !subset.targets.is_empty() {
        let keep = subset_nodes(workspace, &pipeline, subset, &params, &ledger)?;
        pipeline.nodes.retain(|node| keep.contains(&node.id));
    }
    check_named_files(workspace, &pipeline, &templates, &params, &start.reuse)?;
    let dag = dag::compile(&pipeline)?;
    tracing::debug!(nodes = dag.len(), "pipeline loaded and planned");
    // Sandboxes of earlier runs whose keeping time is up (or whose kavi was killed) go now.
    crate::ledger::cleanup::sweep(&mut ledger)?;
    // So are the files of an import killed before it settled: a forge must not take them in.
    for path in kavi_governance::skills::pending::settle_abandoned(workspace, &ledger)? {
        errln!(
            "removed {}: written by an import that stopped before its skill was promoted",
            path.display()
        );
    }
    super::policy::adopt_on_first_use(workspace, &mut ledger)?;
    tracing::debug!("ledger open");
    let screen = Screen::new();
    let env = environment(workspace, templates, options, &screen)?;
    tracing::debug!("store open");
    let cancel = super::cancel_on_signals("running nodes");
    // Held until the run has ended; a run cancelled while it waits for its group never began.
    let _group = match &pipeline.concurrency {
        None => None,
        Some(concurrency) => match join_group(&mut ledger, concurrency, &cancel).await? {
            Some(slot) => Some(slot),
            None => return Ok(super::cancelled_exit_code()),
        },
    };

    let mut console = observer(json, &screen, 0);
    let owner = Arc::clone(&env.owner);
    let outcome = executor::execute(
        &dag,
        params,
        Arc::new(env),
        &mut ledger,
        console.as_mut(),
        cancel,
        start,
    )
    .await
    .inspect_err(|e| {
        // The run's end could not be recorded (a full disk, most often): why is kept beside
        // the ledger, for the kavi that finds the run unfinished to record as its end.
        let cause = if e.is_disk_full() {
            format!("no space left on device ({e})")
        } else {
            e.to_string()
        };
        owner.note_stop(&cause);
    })?;
    let detail = ledger.run_detail(outcome.run_id)?;
    tracing::debug!("run read back");
    if let Some(path) = junit {
        super::junit::write(&detail, path)?;
    }
    if json {
        super::print_json(&detail);
    } else {
        let duration = i64::try_from(outcome.duration_ms).unwrap_or(i64::MAX);
        report_run(&ledger, &detail, outcome.status, duration)?;
    }
    // kavi's own CPU, every thread's, its nodes' processes not included: what it costs a run
    // beside them, for whoever profiles one (`RUST_LOG=kavi=debug`).
    let cpu = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(std::time::Duration::from)
        .unwrap_or_default();
    tracing::debug!(cpu = ?cpu, "run reported");
    super::leave_to_exit(detail);
    super::leave_to_exit(dag);
    super::leave_to_exit(pipeline);
    Ok(run_exit_code(outcome.status))
}

/// Takes a slot of the run's concurrency group (see [`crate::groups`]), doing what its
/// `on_conflict` says while the group is full: waiting, refusing (exit 2), or cancelling the
/// runs holding it and waiting. Runs that wait take a free slot in no set order. `None` when
/// `cancel` fired while it waited.
async fn join_group(
    ledger: &mut Ledger,
    concurrency: &spec::Concurrency,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<Option<crate::groups::Slot>, Error> {
    let mut wait = crate::groups::GroupWait::new(concurrency, "run");
    let mut waiting = false;
    loop {
        let turn = wait.try_take(ledger)?;
        match turn {
            crate::groups::Turn::Took(slot) => return Ok(Some(slot)),
            crate::groups::Turn::Refused(full) => {
                return Err(Error::Usage(format!(
                    "{full}; this pipeline's `on_conflict = \"refuse\"` starts nothing"
                )));
            }
            crate::groups::Turn::Full { why, cancelled } => {
                for holder in cancelled {
                    errln!(
                        "cancelling the run of kavi process {holder} in concurrency group `{}`",
                        wait.group()
                    );
                }
                if !waiting {
                    errln!("{why}; waiting for a slot");
                    waiting = true;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(crate::groups::RETRY) => {}
            () = cancel.cancelled() => return Ok(None),
        }
    }
}

/// The environment a run's nodes run in, owned by this kavi process and shown on `screen`.
pub(super) fn environment(
    workspace: &Workspace,
    templates: Arc<TemplateEngine>,
    options: RunOptions,
    screen: &Arc<Screen>,
) -> Result<Environment, Error> {
    let json = options.json;
    let artifacts = super::open_store(workspace)?;
    let config = &workspace.config;
    let state_paths = workspace.state_paths();
    let child_screen = Arc::clone(screen);
    let owner =
        Owner::claim(&config.ledger, &artifacts.temp_dir()).map_err(|source| Error::Io {
            context: "failed to claim the run's lock beside the ledger".into(),
            source,
        })?;
    Ok(Environment {
        owner: Arc::new(owner),
        workspace: Arc::from(workspace.root.as_path()),
        templates,
        artifacts,
        sandboxes: Arc::from(config.sandboxes.as_path()),
        ledger: Arc::from(config.ledger.as_path()),
        state_paths: Arc::from(state_paths),
        config: workspace.run_config(),
        jobs: jobs_within_open_files(workspace.config.jobs)?,
        use_cache: !options.no_cache,
        depth: 0,
        toolchains: Arc::new(crate::config::ToolchainHome::of(workspace)),
        child_runs: Arc::new(ChildRunner {
            observer: Box::new(move |depth| observer(json, &child_screen, depth)),
        }),
        live_output: (options.stream && !json).then(|| {
            Arc::new(StreamPrinter {
                screen: Arc::clone(screen),
            }) as Arc<dyn crate::node::LiveNodeOutput>
        }),
    })
}

/// The line that sums up a finished run, what its skills became, and what to do next.
pub(super) fn report_run(
    ledger: &Ledger,
    detail: &crate::ledger::RunDetail,
    status: RunStatus,
    millis: i64,
) -> Result<(), Error> {
    let run_id = detail.run.id;
    let mut counts: Vec<(NodeState, usize)> = Vec::new();
    for node in crate::ledger::final_attempts(&detail.nodes) {
        match counts.iter_mut().find(|(s, _)| *s == node.state) {
            Some((_, n)) => *n += 1,
            None => counts.push((node.state, 1)),
        }
    }
    counts.sort_by_key(|(state, _)| NodeState::ALL.iter().position(|s| s == state));
    let counts: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    outln!(
        "run {run_id} {status} in {}: {}",
        duration_ms(millis),
        counts.join(", ")
    );
    report_skills(ledger, run_id)?;
    if status == RunStatus::AwaitingReview {
        outln!(
            "awaiting review: decide with `kavi approve {run_id} --comment ...` or `kavi reject {run_id} --comment ...`"
        );
    } else if status != RunStatus::Succeeded {
        outln!("see the details with: kavi runs show {run_id}");
    }
    Ok(())
}

/// The exit code of a run that ended in `status` (see docs/exit-codes.md).
pub(super) fn run_exit_code(status: RunStatus) -> i32 {
    match status {
        RunStatus::Succeeded => exit::SUCCESS,
        RunStatus::Cancelled => super::cancelled_exit_code(),
        RunStatus::AwaitingReview => exit::AWAITING_REVIEW,
        _ => exit::RUN_FAILED,
    }
}

/// What became of each skill the run moved through its lifecycle, and what to do with it now.
fn report_skills(ledger: &Ledger, run_id: i64) -> Result<(), Error> {
    for (name, states) in ledger.skills_moved_by(run_id)? {
        let skill = ledger.skill(&name)?;
        outln!(
            "skill `{name}` is {} (version {}): {}",
            skill.state,
            skill.version,
            states.join(" -> ")
        );
        if skill.state == crate::skills::TRUSTED {
            outln!(
                "run it: kavi skill run {name} --input JSON  (its input: kavi skill show {name})"
            );
        }
    }
    Ok(())
}

pub fn check(workspace: &Workspace, file: &str, json: bool) -> Result<i32, Error> {
    let (pipeline, _) = load(workspace, file)?;
    let dag = dag::compile(&pipeline)?;
    let stages = dag.stage.iter().max().map_or(0, |s| s + 1);
    if json {
        super::print_json(&serde_json::json!({
            "ok": true,
            "file": pipeline.source.path,
            "pipeline": pipeline.name,
            "nodes": dag.len(),
            "stages": stages,
            "params": pipeline.params.len(),
            "problems": [],
        }));
    } else {
        outln!(
            "{}: pipeline `{}` is valid ({}, {}, {})",
            pipeline.source.path.display(),
            pipeline.name,
            plural(dag.len(), "node"),
            plural(stages, "stage"),
            plural(pipeline.params.len(), "parameter"),
        );
    }
    super::leave_to_exit(dag);
    super::leave_to_exit(pipeline);
    Ok(exit::SUCCESS)
}

/// The ledger an export's tasks record into, from `--task-ledger` or `--task-ledger-secret`. A
/// location with a password is refused: the manifest would carry it in plain text into every
/// container, and to whoever can read the workflow.
pub fn task_ledger(
    location: Option<String>,
    secret: Option<String>,
) -> Result<Option<crate::export::argo::TaskLedger>, Error> {
    use crate::export::argo::TaskLedger;
    if let Some(secret) = secret {
        let Some((name, key)) = secret
            .split_once(':')
            .filter(|(name, key)| !name.is_empty() && !key.is_empty())
        else {
            return Err(Error::Usage(format!(
                "--task-ledger-secret `{secret}`: give the Secret and its key as SECRET:KEY"
            )));
        };
        return Ok(Some(TaskLedger::Secret {
            name: name.to_owned(),
            key: key.to_owned(),
        }));
    }
    match location {
        Some(url)
            if crate::ledger::display_location(Path::new(&url)) != url
                || url.contains("password=") =>
        {
            Err(Error::Usage(
                "--task-ledger carries a password, which the manifest would hold in plain text \
                 for every container: keep the URL in a Kubernetes Secret and give \
                 --task-ledger-secret SECRET:KEY"
                    .to_owned(),
            ))
        }
        location => Ok(location.map(TaskLedger::Location)),
    }
}

/// `kavi pipeline export`: the manifest on stdout (or into `output`), and what the engine does
/// not carry out itself on stderr.
pub fn export(
    workspace: &Workspace,
    file: &str,
    format: crate::export::ExportFormat,
    mut options: crate::export::argo::ArgoOptions,
    output: Option<&Path>,
) -> Result<i32, Error> {
    let (pipeline, _) = load(workspace, file)?;
    let dag = dag::compile(&pipeline)?;
    // Inside the container, kavi finds the file where it is in the workspace.
    options.file = pipeline.source.path.display().to_string();
    let export = match format {
        crate::export::ExportFormat::Argo => crate::export::argo::export(&dag, &options)?,
    };
    let text = serde_json::to_string_pretty(&export.manifest).expect("a manifest serializes");
    match output {
        None => outln!("{text}"),
        Some(path) => std::fs::write(path, format!("{text}\n")).map_err(|source| Error::Io {
            context: format!("failed to write {}", path.display()),
            source,
        })?,
    }
    for note in &export.notes {
        errln!("note: {note}");
    }
    Ok(exit::SUCCESS)
}

/// Whether a `when` can be decided now: it can when it reads only parameters.
fn decide_now(
    dag: &Dag<'_>,
    index: usize,
    templates: &TemplateEngine,
    params: &serde_json::Map<String, Value>,
) -> Option<bool> {
    let node = &dag.pipeline.nodes[index];
    let when = node.when.as_ref()?;
    let reads_only_params = node
        .reads
        .iter()
        .filter(|(_, span)| *span == when.span())
        .all(|(path, _)| path.starts_with("params"));
    if !reads_only_params {
        return None;
    }
    let context = minijinja::Value::from_serialize(json!({ "params": params }));
    templates.eval_condition(when.get_ref(), &context).ok()
}

pub fn plan(
    workspace: &Workspace,
    file: &str,
    sets: &[(String, String)],
    json: bool,
) -> Result<i32, Error> {
    let (pipeline, templates) = load(workspace, file)?;
    let dag = dag::compile(&pipeline)?;
    let params = resolve_params(&pipeline, sets)?;
    let stage_count = dag.stage.iter().max().map_or(0, |s| s + 1);
    let mut stages: Vec<Vec<usize>> = vec![Vec::new(); stage_count];
    for &i in &dag.order {
        stages[dag.stage[i]].push(i);
    }
    if json {
        let stages: Vec<Value> = stages
            .iter()
            .map(|nodes| {
                Value::Array(
                    nodes
                        .iter()
                        .map(|&i| {
                            let node = &pipeline.nodes[i];
                            json!({
                                "id": node.id,
                                "kind": node.kind,
                                "needs": node.needs.iter().map(|n| n.get_ref()).collect::<Vec<_>>(),
                                "when": node.when.as_ref().map(|w| w.get_ref()),
                                "runs_if_known": decide_now(&dag, i, &templates, &params),
                                "action": node.action.describe(),
                            })
                        })
                        .collect(),
                )
            })
            .collect();
        let plan = json!({
            "pipeline": pipeline.name,
            "spec_hash": pipeline.spec_hash,
            "params": params,
            "stages": stages,
        });
        super::print_json(&plan);
        super::leave_to_exit(dag);
        super::leave_to_exit(pipeline);
        return Ok(exit::SUCCESS);
    }
    outln!(
        "plan for `{}`: {} nodes in {stage_count} stages (spec {})",
        pipeline.name,
        dag.len(),
        short_hash(&pipeline.spec_hash)
    );
    for (name, value) in &params {
        outln!("  param {name} = {value}");
    }
    for (s, nodes) in stages.iter().enumerate() {
        outln!("stage {}:", s + 1);
        let rows: Vec<Vec<String>> = nodes
            .iter()
            .map(|&i| {
                let node = &pipeline.nodes[i];
                // Built with `push_str` into one string, not `format!` and `join`: `plan` of
                // 10,000 nodes formatted 30,000 strings, 6% of its instructions, and growing
                // them was 4% more.
                let mut notes = String::new();
                let note = |notes: &mut String, part: &str| {
                    notes.push_str(if notes.is_empty() { "[" } else { "; " });
                    notes.push_str(part);
                };
                if !node.needs.is_empty() {
                    note(&mut notes, "needs ");
                    for (n, need) in node.needs.iter().enumerate() {
                        if n > 0 {
                            notes.push_str(", ");
                        }
                        notes.push_str(need.get_ref());
                    }
                }
                if let Some(when) = &node.when {
                    let verdict = match decide_now(&dag, i, &templates, &params) {
                        Some(true) => "true now",
                        Some(false) => "false now: will be skipped",
                        None => "decided at run time",
                    };
                    note(&mut notes, &format!("when {} ({verdict})", when.get_ref()));
                }
                if let Some(fan_out) = &node.fan_out {
                    let items = match &fan_out.items {
                        crate::spec::ForEach::Items(items) => format!("{} items", items.len()),
                        crate::spec::ForEach::Expression(e) => e.get_ref().clone(),
                    };
                    note(&mut notes, &format!("once per item of {items}"));
                    if let Some(max) = fan_out.max_parallel {
                        note(&mut notes, &format!("at most {max} at once"));
                    }
                }
                if let Some(timeout) = node.timeout {
                    let timeout = humantime::format_duration(timeout);
                    note(&mut notes, &format!("timeout {timeout}"));
                }
                if node.retry.attempts > 1 {
                    note(&mut notes, &format!("{} attempts", node.retry.attempts));
                }
                if !notes.is_empty() {
                    notes.push(']');
                }
                let mut id = String::with_capacity(node.id.len() + 2);
                id.push_str("  ");
                id.push_str(&node.id);
                vec![id, node.kind.to_owned(), node.action.describe(), notes]
            })
            .collect();
        out!("{}", table(&rows));
    }
    super::leave_to_exit(dag);
    super::leave_to_exit(pipeline);
    Ok(exit::SUCCESS)
}

/// `kavi pipeline status`: each node, in the order a run decides them, fresh (a run now takes
/// its recorded result) or stale (a run now runs it), and why.
pub fn status(
    workspace: &Workspace,
    file: &str,
    sets: &[(String, String)],
    json: bool,
) -> Result<i32, Error> {
    let (pipeline, _) = load(workspace, file)?;
    let dag = dag::compile(&pipeline)?;
    let params = Value::Object(resolve_params(&pipeline, sets)?);
    let nodes = match Ledger::open_existing(&workspace.config.ledger) {
        Ok(ledger) => {
            let store = super::open_store(workspace)?;
            let memo = crate::cache::DigestMemo::of_store(&store);
            let inputs = executor::Inputs {
                workspace: &workspace.root,
                state_paths: &workspace.state_paths(),
                memo: &memo,
            };
            executor::status(&dag, &params, &workspace.run_config(), &inputs, &ledger)?
        }
        // Reading never makes a ledger: with none, nothing has run, and every node would.
        Err(crate::ledger::LedgerError::Missing(_)) => dag
            .order
            .iter()
            .map(|&i| executor::NodeStatus {
                node: pipeline.nodes[i].id.clone(),
                fresh: false,
                reason: "nothing has run in this workspace yet".into(),
                changed: Vec::new(),
            })
            .collect(),
        Err(e) => return Err(e.into()),
    };
    if json {
        super::print_json(&json!({
            "pipeline": pipeline.name,
            "spec_hash": pipeline.spec_hash,
            "params": params,
            "nodes": nodes,
        }));
        return Ok(exit::SUCCESS);
    }
    let fresh = nodes.iter().filter(|n| n.fresh).count();
    outln!(
        "status of `{}`: {} up to date, {} would run",
        pipeline.name,
        plural(fresh, "node"),
        nodes.len() - fresh
    );
    let mut rows = Vec::with_capacity(nodes.len());
    for node in &nodes {
        let state = if node.fresh { "fresh" } else { "stale" };
        rows.push(vec![
            state.to_owned(),
            node.node.clone(),
            node.reason.clone(),
        ]);
        for change in &node.changed {
            rows.push(vec![String::new(), String::new(), format!("  {change}")]);
        }
    }
    out!("{}", table(&rows));
    Ok(exit::SUCCESS)
}

pub fn graph(workspace: &Workspace, file: &str, format: GraphFormat) -> Result<i32, Error> {
    let (pipeline, _) = load(workspace, file)?;
    let dag = dag::compile(&pipeline)?;
    out!("{}", dag::render_graph(&dag, format));
    Ok(exit::SUCCESS)
}

/// The graph of run `run_id` as the spec it kept declares it (not the file as it is now): each
/// node with the nodes it depends on, in the order `kavi pipeline graph` lists them.
pub(super) fn kept_graph(
    workspace: &Workspace,
    run_id: i64,
) -> Result<Vec<(String, Vec<String>)>, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let run = ledger.run(run_id)?;
    let (_, text) = ledger.spec_text(&run.spec_hash)?;
    let templates = TemplateEngine::new(&workspace.templates_dir());
    let context = spec::LoadContext {
        root: &workspace.root,
        templates: &templates,
        including: &[],
        registry: crate::nodes::registry(),
    };
    let pipeline = spec::load_pipeline_str(Path::new(&run.spec_path), text, &context)?;
    let dag = dag::compile(&pipeline)?;
    let nodes = &pipeline.nodes;
    Ok(dag
        .order
        .iter()
        .map(|&i| {
            let needs = dag
                .dependencies(i)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|dep| nodes[dep].id.clone())
                .collect();
            (nodes[i].id.clone(), needs)
        })
        .collect())
}
