//! A running node's output on its page: what it has printed so far, rendered with the page, and
//! more as it prints, sent as server-sent events that the page's script appends. Both read the
//! node's live log, the file `kavi runs logs` reads, which the node's kavi writes with the node's
//! secrets already hidden: no byte of a secret is ever read here.

use std::convert::Infallible;

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use kavi_ledger::{Ledger, LivePosition, LiveTail, NodeRunRow};

use crate::pages::{read, refusal};
use crate::{App, Shared};

/// The streams a node's page follows, in the order its live view names them.
const STREAMS: [&str; 2] = ["stdout", "stderr"];

/// How much of what a running node has printed its page shows: the last of it.
const SHOWN_BYTES: usize = 256 * 1024;

/// Where each stream's live log of node `node` in run `run_id` is, as its kavi writes it; `None`
/// for one this machine cannot see into (a run another machine runs).
fn paths(
    app: &App,
    ledger: &Ledger,
    run_id: i64,
    node: &str,
) -> Result<[Option<std::path::PathBuf>; 2], String> {
    let owner = ledger.run_owner(run_id).map_err(|e| e.to_string())?;
    let spill = kavi_governance::open_store(&app.workspace)
        .map_err(|e| e.to_string())?
        .temp_dir();
    Ok(STREAMS.map(|stream| kavi_ledger::live_log(&spill, &owner, run_id, node, stream)))
}

/// What a running node has printed so far, for its page: each stream's text (the last
/// [`SHOWN_BYTES`] of it, from a line's start), whether it was cut, whether this machine can see
/// it at all, and where the page's live view goes on from.
pub fn so_far(
    app: &App,
    ledger: &Ledger,
    run_id: i64,
    node: &str,
) -> Result<Vec<minijinja::Value>, String> {
    let mut streams = Vec::new();
    for (role, path) in STREAMS.into_iter().zip(paths(app, ledger, run_id, node)?) {
        let seen = path.is_some();
        let mut tail = LiveTail::new(path);
        let bytes = tail
            .read()
            .map_err(|e| format!("failed to read the node's live log: {e}"))?;
        let cut = bytes.len() > SHOWN_BYTES;
        let mut shown = &bytes[bytes.len().saturating_sub(SHOWN_BYTES)..];
        if cut && let Some(start) = shown.iter().position(|b| *b == b'\n') {
            shown = &shown[start + 1..];
        }
        streams.push(minijinja::context! {
            role,
            text => String::from_utf8_lossy(shown),
            cut,
            seen,
            at => tail.position().map(|at| at.to_string()),
        });
    }
    Ok(streams)
}

#[derive(Deserialize)]
pub struct LiveQuery {
    /// The attempt the page showed: another one since ends the view (the page is then stale).
    attempt: i64,
    /// Where the page's text of each stream ends.
    stdout: Option<String>,
    stderr: Option<String>,
}

/// The last attempt of node `node` in run `run_id`; `None` for a node the run does not have.
pub fn last_attempt(
    ledger: &Ledger,
    run_id: i64,
    node: &str,
) -> Result<Option<NodeRunRow>, String> {
    let detail = ledger.run_detail(run_id).map_err(|e| e.to_string())?;
    Ok(kavi_ledger::final_attempts(&detail.nodes)
        .into_iter()
        .find(|n| n.node_id == node)
        .cloned())
}

/// A running node's output as server-sent events, from where its page's text ended: an event
/// named after its stream (`stdout`, `stderr`) with each run of whole lines as they are written,
/// and `end` once the attempt the page showed is over (or another has started), when the page
/// reloads to show what the ledger kept.
pub async fn follow(
    State(app): State<Shared>,
    Path((id, node)): Path<(i64, String)>,
    Query(query): Query<LiveQuery>,
) -> Response {
    let mut from = [None, None];
    for (at, given) in from.iter_mut().zip([&query.stdout, &query.stderr]) {
        match given.as_deref().map(str::parse::<LivePosition>).transpose() {
            Ok(position) => *at = position,
            Err(e) => return refusal(&app, StatusCode::BAD_REQUEST, &e),
        }
    }
    let found = read(&app, move |app, ledger| {
        let ledger = ledger.ok_or_else(|| format!("no run {id}: the ledger has no runs yet"))?;
        last_attempt(ledger, id, &node)?.ok_or_else(|| format!("run {id} has no node `{node}`"))?;
        Ok((paths(app, ledger, id, &node)?, node))
    })
    .await;
    let (paths, node) = match found {
        Ok(found) => found,
        Err(response) => return response,
    };
    let mut tails: Vec<LiveTail> = paths
        .into_iter()
        .zip(from)
        .map(|(path, at)| match at {
            Some(at) => LiveTail::resume(path, at),
            None => LiveTail::new(path),
        })
        .collect();
    let (events, received) = tokio::sync::mpsc::channel::<Event>(16);
    let ledger_path = app.workspace.config.ledger.clone();
    let attempt = query.attempt;
    // Following waits on files and the ledger: a thread of its own, until the node ends or the
    // page goes away (the channel closes).
    tokio::task::spawn_blocking(move || {
        let Ok(mut ledger) = Ledger::open_existing(&ledger_path) else {
            return;
        };
        let mut partial: [Vec<u8>; 2] = Default::default();
        let followed = ledger.follow_live(
            &mut tails,
            |index, read| {
                // An unreadable log ends the view; the page, reloaded, says what the ledger has.
                let Ok(bytes) = read else {
                    return Ok(false);
                };
                let pending = &mut partial[index];
                pending.extend_from_slice(&bytes);
                // Whole lines only: a line's end (and a character's) is never cut in two.
                if let Some(last) = pending.iter().rposition(|b| *b == b'\n') {
                    let lines: Vec<u8> = pending.drain(..=last).collect();
                    let event = Event::default()
                        .event(STREAMS[index])
                        .data(String::from_utf8_lossy(&lines));
                    if events.blocking_send(event).is_err() {
                        return Ok(false);
                    }
                }
                Ok(!events.is_closed())
            },
            |ledger| {
                let last = last_attempt(ledger, id, &node)?;
                let over = last.is_none_or(|n| n.attempt != attempt || n.state.is_terminal());
                Ok::<_, String>(over.then_some(()))
            },
        );
        if let Ok(Some(())) = followed {
            let _ = events.blocking_send(Event::default().event("end").data("ended"));
        }
    });
    Sse::new(futures_util::stream::unfold(
        received,
        |mut received| async move {
            let event = received.recv().await?;
            Some((Ok::<_, Infallible>(event), received))
        },
    ))
    .keep_alive(KeepAlive::default())
    .into_response()
}

/// The script that follows a running node on its page.
pub async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript")],
        include_str!("live.js"),
    )
        .into_response()
}
