//! Writes the executor's decisions to the ledger on a thread of its own.
//!
//! The loop hands over each decision (a node started, a node ended) and goes on at once; the
//! thread writes the decisions that arrive within a moment of each other as one transaction
//! (group commit). On a chain of short nodes the next node's process runs while the ledger
//! records the one before it, and a commit, which costs more than the writes in it, is shared
//! by the nodes that ended meanwhile. A hard kill loses only what was not yet committed: those
//! nodes stay `pending` or `running`, and the next kavi marks them interrupted like any other
//! unfinished node.
//!
//! A first attempt that starts and ends within one group is written once: its pending row goes
//! straight to how it ended, with its start time. Both writes would share one transaction, so
//! no reader could have seen it `running`; what the group saves is a write and a journal entry
//! for every short node.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::ledger::{Ledger, LedgerError, NewRun, NodeRecord, format_time};
use crate::state::{NodeState, RunStatus};

/// One decision to record.
pub(super) enum Write {
    /// A node run the run did not begin with: an instance of a fan-out, pending.
    Pending { node_id: String, kind: &'static str },
    /// An attempt due to start waits for a slot of its concurrency group: why, on its row.
    Waiting {
        node_id: String,
        kind: &'static str,
        attempt: u32,
        reason: String,
    },
    Start {
        node_id: String,
        kind: &'static str,
        attempt: u32,
        /// When the loop started it, not when the writer gets to it.
        at: jiff::Timestamp,
    },
    Finish {
        node_id: String,
        attempt: u32,
        state: NodeState,
        /// Boxed: a node's end is far larger than its start.
        record: Box<NodeRecord>,
    },
    /// How the run ended: the last decision, committed with the nodes' last ends.
    RunEnd {
        status: RunStatus,
        duration: Duration,
        error: Option<String>,
    },
}

enum Message {
    Write(Write),
    /// Answered once everything sent before it is committed (or has failed).
    Sync(mpsc::SyncSender<()>),
}

pub(super) struct Recorder {
    /// Decisions of the loop's current turn, not handed over yet (see [`Recorder::hand_over`]).
    held: Vec<Write>,
    sender: Option<mpsc::Sender<Message>>,
    /// How the writing ended, sent once the channel closed and the last group is committed.
    written: Option<mpsc::Receiver<Result<(), LedgerError>>>,
    /// The writer's thread, which goes on closing its connection after it has written (see
    /// [`Recorder::closing`]).
    thread: Option<JoinHandle<()>>,
    failed: Arc<AtomicBool>,
    clock: WriteClock,
}

/// How long one of the writer's commits may take before the loop takes the ledger for
/// unreachable (a server gone, its connection being made again; a file locked past its busy
/// timeout). A commit takes milliseconds, or a moment more when another kavi writes.
const STALL: Duration = Duration::from_millis(250);

/// When the writer began the write it is at, for the loop to see it stalled.
#[derive(Clone)]
struct WriteClock {
    epoch: Instant,
    /// Milliseconds from `epoch` plus one when the write began; 0 between writes.
    since: Arc<AtomicU64>,
}

impl WriteClock {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            since: Arc::new(AtomicU64::new(0)),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
    }

    fn begin(&self) {
        self.since.store(self.now(), Ordering::Release);
    }

    fn end(&self) {
        self.since.store(0, Ordering::Release);
    }

    fn stalled(&self) -> bool {
        let since = self.since.load(Ordering::Acquire);
        since != 0 && self.now().saturating_sub(since) > STALL.as_millis() as u64
    }
}

impl Recorder {
    /// Starts the writer on a connection of its own to `ledger`'s file, recording into run
    /// `run_id`, which the ledger already holds.
    pub(super) fn start(ledger: &mut Ledger, run_id: i64) -> Result<Self, LedgerError> {
        Self::launch(ledger, move |_| Ok(run_id))
    }

    /// Starts the writer on a connection of its own to `ledger`'s file. It records the run
    /// `make_run` puts together (the run, its governing set and a pending node run per node,
    /// in one transaction) and then the run's decisions. `make_run` runs here while the writer
    /// starts and connects (on a 1,000-node chain, about 0.4 and 0.3 ms). Returns with the
    /// run's id as soon as the writer has it, while the writer goes on with the rest of that
    /// transaction: on such a pipeline that is most of it, and the first nodes run meanwhile.
    /// A node that uses the ledger syncs first, so it reads the run whole (see
    /// [`Recorder::sync`]).
    pub(super) fn begin(
        ledger: &mut Ledger,
        make_run: impl FnOnce() -> NewRun,
    ) -> Result<(Self, i64), LedgerError> {
        let (announce, announced) = mpsc::sync_channel(1);
        let (hand_run, run_made) = mpsc::sync_channel::<NewRun>(1);
        let mut recorder = Self::launch(ledger, move |connection| {
            // Without a run, the loop that was to make it is gone: there is nothing to record.
            let run = run_made.recv().map_err(|_| {
                LedgerError::Io(std::io::Error::other("no run was handed to the recorder"))
            })?;
            connection.create_run_announcing(&run, |id| {
                let _ = announce.send(id);
            })
        })?;
        // Declared after the recorder, so dropped before it: should `make_run` panic, the
        // writer's wait for the run ends, and the recorder's drop does not wait on it forever.
        let hand_run = hand_run;
        // A writer that failed to connect has dropped its end: `finish` says why, below.
        let _ = hand_run.send(make_run());
        match announced.recv() {
            Ok(run_id) => Ok((recorder, run_id)),
            // The writer failed before the run had an id: `finish` says why.
            Err(_) => Err(recorder.finish().err().unwrap_or_else(|| {
                LedgerError::Io(std::io::Error::other(
                    "the thread recording the run stopped before the run was recorded",
                ))
            })),
        }
    }

    /// Starts the writer: once connected, it calls `first` for the run to record into, then
    /// writes the loop's decisions until the recorder finishes.
    fn launch(
        ledger: &mut Ledger,
        first: impl FnOnce(&mut Ledger) -> Result<i64, LedgerError> + Send + 'static,
    ) -> Result<Self, LedgerError> {
        let connection = ledger.another_connection()?;
        let (sender, receiver) = mpsc::channel();
        let (report, written) = mpsc::sync_channel(1);
        let failed = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&failed);
        let clock = WriteClock::new();
        let writer_clock = clock.clone();
        let thread = std::thread::Builder::new()
            .name("kavi-recorder".into())
            .spawn(move || {
                let result = connection.open().and_then(|mut connection| {
                    connection.checkpoint_every(CHECKPOINT_PAGES)?;
                    let run_id = first(&mut connection)?;
                    write_groups(&mut connection, run_id, &receiver, &writer_clock)?;
                    Ok(connection)
                });
                match result {
                    Ok(connection) => {
                        let _ = report.send(Ok(()));
                        // Written: the run's end is committed and the loop reads it back. The
                        // WAL pages the last commits left are copied into the file meanwhile,
                        // on this thread, rather than by the last connection to close, on the
                        // run's time (see `Ledger::close_after`).
                        if let Err(e) = connection.copy_wal() {
                            tracing::debug!(error = %e, "the recorder's last checkpoint failed");
                        }
                    }
                    Err(e) => {
                        flag.store(true, Ordering::Release);
                        // Whoever waits for a sync learns of the failure from `finish`.
                        while let Ok(message) = receiver.recv() {
                            if let Message::Sync(done) = message {
                                let _ = done.send(());
                            }
                        }
                        let _ = report.send(Err(e));
                    }
                }
            })?;
        Ok(Self {
            held: Vec::new(),
            sender: Some(sender),
            written: Some(written),
            thread: Some(thread),
            failed,
            clock,
        })
    }

    /// Whether the writer has been at one write for longer than [`STALL`]: the ledger cannot
    /// record now, and nothing is to start that it would have to.
    pub(super) fn stalled(&self) -> bool {
        self.clock.stalled()
    }

    /// Keeps `write` until the loop's turn ends ([`Recorder::hand_over`]).
    pub(super) fn record(&mut self, write: Write) {
        self.held.push(write);
    }

    /// Whether decisions wait to be handed over.
    pub(super) fn holds_any(&self) -> bool {
        !self.held.is_empty()
    }

    /// Hands the turn's decisions over, in the order they were made. The first may wake the
    /// writer, a system call here and a context switch there: the loop calls this once the
    /// nodes it just started have their processes, so that the wake is not paid between one
    /// node's end and the next one's start. While the writer lingers it is parked, not waiting
    /// on the channel, and the rest wake nobody.
    pub(super) fn hand_over(&mut self) {
        let held = std::mem::take(&mut self.held);
        if let Some(sender) = &self.sender {
            for write in held {
                // A closed channel means the writer failed: `check` reports why.
                let _ = sender.send(Message::Write(write));
            }
        }
    }

    /// Cuts the writer's linger short: someone waits.
    fn hurry(&self) {
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }

    /// Waits until everything recorded so far is committed, then reports a failure if the
    /// writer had one.
    pub(super) fn sync(&mut self) -> Result<(), LedgerError> {
        self.hand_over();
        if let Some(sender) = &self.sender {
            let (done, wait) = mpsc::sync_channel(1);
            let sent = sender.send(Message::Sync(done)).is_ok();
            self.hurry();
            let answered = sent && wait.recv().is_ok();
            if !answered {
                // The writer stopped with the group this sync was in.
                return self.finish();
            }
        }
        self.check()
    }

    /// The writer's failure, once it has had one.
    pub(super) fn check(&mut self) -> Result<(), LedgerError> {
        if self.failed.load(Ordering::Acquire) {
            return self.finish();
        }
        Ok(())
    }

    /// Commits what is left and stops the writer, returning once everything is committed. Its
    /// thread may still be closing its connection: see [`Recorder::closing`].
    pub(super) fn finish(&mut self) -> Result<(), LedgerError> {
        self.hand_over();
        self.sender = None;
        self.hurry();
        match self.written.take().map(|written| written.recv()) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err(LedgerError::Io(std::io::Error::other(
                "the thread recording the run into the ledger stopped unexpectedly",
            ))),
        }
    }

    /// The writer's thread, once [`Recorder::finish`]ed, for whoever closes the ledger last to
    /// wait for: it may still be copying the WAL into the ledger file.
    pub(super) fn closing(&mut self) -> Option<JoinHandle<()>> {
        if self.written.is_some() {
            return None;
        }
        self.thread.take()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.finish();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How long the writer waits, after a decision arrives, for others to share its commit. A
/// commit costs more than the writes in it; on a chain of short nodes one node ends every
/// millisecond or so. Measured on a 1,000-node printing chain: 1.12 s writing at once, 0.99 s
/// lingering 1 ms, 0.98 s lingering 3 ms. Longer still, the wall time no longer moves but the
/// writer's CPU, which the nodes' processes need on a wide graph, falls: medians of 14 runs of
/// 1,000 independent nodes at `--jobs 2`, 111 ms lingering 2 ms, 89 ms at 5 ms, 76 ms at 10 ms.
/// A hard kill loses at most that much more of the decisions. A sync, or the end of the run,
/// does not wait.
const LINGER: Duration = Duration::from_millis(10);

/// How many pages the writer's commits may leave in the WAL before it copies them into the
/// ledger file. Whatever is left when the run ends, the last connection to close copies, on
/// the run's time: after a 1,000-node chain, SQLite's own 1,000 left 20 to 203 pages there
/// (10.0 ms from printing the run to exiting, median of 8), 200 left 11 to 52 (5.2 ms). The
/// writer copies the rest while the nodes run.
const CHECKPOINT_PAGES: u32 = 200;

/// Writes groups until the channel closes: each group is what arrived within [`LINGER`] of its
/// first decision, gathered before the write lock is taken, so no other kavi waits on it.
fn write_groups(
    ledger: &mut Ledger,
    run_id: i64,
    receiver: &mpsc::Receiver<Message>,
    clock: &WriteClock,
) -> Result<(), LedgerError> {
    let mut group = Vec::new();
    let (mut groups, mut writes) = (0_usize, 0_usize);
    // The run's lease is renewed while this thread lives: with the first group after a third
    // of it has passed, or on its own when nothing is written for that long (a long node).
    let renew_every = crate::ledger::lease() / 3;
    let mut renewed = Instant::now();
    loop {
        let first = match receiver.recv_timeout(renew_every) {
            Ok(first) => first,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                clock.begin();
                ledger.renew_run_lease(run_id)?;
                clock.end();
                renewed = Instant::now();
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        gather(first, receiver, Instant::now() + LINGER, &mut group);
        fold_starts(&mut group);
        groups += 1;
        writes += group.len();
        clock.begin();
        let mut undone = 0;
        loop {
            let renew = renewed.elapsed() >= renew_every;
            match write_group(ledger, run_id, &group, renew) {
                Ok(()) => break,
                // Two runs on one server write the same content-addressed rows (the same
                // output of the same node) in another order: the server aborts one to end
                // the deadlock, and that one, done again, goes through. A server that
                // restarts ends the session under the group: its connection is made again
                // (waiting for the server as long as a statement may take) for the next try.
                Err(e) if e.is_undone() && undone < UNDONE_RETRIES => {
                    undone += 1;
                    tracing::debug!(run = run_id, undone, "group written again: {e}");
                }
                Err(e) => return Err(e),
            }
        }
        if renewed.elapsed() >= renew_every {
            renewed = Instant::now();
        }
        clock.end();
        for message in group.drain(..) {
            if let Message::Sync(done) = message {
                let _ = done.send(());
            }
        }
    }
    // What the group commits cost, for whoever profiles a run (`RUST_LOG=kavi=debug`).
    let cpu = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default();
    tracing::debug!(groups, writes, cpu = ?cpu, "recorder done");
    Ok(())
}

/// Writes one group in one transaction (renewing the run's lease first when `renew`), or
/// nothing when any of it fails.
fn write_group(
    ledger: &mut Ledger,
    run_id: i64,
    group: &[Message],
    renew: bool,
) -> Result<(), LedgerError> {
    ledger.begin_batch()?;
    let written = (|| {
        if renew {
            ledger.renew_run_lease(run_id)?;
        }
        for message in group {
            if let Message::Write(write) = message {
                apply(ledger, run_id, write)?;
            }
        }
        ledger.commit_batch()
    })();
    if written.is_err() {
        ledger.rollback_batch();
    }
    written
}

/// How often a group the server undid (a conflict with another run's, a restart) is written
/// again.
const UNDONE_RETRIES: u32 = 5;

/// How many decisions a group holds at most: a burst (nodes found up to date one after another,
/// some 25 a millisecond) is written while it arrives rather than once the linger is over, and
/// the writer, whose CPU is the longest part of such a run, ends sooner after the loop. A
/// 1,000-node chain found up to date (bench.sh's), hyperfine, 25 runs in either order: 126.9 and
/// 125.5 ms without, 121.4 and 116.3 ms with; at 64 no faster than without. A chain or a wide
/// graph of real processes never fills one (a few nodes end per linger).
const GROUP_MOST: usize = 128;

/// Collects `first` and what follows it until `deadline`, [`GROUP_MOST`] decisions, a sync
/// (someone waits for it), or the end of the run. In between it parks rather than waiting on
/// the channel: senders then have no one to wake, and a sync or the end unparks it (see
/// [`Recorder::hurry`]).
fn gather(
    first: Message,
    receiver: &mpsc::Receiver<Message>,
    deadline: Instant,
    group: &mut Vec<Message>,
) {
    let mut next = first;
    loop {
        let sync = matches!(next, Message::Sync(_));
        group.push(next);
        if sync || group.len() >= GROUP_MOST {
            return;
        }
        next = loop {
            match receiver.try_recv() {
                Ok(message) => break message,
                Err(mpsc::TryRecvError::Disconnected) => return,
                Err(mpsc::TryRecvError::Empty) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::park_timeout(left);
        };
    }
}

/// Drops the start of every first attempt that also ends in `group`, handing its time to the
/// end (see the module's comment). A retry's start stays: it adds the row its end updates.
fn fold_starts(group: &mut Vec<Message>) {
    let mut folded = Vec::new();
    {
        let mut starts: HashMap<&str, (usize, jiff::Timestamp)> = HashMap::new();
        for (index, message) in group.iter().enumerate() {
            match message {
                Message::Write(Write::Start {
                    node_id,
                    attempt: 1,
                    at,
                    ..
                }) => {
                    starts.insert(node_id, (index, *at));
                }
                Message::Write(Write::Finish {
                    node_id,
                    attempt: 1,
                    ..
                }) => {
                    if let Some((start, at)) = starts.remove(node_id.as_str()) {
                        folded.push((start, at, index));
                    }
                }
                _ => {}
            }
        }
    }
    if folded.is_empty() {
        return;
    }
    let mut keep = vec![true; group.len()];
    for (start, at, end) in folded {
        keep[start] = false;
        if let Message::Write(Write::Finish { record, .. }) = &mut group[end] {
            record.started_at = Some(format_time(at));
        }
    }
    let mut keep = keep.into_iter();
    group.retain(|_| keep.next().unwrap_or(true));
}

fn apply(ledger: &mut Ledger, run_id: i64, write: &Write) -> Result<(), LedgerError> {
    match write {
        Write::Pending { node_id, kind } => ledger.add_node(run_id, node_id, kind),
        Write::Waiting {
            node_id,
            kind,
            attempt,
            reason,
        } => ledger.note_waiting(run_id, node_id, kind, *attempt, reason),
        Write::Start {
            node_id,
            kind,
            attempt,
            at,
        } => ledger.start_node(run_id, node_id, kind, *attempt, &format_time(*at)),
        Write::Finish {
            node_id,
            attempt,
            state,
            record,
        } => ledger.finish_node(run_id, node_id, *attempt, *state, record),
        Write::RunEnd {
            status,
            duration,
            error,
        } => ledger.finish_run(run_id, *status, *duration, error.as_deref()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::testing::{fresh_ledger, new_run, wal_frames};

    /// A ledger in a temporary folder, and a recorder that has begun a run of exec nodes
    /// `nodes` in it, committed, all pending.
    fn run_of(nodes: &[&str]) -> (tempfile::TempDir, Ledger, Recorder, i64) {
        let (dir, mut ledger, owner) = fresh_ledger();
        let params = serde_json::json!({});
        let (mut recorder, run_id) =
            Recorder::begin(&mut ledger, || new_run(&params, nodes, &owner)).unwrap();
        recorder.sync().unwrap();
        (dir, ledger, recorder, run_id)
    }

    fn start(node: &str) -> Write {
        Write::Start {
            node_id: node.into(),
            kind: "exec",
            attempt: 1,
            at: jiff::Timestamp::now(),
        }
    }

    /// A burst is cut into groups of at most GROUP_MOST as it arrives, without waiting out the
    /// linger; what trickles in waits for it, for others to share the commit.
    #[test]
    fn a_burst_is_written_in_groups_as_it_arrives_and_a_trickle_lingers() {
        let (sender, receiver) = mpsc::channel();
        for i in 0..GROUP_MOST + 10 {
            sender
                .send(Message::Write(start(&format!("n{i}"))))
                .unwrap();
        }
        let far = Instant::now() + Duration::from_secs(30);
        let mut group = Vec::new();
        let first = receiver.recv().unwrap();
        let began = Instant::now();
        gather(first, &receiver, far, &mut group);
        assert_eq!(group.len(), GROUP_MOST);
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "it waited for the deadline"
        );

        // The ten left: fewer than a group, so they wait until the deadline.
        group.clear();
        let first = receiver.recv().unwrap();
        let began = Instant::now();
        gather(first, &receiver, Instant::now() + LINGER, &mut group);
        assert_eq!(group.len(), 10);
        assert!(began.elapsed() >= LINGER);
    }

    fn states(ledger: &Ledger, run_id: i64) -> Vec<(String, NodeState)> {
        let detail = ledger.run_detail(run_id).unwrap();
        detail
            .nodes
            .into_iter()
            .map(|n| (n.node_id, n.state))
            .collect()
    }

    #[test]
    fn a_sync_returns_once_everything_recorded_before_it_is_committed() {
        let (_dir, ledger, mut recorder, run_id) = run_of(&["a", "b"]);
        recorder.record(start("a"));
        recorder.record(Write::Finish {
            node_id: "a".into(),
            attempt: 1,
            state: NodeState::Succeeded,
            record: Box::new(NodeRecord {
                exit_code: Some(0),
                ..Default::default()
            }),
        });
        recorder.record(start("b"));
        recorder.sync().unwrap();
        assert_eq!(
            states(&ledger, run_id),
            [
                ("a".into(), NodeState::Succeeded),
                ("b".into(), NodeState::Running)
            ]
        );
        recorder.finish().unwrap();
    }

    #[test]
    fn a_run_whose_plan_cannot_be_written_is_not_recorded_at_all() {
        let (_dir, mut ledger, owner) = fresh_ledger();
        // Two nodes with one id: the second pending row breaks the node runs' unique key,
        // after the run already has its id.
        let (mut recorder, run_id) = Recorder::begin(&mut ledger, || {
            new_run(&serde_json::Value::Null, &["a", "a"], &owner)
        })
        .unwrap();
        let error = recorder.sync().unwrap_err();
        assert!(
            error.to_string().contains("UNIQUE"),
            "unexpected error: {error}"
        );
        assert!(matches!(
            ledger.run(run_id),
            Err(LedgerError::RunNotFound(_))
        ));
    }

    #[test]
    fn decisions_are_held_until_the_turn_hands_them_over() {
        let (_dir, ledger, mut recorder, run_id) = run_of(&["a"]);
        recorder.record(start("a"));
        // Time enough for the writer to have committed it, had it been handed over.
        std::thread::sleep(LINGER * 5);
        assert_eq!(states(&ledger, run_id), [("a".into(), NodeState::Pending)]);
        recorder.hand_over();
        recorder.sync().unwrap();
        assert_eq!(states(&ledger, run_id), [("a".into(), NodeState::Running)]);
        recorder.finish().unwrap();
    }

    fn finish(node: &str, attempt: u32) -> Write {
        Write::Finish {
            node_id: node.into(),
            attempt,
            state: NodeState::Succeeded,
            record: Box::new(NodeRecord {
                exit_code: Some(0),
                ..Default::default()
            }),
        }
    }

    /// The group's writes, as (what, node, attempt, the start time an end carries).
    fn described(group: &[Message]) -> Vec<(&str, &str, u32, Option<&str>)> {
        group
            .iter()
            .map(|message| match message {
                Message::Write(Write::Start {
                    node_id, attempt, ..
                }) => ("start", node_id.as_str(), *attempt, None),
                Message::Write(Write::Finish {
                    node_id,
                    attempt,
                    record,
                    ..
                }) => (
                    "finish",
                    node_id.as_str(),
                    *attempt,
                    record.started_at.as_deref(),
                ),
                Message::Write(Write::Pending { node_id, .. }) => {
                    ("pending", node_id.as_str(), 1, None)
                }
                Message::Write(Write::Waiting {
                    node_id, attempt, ..
                }) => ("waiting", node_id.as_str(), *attempt, None),
                Message::Write(Write::RunEnd { .. }) => ("run end", "", 0, None),
                Message::Sync(_) => ("sync", "", 0, None),
            })
            .collect()
    }

    #[test]
    fn a_first_attempt_that_starts_and_ends_in_one_group_is_written_once() {
        let at = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        let start_at = |node: &str, attempt: u32| Write::Start {
            node_id: node.into(),
            kind: "exec",
            attempt,
            at,
        };
        let mut group: Vec<Message> = [
            start_at("a", 1),
            start_at("b", 1),
            finish("b", 1),
            // A retry's start adds the row its end updates: it stays.
            start_at("a", 2),
            finish("a", 2),
            finish("a", 1),
            // Its end comes in a later group.
            start_at("c", 1),
        ]
        .into_iter()
        .map(Message::Write)
        .collect();
        fold_starts(&mut group);
        let time = format_time(at);
        assert_eq!(
            described(&group),
            [
                ("finish", "b", 1, Some(time.as_str())),
                ("start", "a", 2, None),
                ("finish", "a", 2, None),
                ("finish", "a", 1, Some(time.as_str())),
                ("start", "c", 1, None),
            ]
        );
    }

    #[test]
    fn a_folded_start_is_recorded_with_the_end() {
        let (_dir, ledger, mut recorder, run_id) = run_of(&["a"]);
        // Hold the writer's lock, so that both writes land in one group.
        ledger.begin_batch().unwrap();
        let at = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        recorder.record(Write::Start {
            node_id: "a".into(),
            kind: "exec",
            attempt: 1,
            at,
        });
        recorder.record(finish("a", 1));
        ledger.commit_batch().unwrap();
        recorder.sync().unwrap();
        let detail = ledger.run_detail(run_id).unwrap();
        let node = &detail.nodes[0];
        assert_eq!(node.state, NodeState::Succeeded);
        assert_eq!(node.started_at.as_deref(), Some("2023-11-14T22:13:20.000Z"));
        assert!(node.finished_at.is_some());
        recorder.finish().unwrap();
    }

    #[test]
    fn a_failed_write_is_reported_and_its_whole_group_is_rolled_back() {
        let (_dir, ledger, mut recorder, run_id) = run_of(&["a"]);
        // Hold the writer's lock, so that both writes wait and land in one group.
        ledger.begin_batch().unwrap();
        recorder.record(start("a"));
        // No such node run: its end cannot be recorded.
        recorder.record(Write::Finish {
            node_id: "ghost".into(),
            attempt: 1,
            state: NodeState::Succeeded,
            record: Box::default(),
        });
        ledger.commit_batch().unwrap();
        let error = recorder.sync().unwrap_err();
        assert!(
            error.to_string().contains("no rows"),
            "unexpected error: {error}"
        );
        assert_eq!(states(&ledger, run_id), [("a".into(), NodeState::Pending)]);
        // It stays failed: nothing more is written.
        recorder.record(start("a"));
        recorder.sync().unwrap();
        assert_eq!(states(&ledger, run_id), [("a".into(), NodeState::Pending)]);
    }

    #[test]
    fn the_runs_end_is_committed_with_the_last_group_and_the_writer_copies_the_wal() {
        let (dir, ledger, mut recorder, run_id) = run_of(&["a"]);
        recorder.record(start("a"));
        recorder.record(finish("a", 1));
        recorder.record(Write::RunEnd {
            status: RunStatus::Failed,
            duration: Duration::from_millis(7),
            error: Some("a reason".into()),
        });
        recorder.finish().unwrap();
        // Committed once `finish` returns, though the writer's thread may still be closing.
        let run = ledger.run(run_id).unwrap();
        assert_eq!(run.status, RunStatus::Failed);
        assert_eq!(run.error.as_deref(), Some("a reason"));
        assert_eq!(
            states(&ledger, run_id),
            [("a".into(), NodeState::Succeeded)]
        );
        let closing = recorder
            .closing()
            .expect("the writer's thread, once finished");
        closing.join().unwrap();
        // The writer copied every frame of the WAL into the file before it closed (the
        // wal-index says so, without a checkpoint of its own).
        let (frames, copied) = wal_frames(&dir.path().join("ledger.db"));
        assert!(frames > 0, "the run was written through the WAL");
        assert_eq!(copied, frames, "frames left in the WAL");
        // The ledger's connection closes last and removes the WAL.
        let wal = dir.path().join("ledger.db-wal");
        assert!(wal.exists());
        drop(ledger);
        assert!(
            !wal.exists(),
            "the last connection to close leaves the WAL behind"
        );
    }

    #[test]
    fn a_ledger_waits_for_the_connections_it_was_handed_to_close() {
        let (_dir, mut ledger, _owner) = fresh_ledger();
        let closed = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&closed);
        ledger.close_after(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            flag.store(true, Ordering::Release);
        }));
        drop(ledger);
        assert!(closed.load(Ordering::Acquire));
    }
}
