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

/// Records `cache` for a node run. Its parts go under its key, once: the key is their hash, so
/// a node run with a key recorded before (every `cached` one) adds none.
pub(super) fn record(tx: &Db, node_run_id: i64, cache: &CacheRecord) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO cache_parts (key, parts) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
    )?
    .execute(params![
        cache.key,
        serde_json::to_string(&cache.parts).expect("parts serialize"),
    ])?;
    tx.prepare_cached(
        "INSERT INTO node_cache (node_run_id, key, files, source, note) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        node_run_id,
        cache.key,
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

/// A node run recorded before parts were kept once has them in its own row.
const RECORDED_KEY: &str =
    "SELECT c.node_run_id, n.run_id, c.key, COALESCE(c.parts, p.parts, '{}'), c.files, c.source,
            c.note
     FROM node_cache c JOIN node_runs n ON n.id = c.node_run_id
     LEFT JOIN cache_parts p ON p.key = c.key";

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeRecord;
    use crate::testing::{fresh_ledger, new_run};
    use kavi_foundation::state::{NodeState, RunStatus};
    use std::time::Duration;

    #[test]
    fn a_keys_parts_are_kept_once_and_read_back_with_every_node_run_that_has_it() {
        let (dir, mut ledger, owner) = fresh_ledger();
        let params = serde_json::json!({});
        let parts = BTreeMap::from([
            ("definition".to_owned(), "d1".to_owned()),
            ("input:src/a.txt".to_owned(), "a1".to_owned()),
        ]);
        let key = "k1".to_owned();
        // Runs of node `n`, each ending with `cache`; the node run's id.
        let run_ending = |ledger: &mut Ledger, state: NodeState, cache: CacheRecord| {
            let run = ledger
                .create_run(&new_run(&params, &["n"], &owner))
                .unwrap();
            let record = NodeRecord {
                cache: Some(cache),
                ..NodeRecord::default()
            };
            ledger.finish_node(run, "n", 1, state, &record).unwrap();
            ledger
                .finish_run(run, RunStatus::Succeeded, Duration::ZERO, None)
                .unwrap();
            let id: i64 = ledger
                .conn
                .query_row("SELECT id FROM node_runs WHERE run_id = ?1", [run], |row| {
                    row.get(0)
                })
                .unwrap();
            id
        };
        let count = |ledger: &Ledger, sql: &str| -> i64 {
            ledger.conn.query_row(sql, [], |row| row.get(0)).unwrap()
        };
        let built = CacheRecord {
            key: key.clone(),
            parts: parts.clone(),
            ..CacheRecord::default()
        };
        let first = run_ending(&mut ledger, NodeState::Succeeded, built);
        let taken = CacheRecord {
            key: key.clone(),
            parts: parts.clone(),
            source: Some(first),
            ..CacheRecord::default()
        };
        let second = run_ending(&mut ledger, NodeState::Cached, taken);

        // One copy of the parts, and one journal entry for it; none in the node runs' rows.
        assert_eq!(count(&ledger, "SELECT COUNT(*) FROM cache_parts"), 1);
        assert_eq!(
            count(
                &ledger,
                "SELECT COUNT(*) FROM journal WHERE tbl = 'cache_parts'"
            ),
            1
        );
        assert_eq!(
            count(
                &ledger,
                "SELECT COUNT(*) FROM node_cache WHERE parts IS NOT NULL"
            ),
            0
        );
        for id in [first, second] {
            let recorded = ledger.recorded_key(id).unwrap().unwrap();
            assert_eq!((recorded.key.as_str(), &recorded.parts), ("k1", &parts));
        }
        let previous = ledger.previous_key("demo", "n", second).unwrap().unwrap();
        assert_eq!((previous.node_run_id, &previous.parts), (first, &parts));
        assert_eq!(ledger.cache_hit("k1").unwrap().unwrap().node_run_id, first);

        // A node run recorded before parts were kept once has them in its own row.
        let old_parts = BTreeMap::from([("definition".to_owned(), "d0".to_owned())]);
        let old = run_ending(
            &mut ledger,
            NodeState::Succeeded,
            CacheRecord {
                key: "k0".into(),
                ..CacheRecord::default()
            },
        );
        ledger
            .conn
            .execute_batch(&format!(
                "DELETE FROM cache_parts WHERE key = 'k0';
                 UPDATE node_cache SET parts = '{}' WHERE node_run_id = {old};",
                serde_json::to_string(&old_parts).unwrap()
            ))
            .unwrap();
        assert_eq!(ledger.recorded_key(old).unwrap().unwrap().parts, old_parts);

        // gc: the parts stay while a kept node run has the key, and go with the last one.
        let keeping = |keep| crate::gc::GcRule {
            before: "9999-01-01T00:00:00Z".into(),
            keep,
        };
        ledger.prune_runs(&keeping(2), false).unwrap();
        assert_eq!(count(&ledger, "SELECT COUNT(*) FROM cache_parts"), 1);
        assert_eq!(ledger.recorded_key(second).unwrap().unwrap().parts, parts);
        ledger.prune_runs(&keeping(1), false).unwrap();
        assert_eq!(count(&ledger, "SELECT COUNT(*) FROM cache_parts"), 0);
        assert_eq!(ledger.recorded_key(old).unwrap().unwrap().parts, old_parts);
        let store = crate::ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
        let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
        assert!(findings.problems.is_empty(), "{:?}", findings.problems);
    }
}
