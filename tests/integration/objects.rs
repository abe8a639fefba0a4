//! Artifacts in an S3-compatible object store (kavi.toml's `[object_store]`), shared by
//! checkouts on several machines through one PostgreSQL ledger: a real PostgreSQL server, real
//! `kavi` processes, and a stand-in S3 server that speaks the real wire protocol (moto's, see
//! `common::s3`: there is no AWS to reach from here).

use std::path::Path;
use std::process::Output;

use crate::common::{self, json, s3};

const BUCKET: &str = "kavi-artifacts";

/// A node whose output is over the 16 KiB the ledger keeps in a row and over one 8 MiB part of
/// an upload (so it goes up in parts), and one that prints the environment kavi gives it.
const PIPELINE: &str = r#"
[pipeline]
name = "large"

[nodes.big]
kind = "exec"
shell = "yes kavi | head -c 9000000"

[nodes.env]
kind = "exec"
run = ["env"]
"#;

/// A checkout of the workspace, its kavi.toml naming the store at `endpoint` (none: no store).
fn checkout(endpoint: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pipelines")).unwrap();
    std::fs::write(dir.path().join("pipelines/large.toml"), PIPELINE).unwrap();
    let config = match endpoint {
        Some(endpoint) => format!(
            "[object_store]\nbucket = \"{BUCKET}\"\nendpoint = \"{endpoint}\"\n\
             region = \"us-east-1\"\nprefix = \"/team/kavi/\"\n"
        ),
        None => "# no object store\n".to_owned(),
    };
    std::fs::write(dir.path().join("kavi.toml"), config).unwrap();
    dir
}

/// `kavi` in `root` on the server ledger at `url`, with the store's credentials in the
/// environment, where AWS's tools read them.
fn kavi_at(root: &Path, url: &str, args: &[&str]) -> Output {
    common::kavi_command(root, args)
        .env("KAVI_LEDGER", url)
        .env("AWS_ACCESS_KEY_ID", s3::ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", s3::SECRET_ACCESS_KEY)
        .output()
        .unwrap()
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The whole database as `pg_dump` writes it: every row of every table.
fn database_dump(url: &str) -> String {
    let dump = std::process::Command::new("bash")
        .args([
            "-c",
            r#"pg_dump=$(command -v pg_dump || ls -d /usr/lib/postgresql/*/bin/pg_dump | sort -V | tail -n 1)
               "$pg_dump" --data-only "$1""#,
            "pg_dump",
            url,
        ])
        .output()
        .unwrap();
    assert!(dump.status.success(), "{}", text(&dump));
    String::from_utf8(dump.stdout).unwrap()
}

/// A node's output made on one machine goes to the object store, not the server ledger, and is
/// verified and read on another from there; the second's file of it is a cache. An object
/// changed or removed in the store is reported by `ledger verify` and refused by `artifact
/// cat`; a store that cannot be reached is an error (exit 4), never a panic; and the store's
/// credentials are nowhere in the ledger, the workspaces, the outputs or what nodes see.
#[test]
fn artifacts_in_an_object_store_are_read_and_checked_from_another_checkout() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let Some(server) = s3::server() else {
        return;
    };
    server.create_bucket(BUCKET);
    let (first, second) = (
        checkout(Some(&server.endpoint)),
        checkout(Some(&server.endpoint)),
    );
    let ran = kavi_at(first.path(), &url, &["pipeline", "run", "large"]);
    assert_eq!(code(&ran), 0, "{}", text(&ran));
    let expected = "kavi\n".repeat(1_800_000).into_bytes();

    let detail = json(&kavi_at(
        second.path(),
        &url,
        &["runs", "show", "1", "--json"],
    ));
    let big = detail["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == "big")
        .unwrap();
    let stdout = big["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["role"] == "stdout")
        .unwrap()
        .clone();
    let sha = stdout["sha256"].as_str().unwrap().to_owned();
    assert_eq!(stdout["size"], expected.len());
    let key = format!("team/kavi/sha256/{}/{sha}", &sha[..2]);
    // In the store under its hash, and recorded there; none of it in the server's chunks.
    let size = server.boto3(
        "print(s3.head_object(Bucket=sys.argv[1], Key=sys.argv[2])['ContentLength'])",
        &[BUCKET, &key],
    );
    assert_eq!(size.trim(), expected.len().to_string());
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let location: String = client
        .query_one(
            "SELECT location FROM artifact_objects WHERE sha256 = $1",
            &[&sha],
        )
        .unwrap()
        .get(0);
    assert_eq!(location, format!("s3://{BUCKET}/{key}"));
    let chunks: i64 = client
        .query_one("SELECT count(*) FROM artifact_chunks", &[])
        .unwrap()
        .get(0);
    assert_eq!(chunks, 0);

    // The second machine has none of it on disk: it reads and verifies the store's copy.
    let cached = second
        .path()
        .join(".kavi/artifacts")
        .join(stdout["path"].as_str().unwrap());
    assert!(!cached.exists());
    let verify = kavi_at(second.path(), &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
    assert!(text(&verify).starts_with("ok: "), "{}", text(&verify));
    let cat = kavi_at(second.path(), &url, &["artifact", "cat", &sha]);
    assert_eq!(code(&cat), 0, "{}", text(&cat));
    assert!(cat.stdout == expected, "{} bytes", cat.stdout.len());
    assert_eq!(std::fs::read(&cached).unwrap(), expected);
    let logs = kavi_at(second.path(), &url, &["runs", "logs", "1", "big"]);
    assert_eq!(code(&logs), 0, "{}", text(&logs));
    assert!(logs.stdout == expected, "{} bytes", logs.stdout.len());
    // Its cached copy altered: fetched again from the store, and checked.
    std::fs::remove_file(&cached).unwrap();
    std::fs::write(&cached, b"not what was made\n").unwrap();
    let cat = kavi_at(second.path(), &url, &["artifact", "cat", &sha]);
    assert_eq!(code(&cat), 0, "{}", text(&cat));
    assert!(cat.stdout == expected, "{} bytes", cat.stdout.len());

    // A machine whose kavi.toml names no store says where the content is, and that it cannot
    // read it there.
    let unset = checkout(None);
    let cat = kavi_at(unset.path(), &url, &["artifact", "cat", &sha]);
    assert_eq!(code(&cat), 4, "{}", text(&cat));
    assert!(
        text(&cat).contains(&format!(
            "its content is kept in the object store at s3://{BUCKET}/{key}, and this machine's \
             kavi.toml names no `[object_store]`"
        )),
        "{}",
        text(&cat)
    );

    // No credential anywhere kavi wrote or printed, nor in what a node was given.
    let env = kavi_at(second.path(), &url, &["runs", "logs", "1", "env"]);
    assert_eq!(code(&env), 0, "{}", text(&env));
    assert!(text(&env).contains("PATH="), "{}", text(&env));
    let dump = database_dump(&url);
    assert!(dump.contains(&location), "the dump holds the ledger");
    for secret in [s3::SECRET_ACCESS_KEY, s3::ACCESS_KEY_ID] {
        assert!(!dump.contains(secret), "a credential is in the ledger");
        for output in [&ran, &verify, &cat, &logs, &env] {
            assert!(!text(output).contains(secret), "{}", text(output));
        }
        common::assert_nowhere_under(first.path(), secret);
        common::assert_nowhere_under(second.path(), secret);
    }

    // The store's copy changed: refused where no machine has the content, and reported.
    server.boto3(
        "s3.put_object(Bucket=sys.argv[1], Key=sys.argv[2], Body=b'edited in the store')",
        &[BUCKET, &key],
    );
    let third = checkout(Some(&server.endpoint));
    let cat = kavi_at(third.path(), &url, &["artifact", "cat", &sha]);
    assert_eq!(code(&cat), 4, "{}", text(&cat));
    assert!(
        text(&cat).contains("in the shared store was altered"),
        "{}",
        text(&cat)
    );
    assert!(cat.stdout.is_empty());
    let verify = kavi_at(third.path(), &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 1, "{}", text(&verify));
    assert!(
        text(&verify).contains(&format!(
            "artifact {sha}: its object s3://{BUCKET}/{key} no longer hashes to its name \
             (edited in the store)"
        )),
        "{}",
        text(&verify)
    );
    // Removed from the store: reported as missing.
    server.boto3(
        "s3.delete_object(Bucket=sys.argv[1], Key=sys.argv[2])",
        &[BUCKET, &key],
    );
    let verify = kavi_at(third.path(), &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 1, "{}", text(&verify));
    assert!(
        text(&verify).contains(&format!(
            "artifact {sha}: its object s3://{BUCKET}/{key} is missing from the object store"
        )),
        "{}",
        text(&verify)
    );

    // The store gone: reading what only it has, and verifying, fail with the store named
    // (exit 4: the workspace could not be used); a node's large output cannot be kept, so the
    // node fails, saying why.
    let endpoint = server.endpoint.clone();
    drop(server);
    let fourth = checkout(Some(&endpoint));
    let down = format!("the object store s3://{BUCKET} at {endpoint} failed");
    for args in [
        &["artifact", "cat", &sha][..],
        &["runs", "logs", "1", "big"],
        &["ledger", "verify"],
    ] {
        let failed = kavi_at(fourth.path(), &url, args);
        assert_eq!(code(&failed), 4, "{args:?}: {}", text(&failed));
        assert!(text(&failed).contains(&down), "{args:?}: {}", text(&failed));
        assert!(!text(&failed).contains("panicked"), "{}", text(&failed));
    }
    let ran = kavi_at(fourth.path(), &url, &["pipeline", "run", "large"]);
    assert_eq!(code(&ran), 1, "{}", text(&ran));
    let detail = json(&kavi_at(
        fourth.path(),
        &url,
        &["runs", "show", "2", "--json"],
    ));
    let big = detail["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == "big")
        .unwrap();
    assert_eq!(big["state"], "failed", "{big}");
    assert!(
        big["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("failed to store output: ") && e.contains(&down)),
        "{big}"
    );
}
