//! `kavi executor`: a resident process that keeps sandboxes for READ_ONLY skills started ahead,
//! so that `kavi skill run` pays for a run and not for making its sandbox.
//!
//! Each sandbox is a READ_ONLY skill's confinement, made as a direct run makes it, around the
//! profile's Python waiting for its script (`kavi_forge::executions::Runner::prestart`); it
//! serves one run and ends with it. `kavi skill run`, `kavi mcp`, `kavi chat` and chains ask
//! over a unix socket beside the ledger's locks (among the workspace's state paths, so hidden
//! from every confined view), from the same account only (`kavi_forge::executions::pool`); the
//! executor runs the trust check, the run and its records as `kavi skill run` does, under the
//! rules that govern at that run, on the one ledger connection it holds, and answers with the
//! record. Whatever it cannot serve (a skill of another class, a refusal, a view that changed, a
//! run already under way) it answers with no record, and the caller runs the skill itself.

use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::skills::SkillEnv;
use crate::config::{Overrides, Workspace};
use crate::error::{Error, exit};
use crate::executions::pool::{Reply, Request};
use crate::executions::{Claim, Prestarted};
use crate::ledger::Ledger;

/// Sandboxes kept started: a run takes one and the next is ready for a run right after it.
const POOL_SIZE: usize = 2;

/// The most a request may hold: a skill's input is read whole, as `--input` is.
const REQUEST_LIMIT: u64 = 16 << 20;

/// Runs the executor in the foreground until SIGINT or SIGTERM, or until no request came for
/// `idle_timeout`; every sandbox it started ends before it returns.
pub async fn run(
    workspace: Workspace,
    overrides: &Overrides,
    idle_timeout: Duration,
) -> Result<i32, Error> {
    // Nothing to run without a ledger, and the executor must not make one.
    let mut ledger = Held::open(&workspace.config.ledger)?;
    let mut env = SkillEnv::load(&workspace)?;
    let path = crate::executions::pool::socket(&workspace.config.ledger);
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
            let _ = answer(stream, &Reply::default()).await;
            break "kavi.toml changed; start it again";
        }
        let served = {
            let serving = serve(
                &mut env,
                &workspace,
                &mut ledger,
                stream,
                &mut pool,
                &shutdown,
            );
            tokio::pin!(serving);
            // One run at a time: a caller that comes meanwhile runs its skill itself.
            loop {
                tokio::select! {
                    served = &mut serving => break served,
                    accepted = listener.accept() => {
                        if let Ok((other, _)) = accepted {
                            let _ = answer(other, &Reply::default()).await;
                        }
                    }
                }
            }
        };
        // A sandbox refused for its view (a policy changed, a new file to hide) has siblings
        // started with the same view: all go, and the new ones see the workspace as it is.
        if matches!(served, Some(Claim::OtherView)) {
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
/// sandbox from the pool, and answers with the record, or with none. What became of the
/// sandbox it took, if it took one.
async fn serve(
    env: &mut SkillEnv,
    workspace: &Workspace,
    ledger: &mut Held,
    stream: UnixStream,
    pool: &mut VecDeque<Prestarted>,
    shutdown: &CancellationToken,
) -> Option<Claim> {
    let same_account = stream
        .peer_cred()
        .is_ok_and(|peer| peer.uid() == nix::unistd::getuid().as_raw());
    if !same_account {
        tracing::warn!("executor: refused a connection from another account");
        return None;
    }
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader.take(REQUEST_LIMIT));
    let mut line = String::new();
    let request: Request = match reader.read_line(&mut line).await {
        Ok(_) => serde_json::from_str(&line).ok()?,
        // Nothing was asked: no sandbox was taken.
        Err(_) => return None,
    };
    // A caller gone (Ctrl-C), or one that closes its side of the connection, cancels its
    // run, as Ctrl-C does a direct one.
    let cancel = shutdown.child_token();
    let gone = cancel.clone();
    let watch = tokio::spawn(async move {
        let mut rest = Vec::new();
        let _ = reader.read_to_end(&mut rest).await;
        gone.cancel();
    });
    // The run's folders and cgroups are removed after the answer: its client waits for none
    // of it (the run's processes are gone before its record is written).
    let leftovers = crate::executions::Deferred::default();
    let claimed = claim(env, workspace, ledger, &request, pool, &leftovers, &cancel).await;
    watch.abort();
    let reply = match &claimed {
        Some(Claim::Ran(record)) => Reply {
            record: Some(record.as_ref().clone()),
            // The run went by the rules read for it: the caller says so as a direct run does.
            warning: super::skills::weakening_warning(&env.rules),
        },
        _ => Reply::default(),
    };
    let _ = writer
        .write_all(format!("{}\n", json!(reply)).as_bytes())
        .await;
    drop(writer);
    drop(leftovers);
    claimed
}

/// Runs the request's skill in the pool's first live sandbox, under the policies as their
/// files are now: what became of the sandbox, or `None` when none was taken.
async fn claim(
    env: &mut SkillEnv,
    workspace: &Workspace,
    ledger: &mut Held,
    request: &Request,
    pool: &mut VecDeque<Prestarted>,
    leftovers: &crate::executions::Deferred,
    cancel: &CancellationToken,
) -> Option<Claim> {
    // Another workspace on this ledger (its socket is the ledger's), or a caller whose run
    // goes by other settings: it runs the skill itself, in its own folder, by its own rules.
    if request.caller != env.runner(workspace, true).caller() {
        tracing::warn!(
            "executor: not serving a caller in {} (this executor serves {} with its own \
             settings)",
            request.caller.root.display(),
            workspace.root.display()
        );
        return None;
    }
    let connection = ledger.current(&workspace.config.ledger).ok()?;
    let reloaded = env.reload(workspace, &crate::executions::lock(connection));
    if let Err(e) = reloaded {
        // The caller runs the skill itself, and says why where it is refused too. The next
        // run opens the ledger again, in case the connection is what failed.
        tracing::warn!("executor: reading the rules again failed: {e}");
        ledger.forget();
        return None;
    }
    let sandbox = loop {
        let sandbox = pool.pop_front()?;
        if sandbox.alive() {
            break sandbox;
        }
    };
    let runner = env
        .runner(workspace, true)
        .holding(connection)
        .deferring(leftovers);
    match runner.run_prestarted(request, cancel, sandbox).await {
        Ok(claimed) => Some(claimed),
        Err(e) => {
            tracing::warn!("executor: running `{}` failed: {e}", request.skill);
            // The next run opens the ledger again, in case the connection is what failed.
            ledger.forget();
            Some(Claim::Declined)
        }
    }
}

/// The executor's one connection to the ledger, kept across runs while the ledger is the same
/// file: one moved or replaced (restored from a copy, say) is opened again.
struct Held {
    ledger: std::sync::Mutex<Ledger>,
    /// The file's device and inode when it was opened; `None` for a server's ledger.
    file: Option<(u64, u64)>,
    stale: bool,
}

impl Held {
    fn open(path: &Path) -> Result<Self, Error> {
        let ledger = Ledger::open_existing(path)?;
        Ok(Self {
            ledger: std::sync::Mutex::new(ledger),
            file: file_id(path),
            stale: false,
        })
    }

    /// The connection, opened again first when the file it was opened on is not the one at
    /// `path` any more, or a run failed on it.
    fn current(&mut self, path: &Path) -> Result<&std::sync::Mutex<Ledger>, Error> {
        if self.stale || file_id(path) != self.file {
            *self = Self::open(path)?;
        }
        Ok(&self.ledger)
    }

    fn forget(&mut self) {
        self.stale = true;
    }
}

/// A ledger file's device and inode (`None` for a server's ledger, or no file).
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    if crate::ledger::postgres_url(path).is_some() {
        return None;
    }
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Writes one answer line and closes the connection.
async fn answer(mut stream: UnixStream, reply: &Reply) -> std::io::Result<()> {
    stream
        .write_all(format!("{}\n", json!(reply)).as_bytes())
        .await
}
