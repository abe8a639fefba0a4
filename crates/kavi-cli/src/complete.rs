//! Dynamic completion: a shell asks `COMPLETE=bash kavi -- <words>` for the values of the word
//! under the cursor, and values that name something in a workspace (a pipeline, a chain, a node,
//! a skill, a run) are read from the workspace the line would run in. What names exist is the
//! binary's to say ([`Source`]); which argument takes which names is said here, beside the
//! arguments.

use std::ffi::{OsStr, OsString};
use std::sync::OnceLock;

use clap::CommandFactory;
use clap_complete::engine::{ArgValueCompleter, CompletionCandidate};
use clap_complete::env::{CompleteEnv, Shells};

use crate::Cli;

/// What a value on the command line names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// A pipeline file of the workspace's `pipelines/`.
    Pipeline,
    /// A chain file of `chains/`.
    Chain,
    /// A skill.
    Skill,
    /// A recorded run.
    Run,
    /// A node of the pipeline the line names.
    PipelineNode,
    /// A node of the run the line names.
    RunNode,
}

/// What the words before the one being completed said: the workspace, and the pipeline file
/// and run they named, where the command takes one.
#[derive(Clone, Debug, Default)]
pub struct Line {
    pub workspace: Option<std::path::PathBuf>,
    pub file: Option<String>,
    pub run: Option<String>,
}

/// The names of a kind a line can take, each with a one-line description when there is one.
pub type Source = fn(Names, &Line) -> Vec<(String, Option<String>)>;

static SOURCE: OnceLock<(Source, Line)> = OnceLock::new();

/// When a shell asks for completions (`COMPLETE` is set), answers from `source` and ends the
/// process; otherwise returns at once. Call it first thing, before any thread starts.
pub fn complete_if_asked(source: Source) {
    if std::env::var_os("COMPLETE").is_none_or(|shell| shell.is_empty() || shell == "0") {
        return;
    }
    let words: Vec<OsString> = std::env::args_os()
        .skip_while(|a| a != "--")
        .skip(1)
        .collect();
    // Bash says which word the cursor is in; the other shells complete the last.
    let cursor = std::env::var("_CLAP_COMPLETE_INDEX")
        .ok()
        .and_then(|i| i.parse::<usize>().ok())
        .unwrap_or(words.len().saturating_sub(1));
    let _ = SOURCE.set((source, line_before_cursor(&words, cursor)));
    CompleteEnv::with_factory(Cli::command).complete();
}

/// Writes the script that registers kavi's dynamic completion with `shell`; it calls the `kavi`
/// on the shell's PATH for every completion.
pub fn write_registration(
    shell: clap_complete::Shell,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let name = shell.to_string();
    let shells = Shells::builtins();
    let completer = shells
        .completer(&name)
        .ok_or_else(|| std::io::Error::other(format!("no dynamic completion for {name}")))?;
    completer.write_registration("COMPLETE", "kavi", "kavi", "kavi", out)
}

/// Parses the words before the cursor (`words[0]` is `kavi`) as far as they go (a line being
/// typed is incomplete) for the workspace, pipeline file and run they name.
fn line_before_cursor(words: &[OsString], cursor: usize) -> Line {
    let before = &words[..cursor.min(words.len())];
    let Ok(matches) = Cli::command()
        .ignore_errors(true)
        .try_get_matches_from(before)
    else {
        return Line::default();
    };
    let mut line = Line {
        workspace: raw(&matches, "workspace").map(Into::into),
        ..Line::default()
    };
    let mut deepest = &matches;
    while let Some((_, sub)) = deepest.subcommand() {
        deepest = sub;
    }
    line.file = raw(deepest, "file").map(|f| f.to_string_lossy().into_owned());
    line.run = raw(deepest, "run").map(|r| r.to_string_lossy().into_owned());
    line
}

fn raw<'a>(matches: &'a clap::ArgMatches, id: &str) -> Option<&'a OsStr> {
    matches.try_get_raw(id).ok().flatten()?.next()
}

/// The completer of an argument that takes names of `kind`.
pub fn names(kind: Names) -> ArgValueCompleter {
    ArgValueCompleter::new(move |current: &OsStr| {
        let Some((source, line)) = SOURCE.get() else {
            return Vec::new();
        };
        let current = current.to_string_lossy();
        source(kind, line)
            .into_iter()
            .filter(|(name, _)| name.starts_with(current.as_ref()))
            .map(|(name, help)| CompletionCandidate::new(name).help(help.map(Into::into)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(words: &[&str]) -> Line {
        let words: Vec<OsString> = ["kavi"].iter().chain(words).map(OsString::from).collect();
        line_before_cursor(&words, words.len() - 1)
    }

    #[test]
    fn the_line_names_its_pipeline_file_and_run_for_node_completion() {
        let run = line(&["pipeline", "run", "forge.toml", "--set", "skill=x", ""]);
        assert_eq!(run.file.as_deref(), Some("forge.toml"));
        let logs = line(&["--workspace", "/w", "runs", "logs", "12", "bu"]);
        assert_eq!(logs.run.as_deref(), Some("12"));
        assert_eq!(logs.workspace.as_deref(), Some(std::path::Path::new("/w")));
        let nothing = line(&["pipeline", "ru"]);
        assert!(nothing.file.is_none() && nothing.run.is_none());
    }
}
