//! What a node sees of the run it belongs to, and how a node starts a run of its own.
//!
//! The executor hands nodes an [`Environment`], and with it a [`ChildRuns`] to start child
//! runs through, so that no node kind imports the executor: the executor depends on the node
//! kinds, never the other way round.

use std::path::Path;
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

/// Cuts one process's output into lines for a [`LiveNodeOutput`], hiding the node's secrets
/// line by line. What is left without a newline goes out when the process's capture options
/// are dropped, after it ended.
pub(super) struct LiveLines {
    pub node: String,
    pub watcher: Arc<dyn LiveNodeOutput>,
    pub redactor: Option<Redactor>,
    pub partial: Mutex<[Vec<u8>; 2]>,
}

impl LiveLines {
    pub fn push(&self, stream: Stream, chunk: &[u8]) {
        let mut partial = self.partial.lock().unwrap_or_else(PoisonError::into_inner);
        let buffer = &mut partial[stream as usize];
        buffer.extend_from_slice(chunk);
        let Some(last) = buffer.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        let lines: Vec<u8> = buffer.drain(..=last).collect();
        drop(partial);
        for line in lines[..lines.len() - 1].split(|b| *b == b'\n') {
            self.emit(stream, line);
        }
    }

    fn emit(&self, stream: Stream, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = match &self.redactor {
            Some(redactor) => redactor.text(&text),
            None => text.into_owned(),
        };
        self.watcher
            .line(&self.node, stream, text.trim_end_matches('\r'));
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
                self.emit(stream, &rest);
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
