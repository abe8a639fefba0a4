//! A confined process with the network reaches only the hosts `[processes] allowed_hosts`
//! lists, only through kavi's proxy, and every connection it asks for is recorded: real
//! processes under bubblewrap, real HTTP servers on the host's loopback. A machine that cannot
//! isolate skips these (and fails under CI, which installs bubblewrap).

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kavi::confinement::proxy::{HostAllowlist, HostPattern, ProxyLog};
use kavi::confinement::{self, Limits, Profile};
use kavi::process::{self, CaptureOptions, CommandSpec, Finished};

/// An HTTP server on the host's loopback that answers every request with `body`, and keeps
/// each request's head.
struct Server {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(body: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let kept = Arc::clone(&heads);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = Arc::clone(&kept);
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    loop {
                        let mut head = String::new();
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                            head.push_str(&line);
                        }
                        kept.lock().unwrap().push(head);
                        let mut out = &stream;
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if out.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { port, heads }
    }

    fn hits(&self) -> usize {
        self.heads.lock().unwrap().len()
    }
}

/// A network profile over `dir` that may reach `hosts`.
fn profile(dir: &Path, hosts: &[String]) -> Profile {
    Profile {
        role: "NETWORK skill".into(),
        read: ["/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache"]
            .map(PathBuf::from)
            .into_iter()
            .chain([dir.to_owned()])
            .collect(),
        write: vec![],
        hide: vec![],
        hide_matching: None,
        network: true,
        hosts: Arc::new(HostAllowlist {
            entries: hosts
                .iter()
                .map(|h| HostPattern::parse(h).unwrap())
                .collect(),
        }),
        programs: true,
        locks: true,
        require: true,
        limits: Limits::default(),
        path: "/usr/bin:/bin".into(),
        tripwires: vec![],
        workspace: None,
    }
}

/// Runs a Python script under `profile`; `None` where this machine cannot isolate.
async fn run_python(profile: Profile, script: &str) -> Option<(Finished, serde_json::Value)> {
    if !common::isolation_or_skip() {
        return None;
    }
    confinement::bridge::set_program(env!("CARGO_BIN_EXE_kavi"));
    let dir = profile.read.last().unwrap().clone();
    let confinement = confinement::prepare(profile).unwrap();
    let spec = CommandSpec {
        program: "python3".into(),
        args: vec!["-I".into(), "-c".into(), script.to_owned()],
        env: vec![("HTTP_PROXY".into(), "http://127.0.0.1:1".into())],
        cwd: dir.clone(),
        stdin: None,
        confinement: Some(confinement.clone()),
    };
    let options = CaptureOptions {
        limit: 1 << 20,
        spill_dir: dir,
        roster: None,
        live: None,
    };
    let finished = process::run(&spec, &options, &Default::default())
        .await
        .unwrap();
    let record = confinement.record_run(finished.network.as_ref());
    Some((finished, record))
}

fn stdout(finished: &Finished) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&finished.stdout.head),
        String::from_utf8_lossy(&finished.stderr.head)
    )
}

fn log(finished: &Finished) -> &ProxyLog {
    finished
        .network
        .as_ref()
        .expect("a network process has a proxy log")
}

/// Python that fetches `url` through the proxy the environment names and prints the status
/// and body, or the status of the refusal.
fn fetch(url: &str) -> String {
    format!(
        "import urllib.request, urllib.error\n\
         try:\n    r = urllib.request.urlopen('{url}', timeout=10); print(r.status, r.read().decode())\n\
         except urllib.error.HTTPError as e:\n    print('refused', e.code)\n"
    )
}

#[tokio::test]
async fn an_allowed_host_is_reached_through_the_proxy_and_recorded() {
    let server = Server::start("kavi-proxy-ok");
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let allowed = format!("127.0.0.1:{}", server.port);
    // Plain http, forwarded; then a CONNECT tunnel to the same host.
    let script = format!(
        "{}import http.client\n\
         c = http.client.HTTPConnection('127.0.0.1', 3128, timeout=10)\n\
         c.set_tunnel('127.0.0.1', {port})\n\
         c.request('GET', '/tunnelled'); r = c.getresponse(); print('tunnel', r.status, r.read().decode())\n",
        fetch(&format!("http://127.0.0.1:{}/forwarded", server.port)),
        port = server.port
    );
    let Some((finished, record)) =
        run_python(profile(&dir, std::slice::from_ref(&allowed)), &script).await
    else {
        return;
    };
    let out = stdout(&finished);
    assert!(out.contains("200 kavi-proxy-ok"), "{out}");
    assert!(out.contains("tunnel 200 kavi-proxy-ok"), "{out}");
    assert_eq!(server.hits(), 2, "{out}");
    // The forwarded request reached the server in origin form, with the proxy's own headers
    // gone.
    let heads = server.heads.lock().unwrap().clone();
    assert!(heads[0].starts_with("GET /forwarded HTTP/1.1"), "{heads:?}");
    let log = log(&finished);
    assert_eq!((log.allowed, log.refused), (2, 0), "{log:?}");
    assert_eq!(log.connections[0].method, "GET");
    assert_eq!(log.connections[1].method, "CONNECT");
    for connection in &log.connections {
        assert_eq!(connection.host, "127.0.0.1");
        assert_eq!(connection.port, server.port);
        assert!(connection.allowed);
        assert_eq!(connection.reason, format!("allowed by `{allowed}`"));
    }
    assert_eq!(record["network"], "proxy", "{record}");
    assert_eq!(record["proxy"]["allowed_hosts"][0], allowed.as_str());
    assert_eq!(record["proxy"]["connections"][1]["method"], "CONNECT");
    assert_eq!(record["proxy"]["connections"][1]["allowed"], true);
}

#[tokio::test]
async fn a_host_not_on_the_list_is_refused_with_403_and_recorded() {
    let (allowed, other) = (Server::start("allowed"), Server::start("other"));
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let port = other.port;
    let script = format!(
        "{forward}import http.client, socket\n\
         c = http.client.HTTPConnection('127.0.0.1', 3128, timeout=10)\n\
         c.set_tunnel('127.0.0.1', {port})\n\
         try:\n    c.request('GET', '/')\nexcept OSError as e:\n    print('tunnel refused', e)\n\
         c = http.client.HTTPConnection('127.0.0.1', 3128, timeout=10)\n\
         c.set_tunnel('localhost', {allowed})\n\
         try:\n    c.request('GET', '/')\nexcept OSError as e:\n    print('name refused', e)\n\
         g = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n\
         g.sendall(b'\\x00\\xff GARBAGE / HTTP/9\\r\\n\\r\\n'); print('garbage', g.recv(100)[:12])\n\
         s = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n\
         s.sendall(b'GET http://127.0.0.1:{allowed}/one HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n'\n\
                   b'GET http://127.0.0.1:{port}/two HTTP/1.1\\r\\nHost: 127.0.0.1:{allowed}\\r\\n\\r\\n')\n\
         got = b''\n\
         while got.count(b'HTTP/1.1') < 2:\n    chunk = s.recv(65536)\n    if not chunk: break\n    got += chunk\n\
         import re; print('pipelined', [c.decode() for c in re.findall(rb'HTTP/1.1 (\\d+)', got)])\n",
        forward = fetch(&format!("http://127.0.0.1:{port}/")),
        allowed = allowed.port,
    );
    let hosts = [format!("127.0.0.1:{}", allowed.port)];
    let Some((finished, record)) = run_python(profile(&dir, &hosts), &script).await else {
        return;
    };
    let out = stdout(&finished);
    assert!(out.contains("refused 403"), "{out}");
    assert!(
        out.contains("tunnel refused Tunnel connection failed: 403"),
        "{out}"
    );
    // A name for an allowed address is not the address.
    assert!(
        out.contains("name refused Tunnel connection failed: 403"),
        "{out}"
    );
    // Two requests in one write: the first reaches its allowed host with its own Host, the
    // second is checked on its own and refused.
    assert!(out.contains("pipelined ['200', '403']"), "{out}");
    // Garbage is answered, not a crash: the requests after it were served.
    assert!(out.contains("garbage b'HTTP/1.1 400'"), "{out}");
    assert_eq!(other.hits(), 0, "the refused server was reached: {out}");
    let heads = allowed.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(
        heads[0].contains(&format!("host: 127.0.0.1:{}", allowed.port))
            || heads[0].contains(&format!("Host: 127.0.0.1:{}", allowed.port)),
        "{heads:?}"
    );
    let log = log(&finished);
    assert_eq!((log.allowed, log.refused), (1, 4), "{log:?}");
    let refused: Vec<_> = log.connections.iter().filter(|c| !c.allowed).collect();
    assert!(
        refused
            .iter()
            .filter(|c| c.host == "127.0.0.1")
            .all(|c| c.port == port
                && c.reason == "not in [processes] allowed_hosts of policies/network.toml"),
        "{refused:?}"
    );
    assert!(
        refused
            .iter()
            .any(|c| c.host == "localhost" && c.method == "CONNECT"),
        "{refused:?}"
    );
    assert_eq!(record["proxy"]["refused"], 4, "{record}");
}

#[tokio::test]
async fn past_the_proxy_nothing_leaves_neither_tcp_nor_udp() {
    let server = Server::start("direct");
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    // Even with the server on the list, a connection that does not go through the proxy goes
    // nowhere: the namespace has only its own loopback.
    let script = format!(
        "import socket\n\
         try:\n    socket.create_connection(('127.0.0.1', {tcp}), timeout=5); print('tcp connected')\n\
         except OSError as e:\n    print('tcp', e.errno)\n\
         try:\n    socket.create_connection(('10.0.0.1', 80), timeout=5); print('tcp out connected')\n\
         except OSError as e:\n    print('tcp out', e.errno)\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.sendto(b'kavi-udp', ('127.0.0.1', {udp})); print('udp loopback sent')\n\
         try:\n    s.sendto(b'kavi-udp', ('8.8.8.8', 53)); print('udp out sent')\n\
         except OSError as e:\n    print('udp out', e.errno)\n",
        tcp = server.port,
        udp = udp.local_addr().unwrap().port(),
    );
    let hosts = [format!("127.0.0.1:{}", server.port)];
    let Some((finished, _)) = run_python(profile(&dir, &hosts), &script).await else {
        return;
    };
    let out = stdout(&finished);
    // ECONNREFUSED: nothing listens on the sandbox's own loopback (Landlock may refuse first
    // with EACCES); ENETUNREACH: there is no route out.
    assert!(out.contains("tcp 111") || out.contains("tcp 13"), "{out}");
    assert!(
        out.contains("tcp out 101") || out.contains("tcp out 13"),
        "{out}"
    );
    assert!(out.contains("udp out 101"), "{out}");
    assert_eq!(server.hits(), 0, "{out}");
    let mut buffer = [0u8; 64];
    assert!(
        udp.recv(&mut buffer).is_err(),
        "a datagram reached the host"
    );
    // Nothing asked the proxy for anything.
    assert_eq!(log(&finished).connections, vec![]);
}

/// What an attacker would try on the request line: a user-info prefix naming the allowed host,
/// another spelling of an address, an IPv4-mapped IPv6 address, a malformed CONNECT target, and
/// a second request inside an allowed tunnel. None reaches the other server.
#[tokio::test]
async fn tricks_in_the_target_reach_no_other_host() {
    let (allowed, other) = (Server::start("allowed"), Server::start("other"));
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let (a, o) = (allowed.port, other.port);
    let script = format!(
        "import socket, re\n\
         def ask(raw):\n    s = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n    s.sendall(raw)\n    \
         got = s.recv(65536)\n    m = re.match(rb'HTTP/1.1 (\\d+)', got)\n    return (m.group(1).decode() if m else repr(got[:20])), s\n\
         for raw in [b'GET http://127.0.0.1:{a}@127.0.0.1:{o}/ HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n',\n\
                     b'GET http://2130706433:{o}/ HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n',\n\
                     b'CONNECT [::ffff:127.0.0.1]:{o} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n',\n\
                     b'CONNECT 127.0.0.1 HTTP/1.1\\r\\nHost: 127.0.0.1:{a}\\r\\n\\r\\n',\n\
                     b'GET /x HTTP/1.1\\r\\nHost: 127.0.0.1:{a}\\r\\n\\r\\n']:\n    print('status', ask(raw)[0])\n\
         status, s = ask(b'CONNECT 127.0.0.1:{a} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n\
         s.sendall(b'GET http://127.0.0.1:{o}/inside HTTP/1.1\\r\\nHost: 127.0.0.1:{o}\\r\\n\\r\\n')\n\
         print('tunnel', status, s.recv(65536).split(b'\\r\\n\\r\\n')[-1].decode())\n"
    );
    let hosts = [format!("127.0.0.1:{a}")];
    let Some((finished, _)) = run_python(profile(&dir, &hosts), &script).await else {
        return;
    };
    let out = stdout(&finished);
    let statuses: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("status "))
        .collect();
    assert_eq!(statuses.len(), 5, "{out}");
    for status in &statuses {
        assert!(["400", "403"].contains(status), "{out}");
    }
    // The tunnel carries bytes to the host it was opened to, whatever they name.
    assert!(out.contains("tunnel 200 allowed"), "{out}");
    assert_eq!(other.hits(), 0, "{out}");
    let log = log(&finished);
    assert_eq!(log.allowed, 1, "{log:?}");
    assert_eq!(log.refused, 5, "{log:?}");
}
