//! Tests of the ledger's runs, node runs, connections, recovery and migrations.

use std::fs::File;
use std::time::Duration;

use super::db::params;
use super::runs::merge_by_path;
use super::*;
use crate::testing::{DEMO_HASH, DEMO_TEXT, fresh_ledger, new_run, wal_frames};
use kavi_foundation::state::{NodeState, RunStatus};

#[test]
fn a_sets_members_and_legacy_rows_merge_in_path_order_each_file_once() {
    let file = |path: &str, hash: &str| GoverningFile {
        role: "policy".into(),
        path: path.into(),
        spec_hash: hash.into(),
    };
    let members = vec![file("a", "1"), file("c", "3"), file("d", "4")];
    let legacy = vec![
        file("b", "2"),
        file("c", "3"),
        file("c", "9"),
        file("e", "5"),
    ];
    let merged = merge_by_path(members, legacy);
    let listed: Vec<(&str, &str)> = merged
        .iter()
        .map(|f| (f.path.as_str(), f.spec_hash.as_str()))
        .collect();
    assert_eq!(
        listed,
        [
            ("a", "1"),
            ("b", "2"),
            ("c", "3"),
            ("c", "9"),
            ("d", "4"),
            ("e", "5")
        ]
    );
    assert_eq!(
        merge_by_path(Vec::new(), vec![file("x", "1")]),
        [file("x", "1")]
    );
    // A server may sort by a collation of its own: the merge does not rely on the order.
    let merged = merge_by_path(
        vec![file("b", "2"), file("a-b", "1")],
        vec![file("a-b", "1"), file("a_c", "3")],
    );
    let paths: Vec<&str> = merged.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["a-b", "a_c", "b"]);
}

#[test]
fn times_are_written_to_the_millisecond_in_fixed_width() {
    for (ms, text) in [
        (0, "1970-01-01T00:00:00.000Z"),
        (1_795_000_000_000, "2026-11-18T11:06:40.000Z"),
        (1_795_000_000_908, "2026-11-18T11:06:40.908Z"),
        (1_795_000_000_050, "2026-11-18T11:06:40.050Z"),
        (253_402_207_199_999, "9999-12-30T21:59:59.999Z"),
    ] {
        let time = jiff::Timestamp::from_millisecond(ms).unwrap();
        assert_eq!(format_time(time), text);
        // What `strftime` wrote before: the ledger's older rows compare with these.
        assert_eq!(time.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(), text);
    }
    // Below the millisecond is cut, not rounded, as before.
    let time = jiff::Timestamp::from_nanosecond(1_795_000_000_999_999_999).unwrap();
    assert_eq!(format_time(time), "2026-11-18T11:06:40.999Z");
}

#[test]
fn a_runs_rows_written_in_one_statement_keep_their_order_and_exact_texts() {
    let (dir, mut ledger, owner) = fresh_ledger();
    // Texts that JSON must escape, and one that is not valid as a C string: each is stored
    // byte for byte and still hashes to its name.
    let texts = [
        "plain",
        "quote \" backslash \\ tab \t newline \n",
        "nul \0 inside",
        "unicode é ✓ 𝄞",
        "",
    ];
    let governing: Vec<(&'static str, String, String, String)> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let hash = kavi_foundation::hash::spec_hash(text);
            (
                "script",
                format!("scripts/{i}.sh"),
                hash,
                (*text).to_owned(),
            )
        })
        .collect();
    // Node ids in an order that is not sorted: the rows follow the pipeline's order.
    let nodes: Vec<String> = (0..300).map(|i| format!("n{}", (i * 7) % 300)).collect();
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let new = NewRun {
        governing: governing.clone(),
        ..new_run(&serde_json::json!({}), &names, &owner)
    };
    let run = ledger.create_run(&new).unwrap();

    let written: Vec<(String, String, String)> = ledger
        .conn
        .prepare("SELECT node_id, kind, state FROM node_runs WHERE run_id = ?1 ORDER BY id")
        .unwrap()
        .query_map(params![run], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .unwrap()
        .collect::<std::result::Result<_, _>>()
        .unwrap();
    let expected: Vec<(String, String, String)> = nodes
        .iter()
        .map(|id| (id.clone(), "exec".to_owned(), "pending".to_owned()))
        .collect();
    assert_eq!(written, expected);
    for (_, path, hash, text) in &governing {
        let (stored, stored_path): (String, String) = ledger
            .conn
            .query_row(
                "SELECT text, path FROM specs WHERE hash = ?1",
                params![hash],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!((&stored, &stored_path), (text, path));
    }
    let listed: Vec<String> = ledger
        .governing(run)
        .unwrap()
        .into_iter()
        .map(|file| file.path)
        .collect();
    assert_eq!(
        listed,
        (0..texts.len())
            .map(|i| format!("scripts/{i}.sh"))
            .collect::<Vec<_>>()
    );
    let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
    let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
    assert!(findings.problems.is_empty(), "{:?}", findings.problems);
}

#[test]
fn a_governing_set_is_kept_once_for_every_run_that_has_it() {
    let (dir, mut ledger, owner) = fresh_ledger();
    let params = serde_json::json!({});
    let member = |path: &str, text: &str| {
        let hash = kavi_foundation::hash::spec_hash(text);
        ("policy", path.to_owned(), hash, text.to_owned())
    };
    let run_with = |ledger: &mut Ledger, governing: &[(&'static str, String, String, String)]| {
        let new = NewRun {
            governing: governing.to_vec(),
            ..new_run(&params, &["n"], &owner)
        };
        let id = ledger.create_run(&new).unwrap();
        ledger
            .finish_run(id, RunStatus::Succeeded, Duration::ZERO, None)
            .unwrap();
        id
    };
    let count = |ledger: &Ledger, sql: &str| -> i64 {
        ledger.conn.query_row(sql, [], |row| row.get(0)).unwrap()
    };
    let listed = |ledger: &Ledger, run: i64| -> Vec<(String, String, String)> {
        let files = ledger.governing(run).unwrap();
        files
            .into_iter()
            .map(|f| (f.role, f.path, f.spec_hash))
            .collect()
    };
    let set = [
        member("policies/a.toml", "a = 1"),
        member("policies/b.toml", "b = 2"),
    ];
    let expected = |set: &[(&str, String, String, String)]| -> Vec<(String, String, String)> {
        set.iter()
            .map(|(role, path, hash, _)| ((*role).to_owned(), path.clone(), hash.clone()))
            .collect()
    };

    let first = run_with(&mut ledger, &set);
    let second = run_with(&mut ledger, &set);
    // The second run wrote nothing for its set: two members, two journal entries, and no
    // row per run.
    let members = "SELECT COUNT(*) FROM governing_members";
    assert_eq!(count(&ledger, members), 2);
    assert_eq!(
        count(
            &ledger,
            "SELECT COUNT(*) FROM journal WHERE tbl = 'governing_members'"
        ),
        2
    );
    assert_eq!(count(&ledger, "SELECT COUNT(*) FROM run_policies"), 0);
    assert_eq!(listed(&ledger, first), expected(&set));
    assert_eq!(listed(&ledger, second), expected(&set));

    // One file changed: another set, and the first runs still list theirs.
    let changed = [set[0].clone(), member("policies/b.toml", "b = 3")];
    let third = run_with(&mut ledger, &changed);
    assert_eq!(count(&ledger, members), 4);
    assert_eq!(listed(&ledger, third), expected(&changed));
    assert_eq!(listed(&ledger, first), expected(&set));

    // A set found short (a member deleted by hand) is completed by the next run with it.
    ledger
        .conn
        .execute(
            "DELETE FROM governing_members WHERE path = 'policies/a.toml' AND spec_hash = ?1
                 AND set_hash = (SELECT governing_hash FROM runs WHERE id = ?2)",
            params![set[0].2, first],
        )
        .unwrap();
    let fourth = run_with(&mut ledger, &set);
    assert_eq!(listed(&ledger, fourth), expected(&set));
    assert_eq!(listed(&ledger, first), expected(&set));

    // A run recorded before sets were kept once has its members in run_policies: listed,
    // and a member in both tables once.
    for (role, path, hash, _) in &set {
        ledger
            .conn
            .execute(
                "INSERT INTO run_policies (run_id, path, spec_hash, role) VALUES (?1, ?2, ?3, ?4)",
                params![first, path, hash, role],
            )
            .unwrap();
    }
    assert_eq!(listed(&ledger, first), expected(&set));
    ledger
        .conn
        .execute(
            "UPDATE runs SET governing_hash = NULL WHERE id = ?1",
            [first],
        )
        .unwrap();
    assert_eq!(listed(&ledger, first), expected(&set));

    // gc: the set of the pruned runs stays while a kept run names it, and goes with the
    // last one. Keep the latest run (the fourth, with the first set): the changed set goes.
    let rule = super::gc::GcRule {
        before: "9999-01-01T00:00:00Z".into(),
        keep: 1,
    };
    let pruned = ledger.prune_runs(&rule, false).unwrap();
    assert_eq!(pruned.runs, vec![first, second, third]);
    assert_eq!(count(&ledger, members), 2);
    assert_eq!(listed(&ledger, fourth), expected(&set));
    assert_eq!(count(&ledger, "SELECT COUNT(*) FROM run_policies"), 0);
    let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
    let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
    assert!(findings.problems.is_empty(), "{:?}", findings.problems);
}

#[test]
fn times_have_a_fixed_width_so_text_order_is_time_order() {
    let at = |ms: i64| format_time(jiff::Timestamp::from_millisecond(ms).unwrap());
    assert_eq!(at(1_700_000_000_120), "2023-11-14T22:13:20.120Z");
    assert_eq!(at(1_700_000_000_000), "2023-11-14T22:13:20.000Z");
    assert!(at(1_700_000_000_120) < at(1_700_000_000_123));
}

#[test]
fn a_connection_told_to_checkpoint_often_leaves_few_pages_in_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    // A table, then 20 commits of a page or more each.
    let text = "x".repeat(4096);
    let fill = |ledger: &Ledger| {
        ledger.conn.execute_batch("CREATE TABLE t (x)").unwrap();
        for _ in 0..20 {
            ledger
                .conn
                .execute("INSERT INTO t VALUES (?1)", params![text])
                .unwrap();
        }
    };
    let often = Ledger::open(&path).unwrap();
    often.checkpoint_every(8).unwrap();
    fill(&often);
    let (frames, copied) = wal_frames(&path);
    assert!(frames - copied <= 8 + 2, "{frames} frames, {copied} copied");
    // SQLite's own threshold copies nothing yet.
    let seldom = Ledger::open(&dir.path().join("other.db")).unwrap();
    fill(&seldom);
    let (frames, copied) = wal_frames(&dir.path().join("other.db"));
    assert!(
        frames > 20 && copied == 0,
        "{frames} frames, {copied} copied"
    );
}

/// Regression: CI saw "database is locked" when several processes opened a fresh ledger at
/// once: SQLite answers a concurrent switch to WAL with `SQLITE_BUSY` without waiting.
#[test]
fn many_openers_of_a_fresh_ledger_all_succeed() {
    const OPENERS: usize = 6;
    for round in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let start = std::sync::Arc::new(std::sync::Barrier::new(OPENERS));
        let openers: Vec<_> = (0..OPENERS)
            .map(|_| {
                let (path, start) = (path.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    Ledger::open(&path).map(|_| ())
                })
            })
            .collect();
        for opener in openers {
            if let Err(e) = opener.join().unwrap() {
                panic!("round {round}: {e}");
            }
        }
        kavi_db::memory::use_mimalloc();
        let mode: String = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }
}

#[test]
fn a_run_s_id_is_announced_before_any_of_it_is_committed() {
    let (_dir, mut ledger, owner) = fresh_ledger();
    let reader = ledger.another_connection().unwrap().open().unwrap();
    let mut announced = None;
    let run_id = ledger
        .create_run_announcing(&new_run(&Value::Null, &["a", "b"], &owner), |id| {
            // Another connection sees nothing of the run yet.
            assert!(matches!(reader.run(id), Err(LedgerError::RunNotFound(_))));
            announced = Some(id);
        })
        .unwrap();
    assert_eq!(announced, Some(run_id));
    // Its spec, written after the announcement on SQLite, is committed with it.
    let spec_hash = reader.run(run_id).unwrap().spec_hash;
    assert_eq!(reader.spec_text(&spec_hash).unwrap().1, DEMO_TEXT);
    let nodes = reader.run_detail(run_id).unwrap().nodes;
    let states: Vec<_> = nodes
        .iter()
        .map(|n| (n.node_id.as_str(), n.state))
        .collect();
    assert_eq!(
        states,
        [("a", NodeState::Pending), ("b", NodeState::Pending)]
    );
}

#[test]
fn a_run_s_node_runs_read_back_by_node_then_attempt() {
    let (_dir, mut ledger, owner) = fresh_ledger();
    let run_id = ledger
        .create_run(&new_run(&Value::Null, &["c", "a", "b"], &owner))
        .unwrap();
    // Retries recorded after every first attempt, in another order than the nodes'.
    for (node, attempt) in [("b", 2), ("c", 2), ("b", 3)] {
        ledger
            .start_node(run_id, node, "exec", attempt, &now())
            .unwrap();
    }
    let nodes = ledger.run_detail(run_id).unwrap().nodes;
    let order: Vec<_> = nodes
        .iter()
        .map(|n| (n.node_id.as_str(), n.attempt))
        .collect();
    assert_eq!(
        order,
        [("c", 1), ("c", 2), ("a", 1), ("b", 1), ("b", 2), ("b", 3)]
    );
}

#[test]
fn a_run_records_every_node_and_its_spec() {
    let (_dir, mut ledger, owner) = fresh_ledger();
    let params = serde_json::json!({"x": 1});
    let run_id = ledger
        .create_run(&new_run(&params, &["a", "b"], &owner))
        .unwrap();
    ledger.start_node(run_id, "a", "exec", 1, &now()).unwrap();
    let outputs = serde_json::json!({"exit_code": 0});
    ledger
        .finish_node(
            run_id,
            "a",
            1,
            NodeState::Succeeded,
            &NodeRecord {
                exit_code: Some(0),
                outputs: Some(outputs.clone()),
                ..Default::default()
            },
        )
        .unwrap();
    let detail = ledger.run_detail(run_id).unwrap();
    assert_eq!(detail.run.status, RunStatus::Running);
    let states: Vec<_> = detail
        .nodes
        .iter()
        .map(|n| (n.node_id.as_str(), n.state))
        .collect();
    assert_eq!(
        states,
        [("a", NodeState::Succeeded), ("b", NodeState::Pending)]
    );
    assert_eq!(detail.nodes[0].outputs, Some(outputs));
    let (hash, text) = ledger.spec_text(&DEMO_HASH[..12]).unwrap();
    assert_eq!(hash, *DEMO_HASH);
    assert!(text.contains("demo"));
    assert_eq!(ledger.resolve_run("latest").unwrap(), run_id);
    assert!(matches!(
        ledger.resolve_run("99"),
        Err(LedgerError::RunNotFound(_))
    ));
}

/// An owner half-way through its claim (its `.claiming` file made but not locked yet) is
/// not taken for dead: recovery waits for the claim to end, then finds the owner alive.
#[test]
fn recovery_waits_for_a_claim_in_progress_and_finds_its_owner_alive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let mut ledger = Ledger::open(&path).unwrap();
    let locks = locks_dir(&path);
    let name = format!("{}-1", std::process::id());
    let [claiming, lock] = ["claiming", "lock"].map(|e| locks.join(format!("{name}.{e}")));
    // What a claim does, stopped after its first step.
    let turn = owner::take_turn(&locks, false).unwrap();
    let held = File::create(&claiming).unwrap();
    let recovery = std::thread::spawn(move || ledger.recover_interrupted().unwrap());
    std::thread::sleep(Duration::from_millis(200));
    assert!(claiming.exists(), "recovery removed a claim in progress");
    // The claim goes on: locked, renamed into place, done.
    held.lock().unwrap();
    std::fs::rename(&claiming, &lock).unwrap();
    drop(turn);
    assert_eq!(recovery.join().unwrap(), Vec::new());
    assert!(lock.exists(), "recovery removed a live owner's lock");
}

/// A ledger in a fresh folder with one run started by a live owner: the folder, the ledger's
/// path, the ledger, the owner and the run.
fn a_running_run() -> (tempfile::TempDir, std::path::PathBuf, Ledger, Owner, i64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let mut ledger = Ledger::open(&path).unwrap();
    let owner = Owner::claim(&path, dir.path()).unwrap();
    let run = ledger
        .create_run(&new_run(&serde_json::json!({}), &["a"], &owner))
        .unwrap();
    (dir, path, ledger, owner, run)
}

/// A dead owner another recovery has taken over (it holds the owner's lock) is left to that
/// recovery, and the turn is free meanwhile: of two kavis opening the ledger at once, one
/// recovers each dead owner, and claims do not wait for the slow part of a recovery.
#[test]
fn a_dead_owner_another_recovery_holds_is_left_to_it() {
    let (_dir, path, mut ledger, owner, run) = a_running_run();
    // A noted owner keeps its lock file when it goes.
    owner.note_stop("the test stopped it");
    let locks = locks_dir(&path);
    let lock = locks.join(format!("{}.lock", owner.name()));
    let name = owner.name().to_owned();
    drop(owner);
    // What a recovery decides in its turn: the owner is dead, and now it is this recovery's.
    let taken = ledger.dead_owners().unwrap();
    assert_eq!(taken.iter().map(|(n, _)| n).collect::<Vec<_>>(), [&name]);
    assert!(ledger.dead_owners().unwrap().is_empty(), "taken twice");
    drop(taken);
    let recovering = File::open(&lock).unwrap();
    recovering.lock().unwrap();
    ledger.recover_interrupted().unwrap();
    assert_eq!(
        ledger.run_detail(run).unwrap().run.status,
        RunStatus::Running
    );
    assert!(
        lock.exists(),
        "the other recovery's owner was removed under it"
    );
    assert!(owner::take_turn_within(&locks, true, Duration::from_millis(200)).is_ok());
    drop(recovering);
    ledger.recover_interrupted().unwrap();
    let detail = ledger.run_detail(run).unwrap().run;
    assert_eq!(detail.status, RunStatus::Interrupted);
    assert!(
        detail
            .error
            .unwrap_or_default()
            .contains("the test stopped it")
    );
    assert!(!lock.exists());
}

/// An owner known only from its rows (its files gone: an older kavi, or a recovery cut short)
/// is taken by one recovery alone: a placeholder lock, held, tells the others.
#[test]
fn an_owner_known_only_from_its_rows_is_taken_by_one_recovery() {
    let (_dir, path, mut ledger, owner, run) = a_running_run();
    let name = owner.name().to_owned();
    drop(owner);
    let locks = locks_dir(&path);
    let files = |locks: &std::path::Path| {
        std::fs::read_dir(locks)
            .unwrap()
            .filter(|entry| {
                entry
                    .as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(&name)
            })
            .count()
    };
    assert_eq!(files(&locks), 0, "the owner's files are gone");
    let taken = ledger.dead_owners().unwrap();
    assert_eq!(taken.iter().map(|(n, _)| n).collect::<Vec<_>>(), [&name]);
    assert!(ledger.dead_owners().unwrap().is_empty(), "taken twice");
    drop(taken);
    ledger.recover_interrupted().unwrap();
    assert_eq!(
        ledger.run_detail(run).unwrap().run.status,
        RunStatus::Interrupted
    );
    assert_eq!(files(&locks), 0, "the placeholder is left behind");
}

#[test]
fn a_run_whose_owner_is_gone_is_marked_interrupted_and_a_live_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let mut ledger = Ledger::open(&path).unwrap();
    let (live_owner, dead_owner) = (
        Owner::claim(&path, dir.path()).unwrap(),
        Owner::claim(&path, dir.path()).unwrap(),
    );
    let params = serde_json::json!({});
    let live = ledger
        .create_run(&new_run(&params, &["a"], &live_owner))
        .unwrap();
    let dead = ledger
        .create_run(&new_run(&params, &["a"], &dead_owner))
        .unwrap();
    ledger.start_node(dead, "a", "exec", 1, &now()).unwrap();
    let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
    let spec = store.put_bytes("SKILL_SPEC", b"{}").unwrap();
    ledger
        .propose_skill(&NewSkill {
            name: "s",
            description: "",
            side_effect: "READ_ONLY",
            spec: &spec,
            proposal_path: "proposals/s.toml",
            initial_state: "PROPOSED",
            actor: "test",
        })
        .unwrap();
    let build = ledger.start_build("s", dead, "a").unwrap();
    let execution = ExecutionRecord {
        execution_id: "e1".into(),
        parent_execution_id: None,
        skill: "s".into(),
        source_hash: None,
        skill_version: None,
        side_effect: "READ_ONLY".into(),
        input: None,
        output: None,
        success: false,
        error: None,
        started_at: now(),
        finished_at: now(),
        duration_ms: 0,
        chain: None,
        step: None,
        run_id: None,
        confinement: None,
        caller: None,
    };
    ledger
        .start_execution(&execution, dead_owner.name())
        .unwrap();
    // Releasing the lock is what a dying process does.
    drop(dead_owner);

    let reopened = Ledger::open(&path).unwrap();
    assert_eq!(
        reopened.run_detail(live).unwrap().run.status,
        RunStatus::Running
    );
    let detail = reopened.run_detail(dead).unwrap();
    assert_eq!(detail.run.status, RunStatus::Interrupted);
    assert_eq!(detail.nodes[0].state, NodeState::Interrupted);
    assert_eq!(reopened.build(build.id).unwrap().status, "interrupted");
    let status: String = reopened
        .conn
        .query_row("SELECT status FROM executions WHERE id = 'e1'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(status, "interrupted");
    drop(live_owner);
}

#[test]
fn migrations_are_recorded_and_a_newer_ledger_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    drop(Ledger::open(&path).unwrap());
    kavi_db::memory::use_mimalloc();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema::MIGRATIONS.len() as i64);
    conn.execute("UPDATE schema_version SET version = 999", [])
        .unwrap();
    drop(conn);
    assert!(matches!(
        Ledger::open(&path),
        Err(LedgerError::TooNew { found: 999, .. })
    ));
}

/// Opening a ledger hands SQLite mimalloc (see `kavi_db::memory`).
#[test]
fn sqlite_allocates_from_mimalloc_uncounted_once_a_ledger_is_opened() {
    let (_dir, _ledger, _owner) = crate::testing::fresh_ledger();
    // SAFETY: a block SQLite allocates and frees again.
    unsafe {
        let block = rusqlite::ffi::sqlite3_malloc(64);
        assert!(!block.is_null());
        assert!(libmimalloc_sys::mi_is_in_heap_region(block));
        // Nothing counted: no statistics, so no lock around the allocation.
        assert_eq!(rusqlite::ffi::sqlite3_memory_used(), 0);
        rusqlite::ffi::sqlite3_free(block);
    }
}

/// The skill pages (`kavi serve`) read each table through an index, in the order they show its
/// rows, seeking straight to the page asked for: no table is scanned and nothing is sorted,
/// however many gate results, executions or skills there are. Each query is the text the
/// ledger runs; a missing index, or a query no index serves, changes its plan and fails this.
#[test]
fn the_skill_pages_seek_by_index_and_sort_nothing() {
    let (dir, _ledger, _owner) = fresh_ledger();
    let conn = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    let plan = |sql: &str| -> Vec<String> {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        // Planned as prepared, before any value is bound: every parameter NULL.
        let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
        stmt.query_map(rusqlite::params_from_iter(nulls), |row| {
            row.get::<_, String>(3)
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    };
    for (sql, expected) in [
        (
            crate::skills::skills_page_sql(),
            &[
                "SEARCH s USING INDEX sqlite_autoindex_skills_1 (name>?)",
                "SEARCH v USING INDEX sqlite_autoindex_skill_versions_1 (skill=? AND version=?)",
            ][..],
        ),
        (
            crate::skills::SKILL_TRANSITIONS.to_owned(),
            &["SEARCH skill_transitions USING INDEX skill_transitions_skill (skill=?)"],
        ),
        (
            crate::verifications::skill_verifications_sql(),
            &["SEARCH verifications USING INDEX verifications_skill (skill=? AND rowid<?)"],
        ),
        (
            crate::verifications::LATEST_TOOLCHAINS.to_owned(),
            &[
                "SEARCH verifications USING INDEX verifications_skill_run (skill=? AND run_id=?)",
                "SCALAR SUBQUERY 1",
                "SEARCH verifications USING COVERING INDEX verifications_skill_run (skill=?)",
            ],
        ),
        (
            crate::executions::skill_executions_sql(),
            &["SEARCH executions USING INDEX executions_skill (skill=? AND started_at<?)"],
        ),
        (
            crate::builds::skill_builds_sql(),
            &["SEARCH builds USING INDEX sqlite_autoindex_builds_1 (skill=?)"],
        ),
    ] {
        assert_eq!(plan(&sql), expected, "{sql}");
    }
}

/// A turn another process holds for longer than any kavi does is given up with a message naming
/// the file, not waited on for ever (any account that could open it once could hold it).
#[test]
fn a_turn_held_too_long_is_given_up_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let _ledger = Ledger::open(&path).unwrap();
    let locks = locks_dir(&path);
    // Another open file description of the same file: its lock conflicts, as another
    // process's would.
    let holder = File::open(locks.join("claims.turns")).unwrap();
    holder.lock().unwrap();
    let error = owner::take_turn_within(&locks, false, Duration::from_millis(200)).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
    assert!(
        error.to_string().contains("claims.turns") && error.to_string().contains("gave up"),
        "{error}"
    );
    drop(holder);
    assert!(owner::take_turn_within(&locks, true, Duration::from_millis(200)).is_ok());
}

/// The locks folder and the ledger's files are closed to every account but the ledger's own (and
/// its group's when the group may write the state folder): what an older kavi left open is
/// closed when the ledger is opened.
#[test]
fn the_locks_folder_is_closed_to_accounts_that_may_not_write_the_state() {
    use std::os::unix::fs::PermissionsExt as _;
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = state.join("ledger.db");
    let ledger = Ledger::open(&path).unwrap();
    let locks = locks_dir(&path);
    assert_eq!(mode(&locks), 0o700);
    // SQLite gives the write-ahead log and its index the database's mode: a reader of the index
    // could hold its write lock and stop every writer.
    let wal_index = state.join("ledger.db-shm");
    assert_eq!((mode(&path), mode(&wal_index)), (0o600, 0o600));
    // The lock files inside are closed too, should the folder ever be opened again.
    let owner = Owner::claim(&path, dir.path()).unwrap();
    let turns = locks.join("claims.turns");
    for file in std::fs::read_dir(&locks).unwrap() {
        let file = file.unwrap().path();
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    // The ledger stays open, so that its `-shm` stays too.
    drop(owner);
    for (opened, older) in [
        (&locks, 0o755),
        (&path, 0o644),
        (&wal_index, 0o644),
        (&turns, 0o644),
    ] {
        std::fs::set_permissions(opened, std::fs::Permissions::from_mode(older)).unwrap();
    }
    drop(Ledger::open(&path).unwrap());
    assert_eq!(
        [&locks, &path, &wal_index, &turns].map(|file| mode(file)),
        [0o700, 0o600, 0o600, 0o600],
        "what an older kavi left open is closed"
    );
    drop(ledger);
    // A team's state folder, writable by its group: the group keeps its way in.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o2775)).unwrap();
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o2775)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
    drop(Ledger::open(&path).unwrap());
    assert_eq!((mode(&locks), mode(&path)), (0o2770, 0o660));
}

/// An owner of this machine whose lock is in another folder (another account's cache, or a
/// kavi a node started with another cache home, on a server's ledger) is alive while its
/// process is: the pid, started no later than the name was made. A pid reused by a process
/// started after the name, or no process at all, is not it.
#[test]
fn an_owner_is_still_running_while_its_process_is() {
    let pid = std::process::id();
    let now = jiff::Timestamp::now().as_nanosecond();
    assert!(owner::still_running(&format!("{pid}-{now}@host")));
    assert!(!owner::still_running(&format!("{pid}-1000@host")));
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    let gone = ended.id();
    ended.wait().unwrap();
    assert!(!owner::still_running(&format!("{gone}-{now}@host")));
    assert!(!owner::still_running("not-an-owner"));
    // A name the ledger holds may carry any digits: no overflow, no panic.
    assert!(owner::still_running(&format!("{pid}-{}@host", i128::MAX)));
    assert!(!owner::still_running(&format!("{pid}-{}0@host", i128::MAX)));
}
