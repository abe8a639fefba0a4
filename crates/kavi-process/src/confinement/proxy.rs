//! The network of a confined process that may use it: a proxy kavi runs, never the host's
//! network.
//!
//! A `network = true` profile still gets a network namespace of its own, with only loopback (the
//! design of Anthropic's sandbox runtime for coding agents on Linux). Its one way out is this
//! proxy: kavi listens, for that one launch, on a unix socket in a private folder, which is
//! mounted into the view at [`SOCKET_IN_VIEW`] (a unix socket is a file, and reaches across
//! network namespaces). Inside, kavi's own binary runs first as a bridge ([`super::bridge`]):
//! it listens on `127.0.0.1:`[`PORT`], forwards each connection to the socket, and runs the
//! program as its child, whose `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` name it.
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
use std::net::{IpAddr, SocketAddr};
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

/// Where the proxy's socket is in the view.
pub const SOCKET_IN_VIEW: &str = "/run/kavi/proxy.sock";

/// The port the bridge listens on, on the view's own loopback.
pub const PORT: u16 = 3128;

/// How many client connections the proxy serves at once; more wait for one to end.
const MAX_CLIENTS: usize = 64;

/// How many connection records are kept; past that, only counted.
const MAX_RECORDS: usize = 256;

/// How long reaching an allowed host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// One entry of `[processes] allowed_hosts`: `host`, `host:port`, `*.domain`, `*.domain:port`,
/// an IPv4 address, or an IPv6 one (`::1`, or `[::1]:443` with a port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    text: String,
    host: Host,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Ip(IpAddr),
    /// Lowercase, without a trailing dot.
    Name(String),
    /// `*.suffix`: any name below `suffix`, not `suffix` itself.
    Below(String),
}

impl HostPattern {
    /// Parses an entry; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some((_, rest)) = text.split_once("://") {
            let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
            return Err(format!(
                "`{text}` is a URL: write the host alone (`{host}`), or `host:port`"
            ));
        }
        let (host, port) = split_port(text)?;
        let host = if let Some(ip) = ip_literal(host) {
            Host::Ip(ip)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            Host::Below(host_name(suffix).ok_or_else(|| {
                format!("`{text}`: `*.` must be followed by a host name, such as `*.example.com`")
            })?)
        } else if host == "*" {
            return Err(format!(
                "`{text}` would allow every host; list the hosts a process may reach"
            ));
        } else {
            Host::Name(host_name(host).ok_or_else(|| {
                format!(
                    "`{text}` is not a host name, `*.domain`, or IP address (with an optional \
                     `:port`)"
                )
            })?)
        };
        Ok(Self {
            text: text.to_owned(),
            host,
            port,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn matches(&self, target: &Host, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match (&self.host, target) {
            (Host::Ip(a), Host::Ip(b)) => a.to_canonical() == b.to_canonical(),
            (Host::Name(a), Host::Name(b)) => a == b,
            (Host::Below(suffix), Host::Name(name)) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            _ => false,
        }
    }
}

/// `host` and its port, if any. An IPv6 address with a port is bracketed; one without may be
/// bare.
fn split_port(text: &str) -> Result<(&str, Option<u16>), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{text}`: `{p}` is not a port (1 to 65535)"))
    };
    if let Some(rest) = text.strip_prefix('[') {
        let (ip, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{text}`: `[` without its `]`"))?;
        return match after {
            "" => Ok((ip, None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((ip, Some(port(p)?))),
                None => Err(format!("`{text}`: only `:port` may follow `]`")),
            },
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None)),
        1 => {
            let (host, p) = text.split_once(':').unwrap_or((text, ""));
            Ok((host, Some(port(p)?)))
        }
        // A bare IPv6 address: no port.
        _ => Ok((text, None)),
    }
}

/// An IP address, bracketed or not, written the standard way (not `127.1` or `0x7f.0.0.1`).
fn ip_literal(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// A DNS name, lowercased, without its trailing dot; `None` for anything that is not one.
fn host_name(host: &str) -> Option<String> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    valid.then_some(host)
}

/// The hosts confined processes may reach through the proxy: empty, none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAllowlist {
    pub entries: Vec<HostPattern>,
}

/// Whether a target may be reached, and by which entry.
#[derive(Debug)]
enum Decision<'a> {
    Allowed(&'a HostPattern),
    Refused(String),
}

impl HostAllowlist {
    pub fn texts(&self) -> Vec<&str> {
        self.entries.iter().map(HostPattern::as_str).collect()
    }

    fn decide(&self, host: &str, port: u16) -> Decision<'_> {
        let target = match ip_literal(host) {
            Some(ip) => Host::Ip(ip),
            None => match host_name(host) {
                Some(name) => Host::Name(name),
                None => return Decision::Refused(format!("`{host}` is not a host name")),
            },
        };
        match self.entries.iter().find(|e| e.matches(&target, port)) {
            Some(entry) => Decision::Allowed(entry),
            None => Decision::Refused(
                "not in [processes] allowed_hosts of policies/network.toml".to_owned(),
            ),
        }
    }
}

/// An address only an entry naming it may lead to: this machine (any address of its own), its
/// link (a cloud's metadata service), a private network behind it, nowhere, or a group. A
/// public name that resolves to one of these is how a process would reach a service the host
/// only offers inward.
fn special(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    reserved(ip) || this_machine().contains(&ip)
}

fn reserved(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [first, second, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || first == 0
                // Shared address space (RFC 6598): a carrier's or a cloud's inside network.
                || (first == 100 && (64..128).contains(&second))
                // IETF protocol assignments, benchmarking networks, reserved for future use.
                || (first == 192 && second == 0 && v4.octets()[2] == 0)
                || (first == 198 && (18..20).contains(&second))
                || first >= 240
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || v6.is_unicast_link_local()
                || v6.is_unique_local()
                // NAT64 (64:ff9b::/96, 64:ff9b:1::/48) and 6to4 (2002::/16) carry an IPv4
                // address a gateway reaches for the asker: a private one among them.
                || matches!(v6.segments(), [0x64, 0xff9b, ..])
                || v6.segments()[0] == 0x2002
        }
    }
}

/// Every address of this machine's interfaces, read when asked: an address the host has is
/// reached from the host's side of the proxy, whatever range it is in.
fn this_machine() -> Vec<IpAddr> {
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    interfaces
        .filter_map(|interface| interface.address)
        .filter_map(|address| {
            address
                .as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .map(|ip| ip.to_canonical())
        .collect()
}

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

/// What a launch's proxy saw: the first [`MAX_RECORDS`] connections, and how many it allowed and
/// refused in all.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ProxyLog {
    pub connections: Vec<Connection>,
    pub allowed: u64,
    pub refused: u64,
    /// Connections counted but not kept, past the first [`MAX_RECORDS`].
    pub unrecorded: u64,
}

impl ProxyLog {
    fn push(&mut self, connection: Connection) {
        if connection.allowed {
            self.allowed += 1;
        } else {
            self.refused += 1;
        }
        tracing::debug!(?connection, "proxy");
        if self.connections.len() < MAX_RECORDS {
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

    fn list(entries: &[&str]) -> HostAllowlist {
        HostAllowlist {
            entries: entries
                .iter()
                .map(|e| HostPattern::parse(e).unwrap())
                .collect(),
        }
    }

    fn allowed(list: &HostAllowlist, host: &str, port: u16) -> bool {
        matches!(list.decide(host, port), Decision::Allowed(_))
    }

    #[test]
    fn entries_match_by_name_port_and_suffix_and_nothing_else() {
        let hosts = list(&[
            "api.example.com",
            "pypi.org:443",
            "*.githubusercontent.com",
            "127.0.0.1:8080",
            "[::1]:9000",
            "fe80::1",
        ]);
        assert!(allowed(&hosts, "api.example.com", 443));
        assert!(allowed(&hosts, "API.Example.COM.", 80));
        assert!(allowed(&hosts, "pypi.org", 443));
        assert!(!allowed(&hosts, "pypi.org", 80));
        assert!(allowed(&hosts, "raw.githubusercontent.com", 443));
        assert!(!allowed(&hosts, "githubusercontent.com", 443));
        assert!(!allowed(&hosts, "evilgithubusercontent.com", 443));
        assert!(!allowed(&hosts, "githubusercontent.com.evil.org", 443));
        assert!(!allowed(&hosts, "example.com", 443));
        assert!(!allowed(&hosts, "sub.api.example.com", 443));
        assert!(allowed(&hosts, "127.0.0.1", 8080));
        assert!(!allowed(&hosts, "127.0.0.1", 8081));
        // Other spellings of an address are names, and no name entry lists them.
        assert!(!allowed(&hosts, "127.1", 8080));
        assert!(!allowed(&hosts, "2130706433", 8080));
        assert!(!allowed(&hosts, "localhost", 8080));
        assert!(allowed(&hosts, "[::1]", 9000));
        assert!(allowed(&hosts, "[0:0:0:0:0:0:0:1]", 9000));
        assert!(allowed(&hosts, "[::ffff:127.0.0.1]", 8080));
        assert!(allowed(&hosts, "[fe80::1]", 1));
        // An allowed name does not allow its address.
        assert!(!allowed(&hosts, "93.184.216.34", 443));
        assert!(!allowed(&hosts, "api.example.com\0.evil", 443));
        assert!(!allowed(&hosts, "", 443));
        assert!(!allowed(&list(&[]), "api.example.com", 443));
    }

    #[test]
    fn malformed_entries_say_what_is_wrong() {
        for (entry, says) in [
            ("*", "every host"),
            ("*.", "`*.` must be followed"),
            ("host:0", "not a port"),
            ("host:99999", "not a port"),
            ("host:http", "not a port"),
            ("[::1", "without its `]`"),
            ("[::1]x", "only `:port`"),
            ("exa mple.com", "not a host name"),
            (
                "https://example.com/x",
                "is a URL: write the host alone (`example.com`)",
            ),
            ("a.*.com", "not a host name"),
            ("", "not a host name"),
        ] {
            let err = HostPattern::parse(entry).unwrap_err();
            assert!(err.contains(says), "{entry}: {err}");
        }
    }

    #[test]
    fn addresses_of_this_machine_its_link_and_private_networks_are_special() {
        for ip in [
            "127.0.0.1",
            "127.8.9.10",
            "169.254.169.254",
            "0.0.0.0",
            "::1",
            "::ffff:127.0.0.1",
            "fe80::1",
            "224.0.0.1",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "100.64.0.1",
            "fd00::1",
            "::ffff:192.168.0.1",
            "64:ff9b::a00:1",
            "64:ff9b:1::1",
            "2002:a00:1::1",
            "198.18.0.1",
            "240.0.0.1",
            "192.0.0.8",
        ] {
            assert!(special(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "100.128.0.1", "172.32.0.1", "2606:4700::1"] {
            assert!(!special(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn the_addresses_of_this_machine_are_read_from_its_interfaces() {
        let own = this_machine();
        assert!(
            own.iter().any(IpAddr::is_loopback),
            "getifaddrs listed no loopback address: {own:?}"
        );
    }

    proptest::proptest! {
        /// Whatever a policy or a process writes, parsing and matching answer, never panic.
        #[test]
        fn no_entry_or_target_makes_matching_panic(entry in ".{0,40}", host in ".{0,40}", port: u16) {
            let hosts = HostAllowlist {
                entries: HostPattern::parse(&entry).into_iter().collect(),
            };
            let _ = hosts.decide(&host, port);
            let _ = split_port(&host);
        }
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_unless_its_address_is_listed() {
        let hosts = list(&["localhost"]);
        match reach(&hosts, "localhost", 9).await {
            Err(Reach::Refused(reason)) => assert!(reason.contains("resolves to"), "{reason}"),
            _ => panic!("reached loopback through a name"),
        }
    }
}
