//! Tests of the journal in a ledger: upgrades, the appender, sealing and remade triggers.

use crate::journal::{APPEND_VIEW, APPENDER, Findings, HASH_FUNCTION, current};
use crate::{ArtifactStore, Ledger, schema};

/// A ledger written before the journal existed gets one `snapshot` entry per row when it is
/// upgraded, and verifies clean; an edit afterwards, behind the triggers, does not.
#[test]
fn an_older_ledger_is_snapshotted_on_upgrade_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    {
        kavi_db::memory::use_mimalloc();
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            .unwrap();
        for migration in &schema::MIGRATIONS[..15] {
            conn.execute_batch(migration).unwrap();
        }
        conn.execute_batch(
            "INSERT INTO schema_version VALUES (15);
                 INSERT INTO specs VALUES ('sha256:x', 'p.toml', 'text', 'now');
                 INSERT INTO runs (pipeline, spec_path, spec_hash, params, status, started_at, owner)
                 VALUES ('demo', 'p.toml', 'sha256:x', '{}', 'succeeded', 'now', 'o');",
        )
        .unwrap();
    }
    let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
    let ledger = Ledger::open(&path).unwrap();
    let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
    // The old spec row is journaled as it is, and its wrong hash is still reported.
    assert_eq!(
        findings.problems,
        ["spec sha256:x: its text does not hash to its name"]
    );
    let ops: Vec<String> = ledger
        .conn
        .prepare("SELECT op FROM journal ORDER BY seq")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<crate::db::Result<_>>()
        .unwrap();
    // Then the ledger's identity, made as it is opened.
    assert_eq!(ops, ["snapshot", "snapshot", "insert"]);

    ledger
        .conn
        .execute_batch("DROP TRIGGER journal_runs_update; UPDATE runs SET status = 'failed'")
        .unwrap();
    assert_reports_run_edited(&ledger.verify(&store, None, &Vec::new()).unwrap());
}

/// `verify` names run 1's row as changed since its last journal entry.
fn assert_reports_run_edited(findings: &Findings) {
    assert!(
        findings
            .problems
            .iter()
            .any(|p| p.starts_with("table runs row [1]: differs from journal entry")),
        "{:?}",
        findings.problems
    );
}

/// The table triggers write through one appender. Without it a write fails rather than go
/// unjournaled, `verify` names it, and the next kavi to open the ledger makes it again.
#[test]
fn without_its_appender_a_ledger_refuses_writes_until_it_is_opened_again() {
    let (dir, ledger, _owner) = crate::testing::fresh_ledger();
    let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
    let hash = kavi_foundation::hash::spec_hash("text");
    let insert = format!("INSERT INTO specs VALUES ('{hash}', 'p.toml', 'text', 'now')");
    ledger
        .conn
        .execute_batch(&format!("DROP TRIGGER {APPENDER}"))
        .unwrap();
    let refused = ledger.conn.execute_batch(&insert).unwrap_err();
    assert!(refused.to_string().contains(APPEND_VIEW), "{refused}");
    let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
    assert_eq!(
        findings.problems,
        [format!(
            "the journal's appender (trigger {APPENDER}) is missing (dropped outside kavi)"
        )]
    );
    assert!(!current(&ledger.conn).unwrap());
    drop(ledger);

    let ledger = Ledger::open(&dir.path().join("ledger.db")).unwrap();
    assert!(current(&ledger.conn).unwrap());
    ledger.conn.execute_batch(&insert).unwrap();
    let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
    assert!(findings.problems.is_empty(), "{:?}", findings.problems);
    let last: (String, String) = ledger
        .conn
        .query_row(
            "SELECT tbl, op FROM journal ORDER BY seq DESC LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!(last, ("specs".to_owned(), "insert".to_owned()));
}

/// A ledger made by a kavi whose appender read the journal in an `INSERT ... SELECT` (a
/// temporary table for every entry) is not current: it journals on as it is, and the next
/// kavi to open it remakes the appender, whose entries chain on from the old ones.
#[test]
fn an_older_appender_is_remade_and_the_chain_goes_on() {
    let (dir, mut ledger, owner) = crate::testing::fresh_ledger();
    let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
    let run = |ledger: &mut Ledger| {
        ledger
            .create_run(&crate::testing::new_run(
                &serde_json::json!({}),
                &["a"],
                &owner,
            ))
            .unwrap()
    };
    run(&mut ledger);
    ledger
        .conn
        .execute_batch(&format!(
            "DROP TRIGGER {APPENDER};
                 CREATE TRIGGER {APPENDER} INSTEAD OF INSERT ON {APPEND_VIEW} BEGIN
                   INSERT INTO journal (seq, tbl, op, key, content, prev, hash)
                   SELECT seq, NEW.tbl, NEW.op, NEW.key, NEW.content, prev,
                          {HASH_FUNCTION}(prev || char(10) || seq || char(10) || NEW.tbl
                                          || char(10) || NEW.op || char(10) || NEW.key
                                          || char(10) || NEW.content)
                   FROM (SELECT COALESCE((SELECT MAX(seq) FROM journal), 0) + 1 AS seq,
                                COALESCE((SELECT hash FROM journal ORDER BY seq DESC LIMIT 1),
                                         '') AS prev);
                 END;"
        ))
        .unwrap();
    assert!(!current(&ledger.conn).unwrap());
    run(&mut ledger);
    drop(ledger);

    let mut ledger = Ledger::open(&dir.path().join("ledger.db")).unwrap();
    assert!(current(&ledger.conn).unwrap());
    let entries = |ledger: &Ledger| -> i64 {
        ledger
            .conn
            .query_row("SELECT count(*) FROM journal", [], |row| row.get(0))
            .unwrap()
    };
    let before = entries(&ledger);
    run(&mut ledger);
    assert!(entries(&ledger) > before);
    // The older appender wrote no MACs, after keyed entries: said so, and not sealed, since
    // that is what a writer without the key leaves.
    let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
    assert_eq!(findings.unkeyed, 2, "{:?}", findings.problems);
    let refused = ledger.seal().unwrap_err().to_string();
    assert!(
        refused.contains("no keyed entry after it vouches"),
        "{refused}"
    );
}

/// A ledger journaled before kavi keyed it: its entries are a prefix without MACs, which
/// what this kavi writes follows; `seal` MACs them, and it verifies.
#[test]
fn entries_from_before_the_keyed_journal_are_sealed() {
    let (dir, mut ledger, owner) = crate::testing::fresh_ledger();
    let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
    let run = |ledger: &mut Ledger| {
        let new = crate::testing::new_run(&serde_json::json!({}), &["a"], &owner);
        ledger.create_run(&new).unwrap();
    };
    run(&mut ledger);
    // As an older kavi left it: no MACs.
    ledger
        .conn
        .execute_batch("UPDATE journal SET mac = NULL")
        .unwrap();
    let refused = ledger.seal().unwrap_err().to_string();
    assert!(refused.contains("no keyed entry after it"), "{refused}");
    run(&mut ledger);
    let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
    assert!(findings.unkeyed > 0);
    assert_eq!(findings.problems.len(), 1, "{:?}", findings.problems);
    assert_eq!(ledger.seal().unwrap(), findings.unkeyed);
    let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
    assert!(findings.problems.is_empty(), "{:?}", findings.problems);
}

/// A ledger whose triggers cannot be remade now (another process holds the write lock past
/// the timeout, here 10 s) opens with the ones it has, and has them remade once it can.
#[test]
fn a_ledger_that_cannot_be_written_now_opens_with_its_older_triggers() {
    let (dir, ledger, _owner) = crate::testing::fresh_ledger();
    let path = dir.path().join("ledger.db");
    ledger
        .conn
        .execute_batch(&format!("DROP TRIGGER {APPENDER}"))
        .unwrap();
    drop(ledger);
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let ledger = Ledger::open(&path).unwrap();
    assert!(!current(&ledger.conn).unwrap());
    drop(ledger);
    holder.execute_batch("ROLLBACK").unwrap();
    let ledger = Ledger::open(&path).unwrap();
    assert!(current(&ledger.conn).unwrap());
}

/// Remaking the triggers records nothing: a row edited behind them (the appender and the
/// table's trigger dropped first) is still reported after the next kavi opens the ledger,
/// not taken into the journal as a `migrate` entry.
#[test]
fn remade_triggers_do_not_take_in_a_row_edited_behind_them() {
    let (dir, mut ledger, owner) = crate::testing::fresh_ledger();
    let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
    ledger
        .create_run(&crate::testing::new_run(
            &serde_json::json!({}),
            &["a"],
            &owner,
        ))
        .unwrap();
    ledger
        .conn
        .execute_batch(&format!(
            "DROP TRIGGER {APPENDER}; DROP TRIGGER journal_runs_update;
                 UPDATE runs SET status = 'failed'"
        ))
        .unwrap();
    drop(ledger);
    let ledger = Ledger::open(&dir.path().join("ledger.db")).unwrap();
    assert!(current(&ledger.conn).unwrap());
    assert_reports_run_edited(&ledger.verify(&store, None, &Vec::new()).unwrap());
}
