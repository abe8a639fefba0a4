//! Asking a running `kavi executor` to run a skill in a sandbox it started ahead: the request,
//! its answer, and the socket they go over. Every caller that runs skills (`kavi skill run`,
//! `kavi mcp`, `kavi chat`, chains) asks through [`ask`], and runs the skill itself when no
//! record comes back.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use super::Lineage;
use crate::ledger::ExecutionRecord;

/// The executor's socket for the ledger at `ledger`: in the ledger's locks folder, which every
/// confined view and the builder's sandbox hide.
pub fn socket(ledger: &Path) -> PathBuf {
    crate::ledger::locks_dir(ledger).join("executor.sock")
}

/// Who asks: the caller's workspace and the settings a skill's run goes by there. An executor
/// serves only a caller whose are its own, so a workspace that shares another's ledger (and so
/// its socket) never runs in that one's folder under its rules, and a caller's shorter
/// `skill_timeout` is never traded for the executor's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    pub root: PathBuf,
    pub timeout_ms: u128,
    pub executions_log: Option<PathBuf>,
}

impl Caller {
    pub fn new(root: &Path, timeout: std::time::Duration, log: Option<&Path>) -> Self {
        Self {
            root: root.to_owned(),
            timeout_ms: timeout.as_millis(),
            executions_log: log.map(Path::to_owned),
        }
    }
}

/// One request: a line of JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// Required: a request that does not say who asks is not served.
    pub caller: Caller,
    pub skill: String,
    pub input: Value,
    /// Where the run sits, recorded as a direct run records it.
    #[serde(default)]
    pub lineage: Lineage,
    /// The trusted hash the caller checked, when it checked one: a run of any other hash is
    /// not served (the caller runs it itself, and its own trust check decides).
    #[serde(default)]
    pub hash: Option<String>,
}

/// The answer: the record of the run, or none when the executor did not run it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Reply {
    pub record: Option<ExecutionRecord>,
    /// Said when the adopted rules governed the run in place of files on disk that weaken
    /// them, as a direct run says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// What became of a request.
#[derive(Debug)]
pub enum Answer {
    /// The executor ran it: its record, and what it warned of.
    Ran(Box<Ran>),
    /// None answers, or the one that did ran nothing: the caller runs the skill itself.
    Unserved,
    /// Whoever answers is not an executor of this account's (or root's): it was sent nothing,
    /// for the reason given, and the caller runs the skill itself.
    Unvouched(String),
}

/// A run the executor made.
#[derive(Debug)]
pub struct Ran {
    pub record: ExecutionRecord,
    pub warning: Option<String>,
}

/// Asks the executor of the ledger at `ledger` to run `request`. `cancel` stops the run: the
/// request's side of the connection is closed, the executor stops the skill and answers with
/// the record of the cancelled run.
pub async fn ask(ledger: &Path, request: &Request, cancel: &CancellationToken) -> Answer {
    let path = socket(ledger);
    let Ok(stream) = UnixStream::connect(&path).await else {
        return Answer::Unserved;
    };
    // Whoever can make the socket can listen on it: only an executor of this account (or
    // root's) is sent the skill's input or believed.
    let me = nix::unistd::getuid().as_raw();
    match stream.peer_cred().map(|peer| peer.uid()) {
        Ok(uid) if uid == me || uid == 0 => {}
        answered => {
            return Answer::Unvouched(format!(
                "not asking the executor at {}: {}",
                path.display(),
                answered.map_or_else(
                    |e| format!("its account cannot be told ({e})"),
                    |uid| format!("it runs as another account (uid {uid})")
                )
            ));
        }
    }
    match exchange(stream, request, cancel).await {
        Some(Reply {
            record: Some(record),
            warning,
        }) => Answer::Ran(Box::new(Ran { record, warning })),
        _ => Answer::Unserved,
    }
}

/// Sends the request's line and reads the reply's.
async fn exchange(
    stream: UnixStream,
    request: &Request,
    cancel: &CancellationToken,
) -> Option<Reply> {
    let (reader, mut writer) = stream.into_split();
    let mut line = serde_json::to_vec(request).ok()?;
    line.push(b'\n');
    writer.write_all(&line).await.ok()?;
    let mut reader = BufReader::new(reader);
    let mut reply = String::new();
    tokio::select! {
        read = reader.read_line(&mut reply) => { read.ok()?; }
        () = cancel.cancelled() => {
            // The executor takes the end of the request as the caller gone.
            let _ = writer.shutdown().await;
            reader.read_line(&mut reply).await.ok()?;
        }
    }
    serde_json::from_str(&reply).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_without_lineage_or_hash_is_read_as_a_plain_run() {
        let caller = r#""caller": {"root": "/w", "timeout_ms": 60000, "executions_log": null}"#;
        let request: Request = serde_json::from_str(&format!(
            r#"{{{caller}, "skill": "demo", "input": {{"x": 1}}}}"#
        ))
        .unwrap();
        assert_eq!(
            request.caller,
            Caller::new(Path::new("/w"), std::time::Duration::from_secs(60), None)
        );
        // One that does not say who asks is not read, so not served.
        assert!(
            serde_json::from_str::<Request>(r#"{"skill": "demo", "input": {"x": 1}}"#).is_err()
        );
        assert_eq!(request.skill, "demo");
        assert_eq!(request.hash, None);
        assert_eq!(request.lineage.caller, None);
    }

    #[test]
    fn a_reply_without_a_warning_is_read_as_one_with_none() {
        let reply: Reply = serde_json::from_str(r#"{"record": null}"#).unwrap();
        assert!(reply.record.is_none() && reply.warning.is_none());
        assert_eq!(
            serde_json::to_string(&Reply::default()).unwrap(),
            r#"{"record":null}"#
        );
    }
}
