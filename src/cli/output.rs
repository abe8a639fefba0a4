//! Human output: durations, tables, state marks.

use std::borrow::Cow;
use std::time::Duration;

use crate::state::NodeState;

/// `bytes` made safe to show on a terminal: every control character but tab and newline (the
/// escape that starts a sequence setting the window title or the clipboard, a carriage return
/// that overwrites a line, and the C1 controls UTF-8 can carry) in caret notation (`^[`), so
/// that what a builder or a skill printed is read, never obeyed, by the terminal.
pub fn terminal_safe(bytes: &[u8]) -> Cow<'_, [u8]> {
    let control = |b: u8| (b < 0x20 && b != b'\t' && b != b'\n') || b == 0x7f;
    let c1 = |pair: &[u8]| pair[0] == 0xc2 && (0x80..=0x9f).contains(&pair[1]);
    if !bytes.iter().copied().any(control) && !bytes.windows(2).any(c1) {
        return Cow::Borrowed(bytes);
    }
    let mut safe = Vec::with_capacity(bytes.len() + 8);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if control(b) {
            safe.extend_from_slice(&[b'^', b ^ 0x40]);
        } else if i + 1 < bytes.len() && c1(&bytes[i..i + 2]) {
            safe.extend_from_slice(format!("\\x{:02x}", bytes[i + 1]).as_bytes());
            i += 1;
        } else {
            safe.push(b);
        }
        i += 1;
    }
    Cow::Owned(safe)
}

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

pub use crate::hash::short_hash;

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
    // Written into one string, padded by hand and made at its size: `plan` of 10,000 nodes made
    // a string per cell and one per line.
    let line_width: usize = widths.iter().map(|w| w + 2).sum::<usize>() + 1;
    let mut out = String::with_capacity(rows.len() * line_width);
    for row in rows {
        let line = out.len();
        for (c, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if c + 1 < row.len() {
                let pad = widths[c].saturating_sub(cell.chars().count()) + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        let kept = out[line..].trim_end().len();
        out.truncate(line + kept);
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

#[cfg(test)]
mod tests {
    use super::table;

    #[test]
    fn a_table_pads_each_column_to_its_widest_cell_in_characters_and_trims_each_line() {
        let rows = vec![
            vec!["  née".to_owned(), "exec".to_owned(), "true".to_owned()],
            vec!["  b".to_owned(), "http".to_owned(), String::new()],
            vec!["  ccccc".to_owned(), "x".to_owned(), "last".to_owned()],
        ];
        assert_eq!(
            table(&rows),
            "  née    exec  true\n  b      http\n  ccccc  x     last\n"
        );
        assert_eq!(table(&[]), "");
    }
}

#[cfg(test)]
mod terminal_tests {
    use super::terminal_safe;

    #[test]
    fn escapes_and_c1_controls_are_shown_not_obeyed() {
        let printed = b"title\x1b]0;pwned\x07 clip\x1b]52;c;ZQ==\x07 csi\xc2\x9b2J ok\tdone\n";
        let safe = terminal_safe(printed);
        assert_eq!(
            String::from_utf8_lossy(&safe),
            "title^[]0;pwned^G clip^[]52;c;ZQ==^G csi\\x9b2J ok\tdone\n"
        );
        assert!(matches!(
            terminal_safe(b"plain text\n"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(&*terminal_safe("é ü".as_bytes()), "é ü".as_bytes());
    }
}
