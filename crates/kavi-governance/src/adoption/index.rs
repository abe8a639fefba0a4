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

/// Every line of an index's text, in order: its workspace and ledger, or why it is not a line
/// this index writes (a last line no line break ends is cut short).
fn entries(text: &str) -> Vec<Result<(PathBuf, PathBuf), &'static str>> {
    let whole = text.ends_with('\n');
    let lines: Vec<&str> = text.split_terminator('\n').collect();
    let last = lines.len().saturating_sub(1);
    lines
        .iter()
        .enumerate()
        .map(|(at, line)| {
            if at == last && !whole {
                Err("it is cut short (no line break ends it)")
            } else {
                parse(line)
            }
        })
        .collect()
}

/// The ledger the index's `text` remembers last for the workspace `key`. A line this index
/// does not write is passed over (two kavis that wrote at once before lines were written whole
/// left such lines), unless it may be about `key`: it names it, or it stands next to a line for
/// `key`. An earlier kavi wrote a workspace's path unescaped, and a path with a line break made
/// a line of its own for any workspace right after the broken one: such a line is not taken at
/// its word, and the error names the broken line.
fn lookup(text: &str, key: &Path) -> Result<Option<PathBuf>, String> {
    let entries = entries(text);
    let encoded = encode(key.as_os_str().as_bytes());
    let for_key = |at: usize| matches!(entries.get(at), Some(Ok((root, _))) if root == key);
    for (at, entry) in entries.iter().enumerate() {
        let Err(why) = entry else { continue };
        let line = text.split_terminator('\n').nth(at).unwrap_or_default();
        if line.contains(&encoded) || for_key(at + 1) || (at > 0 && for_key(at - 1)) {
            return Err(format!("line {}: {why}", at + 1));
        }
    }
    Ok(entries
        .into_iter()
        .filter_map(Result::ok)
        .filter(|(root, _)| root == key)
        .map(|(_, ledger)| ledger)
        .next_back())
}

/// The ledger the index remembers `workspace`'s rules were last adopted in, if any. An index
/// that cannot be read is an error, and so is one holding a line this does not write that may
/// be about `workspace` (see [`lookup`]).
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
             line kavi does not write ({why}), next to or naming this workspace's, so what it \
             says of this workspace cannot be taken at its word (an earlier kavi wrote a \
             workspace's path unescaped, and a path with a line break in it makes a line of its \
             own, naming any workspace). Whoever keeps the keys folder checks each line against \
             the workspaces and ledgers in use and removes the ones that are not theirs",
            file.display()
        )
    };
    // Written as `\xNN` escapes, every line is ASCII: bytes that are not UTF-8 are no line.
    let text = String::from_utf8_lossy(&text);
    lookup(&text, &workspace_key(workspace)).map_err(malformed)
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
    use super::{decode, encode, entries, line, lookup};
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
            let read = entries(&written);
            assert_eq!(read.len(), 1, "{written:?}");
            let (root, ledger) = read[0].as_ref().unwrap();
            assert_eq!(root, path, "{written:?}");
            assert_eq!(ledger, Path::new("/l/ledger\n.db"));
        }
        // As earlier versions wrote an ordinary path: the same line.
        assert_eq!(
            line(Path::new("/w/a b"), Path::new("/w/a b/.kavi/ledger.db")),
            "/w/a b\t/w/a b/.kavi/ledger.db\n"
        );
    }

    /// A line this does not write is refused where it may be about the workspace looked up, and
    /// names its number.
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
            let refused = lookup(&text, Path::new("/w/a")).expect_err(&format!("{bad:?} was read"));
            assert!(refused.starts_with("line 2:"), "{bad:?}: {refused}");
        }
        assert_eq!(
            lookup(ok, Path::new("/w/a")).unwrap().as_deref(),
            Some(Path::new("/w/a/.kavi/ledger.db"))
        );
        assert!(entries("").is_empty());
        assert_eq!(decode("/a\\x0a").unwrap(), b"/a\n");
        assert_eq!(encode(b"/a\\b"), "/a\\\\b");
    }

    /// Two kavis that appended at once before lines were written whole left a broken line: it is
    /// passed over for every workspace but the ones it may be about.
    #[test]
    fn a_broken_line_elsewhere_in_the_index_is_passed_over() {
        let text = "/w/a\t/w/a/.kavi/ledger.db\n\
                    /w/b\t/w/b/.kavi/ledger.db/w/c\n\
                    \t/w/c/.kavi/ledger.db\n\
                    /w/d\t/w/d/.kavi/ledger.db\n\
                    /w/e\t/w/e/.kavi/ledger.db\n";
        assert_eq!(
            lookup(text, Path::new("/w/a")).unwrap().as_deref(),
            Some(Path::new("/w/a/.kavi/ledger.db"))
        );
        assert_eq!(
            lookup(text, Path::new("/w/e")).unwrap().as_deref(),
            Some(Path::new("/w/e/.kavi/ledger.db"))
        );
        assert_eq!(lookup(text, Path::new("/w/f")).unwrap(), None);
        // Next to it, or named in it: not taken at its word.
        for near in ["/w/b", "/w/c", "/w/d"] {
            let refused = lookup(text, Path::new(near)).expect_err(near);
            assert!(refused.starts_with("line 3:"), "{near}: {refused}");
        }
    }
}
