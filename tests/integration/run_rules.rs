//! The rules a skill runs under outside a pipeline run (`kavi skill run`, `kavi mcp`, the
//! executor's client): never a weakening on disk nobody adopted, never an executor or a state
//! folder of another account's.

use std::path::Path;

use serde_json::Value;

use crate::common::{self, json, kavi};
use crate::trust::{PROPOSAL, TEST, verify_and_promote, workspace_with};

/// `demo` as trust's tests have it, printing also what it reads at the workspace's `.env`.
const SKILL: &str = "import json\nimport pathlib\nimport sys\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: Any) -> dict[str, Any]:\n    return {'echo': data}\n\n\ndef seen(path: str) -> str | None:\n    file = pathlib.Path(path)\n    try:\n        return file.read_text() if file.exists() else None\n    except OSError as error:\n        return type(error).__name__\n\n\nif __name__ == '__main__':\n    out = run(json.load(sys.stdin))\n    out['env'] = seen('.env')\n    print(json.dumps(out))\n";

/// `demo` trusted, its rules adopted on first use by the pipeline that promoted it.
fn trusted() -> tempfile::TempDir {
    let dir = workspace_with(PROPOSAL, SKILL, TEST);
    verify_and_promote(dir.path());
    dir
}

fn run_demo(root: &Path) -> (Value, String) {
    let ran = kavi(root, &["skill", "run", "demo", "--input", "{\"x\": 1}"]);
    let stderr = String::from_utf8_lossy(&ran.stderr).into_owned();
    assert!(ran.status.success(), "{stderr}");
    (json(&ran), stderr)
}

/// `policies/confinement.toml` with the READ_ONLY profile's hidden globs emptied: what
/// `kavi policy diff` calls weakening.
pub(crate) fn unhide_everything(root: &Path) {
    let path = root.join("policies/confinement.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("[read_only]").unwrap();
    let line = start + text[start..].find("hide_matching").unwrap();
    let end = line + text[line..].find('\n').unwrap();
    std::fs::write(
        &path,
        format!("{}hide_matching = []{}", &text[..line], &text[end..]),
    )
    .unwrap();
    let diff = kavi(root, &["policy", "diff"]);
    assert!(
        String::from_utf8_lossy(&diff.stdout).contains("weakening"),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
}

#[test]
fn a_weakened_confinement_nobody_adopted_does_not_govern_a_skill_run() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = trusted();
    let root = dir.path();
    std::fs::write(root.join(".env"), "SECRET=canary\n").unwrap();
    let (before, _) = run_demo(root);
    assert_ne!(before["output"]["env"], "SECRET=canary\n", "{before}");
    let adopted_hash = before["confinement"]["policy_hash"].clone();
    assert!(adopted_hash.is_string(), "{before}");

    unhide_everything(root);
    let (after, stderr) = run_demo(root);
    // The adopted copy governed, and the record names its text, not the file on disk's.
    assert_ne!(after["output"]["env"], "SECRET=canary\n", "{after}");
    assert_eq!(after["confinement"]["policy_hash"], adopted_hash, "{after}");
    assert!(
        stderr.contains("weaken the adopted rules")
            && stderr.contains("read_only.hide_matching")
            && stderr.contains("running under adopted rule set 1"),
        "{stderr}"
    );
}

/// Another account's listener on the executor's socket is never sent a skill's input nor
/// believed: the skill runs here, as if no executor answered.
#[test]
fn an_executor_of_another_account_is_not_asked() {
    if !common::isolation_or_skip() || !common::other_accounts_or_skip() {
        return;
    }
    // The other account needs a Python it may run (root's own may be under root's home).
    let python = Path::new("/usr/bin/python3");
    if !python.is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must: /usr/bin/python3"
        );
        eprintln!("skipping: the other account's listener needs /usr/bin/python3");
        return;
    }
    let dir = trusted();
    let root = dir.path();
    let locks = root.join(".kavi/ledger.locks");
    let socket = locks.join("executor.sock");
    let asked = root.join("asked.log");
    std::fs::write(&asked, "").unwrap();
    // The locks folder open to the other account through the team's group, as a shared
    // workspace has it: a folder root owns is accepted, so only the check of who answers stands
    // in the way.
    use std::os::unix::fs::PermissionsExt as _;
    for (path, mode) in [
        (root, 0o755),
        (locks.as_path(), 0o2775),
        (asked.as_path(), 0o664),
    ] {
        std::os::unix::fs::chown(path, None, Some(common::TEAM_GID)).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    const FAKE: &str = "import json, os, socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(1)\nprint('listening', flush=True)\nc, _ = s.accept()\nline = c.makefile('rb').readline()\nopen(sys.argv[2], 'a').write(line.decode())\nc.sendall((json.dumps({'record': {'forged': True}}) + '\\n').encode())\n";
    let mut fake = std::process::Command::new("setpriv")
        .args(["--reuid=4202", "--regid=4202"])
        .arg(format!("--groups={}", common::TEAM_GID))
        .arg(python)
        .args(["-c", FAKE])
        .arg(&socket)
        .arg(&asked)
        .stdout(std::process::Stdio::piped())
        // It finds the connection closed unasked: its complaint is no part of the test.
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(fake.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "listening\n");

    let (record, stderr) = run_demo(root);
    let _ = fake.kill();
    let _ = fake.wait();
    assert_eq!(record["output"]["echo"]["x"], 1, "{record}");
    assert!(record["execution_id"].is_string(), "{record}");
    assert!(
        stderr.contains("not asking the executor") && stderr.contains("uid 4202"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&asked).unwrap(),
        "",
        "the input went to uid 4202"
    );
}

/// A ledger an older kavi left readable in a team folder that is not setgid: its files are of
/// their maker's group, not the folder's, so they are closed to that group, and kavi says how
/// to share them with the folder's group instead.
#[test]
fn a_ledger_closed_to_a_group_that_does_not_share_its_folder_says_how_to_share_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = trusted();
    let root = dir.path();
    let state = root.join(".kavi");
    let ledger = state.join("ledger.db");
    std::os::unix::fs::chown(&state, None, Some(common::TEAM_GID)).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o775)).unwrap();
    std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = kavi(root, &["runs", "list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("closing {} to its group", ledger.display()))
            && stderr.contains("`chmod g+s` the folder"),
        "{stderr}"
    );
    let mode = std::fs::metadata(&ledger).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// A `.kavi/` every account may add to is refused even when root owns it and the sticky bit is
/// set: another account could plant a lock file, a socket or an artifact under a name kavi reads.
#[test]
fn a_world_writable_state_folder_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = workspace_with(PROPOSAL, SKILL, TEST);
    let root = dir.path();
    let state = root.join(".kavi");
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = kavi(
        root,
        &["pipeline", "run", "verify-promote", "--set", "skill=demo"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains(&format!("kavi's state folder {}", state.display()))
            && stderr.contains("is writable by every account (mode 1777)"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(&state).unwrap().count(),
        0,
        "nothing was made in it"
    );
}

/// A `.kavi/` another account made first in a shared workspace is refused, naming it, before
/// anything is read from or written to it.
#[test]
fn a_state_folder_another_account_made_is_refused() {
    if !common::other_accounts_or_skip() {
        return;
    }
    let dir = workspace_with(PROPOSAL, SKILL, TEST);
    let root = dir.path();
    let state = root.join(".kavi");
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::create_dir(&state).unwrap();
    nix::unistd::chown(&state, Some(4202.into()), Some(4202.into())).unwrap();
    let out = kavi(
        root,
        &["pipeline", "run", "verify-promote", "--set", "skill=demo"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains(&format!("kavi's state folder {}", state.display()))
            && stderr.contains("belongs to another user (uid 4202)"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(&state).unwrap().count(),
        0,
        "nothing was made in it"
    );
}
