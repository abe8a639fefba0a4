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
    let read = common::reads_from_another_checkout(
        second.path(),
        &|args| kavi_at(second.path(), &url, args),
        (&sha, stdout["path"].as_str().unwrap()),
        "big",
        &expected,
    );

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
        for output in read.iter().chain([&ran, &env]) {
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

/// What the node of `one.toml` prints: a file artifact (over the 16 KiB the ledger keeps in a
/// row), its object in the store.
fn gc_content() -> Vec<u8> {
    let mut content = "gc\n".repeat(6667).into_bytes();
    content.truncate(20_000);
    content
}

/// Set, for the process of [`gc_removes_unreferenced_objects_and_none_a_run_records_meanwhile`]
/// that plays the second machine, to the folder the two processes take turns through.
const SECOND_MACHINE: &str = "KAVI_TEST_SECOND_MACHINE";

/// `kavi gc` removes from the object store the object of an artifact no run references any
/// more, keeps the one a kept run references, and is safe against another machine that found
/// the object in the store before gc removed it and records it after: that machine puts the
/// object back as it records it, so `ledger verify` from a third checkout is clean and the
/// content reads. The race is made in order, not by timing: the other machine is this test in
/// a process of its own (its store's credentials come from its environment), which puts the
/// artifact, lets gc run, then records it.
#[test]
fn gc_removes_unreferenced_objects_and_none_a_run_records_meanwhile() {
    if let Some(turns) = std::env::var_os(SECOND_MACHINE) {
        return second_machine(Path::new(&turns));
    }
    let Some(url) = common::postgres::database() else {
        return;
    };
    let Some(server) = s3::server() else {
        return;
    };
    server.create_bucket(BUCKET);
    let first = checkout(Some(&server.endpoint));
    for (name, word) in [("one", "gc"), ("two", "kept")] {
        std::fs::write(
            first.path().join(format!("pipelines/{name}.toml")),
            format!(
                "[pipeline]\nname = \"{name}\"\n\n[nodes.out]\nkind = \"exec\"\n\
                 shell = \"yes {word} | head -c 20000\"\n"
            ),
        )
        .unwrap();
        let ran = kavi_at(first.path(), &url, &["pipeline", "run", name]);
        assert_eq!(code(&ran), 0, "{}", text(&ran));
    }
    let object_of = |run: &str| {
        let detail = json(&kavi_at(
            first.path(),
            &url,
            &["runs", "show", run, "--json"],
        ));
        let sha = common::artifact_sha(&detail["nodes"][0], "stdout");
        let key = format!("team/kavi/sha256/{}/{sha}", &sha[..2]);
        (sha, key)
    };
    let ((gone, gone_key), (_, kept_key)) = (object_of("1"), object_of("2"));
    assert_eq!(gone, kavi_foundation::hash::sha256_hex(&gc_content()));
    let in_store = |key: &str| {
        server.boto3(
            "import botocore\n\
             try:\n    s3.head_object(Bucket=sys.argv[1], Key=sys.argv[2]); print('there')\n\
             except botocore.exceptions.ClientError:\n    print('gone')",
            &[BUCKET, key],
        ) == "there\n"
    };
    assert!(in_store(&gone_key) && in_store(&kept_key));

    // The other machine puts the content of run 1's artifact: the store has it, so it finds
    // it there and sends nothing.
    let turns = tempfile::tempdir().unwrap();
    let mut other = common::with_test_env(
        std::process::Command::new(std::env::current_exe().unwrap()),
        turns.path(),
        &[
            "--exact",
            "objects::gc_removes_unreferenced_objects_and_none_a_run_records_meanwhile",
            "--nocapture",
        ],
    );
    let second = other
        .env(SECOND_MACHINE, turns.path())
        .env("KAVI_LEDGER", &url)
        .env("KAVI_TEST_S3", &server.endpoint)
        .env("AWS_ACCESS_KEY_ID", s3::ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", s3::SECRET_ACCESS_KEY)
        .stdout(std::fs::File::create(turns.path().join("said")).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut second = Stopped(second);
    let said = || std::fs::read_to_string(turns.path().join("said")).unwrap();
    wait_for(&turns.path().join("put"), &said);

    // gc, now: run 1 goes, and with it the object only it referenced; run 2's stays.
    let gc = kavi_at(
        first.path(),
        &url,
        &["gc", "--older-than", "0s", "--keep", "1"],
    );
    assert_eq!(code(&gc), 0, "{}", text(&gc));
    assert!(
        text(&gc).contains("removed 1 object from the object store"),
        "{}",
        text(&gc)
    );
    assert!(!in_store(&gone_key), "gc left the unreferenced object");
    assert!(in_store(&kept_key), "gc removed a referenced object");

    // The other machine records the artifact it put before gc ran: it puts the object back.
    std::fs::write(turns.path().join("go"), "").unwrap();
    assert!(second.0.wait().unwrap().success(), "{}", said());
    assert!(in_store(&gone_key), "a recorded artifact's object is gone");
    let third = checkout(Some(&server.endpoint));
    let verify = kavi_at(third.path(), &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
    let cat = kavi_at(third.path(), &url, &["artifact", "cat", &gone]);
    assert_eq!(code(&cat), 0, "{}", text(&cat));
    assert!(cat.stdout == gc_content(), "{} bytes", cat.stdout.len());

    // Run 2 pruned now: its object goes, the one the other machine's run references stays.
    let gc = kavi_at(
        first.path(),
        &url,
        &["gc", "--older-than", "0s", "--keep", "1"],
    );
    assert_eq!(code(&gc), 0, "{}", text(&gc));
    assert!(!in_store(&kept_key) && in_store(&gone_key), "{}", text(&gc));
    let verify = kavi_at(third.path(), &url, &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
}

/// The other machine of the test above: puts [`gc_content`] in the store, says so (`put` in
/// the folder `turns`), waits to be told to go on (`go`), then records it as a run's output.
fn second_machine(turns: &Path) {
    use kavi_foundation::state::{NodeState, RunStatus};
    use kavi_ledger::{ArtifactStore, Ledger, NodeRecord, ObjectSettings, Objects, Owner};

    let objects = Objects::new(ObjectSettings {
        bucket: BUCKET.to_owned(),
        endpoint: std::env::var("KAVI_TEST_S3").ok(),
        region: Some("us-east-1".to_owned()),
        prefix: "team/kavi".to_owned(),
        timeout: std::time::Duration::from_secs(60),
    })
    .unwrap();
    let store = ArtifactStore::open(&turns.join("artifacts"))
        .unwrap()
        .with_objects(std::sync::Arc::new(objects));
    let artifact = store.put_bytes("log", &gc_content()).unwrap();
    std::fs::write(turns.join("put"), "").unwrap();
    wait_for(&turns.join("go"), &|| {
        "the test did not let gc run".to_owned()
    });

    let url = std::env::var("KAVI_LEDGER").unwrap();
    let mut ledger = Ledger::open(Path::new(&url)).unwrap();
    let owner = Owner::claim(Path::new(&url), turns).unwrap();
    let run = ledger
        .create_run(&kavi_ledger::testing::new_run(
            &serde_json::json!({}),
            &["out"],
            &owner,
        ))
        .unwrap();
    let at = kavi_ledger::format_time(jiff::Timestamp::now());
    ledger.start_node(run, "out", "exec", 1, &at).unwrap();
    let record = NodeRecord {
        exit_code: Some(0),
        artifacts: vec![("stdout", artifact)],
        ..NodeRecord::default()
    };
    ledger
        .finish_node(run, "out", 1, NodeState::Succeeded, &record)
        .unwrap();
    ledger
        .finish_run(run, RunStatus::Succeeded, std::time::Duration::ZERO, None)
        .unwrap();
}

/// A process of the test's, stopped if the test ends before it does.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for the file at `path` to be made by the other process of a test: a turn taken, not
/// a time waited. Gives up, saying `why`, after ten minutes (the other process is stuck).
fn wait_for(path: &Path, why: &dyn Fn() -> String) {
    for _ in 0..12_000 {
        if path.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{} never came: {}", path.display(), why());
}
