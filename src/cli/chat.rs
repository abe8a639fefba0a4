//! `kavi chat -m MESSAGE` (one message) and `kavi chat` (a session read line by line from
//! stdin): see [`crate::chat`].

use std::io::{BufRead, IsTerminal, Write};
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
    let source = super::read_policy(workspace, intents::DEFAULT_POLICY)?;
    let policy = ChatPolicy::parse(&source).map_err(SpecError::from)?;
    let env = SkillEnv::load(workspace)?;
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
        let source = super::read_policy(workspace, network::DEFAULT_POLICY)?;
        Some(NetworkPolicy::parse(&source).map_err(SpecError::from)?)
    } else {
        None
    };
    let mut session = Session::new(&policy, &runner, &env.templates, &load_chain);
    session.llm = network.as_ref().map(|network| LlmParser {
        gateway: &workspace.config.gateway,
        network,
    });
    let cancel = super::cancel_on_signals("the chat");
    if let Some(message) = message {
        let answer = session.message(message, confirmed, &cancel).await;
        print(&answer, json, true);
        return Ok(exit_code(&answer));
    }
    // The session: one line, one message; `yes` runs a plan that waits for it, `no` drops it.
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!(
                "{}",
                if session.has_stashed_plan() {
                    "yes/no> "
                } else {
                    "> "
                }
            );
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|source| Error::Io {
            context: "failed to read the chat's input".into(),
            source,
        })?;
        let words = line.trim().to_lowercase();
        if words.is_empty() {
            continue;
        }
        if matches!(words.as_str(), "exit" | "quit") {
            break;
        }
        let answer = match words.as_str() {
            "yes" | "y" if session.has_stashed_plan() => session.confirm(&line, &cancel).await,
            "no" | "n" if session.has_stashed_plan() => session.decline(&line),
            _ => session.message(&line, false, &cancel).await,
        };
        print(&answer, json, false);
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
