//! The executor's node attempts: what a node's dependencies decide, starting what is due,
//! and recording how each attempt (or a node that never ran) ended.

use std::cmp::Reverse;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::Executor;
use super::recorder::Write;
use super::{Done, Event, Finished, counts_as_failure, describe_state, reads_outputs_of};
use crate::ledger::{LedgerError, NodeRecord};
use crate::node::NodeContext;
use crate::spec::{OnFailure, Trigger};
use crate::state::NodeState;

/// What a node's concurrency group lets an attempt due to start do.
enum Admission {
    /// Start, holding the group's slot (`None`: the node names no group).
    Go(Option<crate::groups::Slot>),
    /// Wait: the group is full.
    Wait,
    /// Nothing more: the attempt ended without running (recorded).
    Ended,
}

impl<'a> Executor<'a> {
    /// Why a node cannot run because of its dependencies, if it cannot.
    pub(super) fn dependency_verdict(&self, index: usize) -> Option<(NodeState, String)> {
        let nodes = &self.dag.pipeline.nodes;
        let node = self.spec(index);
        let mut deps: Vec<usize> = self.dag.dependencies(self.slots[index].node).collect();
        deps.sort_unstable();
        let failed = deps.iter().find_map(|&dep| {
            let state = self.slots[dep].state.expect("dependencies finish first");
            // `continue` lets the dependants that want success run on; a failure handler
            // still sees the failure.
            let continues =
                nodes[dep].on_failure == OnFailure::Continue && node.trigger == Trigger::Success;
            (!state.is_success() && state != NodeState::Skipped && !continues).then(|| {
                let why = format!("needs `{}`, which {}", nodes[dep].id, describe_state(state));
                (state, why)
            })
        });
        match (node.trigger, failed) {
            // Cancellation cascades as cancellation; a real failure blocks.
            (Trigger::Success, Some((NodeState::Cancelled, why))) => {
                return Some((NodeState::Cancelled, why));
            }
            (Trigger::Success, Some((_, why))) => return Some((NodeState::Blocked, why)),
            // A dependency that stopped for a person did not fail: failure handlers stay out.
            (Trigger::Failure, Some((NodeState::AwaitingReview, why))) => {
                return Some((
                    NodeState::Skipped,
                    format!("{why}; nothing failed, and it runs only on failure"),
                ));
            }
            (Trigger::Failure, None) => {
                return Some((
                    NodeState::Skipped,
                    "no dependency failed, and it runs only on failure (trigger = \"failure\")"
                        .into(),
                ));
            }
            _ => {}
        }
        // A skipped dependency is only an ordering constraint, unless this node's templates read
        // its outputs: then there is nothing to read, and this node is skipped too.
        deps.iter()
            .find(|&&dep| {
                self.slots[dep].state == Some(NodeState::Skipped)
                    && reads_outputs_of(node, &nodes[dep].id)
            })
            .map(|&dep| {
                (
                    NodeState::Skipped,
                    format!(
                        "reads the outputs of `{}`, which was skipped",
                        nodes[dep].id
                    ),
                )
            })
    }

    /// Starts what is due, as `--jobs` allows: nodes' attempts, and the making of keys (attempt
    /// 0, for a node that declares inputs: hashing them is work as an attempt is, and a pipeline
    /// of many such nodes would otherwise hash them all at once).
    pub(super) fn start_due_nodes(&mut self) -> Result<(), LedgerError> {
        // Instances whose fan-out has `max_parallel` of them running, attempts whose group is
        // full: due again next turn.
        let mut held = Vec::new();
        self.waiting_for_group = false;
        while self.running.len() < self.env.jobs.max(1) {
            let Some(Reverse((index, attempt))) = self.to_start.pop() else {
                break;
            };
            if attempt > 0 && self.stopped_for(index).is_none() && self.at_max_parallel(index) {
                held.push(Reverse((index, attempt)));
                continue;
            }
            if attempt > 0 {
                self.check_budget(index);
            }
            if let Some(reason) = self.stopped_for(index) {
                self.finish_without_running_attempt(
                    index,
                    attempt.max(1),
                    NodeState::Cancelled,
                    None,
                    Some(&format!("not started: {reason}")),
                )?;
                self.mark_done(index, NodeState::Cancelled);
                continue;
            }
            if attempt == 0 {
                self.start_keying(index);
                continue;
            }
            match self.join_group(index, attempt)? {
                Admission::Go(slot) => self.spawn_attempt(index, attempt, slot)?,
                Admission::Wait => {
                    self.waiting_for_group = true;
                    held.push(Reverse((index, attempt)));
                }
                Admission::Ended => {}
            }
        }
        self.to_start.extend(held);
        Ok(())
    }

    /// Takes a slot of the concurrency group the node of slot `index` names, for `attempt`
    /// (see [`crate::groups`]). A full group is waited for, the wait recorded on the attempt's
    /// row and shown once; `refuse` fails the attempt, not retried.
    fn join_group(&mut self, index: usize, attempt: u32) -> Result<Admission, LedgerError> {
        let node = self.spec(index);
        let Some(concurrency) = &node.concurrency else {
            return Ok(Admission::Go(None));
        };
        let first = self.slots[index].group_wait.is_none();
        let wait = self.slots[index].group_wait.get_or_insert_with(|| {
            crate::groups::GroupWait::new(concurrency.get_ref(), "node run")
        });
        let ended = match wait.try_take(self.ledger) {
            Ok(crate::groups::Turn::Took(slot)) => {
                self.slots[index].group_wait = None;
                return Ok(Admission::Go(Some(slot)));
            }
            Ok(crate::groups::Turn::Full { why, cancelled }) => {
                let node_id = self.slot_id(index);
                if first {
                    self.recorder.record(Write::Waiting {
                        node_id: node_id.clone(),
                        kind: node.kind,
                        attempt,
                        reason: format!("waiting: {why}"),
                    });
                }
                if first || !cancelled.is_empty() {
                    self.observer.event(&Event::NodeWaiting {
                        node: &node_id,
                        attempt,
                        why: &why,
                        cancelled: &cancelled,
                    });
                }
                return Ok(Admission::Wait);
            }
            Ok(crate::groups::Turn::Refused(why)) => {
                format!("{why}; this node's `on_conflict = \"refuse\"` runs nothing")
            }
            Err(e) => format!(
                "failed to take a slot of concurrency group `{}`: {e}",
                concurrency.get_ref().group
            ),
        };
        self.slots[index].group_wait = None;
        self.finish_without_running_attempt(index, attempt, NodeState::Failed, Some(&ended), None)?;
        self.mark_done(index, NodeState::Failed);
        Ok(Admission::Ended)
    }

    fn spawn_attempt(
        &mut self,
        index: usize,
        attempt: u32,
        group_slot: Option<crate::groups::Slot>,
    ) -> Result<(), LedgerError> {
        // No node starts that the ledger could not record: while the writer is stalled (the
        // server gone and its connection being made again, the file locked), the loop waits
        // for it to commit what came before, which fails the run, exit 4, when the ledger
        // does not come back within its timeouts.
        if self.recorder.stalled() {
            tracing::warn!(
                run = self.run_id,
                "the ledger does not record: waiting for it before starting a node"
            );
            self.recorder.sync()?;
        }
        let node = self.spec(index);
        let node_id = self.slot_id(index);
        self.instance_started(index, true);
        self.recorder.record(Write::Start {
            node_id: node_id.clone(),
            kind: node.kind,
            attempt,
            at: jiff::Timestamp::now(),
        });
        if node.action.uses_ledger() {
            // It reads what the run recorded so far, and writes on a connection of its own.
            self.recorder.sync()?;
        }
        tracing::debug!(run = self.run_id, node = %node_id, attempt, "node started");
        self.observer.event(&Event::NodeStarted {
            node: &node_id,
            attempt,
        });
        let action = Arc::clone(&node.action);
        let timeout = node.timeout;
        // A node with a key keeps its declared output files, to put back when it is cached.
        let outputs = node
            .cache
            .as_ref()
            .filter(|_| self.slots[index].cache.is_some())
            .map(|spec| spec.outputs.clone())
            .filter(|outputs| !outputs.is_empty());
        let vars = self.context_for(index);
        let env = Arc::clone(&self.env);
        let cancel = self.nodes_cancel.child_token();
        let run_id = self.run_id;
        self.attempts_started += 1;
        if node.calls_http {
            self.http_attempts_started += 1;
        }
        self.running.spawn(async move {
            // The group's slot is held until the attempt's end, its outputs stored.
            let _group_slot = group_slot;
            let started = Instant::now();
            let ctx = NodeContext {
                node_id: &node_id,
                run_id,
                env: &env,
                vars: &vars,
                cancel: cancel.clone(),
            };
            let run = action.run(&ctx);
            tokio::pin!(run);
            let mut outcome = match timeout {
                None => run.await,
                Some(limit) => tokio::select! {
                    outcome = &mut run => outcome,
                    () = tokio::time::sleep(limit) => {
                        cancel.cancel();
                        let mut outcome = run.await;
                        if outcome.state == NodeState::Cancelled {
                            outcome.state = NodeState::TimedOut;
                            outcome.error = Some(format!("timed out after {}", humantime::format_duration(limit)));
                        }
                        outcome
                    }
                },
            };
            if outcome.state == NodeState::Cancelled && outcome.error.is_none() {
                outcome.error = Some("cancelled while running".into());
            }
            let duration = started.elapsed();
            let stored = match outputs {
                Some(outputs) if outcome.state == NodeState::Succeeded => {
                    // Read and copied on a thread of the blocking pool: an output of gigabytes
                    // holds up neither the other nodes' output nor their timeouts.
                    let stopping = cancel.clone();
                    let env = Arc::clone(&env);
                    let storing = tokio::task::spawn_blocking(move || {
                        let stopped = || stopping.is_cancelled();
                        let scratch = env.owner.spill_dir();
                        crate::cache::store_outputs(&env.workspace, &outputs, &env.artifacts, scratch, &stopped)
                    });
                    let stored = storing.await.unwrap_or_else(|e| Err(format!("storing its declared outputs failed: {e}")));
                    // A cancel ends the storing too (a copy of gigabytes would hold kavi's exit).
                    if stored.is_err() && cancel.is_cancelled() {
                        outcome.state = NodeState::Cancelled;
                        outcome.error = Some("cancelled while its declared outputs were stored".into());
                        None
                    } else {
                        Some(stored)
                    }
                }
                _ => None,
            };
            Done::Attempt(Finished { index, attempt, outcome, duration, stored })
        });
        Ok(())
    }

    /// Takes what a task of the loop's set ended with: returns how many nodes finished, and the
    /// state an attempt ended in, when it was an attempt.
    pub(super) fn task_done(
        &mut self,
        task: Done,
    ) -> Result<(usize, Option<NodeState>), LedgerError> {
        Ok(match task {
            Done::Attempt(finished) => {
                let (finished, state) = self.attempt_finished(finished)?;
                (finished, Some(state))
            }
            Done::Keyed { index, key } => (usize::from(self.consult_cache(index, key)?), None),
            Done::Restored {
                index,
                record,
                hit,
                restored,
            } => (
                usize::from(self.outputs_restored(index, record, &hit, restored)),
                None,
            ),
        })
    }

    /// Records an attempt's end; returns how many nodes finished (none when it is tried again)
    /// and the state the attempt ended in.
    fn attempt_finished(&mut self, finished: Finished) -> Result<(usize, NodeState), LedgerError> {
        let Finished {
            index,
            attempt,
            mut outcome,
            duration,
            stored,
        } = finished;
        let node = self.spec(index);
        let node_id = self.slot_id(index);
        self.instance_started(index, false);
        if let Some((_, item)) = &self.slots[index].instance
            && let Some(outputs) = outcome.outputs.as_object_mut()
        {
            outputs.insert("item".into(), item.clone());
        }
        let mut cache = self.slots[index].cache.clone();
        match (stored, &mut cache) {
            (Some(Ok(stored)), Some(cache)) => {
                for (path, artifact) in stored {
                    cache.files.insert(path, artifact.sha256.clone());
                    outcome.artifacts.push(("output", artifact));
                }
            }
            (Some(Err(e)), _) => {
                outcome.state = NodeState::Failed;
                outcome.error = Some(e);
            }
            _ => {}
        }
        let retryable = node
            .retry
            .retries(outcome.state, outcome.exit_code, &outcome.outputs);
        let will_retry = retryable && attempt < node.retry.attempts && self.stop_reason.is_none();
        tracing::debug!(run = self.run_id, node = %node_id, attempt, state = %outcome.state, will_retry, "node finished");
        self.observer.event(&Event::NodeFinished {
            node: &node_id,
            attempt,
            state: outcome.state,
            duration: Some(duration),
            detail: outcome.error.as_deref(),
            outputs: Some(&outcome.outputs),
            will_retry,
        });
        self.recorder.record(Write::Finish {
            node_id,
            attempt,
            state: outcome.state,
            record: Box::new(NodeRecord {
                exit_code: outcome.exit_code,
                outputs: Some(outcome.outputs.clone()),
                error: outcome.error.clone(),
                reason: None,
                duration: Some(duration),
                artifacts: std::mem::take(&mut outcome.artifacts),
                reused_from: None,
                cache,
                started_at: None,
            }),
        });
        if will_retry {
            let due = Instant::now() + node.retry.delay_before(attempt + 1);
            self.retries.push(Reverse((due, index, attempt + 1)));
            return Ok((0, outcome.state));
        }
        self.slots[index].entry = json!({
            "state": outcome.state,
            "kind": node.kind,
            "error": outcome.error,
            "outputs": outcome.outputs,
        });
        self.mark_done(index, outcome.state);
        Ok((1, outcome.state))
    }

    pub(super) fn finish_without_running(
        &mut self,
        index: usize,
        state: NodeState,
        error: Option<&str>,
        reason: Option<&str>,
    ) -> Result<(), LedgerError> {
        self.finish_without_running_attempt(index, 1, state, error, reason)?;
        self.mark_done(index, state);
        Ok(())
    }

    pub(super) fn finish_without_running_attempt(
        &mut self,
        index: usize,
        attempt: u32,
        state: NodeState,
        error: Option<&str>,
        reason: Option<&str>,
    ) -> Result<(), LedgerError> {
        let node = self.spec(index);
        let node_id = self.slot_id(index);
        // An instance is recorded with its item, whether or not it ran.
        let outputs = match &self.slots[index].instance {
            Some((_, item)) => json!({ "item": item }),
            None => json!({}),
        };
        if attempt > 1 {
            // A retry that never started still gets its own row, so the ledger shows why.
            self.recorder.record(Write::Start {
                node_id: node_id.clone(),
                kind: node.kind,
                attempt,
                at: jiff::Timestamp::now(),
            });
        }
        self.recorder.record(Write::Finish {
            node_id: node_id.clone(),
            attempt,
            state,
            record: Box::new(NodeRecord {
                error: error.map(str::to_owned),
                reason: reason.map(str::to_owned),
                outputs: self.slots[index]
                    .instance
                    .is_some()
                    .then(|| outputs.clone()),
                ..Default::default()
            }),
        });
        self.observer.event(&Event::NodeFinished {
            node: &node_id,
            attempt,
            state,
            duration: None,
            detail: error.or(reason),
            outputs: None,
            will_retry: false,
        });
        self.slots[index].entry = json!({
            "state": state,
            "kind": node.kind,
            "error": error.or(reason),
            "outputs": outputs,
        });
        Ok(())
    }

    /// Records a node's final state and releases the nodes that were waiting on it.
    pub(super) fn mark_done(&mut self, index: usize, state: NodeState) {
        self.note_final(index, state);
        // An instance's only dependant is its fan-out, which gathers them all: once this
        // executor made its instances (a step of one instance leaves that to the fan-out's own).
        let dependants: Vec<usize> = match self.slots[index].instance {
            Some(_) if self.slots[self.slots[index].node].instances.is_some() => {
                vec![self.slots[index].node]
            }
            Some(_) => Vec::new(),
            None => self.dag.dependants(index).collect(),
        };
        for dependant in dependants {
            let slot = &mut self.slots[dependant];
            slot.waiting_on -= 1;
            if slot.waiting_on == 0 {
                self.ready.push(Reverse(dependant));
            }
        }
    }

    /// What a node's final state does to the run: a failure fails it (and stops it, when the
    /// pipeline is fail_fast), a node awaiting review makes it wait.
    pub(super) fn note_final(&mut self, index: usize, state: NodeState) {
        self.slots[index].state = Some(state);
        if state == NodeState::AwaitingReview {
            self.awaiting_review = true;
        }
        let node = self.spec(index);
        if counts_as_failure(node, state) && !self.run_cancel.is_cancelled() {
            self.failed = true;
            if self.dag.pipeline.fail_fast && state != NodeState::Blocked {
                self.stop(&format!(
                    "`{}` {} and the pipeline is fail_fast",
                    self.slot_id(index),
                    describe_state(state)
                ));
            }
        }
    }

    /// The template context for a node. Only the nodes its templates read are included, unless
    /// it reads `nodes` as a whole: building every node's outputs for every node would make
    /// large pipelines quadratic.
    pub(super) fn context_for(&self, index: usize) -> minijinja::Value {
        let node = self.spec(index);
        let mut nodes = serde_json::Map::new();
        let reads_all = node.reads.iter().any(|(path, _)| path == "nodes");
        let wanted: Vec<usize> = if reads_all {
            (0..self.dag.len()).collect()
        } else {
            node.reads
                .iter()
                .filter_map(|(path, _)| path.strip_prefix("nodes."))
                .filter_map(|rest| {
                    self.dag
                        .pipeline
                        .nodes
                        .iter()
                        .position(|n| n.id == rest.split('.').next().unwrap_or(rest))
                })
                .collect()
        };
        for i in wanted {
            if self.slots[i].state.is_some() {
                nodes.insert(
                    self.dag.pipeline.nodes[i].id.clone(),
                    self.slots[i].entry.clone(),
                );
            }
        }
        let context = minijinja::context! {
            params => self.run_vars.params.clone(),
            nodes => minijinja::Value::from_serialize(&nodes),
            run => self.run_vars.run.clone(),
            config => self.run_vars.config.clone(),
        };
        match &self.slots[index].instance {
            Some((_, item)) => minijinja::context! {
                item => minijinja::Value::from_serialize(item),
                ..context
            },
            None => context,
        }
    }
}
