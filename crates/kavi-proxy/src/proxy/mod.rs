//! The network of a confined process that may use it: a proxy kavi runs, never the host's
//! network.
//!
//! A `network = true` profile still gets a network namespace of its own, with only loopback (the
//! design of Anthropic's sandbox runtime for coding agents on Linux). Its one way out is this
//! proxy: kavi listens, for that one launch, on a unix socket in a private folder, which is
//! mounted into the view at [`SOCKET_IN_VIEW`] (a unix socket is a file, and reaches across
//! network namespaces). Inside, kavi's own binary runs first as a bridge (kavi-process's
//! `confinement::bridge`, which starts the program and so is not here): it listens on
//! `127.0.0.1:`[`PORT`], forwards each connection to the socket, and runs the program as its
//! child, whose `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` name it.
//!
//! The proxy speaks HTTP/1 (hyper's server parses what the process sends): `CONNECT host:port`
//! for TLS and anything else that tunnels, and absolute-form `http://` requests, which it
//! forwards itself. Each target is checked against `[processes] allowed_hosts` of
//! `policies/network.toml`: a host not listed is refused with 403. A listed name is resolved
//! here, once, and refused if it leads to this machine, its link, a private network, or an
//! unspecified or multicast address (DNS rebinding onto the host's own services, its private
//! network or a cloud's metadata service): only an entry that is that address itself reaches
//! those. Redirects are handed back to the process,
//! never followed, so that the next hop is checked like the first. Every attempt, allowed or
//! refused and why, is kept for the ledger ([`ProxyLog`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

mod hosts;

use hosts::{Decision, Host, host_name, ip_literal, special};
pub use hosts::{HostAllowlist, HostPattern};

/// Where the proxy's socket is in the view.
pub const SOCKET_IN_VIEW: &str = "/run/kavi/proxy.sock";

/// The port the bridge listens on, on the view's own loopback.
pub const PORT: u16 = 3128;

/// How many client connections the proxy serves at once; more wait for one to end.
const MAX_CLIENTS: usize = 64;

/// How many connection records are kept; past that, only counted, except a first connection
/// to a destination it was allowed to reach (see [`MAX_DESTINATIONS`]).
const MAX_RECORDS: usize = 256;

/// How many more records, past [`MAX_RECORDS`], name a destination no kept record names as
/// reached: a process cannot hide where it went behind a flood of refused requests, and
/// ports of an allowed host cannot grow the record without end.
const MAX_DESTINATIONS: usize = 4096;

/// How long reaching an allowed host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// One connection the proxy was asked for, and what it did.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Connection {
    /// `CONNECT`, or the method of a forwarded `http://` request.
    pub method: String,
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    /// The entry that allowed it, or why it was refused.
    pub reason: String,
    /// The address it was connected to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Allowed, but the host could not be reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a launch's proxy saw: the first [`MAX_RECORDS`] connections and then the first to each
/// destination it reached, and how many it allowed and refused in all.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ProxyLog {
    pub connections: Vec<Connection>,
    pub allowed: u64,
    pub refused: u64,
    /// Connections counted but not kept.
    pub unrecorded: u64,
    /// The destinations (host, port) of the allowed connections kept.
    #[serde(skip)]
    reached: std::collections::HashSet<(String, u16)>,
}

impl ProxyLog {
    fn push(&mut self, connection: Connection) {
        if connection.allowed {
            self.allowed += 1;
        } else {
            self.refused += 1;
        }
        tracing::debug!(?connection, "proxy");
        // One destination however it is spelled; reached only when it was connected to.
        let destination = (
            connection.host.trim_end_matches('.').to_ascii_lowercase(),
            connection.port,
        );
        let reached = connection.allowed && connection.address.is_some();
        let new_destination = reached && !self.reached.contains(&destination);
        let keep = self.connections.len() < MAX_RECORDS
            || (new_destination && self.connections.len() < MAX_RECORDS + MAX_DESTINATIONS);
        if keep {
            if reached {
                self.reached.insert(destination);
            }
            self.connections.push(connection);
        } else {
            self.unrecorded += 1;
        }
    }
}

/// A proxy's socket, bound in a private folder, not yet served.
#[derive(Debug)]
pub struct Listening {
    dir: tempfile::TempDir,
    listener: std::os::unix::net::UnixListener,
    hosts: Arc<HostAllowlist>,
}

impl Listening {
    /// The private folder the socket is in.
    pub fn folder(&self) -> &Path {
        self.dir.path()
    }

    /// Binds a socket for `hosts` in a new private folder.
    pub fn bind(hosts: Arc<HostAllowlist>) -> std::io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("kavi-proxy-").tempdir()?;
        let listener = std::os::unix::net::UnixListener::bind(dir.path().join("proxy.sock"))?;
        listener.set_nonblocking(true)?;
        Ok(Self {
            dir,
            listener,
            hosts,
        })
    }

    /// The socket's path on the host.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("proxy.sock")
    }

    /// Serves the socket until the returned proxy is finished or dropped. Needs a tokio runtime.
    pub fn serve(self) -> std::io::Result<Running> {
        let listener = tokio::net::UnixListener::from_std(self.listener)?;
        let log = Arc::new(Mutex::new(ProxyLog::default()));
        let stop = CancellationToken::new();
        let state = Arc::new(State {
            hosts: self.hosts,
            log: Arc::clone(&log),
            stop: stop.clone(),
        });
        let task = tokio::spawn(accept(listener, state));
        Ok(Running {
            _dir: self.dir,
            log,
            stop,
            task,
        })
    }
}

/// A proxy serving one launch.
pub struct Running {
    _dir: tempfile::TempDir,
    log: Arc<Mutex<ProxyLog>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops serving (every connection through it ends) and says what it saw.
    pub fn finish(self) -> ProxyLog {
        self.stop.cancel();
        self.task.abort();
        self.log.lock().map(|log| log.clone()).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
        self.task.abort();
    }
}

struct State {
    hosts: Arc<HostAllowlist>,
    log: Arc<Mutex<ProxyLog>>,
    /// Ends every connection and tunnel when the launch is over.
    stop: CancellationToken,
}

impl State {
    fn record(&self, connection: Connection) {
        if let Ok(mut log) = self.log.lock() {
            log.push(connection);
        }
    }
}

async fn accept(listener: tokio::net::UnixListener, state: Arc<State>) {
    let clients = Arc::new(tokio::sync::Semaphore::new(MAX_CLIENTS));
    loop {
        let Ok(permit) = Arc::clone(&clients).acquire_owned().await else {
            return;
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors, say: wait a little rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = state.stop.cancelled() => return,
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _permit = permit;
            let service = {
                let state = Arc::clone(&state);
                hyper::service::service_fn(move |request| {
                    let state = Arc::clone(&state);
                    async move { Ok::<_, Infallible>(handle(request, &state).await) }
                })
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::select! {
                _ = connection => {}
                () = state.stop.cancelled() => {}
            }
        });
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

fn answer(status: StatusCode, text: &str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(format!("{text}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    response
}

/// The host and port a request asks for, and the scheme of an absolute-form one.
fn target(request: &Request<Incoming>) -> Result<(String, u16), String> {
    let uri = request.uri();
    let authority = uri
        .authority()
        .ok_or_else(|| "the request names no host (use CONNECT or an http:// URL)".to_owned())?;
    let host = authority.host().to_owned();
    let port = if request.method() == Method::CONNECT {
        authority
            .port_u16()
            .ok_or_else(|| "CONNECT names no port".to_owned())?
    } else {
        match uri.scheme_str() {
            Some("http") => authority.port_u16().unwrap_or(80),
            Some("https") => {
                return Err("an https:// URL is reached through CONNECT, not forwarded".to_owned());
            }
            _ => return Err("only http:// URLs are forwarded".to_owned()),
        }
    };
    Ok((host, port))
}

async fn handle(request: Request<Incoming>, state: &State) -> Response<Body> {
    let method = request.method().to_string();
    let (host, port) = match target(&request) {
        Ok(target) => target,
        Err(reason) => {
            // What it named, or else what its Host header says.
            let host = request
                .uri()
                .authority()
                .map(|a| a.as_str())
                .or_else(|| {
                    request
                        .headers()
                        .get(hyper::header::HOST)
                        .and_then(|h| h.to_str().ok())
                })
                .unwrap_or_default();
            state.record(Connection {
                method,
                host: host.chars().take(255).collect(),
                port: 0,
                allowed: false,
                reason: reason.clone(),
                address: None,
                error: None,
            });
            return answer(StatusCode::BAD_REQUEST, &reason);
        }
    };
    let mut connection = Connection {
        method,
        host: host.chars().take(255).collect(),
        port,
        allowed: false,
        reason: String::new(),
        address: None,
        error: None,
    };
    let stream = match reach(&state.hosts, &host, port).await {
        Err(Reach::Refused(reason)) => {
            let text = format!("kavi's proxy refused {host}:{port}: {reason}");
            connection.reason = reason;
            state.record(connection);
            return answer(StatusCode::FORBIDDEN, &text);
        }
        Err(Reach::Failed(entry, error)) => {
            let text = format!("kavi's proxy could not reach {host}:{port}: {error}");
            connection.allowed = true;
            connection.reason = format!("allowed by `{entry}`");
            connection.error = Some(error);
            state.record(connection);
            return answer(StatusCode::BAD_GATEWAY, &text);
        }
        Ok((entry, stream)) => {
            connection.allowed = true;
            connection.reason = format!("allowed by `{entry}`");
            connection.address = stream.peer_addr().ok().map(|a| a.to_string());
            state.record(connection);
            stream
        }
    };
    if request.method() == Method::CONNECT {
        let stop = state.stop.clone();
        tokio::spawn(async move {
            let tunnel = async {
                let upgraded = hyper::upgrade::on(request).await.ok()?;
                let mut upstream = stream;
                tokio::io::copy_bidirectional(&mut TokioIo::new(upgraded), &mut upstream)
                    .await
                    .ok()
            };
            tokio::select! {
                _ = tunnel => {}
                () = stop.cancelled() => {}
            }
        });
        return Response::new(Full::new(Bytes::new()).map_err(|n| match n {}).boxed());
    }
    forward(request, stream, &host, port, &state.stop).await
}

/// Forwards an absolute-form request to the host it names, over `stream`, as an origin-form
/// request whose `Host` is that host, without the hop-by-hop and proxy headers.
async fn forward(
    request: Request<Incoming>,
    stream: TcpStream,
    host: &str,
    port: u16,
    stop: &CancellationToken,
) -> Response<Body> {
    let (mut parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = match path.parse() {
        Ok(uri) => uri,
        Err(_) => return answer(StatusCode::BAD_REQUEST, "the URL's path is not valid"),
    };
    strip_hop_by_hop(&mut parts.headers);
    // hyper has read the body by its framing: the next hop gets it framed the same way, never
    // with a length that could say otherwise.
    if parts.headers.contains_key(hyper::header::TRANSFER_ENCODING) {
        parts.headers.remove(hyper::header::CONTENT_LENGTH);
    }
    let authority = if port == 80 {
        host.to_owned()
    } else {
        format!("{host}:{port}")
    };
    match hyper::header::HeaderValue::from_str(&authority) {
        Ok(value) => {
            parts.headers.insert(hyper::header::HOST, value);
        }
        Err(_) => return answer(StatusCode::BAD_REQUEST, "the URL's host is not valid"),
    }
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => return answer(StatusCode::BAD_GATEWAY, &format!("{authority}: {e}")),
        };
    let stop = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = connection => {}
            () = stop.cancelled() => {}
        }
    });
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(e) => answer(StatusCode::BAD_GATEWAY, &format!("{authority}: {e}")),
    }
}

/// Removes what concerns only one hop: the connection's own headers and the ones it names.
fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    let named: Vec<String> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

enum Reach {
    Refused(String),
    /// Allowed by the entry, but not reached.
    Failed(String, String),
}

/// Checks `host:port` against the list, resolves it once, and connects to what it resolved to.
async fn reach(hosts: &HostAllowlist, host: &str, port: u16) -> Result<(String, TcpStream), Reach> {
    let entry = match hosts.decide(host, port) {
        Decision::Refused(reason) => return Err(Reach::Refused(reason)),
        Decision::Allowed(entry) => entry,
    };
    let addresses: Vec<SocketAddr> = match ip_literal(host) {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None => {
            let name = host_name(host).unwrap_or_default();
            let resolved = tokio::time::timeout(
                CONNECT_TIMEOUT,
                tokio::net::lookup_host((name.as_str(), port)),
            )
            .await;
            match resolved {
                Ok(Ok(found)) => found.collect(),
                Ok(Err(e)) => return Err(Reach::Failed(entry.text.clone(), e.to_string())),
                Err(_) => {
                    return Err(Reach::Failed(
                        entry.text.clone(),
                        "resolving it timed out".into(),
                    ));
                }
            }
        }
    };
    // A name that leads to this machine or its link is refused, whatever else it resolves to:
    // only an entry naming that address reaches it.
    if !matches!(entry.host, Host::Ip(_))
        && let Some(address) = addresses.iter().find(|a| special(a.ip()))
    {
        return Err(Reach::Refused(format!(
            "it resolves to {}, which only an entry naming that address may reach",
            address.ip()
        )));
    }
    let mut last = "it resolves to no address".to_owned();
    for address in addresses {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => return Ok((entry.text.clone(), stream)),
            Ok(Err(e)) => last = format!("{address}: {e}"),
            Err(_) => last = format!("{address}: timed out"),
        }
    }
    Err(Reach::Failed(entry.text.clone(), last))
}

/// The environment a process behind the proxy gets: every common spelling of the proxy
/// variables, naming the bridge.
pub fn environment() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PORT}");
    [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .into_iter()
    .map(|key| (key.to_owned(), url.clone()))
    .collect()
}

/// Whether `key` is a variable [`environment`] sets, or one that would send requests past it.
pub fn is_proxy_variable(key: &str) -> bool {
    matches!(
        key.to_ascii_lowercase().as_str(),
        "http_proxy" | "https_proxy" | "all_proxy" | "no_proxy" | "ftp_proxy"
    )
}

/// Where the socket goes in the view, as a path.
pub fn socket_in_view() -> &'static Path {
    Path::new(SOCKET_IN_VIEW)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(host: &str, allowed: bool) -> Connection {
        Connection {
            method: "CONNECT".into(),
            host: host.into(),
            port: 443,
            allowed,
            reason: String::new(),
            address: allowed.then(|| "192.0.2.1:443".to_owned()),
            error: None,
        }
    }

    /// A flood of refused requests first does not hide where the process went after it: the
    /// first connection to each host it reached is kept past the cap, repeats only counted.
    #[test]
    fn every_reached_destination_is_kept_past_a_flood_of_refusals() {
        let mut log = ProxyLog::default();
        for n in 0..MAX_RECORDS + 10 {
            log.push(asked(&format!("decoy{n}.example"), false));
        }
        for spelled in ["pypi.org", "PyPI.org.", "pypi.org"] {
            log.push(asked(spelled, true));
        }
        log.push(asked("files.pythonhosted.org", true));
        let kept: Vec<&str> = log.connections[MAX_RECORDS..]
            .iter()
            .map(|c| c.host.as_str())
            .collect();
        assert_eq!(kept, ["pypi.org", "files.pythonhosted.org"]);
        assert_eq!((log.allowed, log.refused), (4, MAX_RECORDS as u64 + 10));
        assert_eq!(log.unrecorded, 10 + 2);
    }
}
