//! `kavi executor`: a resident process that keeps sandboxes for READ_ONLY skills started ahead,
//! so that `kavi skill run` pays for a run and not for making its sandbox.
//!
//! Each sandbox is a READ_ONLY skill's confinement, made as a direct run makes it, around the
//! profile's Python waiting for its script (`kavi_forge::executions::Runner::prestart`); it
//! serves one run and ends with it. `kavi skill run` asks over a unix socket beside the ledger's
//! locks (among the workspace's state paths, so hidden from every confined view), from the same
//! account only; the executor runs the trust check, the run and its records as `kavi skill run`
//! does, on its own ledger connection, and answers with the record. Whatever it cannot serve (a
//! skill of another class, a refusal, a view that changed, a run already under way) it answers
//! with no record, and the caller runs the skill itself.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::skills::SkillEnv;
use crate::config::{Overrides, Workspace};
use crate::error::{Error, exit};
use crate::executions::{Lineage, Prestarted};
use crate::ledger::ExecutionRecord;

/// Sandboxes kept started: a run takes one and the next is ready for a run right after it.
const POOL_SIZE: usize = 2;

/// The most a request may hold: a skill's input is read whole, as `--input` is.
const REQUEST_LIMIT: u64 = 16 << 20;

/// The executor's socket for a workspace: in the ledger's locks folder, which every confined
/// view and the builder's sandbox hide.
pub fn socket(workspace: &Workspace) -> PathBuf {
    crate::ledger::locks_dir(&workspace.config.ledger).join("executor.sock")
}

/// Runs the executor in the foreground until SIGINT or SIGTERM, or until no request came for
/// `idle_timeout`; every sandbox it started ends before it returns.
pub async fn run(
    workspace: Workspace,
    overrides: &Overrides,
    idle_timeout: Duration,
) -> Result<i32, Error> {
    // Nothing to run without a ledger, and the executor must not make one.
    drop(crate::ledger::Ledger::open_existing(
        &workspace.config.ledger,
    )?);
    let mut env = SkillEnv::load(&workspace)?;
    let path = socket(&workspace);
    let listener = listen(&path).await?;
    let shutdown = super::cancel_on_signals("the executor");
    let started_config = workspace.run_config();
    let mut pool = VecDeque::new();
    fill(&env, &workspace, &mut pool, &shutdown);
    errln!(
        "executor: {} READ_ONLY sandboxes started ahead; `kavi skill run` uses them (socket {})",
        pool.len(),
        path.display()
    );
    let ended = loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => break "stopped",
            () = tokio::time::sleep(idle_timeout) => break "idle",
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("executor: accepting a connection failed: {e}");
                    continue;
                }
            },
        };
        // kavi.toml changed: its ledger, log or timeout may not be this executor's any more.
        let fresh = Workspace::load(Some(&workspace.root), overrides).ok();
        if fresh.as_ref().map(Workspace::run_config) != Some(started_config.clone()) {
            let _ = answer(stream, &json!({ "record": null })).await;
            break "kavi.toml changed; start it again";
        }
        let served = {
            let serving = serve(&mut env, &workspace, stream, &mut pool, &shutdown);
            tokio::pin!(serving);
            // One run at a time: a caller that comes meanwhile runs its skill itself.
            loop {
                tokio::select! {
                    served = &mut serving => break served,
                    accepted = listener.accept() => {
                        if let Ok((other, _)) = accepted {
                            let _ = answer(other, &json!({ "record": null })).await;
                        }
                    }
                }
            }
        };
        // A sandbox refused for its view (a policy changed, a new file to hide) has siblings
        // started with the same view: all go, and the new ones see the workspace as it is.
        if !served {
            for sandbox in pool.drain(..) {
                sandbox.discard().await;
            }
        }
        fill(&env, &workspace, &mut pool, &shutdown);
    };
    drop(listener);
    let _ = std::fs::remove_file(&path);
    for sandbox in pool {
        sandbox.discard().await;
    }
    errln!("executor: ended ({ended}); no sandbox it started is left");
    Ok(exit::SUCCESS)
}

/// Binds the socket, refusing when another executor answers there; a socket left by one that
/// died is replaced.
async fn listen(path: &Path) -> Result<UnixListener, Error> {
    let io = |context: String| move |source| Error::Io { context, source };
    if UnixStream::connect(path).await.is_ok() {
        return Err(Error::Usage(format!(
            "an executor already serves this workspace (socket {})",
            path.display()
        )));
    }
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(io(format!("failed to remove {}", path.display()))(e));
    }
    let listener =
        UnixListener::bind(path).map_err(io(format!("failed to listen on {}", path.display())))?;
    // Only this account connects; the peer's uid is checked on every connection too.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io(format!("failed to restrict {}", path.display())))?;
    Ok(listener)
}

/// Tops the pool up to [`POOL_SIZE`] live sandboxes.
fn fill(
    env: &SkillEnv,
    workspace: &Workspace,
    pool: &mut VecDeque<Prestarted>,
    shutdown: &CancellationToken,
) {
    pool.retain(Prestarted::alive);
    let runner = env.runner(workspace, true);
    while pool.len() < POOL_SIZE {
        match runner.prestart(shutdown) {
            Ok(sandbox) => pool.push_back(sandbox),
            Err(reason) => {
                tracing::warn!("executor: cannot start a sandbox ahead: {reason}");
                return;
            }
        }
    }
}

/// Serves one connection: checks the caller's account, reads its request, runs the skill in a
/// sandbox from the pool, and answers with the record, or with none. `false` when a sandbox
/// was taken and could not serve the run.
async fn serve(
    env: &mut SkillEnv,
    workspace: &Workspace,
    stream: UnixStream,
    pool: &mut VecDeque<Prestarted>,
    shutdown: &CancellationToken,
) -> bool {
    let same_account = stream
        .peer_cred()
        .is_ok_and(|peer| peer.uid() == nix::unistd::getuid().as_raw());
    if !same_account {
        tracing::warn!("executor: refused a connection from another account");
        return true;
    }
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader.take(REQUEST_LIMIT));
    let mut line = String::new();
    let request: Option<Value> = match reader.read_line(&mut line).await {
        Ok(_) => serde_json::from_str(&line).ok(),
        Err(_) => None,
    };
    let record = match request {
        // Nothing was asked: no sandbox was taken.
        None => return true,
        Some(request) => {
            // A caller gone (Ctrl-C) cancels its run, as Ctrl-C does a direct one.
            let cancel = shutdown.child_token();
            let gone = cancel.clone();
            let watch = tokio::spawn(async move {
                let mut rest = Vec::new();
                let _ = reader.read_to_end(&mut rest).await;
                gone.cancel();
            });
            let record = claim(env, workspace, &request, pool, &cancel).await;
            watch.abort();
            record
        }
    };
    let served = record.is_some();
    let reply = json!({ "record": record });
    let _ = writer.write_all(format!("{reply}\n").as_bytes()).await;
    served
}

/// Runs the request's skill in the pool's first live sandbox, after reading the policies
/// again: the record, or `None` where the caller must run it itself.
async fn claim(
    env: &mut SkillEnv,
    workspace: &Workspace,
    request: &Value,
    pool: &mut VecDeque<Prestarted>,
    cancel: &CancellationToken,
) -> Option<Value> {
    let name = request["skill"].as_str()?;
    let input = request.get("input")?.clone();
    env.reload(workspace).ok()?;
    let sandbox = loop {
        let sandbox = pool.pop_front()?;
        if sandbox.alive() {
            break sandbox;
        }
    };
    let runner = env.runner(workspace, true);
    match runner
        .run_prestarted(name, input, &Lineage::default(), cancel, sandbox)
        .await
    {
        Ok(record) => record.map(|record| serde_json::to_value(record).unwrap_or_default()),
        Err(e) => {
            tracing::warn!("executor: running `{name}` failed: {e}");
            None
        }
    }
}

/// Writes one answer line and closes the connection.
async fn answer(mut stream: UnixStream, reply: &Value) -> std::io::Result<()> {
    stream.write_all(format!("{reply}\n").as_bytes()).await
}

/// Asks a running executor to run `name` with `input`: the execution record it made, or `None`
/// when none answers, or it did not run the skill (the caller runs it itself then). A caller
/// stopped by a signal closes the connection, and the executor cancels the run and records it
/// cancelled.
pub async fn ask(workspace: &Workspace, name: &str, input: &Value) -> Option<ExecutionRecord> {
    let path = socket(workspace);
    let mut stream = UnixStream::connect(&path).await.ok()?;
    // Whoever can make the socket can listen on it: only an executor of this account (or
    // root's) is sent the skill's input or believed.
    let me = nix::unistd::getuid().as_raw();
    match stream.peer_cred().map(|peer| peer.uid()) {
        Ok(uid) if uid == me || uid == 0 => {}
        answered => {
            errln!(
                "warning: not asking the executor at {}: {}; running the skill here",
                path.display(),
                answered.map_or_else(
                    |e| format!("its account cannot be told ({e})"),
                    |uid| format!("it runs as another account (uid {uid})")
                )
            );
            return None;
        }
    }
    let request = json!({ "skill": name, "input": input });
    stream
        .write_all(format!("{request}\n").as_bytes())
        .await
        .ok()?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).await.ok()?;
    let mut reply: Value = serde_json::from_str(&reply).ok()?;
    serde_json::from_value(reply.get_mut("record")?.take()).ok()
}
