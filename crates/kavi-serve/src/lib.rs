//! `kavi serve`: the review page. The runs, a run's nodes and outputs, and the review queue with
//! each stopped run's evidence on one page, served as HTML from the same ledger and through the
//! same functions as the CLI; the approve and reject forms decide through
//! `kavi_governance::review::decide`, as `kavi approve` and `kavi reject` do.
//!
//! Pages are rendered on the server (minijinja, which kavi already builds for its templates) and
//! need no JavaScript to read; the style sheet, and the one script (which follows a running
//! node's output), are compiled into the binary.

mod evidence;
mod forms;
mod graph;
mod live;
mod pages;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

use kavi_governance::adoption::FileChange;
use kavi_ledger::RunRow;
use kavi_spec::config::Workspace;

/// Why the server did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A bind address other than loopback without `--allow-remote`: the page decides for the
    /// account running it, and anyone who can reach the port would decide as that account.
    #[error(
        "refusing to serve on {0}: it is not a loopback address, and whoever reaches it approves \
         as the account running kavi; serve on 127.0.0.1 (and reach it over ssh -L), or pass \
         --allow-remote to accept that"
    )]
    NotLoopback(SocketAddr),
    #[error("failed to listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the server stopped: {0}")]
    Io(#[from] std::io::Error),
}

/// What only the binary can do, which the page asks of it: the binary holds the pipeline loader
/// and the executor, which stand above this crate.
pub trait Cli: Send + Sync + 'static {
    /// What changed in the files that govern run `run_id` since it ran, as `kavi policy diff RUN`
    /// reports it.
    fn policy_diff(&self, workspace: &Workspace, run_id: i64) -> Result<Vec<FileChange>, String>;
    /// Why node `node` of run `run_id` ran or did not, as `kavi explain RUN NODE --json` prints it.
    fn explain(
        &self,
        workspace: &Workspace,
        run_id: i64,
        node: &str,
    ) -> Result<serde_json::Value, String>;
    /// The graph of run `run_id` as the spec it kept declares it, as `kavi pipeline graph`
    /// draws it: each node with the nodes it depends on, in a topological order.
    fn graph(
        &self,
        workspace: &Workspace,
        run_id: i64,
    ) -> Result<Vec<(String, Vec<String>)>, String>;
    /// What verifying the ledger finds, as `kavi ledger verify --json` prints it.
    fn ledger_verify(&self, workspace: &Workspace) -> Result<serde_json::Value, String>;
    /// Resumes an approved run as `kavi approve` does (its pipeline runs again with the same
    /// parameters), without waiting for it: the page shows the run as it goes.
    fn resume(&self, workspace: &Workspace, root: RunRow);
}

/// Where to listen.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub addr: SocketAddr,
    /// Serve on an address other than loopback.
    pub allow_remote: bool,
}

/// What every request shares.
struct App {
    workspace: Workspace,
    /// Served beyond loopback (`--allow-remote`): any `Host` is answered.
    allow_remote: bool,
    cli: Box<dyn Cli>,
    /// The forms' token: random for each start of the server, so a page from another site
    /// cannot know it.
    token: String,
    /// What a request must carry to be answered (see [`session`]): random for each start, and
    /// told only to whoever started the server.
    key: String,
    /// The port listened on, which names the key's cookie.
    port: u16,
    templates: minijinja::Environment<'static>,
}

type Shared = Arc<App>;

/// Serves until the process is stopped. `ready` is told the address listened on (the port the
/// system chose for port 0) and the key a request must carry (`?key=` once, then its cookie).
pub async fn serve(
    workspace: Workspace,
    options: Options,
    cli: Box<dyn Cli>,
    ready: impl FnOnce(SocketAddr, &str),
) -> Result<(), ServeError> {
    if !options.addr.ip().is_loopback() && !options.allow_remote {
        return Err(ServeError::NotLoopback(options.addr));
    }
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: options.addr,
            source,
        })?;
    let addr = listener.local_addr()?;
    let app = Arc::new(App {
        workspace,
        allow_remote: options.allow_remote,
        cli,
        token: uuid::Uuid::new_v4().simple().to_string(),
        key: uuid::Uuid::new_v4().simple().to_string(),
        port: addr.port(),
        templates: pages::templates(),
    });
    ready(addr, &app.key);
    axum::serve(listener, router(app)).await?;
    Ok(())
}

fn router(app: Shared) -> Router {
    Router::new()
        .route("/", get(pages::queue))
        .route("/runs", get(pages::runs))
        .route("/runs/{id}", get(pages::run))
        .route("/runs/{id}/nodes/{node}", get(pages::node))
        .route("/runs/{id}/nodes/{node}/live", get(live::follow))
        .route("/runs/{id}/decide", post(forms::decide))
        .route("/rules/{id}/decide", post(forms::decide_rules))
        .route("/skills", get(pages::skills))
        .route("/skills/{name}", get(pages::skill))
        .route("/ledger", get(pages::ledger))
        .route("/style.css", get(pages::style))
        .route("/live.js", get(live::script))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            session::with_key,
        ))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            forms::loopback_host,
        ))
        .with_state(app)
}
