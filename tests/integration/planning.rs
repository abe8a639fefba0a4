//! What a run is governed by and what a node's key holds (issue 55): the declared governing set,
//! a cache key of what the node's result depends on.

use crate::common;

use common::{json, kavi, node};

use std::path::Path;

use serde_json::Value;

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for folder in ["pipelines", "scripts", "data"] {
        std::fs::create_dir(dir.path().join(folder)).unwrap();
    }
    dir
}

fn write(dir: &Path, relative: &str, text: &str) {
    std::fs::write(dir.join(relative), text).unwrap();
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn succeeds(dir: &Path, args: &[&str]) -> String {
    let out = kavi(dir, args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    stdout(&out)
}

/// A run's governing set as `role path`, in path order.
fn governing(dir: &Path, run: &str) -> Vec<String> {
    json(&kavi(dir, &["runs", "show", run, "--json"]))["governing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{} {}",
                m["role"].as_str().unwrap(),
                m["path"].as_str().unwrap()
            )
        })
        .collect()
}

/// The state each node of the latest run ended in.
fn states(dir: &Path) -> Vec<(String, String)> {
    let run: Value = common::last_run(dir);
    run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node_id"].as_str().unwrap().to_owned(),
                n["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A chain of `touch out/i` names its own outputs: once they exist (the second run), they are
/// still data, not governance; the set is the pipeline and the configuration.
#[test]
fn a_touch_chain_is_governed_by_its_pipeline_and_configuration_only() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let mut pipeline = String::from("[pipeline]\nname = \"chain\"\n");
    for i in 0..20 {
        pipeline.push_str(&format!(
            "[nodes.n{i}]\nkind = \"exec\"\nrun = [\"touch\", \"out/{i}\"]\n"
        ));
        if i > 0 {
            pipeline.push_str(&format!("needs = [\"n{}\"]\n", i - 1));
        }
    }
    write(dir.path(), "pipelines/chain.toml", &pipeline);
    succeeds(dir.path(), &["pipeline", "run", "chain"]);
    succeeds(dir.path(), &["pipeline", "run", "chain"]);
    assert_eq!(
        governing(dir.path(), "2"),
        ["config kavi.toml", "pipeline pipelines/chain.toml"]
    );
}

/// A command's data is not governance: a file a failed node looked for, created since, lets
/// `runs resume` go on; the script a node executes and those it declares in `uses` govern, and
/// a `uses` that names no file is refused where it is written.
#[test]
fn scripts_a_node_executes_or_declares_govern_and_its_data_does_not() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/fix.toml",
        r#"[pipeline]
name = "fix"

[nodes.count]
kind = "exec"
run = ["sh", "scripts/count.sh", "data/in.csv"]
uses = ["scripts/lib.sh"]

[nodes.fixed]
kind = "exec"
run = ["test", "-e", "FIXED"]
needs = ["count"]
"#,
    );
    write(
        dir.path(),
        "scripts/count.sh",
        ". scripts/lib.sh\nwc -l < \"$1\"\n",
    );
    write(dir.path(), "scripts/lib.sh", "set -e\n");
    write(dir.path(), "data/in.csv", "a\nb\n");
    assert_eq!(
        kavi(dir.path(), &["pipeline", "run", "fix"]).status.code(),
        Some(1)
    );
    assert_eq!(
        governing(dir.path(), "1"),
        [
            "config kavi.toml",
            "pipeline pipelines/fix.toml",
            "script scripts/count.sh",
            "script scripts/lib.sh",
        ]
    );
    // The data it reads changed and the file it looks for is there now: no change of rules.
    write(dir.path(), "data/in.csv", "a\nb\nc\n");
    write(dir.path(), "FIXED", "");
    let diff = kavi(dir.path(), &["policy", "diff", "1"]);
    assert_eq!(diff.status.code(), Some(0), "{}", stdout(&diff));
    succeeds(dir.path(), &["runs", "resume", "1"]);
    assert_eq!(
        states(dir.path()),
        [
            ("count".to_owned(), "reused".to_owned()),
            ("fixed".to_owned(), "succeeded".to_owned())
        ]
    );
    // A script it declares changed: that is a change of the rules.
    write(dir.path(), "scripts/lib.sh", "set -eu\n");
    let diff = kavi(dir.path(), &["policy", "diff", "1"]);
    assert_eq!(diff.status.code(), Some(1));
    assert!(
        stdout(&diff).contains("scripts/lib.sh"),
        "{}",
        stdout(&diff)
    );

    write(
        dir.path(),
        "pipelines/typo.toml",
        "[pipeline]\nname = \"typo\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\nuses = [\"scripts/lib.sj\"]\n",
    );
    let refused = kavi(dir.path(), &["pipeline", "check", "typo"]);
    assert_eq!(refused.status.code(), Some(3));
    let message = stderr(&refused);
    assert!(
        message.contains("`uses` names `scripts/lib.sj`, which is not a file of the workspace")
            && message.contains("typo.toml:6:"),
        "{message}"
    );
}

/// A node's key holds what its result depends on: `--jobs` and a setting it does not use
/// (`skill_timeout`) leave it up to date; the script it executes is part of it, and `explain`
/// names it when it changes.
#[test]
fn a_node_is_keyed_on_what_it_depends_on_not_the_whole_configuration() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/make.toml",
        r#"[pipeline]
name = "make"

[nodes.count]
kind = "exec"
run = ["sh", "scripts/count.sh"]
inputs = ["data"]
"#,
    );
    write(
        dir.path(),
        "scripts/count.sh",
        "echo ran >> ran.txt\ncat data/*\n",
    );
    write(dir.path(), "data/in.csv", "a\n");
    let ran = || {
        std::fs::read_to_string(dir.path().join("ran.txt"))
            .unwrap()
            .lines()
            .count()
    };
    succeeds(dir.path(), &["pipeline", "run", "make"]);
    succeeds(dir.path(), &["pipeline", "run", "make", "--jobs", "3"]);
    write(dir.path(), "kavi.toml", "skill_timeout = \"90s\"\n");
    succeeds(dir.path(), &["pipeline", "run", "make"]);
    assert_eq!(ran(), 1, "changing --jobs or skill_timeout reran the node");
    assert_eq!(
        node(&common::last_run(dir.path()), "count")["state"],
        "cached"
    );

    write(
        dir.path(),
        "scripts/count.sh",
        "echo ran >> ran.txt\ncat data/* data/*\n",
    );
    succeeds(dir.path(), &["pipeline", "run", "make"]);
    assert_eq!(ran(), 2);
    let explained = succeeds(dir.path(), &["explain", "latest", "count"]);
    assert!(
        explained.contains("script `scripts/count.sh` changed"),
        "{explained}"
    );
}

/// `pipeline status` says which nodes a run would take from the cache and which it would run,
/// and why, running nothing; `--rerun` runs an up-to-date node again, and what needs it stays
/// cached when what it gets from it comes out the same.
#[test]
fn status_previews_what_would_run_and_rerun_forces_one_node() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/make.toml",
        r#"[pipeline]
name = "make"

[nodes.count]
kind = "exec"
run = ["sh", "scripts/count.sh"]
inputs = ["data"]

[nodes.report]
kind = "exec"
run = ["sh", "scripts/report.sh", "{{ nodes.count.outputs.stdout }}"]
needs = ["count"]
inputs = ["scripts/report.sh"]

[nodes.publish]
kind = "exec"
run = ["true"]
needs = ["report"]
"#,
    );
    write(
        dir.path(),
        "scripts/count.sh",
        "echo count >> ran.txt\ncat data/*\n",
    );
    write(
        dir.path(),
        "scripts/report.sh",
        "echo report >> ran.txt\necho \"rows: $1\"\n",
    );
    write(dir.path(), "data/in.csv", "a\n");
    let ran = || {
        std::fs::read_to_string(dir.path().join("ran.txt"))
            .unwrap_or_default()
            .lines()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let status = || {
        let shown = json(&kavi(dir.path(), &["pipeline", "status", "make", "--json"]));
        shown["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                let state = if n["fresh"].as_bool().unwrap() {
                    "fresh"
                } else {
                    "stale"
                };
                let changed: Vec<&str> = n["changed"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| c.as_str().unwrap())
                    .collect();
                format!(
                    "{} {state}: {} {}",
                    n["node"].as_str().unwrap(),
                    n["reason"].as_str().unwrap(),
                    changed.join("; ")
                )
            })
            .collect::<Vec<_>>()
    };
    // Nothing has run: every node would, and reading made no ledger.
    let before = status();
    assert!(
        before.iter().all(|n| n.contains("stale: nothing has run")),
        "{before:?}"
    );
    assert!(!dir.path().join(".kavi").exists());

    succeeds(dir.path(), &["pipeline", "run", "make"]);
    let after = status();
    assert!(after[0].starts_with("count fresh: node run "), "{after:?}");
    assert!(after[1].starts_with("report fresh: node run "), "{after:?}");
    assert_eq!(
        after[2],
        "publish stale: it declares no `inputs`, so it always runs "
    );

    write(dir.path(), "data/in.csv", "a\nb\n");
    let edited = status();
    assert!(
        edited[0].starts_with("count stale: against node run ")
            && edited[0].ends_with("input `data/in.csv` changed"),
        "{edited:?}"
    );
    assert!(
        edited[1].starts_with("report stale: needs `count`, which runs"),
        "{edited:?}"
    );
    let text = succeeds(dir.path(), &["pipeline", "status", "make"]);
    assert!(
        text.starts_with("status of `make`: 0 nodes up to date, 3 would run\n"),
        "{text}"
    );
    assert_eq!(ran(), "count report", "status ran something");

    succeeds(dir.path(), &["pipeline", "run", "make"]);
    assert_eq!(ran(), "count report count report");
    // Forced, `count` runs; `report` gets the same rows from it, and is cached.
    succeeds(dir.path(), &["pipeline", "run", "make", "--rerun", "count"]);
    assert_eq!(ran(), "count report count report count");
    let run = common::last_run(dir.path());
    assert_eq!(node(&run, "count")["state"], "succeeded");
    assert_eq!(node(&run, "report")["state"], "cached");
    let explained = succeeds(dir.path(), &["explain", "latest", "count"]);
    assert!(explained.contains("--rerun"), "{explained}");

    let unknown = kavi(dir.path(), &["pipeline", "run", "make", "--rerun", "cuont"]);
    assert_eq!(unknown.status.code(), Some(5));
    assert!(
        stderr(&unknown).contains("pipeline `make` has no node `cuont`"),
        "{}",
        stderr(&unknown)
    );
}

/// `runs resume` re-plans: after a script is edited only the nodes that run it (and what needs
/// them) run again, `--dry-run` shows that plan and runs nothing; a change of rules still
/// refuses unless `--allow-changed`, which never reuses a node whose own definition changed.
#[test]
fn resume_runs_again_only_what_changed_and_shows_its_plan_first() {
    let dir = workspace();
    let mut pipeline = String::from("[pipeline]\nname = \"fan\"\n");
    for (id, needs) in [("a", ""), ("b", "a"), ("c", "a")] {
        write(
            dir.path(),
            &format!("scripts/{id}.sh"),
            &format!("echo {id} >> ran.txt\n"),
        );
        pipeline.push_str(&format!(
            "[nodes.{id}]\nkind = \"exec\"\nrun = [\"sh\", \"scripts/{id}.sh\"]\nneeds = [{}]\n",
            if needs.is_empty() {
                String::new()
            } else {
                format!("\"{needs}\"")
            }
        ));
    }
    pipeline.push_str("[nodes.end]\nkind = \"exec\"\nrun = [\"test\", \"-e\", \"FIXED\"]\nneeds = [\"b\", \"c\"]\n");
    write(dir.path(), "pipelines/fan.toml", &pipeline);
    let ran = || {
        std::fs::read_to_string(dir.path().join("ran.txt"))
            .unwrap()
            .lines()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        kavi(dir.path(), &["pipeline", "run", "fan", "--jobs", "1"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(ran(), "a b c");

    write(dir.path(), "scripts/b.sh", "echo b2 >> ran.txt\n");
    write(dir.path(), "FIXED", "");
    let plan = succeeds(dir.path(), &["runs", "resume", "1", "--dry-run"]);
    for line in [
        "resuming run 1 (pipelines/fan.toml): 2 of its nodes reused, 2 run again",
        "reuse  a    succeeded in run 1",
        "run    b    script `scripts/b.sh` changed",
        "reuse  c    succeeded in run 1",
        "run    end  needs `b`, which runs again",
    ] {
        assert!(plan.contains(line), "{line:?} in\n{plan}");
    }
    assert_eq!(ran(), "a b c", "--dry-run ran something");
    assert!(kavi(dir.path(), &["runs", "show", "2"]).status.code() == Some(5));

    succeeds(dir.path(), &["runs", "resume", "1", "--jobs", "1"]);
    assert_eq!(ran(), "a b c b2");
    assert_eq!(
        states(dir.path()),
        [
            ("a".to_owned(), "reused".to_owned()),
            ("b".to_owned(), "succeeded".to_owned()),
            ("c".to_owned(), "reused".to_owned()),
            ("end".to_owned(), "succeeded".to_owned()),
        ]
    );

    // A failed run, then a node's command and a setting change: the setting refuses...
    std::fs::remove_file(dir.path().join("FIXED")).unwrap();
    assert_eq!(
        kavi(dir.path(), &["pipeline", "run", "fan", "--jobs", "1"])
            .status
            .code(),
        Some(1)
    );
    write(
        dir.path(),
        "pipelines/fan.toml",
        &pipeline.replace("scripts/c.sh\"]", "scripts/c.sh\", \"again\"]"),
    );
    write(dir.path(), "kavi.toml", "skill_timeout = \"90s\"\n");
    write(dir.path(), "FIXED", "");
    let refused = kavi(dir.path(), &["runs", "resume", "3"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("changed kavi.toml (config)")
            && !stderr(&refused).contains("fan.toml"),
        "{}",
        stderr(&refused)
    );
    // ...and, allowed, the node whose command changed is not reused for it.
    succeeds(
        dir.path(),
        &["runs", "resume", "3", "--allow-changed", "--jobs", "1"],
    );
    assert_eq!(ran(), "a b c b2 a b2 c c");
    let resumed = common::last_run(dir.path());
    assert_eq!(node(&resumed, "c")["state"], "succeeded");
    // The new run says it was resumed over the change, by choice.
    assert_eq!(resumed["allowed_changes"], "changed kavi.toml (config)");
    let shown = succeeds(dir.path(), &["runs", "show", "latest"]);
    assert!(
        shown.contains("  allowed   resumed over changed rules (--allow-changed):\n              changed kavi.toml (config)\n"),
        "{shown}"
    );

    let set = kavi(dir.path(), &["runs", "resume", "3", "--set", "x=1"]);
    assert_eq!(set.status.code(), Some(2));
    assert!(
        stderr(&set).contains("`runs resume` takes no --set"),
        "{}",
        stderr(&set)
    );
}

/// A fan-out that failed is resumed instance by instance: the instances that succeeded are
/// reused, only the failed one runs again, and `--dry-run` says which.
#[test]
fn resume_runs_again_only_the_instances_of_a_fan_out_that_did_not_succeed() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/items.toml",
        r#"[pipeline]
name = "items"

[nodes.fan]
kind = "exec"
for_each = ["a", "b", "c"]
env = { ITEM = "{{ item }}" }
shell = "echo \"$ITEM\" >> ran.txt; { test \"$ITEM\" != b || test -e FIXED; } && echo \"$ITEM\""

[nodes.after]
kind = "exec"
needs = ["fan"]
run = ["echo", "{% for o in nodes.fan.outputs %}{{ o.stdout | trim }}{% endfor %}"]
"#,
    );
    let ran = || std::fs::read_to_string(dir.path().join("ran.txt")).unwrap();
    assert_eq!(
        kavi(dir.path(), &["pipeline", "run", "items", "--jobs", "1"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(ran(), "a\nb\nc\n");

    write(dir.path(), "FIXED", "");
    let plan = succeeds(dir.path(), &["runs", "resume", "1", "--dry-run"]);
    for line in [
        "resuming run 1 (pipelines/items.toml): 0 of its nodes reused, 2 run again",
        "run    fan     failed in run 1; 2 of its 3 instance(s) reused",
        "reuse  fan[0]  succeeded in run 1",
        "run    fan[1]  failed in run 1",
        "reuse  fan[2]  succeeded in run 1",
        "run    after   needs `fan`, which runs again",
    ] {
        assert!(plan.contains(line), "{line:?} in\n{plan}");
    }
    assert_eq!(ran(), "a\nb\nc\n", "--dry-run ran something");

    succeeds(dir.path(), &["runs", "resume", "1", "--jobs", "1"]);
    assert_eq!(ran(), "a\nb\nc\nb\n", "only the failed instance ran again");
    let resumed = common::last_run(dir.path());
    for (id, state) in [
        ("fan[0]", "reused"),
        ("fan[1]", "succeeded"),
        ("fan[2]", "reused"),
        ("fan", "succeeded"),
        ("after", "succeeded"),
    ] {
        assert_eq!(node(&resumed, id)["state"], state, "{id}: {resumed}");
    }
    // The reused instances' outputs are gathered with the new one's, in item order.
    assert_eq!(node(&resumed, "after")["outputs"]["stdout"], "abc\n");
}

/// A run records the settings of the machine it ran on (where its sandboxes and temporary
/// folder are, its ledger, its artifacts): `runs show` displays them, and they stay out of its
/// governing set, so another machine's spelling is no change of rules.
#[test]
fn a_run_records_its_machines_own_settings_apart_from_its_governing_set() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/one.toml",
        "[pipeline]\nname = \"one\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n",
    );
    let tmp = tempfile::tempdir().unwrap();
    let tmp_path = tmp.path().display().to_string();
    let sandboxes = tmp.path().join("sandboxes");
    std::fs::create_dir(&sandboxes).unwrap();
    let out = common::kavi_command(dir.path(), &["pipeline", "run", "one"])
        .env("TMPDIR", tmp.path())
        .env("KAVI_SANDBOXES", &sandboxes)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let run = json(&kavi(dir.path(), &["runs", "show", "1", "--json"]));
    let local = &run["local_settings"];
    assert_eq!(local["temp"], tmp_path.as_str(), "{run}");
    assert_eq!(local["sandboxes"], format!("{tmp_path}/sandboxes"), "{run}");
    assert!(
        local["ledger"]
            .as_str()
            .is_some_and(|path| path.ends_with(".kavi/ledger.db")),
        "{run}"
    );
    let shown = succeeds(dir.path(), &["runs", "show", "1"]);
    assert!(
        shown.contains("  machine   its machine's own settings (recorded, not governing):\n")
            && shown.contains(&format!("              temp           {tmp_path}\n")),
        "{shown}"
    );
    let governing: Vec<String> = governing(dir.path(), "1");
    assert!(
        governing.iter().all(|member| !member.contains(&tmp_path)),
        "{governing:?}"
    );
}

/// `pipeline run FILE NODE...` runs those nodes and what they need, as make runs targets;
/// `--only` runs the targets alone, taking what they need from the cache, and refuses when that
/// is not up to date.
#[test]
fn a_run_of_targets_runs_them_and_what_they_need() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    let mut pipeline = String::from("[pipeline]\nname = \"make\"\n");
    for (id, needs, inputs) in [
        ("compile", "", "inputs = [\"src\"]\n"),
        ("test", "\"compile\"", ""),
        ("docs", "", ""),
        ("publish", "\"test\"", ""),
    ] {
        write(
            dir.path(),
            &format!("scripts/{id}.sh"),
            &format!("echo {id} >> ran.txt\n"),
        );
        pipeline.push_str(&format!(
            "[nodes.{id}]\nkind = \"exec\"\nrun = [\"sh\", \"scripts/{id}.sh\"]\nneeds = [{needs}]\n{inputs}"
        ));
    }
    write(dir.path(), "pipelines/make.toml", &pipeline);
    write(dir.path(), "src/main.c", "int main;\n");
    let ran = || {
        std::fs::read_to_string(dir.path().join("ran.txt"))
            .unwrap_or_default()
            .lines()
            .collect::<Vec<_>>()
            .join(" ")
    };
    succeeds(
        dir.path(),
        &["pipeline", "run", "make", "test", "--jobs", "1"],
    );
    assert_eq!(ran(), "compile test");
    assert_eq!(
        states(dir.path()),
        [
            ("compile".to_owned(), "succeeded".to_owned()),
            ("test".to_owned(), "succeeded".to_owned()),
        ]
    );
    // Alone: `compile` is up to date, and taken from the cache.
    succeeds(dir.path(), &["pipeline", "run", "make", "test", "--only"]);
    assert_eq!(ran(), "compile test test");
    assert_eq!(
        states(dir.path()),
        [
            ("compile".to_owned(), "cached".to_owned()),
            ("test".to_owned(), "succeeded".to_owned()),
        ]
    );
    write(dir.path(), "src/main.c", "int main() {}\n");
    let refused = kavi(dir.path(), &["pipeline", "run", "make", "test", "--only"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains(
            "they need `compile`, which has no result to take from the cache (against node run"
        ) && stderr(&refused).contains("input `src/main.c` changed"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(ran(), "compile test test", "a refused run ran something");

    let unknown = kavi(dir.path(), &["pipeline", "run", "make", "tset"]);
    assert_eq!(unknown.status.code(), Some(5));
    assert!(
        stderr(&unknown).contains("a target: pipeline `make` has no node `tset`"),
        "{}",
        stderr(&unknown)
    );
}

/// A run of targets that failed is resumed as a run of those targets: the nodes it did not
/// have are not added.
#[test]
fn a_run_of_targets_is_resumed_as_one() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/two.toml",
        "[pipeline]\nname = \"two\"\n[nodes.fix]\nkind = \"exec\"\nrun = [\"test\", \"-e\", \"FIXED\"]\n[nodes.other]\nkind = \"exec\"\nrun = [\"touch\", \"other-ran\"]\n",
    );
    assert_eq!(
        kavi(dir.path(), &["pipeline", "run", "two", "fix"])
            .status
            .code(),
        Some(1)
    );
    write(dir.path(), "FIXED", "");
    // The plan is progress, on stderr.
    let resumed = kavi(dir.path(), &["runs", "resume", "1"]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert!(
        stderr(&resumed).contains("0 of its nodes reused, 1 run again"),
        "{}",
        stderr(&resumed)
    );
    assert_eq!(
        states(dir.path()),
        [("fix".to_owned(), "succeeded".to_owned())]
    );
    assert!(!dir.path().join("other-ran").exists());
}
