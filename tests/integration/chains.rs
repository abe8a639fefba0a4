//! Trusted skills in use, end to end: chains with JSONPath mappings, the execution records and
//! their lineage, replay, the session tree, and the JSONL log. The skills are forged first by
//! the shipped forge, so they are TRUSTED the way a user's would be.

use crate::common;

use common::{json, kavi, shipped_workspace};

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

fn forge(root: &Path, skills: &[&str]) {
    for skill in skills {
        let set = format!("skill={skill}");
        let out = kavi(root, &["pipeline", "run", "forge", "--set", &set]);
        assert!(
            out.status.success(),
            "{skill}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

fn write(root: &Path, relative: &str, text: &str) {
    let path = root.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A workspace with `find_notes` and `summarize_note` trusted and two notes to find.
fn notes_workspace() -> tempfile::TempDir {
    let dir = shipped_workspace();
    let root = dir.path();
    forge(root, &["find_notes", "summarize_note"]);
    write(
        root,
        "notes/kavi.md",
        "# About kavi\n\nKavi runs governed pipelines.\n",
    );
    write(root, "notes/other.md", "# Other\n\nNothing to see.\n");
    dir
}

fn chain(root: &Path, args: &[&str]) -> Output {
    let mut all = vec!["chain", "run"];
    all.extend_from_slice(args);
    kavi(root, &all)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_two_step_chain_maps_the_first_result_into_the_second_and_links_the_records() {
    let dir = notes_workspace();
    let root = dir.path();
    let steps = json(&chain(
        root,
        &["search_and_summarize", "--set", "query=governed", "--json"],
    ));
    let [search, summarize] = steps.as_array().unwrap().as_slice() else {
        panic!("{steps}");
    };
    assert_eq!(search["status"], "succeeded");
    assert_eq!(
        search["record"]["output"]["results"][0]["path"],
        "notes/kavi.md"
    );
    assert_eq!(summarize["status"], "succeeded");
    // The mapping put the path into the second step's input.
    assert_eq!(
        summarize["record"]["input"],
        json!({"path": "notes/kavi.md"})
    );
    assert_eq!(
        summarize["record"]["output"],
        json!({"path": "notes/kavi.md", "title": "About kavi", "words": 7, "lines": 3})
    );
    // Lineage: the second record's parent is the first; each names its chain and step.
    assert_eq!(
        summarize["record"]["parent_execution_id"],
        search["record"]["execution_id"]
    );
    assert!(search["record"]["parent_execution_id"].is_null());
    assert_eq!(summarize["record"]["chain"], "search_and_summarize");
    assert_eq!(summarize["record"]["step"], "summarize");

    // The session tree of the last chain: the search, and the summary under it.
    let tree = json(&kavi(root, &["session", "--latest", "--json"]));
    assert_eq!(tree.as_array().unwrap().len(), 1);
    assert_eq!(tree[0]["execution_id"], search["record"]["execution_id"]);
    assert_eq!(
        tree[0]["children"][0]["execution_id"],
        summarize["record"]["execution_id"]
    );
    let text = stdout(&kavi(root, &["session", "--latest"]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("✓ find_notes "), "{text}");
    assert!(lines[0].ends_with(" (step search)"), "{text}");
    assert!(lines[1].starts_with("└─ ✓ summarize_note "), "{text}");

    // A path that may select many passes every match, as a list, and the skill's input schema
    // judges it: `summarize_note` takes one path, so the list is refused, never cut to its first.
    let many = std::fs::read_to_string(root.join("chains/search_and_summarize.toml"))
        .unwrap()
        .replace("name = \"search_and_summarize\"", "name = \"many\"")
        .replace("$.results[0].path", "$.results[*].path");
    write(root, "chains/many.toml", &many);
    let out = chain(root, &["many", "--set", "query=governed", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let steps: Value = serde_json::from_slice(&out.stdout).unwrap();
    let summarize = &steps[1];
    assert_eq!(summarize["status"], "failed", "{steps}");
    assert_eq!(
        summarize["record"]["input"],
        json!({"path": ["notes/kavi.md"]})
    );
    assert!(summarize["record"]["output"].is_null(), "{steps}");
    assert_eq!(
        summarize["record"]["error"],
        "the input does not match the input schema: at /path: [\"notes/kavi.md\"] is not of type \"string\""
    );
    common::assert_ledger_verifies(root);
}

/// `chain check` refuses a `from` or `parent` that names no earlier step, at its place, with
/// "did you mean" from the earlier steps' ids.
#[test]
fn chain_check_suggests_the_earlier_step_a_misspelled_reference_meant() {
    let dir = shipped_workspace();
    let root = dir.path();
    for field in ["from", "parent"] {
        write(
            root,
            "chains/typo.toml",
            &format!(
                "[chain]\nname = \"typo\"\n\n[[step]]\nid = \"search\"\nskill = \"find_notes\"\n\n\
                 [[step]]\nid = \"summarize\"\nskill = \"summarize_note\"\n{field} = \"serch\"\n"
            ),
        );
        let out = kavi(root, &["chain", "check", "typo"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(
            stderr.contains(&format!("`{field}` must name an earlier step"))
                && stderr.contains("chains/typo.toml:11:")
                && stderr.contains("did you mean `search`? earlier steps: 0 (`search`)"),
            "{stderr}"
        );
    }
}

#[test]
fn a_mapping_to_a_missing_key_fails_that_step_without_running_its_skill() {
    let dir = notes_workspace();
    let root = dir.path();
    forge(root, &["write_note"]);
    // The second step would write a note, if it ran.
    write(
        root,
        "chains/search_then_write.toml",
        r#"
[chain]
name = "search_then_write"

[[step]]
id = "search"
skill = "find_notes"
input = { query = "governed" }

[[step]]
id = "write"
skill = "write_note"
input = { body = "found" }
map = { title = "$.results[0].title" }
"#,
    );
    let out = chain(root, &["search_then_write", "--yes", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let steps: Value = serde_json::from_slice(&out.stdout).unwrap();
    let write = &steps[1];
    assert_eq!(write["status"], "failed");
    assert_eq!(
        write["record"]["error"],
        "mapping `title` from step `search` failed: `$.results[0].title` selects nothing; `write_note` was not run"
    );
    // Not reached: no hash was checked, no output, and no note was written.
    assert!(write["record"]["source_hash"].is_null());
    assert!(write["record"]["output"].is_null());
    let notes: Vec<_> = std::fs::read_dir(root.join("notes")).unwrap().collect();
    assert_eq!(notes.len(), 2, "the skill wrote a note");
}

#[test]
fn without_stop_on_failure_later_steps_run_and_those_mapping_from_a_failed_step_fail_cleanly() {
    let dir = notes_workspace();
    let root = dir.path();
    write(
        root,
        "chains/keep_going.toml",
        r#"
[chain]
name = "keep_going"
stop_on_failure = false

[[step]]
id = "broken"
skill = "summarize_note"
input = { path = "notes/missing.md" }

[[step]]
id = "after_broken"
skill = "summarize_note"
map = { path = "$.path" }

[[step]]
id = "independent"
skill = "find_notes"
input = { query = "kavi" }
parent = 0
"#,
    );
    let out = chain(root, &["keep_going", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let steps: Value = serde_json::from_slice(&out.stdout).unwrap();
    let statuses: Vec<&str> = steps
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["failed", "failed", "succeeded"]);
    // The skill itself failed on the missing file: it was reached, and its error is kept.
    let broken = &steps[0]["record"];
    assert!(broken["source_hash"].is_string());
    assert!(
        broken["error"]
            .as_str()
            .unwrap()
            .starts_with("exited with code 1 under the READ_ONLY profile: Traceback"),
        "{broken}"
    );
    assert_eq!(
        steps[1]["record"]["error"],
        "maps from step `broken`, which failed; `summarize_note` was not run"
    );
    // Branching: two records under the failed first step.
    let text = stdout(&kavi(root, &["session", "--latest"]));
    assert!(text.starts_with("✗ summarize_note "), "{text}");
    assert!(text.contains("\n├─ ✗ summarize_note "), "{text}");
    assert!(text.contains("\n└─ ✓ find_notes "), "{text}");

    // With the default stop_on_failure, the rest is not run and leaves no record.
    let stop = std::fs::read_to_string(root.join("chains/keep_going.toml"))
        .unwrap()
        .replace("stop_on_failure = false\n", "");
    write(
        root,
        "chains/stop.toml",
        &stop.replace("keep_going", "stop"),
    );
    let steps = chain(root, &["stop", "--json"]);
    let steps: Value = serde_json::from_slice(&steps.stdout).unwrap();
    assert_eq!(steps[1]["status"], "not_run");
    assert!(steps[1]["record"].is_null());
    assert_eq!(steps[2]["status"], "not_run");
}

#[test]
fn replay_reruns_with_the_same_input_and_refuses_after_one_changed_byte() {
    let dir = notes_workspace();
    let root = dir.path();
    let first = json(&kavi(
        root,
        &[
            "skill",
            "run",
            "summarize_note",
            "--input",
            r#"{"path": "notes/kavi.md"}"#,
        ],
    ));
    let id = first["execution_id"].as_str().unwrap();
    // A unique prefix names the execution, as with git.
    let again = json(&kavi(root, &["replay", &id[..8]]));
    assert_eq!(again["parent_execution_id"], id);
    assert_eq!(again["input"], first["input"]);
    assert_eq!(again["output"], first["output"]);
    assert_ne!(again["execution_id"], first["execution_id"]);

    // --no-log: the ledger keeps the new record, the JSONL log does not get it.
    let log = root.join(".kavi/executions.jsonl");
    let lines = || std::fs::read_to_string(&log).unwrap().lines().count();
    let before = lines();
    let quiet = json(&kavi(root, &["replay", id, "--no-log"]));
    assert_eq!(lines(), before);
    let tree = json(&kavi(root, &["session", "--execution-id", id, "--json"]));
    let replays: Vec<&Value> = tree[0]["children"].as_array().unwrap().iter().collect();
    assert_eq!(replays.len(), 2);
    assert_eq!(replays[1]["execution_id"], quiet["execution_id"]);

    let missing = kavi(root, &["replay", "00000000-no-such-id"]);
    assert_eq!(missing.status.code(), Some(5));

    let skill = root.join("skills/summarize_note/skill.py");
    let mut text = std::fs::read(&skill).unwrap();
    text.push(b' ');
    std::fs::write(&skill, text).unwrap();
    let refused = kavi(root, &["replay", id]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: replay of {id} refused: the hash check failed: refusing to run `summarize_note`: its files changed since it was trusted"
        )),
        "{stderr}"
    );
}

#[test]
fn the_jsonl_log_survives_a_malformed_line_and_tail_filters() {
    let dir = notes_workspace();
    let root = dir.path();
    let run = |input: &str| kavi(root, &["skill", "run", "find_notes", "--input", input]);
    assert!(run(r#"{"query": "kavi"}"#).status.success());
    // Someone's editor, or a crash mid-write, leaves a broken line in the middle.
    let log = root.join(".kavi/executions.jsonl");
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str("{\"execution_id\": \"torn\n");
    std::fs::write(&log, text).unwrap();
    assert_eq!(run(r#"{"query": ""}"#).status.code(), Some(1));
    assert!(run(r#"{"query": "other"}"#).status.success());

    let tail = kavi(root, &["executions", "tail", "--json"]);
    assert_eq!(
        String::from_utf8_lossy(&tail.stderr),
        "skipped 1 malformed line in .kavi/executions.jsonl\n"
    );
    let records = json(&tail);
    assert_eq!(records.as_array().unwrap().len(), 3);
    let failures = json(&kavi(
        root,
        &["executions", "tail", "--only-failures", "--json"],
    ));
    assert_eq!(failures.as_array().unwrap().len(), 1);
    assert!(
        failures[0]["error"]
            .as_str()
            .unwrap()
            .starts_with("the input does not match the input schema: at /query: ")
    );
    let last = json(&kavi(root, &["executions", "tail", "-n", "1", "--json"]));
    assert_eq!(last[0]["input"], json!({"query": "other"}));
    let none = json(&kavi(
        root,
        &["executions", "tail", "--skill", "word_count", "--json"],
    ));
    assert_eq!(none, json!([]));
}

#[test]
fn a_pipeline_runs_a_chain_as_one_node_and_side_effects_need_the_authors_confirmation() {
    let dir = notes_workspace();
    let root = dir.path();
    forge(root, &["write_note"]);
    write(
        root,
        "chains/write_note_chain.toml",
        "[chain]\nname = \"write_note_chain\"\n\n[params.title]\ntype = \"string\"\n\n[[step]]\nid = \"write\"\nskill = \"write_note\"\ninput = { title = \"{{ params.title }}\", body = \"from a pipeline\" }\n",
    );
    let pipeline = |confirm: &str| {
        format!(
            r#"
[pipeline]
name = "notes"

[nodes.write]
kind = "chain"
chain = "write_note_chain"
params = {{ title = "Pipeline note" }}
{confirm}

[nodes.summary]
kind = "chain"
needs = ["write"]
chain = "search_and_summarize"
params = {{ query = "from a pipeline" }}

[nodes.title]
kind = "exec"
needs = ["summary"]
run = ["echo", "{{{{ nodes.summary.outputs.steps.summarize.output.title }}}}"]
"#
        )
    };
    // A template that reads a step the chain does not have is refused before anything runs.
    write(
        root,
        "pipelines/typo.toml",
        &pipeline("").replace("steps.summarize", "steps.sumarize"),
    );
    let typo = kavi(root, &["pipeline", "check", "typo"]);
    assert_eq!(typo.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&typo.stderr);
    assert!(
        stderr.contains("`summary` has no `sumarize` in its `steps` (it has: search, summarize)")
            && stderr.contains("did you mean `summarize`?"),
        "{stderr}"
    );
    write(root, "pipelines/notes.toml", &pipeline(""));
    assert_eq!(
        kavi(root, &["pipeline", "run", "notes"]).status.code(),
        Some(1)
    );
    let run = json(&kavi(root, &["runs", "show", "--json"]));
    assert_eq!(
        common::node(&run, "write")["error"],
        "chain `write_note_chain` failed: step `write`: `write_note` is FILE_WRITE, which nobody confirmed; nothing was run"
    );
    assert!(!root.join("notes/pipeline-note.md").exists());

    write(
        root,
        "pipelines/notes.toml",
        &pipeline("confirm = [\"FILE_WRITE\"]"),
    );
    let out = kavi(root, &["pipeline", "run", "notes"]);
    assert!(out.status.success(), "{}", stdout(&out));
    let run = json(&kavi(root, &["runs", "show", "--json"]));
    assert_eq!(
        common::node(&run, "title")["outputs"]["stdout"],
        "Pipeline note\n"
    );
    // The chain's records name the pipeline run.
    let records = json(&kavi(root, &["executions", "tail", "-n", "1", "--json"]));
    assert_eq!(records[0]["run_id"], run["id"]);
    assert_eq!(records[0]["chain"], "search_and_summarize");
}

/// A Python environment with the official MCP SDK (see [`common::python_with`]).
pub(crate) fn mcp_client_python() -> Option<std::path::PathBuf> {
    common::python_with("mcp-client", "mcp>=2,<3", "mcp")
}

/// What the official MCP client saw of `kavi mcp` (see tests/mcp/client.py), answering any
/// elicitation with `elicit` when given.
pub(crate) fn mcp_session(python: &Path, root: &Path, extra: &[&str]) -> Value {
    mcp_session_answering(python, root, None, extra)
}

fn mcp_session_answering(
    python: &Path,
    root: &Path,
    elicit: Option<&str>,
    extra: &[&str],
) -> Value {
    let out = std::process::Command::new(python)
        .env("XDG_CONFIG_HOME", common::config_home())
        .env_remove("KAVI_KEYS")
        .arg(common::repo().join("tests/mcp/client.py"))
        .args(
            elicit
                .map(|answer| ["--elicit", answer])
                .into_iter()
                .flatten(),
        )
        .arg(env!("CARGO_BIN_EXE_kavi"))
        .arg(root)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A real MCP client (the official Python SDK) lists the trusted skills as tools and calls
/// them through `kavi mcp`: READ_ONLY runs, FILE_WRITE is refused unless policies/mcp.toml
/// pre-approves it for the client kavi was started for, or lets its user confirm it and the
/// user does (through elicitation), a drifted skill is no longer offered, and every call,
/// refused or not, is an execution record naming the client.
#[test]
fn an_mcp_client_calls_trusted_skills_under_the_same_governance() {
    let Some(python) = mcp_client_python() else {
        return;
    };
    let dir = shipped_workspace();
    let root = dir.path();
    // Written before the forge adopts the rules on first use: an edit after it would be a
    // weakening nobody adopted, which never governs.
    write(
        root,
        "policies/mcp.toml",
        "[clients.editor]\nallow = [\"FILE_WRITE\"]\n\n[clients.desk]\nconfirm = [\"FILE_WRITE\"]\n",
    );
    forge(root, &["word_count", "write_note"]);

    let session = mcp_session(&python, root, &[]);
    assert_eq!(session["server"], "kavi");
    let tools: Vec<&str> = session["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["word_count", "write_note"]);
    assert_eq!(session["tools"][0]["read_only"], true);
    assert_eq!(session["tools"][1]["read_only"], false);
    assert_eq!(session["tools"][0]["schema"]["required"], json!(["text"]));
    let calls = &session["calls"];
    assert_eq!(calls["word_count"]["is_error"], false);
    assert_eq!(calls["word_count"]["structured"]["output"]["words"], 3);
    assert_eq!(calls["write_note"]["is_error"], true);
    assert!(
        calls["write_note"]["text"][0]
            .as_str()
            .unwrap()
            .contains("only READ_ONLY skills run"),
        "{calls}"
    );
    assert!(
        !root.join("notes/from-mcp.md").exists(),
        "nothing was written"
    );
    assert_eq!(calls["bad_input"]["is_error"], true);
    assert!(
        calls["unknown"]["text"][0]
            .as_str()
            .unwrap()
            .contains("no skill")
    );

    // A client whose user must confirm: refused when it cannot ask, or when the user says no;
    // run when the user says yes to the question naming the skill, its class and its input.
    let cannot_ask = mcp_session(&python, root, &["--client", "desk"]);
    let text = |session: &Value| session["calls"]["write_note"]["text"][0].to_string();
    assert!(
        text(&cannot_ask).contains("did not declare the elicitation capability"),
        "{cannot_ask}"
    );
    let declined = mcp_session_answering(&python, root, Some("decline"), &["--client", "desk"]);
    assert_eq!(declined["calls"]["write_note"]["is_error"], true);
    assert!(text(&declined).contains("declined"), "{declined}");
    assert!(!root.join("notes/from-mcp.md").exists());
    // The READ_ONLY call asked nothing: only the FILE_WRITE one did.
    let questions = declined["questions"].as_array().unwrap();
    assert_eq!(questions.len(), 1, "{declined}");
    let question = questions[0]["message"].as_str().unwrap();
    assert!(
        question.contains("`write_note`")
            && question.contains("FILE_WRITE")
            && question.contains("written by an agent"),
        "{question}"
    );
    let confirmed = mcp_session_answering(&python, root, Some("accept"), &["--client", "desk"]);
    assert_eq!(
        confirmed["calls"]["write_note"]["is_error"], false,
        "{confirmed}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("notes/from-mcp.md")).unwrap(),
        "# from mcp\n\nwritten by an agent\n"
    );
    std::fs::remove_file(root.join("notes/from-mcp.md")).unwrap();

    // A client the policy names may write; one it does not name still may not, whatever it
    // calls itself.
    let refused = mcp_session(&python, root, &["--client", "other"]);
    assert_eq!(refused["calls"]["write_note"]["is_error"], true);
    let allowed = mcp_session(&python, root, &["--client", "editor"]);
    assert_eq!(
        allowed["calls"]["write_note"]["is_error"], false,
        "{allowed}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("notes/from-mcp.md")).unwrap(),
        "# from mcp\n\nwritten by an agent\n"
    );

    // Every call is an execution record, naming the client it came from.
    let tail = kavi(root, &["executions", "tail", "-n", "100", "--json"]);
    let records: Vec<Value> = serde_json::from_slice(&tail.stdout).unwrap();
    let by = |caller: &str, skill: &str| {
        records
            .iter()
            .filter(|r| r["caller"].as_str().is_some_and(|c| c.starts_with(caller)))
            .filter(|r| r["skill"] == skill)
            .map(|r| r["success"].as_bool().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(by("mcp:unnamed", "write_note"), [false]);
    assert_eq!(by("mcp:other", "write_note"), [false]);
    assert_eq!(by("mcp:editor", "write_note"), [true]);
    assert_eq!(by("mcp:editor", "word_count"), [true, false]);
    assert_eq!(by("mcp:desk", "write_note"), [false, false, true]);
    assert!(
        records.iter().any(|r| {
            let caller = r["caller"].as_str().unwrap_or_default();
            caller.starts_with("mcp:desk")
                && caller.ends_with(", confirmed by its user")
                && r["skill"] == "write_note"
                && r["success"] == true
        }),
        "the confirmed call does not say so"
    );

    // A skill whose files changed is not offered, and a call to it is refused.
    let script = root.join("skills/word_count/skill.py");
    let text = std::fs::read_to_string(&script).unwrap();
    std::fs::write(&script, format!("{text}\n# drifted\n")).unwrap();
    let drifted = mcp_session(&python, root, &[]);
    assert_eq!(drifted["tools"].as_array().unwrap().len(), 1, "{drifted}");
    assert_eq!(drifted["tools"][0]["name"], "write_note");
    assert_eq!(drifted["calls"]["word_count"]["is_error"], true);
    assert!(
        drifted["calls"]["word_count"]["text"][0]
            .as_str()
            .unwrap()
            .contains("its files changed since it was trusted"),
        "{drifted}"
    );

    // A skill edited while its user is being asked does not run: kavi checks it again after
    // the yes.
    std::fs::remove_file(root.join("notes/from-mcp.md")).unwrap();
    let script = root.join("skills/write_note/skill.py");
    let answer = format!("accept-after-editing={}", script.display());
    let edited = mcp_session_answering(&python, root, Some(&answer), &["--client", "desk"]);
    assert_eq!(edited["calls"]["write_note"]["is_error"], true, "{edited}");
    let refusal = edited["calls"]["write_note"]["text"][0].to_string();
    assert!(
        refusal.contains("its files changed since it was trusted")
            && refusal.contains("found after its user confirmed"),
        "{edited}"
    );
    assert!(
        !root.join("notes/from-mcp.md").exists(),
        "nothing was written"
    );
}

/// The SDK's default client (`mcp.Client`) negotiates 2026-07-28, where a server asks its
/// client's user through an `input_required` result instead of a request of its own: kavi asks
/// that way, and the FILE_WRITE call runs once the user says yes to the question naming it.
#[test]
fn the_mcp_sdks_default_client_confirms_a_file_write_on_the_current_protocol() {
    let Some(python) = mcp_client_python() else {
        return;
    };
    let dir = shipped_workspace();
    let root = dir.path();
    // Written before the forge adopts the rules on first use: an edit after it would be a
    // weakening nobody adopted, which never governs.
    write(
        root,
        "policies/mcp.toml",
        "[clients.desk]\nconfirm = [\"FILE_WRITE\"]\n",
    );
    forge(root, &["write_note"]);
    let out = std::process::Command::new(&python)
        .env("XDG_CONFIG_HOME", common::config_home())
        .env_remove("KAVI_KEYS")
        .arg(common::repo().join("tests/mcp/default_client.py"))
        .arg(env!("CARGO_BIN_EXE_kavi"))
        .arg(root)
        .args(["--client", "desk"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let session: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(session["protocol_version"], "2026-07-28", "{session}");
    assert_eq!(session["is_error"], false, "{session}");
    let questions = session["questions"].as_array().unwrap();
    assert_eq!(questions.len(), 1, "{session}");
    assert!(
        questions[0]
            .as_str()
            .unwrap()
            .contains("`write_note`, which is FILE_WRITE"),
        "{session}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("notes/from-mcp.md")).unwrap(),
        "# from mcp\n\nwritten by an agent\n"
    );
    let records = json(&kavi(root, &["executions", "tail", "-n", "5", "--json"]));
    let records = records.as_array().unwrap();
    assert_eq!(records.len(), 1, "asking recorded nothing of its own");
    assert!(
        records[0]["caller"]
            .as_str()
            .unwrap()
            .ends_with(", confirmed by its user"),
        "{records:?}"
    );
}

/// What tests/mcp/resources.py saw of `kavi mcp`'s resources on protocol generation `mode`
/// (`legacy`: 2025-11-25's handshake; `current`: the SDK's default client, 2026-07-28).
fn mcp_resources(python: &Path, root: &Path, mode: &str) -> Value {
    mcp_script(python, root, "resources.py", &[mode])
}

/// What a script of tests/mcp printed, run as `SCRIPT ARGS... KAVI WORKSPACE`.
fn mcp_script(python: &Path, root: &Path, script: &str, args: &[&str]) -> Value {
    let script = common::repo().join("tests/mcp").join(script);
    let mut all = vec![script.to_str().unwrap()];
    all.extend_from_slice(args);
    all.extend([env!("CARGO_BIN_EXE_kavi"), root.to_str().unwrap()]);
    let out = common::with_test_env(std::process::Command::new(python), root, &all)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The workspace's chains are MCP prompts for the official SDK's default client, listed in
/// pages of `resources_page` with their parameters as arguments, each rendered with the
/// arguments given into the calls it makes; a missing argument or an unknown prompt is invalid
/// params. A note that links out of the workspace (to /etc/passwd) is refused, named, with a
/// record, over MCP and in the chat alike, and what the skill read there is not handed back.
#[test]
fn chains_are_mcp_prompts_and_a_note_linked_out_of_the_workspace_is_refused() {
    let Some(python) = mcp_client_python() else {
        return;
    };
    // The MCP policy is written before the forge adopts the rules: one nobody adopted does not
    // govern.
    let dir = shipped_workspace();
    let root = dir.path();
    write(root, "policies/mcp.toml", "resources_page = 1\n");
    forge(root, &["find_notes", "summarize_note"]);
    write(
        root,
        "notes/kavi.md",
        "# About kavi\n\nKavi runs governed pipelines.\n",
    );
    write(root, "notes/other.md", "# Other\n\nNothing to see.\n");
    write(
        root,
        "chains/count.toml",
        "[chain]\nname = \"count_it\"\ndescription = \"Count a text's words\"\n\n\
         [params.text]\ntype = \"string\"\n\n[[step]]\nid = \"count\"\nskill = \"word_count\"\n\
         input = { text = \"{{ params.text }}\" }\n",
    );
    std::os::unix::fs::symlink("/etc/passwd", root.join("notes/link.md")).unwrap();

    let seen = mcp_script(&python, root, "prompts.py", &[]);
    assert_eq!(seen["prompts_capability"], true, "{seen}");
    let pages = seen["pages"].as_array().unwrap();
    let names: Vec<&str> = pages
        .iter()
        .flat_map(|page| page["prompts"].as_array().unwrap())
        .map(|prompt| prompt["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["count_it", "search_and_summarize"], "{seen}");
    assert_eq!(pages.len(), 2, "one prompt a page: {seen}");
    assert_eq!(
        pages[0]["prompts"][0]["arguments"],
        json!([{ "name": "text", "required": true }])
    );
    let text = seen["got"]["messages"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("1. call `find_notes` with {\"query\":\"governed\",\"folder\":\"notes\"}"),
        "{text}"
    );
    assert!(text.contains("2. call `summarize_note`"), "{text}");
    for (key, says) in [
        ("missing_argument", "missing required parameter `text`"),
        ("unknown", "no prompt `no_such_chain`"),
    ] {
        assert_eq!(seen[key]["code"], -32602, "{seen}");
        assert!(
            seen[key]["message"].as_str().unwrap().contains(says),
            "{seen}"
        );
    }
    let refusal = "`notes/link.md` is a link that leads outside the workspace (to /etc/passwd)";
    assert_eq!(seen["link"]["is_error"], true, "{seen}");
    let said = seen["link"]["text"].to_string();
    assert!(
        said.contains(refusal) && !said.contains("root:x:0"),
        "{said}"
    );

    for message in ["find root", "summarize notes/link.md"] {
        let (code, answer) = chat_once(root, &[message]);
        assert_eq!(code, Some(1), "{answer}");
        assert_eq!(answer["status"], "failed", "{answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(refusal),
            "{answer}"
        );
        assert!(answer["records"][0]["output"].is_null(), "{answer}");
    }
    // Each refusal is a record, naming who asked.
    let records = json(&kavi(root, &["executions", "tail", "-n", "100", "--json"]));
    let refused: Vec<&str> = records
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["error"].as_str().is_some_and(|e| e.contains(refusal)))
        .map(|r| r["caller"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(refused.len(), 3, "{records}");
    assert!(refused[0].starts_with("mcp:"), "{refused:?}");
    assert_eq!(refused[1..], ["chat", "chat"]);
}

/// Execution records and runs are MCP resources, for the official SDK's clients of both
/// protocol generations: listed newest first in pages of `resources_page` (policies/mcp.toml)
/// by cursor, read by id, by a prefix of it or by run, the two summaries subscribable; a
/// `kavi skill run` in another process is told to the subscribed client as a new resource and
/// an update of `kavi://executions` (`resources/subscribe` up to 2025-11-25,
/// `subscriptions/listen` from 2026-07-28).
#[test]
fn mcp_clients_page_read_and_subscribe_to_execution_records_and_runs() {
    let Some(python) = mcp_client_python() else {
        return;
    };
    let dir = shipped_workspace();
    let root = dir.path();
    // Written before the forge adopts the rules on first use: an edit after it would be a
    // weakening nobody adopted, which never governs.
    write(root, "policies/mcp.toml", "resources_page = 2\n");
    forge(root, &["word_count"]);
    for text in ["one", "one two", "one two three"] {
        let input = json!({ "text": text }).to_string();
        let ran = kavi(root, &["skill", "run", "word_count", "--input", &input]);
        assert!(ran.status.success(), "{}", stdout(&ran));
    }
    let runs: Vec<String> = common::LedgerConnection::open(root)
        .texts("SELECT CAST(id AS TEXT) FROM runs ORDER BY id DESC")
        .iter()
        .map(|id| format!("kavi://runs/{id}"))
        .collect();
    assert!(!runs.is_empty(), "forging recorded its runs");

    for mode in ["legacy", "current"] {
        let seen = mcp_resources(&python, root, mode);
        let records = json(&kavi(root, &["executions", "tail", "-n", "100", "--json"]));
        // Newest first: the log's order reversed.
        let mut newest_first: Vec<String> = records
            .as_array()
            .unwrap()
            .iter()
            .map(|r| format!("kavi://executions/{}", r["execution_id"].as_str().unwrap()))
            .collect();
        newest_first.reverse();
        // The record the client's own `kavi skill run` added is the newest; the rest were listed.
        let added = newest_first.remove(0);
        let pages = seen["pages"].as_array().unwrap();
        let listed: Vec<String> = pages
            .iter()
            .flat_map(|page| page["uris"].as_array().unwrap().iter())
            .map(|uri| uri.as_str().unwrap().to_owned())
            .collect();
        let mut expected = vec!["kavi://executions".to_owned(), "kavi://runs".to_owned()];
        expected.extend(newest_first.iter().cloned());
        expected.extend(runs.iter().cloned());
        assert_eq!(listed, expected, "{mode}: {seen}");
        assert!(pages.len() > 2, "{mode}: paged: {seen}");
        for page in &pages[1..] {
            assert!(
                page["uris"].as_array().unwrap().len() <= 2,
                "{mode}: {seen}"
            );
        }
        assert_eq!(
            seen["templates"],
            json!(["kavi://executions/{execution_id}", "kavi://runs/{run_id}"])
        );
        let newest = &newest_first[0];
        assert_eq!(
            format!(
                "kavi://executions/{}",
                seen["record"]["execution_id"].as_str().unwrap()
            ),
            *newest
        );
        assert_eq!(seen["record"]["output"]["words"], 3, "{mode}: {seen}");
        assert_eq!(seen["by_prefix"], seen["record"], "{mode}");
        assert_eq!(seen["summary"][0]["uri"], newest.as_str(), "{mode}");
        assert_eq!(
            format!("kavi://runs/{}", seen["run"]["id"]),
            runs[0],
            "{mode}: {seen}"
        );
        assert!(seen["run"]["nodes"].as_array().is_some(), "{mode}: {seen}");
        assert!(
            seen["missing"]["message"]
                .as_str()
                .unwrap()
                .contains("no execution `ffffffff` in the ledger"),
            "{mode}: {seen}"
        );
        // What the other process ran is told, and listed first.
        assert_eq!(seen["after"][2], added.as_str(), "{mode}: {seen}");
        match mode {
            "legacy" => {
                assert_eq!(seen["protocol_version"], "2025-11-25", "{seen}");
                assert_eq!(
                    seen["capabilities"],
                    json!({"subscribe": true, "listChanged": true})
                );
                let notified = seen["notified"].as_array().unwrap();
                for expected in [
                    json!({"method": "notifications/resources/updated", "uri": "kavi://executions"}),
                    json!({"method": "notifications/resources/list_changed", "uri": null}),
                ] {
                    assert!(notified.contains(&expected), "{seen}");
                }
            }
            _ => {
                assert_eq!(seen["protocol_version"], "2026-07-28", "{seen}");
                assert_eq!(
                    seen["honored"]["resourceSubscriptions"],
                    json!(["kavi://executions"]),
                    "{seen}"
                );
                let events = seen["events"].as_array().unwrap();
                for expected in ["ResourcesListChanged", "ResourceUpdated kavi://executions"] {
                    assert!(events.contains(&json!(expected)), "{seen}");
                }
            }
        }
    }
}

/// `kavi mcp` spoken to line by line, as JSON-RPC over stdio is.
struct RawMcp {
    child: std::process::Child,
    /// Its lines, read by a thread of their own, so that an answer that never comes fails the
    /// test instead of hanging it.
    lines: std::sync::mpsc::Receiver<String>,
}

impl RawMcp {
    /// A server past its handshake (the older one, where no capability is needed here).
    fn start(root: &Path, args: &[&str]) -> Self {
        let mut all = vec!["mcp"];
        all.extend_from_slice(args);
        let mut child = common::kavi_command(root, &all)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut mcp = Self { child, lines };
        mcp.send(
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
        );
        assert_eq!(mcp.next()["id"], 0);
        mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn send_bytes(&mut self, line: &[u8]) {
        let stdin = self.child.stdin.as_mut().unwrap();
        std::io::Write::write_all(stdin, line).unwrap();
        std::io::Write::write_all(stdin, b"\n").unwrap();
        std::io::Write::flush(stdin).unwrap();
    }

    fn send(&mut self, message: &Value) {
        self.send_bytes(message.to_string().as_bytes());
    }

    /// The next message the server wrote.
    fn next(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the server answered within 30 s");
        serde_json::from_str(&line).unwrap()
    }
}

impl Drop for RawMcp {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Lines that are no message get the error JSON-RPC 2.0 names, with `"id": null` when the id
/// cannot be known, and the session goes on: bad JSON, binary and invalid UTF-8 are parse errors
/// (-32700); bad `tools/call` params are invalid params (-32602), an unknown method -32601; a
/// line over `max_request_bytes` of policies/mcp.toml is refused unread, and a tool name that
/// is no skill name reaches the ledger shortened.
#[test]
fn mcp_answers_malformed_lines_as_json_rpc_says() {
    let dir = shipped_workspace();
    let root = dir.path();
    write(root, "policies/mcp.toml", "max_request_bytes = 4096\n");
    let mut mcp = RawMcp::start(root, &[]);
    let error = |answer: &Value| (answer["id"].clone(), answer["error"]["code"].clone());
    for line in [&b"{not json"[..], b"\x00\x01\x02", b"\xff\xfe{}"] {
        mcp.send_bytes(line);
        let answer = mcp.next();
        assert_eq!(error(&answer), (Value::Null, json!(-32700)), "{answer}");
        assert!(answer.as_object().unwrap().contains_key("id"), "{answer}");
    }
    mcp.send(&json!({"jsonrpc": "2.0", "id": 5}));
    assert_eq!(error(&mcp.next()), (json!(5), json!(-32600)));
    mcp.send(&json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": 5}}));
    let answer = mcp.next();
    assert_eq!(error(&answer), (json!(6), json!(-32602)), "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid params for `tools/call`"),
        "{answer}"
    );
    mcp.send(&json!({"jsonrpc": "2.0", "id": 7, "method": "no/such/method"}));
    assert_eq!(error(&mcp.next()), (json!(7), json!(-32601)));
    let big = "a ".repeat(3000);
    mcp.send(&json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
        "params": {"name": "word_count", "arguments": {"text": big}}}));
    let answer = mcp.next();
    assert_eq!(error(&answer), (Value::Null, json!(-32600)), "{answer}");
    assert!(
        answer["error"]["message"].as_str().unwrap().contains(
            "over the 4096 bytes a message may have (`max_request_bytes` in policies/mcp.toml)"
        ),
        "{answer}"
    );
    let long_name = "x".repeat(3000);
    mcp.send(&json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": long_name, "arguments": {}}}));
    let answer = mcp.next();
    assert_eq!(answer["id"], 9);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    mcp.send(&json!({"jsonrpc": "2.0", "id": 10, "method": "ping"}));
    assert_eq!(mcp.next()["id"], 10, "the session went on");
    drop(mcp);
    let records = json(&kavi(root, &["executions", "tail", "-n", "5", "--json"]));
    let records = records.as_array().unwrap();
    assert_eq!(
        records.len(),
        1,
        "only the call that was read is recorded: {records:?}"
    );
    let skill = records[0]["skill"].as_str().unwrap();
    assert!(
        skill.len() < 100 && skill.ends_with("(3000 bytes)"),
        "{skill}"
    );
}

/// `notifications/cancelled` stops the call's skill and its process tree: a FILE_WRITE stuck
/// writing its note (a FIFO nobody reads) is killed, writes nothing, and is recorded as
/// cancelled; the cancelled request gets no answer and the session goes on.
#[test]
fn a_cancelled_mcp_call_stops_its_skill_and_writes_nothing() {
    let dir = shipped_workspace();
    let root = dir.path();
    // Written before the forge adopts the rules on first use: an edit after it would be a
    // weakening nobody adopted, which never governs.
    write(
        root,
        "policies/mcp.toml",
        "[clients.desk]\nallow = [\"FILE_WRITE\"]\n",
    );
    forge(root, &["write_note"]);
    let note = root.join("notes/from-mcp.md");
    std::fs::create_dir_all(note.parent().unwrap()).unwrap();
    nix::unistd::mkfifo(&note, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let mut mcp = RawMcp::start(root, &["--client", "desk"]);
    mcp.send(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "write_note", "arguments": {"title": "from mcp", "body": "never written"}}}),
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    mcp.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 2, "reason": "the person stopped it"}}),
    );
    let started = std::time::Instant::now();
    let record = loop {
        let records = json(&kavi(root, &["executions", "tail", "-n", "1", "--json"]));
        if let Some(record) = records.as_array().unwrap().first() {
            break record.clone();
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the cancelled call was not recorded"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(record["skill"], "write_note");
    assert_eq!(record["success"], false);
    assert_eq!(record["error"], "cancelled", "{record}");
    mcp.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}));
    assert_eq!(mcp.next()["id"], 3, "the cancelled call is not answered");
    drop(mcp);
    let kind = std::fs::symlink_metadata(&note).unwrap().file_type();
    assert!(
        std::os::unix::fs::FileTypeExt::is_fifo(&kind),
        "the note was written"
    );
}

/// A plan waiting for a yes is never dropped in silence: a yes after `confirm_within` is refused
/// as expired, any other reply says the plan was put aside, and nothing is written either way.
/// A message asking for two things runs neither.
#[test]
fn the_chat_says_what_became_of_a_plan_and_runs_no_part_of_a_message() {
    let dir = shipped_workspace();
    let root = dir.path();
    // The chat's policy is written before the forge adopts the rules.
    let policy = std::fs::read_to_string(root.join("policies/chat.toml")).unwrap();
    write(
        root,
        "policies/chat.toml",
        &policy.replace("confirm_within = \"5m\"", "confirm_within = \"1s\""),
    );
    forge(root, &["write_note"]);
    let mut child = common::kavi_command(root, &["chat", "--json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut say = |line: &str| {
        std::io::Write::write_all(&mut stdin, format!("{line}\n").as_bytes()).unwrap();
        std::io::Write::flush(&mut stdin).unwrap();
    };
    say("write a note titled Late saying too late");
    std::thread::sleep(std::time::Duration::from_secs(3));
    say("yes");
    say("write a note Dropped: by another message");
    say("sure");
    say("find governed and write a note Both: at once");
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let answers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(answers.len(), 5, "{answers:?}");
    assert_eq!(
        answers[0]["plan"]["input"]["title"],
        "Late",
        "{answers:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(answers[1]["status"], "expired", "{}", answers[1]);
    assert!(
        answers[1]["error"]
            .as_str()
            .unwrap()
            .starts_with("it waited more than 1s for a yes"),
        "{}",
        answers[1]
    );
    assert_eq!(answers[3]["status"], "unsupported");
    assert_eq!(answers[3]["put_aside"]["plan"]["input"]["title"], "Dropped");
    assert!(
        answers[3]["put_aside"]["why"]
            .as_str()
            .unwrap()
            .contains("nothing was run"),
        "{}",
        answers[3]
    );
    assert_eq!(answers[4]["status"], "needs_clarification");
    assert_eq!(
        answers[4]["candidates"],
        json!(["find governed", "write a note Both: at once"])
    );
    let notes: Vec<_> = std::fs::read_dir(root.join("notes"))
        .map(|dir| dir.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(notes.is_empty(), "written: {notes:?}");
    let records = json(&kavi(root, &["executions", "tail", "--json"]));
    assert_eq!(records, json!([]), "nothing ran");
}

/// On a terminal (driven through a pseudo-terminal by tests/chat/terminal.py), Ctrl-C at the
/// prompt clears the line and runs nothing; Ctrl-C during a run (a note written into a FIFO
/// nobody reads: a READ_ONLY skill's view holds no FIFO, only the files git would track)
/// cancels that run only, and the session goes on; Ctrl-D ends the chat with 0.
#[test]
fn the_chat_on_a_terminal_cancels_only_what_ctrl_c_interrupts() {
    let dir = notes_workspace();
    let root = dir.path();
    forge(root, &["word_count", "write_note"]);
    nix::unistd::mkfifo(&root.join("notes/block.md"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let script = common::repo().join("tests/chat/terminal.py");
    let out = common::with_test_env(
        std::process::Command::new("python3"),
        root,
        &[
            script.to_str().unwrap(),
            env!("CARGO_BIN_EXE_kavi"),
            root.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let session: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(session["exit"], 0, "{}", session["transcript"]);
    let records = json(&kavi(root, &["executions", "tail", "-n", "10", "--json"]));
    let ran: Vec<(&str, &str)> = records
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["skill"].as_str().unwrap(),
                r["error"].as_str().unwrap_or("ok"),
            )
        })
        .collect();
    assert_eq!(
        ran,
        [
            ("word_count", "ok"),
            ("write_note", "cancelled"),
            ("word_count", "ok")
        ],
        "{}",
        session["transcript"]
    );
}

/// `exec:<id>` names an execution of any session by its id or a prefix of it: a prefix that
/// names one resolves to that record's result; one that names several, or none, is asked back
/// about with the candidates, and nothing runs.
#[test]
fn the_chat_resolves_an_execution_named_by_its_id_or_asks_which() {
    let dir = notes_workspace();
    let root = dir.path();
    // Seventeen records: two of them share at least the first character of their ids.
    let messages: String = (0..17)
        .map(|i| format!("summarize notes/{}.md\n", ["kavi", "other"][i % 2]))
        .collect();
    let answers = chat_session(root, &messages);
    let other = answers[1]["records"][0]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ledger = common::LedgerConnection::open(root);
    let ids = ledger.texts("SELECT id FROM executions ORDER BY id");
    let shared = ids
        .iter()
        .map(|id| &id[..1])
        .find(|first| ids.iter().filter(|id| id.starts_with(first)).count() > 1)
        .unwrap()
        .to_owned();
    let sharing: Vec<String> = ids
        .iter()
        .filter(|id| id.starts_with(&shared))
        .take(10)
        .map(|id| format!("summarize exec:{id}"))
        .collect();
    let count = |ledger: &mut common::LedgerConnection| {
        ledger.texts("SELECT CAST(count(*) AS TEXT) FROM executions")[0].clone()
    };
    let before = count(&mut ledger);

    let (code, several) = chat_once(root, &[&format!("summarize exec:{shared}")]);
    assert_eq!(code, Some(2), "{several}");
    assert_eq!(several["status"], "needs_clarification", "{several}");
    assert_eq!(several["candidates"], json!(sharing));
    let (_, none) = chat_once(root, &["summarize exec:0000ffff"]);
    assert_eq!(none["status"], "needs_clarification", "{none}");
    assert!(
        none["question"]
            .as_str()
            .unwrap()
            .contains("no execution in the ledger has an id starting with `0000ffff`"),
        "{none}"
    );
    assert_eq!(count(&mut ledger), before, "nothing ran");

    let (code, one) = chat_once(
        root,
        &[&format!("summarize exec:{}", other[..8].to_uppercase())],
    );
    assert_eq!(code, Some(0), "{one}");
    assert_eq!(one["plan"]["input"]["path"], "notes/other.md", "{one}");
    assert_eq!(one["records"][0]["output"]["title"], "Other");
}

/// Answers of `kavi chat -m`, as JSON, with the exit code.
fn chat_once(root: &Path, args: &[&str]) -> (Option<i32>, Value) {
    let mut all = vec!["chat", "--json", "-m"];
    all.extend_from_slice(args);
    let out = kavi(root, &all);
    let answer = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), answer)
}

/// The chat's session: each line of `input` a message, one JSON answer per line back.
fn chat_session(root: &Path, input: &str) -> Vec<Value> {
    let mut child = common::kavi_command(root, &["chat", "--json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(&out)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The chat: a message runs the skill its intent names and says what it parsed, planned and
/// ran; a side effect waits for confirmation and a yes runs the stashed plan, not a re-parse;
/// "that" is the session's last result; the policy's `allow` is a hard limit; what it does not
/// understand it says, with what it does.
#[test]
fn the_chat_runs_one_trusted_skill_per_message_and_asks_before_side_effects() {
    let dir = notes_workspace();
    let root = dir.path();
    forge(root, &["write_note"]);

    let (code, answer) = chat_once(root, &["summarize notes/kavi.md"]);
    assert_eq!(code, Some(0), "{answer}");
    assert_eq!(answer["status"], "executed");
    assert_eq!(answer["intent"]["name"], "summarize");
    assert_eq!(answer["intent"]["parser"], "deterministic");
    assert_eq!(answer["plan"]["name"], "summarize_note");
    assert_eq!(answer["records"][0]["output"]["title"], "About kavi");
    assert_eq!(answer["records"][0]["caller"], "chat");

    let (code, answer) = chat_once(root, &["write a note Plans: ship it"]);
    assert_eq!(code, Some(2));
    assert_eq!(answer["status"], "needs_confirmation");
    assert_eq!(answer["plan"]["side_effect"], "FILE_WRITE");
    assert!(answer["records"].as_array().unwrap().is_empty());
    assert!(!root.join("notes/plans.md").exists(), "nothing ran");
    let (code, answer) = chat_once(root, &["write a note Plans: ship it", "--confirmed"]);
    assert_eq!(code, Some(0), "{answer}");
    assert_eq!(answer["records"][0]["output"]["path"], "notes/plans.md");

    let (code, answer) = chat_once(root, &["dance for me"]);
    assert_eq!(code, Some(2));
    assert_eq!(answer["status"], "unsupported");
    assert!(
        answer["supported"]
            .as_array()
            .unwrap()
            .contains(&json!("summarize <note.md>"))
    );
    let (code, answer) = chat_once(root, &["summarize that"]);
    assert_eq!(code, Some(2));
    assert_eq!(answer["status"], "needs_clarification");
    assert!(
        answer["question"]
            .as_str()
            .unwrap()
            .starts_with("nothing earlier in this session is a path"),
        "{answer}"
    );

    // A session: "that" is what the search found; a yes runs the plan that was shown.
    let answers = chat_session(
        root,
        "find governed\nsummarize that\nwrite a note Later: from the session\nyes\n\
         write a note Never: declined\nno\nsearch and summarize nothing to see\nexit\n",
    );
    assert_eq!(answers.len(), 7, "{answers:?}");
    assert_eq!(
        answers[0]["records"][0]["output"]["results"][0]["path"],
        "notes/kavi.md"
    );
    assert_eq!(answers[1]["intent"]["name"], "summarize_that");
    assert_eq!(answers[1]["plan"]["input"]["path"], "notes/kavi.md");
    assert_eq!(answers[1]["status"], "executed");
    assert_eq!(answers[2]["status"], "needs_confirmation");
    assert_eq!(answers[3]["status"], "executed");
    assert!(answers[3]["intent"].is_null(), "a yes is not parsed again");
    assert_eq!(answers[3]["plan"], answers[2]["plan"]);
    assert!(root.join("notes/later.md").is_file());
    assert_eq!(answers[5]["status"], "declined");
    assert!(!root.join("notes/never.md").exists());
    // A chain intent: both steps' records, in one answer.
    assert_eq!(answers[6]["plan"]["kind"], "chain");
    let skills: Vec<&str> = answers[6]["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["skill"].as_str().unwrap())
        .collect();
    assert_eq!(skills, ["find_notes", "summarize_note"]);
    assert_eq!(answers[6]["records"][1]["output"]["path"], "notes/other.md");

    // What the policy does not allow is refused, confirmed or not (in a workspace whose rules
    // said so when they were adopted).
    let tight = shipped_workspace();
    let root = tight.path();
    let policy = std::fs::read_to_string(root.join("policies/chat.toml")).unwrap();
    write(
        root,
        "policies/chat.toml",
        &policy.replace(
            "allow = [\"READ_ONLY\", \"FILE_WRITE\"]",
            "allow = [\"READ_ONLY\"]",
        ),
    );
    forge(root, &["write_note"]);
    let (code, answer) = chat_once(root, &["write a note Blocked: no", "--confirmed"]);
    assert_eq!(code, Some(2));
    assert_eq!(answer["status"], "refused");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .starts_with("the chat may not run FILE_WRITE skills"),
        "{answer}"
    );
    assert!(!root.join("notes/blocked.md").exists());
}

/// With a gateway configured, the chat asks it first. No real gateway can exist here: a
/// stand-in speaks the chat-completions wire format on a loopback port. What it picks must be a
/// declared intent with that intent's groups; anything else (nonsense, an intent that does not
/// exist, a gateway that is not there) leaves the decision to the patterns, and the answer says
/// why.
#[test]
fn the_chat_asks_the_gateway_first_and_falls_back_to_its_patterns() {
    use common::stand_in::StandIn;
    let dir = notes_workspace();
    let root = dir.path();
    let answer_for = |message: &str| -> String {
        if message.contains("gist of the kavi note") {
            "```json\n{\"intent\": \"summarize\", \"groups\": {\"path\": \"notes/kavi.md\"}}\n```"
                .into()
        } else if message.contains("wipe") {
            "{\"intent\": \"delete_everything\", \"groups\": {}}".into()
        } else if message.contains("and summarize it") {
            "{\"intent\": \"search\", \"groups\": {\"query\": \"governed\"}}".into()
        } else if message.contains("hello there") {
            "{\"intent\": \"summarize\", \"groups\": {\"path\": \"notes/other.md\"}}".into()
        } else {
            "I think you want to summarize something!".into()
        }
    };
    let gateway = StandIn::start(move |received| {
        let prompt = received.prompt();
        let message = &prompt[prompt.find("Message:").unwrap()..];
        let content = answer_for(message);
        (
            200,
            json!({ "choices": [{ "index": 0, "message": { "role": "assistant", "content": content } }] }),
        )
    });
    let key = "sk-chat-standin-0123456789";
    let ask = |base: &str, message: &str| -> Value {
        let out = common::kavi_command(root, &["chat", "--json", "-m", message])
            .env("KAVI_GATEWAY_BASE_URL", base)
            .env("KAVI_GATEWAY_MODEL", "stand-in-model")
            .env("KAVI_GATEWAY_TIMEOUT", "5s")
            .env("KAVI_GATEWAY_API_KEY", key)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)))
    };
    let base = format!("{}/v1", gateway.origin);

    let understood = ask(&base, "could you give me the gist of the kavi note");
    assert_eq!(understood["status"], "executed", "{understood}");
    assert_eq!(understood["intent"]["parser"], "llm");
    assert_eq!(understood["plan"]["input"]["path"], "notes/kavi.md");
    // The message names the note by its file name: that grounds the model's path.
    assert_eq!(
        understood["intent"]["grounding"]["path"], "path",
        "{understood}"
    );
    let request = &gateway.received()[0];
    assert_eq!(request.request_line, "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );
    assert_eq!(request.body["model"], "stand-in-model");
    assert!(
        request.prompt().contains("\"summarize_that\""),
        "the intents are listed"
    );

    let nonsense = ask(&base, "summarize notes/other.md");
    assert_eq!(nonsense["intent"]["parser"], "deterministic");
    assert_eq!(nonsense["status"], "executed");
    assert!(
        nonsense["llm_error"]
            .as_str()
            .unwrap()
            .contains("not the JSON asked for"),
        "{nonsense}"
    );
    let invented = ask(&base, "wipe my notes");
    assert_eq!(invented["status"], "unsupported");
    assert!(
        invented["llm_error"]
            .as_str()
            .unwrap()
            .contains("`delete_everything`, which is not a declared intent"),
        "{invented}"
    );
    // A value the message does not justify is not taken: the patterns decide, and nothing runs.
    let ungrounded = ask(&base, "hello there");
    assert_eq!(ungrounded["status"], "unsupported", "{ungrounded}");
    assert!(ungrounded["records"].as_array().unwrap().is_empty());
    assert!(
        ungrounded["llm_error"]
            .as_str()
            .unwrap()
            .contains("gave `path` the value \"notes/other.md\", which neither the message nor"),
        "{ungrounded}"
    );
    // A message asking for two things runs neither, whatever one part the model would pick.
    let two = ask(&base, "find governed and summarize it");
    assert_eq!(two["status"], "needs_clarification", "{two}");
    assert!(two["records"].as_array().unwrap().is_empty());
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v1", listener.local_addr().unwrap())
    };
    let unreachable = ask(&closed, "summarize notes/kavi.md");
    assert_eq!(unreachable["status"], "executed");
    assert!(
        unreachable["llm_error"]
            .as_str()
            .unwrap()
            .contains("unreachable")
    );
    common::assert_nowhere_under(root, key);
}

/// An MCP client's grant added to policies/mcp.toml after the rules were adopted, by whoever can
/// edit the workspace (an agent too), is a weakening nobody reviewed: it grants nothing.
#[test]
fn an_mcp_grant_nobody_adopted_grants_nothing() {
    let Some(python) = mcp_client_python() else {
        return;
    };
    let dir = shipped_workspace();
    let root = dir.path();
    forge(root, &["write_note"]);
    write(
        root,
        "policies/mcp.toml",
        "[clients.agent]\nallow = [\"FILE_WRITE\"]\n",
    );
    let session = mcp_session(&python, root, &["--client", "agent"]);
    assert_eq!(
        session["calls"]["write_note"]["is_error"], true,
        "{session}"
    );
    assert!(
        session["calls"]["write_note"]["text"][0]
            .as_str()
            .unwrap()
            .contains("FILE_WRITE"),
        "{session}"
    );
    assert!(
        !root.join("notes/from-mcp.md").exists(),
        "nothing was written"
    );
}
