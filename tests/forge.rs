//! The forge end to end, offline, with the shipped pipeline, policies, templates, proposals and
//! scripted builder: a proposal becomes TRUSTED, and each refusal leaves the target untouched.
//! The scripted builder stands in for a coding agent, which cannot run here.

mod common;

use common::{copy_dir, json, kavi, node, repo, verification};

use std::path::Path;
use std::process::Output;

/// Runs the shipped forge for `skill`; `flaws` is for the scripted builder ("" for none).
fn forge(root: &Path, skill: &str, flaws: &str) -> Output {
    let (skill, flaws) = (format!("skill={skill}"), format!("flaws={flaws}"));
    kavi(
        root,
        &["pipeline", "run", "forge", "--set", &skill, "--set", &flaws],
    )
}

/// A copy of the repository's workspace: what a user starts from.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo();
    for folder in [
        "pipelines",
        "policies",
        "templates",
        "proposals",
        "builders",
    ] {
        copy_dir(&repo.join(folder), &dir.path().join(folder));
    }
    std::fs::copy(repo.join("kavi.toml"), dir.path().join("kavi.toml")).unwrap();
    dir
}

#[test]
fn the_forge_takes_a_proposal_to_trusted_and_the_ledger_has_every_record() {
    let dir = workspace();
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

    let run = json(&kavi(root, &["runs", "show", "--json"]));
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
            ("escalate", "skipped"),
        ]
    );
    // One verification row per gate, all passed, at the hash that was promoted.
    let verifications = run["verifications"].as_array().unwrap();
    let gates: Vec<&str> = verifications
        .iter()
        .map(|v| v["gate"].as_str().unwrap())
        .collect();
    assert_eq!(gates, ["compile", "tests", "policy", "invariants"]);
    assert!(verifications.iter().all(|v| v["status"] == "passed"));
    assert_eq!(
        node(&run, "promote")["outputs"]["source_hash"],
        verifications[0]["source_hash"]
    );

    // The build: attempt 1, its packet and log as artifacts.
    let build = &node(&run, "build")["outputs"];
    assert_eq!(build["attempt"], 1);
    let packet = std::fs::read_to_string(build["packet_path"].as_str().unwrap()).unwrap();
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

    // A trusted skill is not rebuilt by running the forge again.
    assert_eq!(
        kavi(
            root,
            &["pipeline", "run", "forge.toml", "--set", "skill=word_count"]
        )
        .status
        .code(),
        Some(1)
    );
    let again = json(&kavi(root, &["runs", "show", "--json"]));
    assert_eq!(
        node(&again, "build")["error"],
        "`word_count` is TRUSTED, which is not buildable (buildable: PROPOSED, BUILT)"
    );
}

#[test]
fn a_build_outside_the_allowlist_fails_the_diff_gate_and_nothing_reaches_the_target() {
    let dir = workspace();
    let root = dir.path();
    let out = forge(root, "write_note", "1=scope");
    assert_eq!(out.status.code(), Some(1));
    let run = json(&kavi(root, &["runs", "show", "--json"]));
    assert_eq!(
        node(&run, "diff")["error"],
        "changed outside the allowlist: notes.txt"
    );
    assert_eq!(node(&run, "copy")["state"], "blocked");
    assert!(!root.join("notes.txt").exists());
    assert!(
        !root.join("skills").exists(),
        "part of a refused build reached the target"
    );
    let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
    assert_eq!(shown["skill"]["state"], "PROPOSED");
}

#[test]
fn a_forbidden_import_fails_the_policy_gate_and_the_skill_stays_built() {
    let dir = workspace();
    let root = dir.path();
    let out = forge(root, "write_note", "1=policy");
    // The policy failure is a security class: the run stops for a person's review (exit 6).
    assert_eq!(out.status.code(), Some(6));
    let run = json(&kavi(root, &["runs", "show", "--json"]));
    let policy = verification(&run, "policy").clone();
    assert_eq!(policy["status"], "failed");
    assert_eq!(
        policy["detail"],
        "skills/write_note/skill.py:1: [forbidden-import] imports forbidden module `subprocess`"
    );
    assert_eq!(node(&run, "promote")["state"], "blocked");
    let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
    assert_eq!(shown["skill"]["state"], "BUILT");
    assert_eq!(run["status"], "awaiting_review");
    assert_eq!(node(&run, "classify")["outputs"]["kind"], "VERIFY_POLICY");
    let escalate = node(&run, "escalate");
    assert_eq!(escalate["state"], "awaiting_review");
    assert_eq!(
        escalate["outputs"]["triggers"][0]["trigger"],
        "SECURITY_CLASS"
    );

    // Until a person decides, the loop does not go on.
    assert_eq!(forge(root, "write_note", "").status.code(), Some(1));
    let waiting = json(&kavi(root, &["runs", "show", "--json"]));
    assert_eq!(
        node(&waiting, "build")["error"],
        "`write_note` awaits review since run 1; decide with `kavi approve 1` or `kavi reject 1`"
    );
    let approved = kavi(
        root,
        &["approve", "1", "--comment", "the import was the drill's"],
    );
    assert!(approved.status.success());
    assert!(
        String::from_utf8_lossy(&approved.stdout)
            .starts_with("approved run 1 for `write_note` (SECURITY_CLASS)")
    );

    // The next run resets BUILT to PROPOSED, builds attempt 2 (no flaw), and promotes it.
    let out = forge(root, "write_note", "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let run = json(&kavi(root, &["runs", "show", "--json"]));
    // The refused run had already reset BUILT to PROPOSED; this one builds attempt 2.
    assert_eq!(node(&run, "build")["outputs"]["attempt"], 2);
    assert!(node(&run, "build")["outputs"]["parent_build"].is_i64());
    // Attempt 2's packet carries attempt 1's failure analysis.
    let packet = std::fs::read_to_string(
        node(&run, "build")["outputs"]["packet_path"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert!(
        packet.contains(
            "## Previous attempt\n\nAttempt 1 (build 1) failed: **VERIFY_POLICY**, at `verify`."
        ),
        "{packet}"
    );
    assert!(packet.contains("- `policy` (failed): skills/write_note/skill.py:1: [forbidden-import] imports forbidden module `subprocess`"), "{packet}");
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
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout),
        "{\"path\": \"notes/first.md\"}\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("notes/first.md")).unwrap(),
        "# First\n\nHello.\n"
    );
}

/// The failure canon: each engineered defect takes the whole arc. Attempt 1 fails and the
/// classifier names its kind in a research note; where the escalation rules demand a review, a
/// person approves; attempt 2 gets the enriched packet, passes, and the skill is promoted, with
/// no permission widening between the two packets.
#[test]
fn the_failure_canon_each_defect_is_classified_retried_and_promoted() {
    for (flaw, kind, failed_node) in [
        ("fail", "BUILD_ERROR", "build"),
        ("scope", "GATE_VIOLATION", "diff"),
        ("link", "GATE_VIOLATION", "copy"),
        ("syntax", "VERIFY_LINT", "verify"),
        ("test", "VERIFY_TEST", "verify"),
        ("policy", "VERIFY_POLICY", "verify"),
    ] {
        let dir = workspace();
        let root = dir.path();
        let flaws = &format!("1={flaw}");
        let out = forge(root, "word_count", flaws);
        // A policy failure also stops the run for review (exit 6); the others fail it (exit 1).
        let security = kind == "VERIFY_POLICY";
        assert_eq!(
            out.status.code(),
            Some(if security { 6 } else { 1 }),
            "{flaw}"
        );
        let first = json(&kavi(root, &["runs", "show", "--json"]));
        let classify = node(&first, "classify");
        assert_eq!(classify["state"], "succeeded", "{flaw}");
        assert_eq!(classify["outputs"]["kind"], kind, "{flaw}");
        assert_eq!(classify["outputs"]["facts"]["node"], failed_node, "{flaw}");
        let note: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(classify["outputs"]["note_path"].as_str().unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(note["kind"], kind, "{flaw}");
        assert_eq!(note["skill"], "word_count");
        assert!(
            !note["excerpt"].as_str().unwrap().is_empty(),
            "{flaw}: empty excerpt"
        );
        if security {
            assert!(
                kavi(root, &["approve", "latest"]).status.success(),
                "{flaw}"
            );
        }

        let out = forge(root, "word_count", "");
        assert!(
            out.status.success(),
            "{flaw}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let second = json(&kavi(root, &["runs", "show", "--json"]));
        let build = &node(&second, "build")["outputs"];
        assert_eq!(build["attempt"], 2, "{flaw}");
        let packet_of = |run: &serde_json::Value| {
            std::fs::read_to_string(
                node(run, "build")["outputs"]["packet_path"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap()
        };
        let (before, after) = (packet_of(&first), packet_of(&second));
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

/// Three consecutive failed attempts go to a person; a rejection ends the skill's loop.
#[test]
fn repeated_failure_escalates_and_a_rejection_ends_it() {
    let dir = workspace();
    let root = dir.path();
    let run = |flaws: &str| forge(root, "word_count", flaws).status.code();
    assert_eq!(run("1=test"), Some(1));
    assert_eq!(run("2=test"), Some(1));
    assert_eq!(run("3=test"), Some(6));
    let third = json(&kavi(root, &["runs", "show", "--json"]));
    let escalate = node(&third, "escalate");
    assert_eq!(escalate["outputs"]["consecutive_failures"], 3);
    assert_eq!(
        escalate["outputs"]["triggers"][0]["trigger"],
        "REPEATED_FAILURE"
    );

    let rejected = kavi(
        root,
        &["reject", "latest", "--comment", "rethink the proposal"],
    );
    assert!(rejected.status.success());
    assert_eq!(run(""), Some(1));
    let after = json(&kavi(root, &["runs", "show", "--json"]));
    let error = node(&after, "build")["error"].as_str().unwrap().to_owned();
    assert!(
        error.starts_with("`word_count` was rejected in review of run 3 by "),
        "{error}"
    );
    assert!(
        error.ends_with("(rethink the proposal); it is not built again"),
        "{error}"
    );
}
