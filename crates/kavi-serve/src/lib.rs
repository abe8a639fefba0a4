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
    /// On loopback the page is served under a name that resolves to both 127.0.0.1 and ::1, so
    /// the server holds the port on both; another process holding the other would be sent the
    /// key by the browser of whoever opens the printed address.
    #[error(
        "refusing to serve on loopback port {port}: another process holds {taken}, where a \
         browser opening the printed address may connect instead of this server (with the key); \
         choose another port"
    )]
    TwinTaken { port: u16, taken: SocketAddr },
    /// A loopback address the printed name does not resolve to.
    #[error(
        "refusing to serve on {0}: the review page is served under a `.localhost` name, which \
         browsers resolve to 127.0.0.1 and ::1 only; bind one of those"
    )]
    NotNamedLoopback(SocketAddr),
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
    cli: Box<dyn Cli>,
    /// The forms' token: random for each start of the server, so a page from another site
    /// cannot know it.
    token: String,
    /// What a request must carry to be answered (see [`session`]): random for each start, and
    /// told only to whoever started the server.
    key: String,
    /// The `Host` every request must name, `None` when served beyond loopback (see
    /// [`session::named_host`]).
    host: Option<String>,
    templates: minijinja::Environment<'static>,
}

type Shared = Arc<App>;

/// Where the server answers, told to whoever started it and no one else.
#[derive(Debug, Clone)]
pub struct Address {
    /// A socket listened on (the port the system chose for port 0).
    pub addr: SocketAddr,
    /// What every request's `Host` must be: on loopback a name made at random for this start
    /// (`kavi-<hex>.localhost:PORT`), which browsers resolve to loopback themselves; beyond
    /// loopback the address listened on.
    pub host: String,
    /// What a request must carry to be answered (`?key=` once, then its cookie).
    pub key: String,
}

impl Address {
    /// The address to open: the first request sets the key's cookie.
    pub fn url(&self) -> String {
        format!("http://{}/?key={}", self.host, self.key)
    }
}

/// Serves until the process is stopped. `ready` is told where it answers and the key.
pub async fn serve(
    workspace: Workspace,
    options: Options,
    cli: Box<dyn Cli>,
    ready: impl FnOnce(&Address),
) -> Result<(), ServeError> {
    let loopback = options.addr.ip().is_loopback() && !options.allow_remote;
    if !options.addr.ip().is_loopback() && !options.allow_remote {
        return Err(ServeError::NotLoopback(options.addr));
    }
    let (listener, twin) = if loopback {
        listen_on_loopback(options.addr).await?
    } else {
        (bind(options.addr).await?, None)
    };
    let addr = listener.local_addr()?;
    let host = if loopback {
        format!(
            "kavi-{}.localhost:{}",
            uuid::Uuid::new_v4().simple(),
            addr.port()
        )
    } else {
        addr.to_string()
    };
    let address = Address {
        addr,
        host,
        key: uuid::Uuid::new_v4().simple().to_string(),
    };
    let app = Arc::new(App {
        workspace,
        cli,
        token: uuid::Uuid::new_v4().simple().to_string(),
        key: address.key.clone(),
        host: loopback.then(|| address.host.clone()),
        templates: pages::templates(),
    });
    ready(&address);
    let router = router(app);
    match twin {
        Some(twin) => tokio::select! {
            served = axum::serve(listener, router.clone()) => served?,
            served = axum::serve(twin, router) => served?,
        },
        None => axum::serve(listener, router).await?,
    }
    Ok(())
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, ServeError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Listens on `addr` (127.0.0.1 or ::1) and on the same port of the other loopback address:
/// the printed name resolves to both, and a browser tries either, so no other process may
/// hold the other one. Without IPv6 (or IPv4) nobody can hold it. For port 0 a port free on
/// both is looked for.
async fn listen_on_loopback(
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, Option<tokio::net::TcpListener>), ServeError> {
    let other: std::net::IpAddr = match addr.ip() {
        ip if ip == std::net::Ipv4Addr::LOCALHOST => std::net::Ipv6Addr::LOCALHOST.into(),
        ip if ip == std::net::Ipv6Addr::LOCALHOST => std::net::Ipv4Addr::LOCALHOST.into(),
        _ => return Err(ServeError::NotNamedLoopback(addr)),
    };
    const TRIES: usize = 20;
    for _ in 0..TRIES {
        let listener = bind(addr).await?;
        let port = listener.local_addr()?.port();
        let taken = SocketAddr::new(other, port);
        match tokio::net::TcpListener::bind(taken).await {
            Ok(twin) => return Ok((listener, Some(twin))),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if addr.port() != 0 {
                    return Err(ServeError::TwinTaken { port, taken });
                }
            }
            // The address family or address is missing here: no process can hold it.
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrNotAvailable
                    || e.raw_os_error() == Some(EAFNOSUPPORT) =>
            {
                return Ok((listener, None));
            }
            Err(source) => {
                return Err(ServeError::Bind {
                    addr: taken,
                    source,
                });
            }
        }
    }
    Err(ServeError::Bind {
        addr,
        source: std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("no port was free on both 127.0.0.1 and ::1 in {TRIES} tries"),
        ),
    })
}

/// Linux's "address family not supported" (a kernel without IPv6).
const EAFNOSUPPORT: i32 = 97;

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
            session::named_host,
        ))
        .with_state(app)
}
