//! `exec`: run a command, as an argv array (`run`) or a shell string (`shell`).
//!
//! Argv elements are rendered one by one, so a value stays one argument whatever it contains.
//! A `shell` string holds no template at all; values reach it through `env`. The child gets a minimal
//! environment plus what the node declares, unless it asks to inherit kavi's.

use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::{Value, json};
use toml::Spanned;

use super::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::diagnostic::Diagnostic;
use crate::ledger::Artifact;
use crate::process::{self, CaptureOptions, Captured, CommandSpec, Exit};
use crate::state::NodeState;

pub const KIND: NodeKind = NodeKind {
    name: "exec",
    parse,
};

/// How much of stdout and stderr is kept in the node's JSON outputs; the whole of each is an
/// artifact.
const OUTPUT_TEXT_LIMIT: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum StdoutFormat {
    #[default]
    Text,
    /// Parse stdout as JSON into `outputs.json`; invalid JSON fails the node.
    Json,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecConfig {
    run: Option<Spanned<Vec<Spanned<String>>>>,
    shell: Option<Spanned<String>>,
    #[serde(default)]
    env: IndexMap<String, Spanned<String>>,
    #[serde(default)]
    inherit_env: bool,
    cwd: Option<Spanned<String>>,
    stdin: Option<Spanned<String>>,
    #[serde(default)]
    stdout: StdoutFormat,
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
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: ExecConfig = config.deserialize()?;
    let program = match (raw.run, raw.shell) {
        (Some(run), None) => {
            if run.get_ref().is_empty() {
                return Err(config.error("`run` needs at least the program to run", run.span()));
            }
            for arg in run.get_ref() {
                config.check_template(arg)?;
            }
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
    for value in raw.env.values() {
        config.check_template(value)?;
    }
    for field in [&raw.cwd, &raw.stdin].into_iter().flatten() {
        config.check_template(field)?;
    }
    Ok(Arc::new(Exec {
        program,
        env: raw
            .env
            .into_iter()
            .map(|(k, v)| (k, v.into_inner()))
            .collect(),
        inherit_env: raw.inherit_env,
        cwd: raw.cwd.map(Spanned::into_inner),
        stdin: raw.stdin.map(Spanned::into_inner),
        stdout: raw.stdout,
    }))
}

impl Exec {
    fn resolve(&self, ctx: &NodeContext<'_>) -> Result<CommandSpec, String> {
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
        let cwd = match &self.cwd {
            None => ctx.env.workspace.to_path_buf(),
            Some(cwd) => ctx.env.workspace.join(ctx.render("cwd", cwd)?),
        };
        if !cwd.is_dir() {
            return Err(format!(
                "working directory {} does not exist",
                cwd.display()
            ));
        }
        let stdin = match &self.stdin {
            None => None,
            Some(stdin) => Some(ctx.render("stdin", stdin)?.into_bytes()),
        };
        Ok(CommandSpec {
            program,
            args,
            env,
            cwd,
            stdin,
            confinement: None,
        })
    }
}

/// Stores one captured stream as an artifact; returns it, its head as text, and whether the
/// head is only part of it.
fn store_output(
    ctx: &NodeContext<'_>,
    kind: &str,
    captured: Captured,
) -> std::io::Result<(Artifact, String, bool)> {
    let truncated = captured.truncated();
    let text = String::from_utf8_lossy(&captured.head).into_owned();
    let artifact = match captured.spill {
        Some(file) => ctx.env.artifacts.put_file(kind, file)?,
        None => ctx.env.artifacts.put_bytes(kind, &captured.head)?,
    };
    Ok((artifact, text, truncated))
}

#[async_trait::async_trait]
impl NodeAction for Exec {
    fn describe(&self) -> String {
        match &self.program {
            Program::Argv(argv) => shlex::try_join(argv.iter().map(String::as_str))
                .unwrap_or_else(|_| format!("{argv:?}")),
            Program::Shell(line) => format!("sh -c {}", shlex::try_quote(line).unwrap_or_default()),
        }
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        let spec = match self.resolve(ctx) {
            Ok(spec) => spec,
            Err(error) => return NodeOutcome::failed(error),
        };
        let options = CaptureOptions {
            limit: OUTPUT_TEXT_LIMIT,
            spill_dir: ctx.env.artifacts.temp_dir(),
        };
        let finished = match process::run(&spec, &options, &ctx.cancel).await {
            Ok(finished) => finished,
            Err(e) => {
                return NodeOutcome::failed(format!("failed to start `{}`: {e}", spec.program));
            }
        };
        let exit = finished.exit;
        let stored = store_output(ctx, "STDOUT", finished.stdout)
            .and_then(|out| Ok((out, store_output(ctx, "STDERR", finished.stderr)?)));
        let (
            (stdout_artifact, stdout_text, stdout_cut),
            (stderr_artifact, stderr_text, stderr_cut),
        ) = match stored {
            Ok(stored) => stored,
            Err(e) => return NodeOutcome::failed(format!("failed to store output: {e}")),
        };
        let artifacts = vec![("stdout", stdout_artifact), ("stderr", stderr_artifact)];

        let exit_code = match exit {
            Exit::Code(code) => Some(code),
            _ => None,
        };
        let mut outputs = json!({
            "exit_code": exit_code,
            "stdout": stdout_text,
            "stderr": stderr_text,
        });
        if stdout_cut || stderr_cut {
            outputs["truncated"] = json!({ "stdout": stdout_cut, "stderr": stderr_cut });
        }
        let (state, error) = match exit {
            Exit::Code(0) => match self.stdout {
                StdoutFormat::Text => (NodeState::Succeeded, None),
                StdoutFormat::Json => match serde_json::from_str::<Value>(&stdout_text) {
                    Ok(parsed) if !stdout_cut => {
                        outputs["json"] = parsed;
                        (NodeState::Succeeded, None)
                    }
                    Ok(_) => (
                        NodeState::Failed,
                        Some("stdout is too large to parse as JSON".into()),
                    ),
                    Err(e) => (
                        NodeState::Failed,
                        Some(format!("stdout is not valid JSON: {e}")),
                    ),
                },
            },
            Exit::Code(code) => (NodeState::Failed, Some(format!("exited with code {code}"))),
            Exit::Signal(signal) => (
                NodeState::Failed,
                Some(format!("killed by signal {signal}")),
            ),
            Exit::Cancelled => (NodeState::Cancelled, None),
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
