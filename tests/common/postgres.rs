//! A real PostgreSQL server for the tests (tests/postgres/server.sh starts it from Debian's
//! packages, and stops it when the test binary ends), and a database of its own per caller.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// The server's URL without a database, or why there is none.
fn server() -> Result<&'static str, &'static str> {
    static SERVER: OnceLock<Result<String, String>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
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
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        })
        .as_deref()
        .map_err(String::as_str)
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
