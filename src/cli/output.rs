//! Human output: durations, tables, and the console observer that prints node progress.

use std::io::Write;
use std::time::Duration;

use crate::executor::{Event, Observer};
use crate::state::NodeState;

pub fn duration_ms(ms: i64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.2}s", ms as f64 / 1000.0)
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

pub fn duration(d: Duration) -> String {
    duration_ms(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `1 node`, `3 nodes`.
pub fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

pub use crate::ledger::short_hash;

/// An error on one line: its first line and, for a longer text (a traceback), its last.
pub fn one_line(error: &str) -> String {
    let lines: Vec<&str> = error.lines().filter(|l| !l.trim().is_empty()).collect();
    match lines.as_slice() {
        [] => String::new(),
        [only] => (*only).to_owned(),
        [first, .., last] => format!("{first} … {}", last.trim()),
    }
}

/// Prints rows with columns padded to the widest cell.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A mark that makes each state distinct at a glance; a skipped node never looks passed.
pub fn mark(state: NodeState) -> &'static str {
    match state {
        NodeState::Succeeded => "ok",
        NodeState::Cached => "cached",
        NodeState::Skipped => "skip",
        NodeState::Failed => "FAIL",
        NodeState::TimedOut => "TIME",
        NodeState::Blocked => "BLOCK",
        NodeState::Cancelled => "CANCEL",
        NodeState::Interrupted => "INTR",
        NodeState::AwaitingReview => "REVIEW",
        NodeState::Pending | NodeState::Running => "..",
    }
}

/// How many lines of a failed node's stderr the console shows; the whole is an artifact.
const STDERR_TAIL_LINES: usize = 5;

fn last_lines(text: &str, n: usize) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

/// Prints one line per finished node to stdout, as it happens. A child run (a `pipeline` node's)
/// is indented under the node that started it.
#[derive(Debug, Clone, Copy)]
pub struct Console {
    pub quiet: bool,
    pub depth: usize,
}

impl Observer for Console {
    fn event(&mut self, event: &Event<'_>) {
        if self.quiet {
            return;
        }
        let indent = "    ".repeat(self.depth);
        let mut out = std::io::stdout().lock();
        let _ = match event {
            Event::RunStarted {
                run_id,
                pipeline,
                spec_hash,
                nodes,
            } => writeln!(
                out,
                "{indent}run {run_id}: {pipeline} ({}, spec {})",
                plural(*nodes, "node"),
                short_hash(spec_hash)
            ),
            Event::NodeStarted { .. } => Ok(()),
            Event::NodeFinished {
                node,
                attempt,
                state,
                duration: took,
                detail,
                outputs,
                will_retry,
            } => {
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
                writeln!(out, "{line}")
            }
        };
    }
}
