//! A real PostgreSQL server for the tests (tests/postgres/server.sh starts it from Debian's
//! packages, and stops it when the test binary ends), and a database of its own per caller.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// The server's URL without a database, or why there is none.
fn server() -> Result<&'static str, &'static str> {
    static SERVER: OnceLock<Result<String, String>> = OnceLock::new();
    SERVER
        .get_or_init(|| start().map(|(url, _)| url))
        .as_deref()
        .map_err(String::as_str)
}

/// Starts a server (tests/postgres/server.sh): its URL without a database, and its folder.
fn start() -> Result<(String, PathBuf), String> {
    let dir = tempfile::Builder::new()
        .prefix("kavi-postgres")
        .tempdir()
        .map_err(|e| e.to_string())?
        .keep();
    let output = std::process::Command::new("bash")
        .arg(super::repo().join("tests/postgres/server.sh"))
        .arg(&dir)
        .arg(std::process::id().to_string())
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    Ok((
        String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        dir,
    ))
}

/// A server of the caller's own, for a test that stops or restarts it: the URL of its
/// `postgres` database, and its folder (for [`restart`]). `None`, with the reason printed,
/// when no server can run here (under CI, a failure).
pub fn own_server() -> Option<(String, PathBuf)> {
    match start() {
        Ok((url, dir)) => Some((format!("{url}/postgres"), dir)),
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI needs a PostgreSQL server: {why}"
            );
            eprintln!("skipping: no PostgreSQL server: {why}");
            None
        }
    }
}

/// Restarts the server in `dir` (made by [`own_server`]) as an administrator would: its
/// sessions are ended, and it takes connections again once it is back.
pub fn restart(dir: &Path) {
    pg_ctl(dir, "restart");
}

/// Stops the server in `dir` (made by [`own_server`]) for good, ending its sessions.
pub fn stop(dir: &Path) {
    pg_ctl(dir, "stop");
}

/// `pg_ctl ACTION` on the server in `dir`, as its owner, waiting for it to be done.
fn pg_ctl(dir: &Path, action: &str) {
    let done = std::process::Command::new("bash")
        .args([
            "-c",
            r#"pg_ctl=$(command -v pg_ctl || ls -d /usr/lib/postgresql/*/bin/pg_ctl | sort -V | tail -n 1)
               as=(); [[ $(id -u) == 0 ]] && as=(runuser -u nobody --)
               "${as[@]}" "$pg_ctl" -D "$1/data" -m fast -w "$2" > /dev/null"#,
            "pg_ctl",
        ])
        .arg(dir)
        .arg(action)
        .status()
        .unwrap();
    assert!(
        done.success(),
        "pg_ctl {action} of the server in {} failed",
        dir.display()
    );
}

/// The URL of a new, empty database on the tests' server; `None`, with the reason printed,
/// when no server can run here.
pub fn database() -> Option<String> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let server = match server() {
        Ok(server) => server,
        Err(why) => {
            // .ci/run installs PostgreSQL: under CI a missing server is a failure.
            assert!(
                std::env::var_os("CI").is_none(),
                "CI needs a PostgreSQL server: {why}"
            );
            eprintln!("skipping: no PostgreSQL server: {why}");
            return None;
        }
    };
    let name = format!(
        "kavi_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let mut admin = postgres::Client::connect(&format!("{server}/postgres"), postgres::NoTls)
        .expect("the tests' server takes connections");
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("a database can be made");
    Some(format!("{server}/{name}"))
}

/// With `KAVI_TEST_LEDGER=postgres`, the suites run every workspace on a database of its own on
/// the tests' server (`.ci/run` runs the engine suite so); otherwise on its SQLite file.
pub fn ledger_for(workspace: &Path) -> Option<String> {
    static DATABASES: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());
    if std::env::var("KAVI_TEST_LEDGER").as_deref() != Ok("postgres") {
        return None;
    }
    let mut databases = DATABASES.lock().unwrap();
    if let Some((_, url)) = databases.iter().find(|(dir, _)| dir == workspace) {
        return Some(url.clone());
    }
    let url = database().expect("KAVI_TEST_LEDGER=postgres needs a PostgreSQL server");
    databases.push((workspace.to_owned(), url.clone()));
    Some(url)
}

/// Runs `sql` as kavi writes a server's ledger: in one transaction whose journal entries are
/// appended as its rows change, then MACed here, with the key kavi made in the tests' keys
/// folder, before the commit (the server never holds the key).
pub fn keyed_batch(client: &mut postgres::Client, sql: &str) {
    client
        .batch_execute(&format!("BEGIN; SET CONSTRAINTS ALL IMMEDIATE; {sql};"))
        .unwrap();
    seal_by_hand(|query| {
        client
            .query(query, &[])
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    })
    .into_iter()
    .for_each(|update| client.batch_execute(&update).unwrap());
    client.batch_execute("COMMIT").unwrap();
}

/// The statements that MAC the open transaction's journal entries with the tests' key, given
/// a way to run a query for (seq, hash) rows.
pub fn seal_by_hand(mut rows: impl FnMut(&str) -> Vec<(i64, String)>) -> Vec<String> {
    rows(
        "SELECT seq, hash FROM journal
          WHERE mac IS NULL AND xmin = pg_current_xact_id_if_assigned()::xid",
    )
    .into_iter()
    .map(|(seq, hash)| {
        format!(
            "UPDATE journal SET mac = '{}' WHERE seq = {seq}",
            super::mac_with_the_key(&hash)
        )
    })
    .collect()
}
