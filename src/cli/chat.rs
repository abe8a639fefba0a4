//! `kavi chat -m MESSAGE` (one message) and `kavi chat` (a session read line by line from
//! stdin): see [`crate::chat`].

use std::io::{BufRead, IsTerminal};
use std::path::Path;

use super::skills::SkillEnv;
use crate::chains::Chain;
use crate::chat::llm::LlmParser;
use crate::chat::{self, Answer, ChatPolicy, Session, Status, intents};
use crate::config::Workspace;
use crate::confinement::network::{self, NetworkPolicy};
use crate::error::{Error, exit};
use crate::spec::SpecError;

/// What the answer to a single message means as an exit code (docs/exit-codes.md).
fn exit_code(answer: &Answer) -> i32 {
    match answer.status {
        Status::Executed | Status::Help | Status::Declined => exit::SUCCESS,
        Status::Failed => exit::RUN_FAILED,
        Status::NeedsConfirmation
        | Status::Refused
        | Status::Unsupported
        | Status::NeedsClarification
        | Status::Expired => exit::USAGE,
    }
}

fn print(answer: &Answer, json: bool, pretty: bool) {
    if json {
        outln!("{}", chat::to_json(answer, pretty));
    } else {
        outln!("{}", chat::describe(answer));
    }
}

pub async fn run(
    workspace: &Workspace,
    message: Option<&str>,
    confirmed: bool,
    json: bool,
) -> Result<i32, Error> {
    let env = SkillEnv::load(workspace)?;
    let source = kavi_governance::run_policy(&env.rules, intents::DEFAULT_POLICY)?;
    let policy = ChatPolicy::parse(&source).map_err(SpecError::from)?;
    let runner = env.runner(workspace, true);
    let load_chain = |name: &str| -> Result<Chain, String> {
        let path = crate::spec::resolve_spec_path(&workspace.root, "chains", "chain", name)
            .map_err(|e| e.to_string())?;
        let display = path
            .strip_prefix(&workspace.root)
            .map_or_else(|_| path.clone(), Path::to_path_buf);
        crate::chains::load(&path, &display, &env.templates).map_err(|e| e.to_string())
    };
    // With a gateway configured, the model parses first (and the patterns when it fails).
    let network = if crate::research::gateway::configured(&workspace.config.gateway) {
        let source = kavi_governance::run_policy(&env.rules, network::DEFAULT_POLICY)?;
        Some(NetworkPolicy::parse(&source).map_err(SpecError::from)?)
    } else {
        None
    };
    let mut session = Session::new(&policy, &runner, &env.templates, &load_chain);
    session.llm = network.as_ref().map(|network| LlmParser {
        gateway: &workspace.config.gateway,
        network,
    });
    if let Some(message) = message {
        let cancel = super::cancel_on_signals("the chat");
        let answer = session.message(message, confirmed, &cancel).await;
        print(&answer, json, true);
        return Ok(exit_code(&answer));
    }
    if std::io::stdin().is_terminal() {
        return on_a_terminal(&mut session, json).await;
    }
    // The session: one line, one message; `yes` runs a plan that waits for it, `no` drops it.
    let cancel = super::cancel_on_signals("the chat");
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|source| Error::Io {
            context: "failed to read the chat's input".into(),
            source,
        })?;
        if !reply(&mut session, &line, json, &cancel).await {
            break;
        }
        if cancel.is_cancelled() {
            break;
        }
    }
    // A session's answers carry their own status; the session itself succeeded.
    Ok(if cancel.is_cancelled() {
        super::cancelled_exit_code()
    } else {
        exit::SUCCESS
    })
}

/// Answers one line of a session; false when it ends the session.
async fn reply(
    session: &mut Session<'_>,
    line: &str,
    json: bool,
    cancel: &tokio_util::sync::CancellationToken,
) -> bool {
    let words = line.trim().to_lowercase();
    if words.is_empty() {
        return true;
    }
    if matches!(words.as_str(), "exit" | "quit") {
        return false;
    }
    let answer = match words.as_str() {
        "yes" | "y" if session.has_stashed_plan() => session.confirm(line, cancel).await,
        "no" | "n" if session.has_stashed_plan() => session.decline(line),
        _ => session.message(line, false, cancel).await,
    };
    print(&answer, json, false);
    true
}

/// The session on a terminal, through a line editor (history, editing). The line is read on a
/// thread of its own, so that the runtime stays free: Ctrl-C at the prompt clears the line,
/// Ctrl-C while a message runs cancels that run only (its record says so) and the session goes
/// on, and Ctrl-D (or `exit`) ends it.
async fn on_a_terminal(session: &mut Session<'_>, json: bool) -> Result<i32, Error> {
    let failed = |e: rustyline::error::ReadlineError| Error::Io {
        context: "failed to read the chat's input".into(),
        source: std::io::Error::other(e),
    };
    let mut editor = rustyline::DefaultEditor::new().map_err(failed)?;
    loop {
        let prompt = if session.has_stashed_plan() {
            "yes/no> "
        } else {
            "> "
        };
        let (back, read) = tokio::task::spawn_blocking(move || {
            let read = editor.readline(prompt);
            (editor, read)
        })
        .await
        .map_err(|e| Error::Io {
            context: "failed to read the chat's input".into(),
            source: std::io::Error::other(e),
        })?;
        editor = back;
        let line = match read {
            Ok(line) => line,
            // The editor has the terminal then, so Ctrl-C is a key, not a signal.
            Err(rustyline::error::ReadlineError::Interrupted) => continue,
            Err(rustyline::error::ReadlineError::Eof) => break,
            Err(e) => return Err(failed(e)),
        };
        let _ = editor.add_history_entry(line.as_str());
        // While a message runs, Ctrl-C is a signal again, and it stops that run only.
        let cancel = tokio_util::sync::CancellationToken::new();
        let on_interrupt = cancel.clone();
        let interrupt = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                errln!("cancelling this message's run (Ctrl-D ends the chat)");
                on_interrupt.cancel();
            }
        });
        let more = reply(session, &line, json, &cancel).await;
        interrupt.abort();
        if !more {
            break;
        }
    }
    Ok(exit::SUCCESS)
}
