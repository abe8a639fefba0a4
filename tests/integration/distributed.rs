//! Runs that another scheduler drives, node by node (`kavi pipeline start|step|end`), and the
//! Argo Workflows manifests `kavi pipeline export` writes for them: real `kavi` processes, a
//! real ledger file, and the manifests checked against Argo's published schema.

use crate::common;
#[path = "../argo/controller.rs"]
mod controller;

use std::path::Path;

use common::{json, kavi};
use serde_json::Value;

/// A pipeline with one of everything a step decides: a parameter, a `when` that is false, a
/// node that fails twice before it succeeds (retried), one that reads another's outputs, a
/// failure that does not stop the run, one that does, a node it blocks, a failure handler and
/// a cleanup node.
const PARITY: &str = r#"
[pipeline]
name = "parity"

[params.word]
type = "string"
default = "kavi"

[nodes.greet]
kind = "exec"
run = ["echo", "hello {{ params.word }}"]

[nodes.flaky]
kind = "exec"
needs = ["greet"]
shell = "n=$(cat tries 2>/dev/null || echo 0); echo $((n + 1)) > tries; test $n -ge 2"
retry = { attempts = 3 }

[nodes.echo_back]
kind = "exec"
needs = ["flaky"]
run = ["echo", "{{ nodes.greet.outputs.stdout }}"]

[nodes.skipped]
kind = "exec"
needs = ["greet"]
when = "params.word == 'nobody'"
run = ["false"]

[nodes.tolerated]
kind = "exec"
needs = ["greet"]
run = ["false"]
on_failure = "continue"

[nodes.hard_fail]
kind = "exec"
needs = ["echo_back", "tolerated"]
run = ["sh", "-c", "exit 3"]

[nodes.blocked]
kind = "exec"
needs = ["hard_fail"]
run = ["true"]

[nodes.handler]
kind = "exec"
needs = ["hard_fail"]
trigger = "failure"
run = ["echo", "handled"]

[nodes.cleanup]
kind = "exec"
needs = ["blocked", "handler", "skipped"]
trigger = "always"
run = ["echo", "cleaned"]
"#;

fn workspace_with(pipeline: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pipelines")).unwrap();
    std::fs::write(dir.path().join("kavi.toml"), "# a workspace\n").unwrap();
    std::fs::write(dir.path().join("pipelines/parity.toml"), pipeline).unwrap();
    dir
}

fn code(output: &std::process::Output) -> i32 {
    output.status.code().unwrap()
}

fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Every node run of a run, as (node, attempt, state, exit code, outputs), in the ledger's order.
fn node_runs(root: &Path, run: &str) -> Vec<(String, i64, String, Value, Value)> {
    let detail = json(&kavi(root, &["runs", "show", run, "--json"]));
    detail["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node_id"].as_str().unwrap().to_owned(),
                n["attempt"].as_i64().unwrap(),
                n["state"].as_str().unwrap().to_owned(),
                n["exit_code"].clone(),
                n["outputs"].clone(),
            )
        })
        .collect()
}

fn export(root: &Path, file: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "pipeline",
        "export",
        file,
        "--format",
        "argo",
        "--image",
        "registry.example/kavi:test",
    ];
    args.extend_from_slice(extra);
    json(&kavi(root, &args))
}

#[test]
fn an_exported_workflow_records_the_run_kavi_would_have_run_itself() {
    if !controller::available() {
        return;
    }
    // The same pipeline twice, each in a workspace of its own: once as `kavi pipeline run`
    // schedules it, once as Argo would, task by task, from the exported manifest.
    let local = workspace_with(PARITY);
    let run = kavi(
        local.path(),
        &["pipeline", "run", "parity", "--set", "word=argo"],
    );
    assert_eq!(code(&run), 1, "{}", text(&run));
    let expected = node_runs(local.path(), "latest");

    let driven = workspace_with(PARITY);
    let manifest = export(driven.path(), "parity", &["--workspace-claim", "ws"]);
    let outcome = controller::run(
        &manifest,
        driven.path(),
        Path::new(env!("CARGO_BIN_EXE_kavi")),
        &[("word", "argo")],
        (&[], &[]),
    );
    let run_id = &outcome.globals["kavi-run"];
    assert_eq!(node_runs(driven.path(), run_id), expected);

    // Argo saw what kavi decided: the retried node asked twice for another try, the failure
    // that stops the run failed its task, the tolerated one too (its task continues on), and
    // what kavi skipped or blocked ran as a task that recorded so.
    assert_eq!(outcome.exits["node-flaky"], [75, 75, 0]);
    assert_eq!(outcome.phases["node-hard-fail"], "Failed");
    assert_eq!(outcome.phases["node-tolerated"], "Failed");
    assert_eq!(outcome.phases["node-skipped"], "Succeeded");
    assert_eq!(outcome.phases["node-blocked"], "Failed");
    assert_eq!(outcome.phases["node-cleanup"], "Succeeded");
    // The exit handler closed the run as `kavi pipeline run` did, with its exit code.
    assert_eq!(outcome.on_exit, Some(1));
    let detail = json(&kavi(driven.path(), &["runs", "show", run_id, "--json"]));
    assert_eq!(detail["status"], "failed");
    assert_eq!(detail["params"]["word"], "argo");
    common::assert_ledger_verifies(driven.path());
}

/// The shipped forge attempt, exported and carried out task by task, ends as the same attempt
/// in one process: a good skill TRUSTED, and a skill that fails its policy gate classified
/// (VERIFY_POLICY) and escalated for review, not left with an interrupted classify.
#[test]
fn the_exported_forge_attempt_passes_and_fails_as_it_does_in_one_process() {
    if !controller::available() {
        return;
    }
    for (skill, flaws, exit, state) in [
        ("word_count", "", 0, "TRUSTED"),
        ("write_note", "1=policy", 6, "BUILT"),
    ] {
        let sets = [("skill", skill), ("flaws", flaws)];
        let local = common::shipped_workspace();
        let run = kavi(
            local.path(),
            &[
                "pipeline",
                "run",
                "forge_attempt.toml",
                "--set",
                &format!("skill={skill}"),
                "--set",
                &format!("flaws={flaws}"),
            ],
        );
        assert_eq!(code(&run), exit, "{skill}: {}", text(&run));

        // The sandboxes on a volume of their own that every task mounts: each pod's /tmp is
        // its own.
        let driven = common::shipped_workspace();
        let manifest = export(
            driven.path(),
            "forge_attempt.toml",
            &["--workspace-claim", "ws", "--sandbox-claim", "sandboxes"],
        );
        let sandboxes = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let outcome = controller::run(
            &manifest,
            driven.path(),
            Path::new(env!("CARGO_BIN_EXE_kavi")),
            &sets,
            (&[], &[("sandboxes", sandboxes.path())]),
        );
        assert_eq!(outcome.on_exit, Some(exit), "{skill}: {outcome:?}");
        // Node by node, each attempt ended as in the one process, and the failure handling
        // decided the same: the kind, the node it blames, the escalation's triggers.
        let decided = |root: &Path, run: &str| {
            let runs = node_runs(root, run);
            let output = |node: &str, field: &str| {
                runs.iter()
                    .find(|(id, ..)| id == node)
                    .map(|(.., outputs)| outputs[field].clone())
            };
            let kind = output("classify", "kind");
            let blamed = output("classify", "facts").map(|facts| facts["node"].clone());
            let triggers = output("escalate", "triggers");
            let states: Vec<_> = runs
                .into_iter()
                .map(|(id, attempt, state, exit_code, _)| (id, attempt, state, exit_code))
                .collect();
            (states, kind, blamed, triggers)
        };
        let expected = decided(local.path(), "latest");
        assert_eq!(
            decided(driven.path(), &outcome.globals["kavi-run"]),
            expected,
            "{skill}"
        );
        for root in [local.path(), driven.path()] {
            let shown = json(&kavi(root, &["skill", "show", skill, "--json"]));
            assert_eq!(shown["skill"]["state"], state, "{skill}");
        }
        if exit != 0 {
            assert_eq!(expected.1, Some(serde_json::json!("VERIFY_POLICY")));
            continue;
        }
        // Without the sandboxes' volume, the sandbox the `sandbox` task made is in that pod's
        // /tmp, gone for the build: the export says so, and the attempt does not succeed.
        let unshared = common::shipped_workspace();
        let manifest = export(
            unshared.path(),
            "forge_attempt.toml",
            &["--workspace-claim", "ws"],
        );
        assert!(
            manifest["metadata"]["annotations"]["kavi.dev/notes"]
                .as_str()
                .unwrap()
                .contains("give --sandbox-claim"),
            "{manifest}"
        );
        let outcome = controller::run(
            &manifest,
            unshared.path(),
            Path::new(env!("CARGO_BIN_EXE_kavi")),
            &sets,
            (&[], &[]),
        );
        assert_ne!(outcome.on_exit, Some(0), "{outcome:?}");
    }
}

/// A step takes a node from the cache as `pipeline run` does: its key made and its outputs put
/// back off the step's loop, with no process started.
#[test]
fn a_step_takes_an_up_to_date_node_from_the_cache() {
    let dir = workspace_with(
        r#"
[pipeline]
name = "parity"

[nodes.build]
kind = "exec"
shell = "echo ran >> count.txt; cat src.txt > out.txt"
inputs = ["src.txt"]
outputs = ["out.txt"]
"#,
    );
    std::fs::write(dir.path().join("src.txt"), "made\n").unwrap();
    let step = |dir: &Path| {
        let start = kavi(dir, &["pipeline", "start", "parity"]);
        assert_eq!(code(&start), 0, "{}", text(&start));
        let run = String::from_utf8_lossy(&start.stdout).trim().to_owned();
        let step = kavi(dir, &["pipeline", "step", "--run", &run, "parity", "build"]);
        assert_eq!(code(&step), 0, "{}", text(&step));
        let end = kavi(dir, &["pipeline", "end", "--run", &run, "parity"]);
        assert_eq!(code(&end), 0, "{}", text(&end));
        node_runs(dir, &run)[0].2.clone()
    };
    assert_eq!(step(dir.path()), "succeeded");
    std::fs::remove_file(dir.path().join("out.txt")).unwrap();
    assert_eq!(step(dir.path()), "cached");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "made\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("count.txt")).unwrap(),
        "ran\n"
    );
}

/// The exported workflow's tasks record into a server's ledger, as tasks on several machines
/// would: its URL, password and all, comes from a Kubernetes Secret (`--task-ledger-secret`),
/// and is nowhere in the manifest; `--task-ledger` with a password is refused.
#[test]
fn an_exported_workflow_records_into_a_server_ledger() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    if !controller::available() {
        return;
    }
    let dir = workspace_with(PARITY);
    let refused = kavi(
        dir.path(),
        &[
            "pipeline",
            "export",
            "parity",
            "--format",
            "argo",
            "--image",
            "registry.example/kavi:test",
            "--task-ledger",
            &url,
        ],
    );
    assert_eq!(code(&refused), 2, "{}", text(&refused));
    assert!(
        text(&refused).contains("--task-ledger carries a password"),
        "{}",
        text(&refused)
    );
    assert!(refused.stdout.is_empty());
    let manifest = export(
        dir.path(),
        "parity",
        &[
            "--workspace-claim",
            "ws",
            "--task-ledger-secret",
            "kavi-ledger:url",
        ],
    );
    assert!(!manifest.to_string().contains(&url));
    let start = manifest["spec"]["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "kavi-start")
        .unwrap();
    assert_eq!(
        start["container"]["env"],
        serde_json::json!([{
            "name": "KAVI_LEDGER",
            "valueFrom": { "secretKeyRef": { "name": "kavi-ledger", "key": "url" } },
        }])
    );
    let outcome = controller::run(
        &manifest,
        dir.path(),
        Path::new(env!("CARGO_BIN_EXE_kavi")),
        &[],
        (&[(("kavi-ledger", "url"), &url)], &[]),
    );
    assert_eq!(outcome.on_exit, Some(1));
    let run_id = &outcome.globals["kavi-run"];
    let detail = json(&on_server(
        dir.path(),
        &url,
        &["runs", "show", run_id, "--json"],
    ));
    assert_eq!(detail["status"], "failed");
    assert_eq!(detail["nodes"].as_array().unwrap().len(), 11);
    assert!(!dir.path().join(".kavi/ledger.db").exists());
    let verify = on_server(dir.path(), &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
}

#[test]
fn a_step_refuses_what_would_record_a_result_the_run_does_not_vouch_for() {
    let dir = workspace_with(PARITY);
    let root = dir.path();
    let start = kavi(root, &["pipeline", "start", "parity"]);
    assert_eq!(code(&start), 0, "{}", text(&start));
    let run = String::from_utf8_lossy(&start.stdout).trim().to_owned();
    let step = |node: &str| kavi(root, &["pipeline", "step", "parity", "--run", &run, node]);

    // Out of turn: what it needs has not finished.
    let early = step("flaky");
    assert_eq!(code(&early), 2, "{}", text(&early));
    assert!(
        text(&early).contains("`flaky` needs `greet`, which has not finished"),
        "{}",
        text(&early)
    );

    // Another kavi opening the ledger meanwhile does not take the run for an abandoned one.
    kavi(root, &["runs", "list"]);
    let detail = json(&kavi(root, &["runs", "show", &run, "--json"]));
    assert_eq!(detail["status"], "running");

    let greet = step("greet");
    assert_eq!(code(&greet), 0, "{}", text(&greet));
    // Again: the node is decided; the step says so and runs nothing.
    let again = step("greet");
    assert_eq!(code(&again), 0, "{}", text(&again));
    let greets = node_runs(root, &run)
        .into_iter()
        .filter(|(node, ..)| node == "greet")
        .count();
    assert_eq!(greets, 1);

    // The rules changed since the run started: a policy, the configuration, the pipeline.
    std::fs::write(root.join("kavi.toml"), "skill_timeout = \"90s\"\n").unwrap();
    let changed = step("flaky");
    assert_eq!(code(&changed), 2, "{}", text(&changed));
    assert!(
        text(&changed).contains("changed kavi.toml (config)"),
        "{}",
        text(&changed)
    );
    std::fs::write(root.join("kavi.toml"), "# a workspace\n").unwrap();
    let edited = format!("{PARITY}\n# edited\n");
    std::fs::write(root.join("pipelines/parity.toml"), edited).unwrap();
    let other = step("flaky");
    assert_eq!(code(&other), 2, "{}", text(&other));
    assert!(text(&other).contains("not of parity"), "{}", text(&other));
    std::fs::write(root.join("pipelines/parity.toml"), PARITY).unwrap();

    // Only runs started for steps take them.
    let own = kavi(root, &["pipeline", "run", "parity"]);
    let own_id = json(&kavi(root, &["runs", "show", "--json"]))["id"].to_string();
    assert_eq!(code(&own), 1, "{}", text(&own));
    let refused = kavi(
        root,
        &["pipeline", "step", "parity", "--run", &own_id, "greet"],
    );
    assert_eq!(code(&refused), 2, "{}", text(&refused));
    assert!(
        text(&refused).contains("not node by node"),
        "{}",
        text(&refused)
    );

    // The run ends with what no step decided recorded, not left pending.
    let end = kavi(
        root,
        &["pipeline", "end", "parity", "--run", &run, "--json"],
    );
    assert_eq!(code(&end), 1, "{}", text(&end));
    let detail: Value = serde_json::from_slice(&end.stdout).unwrap();
    assert_eq!(detail["status"], "interrupted");
    let states: Vec<&str> = detail["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["state"].as_str().unwrap())
        .collect();
    assert_eq!(states.iter().filter(|s| **s == "cancelled").count(), 8);
    assert!(!states.contains(&"pending"), "{states:?}");
    // A step after the end is refused; the end again changes nothing.
    let late = step("flaky");
    assert_eq!(code(&late), 2, "{}", text(&late));
    let end_again = kavi(root, &["pipeline", "end", "parity", "--run", &run]);
    assert_eq!(code(&end_again), 1, "{}", text(&end_again));

    // A node that failed without running (its `when` could not be evaluated) is decided, as in
    // `kavi pipeline run`: its retry policy is for attempts that ran, and a second step of it
    // runs nothing.
    std::fs::write(
        root.join("pipelines/unevaluable.toml"),
        r#"
[pipeline]
name = "unevaluable"

[nodes.a]
kind = "exec"
run = ["echo", "x"]

[nodes.b]
kind = "exec"
needs = ["a"]
when = "nodes.a.outputs.stdout + 1 == 2"
run = ["echo", "ran"]
retry = { attempts = 2 }
"#,
    )
    .unwrap();
    let started = kavi(root, &["pipeline", "start", "unevaluable"]);
    let other = String::from_utf8_lossy(&started.stdout).trim().to_owned();
    let step = |node: &str| {
        kavi(
            root,
            &["pipeline", "step", "unevaluable", "--run", &other, node],
        )
    };
    assert_eq!(code(&step("a")), 0);
    for _ in 0..2 {
        let b = step("b");
        assert_eq!(code(&b), 1, "{}", text(&b));
        assert!(text(&b).contains("`b` failed (attempt 1)"), "{}", text(&b));
    }
    let attempts: Vec<_> = node_runs(root, &other)
        .into_iter()
        .filter(|(node, ..)| node == "b")
        .collect();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    common::assert_ledger_verifies(root);
}

/// Argo's published JSON Schema for `Workflow`, as the models hera generates from it (see
/// tests/argo/validate.py), accepts every shipped pipeline's manifest, and the validator
/// catches a manifest Argo would reject.
#[test]
fn exported_manifests_are_valid_argo_workflows() {
    let Some(python) = common::python_with("argo-schema", "hera==7.1.0", "hera") else {
        return;
    };
    let validate = |manifest: &Value| {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), manifest.to_string()).unwrap();
        let output = std::process::Command::new(&python)
            .arg(common::repo().join("tests/argo/validate.py"))
            .arg(file.path())
            .output()
            .unwrap();
        (output.status.success(), text(&output))
    };
    let dir = common::shipped_workspace();
    let root = dir.path();
    std::fs::write(root.join("pipelines/parity.toml"), PARITY).unwrap();
    std::fs::write(root.join("pipelines/fan.toml"), FAN).unwrap();
    let mut files: Vec<String> = std::fs::read_dir(root.join("pipelines"))
        .unwrap()
        .map(|entry| format!("pipelines/{}", entry.unwrap().file_name().to_string_lossy()))
        .collect();
    files.sort();
    assert!(files.contains(&"pipelines/forge_attempt.toml".to_owned()));
    for file in &files {
        let manifest = export(
            root,
            file,
            &[
                "--workspace-claim",
                "kavi-workspace",
                "--task-ledger",
                "/ledger/ledger.db",
                "--parallelism",
                "4",
            ],
        );
        let (valid, report) = validate(&manifest);
        assert!(valid, "{file}: {report}");
    }
    let from_secret = export(
        root,
        "pipelines/forge_attempt.toml",
        &[
            "--workspace-claim",
            "kavi-workspace",
            "--sandbox-claim",
            "kavi-sandboxes",
            "--task-ledger-secret",
            "kavi-ledger:url",
        ],
    );
    let (valid, report) = validate(&from_secret);
    assert!(valid, "{report}");

    let mut broken = export(root, "pipelines/forge_attempt.toml", &[]);
    broken["spec"]["templates"][1]["container"]["arguments"] = serde_json::json!(["x"]);
    let (valid, report) = validate(&broken);
    assert!(
        !valid && report.contains("container.arguments: not a field"),
        "{report}"
    );
}

#[test]
fn an_export_lists_what_argo_does_not_carry_out_itself() {
    let dir = workspace_with(PARITY);
    let output = kavi(
        dir.path(),
        &[
            "pipeline",
            "export",
            "parity",
            "--format",
            "argo",
            "--image",
            "kavi:test",
        ],
    );
    assert_eq!(code(&output), 0, "{}", text(&output));
    let notes = String::from_utf8_lossy(&output.stderr);
    for expected in [
        "node `skipped`: its `when` is decided by kavi",
        "node `handler`: runs only when a node it needs did not succeed",
        "node `cleanup`: runs only after the nodes it needs, whatever they did",
        "the tasks share no workspace",
        "give --task-ledger",
    ] {
        assert!(
            notes.contains(expected),
            "missing `{expected}` in:\n{notes}"
        );
    }
    let manifest: Value = serde_json::from_slice(&output.stdout).unwrap();
    let annotation = manifest["metadata"]["annotations"]["kavi.dev/notes"]
        .as_str()
        .unwrap();
    assert!(annotation.contains("node `skipped`"), "{annotation}");
    // Mapped, not noted: the retry, the tolerated failure, the parameter.
    let templates = manifest["spec"]["templates"].as_array().unwrap();
    let flaky = templates
        .iter()
        .find(|t| t["name"] == "node-flaky")
        .unwrap();
    assert_eq!(flaky["retryStrategy"]["limit"], 2);
    let tasks = templates[0]["dag"]["tasks"].as_array().unwrap();
    let tolerated = tasks
        .iter()
        .find(|t| t["name"] == "node-tolerated")
        .unwrap();
    assert_eq!(tolerated["continueOn"]["failed"], true);
    assert_eq!(
        manifest["spec"]["arguments"]["parameters"][0]["value"],
        "kavi"
    );
}

/// Fan-outs of each source: a list parameter of three items, limited to two at once, and a
/// previous node's JSON output (objects, read by field), then a node that reads the list of
/// the first one's outputs.
const FAN: &str = r#"
[pipeline]
name = "parity"

[params.words]
type = "list"
default = ["alpha", "beta", "gamma"]

[nodes.list]
kind = "exec"
run = ["echo", '[{"n": 1}, {"n": 2}]']

[nodes.each]
kind = "exec"
for_each = "{{ params.words }}"
max_parallel = 2
env = { WORD = "{{ item }}" }
shell = 'sleep 0.3; echo "word $WORD"'

[nodes.objs]
kind = "exec"
needs = ["list"]
for_each = "{{ nodes.list.outputs.stdout }}"
run = ["echo", "n={{ item.n }}"]

[nodes.after]
kind = "exec"
needs = ["each", "objs"]
run = ["echo", "{% for o in nodes.each.outputs %}{{ o.stdout | trim }};{% endfor %}"]
"#;

/// A run's node runs sorted by node and attempt: the two schedulers record instances of
/// independent fan-outs in another order.
fn sorted_node_runs(root: &Path, run: &str) -> Vec<(String, i64, String, Value, Value)> {
    let mut runs = node_runs(root, run);
    runs.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    runs
}

/// `pipeline` run by `kavi pipeline run` in one workspace and, exported, by the stand-in
/// controller in another: the driven workspace, the controller's outcome and the run's id,
/// once both recorded the same node runs.
fn run_both_ways(pipeline: &str, exit: i32) -> (tempfile::TempDir, controller::Outcome, String) {
    let local = workspace_with(pipeline);
    let run = kavi(local.path(), &["pipeline", "run", "parity"]);
    assert_eq!(code(&run), exit, "{}", text(&run));
    let expected = sorted_node_runs(local.path(), "latest");

    let driven = workspace_with(pipeline);
    let manifest = export(driven.path(), "parity", &["--workspace-claim", "ws"]);
    let outcome = controller::run(
        &manifest,
        driven.path(),
        Path::new(env!("CARGO_BIN_EXE_kavi")),
        &[],
        (&[], &[]),
    );
    let run_id = outcome.globals["kavi-run"].clone();
    assert_eq!(
        sorted_node_runs(driven.path(), &run_id),
        expected,
        "{outcome:?}"
    );
    assert_eq!(outcome.on_exit, Some(exit), "{outcome:?}");
    common::assert_ledger_verifies(driven.path());
    (driven, outcome, run_id)
}

/// A fan-out exported: kavi decides it and records its instances, Argo fans out over them
/// (`withParam`, at most `max_parallel` at once, the template's `parallelism`), each instance a
/// step of its own, and the node's own task ends it with the list of their outputs. The ledger
/// holds what `kavi pipeline run` records, each item once.
#[test]
fn an_exported_fan_out_records_what_pipeline_run_records() {
    if !controller::available() {
        return;
    }
    let (driven, outcome, run_id) = run_both_ways(FAN, 0);
    let runs = sorted_node_runs(driven.path(), &run_id);
    let instances: Vec<_> = runs
        .iter()
        .filter(|(id, ..)| id.starts_with("each["))
        .map(|(id, attempt, state, _, outputs)| {
            (
                id.as_str(),
                *attempt,
                state.as_str(),
                outputs["item"].clone(),
            )
        })
        .collect();
    assert_eq!(
        instances,
        [
            ("each[0]", 1, "succeeded", serde_json::json!("alpha")),
            ("each[1]", 1, "succeeded", serde_json::json!("beta")),
            ("each[2]", 1, "succeeded", serde_json::json!("gamma")),
        ]
    );
    let after = runs.iter().find(|(id, ..)| id == "after").unwrap();
    assert_eq!(after.4["stdout"], "word alpha;word beta;word gamma;\n");
    for i in 0..3 {
        assert_eq!(
            outcome.phases[&format!("node-each-each.instance({i})")],
            "Succeeded"
        );
        assert_eq!(outcome.exits[&format!("node-each-each.instance({i})")], [0]);
    }
    assert_eq!(outcome.phases["node-objs-each.instance(1)"], "Succeeded");
    // Two instances at most ran at once: no instant lies inside three of their runs.
    let detail = json(&kavi(driven.path(), &["runs", "show", &run_id, "--json"]));
    let spans: Vec<(String, String)> = detail["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["node_id"].as_str().unwrap().starts_with("each["))
        .map(|n| {
            (
                n["started_at"].as_str().unwrap().to_owned(),
                n["finished_at"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (start, _) in &spans {
        let running = spans
            .iter()
            .filter(|(s, f)| s <= start && start < f)
            .count();
        assert!(running <= 2, "{spans:?}");
    }
}

/// An item that fails fails its fan-out, and the run, as in `kavi pipeline run`; the other
/// items are recorded as they ran there.
#[test]
fn a_failing_item_fails_the_exported_workflow_as_pipeline_run_fails() {
    if !controller::available() {
        return;
    }
    let pipeline = "[pipeline]\nname = \"parity\"\n\n[nodes.fan]\nkind = \"exec\"\n\
                    for_each = [\"a\", \"b\", \"bad\"]\nrun = [\"test\", \"{{ item }}\", \"!=\", \"bad\"]\n\n\
                    [nodes.next]\nkind = \"exec\"\nneeds = [\"fan\"]\nrun = [\"true\"]\n";
    let (driven, outcome, run_id) = run_both_ways(pipeline, 1);
    assert_eq!(outcome.phases["node-fan-each.instance(2)"], "Failed");
    assert_eq!(outcome.phases["node-fan"], "Failed");
    assert_eq!(outcome.phases["node-next"], "Failed");
    let detail = json(&kavi(driven.path(), &["runs", "show", &run_id, "--json"]));
    assert_eq!(detail["status"], "failed");
}

/// The steps of a fan-out are idempotent, as Argo may start a pod twice: deciding it again
/// records nothing and gives the same instances, an instance or its end stepped again runs
/// nothing; and out of turn they are refused.
#[test]
fn a_fan_out_s_steps_run_each_item_once_however_often_they_are_started() {
    let dir = workspace_with(FAN);
    let root = dir.path();
    let start = kavi(root, &["pipeline", "start", "parity"]);
    let run = String::from_utf8_lossy(&start.stdout).trim().to_owned();
    let step = |args: &[&str]| {
        let mut all = vec!["pipeline", "step", "parity", "--run", &run];
        all.extend_from_slice(args);
        kavi(root, &all)
    };
    let list = root.join("instances.json");
    let list_arg = list.to_str().unwrap();
    let early = step(&["each"]);
    assert_eq!(code(&early), 2, "{}", text(&early));
    assert!(
        text(&early).contains("its step with --instances-file comes first"),
        "{}",
        text(&early)
    );
    let unrecorded = step(&["each[0]"]);
    assert_eq!(code(&unrecorded), 2, "{}", text(&unrecorded));
    let mut lists = Vec::new();
    for _ in 0..2 {
        let expand = step(&["each", "--instances-file", list_arg]);
        assert_eq!(code(&expand), 0, "{}", text(&expand));
        lists.push(std::fs::read_to_string(&list).unwrap());
    }
    assert_eq!(lists[0], lists[1]);
    let listed: Value = serde_json::from_str(&lists[0]).unwrap();
    assert_eq!(
        listed[2],
        serde_json::json!({ "id": "each[2]", "item": "gamma" })
    );
    let not_yet = step(&["each"]);
    assert!(
        text(&not_yet).contains("`each[0]` has not finished"),
        "{}",
        text(&not_yet)
    );
    for i in [0, 1, 2, 1] {
        let instance = step(&[&format!("each[{i}]")]);
        assert_eq!(code(&instance), 0, "{}", text(&instance));
    }
    let beyond = step(&["each[3]"]);
    assert_eq!(code(&beyond), 2, "{}", text(&beyond));
    let wrong = step(&["list", "--instances-file", list_arg]);
    assert_eq!(code(&wrong), 2, "{}", text(&wrong));
    for _ in 0..2 {
        let end = step(&["each"]);
        assert_eq!(code(&end), 0, "{}", text(&end));
    }
    let runs = node_runs(root, &run);
    for id in ["each", "each[0]", "each[1]", "each[2]"] {
        let rows: Vec<_> = runs.iter().filter(|(n, ..)| n == id).collect();
        assert_eq!(rows.len(), 1, "{id}: {rows:?}");
        assert_eq!(rows[0].2, "succeeded", "{id}");
    }
    // Ended with `objs` never decided: the run is interrupted, nothing left pending.
    let end = kavi(
        root,
        &["pipeline", "end", "parity", "--run", &run, "--json"],
    );
    let detail: Value = serde_json::from_slice(&end.stdout).unwrap();
    assert_eq!(detail["status"], "interrupted");
    common::assert_ledger_verifies(root);
}

/// The stand-in controller loops as Argo does: `withItems` and `withParam` items in order,
/// `{{item}}` and `{{item.KEY}}` in place, no item a skipped task, and text that is not a JSON
/// list an errored one.
#[test]
fn the_stand_in_controller_loops_as_argo_does() {
    if !controller::available() {
        return;
    }
    let dir = workspace_with(FAN);
    let manifest = serde_json::json!({
        "spec": {
            "entrypoint": "main",
            "templates": [
                { "name": "main", "dag": { "tasks": [
                    { "name": "items", "template": "kavi",
                      "withItems": [{ "flag": "--version" }, { "flag": "--no-such-flag" }],
                      "arguments": { "parameters": [{ "name": "flag", "value": "{{item.flag}}" }] } },
                    { "name": "param", "template": "kavi", "withParam": "[\"--version\"]",
                      "arguments": { "parameters": [{ "name": "flag", "value": "{{item}}" }] } },
                    { "name": "none", "template": "kavi", "withParam": "[]",
                      "arguments": { "parameters": [{ "name": "flag", "value": "{{item}}" }] } },
                    { "name": "broken", "template": "kavi", "withParam": "{\"not\": \"a list\"}",
                      "arguments": { "parameters": [{ "name": "flag", "value": "{{item}}" }] } },
                ]}},
                { "name": "kavi", "inputs": { "parameters": [{ "name": "flag" }] },
                  "container": { "image": "kavi", "command": ["kavi"], "args": ["{{inputs.parameters.flag}}"] } },
            ],
        },
    });
    let outcome = controller::run(
        &manifest,
        dir.path(),
        Path::new(env!("CARGO_BIN_EXE_kavi")),
        &[],
        (&[], &[]),
    );
    // In order, each with its own field; one item failed fails the task.
    assert_eq!(outcome.exits["items(0)"], [0]);
    assert_eq!(outcome.exits["items(1)"], [2]);
    assert_eq!(outcome.phases["items(1)"], "Failed");
    assert_eq!(outcome.phases["items"], "Failed");
    assert_eq!(outcome.exits["param(0)"], [0]);
    assert_eq!(outcome.phases["param"], "Succeeded");
    assert_eq!(outcome.phases["none"], "Skipped");
    assert_eq!(outcome.phases["broken"], "Errored");
}

/// `kavi` in `root` with its ledger on the tests' PostgreSQL server at `url`.
fn on_server(root: &Path, url: &str, args: &[&str]) -> std::process::Output {
    common::kavi_command(root, args)
        .env("KAVI_LEDGER", url)
        .output()
        .unwrap()
}

/// `count` kavis started at once with `args` on the server's ledger, and what each did.
fn on_server_at_once(
    root: &Path,
    url: &str,
    args: &[&str],
    count: usize,
) -> Vec<std::process::Output> {
    let started: Vec<_> = (0..count)
        .map(|_| {
            common::kavi_command(root, args)
                .env("KAVI_LEDGER", url)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    started
        .into_iter()
        .map(|kavi| kavi.wait_with_output().unwrap())
        .collect()
}

/// Every text the server's ledger keeps that could carry a secret: the journal holds each row's
/// content, and the specs every governing file's text.
fn server_texts(url: &str) -> String {
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let mut texts = String::new();
    for sql in [
        "SELECT content || key FROM journal",
        "SELECT text FROM specs",
        "SELECT coalesce(error, '') || owner FROM runs",
    ] {
        for row in client.query(sql, &[]).unwrap() {
            texts.push_str(&row.get::<_, String>(0));
            texts.push('\n');
        }
    }
    texts
}

#[test]
fn the_readme_forge_runs_on_a_server_ledger_which_verifies_and_keeps_no_password() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    // The tests' server asks for the password its URL carries, which must be kept secret.
    let password = url
        .split_once("kavi:")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map(|(password, _)| password.to_owned())
        .unwrap();
    let dir = common::shipped_workspace();
    let root = dir.path();
    let run = on_server(
        root,
        &url,
        &["pipeline", "run", "forge.toml", "--set", "skill=word_count"],
    );
    assert_eq!(code(&run), 0, "{}", text(&run));
    assert!(
        text(&run).contains("skill `word_count` is TRUSTED"),
        "{}",
        text(&run)
    );
    let verify = on_server(root, &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
    assert!(text(&verify).starts_with("ok: "), "{}", text(&verify));
    let doctor = on_server(root, &url, &["doctor"]);
    assert!(
        text(&doctor).contains("postgres://kavi:[redacted]@127.0.0.1"),
        "{}",
        text(&doctor)
    );
    for output in [&run, &verify, &doctor] {
        assert!(!text(output).contains(&password), "{}", text(output));
    }
    assert!(!server_texts(&url).contains(&password));
    common::assert_nowhere_under(root, &password);
    // Nothing of the ledger went into the workspace's own SQLite file.
    assert!(!root.join(".kavi/ledger.db").exists());

    // The password can stay out of the URL: PGPASSWORD gives it, as to libpq. Without it, the
    // server refuses, and kavi says so.
    let bare = url.replacen(&format!(":{password}@"), "@", 1);
    let listed = common::kavi_command(root, &["runs", "list"])
        .env("KAVI_LEDGER", &bare)
        .env("PGPASSWORD", &password)
        .output()
        .unwrap();
    assert_eq!(code(&listed), 0, "{}", text(&listed));
    assert!(text(&listed).contains("forge"), "{}", text(&listed));
    let refused = common::kavi_command(root, &["runs", "list"])
        .env("KAVI_LEDGER", &bare)
        .env_remove("PGPASSWORD")
        .output()
        .unwrap();
    assert_eq!(code(&refused), 4, "{}", text(&refused));
    assert!(text(&refused).contains("password"), "{}", text(&refused));
}

/// Two checkouts of one workspace on two machines, each with its own artifact folder, on one
/// server ledger: the skill one promotes is TRUSTED on the other, which runs it. A checkout
/// whose files are stale is that machine's condition: it runs the trusted bytes from the shared
/// store, and the skill stays trusted for the team.
#[test]
fn a_skill_promoted_by_one_kavi_is_trusted_by_another_on_the_same_server() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let (first, second) = (common::shipped_workspace(), common::shipped_workspace());
    let kavi_at = |root: &Path, args: &[&str]| on_server(root, &url, args);
    let forged = kavi_at(
        first.path(),
        &["pipeline", "run", "forge.toml", "--set", "skill=word_count"],
    );
    assert_eq!(code(&forged), 0, "{}", text(&forged));
    // The second checkout gets the skill's files as a team does, through version control.
    common::copy_dir(
        &first.path().join("skills/word_count"),
        &second.path().join("skills/word_count"),
    );
    let shown = json(&kavi_at(
        second.path(),
        &["skill", "show", "word_count", "--json"],
    ));
    assert_eq!(shown["skill"]["state"], "TRUSTED");
    let run_on = |root: &Path| {
        let ran = kavi_at(
            root,
            &[
                "skill",
                "run",
                "word_count",
                "--input",
                r#"{"text": "one two three"}"#,
            ],
        );
        assert_eq!(code(&ran), 0, "{}", text(&ran));
        let record: Value = serde_json::from_slice(&ran.stdout).unwrap();
        assert_eq!(record["output"]["words"], 3, "{record}");
        (record, text(&ran))
    };
    run_on(second.path());

    // The second machine's checkout is stale (its files are not the trusted ones): verifying
    // there says so, and suspends nothing.
    let skill_file = second.path().join("skills/word_count/skill.py");
    let trusted_bytes = std::fs::read(&skill_file).unwrap();
    std::fs::write(&skill_file, "print('changed')\n").unwrap();
    let verified = kavi_at(second.path(), &["skill", "verify"]);
    assert_eq!(code(&verified), 0, "{}", text(&verified));
    assert!(
        text(&verified).contains(&format!(
            "STALE  word_count  trusted sha256:{}; this checkout's files differ \
             (skills/word_count/skill.py: trusted sha256:{}, found sha256:{})",
            &shown["skill"]["trusted_hash"].as_str().unwrap()["sha256:".len()..][..12],
            kavi::hash::sha256_hex(&trusted_bytes),
            kavi::hash::sha256_hex(b"print('changed')\n"),
        )),
        "{}",
        text(&verified)
    );
    for root in [first.path(), second.path()] {
        let shown = json(&kavi_at(root, &["skill", "show", "word_count", "--json"]));
        assert_eq!(shown["skill"]["state"], "TRUSTED");
    }
    // Both run it: the second from the trusted bytes it fetches from the shared store (its
    // own folder would print `changed`), saying so; the first from its folder.
    std::fs::remove_dir_all(second.path().join(".kavi/artifacts")).unwrap();
    let (record, said) = run_on(second.path());
    assert!(
        said.contains(
            "differs from its trusted files: running the trusted files from the shared store"
        ),
        "{said}"
    );
    assert_eq!(record["source_hash"], shown["skill"]["trusted_hash"]);
    run_on(first.path());
}

/// A node whose output is over the 16 KiB the ledger keeps in a row, and over two of the
/// server's 1 MiB chunks.
const LARGE: &str = r#"
[pipeline]
name = "large"

[nodes.big]
kind = "exec"
shell = "yes kavi | head -c 2500000"
"#;

/// Two checkouts on two machines, each with its own artifact folder, on one server ledger: an
/// output too large for a row, made on the first, is verified and read on the second, from the
/// copy the server keeps; the second's file of it is a cache, checked whenever it is read.
#[test]
fn a_large_artifact_made_on_one_machine_is_verified_and_read_on_another() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let (first, second) = (workspace_with(LARGE), workspace_with(LARGE));
    let ran = on_server(first.path(), &url, &["pipeline", "run", "parity"]);
    assert_eq!(code(&ran), 0, "{}", text(&ran));
    let expected = "kavi\n".repeat(500_000).into_bytes();
    let detail = json(&on_server(
        second.path(),
        &url,
        &["runs", "show", "1", "--json"],
    ));
    let stdout = detail["nodes"][0]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["role"] == "stdout")
        .unwrap()
        .clone();
    let sha = stdout["sha256"].as_str().unwrap();
    assert_eq!(stdout["size"], expected.len());
    // A file of the store, not a row: the case that was only on the first machine's disk.
    assert_ne!(stdout["path"], "");
    common::reads_from_another_checkout(
        second.path(),
        &|args| on_server(second.path(), &url, args),
        (sha, stdout["path"].as_str().unwrap()),
        "big",
        &expected,
    );

    // The server's copy altered: refused on reading where no machine has it, and reported.
    let third = workspace_with(LARGE);
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let altered = client
        .execute(
            "UPDATE artifact_chunks SET content = convert_to('edited', 'UTF8')
             WHERE sha256 = $1 AND seq = 1",
            &[&sha],
        )
        .unwrap();
    assert_eq!(altered, 1);
    let cat = on_server(third.path(), &url, &["artifact", "cat", sha]);
    assert_eq!(code(&cat), 4, "{}", text(&cat));
    assert!(
        text(&cat).contains("in the shared store was altered"),
        "{}",
        text(&cat)
    );
    let verify = on_server(third.path(), &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 1, "{}", text(&verify));
    assert!(
        text(&verify).contains(&format!(
            "artifact {sha}: the content the ledger keeps no longer hashes to its name"
        )),
        "{}",
        text(&verify)
    );

    // The run pruned: the server's chunks of its artifact go with its row, and the ledger
    // verifies from another checkout.
    let gc = on_server(
        first.path(),
        &url,
        &["gc", "--older-than", "0s", "--keep", "0"],
    );
    assert_eq!(code(&gc), 0, "{}", text(&gc));
    assert!(text(&gc).contains("1 artifact"), "{}", text(&gc));
    let chunks: i64 = client
        .query_one("SELECT count(*) FROM artifact_chunks", &[])
        .unwrap()
        .get(0);
    assert_eq!(chunks, 0);
    let verify = on_server(third.path(), &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
}

#[test]
fn four_runs_at_once_on_one_server_lose_nothing() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let mut pipeline = String::from("[pipeline]\nname = \"many\"\n");
    for i in 0..25 {
        pipeline.push_str(&format!(
            "\n[nodes.n{i}]\nkind = \"exec\"\nrun = [\"echo\", \"node {i}\"]\n"
        ));
        if i >= 5 {
            pipeline.push_str(&format!("needs = [\"n{}\"]\n", i - 5));
        }
    }
    let dir = workspace_with(&pipeline);
    let root = dir.path();
    let runs = on_server_at_once(
        root,
        &url,
        &["pipeline", "run", "parity", "--jobs", "3", "--json"],
        4,
    );
    let mut ids = Vec::new();
    for output in runs {
        assert_eq!(code(&output), 0, "{}", text(&output));
        let detail: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(detail["status"], "succeeded");
        let nodes = detail["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 25);
        assert!(nodes.iter().all(|n| n["state"] == "succeeded"), "{nodes:?}");
        ids.push(detail["id"].as_i64().unwrap());
    }
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3, 4]);
    let listed = json(&on_server(root, &url, &["runs", "list", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 4);
    let verify = on_server(root, &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
}

#[test]
fn a_sqlite_ledger_moves_to_a_server_checkpoints_and_all_and_verifies_there() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let dir = workspace_with(PARITY);
    let root = dir.path();
    // A keys folder of its own (a signing key is made once per folder), with the MAC key the
    // tests' runs use.
    let keys = tempfile::tempdir().unwrap();
    let with_key = |args: &[&str]| {
        common::kavi_command(root, args)
            .env("KAVI_KEYS", keys.path())
            .output()
            .unwrap()
    };
    assert_eq!(code(&kavi(root, &["pipeline", "run", "parity"])), 1);
    common::copy_dir(&common::config_home().join("kavi"), keys.path());
    assert_eq!(code(&with_key(&["ledger", "keygen"])), 0);
    assert_eq!(code(&with_key(&["ledger", "checkpoint"])), 0);
    assert_eq!(
        code(&kavi(
            root,
            &["pipeline", "run", "parity", "--set", "word=x"]
        )),
        1
    );
    // An output too large for a row: a file of this machine's store, which the copy takes along.
    std::fs::write(root.join("pipelines/large.toml"), LARGE).unwrap();
    assert_eq!(code(&kavi(root, &["pipeline", "run", "large"])), 0);

    let moved = with_key(&["ledger", "migrate", "--to", &url]);
    assert_eq!(code(&moved), 0, "{}", text(&moved));
    assert!(text(&moved).contains("3 runs"), "{}", text(&moved));
    assert!(text(&moved).contains("1 checkpoints"), "{}", text(&moved));
    assert!(
        text(&moved).contains("the copy verifies"),
        "{}",
        text(&moved)
    );
    let on_copy = |args: &[&str]| {
        common::kavi_command(root, args)
            .env("KAVI_KEYS", keys.path())
            .env("KAVI_LEDGER", &url)
            .output()
            .unwrap()
    };
    let verify = on_copy(&["ledger", "verify", "--json"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
    let findings: Value = serde_json::from_slice(&verify.stdout).unwrap();
    assert_eq!(findings["checkpoints"], 1);
    // The copy goes on where the file stopped.
    assert_eq!(code(&on_copy(&["pipeline", "run", "parity"])), 1);
    let listed = json(&on_copy(&["runs", "list", "--json"]));
    assert_eq!(listed[0]["id"], 4);
    assert_eq!(code(&on_copy(&["ledger", "verify"])), 0);
    // Another machine's checkout reads the large output from the server.
    let elsewhere = workspace_with(PARITY);
    let on_copy_elsewhere = |args: &[&str]| {
        common::kavi_command(elsewhere.path(), args)
            .env("KAVI_KEYS", keys.path())
            .env("KAVI_LEDGER", &url)
            .output()
            .unwrap()
    };
    let verify = on_copy_elsewhere(&["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
    let logs = on_copy_elsewhere(&["runs", "logs", "3", "big"]);
    assert_eq!(code(&logs), 0, "{}", text(&logs));
    assert!(logs.stdout == "kavi\n".repeat(500_000).into_bytes());

    // Into a database that holds a ledger: refused.
    let again = with_key(&["ledger", "migrate", "--to", &url]);
    assert_eq!(code(&again), 2, "{}", text(&again));
    assert!(
        text(&again).contains("holds a ledger already"),
        "{}",
        text(&again)
    );
    // A ledger changed outside kavi is not copied.
    let mut ledger = common::LedgerConnection::open(root);
    ledger.batch("DROP TRIGGER journal_runs_update; UPDATE runs SET status = 'succeeded';");
    let Some(other) = common::postgres::database() else {
        return;
    };
    let tampered = with_key(&["ledger", "migrate", "--to", &other]);
    assert_eq!(code(&tampered), 1, "{}", text(&tampered));
    assert!(
        text(&tampered).contains("refused: the ledger does not verify"),
        "{}",
        text(&tampered)
    );
}

/// A server's ledger names the kavi processes of every machine that uses it: a kavi recovers
/// only what its own machine's dead processes left, and leaves the rest running.
#[test]
fn recovery_on_a_server_leaves_other_machines_runs_alone() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let dir = workspace_with(PARITY);
    let root = dir.path();
    assert_eq!(
        code(&on_server(root, &url, &["pipeline", "run", "parity"])),
        1
    );
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    for owner in ["123-456@elsewhere.example", &format!("124-457@{host}")] {
        common::postgres::keyed_batch(
            &mut client,
            &format!(
                "INSERT INTO runs (pipeline, spec_path, spec_hash, params, status, started_at, owner)
                 SELECT pipeline, spec_path, spec_hash, params, 'running', started_at, '{owner}'
                 FROM runs WHERE id = 1"
            ),
        );
    }
    let listed = json(&on_server(root, &url, &["runs", "list", "--json"]));
    let status = |id: i64| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|run| run["id"] == id)
            .unwrap()["status"]
            .clone()
    };
    assert_eq!(status(2), "running");
    assert_eq!(status(3), "interrupted");
}

/// The tables, columns, constraints and indexes of a server's ledger, for comparing two.
fn server_schema(url: &str) -> Vec<String> {
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let mut described = Vec::new();
    for sql in [
        "SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable
                || ' ' || is_identity || ' ' || coalesce(column_default, '')
         FROM information_schema.columns WHERE table_schema = current_schema()",
        "SELECT table_name || ' ' || constraint_type || ' ' || constraint_name
         FROM information_schema.table_constraints
         -- NOT NULL is a CHECK named after the table's oid here; is_nullable says it above
         WHERE table_schema = current_schema() AND constraint_type <> 'CHECK'",
        "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema()",
        "SELECT event_object_table || ' ' || trigger_name || ' ' || event_manipulation
         FROM information_schema.triggers WHERE trigger_schema = current_schema()",
    ] {
        for row in client.query(sql, &[]).unwrap() {
            described.push(row.get::<_, String>(0));
        }
    }
    described.sort();
    described
}

/// A ledger the first kavi with server ledgers made (schema 23) is brought up to date by the
/// first command of this one: what it holds reads as before, the next run finds its node up to
/// date, the chain verifies, and its schema is that of a ledger made new.
#[test]
fn a_server_ledger_from_schema_23_is_upgraded_and_reads_as_before() {
    let (Some(url), Some(fresh)) = (common::postgres::database(), common::postgres::database())
    else {
        return;
    };
    let dir = workspace_with(
        r#"
[pipeline]
name = "parity"

[nodes.copy]
kind = "exec"
run = ["cp", "src/a.txt", "out/a.txt"]
inputs = ["src/a.txt"]
outputs = ["out/a.txt"]
"#,
    );
    let root = dir.path();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::create_dir_all(root.join("out")).unwrap();
    std::fs::write(root.join("src/a.txt"), "a\n").unwrap();
    let first = on_server(root, &url, &["pipeline", "run", "parity"]);
    assert_eq!(code(&first), 0, "{}", text(&first));
    let shown = json(&on_server(root, &url, &["runs", "show", "1", "--json"]));
    assert_eq!(shown["governing"].as_array().unwrap().len(), 2, "{shown}");
    let explained = text(&on_server(root, &url, &["explain", "1", "copy"]));

    // Back to schema 23, as the kavi before wrote that run: the set's members in run_policies,
    // the key's parts in node_cache, neither table since, and no sandbox budget. Through the journal's triggers,
    // so that the chain stays whole, appending as the rows change, as that kavi's did (a
    // table whose entries are still to come, at commit, cannot be dropped).
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    client
        .batch_execute(
            "BEGIN;
             SET CONSTRAINTS ALL IMMEDIATE;
             INSERT INTO run_policies (run_id, path, spec_hash, role)
                 SELECT r.id, g.path, g.spec_hash, g.role
                 FROM runs r JOIN governing_members g ON g.set_hash = r.governing_hash;
             UPDATE node_cache SET parts = (SELECT parts FROM cache_parts p
                                            WHERE p.key = node_cache.key);
             DELETE FROM governing_members;
             DELETE FROM cache_parts;
             DROP TABLE governing_members;
             DROP TABLE cache_parts;
             ALTER TABLE node_cache ALTER COLUMN parts SET NOT NULL;
             ALTER TABLE sandboxes DROP COLUMN keep_max_bytes;
             DELETE FROM rule_sets;
             DROP TABLE rule_sets;
             ALTER TABLE escalations DROP COLUMN approvals;
             ALTER TABLE skills DROP COLUMN trusted_rules;
             DELETE FROM ledger_identity;
             DROP TABLE ledger_identity;
             ALTER TABLE journal DROP COLUMN mac;
             ALTER TABLE runs DROP COLUMN allowed_changes;
             ALTER TABLE promotions DROP COLUMN attestation;
             ALTER TABLE node_runs DROP COLUMN claimed_by;
             ALTER TABLE node_runs DROP COLUMN lease_until;
             ALTER TABLE runs DROP COLUMN lease_until;
             ALTER TABLE runs DROP COLUMN local_settings;
             DELETE FROM artifact_chunks;
             DROP TABLE artifact_chunks;
             DROP INDEX verifications_skill;
             DROP INDEX verifications_skill_run;
             DROP INDEX executions_skill;
             DROP TABLE group_slots;
             DELETE FROM artifact_objects;
             DROP TABLE artifact_objects;
             DROP TABLE object_deletions;
             UPDATE schema_version SET version = 23;
             COMMIT;",
        )
        .unwrap();
    drop(client);

    // Three kavis open it at once: one upgrades it, under the write lock, and the others find
    // it done (`ledger verify` opens it read-only, and upgrades nothing).
    for listed in on_server_at_once(root, &url, &["runs", "list"], 3) {
        assert_eq!(code(&listed), 0, "{}", text(&listed));
    }
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let count = |client: &mut postgres::Client, sql: &str| -> i64 {
        client.query_one(sql, &[]).unwrap().get(0)
    };
    assert_eq!(count(&mut client, "SELECT version FROM schema_version"), 39);
    let shown_again = json(&on_server(root, &url, &["runs", "show", "1", "--json"]));
    assert_eq!(shown_again["governing"], shown["governing"]);
    assert_eq!(
        text(&on_server(root, &url, &["explain", "1", "copy"])),
        explained
    );

    // The next run finds its node up to date from the old key, and writes its set and the
    // key's parts once, in the new tables.
    let second = json(&on_server(
        root,
        &url,
        &["pipeline", "run", "parity", "--json"],
    ));
    assert_eq!(second["nodes"][0]["state"], "cached", "{second}");
    // (its set is the first run's: the files its command names are its data)
    let members = second["governing"].as_array().unwrap().len();
    assert_eq!(members, 2, "{second}");
    assert_eq!(
        count(&mut client, "SELECT COUNT(*) FROM governing_members"),
        2
    );
    assert_eq!(count(&mut client, "SELECT COUNT(*) FROM cache_parts"), 1);
    assert_eq!(
        count(
            &mut client,
            "SELECT COUNT(*) FROM node_cache WHERE parts IS NULL"
        ),
        1
    );
    // The entries the older kavi wrote carry no MAC: verify says so until they are sealed.
    let unsealed = on_server(root, &url, &["ledger", "verify"]);
    assert_eq!(code(&unsealed), 1, "{}", text(&unsealed));
    let sealed = on_server(root, &url, &["ledger", "seal"]);
    assert_eq!(code(&sealed), 0, "{}", text(&sealed));
    let verify = on_server(root, &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));

    // Its schema is that of a ledger made new by this kavi. The new ledger carries over the
    // rules adopted in the first one, which kavi remembers without its password: the server's
    // password comes from PGPASSWORD, as docs/distributed.md says.
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(credentials, _)| credentials.split_once(':'))
        .map(|(_, password)| password.to_owned())
        .unwrap();
    let made = common::kavi_command(root, &["pipeline", "run", "parity"])
        .env("KAVI_LEDGER", &fresh)
        .env("PGPASSWORD", password)
        .output()
        .unwrap();
    assert_eq!(code(&made), 0, "{}", text(&made));
    assert_eq!(server_schema(&url), server_schema(&fresh));
}
