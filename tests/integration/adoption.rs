//! Rule changes are proposals: a weaker rule set on disk may run but not promote until it is
//! proposed, approved by another account holding the role, and adopted.

use crate::common;

use std::path::Path;
use std::process::Output;

use common::{drop_the_test_gate, json, kavi, kavi_command, node, shipped_workspace};

fn forge(root: &Path, skill: &str) -> Output {
    kavi(
        root,
        &[
            "pipeline",
            "run",
            "forge",
            "--set",
            &format!("skill={skill}"),
        ],
    )
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn state(root: &Path, skill: &str) -> String {
    let shown = json(&kavi(root, &["skill", "show", skill, "--json"]));
    shown["skill"]["state"].as_str().unwrap().to_owned()
}

#[test]
fn a_weakened_rule_set_promotes_only_once_another_maintainer_approved_it_and_it_was_adopted() {
    if !common::other_accounts_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let root = dir.path();
    // Trust on first use: the first run adopts the set it runs under, and still promotes.
    assert!(forge(root, "word_count").status.success());
    assert_eq!(state(root, "word_count"), "TRUSTED");
    let same = kavi(root, &["policy", "propose"]);
    assert!(
        stdout(&same).contains("are the adopted rule set"),
        "{}",
        stdout(&same)
    );

    let strong = drop_the_test_gate(root);
    let refused = forge(root, "find_notes");
    assert_eq!(refused.status.code(), Some(6), "{}", stdout(&refused));
    assert_ne!(state(root, "find_notes"), "TRUSTED");
    let runs = json(&kavi(root, &["runs", "list", "--json"]));
    let held = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pipeline"] == "forge" && r["status"] == "awaiting_review")
        .unwrap()["id"]
        .to_string();
    let attempt = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pipeline"] == "forge_attempt" && r["status"] != "succeeded")
        .unwrap()["id"]
        .to_string();
    let attempt = json(&kavi(root, &["runs", "show", &attempt, "--json"]));
    let error = node(&attempt, "promote")["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        error.contains("are not the adopted rule set") && error.contains("`kavi policy propose`"),
        "{error}"
    );

    let proposed = kavi(
        root,
        &["policy", "propose", "-m", "the tests gate is too slow"],
    );
    assert!(proposed.status.success(), "{}", stderr(&proposed));
    let text = stdout(&proposed);
    assert!(
        text.starts_with("proposed rule change 2 (weakening)"),
        "{text}"
    );
    assert!(
        text.contains("weakening      policies/gates.toml: gate `tests` removed"),
        "{text}"
    );
    // `policy diff` tells the story so far: what differs from the adopted set, how each change
    // is classified, and the proposal pending.
    let diff = kavi(root, &["policy", "diff"]);
    assert_eq!(diff.status.code(), Some(1));
    let text = stdout(&diff);
    assert!(
        text.starts_with("adopted: rule set 1 (")
            && text.contains(", first-use, by ")
            && text.contains("differ from it (")
            && text.contains("  weakening      policies/gates.toml: gate `tests` removed\n")
            && text.contains(
                "pending: rule change 2 (weakening, of exactly these files) by root (uid 0): it \
                 needs 1 maintainer other than the proposer; has none"
            ),
        "{text}"
    );
    // Proposed is not adopted: the forge still cannot promote.
    let refused = forge(root, "summarize_note");
    assert_eq!(refused.status.code(), Some(6));

    let early = kavi(root, &["policy", "adopt", "2"]);
    assert_eq!(early.status.code(), Some(2));
    assert!(
        stderr(&early)
            .contains("weakens the rules and needs 1 maintainer other than the proposer; has none"),
        "{}",
        stderr(&early)
    );
    let own = kavi(root, &["policy", "approve", "2"]);
    assert_eq!(own.status.code(), Some(2));
    assert!(
        stderr(&own).contains("the proposer's approval never counts"),
        "{}",
        stderr(&own)
    );

    common::open_to_other_accounts(root);
    let approved = common::kavi_as(4201, root, &["policy", "approve", "2"]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    assert!(
        stdout(&approved)
            .starts_with("approved rule change 2 by uid 4201 (roles: maintainer, reviewer)"),
        "{}",
        stdout(&approved)
    );
    let adopted = kavi(root, &["policy", "adopt", "2"]);
    assert!(adopted.status.success(), "{}", stderr(&adopted));
    assert!(stdout(&adopted).starts_with("adopted rule change 2 (weakening)"));
    let diff = kavi(root, &["policy", "diff"]);
    assert_eq!(diff.status.code(), Some(0));
    assert!(
        stdout(&diff).contains("the governing files are the adopted rule set"),
        "{}",
        stdout(&diff)
    );
    let verified = kavi(root, &["ledger", "verify"]);
    let text = stdout(&verified);
    assert!(verified.status.success(), "{text}");
    assert!(
        text.contains("adoption history:\n  rule set 1 (")
            && text.contains("): first-use, proposed by root (uid 0), adopted by root (uid 0), since superseded\n")
            && text.contains(
                "): weakening, proposed by root (uid 0), approved by uid 4201, adopted by root (uid 0)\n"
            ),
        "{text}"
    );
    assert!(forge(root, "write_note").status.success());
    assert_eq!(state(root, "write_note"), "TRUSTED");
    // The skill whose promotion was refused is not stuck where it was verified: approving its
    // run resumes the forge, which builds and gates it again, and promotes it under the
    // adopted rules.
    assert_eq!(state(root, "find_notes"), "VERIFIED");
    let resumed = kavi(root, &["approve", &held]);
    assert!(resumed.status.success(), "{}", stdout(&resumed));
    assert_eq!(state(root, "find_notes"), "TRUSTED");
    let shown = json(&kavi(root, &["skill", "show", "find_notes", "--json"]));
    let path: Vec<&str> = shown["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["to_state"].as_str().unwrap())
        .collect();
    assert!(
        path.ends_with(&["VERIFIED", "BUILT", "VERIFIED", "TRUSTED"]),
        "{path:?}"
    );

    // Putting the gate back strengthens the rules: its proposer adopts it at once.
    std::fs::write(root.join("policies/gates.toml"), &strong).unwrap();
    let proposed = kavi(root, &["policy", "propose"]);
    let text = stdout(&proposed);
    assert!(
        text.starts_with("proposed rule change 3 (strengthening)"),
        "{text}"
    );
    assert!(kavi(root, &["policy", "adopt", "3"]).status.success());

    // A change whose files changed since it was proposed is not adopted.
    drop_the_test_gate(root);
    assert!(kavi(root, &["policy", "propose"]).status.success());
    std::fs::write(
        root.join("policies/gates.toml"),
        format!("{strong}\n# edited\n"),
    )
    .unwrap();
    let stale = kavi(root, &["policy", "adopt", "4"]);
    assert_eq!(stale.status.code(), Some(2));
    assert!(
        stderr(&stale).contains("the governing files changed since rule change 4 was proposed"),
        "{}",
        stderr(&stale)
    );
    common::assert_ledger_verifies(root);
}

/// Issue 53: approvals given at the same moment are all kept. Four accounts approve a rule
/// change while another connection holds the ledger's write lock, so that each has read the
/// change before any can write: each approval is read and written under the lock, and none is
/// lost to another's write.
#[test]
fn approvals_of_a_rule_change_given_at_the_same_moment_are_all_kept() {
    if !common::other_accounts_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let root = dir.path();
    std::fs::write(
        root.join("pipelines/noop.toml"),
        "[pipeline]\nname = \"noop\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n",
    )
    .unwrap();
    let first = kavi(root, &["pipeline", "run", "noop"]);
    assert!(first.status.success(), "{}", stderr(&first));
    drop_the_test_gate(root);
    let proposed = kavi(root, &["policy", "propose"]);
    assert!(stdout(&proposed).starts_with("proposed rule change 2 (weakening)"));
    common::open_to_other_accounts(root);

    let mut holder = common::LedgerConnection::open(root);
    holder.batch(if common::postgres::ledger_for(root).is_some() {
        // kavi's write lock, and the table's, as a writer that does not take kavi's would meet.
        "BEGIN; SELECT pg_advisory_xact_lock(1801549417); LOCK TABLE rule_sets IN EXCLUSIVE MODE"
    } else {
        "BEGIN IMMEDIATE"
    });
    let approvers: Vec<_> = (4501..4505)
        .map(|uid| {
            let root = root.to_owned();
            std::thread::spawn(move || common::kavi_as(uid, &root, &["policy", "approve", "2"]))
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_secs(3));
    holder.batch("ROLLBACK");
    for approver in approvers {
        let out = approver.join().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let shown = common::LedgerConnection::open(root)
        .texts("SELECT approvals FROM rule_sets WHERE id = 2")
        .remove(0);
    let approvals: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let mut actors: Vec<&str> = approvals
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["actor"].as_str().unwrap())
        .collect();
    actors.sort_unstable();
    assert_eq!(actors, ["uid 4501", "uid 4502", "uid 4503", "uid 4504"]);
    common::assert_ledger_verifies(root);
}

/// Issue 53: `[adoption] on_change = "reverify"`. A skill is stamped with the rule set it was
/// promoted under; adopting a newer set suspends it (it does not run, and restore does not put
/// back trust earned under the older set) until the forge builds and gates it again under the
/// new one.
#[test]
fn adopting_a_new_rule_set_reverifies_skills_trusted_under_an_older_one() {
    let dir = shipped_workspace();
    let root = dir.path();
    let trust = root.join("policies/trust.toml");
    let text = std::fs::read_to_string(&trust).unwrap();
    let reverify = text.replace(
        "otherwise = \"weakening\"\n",
        "otherwise = \"weakening\"\non_change = \"reverify\"\n",
    );
    assert_ne!(reverify, text);
    std::fs::write(&trust, reverify).unwrap();
    assert!(forge(root, "word_count").status.success());
    let shown = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(shown["skill"]["trusted_rules"], 1);

    // A strengthening change: its proposer adopts it at once, and it re-verifies word_count.
    let allowlist = root.join("policies/allowlist.toml");
    let text = std::fs::read_to_string(&allowlist).unwrap();
    std::fs::write(
        &allowlist,
        text.replacen("deny = [\n", "deny = [\n    \"**/Makefile\",\n", 1),
    )
    .unwrap();
    let proposed = kavi(root, &["policy", "propose"]);
    assert!(
        stdout(&proposed).starts_with("proposed rule change 2 (strengthening)"),
        "{}",
        stdout(&proposed)
    );
    let adopted = kavi(root, &["policy", "adopt", "2"]);
    assert!(adopted.status.success(), "{}", stderr(&adopted));
    assert!(
        stdout(&adopted).contains("`word_count` was trusted under an older rule set"),
        "{}",
        stdout(&adopted)
    );
    assert_eq!(state(root, "word_count"), "SUSPENDED");
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
    assert_eq!(ran.status.code(), Some(2), "{}", stdout(&ran));
    let restored = kavi(root, &["skill", "restore", "word_count"]);
    assert_eq!(restored.status.code(), Some(2));
    assert!(
        stderr(&restored)
            .contains("was trusted under rule set 1, and the adopted rule set 2 re-verifies"),
        "{}",
        stderr(&restored)
    );

    // Nor does a pipeline of the user's own move it back with a plain transition.
    let back = root.join("pipelines/back.toml");
    std::fs::write(
        &back,
        "[pipeline]\nname = \"back\"\n[nodes.t]\nkind = \"transition\"\n\
         skill = \"word_count\"\nto = \"TRUSTED\"\n",
    )
    .unwrap();
    assert_eq!(
        kavi(root, &["pipeline", "run", "back"]).status.code(),
        Some(1)
    );
    assert_eq!(state(root, "word_count"), "SUSPENDED");
    std::fs::remove_file(back).unwrap();

    // The forge builds and gates it again under rule set 2.
    let rebuilt = forge(root, "word_count");
    assert!(rebuilt.status.success(), "{}", stdout(&rebuilt));
    let shown = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    assert_eq!(shown["skill"]["state"], "TRUSTED");
    assert_eq!(shown["skill"]["trusted_rules"], 2);
    common::assert_ledger_verifies(root);
}

/// Issue 53: the adopted set's row swapped with raw SQL (a pending weakening change made the
/// adopted one) governs nothing: kavi reads it only as the journal's keyed entries vouch for it,
/// and `kavi ledger verify` reports it.
#[test]
fn an_adopted_set_swapped_with_raw_sql_governs_nothing_and_verify_says_so() {
    let dir = weakening_proposed();
    let root = dir.path();
    let swap = "UPDATE rule_sets SET status = 'superseded' WHERE id = 1; \
                UPDATE rule_sets SET status = 'adopted', decided_by = 'uid 9' WHERE id = 2;";
    common::edit_without_the_key(root, swap);
    let refused = kavi(root, &["policy", "diff"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stdout(&refused));
    assert!(
        stderr(&refused).contains("rule set 2: ")
            && stderr(&refused).contains("edited outside kavi"),
        "{}",
        stderr(&refused)
    );
    let verified = kavi(root, &["ledger", "verify"]);
    assert_eq!(verified.status.code(), Some(1));
    assert!(
        stdout(&verified).contains("MISMATCH"),
        "{}",
        stdout(&verified)
    );
}

/// Adopts the shipped rules on first use (a run of a pipeline of one `true`), then proposes them
/// without the tests gate: rule change 2, weakening.
fn propose_a_weakening(root: &Path) {
    std::fs::write(
        root.join("pipelines/noop.toml"),
        "[pipeline]\nname = \"noop\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n",
    )
    .unwrap();
    assert!(kavi(root, &["pipeline", "run", "noop"]).status.success());
    drop_the_test_gate(root);
    let proposed = kavi(root, &["policy", "propose"]);
    assert!(stdout(&proposed).contains("weakening"), "{proposed:?}");
}

/// A shipped workspace with [`propose_a_weakening`] done.
fn weakening_proposed() -> tempfile::TempDir {
    let dir = shipped_workspace();
    propose_a_weakening(dir.path());
    dir
}

/// An account that holds the journal key (every account that writes a shared ledger does)
/// rewrites its own weakening change to read "strengthening": `adopt` works the class out again
/// from the texts and refuses it, and once such a set governs, `verify` names it.
#[test]
fn a_change_recorded_as_less_than_it_is_is_neither_adopted_nor_passed_by_verify() {
    let dir = weakening_proposed();
    let root = dir.path();
    common::edit_with_the_key(
        root,
        "UPDATE rule_sets SET class = 'strengthening' WHERE id = 2",
    );
    let refused = kavi(root, &["policy", "adopt", "2"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        stderr(&refused).contains(
            "rule change 2 is recorded as strengthening, but by the adopted [adoption] rules \
             its changes are weakening"
        ),
        "{}",
        stderr(&refused)
    );
    // The same record made the adopted set by the same hand: verify works the class out again.
    assert!(kavi(root, &["ledger", "verify"]).status.success());
    common::edit_with_the_key(
        root,
        "UPDATE rule_sets SET status = 'superseded' WHERE id = 1; \
         UPDATE rule_sets SET status = 'adopted', decided_by = 'uid 0' WHERE id = 2;",
    );
    let verified = kavi(root, &["ledger", "verify"]);
    assert_eq!(verified.status.code(), Some(1), "{}", stdout(&verified));
    assert!(
        stdout(&verified).contains(
            "rule set 2 was adopted weakening the rules (recorded as strengthening), but it"
        ),
        "{}",
        stdout(&verified)
    );
}

/// An approval written into a pending change by a process without the journal key is never
/// read: `adopt` refuses the row before it counts anything in it.
#[test]
fn an_approval_written_without_the_key_is_not_counted() {
    let dir = weakening_proposed();
    let root = dir.path();
    let forge = "UPDATE rule_sets SET approvals = \
                 '[{\"actor\":\"alice (uid 4242)\",\"roles\":[\"maintainer\"]}]' WHERE id = 2";
    common::edit_without_the_key(root, forge);
    let refused = kavi(root, &["policy", "adopt", "2"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        stderr(&refused).contains("rule set 2: ") && stderr(&refused).contains("without the key"),
        "{}",
        stderr(&refused)
    );
    let shown = kavi(root, &["policy", "status"]);
    assert!(
        !stdout(&shown).contains("adopted rule change 2"),
        "{shown:?}"
    );
}

/// Once `policies/roles.toml` pins the accounts' own keys, an approval counts only when its
/// giver's pinned key signed it: one written into the ledger by an account that holds the
/// journal key (every account that writes the ledger does) counts for nothing, whoever it names.
#[test]
fn once_keys_are_pinned_only_an_approval_its_giver_signed_counts() {
    if !common::other_accounts_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let root = dir.path();
    let keys = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(keys.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let key_of = |uid: u32| keys.path().join(format!("{uid}.key"));
    let printed = common::kavi_with_key(4301, &key_of(4301), root, &["policy", "key"]);
    assert!(printed.status.success(), "{printed:?}");
    let line = stdout(&printed);
    assert!(line.contains("= \"ed25519:"), "{line}");
    let roles = root.join("policies/roles.toml");
    let text = std::fs::read_to_string(&roles).unwrap();
    std::fs::write(&roles, format!("{text}\n[keys]\n{line}")).unwrap();
    propose_a_weakening(root);

    // The proposer writes uid 4301's approval itself, with the journal key.
    common::edit_with_the_key(
        root,
        "UPDATE rule_sets SET approvals = \
         '[{\"actor\":\"uid 4301\",\"roles\":[\"maintainer\",\"reviewer\"]}]' WHERE id = 2",
    );
    let refused = kavi(root, &["policy", "adopt", "2"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        stderr(&refused).contains("needs 1 maintainer other than the proposer; has none"),
        "{}",
        stderr(&refused)
    );
    // An account whose key is not the one pinned for it cannot give one that counts.
    common::open_to_other_accounts(root);
    let unpinned = common::kavi_with_key(4302, &key_of(4302), root, &["policy", "approve", "2"]);
    assert_eq!(unpinned.status.code(), Some(2), "{unpinned:?}");
    assert!(
        stderr(&unpinned).contains("is not the one the adopted policies/roles.toml pins"),
        "{}",
        stderr(&unpinned)
    );
    // Its giver's own, signed, does.
    let approved = common::kavi_with_key(4301, &key_of(4301), root, &["policy", "approve", "2"]);
    assert!(approved.status.success(), "{approved:?}");
    assert!(
        stdout(&approved).contains("its approvals are complete"),
        "{}",
        stdout(&approved)
    );
    let adopted = kavi(root, &["policy", "adopt", "2"]);
    assert!(adopted.status.success(), "{adopted:?}");
    let verified = kavi(root, &["ledger", "verify"]);
    assert_eq!(verified.status.code(), Some(0), "{}", stdout(&verified));
}

/// A rule weakened on disk when a run starts and put back before it promotes: the run's gates
/// judged under the weakened file, so its promotion is refused, naming the file, although the
/// disk holds the adopted set again by then.
#[test]
fn a_rule_weakened_for_the_gates_and_put_back_before_promotion_promotes_nothing() {
    let dir = shipped_workspace();
    let root = dir.path();
    // A builder slow enough for the test to put the file back while it builds; part of the
    // adopted set from the first run on.
    std::fs::write(
        root.join("builders/slow.py"),
        "import os, time\ntime.sleep(3)\nos.execvp('python3', ['python3', 'builders/scripted.py'])\n",
    )
    .unwrap();
    let config = std::fs::read_to_string(root.join("kavi.toml")).unwrap();
    std::fs::write(
        root.join("kavi.toml"),
        config.replace("builders/scripted.py", "builders/slow.py"),
    )
    .unwrap();
    assert!(forge(root, "word_count").status.success());
    let adopted = drop_the_test_gate(root);
    // A skill whose unit test fails: only the tests gate would catch it.
    let mut run = kavi_command(
        root,
        &[
            "pipeline",
            "run",
            "forge",
            "--set",
            "skill=find_notes",
            "--set",
            "flaws=1=test",
        ],
    )
    .spawn()
    .unwrap();
    // The forge's attempt, a child run of the latest.
    let attempt = |root: &Path| -> Option<serde_json::Value> {
        let forge = kavi(root, &["runs", "show", "latest", "--json"]);
        let child = json(&forge)["children"].as_array()?.last()?["id"].to_string();
        Some(json(&kavi(root, &["runs", "show", &child, "--json"])))
    };
    let building = |root: &Path| {
        attempt(root).is_some_and(|run| {
            run["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["node_id"] == "build" && n["state"] == "running")
        })
    };
    let waited = std::time::Instant::now();
    while !building(root) {
        assert!(waited.elapsed().as_secs() < 120, "the build never started");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::fs::write(root.join("policies/gates.toml"), adopted).unwrap();
    assert!(!run.wait().unwrap().success());
    assert_ne!(state(root, "find_notes"), "TRUSTED");
    let attempt = attempt(root).unwrap();
    let error = node(&attempt, "promote")["error"].to_string();
    assert!(
        error.contains("ran under a policies/gates.toml that is not the adopted rule set"),
        "{attempt}"
    );
}

/// `kavi.toml` pointed at a new ledger beside a weakened rule: the new ledger does not adopt
/// the disk's rules on first use but carries over those the workspace's ledger adopted, so the
/// weakening still promotes nothing, and `kavi policy diff` names it against them.
#[test]
fn a_new_ledger_carries_over_the_adopted_rules_and_adopts_no_weakening_on_first_use() {
    let dir = shipped_workspace();
    let root = dir.path();
    assert!(forge(root, "word_count").status.success());
    drop_the_test_gate(root);
    let config = root.join("kavi.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("ledger = \".kavi/team.db\"\n{text}")).unwrap();

    let held = forge(root, "find_notes");
    assert_eq!(held.status.code(), Some(6), "{}", stdout(&held));
    assert!(root.join(".kavi/team.db").exists());
    assert_ne!(state(root, "find_notes"), "TRUSTED");
    let said = stdout(&kavi(root, &["policy", "diff"]));
    assert!(said.contains("gate `tests` removed"), "{said}");
    // The same adopted set as the workspace's own ledger's, hash for hash.
    let adopted = |said: &str| said.lines().next().unwrap_or_default().to_owned();
    let earlier = stdout(&kavi(
        root,
        &["policy", "diff", "--ledger", ".kavi/ledger.db"],
    ));
    assert!(
        adopted(&said).starts_with("adopted: rule set 1 (sha256:"),
        "{said}"
    );
    assert_eq!(adopted(&said), adopted(&earlier), "{said}\n{earlier}");
}

/// A new keys folder and a new ledger beside a weakened rule: the workspace's ledger, whose
/// adopted set would be carried over, cannot be vouched for with the new keys, so the run adopts
/// nothing on first use (it does not fall back to the rules on disk) and promotes nothing; the
/// refusal says what to do.
#[test]
fn a_new_keys_folder_and_ledger_adopt_nothing_on_first_use_when_the_earlier_ledger_cannot_be_vouched_for()
 {
    let dir = shipped_workspace();
    let root = dir.path();
    assert!(forge(root, "word_count").status.success());
    drop_the_test_gate(root);
    let keys = tempfile::tempdir().unwrap();
    let ledger = root.join(".kavi/elsewhere.db");
    let run = kavi_command(
        root,
        &[
            "pipeline",
            "run",
            "forge",
            "--ledger",
            ledger.to_str().unwrap(),
            "--set",
            "skill=find_notes",
        ],
    )
    .env("KAVI_KEYS", keys.path())
    .output()
    .unwrap();
    assert_eq!(run.status.code(), Some(2), "{run:?}");
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(
        said.contains("refused to adopt the rules on first use")
            && said.contains("cannot be vouched for with the keys in use")
            && said.contains("kavi policy propose"),
        "{said}"
    );
    let diff = kavi_command(
        root,
        &["policy", "diff", "--ledger", ledger.to_str().unwrap()],
    )
    .env("KAVI_KEYS", keys.path())
    .output()
    .unwrap();
    assert!(
        String::from_utf8_lossy(&diff.stderr).contains("no rule set is adopted"),
        "{diff:?}"
    );
}

/// An approval given from inside a user namespace of the approver's own (where it is any uid and
/// any name its own mounts say) is refused and records nothing; the proposer's own uid under
/// another name is still the proposer.
#[test]
fn an_approval_from_inside_a_user_namespace_is_refused_and_records_nothing() {
    if !common::user_namespace_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let root = dir.path();
    assert!(forge(root, "word_count").status.success());
    drop_the_test_gate(root);
    let proposed = kavi(root, &["policy", "propose", "-m", "drop the tests gate"]);
    assert!(proposed.status.success(), "{proposed:?}");
    let mut unshare = std::process::Command::new("unshare");
    // Another uid, with no account's name: to the NSS lookup inside, someone else.
    unshare
        .args(["--user", "--map-user=4321", "--map-group=4321"])
        .arg(env!("CARGO_BIN_EXE_kavi"));
    let approved = common::with_test_env(unshare, root, &["policy", "approve", "2"])
        .output()
        .unwrap();
    assert_eq!(approved.status.code(), Some(2), "{approved:?}");
    assert!(
        String::from_utf8_lossy(&approved.stderr)
            .contains("a decision is never recorded from inside a user namespace"),
        "{approved:?}"
    );
    let adopt = kavi(root, &["policy", "adopt", "2"]);
    assert!(!adopt.status.success(), "{adopt:?}");
    let said = stdout(&kavi(root, &["policy", "diff"]));
    assert!(said.contains("gate `tests` removed"), "{said}");
}

/// Runs `kavi` in `root` with a keys folder of the test's own (its index of where each
/// workspace's rules were adopted among them) and, when given, `KAVI_LEDGER`.
fn kavi_keyed(keys: &Path, ledger: Option<&Path>, root: &Path, args: &[&str]) -> Output {
    let mut command = kavi_command(root, args);
    command.env("KAVI_KEYS", keys);
    if let Some(ledger) = ledger {
        command.env("KAVI_LEDGER", ledger);
    }
    command.output().unwrap()
}

/// A pipeline of one `true`, whose first run adopts the rules it runs under.
fn add_noop(root: &Path) {
    std::fs::write(
        root.join("pipelines/noop.toml"),
        "[pipeline]\nname = \"noop\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n",
    )
    .unwrap();
}

/// A workspace at a path with a line break and another workspace's path in it, whose rules are
/// weaker, adopts them on first use in a ledger of its own: the index of where each workspace's
/// rules were adopted still says nothing of the other workspace, so when that one moves to a new
/// ledger, the set carried over is its own, and the weakening on its disk stays one.
#[test]
fn a_workspace_path_with_a_line_break_names_no_other_workspace_in_the_ledgers_index() {
    let keys = tempfile::tempdir().unwrap();
    let dir = shipped_workspace();
    let root = dir.path().canonicalize().unwrap();
    add_noop(&root);
    let first = kavi_keyed(keys.path(), None, &root, &["pipeline", "run", "noop"]);
    assert!(first.status.success(), "{first:?}");
    drop_the_test_gate(&root);

    let outside = tempfile::tempdir().unwrap();
    let mut odd = outside.path().join("x").into_os_string();
    odd.push("\n");
    odd.push(root.as_os_str());
    let odd = std::path::PathBuf::from(odd);
    common::copy_shipped_workspace(&odd);
    std::fs::copy(
        root.join("policies/gates.toml"),
        odd.join("policies/gates.toml"),
    )
    .unwrap();
    add_noop(&odd);
    let weak = outside.path().join("weak.db");
    let there = kavi_keyed(keys.path(), Some(&weak), &odd, &["pipeline", "run", "noop"]);
    assert!(there.status.success(), "{there:?}");

    let moved = outside.path().join("moved.db");
    let run = kavi_keyed(
        keys.path(),
        Some(&moved),
        &root,
        &["pipeline", "run", "noop"],
    );
    assert!(run.status.success(), "{run:?}");
    let diff = kavi_keyed(keys.path(), Some(&moved), &root, &["policy", "diff"]);
    let said = stdout(&diff);
    assert!(
        said.contains("weakening      policies/gates.toml: gate `tests` removed"),
        "{said}{}",
        stderr(&diff)
    );
    let index = std::fs::read_to_string(keys.path().join("ledgers/workspaces")).unwrap();
    assert_eq!(index.lines().count(), 3, "{index:?}");
}

/// An index line that kavi does not write (as an earlier kavi wrote a workspace's path with a
/// line break in it) makes a new ledger adopt nothing on first use: no line of that index can be
/// taken at its word, and the refusal says which line and what to do.
#[test]
fn a_ledgers_index_with_a_line_kavi_does_not_write_is_refused_at_first_use() {
    let keys = tempfile::tempdir().unwrap();
    let dir = shipped_workspace();
    let root = dir.path().canonicalize().unwrap();
    add_noop(&root);
    assert!(
        kavi_keyed(keys.path(), None, &root, &["pipeline", "run", "noop"])
            .status
            .success()
    );
    let index = keys.path().join("ledgers/workspaces");
    let mut text = std::fs::read_to_string(&index).unwrap();
    text.push_str(&format!("/tmp/x\n{}\t/tmp/weak.db\n", root.display()));
    std::fs::write(&index, text).unwrap();
    drop_the_test_gate(&root);
    let moved = tempfile::tempdir().unwrap();
    let moved = moved.path().join("moved.db");
    let run = kavi_keyed(
        keys.path(),
        Some(&moved),
        &root,
        &["pipeline", "run", "noop"],
    );
    assert_eq!(run.status.code(), Some(2), "{run:?}");
    let said = stderr(&run);
    assert!(
        said.contains("refused to adopt the rules on first use")
            && said.contains("holds a line kavi does not write (line 2:")
            && said.contains("removes the ones that are not theirs"),
        "{said}"
    );
}

/// `kavi.toml` (or `KAVI_LEDGER`) pointed at another workspace's ledger, whose weaker rules it
/// adopted: they govern nothing here, the refusal says where this workspace's rules were
/// adopted. A ledger that adopted the same set (a copy of the workspace's own) is taken on.
#[test]
fn another_workspaces_ledger_with_other_rules_governs_nothing_here() {
    let keys = tempfile::tempdir().unwrap();
    let ours = shipped_workspace();
    let theirs = shipped_workspace();
    for (dir, weaken) in [(&ours, false), (&theirs, true)] {
        add_noop(dir.path());
        if weaken {
            drop_the_test_gate(dir.path());
        }
        let ran = kavi_keyed(keys.path(), None, dir.path(), &["pipeline", "run", "noop"]);
        assert!(ran.status.success(), "{}", stderr(&ran));
    }
    let root = ours.path();
    let hop = theirs.path().join(".kavi/ledger.db");
    let hopped = kavi_keyed(keys.path(), Some(&hop), root, &["pipeline", "run", "noop"]);
    assert_eq!(hopped.status.code(), Some(2), "{}", stderr(&hopped));
    assert!(
        stderr(&hopped).contains("adopted another set (rule set 1), which no one reviewed"),
        "{}",
        stderr(&hopped)
    );
    let copy = root.join(".kavi/copy.db");
    std::fs::copy(root.join(".kavi/ledger.db"), &copy).unwrap();
    let moved = kavi_keyed(keys.path(), Some(&copy), root, &["pipeline", "run", "noop"]);
    assert!(moved.status.success(), "{}", stderr(&moved));
    let back = kavi_keyed(keys.path(), None, root, &["pipeline", "run", "noop"]);
    assert!(back.status.success(), "{}", stderr(&back));
}
