//! Checkpoints: the journal's head, signed with an ed25519 key kept outside the workspace.
//!
//! The journal makes an edit evident only to someone who does not recompute the chain after it.
//! A checkpoint pins entry `seq` to its `hash` with a signature over
//! `kavi-checkpoint-v1 LF seq LF hash`; a rewritten chain no longer has that hash at that entry,
//! and without the key nobody can sign the new one. `kavi ledger verify` checks every checkpoint
//! against the key configured as `signing_key`, so one signed by a key of the writer's own is
//! not accepted either.

use std::io::Write;
use std::path::Path;

use super::db::{Db, params};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};

use super::{Ledger, Result, now};

const CONTEXT: &str = "kavi-checkpoint-v1";

fn message(seq: i64, hash: &str) -> String {
    format!("{CONTEXT}\n{seq}\n{hash}")
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
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
    use std::os::unix::fs::OpenOptionsExt;
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut seed))?;
    let key = SigningKey::from_bytes(&seed);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{}", to_hex(&seed))?;
    Ok(key.verifying_key())
}

/// Reads the key at `path`.
pub fn load(path: &Path) -> std::result::Result<SigningKey, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the signing key {}: {e}", path.display()))?;
    let seed = from_hex::<32>(&text).ok_or_else(|| {
        format!(
            "{} is not a signing key (64 hex digits); make one with `kavi ledger keygen`",
            path.display()
        )
    })?;
    Ok(SigningKey::from_bytes(&seed))
}

impl Ledger {
    /// Signs the journal's head with `key` and records the checkpoint.
    pub fn checkpoint(&self, key: &SigningKey) -> Result<Option<Signed>> {
        let head: Option<(i64, String)> =
            super::db::OptionalExtension::optional(self.conn.query_row(
                "SELECT seq, hash FROM journal ORDER BY seq DESC LIMIT 1",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            ))?;
        let Some((seq, hash)) = head else {
            return Ok(None);
        };
        let signed = Signed {
            signature: to_hex(&key.sign(message(seq, &hash).as_bytes()).to_bytes()),
            public_key: public_hex(&key.verifying_key()),
            seq,
            hash,
        };
        self.conn.execute(
            "INSERT INTO checkpoints (seq, hash, public_key, signature, at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                signed.seq,
                signed.hash,
                signed.public_key,
                signed.signature,
                now()
            ],
        )?;
        Ok(Some(signed))
    }
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
    /// Why this checkpoint does not hold, if it does not.
    fn problem(&self, conn: &Db, trusted: Option<&VerifyingKey>) -> Result<Option<String>> {
        let journaled: Option<String> = super::db::OptionalExtension::optional(conn.query_row(
            "SELECT hash FROM journal WHERE seq = ?1",
            [self.seq],
            |row| row.get(0),
        ))?;
        if journaled.as_deref() != Some(self.hash.as_str()) {
            return Ok(Some(format!(
                "journal entry {} no longer has the hash it signed (the chain was rewritten)",
                self.seq
            )));
        }
        let key = from_hex::<32>(&self.public_key).and_then(|b| VerifyingKey::from_bytes(&b).ok());
        let signature = from_hex::<64>(&self.signature).map(|b| Signature::from_bytes(&b));
        let holds = match (&key, signature) {
            (Some(key), Some(signature)) => key
                .verify(message(self.seq, &self.hash).as_bytes(), &signature)
                .is_ok(),
            _ => false,
        };
        Ok(if !holds {
            Some("its signature does not verify".to_owned())
        } else if trusted.is_some_and(|trusted| key.as_ref() != Some(trusted)) {
            Some(format!(
                "signed by {}, which is not the configured signing key",
                self.public_key.get(..16).unwrap_or(&self.public_key)
            ))
        } else {
            None
        })
    }
}

/// The log of checkpoints kept beside the key, outside the workspace: a writer who rewrites the
/// chain and deletes the ledger's own checkpoints still meets these.
pub fn log_path(key: &Path) -> std::path::PathBuf {
    key.with_extension("checkpoints")
}

/// One line of the log: which ledger, and the checkpoint.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Logged {
    ledger: String,
    #[serde(flatten)]
    signed: Signed,
}

/// Appends a checkpoint to the log beside the key.
pub fn log(key: &Path, ledger: &Path, signed: &Signed) -> std::io::Result<()> {
    let line = serde_json::to_string(&Logged {
        ledger: ledger.display().to_string(),
        signed: signed.clone(),
    })
    .map_err(std::io::Error::other)?;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log_path(key))?;
    writeln!(file, "{line}")
}

/// The logged checkpoints of `ledger`; none when there is no log.
pub fn logged(key: &Path, ledger: &Path) -> Vec<Signed> {
    let Ok(text) = std::fs::read_to_string(log_path(key)) else {
        return Vec::new();
    };
    let ledger = ledger.display().to_string();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Logged>(line).ok())
        .filter(|logged| logged.ledger == ledger)
        .map(|logged| logged.signed)
        .collect()
}

/// Checks every checkpoint in the ledger and every one in `logged`: its entry still has the
/// hash it signed, the signature holds, and the key is `trusted` (when one is known). Returns how
/// many there are, and the problems.
pub(super) fn verify(
    conn: &Db,
    trusted: Option<&VerifyingKey>,
    logged: &[Signed],
) -> Result<(usize, Vec<String>)> {
    let mut problems = Vec::new();
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
        .collect::<super::db::Result<_>>()?;
    for (id, signed) in &recorded {
        if let Some(problem) = signed.problem(conn, trusted)? {
            problems.push(format!("checkpoint {id}: {problem}"));
        }
    }
    for signed in logged {
        if let Some(problem) = signed.problem(conn, trusted)? {
            problems.push(format!(
                "the checkpoint of entry {} in the log beside the key: {problem}",
                signed.seq
            ));
        }
    }
    Ok((recorded.len().max(logged.len()), problems))
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
