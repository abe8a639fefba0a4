//! `exec`: run a command, as an argv array (`run`) or a shell string (`shell`).
//!
//! Argv elements are rendered one by one, so a value stays one argument whatever it contains.
//! In a `shell` string every interpolated value is shell-quoted. The child gets a minimal
//! environment plus what the node declares, unless it asks to inherit kavi's.

use std::io::Read;
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::{Value, json};
use toml::Spanned;

use super::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::diagnostic::Diagnostic;
use crate::process::{self, CommandSpec, Exit};
use crate::state::NodeState;
use crate::template::describe_error;

pub const KIND: NodeKind = NodeKind {
    name: "exec",
    parse,
};

/// Variables passed through from kavi's own environment even when `inherit_env` is off: what
/// ordinary tools need to find programs and behave, and nothing that tends to hold secrets.
const BASE_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR", "TZ",
];

/// How much of stdout and stderr is kept in the node's JSON outputs; the whole of each is an
/// artifact.
const OUTPUT_TEXT_LIMIT: u64 = 64 * 1024;

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
            config.check_template(&shell)?;
            Program::Shell(shell.into_inner())
        }
        (Some(run), Some(_)) => {
            return Err(config
                .error("an exec node takes `run` or `shell`, not both", run.span())
                .with_help("`run` is an argv array; `shell` is one string given to `sh -c`"));
        }
        (None, None) => {
            let span = config.table.as_ref().map_or(0..0, Spanned::span);
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
            Program::Shell(line) => {
                let line = ctx
                    .templates
                    .render_shell(line, ctx.vars)
                    .map_err(|e| format!("failed to render `shell`: {}", describe_error(&e)))?;
                ("sh".to_owned(), vec!["-c".to_owned(), line])
            }
        };
        let mut env: Vec<(String, String)> = if self.inherit_env {
            std::env::vars().collect()
        } else {
            BASE_ENV
                .iter()
                .filter_map(|key| std::env::var(key).ok().map(|v| ((*key).to_owned(), v)))
                .collect()
        };
        env.push(("KAVI_RUN_ID".into(), ctx.run_id.to_string()));
        env.push(("KAVI_NODE_ID".into(), ctx.node_id.to_owned()));
        env.push(("KAVI_WORKSPACE".into(), ctx.workspace.display().to_string()));
        for (key, value) in &self.env {
            env.push((key.clone(), ctx.render(&format!("env.{key}"), value)?));
        }
        let cwd = match &self.cwd {
            None => ctx.workspace.to_owned(),
            Some(cwd) => ctx.workspace.join(ctx.render("cwd", cwd)?),
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
        })
    }
}

/// Reads up to `limit` bytes of a file as text, noting whether it was cut.
fn read_prefix(path: &std::path::Path, limit: u64) -> std::io::Result<(String, bool)> {
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok((String::from_utf8_lossy(&bytes).into_owned(), size > limit))
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
        let files = ctx.artifacts.temp_file().and_then(|out| {
            let err = ctx.artifacts.temp_file()?;
            Ok((out, err))
        });
        let (stdout, stderr) = match files {
            Ok(files) => files,
            Err(e) => return NodeOutcome::failed(format!("failed to create output files: {e}")),
        };
        let handles = stdout
            .as_file()
            .try_clone()
            .and_then(|out| Ok((out, stderr.as_file().try_clone()?)));
        let exit = match handles {
            Ok((out, err)) => process::run(&spec, out, err, &ctx.cancel).await,
            Err(e) => Err(e),
        };
        let exit = match exit {
            Ok(exit) => exit,
            Err(e) => {
                return NodeOutcome::failed(format!("failed to start `{}`: {e}", spec.program));
            }
        };

        let texts = read_prefix(stdout.path(), OUTPUT_TEXT_LIMIT)
            .and_then(|out| Ok((out, read_prefix(stderr.path(), OUTPUT_TEXT_LIMIT)?)));
        let stored = ctx.artifacts.put_file("STDOUT", stdout).and_then(|out| {
            Ok(vec![
                ("stdout", out),
                ("stderr", ctx.artifacts.put_file("STDERR", stderr)?),
            ])
        });
        let (((stdout_text, stdout_cut), (stderr_text, stderr_cut)), artifacts) =
            match texts.and_then(|t| Ok((t, stored?))) {
                Ok(both) => both,
                Err(e) => return NodeOutcome::failed(format!("failed to store output: {e}")),
            };

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
