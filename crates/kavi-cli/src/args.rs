//! The command line's arguments: every command, subcommand and flag, as clap parses them.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::complete::Names;
use crate::dag::GraphFormat;

#[derive(Debug, Parser)]
#[command(
    name = "kavi",
    version,
    about = "A declarative pipeline runner for governed, agent-built code"
)]
pub struct Cli {
    /// The workspace root (default: the nearest folder upwards holding kavi.toml, else the current one).
    #[arg(long, global = true, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// The ledger file (overrides kavi.toml and KAVI_LEDGER).
    #[arg(long, global = true, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// Log format on stderr; the level comes from RUST_LOG (default: warn).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// More log lines on stderr: -v info, -vv debug, -vvv trace (RUST_LOG, when set, wins).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// No progress lines of a run, and only errors in the log on stderr (RUST_LOG, when set,
    /// wins for the log).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Colour in help, usage errors and the log: `auto` (on a terminal, unless NO_COLOR is set),
    /// `always` or `never`.
    #[arg(long, global = true, value_enum, default_value_t = clap::ColorChoice::Auto, value_name = "WHEN")]
    pub color: clap::ColorChoice,
    #[command(subcommand)]
    pub command: TopCommand,
}

// Every command: those that work in a workspace, and those that describe kavi itself.
//
// Here and in every subcommand enum, `defer` has clap make a command's arguments only when
// that command is the one given: making them all was 0.43 to 0.49 ms of every kavi's start
// (uprobes on `Cli::augment_args`, five runs). What lists every command (the man page, the
// completions) builds them first. Comments on these enums and on flattened `Args` are not doc
// comments: clap would apply them, late, over the about of the command they belong to.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum TopCommand {
    #[command(flatten)]
    InWorkspace(Command),
    /// Print the script that registers kavi's completion with a shell, such as `kavi completions
    /// bash > ~/.local/share/bash-completion/completions/kavi`: commands and flags, and the
    /// workspace's pipelines, nodes, skills and runs (it asks the `kavi` on PATH).
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print kavi's man page (roff), such as `kavi man > ~/.local/share/man/man1/kavi.1`.
    Man {
        /// Write a page per command instead (kavi.1, kavi-pipeline.1, kavi-pipeline-run.1, ...)
        /// into this folder, such as ~/.local/share/man/man1, so every page the first one names
        /// is there.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Write a working workspace (kavi.toml, the shipped pipelines, policies, chains, templates,
    /// example proposals and the offline scripted builder) into DIR, and say what it wrote.
    Init {
        /// The folder to make a workspace of (made if missing); the current one by default.
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Run, check, plan or draw a pipeline.
    #[command(subcommand)]
    Pipeline(PipelineCommand),
    /// Inspect recorded runs.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Inspect stored spec texts.
    #[command(subcommand)]
    Spec(SpecCommand),
    /// Read stored artifacts.
    #[command(subcommand)]
    Artifact(ArtifactCommand),
    /// Check the ledger's integrity: its journal, every row, every stored spec and artifact.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Review governance: what changed in the files that govern runs.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Propose and inspect skills.
    #[command(subcommand)]
    Skill(SkillCommand),
    /// Inspect build attempts.
    #[command(subcommand)]
    Builds(BuildsCommand),
    /// Provision or inspect the toolchains gates run (`policies/toolchains.toml`).
    #[command(subcommand)]
    Toolchain(ToolchainCommand),
    /// Try the attacks a hostile builder, gate or skill would, under this workspace's
    /// confinement policy, and say what refused each (exit 1 if any was allowed or could not
    /// run).
    #[command(subcommand)]
    Drill(DrillCommand),
    /// Check that this workspace is ready: ledger, artifact store, every pipeline and chain, the
    /// builder, python3, trusted skills' hashes, the gateway (exit 1 if a check failed).
    Doctor {
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Remove old runs that no skill's record needs, the artifacts only they used, sandboxes whose
    /// keeping time is up and leftover temporary files; the journal records every deletion, so
    /// `kavi ledger verify` still holds.
    Gc {
        /// Runs that finished longer ago than this may go, such as `30d` or `12h`.
        #[arg(long, default_value = "30d")]
        older_than: String,
        /// The latest runs started by a person (with their child runs) that always stay.
        #[arg(long, default_value_t = 20)]
        keep: u32,
        /// Say what would be removed, and remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Run or check a chain of trusted skills (`chains/*.toml`).
    #[command(subcommand)]
    Chain(ChainCommand),
    /// Read the log of skill executions.
    #[command(subcommand)]
    Executions(ExecutionsCommand),
    /// Ask for a trusted skill or chain in words (policies/chat.toml): one message with -m, or
    /// a session read line by line from stdin (see docs/chat.md).
    Chat {
        /// One message; without it, a session: one message per line, `yes`/`no` to a plan that
        /// waits for confirmation, `exit` to end.
        #[arg(long, short)]
        message: Option<String>,
        /// Run a plan with a side effect the chat allows without asking (with -m).
        #[arg(long, requires = "message")]
        confirmed: bool,
        /// Print each answer as JSON (one line per answer in a session).
        #[arg(long)]
        json: bool,
    },
    /// Serve the review page on http://127.0.0.1:8321: the review queue with each stopped run's
    /// evidence and approve and reject forms, and the runs (see docs/review.md).
    Serve {
        /// The address to listen on; a port of 0 takes a free one (printed).
        #[arg(long, default_value = "127.0.0.1:8321")]
        bind: std::net::SocketAddr,
        /// The port to listen on, on the --bind address.
        #[arg(long)]
        port: Option<u16>,
        /// Listen on an address other than loopback: whoever reaches it decides as the account
        /// running kavi.
        #[arg(long)]
        allow_remote: bool,
    },
    /// Serve the trusted skills to an agent as MCP tools, on stdio (see docs/mcp.md).
    Mcp {
        /// The name the client is granted side effects under in policies/mcp.toml; without it,
        /// only READ_ONLY skills run. Give it in the agent's configuration, where kavi is
        /// started.
        #[arg(long)]
        client: Option<String>,
    },
    /// Keep sandboxes for READ_ONLY skills started ahead, so that `kavi skill run` pays only
    /// for the run; in the foreground, until Ctrl-C, SIGTERM or --idle-timeout (see
    /// docs/skills.md).
    Executor {
        /// End after this long without a request (`90s`, `10m`, `1h`).
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        idle_timeout: std::time::Duration,
    },
    /// Say why a node of a recorded run ran, was skipped, blocked, cancelled, reused or cached,
    /// what the nodes it needs did, and which of its inputs, parameters or policies changed.
    Explain {
        /// A run id, or `latest`.
        #[arg(add = crate::complete::names(Names::Run))]
        run: String,
        /// The node's id.
        #[arg(add = crate::complete::names(Names::RunNode))]
        node: String,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Run a recorded execution again with the same input, if its skill is still trusted at the
    /// same hash; the new record's parent is the original.
    Replay {
        /// An execution id, a unique prefix of one, or `latest`.
        execution_id: String,
        /// Record in the ledger only, not in the JSONL log.
        #[arg(long)]
        no_log: bool,
        /// Confirm a side effect (FILE_WRITE, NETWORK, SECRET_READ) without a prompt.
        #[arg(long)]
        yes: bool,
    },
    /// Show the tree of executions one belongs to: its root and every descendant.
    Session {
        /// An execution id, or a unique prefix of one.
        #[arg(long, required_unless_present = "latest", conflicts_with = "latest")]
        execution_id: Option<String>,
        /// The tree of the newest execution.
        #[arg(long)]
        latest: bool,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Classify a build's failed attempt by hand and write a research note on it.
    Research {
        /// The build id (`kavi builds list SKILL` lists them).
        build: i64,
        /// Also ask the LLM gateway (`[gateway]` in kavi.toml) for a revised packet.
        #[arg(long)]
        advise: bool,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Approve a run that stopped for review: make the lifecycle moves it waited for, and resume
    /// it if it stopped for anything else (its pipeline runs again with the same parameters, and
    /// the forge goes on with the next attempt).
    Approve {
        /// A run id (the run or one of its child runs), or `latest`.
        #[arg(add = crate::complete::names(Names::Run))]
        run: String,
        /// Why, recorded with the decision.
        #[arg(long)]
        comment: Option<String>,
        /// Only record the decision; start nothing.
        #[arg(long)]
        no_resume: bool,
    },
    /// Reject a run that stopped for review: what it copied back is undone (or the trusted files
    /// put back), the skill moves to the lifecycle's rejected state and is not built again.
    Reject {
        /// A run id (the run or one of its child runs), or `latest`.
        #[arg(add = crate::complete::names(Names::Run))]
        run: String,
        /// Why, recorded with the decision.
        #[arg(long)]
        comment: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ChainCommand {
    /// List the workspace's chains (chains/*.toml), each checked: name, steps, description.
    List {
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Run a chain's steps in order; each leaves an execution record (exit 1 if any failed).
    Run {
        /// A chain file, or a name looked up in chains/.
        #[arg(add = crate::complete::names(Names::Chain))]
        file: String,
        /// Set a chain parameter.
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::spec::parse_set)]
        sets: Vec<(String, String)>,
        /// Confirm the side effects (FILE_WRITE, NETWORK, SECRET_READ) of every step.
        #[arg(long)]
        yes: bool,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Validate a chain: fields, step references, templates and JSONPath mappings.
    Check {
        /// A chain file, or a name looked up in the workspace's chains/ folder.
        #[arg(add = crate::complete::names(Names::Chain))]
        file: String,
        /// Print JSON instead of text: the verdict, and each problem with its file, line,
        /// column and help.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ExecutionsCommand {
    /// The newest execution records of the JSONL log (malformed lines are skipped and counted).
    Tail {
        /// How many records.
        #[arg(short = 'n', default_value_t = 10)]
        count: usize,
        /// Only the executions that did not succeed.
        #[arg(long)]
        only_failures: bool,
        /// Only the executions of this skill.
        #[arg(add = crate::complete::names(Names::Skill), long)]
        skill: Option<String>,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum DrillCommand {
    /// Every attack of the isolation drill: secrets, the ledger, the network, the terminal,
    /// daemons, signals, bounds, privileges and the kernel's interfaces, each run as the role
    /// it threatens, through the confinement the real role runs under.
    Isolation {
        /// Only the attacks run as this role.
        #[arg(long, value_parser = ["builder", "gate", "skill"])]
        role: Option<String>,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Every neutralisation attempt of the gates drill: a broken skill that hides it with a
    /// suppression, a test that ends early or patches the framework, or a tool configuration
    /// file, each run through the workspace's own gate set and reported caught or missed.
    Gates {
        /// Only the cases whose name contains this.
        #[arg(long)]
        case: Option<String>,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ToolchainCommand {
    /// Provision the declared toolchains now (or one), as the first run needing them would;
    /// an environment already made for the same declaration is reused.
    Install {
        /// The toolchain to provision; all of them when omitted.
        name: Option<String>,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Resolve every declared toolchain's pins with pip and write policies/toolchains.lock:
    /// each package it installs, with the sha256 of its wheel. Provisioning installs only that.
    Lock,
    /// List the declared toolchains: pins, and whether and where each is provisioned.
    List {
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Print the folder of a provisioned toolchain's environment (its tools are in `bin/`).
    Path {
        /// The toolchain, as declared.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum BuildsCommand {
    /// A skill's build attempts, first first, with their lineage and failure kinds.
    List {
        /// The skill whose builds to list.
        #[arg(add = crate::complete::names(Names::Skill))]
        skill: String,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum SkillCommand {
    /// Record a skill proposal (a TOML file) in its initial lifecycle state.
    Propose {
        /// The proposal file, inside the workspace, named after the skill.
        file: String,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// List trusted skills: description, side-effect class, secrets, input and output schemas.
    List {
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Show a skill's state and every transition it went through.
    Show {
        /// The skill's name.
        #[arg(add = crate::complete::names(Names::Skill))]
        name: String,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Run a trusted skill with JSON input and print its execution record: re-hashed first and
    /// refused on drift; input and output checked against its schemas.
    Run {
        /// The skill's name.
        #[arg(add = crate::complete::names(Names::Skill))]
        name: String,
        /// The input, as JSON.
        #[arg(long)]
        input: String,
        /// Confirm a side effect (FILE_WRITE, NETWORK, SECRET_READ) without a prompt.
        #[arg(long)]
        yes: bool,
    },
    /// Put a skill's trusted files back, byte for byte as promoted, and (if it was suspended for
    /// drift) return it to TRUSTED.
    Restore {
        /// The skill's name.
        #[arg(add = crate::complete::names(Names::Skill))]
        name: String,
        /// Why, recorded with the transition.
        #[arg(long)]
        comment: Option<String>,
    },
    /// Revoke a skill: it moves to the lifecycle's `revoked` state and never runs again.
    Revoke {
        /// The skill's name.
        #[arg(add = crate::complete::names(Names::Skill))]
        name: String,
        /// Why, recorded with the transition.
        #[arg(long)]
        comment: String,
    },
    /// Re-hash trusted skills; one that changed since promotion is suspended (the lifecycle's
    /// `drifted` state) and does not run (exit 1 on drift).
    Verify {
        /// One skill; without it, every trusted skill.
        #[arg(add = crate::complete::names(Names::Skill))]
        name: Option<String>,
        /// Every trusted skill (the default when no name is given).
        #[arg(long, conflicts_with = "name")]
        all: bool,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Print the attestation of a skill's promotion: an in-toto statement with SLSA provenance,
    /// in a DSSE envelope signed with kavi's signing key (docs/provenance.md).
    Attest {
        /// The skill's name.
        #[arg(add = crate::complete::names(Names::Skill))]
        name: String,
        /// The promoted version; by default the latest promotion.
        #[arg(long)]
        version: Option<i64>,
        /// Write it to this file instead of standard output.
        #[arg(long, short)]
        output: Option<std::path::PathBuf>,
    },
    /// Write a bundle of a trusted skill for another workspace: its files, the attestation of
    /// its promotion, and the public key that signed it (docs/provenance.md).
    Export {
        /// The skill's name.
        #[arg(add = crate::complete::names(Names::Skill))]
        name: String,
        /// Write it to this file instead of standard output.
        #[arg(long, short)]
        output: Option<std::path::PathBuf>,
    },
    /// Take in a skill bundle: refused unless a key `policies/trust.toml` `[import]` lists signed
    /// it and its files are the attested ones; then this workspace's gates verify it and the
    /// `import` pipeline promotes it, if `[promotion]` lets that pipeline promote.
    Import {
        /// The bundle, as `kavi skill export` writes it.
        bundle: std::path::PathBuf,
        #[command(flatten)]
        options: RunOptions,
    },
    /// Check an attestation: its signature under a public key, that it is an in-toto statement
    /// with SLSA provenance, and (with `--files`) that the files it names still have its digests
    /// (exit 1 when a check fails). Needs no workspace.
    VerifyAttestation {
        /// The attestation (a DSSE envelope, as `kavi skill attest` writes it).
        file: std::path::PathBuf,
        /// The signer's public key: 64 hex digits (as `kavi ledger keygen` prints it), or a file
        /// holding them.
        #[arg(long)]
        key: String,
        /// The folder the attested files' paths are relative to (a workspace).
        #[arg(long)]
        files: Option<std::path::PathBuf>,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct PipelineArgs {
    /// A pipeline file, or a name looked up in the workspace's pipelines/ folder.
    #[arg(add = crate::complete::names(Names::Pipeline))]
    pub file: String,
    /// Set a parameter (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::spec::parse_set)]
    pub sets: Vec<(String, String)>,
}

// How a run shows itself while it runs, and whether it takes cached results: the options
// `pipeline run` and `runs resume` share. Not a doc comment: clap would make it the about of
// the commands it is flattened into, over their own (their arguments are made late, see
// `TopCommand`).
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct RunOptions {
    /// Print the recorded run as JSON instead of progress lines.
    #[arg(long)]
    pub json: bool,
    /// Print what the nodes' processes write as they write it, each line after its node's id
    /// (secrets hidden).
    #[arg(long, conflicts_with = "json")]
    pub stream: bool,
    /// Run every node, even one whose inputs are unchanged since a run that succeeded at it
    /// (its key is still recorded).
    #[arg(long)]
    pub no_cache: bool,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum PipelineCommand {
    /// List the workspace's pipelines (pipelines/*.toml), each checked: name, nodes, description.
    List {
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Run a pipeline and record it in the ledger.
    Run {
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// Run only these nodes and what they need, as make runs targets.
        #[arg(add = crate::complete::names(Names::PipelineNode), value_name = "NODE")]
        targets: Vec<String>,
        /// Run the NODEs alone: what they need is taken from the cache, and must be up to date.
        #[arg(long, requires = "targets")]
        only: bool,
        /// How many nodes may run at once (default: from config, else the number of CPUs).
        #[arg(long, short, value_parser = clap::value_parser!(u32).range(1..))]
        jobs: Option<u32>,
        /// Run this node even when it is up to date (repeatable). What needs it is cached still
        /// when what it gets from it comes out the same.
        #[arg(add = crate::complete::names(Names::PipelineNode), long, value_name = "NODE")]
        rerun: Vec<String>,
        /// Also write the run as JUnit XML into FILE (a test suite, a test case per node), for
        /// CI systems that show test results.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        #[command(flatten)]
        options: RunOptions,
    },
    /// Show which nodes are up to date and which a run would run, and why, without running
    /// anything.
    Status {
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Record a run whose nodes another scheduler runs, one `kavi pipeline step` each (such as
    /// an exported Argo workflow), and print its id.
    Start {
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// Also write the run id into this file (where Argo reads a task's output).
        #[arg(long, value_name = "PATH")]
        id_file: Option<PathBuf>,
    },
    /// Decide one node of a run started with `kavi pipeline start` and run it once, once the
    /// nodes it needs have finished. Exits 75 when its retry policy wants another attempt.
    Step {
        /// The run's pipeline file, or a name looked up in pipelines/.
        #[arg(add = crate::complete::names(Names::Pipeline))]
        file: String,
        /// The run, as `kavi pipeline start` printed it.
        #[arg(long)]
        run: i64,
        /// The node to run; `NODE[N]` for the instance at position N of a node that runs once
        /// per item (`for_each`). Such a node itself is decided with --instances-file, and
        /// ended, once its instances have, without.
        #[arg(add = crate::complete::names(Names::PipelineNode))]
        node: String,
        /// For a node that runs once per item: decide it and record its instances, without
        /// running them, and write them to this file as a JSON list of `{"id", "item"}` (where
        /// Argo reads the list it fans out over).
        #[arg(long, value_name = "PATH")]
        instances_file: Option<PathBuf>,
        #[command(flatten)]
        options: RunOptions,
    },
    /// Close a run started with `kavi pipeline start` once its steps are over: nodes no step
    /// decided are recorded, and the run gets its status.
    End {
        /// The run's pipeline file, or a name looked up in pipelines/.
        #[arg(add = crate::complete::names(Names::Pipeline))]
        file: String,
        /// The run, as `kavi pipeline start` printed it.
        #[arg(long)]
        run: i64,
        /// Print the recorded run as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the pipeline out for another engine to run, each node a `kavi pipeline step` that
    /// records into the ledger; what the engine cannot carry out itself is listed on stderr.
    Export {
        /// A pipeline file, or a name looked up in pipelines/.
        #[arg(add = crate::complete::names(Names::Pipeline))]
        file: String,
        /// The engine.
        #[arg(long, value_enum)]
        format: crate::export::ExportFormat,
        /// The container image every task runs: `kavi` on its PATH, the workspace at --workdir.
        #[arg(long)]
        image: String,
        /// The workspace folder inside the container.
        #[arg(long, default_value = "/workspace")]
        workdir: String,
        /// A PersistentVolumeClaim holding the workspace, mounted at --workdir in every task.
        #[arg(long, value_name = "CLAIM")]
        workspace_claim: Option<String>,
        /// A PersistentVolumeClaim for the sandboxes, mounted in every task (their
        /// KAVI_SANDBOXES): a `sandbox` node's copy is then there for the nodes after it.
        #[arg(long, value_name = "CLAIM")]
        sandbox_claim: Option<String>,
        /// The ledger the tasks record into (their KAVI_LEDGER); the workspace's by default.
        /// A URL with a password is refused: give it with --task-ledger-secret.
        #[arg(long, value_name = "LEDGER")]
        task_ledger: Option<String>,
        /// The Kubernetes Secret, and its key, that holds the ledger the tasks record into: their
        /// KAVI_LEDGER comes from it (`secretKeyRef`), and no password is in the manifest.
        #[arg(long, value_name = "SECRET:KEY", conflicts_with = "task_ledger")]
        task_ledger_secret: Option<String>,
        /// At most this many tasks at once.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        parallelism: Option<u32>,
        /// Write the manifest here instead of to stdout.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Validate a pipeline without running it.
    Check {
        /// A pipeline file, or a name looked up in pipelines/.
        #[arg(add = crate::complete::names(Names::Pipeline))]
        file: String,
        /// Print JSON instead of text: the verdict, and each problem with its file, line,
        /// column and help.
        #[arg(long)]
        json: bool,
    },
    /// Show what would run, in order, without running anything.
    Plan {
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Print the pipeline's graph.
    Graph {
        /// A pipeline file, or a name looked up in pipelines/.
        #[arg(add = crate::complete::names(Names::Pipeline))]
        file: String,
        /// DOT for Graphviz, or Mermaid for Markdown.
        #[arg(long, value_enum, default_value_t = GraphFormat::Dot)]
        format: GraphFormat,
    },
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum RunsCommand {
    /// List runs, newest first.
    List {
        /// How many runs, newest first.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Only runs in this status (running, succeeded, failed, cancelled, awaiting_review, ...).
        #[arg(long, value_parser = |s: &str| s.parse::<crate::state::RunStatus>())]
        status: Option<crate::state::RunStatus>,
        /// Only runs of this pipeline (its `name`).
        #[arg(long)]
        pipeline: Option<String>,
        /// Only runs started within this long, such as `2h` or `3days`.
        #[arg(long, value_parser = humantime::parse_duration)]
        since: Option<std::time::Duration>,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Run a failed (or cancelled, interrupted) run's pipeline again as a new run: the nodes that
    /// succeeded are reused (their recorded outputs, not run again) unless their definition,
    /// scripts or inputs changed since; the rest and what needs them run. Refused when a policy,
    /// template, chain or the configuration changed, unless --allow-changed.
    Resume {
        /// A run id, or `latest`.
        #[arg(add = crate::complete::names(Names::Run))]
        run: String,
        /// Resume although the rules that governed the run changed since (`kavi policy diff
        /// RUN`); a node whose own definition, scripts or inputs changed still runs again.
        #[arg(long)]
        allow_changed: bool,
        /// Show which nodes would be reused and which would run, and why, and stop there.
        #[arg(long)]
        dry_run: bool,
        /// How many nodes may run at once (default: from config, else the number of CPUs).
        #[arg(long, short, value_parser = clap::value_parser!(u32).range(1..))]
        jobs: Option<u32>,
        /// Refused: a resumed run keeps the parameters of the run it resumes.
        #[arg(long = "set", value_name = "KEY=VALUE", hide = true)]
        sets: Vec<String>,
        #[command(flatten)]
        options: RunOptions,
    },
    /// Print what a node of a run wrote to stdout (or stderr), as recorded, re-hashed; of a node
    /// still running, what it has printed so far.
    Logs {
        /// A run id, or `latest`.
        #[arg(add = crate::complete::names(Names::Run))]
        run: String,
        /// The node's id.
        #[arg(add = crate::complete::names(Names::RunNode))]
        node: String,
        /// Its stderr instead of its stdout.
        #[arg(long)]
        stderr: bool,
        /// Go on printing what the node prints until it ends (waiting for it to start); exit 0
        /// when it succeeded, 1 when not.
        #[arg(short, long)]
        follow: bool,
    },
    /// Show one run and every node run in it.
    Show {
        /// A run id, or `latest`.
        #[arg(add = crate::complete::names(Names::Run), default_value = "latest")]
        run: String,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum LedgerCommand {
    /// Recompute the journal's hash chain, check every table against it, and re-hash every
    /// stored spec and artifact file (exit 1 naming the first entry, row or file that does not
    /// match).
    Verify {
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Make the ed25519 key that signs checkpoints, in kavi's keys folder ($KAVI_KEYS, else
    /// ~/.config/kavi; never in the workspace). An existing key is never overwritten.
    Keygen,
    /// Print the public half of the signing key: what another workspace lists in its
    /// `policies/trust.toml` `[import] keys` to take in this one's skill bundles.
    PublicKey,
    /// Sign the journal's head, so that a rewrite of the chain up to it is detected.
    Checkpoint,
    /// Make a new signing key, with a rotation record signed by the old one in the log of every
    /// ledger the old one is pinned to; the old key is kept beside as `signing.key.<key>.old`.
    RotateKey,
    /// MAC the journal entries written before kavi keyed the journal, once `ledger verify`
    /// finds nothing else wrong (exit 1, sealing nothing, when it does).
    Seal,
    /// Copy the workspace's SQLite ledger, journal and checkpoints included, into an empty
    /// PostgreSQL database, and verify the copy (exit 1 when either does not verify).
    Migrate {
        /// The database: postgres://user[:password]@host[:port]/database.
        #[arg(long, value_name = "URL")]
        to: String,
    },
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum PolicyCommand {
    /// Check governance as a whole: the lifecycle's dead ends (states that cannot reach
    /// TRUSTED, buildable states with no way in, moves the pipelines need that it lacks), then
    /// every pipeline and chain with every policy they read (exit 3 on any problem).
    Check {
        /// Print JSON instead of text: the verdict, and each problem with its file, line,
        /// column and help.
        #[arg(long)]
        json: bool,
    },
    /// Say what changed in governance between two runs, or between a run and the workspace as
    /// it is now (gates, transitions, allowlist paths, rules, thresholds, profiles), then show
    /// the text diff. Exit 0 when nothing changed, 1 when governance changed.
    Diff {
        /// The earlier run (an id, or `latest`); without it, the governing files on disk against
        /// the adopted rule set, each change classified, and the rule changes pending.
        from: Option<String>,
        /// The later run; without it, the workspace as a run of the same pipeline would see it now.
        #[arg(requires = "from")]
        to: Option<String>,
        /// Print JSON instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Record the governing files as they are now as a pending change to the adopted rule set,
    /// each part classified weakening, strengthening or neutral (`policies/trust.toml`).
    Propose {
        /// Why, recorded with the change.
        #[arg(short, long)]
        message: Option<String>,
    },
    /// Approve a pending rule change (the proposer's approval never counts).
    Approve {
        /// The rule change's id (`kavi policy propose` prints it).
        id: i64,
    },
    /// Reject a pending rule change.
    Reject {
        /// The rule change's id (`kavi policy propose` prints it).
        id: i64,
    },
    /// Make a pending rule change the adopted set: its files must be unchanged since it was
    /// proposed, and a weakening change must have the approvals `[adoption]` names.
    Adopt {
        /// The rule change's id (`kavi policy propose` prints it).
        id: i64,
    },
    /// Print this account's own key (made on first use, in `$KAVI_PERSON_KEY` or
    /// `~/.config/kavi/person.key`) as the line to pin it under `[keys]` in
    /// `policies/roles.toml`: once a key is pinned there, only signed approvals count.
    Key,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ArtifactCommand {
    /// Print an artifact's bytes, re-hashed as they are read (a changed file is refused).
    Cat {
        /// `sha256:<hex>`, or a unique prefix of the hex.
        hash: String,
    },
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum SpecCommand {
    /// Print the spec text recorded under a hash (`sha256:...`, or a unique prefix).
    Show {
        /// `sha256:<hex>`, or a unique prefix of the hex.
        hash: String,
    },
}
