//! The root of trust the workspace cannot redirect: kavi's keys live outside it, the journal is
//! MACed under a key no other process has, checkpoints are pinned to one signing key and found
//! by the ledger's identity wherever it moves, and `ledger verify` changes nothing.

use crate::common;

use common::{attacker_connection, kavi, kavi_command};

use std::path::Path;
use std::process::Output;

/// One node that fails, one that succeeds: a run whose status an attacker would flip.
const PIPELINE: &str = r#"
[pipeline]
name = "two"

[nodes.ok]
kind = "exec"
shell = "echo fine"

[nodes.bad]
kind = "exec"
shell = "exit 3"
"#;

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pipelines")).unwrap();
    std::fs::write(dir.path().join("kavi.toml"), "# a workspace\n").unwrap();
    std::fs::write(dir.path().join("pipelines/two.toml"), PIPELINE).unwrap();
    let out = kavi(dir.path(), &["pipeline", "run", "two"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    dir
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// kavi with its keys in `keys` (a folder of the operator's, outside the workspace), holding
/// the MAC key the tests' runs were journaled under.
fn with_keys(root: &Path, keys: &Path, args: &[&str]) -> Output {
    kavi_command(root, args)
        .env("KAVI_KEYS", keys)
        .output()
        .unwrap()
}

/// A keys folder of a test's own: the tests' MAC key, no signing key yet.
fn keys_folder() -> tempfile::TempDir {
    let keys = tempfile::tempdir().unwrap();
    let shared = common::config_home().join("kavi/journal.key");
    if !shared.exists() {
        // The first ledger kavi opens makes it.
        drop(workspace());
    }
    std::fs::copy(shared, keys.path().join("journal.key")).unwrap();
    keys
}

/// [`with_keys`], which must succeed.
fn succeeds(root: &Path, keys: &Path, args: &[&str]) {
    let out = with_keys(root, keys, args);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
}

fn verify(root: &Path, keys: &Path) -> (i32, String) {
    let out = with_keys(root, keys, &["ledger", "verify"]);
    (out.status.code().unwrap(), text(&out))
}

#[test]
fn a_signing_key_named_by_the_workspace_is_refused_where_it_is_named() {
    let dir = workspace();
    let elsewhere = tempfile::tempdir().unwrap();
    let key = elsewhere.path().join("mine.key");
    std::fs::write(
        dir.path().join("kavi.toml"),
        format!("jobs = 2\nsigning_key = \"{}\"\n", key.display()),
    )
    .unwrap();
    for command in [&["ledger", "keygen"][..], &["ledger", "verify"]] {
        let out = kavi(dir.path(), command);
        assert_eq!(out.status.code(), Some(4), "{}", text(&out));
        let said = text(&out);
        assert!(said.contains("kavi.toml:2:"), "{said}");
        assert!(said.contains("`signing_key` is no longer read"), "{said}");
    }
    assert!(!key.exists());
    // Nor may the operator's keys folder lie in the workspace.
    std::fs::write(dir.path().join("kavi.toml"), "# a workspace\n").unwrap();
    let inside = with_keys(dir.path(), &dir.path().join(".keys"), &["ledger", "keygen"]);
    assert_eq!(inside.status.code(), Some(4), "{}", text(&inside));
    assert!(text(&inside).contains("lies in the workspace"));
    assert!(!dir.path().join(".keys").exists());
}

/// The attacks of issue 53, each by a process without kavi's keys that journals its edit
/// through the public hash function, so that the public chain holds: with no checkpoint at all,
/// the MACs catch every one.
#[test]
fn edits_journaled_without_the_key_are_caught_with_no_checkpoint() {
    let keys = keys_folder();
    let attacks: [(&str, &str); 4] = [
        ("a failed run made to succeed", "UPDATE runs SET status = 'succeeded'"),
        ("a run deleted", "DELETE FROM node_runs; DELETE FROM runs"),
        (
            "an approval added by another account",
            "INSERT INTO skill_transitions (skill, from_state, to_state, run_id, node_id, actor, at, comment)
             VALUES ('demo', 'VERIFIED', 'TRUSTED', 1, NULL, 'uid 4242', '2026-01-01T00:00:00Z',
                     'approved in review by uid 4242')",
        ),
        (
            "where a spec was read from changed",
            "UPDATE specs SET path = 'policies/other.toml'",
        ),
    ];
    for (attack, sql) in attacks {
        let dir = workspace();
        assert_eq!(
            verify(dir.path(), keys.path()).0,
            0,
            "{attack}: clean before"
        );
        attacker_connection(dir.path()).execute_batch(sql).unwrap();
        let (code, said) = verify(dir.path(), keys.path());
        assert_eq!(code, 1, "{attack}: {said}");
        assert!(said.contains("its MAC does not hold"), "{attack}: {said}");
        // The public chain and the rows agree: only the MAC tells.
        assert!(!said.contains("table "), "{attack}: {said}");
    }
}

/// Recomputes every entry's hash, as a writer who edited the journal directly would.
fn rechain(conn: &rusqlite::Connection) {
    let entries: Vec<(i64, String, String, String, String)> = conn
        .prepare("SELECT seq, tbl, op, key, content FROM journal ORDER BY seq")
        .unwrap()
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let mut prev = String::new();
    for (seq, table, op, key, content) in entries {
        let hash = kavi::ledger::journal::entry_hash(&prev, seq, &table, &op, &key, &content);
        conn.execute(
            "UPDATE journal SET prev = ?1, hash = ?2 WHERE seq = ?3",
            rusqlite::params![prev, hash, seq],
        )
        .unwrap();
        prev = hash;
    }
}

/// A row edited behind the triggers, its last entry made to say the same, and the whole public
/// chain recomputed: caught by the MACs, and by the checkpoint when there is one.
#[test]
fn a_rewritten_and_rechained_journal_is_caught_with_and_without_checkpoints() {
    let keys = keys_folder();
    for checkpointed in [false, true] {
        let dir = workspace();
        if checkpointed {
            let _ = with_keys(dir.path(), keys.path(), &["ledger", "keygen"]);
            let out = with_keys(dir.path(), keys.path(), &["ledger", "checkpoint"]);
            assert!(out.status.success(), "{}", text(&out));
        }
        let conn = rusqlite::Connection::open(dir.path().join(".kavi/ledger.db")).unwrap();
        conn.execute_batch(
            r#"DROP TRIGGER journal_runs_update;
               UPDATE runs SET status = 'succeeded';
               UPDATE journal SET content = replace(content, '"status":"failed"', '"status":"succeeded"')
               WHERE tbl = 'runs';"#,
        )
        .unwrap();
        rechain(&conn);
        drop(conn);
        let (code, said) = verify(dir.path(), keys.path());
        assert_eq!(code, 1, "{said}");
        assert!(said.contains("its MAC does not hold"), "{said}");
        assert_eq!(
            said.contains("no longer has the hash it signed"),
            checkpointed,
            "{said}"
        );
    }
}

/// The checkpoint log is found by the ledger's identity: a workspace moved elsewhere keeps its
/// protection against a ledger rolled back to before its last checkpoint (every entry of the
/// older file MACed, so only the checkpoint tells).
#[test]
fn a_moved_workspace_keeps_its_checkpoint_protection() {
    let keys = keys_folder();
    let dir = workspace();
    let ledger = dir.path().join(".kavi/ledger.db");
    let older = std::fs::read(&ledger).unwrap();
    assert!(!dir.path().join(".kavi/ledger.db-wal").exists());
    assert_eq!(
        kavi(dir.path(), &["pipeline", "run", "two"]).status.code(),
        Some(1)
    );
    assert!(
        with_keys(dir.path(), keys.path(), &["ledger", "keygen"])
            .status
            .success()
    );
    let signed = with_keys(dir.path(), keys.path(), &["ledger", "checkpoint"]);
    assert!(signed.status.success(), "{}", text(&signed));
    assert_eq!(verify(dir.path(), keys.path()).0, 0);

    let moved = tempfile::tempdir().unwrap();
    let root = moved.path().join("elsewhere");
    std::fs::rename(dir.path(), &root).unwrap();
    assert_eq!(verify(&root, keys.path()).0, 0, "moved, untouched");
    std::fs::write(root.join(".kavi/ledger.db"), &older).unwrap();
    let (code, said) = verify(&root, keys.path());
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains("in the log beside the key: journal entry"),
        "{said}"
    );
    assert!(!said.contains("its MAC does not hold"), "{said}");
}

/// A ledger swapped, in place, for another of the same account (its own identity, every entry
/// MACed under the same key): the location's last checkpointed identity tells.
#[test]
fn a_ledger_swapped_for_another_is_seen() {
    let keys = keys_folder();
    let dir = workspace();
    assert!(
        with_keys(dir.path(), keys.path(), &["ledger", "keygen"])
            .status
            .success()
    );
    assert!(
        with_keys(dir.path(), keys.path(), &["ledger", "checkpoint"])
            .status
            .success()
    );
    let other = workspace();
    std::fs::copy(
        other.path().join(".kavi/ledger.db"),
        dir.path().join(".kavi/ledger.db"),
    )
    .unwrap();
    let (code, said) = verify(dir.path(), keys.path());
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("it was swapped for another"), "{said}");
    // Its rules govern nothing here: no run starts on it.
    let run = with_keys(dir.path(), keys.path(), &["pipeline", "run", "two"]);
    assert_eq!(run.status.code(), Some(4), "{}", text(&run));
    assert!(
        text(&run).contains("it was swapped for another"),
        "{}",
        text(&run)
    );
    assert!(!text(&run).contains("fine"), "{}", text(&run));
    // Signed here, it is taken on.
    succeeds(dir.path(), keys.path(), &["ledger", "checkpoint"]);
    let run = with_keys(dir.path(), keys.path(), &["pipeline", "run", "two"]);
    assert_eq!(run.status.code(), Some(1), "{}", text(&run));
}

/// A ledger rolled back to a copy from before its last checkpoint no longer holds the entry
/// that checkpoint signed: no run starts on it until it is signed again.
#[test]
fn a_ledger_rolled_back_from_before_its_last_checkpoint_governs_nothing() {
    let keys = keys_folder();
    let dir = workspace();
    let root = dir.path();
    succeeds(root, keys.path(), &["ledger", "keygen"]);
    let ledger = root.join(".kavi/ledger.db");
    let older = root.join("older.db");
    std::fs::copy(&ledger, &older).unwrap();
    let run = with_keys(root, keys.path(), &["pipeline", "run", "two"]);
    assert_eq!(run.status.code(), Some(1), "{}", text(&run));
    succeeds(root, keys.path(), &["ledger", "checkpoint"]);
    std::fs::copy(&older, &ledger).unwrap();
    let run = with_keys(root, keys.path(), &["pipeline", "run", "two"]);
    assert_eq!(run.status.code(), Some(4), "{}", text(&run));
    assert!(
        text(&run).contains("does not hold its last checkpoint"),
        "{}",
        text(&run)
    );
    let (code, said) = verify(root, keys.path());
    assert_eq!(code, 1, "{said}");
    // Without a keys folder that checkpointed it, nothing holds it back.
    let run = kavi(root, &["pipeline", "run", "two"]);
    assert_eq!(run.status.code(), Some(1), "{}", text(&run));
}

/// The first checkpoint pins its key. A checkpoint signed by another key is refused, by
/// `checkpoint` and by `verify`, unless a rotation signed by the pinned key names it.
#[test]
fn a_checkpoint_by_another_key_is_refused_unless_the_pinned_key_rotated_to_it() {
    let keys = keys_folder();
    let dir = workspace();
    let root = dir.path();
    assert!(
        with_keys(root, keys.path(), &["ledger", "keygen"])
            .status
            .success()
    );
    assert!(
        with_keys(root, keys.path(), &["ledger", "checkpoint"])
            .status
            .success()
    );
    // Handed over by the pinned key: the new key's checkpoints verify.
    let rotated = with_keys(root, keys.path(), &["ledger", "rotate-key"]);
    assert!(rotated.status.success(), "{}", text(&rotated));
    assert!(
        text(&rotated).contains("1 ledger logs hand over"),
        "{}",
        text(&rotated)
    );
    assert!(
        with_keys(root, keys.path(), &["ledger", "checkpoint"])
            .status
            .success()
    );
    let (code, said) = verify(root, keys.path());
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("2 checkpoints, signed by the pinned key"),
        "{said}"
    );

    // A key put in the pinned one's place, without a rotation: `checkpoint` refuses it.
    let swapped = keys_folder();
    common::copy_dir(
        &keys.path().join("ledgers"),
        &swapped.path().join("ledgers"),
    );
    assert!(
        with_keys(root, swapped.path(), &["ledger", "keygen"])
            .status
            .success()
    );
    let refused = with_keys(root, swapped.path(), &["ledger", "checkpoint"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("is not the key this ledger's checkpoints are pinned to"));

    // A checkpoint signed elsewhere with a key of the writer's own, into the ledger.
    let own = keys_folder();
    assert!(
        with_keys(root, own.path(), &["ledger", "keygen"])
            .status
            .success()
    );
    assert!(
        with_keys(root, own.path(), &["ledger", "checkpoint"])
            .status
            .success()
    );
    let (code, said) = verify(root, keys.path());
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains("which is not a key this ledger's log pins"),
        "{said}"
    );
    // And a rotation record not signed by the pinned key, appended to the log, pins nothing.
    let log = std::fs::read_dir(keys.path().join("ledgers"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.extension().is_some_and(|ext| ext == "log"))
        .unwrap();
    let forged = format!(
        "{{\"record\":\"rotate\",\"from\":\"{}\",\"to\":\"{}\",\"signature\":\"{}\"}}\n",
        "00".repeat(32),
        "11".repeat(32),
        "22".repeat(64)
    );
    let mut text_of_log = std::fs::read_to_string(&log).unwrap();
    text_of_log.push_str(&forged);
    std::fs::write(&log, text_of_log).unwrap();
    let (_, said) = verify(root, keys.path());
    assert!(said.contains("is not signed by the pinned key"), "{said}");
}

/// A ledger on read-only media is read by every command that only reads it, and a command that
/// records says the ledger is read-only, before it writes anything.
#[test]
fn a_read_only_ledger_is_read_and_never_written() {
    let dir = workspace();
    let root = dir.path();
    let state = root.join(".kavi");
    let before = std::fs::read(state.join("ledger.db")).unwrap();
    for (args, shows) in [
        (&["runs", "list"][..], "two"),
        (&["runs", "show", "1"][..], "bad"),
        (&["ledger", "verify"][..], "ok:"),
    ] {
        let Some(out) = common::kavi_with_read_only(&state, root, args) else {
            return;
        };
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(shows), "{args:?}: {}", text(&out));
    }
    for args in [
        &["pipeline", "run", "two"][..],
        &["skill", "run", "word_count", "--input", "{}"][..],
    ] {
        let out = common::kavi_with_read_only(&state, root, args).unwrap();
        assert_ne!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("is read-only") && text(&out).contains("read-only file system"),
            "{args:?}: {}",
            text(&out)
        );
    }
    assert_eq!(std::fs::read(state.join("ledger.db")).unwrap(), before);
}

/// A ledger another account may read but not write (its folder and file without write
/// permission, as `chmod` leaves a team's archived workspace) is read by that account's commands
/// that only read it: opened read-only, nothing migrated, recovered or written.
#[test]
fn a_ledger_another_account_cannot_write_is_read() {
    use std::os::unix::fs::PermissionsExt as _;
    if !common::other_accounts_or_skip() {
        return;
    }
    let dir = workspace();
    let root = dir.path();
    if common::postgres::ledger_for(root).is_some() {
        // The ledger is on the server: its files' modes do not apply.
        return;
    }
    common::open_to_other_accounts(root);
    let state = root.join(".kavi");
    let ledger = state.join("ledger.db");
    std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o555)).unwrap();
    let before = std::fs::read(&ledger).unwrap();
    for (args, shows) in [
        (&["runs", "list"][..], "two"),
        (&["runs", "show", "1"][..], "bad"),
        (&["ledger", "verify"][..], "ok:"),
    ] {
        let out = common::kavi_as(4301, root, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(shows), "{args:?}: {}", text(&out));
    }
    assert_eq!(std::fs::read(&ledger).unwrap(), before);
}

/// `ledger verify` opens the ledger read-only: a run left by a kavi that was killed (which any
/// other command would recover, writing) is read as it is, and no byte of the file changes, nor
/// is a write-ahead log made.
#[test]
fn ledger_verify_changes_nothing() {
    let keys = keys_folder();
    let dir = workspace();
    let root = dir.path();
    std::fs::write(
        root.join("pipelines/long.toml"),
        "[pipeline]\nname = \"long\"\n[nodes.wait]\nkind = \"exec\"\nshell = \"echo $$ > started; exec sleep 60\"\n",
    )
    .unwrap();
    let mut running = kavi_command(root, &["pipeline", "run", "long"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Its node started and its run is recorded.
    let recorded = || {
        rusqlite::Connection::open(root.join(".kavi/ledger.db"))
            .and_then(|conn| {
                conn.query_row(
                    "SELECT count(*) FROM node_runs n JOIN runs r ON r.id = n.run_id
                     WHERE r.pipeline = 'long' AND n.state = 'running'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .is_ok_and(|count| count == 1)
    };
    while !root.join("started").exists() || !recorded() {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    running.kill().unwrap();
    running.wait().unwrap();
    // The node, orphaned, is not left to sleep on.
    let node: i32 = std::fs::read_to_string(root.join("started"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(node),
        nix::sys::signal::Signal::SIGKILL,
    );
    // What the killed kavi left in its write-ahead log is moved into the file, as SQLite does
    // when the last connection closes.
    let conn = rusqlite::Connection::open(root.join(".kavi/ledger.db")).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    drop(conn);
    let ledger = root.join(".kavi/ledger.db");
    let wal = root.join(".kavi/ledger.db-wal");
    let shm = root.join(".kavi/ledger.db-shm");
    assert!(!wal.exists() && !shm.exists());
    let before = std::fs::read(&ledger).unwrap();
    let modified = std::fs::metadata(&ledger).unwrap().modified().unwrap();
    let (code, said) = verify(root, keys.path());
    assert_eq!(code, 0, "{said}");
    assert_eq!(
        std::fs::read(&ledger).unwrap(),
        before,
        "verify wrote to the ledger"
    );
    assert_eq!(
        std::fs::metadata(&ledger).unwrap().modified().unwrap(),
        modified
    );
    assert!(
        !wal.exists() && !shm.exists(),
        "verify left a write-ahead log"
    );
    // The run is still as the killed kavi left it: verify recovered nothing.
    let status: String = rusqlite::Connection::open(&ledger)
        .unwrap()
        .query_row("SELECT status FROM runs WHERE pipeline = 'long'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(status, "running");
}
