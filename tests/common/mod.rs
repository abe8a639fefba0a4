//! Helpers shared by the integration tests: run the real `kavi` binary in a workspace folder and
//! read its JSON answers.
#![allow(
    dead_code,
    reason = "each test crate uses a different subset of these helpers"
)]

pub mod postgres;
pub mod stand_in;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// The repository: where the shipped policies, pipelines and builder live.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where the tests' sandboxes go: under `target/`, so that the ones kept after failed attempts
/// do not pile up in the system's temporary folder.
pub fn sandboxes() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("sandboxes")
}

pub fn kavi_command(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kavi"));
    command
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env("KAVI_SANDBOXES", sandboxes())
        .env("KAVI_TOOLCHAINS", toolchains());
    if let Some(url) = postgres::ledger_for(dir) {
        command.env("KAVI_LEDGER", url);
    }
    command
}

pub fn kavi(dir: &Path, args: &[&str]) -> Output {
    kavi_command(dir, args).output().unwrap()
}

/// A Python environment under the target folder named `venv`, with `requirement` from PyPI
/// (which makes `module` importable), as `.ci/run` installs it; tests never install it. `None`,
/// with the command that makes it printed, where it is missing (under CI, a failure).
pub fn python_with(venv: &str, requirement: &str, module: &str) -> Option<std::path::PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(venv);
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|out| out.status.success());
    if ready {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI needs {requirement} in {} (.ci/run installs it)",
        venv.display()
    );
    eprintln!(
        "skipping: {requirement} is not installed in {v} (`bash .ci/run` installs it, or: \
         python3 -m venv {v} && {v}/bin/pip install '{requirement}')",
        v = venv.display()
    );
    None
}

/// A connection of its own to a workspace's ledger, as someone working on it outside kavi has:
/// its SQLite file, or its database on the tests' server.
pub enum LedgerConnection {
    Sqlite(rusqlite::Connection),
    Postgres(::postgres::Client),
}

impl LedgerConnection {
    pub fn open(workspace: &Path) -> Self {
        match postgres::ledger_for(workspace) {
            None => LedgerConnection::Sqlite(
                rusqlite::Connection::open(workspace.join(".kavi/ledger.db")).unwrap(),
            ),
            Some(url) => LedgerConnection::Postgres(
                ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap(),
            ),
        }
    }

    /// Runs one statement with one text parameter: `sqlite` as SQLite says it (`?1`), or
    /// `postgres` as PostgreSQL does (`$1`). Returns how many rows it changed.
    pub fn execute(&mut self, sqlite: &str, postgres: &str, param: &str) -> u64 {
        match self {
            LedgerConnection::Sqlite(conn) => conn.execute(sqlite, [param]).unwrap() as u64,
            LedgerConnection::Postgres(client) => client.execute(postgres, &[&param]).unwrap(),
        }
    }

    /// Runs statements without parameters.
    pub fn batch(&mut self, sql: &str) {
        match self {
            LedgerConnection::Sqlite(conn) => conn.execute_batch(sql).unwrap(),
            LedgerConnection::Postgres(client) => client.batch_execute(sql).unwrap(),
        }
    }
}

/// The JSON a successful command printed.
pub fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "kavi failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// `kavi runs show --json` of the newest run.
pub fn last_run(dir: &Path) -> Value {
    json(&kavi(dir, &["runs", "show", "--json"]))
}

/// The last node run of a node in a run's JSON.
pub fn node<'a>(run: &'a Value, id: &str) -> &'a Value {
    run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|n| n["node_id"] == id)
        .unwrap_or_else(|| panic!("no node {id}"))
}

/// The result of one gate in a run's JSON.
pub fn verification<'a>(run: &'a Value, gate: &str) -> &'a Value {
    run["verifications"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["gate"] == gate)
        .unwrap_or_else(|| panic!("no verification for gate {gate}"))
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() == "__pycache__" {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// Copies the shipped workspace (pipelines, policies, templates, proposals, the scripted builder,
/// the chains and kavi.toml) into `dir`: what a user starts from.
pub fn copy_shipped_workspace(dir: &Path) {
    for folder in [
        "pipelines",
        "policies",
        "templates",
        "proposals",
        "builders",
        "chains",
    ] {
        copy_dir(&repo().join(folder), &dir.join(folder));
    }
    std::fs::copy(repo().join("kavi.toml"), dir.join("kavi.toml")).unwrap();
}

/// A fresh temporary copy of the shipped workspace.
pub fn shipped_workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_shipped_workspace(dir.path());
    dir
}

/// Copies shipped policy files into a workspace's `policies/`.
pub fn copy_policies(root: &Path, names: &[&str]) {
    std::fs::create_dir_all(root.join("policies")).unwrap();
    for name in names {
        std::fs::copy(
            repo().join("policies").join(name),
            root.join("policies").join(name),
        )
        .unwrap();
    }
}

/// Copies what the shipped gate set's tools are declared and configured by: the toolchains and
/// each tool's kavi-owned configuration.
pub fn copy_gate_tools(root: &Path) {
    copy_policies(
        root,
        &[
            "toolchains.toml",
            "toolchains.lock",
            "ruff.toml",
            "mypy.ini",
            "pytest.ini",
        ],
    );
}

/// Where the tests' toolchains are provisioned: under `target/`, shared by every test and kept
/// between runs, so that the real ruff, mypy and pytest are installed once per checkout.
pub fn toolchains() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("toolchains")
}

/// Fails if any file under `dir` (the ledger, its write-ahead log, artifacts, logs) holds
/// `secret`.
pub fn assert_nowhere_under(dir: &Path, secret: &str) {
    for entry in walkdir::WalkDir::new(dir) {
        let entry = entry.unwrap();
        if !entry.file_type().is_file() {
            continue;
        }
        let bytes = std::fs::read(entry.path()).unwrap_or_default();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the secret is in {}",
            entry.path().display()
        );
    }
}

/// `kavi ledger verify` finds the ledger as kavi left it: every entry chains, every row matches.
pub fn assert_ledger_verifies(root: &Path) {
    let out = kavi(root, &["ledger", "verify"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("ok: "),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this machine isolates builders, gates and skills (bubblewrap and namespaces). Where it
/// cannot, the caller skips, saying why; under CI, which installs bubblewrap, that fails.
pub fn isolation_or_skip() -> bool {
    match kavi::confinement::runtime::bwrap() {
        Ok(_) => true,
        Err(missing) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must isolate: {missing}"
            );
            eprintln!("skipping: {missing}");
            false
        }
    }
}
