//! The generic executor: runs a compiled DAG on tokio and records every node run in the ledger.
//!
//! One loop owns the ledger and the scheduling state; node attempts run as tasks. Ready nodes
//! start in declaration order, up to `jobs` at a time. A node whose dependency failed is
//! `blocked`; one whose dependency was skipped, or whose `when` is false, is `skipped`. Timeouts
//! and cancellation reach the node through a cancel token, and the node stops what it started.
//!
//! Display hangs off [`Observer`] events, so the executor never prints (moon's subscriber shape).
//!
//! What the loop decides (a node started, a node ended) goes to the ledger through a
//! [`recorder::Recorder`], which commits it on a thread of its own while the nodes run. A node
//! whose own work reads or writes the ledger starts only once everything before it is committed.

mod recorder;
mod step;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cache::{DigestMemo, Key};
use crate::dag::Dag;
use crate::ledger::{
    Artifact, CacheHit, CacheRecord, Ledger, LedgerError, NewRun, NodeRecord, RunOrigin,
};
use crate::nodes::{ChildRun, ChildRuns, Environment, NodeContext, NodeOutcome};
use crate::spec::Pipeline;
use crate::spec::governing::Role;
use crate::spec::{OnFailure, Trigger};
use crate::state::{NodeState, RunStatus};
use recorder::{Recorder, Write};
pub use step::{Progress, StepOutcome, execute_step, progress, rows_by_node, settle_external_run};

/// Something worth telling the user about, as it happens.
#[derive(Debug)]
pub enum Event<'a> {
    RunStarted {
        run_id: i64,
        pipeline: &'a str,
        spec_hash: &'a str,
        nodes: usize,
    },
    NodeStarted {
        node: &'a str,
        attempt: u32,
    },
    NodeFinished {
        node: &'a str,
        attempt: u32,
        state: NodeState,
        duration: Option<Duration>,
        detail: Option<&'a str>,
        /// The node's outputs, for nodes that ran.
        outputs: Option<&'a Value>,
        will_retry: bool,
    },
}

pub trait Observer {
    fn event(&mut self, event: &Event<'_>);
}

/// Starts child runs with this executor, each with an observer made for its depth.
pub struct ChildRunner {
    pub observer: Box<dyn Fn(usize) -> Box<dyn Observer + Send> + Send + Sync>,
}

#[async_trait::async_trait]
impl ChildRuns for ChildRunner {
    async fn run_child(
        &self,
        pipeline: &Pipeline,
        params: serde_json::Map<String, Value>,
        env: &Environment,
        parent_run: i64,
        cancel: CancellationToken,
    ) -> Result<ChildRun, String> {
        let dag = crate::dag::compile(pipeline).map_err(|e| e.to_string())?;
        let mut ledger = Ledger::open(&env.ledger).map_err(|e| e.to_string())?;
        let env = Environment {
            depth: env.depth + 1,
            ..env.clone()
        };
        let mut observer = (self.observer)(env.depth);
        let outcome = execute(
            &dag,
            params,
            Arc::new(env),
            &mut ledger,
            observer.as_mut(),
            cancel,
            RunOrigin::Child { parent: parent_run }.into(),
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok(ChildRun {
            run_id: outcome.run_id,
            status: outcome.status,
        })
    }
}

#[derive(Debug, Serialize)]
pub struct RunOutcome {
    pub run_id: i64,
    pub status: RunStatus,
    pub duration_ms: u128,
}

/// How a run starts: who started it, and, for `kavi runs resume`, the nodes whose outputs it
/// takes from the run it resumes instead of running them.
#[derive(Debug, Default)]
pub struct RunStart {
    pub origin: RunOrigin,
    /// By node id.
    pub reuse: HashMap<String, Reused>,
}

impl From<RunOrigin> for RunStart {
    fn from(origin: RunOrigin) -> Self {
        Self {
            origin,
            reuse: HashMap::new(),
        }
    }
}

/// A node run of an earlier run that a resumed run takes as it is.
#[derive(Debug, Clone)]
pub struct Reused {
    pub node_run_id: i64,
    pub run_id: i64,
    pub outputs: Value,
}

/// The run's configuration as part of every node key, from the run's governing set: each key
/// has the node's own governing files, and the configuration is the run's.
fn config_parts(members: &[GoverningMember<'_>]) -> Vec<(String, String)> {
    members
        .iter()
        .filter(|(role, ..)| *role == Role::Config)
        .map(|(role, path, hash, _)| (format!("{role}:{path}"), hash.clone()))
        .collect()
}

/// A member of a run's governing set: role, path, hash and text.
pub type GoverningMember<'t> = (Role, String, String, &'t str);

/// Work a task of the loop's set first tries on the loop's own thread: hashing a node's inputs,
/// checking its outputs are in place. Handing it to the blocking pool and back costs two thread
/// wakes, more than hashing a few small files; but the loop also reads the running nodes'
/// output and keeps their timeouts, so the work moves to the pool once it has asked whether to
/// stop [`OnTheLoop::ASKS`] times (once per file walked and per 64 KiB read), and starts over
/// there.
struct OnTheLoop<'c> {
    cancel: &'c CancellationToken,
    asked: std::cell::Cell<u32>,
}

impl<'c> OnTheLoop<'c> {
    /// About three small files, or 700 KiB read: well under a millisecond.
    const ASKS: u32 = 12;

    fn new(cancel: &'c CancellationToken) -> Self {
        Self {
            cancel,
            asked: std::cell::Cell::new(0),
        }
    }

    /// The work's `stopped`: yes once the run is cancelled, or once it has been asked too often.
    fn stopped(&self) -> bool {
        self.asked.set(self.asked.get() + 1);
        self.cancel.is_cancelled() || self.asked.get() > Self::ASKS
    }

    /// Whether the work stopped for being too much, not for a cancel: it is to be done again on
    /// the blocking pool.
    fn moved(&self) -> bool {
        self.asked.get() > Self::ASKS && !self.cancel.is_cancelled()
    }
}

/// Runs `work` on the loop's thread, and when it proves too much there (see [`OnTheLoop`]),
/// again from the start on the blocking pool. `work` is told to stop through its argument.
async fn here_else_on_the_pool<T: Send + 'static>(
    cancel: CancellationToken,
    work: impl Fn(&dyn Fn() -> bool) -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    {
        let here = OnTheLoop::new(&cancel);
        let tried = work(&|| here.stopped());
        if !here.moved() {
            return Ok(tried);
        }
    }
    tokio::task::spawn_blocking(move || work(&|| cancel.is_cancelled())).await
}

/// What a task of the loop's set ended with.
enum Done {
    /// A node's attempt ended.
    Attempt(Finished),
    /// A node's input files are hashed: its key is whole, or why it could not be.
    Keyed {
        index: usize,
        key: std::io::Result<Key>,
    },
    /// A cached node's output files are put back, or why they could not be.
    Restored {
        index: usize,
        record: CacheRecord,
        hit: CacheHit,
        restored: Result<usize, String>,
    },
}

struct Finished {
    index: usize,
    attempt: u32,
    outcome: NodeOutcome,
    duration: Duration,
    /// A node with a key that succeeded: its declared output files, as stored.
    stored: Option<Result<Vec<(String, Artifact)>, String>>,
}

/// What the loop knows about one node.
struct Slot {
    state: Option<NodeState>,
    waiting_on: usize,
    entry: Value,
    /// The key of a node that declares its inputs, computed when it became ready.
    cache: Option<CacheRecord>,
}

pub struct Executor<'a> {
    dag: &'a Dag<'a>,
    env: Arc<Environment>,
    ledger: &'a mut Ledger,
    observer: &'a mut (dyn Observer + Send),
    params: Value,
    run_id: i64,
    slots: Vec<Slot>,
    ready: BinaryHeap<Reverse<usize>>,
    /// Due to start, by node and attempt; attempt 0 is the making of a node's key.
    to_start: BinaryHeap<Reverse<(usize, u32)>>,
    retries: BinaryHeap<Reverse<(Instant, usize, u32)>>,
    /// The nodes' attempts, and for nodes that declare inputs the hashing of those and the
    /// putting back of their outputs: the work `--jobs` bounds.
    running: JoinSet<Done>,
    run_cancel: CancellationToken,
    /// Parent of every node's token: cancelled by the user's cancel, or when a budget is spent
    /// (which fails the run rather than cancelling it).
    nodes_cancel: CancellationToken,
    /// A `[pipeline.budget]` ran out.
    budget_spent: bool,
    /// Attempts started, all nodes and HTTP-calling nodes, for the budgets.
    attempts_started: u32,
    http_attempts_started: u32,
    stop_reason: Option<String>,
    failed: bool,
    /// A node stopped the run for a person's decision.
    awaiting_review: bool,
    reuse: HashMap<String, Reused>,
    /// The run's configuration, part of every node key, as (`config:<path>`, hash).
    config_parts: Vec<(String, String)>,
    recorder: Recorder,
    /// The parts of every node's template context that do not change during the run, made
    /// once: converting them again for each node cost more than the node's own part.
    run_vars: RunVars,
}

/// `params`, `run` and `config` as templates see them.
struct RunVars {
    params: minijinja::Value,
    run: minijinja::Value,
    config: minijinja::Value,
}

/// How a wall budget reads in a reason.
fn wall_text(wall: Option<(Instant, Duration)>) -> String {
    wall.map_or_else(String::new, |(_, limit)| {
        humantime::format_duration(limit).to_string()
    })
}

/// Runs `dag` with resolved `params`, recording it as a new run started by `origin`. `cancel` stops the run (Ctrl-C): running nodes are stopped and
/// recorded as cancelled, unstarted ones too.
pub async fn execute(
    dag: &Dag<'_>,
    params: serde_json::Map<String, Value>,
    env: Arc<Environment>,
    ledger: &mut Ledger,
    observer: &mut (dyn Observer + Send),
    cancel: CancellationToken,
    start: RunStart,
) -> Result<RunOutcome, LedgerError> {
    let RunStart { origin, reuse } = start;
    let pipeline = dag.pipeline;
    let params = Value::Object(params);
    let governing = pipeline.governing.resolved(&env.config, &env.workspace);
    let mut members = Vec::new();
    // The recorder writes the run, its governing set and its pending node runs in one
    // transaction, and hands back the run's id first: the nodes start while it writes the rest.
    // The run is put together while the recorder connects.
    let (recorder, run_id) = Recorder::begin(ledger, || {
        members = governing.members();
        tracing::debug!(members = members.len(), "governing set read");
        new_run(pipeline, &params, &members, origin, env.owner.name())
    })?;
    tracing::debug!(run = run_id, "run begun");
    observer.event(&Event::RunStarted {
        run_id,
        pipeline: &pipeline.name,
        spec_hash: &pipeline.spec_hash,
        nodes: pipeline.nodes.len(),
    });
    let started = Instant::now();
    let mut executor = Executor::new(
        dag,
        env,
        ledger,
        observer,
        params,
        (recorder, run_id),
        cancel,
    );
    executor.config_parts = config_parts(&members);
    executor.reuse = reuse;
    let result = executor.run_loop().await;
    tracing::debug!(run = run_id, "nodes settled");
    if result.is_err() {
        // The ledger failed under us: stop everything we started before reporting it, without
        // holding the ledger's lock while they stop.
        let _ = executor.recorder.finish();
        executor.run_cancel.cancel();
        while executor.running.join_next().await.is_some() {}
    }
    result?;
    let status = if executor.run_cancel.is_cancelled() {
        RunStatus::Cancelled
    } else if executor.awaiting_review {
        RunStatus::AwaitingReview
    } else if executor.failed {
        RunStatus::Failed
    } else {
        RunStatus::Succeeded
    };
    let error = match status {
        RunStatus::Cancelled => Some("cancelled by the user".to_owned()),
        _ => executor.stop_reason.clone(),
    };
    let duration = started.elapsed();
    executor.recorder.record(Write::RunEnd {
        status,
        duration,
        error,
    });
    executor.recorder.finish()?;
    if let Some(closing) = executor.recorder.closing() {
        executor.ledger.close_after(closing);
    }
    // The run's sandboxes go with it, or stay for a person to look at when it did not succeed.
    crate::ledger::cleanup::settle_run(executor.ledger, run_id, status == RunStatus::Succeeded)?;
    tracing::debug!(run = run_id, %status, "run finished");
    Ok(RunOutcome {
        run_id,
        status,
        duration_ms: duration.as_millis(),
    })
}

/// What a new run of `pipeline` records before its nodes start: governed by `members` (its
/// set resolved for the run), all its nodes pending.
pub fn new_run(
    pipeline: &Pipeline,
    params: &Value,
    members: &[GoverningMember<'_>],
    origin: RunOrigin,
    owner: &str,
) -> NewRun {
    NewRun {
        pipeline: pipeline.name.clone(),
        spec_path: pipeline.source.path.display().to_string(),
        spec_hash: pipeline.spec_hash.clone(),
        spec_text: pipeline.source.text.clone(),
        params: params.clone(),
        origin,
        owner: owner.to_owned(),
        nodes: pipeline
            .nodes
            .iter()
            .map(|n| (n.id.clone(), n.kind))
            .collect(),
        governing: members
            .iter()
            .map(|(role, path, hash, text)| {
                (
                    role.as_str(),
                    path.clone(),
                    hash.clone(),
                    (*text).to_owned(),
                )
            })
            .collect(),
    }
}

impl<'a> Executor<'a> {
    fn new(
        dag: &'a Dag<'a>,
        env: Arc<Environment>,
        ledger: &'a mut Ledger,
        observer: &'a mut (dyn Observer + Send),
        params: Value,
        (recorder, run_id): (Recorder, i64),
        cancel: CancellationToken,
    ) -> Self {
        let run_vars = RunVars {
            params: minijinja::Value::from_serialize(&params),
            run: minijinja::Value::from_serialize(json!({
                "id": run_id,
                "pipeline": dag.pipeline.name,
                "spec_hash": dag.pipeline.spec_hash,
            })),
            config: minijinja::Value::from_serialize(&env.config),
        };
        Executor {
            dag,
            env,
            ledger,
            observer,
            params,
            run_id,
            slots: (0..dag.len())
                .map(|i| Slot {
                    state: None,
                    waiting_on: dag.dependencies(i).count(),
                    entry: Value::Null,
                    cache: None,
                })
                .collect(),
            ready: BinaryHeap::new(),
            to_start: BinaryHeap::new(),
            retries: BinaryHeap::new(),
            running: JoinSet::new(),
            nodes_cancel: cancel.child_token(),
            budget_spent: false,
            attempts_started: 0,
            http_attempts_started: 0,
            run_cancel: cancel,
            stop_reason: None,
            failed: false,
            awaiting_review: false,
            reuse: HashMap::new(),
            config_parts: Vec::new(),
            recorder,
            run_vars,
        }
    }

    async fn run_loop(&mut self) -> Result<(), LedgerError> {
        let budget = self.dag.pipeline.budget;
        let wall = budget.wall.map(|limit| (Instant::now() + limit, limit));
        for i in 0..self.slots.len() {
            if self.slots[i].waiting_on == 0 {
                self.ready.push(Reverse(i));
            }
        }
        let mut done = 0;
        while done < self.slots.len() {
            done += self.settle_ready()?;
            self.start_due_nodes()?;
            // Nodes cancelled by a stop release their dependants into `ready`: decide those
            // before waiting, or the loop could wait on nothing.
            if !self.ready.is_empty() {
                continue;
            }
            if self.recorder.holds_any() {
                // The nodes just started get their processes first (their tasks' first poll):
                // handing the turn's decisions to the writer may wake it, and that wake is not
                // to delay them.
                tokio::task::yield_now().await;
                self.recorder.hand_over();
            }
            self.recorder.check()?;
            if self.running.is_empty() && self.to_start.is_empty() {
                if let Some(Reverse((due, _, _))) = self.retries.peek() {
                    let due = *due;
                    tokio::select! {
                        () = tokio::time::sleep_until(due.into()) => {}
                        () = self.run_cancel.cancelled() => self.stop("run cancelled"),
                        () = sleep_until_opt(wall.map(|(at, _)| at)), if !self.budget_spent => {
                            self.spend_budget("wall", &wall_text(wall));
                        }
                    }
                    self.promote_due_retries();
                    continue;
                }
                break;
            }
            let next_retry = self.retries.peek().map(|Reverse((due, _, _))| *due);
            tokio::select! {
                joined = self.running.join_next(), if !self.running.is_empty() => {
                    let task = joined.expect("join set is not empty").expect("node tasks do not panic");
                    done += self.task_done(task)?.0;
                }
                () = sleep_until_opt(next_retry) => self.promote_due_retries(),
                () = self.run_cancel.cancelled(), if self.stop_reason.is_none() => self.stop("run cancelled"),
                () = sleep_until_opt(wall.map(|(at, _)| at)), if !self.budget_spent => {
                    self.spend_budget("wall", &wall_text(wall));
                }
            }
        }
        self.recorder.check()
    }

    fn stop(&mut self, reason: &str) {
        if self.stop_reason.is_none() {
            self.stop_reason = Some(reason.to_owned());
        }
    }

    /// A budget ran out: the run fails with a reason naming it, its running nodes are cancelled
    /// and nothing more starts, failure handlers included.
    fn spend_budget(&mut self, name: &str, limit: &str) {
        if self.budget_spent {
            return;
        }
        self.budget_spent = true;
        self.failed = true;
        self.stop_reason = Some(format!("the run's `{name}` budget ({limit}) is spent"));
        self.nodes_cancel.cancel();
    }

    /// Spends a budget if starting `index` would take more than it allows.
    fn check_budget(&mut self, index: usize) {
        let budget = self.dag.pipeline.budget;
        let node = &self.dag.pipeline.nodes[index];
        if budget
            .attempts
            .is_some_and(|limit| self.attempts_started >= limit)
        {
            let limit = budget.attempts.unwrap_or_default();
            self.spend_budget("attempts", &format!("{limit} node attempts"));
        } else if crate::nodes::HTTP_KINDS.contains(&node.kind)
            && budget
                .http_calls
                .is_some_and(|limit| self.http_attempts_started >= limit)
        {
            let limit = budget.http_calls.unwrap_or_default();
            self.spend_budget("http_calls", &format!("{limit} HTTP calls"));
        }
    }

    /// Why a node may not start because the run is stopping, if it may not. A user's cancel stops
    /// everything; a fail_fast stop spares failure handlers and cleanup (`trigger` other than
    /// `success`), which exist for exactly that moment.
    fn stopped_for(&self, index: usize) -> Option<String> {
        let reason = self.stop_reason.clone()?;
        let handler = self.dag.pipeline.nodes[index].trigger != Trigger::Success;
        (self.run_cancel.is_cancelled() || self.budget_spent || !handler).then_some(reason)
    }

    fn promote_due_retries(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((due, index, attempt))) = self.retries.peek().copied() {
            if due > now && self.stop_reason.is_none() {
                break;
            }
            self.retries.pop();
            self.to_start.push(Reverse((index, attempt)));
        }
    }

    /// Decides every ready node: started later, or finished now without running (skipped,
    /// blocked, cancelled, failed condition). Returns how many finished.
    fn settle_ready(&mut self) -> Result<usize, LedgerError> {
        let mut finished = 0;
        while let Some(Reverse(index)) = self.ready.pop() {
            if self.reuse_node(index) {
                finished += 1;
                continue;
            }
            let node = &self.dag.pipeline.nodes[index];
            // What its dependencies did is the more precise reason; a stop comes second.
            let verdict = self.dependency_verdict(index).or_else(|| {
                self.stopped_for(index)
                    .map(|reason| (NodeState::Cancelled, format!("not started: {reason}")))
            });
            let verdict = match verdict {
                Some(v) => Some(v),
                None => match &node.when {
                    None => None,
                    Some(when) => {
                        let context = self.context_for(index);
                        match self.env.templates.eval_condition(when.get_ref(), &context) {
                            Ok(true) => None,
                            Ok(false) => Some((
                                NodeState::Skipped,
                                format!("`when` is false: {}", when.get_ref()),
                            )),
                            Err(e) => Some((
                                NodeState::Failed,
                                format!(
                                    "failed to evaluate `when`: {}",
                                    crate::template::describe_error(&e)
                                ),
                            )),
                        }
                    }
                },
            };
            match verdict {
                // Its key first: attempt 0 (see `start_due_nodes`).
                None if node.cache.is_some() => self.to_start.push(Reverse((index, 0))),
                None => self.to_start.push(Reverse((index, 1))),
                Some((state, text)) => {
                    let (error, reason) = if state == NodeState::Failed {
                        (Some(text), None)
                    } else {
                        (None, Some(text))
                    };
                    self.finish_without_running(index, state, error.as_deref(), reason.as_deref())?;
                    finished += 1;
                }
            }
        }
        Ok(finished)
    }

    /// Takes a node's outputs from the run being resumed, when it succeeded there and so did
    /// (there, again) everything it needs: what is upstream of something that runs anew is never
    /// reused. Returns whether it was.
    fn reuse_node(&mut self, index: usize) -> bool {
        let node = &self.dag.pipeline.nodes[index];
        let Some(reused) = self.reuse.get(&node.id) else {
            return false;
        };
        if self
            .dag
            .dependencies(index)
            .any(|dep| self.slots[dep].state != Some(NodeState::Reused))
            || self.stopped_for(index).is_some()
        {
            return false;
        }
        let record = NodeRecord {
            outputs: Some(reused.outputs.clone()),
            reason: Some(format!("reused from run {}", reused.run_id)),
            reused_from: Some(reused.node_run_id),
            ..Default::default()
        };
        self.observer.event(&Event::NodeFinished {
            node: &node.id,
            attempt: 1,
            state: NodeState::Reused,
            duration: None,
            detail: Some(&format!("from run {}", reused.run_id)),
            outputs: Some(&reused.outputs),
            will_retry: false,
        });
        // Templates see it as they saw it in the run it comes from: it succeeded there.
        self.slots[index].entry = json!({
            "state": NodeState::Succeeded,
            "kind": node.kind,
            "error": null,
            "outputs": reused.outputs,
        });
        self.recorder.record(Write::Finish {
            node_id: node.id.clone(),
            attempt: 1,
            state: NodeState::Reused,
            record: Box::new(record),
        });
        self.mark_done(index, NodeState::Reused);
        true
    }

    /// For a node that declares its inputs: makes its key's parts that the loop knows, and
    /// hashes its input files as a task of the loop's set (`--jobs` bounds those as it bounds
    /// attempts): on the loop's thread while they are few and small (see [`OnTheLoop`]), else
    /// on a thread of the blocking pool. Inputs of gigabytes hold up neither the running nodes
    /// (their output is read, their timeouts kept) nor a cancel; [`Executor::consult_cache`]
    /// takes the key when it is whole.
    fn start_keying(&mut self, index: usize) {
        let spec = self.dag.pipeline.nodes[index]
            .cache
            .as_ref()
            .expect("only nodes with inputs have keys");
        let key = self.node_key(index);
        let inputs = spec.inputs.clone();
        let workspace = Arc::clone(&self.env.workspace);
        let skip = Arc::clone(&self.env.state_paths);
        let memo = DigestMemo::of_store(&self.env.artifacts);
        // A cancel (or a spent budget) ends the hashing too: inputs of terabytes would
        // otherwise hold kavi's exit for as long as they take to read.
        let cancel = self.nodes_cancel.child_token();
        self.running.spawn(async move {
            let hash = move |stopped: &dyn Fn() -> bool| {
                let mut key = key.clone();
                key.add_inputs(&workspace, &inputs, &skip, &memo, stopped)
                    .map(|()| key)
            };
            let key = here_else_on_the_pool(cancel, hash)
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            Done::Keyed { index, key }
        });
    }

    /// For a node whose key is whole: when an earlier node run with that key succeeded, starts
    /// putting its output files back (see [`Executor::outputs_restored`]). Otherwise keeps the
    /// key (and why it was not used) for when the node finishes, and makes it due to start.
    /// Returns whether the node finished: only when its inputs could not be read, which fails it.
    fn consult_cache(
        &mut self,
        index: usize,
        key: std::io::Result<Key>,
    ) -> Result<bool, LedgerError> {
        let node = &self.dag.pipeline.nodes[index];
        let spec = node
            .cache
            .as_ref()
            .expect("only nodes with inputs have keys");
        let key = match key {
            Ok(key) => key,
            Err(_) if self.nodes_cancel.is_cancelled() => {
                // The loop may take the cancel itself only after this.
                let reason = self
                    .stopped_for(index)
                    .unwrap_or_else(|| "run cancelled".into());
                let reason = format!("not started: {reason}");
                self.finish_without_running(index, NodeState::Cancelled, None, Some(&reason))?;
                return Ok(true);
            }
            Err(e) => {
                let error = format!("failed to read its inputs: {e}");
                self.finish_without_running(index, NodeState::Failed, Some(&error), None)?;
                return Ok(true);
            }
        };
        let mut record = CacheRecord {
            key: key.digest(),
            parts: key.parts,
            ..CacheRecord::default()
        };
        let hit = if !spec.enabled {
            record.note = Some("it has `cache = false`".into());
            None
        } else if !self.env.use_cache {
            record.note = Some("the run was started with --no-cache".into());
            None
        } else {
            self.ledger.cache_hit(&record.key)?
        };
        let Some(hit) = hit else {
            if record.note.is_none() {
                record.note = Some("no earlier run of it with this key succeeded".into());
            }
            self.slots[index].cache = Some(record);
            self.to_start.push(Reverse((index, 1)));
            return Ok(false);
        };
        // What the ledger keeps of the outputs is read here, on its connection; the files are
        // compared, copied and checked on a thread of the blocking pool, as the inputs were
        // hashed (see `start_keying`).
        let mut kept = HashMap::new();
        for sha256 in hit.files.values() {
            match self.ledger.kept_artifact(sha256) {
                Ok(None) => {}
                Ok(Some(bytes)) => _ = kept.insert(sha256.clone(), Ok(bytes)),
                Err(e) => _ = kept.insert(sha256.clone(), Err(e)),
            }
        }
        let workspace = Arc::clone(&self.env.workspace);
        let store = self.env.artifacts.clone();
        let staging = self.env.owner.spill_dir().to_owned();
        let cancel = self.nodes_cancel.child_token();
        self.running.spawn(async move {
            let files = hit.files.clone();
            let restore = move |stopped: &dyn Fn() -> bool| {
                let copy = |sha256: &str, to: &mut dyn std::io::Write| match kept.get(sha256) {
                    Some(Ok(bytes)) => to.write_all(bytes).map_err(|e| e.to_string()),
                    Some(Err(e)) => Err(e.clone()),
                    None => store.copy_out(sha256, to),
                };
                crate::cache::restore_outputs(&workspace, &files, &staging, copy, stopped)
            };
            // Most outputs are already in place and small. A stop part way leaves every output
            // as it was, so the blocking pool can start over.
            let restored = here_else_on_the_pool(cancel, restore)
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            Done::Restored {
                index,
                record,
                hit,
                restored,
            }
        });
        Ok(false)
    }

    /// Takes a cached node's restored outputs: finishes it as `cached`, or, when they could not
    /// be put back, makes it due to run with the reason kept. Returns whether it finished.
    fn outputs_restored(
        &mut self,
        index: usize,
        mut record: CacheRecord,
        hit: &CacheHit,
        restored: Result<usize, String>,
    ) -> bool {
        match restored {
            Ok(restored) => {
                self.finish_cached(index, record, hit, restored);
                true
            }
            Err(e) => {
                record.note = Some(format!(
                    "node run {} of run {} had this key, but {e}",
                    hit.node_run_id, hit.run_id
                ));
                self.slots[index].cache = Some(record);
                self.to_start.push(Reverse((index, 1)));
                false
            }
        }
    }

    fn finish_cached(
        &mut self,
        index: usize,
        mut record: CacheRecord,
        hit: &CacheHit,
        restored: usize,
    ) {
        let node = &self.dag.pipeline.nodes[index];
        record.source = Some(hit.node_run_id);
        record.files.clone_from(&hit.files);
        let reason = format!(
            "node run {} of run {} had the same key: its recorded result was taken, and no \
             process started",
            hit.node_run_id, hit.run_id
        );
        let detail = match restored {
            0 => format!("from run {}", hit.run_id),
            n => format!("from run {}, {n} output file(s) restored", hit.run_id),
        };
        self.observer.event(&Event::NodeFinished {
            node: &node.id,
            attempt: 1,
            state: NodeState::Cached,
            duration: None,
            detail: Some(&detail),
            outputs: Some(&hit.outputs),
            will_retry: false,
        });
        // Templates see the result as it was when the node ran.
        self.slots[index].entry = json!({
            "state": NodeState::Succeeded,
            "kind": node.kind,
            "error": null,
            "outputs": hit.outputs,
        });
        let record = NodeRecord {
            outputs: Some(hit.outputs.clone()),
            reason: Some(reason),
            cache: Some(record),
            ..Default::default()
        };
        self.recorder.record(Write::Finish {
            node_id: node.id.clone(),
            attempt: 1,
            state: NodeState::Cached,
            record: Box::new(record),
        });
        self.mark_done(index, NodeState::Cached);
    }

    /// A node's key (see [`crate::cache`]) but for its input files, which are hashed off the
    /// loop (see [`Executor::start_keying`]): its definition, kavi's version, the governing
    /// files, what its templates read and its environment.
    fn node_key(&self, index: usize) -> Key {
        let node = &self.dag.pipeline.nodes[index];
        let spec = node
            .cache
            .as_ref()
            .expect("only nodes with inputs have keys");
        let mut key = Key::default();
        key.parts
            .insert("definition".into(), spec.definition.clone());
        key.add("kavi", env!("CARGO_PKG_VERSION"));
        key.parts.extend(spec.governing.iter().cloned());
        key.parts.extend(self.config_parts.iter().cloned());
        // What its templates read; `config` is the configuration's governing member.
        let run = json!({ "id": self.run_id, "pipeline": self.dag.pipeline.name, "spec_hash": self.dag.pipeline.spec_hash });
        for (path, _) in &node.reads {
            let mut names = path.split('.');
            let (root, name) = (names.next().unwrap_or_default(), names.next());
            let (prefix, values) = match root {
                "params" => ("param", &self.params),
                "run" => ("run", &run),
                "nodes" => {
                    for (i, other) in self.dag.pipeline.nodes.iter().enumerate() {
                        if name.is_none_or(|id| id == other.id) && self.slots[i].state.is_some() {
                            key.add(
                                format!("node:{}", other.id),
                                self.slots[i].entry.to_string(),
                            );
                        }
                    }
                    continue;
                }
                _ => continue,
            };
            for (field, value) in values.as_object().into_iter().flatten() {
                if name.is_none_or(|name| name == field) {
                    key.add(format!("{prefix}:{field}"), value.to_string());
                }
            }
        }
        for (name, value) in crate::process::base_env() {
            key.add(format!("env:{name}"), value);
        }
        if node.action.inherits_environment() {
            let mut inherited: Vec<String> = std::env::vars()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            inherited.sort();
            key.add("env:*", inherited.join("\0"));
        }
        key
    }

    /// Why a node cannot run because of its dependencies, if it cannot.
    fn dependency_verdict(&self, index: usize) -> Option<(NodeState, String)> {
        let nodes = &self.dag.pipeline.nodes;
        let node = &nodes[index];
        let mut deps: Vec<usize> = self.dag.dependencies(index).collect();
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
    fn start_due_nodes(&mut self) -> Result<(), LedgerError> {
        while self.running.len() < self.env.jobs.max(1) {
            let Some(Reverse((index, attempt))) = self.to_start.pop() else {
                break;
            };
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
            } else {
                self.spawn_attempt(index, attempt)?;
            }
        }
        Ok(())
    }

    fn spawn_attempt(&mut self, index: usize, attempt: u32) -> Result<(), LedgerError> {
        let node = &self.dag.pipeline.nodes[index];
        self.recorder.record(Write::Start {
            node_id: node.id.clone(),
            kind: node.kind,
            attempt,
            at: jiff::Timestamp::now(),
        });
        if node.action.uses_ledger() {
            // It reads what the run recorded so far, and writes on a connection of its own.
            self.recorder.sync()?;
        }
        tracing::debug!(run = self.run_id, node = %node.id, attempt, "node started");
        self.observer.event(&Event::NodeStarted {
            node: &node.id,
            attempt,
        });
        let action = Arc::clone(&node.action);
        let node_id = node.id.clone();
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
        if crate::nodes::HTTP_KINDS.contains(&node.kind) {
            self.http_attempts_started += 1;
        }
        self.running.spawn(async move {
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
    fn task_done(&mut self, task: Done) -> Result<(usize, Option<NodeState>), LedgerError> {
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
        let node = &self.dag.pipeline.nodes[index];
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
        tracing::debug!(run = self.run_id, node = %node.id, attempt, state = %outcome.state, will_retry, "node finished");
        self.observer.event(&Event::NodeFinished {
            node: &node.id,
            attempt,
            state: outcome.state,
            duration: Some(duration),
            detail: outcome.error.as_deref(),
            outputs: Some(&outcome.outputs),
            will_retry,
        });
        self.recorder.record(Write::Finish {
            node_id: node.id.clone(),
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

    fn finish_without_running(
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

    fn finish_without_running_attempt(
        &mut self,
        index: usize,
        attempt: u32,
        state: NodeState,
        error: Option<&str>,
        reason: Option<&str>,
    ) -> Result<(), LedgerError> {
        let node = &self.dag.pipeline.nodes[index];
        if attempt > 1 {
            // A retry that never started still gets its own row, so the ledger shows why.
            self.recorder.record(Write::Start {
                node_id: node.id.clone(),
                kind: node.kind,
                attempt,
                at: jiff::Timestamp::now(),
            });
        }
        self.recorder.record(Write::Finish {
            node_id: node.id.clone(),
            attempt,
            state,
            record: Box::new(NodeRecord {
                error: error.map(str::to_owned),
                reason: reason.map(str::to_owned),
                ..Default::default()
            }),
        });
        self.observer.event(&Event::NodeFinished {
            node: &node.id,
            attempt,
            state,
            duration: None,
            detail: error.or(reason),
            outputs: None,
            will_retry: false,
        });
        self.slots[index].entry = json!({
            "state": state,
            "kind": self.dag.pipeline.nodes[index].kind,
            "error": error.or(reason),
            "outputs": {},
        });
        Ok(())
    }

    /// Records a node's final state and releases the nodes that were waiting on it.
    fn mark_done(&mut self, index: usize, state: NodeState) {
        self.note_final(index, state);
        let dependants: Vec<usize> = self.dag.dependants(index).collect();
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
    fn note_final(&mut self, index: usize, state: NodeState) {
        self.slots[index].state = Some(state);
        if state == NodeState::AwaitingReview {
            self.awaiting_review = true;
        }
        let node = &self.dag.pipeline.nodes[index];
        if counts_as_failure(node, state) && !self.run_cancel.is_cancelled() {
            self.failed = true;
            if self.dag.pipeline.fail_fast && state != NodeState::Blocked {
                self.stop(&format!(
                    "`{}` {} and the pipeline is fail_fast",
                    node.id,
                    describe_state(state)
                ));
            }
        }
    }

    /// The template context for a node. Only the nodes its templates read are included, unless
    /// it reads `nodes` as a whole: building every node's outputs for every node would make
    /// large pipelines quadratic.
    fn context_for(&self, index: usize) -> minijinja::Value {
        let node = &self.dag.pipeline.nodes[index];
        let mut nodes = serde_json::Map::new();
        let reads_all = node.reads.iter().any(|(path, _)| path == "nodes");
        let wanted: Vec<usize> = if reads_all {
            (0..self.slots.len()).collect()
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
        minijinja::context! {
            params => self.run_vars.params.clone(),
            nodes => minijinja::Value::from_serialize(&nodes),
            run => self.run_vars.run.clone(),
            config => self.run_vars.config.clone(),
        }
    }
}

/// Whether a node ending in `state` fails its run.
pub fn counts_as_failure(node: &crate::spec::NodeSpec, state: NodeState) -> bool {
    matches!(
        state,
        NodeState::Failed | NodeState::TimedOut | NodeState::Blocked | NodeState::Cancelled
    ) && node.on_failure == OnFailure::Stop
}

/// Whether a node's templates read `nodes.<id>.outputs` (or all of `nodes`).
fn reads_outputs_of(node: &crate::spec::NodeSpec, id: &str) -> bool {
    let node_prefix = format!("nodes.{id}");
    node.reads.iter().any(|(path, _)| {
        path == "nodes"
            || path == &node_prefix
            || path
                .strip_prefix(&node_prefix)
                .is_some_and(|rest| rest.starts_with(".outputs"))
    })
}

async fn sleep_until_opt(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due.into()).await,
        None => std::future::pending().await,
    }
}

/// "failed", "timed out", ... as the end of a sentence about a node.
pub fn describe_state(state: NodeState) -> &'static str {
    match state {
        NodeState::Failed => "failed",
        NodeState::TimedOut => "timed out",
        NodeState::Blocked => "was blocked",
        NodeState::Cancelled => "was cancelled",
        NodeState::Skipped => "was skipped",
        NodeState::Interrupted => "was interrupted",
        NodeState::AwaitingReview => "is awaiting review",
        NodeState::Succeeded | NodeState::Cached | NodeState::Reused => "succeeded",
        NodeState::Pending | NodeState::Running => "did not finish",
    }
}
