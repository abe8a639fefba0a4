//! What a run shows while it runs, on stderr as cargo shows its progress: stdout keeps the
//! command's result (the run's summary), so `kavi pipeline run X > result` holds only that.
//!
//! Off a terminal (a log, CI, a pipe), one line per change of state: a node started, a node
//! finished. On a terminal, finished nodes print the same way, and below them a live line per
//! running node counts its time (indicatif, drawn on stderr as cargo draws its bars). `-q` shows
//! none of it. With `--stream`, every line a node's processes write is printed as it comes, after
//! the node's id, on the stream it was written to.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::output::{duration, mark, plural, short_hash};
use crate::executor::{Event, Observer};
use crate::node::LiveNodeOutput;
use crate::process::Stream;
use crate::state::NodeState;

/// How many lines of a failed node's stderr the console shows; the whole is an artifact.
const STDERR_TAIL_LINES: usize = 5;

/// Set by `-q`: runs show no progress, only their result.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Hides the progress of every run this command makes (`-q`).
pub fn hide_progress() {
    QUIET.store(true, Ordering::Relaxed);
}

/// Prints a line of progress to stderr, unless `-q` hides it: what a command says it is about to
/// do, kept apart from its result on stdout (the plan a resumed run follows, "resuming run 4").
pub fn note(args: std::fmt::Arguments<'_>) {
    if !QUIET.load(Ordering::Relaxed) {
        errln!("{args}");
    }
}

/// Where a run's lines go: straight to stderr (or stdout), or around the live view.
pub struct Screen {
    live: Option<MultiProgress>,
    quiet: bool,
}

impl Screen {
    /// A live view only for a person at a terminal: stderr is one, and `TERM` is not `dumb`.
    pub fn new() -> Arc<Self> {
        let quiet = QUIET.load(Ordering::Relaxed);
        let terminal = !quiet
            && std::io::stderr().is_terminal()
            && std::env::var_os("TERM").is_none_or(|term| term != "dumb");
        Arc::new(Self {
            live: terminal.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
            quiet,
        })
    }

    /// Prints a line of progress to stderr, unless `-q` hides it.
    fn progress(&self, text: &str) {
        if !self.quiet {
            self.print(text, Stream::Stderr);
        }
    }

    /// Prints a line to stdout (or stderr), clearing the live view while it does.
    fn print(&self, text: &str, stream: Stream) {
        let write = || match stream {
            Stream::Stdout => outln!("{text}"),
            Stream::Stderr => errln!("{text}"),
        };
        match &self.live {
            Some(live) => live.suspend(write),
            None => write(),
        }
    }
}

/// Prints each line a node's processes write, after the node's id: stdout lines to stdout,
/// stderr lines to stderr.
pub struct StreamPrinter {
    pub screen: Arc<Screen>,
}

impl LiveNodeOutput for StreamPrinter {
    fn line(&self, node: &str, stream: Stream, text: &str) {
        // A node's output is shown, never obeyed: no escape sequence reaches the terminal.
        let text = super::output::terminal_safe(text.as_bytes());
        self.screen.print(
            &format!("{node} | {}", String::from_utf8_lossy(&text)),
            stream,
        );
    }
}

/// The observer of one run (a child run, a `pipeline` node's, is indented under its node).
pub struct Console {
    screen: Arc<Screen>,
    depth: usize,
    /// The live lines of running nodes, by node and attempt.
    running: HashMap<(String, u32), ProgressBar>,
}

impl Console {
    pub fn new(screen: Arc<Screen>, depth: usize) -> Self {
        Self {
            screen,
            depth,
            running: HashMap::new(),
        }
    }

    fn started(&mut self, node: &str, attempt: u32) {
        let indent = "    ".repeat(self.depth);
        let Some(live) = &self.screen.live else {
            let mut line = format!("{indent}  {:<6} {node}", mark(NodeState::Running));
            if attempt > 1 {
                line.push_str(&format!(" (attempt {attempt})"));
            }
            line.push_str(" started");
            self.screen.progress(&line);
            return;
        };
        let style = ProgressStyle::with_template("{spinner} {prefix} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        let prefix = match attempt {
            1 => format!("{indent}{node}"),
            _ => format!("{indent}{node} (attempt {attempt})"),
        };
        let bar = live.add(
            ProgressBar::new_spinner()
                .with_style(style)
                .with_prefix(prefix),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        self.running.insert((node.to_owned(), attempt), bar);
    }

    fn finished(&mut self, node: &str, attempt: u32) {
        if let Some(bar) = self.running.remove(&(node.to_owned(), attempt)) {
            bar.finish_and_clear();
            if let Some(live) = &self.screen.live {
                live.remove(&bar);
            }
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        // A run that stopped (Ctrl-C) leaves no spinner behind.
        for (_, bar) in self.running.drain() {
            bar.finish_and_clear();
        }
    }
}

impl Observer for Console {
    fn event(&mut self, event: &Event<'_>) {
        let indent = "    ".repeat(self.depth);
        match event {
            Event::RunStarted {
                run_id,
                pipeline,
                spec_hash,
                nodes,
            } => self.screen.progress(&format!(
                "{indent}run {run_id}: {pipeline} ({}, spec {})",
                plural(*nodes, "node"),
                short_hash(spec_hash)
            )),
            Event::NodeStarted { node, attempt } => self.started(node, *attempt),
            Event::NodeWaiting {
                node,
                attempt,
                why,
                cancelled,
            } => {
                for pid in *cancelled {
                    self.screen.progress(&format!(
                        "{indent}  {:<6} {node}: cancelling the run of kavi process {pid}",
                        mark(NodeState::Pending)
                    ));
                }
                let mut line = format!("{indent}  {:<6} {node}", mark(NodeState::Pending));
                if *attempt > 1 {
                    line.push_str(&format!(" (attempt {attempt})"));
                }
                line.push_str(&format!(" waits: {why}"));
                self.screen.progress(&line);
            }
            Event::NodeFinished {
                node,
                attempt,
                state,
                duration: took,
                detail,
                outputs,
                will_retry,
            } => {
                self.finished(node, *attempt);
                let mut line = format!("{indent}  {:<6} {node}", mark(*state));
                if *attempt > 1 {
                    line.push_str(&format!(" (attempt {attempt})"));
                }
                line.push_str(&format!(" {state}"));
                if let Some(took) = took {
                    line.push_str(&format!(" in {}", duration(*took)));
                }
                if let Some(detail) = detail {
                    // Later lines of a long detail sit under the node, not at the margin.
                    let under = format!("\n{indent}         ");
                    line.push_str(&format!(": {}", detail.replace('\n', &under)));
                }
                if *will_retry {
                    line.push_str(" (will retry)");
                }
                if matches!(state, NodeState::Failed | NodeState::TimedOut)
                    && let Some(stderr) = outputs.and_then(|o| o["stderr"].as_str())
                {
                    for tail in last_lines(stderr, STDERR_TAIL_LINES) {
                        line.push_str(&format!("\n{indent}         | {tail}"));
                    }
                }
                self.screen.progress(&line);
            }
        }
    }
}

/// Prints nothing: for `--json`, whose one output is the record at the end.
pub struct Silent;

impl Observer for Silent {
    fn event(&mut self, _: &Event<'_>) {}
}

fn last_lines(text: &str, n: usize) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}
