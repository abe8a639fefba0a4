//! Checkpoints: the journal's head, signed with an ed25519 key kept outside the workspace.
//!
//! The journal's MACs make an edit by a process without kavi's key evident; a checkpoint pins
//! entry `seq` to its `hash` with a signature over `kavi-checkpoint-v1 LF seq LF hash`, which
//! also catches the tail of the journal cut off, and holds for whoever has only the public key.
//!
//! Each ledger's checkpoints are logged beside the key (see [`crate::keys`]), under the ledger's
//! identity. The first one logged pins its key: a later checkpoint signed by another key is
//! refused unless a rotation record, signed by the key pinned then, names the new one
//! (`kavi ledger rotate-key`).

use std::io::Write;
use std::path::Path;

/// The key a checkpoint or a person's approval is signed with.
pub use ed25519_dalek::SigningKey;
use ed25519_dalek::{Signature, Signer, Verifier, VerifyingKey};
use kavi_db::{Db, OptionalExtension, params};

use crate::Result;
use crate::keys;

const CONTEXT: &str = "kavi-checkpoint-v1";

/// What a rotation record's signature is over: `kavi-rotate-v1 LF old LF new`.
const ROTATE_CONTEXT: &str = "kavi-rotate-v1";

fn message(seq: i64, hash: &str) -> String {
    format!("{CONTEXT}\n{seq}\n{hash}")
}

pub(crate) use kavi_foundation::hash::hex as to_hex;

pub(crate) fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let text = text.trim();
    if text.len() != N * 2 || !text.is_ascii() {
        return None;
    }
    let mut bytes = [0u8; N];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(bytes)
}

/// A public key as checkpoints record it.
pub fn public_hex(key: &VerifyingKey) -> String {
    to_hex(key.as_bytes())
}

/// Makes a new key at `path` (which must not exist), readable by this user only; returns its
/// public half.
pub fn generate(path: &Path) -> std::io::Result<VerifyingKey> {
    let seed = keys::random_seed()?;
    let made = keys::write_new_private(path, format!("{}\n", to_hex(&seed)).as_bytes())?;
    if !made {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "a key is there already",
        ));
    }
    Ok(SigningKey::from_bytes(&seed).verifying_key())
}

/// The key at `path`, made there first when there is none.
pub fn load_or_generate(path: &Path) -> std::result::Result<SigningKey, String> {
    if !path.exists() {
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder)
                .map_err(|e| format!("cannot make {}: {e}", folder.display()))?;
        }
        match generate(path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(format!("cannot make the key {}: {e}", path.display()));
            }
            _ => {}
        }
    }
    load(path)
}

/// Reads the key at `path`.
pub fn load(path: &Path) -> std::result::Result<SigningKey, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            "; make one with `kavi ledger keygen`"
        } else {
            ""
        };
        format!("cannot read the signing key {}: {e}{hint}", path.display())
    })?;
    let seed = from_hex::<32>(&text).ok_or_else(|| {
        format!(
            "{} is not a signing key (64 hex digits); make one with `kavi ledger keygen`",
            path.display()
        )
    })?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Signs the journal's head with `key` and records the checkpoint, made `at`.
pub fn record(conn: &Db, key: &SigningKey, at: &str) -> Result<Option<Signed>> {
    let head: Option<(i64, String)> = conn
        .query_row(
            "SELECT seq, hash FROM journal ORDER BY seq DESC LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    let Some((seq, hash)) = head else {
        return Ok(None);
    };
    let signed = Signed {
        signature: to_hex(&key.sign(message(seq, &hash).as_bytes()).to_bytes()),
        public_key: public_hex(&key.verifying_key()),
        seq,
        hash,
    };
    conn.execute(
        "INSERT INTO checkpoints (seq, hash, public_key, signature, at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            signed.seq,
            signed.hash,
            signed.public_key,
            signed.signature,
            at
        ],
    )?;
    Ok(Some(signed))
}

/// A signed checkpoint, from the ledger's `checkpoints` table or from the log kept beside the
/// key.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Signed {
    pub seq: i64,
    pub hash: String,
    pub public_key: String,
    pub signature: String,
}

impl Signed {
    /// Why this checkpoint does not hold, if it does not: its entry no longer has the hash it
    /// signed, or the signature does not verify under the key it names.
    pub fn problem(&self, conn: &Db) -> Result<Option<String>> {
        let journaled: Option<String> = conn
            .query_row(
                "SELECT hash FROM journal WHERE seq = ?1",
                [self.seq],
                |row| row.get(0),
            )
            .optional()?;
        if journaled.as_deref() != Some(self.hash.as_str()) {
            return Ok(Some(format!(
                "journal entry {} no longer has the hash it signed (the chain was rewritten)",
                self.seq
            )));
        }
        Ok((!holds(
            &self.public_key,
            &self.signature,
            &message(self.seq, &self.hash),
        ))
        .then(|| "its signature does not verify".to_owned()))
    }
}

/// A public key from its 64 hex digits (as `kavi ledger keygen` prints it).
/// A weak key (of small order, such as the identity) is none: a signature of its own "verifies"
/// any message under it.
pub fn parse_public(hex: &str) -> Option<VerifyingKey> {
    from_hex::<32>(hex)
        .and_then(|b| VerifyingKey::from_bytes(&b).ok())
        .filter(|key| !key.is_weak())
}

/// Whether `signature` over `message` verifies under `public_key` (hex both).
/// `key`'s signature of `message`, hex.
pub fn sign(key: &SigningKey, message: &str) -> String {
    to_hex(&key.sign(message.as_bytes()).to_bytes())
}

/// Whether `signature` (hex) is the key `public_key`'s (hex, not a weak one) of `message`.
pub fn holds(public_key: &str, signature: &str, message: &str) -> bool {
    let key = parse_public(public_key);
    let signature = from_hex::<64>(signature).map(|b| Signature::from_bytes(&b));
    match (key, signature) {
        (Some(key), Some(signature)) => key.verify(message.as_bytes(), &signature).is_ok(),
        _ => false,
    }
}

/// The first 16 hex digits of a key: how messages name it.
pub fn short(key: &str) -> &str {
    key.get(..16).unwrap_or(key)
}

/// A key handed on: signed by the old key, naming the new one.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Rotation {
    pub from: String,
    pub to: String,
    pub signature: String,
}

impl Rotation {
    fn message(from: &str, to: &str) -> String {
        format!("{ROTATE_CONTEXT}\n{from}\n{to}")
    }

    /// Hands `old`'s place on to `new`.
    pub fn sign(old: &SigningKey, new: &VerifyingKey) -> Self {
        let (from, to) = (public_hex(&old.verifying_key()), public_hex(new));
        Self {
            signature: to_hex(&old.sign(Self::message(&from, &to).as_bytes()).to_bytes()),
            from,
            to,
        }
    }
}

/// One line of a ledger's log beside the key.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "record", rename_all = "lowercase")]
pub enum Record {
    Checkpoint(Signed),
    Rotate(Rotation),
}

/// A log as read: each line a record, or why it is not one.
pub type Log = Vec<std::result::Result<Record, String>>;

/// Appends a record to the log of the ledger `ledger_id`.
pub fn log(ledger_id: &str, record: &Record) -> std::io::Result<()> {
    let line = serde_json::to_string(record).map_err(std::io::Error::other)?;
    append_line(&keys::log_path(ledger_id), &line)
}

fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{line}")
}

/// The log of the ledger `ledger_id`, in order; empty when there is none.
pub fn logged(ledger_id: &str) -> std::io::Result<Log> {
    let path = keys::log_path(ledger_id);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .map_err(|e| format!("{} line {}: not a record ({e})", path.display(), i + 1))
        })
        .collect())
}

/// Records that `ledger_id` was checkpointed at `location`.
pub fn remember_location(ledger_id: &str, location: &str) -> std::io::Result<()> {
    append_line(&keys::paths_index(), &format!("{ledger_id}\t{location}"))
}

/// The identity last checkpointed at `location`, if any.
pub fn last_seen_at(location: &str) -> Option<String> {
    let text = std::fs::read_to_string(keys::paths_index()).ok()?;
    text.lines()
        .filter_map(|line| line.split_once('\t'))
        .filter(|(_, at)| *at == location)
        .map(|(id, _)| id.to_owned())
        .next_back()
}

/// What a log says: the keys it pinned, in order (the last is the current one), its
/// checkpoints, and what does not hold in it.
#[derive(Debug, Default)]
pub struct Pinned {
    pub keys: Vec<String>,
    pub checkpoints: Vec<Signed>,
    pub problems: Vec<String>,
}

impl Pinned {
    pub fn current(&self) -> Option<&str> {
        self.keys.last().map(String::as_str)
    }
}

/// Walks a log: its first checkpoint pins its key, each rotation signed by the key pinned then
/// pins the one it names, and every checkpoint must be signed by the key pinned at its place.
pub fn pinned(log: &Log) -> Pinned {
    let mut pinned = Pinned::default();
    for record in log {
        match record {
            Err(problem) => pinned.problems.push(problem.clone()),
            Ok(Record::Checkpoint(signed)) => {
                match pinned.current() {
                    None => pinned.keys.push(signed.public_key.clone()),
                    Some(current) if current != signed.public_key => {
                        pinned.problems.push(format!(
                            "the checkpoint of entry {} in the log beside the key is signed by \
                             {}, not by the pinned key {} (no rotation signed by that key names \
                             it)",
                            signed.seq,
                            short(&signed.public_key),
                            short(current)
                        ));
                    }
                    Some(_) => {}
                }
                pinned.checkpoints.push(signed.clone());
            }
            Ok(Record::Rotate(rotation)) => {
                let signed_by_pinned = pinned.current() == Some(rotation.from.as_str())
                    && holds(
                        &rotation.from,
                        &rotation.signature,
                        &Rotation::message(&rotation.from, &rotation.to),
                    );
                if signed_by_pinned {
                    pinned.keys.push(rotation.to.clone());
                } else {
                    pinned.problems.push(format!(
                        "a rotation to {} in the log beside the key is not signed by the pinned \
                         key",
                        short(&rotation.to)
                    ));
                }
            }
        }
    }
    pinned
}

/// Checks every checkpoint in the ledger and every one in the log: its entry still has the hash
/// it signed, the signature holds, and the key is one the log pins (or, before the log has one,
/// kavi's signing key `trusted`). Returns how many there are, and the problems.
pub(crate) fn verify(
    conn: &Db,
    trusted: Option<&VerifyingKey>,
    log: &Log,
) -> Result<(usize, Vec<String>)> {
    let log = pinned(log);
    let mut problems = log.problems.clone();
    let recorded: Vec<(i64, Signed)> = conn
        .prepare("SELECT id, seq, hash, public_key, signature FROM checkpoints ORDER BY id")?
        .query_map([], |row| {
            Ok((
                row.get(0)?,
                Signed {
                    seq: row.get(1)?,
                    hash: row.get(2)?,
                    public_key: row.get(3)?,
                    signature: row.get(4)?,
                },
            ))
        })?
        .collect::<kavi_db::Result<_>>()?;
    let trusted = trusted.map(public_hex);
    for (id, signed) in &recorded {
        let problem = match signed.problem(conn)? {
            Some(problem) => Some(problem),
            None if !log.keys.is_empty() && !log.keys.contains(&signed.public_key) => {
                Some(format!(
                    "signed by {}, which is not a key this ledger's log pins",
                    short(&signed.public_key)
                ))
            }
            None if log.keys.is_empty()
                && trusted
                    .as_ref()
                    .is_some_and(|key| *key != signed.public_key) =>
            {
                Some(format!(
                    "signed by {}, which is not kavi's signing key",
                    short(&signed.public_key)
                ))
            }
            None => None,
        };
        if let Some(problem) = problem {
            problems.push(format!("checkpoint {id}: {problem}"));
        }
    }
    for signed in &log.checkpoints {
        if let Some(problem) = signed.problem(conn)? {
            problems.push(format!(
                "the checkpoint of entry {} in the log beside the key: {problem}",
                signed.seq
            ));
        }
    }
    Ok((recorded.len().max(log.checkpoints.len()), problems))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_round_trips_through_its_file_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kavi/signing.key");
        let public = generate(&path).unwrap();
        assert_eq!(load(&path).unwrap().verifying_key(), public);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        assert!(generate(&path).is_err(), "an existing key was overwritten");
        std::fs::write(&path, "not a key").unwrap();
        assert!(load(&path).unwrap_err().contains("kavi ledger keygen"));
    }
}
