//! Node keys (see `crate::cache`): recorded with each node run of a node that declares its
//! inputs, looked up before such a node runs, and compared by `kavi explain`.

use std::collections::BTreeMap;

use super::db::{Db, OptionalExtension, Row, params};
use serde::Serialize;
use serde_json::Value;

use super::{Ledger, Result};

/// What a node run records about its key.
#[derive(Debug, Clone, Default)]
pub struct CacheRecord {
    pub key: String,
    pub parts: BTreeMap<String, String>,
    /// Output path -> the SHA-256 of the artifact holding it.
    pub files: BTreeMap<String, String>,
    /// For a `cached` node run: the node run whose result it took.
    pub source: Option<i64>,
    /// Why the key was not looked up, or found nothing usable.
    pub note: Option<String>,
}

/// An earlier node run with the same key, whose result a node can take.
#[derive(Debug, Clone)]
pub struct CacheHit {
    pub node_run_id: i64,
    pub run_id: i64,
    pub outputs: Value,
    pub files: BTreeMap<String, String>,
}

/// A recorded key, with the node run and run it belongs to.
#[derive(Debug, Clone, Serialize)]
pub struct RecordedKey {
    pub node_run_id: i64,
    pub run_id: i64,
    pub key: String,
    pub parts: BTreeMap<String, String>,
    pub files: BTreeMap<String, String>,
    pub source: Option<i64>,
    pub note: Option<String>,
}

pub(super) fn record(tx: &Db, node_run_id: i64, cache: &CacheRecord) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO node_cache (node_run_id, key, parts, files, source, note)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        node_run_id,
        cache.key,
        serde_json::to_string(&cache.parts).expect("parts serialize"),
        serde_json::to_string(&cache.files).expect("files serialize"),
        cache.source,
        cache.note,
    ])?;
    Ok(())
}

/// Reads a JSON object of strings kept in a column.
fn string_map(text: &str) -> BTreeMap<String, String> {
    serde_json::from_str(text).unwrap_or_default()
}

const RECORDED_KEY: &str =
    "SELECT c.node_run_id, n.run_id, c.key, c.parts, c.files, c.source, c.note
     FROM node_cache c JOIN node_runs n ON n.id = c.node_run_id";

fn recorded_key(row: &Row) -> super::db::Result<RecordedKey> {
    Ok(RecordedKey {
        node_run_id: row.get(0)?,
        run_id: row.get(1)?,
        key: row.get(2)?,
        parts: string_map(&row.get::<_, String>(3)?),
        files: string_map(&row.get::<_, String>(4)?),
        source: row.get(5)?,
        note: row.get(6)?,
    })
}

impl Ledger {
    /// The newest node run with this key that succeeded, if any; else the newest that was
    /// cached (its source may have been pruned since).
    pub fn cache_hit(&self, key: &str) -> Result<Option<CacheHit>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT c.node_run_id, n.run_id, n.outputs, c.files
                 FROM node_cache c JOIN node_runs n ON n.id = c.node_run_id
                 WHERE c.key = ?1 AND n.state IN ('succeeded', 'cached')
                 ORDER BY n.state = 'succeeded' DESC, c.node_run_id DESC LIMIT 1",
            )?
            .query_row([key], |row| {
                Ok(CacheHit {
                    node_run_id: row.get(0)?,
                    run_id: row.get(1)?,
                    outputs: row
                        .get::<_, Option<String>>(2)?
                        .and_then(|text| serde_json::from_str(&text).ok())
                        .unwrap_or(Value::Null),
                    files: string_map(&row.get::<_, String>(3)?),
                })
            })
            .optional()?)
    }

    /// The key a node run recorded, if its node declared inputs.
    pub fn recorded_key(&self, node_run_id: i64) -> Result<Option<RecordedKey>> {
        Ok(self
            .conn
            .prepare(&format!("{RECORDED_KEY} WHERE c.node_run_id = ?1"))?
            .query_row([node_run_id], recorded_key)
            .optional()?)
    }

    /// The key recorded by the last run of the same pipeline's node before `node_run_id`.
    pub fn previous_key(
        &self,
        pipeline: &str,
        node_id: &str,
        node_run_id: i64,
    ) -> Result<Option<RecordedKey>> {
        Ok(self
            .conn
            .prepare(&format!(
                "{RECORDED_KEY} JOIN runs r ON r.id = n.run_id
                 WHERE r.pipeline = ?1 AND n.node_id = ?2 AND c.node_run_id < ?3
                 ORDER BY c.node_run_id DESC LIMIT 1"
            ))?
            .query_row(params![pipeline, node_id, node_run_id], recorded_key)
            .optional()?)
    }
}
