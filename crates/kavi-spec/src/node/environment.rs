//! What a node sees of the run it belongs to, and how a node starts a run of its own.
//!
//! The executor hands nodes an [`Environment`], and with it a [`ChildRuns`] to start child
//! runs through, so that no node kind imports the executor: the executor depends on the node
//! kinds, never the other way round.

use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::ledger::{ArtifactStore, Owner};
use crate::process::Stream;
use crate::redact::Redactor;
use crate::spec::Pipeline;
use crate::state::RunStatus;
use crate::template::TemplateEngine;

/// What the executor needs besides the DAG. Cloned for a child run (`pipeline` nodes).
#[derive(Clone)]
pub struct Environment {
    pub workspace: Arc<Path>,
    pub templates: Arc<TemplateEngine>,
    pub artifacts: ArtifactStore,
    /// The kavi process running this run: its runs, executions and process groups are its own.
    pub owner: Arc<Owner>,
    /// Where `sandbox` nodes create their copies.
    pub sandboxes: Arc<Path>,
    /// The ledger file, for kinds that record domain facts.
    pub ledger: Arc<Path>,
    /// kavi's own state (ledger, artifacts, locks), never copied into a sandbox and never
    /// holding or held by the sandbox folder.
    pub state_paths: Arc<[std::path::PathBuf]>,
    /// Exposed to templates as `config`.
    pub config: Value,
    pub jobs: usize,
    /// Whether nodes that declare their inputs may take an earlier run's result (`--no-cache`
    /// turns it off; their keys are recorded either way).
    pub use_cache: bool,
    /// How deeply this run is nested in `pipeline` nodes (0 for a run the user started).
    pub depth: usize,
    /// Starts the child runs of `pipeline` nodes.
    pub child_runs: Arc<dyn ChildRuns>,
    /// Where the toolchains gates run are, or are provisioned.
    pub toolchains: Arc<crate::config::ToolchainHome>,
    /// Who sees the output of the processes nodes start as it arrives (`--stream`), if anyone.
    pub live_output: Option<Arc<dyn LiveNodeOutput>>,
}

/// Sees the output of every process a node starts, line by line, as it arrives.
pub trait LiveNodeOutput: Send + Sync {
    fn line(&self, node: &str, stream: Stream, text: &str);
}

/// Cuts one process's output into lines for a [`LiveNodeOutput`], if anyone watches, and for
/// its [`LiveLog`], hiding the node's secrets line by line. What is left without a newline goes
/// out when the process's capture options are dropped, after it ended.
pub(super) struct LiveLines {
    pub node: String,
    pub watcher: Option<Arc<dyn LiveNodeOutput>>,
    pub log: LiveLog,
    pub redactor: Option<Redactor>,
    pub partial: Mutex<[Vec<u8>; 2]>,
}

/// The longest line [`LiveLines`] holds waiting for its newline: output that never ends a line
/// is shown in pieces of about this size, so kavi's memory and work stay linear in it.
const LONGEST_LIVE_LINE: usize = 64 * 1024;

impl LiveLines {
    pub fn push(&self, stream: Stream, chunk: &[u8]) {
        let mut partial = self.partial.lock().unwrap_or_else(PoisonError::into_inner);
        let buffer = &mut partial[stream as usize];
        let held = buffer.len();
        buffer.extend_from_slice(chunk);
        // Only the new bytes are searched: what was held has no newline.
        let cut = match chunk.iter().rposition(|b| *b == b'\n') {
            Some(last) => held + last + 1,
            None if buffer.len() > LONGEST_LIVE_LINE => self.piece(buffer),
            None => return,
        };
        if cut == 0 {
            return;
        }
        let mut lines: Vec<u8> = buffer.drain(..cut).collect();
        drop(partial);
        let forced = lines.last() != Some(&b'\n');
        if !forced {
            lines.pop();
        }
        // The chunk's lines go to the log in one write.
        let mut logged = Vec::with_capacity(lines.len());
        for line in lines.split(|b| *b == b'\n') {
            logged.extend_from_slice(self.emit(stream, line).as_bytes());
            logged.push(b'\n');
        }
        self.log.write(stream, &logged);
    }

    /// Where a line too long to hold is cut: not inside a secret that may still be completing.
    /// (A character cut in two shows as U+FFFD on each side.)
    fn piece(&self, held: &[u8]) -> usize {
        self.redactor
            .as_ref()
            .map_or(held.len(), |redactor| redactor.settled(held, false))
    }

    /// Shows `line` to the watcher, and returns it as shown, for the log.
    fn emit(&self, stream: Stream, line: &[u8]) -> String {
        let text = String::from_utf8_lossy(line);
        let mut text = match &self.redactor {
            Some(redactor) => redactor.text(&text),
            None => text.into_owned(),
        };
        text.truncate(text.trim_end_matches('\r').len());
        if let Some(watcher) = &self.watcher {
            watcher.line(&self.node, stream, &text);
        }
        text
    }
}

impl Drop for LiveLines {
    fn drop(&mut self) {
        let partial = std::mem::take(
            self.partial
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (stream, rest) in [Stream::Stdout, Stream::Stderr].into_iter().zip(partial) {
            if !rest.is_empty() {
                let text = self.emit(stream, &rest);
                self.log.write(stream, text.as_bytes());
            }
        }
    }
}

/// How much of each stream a [`LiveLog`] holds at most: enough to follow a long build's log,
/// while a process that prints without end (a builder's output is otherwise kept only up to its
/// head) cannot fill the disk through it.
const LIVE_LOG_LIMIT: u64 = 64 * 1024 * 1024;

/// The files a running process's output is written to as it comes, its secrets hidden, so that
/// `kavi runs logs` in another process can show it before the node ends (see
/// [`Owner::live_log`]). Made with the first line; removed once the process has ended, when what
/// it printed is the ledger's to keep (a reader that has a file open reads it to its end).
pub(super) struct LiveLog {
    paths: [PathBuf; 2],
    files: Mutex<[LiveFile; 2]>,
}

#[derive(Default)]
struct LiveFile {
    file: Option<File>,
    written: u64,
    /// It could not be made or written: the node runs on, without a live log of this stream.
    failed: bool,
}

impl LiveLog {
    pub fn new(owner: &Owner, run_id: i64, node: &str) -> Self {
        Self {
            paths: ["stdout", "stderr"].map(|stream| owner.live_log(run_id, node, stream)),
            files: Mutex::default(),
        }
    }

    fn write(&self, stream: Stream, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let live = &mut files[stream as usize];
        if live.failed || live.written >= LIVE_LOG_LIMIT {
            return;
        }
        let path = &self.paths[stream as usize];
        let room = usize::try_from(LIVE_LOG_LIMIT - live.written).unwrap_or(usize::MAX);
        let mut kept = bytes[..room.min(bytes.len())].to_vec();
        if kept.len() < bytes.len() {
            kept.extend_from_slice(
                b"\n[kavi: the live log stops here; `kavi runs logs` shows it all once the node \
                  has ended]\n",
            );
        }
        let written = match &mut live.file {
            Some(file) => file.write_all(&kept),
            None => open_live_log(path).and_then(|mut file| {
                file.write_all(&kept)?;
                live.file = Some(file);
                Ok(())
            }),
        };
        match written {
            Ok(()) => live.written += bytes.len().min(room) as u64,
            // A view for other processes, not the record: the node is not failed for it.
            Err(_) => live.failed = true,
        }
    }
}

fn open_live_log(path: &Path) -> std::io::Result<File> {
    if let Some(folder) = path.parent() {
        std::fs::create_dir_all(folder)?;
    }
    // What the node prints is closed to the accounts that may not write the folder, as the
    // record it ends up in is.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o666 & !kavi_foundation::sandbox::closed_bits(path))
        .open(path)
}

impl Drop for LiveLog {
    fn drop(&mut self) {
        let files = self.files.get_mut().unwrap_or_else(PoisonError::into_inner);
        for (live, path) in files.iter().zip(&self.paths) {
            if live.file.is_some() {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("workspace", &self.workspace)
            .field("depth", &self.depth)
            .finish_non_exhaustive()
    }
}

/// How a child run ended.
#[derive(Debug, Clone, Copy)]
pub struct ChildRun {
    pub run_id: i64,
    pub status: RunStatus,
}

/// Starts a run of `pipeline` as a child of `parent_run`, one level deeper than `env`, and
/// waits for it; `cancel` stops it.
#[async_trait::async_trait]
pub trait ChildRuns: Send + Sync {
    async fn run_child(
        &self,
        pipeline: &Pipeline,
        params: Map<String, Value>,
        env: &Environment,
        parent_run: i64,
        cancel: CancellationToken,
    ) -> Result<ChildRun, String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Watcher(Mutex<Vec<String>>);

    impl LiveNodeOutput for Watcher {
        fn line(&self, _node: &str, _stream: Stream, text: &str) {
            self.0.lock().unwrap().push(text.to_owned());
        }
    }

    /// What a running node prints is closed to the accounts that may not write its folder.
    #[test]
    fn a_live_log_is_closed_to_other_accounts() {
        use std::os::unix::fs::PermissionsExt as _;
        let folder = tempfile::tempdir().unwrap();
        std::fs::set_permissions(folder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = folder.path().join("live/1.a.stdout");
        open_live_log(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    /// Output that never ends a line is shown in pieces while kavi holds little of it, and a
    /// secret across a piece's edge is still hidden whole.
    #[test]
    fn a_line_without_end_goes_out_in_pieces_its_secrets_hidden() {
        let folder = tempfile::tempdir().unwrap();
        let secret = "sekrit-value-0123456789";
        let watcher = Arc::new(Watcher::default());
        let lines = LiveLines {
            node: "build".into(),
            watcher: Some(watcher.clone()),
            log: LiveLog {
                paths: ["out", "err"].map(|name| folder.path().join(name)),
                files: Mutex::default(),
            },
            redactor: Redactor::new(&[secret]).map(|r| r.line_wise()),
            partial: Mutex::default(),
        };
        // 1 MiB of `A`s with the secret every 9,999 bytes, in chunks of 4,093 bytes, so the
        // secret falls across chunk edges and piece edges alike.
        let mut printed = Vec::new();
        while printed.len() < 1 << 20 {
            printed.extend(std::iter::repeat_n(b'A', 9_999));
            printed.extend_from_slice(secret.as_bytes());
        }
        for chunk in printed.chunks(4_093) {
            lines.push(Stream::Stdout, chunk);
            let held = lines.partial.lock().unwrap()[Stream::Stdout as usize].len();
            assert!(held <= LONGEST_LIVE_LINE + 4_093, "holds {held} bytes");
        }
        // The live log holds what was shown so far, a piece a line (it goes once the process
        // has ended, with the rest shown).
        let logged = std::fs::read_to_string(folder.path().join("out")).unwrap();
        assert_eq!(logged, watcher.0.lock().unwrap().join("\n") + "\n");
        drop(lines);
        let shown = watcher.0.lock().unwrap().concat();
        let expected = String::from_utf8(printed)
            .unwrap()
            .replace(secret, crate::redact::REDACTED);
        assert!(!shown.contains("sekrit"));
        assert_eq!(shown, expected);
        assert!(watcher.0.lock().unwrap().len() > 10, "shown in pieces");
    }
}
