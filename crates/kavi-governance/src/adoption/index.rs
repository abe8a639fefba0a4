//! Where kavi's keys folder remembers, per workspace, the ledger its rules were adopted in:
//! `ledgers/workspaces`, one `<workspace>\t<ledger>` line each, outside every workspace so that
//! no edit of one changes it.
//!
//! Both fields are encoded, so that a line is one workspace's and nothing in a path can make
//! another: a backslash is `\\`, and each control character (a tab or line break among them)
//! and each byte that is not UTF-8 is `\xNN`. A path with none of these is written as it is,
//! as earlier versions wrote it. A line that is not exactly what this writes is refused, with
//! the whole index: one path written raw by an older kavi could have made the line after it.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Path, PathBuf};

/// The index's file.
pub(super) fn file() -> PathBuf {
    crate::ledger::keys::dir()
        .join("ledgers")
        .join("workspaces")
}

/// How the index names a workspace: its canonical path.
pub(super) fn workspace_key(root: &Path) -> PathBuf {
    root.canonicalize().unwrap_or_else(|_| root.to_owned())
}

/// How the index names a ledger: a file's canonical path, a server's URL without its password.
pub(super) fn ledger_key(ledger: &Path) -> PathBuf {
    if crate::ledger::postgres_url(ledger).is_some() {
        return PathBuf::from(crate::ledger::canonical_location(ledger));
    }
    ledger.canonicalize().unwrap_or_else(|_| ledger.to_owned())
}

/// One field as the index writes it.
fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let escape = |out: &mut String, byte: u8| {
        let _ = write!(out, "\\x{byte:02x}");
    };
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else if c.is_control() {
                for byte in c.encode_utf8(&mut [0; 4]).bytes() {
                    escape(&mut out, byte);
                }
            } else {
                out.push(c);
            }
        }
        for &byte in chunk.invalid() {
            escape(&mut out, byte);
        }
    }
    out
}

/// One field's bytes, or why it is not one this index writes.
fn decode(field: &str) -> Result<Vec<u8>, &'static str> {
    if field.is_empty() {
        return Err("a field is empty");
    }
    if field.chars().any(char::is_control) {
        return Err("it holds a control character");
    }
    let mut out = Vec::with_capacity(field.len());
    let mut bytes = field.bytes();
    while let Some(byte) = bytes.next() {
        if byte != b'\\' {
            out.push(byte);
            continue;
        }
        match bytes.next() {
            Some(b'\\') => out.push(b'\\'),
            Some(b'x') => {
                let hex = [bytes.next(), bytes.next()];
                let digits = match hex {
                    [Some(a), Some(b)] => [a, b],
                    _ => return Err("an escape is cut short"),
                };
                let text = std::str::from_utf8(&digits).map_err(|_| "an escape is not hex")?;
                out.push(u8::from_str_radix(text, 16).map_err(|_| "an escape is not hex")?);
            }
            _ => return Err("a backslash starts no escape"),
        }
    }
    // One spelling per path: `\x41` for `A`, or a capital hex digit, is not one this writes.
    if encode(&out) != field {
        return Err("a field is not spelled as kavi spells it");
    }
    Ok(out)
}

/// The line remembering that `workspace`'s rules were adopted in `ledger`, with its line break.
fn line(workspace: &Path, ledger: &Path) -> String {
    format!(
        "{}\t{}\n",
        encode(workspace.as_os_str().as_bytes()),
        encode(ledger.as_os_str().as_bytes())
    )
}

/// One line's workspace and ledger, or why it is not a line this index writes.
fn parse(line: &str) -> Result<(PathBuf, PathBuf), &'static str> {
    let mut fields = line.split('\t');
    let (Some(workspace), Some(ledger), None) = (fields.next(), fields.next(), fields.next())
    else {
        return Err("it is not two fields split by one tab");
    };
    let workspace = PathBuf::from(OsString::from_vec(decode(workspace)?));
    if !workspace.is_absolute() {
        return Err("its workspace is not an absolute path");
    }
    let ledger = PathBuf::from(OsString::from_vec(decode(ledger)?));
    Ok((workspace, ledger))
}

/// Every line of an index's text, in order; an error naming the first that is not one this
/// index writes.
fn entries(text: &str) -> Result<Vec<(PathBuf, PathBuf)>, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("its last line is cut short (no line break ends it)".to_owned());
    }
    text.split_terminator('\n')
        .enumerate()
        .map(|(at, line)| parse(line).map_err(|why| format!("line {}: {why}", at + 1)))
        .collect()
}

/// The ledger the index remembers `workspace`'s rules were last adopted in, if any. An index
/// that cannot be read, or holds a line this does not write, is an error: which lines are
/// whose cannot be told, so no line is taken at its word.
pub(super) fn remembered(workspace: &Path) -> Result<Option<PathBuf>, String> {
    let file = file();
    let text = match std::fs::read(&file) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(format!(
                "kavi's index of the ledgers each workspace's rules were adopted in, {}, cannot \
                 be read ({e}), so it cannot tell which ledger this workspace's rules were \
                 adopted in",
                file.display()
            ));
        }
    };
    let malformed = |why: String| {
        format!(
            "kavi's index of the ledgers each workspace's rules were adopted in, {}, holds a \
             line kavi does not write ({why}), so no line of it can be taken at its word (an \
             earlier kavi wrote a workspace's path unescaped, and a path with a line break in \
             it makes a line of its own, naming any workspace). Whoever keeps the keys \
             folder checks each line against the workspaces and ledgers in use and removes the \
             ones that are not theirs",
            file.display()
        )
    };
    let text = String::from_utf8(text).map_err(|_| malformed("it is not UTF-8 text".to_owned()))?;
    let key = workspace_key(workspace);
    Ok(entries(&text)
        .map_err(malformed)?
        .into_iter()
        .filter(|(root, _)| *root == key)
        .map(|(_, ledger)| ledger)
        .next_back())
}

/// Remembers `ledger` as where `workspace`'s rules were adopted. Best effort: a keys folder that
/// cannot be written loses only the carrying over from a ledger other than the workspace's
/// default one. The line is written with one `write`, so that two kavis appending at once do
/// not interleave their lines.
pub(super) fn remember(workspace: &Path, ledger: &Path) {
    use std::io::Write as _;
    let file = file();
    let line = line(&workspace_key(workspace), ledger);
    let remember = || -> std::io::Result<()> {
        std::fs::create_dir_all(file.parent().unwrap_or(Path::new(".")))?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)?
            .write_all(line.as_bytes())
    };
    let _ = remember();
}

#[cfg(test)]
mod tests {
    use super::{decode, encode, entries, line};
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt as _;
    use std::path::Path;

    /// Any path, a tab, a line break, a backslash or bytes that are not UTF-8 in it, makes one
    /// line that reads back as that path, and only that path.
    #[test]
    fn every_path_is_one_line_that_reads_back_as_itself() {
        let odd: [&[u8]; 6] = [
            b"/w/plain",
            b"/w/x\n/victim",
            b"/w/x\t/y\n/victim\t/evil.db",
            b"/w/back\\slash\\x41",
            b"/w/not-utf8-\xff\xfe",
            "/w/c1-\u{85}-\u{7f}-é".as_bytes(),
        ];
        for path in odd {
            let path = Path::new(OsStr::from_bytes(path));
            let written = line(path, Path::new("/l/ledger\n.db"));
            assert_eq!(written.matches('\n').count(), 1, "{written:?}");
            assert!(written.ends_with('\n'));
            let read = entries(&written).unwrap();
            assert_eq!(read.len(), 1, "{written:?}");
            assert_eq!(read[0].0, path, "{written:?}");
            assert_eq!(read[0].1, Path::new("/l/ledger\n.db"));
        }
        // As earlier versions wrote an ordinary path: the same line.
        assert_eq!(
            line(Path::new("/w/a b"), Path::new("/w/a b/.kavi/ledger.db")),
            "/w/a b\t/w/a b/.kavi/ledger.db\n"
        );
    }

    /// A line this does not write is refused, and names its number.
    #[test]
    fn a_line_kavi_does_not_write_is_refused() {
        let ok = "/w/a\t/w/a/.kavi/ledger.db\n";
        for bad in [
            "/t/x\n/w/a\t/t/weak.db\n",
            "/w/a\t/l\t/m\n",
            "/w/a\t\n",
            "\t/l\n",
            "relative\t/l\n",
            "/w/a\\q\t/l\n",
            "/w/a\\x4\t/l\n",
            "/w/a\\x41\t/l\n",
            "/w/a\\x0A\t/l\n",
            "/w/a\t/l\r\n",
            "/w/a\t/l",
        ] {
            let text = format!("{ok}{bad}");
            let refused = entries(&text).expect_err(&format!("{bad:?} was read"));
            assert!(
                refused.starts_with("line 2:") || refused.contains("cut short"),
                "{bad:?}: {refused}"
            );
        }
        assert_eq!(entries(ok).unwrap().len(), 1);
        assert_eq!(entries("").unwrap().len(), 0);
        assert_eq!(decode("/a\\x0a").unwrap(), b"/a\n");
        assert_eq!(encode(b"/a\\b"), "/a\\\\b");
    }
}
