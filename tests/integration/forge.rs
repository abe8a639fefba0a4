//! The forge end to end, offline, with the shipped pipeline, policies, templates, proposals and
//! scripted builder: a proposal becomes TRUSTED, and each refusal leaves the target untouched.
//! The scripted builder stands in for a coding agent, which cannot run here.

use crate::common;

use common::{json, kavi, node, shipped_workspace, verification};

use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// The attempts of a forge run: its child runs, in order, each as `kavi runs show --json`.
fn attempts(root: &Path, run: &Value) -> Vec<Value> {
    run["children"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|child| {
            json(&kavi(
                root,
                &["runs", "show", &child["id"].to_string(), "--json"],
            ))
        })
        .collect()
}

/// The newest forge run and its attempts.
fn last_forge(root: &Path) -> (Value, Vec<Value>) {
    let run = json(&kavi(root, &["runs", "show", "--json"]));
    let attempts = attempts(root, &run);
    (run, attempts)
}

/// The build packet an attempt's build node wrote.
fn packet_of(attempt: &Value) -> String {
    std::fs::read_to_string(
        node(attempt, "build")["outputs"]["packet_path"]
            .as_str()
            .unwrap(),
    )
    .unwrap()
}

/// Runs the shipped forge for `skill`; `flaws` is for the scripted builder ("" for none).
fn forge(root: &Path, skill: &str, flaws: &str) -> Output {
    let (skill, flaws) = (format!("skill={skill}"), format!("flaws={flaws}"));
    kavi(
        root,
        &["pipeline", "run", "forge", "--set", &skill, "--set", &flaws],
    )
}

#[test]
fn the_forge_takes_a_proposal_to_trusted_and_the_ledger_has_every_record() {
    let dir = shipped_workspace();
    let root = dir.path();
    let out = kavi(
        root,
        &["pipeline", "run", "forge.toml", "--set", "skill=word_count"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let (forge, attempts) = last_forge(root);
    assert_eq!(node(&forge, "propose")["state"], "succeeded");
    assert_eq!(node(&forge, "attempt")["state"], "succeeded");
    assert_eq!(attempts.len(), 1, "one attempt was enough");
    let run = &attempts[0];
    assert_eq!(run["parent_run"], forge["id"]);
    let states: Vec<(&str, &str)> = run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["node_id"].as_str().unwrap(), n["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [
            ("propose", "succeeded"),
            ("reset", "skipped"),
            ("sandbox", "succeeded"),
            ("build", "succeeded"),
            ("diff", "succeeded"),
            ("copy", "succeeded"),
            ("built", "succeeded"),
            ("verify", "succeeded"),
            ("verified", "succeeded"),
            ("promote", "succeeded"),
            ("classify", "skipped"),
            ("advise", "skipped"),
            ("escalate", "skipped"),
        ]
    );
    // The sandbox was made outside the workspace, and went with its successful attempt.
    let sandbox = Path::new(node(run, "sandbox")["outputs"]["path"].as_str().unwrap());
    assert!(!sandbox.starts_with(root), "{}", sandbox.display());
    assert!(!sandbox.exists(), "the sandbox was left behind");
    let doctor = String::from_utf8_lossy(&kavi(root, &["doctor"]).stdout).into_owned();
    assert!(
        doctor.contains("sandboxes") && doctor.contains("none left in"),
        "{doctor}"
    );
    // The forge run reads its attempt's outputs through the `pipeline` node.
    assert_eq!(
        node(&forge, "attempt")["outputs"]["nodes"]["promote"]["outputs"]["source_hash"],
        node(run, "promote")["outputs"]["source_hash"]
    );
    // One verification row per gate, all passed, at the hash that was promoted.
    let verifications = run["verifications"].as_array().unwrap();
    let gates: Vec<&str> = verifications
        .iter()
        .map(|v| v["gate"].as_str().unwrap())
        .collect();
    assert_eq!(
        gates,
        [
            "secrets",
            "policy",
            "invariants",
            "contract",
            "lint",
            "types",
            "tests"
        ]
    );
    assert!(verifications.iter().all(|v| v["status"] == "passed"));
    // The real tools ran, from the pinned toolchain, and each row says which version.
    for (gate, tool, version) in [
        ("lint", "ruff", "0.17.6"),
        ("types", "mypy", "2.4.1"),
        ("tests", "pytest", "9.2.0"),
    ] {
        let row = verifications.iter().find(|v| v["gate"] == gate).unwrap();
        assert_eq!(row["tool"]["tool"], tool, "{row}");
        assert_eq!(row["tool"]["version"], version, "{row}");
        assert_eq!(row["tool"]["toolchain"], "python", "{row}");
    }
    // The secret scan ran the pinned detect-secrets, the policy scan the pinned interpreter.
    let secrets = verifications
        .iter()
        .find(|v| v["gate"] == "secrets")
        .unwrap();
    assert_eq!(secrets["tool"]["version"], "1.5.0", "{secrets}");
    let policy = verifications
        .iter()
        .find(|v| v["gate"] == "policy")
        .unwrap();
    assert_eq!(policy["tool"]["tool"], "python", "{policy}");
    assert_eq!(
        node(run, "promote")["outputs"]["source_hash"],
        verifications[0]["source_hash"]
    );

    // The build: attempt 1, its packet and log as artifacts.
    let build = &node(run, "build")["outputs"];
    assert_eq!(build["attempt"], 1);
    let packet = packet_of(run);
    assert!(
        packet.starts_with("# Build packet: `word_count`\n\nBuild 1, attempt 1."),
        "{packet}"
    );
    assert!(packet.contains("- `skills/word_count/skill.py` (required)"));

    let shown = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(shown["skill"]["state"], "TRUSTED");
    assert!(root.join("skills/word_count/skill.py").is_file());
    assert!(
        kavi(root, &["skill", "verify", "word_count"])
            .status
            .success()
    );

    // A trusted skill is not rebuilt: the forge refuses before its first attempt.
    assert_eq!(
        kavi(
            root,
            &["pipeline", "run", "forge.toml", "--set", "skill=word_count"]
        )
        .status
        .code(),
        Some(1)
    );
    let (again, attempts) = last_forge(root);
    assert_eq!(
        node(&again, "propose")["error"],
        "`word_count` is TRUSTED, which is not buildable (buildable: PROPOSED, BUILT, SUSPENDED); \
         to build version 2, edit proposals/word_count.toml: the next forge builds it while \
         version 1 keeps running"
    );
    assert_eq!(node(&again, "attempt")["state"], "blocked");
    assert!(attempts.is_empty());

    // Another skill's forge reuses the provisioned toolchain: nothing is installed.
    let other = self::forge(root, "find_notes", "");
    assert!(other.status.success());
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(!stderr.contains("provisioning toolchain"), "{stderr}");

    common::assert_ledger_verifies(root);
    every_edit_outside_kavi_is_named(root);
    a_rewritten_chain_is_caught_by_the_signed_checkpoints(root);
}

/// Recomputes every journal hash from the first, as a writer who knows the format would after
/// an edit.
fn rewrite_chain(ledger: &rusqlite::Connection) {
    let entries: Vec<(i64, String, String, String, String)> = ledger
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
        ledger
            .execute(
                "UPDATE journal SET prev = ?1, hash = ?2 WHERE seq = ?3",
                rusqlite::params![prev, hash, seq],
            )
            .unwrap();
        prev = hash;
    }
}

/// An edit with the chain recomputed after it passes the public chain's checks, but not the
/// MACs; nor a checkpoint signed before it, even when the writer deletes the ledger's copy of
/// it, since the log beside the key (outside the workspace) still has it.
fn a_rewritten_chain_is_caught_by_the_signed_checkpoints(root: &Path) {
    // A keys folder of its own, shared with the forge's runs' MAC key: the runs' entries stay
    // keyed under it.
    let keys = tempfile::tempdir().unwrap();
    common::copy_dir(&common::config_home().join("kavi"), keys.path());
    let with_key = |dir: &Path, args: &[&str]| {
        common::kavi_command(dir, args)
            .env("KAVI_KEYS", keys.path())
            .output()
            .unwrap()
    };
    let copy = tempfile::tempdir().unwrap();
    common::copy_dir(root, copy.path());
    // Keys inside the workspace are refused: whoever edits the workspace could read them.
    let inside = common::kavi_command(copy.path(), &["ledger", "keygen"])
        .env("KAVI_KEYS", copy.path().join("keys"))
        .output()
        .unwrap();
    assert_eq!(inside.status.code(), Some(4));
    assert!(
        with_key(copy.path(), &["ledger", "keygen"])
            .status
            .success()
    );
    let signed = with_key(copy.path(), &["ledger", "checkpoint"]);
    assert!(
        signed.status.success(),
        "{}",
        String::from_utf8_lossy(&signed.stderr)
    );
    let clean = with_key(copy.path(), &["ledger", "verify"]);
    let stdout = String::from_utf8_lossy(&clean.stdout);
    assert!(clean.status.success(), "{stdout}");
    assert!(
        stdout.contains("1 checkpoints, signed by the pinned key"),
        "{stdout}"
    );

    // The second attack is on the ledger checkpointed, in place; the first on a copy of it
    // elsewhere, which the log (kept by the ledger's identity, not its path) still covers.
    let first = tempfile::tempdir().unwrap();
    common::copy_dir(copy.path(), first.path());
    for (attacked, delete_the_checkpoint) in [(first.path(), false), (copy.path(), true)] {
        let ledger = rusqlite::Connection::open(attacked.join(".kavi/ledger.db")).unwrap();
        // The writer puts back every trigger it drops, so that none is missing.
        let behind_the_triggers = |triggers: &[&str], sql: &str| {
            let saved: Vec<String> = triggers
                .iter()
                .map(|name| {
                    ledger
                        .query_row(
                            "SELECT sql FROM sqlite_master WHERE name = ?1",
                            [name],
                            |r| r.get(0),
                        )
                        .unwrap()
                })
                .collect();
            for name in triggers {
                ledger
                    .execute_batch(&format!("DROP TRIGGER {name}"))
                    .unwrap();
            }
            ledger.execute_batch(sql).unwrap();
            for trigger in saved {
                ledger.execute_batch(&trigger).unwrap();
            }
        };
        behind_the_triggers(
            &["journal_node_runs_update"],
            "UPDATE node_runs SET state = 'succeeded' WHERE state = 'skipped'",
        );
        // The journal is made to say the same: each row's last entry.
        ledger
            .execute_batch(
                r#"UPDATE journal SET content = replace(content, '"state":"skipped"', '"state":"succeeded"')
                   WHERE seq IN (SELECT MAX(seq) FROM journal WHERE tbl = 'node_runs' GROUP BY key)"#,
            )
            .unwrap();
        if delete_the_checkpoint {
            behind_the_triggers(
                &["journal_checkpoints_delete"],
                "DELETE FROM checkpoints; DELETE FROM journal WHERE tbl = 'checkpoints'",
            );
        }
        rewrite_chain(&ledger);
        drop(ledger);
        let out = with_key(attacked, &["ledger", "verify"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{stdout}");
        assert!(
            stdout.contains("no longer has the hash it signed (the chain was rewritten)"),
            "{stdout}"
        );
        // The MACs caught it too, though the rows and the public chain agree.
        assert!(stdout.contains("its MAC does not hold"), "{stdout}");
        assert!(!stdout.contains("table node_runs"), "{stdout}");
    }
}

/// The ledger as the forge left it, edited behind kavi's back in each way a user with write access
/// to the file could (the triggers dropped first, since the `sqlite3` shell cannot fire them):
/// `kavi ledger verify` exits 1 and names the entry, row or file.
fn every_edit_outside_kavi_is_named(root: &Path) {
    let tamperings: [(&str, &str); 6] = [
        (
            "DROP TRIGGER journal_node_runs_update; UPDATE node_runs SET state = 'succeeded' WHERE state = 'skipped'",
            "table node_runs row [",
        ),
        (
            "DROP TRIGGER journal_verifications_delete; DELETE FROM verifications WHERE id = 1",
            "table verifications row [1]: journal entry",
        ),
        (
            "DROP TRIGGER journal_specs_update; UPDATE specs SET text = text || ' ' WHERE path = 'policies/gates.toml'",
            "its text does not hash to its name",
        ),
        (
            "DROP TRIGGER journal_skill_transitions_insert; INSERT INTO skill_transitions (skill, from_state, to_state, actor, at) VALUES ('word_count', 'TRUSTED', 'TRUSTED', 'x', 'now')",
            "not in the journal (added outside kavi)",
        ),
        (
            "UPDATE journal SET content = content || ' ' WHERE seq = 40",
            "journal entry 40: its hash does not match its content",
        ),
        ("", "no longer hashes to its name (edited on disk)"),
    ];
    for (sql, named) in tamperings {
        let copy = tempfile::tempdir().unwrap();
        common::copy_dir(root, copy.path());
        let ledger = copy.path().join(".kavi/ledger.db");
        if sql.is_empty() {
            let artifacts = copy.path().join(".kavi/artifacts/sha256");
            let folder = std::fs::read_dir(&artifacts)
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path();
            let file = std::fs::read_dir(folder)
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path();
            let mut bytes = std::fs::read(&file).unwrap();
            bytes.push(b'!');
            std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
                .unwrap();
            std::fs::write(&file, bytes).unwrap();
        } else {
            rusqlite::Connection::open(&ledger)
                .unwrap()
                .execute_batch(sql)
                .unwrap();
        }
        let out = kavi(copy.path(), &["ledger", "verify"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{sql}: {stdout}");
        assert!(stdout.contains(named), "{sql}: {stdout}");
        if sql.contains("UPDATE specs") {
            // Nor is the altered text served under its old name.
            let hash: String = rusqlite::Connection::open(&ledger)
                .unwrap()
                .query_row(
                    "SELECT hash FROM specs WHERE path = 'policies/gates.toml'",
                    [],
                    |row| row.get(0),
                )
                .unwrap();
            let shown = kavi(copy.path(), &["spec", "show", &hash]);
            assert_ne!(shown.status.code(), Some(0));
            assert!(String::from_utf8_lossy(&shown.stderr).contains("no longer hashes to it"));
        }
    }
}

/// Every attempt writes outside the allowlist: each fails the diff gate naming the file, nothing
/// reaches the target, and after three failures a person must decide. A rejection ends it.
#[test]
fn builds_outside_the_allowlist_never_reach_the_target_and_repeated_failure_escalates() {
    let dir = shipped_workspace();
    let root = dir.path();
    let out = forge(root, "write_note", "1=scope,2=scope,3=scope");
    assert_eq!(out.status.code(), Some(6));
    let (run, attempts) = last_forge(root);
    assert_eq!(run["status"], "awaiting_review");
    assert_eq!(attempts.len(), 3, "the attempt limit is three");
    // The attempt node carries its child run's classification, which `retry.on` can name.
    assert_eq!(
        node(&run, "attempt")["outputs"]["failure_kind"],
        "GATE_VIOLATION"
    );
    for attempt in &attempts {
        assert_eq!(
            node(attempt, "diff")["error"],
            "changed outside the allowlist: notes.txt"
        );
        assert_eq!(node(attempt, "copy")["state"], "blocked");
    }
    assert!(!root.join("notes.txt").exists());
    assert!(
        !root.join("skills").exists(),
        "part of a refused build reached the target"
    );
    let escalate = node(&attempts[2], "escalate");
    assert_eq!(escalate["state"], "awaiting_review");
    assert_eq!(escalate["outputs"]["consecutive_failures"], 3);
    assert_eq!(
        escalate["outputs"]["triggers"][0]["trigger"],
        "REPEATED_FAILURE"
    );
    let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
    assert_eq!(shown["skill"]["state"], "PROPOSED");

    let rejected = kavi(
        root,
        &["reject", "latest", "--comment", "rethink the proposal"],
    );
    assert!(rejected.status.success());
    let (run, _) = last_forge(root);
    assert_eq!(run["status"], "rejected");
    assert_eq!(forge(root, "write_note", "").status.code(), Some(1));
    let (after, attempts) = last_forge(root);
    assert!(attempts.is_empty(), "a rejected skill gets no attempt");
    let error = node(&after, "propose")["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        error.starts_with("`write_note` was rejected in review of run 1 by "),
        "{error}"
    );
    assert!(
        error.ends_with("(rethink the proposal); it is not built again"),
        "{error}"
    );
}

/// Three consecutive failures stop the run for review; an approval resumes it, and the fourth
/// attempt goes on to promotion.
#[test]
fn an_approval_resumes_the_loop_with_the_next_attempt() {
    let dir = shipped_workspace();
    let root = dir.path();
    assert_eq!(
        forge(root, "word_count", "1=test,2=test,3=test")
            .status
            .code(),
        Some(6)
    );
    // Who approves is the account of the real uid, whatever $USER claims.
    let approved = common::kavi_command(root, &["approve", "latest", "--comment", "one more try"])
        .env("USER", "someone-else")
        .output()
        .unwrap();
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stdout)
    );
    let stdout = String::from_utf8_lossy(&approved.stdout);
    assert!(
        stdout.starts_with("approved run 1 for `word_count` (REPEATED_FAILURE) by "),
        "{stdout}"
    );
    // The resumed run's progress, its "resuming" line first, is on stderr.
    let stderr = String::from_utf8_lossy(&approved.stderr);
    assert!(
        stderr.contains("resuming run 1 (pipelines/forge.toml)"),
        "{stderr}"
    );
    assert!(!stdout.contains("someone-else"), "{stdout}");
    let me = kavi::identity::actor();
    assert!(stdout.contains(&format!(" by {me}\n")), "{stdout}");
    let first = json(&kavi(root, &["runs", "show", "1", "--json"]));
    assert_eq!(first["status"], "approved");
    assert_eq!(first["started_by"], me.as_str());
    let (resumed, attempts) = last_forge(root);
    assert_eq!(resumed["resumed_from"], 1);
    assert_eq!(resumed["status"], "succeeded");
    assert_eq!(resumed["params"]["skill"], "word_count");
    assert_eq!(node(&attempts[0], "build")["outputs"]["attempt"], 4);
    let shown = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(shown["skill"]["state"], "TRUSTED");
    common::assert_ledger_verifies(root);
}

/// With `self_approval = false` in the rules that stopped a run, the account that started it may
/// not approve it; rejecting stays open to it.
#[test]
fn the_account_that_started_a_run_may_not_approve_it_when_the_rules_say_so() {
    let dir = shipped_workspace();
    let root = dir.path();
    let rules = root.join("policies/escalation.toml");
    let text = std::fs::read_to_string(&rules).unwrap();
    std::fs::write(
        &rules,
        text.replace("self_approval = true", "self_approval = false"),
    )
    .unwrap();
    assert_eq!(
        forge(root, "word_count", "1=test,2=test,3=test")
            .status
            .code(),
        Some(6)
    );
    let refused = kavi(root, &["approve", "latest"]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("forbid approving a run by the account that started it"),
        "{stderr}"
    );
    // Editing the rules now gives nothing: the decision is refused while they weaken the
    // adopted ones.
    std::fs::write(&rules, text).unwrap();
    let refused = kavi(root, &["approve", "latest"]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("may not be approved: the governing files are not the adopted rule set")
            && stderr.contains("policies/escalation.toml: `self_approval`: false -> true"),
        "{stderr}"
    );
    let run = json(&kavi(root, &["runs", "show", "1", "--json"]));
    assert_eq!(run["status"], "awaiting_review");
    // A rejection grants nothing: it is taken under the adopted rules whatever the disk says.
    assert!(kavi(root, &["reject", "latest"]).status.success());
}

/// With `approval = { role = "reviewer", approvals = 2 }`, a stopped run needs two distinct
/// reviewers other than its starter: the starter is refused, one approval is recorded and the
/// run stays awaiting review, the same account again adds nothing, and a second account decides
/// it. The ledger keeps each approver with the roles they held.
#[test]
fn an_escalation_needs_as_many_distinct_role_holders_as_the_rules_name() {
    if !common::other_accounts_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let root = dir.path();
    let rules = root.join("policies/escalation.toml");
    let text = std::fs::read_to_string(&rules).unwrap();
    std::fs::write(
        &rules,
        text.replace(
            "self_approval = true",
            "approval = { role = \"reviewer\", approvals = 2 }",
        ),
    )
    .unwrap();
    std::fs::write(
        root.join("policies/roles.toml"),
        "[role.reviewer]\nmembers = [\"uid 4101\", \"uid 4102\", \"uid 0\"]\n\
         [role.maintainer]\nmembers = [\"uid 4103\"]\n",
    )
    .unwrap();
    assert_eq!(
        forge(root, "word_count", "1=test,2=test,3=test")
            .status
            .code(),
        Some(6)
    );
    common::open_to_other_accounts(root);
    let refused = kavi(root, &["approve", "latest", "--no-resume"]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("never count the account that started it"),
        "{stderr}"
    );
    // An account without the role is recorded, and counts for nothing.
    let outsider = common::kavi_as(4103, root, &["approve", "latest", "--no-resume"]);
    let stdout = String::from_utf8_lossy(&outsider.stdout);
    assert!(
        outsider.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&outsider.stderr)
    );
    assert!(
        stdout.contains(
            "stays awaiting review: needs 2 distinct reviewers other than the account that \
             started the run; has none"
        ),
        "{stdout}"
    );
    for _ in 0..2 {
        let first = common::kavi_as(4101, root, &["approve", "latest", "--no-resume"]);
        let stdout = String::from_utf8_lossy(&first.stdout);
        assert!(first.status.success(), "{stdout}");
        assert!(stdout.contains("; has 1: uid 4101\n"), "{stdout}");
    }
    let run = json(&kavi(root, &["runs", "show", "1", "--json"]));
    assert_eq!(run["status"], "awaiting_review");
    let second = common::kavi_as(4102, root, &["approve", "latest", "--no-resume"]);
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert!(
        second.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(
        stdout.starts_with("approved run 1 for `word_count` (REPEATED_FAILURE) by uid 4102"),
        "{stdout}"
    );
    let run = json(&kavi(root, &["runs", "show", "1", "--json"]));
    assert_eq!(run["status"], "approved");
    let recorded = common::LedgerConnection::open(root).texts("SELECT approvals FROM escalations");
    let recorded: Value = serde_json::from_str(&recorded[0]).unwrap();
    assert_eq!(
        recorded,
        serde_json::json!([
            { "actor": "uid 4103", "roles": ["maintainer"] },
            { "actor": "uid 4101", "roles": ["reviewer"] },
            { "actor": "uid 4102", "roles": ["reviewer"] },
        ])
    );
    common::assert_ledger_verifies(root);
}

/// Issue 53: an account that can edit the workspace adds itself to a role in
/// `policies/roles.toml` and approves a stopped run. The decision is refused while the files on
/// disk weaken the adopted rules, naming `kavi policy propose`; with the edit undone, the
/// adopted roles decide, and the account holds none.
#[test]
fn an_escalation_approval_reads_roles_from_the_adopted_set_not_from_disk() {
    if !common::other_accounts_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let root = dir.path();
    let rules = root.join("policies/escalation.toml");
    let text = std::fs::read_to_string(&rules).unwrap();
    std::fs::write(
        &rules,
        text.replace(
            "self_approval = true",
            "approval = { role = \"reviewer\", approvals = 1 }",
        ),
    )
    .unwrap();
    let roles = root.join("policies/roles.toml");
    let adopted = "[role.reviewer]\nmembers = [\"uid 4101\"]\n\
                   [role.maintainer]\nmembers = [\"uid 4103\"]\n";
    std::fs::write(&roles, adopted).unwrap();
    assert_eq!(
        forge(root, "word_count", "1=test,2=test,3=test")
            .status
            .code(),
        Some(6)
    );
    common::open_to_other_accounts(root);
    std::fs::write(
        &roles,
        adopted.replace("\"uid 4101\"]", "\"uid 4101\", \"uid 4102\"]"),
    )
    .unwrap();
    let refused = common::kavi_as(4102, root, &["approve", "latest", "--no-resume"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "run 1 may not be approved: the governing files are not the adopted rule set"
        ) && stderr.contains("policies/roles.toml: ")
            && stderr.contains("`kavi policy propose`"),
        "{stderr}"
    );
    let run = json(&kavi(root, &["runs", "show", "1", "--json"]));
    assert_eq!(run["status"], "awaiting_review");
    let recorded = common::LedgerConnection::open(root)
        .texts("SELECT COALESCE(approvals, '') FROM escalations");
    assert!(!recorded[0].contains("4102"), "{recorded:?}");

    std::fs::write(&roles, adopted).unwrap();
    let outsider = common::kavi_as(4102, root, &["approve", "latest", "--no-resume"]);
    let stdout = String::from_utf8_lossy(&outsider.stdout);
    assert!(outsider.status.success(), "{stdout}");
    assert!(
        stdout.contains(
            "stays awaiting review: needs 1 reviewer other than the account that \
             started the run; has none"
        ),
        "{stdout}"
    );
    let reviewer = common::kavi_as(4101, root, &["approve", "latest", "--no-resume"]);
    assert!(reviewer.status.success());
    let run = json(&kavi(root, &["runs", "show", "1", "--json"]));
    assert_eq!(run["status"], "approved");
    common::assert_ledger_verifies(root);
}

/// A pipeline of the user's own: moves `write_note` through `before`, a lenient gate set, the
/// moves `after`, then `promote`.
fn shortcut(root: &Path, before_gates: &[&str], after: &[&str]) {
    let mut text = String::from("[pipeline]\nname = \"shortcut\"\n");
    let mut before = String::new();
    for (n, to) in before_gates.iter().chain(&[""]).chain(after).enumerate() {
        let needs = if before.is_empty() {
            String::new()
        } else {
            format!("needs = [\"{before}\"]\n")
        };
        let node = format!("step{n}");
        if to.is_empty() {
            text.push_str(&format!(
                "[nodes.{node}]\nkind = \"gate\"\n{needs}skill = \"write_note\"\n\
                 set = \"policies/lenient.toml\"\nvars = {{ skill = \"write_note\" }}\n"
            ));
        } else {
            text.push_str(&format!(
                "[nodes.{node}]\nkind = \"transition\"\n{needs}skill = \"write_note\"\nto = \"{to}\"\n"
            ));
        }
        before = node;
    }
    text.push_str(&format!(
        "[nodes.promote]\nkind = \"promote\"\nneeds = [\"{before}\"]\nskill = \"write_note\"\n"
    ));
    std::fs::write(root.join("pipelines/shortcut.toml"), text).unwrap();
    std::fs::write(root.join("policies/lenient.toml"), LENIENT).unwrap();
}

/// Runs the shortcut, which fails; the error of the node that stopped it (its promote node's,
/// or a transition's before it, which the promote node then never runs after).
fn promote_by_shortcut(root: &Path) -> String {
    let out = kavi(root, &["pipeline", "run", "shortcut"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let run = json(&kavi(root, &["runs", "show", "--json"]));
    let failed: Vec<&Value> = run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["state"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{run}");
    if failed[0]["node_id"] != "promote" {
        assert_eq!(node(&run, "promote")["state"], "blocked", "{run}");
    }
    failed[0]["error"].as_str().unwrap_or_default().to_owned()
}

/// Names the shortcut among the pipelines that may promote.
fn trust_the_shortcut(root: &Path) {
    let trust = std::fs::read_to_string(root.join("policies/trust.toml")).unwrap();
    let naming = trust.replace(
        "pipelines = [\"pipelines/forge.toml\"",
        "pipelines = [\"pipelines/shortcut.toml\", \"pipelines/forge.toml\"",
    );
    assert_ne!(naming, trust);
    std::fs::write(root.join("policies/trust.toml"), &naming).unwrap();
}

const LENIENT: &str = r#"
[[gate]]
id = "anything"
kind = "command"
run = ["true"]
failure = "VERIFY_TEST"
required = true
"#;

/// Only the governed path promotes: a skill held for review is not made TRUSTED by a pipeline of
/// the user's own, nor by one the trust policy names, and a person's reject then completes.
#[test]
fn a_held_skill_is_not_promoted_by_a_shortcut_pipeline() {
    let dir = shipped_workspace();
    let root = dir.path();
    assert_eq!(forge(root, "write_note", "1=policy").status.code(), Some(6));
    shortcut(root, &[], &[]);
    let error = promote_by_shortcut(root);
    assert!(
        error.contains("is of pipelines/shortcut.toml, which policies/trust.toml does not name"),
        "{error}"
    );
    // A lenient gate set's pass does not make it VERIFIED either: the move rests on gates run
    // on what was built in the same run.
    shortcut(root, &[], &["VERIFIED"]);
    let error = promote_by_shortcut(root);
    assert!(error.contains("is earned, not declared"), "{error}");
    // Named in the trust policy, it still may not promote what another run holds for review.
    trust_the_shortcut(root);
    shortcut(root, &[], &[]);
    let error = promote_by_shortcut(root);
    assert!(
        error.contains("it awaits review in run 1; decide with `kavi approve 1`"),
        "{error}"
    );
    let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
    let held = shown["skill"]["state"].clone();
    assert!(held == "BUILT" || held == "VERIFIED", "{shown}");
    // The person's decision completes.
    let rejected = kavi(root, &["reject", "1"]);
    assert!(
        rejected.status.success(),
        "{}",
        String::from_utf8_lossy(&rejected.stderr)
    );
    let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
    assert_eq!(shown["skill"]["state"], "REJECTED");
}

/// A pipeline the trust policy names may not promote a skill it never built: the moves into
/// BUILT and VERIFIED rest on a build copied back and the gates in the same run, so a lenient
/// set's pass after declared moves does not count.
#[test]
fn a_promotion_needs_the_named_gate_set_in_the_same_run() {
    let dir = shipped_workspace();
    let root = dir.path();
    let folder = root.join("skills/write_note");
    common::copy_dir(&root.join("builders/prepared/write_note"), &folder);
    let proposed = kavi(root, &["skill", "propose", "proposals/write_note.toml"]);
    assert!(proposed.status.success());
    shortcut(root, &["BUILT"], &["VERIFIED"]);
    trust_the_shortcut(root);
    let error = promote_by_shortcut(root);
    assert!(
        error.contains("the move PROPOSED -> BUILT of `write_note` is earned, not declared"),
        "{error}"
    );
    let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
    assert_eq!(shown["skill"]["state"], "PROPOSED");
}

/// A pipeline file outside the workspace is named by its whole path, never as the workspace's
/// file it shares a name with: it does not pass for a pipeline the trust policy names.
#[test]
fn a_pipeline_outside_the_workspace_does_not_pass_for_a_named_one() {
    let dir = shipped_workspace();
    let root = dir.path();
    let elsewhere = tempfile::tempdir().unwrap();
    // The very same text, under the very same relative name, beside the workspace.
    common::copy_dir(&root.join("pipelines"), &elsewhere.path().join("pipelines"));
    let out = common::kavi_command(
        elsewhere.path(),
        &[
            "--workspace",
            &root.display().to_string(),
            "pipeline",
            "run",
            "pipelines/forge_attempt.toml",
            "--set",
            "skill=write_note",
        ],
    )
    .output()
    .unwrap();
    // The refused promotion is a failure no rule names: it goes to a person.
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let run = json(&kavi(root, &["runs", "show", "--json"]));
    let spec_path = run["spec_path"].as_str().unwrap();
    assert!(Path::new(spec_path).is_absolute(), "{spec_path}");
    assert_eq!(node(&run, "verify")["state"], "succeeded");
    let error = node(&run, "promote")["error"].as_str().unwrap();
    assert!(
        error.contains("which policies/trust.toml does not name"),
        "{error}"
    );
    // Nor may a gate node check one skill's files and record them as another's.
    shortcut(root, &[], &[]);
    let text = std::fs::read_to_string(root.join("pipelines/shortcut.toml")).unwrap();
    std::fs::write(
        root.join("pipelines/shortcut.toml"),
        text.replace(
            "vars = { skill = \"write_note\" }",
            "vars = { skill = \"find_notes\" }",
        ),
    )
    .unwrap();
    assert_eq!(
        kavi(root, &["pipeline", "run", "shortcut"]).status.code(),
        Some(1)
    );
    let run = json(&kavi(root, &["runs", "show", "--json"]));
    let error = node(&run, "step0")["error"].as_str().unwrap();
    assert!(
        error.contains("`vars.skill` (find_notes) is not the skill this node verifies"),
        "{error}"
    );
}

#[test]
fn a_forbidden_import_fails_the_policy_gate_and_the_skill_stays_built() {
    let dir = shipped_workspace();
    let root = dir.path();
    let out = forge(root, "write_note", "1=policy");
    // The policy failure is a security class: the run stops for a person's review (exit 6),
    // without trying again.
    assert_eq!(out.status.code(), Some(6));
    let (forge_run, attempts) = last_forge(root);
    assert_eq!(forge_run["status"], "awaiting_review");
    assert_eq!(attempts.len(), 1);
    let run = &attempts[0];
    let policy = verification(run, "policy").clone();
    assert_eq!(policy["status"], "failed");
    assert_eq!(
        policy["detail"],
        "skills/write_note/skill.py:4:1: [process] starts a process: imports `subprocess`"
    );
    assert_eq!(node(run, "promote")["state"], "blocked");
    let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
    assert_eq!(shown["skill"]["state"], "BUILT");
    assert_eq!(node(run, "classify")["outputs"]["kind"], "VERIFY_POLICY");
    let escalate = node(run, "escalate");
    assert_eq!(escalate["state"], "awaiting_review");
    assert_eq!(
        escalate["outputs"]["triggers"][0]["trigger"],
        "SECURITY_CLASS"
    );
    assert_eq!(
        escalate["error"],
        "awaiting review: SECURITY_CLASS (a VERIFY_POLICY failure); decide with `kavi approve 1` or `kavi reject 1`"
    );

    // Until a person decides, the loop does not go on.
    assert_eq!(forge(root, "write_note", "").status.code(), Some(1));
    let (waiting, _) = last_forge(root);
    assert_eq!(
        node(&waiting, "propose")["error"],
        "`write_note` awaits review since run 1; decide with `kavi approve 1` or `kavi reject 1`"
    );
    // Approving resumes run 1: the next attempt resets BUILT to PROPOSED, builds attempt 2
    // (no flaw), and promotes it.
    let approved = kavi(
        root,
        &["approve", "1", "--comment", "the import was the drill's"],
    );
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stdout)
    );
    assert!(
        String::from_utf8_lossy(&approved.stdout)
            .starts_with("approved run 1 for `write_note` (SECURITY_CLASS)")
    );
    let (resumed, attempts) = last_forge(root);
    assert_eq!(resumed["resumed_from"], 1);
    let run = &attempts[0];
    assert_eq!(node(run, "reset")["state"], "succeeded");
    assert_eq!(node(run, "build")["outputs"]["attempt"], 2);
    assert!(node(run, "build")["outputs"]["parent_build"].is_i64());
    // Attempt 2's packet carries attempt 1's failure analysis.
    let packet = packet_of(run);
    assert!(
        packet.contains(
            "## Previous attempt\n\nAttempt 1 (build 1) failed: **VERIFY_POLICY**, at `verify`."
        ),
        "{packet}"
    );
    assert!(packet.contains("- `policy` (failed): skills/write_note/skill.py:4:1: [process] starts a process: imports `subprocess`"), "{packet}");
    let builds = json(&kavi(root, &["builds", "list", "write_note", "--json"]));
    let lineage: Vec<(i64, Option<i64>, Option<&str>, bool)> = builds
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["attempt"].as_i64().unwrap(),
                b["parent_build"].as_i64(),
                b["failure_kind"].as_str(),
                b["research_note"].is_string(),
            )
        })
        .collect();
    assert_eq!(
        lineage,
        [
            (1, None, Some("VERIFY_POLICY"), true),
            (2, Some(1), None, false)
        ]
    );
    let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
    assert_eq!(shown["skill"]["state"], "TRUSTED");

    // A FILE_WRITE skill without --yes and without a terminal is refused and writes nothing.
    let input = r#"{"title": "First", "body": "Hello."}"#;
    let refused = kavi(root, &["skill", "run", "write_note", "--input", input]);
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "error: `write_note` is FILE_WRITE: confirm with --yes (or answer the prompt on a terminal); nothing was run\n"
    );
    assert!(!root.join("notes").exists());
    let ran = kavi(
        root,
        &["skill", "run", "write_note", "--input", input, "--yes"],
    );
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let record = json(&ran);
    assert_eq!(
        record["output"],
        serde_json::json!({"path": "notes/first.md"})
    );
    assert_eq!(record["side_effect"], "FILE_WRITE");
    assert_eq!(record["success"], true);
    assert_eq!(
        std::fs::read_to_string(root.join("notes/first.md")).unwrap(),
        "# First\n\nHello.\n"
    );
}

/// The failure canon: each engineered defect takes the whole arc in one forge run. Attempt 1
/// fails and the classifier names its kind in a research note; where the escalation rules demand
/// a review, a person approves, which resumes the run; attempt 2 gets the enriched packet,
/// passes, and the skill is promoted, with no permission widening between the two packets.
#[test]
fn the_failure_canon_each_defect_is_classified_retried_and_promoted() {
    for (flaw, kind, failed_node, failed_gate) in [
        ("fail", "BUILD_ERROR", "build", None),
        ("scope", "GATE_VIOLATION", "diff", None),
        ("link", "GATE_VIOLATION", "diff", None),
        // The policy scan cannot check what does not parse, and fails first, named for the cause.
        ("syntax", "VERIFY_LINT", "verify", Some("policy")),
        ("lint", "VERIFY_LINT", "verify", Some("lint")),
        ("type", "VERIFY_TYPES", "verify", Some("types")),
        ("test", "VERIFY_TEST", "verify", Some("tests")),
        ("policy", "VERIFY_POLICY", "verify", Some("policy")),
        // A test that reads a secret is a security violation, not a failing test.
        ("escape", "SECURITY_VIOLATION", "verify", Some("tests")),
    ] {
        let dir = shipped_workspace();
        let root = dir.path();
        let out = forge(root, "word_count", &format!("1={flaw}"));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        // A policy failure stops the run for review (exit 6) until a person approves, which
        // resumes it; the others go straight on to attempt 2.
        let security = kind == "VERIFY_POLICY" || kind == "SECURITY_VIOLATION";
        let mut attempts = last_forge(root).1;
        if security {
            assert_eq!(out.status.code(), Some(6), "{flaw}: {stdout}");
            let approved = kavi(root, &["approve", "latest"]);
            assert!(approved.status.success(), "{flaw}");
            attempts.extend(last_forge(root).1);
        } else {
            assert!(out.status.success(), "{flaw}: {stdout}");
        }
        let [first, second] = attempts.as_slice() else {
            panic!("{flaw}: expected two attempts, got {}", attempts.len());
        };
        let classify = node(first, "classify");
        assert_eq!(classify["state"], "succeeded", "{flaw}");
        assert_eq!(classify["outputs"]["kind"], kind, "{flaw}");
        assert_eq!(classify["outputs"]["facts"]["node"], failed_node, "{flaw}");
        let gates: Vec<&str> = classify["outputs"]["facts"]["failing_gates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["gate"].as_str().unwrap())
            .collect();
        // The first failing gate names the kind (a syntax error fails the later gates too).
        assert_eq!(gates.first().copied(), failed_gate, "{flaw}");
        let note: Value = serde_json::from_str(
            &std::fs::read_to_string(classify["outputs"]["note_path"].as_str().unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(note["kind"], kind, "{flaw}");
        assert_eq!(note["skill"], "word_count");
        assert!(
            !note["excerpt"].as_str().unwrap().is_empty(),
            "{flaw}: empty excerpt"
        );

        assert_eq!(node(second, "build")["outputs"]["attempt"], 2, "{flaw}");
        let (before, after) = (packet_of(first), packet_of(second));
        assert!(
            after.contains(&format!("failed: **{kind}**, at `{failed_node}`")),
            "{flaw}: {after}"
        );
        // No permission widening: the same side-effect class and the same files are allowed.
        let from = |packet: &str, heading: &str| packet[packet.find(heading).unwrap()..].to_owned();
        assert_eq!(
            from(&before, "- Side-effect class"),
            from(&after, "- Side-effect class"),
            "{flaw}"
        );
        let shown = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
        assert_eq!(shown["skill"]["state"], "TRUSTED", "{flaw}");
    }
}

/// Escalation thresholds are data: lowering `repeated_failure` in the policy file stops the
/// next run sooner, with no rebuild.
#[test]
fn editing_the_escalation_policy_changes_the_next_run() {
    let dir = shipped_workspace();
    let root = dir.path();
    let policy = root.join("policies/escalation.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    assert!(text.contains("\nrepeated_failure = 3\n"));
    std::fs::write(
        &policy,
        text.replace("\nrepeated_failure = 3\n", "\nrepeated_failure = 2\n"),
    )
    .unwrap();
    assert_eq!(
        forge(root, "word_count", "1=test,2=test").status.code(),
        Some(6)
    );
    let (run, attempts) = last_forge(root);
    assert_eq!(attempts.len(), 2, "the loop stopped after two failures");
    let escalate = node(&attempts[1], "escalate");
    assert_eq!(
        escalate["outputs"]["triggers"][0]["reason"],
        "2 consecutive failed attempts (threshold 2)"
    );
    // The run records the policy text that governed it.
    let governed: Vec<&str> = attempts[1]["governing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert!(
        governed.contains(&"policies/escalation.toml"),
        "{governed:?}"
    );
    assert_eq!(run["status"], "awaiting_review");
}

/// The governing set of a run, as `runs show --json` lists it: path -> (role, hash).
fn governing_of(run: &Value) -> std::collections::BTreeMap<String, (String, String)> {
    run["governing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["path"].as_str().unwrap().to_owned(),
                (
                    m["role"].as_str().unwrap().to_owned(),
                    m["spec_hash"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect()
}

#[test]
fn a_changed_template_or_configuration_changes_the_governing_set_and_policy_diff_names_it() {
    use sha2::{Digest, Sha256};
    if !common::other_accounts_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let root = dir.path();
    assert!(forge(root, "word_count", "").status.success());
    let (_, attempts) = last_forge(root);
    let first = &attempts[0];
    let governing = governing_of(first);
    for (path, role) in [
        ("pipelines/forge_attempt.toml", "pipeline"),
        ("policies/gates.toml", "policy"),
        ("templates/build_packet.md.j2", "template"),
        ("policies/toolchains.toml", "policy"),
        ("policies/toolchains.lock", "policy"),
        ("policies/ruff.toml", "policy"),
        ("policies/mypy.ini", "policy"),
        ("policies/pytest.ini", "policy"),
        ("builders/scripted.py", "script"),
        ("kavi.toml", "config"),
    ] {
        assert_eq!(governing[path].0, role, "{path} in {governing:?}");
    }
    // The set hash is the sha256 of `role path hash` lines sorted by path, as docs/ledger.md
    // says; every node run carries it.
    let lines: String = governing
        .iter()
        .map(|(path, (role, hash))| format!("{role} {path} {hash}\n"))
        .collect();
    let set_hash = format!("sha256:{:x}", Sha256::digest(lines.as_bytes()));
    assert_eq!(first["governing_hash"], set_hash.as_str());
    let ledger = rusqlite::Connection::open(root.join(".kavi/ledger.db")).unwrap();
    let carried: Vec<Option<String>> = ledger
        .prepare("SELECT governing_hash FROM node_runs WHERE run_id = ?1")
        .unwrap()
        .query_map([first["id"].as_i64().unwrap()], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!carried.is_empty());
    assert!(
        carried
            .iter()
            .all(|h| h.as_deref() == Some(set_hash.as_str())),
        "{carried:?}"
    );
    // `spec show` prints any member; the configuration keeps no absolute workspace path.
    let config = kavi(root, &["spec", "show", &governing["kavi.toml"].1]);
    let config = String::from_utf8_lossy(&config.stdout);
    assert!(
        config.contains("builder = \"python3 builders/scripted.py\""),
        "{config}"
    );
    assert!(!config.contains(&root.display().to_string()), "{config}");

    let attempt_id = first["id"].to_string();
    let unchanged = kavi(root, &["policy", "diff", &attempt_id]);
    assert_eq!(unchanged.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&unchanged.stdout).starts_with("no change in governance"));

    // Three governance edits: a template line, the configuration, a gate made advisory.
    let template = root.join("templates/build_packet.md.j2");
    let mut text = std::fs::read_to_string(&template).unwrap();
    text.push_str("Keep functions short.\n");
    std::fs::write(&template, text).unwrap();
    let mut config = std::fs::read_to_string(root.join("kavi.toml")).unwrap();
    config.push_str("skill_timeout = \"90s\"\n");
    std::fs::write(root.join("kavi.toml"), config).unwrap();
    let gates = root.join("policies/gates.toml");
    let text = std::fs::read_to_string(&gates).unwrap();
    let at = text.rfind("required = true").unwrap();
    std::fs::write(
        &gates,
        format!("{}required = false{}", &text[..at], &text[at + 15..]),
    )
    .unwrap();
    // Weaker rules promote only once adopted.
    common::adopt_the_rules_as_they_are(root);

    assert!(forge(root, "find_notes", "").status.success());
    let (_, attempts) = last_forge(root);
    let second = &attempts[0];
    assert_ne!(second["governing_hash"], first["governing_hash"]);
    let second_id = second["id"].to_string();
    for args in [
        vec![attempt_id.as_str()],
        vec![attempt_id.as_str(), second_id.as_str()],
    ] {
        let mut command = vec!["policy", "diff"];
        command.extend(&args);
        let out = kavi(root, &command);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{stdout}");
        for expected in [
            "  changed  kavi.toml (config)\n",
            "`skill_timeout`: \"60s\" -> \"90s\"",
            "  changed  policies/gates.toml (policy)\n             gate `tests` made advisory\n",
            "  changed  templates/build_packet.md.j2 (template)\n",
            "+Keep functions short.\n",
        ] {
            assert!(
                stdout.contains(expected),
                "{expected:?} missing from:\n{stdout}"
            );
        }
    }
    command_json_lists_the_changed_files(root, &attempt_id, &second_id);
    common::assert_ledger_verifies(root);
}

fn command_json_lists_the_changed_files(root: &Path, from: &str, to: &str) {
    let out = kavi(root, &["policy", "diff", from, to, "--json"]);
    assert_eq!(out.status.code(), Some(1), "governance changed");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let changed: Vec<&str> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        changed,
        [
            "kavi.toml",
            "policies/gates.toml",
            "templates/build_packet.md.j2"
        ]
    );
    assert_eq!(report["from"]["run"].to_string(), from);
}

#[test]
fn failure_kinds_one_policy_names_and_another_uses_are_checked_against_each_other() {
    let dir = shipped_workspace();
    let root = dir.path();
    // Each edit, made alone, is refused by `check` at the place it was made.
    let edits = [
        (
            "policies/classifier.toml",
            "kind = \"BUILD_ERROR\"",
            "kind = \"BOGUS\"",
            "`BOGUS` is not a known failure kind",
        ),
        (
            "policies/gates.toml",
            "failure = \"VERIFY_TEST\"",
            "failure = \"VERIFY_TSET\"",
            "`VERIFY_TSET` is not a known failure kind (see `[kinds]` in policies/classifier.toml)",
        ),
        (
            "policies/escalation.toml",
            "\"CONFINEMENT_DENIED\",\n]",
            "\"CONFINEMENT_DENEID\",\n]",
            "`CONFINEMENT_DENEID` is not a known failure kind",
        ),
        (
            "policies/escalation.toml",
            "repeated_failure = 3",
            "repeated_failure = 0",
            "`repeated_failure` counts failed attempts and must be at least 1",
        ),
        (
            "policies/escalation.toml",
            "large_diff = 0.5",
            "large_diff = 50.0",
            "`large_diff` is a share of the packet's lines",
        ),
    ];
    for (file, from, to, message) in edits {
        let path = root.join(file);
        let original = std::fs::read_to_string(&path).unwrap();
        assert!(original.contains(from), "{file} has no {from}");
        let edited = original.replacen(from, to, 1);
        std::fs::write(&path, &edited).unwrap();
        let out = kavi(root, &["pipeline", "check", "forge"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{file}: {stderr}");
        let at = edited.find(to).unwrap() + to.find(['"', '0', '5']).unwrap();
        let line = edited[..at].lines().count();
        assert!(stderr.contains(message), "{file}: {stderr}");
        assert!(
            stderr.contains(&format!("--> {file}:{line}:")),
            "{file}: {stderr}"
        );
        std::fs::write(&path, original).unwrap();
    }
    let out = kavi(root, &["pipeline", "check", "forge"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn policy_check_names_every_lifecycle_dead_end_at_its_line() {
    let dir = shipped_workspace();
    let root = dir.path();
    let out = kavi(root, &["policy", "check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .starts_with("ok: policies/lifecycle.toml has no dead end")
    );

    let path = root.join("policies/lifecycle.toml");
    let shipped = std::fs::read_to_string(&path).unwrap();
    let without = |text: &str, from: &str, to: &str| {
        let block = format!("[[transition]]\nfrom = \"{from}\"\nto = \"{to}\"\n");
        let at = text
            .find(&block)
            .unwrap_or_else(|| panic!("no {from} -> {to}"));
        let end = text[at + block.len()..]
            .find("\n\n")
            .map_or(text.len(), |e| at + block.len() + e + 2);
        format!("{}{}", &text[..at], &text[end..])
    };
    let line_of = |text: &str, needle: &str| text[..text.find(needle).unwrap()].lines().count();
    let check = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let out = kavi(root, &["policy", "check"]);
        assert_eq!(out.status.code(), Some(3));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };

    // Without VERIFIED -> TRUSTED, a verified skill can never be promoted.
    let stuck = without(&shipped, "VERIFIED", "TRUSTED");
    let stderr = check(&stuck);
    assert!(
        stderr
            .contains("`VERIFIED` is a dead end: no chain of transitions leads from it to TRUSTED")
            && stderr.contains(&format!(
                "--> policies/lifecycle.toml:{}:",
                line_of(&stuck, "\"VERIFIED\", \"TRUSTED\"")
            ))
            && stderr.contains("list it in `terminal`"),
        "{stderr}"
    );
    // The forge itself is refused too, before anything runs.
    let forge_check = kavi(root, &["pipeline", "check", "forge"]);
    assert_eq!(forge_check.status.code(), Some(3));

    // A buildable state nothing leads to.
    let limbo = shipped
        .replace(
            "\"REJECTED\"]\n# A build",
            "\"REJECTED\", \"LIMBO\"]\n# A build",
        )
        .replace(
            "buildable = [\"PROPOSED\", \"BUILT\", \"SUSPENDED\"]",
            "buildable = [\"PROPOSED\", \"BUILT\", \"SUSPENDED\", \"LIMBO\"]",
        )
        .replace(
            "terminal = [\"REVOKED\", \"REJECTED\"]",
            "terminal = [\"REVOKED\", \"REJECTED\", \"LIMBO\"]",
        );
    let stderr = check(&limbo);
    assert!(
        stderr.contains("buildable state `LIMBO` has no way in: no transition leads to it"),
        "{stderr}"
    );

    // A move the forge pipeline makes that the lifecycle lacks: its `reset` node goes to PROPOSED
    // (and so do new versions, from TRUSTED and SUSPENDED).
    let no_reset = without(
        &without(
            &without(&shipped, "BUILT", "PROPOSED"),
            "TRUSTED",
            "PROPOSED",
        ),
        "SUSPENDED",
        "PROPOSED",
    );
    let stderr = check(&no_reset);
    assert!(
        stderr.contains("no transition in policies/lifecycle.toml leads to `PROPOSED`: this node could never move a skill")
            && stderr.contains("--> pipelines/forge_attempt.toml:"),
        "{stderr}"
    );
    std::fs::write(&path, shipped).unwrap();
}

/// Issue 53: each lifecycle the forge or kavi's commands could not carry out is refused by
/// `kavi policy check` with its reason, at the line and column that cause it.
#[test]
fn policy_check_refuses_each_lifecycle_that_cannot_be_carried_out() {
    let dir = shipped_workspace();
    let root = dir.path();
    let path = root.join("policies/lifecycle.toml");
    let shipped = std::fs::read_to_string(&path).unwrap();
    let gated = |from: &str, to: &str, approval: &str| {
        let block = format!("from = \"{from}\"\nto = \"{to}\"\n");
        assert!(shipped.contains(&block), "{block}");
        shipped.replacen(&block, &format!("{block}approval = {approval}\n"), 1)
    };
    // (the lifecycle, its reason, the text the diagnostic points at)
    let cases = [
        (
            gated("TRUSTED", "REVOKED", "true"),
            "the transition TRUSTED -> REVOKED needs a recorded approval, but `kavi skill revoke` \
             makes it without stopping for one: it could never happen",
            "true\n",
        ),
        (
            gated("SUSPENDED", "TRUSTED", "true"),
            "the transition SUSPENDED -> TRUSTED needs a recorded approval, but `kavi skill \
             restore` makes it without stopping for one: it could never happen",
            "true\n",
        ),
        (
            gated(
                "VERIFIED",
                "TRUSTED",
                "{ role = \"auditor\", approvals = 2 }",
            ),
            "role `auditor` is not declared in policies/roles.toml: known: `maintainer`, `reviewer`",
            "{ role",
        ),
        (
            shipped.replace(
                "terminal = [\"REVOKED\", \"REJECTED\"]",
                "terminal = [\"REVOKED\", \"REJECTED\", \"SUSPENDED\"]",
            ),
            "`SUSPENDED` is both buildable and terminal: a build would overwrite a skill that is \
             meant to stay SUSPENDED for good",
            "\"SUSPENDED\"]\n# `kavi skill verify`",
        ),
        (
            shipped.replace(
                "\"REJECTED\"]\n# A build",
                "\"REJECTED\", \"LOST\"]\n# A build",
            ) + "\n[[transition]]\nfrom = \"LOST\"\nto = \"PROPOSED\"\n",
            "`LOST` is unreachable: no chain of transitions leads to it from `initial` (PROPOSED)",
            "\"LOST\"]",
        ),
        (
            shipped.replace("revoked = \"REVOKED\"", "revoked = \"REJECTED\""),
            "no transition TRUSTED -> REJECTED is declared: `kavi skill revoke` makes that move",
            "\"REJECTED\"\n# `kavi reject`",
        ),
    ];
    for (text, reason, at) in cases {
        std::fs::write(&path, &text).unwrap();
        let out = kavi(root, &["policy", "check"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        let offset = text.find(at).unwrap_or_else(|| panic!("{at}"));
        let line = text[..offset].lines().count() + usize::from(text[..offset].ends_with('\n'));
        let column = offset - text[..offset].rfind('\n').map_or(0, |n| n + 1) + 1;
        assert!(
            stderr.contains(reason)
                && stderr.contains(&format!("--> policies/lifecycle.toml:{line}:{column}")),
            "{reason} at {line}:{column}\n{stderr}"
        );
    }
}

#[test]
fn a_move_that_needs_approval_stops_the_run_and_kavi_approve_makes_it() {
    let dir = shipped_workspace();
    let root = dir.path();
    let path = root.join("policies/lifecycle.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let gated = "from = \"VERIFIED\"\nto = \"TRUSTED\"\n";
    assert!(text.contains(gated));
    std::fs::write(
        &path,
        text.replacen(gated, &format!("{gated}approval = true\n"), 1),
    )
    .unwrap();

    assert_eq!(forge(root, "word_count", "").status.code(), Some(6));
    let (run, attempts) = last_forge(root);
    assert_eq!(run["status"], "awaiting_review");
    let promote = node(&attempts[0], "promote");
    assert_eq!(promote["state"], "awaiting_review");
    assert_eq!(promote["outputs"]["triggers"][0]["trigger"], "APPROVAL");
    assert_eq!(promote["outputs"]["triggers"][0]["from"], "VERIFIED");
    // Stopping for a person is not a failure: the failure handlers stay out.
    assert_eq!(node(&attempts[0], "classify")["state"], "skipped");
    let skill = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(skill["skill"]["state"], "VERIFIED");

    let run_id = run["id"].to_string();
    // Files changed since verification: the approved promotion is refused, and nothing is
    // decided, so the run still awaits review.
    let source = root.join("skills/word_count/skill.py");
    let verified = std::fs::read_to_string(&source).unwrap();
    std::fs::write(&source, format!("{verified}# after review\n")).unwrap();
    let refused = kavi(root, &["approve", &run_id]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("changed since it was verified"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let still = json(&kavi(root, &["runs", "show", &run_id, "--json"]));
    assert_eq!(still["status"], "awaiting_review");
    std::fs::write(&source, verified).unwrap();

    let out = kavi(root, &["approve", &run_id, "--comment", "read the diff"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("moved `word_count` VERIFIED -> TRUSTED"),
        "{stdout}"
    );
    let skill = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(skill["skill"]["state"], "TRUSTED");
    let last = skill["transitions"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["to_state"], "TRUSTED");
    assert_eq!(last["node_id"], "promote");
    assert!(
        last["comment"]
            .as_str()
            .unwrap()
            .starts_with("approved in review by ")
            && last["comment"]
                .as_str()
                .unwrap()
                .ends_with(": read the diff"),
        "{last}"
    );
    // Promoted by the approval at the verified hash, with its files kept: it runs.
    word_count_runs(root);
    common::assert_ledger_verifies(root);
}

/// Puts a REVIEWED state between VERIFIED and TRUSTED into the workspace's lifecycle (which
/// must have the direct move), with `into` and `out_of` added to the moves into and out of it
/// (an approval, say); returns the lifecycle's path.
fn add_review_state(root: &Path, into: &str, out_of: &str) -> std::path::PathBuf {
    let path = root.join("policies/lifecycle.toml");
    let shipped = std::fs::read_to_string(&path).unwrap();
    let direct = "[[transition]]\nfrom = \"VERIFIED\"\nto = \"TRUSTED\"\n";
    assert!(shipped.contains(direct));
    let reviewed = shipped
        .replace(
            "\"VERIFIED\", \"TRUSTED\",",
            "\"VERIFIED\", \"REVIEWED\", \"TRUSTED\",",
        )
        .replace(
            direct,
            &format!(
                "[[transition]]\nfrom = \"VERIFIED\"\nto = \"REVIEWED\"\n{into}\n\
                 [[transition]]\nfrom = \"REVIEWED\"\nto = \"TRUSTED\"\n{out_of}\n\
                 [[transition]]\nfrom = \"REVIEWED\"\nto = \"REJECTED\"\n"
            ),
        );
    std::fs::write(&path, reviewed).unwrap();
    path
}

/// Once `policies/roles.toml` pins the reviewers' own keys, an approval of a lifecycle move
/// counts only when its giver's pinned key signed it: one written into the ledger under a
/// reviewer's name with the journal key (every account that writes the ledger holds it) counts
/// for nothing, and gives way to that reviewer's own when they approve.
#[test]
fn once_keys_are_pinned_a_move_counts_only_approvals_their_givers_signed() {
    if !common::other_accounts_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let root = dir.path();
    add_review_state(
        root,
        "approval = { role = \"reviewer\", approvals = 2 }\n",
        "",
    );
    let keys = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(keys.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let key_of = |uid: u32| keys.path().join(format!("{uid}.key"));
    let mut pinned = String::new();
    for uid in [4242, 4343] {
        let printed = common::kavi_with_key(uid, &key_of(uid), root, &["policy", "key"]);
        assert!(printed.status.success(), "{printed:?}");
        pinned.push_str(String::from_utf8_lossy(&printed.stdout).trim());
        pinned.push('\n');
    }
    std::fs::write(
        root.join("policies/roles.toml"),
        format!(
            "[role.maintainer]\nmembers = [\"*\"]\n\n\
             [role.reviewer]\nmembers = [\"uid 4242\", \"uid 4343\"]\n\n[keys]\n{pinned}"
        ),
    )
    .unwrap();
    assert_eq!(forge(root, "word_count", "").status.code(), Some(6));
    let (run, _) = last_forge(root);
    let run_id = run["id"].to_string();
    common::open_to_other_accounts(root);

    // uid 4343's approval, written by another with the journal key.
    common::edit_with_the_key(
        root,
        "UPDATE escalations SET triggers = json_set(triggers, '$[0].approvals', \
         json('[{\"actor\":\"uid 4343\",\"roles\":[\"reviewer\"]}]')) \
         WHERE status = 'pending'",
    );
    let triggers: Vec<Value> = common::LedgerConnection::open(root)
        .texts("SELECT triggers FROM escalations WHERE status = 'pending'")
        .iter()
        .map(|text| serde_json::from_str(text).unwrap())
        .collect();
    assert_eq!(triggers[0][0]["trigger"], "APPROVAL");
    assert_eq!(triggers[0][0]["approvals"][0]["actor"], "uid 4343");
    let first = common::kavi_with_key(4242, &key_of(4242), root, &["approve", &run_id]);
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert_eq!(first.status.code(), Some(6), "{stdout}{first:?}");
    assert!(stdout.contains("has 1: uid 4242"), "{stdout}");
    let skill = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(skill["skill"]["state"], "VERIFIED");

    // uid 4343's own approval, signed, takes the place of the one written for it.
    let second = common::kavi_with_key(4343, &key_of(4343), root, &["approve", &run_id]);
    assert!(
        second.status.success(),
        "{}{second:?}",
        String::from_utf8_lossy(&second.stdout)
    );
    let skill = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(skill["skill"]["state"], "TRUSTED");
}

/// `word_count` runs, as a trusted skill does.
fn word_count_runs(root: &Path) {
    let ran = kavi(
        root,
        &[
            "skill",
            "run",
            "word_count",
            "--input",
            "{\"text\": \"a b\"}",
        ],
    );
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
}

/// Issue 53: a REVIEWED state between VERIFIED and TRUSTED, whose way in needs two approvals,
/// added by editing the lifecycle alone. The forge stops at that move; the account that started
/// it may not approve, one other account is one approval of two (and may not be the second),
/// and a second account makes the move and the promotion the run stopped before: no rebuild,
/// no new run, no failure escalated.
#[test]
fn a_review_state_with_a_two_person_approval_stops_the_forge_and_two_approvals_trust_it() {
    let dir = shipped_workspace();
    let root = dir.path();
    let path = add_review_state(
        root,
        "approval = { role = \"reviewer\", approvals = 2 }\n",
        "",
    );
    // The two reviewers are two accounts other than the one that runs the forge.
    let reviewers = "[role.maintainer]\nmembers = [\"*\"]\n\n\
                     [role.reviewer]\nmembers = [\"uid 4242\", \"uid 4343\", ";
    std::fs::write(
        root.join("policies/roles.toml"),
        format!("{}]\n", reviewers.trim_end_matches(", ")),
    )
    .unwrap();
    let checked = kavi(root, &["policy", "check"]);
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );

    assert_eq!(forge(root, "word_count", "").status.code(), Some(6));
    let (run, attempts) = last_forge(root);
    assert_eq!(run["status"], "awaiting_review");
    assert_eq!(attempts.len(), 1);
    let promote = node(&attempts[0], "promote");
    assert_eq!(promote["state"], "awaiting_review");
    let trigger = &promote["outputs"]["triggers"][0];
    assert_eq!(trigger["trigger"], "APPROVAL");
    assert_eq!(
        (&trigger["from"], &trigger["to"]),
        (&"VERIFIED".into(), &"REVIEWED".into())
    );
    assert_eq!(
        trigger["reason"],
        "the transition VERIFIED -> REVIEWED needs 2 approvals by distinct accounts holding \
         `reviewer` other than the run's starter (policies/lifecycle.toml)"
    );
    assert_eq!(node(&attempts[0], "classify")["state"], "skipped");
    let skill = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(skill["skill"]["state"], "VERIFIED");
    let run_id = run["id"].to_string();

    // The account that started the run is never one of the two.
    let own = kavi(root, &["approve", &run_id]);
    assert_eq!(own.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&own.stderr).contains("it started the run"),
        "{}",
        String::from_utf8_lossy(&own.stderr)
    );

    // Nor does an edit of the lifecycle after the stop lower what the run waits for: a
    // decision is refused while the files on disk weaken the adopted rules.
    let adopted_lifecycle = std::fs::read_to_string(&path).unwrap();
    let lowered =
        adopted_lifecycle.replace("approval = { role = \"reviewer\", approvals = 2 }\n", "");
    std::fs::write(&path, lowered).unwrap();
    let own = kavi(root, &["approve", &run_id]);
    assert_eq!(own.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&own.stderr);
    assert!(
        stderr.contains(&format!("run {run_id} may not be approved"))
            && stderr.contains("weaken it (policies/lifecycle.toml:")
            && stderr.contains("`kavi policy propose`"),
        "{stderr}"
    );
    // Undone: a promotion needs the adopted rules.
    std::fs::write(&path, adopted_lifecycle).unwrap();

    // Two other accounts: the workspace and its ledger are opened to them.
    if !common::other_accounts_or_skip() {
        return;
    }
    common::open_to_other_accounts(root);
    let first = common::kavi_as(4242, root, &["approve", &run_id]);
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert_eq!(
        first.status.code(),
        Some(6),
        "{stdout}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        stdout.contains(
            "approval by uid 4242 (reviewer) of VERIFIED -> REVIEWED of `word_count` recorded; \
             run 1 still awaits review: it needs 2 distinct reviewers other than the account that \
             started the run; has 1: uid 4242"
        ),
        "{stdout}"
    );
    let skill = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(skill["skill"]["state"], "VERIFIED");
    let again = common::kavi_as(4242, root, &["approve", &run_id]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("it has already approved it"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // Only accounts holding the role in the adopted roles count: adding an account to
    // roles.toml after the stop gives it nothing, and the decision waits for the edit to be
    // proposed and adopted.
    std::fs::write(
        root.join("policies/roles.toml"),
        format!("{reviewers}\"uid 4444\"]\n"),
    )
    .unwrap();
    let outsider = common::kavi_as(4444, root, &["approve", &run_id]);
    assert_eq!(outsider.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&outsider.stderr);
    assert!(
        stderr.contains("weaken it (policies/roles.toml: ")
            && stderr.contains("kavi policy propose"),
        "{stderr}"
    );
    // The edit is undone: the rules are the adopted ones again, which a promotion needs.
    std::fs::write(
        root.join("policies/roles.toml"),
        format!("{}]\n", reviewers.trim_end_matches(", ")),
    )
    .unwrap();
    let second = common::kavi_as(4343, root, &["approve", &run_id]);
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert!(
        second.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(
        stdout.contains("moved `word_count` VERIFIED -> REVIEWED")
            && stdout.contains("moved `word_count` REVIEWED -> TRUSTED")
            && !stdout.contains("resuming"),
        "{stdout}"
    );
    let skill = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(skill["skill"]["state"], "TRUSTED");
    let path: Vec<&str> = skill["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["to_state"].as_str().unwrap())
        .collect();
    // Built once: the approvals went on from the stop, not from the start.
    assert_eq!(
        path,
        ["PROPOSED", "BUILT", "VERIFIED", "REVIEWED", "TRUSTED"]
    );
    let runs = json(&kavi(root, &["runs", "list", "--json"]));
    assert_eq!(runs.as_array().unwrap().len(), 2, "{runs}");
    let run = json(&kavi(root, &["runs", "show", &run_id, "--json"]));
    assert_eq!(run["status"], "approved");
    word_count_runs(root);
    common::assert_ledger_verifies(root);
}

/// The approval on the last move instead: `promote` makes VERIFIED -> REVIEWED itself and stops
/// before REVIEWED -> TRUSTED. An approval promotes from there; a rejection of a run stopped
/// there moves its skill to REJECTED.
#[test]
fn promote_walks_to_a_review_state_and_a_run_stopped_there_is_approved_or_rejected() {
    let dir = shipped_workspace();
    let root = dir.path();
    add_review_state(root, "", "approval = true\n");
    let states = |skill: &str| -> Vec<String> {
        let shown = json(&kavi(root, &["skill", "show", skill, "--json"]));
        shown["transitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["to_state"].as_str().unwrap().to_owned())
            .collect()
    };

    assert_eq!(forge(root, "word_count", "").status.code(), Some(6));
    let (run, attempts) = last_forge(root);
    let trigger = &node(&attempts[0], "promote")["outputs"]["triggers"][0];
    assert_eq!(
        (&trigger["from"], &trigger["to"]),
        (&"REVIEWED".into(), &"TRUSTED".into())
    );
    assert_eq!(
        states("word_count"),
        ["PROPOSED", "BUILT", "VERIFIED", "REVIEWED"]
    );
    let approved = kavi(root, &["approve", &run["id"].to_string()]);
    let stdout = String::from_utf8_lossy(&approved.stdout);
    assert!(
        approved.status.success() && stdout.contains("moved `word_count` REVIEWED -> TRUSTED"),
        "{stdout}{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    assert_eq!(
        states("word_count"),
        ["PROPOSED", "BUILT", "VERIFIED", "REVIEWED", "TRUSTED"]
    );

    assert_eq!(forge(root, "write_note", "").status.code(), Some(6));
    assert_eq!(states("write_note").last().unwrap(), "REVIEWED");
    let rejected = kavi(root, &["reject", "latest", "--comment", "not this one"]);
    assert!(
        rejected.status.success(),
        "{}",
        String::from_utf8_lossy(&rejected.stderr)
    );
    assert_eq!(states("write_note").last().unwrap(), "REJECTED");
    common::assert_ledger_verifies(root);
}

#[test]
fn a_rejected_build_leaves_nothing_behind_and_the_skill_says_rejected() {
    let dir = shipped_workspace();
    let root = dir.path();
    // A forbidden import is a security failure: the first attempt stops for review, its files
    // already copied back.
    assert_eq!(forge(root, "write_note", "1=policy").status.code(), Some(6));
    let source = root.join("skills/write_note/skill.py");
    assert!(
        std::fs::read_to_string(&source)
            .unwrap()
            .contains("import subprocess")
    );
    let out = kavi(root, &["reject", "latest", "--comment", "no subprocess"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("`write_note`: removed the "), "{stdout}");
    assert!(stdout.contains("`write_note` is REJECTED"), "{stdout}");
    assert!(!source.exists(), "the rejected build's file stayed");
    let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
    assert_eq!(shown["skill"]["state"], "REJECTED");
    let last = shown["transitions"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        last["comment"]
            .as_str()
            .unwrap()
            .contains(": no subprocess; removed the "),
        "{last}"
    );

    // A skill with a trusted version gets that version back.
    assert!(forge(root, "word_count", "").status.success());
    let source = root.join("skills/word_count/skill.py");
    let trusted = std::fs::read_to_string(&source).unwrap();
    std::fs::write(&source, format!("{trusted}# drift\n")).unwrap();
    assert_eq!(kavi(root, &["skill", "verify"]).status.code(), Some(1));
    // Attempts count on from the first forge: this is attempt 2.
    assert_eq!(forge(root, "word_count", "2=policy").status.code(), Some(6));
    assert!(
        std::fs::read_to_string(&source)
            .unwrap()
            .contains("import subprocess")
    );
    let out = kavi(root, &["reject", "latest"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("`word_count`: its files are those trusted at sha256:"),
        "{stdout}"
    );
    assert_eq!(std::fs::read_to_string(&source).unwrap(), trusted);
    let shown = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(shown["skill"]["state"], "REJECTED");
    common::assert_ledger_verifies(root);
}

/// Runs `word_count` and returns its execution record.
fn count_words(root: &Path) -> Value {
    let out = kavi(
        root,
        &[
            "skill",
            "run",
            "word_count",
            "--input",
            r#"{"text": "a b c"}"#,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

#[test]
fn a_new_version_is_forged_while_the_trusted_one_runs_and_a_rejected_one_gives_way() {
    let dir = shipped_workspace();
    let root = dir.path();
    assert!(forge(root, "word_count", "").status.success());
    assert_eq!(count_words(root)["skill_version"], 1);

    // A changed proposal of a trusted skill is its next version.
    let proposal = root.join("proposals/word_count.toml");
    let first = std::fs::read_to_string(&proposal).unwrap();
    let edit = |from: &str, to: &str| {
        let text = std::fs::read_to_string(&proposal).unwrap();
        std::fs::write(&proposal, text.replace(from, to)).unwrap();
    };
    edit("Count the words", "Count the words (v2)");
    let out = kavi(root, &["skill", "propose", "proposals/word_count.toml"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("proposed version 2 of `word_count`"),
        "{stdout}"
    );
    assert!(stdout.contains("version 1 stays trusted"), "{stdout}");
    let shown = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(shown["skill"]["state"], "PROPOSED");
    assert_eq!(shown["skill"]["version"], 2);
    assert_eq!(shown["skill"]["trusted_version"], 1);

    // While version 2 is forged in the folder, version 1 runs from the files kept at its
    // promotion, and stays listed.
    let source = root.join("skills/word_count/skill.py");
    std::fs::write(&source, "raise SystemExit(3)\n").unwrap();
    let record = count_words(root);
    assert_eq!(record["skill_version"], 1);
    assert_eq!(record["output"]["words"], 3);
    let listed = json(&kavi(root, &["skill", "list", "--json"]));
    assert_eq!(listed[0]["name"], "word_count");
    assert_eq!(listed[0]["version"], 1);
    assert_eq!(
        listed[0]["description"],
        "Count the words, lines and characters of a text"
    );
    assert!(kavi(root, &["skill", "verify"]).status.success());

    // A rejected new version gives way: the trusted files come back and version 1 is TRUSTED.
    // Attempts count on from the first forge: this is attempt 2.
    assert_eq!(forge(root, "word_count", "2=policy").status.code(), Some(6));
    assert_eq!(count_words(root)["skill_version"], 1);
    let out = kavi(root, &["reject", "latest", "--comment", "no subprocess"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("`word_count` is back at version 1, TRUSTED"),
        "{stdout}"
    );
    assert_eq!(std::fs::read_to_string(&proposal).unwrap(), first);
    let shown = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(shown["skill"]["state"], "TRUSTED");
    assert_eq!(shown["skill"]["version"], 1);
    assert_eq!(count_words(root)["skill_version"], 1);

    // The forge proposes the next version itself, and promoting it makes it the one that runs.
    // Version numbers are not reused.
    edit("Count the words", "Count the words (v3)");
    let out = forge(root, "word_count", "");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let record = count_words(root);
    assert_eq!(record["skill_version"], 3);
    let shown = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(shown["skill"]["trusted_version"], 3);
    assert!(
        shown["transitions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["comment"]
                .as_str()
                .is_some_and(|c| c.starts_with("version 2 REJECTED: rejected in review"))),
        "{shown}"
    );

    // The ledger keeps every version and what each promotion trusted.
    let ledger = rusqlite::Connection::open(root.join(".kavi/ledger.db")).unwrap();
    let versions: Vec<(i64, String)> = ledger
        .prepare("SELECT version, description FROM skill_versions WHERE skill = 'word_count' ORDER BY version")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(versions.iter().map(|v| v.0).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(versions[2].1.contains("(v3)"));
    let promoted: Vec<i64> = ledger
        .prepare("SELECT version FROM promotions WHERE skill = 'word_count' ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(promoted, [1, 3]);

    // Editing the proposal of a trusted skill is drift until it is proposed; proposed, it is the
    // next version, and the suspended trusted version runs again from its kept files.
    edit("Count the words", "Count the words (v4)");
    assert_eq!(kavi(root, &["skill", "verify"]).status.code(), Some(1));
    assert!(
        kavi(root, &["skill", "propose", "proposals/word_count.toml"])
            .status
            .success()
    );
    assert_eq!(count_words(root)["skill_version"], 3);
    common::assert_ledger_verifies(root);
}

/// Every file of the skill's folder and its proposal, by path.
fn skill_files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = walkdir::WalkDir::new(root.join("skills/word_count"))
        .into_iter()
        .map(Result::unwrap)
        .filter(|entry| entry.file_type().is_file())
        .filter(|entry| !entry.path().to_string_lossy().contains("__pycache__"))
        .map(|entry| {
            (
                entry.path().display().to_string(),
                std::fs::read(entry.path()).unwrap(),
            )
        })
        .collect();
    files.push((
        "proposal".into(),
        std::fs::read(root.join("proposals/word_count.toml")).unwrap(),
    ));
    files.sort();
    files
}

/// A rejection that fails half-way (a file of the trusted version cannot be put back: its path
/// is a folder now, after the files before it were written) changes nothing: those files are
/// put back as they were, the run still awaits review, and the skill has not moved. Once the
/// cause is gone, the same rejection completes.
#[test]
fn a_reject_that_fails_half_way_changes_nothing_and_completes_once_it_can() {
    let dir = shipped_workspace();
    let root = dir.path();
    assert!(forge(root, "word_count", "").status.success());
    let proposal = root.join("proposals/word_count.toml");
    let first = std::fs::read_to_string(&proposal).unwrap();
    std::fs::write(
        &proposal,
        first.replace("Count the words", "Count the words (v2)"),
    )
    .unwrap();
    assert!(
        kavi(root, &["skill", "propose", "proposals/word_count.toml"])
            .status
            .success()
    );
    assert_eq!(forge(root, "word_count", "2=policy").status.code(), Some(6));
    let shown = |root: &Path| {
        json(&kavi(root, &["skill", "show", "word_count", "--json"]))["skill"].clone()
    };
    let standing = shown(root);
    assert_eq!(
        (
            standing["version"].as_i64(),
            standing["trusted_version"].as_i64()
        ),
        (Some(2), Some(1))
    );

    // `test_skill.py` sorts after `skill.py`: the proposal and skill.py are written back first.
    let blocker = root.join("skills/word_count/test_skill.py");
    let v2_test = std::fs::read(&blocker).unwrap();
    std::fs::remove_file(&blocker).unwrap();
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("notes.txt"), "in the way\n").unwrap();
    let before = skill_files(root);
    let out = kavi(root, &["reject", "latest", "--comment", "no subprocess"]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("its files were put back as they were and nothing was recorded"),
        "{said}"
    );
    assert_eq!(
        skill_files(root),
        before,
        "the files were left half put back"
    );
    assert_eq!(shown(root), standing, "the skill moved");
    assert_eq!(common::last_run(root)["status"], "awaiting_review");
    common::assert_ledger_verifies(root);

    // The cause gone, the same rejection completes.
    std::fs::remove_dir_all(&blocker).unwrap();
    std::fs::write(&blocker, v2_test).unwrap();
    let out = kavi(root, &["reject", "latest", "--comment", "no subprocess"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("`word_count` is back at version 1, TRUSTED"),
        "{stdout}"
    );
    assert_eq!(std::fs::read_to_string(&proposal).unwrap(), first);
    assert_eq!(shown(root)["state"], "TRUSTED");
}
