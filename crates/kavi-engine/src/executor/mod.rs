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

mod attempts;
mod caching;
mod fan_out;
mod recorder;
mod status;
mod step;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cache::Key;
use crate::dag::Dag;
use crate::ledger::{Artifact, CacheHit, CacheRecord, Ledger, LedgerError, NewRun, RunOrigin};
use crate::node::{ChildRun, ChildRuns, Environment, NodeOutcome};
use crate::spec::Pipeline;
use crate::spec::governing::{Role, config_settings};
use crate::spec::{OnFailure, Trigger};
use crate::state::{NodeState, RunStatus};
use recorder::{Recorder, Write};
pub use status::{Inputs, NodeStatus, status};
pub use step::{
    Progress, StepOf, StepOutcome, StepWork, execute_step, progress, rows_by_node,
    settle_external_run,
};

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
    /// A node's attempt found its concurrency group full and waits for a slot (said once per
    /// wait, and again when it cancels the runs holding the group).
    NodeWaiting {
        node: &'a str,
        attempt: u32,
        /// Why: the group, its limit and its holders.
        why: &'a str,
        /// The kavi processes it asked to make way (`on_conflict = "cancel-running"`): process
        /// ids, or `pid@host` on a server's ledger.
        cancelled: &'a [String],
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
    /// Nodes that run even when up to date (`pipeline run --rerun NODE`), by id.
    pub rerun: HashSet<String>,
    /// For a resumed run, the changes of rules it was allowed to start over, a line each.
    pub allowed_changes: Option<String>,
}

impl From<RunOrigin> for RunStart {
    fn from(origin: RunOrigin) -> Self {
        Self {
            origin,
            reuse: HashMap::new(),
            rerun: HashSet::new(),
            allowed_changes: None,
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

/// What the loop knows about one node, or one instance of a node that runs once per item: the
/// pipeline's nodes have the first slots, in order; instances are added as their items are
/// known.
struct Slot {
    state: Option<NodeState>,
    waiting_on: usize,
    entry: Value,
    /// The key of a node that declares its inputs, computed when it became ready.
    cache: Option<CacheRecord>,
    /// The pipeline node it runs: its own index, or, for an instance, its fan-out's.
    node: usize,
    /// For an instance: its position among its fan-out's and its item.
    instance: Option<(usize, Value)>,
    /// For a fan-out once its items are known: its instances' slots, and how many of their
    /// attempts are running (`max_parallel`).
    instances: Option<(std::ops::Range<usize>, u32)>,
    /// While an attempt waits for a slot of the node's concurrency group: its wait.
    group_wait: Option<crate::groups::GroupWait>,
}

impl Slot {
    fn new(node: usize, waiting_on: usize) -> Self {
        Self {
            state: None,
            waiting_on,
            entry: Value::Null,
            cache: None,
            node,
            instance: None,
            instances: None,
            group_wait: None,
        }
    }
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
    /// See [`RunStart::rerun`].
    rerun: HashSet<String>,
    /// The run's configuration, setting by setting (see [`config_settings`]): a node's key
    /// takes those its result depends on.
    config_settings: std::collections::BTreeMap<String, String>,
    recorder: Recorder,
    /// The parts of every node's template context that do not change during the run, made
    /// once: converting them again for each node cost more than the node's own part.
    run_vars: RunVars,
    /// A step's node (`kavi pipeline step`): the one node this executor may start. Another that
    /// its outcome makes ready to run (a failure handler) is its own step's to run: started
    /// here, it would be left running when the step ends.
    starts_only: Option<usize>,
    /// An attempt due to start waits for a slot of its concurrency group: the loop tries again
    /// after [`crate::groups::RETRY`].
    waiting_for_group: bool,
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
    let RunStart {
        origin,
        reuse,
        rerun,
        allowed_changes,
    } = start;
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
        NewRun {
            allowed_changes,
            ..new_run(
                pipeline,
                &params,
                &members,
                origin,
                env.owner.name(),
                &env.config,
            )
        }
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
    executor.reuse = reuse;
    executor.rerun = rerun;
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
/// set resolved for the run), all its nodes pending, with the machine-local settings of
/// `config` (the resolved configuration).
pub fn new_run(
    pipeline: &Pipeline,
    params: &Value,
    members: &[GoverningMember<'_>],
    origin: RunOrigin,
    owner: &str,
    config: &Value,
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
        allowed_changes: None,
        local_settings: Some(crate::spec::governing::local_settings(config)),
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
        let config_settings = config_settings(&env.config);
        Executor {
            dag,
            env,
            ledger,
            observer,
            params,
            run_id,
            slots: (0..dag.len())
                .map(|i| Slot::new(i, dag.dependencies(i).count()))
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
            rerun: HashSet::new(),
            config_settings,
            recorder,
            run_vars,
            starts_only: None,
            waiting_for_group: false,
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
                () = tokio::time::sleep(crate::groups::RETRY), if self.waiting_for_group => {}
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

    /// The pipeline node slot `index` runs.
    fn spec(&self, index: usize) -> &'a crate::spec::NodeSpec {
        &self.dag.pipeline.nodes[self.slots[index].node]
    }

    /// The id slot `index` is recorded and shown under: its node's, or for an instance
    /// `id[position]`.
    fn slot_id(&self, index: usize) -> String {
        let id = &self.spec(index).id;
        match &self.slots[index].instance {
            Some((position, _)) => crate::spec::FanOut::instance_id(id, *position),
            None => id.clone(),
        }
    }

    /// Spends a budget if starting `index` would take more than it allows.
    fn check_budget(&mut self, index: usize) {
        let budget = self.dag.pipeline.budget;
        let node = self.spec(index);
        if budget
            .attempts
            .is_some_and(|limit| self.attempts_started >= limit)
        {
            let limit = budget.attempts.unwrap_or_default();
            self.spend_budget("attempts", &format!("{limit} node attempts"));
        } else if node.calls_http
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
        let handler = self.spec(index).trigger != Trigger::Success;
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
            let node = self.spec(index);
            if node.fan_out.is_some() && self.slots[index].instance.is_none() {
                finished += usize::from(self.settle_fan_out(index)?);
                continue;
            }
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
                None if self.starts_only.is_some_and(|only| only != index) => {}
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
