//! The artifacts' rows: recording one the store (`kavi-store`, re-exported) has kept, and
//! finding one by its hash.

use super::db::{self, Db, OptionalExtension, params};
use super::{Artifact, Ledger, LedgerError, Result};

/// Records a stored artifact's row (once: content already recorded is left as it is).
pub(crate) fn keep_artifact(conn: &Db, artifact: &Artifact, at: &str) -> db::Result<()> {
    conn.prepare_cached(
        "INSERT INTO artifacts (sha256, kind, size, path, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
    )?
    .execute(params![
        artifact.sha256,
        artifact.kind,
        artifact.size,
        artifact.path,
        at
    ])?;
    if let Some(content) = &artifact.inline {
        conn.prepare_cached(
            "INSERT INTO artifact_contents (sha256, content) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        )?
        .execute(params![artifact.sha256, &content[..]])?;
    }
    Ok(())
}

impl Ledger {
    /// A stored artifact's row, by its SHA-256 or a unique prefix of it.
    pub fn artifact(&self, prefix: &str) -> Result<Artifact> {
        let hex = prefix.strip_prefix("sha256:").unwrap_or(prefix);
        let found: Vec<Artifact> = self
            .conn
            .prepare("SELECT sha256, kind, size, path FROM artifacts WHERE sha256 LIKE ?1 LIMIT 2")?
            .query_map([format!("{hex}%")], |row| {
                Ok(Artifact {
                    sha256: row.get(0)?,
                    kind: row.get(1)?,
                    size: row.get(2)?,
                    path: row.get(3)?,
                    inline: None,
                })
            })?
            .collect::<db::Result<_>>()?;
        match <[Artifact; 1]>::try_from(found) {
            Ok([artifact]) if !hex.is_empty() => Ok(artifact),
            _ => Err(LedgerError::ArtifactNotFound(prefix.to_owned())),
        }
    }

    /// The bytes of an artifact the ledger keeps, checked against its hash; `None` when it is
    /// the store's file.
    pub fn kept_artifact(&self, sha256: &str) -> Result<Option<Vec<u8>>, String> {
        let kept: Option<Vec<u8>> = self
            .conn
            .query_row(
                "SELECT content FROM artifact_contents WHERE sha256 = ?1",
                [sha256],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| e.to_string())?;
        match kept {
            Some(bytes) if kavi_foundation::hash::sha256_hex(&bytes) != sha256 => Err(format!(
                "artifact {sha256} in the ledger was altered: its content no longer matches its hash"
            )),
            kept => Ok(kept),
        }
    }
}
