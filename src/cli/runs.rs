//! `kavi runs list|show` and `kavi spec show`.

use super::output::{duration_ms, mark, short_hash, table};
use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::ledger::{Ledger, LedgerError, RunFilter};

fn open(workspace: &Workspace) -> Result<Ledger, Error> {
    Ok(Ledger::open_existing(&workspace.config.ledger)?)
}

pub fn list(
    workspace: &Workspace,
    filter: &RunFilter,
    limit: usize,
    json: bool,
) -> Result<i32, Error> {
    // No ledger is no runs: listing must not make one.
    let runs = match open(workspace) {
        Err(Error::Ledger(LedgerError::Missing(_))) => Vec::new(),
        ledger => ledger?.find_runs(filter, limit)?,
    };
    if json {
        super::print_json(&runs);
        return Ok(exit::SUCCESS);
    }
    if runs.is_empty() {
        outln!("no runs yet; start one with: kavi pipeline run <file>");
        return Ok(exit::SUCCESS);
    }
    let mut rows = vec![
        vec![
            "RUN", "PARENT", "STATUS", "PIPELINE", "STARTED", "DURATION", "SPEC",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>(),
    ];
    for run in &runs {
        rows.push(vec![
            run.id.to_string(),
            run.parent_run.map_or_else(|| "-".into(), |p| p.to_string()),
            run.status.to_string(),
            run.pipeline.clone(),
            run.started_at.clone(),
            run.duration_ms.map_or_else(|| "-".into(), duration_ms),
            short_hash(&run.spec_hash),
        ]);
    }
    out!("{}", table(&rows));
    if runs.len() == limit {
        let all = open(workspace)?.count_runs(filter)?;
        let more = all.saturating_sub(runs.len() as u64);
        match more {
            0 => {}
            1 => errln!("1 more run matches; show it with --limit {all}"),
            _ => errln!("{more} more runs match; show them all with --limit {all}"),
        }
    }
    Ok(exit::SUCCESS)
}

pub fn show(workspace: &Workspace, reference: &str, json: bool) -> Result<i32, Error> {
    let ledger = open(workspace)?;
    let detail = ledger.run_detail(ledger.resolve_run(reference)?)?;
    if json {
        super::print_json(&detail);
        return Ok(exit::SUCCESS);
    }
    let run = &detail.run;
    outln!("run {}: {} {}", run.id, run.pipeline, run.status);
    outln!("  spec      {} ({})", run.spec_hash, run.spec_path);
    if let Some(hash) = &run.governing_hash {
        outln!(
            "  governed  {hash} ({} files, listed below)",
            detail.governing.len()
        );
    }
    outln!("  params    {}", run.params);
    outln!("  started   {}", run.started_at);
    if let Some(finished) = &run.finished_at {
        let took = run
            .duration_ms
            .map_or_else(String::new, |ms| format!(" ({})", duration_ms(ms)));
        outln!("  finished  {finished}{took}");
    }
    if let Some(parent) = run.parent_run {
        outln!("  parent    run {parent}");
    }
    if let Some(resumed) = run.resumed_from {
        // `kavi approve` resumes a run it approved; `kavi runs resume` one that failed.
        let how = match ledger.run(resumed).map(|r| r.status) {
            Ok(crate::state::RunStatus::Approved) => ", approved after review".to_owned(),
            Ok(status) => format!(", which {status}; its succeeded nodes are reused"),
            Err(_) => String::new(),
        };
        outln!("  resumes   run {resumed}{how}");
    }
    if let Some(changes) = &run.allowed_changes {
        outln!("  allowed   resumed over changed rules (--allow-changed):");
        for change in changes.lines() {
            outln!("              {change}");
        }
    }
    if let Some(serde_json::Value::Object(settings)) = &run.local_settings {
        outln!("  machine   its machine's own settings (recorded, not governing):");
        for (name, value) in settings {
            let shown = match value {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            outln!("              {name:<14} {shown}");
        }
    }
    if let Some(error) = &run.error {
        outln!("  note      {error}");
    }
    if !detail.children.is_empty() {
        let children: Vec<String> = detail
            .children
            .iter()
            .map(|c| format!("{} ({} {})", c.id, c.pipeline, c.status))
            .collect();
        outln!("  children  {}", children.join(", "));
    }
    outln!();
    let mut rows = vec![
        vec![
            "", "NODE", "KIND", "STATE", "TRY", "DURATION", "EXIT", "DETAIL",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>(),
    ];
    for node in &detail.nodes {
        rows.push(vec![
            mark(node.state).to_owned(),
            node.node_id.clone(),
            node.kind.clone(),
            node.state.to_string(),
            node.attempt.to_string(),
            node.duration_ms.map_or_else(|| "-".into(), duration_ms),
            node.exit_code.map_or_else(|| "-".into(), |c| c.to_string()),
            node.error
                .clone()
                .or_else(|| node.reason.clone())
                .unwrap_or_default(),
        ]);
    }
    out!("{}", table(&rows));
    let confined: Vec<Vec<String>> = detail
        .nodes
        .iter()
        .filter_map(|node| {
            let record = node.outputs.as_ref()?.get("confinement")?;
            Some(vec![
                format!("  {}", node.node_id),
                describe_confinement(record)?,
            ])
        })
        .collect();
    if !confined.is_empty() {
        outln!();
        outln!("confinement:");
        out!("{}", table(&confined));
    }
    if !detail.governing.is_empty() {
        let rows: Vec<Vec<String>> = detail
            .governing
            .iter()
            .map(|member| {
                vec![
                    format!("  {}", member.role),
                    member.path.clone(),
                    short_hash(&member.spec_hash),
                ]
            })
            .collect();
        outln!();
        outln!("governed by (`kavi spec show HASH` prints one):");
        out!("{}", table(&rows));
    }
    Ok(exit::SUCCESS)
}

/// One line for a node's confinement record: the role, how it was enforced (or why not), and
/// the policy it came from.
fn describe_confinement(record: &serde_json::Value) -> Option<String> {
    let role = record.get("role")?.as_str()?;
    let enforced = record["enforced"].as_str().unwrap_or("none");
    let mut line = format!("{role}: {enforced}");
    if let Some(reason) = record["unconfined_because"].as_str() {
        line.push_str(&format!(" ({reason})"));
    }
    if let (Some(path), Some(hash)) = (record["policy"].as_str(), record["policy_hash"].as_str()) {
        line.push_str(&format!(", {path} {}", short_hash(hash)));
    }
    Some(line)
}

pub fn spec_show(workspace: &Workspace, hash: &str) -> Result<i32, Error> {
    let (_, text) = open(workspace)?.spec_text(hash)?;
    out!("{text}");
    Ok(exit::SUCCESS)
}

/// Prints a stored artifact, wherever it is kept, its hash checked before a byte is printed: a
/// file in the store is read twice rather than held (a node's log may be gigabytes). A reader
/// that went away (`kavi runs logs RUN NODE | head`) ends the command quietly, as `outln!` does.
fn print_artifact(workspace: &Workspace, sha256: &str) -> Result<(), Error> {
    use std::io::Write as _;
    let unreadable = |reason: String| Error::Io {
        context: format!("failed to read artifact sha256:{sha256}"),
        source: std::io::Error::other(reason),
    };
    let kept = open(workspace)?.kept_artifact(sha256).map_err(unreadable)?;
    let mut stdout = Watched {
        inner: std::io::stdout().lock(),
        failed: None,
    };
    // On a terminal, an artifact (a builder's log, a skill's output) is shown, never obeyed:
    // its control characters are escaped. Piped, its bytes go out as stored.
    let on_terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let printed = match kept {
        Some(bytes) if on_terminal => stdout
            .write_all(&super::output::terminal_safe(&bytes))
            .map_err(|e| e.to_string()),
        Some(bytes) => stdout.write_all(&bytes).map_err(|e| e.to_string()),
        None if on_terminal => {
            let store = super::open_store(workspace)?;
            let mut bytes = Vec::new();
            store.copy_out(sha256, &mut bytes).map_err(unreadable)?;
            stdout
                .write_all(&super::output::terminal_safe(&bytes))
                .map_err(|e| e.to_string())
        }
        None => {
            let store = super::open_store(workspace)?;
            store
                .copy_out(sha256, &mut std::io::sink())
                .map_err(unreadable)?;
            store.copy_out(sha256, &mut stdout)
        }
    }
    .and_then(|()| stdout.flush().map_err(|e| e.to_string()));
    match (printed, stdout.failed) {
        (_, Some(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        (_, Some(source)) => Err(Error::Io {
            context: "failed to write to stdout".into(),
            source,
        }),
        (printed, None) => printed.map_err(unreadable),
    }
}

/// A writer that keeps its first error: what a copy reports in words, the caller still tells
/// apart by kind.
struct Watched<W> {
    inner: W,
    failed: Option<std::io::Error>,
}

impl<W: std::io::Write> std::io::Write for Watched<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf).inspect_err(|e| self.keep(e))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().inspect_err(|e| self.keep(e))
    }
}

impl<W> Watched<W> {
    fn keep(&mut self, e: &std::io::Error) {
        if self.failed.is_none() {
            self.failed = Some(std::io::Error::new(e.kind(), e.to_string()));
        }
    }
}

/// What a node wrote to stdout or stderr in its last attempt, as the ledger kept it; of a node
/// still running, what it has printed so far (its live log). Following (`-f`), it prints what
/// the node prints until the node ends, and exits 0 when it succeeded, 1 when not.
pub fn logs(
    workspace: &Workspace,
    run: &str,
    node: &str,
    stderr: bool,
    follow: bool,
) -> Result<i32, Error> {
    let mut ledger = open(workspace)?;
    let run_id = ledger.resolve_run(run)?;
    let role = if stderr { "stderr" } else { "stdout" };
    let mut attempt = last_attempt(&ledger, run_id, node)?;
    let mut printed_live = false;
    if !attempt.state.is_terminal() {
        let owner = ledger.run_owner(run_id)?;
        let live = crate::ledger::live_log(
            &super::open_store(workspace)?.temp_dir(),
            &owner,
            run_id,
            node,
            role,
        );
        let mut tail = crate::ledger::LiveTail::new(live);
        if !follow {
            copy_live(tail.read())?;
            return Ok(exit::SUCCESS);
        }
        let mut tails = [tail];
        let ended = ledger.follow_live(
            &mut tails,
            |_, read| copy_live(read),
            |ledger| {
                let attempt = last_attempt(ledger, run_id, node)?;
                Ok::<_, Error>(attempt.state.is_terminal().then_some(attempt))
            },
        )?;
        // A reader that went away (`| head`) ends the follow, quietly.
        let Some(ended) = ended else {
            return Ok(exit::SUCCESS);
        };
        (attempt, printed_live) = (ended, tails[0].opened());
    }
    // A node that ended before its output could be followed: it is all in the ledger.
    if !printed_live {
        print_kept(workspace, run_id, &attempt, role)?;
    }
    Ok(match follow {
        true if !attempt.state.is_success() => exit::RUN_FAILED,
        _ => exit::SUCCESS,
    })
}

/// The last attempt of node `node` in run `run_id`.
fn last_attempt(
    ledger: &Ledger,
    run_id: i64,
    node: &str,
) -> Result<crate::ledger::NodeRunRow, Error> {
    let detail = ledger.run_detail(run_id)?;
    if let Some(attempt) = crate::ledger::final_attempts(&detail.nodes)
        .into_iter()
        .find(|n| n.node_id == node)
    {
        return Ok(attempt.clone());
    }
    let known: Vec<&str> = detail.nodes.iter().map(|n| n.node_id.as_str()).collect();
    Err(Error::NotFound(format!(
        "run {run_id} has no node `{node}` (its nodes: {})",
        known.join(", ")
    )))
}

/// Prints what was read of a live log; `false` once stdout's reader has gone.
fn copy_live(read: std::io::Result<Vec<u8>>) -> Result<bool, Error> {
    use std::io::Write as _;
    let bytes = read.map_err(|source| Error::Io {
        context: "failed to read the node's live log".into(),
        source,
    })?;
    if bytes.is_empty() {
        return Ok(true);
    }
    let bytes = if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        super::output::terminal_safe(&bytes).into_owned()
    } else {
        bytes
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&bytes).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        written => written.map(|()| true).map_err(|source| Error::Io {
            context: "failed to write to stdout".into(),
            source,
        }),
    }
}

/// Prints what `attempt` of a node in run `run_id` kept of `role`.
fn print_kept(
    workspace: &Workspace,
    run_id: i64,
    attempt: &crate::ledger::NodeRunRow,
    role: &str,
) -> Result<(), Error> {
    // A build node keeps its builder's output, both streams, as its `log`.
    let found = attempt
        .artifacts
        .iter()
        .find(|a| a.role == role)
        .or_else(|| {
            (role == "stdout")
                .then(|| attempt.artifacts.iter().find(|a| a.role == "log"))
                .flatten()
        });
    // An exec node keeps no artifact of a stream it wrote nothing to; its outputs say so.
    if found.is_none() && attempt.outputs.as_ref().is_some_and(|o| o[role] == "") {
        return Ok(());
    }
    let Some(artifact) = found else {
        let kept: Vec<String> = attempt
            .artifacts
            .iter()
            .map(|a| format!("{} {}", a.role, short_hash(&a.sha256)))
            .collect();
        let kept = if kept.is_empty() {
            "nothing".to_owned()
        } else {
            format!("{} (`kavi artifact cat HASH` prints one)", kept.join(", "))
        };
        return Err(Error::NotFound(format!(
            "node `{}` of run {run_id} kept no {role}; it kept {kept}",
            attempt.node_id
        )));
    };
    print_artifact(workspace, &artifact.sha256)
}

pub fn artifact_cat(workspace: &Workspace, hash: &str) -> Result<i32, Error> {
    let artifact = open(workspace)?.artifact(hash)?;
    print_artifact(workspace, &artifact.sha256)?;
    Ok(exit::SUCCESS)
}
