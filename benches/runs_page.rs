//! The review page's runs list on a ledger of 10,000 runs, the target being a page load
//! under 200 ms: the first page, a deep one (by key), a filtered one and the review queue, each
//! fetched over HTTP from a real server, 20 times after one to warm up; and a skill's page, whose
//! skill has a gate result in every other run (three gates each) and 10,000 executions, the other
//! runs gating another skill: its first page and one half way down both lists. The ledger is
//! filled through the ledger's own API (a run and its two node runs each), not by running
//! pipelines.
//!
//!     cargo bench --bench runs_page
//!
//! Exits 1 when the median of the runs list's first page, or of the skill's, is over the target.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use kavi_foundation::state::RunStatus;
use kavi_ledger::testing::{isolate_keys, new_run};
use kavi_ledger::{ExecutionRecord, GateResult, Ledger, NewSkill, Owner, RunRow};
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

/// The skill whose page is timed, and the one gated in the runs between.
const SKILLS: [&str; 2] = ["word_count", "find_notes"];
const EXECUTIONS: usize = 10_000;

fn propose(ledger: &mut Ledger, workspace: &Workspace) -> kavi_ledger::Artifact {
    let store = kavi_governance::open_store(workspace).unwrap();
    let spec = store.put_bytes("SKILL_SPEC", b"{}").unwrap();
    for name in SKILLS {
        ledger
            .propose_skill(&NewSkill {
                name,
                description: "a skill with many gate results and executions",
                side_effect: "READ_ONLY",
                spec: &spec,
                proposal_path: "proposals/skill.toml",
                initial_state: "PROPOSED",
                actor: "bench",
            })
            .unwrap();
    }
    store.put_bytes("VERIFICATION_REPORT", b"{}").unwrap()
}

/// Three gate results of one of [`SKILLS`] for run `run_id`.
fn gate(ledger: &mut Ledger, run_id: i64, report: &kavi_ledger::Artifact) {
    let skill = SKILLS[usize::try_from(run_id).unwrap() % 2];
    let results: Vec<GateResult> = ["lint", "types", "tests"]
        .into_iter()
        .map(|gate| GateResult {
            gate: gate.into(),
            kind: "command".into(),
            required: true,
            status: "passed".into(),
            failure_kind: None,
            detail: None,
            tool: None,
            evidence: None,
        })
        .collect();
    ledger
        .record_verifications(run_id, "verify", Some(skill), None, true, &results, report)
        .unwrap();
}

fn execute(ledger: &Ledger, i: usize) {
    let at = jiff::Timestamp::from_second(1_700_000_000 + i64::try_from(i).unwrap())
        .unwrap()
        .to_string();
    ledger
        .record_execution(&ExecutionRecord {
            execution_id: format!("e{i:05}"),
            parent_execution_id: None,
            skill: SKILLS[0].into(),
            source_hash: None,
            skill_version: Some(1),
            side_effect: "READ_ONLY".into(),
            input: Some(serde_json::json!({ "text": "a b" })),
            output: Some(serde_json::json!({ "words": 2 })),
            success: true,
            error: None,
            started_at: at.clone(),
            finished_at: at,
            duration_ms: 1,
            chain: None,
            step: None,
            run_id: None,
            confinement: None,
            caller: None,
        })
        .unwrap();
}

fn fill(workspace: &Workspace) {
    let started = Instant::now();
    let path = &workspace.config.ledger;
    let mut ledger = Ledger::open(path).unwrap();
    let owner = Owner::claim(path, &workspace.root).unwrap();
    let report = propose(&mut ledger, workspace);
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
        gate(&mut ledger, id, &report);
    }
    for i in 0..EXECUTIONS {
        execute(&ledger, i);
    }
    println!(
        "filled a ledger with {RUNS} runs, {} gate results and {EXECUTIONS} executions in {:.1} s",
        RUNS * 3,
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
    // Half way down both of the skill's lists: the gate results of the middle run (ids count up
    // three a run) and the middle execution.
    let skill = format!("/skills/{}", SKILLS[0]);
    let deep_skill = format!(
        "{skill}?verifications_before={}&executions_before={}&executions_before_id=e{:05}",
        RUNS / 2 * 3,
        jiff::Timestamp::from_second(1_700_000_000 + i64::try_from(EXECUTIONS / 2).unwrap())
            .unwrap(),
        EXECUTIONS / 2
    );
    let mut over = Vec::new();
    for (name, path, timed) in [
        ("runs, first page", "/runs", true),
        ("runs, a page half way down", deep.as_str(), false),
        ("runs, failed only", "/runs?status=failed", false),
        ("review queue", "/", false),
        ("a skill, first page", skill.as_str(), true),
        ("a skill, half way down", deep_skill.as_str(), false),
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
        if timed && median > TARGET {
            over.push(name);
        }
    }
    if !over.is_empty() {
        println!("over the target of {TARGET:?}: {}", over.join(", "));
        std::process::exit(1);
    }
}
