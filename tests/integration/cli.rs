//! CLI scenarios pinned with trycmd: `tests/cmd/*.toml` (one command each) and `tests/cmd/*.md`
//! (stories). Refresh expected output with `TRYCMD=overwrite cargo test --test integration cli::`, then read
//! the diff (and restore the `[..]` redactions) before committing it.

use crate::common;

use std::path::Path;

/// The forge and chain stories run against the shipped workspace itself, copied fresh into
/// their fixture folders, so the scenarios always exercise what ships (the folders are
/// git-ignored).
fn prepare_shipped_fixture(story: &str) -> std::path::PathBuf {
    let fixture = common::repo().join(format!("tests/cmd/{story}.in"));
    let _ = std::fs::remove_dir_all(&fixture);
    common::copy_shipped_workspace(&fixture);
    fixture
}

#[test]
fn cli_scenarios() {
    prepare_shipped_fixture("forge");
    prepare_shipped_fixture("adopt");
    prepare_shipped_fixture("review");
    // Two workspaces side by side: one exports a skill, the other imports it.
    let bundle = common::repo().join("tests/cmd/bundle.in");
    let _ = std::fs::remove_dir_all(&bundle);
    common::copy_shipped_workspace(&bundle.join("a"));
    common::copy_shipped_workspace(&bundle.join("b"));
    let chain = prepare_shipped_fixture("chain");
    std::fs::create_dir_all(chain.join("notes")).unwrap();
    std::fs::write(
        chain.join("notes/kavi.md"),
        "# About kavi\n\nKavi runs governed pipelines.\n",
    )
    .unwrap();
    let chat = prepare_shipped_fixture("chat");
    std::fs::create_dir_all(chat.join("notes")).unwrap();
    std::fs::write(
        chat.join("notes/kavi.md"),
        "# About kavi\n\nKavi runs governed pipelines.\n",
    )
    .unwrap();
    std::fs::write(chat.join("notes/other.md"), "# Other\n\nGoverned too.\n").unwrap();
    // The stories' failed attempts keep their sandboxes (policies/sandbox.toml), and their
    // ledgers are made anew each time, so nothing would sweep them: they get a folder of their
    // own under target/, emptied here.
    let sandboxes = Path::new(env!("CARGO_TARGET_TMPDIR")).join("trycmd-sandboxes");
    let _ = std::fs::remove_dir_all(&sandboxes);
    // The stories show runs, not an install: the toolchains are provisioned before they start.
    let installed = common::kavi(
        &common::repo().join("tests/cmd/forge.in"),
        &["toolchain", "install"],
    );
    assert!(
        installed.status.success(),
        "{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    // Stories change files between steps with `sh`, as a user would with an editor, and pipe
    // into kavi with it: the kavi under test comes first on its PATH.
    let kavi_dir = Path::new(env!("CARGO_BIN_EXE_kavi")).parent().unwrap();
    let path = std::env::join_paths(std::iter::once(kavi_dir.to_owned()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    trycmd::TestCases::new()
        .env("PATH", path.to_string_lossy())
        .env("KAVI_SANDBOXES", sandboxes.display().to_string())
        .env(
            "KAVI_TOOLCHAINS",
            common::toolchains().display().to_string(),
        )
        .env(
            "XDG_CONFIG_HOME",
            common::config_home().display().to_string(),
        )
        .env("XDG_CACHE_HOME", common::cache_home().display().to_string())
        .register_bin("sh", Path::new("/bin/sh"))
        .case("tests/cmd/*.toml")
        .case("tests/cmd/*.md");
}

/// Completions and the man page describe kavi itself: they need no workspace, even a broken one,
/// and the bash script is valid bash.
#[test]
fn completions_and_the_man_page_cover_every_command_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kavi.toml"), "jobs = \"not a number\"\n").unwrap();
    let script = common::kavi(dir.path(), &["completions", "bash"]);
    assert!(
        script.status.success(),
        "{}",
        String::from_utf8_lossy(&script.stderr)
    );
    let mut bash = std::process::Command::new("bash")
        .arg("-n")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(bash.stdin.as_mut().unwrap(), &script.stdout).unwrap();
    assert!(bash.wait().unwrap().success(), "bash rejects the script");
    let man = common::kavi(dir.path(), &["man"]);
    assert!(man.status.success());
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(
        page.contains(".TH kavi 1") && page.contains("kavi\\-policy"),
        "{page}"
    );
    // With --dir, a page per command: every page one of them names is there.
    let pages = dir.path().join("man1");
    std::fs::create_dir(&pages).unwrap();
    let written = common::kavi(dir.path(), &["man", "--dir", pages.to_str().unwrap()]);
    assert!(written.status.success(), "{written:?}");
    let mut named = 0;
    for entry in std::fs::read_dir(&pages).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for (at, _) in text.match_indices("(1)") {
            let start = text[..at].rfind(char::is_whitespace).map_or(0, |i| i + 1);
            let page = text[start..at].replace("\\-", "-");
            if page.starts_with("kavi") {
                named += 1;
                assert!(pages.join(format!("{page}.1")).is_file(), "no page {page}");
            }
        }
    }
    assert!(named > 10, "the pages name {named} others");
    assert!(pages.join("kavi.1").is_file() && pages.join("kavi-pipeline-run.1").is_file());
}

/// What a real bash completes, with the script `kavi completions bash` prints sourced and the
/// `kavi` under test on PATH: commands, and the workspace's pipelines, a named pipeline's nodes,
/// its skills, its runs and a named run's nodes.
#[test]
fn bash_completes_commands_and_the_workspaces_names() {
    let workspace = common::shipped_workspace();
    let root = workspace.path();
    let ran = common::kavi(root, &["pipeline", "run", "diamond.toml"]);
    assert!(ran.status.success(), "{ran:?}");
    let script = String::from_utf8(common::kavi(root, &["completions", "bash"]).stdout).unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_kavi"))
        .parent()
        .unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    // The words typed, the last one the word under the cursor, as bash hands them over.
    let complete = |words: &[&str]| -> Vec<String> {
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let call = format!(
            "{script}\nCOMP_WORDS=({}); COMP_CWORD={}; COMP_TYPE=9\n\
             _clap_complete_kavi kavi \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            quoted.join(" "),
            words.len() - 1
        );
        let out = common::with_test_env(std::process::Command::new("bash"), root, &["-c", &call])
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(complete(&["kavi", "pipel"]), ["pipeline"]);
    let pipelines = complete(&["kavi", "pipeline", "run", ""]);
    for shipped in ["diamond.toml", "forge.toml", "import.toml"] {
        assert!(pipelines.iter().any(|p| p == shipped), "{pipelines:?}");
    }
    assert_eq!(
        complete(&["kavi", "pipeline", "run", "fo"]),
        ["forge.toml", "forge_attempt.toml"]
    );
    assert_eq!(
        complete(&["kavi", "pipeline", "run", "forge.toml", "--rerun", "a"]),
        ["attempt"]
    );
    assert_eq!(complete(&["kavi", "skill", "show", "word"]), ["word_count"]);
    assert_eq!(complete(&["kavi", "runs", "show", "1"]), ["1"]);
    // An empty word: the run's nodes, then the flags.
    assert_eq!(
        complete(&["kavi", "runs", "logs", "1", ""])[..4],
        ["a", "b", "c", "d"]
    );
}

/// In a folder where nothing has run, and with no policies, reading commands say so and leave
/// nothing behind; the ones that need no policy work without one, and `kavi mcp` and `kavi
/// serve`, which serve a workspace, refuse a folder that is none.
#[test]
fn reading_commands_never_make_a_ledger() {
    let dir = tempfile::tempdir().unwrap();
    for (args, code, says) in [
        (vec!["runs", "list"], 0, "no runs yet"),
        (vec!["skill", "list"], 0, "no trusted skills yet"),
        (vec!["runs", "show", "1"], 5, "no ledger at"),
        (vec!["spec", "show", "sha256:00"], 5, "no ledger at"),
        (vec!["builds", "list", "demo"], 5, "no ledger at"),
        (vec!["skill", "show", "demo"], 5, "no ledger at"),
        (vec!["policy", "diff", "1"], 5, "no ledger at"),
        (vec!["ledger", "verify"], 5, "no ledger at"),
        (vec!["skill", "verify"], 0, "no trusted skills"),
        (
            vec!["skill", "run", "demo", "--input", "{}"],
            5,
            "no skill `demo`",
        ),
        (vec!["executions", "tail"], 0, "no executions"),
        (vec!["gc", "--dry-run"], 0, "nothing recorded"),
        (vec!["gc"], 0, "nothing recorded"),
        (vec!["doctor"], 0, "none yet at"),
        (
            vec!["mcp"],
            4,
            "is not a kavi workspace (no kavi.toml there or above)",
        ),
        (
            vec!["serve", "--port", "0"],
            4,
            "is not a kavi workspace (no kavi.toml there or above)",
        ),
    ] {
        let out = common::kavi(dir.path(), &args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "reading left {left:?}");
}

/// `kavi init` never overwrites a workspace, nor a folder holding any file it would write.
/// (That the workspace it writes works is the README tour's test.)
#[test]
fn init_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let made = common::kavi(dir.path(), &["init", "ws"]);
    assert!(made.status.success());
    let ws = dir.path().join("ws");
    for file in [
        "kavi.toml",
        "pipelines/forge.toml",
        "policies/toolchains.toml",
        "builders/scripted.py",
        "docs/schemas/pipeline.json",
        ".gitignore",
    ] {
        assert!(ws.join(file).is_file(), "{file} was not written");
    }
    let again = common::kavi(&ws, &["init"]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("is a kavi workspace already"));
    let partial = dir.path().join("partial");
    std::fs::create_dir_all(partial.join("policies")).unwrap();
    std::fs::write(partial.join("policies/gates.toml"), "# mine\n").unwrap();
    let refused = common::kavi(dir.path(), &["init", "partial"]);
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        std::fs::read_to_string(partial.join("policies/gates.toml")).unwrap(),
        "# mine\n"
    );
    assert!(!partial.join("kavi.toml").exists());
}

/// An existing `.gitignore` keeps its lines and gets only what kavi needs ignored; init says
/// what it added.
#[test]
fn init_merges_into_an_existing_gitignore() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join(".gitignore"), "target/\n.kavi/").unwrap();
    let made = common::kavi(dir.path(), &["init", "ws"]);
    assert!(made.status.success());
    let stdout = String::from_utf8_lossy(&made.stdout);
    assert!(
        stdout.contains(".gitignore (kept, with /skills/ added)"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(ws.join(".gitignore")).unwrap();
    assert!(text.starts_with("target/\n.kavi/\n"), "{text}");
    assert_eq!(text.matches(".kavi/").count(), 1, "{text}");
    assert!(text.ends_with("\n/skills/\n"), "{text}");
}

/// `--json` on each check command: the verdict on stdout, and each problem with the place the
/// text points at (file, line, column, end) and its help; the exit code is the text's.
#[test]
fn every_check_command_reports_its_problems_as_json() {
    let dir = common::shipped_workspace();
    let root = dir.path();
    let json = |args: &[&str]| {
        let out = common::kavi(root, args);
        let value: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), value)
    };
    for args in [
        &["pipeline", "check", "forge", "--json"][..],
        &["chain", "check", "search_and_summarize", "--json"],
        &["policy", "check", "--json"],
    ] {
        let (code, value) = json(args);
        assert_eq!(code, Some(0), "{args:?}: {value}");
        assert_eq!(value["ok"], true, "{args:?}: {value}");
        assert_eq!(value["problems"], serde_json::json!([]), "{args:?}");
    }
    let chain = root.join("chains/search_and_summarize.toml");
    let text = std::fs::read_to_string(&chain).unwrap();
    std::fs::write(&chain, text.replace("stop_on_failure", "stop_on_failur")).unwrap();
    let line = text
        .lines()
        .position(|l| l.starts_with("stop_on_failure"))
        .unwrap()
        + 1;
    let expected = serde_json::json!({
        "message": "unknown field `stop_on_failur`, expected one of `name`, `description`, `stop_on_failure`",
        "file": "chains/search_and_summarize.toml",
        "line": line,
        "column": 1,
        "end_line": line,
        "end_column": 15,
        "help": "did you mean `stop_on_failure`?",
    });
    let (code, value) = json(&["chain", "check", "search_and_summarize", "--json"]);
    assert_eq!(code, Some(3), "{value}");
    assert_eq!(value["ok"], false);
    assert_eq!(value["problems"], serde_json::json!([expected]));
    let (code, value) = json(&["policy", "check", "--json"]);
    assert_eq!(code, Some(3), "{value}");
    assert!(
        value["problems"].as_array().unwrap().contains(&expected),
        "{value}"
    );
    // A problem of no file has no place, and keeps its exit code.
    let (code, value) = json(&["pipeline", "check", "nosuch", "--json"]);
    assert_eq!(code, Some(5), "{value}");
    assert_eq!(value["problems"][0]["file"], serde_json::Value::Null);
    assert!(
        value["problems"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("pipeline `nosuch` not found"),
        "{value}"
    );
}

/// `pipeline run --junit FILE` writes the run as JUnit XML in nextest's shape: a suite for the
/// run, a case per node; a failed node is a failure, a retried one that passed is flaky, and a
/// skipped or blocked node is skipped, never passed.
#[test]
fn a_run_is_written_as_junit_xml() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("pipelines")).unwrap();
    std::fs::write(
        root.join("pipelines/checks.toml"),
        r#"[pipeline]
name = "checks"

[nodes.lint]
kind = "exec"
run = ["true"]

[nodes.flaky]
kind = "exec"
shell = "test -f tried || { touch tried; exit 1; }"
retry = { attempts = 2 }

[nodes.tests]
kind = "exec"
shell = "echo 'expected <3> & got 4' >&2; exit 1"
needs = ["lint"]

[nodes.deploy]
kind = "exec"
run = ["true"]
needs = ["tests"]

[nodes.docs]
kind = "exec"
run = ["true"]
when = "false"
"#,
    )
    .unwrap();
    let out = common::kavi(
        root,
        &["pipeline", "run", "checks", "--junit", "report.xml"],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let xml = std::fs::read_to_string(root.join("report.xml")).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap_or_else(|e| panic!("{e}: {xml}"));
    let suites = doc.root_element();
    assert_eq!(suites.tag_name().name(), "testsuites", "{xml}");
    let suite = suites
        .children()
        .find(|n| n.has_tag_name("testsuite"))
        .unwrap();
    assert_eq!(suite.attribute("name"), Some("checks"));
    assert_eq!(suite.attribute("tests"), Some("5"), "{xml}");
    assert_eq!(suite.attribute("failures"), Some("1"), "{xml}");
    assert_eq!(suite.attribute("skipped"), Some("2"), "{xml}");
    let case = |name: &str| {
        suite
            .children()
            .find(|n| n.has_tag_name("testcase") && n.attribute("name") == Some(name))
            .unwrap_or_else(|| panic!("no test case {name}: {xml}"))
    };
    let child = |name: &str, tag: &str| case(name).children().find(|n| n.has_tag_name(tag));
    assert_eq!(case("lint").attribute("classname"), Some("checks.exec"));
    assert!(case("lint").children().all(|n| !n.is_element()), "{xml}");
    let failure = child("tests", "failure").unwrap_or_else(|| panic!("{xml}"));
    assert_eq!(failure.attribute("type"), Some("failed"));
    // Escaped in the file, the node's own words come back as it wrote them.
    assert_eq!(
        child("tests", "system-err").and_then(|n| n.text()),
        Some("expected <3> & got 4\n"),
        "{xml}"
    );
    assert!(child("flaky", "flakyFailure").is_some(), "{xml}");
    assert!(child("flaky", "failure").is_none(), "{xml}");
    assert_eq!(
        child("deploy", "skipped").unwrap().attribute("type"),
        Some("blocked")
    );
    assert_eq!(
        child("docs", "skipped").unwrap().attribute("type"),
        Some("skipped")
    );
}

/// `kavi --version` names the build, as nextest's does: the commit and its date (this is a git
/// checkout, so it is known), the profile and the features.
#[test]
fn the_version_names_the_commit_the_profile_and_the_features() {
    let out = common::kavi(common::repo(), &["--version"]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let build = stdout
        .trim_end()
        .strip_prefix(concat!("kavi ", env!("CARGO_PKG_VERSION"), " ("))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{stdout}"));
    let parts: Vec<&str> = build.split(", ").collect();
    assert_eq!(parts.len(), 3, "{stdout}");
    let (commit, date) = parts[0].split_once(' ').unwrap();
    if common::repo().join(".git").exists() {
        assert_eq!(commit.len(), 12, "{stdout}");
        assert!(commit.chars().all(|c| c.is_ascii_hexdigit()), "{stdout}");
        assert_eq!(date.len(), "2026-01-01".len(), "{stdout}");
    }
    assert!(["debug", "release"].contains(&parts[1]), "{stdout}");
    assert_eq!(parts[2], "features: none", "{stdout}");
}

/// Run from a folder in no workspace, a pipeline named by its path runs in the workspace it is
/// in, or is refused when it is in none: the current folder never gets a ledger it did not ask
/// for.
#[test]
fn a_pipeline_run_from_outside_any_workspace_uses_the_file_s_or_refuses() {
    let elsewhere = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    std::fs::create_dir(project.path().join("pipelines")).unwrap();
    let file = project.path().join("pipelines/hello.toml");
    std::fs::write(
        &file,
        "[pipeline]\nname = \"hello\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n",
    )
    .unwrap();
    let run = || {
        common::kavi(
            elsewhere.path(),
            &["pipeline", "run", file.to_str().unwrap()],
        )
    };
    let refused = run();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is in no workspace"), "{stderr}");
    assert!(!elsewhere.path().join(".kavi").exists());
    assert!(!project.path().join(".kavi").exists());

    std::fs::write(project.path().join("kavi.toml"), "").unwrap();
    let ran = run();
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert!(ran.status.success(), "{stderr}");
    assert!(stderr.contains("running in "), "{stderr}");
    // Its state (the artifact store, and the ledger on SQLite) is the project's.
    assert!(project.path().join(".kavi").is_dir());
    assert!(!elsewhere.path().join(".kavi").exists());
}

/// The forge of a skill with no proposal is refused before a run is recorded (exit 5), naming
/// the file once, with the proposals there are and the one it probably meant (the usual cause is
/// a mistyped name).
#[test]
fn forging_a_skill_with_no_proposal_names_the_ones_there_are() {
    let dir = common::shipped_workspace();
    let out = common::kavi(
        dir.path(),
        &["pipeline", "run", "forge.toml", "--set", "skill=word_cuont"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(
        stderr.contains(
            "parameter `skill` is `word_cuont`: node `propose` reads proposals/word_cuont.toml, \
             which does not exist; nothing was run\n  = help: did you mean `--set \
             skill=word_count`?\n  = help: `skill` names a file for each of: find_notes, \
             summarize_note, word_count, write_note\n"
        ),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("proposals/word_cuont.toml").count(),
        1,
        "{stderr}"
    );
    let runs = common::kavi(dir.path(), &["runs", "list", "--json"]);
    assert_eq!(String::from_utf8_lossy(&runs.stdout).trim(), "[]");
}

/// `-v`/`-q` set how much the log on stderr says (RUST_LOG unset), and `--color` whether it
/// and clap's usage errors are coloured: never off a terminal unless `always` is asked for.
#[test]
fn verbosity_and_colour_are_the_operator_s_to_choose() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("pipelines")).unwrap();
    std::fs::write(
        root.join("pipelines/hello.toml"),
        "[pipeline]\nname = \"hello\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n",
    )
    .unwrap();
    let stderr = |args: &[&str]| {
        let out = common::kavi(root, args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    const ESCAPE: &str = "\u{1b}[";
    let (code, quiet) = stderr(&["pipeline", "run", "hello"]);
    assert_eq!(code, Some(0), "{quiet}");
    assert!(!quiet.contains("DEBUG"), "{quiet}");
    let (_, verbose) = stderr(&["-vv", "pipeline", "run", "hello"]);
    assert!(verbose.contains(" DEBUG "), "{verbose}");
    assert!(!verbose.contains(ESCAPE), "{verbose}");
    let (_, coloured) = stderr(&["-vv", "--color", "always", "pipeline", "run", "hello"]);
    assert!(coloured.contains(ESCAPE), "{coloured}");
    let (code, both) = stderr(&["-q", "-v", "pipeline", "run", "hello"]);
    assert_eq!(code, Some(2), "{both}");
    let (code, plain) = stderr(&["--color=never", "pipeline", "chek"]);
    assert_eq!(code, Some(2), "{plain}");
    assert!(
        plain.contains("unrecognized subcommand") && !plain.contains(ESCAPE),
        "{plain}"
    );
    let (_, coloured) = stderr(&["--color=always", "pipeline", "chek"]);
    assert!(coloured.contains(ESCAPE), "{coloured}");
}

/// The README's tour runs as written, top to bottom, from `kavi init` in an empty folder:
/// every command exits 0, or the code its comment ends with (`(exit 6)`). Its pipeline example
/// is the shipped `pipelines/diamond.toml`, byte for byte.
#[test]
fn the_readme_tour_runs_as_written() {
    let readme = std::fs::read_to_string(common::repo().join("README.md")).unwrap();
    let tour = readme
        .split("## A short tour")
        .nth(1)
        .and_then(|rest| rest.split("```console\n").nth(1))
        .and_then(|block| block.split("```").next())
        .expect("the README has a tour");
    let example = readme
        .split("```toml\n")
        .nth(1)
        .and_then(|block| block.split("```").next())
        .expect("the README shows a pipeline");
    assert_eq!(
        example,
        std::fs::read_to_string(common::repo().join("pipelines/diamond.toml")).unwrap()
    );

    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_kavi")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let expected_code = regex::Regex::new(r"\(exit (\d+)\)\s*$").unwrap();
    let mut cwd = dir.path().to_owned();
    for line in tour.lines() {
        let command = line
            .strip_prefix("$ ")
            .expect("every tour line is a command");
        if let Some(folder) = command.strip_prefix("cd ") {
            cwd = cwd.join(folder.trim());
            continue;
        }
        let code = expected_code
            .captures(command)
            .map_or(0, |found| found[1].parse().unwrap());
        let out = std::process::Command::new("sh")
            .args(["-c", command])
            .current_dir(&cwd)
            .env("PATH", &path)
            .env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", common::config_home())
            .env_remove("KAVI_KEYS")
            .env_remove("RUST_LOG")
            .env("KAVI_SANDBOXES", common::sandboxes())
            .env("KAVI_TOOLCHAINS", common::toolchains())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "`{command}`:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let trusted = common::json(&common::kavi(
        &cwd,
        &["skill", "show", "write_note", "--json"],
    ));
    assert_eq!(
        trusted["skill"]["state"], "TRUSTED",
        "approve resumed the forge"
    );
}
