//! The command line: dispatch of the commands `kavi_cli` defines. One module per command group.

/// `println!` to stdout, but a reader that went away (`kavi pipeline run X | head`) does not
/// end the command: see [`write_out`]. Children's pipes keep SIGPIPE ignored, so this is the
/// one place a closed stdout is handled.
macro_rules! outln {
    () => {
        $crate::cli::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!`, made terminal-safe (see [`write_err`]).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::write_err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` to stdout, with the same handling of a closed pipe as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_out(format_args!($($arg)*))
    };
}

/// Set once stdout's reader has gone.
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes to stdout until its reader goes away; from then on what the command prints is
/// dropped, and the command itself goes on to its end: a run whose reader went away (`| head`)
/// finishes and is recorded like any other, and its exit code is its own. What it prints is
/// made terminal-safe first: a file name or an error a builder chose is shown, never obeyed
/// (an escape sequence retitling the window, a carriage return overwriting "FAIL").
pub(crate) fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    use std::sync::atomic::Ordering;
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let text = args.to_string();
    if let Err(e) = std::io::stdout().write_all(&output::terminal_safe(text.as_bytes()))
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Writes to stderr, terminal-safe as [`write_out`] is: an error often quotes what a skill, a
/// builder or a gate printed.
pub(crate) fn write_err(args: std::fmt::Arguments<'_>) {
    let text = args.to_string();
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        &output::terminal_safe(text.as_bytes()),
    );
}

/// Prints `value` as pretty JSON and a newline on stdout, written as it is serialized (a run of
/// many nodes is never held whole as text), with the same handling of a closed pipe as
/// [`outln!`].
fn print_json<T: serde::Serialize + ?Sized>(value: &T) {
    use std::io::Write as _;
    use std::sync::atomic::Ordering;
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    // In 64 KiB writes, a pipe's size: stdout passes a chunk that ends mid-line on in two
    // writes, and 8 KiB ones made 146 system calls of a 1,000-node run's 700 KB.
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    let written = serde_json::to_writer_pretty(&mut out, value)
        .map_err(std::io::Error::from)
        .and_then(|()| writeln!(out))
        .and_then(|()| out.flush());
    if let Err(e) = written
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Ends the life of what a command loaded without freeing it, piece by piece: kavi ends once
/// the command returns (`main` calls `_exit`), and the end of the process hands all its memory
/// back at once. Only for values that hold nothing but memory (a loaded pipeline and its graph,
/// a run read back), never one whose drop closes, flushes or removes something. Dropping a
/// 10,000-node pipeline was 4 of `plan`'s 294 million instructions, and after a run it came
/// after the ledger had closed, between the last node and kavi's exit.
fn leave_to_exit<T>(value: T) {
    std::mem::forget(value);
}

mod builds;
mod chains;
mod chat;
mod complete;
mod doctor;
mod drill;
mod executions;
mod executor;
mod explain;
mod gc;
mod init;
mod junit;
mod ledger;
mod listing;
mod mcp;
mod output;
mod pipeline;
mod policy;
mod progress;
mod research;
mod resume;
mod review;
mod runs;
mod serve;
mod signals;
mod skills;
mod steps;
mod toolchain;

use std::path::PathBuf;
use std::sync::Arc;

use std::io::IsTerminal as _;

use clap::{ColorChoice, CommandFactory, FromArgMatches, ValueEnum as _};

use crate::config::{Overrides, Workspace};
use crate::diagnostic::SourceFile;
use crate::error::{Error, exit};
use crate::ledger::RunOrigin;
use kavi_governance::{open_store, read_policy};

use kavi_cli::{
    ArtifactCommand, BuildsCommand, ChainCommand, Cli, Command, DrillCommand, ExecutionsCommand,
    LedgerCommand, LogFormat, PipelineCommand, PolicyCommand, RunsCommand, SkillCommand,
    SpecCommand, ToolchainCommand, TopCommand,
};
use signals::cancel_on_signals;
pub(crate) use signals::cancelled_exit_code;

/// A confinement policy, its roles with the network given the hosts of `policies/network.toml`
/// (none without the file), each file as `read` has it (`None`: no such file).
fn read_confinement(
    templates: &crate::template::TemplateEngine,
    read: impl Fn(&str) -> Result<Option<Arc<SourceFile>>, crate::spec::SpecError>,
) -> Result<crate::confinement::policy::ConfinementPolicy, crate::spec::SpecError> {
    let path = crate::confinement::policy::DEFAULT_POLICY;
    let source = read(path)?
        .ok_or_else(|| crate::diagnostic::Diagnostic::new(format!("{path}: no such file")))?;
    let policy = crate::confinement::policy::ConfinementPolicy::parse(&source, templates)?;
    if !policy.any_network() {
        return Ok(policy);
    }
    let hosts = read(crate::confinement::network::DEFAULT_POLICY)?;
    Ok(policy.with_hosts(hosts.as_ref())?)
}

fn init_logging(cli: &Cli) {
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        (false, _) => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let ansi = match cli.color {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => std::io::stderr().is_terminal() && !no_color(),
    };
    // A log line that cannot be written (stderr closed by `2>&1 | head`) is dropped: the
    // subscriber's own report of it would be an eprintln! to the same closed stderr, a panic.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// `NO_COLOR` set and not empty (no-color.org): no colour where the choice is `auto`.
fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty())
}

/// The `--color` the command line asks for, read before clap parses it (the last one wins, as
/// in clap); `auto` honours NO_COLOR.
fn color_asked(args: impl Iterator<Item = std::ffi::OsString>) -> ColorChoice {
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    let mut asked = ColorChoice::Auto;
    for (i, arg) in args.iter().enumerate() {
        let value = match arg.strip_prefix("--color") {
            Some("") => args.get(i + 1).map(String::as_str),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        };
        if let Some(value) = value.and_then(|v| ColorChoice::from_str(v, false).ok()) {
            asked = value;
        }
    }
    match asked {
        ColorChoice::Auto if no_color() => ColorChoice::Never,
        asked => asked,
    }
}

/// Refuses to start server `command` outside a workspace: it would serve nothing and leave a
/// ledger behind.
fn served_workspace(workspace: &Workspace, command: &str) -> Result<(), Error> {
    if workspace.root.join(crate::config::CONFIG_FILE).is_file() {
        return Ok(());
    }
    Err(Error::Unusable(format!(
        "{} is not a kavi workspace (no {} there or above); start `{command}` in one, or name \
         it with --workspace DIR; nothing was written",
        workspace.root.display(),
        crate::config::CONFIG_FILE
    )))
}

/// Runs the command line and returns the process exit code.
pub fn main() -> i32 {
    // `--version` names the build too (build.rs): which commit, which profile, which features.
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("KAVI_BUILD"), ")");
    // A shell asking for the names it may complete is answered, and nothing else happens.
    kavi_cli::complete::complete_if_asked(complete::names);
    // Clap colours its own usage errors before `--color` is parsed: it is read first.
    let matches = Cli::command()
        .version(VERSION)
        .color(color_asked(std::env::args_os()))
        .get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let json_problems = check_with_json(&cli.command);
    init_logging(&cli);
    if cli.quiet {
        progress::hide_progress();
    }
    crate::process::raise_open_file_limit();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            errln!("error: failed to start the async runtime: {e}");
            return exit::ENVIRONMENT;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(err) if json_problems => {
            let problems: Vec<_> = err.diagnostics().iter().map(|d| d.to_json()).collect();
            print_json(&serde_json::json!({ "ok": false, "problems": problems }));
            err.exit_code()
        }
        Err(err) => {
            errln!("error: {err}");
            err.exit_code()
        }
    }
}

/// The workspace to run a pipeline file named by its path in, when the current folder is in none
/// and the file is not under it: the file's own (said on stderr), or a refusal. Either way no
/// ledger is made in a folder that merely happens to be the current one.
fn workspace_of_file(file: &str) -> Result<Option<PathBuf>, Error> {
    let current = std::env::current_dir().map_err(|source| Error::Io {
        context: "failed to read the current directory".into(),
        source,
    })?;
    let Ok(path) = std::path::Path::new(file).canonicalize() else {
        return Ok(None);
    };
    let current = current.canonicalize().unwrap_or(current);
    if crate::config::enclosing_workspace(&current).is_some() || path.starts_with(&current) {
        return Ok(None);
    }
    let folder = path.parent().unwrap_or(&path);
    match crate::config::enclosing_workspace(folder) {
        Some(root) => {
            errln!("running in {}, the workspace {file} is in", root.display());
            Ok(Some(root))
        }
        None => Err(Error::Usage(format!(
            "{file} is in no workspace (no kavi.toml above it), nor is the current folder: \
             pass --workspace DIR, or make one with `kavi init DIR`"
        ))),
    }
}

/// Whether the command is a check asked for JSON: then its problems, the workspace's own
/// included, are printed as JSON on stdout, not as text on stderr.
fn check_with_json(command: &TopCommand) -> bool {
    matches!(
        command,
        TopCommand::InWorkspace(
            Command::Pipeline(PipelineCommand::Check { json: true, .. })
                | Command::Policy(PolicyCommand::Check { json: true })
                | Command::Chain(ChainCommand::Check { json: true, .. })
        )
    )
}

async fn dispatch(cli: Cli) -> Result<i32, Error> {
    match cli.command {
        // These describe kavi itself and need no workspace.
        TopCommand::Completions { shell } => {
            kavi_cli::complete::write_registration(shell, &mut std::io::stdout())
                .map(|()| exit::SUCCESS)
                .map_err(|source| Error::Io {
                    context: "failed to write the completion script".into(),
                    source,
                })
        }
        TopCommand::Man { dir } => match &dir {
            None => kavi_cli::help::man_page(&mut std::io::stdout()),
            Some(dir) => kavi_cli::help::man_pages(dir),
        }
        .map(|()| exit::SUCCESS)
        .map_err(|source| Error::Io {
            context: "failed to write the man page".into(),
            source,
        }),
        TopCommand::Init { dir } => init::run(&dir),
        TopCommand::InWorkspace(command) => {
            in_workspace(command, cli.workspace.as_deref(), cli.ledger).await
        }
    }
}

async fn in_workspace(
    command: Command,
    root: Option<&std::path::Path>,
    ledger: Option<PathBuf>,
) -> Result<i32, Error> {
    let jobs = match &command {
        Command::Pipeline(PipelineCommand::Run { jobs, .. })
        | Command::Runs(RunsCommand::Resume { jobs, .. }) => jobs.map(|jobs| jobs as usize),
        _ => None,
    };
    // Checking an attestation needs no workspace: whoever was handed one checks it.
    if let Command::Skill(SkillCommand::VerifyAttestation {
        file,
        key,
        files,
        json,
    }) = &command
    {
        return skills::verify_attestation(file, key, files.as_deref(), *json);
    }
    let overrides = Overrides { ledger, jobs };
    let file_workspace = match (&command, root) {
        (Command::Pipeline(PipelineCommand::Run { pipeline, .. }), None) => {
            workspace_of_file(&pipeline.file)?
        }
        _ => None,
    };
    let workspace = Workspace::load(root.or(file_workspace.as_deref()), &overrides)?;
    match command {
        Command::Pipeline(command) => match command {
            PipelineCommand::Run {
                pipeline,
                options,
                rerun,
                targets,
                only,
                junit,
                ..
            } => {
                pipeline::run_subset(
                    &workspace,
                    &pipeline.file,
                    &pipeline.sets,
                    options,
                    crate::executor::RunStart {
                        rerun: rerun.into_iter().collect(),
                        ..RunOrigin::User.into()
                    },
                    pipeline::Subset {
                        targets: &targets,
                        only,
                    },
                    junit.as_deref(),
                )
                .await
            }
            PipelineCommand::Status { pipeline, json } => {
                pipeline::status(&workspace, &pipeline.file, &pipeline.sets, json)
            }
            PipelineCommand::Start { pipeline, id_file } => steps::start(
                &workspace,
                &pipeline.file,
                &pipeline.sets,
                id_file.as_deref(),
            ),
            PipelineCommand::Step {
                file,
                run,
                node,
                instances_file,
                options,
            } => {
                steps::step(
                    &workspace,
                    (&file, run, &node),
                    instances_file.as_deref(),
                    options,
                )
                .await
            }
            PipelineCommand::End { file, run, json } => steps::end(&workspace, &file, run, json),
            PipelineCommand::Export {
                file,
                format,
                image,
                workdir,
                workspace_claim,
                sandbox_claim,
                task_ledger,
                task_ledger_secret,
                parallelism,
                output,
            } => {
                let options = crate::export::argo::ArgoOptions {
                    image,
                    workdir,
                    workspace_claim,
                    sandbox_claim,
                    ledger: pipeline::task_ledger(task_ledger, task_ledger_secret)?,
                    parallelism,
                    file: String::new(),
                };
                pipeline::export(&workspace, &file, format, options, output.as_deref())
            }
            PipelineCommand::Check { file, json } => pipeline::check(&workspace, &file, json),
            PipelineCommand::List { json } => listing::pipelines(&workspace, json),
            PipelineCommand::Plan { pipeline, json } => {
                pipeline::plan(&workspace, &pipeline.file, &pipeline.sets, json)
            }
            PipelineCommand::Graph { file, format } => pipeline::graph(&workspace, &file, format),
        },
        Command::Runs(RunsCommand::Resume { sets, run, .. }) if !sets.is_empty() => {
            Err(Error::Usage(format!(
                "`runs resume` takes no --set: a resumed run keeps the parameters of the run it \
                 resumes (`kavi runs show {run}` lists them); to run with others, start a new \
                 run (`kavi pipeline run FILE --set {}`)",
                sets[0]
            )))
        }
        Command::Runs(RunsCommand::Resume {
            run,
            allow_changed,
            dry_run,
            options,
            ..
        }) => resume::run(&workspace, &run, allow_changed, dry_run, options).await,
        Command::Runs(RunsCommand::List {
            limit,
            status,
            pipeline,
            since,
            json,
        }) => {
            let since = since
                .map(|age| {
                    jiff::SignedDuration::try_from(age)
                        .ok()
                        .and_then(|age| jiff::Timestamp::now().checked_sub(age).ok())
                        .ok_or_else(|| {
                            Error::Usage(format!(
                                "--since {age:?} reaches before any time kavi can name"
                            ))
                        })
                })
                .transpose()?;
            let filter = crate::ledger::RunFilter {
                status,
                pipeline,
                since,
                before: None,
            };
            runs::list(&workspace, &filter, limit, json)
        }
        Command::Runs(RunsCommand::Logs {
            run,
            node,
            stderr,
            follow,
        }) => runs::logs(&workspace, &run, &node, stderr, follow),
        Command::Artifact(ArtifactCommand::Cat { hash }) => runs::artifact_cat(&workspace, &hash),
        Command::Runs(RunsCommand::Show { run, json }) => runs::show(&workspace, &run, json),
        Command::Spec(SpecCommand::Show { hash }) => runs::spec_show(&workspace, &hash),
        Command::Policy(PolicyCommand::Check { json }) => policy::check(&workspace, json),
        Command::Policy(PolicyCommand::Propose { message }) => {
            policy::propose(&workspace, message.as_deref())
        }
        Command::Policy(PolicyCommand::Approve { id }) => policy::decide(&workspace, id, true),
        Command::Policy(PolicyCommand::Reject { id }) => policy::decide(&workspace, id, false),
        Command::Policy(PolicyCommand::Adopt { id }) => policy::adopt(&workspace, id),
        Command::Policy(PolicyCommand::Key) => policy::key(),
        Command::Policy(PolicyCommand::Diff { from, to, json }) => match from {
            Some(from) => policy::diff(&workspace, &from, to.as_deref(), json),
            None => policy::adoption_diff(&workspace, json),
        },
        Command::Ledger(LedgerCommand::Verify { json }) => ledger::verify(&workspace, json),
        Command::Ledger(LedgerCommand::Keygen) => ledger::keygen(),
        Command::Ledger(LedgerCommand::PublicKey) => ledger::public_key(),
        Command::Ledger(LedgerCommand::Checkpoint) => ledger::checkpoint(&workspace),
        Command::Ledger(LedgerCommand::RotateKey) => ledger::rotate_key(),
        Command::Ledger(LedgerCommand::Seal) => ledger::seal(&workspace),
        Command::Ledger(LedgerCommand::Migrate { to }) => ledger::migrate(&workspace, &to),
        Command::Builds(BuildsCommand::List { skill, json }) => {
            builds::list(&workspace, &skill, json)
        }
        Command::Toolchain(ToolchainCommand::Install { name, json }) => {
            toolchain::install(&workspace, name.as_deref(), json).await
        }
        Command::Toolchain(ToolchainCommand::Lock) => toolchain::lock(&workspace).await,
        Command::Toolchain(ToolchainCommand::List { json }) => toolchain::list(&workspace, json),
        Command::Toolchain(ToolchainCommand::Path { name }) => toolchain::path(&workspace, &name),
        Command::Research {
            build,
            advise,
            json,
        } => research::run(&workspace, build, advise, json).await,
        Command::Approve {
            run,
            comment,
            no_resume,
        } => {
            let decision = review::Decision::Approve { resume: !no_resume };
            review::decide(&workspace, &run, decision, comment.as_deref()).await
        }
        Command::Reject { run, comment } => {
            review::decide(
                &workspace,
                &run,
                review::Decision::Reject,
                comment.as_deref(),
            )
            .await
        }
        Command::Skill(SkillCommand::Propose { file, json }) => {
            skills::propose(&workspace, &file, json)
        }
        Command::Skill(SkillCommand::Show { name, json }) => skills::show(&workspace, &name, json),
        Command::Skill(SkillCommand::List { json }) => skills::list(&workspace, json),
        Command::Doctor { json } => doctor::run(&workspace, json),
        Command::Drill(DrillCommand::Isolation { role, json }) => {
            drill::isolation(&workspace, role.as_deref(), json).await
        }
        Command::Drill(DrillCommand::Gates { case, json }) => {
            drill::gates(&workspace, case.as_deref(), json).await
        }
        Command::Explain { run, node, json } => explain::run(&workspace, &run, &node, json),
        Command::Serve {
            mut bind,
            port,
            allow_remote,
        } => {
            if let Some(port) = port {
                bind.set_port(port);
            }
            serve::run(workspace, bind, allow_remote).await
        }
        Command::Mcp { client } => mcp::run(workspace, client).await,
        Command::Executor { idle_timeout } => {
            executor::run(workspace, &overrides, idle_timeout).await
        }
        Command::Chat {
            message,
            confirmed,
            json,
        } => chat::run(&workspace, message.as_deref(), confirmed, json).await,
        Command::Gc {
            older_than,
            keep,
            dry_run,
            json,
        } => gc::run(
            &workspace,
            &gc::Options {
                older_than,
                keep,
                dry_run,
                json,
            },
        ),
        Command::Chain(ChainCommand::Run {
            file,
            sets,
            yes,
            json,
        }) => chains::run(&workspace, &file, &sets, yes, json).await,
        Command::Chain(ChainCommand::Check { file, json }) => {
            chains::check(&workspace, &file, json)
        }
        Command::Chain(ChainCommand::List { json }) => listing::chains(&workspace, json),
        Command::Executions(ExecutionsCommand::Tail {
            count,
            only_failures,
            skill,
            json,
        }) => {
            let filter = executions::TailFilter {
                count,
                only_failures,
                skill: skill.as_deref(),
            };
            executions::tail(&workspace, &filter, json)
        }
        Command::Replay {
            execution_id,
            no_log,
            yes,
        } => executions::replay(&workspace, &execution_id, yes, no_log).await,
        Command::Session {
            execution_id,
            latest: _,
            json,
        } => {
            let of = match &execution_id {
                Some(id) => executions::SessionOf::Execution(id),
                None => executions::SessionOf::Latest,
            };
            executions::session(&workspace, of, json)
        }
        Command::Skill(SkillCommand::Run { name, input, yes }) => {
            skills::run(&workspace, &name, &input, yes).await
        }
        Command::Skill(SkillCommand::Restore { name, comment }) => {
            skills::restore(&workspace, &name, comment.as_deref())
        }
        Command::Skill(SkillCommand::Revoke { name, comment }) => {
            skills::revoke(&workspace, &name, &comment)
        }
        Command::Skill(SkillCommand::Verify { name, json, .. }) => {
            skills::verify(&workspace, name.as_deref(), json)
        }
        Command::Skill(SkillCommand::Attest {
            name,
            version,
            output,
        }) => skills::attest(&workspace, &name, version, output.as_deref()),
        Command::Skill(SkillCommand::Export { name, output }) => {
            skills::export(&workspace, &name, output.as_deref())
        }
        Command::Skill(SkillCommand::Import { bundle, options }) => {
            let accepted = kavi_governance::skills::accept_bundle(&workspace, &bundle)?;
            errln!(
                "accepted bundle {} signed by key {}: `{}` is verified and promoted by this \
                 workspace's import pipeline",
                &accepted.bundle[..12],
                crate::ledger::checkpoint::short(&accepted.signer),
                accepted.skill
            );
            let skill = accepted.skill.clone();
            let sets = [
                ("skill".to_owned(), accepted.skill.clone()),
                ("bundle".to_owned(), accepted.bundle.clone()),
            ];
            let import = workspace.root.join("pipelines/import.toml");
            let code = pipeline::run(
                &workspace,
                &import.to_string_lossy(),
                &sets,
                options,
                RunOrigin::User.into(),
                None,
            )
            .await?;
            // Files the import brought that it did not promote go back out: left in the
            // skill's folder, the next forge would take them as this workspace's own.
            if code != exit::SUCCESS {
                let written = accepted.written.files();
                for path in written {
                    if let Err(e) = std::fs::remove_file(path) {
                        errln!("warning: could not remove {}: {e}", path.display());
                    }
                }
                errln!(
                    "the import did not promote `{}`: the {} file(s) it wrote are removed",
                    skill,
                    written.len()
                );
            }
            accepted.written.settle();
            Ok(code)
        }
        Command::Skill(SkillCommand::VerifyAttestation { .. }) => {
            unreachable!("checked before the workspace is loaded")
        }
    }
}
