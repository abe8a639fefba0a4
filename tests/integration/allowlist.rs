//! What a builder and a skill read of the workspace is an allowlist: the files git tracks or
//! would track. A credential file git ignores reaches neither, whatever its name.

use std::path::Path;

use crate::common::{self, json, kavi};
use crate::trust::{PROPOSAL, TEST, verify_and_promote, workspace_with};

/// Makes `root` a repository (real git) that ignores `.my.cnf` and `sub/.netrc`, holding both
/// (ignored), `tracked.txt` (committed) and `untracked.txt` (neither committed nor ignored).
fn with_ignored_credentials(root: &Path) {
    let gitignore = root.join(".gitignore");
    let mut rules = std::fs::read_to_string(&gitignore).unwrap_or_default();
    rules.push_str(".kavi/\n.my.cnf\nsub/.netrc\n");
    std::fs::write(&gitignore, rules).unwrap();
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join(".my.cnf"), "[client]\npassword=canary-mycnf\n").unwrap();
    std::fs::write(root.join("sub/.netrc"), "machine x password canary-netrc\n").unwrap();
    std::fs::write(root.join("tracked.txt"), "tracked\n").unwrap();
    for args in [
        &["init", "-q"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "one",
        ],
    ] {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(root)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::write(root.join("untracked.txt"), "untracked\n").unwrap();
}

/// The builder's sandbox holds the tracked and untracked files, never the ignored ones.
#[test]
fn an_ignored_credential_file_never_reaches_the_builder() {
    if !common::isolation_or_skip() {
        return;
    }
    let seen = "ls -a . sub > /dev/null; for f in .my.cnf sub/.netrc tracked.txt untracked.txt; do \
                test -e $f && echo \"present $f\" || echo \"absent $f\"; done; cat .my.cnf sub/.netrc 2>/dev/null";
    let dir = crate::sandbox::workspace(seen, false);
    let root = dir.path();
    with_ignored_credentials(root);
    let out = kavi(root, &["pipeline", "run", "build"]);
    let shown = kavi(root, &["runs", "logs", "latest", "build"]);
    let log = String::from_utf8_lossy(&shown.stdout);
    assert!(
        log.contains("present tracked.txt") && log.contains("present untracked.txt"),
        "{log}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        log.contains("absent .my.cnf") && log.contains("absent sub/.netrc"),
        "{log}"
    );
    assert!(!log.contains("canary"), "{log}");
}

/// `demo`, reading the workspace's files from where it runs.
const SKILL: &str = "import json\nimport pathlib\nimport sys\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: Any) -> dict[str, Any]:\n    return {'echo': data}\n\n\ndef seen(path: str) -> str | None:\n    file = pathlib.Path(path)\n    try:\n        return file.read_text() if file.exists() else None\n    except OSError as error:\n        return type(error).__name__\n\n\nif __name__ == '__main__':\n    out = run(json.load(sys.stdin))\n    out['seen'] = {p: seen(p) for p in ['.my.cnf', 'sub/.netrc', 'tracked.txt', 'untracked.txt']}\n    print(json.dumps(out))\n";

/// A READ_ONLY skill that opens the ignored files finds nothing there; the tracked and the
/// untracked file it reads.
#[test]
fn an_ignored_credential_file_is_not_in_a_skills_view() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = workspace_with(PROPOSAL, SKILL, TEST);
    let root = dir.path();
    with_ignored_credentials(root);
    verify_and_promote(root);
    let ran = kavi(root, &["skill", "run", "demo", "--input", "{}"]);
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let record = json(&ran);
    let seen = &record["output"]["seen"];
    assert_eq!(seen["tracked.txt"], "tracked\n", "{record}");
    assert_eq!(seen["untracked.txt"], "untracked\n", "{record}");
    assert_eq!(seen[".my.cnf"], serde_json::Value::Null, "{record}");
    assert_eq!(seen["sub/.netrc"], serde_json::Value::Null, "{record}");
    assert_eq!(
        record["confinement"]["isolation"]["workspace"],
        "only the files git tracks or would track: an ignored file is not there"
    );
}
