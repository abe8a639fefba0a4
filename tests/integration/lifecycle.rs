//! Skills and their lifecycle: proposals recorded in the ledger, transitions governed by
//! `policies/lifecycle.toml`, and an edit to that file changing the next run.

use crate::common;

use common::{BUILD_NODES as BUILD, json, kavi, node};

use serde_json::Value;

/// The shipped workspace with `advance`, a pipeline that builds a skill with the scripted
/// builder, copies it back and moves it to BUILT, then to VERIFIED with no gate run.
fn workspace() -> tempfile::TempDir {
    let dir = common::shipped_workspace();
    std::fs::write(
        dir.path().join("pipelines/advance.toml"),
        format!(
            r#"
[pipeline]
name = "advance"

[params.skill]
type = "string"
{BUILD}
[nodes.built]
kind = "transition"
needs = ["copy"]
skill = "{{{{ params.skill }}}}"
to = "BUILT"

[nodes.verified]
kind = "transition"
needs = ["built"]
skill = "{{{{ params.skill }}}}"
to = "VERIFIED"
comment = "all gates passed"
"#
        ),
    )
    .unwrap();
    dir
}

#[test]
fn a_proposal_is_recorded_once_with_its_spec() {
    let dir = workspace();
    let out = kavi(
        dir.path(),
        &["skill", "propose", "proposals/write_note.toml", "--json"],
    );
    let skill = json(&out);
    assert_eq!(skill["state"], "PROPOSED");
    assert_eq!(skill["side_effect"], "FILE_WRITE");
    let spec = dir
        .path()
        .join(".kavi/artifacts/sha256")
        .join(&skill["spec_artifact"].as_str().unwrap()[..2])
        .join(skill["spec_artifact"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(spec).unwrap(),
        std::fs::read_to_string(dir.path().join("proposals/write_note.toml")).unwrap()
    );

    // The same text again changes nothing; changed text under the same name is refused.
    let again = kavi(
        dir.path(),
        &["skill", "propose", "proposals/write_note.toml"],
    );
    assert!(again.status.success());
    let proposal = dir.path().join("proposals/write_note.toml");
    let text = std::fs::read_to_string(&proposal).unwrap();
    std::fs::write(
        &proposal,
        text.replace("description = \"", "description = \"Edited: "),
    )
    .unwrap();
    let changed = kavi(
        dir.path(),
        &["skill", "propose", "proposals/write_note.toml"],
    );
    assert_eq!(changed.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&changed.stderr);
    assert!(
        stderr.starts_with(
            "error: proposals/write_note.toml changed since `write_note` was proposed"
        ),
        "{stderr}"
    );
    std::fs::write(&proposal, text).unwrap();

    std::fs::write(
        dir.path().join("proposals/bad.toml"),
        "name = \"../evil\"\ndescription = \"x\"\nside_effect = \"READ_ONLY\"\ncommand = [\"true\"]\ninput_schema = {}\noutput_schema = {}\n",
    )
    .unwrap();
    let bad = kavi(dir.path(), &["skill", "propose", "proposals/bad.toml"]);
    assert_eq!(bad.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.starts_with("error: invalid skill name `../evil`"),
        "{stderr}"
    );
    assert!(stderr.contains("--> proposals/bad.toml:1:8"), "{stderr}");
}

#[test]
fn transitions_follow_the_lifecycle_file_and_an_edit_changes_the_next_run() {
    let dir = workspace();
    json(&kavi(
        dir.path(),
        &["skill", "propose", "proposals/write_note.toml", "--json"],
    ));

    // Deleting BUILT -> VERIFIED would strand every built skill: the edit is refused where it
    // was made, before anything runs.
    let policy = dir.path().join("policies/lifecycle.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    let stranded = text.replace(
        "from = \"BUILT\"\nto = \"VERIFIED\"",
        "from = \"BUILT\"\nto = \"BUILT\"",
    );
    assert_ne!(text, stranded);
    std::fs::write(&policy, stranded).unwrap();
    let out = kavi(
        dir.path(),
        &["pipeline", "run", "advance", "--set", "skill=write_note"],
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a dead end"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Make BUILT -> VERIFIED need an approval instead: no rebuild, the next run follows it and
    // stops there for a person.
    let forbidden = text.replace(
        "from = \"BUILT\"\nto = \"VERIFIED\"",
        "from = \"BUILT\"\nto = \"VERIFIED\"\napproval = true",
    );
    std::fs::write(&policy, forbidden).unwrap();
    let out = kavi(
        dir.path(),
        &["pipeline", "run", "advance", "--set", "skill=write_note"],
    );
    assert_eq!(out.status.code(), Some(6));
    let run = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(node(&run, "built")["state"], "succeeded");
    assert_eq!(
        node(&run, "built")["outputs"],
        serde_json::json!({"skill": "write_note", "from": "PROPOSED", "to": "BUILT"})
    );
    assert_eq!(node(&run, "verified")["state"], "awaiting_review");
    assert_eq!(
        node(&run, "verified")["error"],
        format!(
            "awaiting review: APPROVAL (the transition BUILT -> VERIFIED needs a recorded approval (policies/lifecycle.toml)); decide with `kavi approve {id}` or `kavi reject {id}`",
            id = run["id"]
        )
    );
    let lifecycle = run["governing"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["path"] == "policies/lifecycle.toml")
        .unwrap();
    assert_eq!(lifecycle["role"], "policy");

    let shown = json(&kavi(
        dir.path(),
        &["skill", "show", "write_note", "--json"],
    ));
    assert_eq!(shown["skill"]["state"], "BUILT");
    let moves: Vec<(Value, Value)> = shown["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["from_state"].clone(), t["to_state"].clone()))
        .collect();
    assert_eq!(
        moves,
        [
            (Value::Null, "PROPOSED".into()),
            ("PROPOSED".into(), "BUILT".into())
        ]
    );
    assert_eq!(shown["transitions"][1]["node_id"], "built");

    // A person's approval is the decision the move waited for, not the gate run it rests on:
    // this run ran no gates, so the approved move is refused and the skill stays BUILT.
    let approved = kavi(dir.path(), &["approve", "latest", "--comment", "fine"]);
    let stderr = String::from_utf8_lossy(&approved.stderr);
    assert_eq!(approved.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the approved move BUILT -> VERIFIED of `write_note` was not made: the move BUILT -> \
             VERIFIED of `write_note` is earned, not declared: no gate run of it is recorded in \
             run {} or the runs below it",
            run["id"]
        )),
        "{stderr}"
    );
    let shown = json(&kavi(
        dir.path(),
        &["skill", "show", "write_note", "--json"],
    ));
    assert_eq!(shown["skill"]["state"], "BUILT");
}

/// A pipeline of `transition` nodes alone does not record a skill VERIFIED ("every required
/// gate passed") with no gate run: the move into a state on the way to trust needs a passing
/// gate run of the skill in the run, whatever the pipeline looks like.
#[test]
fn a_move_into_verified_needs_a_passing_gate_run_in_the_run() {
    let dir = workspace();
    json(&kavi(
        dir.path(),
        &["skill", "propose", "proposals/write_note.toml", "--json"],
    ));
    let out = kavi(
        dir.path(),
        &["pipeline", "run", "advance", "--set", "skill=write_note"],
    );
    assert_eq!(out.status.code(), Some(1));
    let run = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(node(&run, "verified")["state"], "failed", "{run}");
    assert_eq!(
        node(&run, "verified")["error"],
        format!(
            "the move BUILT -> VERIFIED of `write_note` is earned, not declared: no gate run of \
             it is recorded in run {id} or the runs below it; a `gate` node earns it",
            id = run["id"]
        )
    );
    let shown = json(&kavi(
        dir.path(),
        &["skill", "show", "write_note", "--json"],
    ));
    assert_eq!(shown["skill"]["state"], "BUILT");
    // A second run has no more right to it: the first run's moves earn nothing either.
    let again = kavi(
        dir.path(),
        &["pipeline", "run", "advance", "--set", "skill=write_note"],
    );
    assert_eq!(again.status.code(), Some(1));
    let shown = json(&kavi(
        dir.path(),
        &["skill", "show", "write_note", "--json"],
    ));
    assert_ne!(shown["skill"]["state"], "VERIFIED");
}

/// A skill is BUILT only by a build whose result was copied back (or an import), in the run
/// that moves it: transitions alone, a copy of a sandbox no build ran in, or of another
/// sandbox than the build's, leave it where it was.
#[test]
fn a_move_into_built_needs_a_build_copied_back_in_the_run() {
    let dir = workspace();
    let root = dir.path();
    json(&kavi(
        root,
        &["skill", "propose", "proposals/write_note.toml", "--json"],
    ));
    let fill = "mkdir -p skills/write_note && echo 'def run(): pass' > skills/write_note/skill.py && echo 'def test(): pass' > skills/write_note/test_skill.py";
    let built = r#"
[nodes.built]
kind = "transition"
needs = ["copy"]
skill = "write_note"
to = "BUILT"
"#;
    let copy = |sandbox: &str| {
        format!(
            "[nodes.copy]\nkind = \"copy_back\"\nneeds = [\"{sandbox}\", \"fill\"]\n\
             sandbox = \"{{{{ nodes.{sandbox}.outputs.path }}}}\"\n\
             vars = {{ skill = \"write_note\" }}\nskill = \"write_note\"\n"
        )
    };
    let pipelines = [
        (
            "declared",
            "[nodes.copy]\nkind = \"exec\"\nshell = \"true\"\n".to_owned(),
        ),
        (
            "hand-filled",
            format!(
                "[nodes.sandbox]\nkind = \"sandbox\"\n\
                 [nodes.fill]\nkind = \"exec\"\nneeds = [\"sandbox\"]\n\
                 cwd = \"{{{{ nodes.sandbox.outputs.path }}}}\"\nshell = \"{fill}\"\n{}",
                copy("sandbox")
            ),
        ),
        (
            "other-sandbox",
            format!(
                "[nodes.propose]\nkind = \"propose\"\nfile = \"proposals/write_note.toml\"\n\
                 [nodes.sandbox]\nkind = \"sandbox\"\n\
                 [nodes.build]\nkind = \"build\"\nneeds = [\"propose\", \"sandbox\"]\nskill = \"write_note\"\n\
                 sandbox = \"{{{{ nodes.sandbox.outputs.path }}}}\"\nvars = {{ skill = \"write_note\" }}\n\
                 [nodes.other]\nkind = \"sandbox\"\nneeds = [\"build\"]\n\
                 [nodes.fill]\nkind = \"exec\"\nneeds = [\"other\"]\n\
                 cwd = \"{{{{ nodes.other.outputs.path }}}}\"\nshell = \"{fill}\"\n{}",
                copy("other")
            ),
        ),
    ];
    for (name, nodes) in pipelines {
        std::fs::write(
            root.join(format!("pipelines/{name}.toml")),
            format!("[pipeline]\nname = \"{name}\"\n{nodes}{built}"),
        )
        .unwrap();
        let out = kavi(root, &["pipeline", "run", name]);
        assert_eq!(out.status.code(), Some(1), "{name}: {out:?}");
        let run = json(&kavi(root, &["runs", "show", "--json"]));
        assert_eq!(node(&run, "copy")["state"], "succeeded", "{name}: {run}");
        assert_eq!(
            node(&run, "built")["error"],
            format!(
                "the move PROPOSED -> BUILT of `write_note` is earned, not declared: no build of \
                 it was copied back (a `build` node's sandbox, by a `copy_back` node naming the \
                 skill) and no bundle of it imported in run {} or the runs below it",
                run["id"]
            ),
            "{name}"
        );
        let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
        assert_eq!(shown["skill"]["state"], "PROPOSED", "{name}");
    }
}

#[test]
fn a_transition_to_an_undeclared_state_is_a_check_error() {
    let dir = workspace();
    std::fs::write(
        dir.path().join("pipelines/bad.toml"),
        "[pipeline]\nname = \"bad\"\n[nodes.t]\nkind = \"transition\"\nskill = \"x\"\nto = \"DONE\"\n",
    )
    .unwrap();
    let out = kavi(dir.path(), &["pipeline", "check", "bad"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: `DONE` is not a state of policies/lifecycle.toml"),
        "{stderr}"
    );
    assert!(stderr.contains("--> pipelines/bad.toml:6:6"), "{stderr}");
}

/// `kavi gc` prunes old runs and the artifacts only they used, keeps the runs a skill's history
/// names, changes nothing with `--dry-run`, and leaves a ledger that verifies.
#[test]
fn gc_prunes_old_runs_but_never_a_skills_history() {
    let dir = workspace();
    std::fs::write(
        dir.path().join("pipelines/say.toml"),
        r#"
[pipeline]
name = "say"

[params.word]
type = "string"

[nodes.say]
kind = "exec"
run = ["echo", "{{ params.word }}"]
"#,
    )
    .unwrap();
    let said = |word: &str| {
        let out = kavi(
            dir.path(),
            &[
                "pipeline",
                "run",
                "say",
                "--set",
                &format!("word={word}"),
                "--json",
            ],
        );
        assert!(out.status.success());
        json(&out)
    };
    let only_mine = said("only-in-run-1");
    said("shared");
    json(&kavi(
        dir.path(),
        &["skill", "propose", "proposals/write_note.toml", "--json"],
    ));
    // A run that moves the skill, and so is part of its history.
    std::fs::write(
        dir.path().join("pipelines/build-only.toml"),
        format!(
            "[pipeline]\nname = \"build-only\"\n[params.skill]\ntype = \"string\"\n{BUILD}\n\
             [nodes.built]\nkind = \"transition\"\nneeds = [\"copy\"]\n\
             skill = \"{{{{ params.skill }}}}\"\nto = \"BUILT\"\n"
        ),
    )
    .unwrap();
    let advanced = kavi(
        dir.path(),
        &["pipeline", "run", "build-only", "--set", "skill=write_note"],
    );
    assert!(
        advanced.status.success(),
        "{}",
        String::from_utf8_lossy(&advanced.stderr)
    );
    said("shared");
    let store = dir.path().join(".kavi/artifacts");
    let only_mine_stdout = common::artifact_sha(&only_mine["nodes"][0], "stdout");
    let listed = |dir: &std::path::Path| json(&kavi(dir, &["runs", "list", "--json"]));
    let before = listed(dir.path());

    // Nothing is old enough by default, and a dry run removes nothing.
    let out = kavi(dir.path(), &["gc"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("removed no runs"));
    let out = kavi(
        dir.path(),
        &[
            "gc",
            "--older-than",
            "0s",
            "--keep",
            "1",
            "--dry-run",
            "--json",
        ],
    );
    let would = json(&out);
    assert_eq!(would["runs"], serde_json::json!([1, 2]), "{would}");
    assert_eq!(would["kept_as_evidence"], 1, "{would}");
    assert_eq!(listed(dir.path()), before);

    // A temporary file a killed kavi left a day ago goes; one being written now stays.
    let stale = std::fs::File::create(store.join("tmp/stale.part")).unwrap();
    stale
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400))
        .unwrap();
    std::fs::write(store.join("tmp/fresh.part"), "x").unwrap();
    let out = kavi(
        dir.path(),
        &["gc", "--older-than", "0s", "--keep", "1", "--json"],
    );
    let removed = json(&out);
    assert_eq!(removed["temp_files"], 1, "{removed}");
    assert_eq!(removed["runs"], serde_json::json!([1, 2]));
    // Run 1's stdout was its own; run 2's is shared with run 4, which stays.
    let artifacts: Vec<&str> = removed["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(artifacts.contains(&only_mine_stdout.as_str()), "{removed}");
    assert!(
        kavi(dir.path(), &["artifact", "cat", &only_mine_stdout])
            .status
            .code()
            == Some(5)
    );
    let runs: Vec<i64> = listed(dir.path())
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(runs, [4, 3], "the transition run is the skill's history");
    let shown = kavi(dir.path(), &["runs", "show", "4"]);
    assert!(shown.status.success());
    assert!(!store.join("tmp/stale.part").exists());
    assert!(store.join("tmp/fresh.part").exists());
    common::assert_ledger_verifies(dir.path());
}
