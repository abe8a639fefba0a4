//! `exec`: run a command, as an argv array (`run`) or a shell string (`shell`).
//!
//! Argv elements are rendered one by one, so a value stays one argument whatever it contains.
//! A `shell` string holds no template at all; values reach it through `env`. The child gets a minimal
//! environment plus what the node declares, unless it asks to inherit kavi's.
//!
//! Variables named in `secrets` are passed from kavi's environment, and their values are
//! redacted from everything kept of the node: its output streams before they become artifacts,
//! its outputs (JSON keys too) and its errors.

use std::io::Read;
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::{Value, json};
use toml::Spanned;

use crate::diagnostic::Diagnostic;
use crate::ledger::Artifact;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::process::{self, Captured, CommandSpec, Exit};
use crate::redact::Redactor;
use crate::state::NodeState;

pub const KIND: NodeKind = NodeKind {
    name: "exec",
    parse,
    schema: <ExecConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

/// How much of stdout and stderr is kept in the node's JSON outputs; the whole of each is an
/// artifact.
const OUTPUT_TEXT_LIMIT: usize = 64 * 1024;

/// The most stdout `stdout = "json"` parses: the document is read whole, in memory.
pub const JSON_STDOUT_LIMIT: u64 = 16 * 1024 * 1024;

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum StdoutFormat {
    #[default]
    Text,
    /// Parse stdout as JSON into `outputs.json`; invalid JSON fails the node.
    Json,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExecConfig {
    #[schemars(with = "Option<Vec<String>>", extend("minItems" = 1))]
    run: Option<Spanned<Vec<Spanned<String>>>>,
    #[schemars(with = "Option<String>")]
    shell: Option<Spanned<String>>,
    #[serde(default)]
    #[schemars(
        with = "IndexMap<String, String>",
        extend("propertyNames" = { "pattern": "^[A-Za-z_][A-Za-z0-9_]*$" })
    )]
    env: IndexMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    inherit_env: bool,
    #[schemars(with = "Option<String>")]
    cwd: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    stdin: Option<Spanned<String>>,
    #[serde(default)]
    stdout: StdoutFormat,
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    secrets: Vec<Spanned<String>>,
}

#[derive(Debug)]
enum Program {
    Argv(Vec<String>),
    Shell(String),
}

#[derive(Debug)]
struct Exec {
    program: Program,
    env: IndexMap<String, String>,
    inherit_env: bool,
    cwd: Option<String>,
    stdin: Option<String>,
    stdout: StdoutFormat,
    /// Variables of kavi's environment the command gets and whose values are redacted.
    secrets: Vec<String>,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: ExecConfig = config.deserialize()?;
    let program = match (raw.run, raw.shell) {
        (Some(run), None) => {
            match run.get_ref().first() {
                None => {
                    return Err(config.error("`run` needs at least the program to run", run.span()));
                }
                Some(program) if program.get_ref().trim().is_empty() => {
                    return Err(config.error(
                        "the program to run (the first item of `run`) is empty",
                        program.span(),
                    ));
                }
                Some(_) => {}
            }
            for arg in run.get_ref() {
                config.check_template(arg)?;
            }
            config.govern_command(run.get_ref().iter().map(|a| a.get_ref().as_str()));
            Program::Argv(
                run.into_inner()
                    .into_iter()
                    .map(Spanned::into_inner)
                    .collect(),
            )
        }
        (None, Some(shell)) => {
            // A value interpolated into shell code can become code, quoted or not (inside the
            // shell's own quotes, `$(...)` still runs): values go through the environment.
            if crate::template::is_templated(shell.get_ref()) {
                return Err(config
                    .error(
                        "a `shell` string may not hold a template: an interpolated value could \
                         run as shell code",
                        shell.span(),
                    )
                    .with_help(
                        "pass the value through `env` and read it quoted in the shell, as in \
                         `env = { NAME = \"{{ params.name }}\" }` with `shell = 'echo \"$NAME\"'`, \
                         or use `run`, an argv array, where templates stay one argument each",
                    ));
            }
            config.govern_command(shell.get_ref().split_whitespace());
            Program::Shell(shell.into_inner())
        }
        (Some(run), Some(_)) => {
            return Err(config
                .error("an exec node takes `run` or `shell`, not both", run.span())
                .with_help("`run` is an argv array; `shell` is one string given to `sh -c`"));
        }
        (None, None) => {
            let span = config.span.clone();
            return Err(config.error(
                "an exec node needs `run` (an argv array) or `shell` (a string)",
                span,
            ));
        }
    };
    config.check_env(&raw.env)?;
    for name in &raw.secrets {
        config.check_variable_name(name)?;
    }
    for field in [&raw.cwd, &raw.stdin].into_iter().flatten() {
        config.check_template(field)?;
    }
    Ok(Arc::new(Exec {
        program,
        env: raw
            .env
            .into_iter()
            .map(|(k, v)| (k.into_inner(), v.into_inner()))
            .collect(),
        inherit_env: raw.inherit_env,
        cwd: raw.cwd.map(Spanned::into_inner),
        stdin: raw.stdin.map(Spanned::into_inner),
        stdout: raw.stdout,
        secrets: raw.secrets.into_iter().map(Spanned::into_inner).collect(),
    }))
}

impl Exec {
    /// The command to run, and the values of its secrets.
    fn resolve(&self, ctx: &NodeContext<'_>) -> Result<(CommandSpec, Vec<String>), String> {
        let (program, args) = match &self.program {
            Program::Argv(argv) => {
                let mut rendered = Vec::with_capacity(argv.len());
                for (i, arg) in argv.iter().enumerate() {
                    rendered.push(ctx.render(&format!("run[{i}]"), arg)?);
                }
                let program = rendered.remove(0);
                (program, rendered)
            }
            Program::Shell(line) => ("sh".to_owned(), vec!["-c".to_owned(), line.clone()]),
        };
        let mut env: Vec<(String, String)> = if self.inherit_env {
            std::env::vars().collect()
        } else {
            process::base_env()
        };
        env.push(("KAVI_RUN_ID".into(), ctx.run_id.to_string()));
        env.push(("KAVI_NODE_ID".into(), ctx.node_id.to_owned()));
        env.push((
            "KAVI_WORKSPACE".into(),
            ctx.env.workspace.display().to_string(),
        ));
        for (key, value) in &self.env {
            env.push((key.clone(), ctx.render(&format!("env.{key}"), value)?));
        }
        let mut secrets = Vec::with_capacity(self.secrets.len());
        for name in &self.secrets {
            let value = crate::redact::secret_from_env(name)?;
            env.push((name.clone(), value.clone()));
            secrets.push(value);
        }
        let cwd = match &self.cwd {
            None => ctx.env.workspace.to_path_buf(),
            Some(cwd) => ctx.env.workspace.join(ctx.render("cwd", cwd)?),
        };
        let stdin = match &self.stdin {
            None => None,
            Some(stdin) => Some(ctx.render("stdin", stdin)?.into_bytes()),
        };
        let spec = CommandSpec {
            program,
            args,
            env,
            cwd,
            stdin,
            confinement: None,
        };
        Ok((spec, secrets))
    }
}

/// One stream, kept: its artifact (none when it was empty), its head as text, whether the head
/// is only part of it, and whether the head was not valid UTF-8 (and had bytes replaced to
/// become text).
struct Kept {
    artifact: Option<Artifact>,
    text: String,
    truncated: bool,
    lossy: bool,
}

/// Stores one captured stream as an artifact.
fn store_output(ctx: &NodeContext<'_>, kind: &str, captured: Captured) -> std::io::Result<Kept> {
    let truncated = captured.truncated();
    let head = if truncated {
        without_cut_char(&captured.head)
    } else {
        &captured.head
    };
    let text = String::from_utf8_lossy(head);
    let lossy = matches!(text, std::borrow::Cow::Owned(_));
    let text = text.into_owned();
    // An empty stream is not kept: the outputs' text says it was empty, and a node that prints
    // nothing is spared a row and a journal entry per stream.
    let artifact = match captured.spill {
        Some(file) => Some(ctx.env.artifacts.put_file(kind, file)?),
        None if captured.head.is_empty() => None,
        None => Some(ctx.env.artifacts.put_small(kind, &captured.head)?),
    };
    Ok(Kept {
        artifact,
        text,
        truncated,
        lossy,
    })
}

/// `bytes` without a UTF-8 sequence cut short at its end, where the in-memory head stops: that
/// is not a decoding loss.
fn without_cut_char(bytes: &[u8]) -> &[u8] {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0xC0 == 0x80 {
            continue; // a continuation byte: the sequence starts further back
        }
        let width = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if width > back {
            &bytes[..bytes.len() - back]
        } else {
            bytes
        };
    }
    bytes
}

/// Parses the whole of stdout as one JSON document.
fn parse_json(stdout: &mut Captured, redactor: Option<&Redactor>) -> Result<Value, String> {
    if stdout.total > JSON_STDOUT_LIMIT {
        return Err(format!(
            "stdout is {} bytes, more than the {} MiB `stdout = \"json\"` parses",
            stdout.total,
            JSON_STDOUT_LIMIT >> 20
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(stdout.total).unwrap_or_default());
    stdout
        .reader()
        .and_then(|mut reader| reader.read_to_end(&mut bytes))
        .map_err(|e| format!("failed to read stdout back: {e}"))?;
    let mut parsed: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("stdout is not valid JSON: {e}"))?;
    // A secret written with JSON escapes survives the stream's redaction; not the parse.
    if let Some(redactor) = redactor {
        redactor.json(&mut parsed);
    }
    Ok(parsed)
}

#[async_trait::async_trait]
impl NodeAction for Exec {
    /// It reads no setting but through its templates.
    fn config_settings(&self) -> &'static [&'static str] {
        &[]
    }

    fn inherits_environment(&self) -> bool {
        self.inherit_env
    }

    /// A command is a process of its own: it reaches the ledger only by running kavi, which a
    /// command that never names it cannot do (`sh -c 'kavi …'` and `$KAVI` name it too).
    fn uses_ledger(&self) -> bool {
        let names_kavi = |text: &str| text.to_ascii_lowercase().contains("kavi");
        match &self.program {
            Program::Argv(argv) => argv.iter().any(|arg| names_kavi(arg)),
            Program::Shell(text) => names_kavi(text),
        }
    }

    fn output_keys(&self) -> Option<&'static [&'static str]> {
        Some(&[
            "exit_code",
            "stdout",
            "stderr",
            "truncated",
            "stdout_lossy",
            "stderr_lossy",
            "json",
        ])
    }

    fn describe(&self) -> String {
        let mut described = match &self.program {
            Program::Argv(argv) => shlex::try_join(argv.iter().map(String::as_str))
                .unwrap_or_else(|_| format!("{argv:?}")),
            Program::Shell(line) => format!("sh -c {}", shlex::try_quote(line).unwrap_or_default()),
        };
        if self.stdout == StdoutFormat::Json {
            described.push_str(&format!(
                " (stdout parsed as JSON, at most {} MiB)",
                JSON_STDOUT_LIMIT >> 20
            ));
        }
        if !self.secrets.is_empty() {
            described.push_str(&format!(" (secrets redacted: {})", self.secrets.join(", ")));
        }
        described
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        let (spec, secrets) = match self.resolve(ctx) {
            Ok(resolved) => resolved,
            Err(error) => return NodeOutcome::failed(error),
        };
        let redactor = Redactor::new(&secrets);
        let options = ctx.capture(OUTPUT_TEXT_LIMIT, redactor.as_ref());
        let finished = match process::run(&spec, &options, &ctx.cancel).await {
            Ok(finished) => finished,
            // Whether the working directory is there is asked only now: on a chain of short
            // nodes a question per node is time between one node's end and the next's start.
            Err(_) if !spec.cwd.is_dir() => {
                return NodeOutcome::failed(format!(
                    "working directory {} does not exist",
                    spec.cwd.display()
                ));
            }
            // It started: what it printed could not be kept.
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                return NodeOutcome::failed(format!(
                    "no space left on device for the output of `{}`: {e}",
                    spec.program
                ));
            }
            Err(e) => {
                return NodeOutcome::failed(format!("failed to start `{}`: {e}", spec.program));
            }
        };
        let exit = finished.exit;
        let (mut stdout, mut stderr) = (finished.stdout, finished.stderr);
        if let Some(redactor) = &redactor {
            let redacted = |captured: Captured| {
                captured.filtered(&options, |from, to| redactor.stream(from, to))
            };
            match redacted(stdout).and_then(|out| Ok((out, redacted(stderr)?))) {
                Ok(streams) => (stdout, stderr) = streams,
                Err(e) => return NodeOutcome::failed(format!("failed to redact output: {e}")),
            }
        }
        let parsed = (exit == Exit::Code(0) && self.stdout == StdoutFormat::Json)
            .then(|| parse_json(&mut stdout, redactor.as_ref()));
        let stored = store_output(ctx, "STDOUT", stdout)
            .and_then(|out| Ok((out, store_output(ctx, "STDERR", stderr)?)));
        let (out, err) = match stored {
            Ok(stored) => stored,
            Err(e) => return NodeOutcome::failed(format!("failed to store output: {e}")),
        };

        let exit_code = match exit {
            Exit::Code(code) => Some(code),
            _ => None,
        };
        let mut outputs = json!({
            "exit_code": exit_code,
            "stdout": out.text,
            "stderr": err.text,
        });
        if out.truncated || err.truncated {
            outputs["truncated"] = json!({ "stdout": out.truncated, "stderr": err.truncated });
        }
        for (key, lossy) in [("stdout_lossy", out.lossy), ("stderr_lossy", err.lossy)] {
            if lossy {
                outputs[key] = json!(true);
            }
        }
        let artifacts = [("stdout", out.artifact), ("stderr", err.artifact)]
            .into_iter()
            .filter_map(|(role, artifact)| Some((role, artifact?)))
            .collect();
        let (state, error) = match (exit, parsed) {
            (Exit::Code(0), None) => (NodeState::Succeeded, None),
            (Exit::Code(0), Some(Ok(parsed))) => {
                outputs["json"] = parsed;
                (NodeState::Succeeded, None)
            }
            (Exit::Code(0), Some(Err(error))) => (NodeState::Failed, Some(error)),
            (Exit::Code(code), _) => (NodeState::Failed, Some(format!("exited with code {code}"))),
            (Exit::Signal(signal), _) => (
                NodeState::Failed,
                Some(format!("killed by signal {signal}")),
            ),
            (Exit::Cancelled, _) => (NodeState::Cancelled, None),
        };
        NodeOutcome {
            state,
            exit_code,
            outputs,
            artifacts,
            error,
        }
    }
}
