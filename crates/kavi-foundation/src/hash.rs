//! Content hashes as kavi writes them: hex SHA-256, and `sha256:<hex>` for specs and sets.

use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::files::open_regular;

/// The SHA-256 (hex) of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// `bytes` in lower-case hex. By table rather than through `format!`, whose formatter writes a
/// byte at a time: the journal hashes and MACs every change the ledger records with this.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    hex
}

/// `sha256:<hex>` of a spec or policy text: how the ledger names it.
pub fn spec_hash(text: &str) -> String {
    format!("sha256:{:x}", Sha256::digest(text.as_bytes()))
}

/// The hash over a set given as (role, path, spec hash) in any order: `sha256:` and the hex
/// SHA-256 of one `<role> <path> <hash>` LF line per member, sorted by path.
pub fn set_hash<'a>(members: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> String {
    let mut lines: Vec<(&str, &str, &str)> = members.into_iter().collect();
    lines.sort_by(|a, b| a.1.cmp(b.1));
    let mut hasher = Sha256::new();
    for (role, path, hash) in lines {
        hasher.update(format!("{role} {path} {hash}\n"));
    }
    format!("sha256:{:x}", hasher.finalize())
}

/// A short form of a `sha256:<hex>` hash for tables and messages.
pub fn short_hash(hash: &str) -> String {
    let hex = hash.strip_prefix("sha256:").unwrap_or(hash);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}

/// SHA-256 (hex) and size of a regular file (see [`open_regular`]), read in chunks.
pub fn hash_file(path: &Path) -> io::Result<(String, u64)> {
    hash_reader(&mut open_regular(path)?)
}

/// The SHA-256 (hex) and length of everything `reader` yields.
pub fn hash_reader(reader: &mut impl Read) -> io::Result<(String, u64)> {
    copy_hashing(reader, &mut io::sink())
}

/// Copies everything `reader` yields to `writer` through one buffer, hashing it on the way:
/// returns its SHA-256 (hex) and length.
pub fn copy_hashing(
    reader: &mut impl Read,
    writer: &mut (impl Write + ?Sized),
) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    // On the stack, as before the copy: hashing a sandbox of thousands of small files calls
    // this for each, and a larger buffer would be zeroed as many times.
    let mut buffer = [0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buffer[..n]);
        writer.write_all(&buffer[..n])?;
        size += n as u64;
    }
    Ok((format!("{:x}", hasher.finalize()), size))
}

/// A writer that hashes what is written to it and keeps none of it: for content that comes
/// in pieces rather than from a reader.
#[derive(Default)]
pub struct HashingSink {
    hasher: Sha256,
    size: u64,
}

impl HashingSink {
    /// The SHA-256 (hex) and length of everything written.
    pub fn finish(self) -> (String, u64) {
        (format!("{:x}", self.hasher.finalize()), self.size)
    }
}

impl Write for HashingSink {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_writes_every_byte_as_two_lower_case_digits() {
        let bytes: Vec<u8> = (0..=255).collect();
        let by_formatter: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&bytes), by_formatter);
        assert_eq!(sha256_hex(b"abc"), format!("{:x}", Sha256::digest(b"abc")));
    }

    #[test]
    fn the_set_hash_is_the_sha256_of_sorted_lines() {
        let hash = set_hash([
            ("template", "templates/b.j2", "sha256:2"),
            ("pipeline", "pipelines/a.toml", "sha256:1"),
        ]);
        let expected = format!(
            "sha256:{:x}",
            Sha256::digest(
                "pipeline pipelines/a.toml sha256:1\ntemplate templates/b.j2 sha256:2\n"
            )
        );
        assert_eq!(hash, expected);
        assert_ne!(
            hash,
            set_hash([("pipeline", "pipelines/a.toml", "sha256:1")])
        );
    }
}
