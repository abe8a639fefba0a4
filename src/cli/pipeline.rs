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

pub async fn run(
    workspace: &Workspace,
    file: &str,
    sets: &[(String, String)],
    options: RunOptions,
    start: executor::RunStart,
    junit: Option<&Path>,
) -> Result<i32, Error> {
    let json = options.json;
    // A new ledger takes milliseconds of schema and syncs: it opens while the pipeline loads.
    let (loaded, ledger) =
        crate::ledger::open_during(&workspace.config.ledger, || load(workspace, file));
    let (pipeline, templates) = loaded?;
    let dag = dag::compile(&pipeline)?;
    tracing::debug!(nodes = dag.len(), "pipeline loaded and planned");
    let params = resolve_params(&pipeline, sets)?;
    let mut ledger = ledger?;
    // Sandboxes of earlier runs whose keeping time is up (or whose kavi was killed) go now.
    crate::ledger::cleanup::sweep(&mut ledger)?;
    super::policy::adopt_on_first_use(workspace, &mut ledger)?;
    tracing::debug!("ledger open");
    let screen = Screen::new();
    let env = environment(workspace, templates, options, &screen)?;
    tracing::debug!("store open");
    let cancel = super::cancel_on_signals("running nodes");

    let mut console = observer(json, &screen, 0);
    let outcome = executor::execute(
        &dag,
        params,
        Arc::new(env),
        &mut ledger,
        console.as_mut(),
        cancel,
        start,
    )
    .await?;
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
    let state_paths = vec![
        config.ledger.clone(),
        PathBuf::from(format!("{}-wal", config.ledger.display())),
        PathBuf::from(format!("{}-shm", config.ledger.display())),
        crate::ledger::locks_dir(&config.ledger),
        config.artifacts.clone(),
    ];
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
        crate::export::ExportFormat::Argo => crate::export::argo::export(&dag, &options),
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

pub fn graph(workspace: &Workspace, file: &str, format: GraphFormat) -> Result<i32, Error> {
    let (pipeline, _) = load(workspace, file)?;
    let dag = dag::compile(&pipeline)?;
    out!("{}", dag::render_graph(&dag, format));
    Ok(exit::SUCCESS)
}
