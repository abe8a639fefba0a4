//! Running trusted skills, and the record each run leaves.
//!
//! [`Runner::ready`] is the trust check: the skill must be TRUSTED and its files must hash to
//! the hash it was promoted at; or, while a newer version is forged in its folder, the tree
//! kept at its trusted version's promotion must. The bytes checked are written into a private
//! read-only [`Snapshot`], hashed again there, and the command runs them from there, never from
//! the workspace path. [`Runner::run`] then validates the input against the skill's
//! input schema, runs its command with the JSON on stdin, in an environment scrubbed to the
//! minimum plus the secrets it declares, under a timeout, and validates the output against the
//! output schema. Every run, and every step that failed before reaching its skill
//! ([`Runner::record_failure`]), leaves an [`ExecutionRecord`] in the ledger and, unless told
//! not to, a line in the JSONL log. Secret values are redacted from what is recorded.
//!
//! `kavi skill run`, chains, `kavi chat`, `kavi mcp`, `kavi replay` and `kavi executor` all run
//! skills through here; [`pool`] is how they ask a running executor.

pub mod log;
pub mod pool;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::confinement::policy::ConfinementPolicy;
use crate::ledger::{ArtifactStore, ExecutionRecord, Ledger, LedgerError, Owner, TrustedSkill};
use crate::process::Violation;
use crate::redact::Redactor;
use crate::skills::snapshot::Snapshot;
use crate::skills::trust::{Drift, SkillTree, TrustPolicy};
use crate::skills::{Proposal, TRUSTED};
use crate::template::TemplateEngine;

#[derive(Debug, thiserror::Error)]
pub enum ExecutionError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("failed to append to the executions log {path}: {source}")]
    Log {
        path: String,
        source: std::io::Error,
    },
    #[error("failed to start `{skill}`: {source}")]
    Spawn {
        skill: String,
        source: std::io::Error,
    },
}

/// Where a run sits: the execution it follows, and the chain step or pipeline run behind it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Lineage {
    pub parent: Option<String>,
    pub chain: Option<String>,
    pub step: Option<String>,
    pub run_id: Option<i64>,
    /// Who asked from outside kavi's commands (`mcp:<client>`).
    pub caller: Option<String>,
}

/// Why a skill may not run: which check failed, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No such skill (or no ledger yet, so no skill at all).
    #[error("{0}")]
    Unknown(String),
    /// The skill is not TRUSTED.
    #[error("{0}")]
    Trust(String),
    /// Its files do not hash to what was trusted (or cannot be read).
    #[error("{0}")]
    Hash(String),
    /// kavi could not read what it needs (the ledger, the skill spec).
    #[error("{0}")]
    Unreadable(String),
}

/// A trusted skill whose files still hash to the trusted hash, ready to run.
#[derive(Debug, Clone)]
pub struct Ready {
    pub name: String,
    pub proposal: Proposal,
    /// The trusted hash, which the files were just checked against.
    pub hash: String,
    /// The trusted version, which is the one that runs.
    pub version: i64,
    /// The bytes that were hashed, in a private read-only folder: the command runs these, never
    /// the workspace's files. Removed when the last run using them ends.
    snapshot: std::sync::Arc<Snapshot>,
}

impl Ready {
    /// Whether a sandbox started ahead ([`Runner::prestart`]) can run it: a READ_ONLY skill
    /// without secrets or writes whose command is the profile's `python3` running a script.
    fn prestartable(&self) -> bool {
        let proposal = &self.proposal;
        let command = self.command();
        proposal.side_effect.is_read_only()
            && proposal.secrets.is_empty()
            && proposal.writes.is_empty()
            && command.len() > PYTHON_ISOLATED.len() + 1
            && command[0] == PRESTARTED_PYTHON
            && command[1..=PYTHON_ISOLATED.len()] == PYTHON_ISOLATED
            // The loader runs a script, not an interpreter's option.
            && !command[PYTHON_ISOLATED.len() + 1].starts_with('-')
    }

    /// The argv that runs this version: paths into the skill's folder point into its snapshot,
    /// and a Python interpreter runs isolated.
    fn command(&self) -> Vec<String> {
        let mut argv = self
            .proposal
            .command_under(self.snapshot.folder(), self.snapshot.path());
        isolate_python(&mut argv);
        argv
    }
}

/// The flags a Python interpreter runs a skill with: `-I` (no user site, no `PYTHON*`
/// environment, neither the script's folder nor the working folder on `sys.path`) and `-B` (no
/// bytecode written).
const PYTHON_ISOLATED: [&str; 2] = ["-I", "-B"];

/// Puts [`PYTHON_ISOLATED`] after the program when it is a Python interpreter (a file named
/// `python`, `python3` or `python3.X`, in any folder). No other program runs a script: see
/// [`crate::skills::untrusted_program`].
fn isolate_python(argv: &mut Vec<String>) {
    let program = argv[0].rsplit('/').next().unwrap_or(&argv[0]);
    if crate::skills::is_python(program) {
        argv.splice(1..1, PYTHON_ISOLATED.map(str::to_owned));
    }
}

/// How a record's confinement says its process was started ahead (`launch`).
pub const PRESTARTED: &str = "pre-started";

/// The interpreter a pre-started sandbox runs: the one a skill's `python3` is, found on the
/// profile's search path inside the same view.
const PRESTARTED_PYTHON: &str = "python3";

/// What a pre-started sandbox's Python runs: it reads one line from its stdin, a byte at a
/// time (so nothing after it is read ahead), the skill's `sys.argv` as JSON, and runs that
/// script as `__main__`; the rest of stdin is the skill's input, as in a direct run. Without a
/// line (the sandbox discarded unused) it ends.
const LOADER: &str = "import json, os, runpy, sys
line = b''
while not line.endswith(b'\\n'):
    byte = os.read(0, 1)
    if not byte:
        sys.exit(0)
    line += byte
sys.argv = json.loads(line)
runpy.run_path(sys.argv[0], run_name='__main__')
";

/// What became of a run asked of a sandbox started ahead ([`Runner::run_prestarted`]).
#[derive(Debug)]
pub enum Claim {
    /// It ran there, and this is its record.
    Ran(Box<ExecutionRecord>),
    /// That sandbox cannot serve this run; the others still can serve others.
    Declined,
    /// A sandbox started now would see the workspace otherwise: the others, started with the
    /// same view, cannot serve either.
    OtherView,
}

/// A sandbox started before its skill is known ([`Runner::prestart`]). It serves one run
/// ([`Runner::run_prestarted`]) and ends with it; dropped unused, it ends at once.
pub struct Prestarted {
    confinement: crate::confinement::Confinement,
    /// Empty, and shown read-only in the sandbox where the skill's snapshot is expected, until
    /// the run's trust check writes the trusted bytes into it.
    snapshot: Option<kavi_foundation::sandbox::PrivateFolder>,
    tmp: kavi_foundation::sandbox::PrivateFolder,
    /// What its view of the workspace held when it was started (see
    /// `Confinement::workspace_stamp`; `None` when it shows no workspace), taken just before
    /// the view was built. Unset until then; closed unset when it could not be taken.
    view: tokio::sync::watch::Receiver<Option<Option<String>>>,
    /// The loader's line and the input, sent when the sandbox is claimed.
    feed: tokio::sync::oneshot::Sender<Vec<u8>>,
    stop: CancellationToken,
    finished: tokio::task::JoinHandle<std::io::Result<crate::process::Finished>>,
}

impl Prestarted {
    /// Whether its process is still waiting for a run: one that ended (killed, or at a bound)
    /// serves none.
    pub fn alive(&self) -> bool {
        !self.finished.is_finished()
    }

    /// Ends it unused, and waits until its process tree is gone.
    pub async fn discard(self) {
        self.stop.cancel();
        let _ = self.finished.await;
    }
}

/// What running skills needs from the workspace.
pub struct Runner<'a> {
    pub root: &'a Path,
    /// The ledger file; each call opens it (unless [`Runner::held`]), so a runner can be held
    /// across awaits.
    pub ledger: &'a Path,
    /// A connection to that ledger its caller holds open across runs (a resident executor's),
    /// used in place of opening the file on each call: opening one reads the schema, migrates
    /// and recovers, a few milliseconds a run.
    pub held: Option<&'a std::sync::Mutex<Ledger>>,
    /// Whether [`Runner::run`] asks a running `kavi executor` first (see [`pool`]).
    pub pool: bool,
    pub artifacts: &'a ArtifactStore,
    pub templates: &'a TemplateEngine,
    pub trust: &'a TrustPolicy,
    /// The JSONL log; `None` records in the ledger only.
    pub log: Option<&'a Path>,
    pub timeout: Duration,
    /// The profiles skills run under, by side-effect class.
    pub confinement: &'a ConfinementPolicy,
    /// The kavi process running the skills: their executions and process groups are its own.
    pub owner: &'a Owner,
    /// kavi's own files (the workspace's `state_paths`), hidden from every skill.
    pub kavi_state: &'a [std::path::PathBuf],
    /// Where a run's private folders and cgroups go to be removed after its record is
    /// answered (see [`Runner::deferring`]); `None` removes them before the run returns.
    pub deferred: Option<&'a Deferred>,
}

/// A finished run's folders and cgroups, removed when the holder drops them: an executor
/// answers its client first.
pub type Deferred = std::sync::Mutex<crate::process::Leftovers>;

/// The most a skill may print on stdout: its output is parsed whole, in memory.
const OUTPUT_LIMIT: usize = 16 * 1024 * 1024;

/// How much of a failed skill's stderr an error keeps.
const STDERR_CHARS: usize = 2000;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl<'a> Runner<'a> {
    /// Who this runner is to an executor it asks (see [`pool::Caller`]).
    pub fn caller(&self) -> pool::Caller {
        pool::Caller::new(self.root, self.timeout, self.log)
    }

    /// This runner on `ledger`, a connection its caller holds across runs, never asking an
    /// executor: a resident executor's own.
    pub fn holding(self, ledger: &'a std::sync::Mutex<Ledger>) -> Self {
        Self {
            held: Some(ledger),
            pool: false,
            ..self
        }
    }

    /// This runner leaving each run's folders and cgroups in `deferred`, for its caller to
    /// remove once it has answered (its process tree is gone before the record is written).
    pub fn deferring(self, deferred: &'a Deferred) -> Self {
        Self {
            deferred: Some(deferred),
            ..self
        }
    }

    /// Removes `leftovers` now, or leaves them in [`Runner::deferred`].
    fn leave(&self, leftovers: crate::process::Leftovers) {
        if let Some(deferred) = self.deferred {
            let mut held = deferred
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *held = std::mem::take(&mut *held).and(leftovers);
        }
    }

    /// The trust check. The error says which check failed and how to recover.
    pub fn ready(&self, name: &str) -> Result<Ready, Refusal> {
        self.ready_in(name, None)
    }

    /// [`Runner::ready`], the snapshot written into `folder` when given (a pre-started
    /// sandbox's, see [`Prestarted`]), else into a new one.
    fn ready_in(
        &self,
        name: &str,
        folder: Option<kavi_foundation::sandbox::PrivateFolder>,
    ) -> Result<Ready, Refusal> {
        // The run's confined launch follows this check: its cgroup move waits less. A sandbox
        // started ahead is in its cgroup already: nothing is moved for its run.
        if folder.is_none() {
            crate::confinement::bounds::move_soon();
        }
        // Running a skill never makes a ledger: with none, there is no skill to run.
        let connection = self.connect(true).map_err(|e| match e {
            LedgerError::Missing(_) => Refusal::Unknown(format!(
                "no skill `{name}`: nothing has been recorded in this workspace yet"
            )),
            e => Refusal::Unreadable(e.to_string()),
        })?;
        let ledger = connection.lock();
        let skill = ledger.skill(name).map_err(|e| match e {
            LedgerError::SkillNotFound(_) => Refusal::Unknown(e.to_string()),
            e => Refusal::Unreadable(e.to_string()),
        })?;
        // The row is editable by anyone who can open the file: what runs is what the journal's
        // keyed entry for it says.
        ledger
            .check_skill_journaled(name)
            .map_err(|e| Refusal::Trust(format!("refusing to run `{name}`: {e}")))?;
        let trusted = ledger
            .trusted_skills(TRUSTED)
            .map_err(|e| Refusal::Unreadable(e.to_string()))?
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| {
                Refusal::Trust(format!(
                    "skill `{name}` is not trusted (it is {}); only trusted skills run",
                    skill.state
                ))
            })?;
        // The bytes hashed are the bytes that run: they are read once, checked, and written
        // into the snapshot, which is hashed again.
        let tree = match trusted.newer_version {
            None => self
                .working_tree(&trusted)
                .or_else(|refused| self.shared_tree(&trusted).ok_or(refused))?,
            Some(newer) => self.kept_tree(&trusted, newer)?,
        };
        let snapshot = match folder {
            Some(folder) => Snapshot::make_in(folder, &tree, &trusted.trusted_hash),
            None => Snapshot::make(&tree, &trusted.trusted_hash, |dir| self.owner.track(dir)),
        }
        .map_err(|e| Refusal::Hash(format!("refusing to run `{name}`: {e}")))?;
        let proposal = Proposal::from_artifact(self.artifacts, &trusted.spec_artifact)
            .map_err(Refusal::Unreadable)?;
        // Trusted before kavi refused such commands: its hash never covered what it would load.
        if let Some(reason) =
            crate::skills::untrusted_program(proposal.command.get_ref(), snapshot.folder())
        {
            return Err(Refusal::Trust(format!(
                "refusing to run `{name}`: its command may run bytes trust cannot vouch for \
                 ({reason}); change `command` and promote it again"
            )));
        }
        Ok(Ready {
            name: name.to_owned(),
            proposal,
            hash: trusted.trusted_hash,
            version: trusted.version,
            snapshot: std::sync::Arc::new(snapshot),
        })
    }

    /// The files of a skill that runs from its folder, read once; they must hash to the trusted
    /// hash.
    fn working_tree(&self, trusted: &TrustedSkill) -> Result<SkillTree, Refusal> {
        let name = &trusted.name;
        let kept = trusted
            .trusted_tree
            .as_deref()
            .map(|manifest| (self.artifacts, manifest));
        self.trust
            .check_tree(
                self.templates,
                self.root,
                name,
                &trusted.proposal_path,
                &trusted.trusted_hash,
                kept,
            )
            .map_err(|drift| {
                Refusal::Hash(match drift {
                    Drift::Unreadable(e) => format!("refusing to run `{name}`: {e}"),
                    Drift::Hash(now) => format!(
                        "refusing to run `{name}`: its files changed since it was trusted \
                         (trusted {}, now {}); verify and promote it again (run the forge) to \
                         trust the new files",
                        crate::hash::short_hash(&trusted.trusted_hash),
                        crate::hash::short_hash(&now)
                    ),
                    Drift::Metadata(reason) => format!(
                        "refusing to run `{name}`: its files changed since it was trusted \
                         ({reason}); `kavi skill restore {name}` puts them back as trusted"
                    ),
                })
            })
    }

    /// With a server ledger, the trusted files every machine runs, from the shared store
    /// (fetched, and re-hashed on reading), when this checkout's folder differs: a machine that
    /// has not pulled the skill's files yet runs what the team trusted. `None` otherwise, and
    /// when those do not load (the refusal of the folder stands).
    fn shared_tree(&self, trusted: &TrustedSkill) -> Option<SkillTree> {
        crate::ledger::postgres_url(self.ledger)?;
        let tree = SkillTree::load(
            self.artifacts,
            trusted.trusted_tree.as_deref()?,
            &trusted.trusted_hash,
        )
        .ok()?;
        tracing::warn!(
            "`{}`'s folder in this checkout differs from its trusted files: running the trusted \
             files from the shared store",
            trusted.name
        );
        Some(tree)
    }

    /// The trusted version's kept tree, re-hashed on reading: the skill's own folder holds the
    /// newer version being forged.
    fn kept_tree(&self, trusted: &TrustedSkill, newer: i64) -> Result<SkillTree, Refusal> {
        let name = &trusted.name;
        let refused = |reason: String| {
            Refusal::Hash(format!(
                "refusing to run version {} of `{name}` (version {newer} is being forged in its \
                 folder): {reason}",
                trusted.version
            ))
        };
        let manifest = trusted.trusted_tree.as_deref().ok_or_else(|| {
            refused(
                "it was promoted before kavi kept trusted files; promote the new version".into(),
            )
        })?;
        SkillTree::load(self.artifacts, manifest, &trusted.trusted_hash).map_err(refused)
    }

    /// A skill as its folder holds it now, trusted or not, snapshotted as [`Runner::ready`] does:
    /// what a `contract` gate runs. Its files are read from `workspace`; it runs in `root`.
    pub fn candidate(
        &self,
        workspace: &Path,
        name: &str,
        proposal_path: &str,
    ) -> Result<Ready, String> {
        crate::confinement::bounds::move_soon();
        let tree = self
            .trust
            .read_tree(self.templates, workspace, name, proposal_path)?;
        let hash = tree.hash();
        let snapshot = Snapshot::make(&tree, &hash, |dir| self.owner.track(dir))?;
        let text = String::from_utf8(tree.proposal.clone())
            .map_err(|_| format!("the proposal {proposal_path} is not UTF-8"))?;
        let source = crate::diagnostic::SourceFile::new(proposal_path, text);
        let proposal = Proposal::parse(&source).map_err(|d| d.to_string())?;
        Ok(Ready {
            name: name.to_owned(),
            proposal,
            hash,
            // Not a version of the ledger's: nothing about this run is recorded as an execution.
            version: 0,
            snapshot: std::sync::Arc::new(snapshot),
        })
    }

    /// Runs `ready` with `input` exactly as [`Runner::run`] does, under its class's profile,
    /// without recording an execution: the skill's output (valid against its output schema), or
    /// why there is none, and what its confinement stopped it for, if anything.
    pub async fn try_example(
        &self,
        ready: &Ready,
        input: &Value,
        cancel: &CancellationToken,
    ) -> Result<(Result<Value, String>, Option<Violation>), ExecutionError> {
        let (outcome, _, violation) = self.invoke(ready, input, &[], cancel, None).await?;
        Ok((outcome, violation))
    }

    /// Records a run that never reached its skill (a refusal, a mapping or schema failure).
    pub fn record_failure(
        &self,
        skill: &str,
        side_effect: &str,
        input: Option<Value>,
        error: &str,
        lineage: &Lineage,
    ) -> Result<ExecutionRecord, ExecutionError> {
        let now = crate::ledger::now();
        let record = ExecutionRecord {
            execution_id: new_id(),
            parent_execution_id: lineage.parent.clone(),
            skill: skill.to_owned(),
            source_hash: None,
            skill_version: None,
            side_effect: side_effect.to_owned(),
            input,
            output: None,
            success: false,
            error: Some(error.to_owned()),
            started_at: now.clone(),
            finished_at: now,
            duration_ms: 0,
            chain: lineage.chain.clone(),
            step: lineage.step.clone(),
            run_id: lineage.run_id,
            confinement: None,
            caller: lineage.caller.clone(),
        };
        self.keep(record)
    }

    /// Runs a ready skill with `input` and records what happened: in a sandbox a running
    /// `kavi executor` started ahead when it serves the skill (see [`Runner::ask_pool`]), else
    /// here.
    pub async fn run(
        &self,
        ready: &Ready,
        input: Value,
        lineage: &Lineage,
        cancel: &CancellationToken,
    ) -> Result<ExecutionRecord, ExecutionError> {
        if ready.prestartable()
            && let Some(record) = self
                .ask_pool(&ready.name, &input, lineage, Some(&ready.hash), cancel)
                .await
        {
            return Ok(record);
        }
        self.run_in(ready, input, lineage, cancel, None).await
    }

    /// Asks the workspace's running `kavi executor`, if this runner may ([`Runner::pool`]), to
    /// run `name` with `input`: the record it made, or `None` when none answers or it did not
    /// run the skill, and the caller runs it itself. With `hash`, only that trusted version
    /// runs there. The executor does the trust check and records the run as [`Runner::run`]
    /// does.
    async fn ask_pool(
        &self,
        name: &str,
        input: &Value,
        lineage: &Lineage,
        hash: Option<&str>,
        cancel: &CancellationToken,
    ) -> Option<ExecutionRecord> {
        if !self.pool {
            return None;
        }
        let request = pool::Request {
            caller: self.caller(),
            skill: name.to_owned(),
            input: input.clone(),
            lineage: lineage.clone(),
            hash: hash.map(str::to_owned),
        };
        match pool::ask(self.ledger, &request, cancel).await {
            // This caller said which rules govern when it read them for its trust check.
            pool::Answer::Ran(ran) => Some(ran.record),
            pool::Answer::Unvouched(reason) => {
                tracing::warn!("{reason}; running the skill here");
                None
            }
            pool::Answer::Unserved => None,
        }
    }

    /// Starts a sandbox for a READ_ONLY skill not yet known: its confinement made exactly as
    /// [`Runner::run`] makes a READ_ONLY skill's, around the profile's Python running
    /// [`LOADER`], which waits for the script to run. Its snapshot folder is empty until
    /// [`Runner::run_prestarted`] writes the skill's trusted bytes into it. `shutdown` ends it
    /// unused.
    pub fn prestart(&self, shutdown: &CancellationToken) -> Result<Prestarted, String> {
        crate::confinement::bounds::move_soon();
        let tmp = self.private_tmp().map_err(|e| e.to_string())?;
        let snapshot = Snapshot::new_folder(|dir| self.owner.track(dir))?;
        let confinement = self.confine(
            crate::skills::SideEffects::from(crate::skills::SideEffect::ReadOnly),
            tmp.path(),
            snapshot.path(),
            &[],
        )?;
        if !confinement.isolated() {
            return Err("this machine cannot isolate a skill: nothing is started ahead".into());
        }
        let spec = crate::process::CommandSpec {
            program: PRESTARTED_PYTHON.to_owned(),
            args: PYTHON_ISOLATED
                .iter()
                .chain(&["-c", LOADER])
                .map(|arg| (*arg).to_owned())
                .collect(),
            env: self.skill_env(tmp.path(), &[]),
            cwd: self.root.to_owned(),
            stdin: None,
            confinement: Some(confinement.clone()),
        };
        let (feed, input) = tokio::sync::oneshot::channel();
        let options = self.owner.capture(OUTPUT_LIMIT);
        let stop = shutdown.child_token();
        let (taken, view) = tokio::sync::watch::channel(None);
        let finished = tokio::spawn({
            let (stop, confinement) = (stop.clone(), confinement.clone());
            async move {
                // Before the view is built: a change made between the two moves the stamp a
                // claim takes, so the sandbox is declined rather than served stale.
                match confinement.workspace_stamp().await {
                    Ok(stamp) => {
                        taken.send_replace(Some(stamp));
                    }
                    // Closed unset, so no claim can match it: the sandbox serves nothing.
                    Err(error) => tracing::warn!(
                        "a sandbox started ahead cannot tell what it shows of the workspace \
                         ({error}); runs will not use it"
                    ),
                }
                drop(taken);
                crate::process::run_fed(&spec, input, &options, &stop).await
            }
        });
        Ok(Prestarted {
            confinement,
            snapshot: Some(snapshot),
            tmp,
            view,
            feed,
            stop,
            finished,
        })
    }

    /// Runs `name` with `input` in `sandbox` from [`Runner::prestart`], as [`Runner::ready`]
    /// then [`Runner::run`] would: the trust check writes the snapshot into the sandbox's
    /// folder at this moment, and the run is recorded the same, its confinement marked
    /// `pre-started`. [`Claim::Declined`], the sandbox discarded, when it cannot serve this
    /// run: the skill is refused, is not a READ_ONLY Python script without secrets or writes,
    /// or its trusted hash is not `hash` (the one its caller checked, when given);
    /// [`Claim::OtherView`] when the view a fresh sandbox would have (the policies, what
    /// `hide_matching` finds now, the files git lists and their inodes) differs from the one it
    /// was started with. The caller then
    /// runs it the usual way, which says why when it is refused.
    pub async fn run_prestarted(
        &self,
        request: &pool::Request,
        cancel: &CancellationToken,
        mut sandbox: Prestarted,
    ) -> Result<Claim, ExecutionError> {
        let Ok(ready) = self.ready_in(&request.skill, sandbox.snapshot.take()) else {
            return Ok(Claim::Declined);
        };
        if !ready.prestartable()
            || request
                .hash
                .as_ref()
                .is_some_and(|hash| *hash != ready.hash)
        {
            return Ok(Claim::Declined);
        }
        let fresh = self.confine(
            ready.proposal.side_effect,
            sandbox.tmp.path(),
            ready.snapshot.path(),
            &[],
        );
        let Ok(fresh) = fresh else {
            return Ok(Claim::OtherView);
        };
        if fresh.record() != sandbox.confinement.record() {
            return Ok(Claim::OtherView);
        }
        // The workspace's view was built when the sandbox started: a file git no longer lists,
        // one removed or one saved anew since would still be there, as it was.
        let Ok(now) = fresh.workspace_stamp().await else {
            return Ok(Claim::OtherView);
        };
        // A claim that comes before the stamp is taken (a busy machine) waits for it: the
        // sandbox is not of another view for being slow.
        let started_with = sandbox
            .view
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|stamp| stamp.clone());
        if started_with != Some(now) {
            return Ok(Claim::OtherView);
        }
        let ran = self
            .run_in(
                &ready,
                request.input.clone(),
                &request.lineage,
                cancel,
                Some(sandbox),
            )
            .await;
        self.leave(crate::process::Leftovers::default().and(ready));
        ran.map(|record| Claim::Ran(Box::new(record)))
    }

    async fn run_in(
        &self,
        ready: &Ready,
        input: Value,
        lineage: &Lineage,
        cancel: &CancellationToken,
        sandbox: Option<Prestarted>,
    ) -> Result<ExecutionRecord, ExecutionError> {
        let started_at = crate::ledger::now();
        let clock = Instant::now();
        let proposal = &ready.proposal;
        let started = ExecutionRecord {
            execution_id: new_id(),
            parent_execution_id: lineage.parent.clone(),
            skill: ready.name.clone(),
            source_hash: Some(ready.hash.clone()),
            skill_version: Some(ready.version),
            side_effect: proposal.side_effect.to_string(),
            input: Some(input.clone()),
            output: None,
            success: false,
            error: None,
            started_at: started_at.clone(),
            finished_at: started_at,
            duration_ms: 0,
            chain: lineage.chain.clone(),
            step: lineage.step.clone(),
            run_id: lineage.run_id,
            confinement: None,
            caller: lineage.caller.clone(),
        };
        let ledger = self.connect(false)?;
        {
            let ledger = ledger.lock();
            // The confinement policy governs the run: its text is kept for the record to name.
            ledger.keep_spec(&self.confinement.source)?;
            ledger.start_execution(&started, self.owner.name())?;
        }
        let secrets: Result<Vec<(String, String)>, String> = proposal
            .secrets
            .iter()
            .map(|name| {
                let name = name.get_ref();
                crate::redact::secret_from_env(name).map(|v| (name.clone(), v))
            })
            .collect();
        // A path the input names (or a file in a folder it names) that links out of the
        // workspace is refused before the skill runs, and one its output names after: what
        // such a link reaches is the machine's, not the workspace's, whatever the view shows.
        let links_out = crate::sandbox::link_out_named(self.root, &input, true);
        let (outcome, confinement, secrets) = match (
            crate::json_schema::validate(&proposal.input_schema, &input, "input"),
            secrets,
            links_out,
        ) {
            (Err(e), _, _) | (Ok(()), Err(e), _) => (Err(e), None, Vec::new()),
            (Ok(()), Ok(_), Some(refused)) => {
                (Err(format!("refused: {refused}")), None, Vec::new())
            }
            (Ok(()), Ok(secrets), None) => {
                let (outcome, confinement, _) = self
                    .invoke(ready, &input, &secrets, cancel, sandbox)
                    .await?;
                let outcome = outcome.and_then(|output| {
                    match crate::sandbox::link_out_named(self.root, &output, false) {
                        Some(refused) => Err(format!(
                            "refused: {refused}; its output, which names it, is withheld"
                        )),
                        None => Ok(output),
                    }
                });
                (outcome, confinement, secrets)
            }
        };
        let secret_values: Vec<String> = secrets.into_iter().map(|(_, v)| v).collect();
        let (mut output, mut error) = match outcome {
            Ok(output) => (Some(output), None),
            Err(error) => (None, Some(error)),
        };
        if let Some(redactor) = Redactor::new(&secret_values) {
            output.iter_mut().for_each(|output| redactor.json(output));
            error = error.map(|error| redactor.text(&error));
        }
        let record = ExecutionRecord {
            success: error.is_none(),
            output,
            error,
            finished_at: crate::ledger::now(),
            duration_ms: millis(clock.elapsed()),
            confinement,
            ..started
        };
        self.keep_in(&ledger.lock(), record)
    }

    /// Runs the command under its class's confinement; `Ok((Err(..), _, _))` is the skill failing
    /// (or refused for want of confinement), `Err` is kavi failing to start it. The second value
    /// is the confinement it ran under, for the record; the third, what that confinement stopped
    /// it for. In `sandbox`, when given, the command runs in that pre-started sandbox.
    async fn invoke(
        &self,
        ready: &Ready,
        input: &Value,
        secrets: &[(String, String)],
        cancel: &CancellationToken,
        sandbox: Option<Prestarted>,
    ) -> Result<(Result<Value, String>, Option<Value>, Option<Violation>), ExecutionError> {
        let class = ready.proposal.side_effect;
        let spawn_error = |source| ExecutionError::Spawn {
            skill: ready.name.clone(),
            source,
        };
        let own_tmp;
        let tmp = match &sandbox {
            Some(sandbox) => sandbox.tmp.path(),
            None => {
                own_tmp = self.private_tmp().map_err(spawn_error)?;
                own_tmp.path()
            }
        };
        // A declared path that does not exist yet is made as a folder, so that the profile can
        // grant it; one that resolves outside the workspace is refused.
        for write in ready.proposal.write_paths() {
            // Checked again here: the workspace may have changed (a link made) since proposal.
            if let Some(refused) = crate::skills::write_scope_refusal(Some(self.root), &write) {
                return Ok((Err(refused.to_string()), None, None));
            }
            let made = crate::sandbox::contained_path(self.root, &write).and_then(|path| {
                if path.symlink_metadata().is_ok() {
                    return Ok(());
                }
                std::fs::create_dir_all(&path).map_err(|e| e.to_string())
            });
            if let Err(reason) = made {
                return Ok((
                    Err(format!("cannot grant `{write}` from `writes`: {reason}")),
                    None,
                    None,
                ));
            }
        }
        // The snapshot is hashed once more right before the run: a confirmation prompt or a
        // chain's earlier steps may lie between making it and running it.
        if let Err(drift) = ready.snapshot.check() {
            return Ok((
                Err(format!("refusing to run `{}`: {drift}", ready.name)),
                None,
                None,
            ));
        }
        let mut argv = ready.command();
        let timeout = self.timeout;
        // Stopped at the timeout, or when the caller cancels.
        let timer = |stop: CancellationToken| {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(timeout) => {}
                    () = cancel.cancelled() => {}
                }
                stop.cancel();
            })
        };
        let (finished, recorded, prestarted) = match sandbox {
            None => {
                let confinement = match self.confine(
                    class,
                    tmp,
                    ready.snapshot.path(),
                    &ready.proposal.write_paths(),
                ) {
                    Ok(confinement) => confinement,
                    Err(refusal) => return Ok((Err(refusal), None, None)),
                };
                let recorded = confinement.clone();
                let spec = crate::process::CommandSpec {
                    program: argv.remove(0),
                    args: argv,
                    env: self.skill_env(tmp, secrets),
                    cwd: self.root.to_owned(),
                    stdin: Some(input.to_string().into_bytes()),
                    confinement: Some(confinement),
                };
                let options = self.owner.capture(OUTPUT_LIMIT);
                let stop = cancel.child_token();
                let timer = timer(stop.clone());
                let finished = crate::process::run(&spec, &options, &stop).await;
                timer.abort();
                (finished, recorded, false)
            }
            Some(sandbox) => {
                // The loader's line: the script and its arguments, as `sys.argv`; the input
                // follows on the same stdin.
                let script = argv.split_off(1 + PYTHON_ISOLATED.len());
                let mut fed = serde_json::to_vec(&script).unwrap_or_default();
                fed.push(b'\n');
                fed.extend(input.to_string().into_bytes());
                let timer = timer(sandbox.stop.clone());
                // A sandbox that ended before its go (killed, or stopped at a bound) reports
                // that when it is awaited.
                let _ = sandbox.feed.send(fed);
                let finished = match sandbox.finished.await {
                    Ok(finished) => finished,
                    Err(joined) => Err(std::io::Error::other(joined)),
                };
                timer.abort();
                self.leave(crate::process::Leftovers::default().and(sandbox.tmp));
                (finished, sandbox.confinement, true)
            }
        };
        let finished = finished.map_err(spawn_error)?;
        // With the connections its proxy allowed and refused, for a skill with the network; and
        // what stopped it, by the failure kind a build or a gate would have had.
        let mut record = recorded.record_run(finished.network.as_ref());
        if prestarted {
            record["launch"] = serde_json::json!(PRESTARTED);
        }
        if let Some(violation) = &finished.violation {
            record["violation"] = serde_json::json!({
                "kind": violation.failure_kind(),
                "detail": violation.to_string(),
            });
        }
        let stderr = String::from_utf8_lossy(&finished.stderr.head);
        let stderr: String = stderr.trim_end().chars().take(STDERR_CHARS).collect();
        let with_stderr = |what: String| {
            if stderr.is_empty() {
                what
            } else {
                format!("{what}: {stderr}")
            }
        };
        // A denial shows in the skill's stderr; the error names the profile that denied it.
        let profile = format!("under the {class} profile");
        let outcome = match finished.exit {
            _ if let Some(violation) = &finished.violation => {
                Err(with_stderr(format!("{violation} {profile}")))
            }
            crate::process::Exit::Code(0) if finished.stdout.truncated() => Err(format!(
                "the output is larger than the {} MiB a skill may print",
                OUTPUT_LIMIT >> 20
            )),
            crate::process::Exit::Code(0) => {
                match serde_json::from_slice::<Value>(&finished.stdout.head) {
                    Err(e) => Err(format!("the output is not JSON: {e}")),
                    Ok(output) => crate::json_schema::validate(
                        &ready.proposal.output_schema,
                        &output,
                        "output",
                    )
                    .map(|()| output),
                }
            }
            crate::process::Exit::Cancelled if cancel.is_cancelled() => Err("cancelled".to_owned()),
            crate::process::Exit::Cancelled => Err(format!(
                "timed out after {}",
                humantime::format_duration(self.timeout)
            )),
            crate::process::Exit::Code(code) => {
                Err(with_stderr(format!("exited with code {code} {profile}")))
            }
            other => Err(with_stderr(format!("ended with {other:?} {profile}"))),
        };
        self.leave(finished.leftovers);
        Ok((outcome, Some(record), finished.violation))
    }

    /// A skill's private temporary folder (its TMPDIR, writable in its view).
    fn private_tmp(&self) -> std::io::Result<kavi_foundation::sandbox::PrivateFolder> {
        kavi_foundation::sandbox::private_folder(&std::env::temp_dir(), "kavi-tmp-skill-")
            .and_then(|tmp| self.owner.track(tmp.path()).map(|()| tmp))
    }

    /// The confinement of a skill of `class` with its temporary folder `tmp`, its snapshot at
    /// `snapshot` and the write scopes `writes`.
    fn confine(
        &self,
        class: crate::skills::SideEffects,
        tmp: &Path,
        snapshot: &Path,
        writes: &[String],
    ) -> Result<crate::confinement::Confinement, String> {
        let values = minijinja::context! {
            workspace => self.root,
            tmp => tmp,
            snapshot => snapshot,
        };
        self.confinement
            .for_skill(class)
            .confine(self.templates, &values, writes, self.kavi_state)
    }

    /// A skill's environment, built from nothing: the base, its TMPDIR, and its secrets.
    fn skill_env(&self, tmp: &Path, secrets: &[(String, String)]) -> Vec<(String, String)> {
        let mut env = crate::process::base_env();
        env.push(("TMPDIR".to_owned(), tmp.display().to_string()));
        env.extend(secrets.iter().cloned());
        env
    }

    fn keep(&self, record: ExecutionRecord) -> Result<ExecutionRecord, ExecutionError> {
        self.keep_in(&self.connect(false)?.lock(), record)
    }

    /// The ledger for one call: the connection held across runs, else one opened for it
    /// (`existing`: only if the ledger exists).
    fn connect(&self, existing: bool) -> Result<Connection<'_>, LedgerError> {
        Ok(match self.held {
            Some(held) => Connection::Held(held),
            None if existing => Connection::Opened(Ledger::open_existing(self.ledger)?),
            None => Connection::Opened(Ledger::open(self.ledger)?),
        })
    }

    /// [`Runner::keep`] on a ledger already open: the one the run's start was recorded on.
    fn keep_in(
        &self,
        ledger: &Ledger,
        record: ExecutionRecord,
    ) -> Result<ExecutionRecord, ExecutionError> {
        ledger.record_execution(&record)?;
        if let Some(path) = self.log {
            log::append(path, &record).map_err(|source| ExecutionError::Log {
                path: path.display().to_string(),
                source,
            })?;
        }
        Ok(record)
    }
}

/// A ledger connection for one call ([`Runner::connect`]).
enum Connection<'a> {
    Held(&'a std::sync::Mutex<Ledger>),
    Opened(Ledger),
}

/// The ledger a [`Connection`] reaches, for one step: never held across an await, so that a
/// run stays `Send` with a held connection too.
enum Locked<'a> {
    Held(std::sync::MutexGuard<'a, Ledger>),
    Opened(&'a Ledger),
}

impl Connection<'_> {
    fn lock(&self) -> Locked<'_> {
        match self {
            Self::Held(held) => Locked::Held(lock(held)),
            Self::Opened(ledger) => Locked::Opened(ledger),
        }
    }
}

impl std::ops::Deref for Locked<'_> {
    type Target = Ledger;
    fn deref(&self) -> &Ledger {
        match self {
            Self::Held(guard) => guard,
            Self::Opened(ledger) => ledger,
        }
    }
}

/// A ledger connection held across runs ([`Runner::held`]), for one step. A panic while it was
/// locked left no half-written row: SQLite rolled it back.
pub fn lock(held: &std::sync::Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    held.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A new execution id: a random UUID, so a short prefix of it names it (as with git hashes).
fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_interpreters_run_isolated_and_other_programs_are_left_alone() {
        let isolated = |argv: &[&str]| {
            let mut argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
            isolate_python(&mut argv);
            argv
        };
        for (argv, want) in [
            (
                &["python3", "s.py"][..],
                &["python3", "-I", "-B", "s.py"][..],
            ),
            (
                &["/usr/bin/python3.11", "s.py"],
                &["/usr/bin/python3.11", "-I", "-B", "s.py"],
            ),
            (&["python", "-m", "m"], &["python", "-I", "-B", "-m", "m"]),
            (&["sh", "run.sh"], &["sh", "run.sh"]),
            (&["python3-config"], &["python3-config"]),
            (&["env"], &["env"]),
        ] {
            assert_eq!(isolated(argv), want, "{argv:?}");
        }
    }
}
