//! The review page's runs list on a ledger of 10,000 runs, the target being a page load
//! under 200 ms: the first page, a deep one (by key), a filtered one and the review queue, each
//! fetched over HTTP from a real server, 20 times after one to warm up. The ledger is filled
//! through the ledger's own API (a run and its two node runs each), not by running pipelines.
//!
//!     cargo bench --bench runs_page
//!
//! Exits 1 when the first page's median is over the target.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use kavi_foundation::state::RunStatus;
use kavi_ledger::testing::{isolate_keys, new_run};
use kavi_ledger::{Ledger, Owner, RunRow};
use kavi_serve::{Address, Cli, Options};
use kavi_spec::config::{Overrides, Workspace};

const RUNS: usize = 10_000;
const ROUNDS: usize = 20;
const TARGET: Duration = Duration::from_millis(200);

/// The runs list asks nothing of the binary.
struct Nothing;

impl Cli for Nothing {
    fn policy_diff(
        &self,
        _: &Workspace,
        _: i64,
    ) -> Result<Vec<kavi_governance::adoption::FileChange>, String> {
        Err("not asked in this bench".into())
    }

    fn explain(&self, _: &Workspace, _: i64, _: &str) -> Result<serde_json::Value, String> {
        Err("not asked in this bench".into())
    }

    fn graph(&self, _: &Workspace, _: i64) -> Result<Vec<(String, Vec<String>)>, String> {
        Err("not asked in this bench".into())
    }

    fn ledger_verify(&self, _: &Workspace) -> Result<serde_json::Value, String> {
        Err("not asked in this bench".into())
    }

    fn resume(&self, _: &Workspace, _: RunRow) {}
}

fn fill(workspace: &Workspace) {
    let started = Instant::now();
    let path = &workspace.config.ledger;
    let mut ledger = Ledger::open(path).unwrap();
    let owner = Owner::claim(path, &workspace.root).unwrap();
    let statuses = [
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Succeeded,
        RunStatus::AwaitingReview,
    ];
    for i in 0..RUNS {
        let id = ledger
            .create_run(&new_run(
                &serde_json::json!({ "i": i }),
                &["build", "test"],
                &owner,
            ))
            .unwrap();
        let status = statuses[i % statuses.len()];
        ledger
            .finish_run(id, status, Duration::from_millis(i as u64), None)
            .unwrap();
    }
    println!(
        "filled a ledger with {RUNS} runs in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// One GET with the server's key, read to its end; the status line must say 200.
fn get(served: &Address, path: &str) -> Duration {
    let started = Instant::now();
    let mut stream = TcpStream::connect(served.addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {}\r\nCookie: kavi_key={}\r\n\
         Connection: close\r\n\r\n",
        served.host, served.key
    )
    .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let took = started.elapsed();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{path}: {}",
        String::from_utf8_lossy(&answer[..answer.len().min(300)])
    );
    took
}

fn main() {
    isolate_keys();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kavi.toml"), "").unwrap();
    let workspace = Workspace::load(Some(dir.path()), &Overrides::default()).unwrap();
    fill(&workspace);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let options = Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        allow_remote: false,
    };
    runtime.spawn(kavi_serve::serve(
        workspace,
        options,
        Box::new(Nothing),
        move |address| tx.send(address.clone()).unwrap(),
    ));
    let served = rx.recv().unwrap();
    let deep = format!("/runs?before={}", RUNS / 2);
    let mut first_page = Duration::ZERO;
    for (name, path) in [
        ("runs, first page", "/runs"),
        ("runs, a page half way down", deep.as_str()),
        ("runs, failed only", "/runs?status=failed"),
        ("review queue", "/"),
    ] {
        get(&served, path);
        let mut times: Vec<Duration> = (0..ROUNDS).map(|_| get(&served, path)).collect();
        times.sort_unstable();
        let median = times[ROUNDS / 2];
        println!(
            "{name:<28} median {:>7.2} ms, slowest {:>7.2} ms ({ROUNDS} loads)",
            median.as_secs_f64() * 1e3,
            times[ROUNDS - 1].as_secs_f64() * 1e3
        );
        if path == "/runs" {
            first_page = median;
        }
    }
    if first_page > TARGET {
        println!("the first page's median is over the target of {TARGET:?}");
        std::process::exit(1);
    }
}
