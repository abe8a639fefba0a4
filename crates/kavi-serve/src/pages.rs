//! The pages: the review queue, the runs (paged, with `kavi runs list`'s filters), a run with
//! its nodes and, when it awaits review, its evidence.

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

use kavi_foundation::state::RunStatus;
use kavi_ledger::{Ledger, LedgerError, RunFilter, RunRow};

use crate::{App, Shared, evidence};

/// Runs on a page of the runs list.
const PAGE: usize = 50;

pub fn templates() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    for (name, text) in [
        ("base.html", include_str!("templates/base.html")),
        ("queue.html", include_str!("templates/queue.html")),
        ("runs.html", include_str!("templates/runs.html")),
        ("run.html", include_str!("templates/run.html")),
        ("node.html", include_str!("templates/node.html")),
        ("skill.html", include_str!("templates/skill.html")),
        ("skills.html", include_str!("templates/skills.html")),
        ("ledger.html", include_str!("templates/ledger.html")),
        ("decided.html", include_str!("templates/decided.html")),
        ("refusal.html", include_str!("templates/refusal.html")),
        ("rules.html", include_str!("templates/rules.html")),
    ] {
        env.add_template(name, text)
            .expect("the shipped templates parse");
    }
    env
}

pub async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css")],
        include_str!("style.css"),
    )
        .into_response()
}

/// Renders template `name`; the account the page decides as is on every page.
pub fn page(app: &App, name: &str, context: minijinja::Value) -> Response {
    let context = minijinja::context! {
        actor => kavi_foundation::identity::actor(),
        token => app.token,
        ..context
    };
    match app
        .templates
        .get_template(name)
        .and_then(|t| t.render(context))
    {
        Ok(html) => Html(html).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to render {name}: {e:#}"),
        )
            .into_response(),
    }
}

pub fn refusal(app: &App, status: StatusCode, message: &str) -> Response {
    let mut response = page(app, "refusal.html", minijinja::context! { message });
    *response.status_mut() = status;
    response
}

/// Runs a ledger read off the async threads; no ledger yet reads as an empty one.
pub async fn read<T: Send + 'static>(
    app: &Shared,
    read: impl FnOnce(&App, Option<&Ledger>) -> Result<T, String> + Send + 'static,
) -> Result<T, Response> {
    let app = app.clone();
    let task = tokio::task::spawn_blocking(move || {
        match Ledger::open_existing(&app.workspace.config.ledger) {
            Ok(ledger) => read(&app, Some(&ledger)),
            Err(LedgerError::Missing(_)) => read(&app, None),
            Err(e) => Err(e.to_string()),
        }
        .map_err(|message| (app.clone(), message))
    });
    match task.await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err((app, message))) => Err(refusal(&app, StatusCode::NOT_FOUND, &message)),
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()),
    }
}

/// The review queue: each run a user started that awaits a person's decision.
pub async fn queue(State(app): State<Shared>) -> Response {
    let filter = RunFilter {
        status: Some(RunStatus::AwaitingReview),
        ..RunFilter::default()
    };
    let found = read(&app, move |_, ledger| {
        let Some(ledger) = ledger else {
            return Ok((Vec::new(), false));
        };
        // The newest page of them: the rest are on the runs list, filtered to them.
        let runs = ledger.find_runs(&filter, PAGE).map_err(|e| e.to_string())?;
        let more = runs.len() == PAGE;
        let mut waiting = Vec::new();
        // A child run (a forge attempt) is decided through the run above it.
        for run in runs.into_iter().filter(|r| r.parent_run.is_none()) {
            let escalations = ledger
                .pending_escalations(run.id)
                .map_err(|e| e.to_string())?;
            waiting.push(minijinja::context! { run, escalations });
        }
        Ok((waiting, more))
    })
    .await;
    let (waiting, more) = match found {
        Ok(found) => found,
        Err(response) => return response,
    };
    // Rule changes wait on a person too, whether or not a run waits on them.
    let workspace = app.workspace.clone();
    let rules = tokio::task::spawn_blocking(move || evidence::rules(&workspace))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    page(
        &app,
        "queue.html",
        minijinja::context! { waiting, more, rules },
    )
}

#[derive(Deserialize)]
pub struct RunsQuery {
    status: Option<String>,
    pipeline: Option<String>,
    before: Option<i64>,
}

/// The runs, newest first, a page at a time: each page asks the ledger for one page of rows, by
/// key, so the page loads as fast on a ledger of many thousands of runs.
pub async fn runs(State(app): State<Shared>, Query(query): Query<RunsQuery>) -> Response {
    let status = match query.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => match text.parse::<RunStatus>() {
            Ok(status) => Some(status),
            Err(e) => return refusal(&app, StatusCode::BAD_REQUEST, &e),
        },
    };
    let pipeline = query.pipeline.filter(|p| !p.is_empty());
    let filter = RunFilter {
        status,
        pipeline: pipeline.clone(),
        since: None,
        before: query.before,
    };
    let found = read(&app, move |_, ledger| {
        let Some(ledger) = ledger else {
            return Ok((Vec::new(), false));
        };
        let runs: Vec<RunRow> = ledger
            .find_runs(&filter, PAGE + 1)
            .map_err(|e| e.to_string())?;
        Ok(paged(runs))
    })
    .await;
    let (runs, more) = match found {
        Ok(found) => found,
        Err(response) => return response,
    };
    let next = more.then(|| runs.last().map(|r| r.id)).flatten();
    let statuses: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
    page(
        &app,
        "runs.html",
        minijinja::context! {
            runs,
            next,
            statuses,
            status => status.map(RunStatus::as_str),
            pipeline,
        },
    )
}

/// A run: its nodes, and when it awaits review, the evidence and the forms to decide.
pub async fn run(State(app): State<Shared>, Path(id): Path<i64>) -> Response {
    let found = read(&app, move |app, ledger| {
        let ledger = ledger.ok_or_else(|| format!("no run {id}: the ledger has no runs yet"))?;
        evidence::gather(app, ledger, id)
    })
    .await;
    match found {
        Ok(run) => {
            let awaiting = run.detail.run.status == RunStatus::AwaitingReview
                && run.detail.run.parent_run.is_none();
            page(
                &app,
                "run.html",
                minijinja::context! { page => run, awaiting },
            )
        }
        Err(response) => response,
    }
}

/// How much of a kept stream a node's page shows; `kavi artifact cat` prints all of it.
const SHOWN_BYTES: usize = 256 * 1024;

/// The streams a node keeps, in the order its page shows them (a build node's `log` holds both
/// of its builder's).
const STREAMS: [&str; 3] = ["stdout", "stderr", "log"];

/// A node of a run: its last attempt's state, error and outputs, why it ran (`kavi explain`),
/// and the streams it kept (`kavi runs logs`), as far as they were recorded; while it runs, what
/// it has printed so far, which the page follows (see [`crate::live`]).
pub async fn node(State(app): State<Shared>, Path((id, node)): Path<(i64, String)>) -> Response {
    let found = read(&app, move |app, ledger| {
        let ledger = ledger.ok_or_else(|| format!("no run {id}: the ledger has no runs yet"))?;
        let run = ledger.run(id).map_err(|e| e.to_string())?;
        let attempt = crate::live::last_attempt(ledger, id, &node)?
            .ok_or_else(|| format!("run {id} has no node `{node}`"))?;
        let explained = app.cli.explain(&app.workspace, id, &node);
        let store = kavi_governance::open_store(&app.workspace).map_err(|e| e.to_string())?;
        let mut kept: Vec<_> = attempt
            .artifacts
            .iter()
            .filter_map(|a| Some((STREAMS.iter().position(|s| *s == a.role)?, a)))
            .collect();
        kept.sort_by_key(|(order, _)| *order);
        let streams: Vec<minijinja::Value> = kept
            .into_iter()
            .map(|(_, a)| {
                // A small output is kept in the ledger itself, a larger one in the store.
                let bytes = match ledger.kept_artifact(&a.sha256) {
                    Ok(Some(bytes)) => Ok(bytes),
                    Ok(None) => store.read_bytes(&a.sha256).map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                };
                let text = bytes.map_or_else(
                    |e| format!("({e})"),
                    |bytes| {
                        String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN_BYTES)]).into_owned()
                    },
                );
                let cut = usize::try_from(a.size).is_ok_and(|size| size > SHOWN_BYTES);
                minijinja::context! { role => a.role, sha256 => a.sha256, text, cut }
            })
            .collect();
        let outputs = attempt
            .outputs
            .as_ref()
            .and_then(|o| serde_json::to_string_pretty(o).ok());
        let live = match attempt.state.is_terminal() {
            true => None,
            false => Some(crate::live::so_far(app, ledger, id, &node)?),
        };
        Ok(minijinja::context! {
            run, attempt, outputs, streams, explained, live,
        })
    })
    .await;
    match found {
        Ok(context) => page(&app, "node.html", context),
        Err(response) => response,
    }
}

/// A page of at most [`PAGE`] rows read as `PAGE + 1`: the rows, and whether more follow.
fn paged<T>(mut rows: Vec<T>) -> (Vec<T>, bool) {
    let more = rows.len() > PAGE;
    rows.truncate(PAGE);
    (rows, more)
}

#[derive(Deserialize)]
pub struct SkillsQuery {
    after: Option<String>,
}

/// The skills by name, a page at a time, each with its lifecycle state and versions, as
/// `kavi skill show` gives them.
pub async fn skills(State(app): State<Shared>, Query(query): Query<SkillsQuery>) -> Response {
    let found = read(&app, move |_, ledger| {
        let Some(ledger) = ledger else {
            return Ok((Vec::new(), false));
        };
        let after = query.after.as_deref().filter(|a| !a.is_empty());
        let skills = ledger
            .skills_page(after, PAGE + 1)
            .map_err(|e| e.to_string())?;
        Ok(paged(skills))
    })
    .await;
    match found {
        Ok((skills, more)) => {
            let next = more
                .then(|| skills.last().map(|s| s.name.clone()))
                .flatten();
            page(&app, "skills.html", minijinja::context! { skills, next })
        }
        Err(response) => response,
    }
}

#[derive(Deserialize)]
pub struct SkillQuery {
    /// Verifications older than this one's id.
    verifications_before: Option<i64>,
    /// Executions started before this one (its start, then its id).
    executions_before: Option<String>,
    executions_before_id: Option<String>,
}

/// A skill: its state and versions, its lifecycle moves, the tools of its last verification,
/// its builds, as `kavi skill show` and `kavi builds list` print them, and its gate results and
/// executions, newest first, a page of each at a time.
pub async fn skill(
    State(app): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<SkillQuery>,
) -> Response {
    let found = read(&app, move |_, ledger| {
        let ledger = ledger.ok_or_else(|| format!("no skill `{name}`: the ledger is empty"))?;
        let fail = |e: LedgerError| e.to_string();
        let skill = ledger.skill(&name).map_err(fail)?;
        let transitions = ledger.skill_transitions(&name).map_err(fail)?;
        let toolchains = ledger.latest_toolchains(&name).map_err(fail)?;
        let builds = ledger.builds(&name).map_err(fail)?;
        let (verifications, more) = paged(
            ledger
                .skill_verifications(&name, query.verifications_before, PAGE + 1)
                .map_err(fail)?,
        );
        let verifications_next = more
            .then(|| verifications.last().map(|(id, _)| *id))
            .flatten();
        let verifications: Vec<_> = verifications.into_iter().map(|(_, v)| v).collect();
        let before = query
            .executions_before
            .as_deref()
            .zip(query.executions_before_id.as_deref());
        let (executions, more) = paged(
            ledger
                .skill_executions(&name, before, PAGE + 1)
                .map_err(fail)?,
        );
        let executions_next = more.then(|| executions.last()).flatten().map(|e| {
            minijinja::context! { started_at => e.started_at, id => e.execution_id }
        });
        Ok(minijinja::context! {
            skill, transitions, toolchains, builds,
            verifications, verifications_next, executions, executions_next,
        })
    })
    .await;
    match found {
        Ok(context) => page(&app, "skill.html", context),
        Err(response) => response,
    }
}

/// `kavi ledger verify`: the journal, rows, specs and artifacts checked, and the checkpoints.
/// Done when asked for, as the command is: it reads every artifact.
pub async fn ledger(State(app): State<Shared>) -> Response {
    let found = read(&app, move |app, ledger| {
        ledger.ok_or("nothing is recorded yet: there is no ledger to verify")?;
        Ok(app.cli.ledger_verify(&app.workspace))
    })
    .await;
    match found {
        Ok(verified) => page(&app, "ledger.html", minijinja::context! { verified }),
        Err(response) => response,
    }
}

#[cfg(test)]
mod tests {
    /// The runs list's link to its next page keeps a pipeline filter, encoded for a query.
    #[test]
    fn the_next_page_link_keeps_the_pipeline_filter_encoded() {
        let env = super::templates();
        let html = env
            .get_template("runs.html")
            .unwrap()
            .render(
                minijinja::context! { next => 7, pipeline => "a b&c", runs => serde_json::json!([{ "id": 8, "status": "failed", "pipeline": "a b&c" }]) },
            )
            .unwrap();
        assert!(
            html.contains("/runs?before=7&amp;pipeline=a%20b%26c"),
            "{html}"
        );
    }
}
