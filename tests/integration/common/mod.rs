//! Helpers shared by the integration tests: run the real `kavi` binary in a workspace folder and
//! read its JSON answers.

pub mod postgres;
pub mod s3;
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
    with_test_env(Command::new(env!("CARGO_BIN_EXE_kavi")), dir, args)
}

/// Whether this process can act as another account (it is root, and util-linux's `setpriv` is
/// there). Where it cannot, the caller skips, saying why; under CI that fails.
pub fn other_accounts_or_skip() -> bool {
    let missing = if !nix::unistd::getuid().is_root() {
        "acting as a second account needs root (setpriv --reuid)"
    } else if Command::new("setpriv").arg("--version").output().is_err() {
        "acting as a second account needs setpriv (util-linux)"
    } else {
        return true;
    };
    assert!(std::env::var_os("CI").is_none(), "CI must: {missing}");
    eprintln!("skipping: {missing}");
    false
}

/// The group a team's accounts share a workspace through (see [`open_to_other_accounts`]).
pub const TEAM_GID: u32 = 4000;

/// `kavi` run as the numeric `uid` (with its own gid and the team's group, [`TEAM_GID`]): an
/// id with no account, which kavi records as `uid N`. The workspace must be open to it (see
/// [`open_to_other_accounts`]).
pub fn kavi_as(uid: u32, dir: &Path, args: &[&str]) -> Output {
    as_account(uid, dir, args).output().unwrap()
}

/// `kavi` as the account `uid`, with its own key at `key` (`KAVI_PERSON_KEY`): the tests'
/// accounts share one configuration folder, where a person's key would be one for all.
pub fn kavi_with_key(uid: u32, key: &Path, dir: &Path, args: &[&str]) -> Output {
    as_account(uid, dir, args)
        .env("KAVI_PERSON_KEY", key)
        .output()
        .unwrap()
}

/// `kavi` as the account `uid` (see [`kavi_as`]), to be run by the caller.
pub fn as_account(uid: u32, dir: &Path, args: &[&str]) -> Command {
    let mut setpriv = Command::new("setpriv");
    setpriv.args([
        format!("--reuid={uid}"),
        format!("--regid={uid}"),
        format!("--groups={TEAM_GID}"),
        env!("CARGO_BIN_EXE_kavi").to_owned(),
    ]);
    let mut command = with_test_env(setpriv, dir, args);
    command.env("HOME", dir);
    command
}

/// `kavi` run where `read_only` (a folder) is mounted read-only, as on read-only media: in a
/// mount namespace of its own, so nothing else sees it. `None`, saying why, where this process
/// cannot make one (under CI, a failure).
pub fn kavi_with_read_only(read_only: &Path, dir: &Path, args: &[&str]) -> Option<Output> {
    if !mount_namespace_or_skip("mounting a folder read-only") {
        return None;
    }
    let mut unshare = Command::new("unshare");
    unshare.args([
        "-m",
        "sh",
        "-c",
        r#"mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@""#,
        "sh",
    ]);
    unshare.arg(read_only).arg(env!("CARGO_BIN_EXE_kavi"));
    Some(with_test_env(unshare, dir, args).output().unwrap())
}

/// Whether this process can make a mount namespace of its own (`unshare -m`, as root), for
/// `what`; where it cannot, the caller skips, saying why; under CI that fails.
fn mount_namespace_or_skip(what: &str) -> bool {
    namespace_or_skip("-m", "mount", what)
}

/// Whether this process can make a UTS namespace of its own (`unshare --uts`, as root), where
/// a kavi gets a hostname of its own: another machine, as the tests fake one.
pub fn uts_namespace_or_skip() -> bool {
    namespace_or_skip("--uts", "UTS", "another machine's hostname")
}

/// Whether this process can make a user namespace of its own (`unshare --user`), where any
/// account may name itself as it likes.
pub fn user_namespace_or_skip() -> bool {
    namespace_or_skip("--user", "user", "an account naming itself")
}

fn namespace_or_skip(flag: &str, kind: &str, what: &str) -> bool {
    let works = Command::new("unshare")
        .args([flag, "true"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !works {
        let missing = format!("{what} needs a {kind} namespace (unshare {flag}, as root)");
        assert!(std::env::var_os("CI").is_none(), "CI must: {missing}");
        eprintln!("skipping: {missing}");
    }
    works
}

/// `script` run by `sh` in the workspace `dir`, in a mount namespace of its own with a tmpfs of
/// `size` (as `mount -o size=` takes it) mounted on the workspace's `folder`, so that only what
/// it runs sees that folder fill up; `$KAVI` is the kavi binary, with the tests' environment.
/// `None`, saying why, where this process cannot make one (under CI, a failure).
pub fn sh_with_small_disk(dir: &Path, folder: &str, size: &str, script: &str) -> Option<Output> {
    if !mount_namespace_or_skip("a small disk") {
        return None;
    }
    std::fs::create_dir_all(dir.join(folder)).unwrap();
    let mut unshare = Command::new("unshare");
    unshare.args(["-m", "sh", "-c"]).arg(format!(
        "mount -t tmpfs -o size={size},mode=0755 tmpfs {folder} || exit 90\n{script}"
    ));
    let mut command = with_test_env(unshare, dir, &[]);
    Some(
        command
            .env("KAVI", env!("CARGO_BIN_EXE_kavi"))
            .output()
            .unwrap(),
    )
}

/// Lets the team's group ([`TEAM_GID`], which [`kavi_as`] gives every other account) read
/// and write the workspace (its ledger included), as a team's shared workspace has it, and the
/// tests' keys folder, which accounts sharing a ledger share (kavi MACs every journal entry it
/// writes with the key there). Through a group, not every account: kavi refuses a state
/// folder every account may write to.
pub fn open_to_other_accounts(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let keys = config_home().join("kavi");
    let folders = std::iter::once(dir).chain(keys.is_dir().then_some(keys.as_path()));
    for entry in folders.flat_map(walkdir::WalkDir::new) {
        let entry = entry.unwrap();
        std::os::unix::fs::lchown(entry.path(), None, Some(TEAM_GID)).unwrap();
        if entry.file_type().is_symlink() {
            continue;
        }
        let mode = entry.metadata().unwrap().permissions().mode();
        // Folders pass their group on to what is made in them.
        let open = if entry.file_type().is_dir() {
            0o2775
        } else {
            0o664
        };
        std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode | open))
            .unwrap();
    }
}

/// Proposes the governing files as they are now, has another account (`uid 4301`, holding
/// every role of the shipped `policies/roles.toml`) approve the change, and adopts it: what a
/// team does before an edited rule set may promote.
pub fn adopt_the_rules_as_they_are(root: &Path) {
    let proposed = kavi(root, &["policy", "propose"]);
    let stdout = String::from_utf8_lossy(&proposed.stdout).into_owned();
    let id = stdout
        .strip_prefix("proposed rule change ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| {
            panic!(
                "nothing proposed: {stdout}{}",
                String::from_utf8_lossy(&proposed.stderr)
            )
        });
    open_to_other_accounts(root);
    let approved = kavi_as(4301, root, &["policy", "approve", id]);
    assert!(approved.status.success(), "{approved:?}");
    let adopted = kavi(root, &["policy", "adopt", id]);
    assert!(adopted.status.success(), "{adopted:?}");
}

/// `command` with `args`, run in `dir` with the environment every kavi under test gets (its
/// sandboxes, toolchains, keys and ledger), also when a script starts that kavi.
pub fn with_test_env(mut command: Command, dir: &Path, args: &[&str]) -> Command {
    command
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env("KAVI_SANDBOXES", sandboxes())
        .env("KAVI_TOOLCHAINS", toolchains())
        .env("XDG_CONFIG_HOME", config_home())
        .env("XDG_CACHE_HOME", cache_home())
        .env_remove("KAVI_KEYS");
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

    /// The first column of each row a query without parameters returns, as text.
    pub fn texts(&mut self, sql: &str) -> Vec<String> {
        match self {
            LedgerConnection::Sqlite(conn) => {
                let mut stmt = conn.prepare(sql).unwrap();
                stmt.query_map([], |row| row.get(0))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            }
            LedgerConnection::Postgres(client) => client
                .query(sql, &[])
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect(),
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
        .and_then(|all| all.iter().find(|v| v["gate"] == gate))
        .unwrap_or_else(|| panic!("no verification for gate {gate} in the run: {run:#}"))
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

/// `policies/gates.toml` without its `tests` gate, a weakening of the rules; returns the file as
/// it was.
pub fn drop_the_test_gate(root: &Path) -> String {
    let path = root.join("policies/gates.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("[[gate]]\nid = \"tests\"").unwrap();
    let end = text[start + 1..]
        .find("[[gate]]")
        .map_or(text.len(), |i| start + 1 + i);
    std::fs::write(&path, format!("{}{}", &text[..start], &text[end..])).unwrap();
    text
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

/// The tests' configuration folder, in place of the account's own `~/.config`: kavi's keys
/// (the journal's MAC key, a signing key, the checkpoint logs) are made there, never in the
/// machine's `~/.config/kavi`.
pub fn config_home() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("config")
}

/// The cache home every kavi under test gets: what kavi keeps per account (a server ledger's
/// locks, the sandboxes where `KAVI_SANDBOXES` is not set) goes under `target/`, never into the
/// account's own `~/.cache/kavi`.
pub fn cache_home() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("cache")
}

/// Where the tests' toolchains are provisioned: under `target/`, shared by every test and kept
/// between runs, so that the real ruff, mypy and pytest are installed once per checkout.
pub fn toolchains() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("toolchains")
}

/// Whether `kavi toolchain install` (its output) provisioned the toolchains; where it could not
/// (no package registry here), says why for the caller to skip. Under CI, which can, that fails.
pub fn provisioned_or_skip(installed: &Output) -> bool {
    if installed.status.success() {
        return true;
    }
    let why = String::from_utf8_lossy(&installed.stderr);
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must provision the gate toolchains: {why}"
    );
    eprintln!("skipping: the gate toolchains could not be provisioned here: {why}");
    false
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

/// Whether kavi sees every death in a confined tree here (the kernel's process events); where
/// not, the caller leaves out the cases that need it, saying why, and under CI that fails.
pub fn every_death_or_skip() -> bool {
    match kavi::confinement::deaths::availability() {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must see every death in a confined tree: {why}"
            );
            eprintln!("skipping the cases that need every death in a tree seen: {why}");
            false
        }
    }
}

/// A connection to a workspace's SQLite ledger as an attacker without kavi's keys makes it: the
/// journal's hash function registered by hand (it is public), so that the triggers journal
/// every edit and the public chain holds; and the MAC function too, with no key to compute it
/// under, so a guess.
pub fn attacker_connection(root: &Path) -> rusqlite::Connection {
    use rusqlite::functions::FunctionFlags;
    let conn = rusqlite::Connection::open(root.join(".kavi/ledger.db")).unwrap();
    // The `sqlite3` shell's default: rows may point at rows that are not there.
    conn.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    conn.create_scalar_function("kavi_sha256", 1, flags, |ctx| {
        Ok(kavi::hash::sha256_hex(ctx.get::<String>(0)?.as_bytes()))
    })
    .unwrap();
    conn.create_scalar_function("kavi_mac", 1, flags, |ctx| {
        Ok(kavi::hash::sha256_hex(
            format!("guess\n{}", ctx.get::<String>(0)?).as_bytes(),
        ))
    })
    .unwrap();
    conn
}

/// Runs `sql` on a workspace's ledger as an account that holds kavi's journal key does (every
/// account that writes a shared ledger does): the journal's functions registered by hand with
/// the real key (SQLite), or its entries MACed by hand with it before the commit (PostgreSQL),
/// so that what it writes is vouched for as if kavi had written it.
pub fn edit_with_the_key(root: &Path, sql: &str) {
    use rusqlite::functions::FunctionFlags;
    if let Some(url) = postgres::ledger_for(root) {
        let mut client = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
        postgres::keyed_batch(&mut client, sql);
        return;
    }
    let conn = rusqlite::Connection::open(root.join(".kavi/ledger.db")).unwrap();
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    conn.create_scalar_function("kavi_sha256", 1, flags, |ctx| {
        Ok(kavi::hash::sha256_hex(ctx.get::<String>(0)?.as_bytes()))
    })
    .unwrap();
    conn.create_scalar_function("kavi_mac", 1, flags, |ctx| {
        Ok(mac_with_the_key(&ctx.get::<String>(0)?))
    })
    .unwrap();
    conn.execute_batch(sql).unwrap();
}

/// The MAC of a journal entry's hash under the key kavi made in the tests' keys folder:
/// HMAC-SHA256, written out from its padded keys.
pub fn mac_with_the_key(hash: &str) -> String {
    use sha2::Digest;
    let (inner, outer) = journal_key_pads();
    let first = sha2::Sha256::new()
        .chain_update(inner)
        .chain_update(hash.as_bytes())
        .finalize();
    let mac = sha2::Sha256::new()
        .chain_update(outer)
        .chain_update(first)
        .finalize();
    mac.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `sql` on a workspace's ledger as a process without kavi's journal key does: through
/// [`attacker_connection`] (SQLite), or a session of its own (PostgreSQL), whose entries
/// nobody MACs.
pub fn edit_without_the_key(root: &Path, sql: &str) {
    if postgres::ledger_for(root).is_some() {
        LedgerConnection::open(root).batch(sql);
    } else {
        attacker_connection(root).execute_batch(sql).unwrap();
    }
}

/// HMAC-SHA256's inner and outer padded keys (RFC 2104) of the journal key kavi made in the
/// tests' keys folder.
fn journal_key_pads() -> ([u8; 64], [u8; 64]) {
    let path = config_home().join("kavi/journal.key");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no journal key at {}: {e}", path.display()));
    let key: Vec<u8> = (0..64)
        .step_by(2)
        .map(|i| u8::from_str_radix(&text.trim()[i..i + 2], 16).unwrap())
        .collect();
    let pad = |byte: u8| {
        let mut padded = [byte; 64];
        for (p, k) in padded.iter_mut().zip(&key) {
            *p ^= k;
        }
        padded
    };
    (pad(0x36), pad(0x5c))
}

/// The folders the rosters of a workspace's ledger list (`.kavi/ledger.locks/*.procs`): the
/// private folders its kavi processes made, which the next kavi removes when their owner died.
pub fn roster_folders(root: &Path) -> Vec<std::path::PathBuf> {
    let mut folders = Vec::new();
    let Ok(entries) = std::fs::read_dir(root.join(".kavi/ledger.locks")) else {
        return folders;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "procs") {
            let roster = std::fs::read_to_string(&path).unwrap_or_default();
            for line in roster.lines() {
                // A line being written may be cut short: it is read again on the next look.
                let Ok(line) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                if line["entry"] == "folder" {
                    folders.push(std::path::PathBuf::from(line["path"].as_str().unwrap()));
                }
            }
        }
    }
    folders
}

/// How a checkout on another machine, which has none of a run's file artifact on disk, reads
/// it from the content every machine shares (`kavi` runs a command in that checkout):
/// `ledger verify` holds; `artifact cat` and `runs logs 1 NODE` print `expected`, fetched into
/// its store (at `path` there), which is then a cache; and that cache altered is fetched again
/// and checked. Returns what each command printed, for the caller to search.
pub fn reads_from_another_checkout(
    root: &Path,
    kavi: &dyn Fn(&[&str]) -> Output,
    (sha, path): (&str, &str),
    node: &str,
    expected: &[u8],
) -> Vec<Output> {
    let said = |output: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    let cached = root.join(".kavi/artifacts").join(path);
    assert!(!cached.exists());
    let verify = kavi(&["ledger", "verify"]);
    assert!(verify.status.success(), "{}", said(&verify));
    assert!(said(&verify).starts_with("ok: "), "{}", said(&verify));
    let read = |args: &[&str]| {
        let output = kavi(args);
        assert!(output.status.success(), "{}", said(&output));
        assert!(output.stdout == expected, "{} bytes", output.stdout.len());
        output
    };
    let cat = read(&["artifact", "cat", sha]);
    assert_eq!(std::fs::read(&cached).unwrap(), expected);
    let logs = read(&["runs", "logs", "1", node]);
    // The cached copy altered: fetched again from the shared content, and checked.
    std::fs::remove_file(&cached).unwrap();
    std::fs::write(&cached, b"not what was made\n").unwrap();
    let again = read(&["artifact", "cat", sha]);
    vec![verify, cat, logs, again]
}

/// The sha256 of the artifact of `role` (`stdout`, say) kept for a node of a run's detail
/// (`kavi runs show --json`).
pub fn artifact_sha(node: &Value, role: &str) -> String {
    node["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["role"] == role)
        .unwrap()["sha256"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Pipeline nodes that build `params.skill` in a sandbox and copy the result back: what a move
/// into BUILT rests on.
pub const BUILD_NODES: &str = r#"
[nodes.propose]
kind = "propose"
file = "proposals/{{ params.skill }}.toml"

[nodes.sandbox]
kind = "sandbox"

[nodes.build]
kind = "build"
needs = ["propose", "sandbox"]
skill = "{{ params.skill }}"
sandbox = "{{ nodes.sandbox.outputs.path }}"
vars = { skill = "{{ params.skill }}" }

[nodes.diff]
kind = "diff_gate"
needs = ["sandbox", "build"]
sandbox = "{{ nodes.sandbox.outputs.path }}"
vars = { skill = "{{ params.skill }}" }

[nodes.copy]
kind = "copy_back"
needs = ["sandbox", "diff"]
sandbox = "{{ nodes.sandbox.outputs.path }}"
vars = { skill = "{{ params.skill }}" }
skill = "{{ params.skill }}"
"#;
