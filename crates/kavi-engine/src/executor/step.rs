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
use super::{Executor, Observer, Slot, counts_as_failure, sleep_until_opt};
use crate::dag::Dag;
use crate::heartbeat::{Beat, Heartbeat};
use crate::ledger::{Claim, Ledger, LedgerError, NodeRecord, NodeRunRow, RunDetail, lease_over};
use crate::node::Environment;
use crate::spec::{FanOut, NodeSpec};
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
/// are), which claims its attempt; `work` says what of it.
#[derive(Debug, Clone, Copy)]
pub struct StepOf<'a> {
    pub run: &'a RunDetail,
    pub index: usize,
    pub work: StepWork,
    pub claimant: &'a str,
}

/// What a step does with its node. A node that runs once per item (`for_each`) takes three
/// kinds of step, as the in-process executor takes three turns: one decides it and records its
/// instances, one runs each instance, one ends it with the list of their outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepWork {
    /// Decides the node and runs it once; for a fan-out, its instance at this position.
    Run { instance: Option<usize> },
    /// Decides a fan-out and records its instances, pending (none when it is decided without
    /// them: blocked, skipped, no items). Done again, it records nothing and gives them again.
    Expand,
    /// Ends a fan-out whose instances have all finished (the caller checks), as the executor
    /// gathers them.
    Gather,
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
    /// For [`StepWork::Expand`]: the fan-out's instances, in item order, each `{"id": "f[0]",
    /// "item": ...}`; `None` when the fan-out was decided without them.
    pub instances: Option<Vec<Value>>,
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
        work,
        claimant,
    }: StepOf<'_>,
) -> Result<StepOutcome, LedgerError> {
    let rows = rows_by_node(run);
    let node = &dag.pipeline.nodes[index];
    let id = match work {
        StepWork::Run {
            instance: Some(position),
        } => FanOut::instance_id(&node.id, position),
        _ => node.id.clone(),
    };
    let rows_here = rows.get(id.as_str()).map_or(&[][..], Vec::as_slice);
    // A fan-out decided already (ended, or decided without instances) is not decided again.
    if matches!(work, StepWork::Expand | StepWork::Gather)
        && let Progress::Finished(state) = progress(node, rows_here)
    {
        return Ok(decided(state));
    }
    let expanded = instances_recorded(&rows, &node.id);
    // The attempt this step would run, claimed before anything is decided: of two steps of one
    // node, the one that wins decides it, and the other waits for it.
    let to_claim = match (work, progress(node, rows_here)) {
        (StepWork::Gather, _) => None,
        (StepWork::Expand, _) if expanded > 0 => None,
        // A fan-out is decided once: a step that died deciding it left its claim to lapse.
        (StepWork::Expand, Progress::Abandoned { attempt }) => {
            if let Some((by, until)) = ledger.claim_on(run.run.id, &node.id, attempt)?
                && !lease_over(Some(&until))
            {
                return Ok(claimed(attempt, by));
            }
            None
        }
        (StepWork::Expand, _) => Some(1),
        (_, Progress::NotStarted) => Some(1),
        (_, Progress::Retry { attempt }) => Some(attempt),
        (_, Progress::Abandoned { attempt }) => {
            if let Some((by, until)) = ledger.claim_on(run.run.id, &id, attempt)?
                && !lease_over(Some(&until))
            {
                return Ok(claimed(attempt, by));
            }
            (attempt < node.retry.attempts).then_some(attempt + 1)
        }
        (_, Progress::Finished(_)) => None,
    };
    let heartbeat = match to_claim {
        Some(attempt) => {
            match ledger.claim_attempt(run.run.id, &id, node.kind, attempt, claimant)? {
                // Deciding a fan-out starts nothing that runs on: no lease to renew.
                Claim::Won if work == StepWork::Expand => None,
                Claim::Won => Some(claim_heartbeat(
                    ledger.another_connection()?,
                    (run.run.id, id.clone(), attempt, claimant.to_owned()),
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
    let skip = match work {
        StepWork::Run { instance: None } => Some(index),
        _ => None,
    };
    executor.load_recorded(&rows, skip, &id);
    match work {
        StepWork::Expand => return expand(executor, index, expanded),
        StepWork::Gather => return gather_instances(executor, index),
        StepWork::Run { .. } => {}
    }
    // The slot the step runs: the node's own, or its instance's, added with its item.
    let target = match work {
        StepWork::Run {
            instance: Some(position),
        } => executor.instance_slot(index, position)?,
        _ => index,
    };
    executor.starts_only = Some(target);
    let last_attempt = rows_here
        .last()
        .map_or(1, |row| u32::try_from(row.attempt).unwrap_or(u32::MAX));
    let attempt = match progress(node, rows_here) {
        // Decided while its item was looked for (a `for_each` that no longer gives it).
        _ if executor.slots[target].state.is_some() => 1,
        Progress::NotStarted => {
            executor.ready.push(Reverse(target));
            1
        }
        Progress::Retry { attempt } => {
            executor.to_start.push(Reverse((target, attempt)));
            attempt
        }
        Progress::Abandoned { attempt } => {
            executor.finish_without_running_attempt(
                target,
                attempt,
                NodeState::Interrupted,
                None,
                Some("the step running it ended before it finished"),
            )?;
            if attempt < node.retry.attempts {
                executor.to_start.push(Reverse((target, attempt + 1)));
                attempt + 1
            } else {
                executor.note_final(target, NodeState::Interrupted);
                attempt
            }
        }
        Progress::Finished(state) => {
            executor.recorder.finish()?;
            return Ok(StepOutcome {
                attempt: last_attempt,
                ..decided(state)
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
    let state = executor.slots[target]
        .state
        .or(ended_in)
        .unwrap_or(NodeState::Pending);
    Ok(StepOutcome {
        attempt,
        state,
        retry,
        ..decided(state)
    })
}

/// How many instances of fan-out `node` the run recorded (they are recorded all at once).
fn instances_recorded(rows: &HashMap<&str, Vec<&NodeRunRow>>, node: &str) -> usize {
    rows.keys()
        .filter(|id| FanOut::instance_of(id).is_some_and(|(of, _)| of == node))
        .count()
}

/// Decides fan-out `index` and records its instances, or, when an earlier step did
/// (`expanded` of them), gives them again.
fn expand(
    mut executor: Executor<'_>,
    index: usize,
    expanded: usize,
) -> Result<StepOutcome, LedgerError> {
    let node = executor.spec(index);
    let items = if expanded > 0 {
        // The same items: what they are made from (parameters, finished nodes' outputs) is
        // recorded and does not change; the instances are those recorded, whatever happens.
        let items = executor
            .items(index)
            .ok()
            .filter(|items| items.len() == expanded);
        (0..expanded)
            .map(|position| {
                items
                    .as_ref()
                    .map_or(Value::Null, |items| items[position].clone())
            })
            .collect()
    } else {
        executor.settle_fan_out(index)?;
        match executor.slots[index].instances.clone() {
            Some((slots, _)) if executor.slots[index].state.is_none() => slots
                .filter_map(|slot| executor.slots[slot].instance.clone())
                .map(|(_, item)| item)
                .collect(),
            _ => Vec::new(),
        }
    };
    executor.recorder.finish()?;
    if let Some(state) = executor.slots[index].state {
        return Ok(decided(state));
    }
    let instances = items
        .into_iter()
        .enumerate()
        .map(|(position, item)| json!({ "id": FanOut::instance_id(&node.id, position), "item": item }))
        .collect();
    Ok(StepOutcome {
        instances: Some(instances),
        ..decided(NodeState::Running)
    })
}

/// Ends fan-out `index`, whose instances have all finished, as the executor does.
fn gather_instances(mut executor: Executor<'_>, index: usize) -> Result<StepOutcome, LedgerError> {
    let slots: Vec<usize> = (0..executor.slots.len())
        .filter(|&slot| {
            executor.slots[slot].node == index && executor.slots[slot].instance.is_some()
        })
        .collect();
    let range = match (slots.first(), slots.last()) {
        (Some(&first), Some(&last)) => first..last + 1,
        _ => executor.slots.len()..executor.slots.len(),
    };
    executor.slots[index].instances = Some((range, 0));
    executor.gather(index)?;
    executor.recorder.finish()?;
    let state = executor.slots[index].state.unwrap_or(NodeState::Pending);
    Ok(decided(state))
}

/// A step that found its node decided, in `state`.
fn decided(state: NodeState) -> StepOutcome {
    StepOutcome {
        attempt: 1,
        state,
        retry: false,
        claimed_by: None,
        instances: None,
    }
}

impl Executor<'_> {
    /// Puts what the run recorded so far into the executor, as its loop would have it: each
    /// finished node's and instance's state and outputs (for templates and `fail_fast`), and
    /// the attempts started (for the budgets). Node `skip` and row `id` are the step's own.
    fn load_recorded(
        &mut self,
        rows: &HashMap<&str, Vec<&NodeRunRow>>,
        skip: Option<usize>,
        id: &str,
    ) {
        let nodes = &self.dag.pipeline.nodes;
        for (row_id, rows) in rows {
            let of = FanOut::instance_of(row_id).map_or(*row_id, |(of, _)| of);
            let Some(i) = nodes.iter().position(|n| n.id == of) else {
                continue;
            };
            let started = rows.iter().filter(|row| row.started_at.is_some()).count();
            let started = u32::try_from(started).unwrap_or(u32::MAX);
            self.attempts_started += started;
            if nodes[i].calls_http {
                self.http_attempts_started += started;
            }
        }
        for (i, node) in nodes.iter().enumerate() {
            let here = rows.get(node.id.as_str()).map_or(&[][..], Vec::as_slice);
            if Some(i) != skip
                && let Progress::Finished(state) = progress(node, here)
            {
                let last = here.last().expect("a finished node has rows");
                self.slots[i].entry = entry_of(node, last);
                self.note_final(i, state);
            }
            if node.fan_out.is_none() {
                continue;
            }
            // Its instances, in item order: a fan-out's gathering reads them as one range.
            for position in 0.. {
                let instance = FanOut::instance_id(&node.id, position);
                let Some(here) = rows.get(instance.as_str()) else {
                    break;
                };
                let Progress::Finished(state) = progress(node, here) else {
                    continue;
                };
                if instance == id {
                    continue;
                }
                let last = here.last().expect("a finished instance has rows");
                let entry = entry_of(node, last);
                let item = entry["outputs"]["item"].clone();
                self.slots.push(Slot {
                    entry,
                    instance: Some((position, item)),
                    ..Slot::new(i, 0)
                });
                self.note_final(self.slots.len() - 1, state);
            }
        }
    }

    /// Adds the slot of fan-out `index`'s instance at `position`, with its item; when its
    /// `for_each` no longer gives one there, the instance is recorded failed.
    fn instance_slot(&mut self, index: usize, position: usize) -> Result<usize, LedgerError> {
        let item = match self.items(index) {
            Ok(items) => items.get(position).cloned().ok_or_else(|| {
                format!(
                    "`for_each` gives {} item(s) now, none at position {position}",
                    items.len()
                )
            }),
            Err(error) => Err(error),
        };
        let slot = self.slots.len();
        let (item, error) = match item {
            Ok(item) => (item, None),
            Err(error) => (Value::Null, Some(error)),
        };
        self.slots.push(Slot {
            instance: Some((position, item)),
            ..Slot::new(index, 0)
        });
        if let Some(error) = error {
            self.finish_without_running(slot, NodeState::Failed, Some(&error), None)?;
        }
        Ok(slot)
    }
}

/// A step that ran nothing: attempt `attempt` is another's, `by`.
fn claimed(attempt: u32, by: String) -> StepOutcome {
    StepOutcome {
        attempt,
        claimed_by: Some(by),
        ..decided(NodeState::Running)
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
        // A fan-out's instances first: each as a node of its own, whose fan-out then fails.
        if node.fan_out.is_some() {
            for position in 0.. {
                let id = FanOut::instance_id(&node.id, position);
                let Some(rows) = rows.get(id.as_str()) else {
                    break;
                };
                unfinished +=
                    usize::from(settle_unfinished(ledger, run.run.id, node, &id, rows)?.is_none());
            }
        }
        let here = rows.get(node.id.as_str()).map_or(&[][..], Vec::as_slice);
        let state = match settle_unfinished(ledger, run.run.id, node, &node.id, here)? {
            Some(state) => state,
            None => {
                unfinished += 1;
                NodeState::Cancelled
            }
        };
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

/// The final state of `node`'s row `id` (the node's own, or an instance's); `None` when no
/// step decided it, now recorded `cancelled` (not started) or `interrupted` (its step died).
fn settle_unfinished(
    ledger: &mut Ledger,
    run_id: i64,
    node: &NodeSpec,
    id: &str,
    rows: &[&NodeRunRow],
) -> Result<Option<NodeState>, LedgerError> {
    let (state, attempt, reason) = match progress(node, rows) {
        Progress::Finished(state) => return Ok(Some(state)),
        // No step tried again: the last failure stands.
        Progress::Retry { .. } => {
            return Ok(Some(rows.last().map_or(NodeState::Failed, |r| r.state)));
        }
        Progress::NotStarted => (
            NodeState::Cancelled,
            1,
            "not started: the run ended before its step ran",
        ),
        Progress::Abandoned { attempt } => (
            NodeState::Interrupted,
            attempt,
            "the step running it ended before it finished",
        ),
    };
    ledger.finish_node(
        run_id,
        id,
        attempt,
        state,
        &NodeRecord {
            reason: Some(reason.to_owned()),
            ..Default::default()
        },
    )?;
    Ok(None)
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
