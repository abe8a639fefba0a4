//! Runs whose nodes something else schedules: a distributed engine such as Argo Workflows runs
//! `kavi pipeline start` once, `kavi pipeline step` for each node once the nodes it needs have
//! finished (each step a process of its own, on any machine that shares the ledger), and
//! `kavi pipeline end` last.
//!
//! The engine only orders the steps; what each node does is decided here exactly as in a run
//! kavi schedules itself: a step reads what the run recorded so far (the nodes' states and
//! outputs, the attempts spent), then skips, blocks, takes from the cache or runs its node once.
//! A step never retries in-process: when the node's retry policy wants another try, the step
//! says so (see [`StepOutcome::retry`]) and the engine starts the next one, which finds the
//! failed attempt in the ledger.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::recorder::Recorder;
use super::{Executor, Observer, counts_as_failure, sleep_until_opt};
use crate::dag::Dag;
use crate::heartbeat::{Beat, Heartbeat};
use crate::ledger::{Claim, Ledger, LedgerError, NodeRecord, NodeRunRow, RunDetail, lease_over};
use crate::node::Environment;
use crate::spec::NodeSpec;
use crate::state::{NodeState, RunStatus};

/// Where one node of a run stands, from its rows in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Nothing decided yet: its step decides it, or runs its first attempt.
    NotStarted,
    /// Its last attempt failed in a way its retry policy tries again: `attempt` is next.
    Retry { attempt: u32 },
    /// Attempt `attempt` was started by a step that never recorded its end.
    Abandoned { attempt: u32 },
    /// Decided: nothing more runs.
    Finished(NodeState),
}

/// Where `node` stands, given its rows (its attempts, in order).
pub fn progress(node: &NodeSpec, rows: &[&NodeRunRow]) -> Progress {
    let Some(last) = rows.last() else {
        return Progress::NotStarted;
    };
    let attempt = u32::try_from(last.attempt).unwrap_or(u32::MAX);
    match last.state {
        NodeState::Pending => Progress::NotStarted,
        NodeState::Running => Progress::Abandoned { attempt },
        state => {
            let exit_code = last.exit_code.and_then(|code| i32::try_from(code).ok());
            let outputs = last.outputs.clone().unwrap_or(Value::Null);
            // Only an attempt that ran is tried again: a node failed without running (its
            // `when` could not be evaluated, its inputs not read) is decided.
            let ran = last.started_at.is_some();
            if ran
                && attempt < node.retry.attempts
                && node.retry.retries(state, exit_code, &outputs)
            {
                Progress::Retry {
                    attempt: attempt + 1,
                }
            } else {
                Progress::Finished(state)
            }
        }
    }
}

/// Each node's rows, by node id, in attempt order.
pub fn rows_by_node(run: &RunDetail) -> HashMap<&str, Vec<&NodeRunRow>> {
    let mut rows: HashMap<&str, Vec<&NodeRunRow>> = HashMap::new();
    for row in &run.nodes {
        rows.entry(row.node_id.as_str()).or_default().push(row);
    }
    rows
}

/// The node a step decides: node `index` of `run`, for `claimant` (the step, named as owners
/// are), which claims its attempt.
#[derive(Debug, Clone, Copy)]
pub struct StepOf<'a> {
    pub run: &'a RunDetail,
    pub index: usize,
    pub claimant: &'a str,
}

/// What one step did.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    /// The attempt it recorded.
    pub attempt: u32,
    /// The state that attempt ended in.
    pub state: NodeState,
    /// The node's retry policy wants another attempt: the engine should run the step again.
    pub retry: bool,
    /// Another step holds the attempt (named as owners are) and runs it: this one ran nothing.
    pub claimed_by: Option<String>,
}

/// Decides node `index` of `run` and runs it once, as the in-process executor would at this
/// point of the run. Every node it needs must have finished (the caller checks).
pub async fn execute_step(
    dag: &Dag<'_>,
    env: Arc<Environment>,
    ledger: &mut Ledger,
    observer: &mut (dyn Observer + Send),
    cancel: CancellationToken,
    StepOf {
        run,
        index,
        claimant,
    }: StepOf<'_>,
) -> Result<StepOutcome, LedgerError> {
    let rows = rows_by_node(run);
    let node = &dag.pipeline.nodes[index];
    let rows_here = rows.get(node.id.as_str()).map_or(&[][..], Vec::as_slice);
    // The attempt this step would run, claimed before anything is decided: of two steps of one
    // node, the one that wins decides it, and the other waits for it.
    let to_claim = match progress(node, rows_here) {
        Progress::NotStarted => Some(1),
        Progress::Retry { attempt } => Some(attempt),
        Progress::Abandoned { attempt } => {
            if let Some((by, until)) = ledger.claim_on(run.run.id, &node.id, attempt)?
                && !lease_over(Some(&until))
            {
                return Ok(claimed(attempt, by));
            }
            (attempt < node.retry.attempts).then_some(attempt + 1)
        }
        Progress::Finished(_) => None,
    };
    let heartbeat = match to_claim {
        Some(attempt) => {
            match ledger.claim_attempt(run.run.id, &node.id, node.kind, attempt, claimant)? {
                Claim::Won => Some(claim_heartbeat(
                    ledger.another_connection()?,
                    (run.run.id, node.id.clone(), attempt, claimant.to_owned()),
                    cancel.clone(),
                )),
                Claim::Held { by, .. } => return Ok(claimed(attempt, by)),
            }
        }
        None => None,
    };
    let recorder = Recorder::start(ledger, run.run.id)?;
    let mut executor = Executor::new(
        dag,
        env,
        ledger,
        observer,
        run.run.params.clone(),
        (recorder, run.run.id),
        cancel,
    );
    executor.starts_only = Some(index);
    let (mut progress_here, mut last_attempt) = (Progress::NotStarted, 1);
    for (i, node) in dag.pipeline.nodes.iter().enumerate() {
        let rows = rows.get(node.id.as_str()).map_or(&[][..], Vec::as_slice);
        let started = rows.iter().filter(|row| row.started_at.is_some()).count();
        let started = u32::try_from(started).unwrap_or(u32::MAX);
        executor.attempts_started += started;
        if node.calls_http {
            executor.http_attempts_started += started;
        }
        match progress(node, rows) {
            here if i == index => {
                progress_here = here;
                last_attempt = rows
                    .last()
                    .map_or(1, |row| u32::try_from(row.attempt).unwrap_or(u32::MAX));
            }
            Progress::Finished(state) => {
                let last = rows.last().expect("a finished node has rows");
                executor.slots[i].entry = entry_of(node, last);
                executor.note_final(i, state);
            }
            _ => {}
        }
    }
    let attempt = match progress_here {
        Progress::NotStarted => {
            executor.ready.push(Reverse(index));
            1
        }
        Progress::Retry { attempt } => {
            executor.to_start.push(Reverse((index, attempt)));
            attempt
        }
        Progress::Abandoned { attempt } => {
            executor.finish_without_running_attempt(
                index,
                attempt,
                NodeState::Interrupted,
                None,
                Some("the step running it ended before it finished"),
            )?;
            let node = &dag.pipeline.nodes[index];
            if attempt < node.retry.attempts {
                executor.to_start.push(Reverse((index, attempt + 1)));
                attempt + 1
            } else {
                executor.note_final(index, NodeState::Interrupted);
                attempt
            }
        }
        Progress::Finished(state) => {
            executor.recorder.finish()?;
            return Ok(StepOutcome {
                attempt: last_attempt,
                state,
                retry: false,
                claimed_by: None,
            });
        }
    };
    // The run's wall budget counts from its start, whichever machine started it.
    let wall = dag.pipeline.budget.wall.map(|limit| {
        let spent = since_start(run);
        (
            std::time::Instant::now() + limit.saturating_sub(spent),
            limit,
        )
    });
    if wall.is_some_and(|(at, _)| at <= std::time::Instant::now()) {
        executor.spend_budget("wall", &super::wall_text(wall));
    }
    let mut done = executor.settle_ready()?;
    executor.start_due_nodes()?;
    let mut ended_in = None;
    // The node's attempt runs, or waits for a slot of its concurrency group first.
    while done == 0 && (!executor.running.is_empty() || executor.waiting_for_group) {
        tokio::select! {
            joined = executor.running.join_next(), if !executor.running.is_empty() => {
                let task = joined.expect("join set is not empty").expect("node tasks do not panic");
                let (finished, state) = executor.task_done(task)?;
                done += finished;
                ended_in = state.or(ended_in);
                // A node whose key is now whole and found nothing is due to start.
                executor.start_due_nodes()?;
            }
            () = tokio::time::sleep(crate::groups::RETRY), if executor.waiting_for_group => {
                executor.start_due_nodes()?;
            }
            () = executor.run_cancel.cancelled(), if executor.stop_reason.is_none() => {
                executor.stop("run cancelled");
            }
            () = sleep_until_opt(wall.map(|(at, _)| at)), if !executor.budget_spent => {
                executor.spend_budget("wall", &super::wall_text(wall));
            }
        }
    }
    executor.recorder.finish()?;
    drop(heartbeat);
    let retry = !executor.retries.is_empty();
    // Decided without running (the attempt never started), or the state its attempt ended in.
    let state = executor.slots[index]
        .state
        .or(ended_in)
        .unwrap_or(NodeState::Pending);
    Ok(StepOutcome {
        attempt,
        state,
        retry,
        claimed_by: None,
    })
}

/// A step that ran nothing: attempt `attempt` is another's, `by`.
fn claimed(attempt: u32, by: String) -> StepOutcome {
    StepOutcome {
        attempt,
        state: NodeState::Running,
        retry: false,
        claimed_by: Some(by),
    }
}

/// How long ago the run started, whichever machine started it.
fn since_start(run: &RunDetail) -> Duration {
    run.run
        .started_at
        .parse::<jiff::Timestamp>()
        .ok()
        .and_then(|started| Duration::try_from(jiff::Timestamp::now() - started).ok())
        .unwrap_or_default()
}

/// What templates see of a node that finished, from its last row (as the executor keeps it).
fn entry_of(node: &NodeSpec, row: &NodeRunRow) -> Value {
    // A cached or reused result is what the node gave when it ran: it succeeded then.
    let (state, error) = match row.state {
        NodeState::Cached | NodeState::Reused => (NodeState::Succeeded, None),
        state => (state, row.error.clone().or_else(|| row.reason.clone())),
    };
    json!({
        "state": state,
        "kind": node.kind,
        "error": error,
        "outputs": row.outputs.clone().unwrap_or_else(|| json!({})),
    })
}

/// Closes a run whose steps are over (`kavi pipeline end`): a node no step decided is recorded
/// `cancelled` (not started) or `interrupted` (its step died), and the run gets its status from
/// its nodes' final states, as the in-process executor gives it.
pub fn settle_external_run(
    dag: &Dag<'_>,
    ledger: &mut Ledger,
    run: &RunDetail,
) -> Result<RunStatus, LedgerError> {
    let rows = rows_by_node(run);
    let (mut failed, mut awaiting_review, mut unfinished) = (false, false, 0);
    for node in &dag.pipeline.nodes {
        let rows = rows.get(node.id.as_str()).map_or(&[][..], Vec::as_slice);
        let (state, attempt, reason) = match progress(node, rows) {
            Progress::Finished(state) => (state, None, None),
            // No step tried again: the last failure stands.
            Progress::Retry { .. } => (
                rows.last().map_or(NodeState::Failed, |r| r.state),
                None,
                None,
            ),
            Progress::NotStarted => (
                NodeState::Cancelled,
                Some(1),
                Some("not started: the run ended before its step ran"),
            ),
            Progress::Abandoned { attempt } => (
                NodeState::Interrupted,
                Some(attempt),
                Some("the step running it ended before it finished"),
            ),
        };
        if let (Some(attempt), Some(reason)) = (attempt, reason) {
            unfinished += 1;
            ledger.finish_node(
                run.run.id,
                &node.id,
                attempt,
                state,
                &NodeRecord {
                    reason: Some(reason.to_owned()),
                    ..Default::default()
                },
            )?;
        }
        failed |= counts_as_failure(node, state);
        awaiting_review |= state == NodeState::AwaitingReview;
    }
    let (status, error) = if unfinished > 0 {
        (
            RunStatus::Interrupted,
            Some(format!(
                "the run ended before {unfinished} of its nodes finished"
            )),
        )
    } else if awaiting_review {
        (RunStatus::AwaitingReview, None)
    } else if failed {
        (RunStatus::Failed, None)
    } else {
        (RunStatus::Succeeded, None)
    };
    ledger.finish_run(run.run.id, status, since_start(run), error.as_deref())?;
    crate::ledger::cleanup::settle_run(ledger, run.run.id, status == RunStatus::Succeeded)?;
    Ok(status)
}

/// Renews a step's lease on the attempt it runs until it is dropped. Should the attempt stop
/// being the step's own (another step took it over once the lease ran out, when the ledger
/// could not be reached for that long), the node is cancelled: its result would not be
/// recorded.
fn claim_heartbeat(
    connection: crate::ledger::AnotherConnection,
    (run_id, node_id, attempt, claimant): (i64, String, u32, String),
    cancel: CancellationToken,
) -> Heartbeat {
    let what = format!("attempt {attempt} of `{node_id}`'s claim");
    Heartbeat::start(
        connection,
        what,
        move |ledger| {
            Ok(
                if ledger.renew_claim(run_id, &node_id, attempt, &claimant)? {
                    Beat::Held
                } else {
                    Beat::Lost("the attempt's claim was lost to another step: the node is stopped")
                },
            )
        },
        move |_| cancel.cancel(),
        |_| {},
    )
}
