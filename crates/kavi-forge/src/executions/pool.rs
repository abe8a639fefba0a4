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

/// One request: a line of JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
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
#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    pub record: Option<ExecutionRecord>,
}

/// Asks the executor at `socket` to run `request`: the record it made, or `None` when none
/// answers or it did not run the skill (the caller runs it itself then). `cancel` stops the
/// run: the request's side of the connection is closed, the executor stops the skill and
/// answers with the record of the cancelled run.
pub async fn ask(
    socket: &Path,
    request: &Request,
    cancel: &CancellationToken,
) -> Option<ExecutionRecord> {
    let stream = UnixStream::connect(socket).await.ok()?;
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
    serde_json::from_str::<Reply>(&reply).ok()?.record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_without_lineage_or_hash_is_read_as_a_plain_run() {
        let request: Request =
            serde_json::from_str(r#"{"skill": "demo", "input": {"x": 1}}"#).unwrap();
        assert_eq!(request.skill, "demo");
        assert_eq!(request.hash, None);
        assert_eq!(request.lineage.caller, None);
    }
}
