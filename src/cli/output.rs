//! Human output: durations, tables, state marks.

use std::time::Duration;

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
        NodeState::Reused => "reused",
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
