//! The shipped gate set with its real tools: ruff, mypy --strict and pytest from the pinned
//! toolchain (provisioned once, under target/), kavi's scanner and invariants, and every result
//! a verification row.

use crate::common;

use common::{copy_policies, kavi, last_run, verification};

use serde_json::Value;

/// Runs the gate set over the demo skill; returns the exit code.
fn run_verify(dir: &std::path::Path) -> Option<i32> {
    kavi(dir, &["pipeline", "run", "verify"]).status.code()
}

fn statuses(run: &Value) -> Vec<(String, String)> {
    run["verifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["gate"].as_str().unwrap().to_owned(),
                v["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

const SKILL: &str = "import json\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: Any) -> dict[str, Any]:\n    return {'echo': json.loads(json.dumps(data))}\n";
const TEST: &str = "import unittest\n\nfrom skill import run\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {'echo': 1})\n";

/// The shipped gate set wants an example at least: this program echoes as `run` does.
const PROPOSAL: &str = "name = \"demo\"\ndescription = \"Echo\"\nside_effect = \"READ_ONLY\"\n\
command = [\"python3\", \"skills/demo/echo.py\"]\n\
input_schema = {}\noutput_schema = {}\n\n[[examples]]\ninput = 1\noutput = { echo = 1 }\n";

/// A proposal that runs `skill.py` as a program, with one example.
const RUNS_SKILL: &str = "name = \"demo\"\ndescription = \"Echo\"\nside_effect = \"READ_ONLY\"\n\
command = [\"python3\", \"skills/demo/skill.py\"]\ninput_schema = {}\noutput_schema = {}\n\n\
[[examples]]\ninput = 1\noutput = 1\n";

/// The sound skill, which as a program does `main` (Python statements, indented by four).
fn skill_whose_program(main: &str) -> String {
    format!("{SKILL}\n\nif __name__ == \"__main__\":\n{main}")
}

fn workspace(skill: &str, test: &str) -> tempfile::TempDir {
    workspace_proposing(skill, test, PROPOSAL)
}

/// A workspace whose skill `demo` is proposed by `proposal`.
fn workspace_proposing(skill: &str, test: &str, proposal: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for folder in ["pipelines", "policies", "skills/demo"] {
        std::fs::create_dir_all(root.join(folder)).unwrap();
    }
    copy_policies(
        root,
        &[
            "gates.toml",
            "classifier.toml",
            "scanner.toml",
            "trust.toml",
            "conventions.toml",
            "invariants.toml",
            "confinement.toml",
            "lifecycle.toml",
        ],
    );
    common::copy_gate_tools(root);
    // What PROPOSAL runs: a program of the skill's folder (a command runs nothing else).
    std::fs::write(
        root.join("skills/demo/echo.py"),
        "import json\nimport sys\n\njson.dump({\"echo\": json.load(sys.stdin)}, sys.stdout)\n",
    )
    .unwrap();
    std::fs::write(root.join("skills/demo/skill.py"), skill).unwrap();
    std::fs::write(root.join("skills/demo/test_skill.py"), test).unwrap();
    std::fs::write(
        root.join("pipelines/verify.toml"),
        "[pipeline]\nname = \"verify\"\n\n[nodes.verify]\nkind = \"gate\"\nskill = \"demo\"\nvars = { skill = \"demo\" }\n",
    )
    .unwrap();
    // The invariants compare the skill with its proposal, so it is proposed first.
    std::fs::write(root.join("demo.toml"), proposal).unwrap();
    assert!(
        kavi(root, &["skill", "propose", "demo.toml"])
            .status
            .success()
    );
    dir
}

#[test]
fn a_sound_skill_passes_every_gate_and_each_result_is_recorded() {
    let dir = workspace(SKILL, TEST);
    // Regression: the gates' temporary folder goes in the sandbox folder, which a run with no
    // sandbox node before it has not made yet.
    let fresh = tempfile::tempdir().unwrap();
    let out = common::kavi_command(dir.path(), &["pipeline", "run", "verify"])
        .env("KAVI_SANDBOXES", fresh.path().join("not-made-yet"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let run = last_run(dir.path());
    assert_eq!(
        statuses(&run),
        [
            "secrets",
            "policy",
            "invariants",
            "contract",
            "lint",
            "types",
            "tests"
        ]
        .map(|gate| (gate.to_owned(), "passed".to_owned()))
    );
    for v in run["verifications"].as_array().unwrap() {
        assert_eq!(v["skill"], "demo");
        assert_eq!(v["report"], run["nodes"][0]["outputs"]["report"]);
    }
    let report = &run["nodes"][0]["artifacts"][0];
    assert_eq!(report["kind"], "VERIFICATION_REPORT");
    // Confined, the gates wrote nothing into the workspace: not even Python's bytecode cache.
    if kavi::confinement::runtime::bwrap().is_ok() {
        assert!(!dir.path().join("skills/demo/__pycache__").exists());
        let confinement = &run["nodes"][0]["outputs"]["confinement"];
        assert_eq!(confinement["role"], "gate");
        assert_eq!(confinement["network"], "none");
        // The profile names the policy it came from, by the hash the run recorded it under.
        assert_eq!(confinement["policy"], "policies/confinement.toml");
        let recorded = run["governing"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["path"] == "policies/confinement.toml")
            .unwrap();
        assert_eq!(confinement["policy_hash"], recorded["spec_hash"]);
        let shown = kavi(dir.path(), &["runs", "show"]);
        let text = String::from_utf8_lossy(&shown.stdout);
        let hash = confinement["policy_hash"].as_str().unwrap();
        assert!(
            text.contains("confinement:")
                && text.contains(&format!(
                    "gate: bubblewrap, policies/confinement.toml {}",
                    &hash[..19]
                )),
            "{text}"
        );
    }
    let policies: Vec<&str> = run["governing"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "policy")
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        policies,
        [
            "policies/classifier.toml",
            "policies/confinement.toml",
            "policies/conventions.toml",
            "policies/gates.toml",
            "policies/invariants.toml",
            // The tools' configurations the gate commands name under policies/ are policies.
            "policies/mypy.ini",
            "policies/pytest.ini",
            "policies/ruff.toml",
            "policies/scanner.toml",
            "policies/toolchains.lock",
            "policies/toolchains.toml",
            "policies/trust.toml"
        ]
    );
}

#[test]
fn a_forbidden_import_fails_the_policy_gate_with_file_line_and_rule() {
    let dir = workspace(&format!("import subprocess\n{SKILL}"), TEST);
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    let policy = verification(&run, "policy");
    assert_eq!(policy["status"], "failed");
    assert_eq!(policy["failure_kind"], "VERIFY_POLICY");
    assert_eq!(
        policy["detail"],
        "skills/demo/skill.py:1:1: [process] starts a process: imports `subprocess`"
    );
    // The import is unused, too: the lint gate says so, after the policy gate that names the
    // failure kind. The tests passed, but a process the code could start could have written
    // their report: that pass is not kept.
    assert_eq!(
        run["nodes"][0]["error"],
        "required gates did not pass:\n  policy (failed)\n    skills/demo/skill.py:1:1: [process] starts a process: imports `subprocess`\n  lint (failed)\n    exited with code 1\n    skills/demo/skill.py:1:8: F401 [*] `subprocess` imported but unused\n    Found 1 error.\n    [*] 1 fixable with `--fix`.\n  tests (void)\n    not kept: this verdict is the tests' own report, and gate policy found what in the code could have written it"
    );
    assert_eq!(run["nodes"][0]["outputs"]["failure_kind"], "VERIFY_POLICY");
}

/// A bidirectional control character (Trojan Source) shows a reviewer the code in another order
/// than Python reads it: the lint gate fails on it.
#[test]
fn a_bidirectional_control_character_fails_the_lint_gate() {
    let trojan = format!(
        "{SKILL}\n\nACCESS = \"user{} {}# admin only{} {}\"\n",
        '\u{202e}', '\u{2066}', '\u{2069}', '\u{2066}'
    );
    let dir = workspace(&trojan, TEST);
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    let lint = verification(&run, "lint");
    assert_eq!(lint["status"], "failed", "{lint}");
    assert!(
        lint["detail"].as_str().unwrap().contains("PLE2502"),
        "{lint}"
    );
}

/// A file Python decodes as UTF-7 is one text to the tools and another to Python: the scan
/// fails it, and no other gate's row says `passed` about code none of them has seen.
#[test]
fn no_gate_passes_over_code_python_reads_otherwise() {
    let dir = workspace(&format!("# -*- coding: utf-7 -*-\n{SKILL}"), TEST);
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    let policy = verification(&run, "policy");
    assert_eq!(policy["status"], "failed", "{policy}");
    assert!(
        policy["detail"].as_str().unwrap().contains("[source]"),
        "{policy}"
    );
    // Each of these ran and, on its own, passed: the tests did run the code.
    for gate in ["lint", "types", "tests"] {
        let row = verification(&run, gate);
        assert_eq!(row["status"], "void", "{row}");
        assert_eq!(row["failure_kind"], policy["failure_kind"], "{row}");
        assert!(
            row["detail"]
                .as_str()
                .unwrap()
                .contains("skills/demo/skill.py"),
            "{row}"
        );
    }
    assert!(
        statuses(&run).iter().all(|(_, status)| status != "passed"),
        "{:?}",
        statuses(&run)
    );
}

/// A test that reaches a module by reflection (`len.__self__` is `builtins`, as the attack
/// round's test reached `os._exit` after writing pytest's report itself) fails the policy scan,
/// and the tests' own report, which such code could have written, is not kept as a pass.
#[test]
fn a_test_report_the_code_could_have_written_is_void_when_the_scan_fails() {
    let test = TEST
        .replace(
            "from skill import run\n",
            "from typing import Any\n\nfrom skill import run\n\n_size: Any = len\n",
        )
        .replace(
            "        self.assertEqual",
            "        _size.__self__.print(\"reached\")\n        self.assertEqual",
        );
    let dir = workspace(SKILL, &test);
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    let policy = verification(&run, "policy");
    assert_eq!(policy["status"], "failed", "{policy}");
    assert!(
        policy["detail"]
            .as_str()
            .unwrap()
            .contains("[dynamic_code] runs code it was not checked as: `builtins.len.__self__`"),
        "{policy}"
    );
    let tests = verification(&run, "tests");
    assert_eq!(tests["status"], "void", "{tests}");
    assert_eq!(tests["failure_kind"], policy["failure_kind"], "{tests}");
    assert!(
        tests["detail"]
            .as_str()
            .unwrap()
            .contains("this verdict is the tests' own report"),
        "{tests}"
    );
    // What no code of the skill's reports stands: the linter and the type checker passed.
    for gate in ["lint", "types"] {
        assert_eq!(verification(&run, gate)["status"], "passed", "{gate}");
    }
}

#[test]
fn a_failing_test_fails_the_tests_gate() {
    let dir = workspace(SKILL, &TEST.replace("{'echo': 1}", "{'echo': 2}"));
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    let tests = verification(&run, "tests");
    assert_eq!(tests["status"], "failed");
    assert_eq!(tests["failure_kind"], "VERIFY_TEST");
    assert!(
        tests["detail"].as_str().unwrap().contains("AssertionError"),
        "{}",
        tests["detail"]
    );
}

/// The code under review that tries to get something out while its tests run is not a failing
/// test: the gate set fails as a security violation, first whatever else failed.
#[test]
fn a_test_that_reaches_out_fails_the_gates_as_a_security_violation() {
    let escape = format!(
        "{TEST}\n\ndef test_out() -> None:\n    import socket\n    \
         socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'k', ('127.0.0.1', 9))\n"
    );
    let dir = workspace(&format!("import os\n{SKILL}"), &escape);
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    let tests = verification(&run, "tests");
    assert_eq!(tests["status"], "failed");
    assert_eq!(tests["failure_kind"], "SECURITY_VIOLATION");
    assert!(
        tests["detail"]
            .as_str()
            .unwrap()
            .contains("forbidden system call"),
        "{}",
        tests["detail"]
    );
    // The unused import fails the lint gate too; the security violation names the attempt.
    assert_eq!(verification(&run, "lint")["status"], "failed");
    assert_eq!(
        run["nodes"][0]["outputs"]["failure_kind"],
        "SECURITY_VIOLATION"
    );
}

#[test]
fn the_declared_precedence_names_the_attempt_whatever_the_file_order() {
    // An unused import (the lint gate) and a failing test (the tests gate).
    let skill = format!("import os\n{SKILL}");
    let dir = workspace(&skill, &TEST.replace("{'echo': 1}", "{'echo': 2}"));
    let gates = dir.path().join("policies/gates.toml");
    let text = std::fs::read_to_string(&gates).unwrap();
    let shipped = "precedence = [\n    \"SECURITY_VIOLATION\", \"VERIFY_SECRET\", \"RESOURCE_LIMIT\", \"VERIFY_POLICY\", \"VERIFY_INVARIANT\",\n    \"VERIFY_LINT\", \"VERIFY_TYPES\", \"VERIFY_TEST\", \"VERIFY_CONTRACT\", \"TIMEOUT\",\n]";
    assert!(text.contains(shipped));
    // The tests gate moved to the top of the file: lint still names the attempt.
    let at = text.find("[[gate]]\nid = \"tests\"").unwrap();
    let first = text.find("[[gate]]").unwrap();
    let reordered = format!("{}{}\n{}", &text[..first], &text[at..], &text[first..at]);
    std::fs::write(&gates, &reordered).unwrap();
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    assert_eq!(verification(&run, "lint")["status"], "failed");
    assert_eq!(verification(&run, "tests")["status"], "failed");
    assert_eq!(run["nodes"][0]["outputs"]["failure_kind"], "VERIFY_LINT");

    // The precedence is policy: put tests first and the same failure is a test failure; a kind
    // the classifier does not declare is refused at check.
    let tests_first = "precedence = [\"VERIFY_TEST\"]";
    std::fs::write(&gates, reordered.replace(shipped, tests_first)).unwrap();
    assert_eq!(run_verify(dir.path()), Some(1));
    assert_eq!(
        last_run(dir.path())["nodes"][0]["outputs"]["failure_kind"],
        "VERIFY_TEST"
    );
    std::fs::write(
        &gates,
        text.replace(shipped, "precedence = [\"VERIFY_TSET\"]"),
    )
    .unwrap();
    let out = kavi(dir.path(), &["pipeline", "check", "verify"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`VERIFY_TSET` is not a known failure kind"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An advisory gate never names the attempt: with lint advisory, the same skill's failing
    // test is what the attempt is, whatever the precedence says.
    let advisory = text.replace(
        "failure = \"VERIFY_LINT\"\nrequired = true",
        "failure = \"VERIFY_LINT\"\nrequired = false",
    );
    assert_ne!(advisory, text);
    std::fs::write(&gates, advisory).unwrap();
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    assert_eq!(verification(&run, "lint")["status"], "failed");
    assert_eq!(run["nodes"][0]["outputs"]["failure_kind"], "VERIFY_TEST");
}

/// The gates of a set run at once, each in a temporary folder of its own: a gate added to the
/// set cannot find the tests gate's report folder (where kavi's witness lies, first on pytest's
/// path) to plant a module pytest would load, nor rewrite its report.
#[test]
fn a_gate_cannot_reach_the_temporary_folder_of_another_gate_of_its_set() {
    let dir = workspace(SKILL, TEST);
    let gates = dir.path().join("policies/gates.toml");
    let text = std::fs::read_to_string(&gates).unwrap();
    // For ten seconds, while the tests gate runs beside it, look for its report folder.
    let look = "import glob, os, sys, time\n\
                end = time.time() + 10\n\
                while time.time() < end:\n    \
                    found = glob.glob(os.path.join(os.environ['TMPDIR'], '**', 'kavi-junit-*'), recursive=True)\n    \
                    if found:\n        \
                        sys.exit('saw %s' % found)\n    \
                    time.sleep(0.02)\n";
    let planter = format!(
        "\n[[gate]]\nid = \"planter\"\nkind = \"command\"\ntoolchain = \"python\"\n\
         run = [\"python\", \"-c\", {}]\nfailure = \"VERIFY_TEST\"\nrequired = false\n",
        serde_json::to_string(look).unwrap()
    );
    std::fs::write(&gates, format!("{text}{planter}")).unwrap();
    assert_eq!(run_verify(dir.path()), Some(0));
    let run = last_run(dir.path());
    let planter = verification(&run, "planter");
    assert_eq!(planter["status"], "passed", "{planter}");
    assert_eq!(verification(&run, "tests")["status"], "passed");
}

#[test]
fn a_gate_past_its_time_limit_is_stopped_and_recorded_timed_out() {
    // The test sleeps far longer than any run should wait.
    let hanging = TEST.replace("class T", "import time\n\ntime.sleep(100000)\n\n\nclass T");
    let dir = workspace(SKILL, &hanging);
    let gates = dir.path().join("policies/gates.toml");
    let text = std::fs::read_to_string(&gates).unwrap();
    // A generous default for the set, and a short limit on the tests gate: the gate's own wins.
    assert!(text.contains("\ntimeout = \"90s\"\n") && text.trim_end().ends_with("required = true"));
    let text = format!(
        "{}\ntimeout = \"2s\"\n",
        text.replace("\ntimeout = \"90s\"\n", "\ntimeout = \"10m\"\n")
            .trim_end()
    );
    std::fs::write(&gates, text).unwrap();
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    let tests = verification(&run, "tests");
    assert_eq!(tests["status"], "timed_out");
    assert_eq!(tests["failure_kind"], "TIMEOUT");
    assert_eq!(run["nodes"][0]["outputs"]["failure_kind"], "TIMEOUT");
    let detail = tests["detail"].as_str().unwrap();
    assert!(detail.starts_with("timed out after 2s"), "{detail}");
    // It hung at import, so no test had started; a hung test is named (see below).
    assert!(detail.contains("no test had started"), "{detail}");
    // Nothing the gate started lives on: no process still works in this workspace.
    let workspace = dir.path().canonicalize().unwrap();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok()?;
            cwd.starts_with(&workspace)
                .then(|| entry.file_name().to_string_lossy().into_owned())
        })
        .collect();
    assert!(left.is_empty(), "processes outlived their gate: {left:?}");
    for other in ["policy", "invariants", "lint", "types"] {
        assert_eq!(verification(&run, other)["status"], "passed", "{other}");
    }
}

#[test]
fn a_gate_whose_tool_is_missing_is_an_error_never_a_pass() {
    let dir = workspace(SKILL, TEST);
    let gates = dir.path().join("policies/gates.toml");
    let text = std::fs::read_to_string(&gates).unwrap();
    std::fs::write(
        &gates,
        format!("{text}\n[[gate]]\nid = \"mypy\"\nkind = \"command\"\nrun = [\"no-such-type-checker-kavi\", \"skills/{{{{ skill }}}}\"]\nfailure = \"VERIFY_LINT\"\n"),
    )
    .unwrap();
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    let mypy = verification(&run, "mypy");
    assert_eq!(mypy["status"], "error");
    assert!(
        mypy["detail"]
            .as_str()
            .unwrap()
            .starts_with("could not run `no-such-type-checker-kavi`"),
        "{}",
        mypy["detail"]
    );
    let error = run["nodes"][0]["error"].as_str().unwrap();
    assert!(
        error.starts_with(
            "required gates did not pass:\n  mypy (error)\n    could not run `no-such-type-checker-kavi`"
        ),
        "{error}"
    );
}

#[test]
fn a_skill_declaring_another_side_effect_than_proposed_fails_the_invariants() {
    let dir = workspace(&SKILL.replace("READ_ONLY", "NETWORK"), TEST);
    assert_eq!(run_verify(dir.path()), Some(1));
    let run = last_run(dir.path());
    let invariants = verification(&run, "invariants");
    assert_eq!(invariants["status"], "failed");
    assert_eq!(invariants["failure_kind"], "VERIFY_INVARIANT");
    assert_eq!(
        invariants["detail"],
        "skills/demo/skill.py: [side-effect-declared] declares NETWORK, but the skill was proposed as READ_ONLY"
    );
}

#[test]
fn a_confined_gate_that_writes_into_the_workspace_fails_and_its_temporary_folder_works() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = workspace(SKILL, TEST);
    let root = dir.path();
    std::fs::write(
        root.join("policies/writers.toml"),
        r#"
[[gate]]
id = "writes-workspace"
kind = "command"
run = ["sh", "-c", "echo x > pwned.txt"]
failure = "VERIFY_TEST"
required = true

[[gate]]
id = "writes-tmp"
kind = "command"
run = ["sh", "-c", "echo scratch > \"$TMPDIR/scratch\" && cat \"$TMPDIR/scratch\""]
failure = "VERIFY_TEST"
required = true
"#,
    )
    .unwrap();
    std::fs::write(
        root.join("pipelines/writers.toml"),
        "[pipeline]\nname = \"writers\"\n\n[nodes.verify]\nkind = \"gate\"\nset = \"policies/writers.toml\"\n",
    )
    .unwrap();
    let out = kavi(root, &["pipeline", "run", "writers"]);
    assert_eq!(out.status.code(), Some(1));
    let run = last_run(root);
    let denied = verification(&run, "writes-workspace");
    assert_eq!(denied["status"], "failed");
    assert!(
        denied["detail"]
            .as_str()
            .unwrap()
            .contains("Read-only file system"),
        "{denied}"
    );
    assert!(!root.join("pwned.txt").exists());
    assert_eq!(verification(&run, "writes-tmp")["status"], "passed");
}

/// A gate set of invariants alone starts no process, so it needs no confinement: none is
/// prepared (and a machine that cannot isolate could not refuse it).
#[test]
fn a_gate_set_that_starts_no_process_is_not_confined() {
    let dir = workspace(SKILL, TEST);
    let root = dir.path();
    std::fs::write(
        root.join("policies/scan-only.toml"),
        "[[gate]]\nid = \"invariants\"\nkind = \"invariant\"\nrules = \"policies/invariants.toml\"\nfailure = \"VERIFY_INVARIANT\"\nrequired = true\n",
    )
    .unwrap();
    std::fs::write(
        root.join("pipelines/scan.toml"),
        "[pipeline]\nname = \"scan\"\n\n[nodes.verify]\nkind = \"gate\"\nset = \"policies/scan-only.toml\"\nskill = \"demo\"\nvars = { skill = \"demo\" }\n",
    )
    .unwrap();
    let out = kavi(root, &["pipeline", "run", "scan"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let run = last_run(root);
    assert_eq!(verification(&run, "invariants")["status"], "passed");
    assert!(run["nodes"][0]["outputs"]["confinement"].is_null());
}

/// Ten ordinary mistakes, each of which the earlier stand-in lint and type checks let through:
/// the shipped gate set catches every one, with the tool the mistake belongs to.
#[test]
fn ordinary_mistakes_are_caught_by_ruff_or_mypy() {
    // (what, imports to put first, code to append, the gate that must fail)
    let mistakes = [
        (
            "unused variable",
            "",
            "def helper() -> int:\n    unused = 1\n    return 2\n",
            "lint",
        ),
        (
            "undefined name",
            "",
            "def helper() -> int:\n    return missing_name\n",
            "lint",
        ),
        (
            "bare except",
            "",
            "def helper() -> int:\n    try:\n        return int('x')\n    except:\n        return 0\n",
            "lint",
        ),
        (
            "f-string without placeholders",
            "",
            "def helper() -> str:\n    return f'constant'\n",
            "lint",
        ),
        (
            "shadowed import",
            "from json import loads\nfrom ast import literal_eval as loads\n",
            "def helper() -> Any:\n    return loads('1')\n",
            "lint",
        ),
        ("star import", "from os.path import *\n", "", "lint"),
        (
            "wrong argument type",
            "",
            "def helper(n: int) -> int:\n    return n\n\n\ndef caller() -> int:\n    return helper('one')\n",
            "types",
        ),
        (
            "missing return",
            "",
            "def helper(flag: bool) -> int:\n    if flag:\n        return 1\n",
            "types",
        ),
        (
            "optional misuse",
            "",
            "def helper(text: str | None) -> int:\n    return len(text)\n",
            "types",
        ),
        (
            "non-literal wrong return",
            "",
            "def helper(text: str) -> int:\n    return text.upper()\n",
            "types",
        ),
    ];
    for (what, imports, code, gate) in mistakes {
        let dir = workspace(&format!("{imports}{SKILL}\n\n{code}"), TEST);
        assert_eq!(run_verify(dir.path()), Some(1), "{what} passed the gates");
        let run = last_run(dir.path());
        let result = verification(&run, gate);
        assert_eq!(result["status"], "failed", "{what}: {result}");
        assert!(
            ["VERIFY_LINT", "VERIFY_TYPES"]
                .contains(&run["nodes"][0]["outputs"]["failure_kind"].as_str().unwrap()),
            "{what}: {}",
            run["nodes"][0]["outputs"]["failure_kind"]
        );
        assert_eq!(verification(&run, "tests")["status"], "passed", "{what}");
    }
}

/// A gate names its tool through a declared toolchain, and `check` says where it does not.
#[test]
fn a_gate_tool_outside_every_declared_toolchain_is_refused_at_check() {
    let dir = workspace(SKILL, TEST);
    let gates = dir.path().join("policies/gates.toml");
    let shipped = std::fs::read_to_string(&gates).unwrap();
    for (edit, says) in [
        (
            (
                "\"mypy\", \"--config-file\"",
                "\"mypyy\", \"--config-file\"",
            ),
            "gate `types` runs `mypyy`, which is not a tool of toolchain `python`",
        ),
        (
            (
                "id = \"types\"\nkind = \"command\"\ntoolchain = \"python\"\n",
                "id = \"types\"\nkind = \"command\"\n",
            ),
            "gate `types` runs `mypy` from PATH, but toolchain `python` declares it",
        ),
        (
            (
                "id = \"types\"\nkind = \"command\"\ntoolchain = \"python\"",
                "id = \"types\"\nkind = \"command\"\ntoolchain = \"node\"",
            ),
            "gate `types` names toolchain `node`, which policies/toolchains.toml does not declare",
        ),
    ] {
        assert!(shipped.contains(edit.0), "{}", edit.0);
        std::fs::write(&gates, shipped.replace(edit.0, edit.1)).unwrap();
        let out = kavi(dir.path(), &["pipeline", "check", "verify"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(stderr.contains("--> policies/gates.toml:"), "{stderr}");
    }
    std::fs::write(&gates, &shipped).unwrap();
    let toolchains = dir.path().join("policies/toolchains.toml");
    let declared = std::fs::read_to_string(&toolchains).unwrap();
    std::fs::write(
        &toolchains,
        declared.replace("ruff = \"0.17.6\"", "ruff = \">=0.17\""),
    )
    .unwrap();
    let out = kavi(dir.path(), &["pipeline", "check", "verify"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("`ruff` = \">=0.17\" is not one exact version")
            && stderr.contains("--> policies/toolchains.toml:"),
        "{stderr}"
    );
}

/// With no package registry, provisioning fails saying what could not be installed and how to
/// use an environment that exists; the gates that needed it are errors, never passes. Pointed at
/// an environment, kavi uses it, and only if it holds the pinned versions.
#[test]
fn without_a_registry_the_gates_are_errors_and_an_existing_environment_can_stand_in() {
    let dir = workspace(SKILL, TEST);
    let root = dir.path();
    // Who may adopt the rule change that names the environment (below).
    copy_policies(root, &["roles.toml"]);
    // The tests' own toolchains: the environments to point at.
    let existing = provisioned(root, "python");
    let existing_secrets = provisioned(root, "secrets");
    let offline = |args: &[&str]| {
        let cache = tempfile::tempdir().unwrap();
        common::kavi_command(root, args)
            .env("KAVI_TOOLCHAINS", cache.path())
            // A registry that refuses every connection: what a machine without network sees.
            .env("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
            .output()
            .unwrap()
    };

    let out = offline(&["toolchain", "install"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains(
            "could not provision toolchain `python` (coverage 7.17.5, mypy 2.4.1, pytest 9.2.0, \
             pytest-cov 7.1.0, pytest-timeout 2.4.0, ruff 0.17.6)"
        ) && stderr.contains("`[toolchain.python]` then `path = \"/path/to/venv\"`"),
        "{stderr}"
    );
    // pip's own reason, not the traceback printed after it.
    assert!(
        stderr.contains("ERROR: No matching distribution found for"),
        "{stderr}"
    );
    assert_eq!(
        offline(&["pipeline", "run", "verify"]).status.code(),
        Some(1)
    );
    let run = last_run(root);
    // The policy scan parses with the same toolchain's interpreter; the secret scan has its own.
    assert!(error_detail(&run, "secrets").contains("could not provision toolchain `secrets`"));
    for gate in ["policy", "lint", "types", "tests"] {
        let detail = error_detail(&run, gate);
        assert!(
            detail.contains("could not provision toolchain `python`"),
            "{gate}: {detail}"
        );
    }

    std::fs::write(
        root.join("kavi.toml"),
        format!(
            "[toolchain.python]\npath = \"{existing}\"\n\n[toolchain.secrets]\npath = \"{existing_secrets}\"\n"
        ),
    )
    .unwrap();
    // The environment's content is a rule like any other: adopted before its tools run.
    common::adopt_the_rules_as_they_are(root);
    let out = offline(&["pipeline", "run", "verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let run = last_run(root);
    let lint = verification(&run, "lint");
    assert_eq!(lint["tool"]["origin"], "existing");
    assert_eq!(lint["tool"]["version"], "0.17.6");

    // The same environment under other pins is refused, naming the difference.
    let toolchains = root.join("policies/toolchains.toml");
    let declared = std::fs::read_to_string(&toolchains).unwrap();
    std::fs::write(
        &toolchains,
        declared.replace("ruff = \"0.17.6\"", "ruff = \"0.17.5\""),
    )
    .unwrap();
    assert_eq!(
        offline(&["pipeline", "run", "verify"]).status.code(),
        Some(1)
    );
    let run = last_run(root);
    let lint = verification(&run, "lint");
    assert_eq!(lint["status"], "error");
    assert!(
        lint["detail"]
            .as_str()
            .unwrap()
            .contains("holds other versions: ruff is 0.17.6, pinned 0.17.5"),
        "{lint}"
    );
}

/// A toolchain kavi.toml names is adopted by its content: its files rewritten afterwards
/// (`bin/ruff` made to pass everything, and its `RECORD` line rewritten to match, so pip's own
/// record vouches for it) make every gate that runs its tools an error naming the file, never a
/// pass, and `kavi policy diff` names the change.
#[test]
fn a_toolchain_kavi_toml_names_runs_only_with_the_content_adopted() {
    let dir = workspace(SKILL, TEST);
    let root = dir.path();
    let provisioned = provisioned(root, "python");
    // A vendored copy (hard links: the rigging below replaces files, never writes into them).
    let shared = tempfile::tempdir().unwrap();
    let vendored = shared.path().join("python");
    let copied = std::process::Command::new("cp")
        .args(["-al", &provisioned])
        .arg(&vendored)
        .status()
        .unwrap();
    assert!(copied.success());
    // Its scripts name their interpreter by path: moved with the copy, as vendoring does.
    for entry in std::fs::read_dir(vendored.join("bin")).unwrap().flatten() {
        let path = entry.path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if path.is_symlink() || !text.starts_with(&format!("#!{provisioned}")) {
            continue;
        }
        let moved = text.replacen(&provisioned, &vendored.display().to_string(), 1);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, &moved).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        rerecord(
            &vendored,
            &entry.file_name().to_string_lossy(),
            moved.as_bytes(),
        );
    }
    std::fs::write(
        root.join("kavi.toml"),
        format!("[toolchain.python]\npath = \"{}\"\n", vendored.display()),
    )
    .unwrap();
    let out = kavi(root, &["pipeline", "run", "verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = last_run(root);
    let lint = verification(&run, "lint");
    assert_eq!(lint["status"], "passed", "{lint}");
    assert_eq!(lint["tool"]["origin"], "existing");

    // Rigged in place: bin/ruff always passes, and its RECORD entry says so.
    let ruff = vendored.join("bin/ruff");
    let rigged = b"#!/bin/sh\nexit 0\n";
    std::fs::remove_file(&ruff).unwrap();
    std::fs::write(&ruff, rigged).unwrap();
    std::fs::set_permissions(&ruff, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    rerecord(&vendored, "ruff", rigged);

    let diff = kavi(root, &["policy", "diff"]);
    let diff_text = String::from_utf8_lossy(&diff.stdout);
    assert!(
        diff_text.contains("toolchain:python: `bin/ruff` changed"),
        "{diff_text}"
    );
    let out = kavi(root, &["pipeline", "run", "verify"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = last_run(root);
    for gate in ["lint", "types", "tests", "policy"] {
        let result = verification(&run, gate);
        assert_eq!(result["status"], "error", "{gate}: {result}");
        let detail = result["detail"].as_str().unwrap();
        assert!(
            detail.contains("toolchain `python`: refusing the environment")
                && detail.contains("`bin/ruff` changed")
                && detail.contains("ruff-"),
            "{gate}: {detail}"
        );
    }
}

/// The folder of the tests' own toolchain `name`, provisioned once for the whole suite.
fn provisioned(root: &std::path::Path, name: &str) -> String {
    let installed = kavi(root, &["toolchain", "install"]);
    assert!(
        installed.status.success(),
        "{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    String::from_utf8_lossy(&kavi(root, &["toolchain", "path", name]).stdout)
        .trim()
        .to_owned()
}

/// Rewrites the `RECORD` line of `bin/NAME` in the environment at `venv` for its new `bytes`
/// (replacing the file, never writing into it: the copy's files are hard links).
fn rerecord(venv: &std::path::Path, name: &str, bytes: &[u8]) {
    let hash = base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(bytes)),
    );
    let line_for = format!("/bin/{name}");
    for record in walkdir::WalkDir::new(venv.join("lib"))
        .into_iter()
        .flatten()
        .map(|entry| entry.into_path())
        .filter(|path| path.ends_with("RECORD"))
    {
        let old = std::fs::read_to_string(&record).unwrap();
        let text: String = old
            .lines()
            .map(|line| match line.split(',').next() {
                Some(path) if path.ends_with(&line_for) => {
                    format!("{path},sha256={hash},{}\n", bytes.len())
                }
                _ => format!("{line}\n"),
            })
            .collect();
        if text != old {
            std::fs::remove_file(&record).unwrap();
            std::fs::write(&record, text).unwrap();
        }
    }
}

/// The skill with an unused import and a type error, and the test made to fail: broken for
/// every command gate.
const BROKEN: &str = "import json\nimport os\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: Any) -> dict[str, Any]:\n    return {'echo': json.loads(json.dumps(data))}\n\n\ndef count(text: str) -> int:\n    return text\n";

fn failing_test() -> String {
    TEST.replace("{'echo': 1}", "{'echo': 2}")
}

/// Runs the gates; the gate's status and detail.
fn gate_of(dir: &std::path::Path, gate: &str) -> (String, String) {
    assert_eq!(run_verify(dir), Some(1), "the gates passed");
    let run = last_run(dir);
    let v = verification(&run, gate);
    (
        v["status"].as_str().unwrap().to_owned(),
        v["detail"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Issue 52: suppressions that switch a gate off for a file fail that gate, named, unless the
/// gate set allows them; an allowed one is listed with the result.
#[test]
fn a_file_level_suppression_fails_its_gate_unless_the_gate_set_allows_it() {
    let noqa = format!("# ruff: noqa\n{BROKEN}");
    let dir = workspace(&noqa, TEST);
    let (status, detail) = gate_of(dir.path(), "lint");
    assert_eq!(status, "failed");
    assert!(
        detail.contains("suppression `# ruff: noqa` (file_noqa)"),
        "{detail}"
    );

    let ignore = format!("# mypy: ignore-errors\n{BROKEN}").replace("import os\n", "");
    let dir = workspace(&ignore, TEST);
    let (status, detail) = gate_of(dir.path(), "types");
    assert_eq!(status, "failed");
    assert!(detail.contains("(mypy_inline_config)"), "{detail}");
    // A `# type: ignore` after code, with a code or without, is a line's suppression: refused
    // unless allowed, before mypy runs.
    let blanket = BROKEN
        .replace("import os\n", "")
        .replace("return text\n", "return text  # type: ignore\n");
    let dir = workspace(&blanket, TEST);
    let (status, detail) = gate_of(dir.path(), "types");
    assert_eq!(status, "failed");
    assert!(detail.contains("(line_type_ignore)"), "{detail}");

    // Allowed by the gate set: the gate passes, and the suppression is on the record.
    let sound = format!("# mypy: disallow-any-expr=False\n{SKILL}");
    let dir = workspace(&sound, TEST);
    let gates = dir.path().join("policies/gates.toml");
    let text = std::fs::read_to_string(&gates).unwrap();
    std::fs::write(
        &gates,
        text.replace("allow = []", "allow = [\"mypy_inline_config\"]"),
    )
    .unwrap();
    assert_eq!(run_verify(dir.path()), Some(0));
    let run = last_run(dir.path());
    let types = run["nodes"][0]["outputs"]["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gate"] == "types")
        .unwrap()
        .clone();
    assert_eq!(types["status"], "passed");
    let allowed = &types["evidence"]["allowed_suppressions"][0];
    assert_eq!(allowed["kind"], "mypy_inline_config", "{types}");
    assert_eq!(allowed["line"], 1);
    assert_eq!(
        verification(&run, "types")["detail"],
        "allowed suppressions: skills/demo/skill.py:1 mypy_inline_config"
    );
    // An unknown kind is refused where it is written.
    std::fs::write(&gates, text.replace("allow = []", "allow = [\"noqa_all\"]")).unwrap();
    let out = kavi(dir.path(), &["pipeline", "check", "verify"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown suppression `noqa_all`")
            && stderr.contains("policies/gates.toml:"),
        "{stderr}"
    );
}

/// Issue 52: a test gate passes on a complete report of its own run, never on an exit status.
#[test]
fn tests_that_end_early_or_hide_failures_fail_the_test_gate_with_a_named_reason() {
    let cases = [
        (
            "os_exit",
            failing_test().replace(
                "    def test_echo",
                "    def test_a(self) -> None:\n        import os\n\n        os._exit(0)\n\n    def test_echo",
            ),
            "no_report",
        ),
        (
            "patched assertEqual",
            failing_test().replace(
                "class T",
                "setattr(unittest.TestCase, \"assertEqual\", lambda *a, **k: None)\n\n\nclass T",
            ),
            "framework_replaced",
        ),
        (
            "all skipped",
            failing_test().replace("class T", "@unittest.skip(\"later\")\nclass T"),
            "tests_skipped",
        ),
        (
            "no tests",
            "from skill import run\n\nassert run is not None\n".to_owned(),
            "too_few_tests",
        ),
        (
            "atexit",
            failing_test().replace(
                "from skill import run\n",
                "import atexit\nimport os\n\nfrom skill import run\n\natexit.register(lambda: os._exit(0))\n",
            ),
            "tests_failed",
        ),
    ];
    for (case, test, reason) in cases {
        let dir = workspace(SKILL, &test);
        let (status, detail) = gate_of(dir.path(), "tests");
        assert_eq!(status, "failed", "{case}");
        assert!(
            detail.starts_with(&format!("{reason}: ")),
            "{case}: {detail}"
        );
    }
}

/// A test that reaches pytest's machinery through the `request` fixture and makes every later
/// test "pass" without running its body: the classes pytest runs items through, the items
/// themselves, and hooks registered once tests load, each spelling fails the test gate.
#[test]
fn a_test_that_switches_off_the_tests_after_it_fails_the_test_gate_however_spelled() {
    let each_item = |body: &str| {
        format!(
            "import pytest\n\n\ndef test_a_setup(request: pytest.FixtureRequest) -> None:\n    \
             for item in request.node.session.items:\n        {body}\n\n\n"
        )
    };
    let cases = [
        ("type(item).runtest", each_item("kind: Any = type(item)\n        kind.runtest = lambda self: None"), "framework_replaced"),
        ("setattr(type(item))", each_item("setattr(type(item), \"runtest\", lambda self: None)"), "framework_replaced"),
        ("item.__class__", each_item("item.__class__.runtest = lambda self: None"), "framework_replaced"),
        ("type.__setattr__", each_item("type.__setattr__(type(item), \"runtest\", lambda self: None)"), "framework_replaced"),
        ("item.runtest", each_item("item.runtest = lambda: None"), "framework_replaced"),
        ("item.obj", each_item("item.obj = lambda *a, **k: None"), "framework_replaced"),
        ("item.__dict__", each_item("item.__dict__[\"runtest\"] = lambda: None"), "framework_replaced"),
        (
            "CallInfo.from_call",
            "import _pytest.runner\n\n\ndef test_a_setup() -> None:\n    \
             real = _pytest.runner.CallInfo.from_call.__func__\n    \
             _pytest.runner.CallInfo.from_call = classmethod(  # type: ignore[method-assign]\n        \
             lambda cls, func, when, reraise=None: real(cls, (lambda: None) if when == \"call\" else func, when, reraise)\n    )\n\n\n"
                .to_owned(),
            "framework_replaced",
        ),
        (
            "pluginmanager.register",
            "import pytest\n\n\nclass Pass:\n    @pytest.hookimpl(tryfirst=True)\n    \
             def pytest_runtest_call(self, item: Any) -> None:\n        item.runtest = lambda: None\n\n\n\
             def test_a_setup(request: pytest.FixtureRequest) -> None:\n    \
             request.config.pluginmanager.register(Pass())\n\n\n"
                .to_owned(),
            "framework_replaced",
        ),
    ];
    for (case, setup, reason) in cases {
        // Sorted first, so that the failing test runs after it.
        let test = failing_test().replace(
            "from skill import run\n",
            &format!("from typing import Any\n\nfrom skill import run\n\n{setup}"),
        );
        let dir = workspace(SKILL, &test);
        let (status, detail) = gate_of(dir.path(), "tests");
        assert_eq!(status, "failed", "{case}: {detail}");
        assert!(
            detail.starts_with(&format!("{reason}: ")),
            "{case}: {detail}"
        );
    }
}

/// The gates judge the bytes that are hashed: a test file swapped for a passing one while the
/// gates run (from the moment their temporary folder appears until pytest's report is written)
/// and swapped back before the second hash is never what the test gate reads. Before, the gates
/// read the workspace, and the failing test file was verified.
#[test]
fn a_file_swapped_in_the_workspace_while_the_gates_run_is_not_what_they_judge() {
    let dir = workspace(SKILL, &failing_test());
    let sandboxes = tempfile::tempdir().unwrap();
    let test_file = dir.path().join("skills/demo/test_skill.py");
    let mut gates = common::kavi_command(dir.path(), &["pipeline", "run", "verify"])
        .env("KAVI_SANDBOXES", sandboxes.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // A folder of this run's (the gates' temporary one), and in it the file `find` names.
    let mut appears = |find: &dyn Fn(&std::path::Path) -> Option<std::path::PathBuf>| loop {
        if let Some(found) = walkdir::WalkDir::new(sandboxes.path())
            .into_iter()
            .flatten()
            .find_map(|e| find(e.path()))
        {
            return Some(found);
        }
        if gates.try_wait().unwrap().is_some() {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let named = |prefix: &'static str| {
        move |path: &std::path::Path| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                .then(|| path.to_owned())
        }
    };
    appears(&named("kavi-tmp-gates-")).expect("the gates made no temporary folder");
    let swap = |text: &str| {
        let next = test_file.with_extension("swap");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &test_file).unwrap();
    };
    swap(TEST);
    let report = appears(&named("report.xml"));
    swap(&failing_test());
    assert!(report.is_some(), "pytest wrote no report");
    let code = gates.wait().unwrap().code();
    let run = last_run(dir.path());
    let tests = verification(&run, "tests");
    // What was hashed (the failing test) is what the test gate judged.
    assert_eq!(code, Some(1), "{run}");
    assert_eq!(tests["status"], "failed", "{tests}");
    assert!(
        tests["detail"]
            .as_str()
            .unwrap_or_default()
            .starts_with("tests_failed: "),
        "{tests}"
    );
}

/// Where pip finds nothing: provisioning again fails at once, as it does offline.
const NO_INDEX: &str = "http://127.0.0.1:9/simple";

/// A provisioned toolchain is the one kavi installed, not what its folder says of itself. The
/// attack as found: a copy of the cache (kavi's records of it included) with its scripts and
/// `kavi-toolchain.json` moved to the copy's path and a `.pth` planted among mypy's files,
/// listed in mypy's `RECORD` as pip would have, made mypy print "Success" for a type error.
/// kavi has no record of installing that copy, so it provisions it again; where it cannot
/// (here, offline), every gate of the toolchain is an error naming the folder and why, and the
/// copy is gone. A record copied with its path edited does not hold either: its MAC is this
/// account's key's.
#[test]
fn a_copied_cache_with_a_planted_pth_is_not_trusted_and_is_provisioned_again() {
    let dir = workspace(&BROKEN.replace("import os\n", ""), TEST);
    let root = dir.path();
    assert!(kavi(root, &["toolchain", "install"]).status.success());
    let cache = tempfile::tempdir().unwrap();
    let mut copies = Vec::new();
    for name in ["python", "secrets"] {
        let out = kavi(root, &["toolchain", "path", name]);
        let original = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let copy = cache.path().join(original.file_name().unwrap());
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(&original)
            .arg(original.with_extension("provisioned"))
            .arg(cache.path())
            .status()
            .unwrap();
        assert!(copied.success());
        let (from, to) = (original.display().to_string(), copy.display().to_string());
        let manifest = copy.join("kavi-toolchain.json");
        let text = std::fs::read_to_string(&manifest)
            .unwrap()
            .replace(&from, &to);
        std::fs::write(&manifest, text).unwrap();
        for entry in std::fs::read_dir(copy.join("bin")).unwrap().flatten() {
            let path = entry.path();
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            if !path.is_symlink() && text.starts_with(&format!("#!{from}")) {
                let moved = text.replacen(&from, &to, 1);
                std::fs::write(&path, &moved).unwrap();
                rerecord(
                    &copy,
                    &entry.file_name().to_string_lossy(),
                    moved.as_bytes(),
                );
            }
        }
        copies.push(copy);
    }
    // python: the .pth, listed in mypy's RECORD; kavi's record as copied.
    let site = walkdir::WalkDir::new(copies[0].join("lib"))
        .into_iter()
        .flatten()
        .find(|e| e.file_name() == "site-packages")
        .unwrap()
        .into_path();
    let pth = site.join("zz_attack.pth");
    let attack = "import os, sys; any(a.endswith('/bin/mypy') for a in getattr(sys, 'orig_argv', [])[:2]) and (os.write(1, b'Success: no issues found in 2 source files\\n'), os._exit(0))\n";
    std::fs::write(&pth, attack).unwrap();
    let record = std::fs::read_dir(&site)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("mypy-")
        })
        .unwrap()
        .join("RECORD");
    let hash = base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        <sha2::Sha256 as sha2::Digest>::digest(attack.as_bytes()),
    );
    let mut listed = std::fs::read_to_string(&record).unwrap();
    listed.push_str(&format!("zz_attack.pth,sha256={hash},{}\n", attack.len()));
    std::fs::write(&record, listed).unwrap();
    // secrets: kavi's record edited to name the copy, without the key its MAC needs.
    let secrets_record = copies[1].with_extension("provisioned");
    let mut edited: Value =
        serde_json::from_str(&std::fs::read_to_string(&secrets_record).unwrap()).unwrap();
    edited["path"] = copies[1].display().to_string().into();
    std::fs::write(&secrets_record, edited.to_string()).unwrap();

    let listed = common::kavi_command(root, &["toolchain", "list", "--json"])
        .env("KAVI_TOOLCHAINS", cache.path())
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[0]["state"], "untrusted", "{listed}");
    assert_eq!(listed[1]["state"], "untrusted", "{listed}");
    // Its folder is not printed as one to use.
    let path = common::kavi_command(root, &["toolchain", "path", "python"])
        .env("KAVI_TOOLCHAINS", cache.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&path.stderr);
    assert!(
        path.stdout.is_empty() && said.contains("is not the environment kavi installed"),
        "{said}"
    );
    // Without a key, no folder is kavi's: said as such, not as one never provisioned.
    let not_a_folder = cache.path().join("not-a-folder");
    std::fs::write(&not_a_folder, "").unwrap();
    let no_key = not_a_folder.join("keys");
    let listed = common::kavi_command(root, &["toolchain", "list", "--json"])
        .env("KAVI_TOOLCHAINS", cache.path())
        .env("KAVI_KEYS", &no_key)
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[0]["state"], "unknown", "{listed}");
    assert!(
        listed[0]["error"]
            .as_str()
            .unwrap()
            .contains("cannot name its folder"),
        "{listed}"
    );

    let out = common::kavi_command(root, &["pipeline", "run", "verify"])
        .env("KAVI_TOOLCHAINS", cache.path())
        .env("PIP_INDEX_URL", NO_INDEX)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let run = last_run(root);
    let detail = error_detail(&run, "types");
    assert!(
        detail.contains(&format!(
            "the environment {} is not one this kavi installed",
            copies[0].display()
        )) && detail.contains("not here (a copy)")
            && detail.contains("provisioning it again failed"),
        "{detail}"
    );
    let detail = error_detail(&run, "secrets");
    assert!(
        detail.contains("was not made with this account's key"),
        "{detail}"
    );
    assert!(!pth.exists(), "the untrusted copy was removed");
}

/// An environment kavi provisioned, changed afterwards (a line added to one of mypy's
/// modules), is not run: the next run provisions it again and the gate judges the skill with
/// the tool as installed. A kavi with other keys sharing the cache does not trust it, and
/// provisions a folder of its own beside it. Each gate result names the content its tool ran
/// with.
#[test]
fn a_provisioned_toolchain_changed_since_or_installed_by_another_kavi_is_not_run() {
    let dir = workspace(&BROKEN.replace("import os\n", ""), TEST);
    let root = dir.path();
    let home = tempfile::tempdir().unwrap();
    let with_home = |args: &[&str]| {
        let mut command = common::kavi_command(root, args);
        command.env("KAVI_TOOLCHAINS", home.path());
        command
    };
    let out = with_home(&["toolchain", "install", "python"])
        .output()
        .unwrap();
    if !common::provisioned_or_skip(&out) {
        return;
    }
    let folder = std::path::PathBuf::from(
        String::from_utf8_lossy(
            &with_home(&["toolchain", "path", "python"])
                .output()
                .unwrap()
                .stdout,
        )
        .trim(),
    );
    let module = walkdir::WalkDir::new(folder.join("lib"))
        .into_iter()
        .flatten()
        .find(|e| e.path().ends_with("site-packages/mypy/__init__.py"))
        .unwrap()
        .into_path();
    let mut text = std::fs::read_to_string(&module).unwrap();
    text.push_str("PLANTED = 1\n");
    std::fs::write(&module, &text).unwrap();
    let relative = module.strip_prefix(&folder).unwrap().display().to_string();

    let doctor = with_home(&["doctor"]).output().unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        said.contains("is not the environment kavi installed")
            && said.contains(&format!("`{relative}` changed")),
        "{said}"
    );
    let out = with_home(&["pipeline", "run", "verify"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("`{relative}` changed"))
            && stderr.contains("provisioning it again"),
        "{stderr}"
    );
    let run = last_run(root);
    let types = verification(&run, "types");
    assert_eq!(types["status"], "failed", "mypy ran, as installed: {types}");
    assert!(
        !std::fs::read_to_string(&module)
            .unwrap()
            .contains("PLANTED")
    );
    let listed_now = || -> Value {
        let out = with_home(&["toolchain", "list", "--json"])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let listed = listed_now();
    assert_eq!(listed[0]["state"], "provisioned", "{listed}");
    assert_eq!(types["tool"]["content"], listed[0]["content"], "{types}");

    // Another kavi's keys (a workspace with its own `KAVI_KEYS`) sharing the cache: the
    // environment is not theirs to trust, and they get a folder of their own (offline here, so
    // it cannot be made) rather than provisioning over this one while its gates may run.
    let other = workspace(&BROKEN.replace("import os\n", ""), TEST);
    let keys = tempfile::tempdir().unwrap();
    let out = common::kavi_command(other.path(), &["pipeline", "run", "verify"])
        .env("KAVI_TOOLCHAINS", home.path())
        .env("KAVI_KEYS", keys.path())
        .env("PIP_INDEX_URL", NO_INDEX)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let run = last_run(other.path());
    let detail = error_detail(&run, "types");
    assert!(
        detail.contains("could not provision toolchain `python`")
            && !detail.contains(&folder.display().to_string()),
        "{detail}"
    );
    let listed = listed_now();
    assert_eq!(
        (&listed[0]["state"], &listed[0]["path"]),
        (&"provisioned".into(), &folder.display().to_string().into()),
        "the first key's environment is left as it was: {listed}"
    );
}

/// The files kavi reads back from the test gate's folder (the report, the name of the test
/// running) are the tests' to replace: one replaced by a link to a file of the host's is not
/// read through it, so what the link points at never reaches the record (or the next build's
/// packet, which shows the builder the gate's detail).
#[test]
fn a_link_planted_for_a_file_kavi_reads_back_is_never_followed() {
    let outside = tempfile::tempdir().unwrap();
    let canary = outside.path().join("canary.txt");
    std::fs::write(&canary, "HOST-CANARY-4e1f\n").unwrap();
    let test = failing_test().replace(
        "    def test_echo",
        &format!(
            "    def test_a(self) -> None:\n        import os\n\n        witness = os.environ[\"PYTHONPATH\"].split(os.pathsep)[0]\n        for name in (\"running\", \"report.xml\"):\n            path = os.path.join(os.path.dirname(witness), name)\n            if os.path.lexists(path):\n                os.remove(path)\n            os.symlink({:?}, path)\n        os._exit(1)\n\n    def test_echo",
            canary.display().to_string()
        ),
    );
    let dir = workspace(SKILL, &test);
    let (status, detail) = gate_of(dir.path(), "tests");
    assert_eq!(status, "failed");
    assert!(detail.starts_with("no_report: "), "{detail}");
    assert!(!detail.contains("HOST-CANARY"), "{detail}");
    common::assert_nowhere_under(&dir.path().join(".kavi"), "HOST-CANARY-4e1f");
}

/// Issue 52: no tool configuration beside the skill, at the workspace's root or above it, and
/// no variable of the caller's, changes what a gate checks; a conftest.py is never loaded.
#[test]
fn tool_configuration_near_the_skill_or_in_the_environment_changes_nothing() {
    let setup_cfg = "[mypy]\nignore_errors = True\n\n[tool:pytest]\naddopts = --collect-only\n";
    let pyproject = "[tool.ruff.lint]\nignore = [\"F401\"]\n";
    let dir = workspace(BROKEN, &failing_test());
    let root = dir.path();
    std::fs::write(root.join("setup.cfg"), setup_cfg).unwrap();
    std::fs::write(root.join("skills/demo/pyproject.toml"), pyproject).unwrap();
    std::fs::write(
        root.join("skills/demo/conftest.py"),
        "def pytest_collection_modifyitems(config, items):\n    items.clear()\n",
    )
    .unwrap();
    let out = common::kavi_command(root, &["pipeline", "run", "verify"])
        .env("PYTEST_ADDOPTS", "--collect-only")
        .env("PYTHONPATH", root.join("skills/demo"))
        .env("MYPY_CONFIG_FILE_DIR", root.join("skills/demo"))
        .env("RUFF_CONFIG", root.join("skills/demo/pyproject.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let run = last_run(root);
    lint_types_and_tests_failed(&run);
}

/// The tools' configuration is recorded as governing when the run begins, and the tools read the
/// recorded texts: weakened on disk once the run has begun (and put back before anyone looks),
/// it decides nothing. An attacker's race made a skill with a lint error, a type error and a
/// failing test TRUSTED this way, the record showing only the texts it began with.
#[test]
fn tool_configuration_weakened_after_the_run_began_is_not_what_the_tools_read() {
    let dir = workspace(BROKEN, &failing_test());
    let root = dir.path();
    // The gates wait for `go`: the run, its governing set with it, is recorded by then.
    std::fs::write(
        root.join("pipelines/verify.toml"),
        "[pipeline]\nname = \"verify\"\n\n[nodes.wait]\nkind = \"exec\"\nrun = [\"python3\", \
         \"-c\", \"import os, time\\nwhile not os.path.exists('go'): time.sleep(0.02)\"]\n\n\
         [nodes.verify]\nkind = \"gate\"\nneeds = [\"wait\"]\nskill = \"demo\"\n\
         vars = { skill = \"demo\" }\n",
    )
    .unwrap();
    let mut gates = common::kavi_command(root, &["pipeline", "run", "verify"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !common::kavi(root, &["runs", "show", "1", "--json"])
        .status
        .success()
    {
        assert!(std::time::Instant::now() < deadline, "the run never began");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let weakened = [
        ("policies/ruff.toml", "[lint]\nselect = []\n"),
        ("policies/mypy.ini", "[mypy]\nignore_errors = True\n"),
        (
            "policies/pytest.ini",
            "[pytest]\naddopts = --collect-only\n",
        ),
    ];
    let recorded: Vec<String> = weakened
        .iter()
        .map(|(path, text)| {
            let before = std::fs::read_to_string(root.join(path)).unwrap();
            std::fs::write(root.join(path), text).unwrap();
            before
        })
        .collect();
    std::fs::write(root.join("go"), "").unwrap();
    assert_eq!(gates.wait().unwrap().code(), Some(1));
    for ((path, _), text) in weakened.iter().zip(&recorded) {
        std::fs::write(root.join(path), text).unwrap();
    }
    let run = last_run(root);
    lint_types_and_tests_failed(&run);
}

/// The lint, type and test gates each failed on BROKEN and its failing test, for what they exist
/// to catch.
fn lint_types_and_tests_failed(run: &Value) {
    for (gate, says) in [
        ("lint", "F401"),
        ("types", "Incompatible return value"),
        ("tests", "tests_failed: "),
    ] {
        let v = verification(run, gate);
        assert_eq!(v["status"], "failed", "{gate}: {v}");
        assert!(v["detail"].as_str().unwrap().contains(says), "{gate}: {v}");
    }
}

/// A pytest.ini in the folder above the workspace (pytest walks up to find one) is not read.
#[test]
fn a_pytest_ini_above_the_workspace_is_not_read() {
    let above = tempfile::tempdir().unwrap();
    let inner = workspace(SKILL, &failing_test());
    let root = above.path().join("workspace");
    std::fs::rename(inner.path(), &root)
        .or_else(|_| {
            // Another file system: copy instead.
            std::process::Command::new("cp")
                .arg("-a")
                .arg(inner.path())
                .arg(&root)
                .status()
                .map(|_| ())
        })
        .unwrap();
    std::fs::write(
        above.path().join("pytest.ini"),
        "[pytest]\naddopts = --collect-only\n",
    )
    .unwrap();
    let (status, detail) = gate_of(&root, "tests");
    assert_eq!(status, "failed");
    assert!(detail.starts_with("tests_failed: "), "{detail}");
}

/// A test past the policy's per-test limit fails, named, and the report still counts the rest.
#[test]
fn a_hung_test_is_stopped_by_the_per_test_limit_and_named() {
    let hanging = format!(
        "{TEST}\n    def test_hangs(self) -> None:\n        import time\n\n        time.sleep(3600)\n"
    );
    let dir = workspace(SKILL, &hanging);
    let ini = dir.path().join("policies/pytest.ini");
    let text = std::fs::read_to_string(&ini).unwrap();
    assert!(text.contains("\ntimeout = 20\n"));
    std::fs::write(&ini, text.replace("\ntimeout = 20\n", "\ntimeout = 2\n")).unwrap();
    let (status, detail) = gate_of(dir.path(), "tests");
    assert_eq!(status, "failed");
    assert!(
        detail.starts_with("test_timed_out: test_skill.T.test_hangs failure: Failed: Timeout"),
        "{detail}"
    );
    assert!(
        detail.contains("2 collected, 2 ran: 1 passed, 1 failed"),
        "{detail}"
    );
}

/// A sound skill's test gate records what ran.
#[test]
fn a_passing_test_gate_records_its_counts() {
    let dir = workspace(SKILL, TEST);
    assert_eq!(run_verify(dir.path()), Some(0));
    let run = last_run(dir.path());
    let tests = verification(&run, "tests");
    assert_eq!(
        tests["detail"],
        "1 collected, 1 ran: 1 passed, 0 failed, 0 errors, 0 skipped"
    );
    let report = run["nodes"][0]["outputs"]["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|gate| gate["gate"] == "tests")
        .unwrap();
    assert_eq!(report["evidence"]["tests"]["passed"], 1, "{report}");
}

/// A skill that passes its own tests but prints another output than its proposal's example
/// promises: the contract gate runs it as `kavi skill run` would and fails it, VERIFY_CONTRACT.
#[test]
fn a_skill_that_passes_its_tests_but_breaks_its_contract_fails_the_contract_gate() {
    // The test checks `run`; the program the proposal runs prints an off-by-one count.
    let skill = "import json\nimport sys\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\n\
def run(data: Any) -> dict[str, Any]:\n    return {'echo': json.loads(json.dumps(data))}\n\n\n\
if __name__ == \"__main__\":\n    json.dump({'words': len(str(json.load(sys.stdin)['text']).split()) + 1}, sys.stdout)\n";
    let proposal = "name = \"demo\"\ndescription = \"Count\"\nside_effect = \"READ_ONLY\"\n\
command = [\"python3\", \"skills/demo/skill.py\"]\ninput_schema = { type = \"object\", required = [\"text\"] }\n\
output_schema = { type = \"object\", required = [\"words\"], properties.words = { type = \"integer\" } }\n\n\
[[examples]]\ninput = { text = \"one two\" }\noutput = { words = 2 }\n";
    let dir = workspace_proposing(skill, TEST, proposal);
    let root = dir.path();
    assert_eq!(run_verify(root), Some(1));
    let run = last_run(root);
    assert_eq!(verification(&run, "tests")["status"], "passed");
    let contract = verification(&run, "contract");
    assert_eq!(contract["status"], "failed");
    assert_eq!(contract["failure_kind"], "VERIFY_CONTRACT");
    let detail = contract["detail"].as_str().unwrap();
    assert!(
        detail.contains("example 1: the output is not the example's: got {\"words\":3}"),
        "{detail}"
    );
    let report = run["nodes"][0]["outputs"]["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|gate| gate["gate"] == "contract")
        .unwrap();
    assert_eq!(report["evidence"]["examples"]["matched"], 0, "{report}");
    assert_eq!(
        run["nodes"][0]["outputs"]["failure_kind"],
        "VERIFY_CONTRACT"
    );

    // Fixed, the same example passes, and the row says how many matched.
    std::fs::write(
        root.join("skills/demo/skill.py"),
        skill.replace(".split()) + 1}", ".split())}"),
    )
    .unwrap();
    assert_eq!(run_verify(root), Some(0));
    let run = last_run(root);
    let contract = verification(&run, "contract");
    assert_eq!(contract["status"], "passed");
    assert_eq!(contract["detail"], "1 of 1 examples matched");
}

/// A confinement violation while the contract gate runs the skill (here a decoy opened) is
/// what it is, a security violation that goes to a person at once, not a broken contract.
#[test]
fn a_confinement_violation_during_a_contract_run_is_a_security_violation() {
    if !common::isolation_or_skip() {
        return;
    }
    let skill = skill_whose_program("    open(\"/etc/shadow\").read()\n    print(1)\n");
    let dir = workspace_proposing(&skill, TEST, RUNS_SKILL);
    let root = dir.path();
    assert_eq!(run_verify(root), Some(1));
    let run = last_run(root);
    let contract = verification(&run, "contract");
    assert_eq!(contract["status"], "failed", "{contract}");
    assert_eq!(contract["failure_kind"], "SECURITY_VIOLATION", "{contract}");
    let detail = contract["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(
            "running its examples, the skill was stopped by its confinement for opening \
             /etc/shadow, a decoy"
        ),
        "{detail}"
    );
    // The attempt is named for it, over every other kind.
    assert_eq!(
        run["nodes"][0]["outputs"]["failure_kind"],
        "SECURITY_VIOLATION"
    );
}

/// A proposal with fewer examples than the gate set's `min_examples` (1 in the shipped set)
/// fails the contract gate, saying so; `min_examples` on another kind of gate is refused.
#[test]
fn a_proposal_below_the_minimum_of_examples_fails_the_contract_gate() {
    let none = PROPOSAL
        .split("\n\n[[examples]]")
        .next()
        .unwrap()
        .to_owned()
        + "\n";
    let dir = workspace_proposing(SKILL, TEST, &none);
    let root = dir.path();
    assert_eq!(run_verify(root), Some(1));
    let run = last_run(root);
    let contract = verification(&run, "contract");
    assert_eq!(contract["status"], "failed", "{contract}");
    assert_eq!(contract["failure_kind"], "VERIFY_CONTRACT");
    assert!(
        contract["detail"].as_str().unwrap().starts_with(
            "too_few_examples: demo.toml declares 0 examples, and the gate set requires at least 1"
        ),
        "{contract}"
    );
    for (gate, passed) in statuses(&run) {
        if gate != "contract" {
            assert_eq!(passed, "passed", "{gate}");
        }
    }

    let gates = root.join("policies/gates.toml");
    let text = std::fs::read_to_string(&gates).unwrap();
    let misplaced = text.replacen(
        "kind = \"invariant\"\n",
        "kind = \"invariant\"\nmin_examples = 2\n",
        1,
    );
    assert_ne!(misplaced, text);
    std::fs::write(&gates, misplaced).unwrap();
    let out = kavi(root, &["pipeline", "check", "verify"]);
    assert_ne!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`min_examples` applies to a contract gate only")
            && stderr.contains("policies/gates.toml:"),
        "{stderr}"
    );
}

/// A kavi killed while the contract gate runs an example leaves the example's scratch
/// workspace; it is in the owner's roster from the moment it is made, so the next kavi removes
/// it.
#[test]
fn a_killed_contract_runs_scratch_workspace_is_removed_by_the_next_kavi() {
    if !common::isolation_or_skip() {
        return;
    }
    let skill = skill_whose_program("    import time\n\n    time.sleep(120)\n");
    let dir = workspace_proposing(&skill, TEST, RUNS_SKILL);
    let root = dir.path();
    let sandboxes = root.join("sandboxes");
    let mut running = common::kavi_command(root, &["pipeline", "run", "verify"])
        .env("KAVI_SANDBOXES", &sandboxes)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let scratch = loop {
        let listed = common::roster_folders(root).into_iter().find(|f| {
            f.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("kavi-tmp-contract-")
        });
        if let Some(folder) = listed {
            break folder;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the contract's scratch workspace was never written in the roster: {:?}",
            std::fs::read_dir(&sandboxes).map(|d| d.count())
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    running.kill().unwrap(); // SIGKILL: no chance to clean up
    running.wait().unwrap();
    assert!(scratch.is_dir(), "{}", scratch.display());
    // Killed as it starts the example, kavi may leave a child between fork and exec that still
    // shares its lock for a moment; until that child execs, the owner is not dead, and recovery
    // rightly leaves its folders alone. The next kavi is run once the lock is free.
    let lock = std::fs::read_dir(root.join(".kavi/ledger.locks"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.extension().is_some_and(|e| e == "lock"))
        .expect("the killed kavi's owner lock");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::File::open(&lock).unwrap().try_lock().is_err() {
        assert!(std::time::Instant::now() < deadline, "the lock stays held");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(kavi(root, &["runs", "list"]).status.success());
    assert!(!scratch.exists(), "left behind: {}", scratch.display());
}

/// An example that does not match the proposal's own schemas is refused when the proposal is
/// recorded, and the error points at it.
#[test]
fn an_example_outside_the_declared_schemas_is_refused_at_proposal() {
    let dir = workspace(SKILL, TEST);
    let root = dir.path();
    std::fs::write(
        root.join("other.toml"),
        "name = \"other\"\ndescription = \"Count\"\nside_effect = \"READ_ONLY\"\n\
command = [\"python3\"]\ninput_schema = { type = \"object\" }\n\
output_schema = { type = \"object\", required = [\"words\"] }\n\n\
[[examples]]\ninput = { text = \"a\" }\noutput = { lines = 1 }\n",
    )
    .unwrap();
    let out = kavi(root, &["skill", "propose", "other.toml"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("example 1: the output does not match the output schema"),
        "{stderr}"
    );
    assert!(stderr.contains("other.toml:8:"), "{stderr}");
}

/// kavi provisions only the locked set: a wheel whose hash is not the lock's is refused by pip
/// (`--require-hashes`), and a lock made for other pins is refused before pip runs, saying to
/// lock again. Nothing is left provisioned either way.
#[test]
fn a_tampered_or_stale_lock_makes_provisioning_fail_with_a_clear_error() {
    let dir = workspace(SKILL, TEST);
    let root = dir.path();
    let install = |cache: &std::path::Path| {
        common::kavi_command(root, &["toolchain", "install", "secrets"])
            .env("KAVI_TOOLCHAINS", cache)
            .output()
            .unwrap()
    };
    let lock = root.join("policies/toolchains.lock");
    let locked = std::fs::read_to_string(&lock).unwrap();
    // The first hash of the `secrets` toolchain, one digit changed.
    let entry = locked.find("[toolchain.secrets]").unwrap();
    let at = entry + locked[entry..].find("sha256 = \"").unwrap() + "sha256 = \"".len();
    let digit = if &locked[at..=at] == "0" { "1" } else { "0" };
    let tampered = format!("{}{digit}{}", &locked[..at], &locked[at + 1..]);
    std::fs::write(&lock, &tampered).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let out = install(cache.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("could not provision toolchain `secrets`")
            && stderr.contains("pip could not install the locked set")
            && stderr.contains("DO NOT MATCH THE HASHES"),
        "{stderr}"
    );
    let listed = common::kavi_command(root, &["toolchain", "list", "--json"])
        .env("KAVI_TOOLCHAINS", cache.path())
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[1]["state"], "not provisioned", "{listed}");

    // The lock as made, but the pin moved on since: refused before pip runs.
    std::fs::write(&lock, &locked).unwrap();
    let toolchains = root.join("policies/toolchains.toml");
    let declared = std::fs::read_to_string(&toolchains).unwrap();
    std::fs::write(
        &toolchains,
        declared.replace("detect-secrets = \"1.5.0\"", "detect-secrets = \"1.4.0\""),
    )
    .unwrap();
    let out = install(cache.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains(
            "toolchain `secrets`: policies/toolchains.lock was locked for other pins than it \
             declares; run `kavi toolchain lock`"
        ),
        "{stderr}"
    );
}

/// Each gate result names the locked set its tool was installed from, and `kavi skill show`
/// shows it.
#[test]
fn each_verification_records_the_hash_of_the_lock_its_tools_came_from() {
    let dir = workspace(SKILL, TEST);
    let root = dir.path();
    assert_eq!(run_verify(root), Some(0));
    let run = last_run(root);
    let lint = verification(&run, "lint");
    let lock = lint["tool"]["lock"].as_str().unwrap();
    assert!(lock.starts_with("sha256:") && lock.len() == 71, "{lint}");
    let shown = kavi(root, &["skill", "show", "demo", "--json"]);
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let python = shown["toolchains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["toolchain"] == "python")
        .unwrap();
    assert_eq!(python["lock"], lock);
    let text = String::from_utf8_lossy(&kavi(root, &["skill", "show", "demo"]).stdout).into_owned();
    assert!(
        text.contains(&format!("toolchain    python lock {lock}")),
        "{text}"
    );
}

/// With `line_coverage` in the test gate's `junit`, a function no test calls fails the gate,
/// naming its lines, where `branch_coverage` alone passes it (it has no branch to leave untaken).
#[test]
fn a_line_coverage_threshold_fails_code_no_test_runs() {
    let skill = "import json\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\n\
def run(data: Any) -> dict[str, Any]:\n    return {'echo': json.loads(json.dumps(data))}\n\n\n\
def backdoor(data: Any) -> dict[str, Any]:\n    return {'echo': None}\n";
    let dir = workspace(skill, TEST);
    let root = dir.path();
    let gates = root.join("policies/gates.toml");
    let shipped = std::fs::read_to_string(&gates).unwrap();
    let junit = "junit = { min_tests = 1, allow_skipped = 0 }";
    let with = |thresholds: &str| {
        std::fs::write(
            &gates,
            shipped.replace(
                junit,
                &format!("junit = {{ min_tests = 1, allow_skipped = 0, {thresholds} }}"),
            ),
        )
        .unwrap();
    };
    with("branch_coverage = 100");
    assert_eq!(run_verify(root), Some(0));
    with("branch_coverage = 100, line_coverage = 100");
    let (status, detail) = gate_of(root, "tests");
    assert_eq!(status, "failed");
    assert!(
        // The workspace's `echo.py`, which no test imports, is measured too.
        detail.starts_with(
            "line_coverage: the tests ran 6 of 10 lines (60%), the policy requires 100%; \
             never run: skills/demo/echo.py:1, skills/demo/echo.py:2, skills/demo/echo.py:4, \
             skills/demo/skill.py:12 "
        ),
        "{detail}"
    );
}

/// With `branch_coverage` in the test gate's `junit`, tests that pass but never take a branch
/// fail the gate, naming the branch; a `.coveragerc` in the skill's folder changes nothing; off
/// (as shipped), the same skill passes.
#[test]
fn a_branch_coverage_threshold_fails_tests_that_leave_a_branch_untaken() {
    let skill = "import json\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\n\
def run(data: Any) -> dict[str, Any]:\n    if data == 'hidden':\n        return {'echo': None}\n    \
return {'echo': json.loads(json.dumps(data))}\n";
    let dir = workspace(skill, TEST);
    let root = dir.path();
    // Shipped: coverage is off.
    assert_eq!(run_verify(root), Some(0));
    let gates = root.join("policies/gates.toml");
    let shipped = std::fs::read_to_string(&gates).unwrap();
    let junit = "junit = { min_tests = 1, allow_skipped = 0 }";
    assert!(shipped.contains(junit));
    std::fs::write(
        &gates,
        shipped.replace(
            junit,
            "junit = { min_tests = 1, allow_skipped = 0, branch_coverage = 100 }",
        ),
    )
    .unwrap();
    // A configuration of the skill's own that would exclude the branch is not read.
    std::fs::write(
        root.join("skills/demo/.coveragerc"),
        "[report]\nexclude_lines =\n    if data\n[run]\nbranch = False\n",
    )
    .unwrap();
    let (status, detail) = gate_of(root, "tests");
    assert_eq!(status, "failed");
    assert!(
        detail.starts_with(
            "branch_coverage: the tests took 1 of 2 branches (50%), the policy requires 100%; \
             never taken: skills/demo/skill.py:8->9"
        ),
        "{detail}"
    );
    // Tested both ways, it passes and records the branches.
    std::fs::write(
        root.join("skills/demo/test_skill.py"),
        format!("{TEST}\n    def test_hidden(self) -> None:\n        self.assertEqual(run('hidden'), {{'echo': None}})\n"),
    )
    .unwrap();
    assert_eq!(run_verify(root), Some(0));
    let run = last_run(root);
    assert_eq!(
        verification(&run, "tests")["detail"],
        "2 collected, 2 ran: 2 passed, 0 failed, 0 errors, 0 skipped; 2 of 2 branches taken"
    );
}

/// The detail of gate `gate` in `run`, after checking the gate ended in an error (its tool did
/// not run), never passed or failed.
fn error_detail<'a>(run: &'a Value, gate: &str) -> &'a str {
    let result = verification(run, gate);
    assert_eq!(result["status"], "error", "{gate}: {result}");
    result["detail"].as_str().unwrap()
}
