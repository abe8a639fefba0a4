//! Execution records and runs as MCP resources, read from the ledger.
//!
//! `kavi://executions/{execution_id}` is one execution record (as `kavi executions tail --json`
//! shows it; a unique prefix of the id reads it too), `kavi://runs/{run_id}` one run (as `kavi
//! runs show --json`). `kavi://executions` and `kavi://runs` are the newest of each, a summary a
//! record: what a client subscribes to for new ones. `resources/list` pages through the records
//! that have ended, newest first, then through the runs, by cursor.
//!
//! New records come from any kavi process sharing the ledger, so [`Watch`] reads the ledger
//! again every [`POLL`] while a client subscribes (`resources/subscribe` up to 2025-11-25,
//! `subscriptions/listen` from 2026-07-28) or has listed the resources, and tells it what
//! changed: `notifications/resources/list_changed` when a record or a run is new,
//! `notifications/resources/updated` for a subscribed resource whose content changed.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::RoleServer;
use rmcp::model::{
    ListResourcesResult, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::{Peer, SubscriptionSendError, SubscriptionSink};
use serde_json::{Value, json};

use crate::ledger::{ExecutionRecord, Ledger, LedgerError, RunFilter, RunRow};

/// The newest execution records, a summary each.
pub const EXECUTIONS: &str = "kavi://executions";
/// The newest runs, a summary each.
pub const RUNS: &str = "kavi://runs";

/// How often the ledger is read again for what changed while a client watches.
pub const POLL: Duration = Duration::from_millis(500);

const JSON: &str = "application/json";

/// What a `kavi://` URI names.
enum Address {
    Executions,
    Runs,
    /// An execution by its id or a unique prefix of it.
    Execution(String),
    Run(i64),
}

fn address(uri: &str) -> Result<Address, McpError> {
    let unknown = || {
        McpError::resource_not_found(
            format!(
                "no resource `{uri}`: kavi's resources are {EXECUTIONS}, {EXECUTIONS}/{{execution_id}}, \
                 {RUNS} and {RUNS}/{{run_id}}"
            ),
            None,
        )
    };
    match uri.strip_prefix("kavi://").ok_or_else(unknown)? {
        "executions" => Ok(Address::Executions),
        "runs" => Ok(Address::Runs),
        rest => match rest.split_once('/') {
            Some(("executions", id))
                if !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') =>
            {
                Ok(Address::Execution(id.to_owned()))
            }
            Some(("runs", id)) => id.parse().map(Address::Run).map_err(|_| unknown()),
            _ => Err(unknown()),
        },
    }
}

/// Whether `uri` names a resource kavi has (whether or not the record exists).
pub fn is_kavi_uri(uri: &str) -> bool {
    address(uri).is_ok()
}

fn ledger_error(e: LedgerError) -> McpError {
    match e {
        LedgerError::ExecutionNotFound(_)
        | LedgerError::ExecutionAmbiguous(_)
        | LedgerError::RunNotFound(_) => McpError::resource_not_found(e.to_string(), None),
        other => McpError::internal_error(format!("reading the ledger failed: {other}"), None),
    }
}

fn execution_uri(id: &str) -> String {
    format!("{EXECUTIONS}/{id}")
}

fn run_uri(id: i64) -> String {
    format!("{RUNS}/{id}")
}

fn execution_resource(record: &ExecutionRecord) -> Resource {
    let outcome = if record.success { "ok" } else { "failed" };
    let short = &record.execution_id[..record.execution_id.len().min(8)];
    let mut description = format!("started {}", record.started_at);
    if let Some(caller) = &record.caller {
        description.push_str(&format!(", called by {caller}"));
    }
    if let Some(error) = &record.error {
        description.push_str(&format!(": {error}"));
    }
    Resource::new(
        execution_uri(&record.execution_id),
        format!("execution {short}"),
    )
    .with_title(format!("`{}` {outcome}", record.skill))
    .with_description(description)
    .with_mime_type(JSON)
}

fn run_resource(run: &RunRow) -> Resource {
    Resource::new(run_uri(run.id), format!("run {}", run.id))
        .with_title(format!("{} {}", run.pipeline, run.status))
        .with_description(format!("started {}", run.started_at))
        .with_mime_type(JSON)
}

/// One page of `resources/list`: on the first, the two summaries; then the execution records
/// that have ended, newest first, then the runs. A cursor is `executions/<key>` (the records
/// before that key), `runs` (the runs from the newest) or `runs/<id>` (the runs before it).
pub fn list(
    ledger: &Ledger,
    cursor: Option<&str>,
    page: usize,
) -> Result<ListResourcesResult, McpError> {
    let bad = |cursor: &str| {
        McpError::invalid_params(
            format!(
                "invalid cursor `{cursor}`: give the `nextCursor` a page of resources/list ended with"
            ),
            None,
        )
    };
    let mut resources = Vec::new();
    // Where the page starts: among the records (before a key) or among the runs.
    let (records_before, runs_before) = match cursor {
        None => {
            resources.push(
                Resource::new(EXECUTIONS, "executions")
                    .with_title("The newest execution records")
                    .with_mime_type(JSON),
            );
            resources.push(
                Resource::new(RUNS, "runs")
                    .with_title("The newest runs")
                    .with_mime_type(JSON),
            );
            (Some(None), None)
        }
        Some("runs") => (None, None),
        Some(cursor) => match cursor.split_once('/') {
            Some(("executions", key)) => (Some(Some(key.parse().map_err(|_| bad(cursor))?)), None),
            Some(("runs", id)) => (None, Some(id.parse().map_err(|_| bad(cursor))?)),
            _ => return Err(bad(cursor)),
        },
    };
    let mut room = page;
    if let Some(before) = records_before {
        let records = ledger
            .finished_executions(before, room + 1)
            .map_err(ledger_error)?;
        if records.len() > room {
            resources.extend(records[..room].iter().map(|(_, r)| execution_resource(r)));
            let mut result = ListResourcesResult::with_all_items(resources);
            result.next_cursor = records[..room]
                .last()
                .map(|(key, _)| format!("executions/{key}"));
            return Ok(result.with_ttl_ms(0));
        }
        resources.extend(records.iter().map(|(_, r)| execution_resource(r)));
        room -= records.len();
    }
    let filter = RunFilter {
        before: runs_before,
        ..RunFilter::default()
    };
    let runs = ledger.find_runs(&filter, room + 1).map_err(ledger_error)?;
    let mut result = ListResourcesResult::with_all_items(resources);
    if runs.len() > room {
        result
            .resources
            .extend(runs[..room].iter().map(run_resource));
        result.next_cursor = Some(match runs[..room].last() {
            Some(last) => format!("runs/{}", last.id),
            None => "runs".to_owned(),
        });
    } else {
        result.resources.extend(runs.iter().map(run_resource));
    }
    Ok(result.with_ttl_ms(0))
}

/// One execution record and one run, by id.
pub fn templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(format!("{EXECUTIONS}/{{execution_id}}"), "execution")
            .with_title("An execution record, by its id or a unique prefix of it")
            .with_mime_type(JSON),
        ResourceTemplate::new(format!("{RUNS}/{{run_id}}"), "run")
            .with_title("A run, with its nodes, by its id")
            .with_mime_type(JSON),
    ]
}

/// What `uri` holds now, as JSON text.
fn content(ledger: &Ledger, uri: &str, page: usize) -> Result<String, McpError> {
    let value = match address(uri)? {
        Address::Execution(id) => json!(ledger.execution(&id).map_err(ledger_error)?),
        Address::Run(id) => json!(ledger.run_detail(id).map_err(ledger_error)?),
        Address::Executions => {
            let records = ledger
                .finished_executions(None, page)
                .map_err(ledger_error)?;
            Value::Array(
                records
                    .iter()
                    .map(|(_, r)| {
                        json!({
                            "uri": execution_uri(&r.execution_id),
                            "execution_id": r.execution_id,
                            "skill": r.skill,
                            "success": r.success,
                            "started_at": r.started_at,
                            "caller": r.caller,
                        })
                    })
                    .collect(),
            )
        }
        Address::Runs => {
            let runs = ledger.list_runs(page).map_err(ledger_error)?;
            Value::Array(
                runs.iter()
                    .map(|run| {
                        json!({
                            "uri": run_uri(run.id),
                            "id": run.id,
                            "pipeline": run.pipeline,
                            "status": run.status,
                            "started_at": run.started_at,
                            "finished_at": run.finished_at,
                        })
                    })
                    .collect(),
            )
        }
    };
    Ok(serde_json::to_string_pretty(&value).expect("JSON serializes"))
}

pub fn read(ledger: &Ledger, uri: &str, page: usize) -> Result<ReadResourceResult, McpError> {
    let text = content(ledger, uri, page)?;
    Ok(
        ReadResourceResult::new(vec![ResourceContents::TextResourceContents {
            uri: uri.to_owned(),
            mime_type: Some(JSON.to_owned()),
            text,
            meta: None,
        }])
        .with_ttl_ms(0),
    )
}

/// The newest record and run: a new one of either changes the list.
fn newest(ledger: &Ledger) -> Result<(Option<String>, Option<i64>), McpError> {
    let record = ledger
        .finished_executions(None, 1)
        .map_err(ledger_error)?
        .pop()
        .map(|(_, r)| r.execution_id);
    let run = ledger
        .list_runs(1)
        .map_err(ledger_error)?
        .pop()
        .map(|r| r.id);
    Ok((record, run))
}

/// Who watches what: subscriptions of both protocol generations, and what each watched
/// resource held when last read.
#[derive(Default)]
pub struct Watch {
    state: Mutex<Watched>,
    started: AtomicBool,
}

#[derive(Default)]
struct Watched {
    /// The session's peer, for the notifications of protocol versions up to 2025-11-25.
    peer: Option<Peer<RoleServer>>,
    /// URIs subscribed with `resources/subscribe` (up to 2025-11-25).
    subscribed: BTreeSet<String>,
    /// Open `subscriptions/listen` streams (2026-07-28).
    listeners: Vec<SubscriptionSink>,
    /// What each watched URI held when last read.
    seen: HashMap<String, String>,
}

/// Whether the session negotiated a version with `initialize`, whose notifications go to the
/// peer itself rather than to a `subscriptions/listen` stream.
fn has_initialize(peer: &Peer<RoleServer>) -> bool {
    peer.peer_info()
        .is_some_and(|info| info.protocol_version.has_initialize())
}

impl Watch {
    /// Starts reading the ledger for changes (once), telling `peer`'s client.
    pub fn start(self: &Arc<Self>, peer: &Peer<RoleServer>, ledger: &std::path::Path, page: usize) {
        self.state
            .lock()
            .expect("watch lock")
            .peer
            .get_or_insert_with(|| peer.clone());
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let watch = self.clone();
        let ledger = ledger.to_owned();
        // Taken now, so that a record added before the first poll is a change.
        let mut last = Ledger::open_existing(&ledger)
            .ok()
            .and_then(|l| newest(&l).ok());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(POLL).await;
                let Ok(opened) = Ledger::open_existing(&ledger) else {
                    continue;
                };
                let now = newest(&opened).ok();
                let list_changed = now.is_some() && now != last && last.is_some();
                if now.is_some() {
                    last = now;
                }
                let updated = watch.changed(&opened, page);
                drop(opened);
                if !watch.notify(list_changed, &updated).await {
                    return;
                }
            }
        });
    }

    /// Remembers what `uri` holds now, so that the next change to it is told.
    fn baseline(&self, ledger: &Ledger, uri: &str, page: usize) {
        if let Ok(text) = content(ledger, uri, page) {
            let mut state = self.state.lock().expect("watch lock");
            state.seen.entry(uri.to_owned()).or_insert(text);
        }
    }

    /// A `resources/subscribe` (up to 2025-11-25).
    pub fn subscribe(&self, ledger: &Ledger, uri: &str, page: usize) {
        self.baseline(ledger, uri, page);
        self.state
            .lock()
            .expect("watch lock")
            .subscribed
            .insert(uri.to_owned());
    }

    pub fn unsubscribe(&self, uri: &str) {
        self.state
            .lock()
            .expect("watch lock")
            .subscribed
            .remove(uri);
    }

    /// A `subscriptions/listen` stream (2026-07-28), until [`Self::stop_listening`].
    pub fn listen(&self, ledger: &Ledger, sink: SubscriptionSink, page: usize) {
        for uri in sink.accepted().resource_subscriptions.iter().flatten() {
            self.baseline(ledger, uri, page);
        }
        self.state.lock().expect("watch lock").listeners.push(sink);
    }

    pub fn stop_listening(&self, sink: &SubscriptionSink) {
        self.state
            .lock()
            .expect("watch lock")
            .listeners
            .retain(|open| open.id() != sink.id());
    }

    /// The open `subscriptions/listen` streams.
    pub fn listeners(&self) -> Vec<SubscriptionSink> {
        self.state.lock().expect("watch lock").listeners.clone()
    }

    /// The watched URIs whose content changed since they were last read.
    fn changed(&self, ledger: &Ledger, page: usize) -> Vec<String> {
        let watched: BTreeSet<String> = {
            let state = self.state.lock().expect("watch lock");
            let listened = state.listeners.iter().flat_map(|sink| {
                sink.accepted()
                    .resource_subscriptions
                    .clone()
                    .unwrap_or_default()
            });
            state.subscribed.iter().cloned().chain(listened).collect()
        };
        let mut changed = Vec::new();
        for uri in watched {
            // A record that is gone (collected) is a change too.
            let text = content(ledger, &uri, page).unwrap_or_else(|e| e.message.to_string());
            let mut state = self.state.lock().expect("watch lock");
            if state.seen.get(&uri) != Some(&text) {
                state.seen.insert(uri.clone(), text);
                changed.push(uri);
            }
        }
        changed
    }

    /// Tells the client; false once its session is gone.
    async fn notify(&self, list_changed: bool, updated: &[String]) -> bool {
        let (peer, subscribed, listeners) = {
            let state = self.state.lock().expect("watch lock");
            (
                state.peer.clone(),
                state.subscribed.clone(),
                state.listeners.clone(),
            )
        };
        if let Some(peer) = peer.filter(has_initialize) {
            if list_changed && peer.notify_resource_list_changed().await.is_err() {
                return false;
            }
            for uri in updated.iter().filter(|uri| subscribed.contains(*uri)) {
                let param = ResourceUpdatedNotificationParam::new(uri.clone());
                if peer.notify_resource_updated(param).await.is_err() {
                    return false;
                }
            }
        }
        for sink in listeners {
            let accepted = sink.accepted().clone();
            let mut sent = Ok(());
            if list_changed && accepted.resources_list_changed == Some(true) {
                sent = sink.notify_resource_list_changed().await;
            }
            for uri in updated {
                if sent.is_err() {
                    break;
                }
                if accepted
                    .resource_subscriptions
                    .as_ref()
                    .is_some_and(|uris| uris.contains(uri))
                {
                    sent = sink.notify_resource_updated(uri.clone()).await;
                }
            }
            if let Err(SubscriptionSendError::SubscriptionClosed) = sent {
                self.stop_listening(&sink);
            }
        }
        true
    }
}
