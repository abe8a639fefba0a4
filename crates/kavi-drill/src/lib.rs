//! `kavi drill isolation`: the attacks a hostile builder, gate or skill would try, run under the
//! workspace's own confinement policy through the one layer every role goes through, each
//! reported as refused (and by what) or allowed.
//!
//! Each attack is a function of `attacks.py`, run by `python3 -I -B` under the role's profile,
//! with the values the real role has (a sandbox and a private temporary folder for the
//! builder; the workspace for a gate or a skill). What the attack saw is one JSON line; what the
//! attack could only claim, the drill checks from outside: whether a datagram reached its
//! listener, whether a daemon outlived the run, whether a file landed beside the sandbox, and,
//! for what a NETWORK skill asks kavi's proxy for, whether the proxy recorded its refusal.

pub mod gates;

use kavi_foundation::template;
use kavi_process::{self as process, confinement};
use kavi_spec::config;

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::confinement::policy::{ConfinementPolicy, RoleProfile};
use crate::process::{CaptureOptions, CommandSpec, Exit, Violation};
use crate::template::TemplateEngine;

const ATTACKS: &str = include_str!("attacks.py");

/// The role an attack runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Builder,
    Gate,
    Skill,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Builder => "builder",
            Role::Gate => "gate",
            Role::Skill => "skill",
        }
    }
}

/// What the drill checks from outside after an attack, besides what the attack reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outside {
    Nothing,
    /// The datagram or connection reached the drill's listener.
    Reached,
    /// A process carrying the drill's token is still alive.
    Survived,
    /// The file the attack wrote beside its sandbox exists there.
    Landed,
    /// The policy file changed.
    PolicyChanged,
}

/// One attack: its function in `attacks.py`, the role it runs as, what it tries, and what the
/// drill checks from outside.
struct Case {
    attack: &'static str,
    role: Role,
    what: &'static str,
    outside: Outside,
    /// The attack names x86-64 system call numbers.
    x86_64_only: bool,
    /// The skill runs under the NETWORK profile, not the READ_ONLY one.
    network: bool,
}

const fn case(attack: &'static str, role: Role, what: &'static str) -> Case {
    Case {
        attack,
        role,
        what,
        outside: Outside::Nothing,
        x86_64_only: false,
        network: false,
    }
}

/// An attack by a NETWORK skill: it has the network, through kavi's proxy only.
const fn networked(attack: &'static str, what: &'static str) -> Case {
    Case {
        network: true,
        ..checked(attack, Role::Skill, what, Outside::Reached)
    }
}

const fn checked(attack: &'static str, role: Role, what: &'static str, outside: Outside) -> Case {
    Case {
        outside,
        ..case(attack, role, what)
    }
}

const fn x86(attack: &'static str, role: Role, what: &'static str) -> Case {
    Case {
        x86_64_only: true,
        ..case(attack, role, what)
    }
}

const CASES: &[Case] = &[
    case(
        "home_canary",
        Role::Builder,
        "read a file in the home folder of kavi's user",
    ),
    case("ssh_key", Role::Builder, "read the SSH key of kavi's user"),
    case("etc_shadow", Role::Builder, "read /etc/shadow"),
    case(
        "kavi_environ",
        Role::Skill,
        "read kavi's environment through /proc",
    ),
    case("ledger", Role::Skill, "list the ledger's folder (.kavi)"),
    case(
        "passwd_link",
        Role::Skill,
        "read the host's /etc/passwd through a link in the workspace",
    ),
    case(
        "workspace_secret",
        Role::Gate,
        "read a secret file in the workspace (.env, .vault-token, id_dsa, *.tfvars, ...)",
    ),
    case(
        "ignored_secret",
        Role::Builder,
        "read a credential file git ignores, named by no hide pattern",
    ),
    case(
        "ignored_secret",
        Role::Skill,
        "read a credential file git ignores, named by no hide pattern",
    ),
    case(
        "ignored_secret",
        Role::Gate,
        "read a credential file git ignores, named by no hide pattern",
    ),
    checked(
        "write_policies",
        Role::Skill,
        "append to a policy",
        Outside::PolicyChanged,
    ),
    checked(
        "chmod_policy",
        Role::Skill,
        "change a policy's mode and time",
        Outside::PolicyChanged,
    ),
    checked(
        "write_beside",
        Role::Builder,
        "write beside its sandbox",
        Outside::Landed,
    ),
    checked(
        "udp_out",
        Role::Builder,
        "send a datagram to the host's loopback",
        Outside::Reached,
    ),
    checked(
        "tcp_out",
        Role::Skill,
        "connect to the host's loopback",
        Outside::Reached,
    ),
    checked(
        "mptcp_out",
        Role::Skill,
        "connect to the host's loopback over MPTCP",
        Outside::Reached,
    ),
    networked(
        "tcp_out",
        "as a NETWORK skill, connect to the host's loopback past the proxy",
    ),
    networked(
        "udp_out",
        "as a NETWORK skill, send a datagram to the host's loopback",
    ),
    networked(
        "proxy_connect",
        "as a NETWORK skill, ask kavi's proxy to tunnel to a host not allowed",
    ),
    networked(
        "proxy_http",
        "as a NETWORK skill, ask kavi's proxy to forward to a host not allowed",
    ),
    case("raw_icmp", Role::Builder, "open a raw ICMP socket"),
    case("netlink", Role::Builder, "open a netlink socket"),
    case(
        "unix_path",
        Role::Builder,
        "connect to a unix socket of the host",
    ),
    case(
        "unix_abstract",
        Role::Builder,
        "connect to an abstract unix socket of the host",
    ),
    checked(
        "unix_workspace",
        Role::Skill,
        "connect to a host's unix socket in the workspace (an agent's, a database's)",
        Outside::Reached,
    ),
    checked(
        "unix_workspace",
        Role::Gate,
        "connect to a host's unix socket in the workspace (an agent's, a database's)",
        Outside::Reached,
    ),
    networked(
        "unix_workspace",
        "as a NETWORK skill, connect to a host's unix socket in the workspace",
    ),
    case(
        "tiocsti",
        Role::Skill,
        "push input into the terminal (TIOCSTI)",
    ),
    checked(
        "daemon",
        Role::Builder,
        "leave a setsid daemon behind",
        Outside::Survived,
    ),
    case("kill_kavi", Role::Builder, "signal kavi"),
    case(
        "init_memory",
        Role::Builder,
        "write into the namespace's init through /proc/1/mem (code that outlives the run)",
    ),
    case(
        "init_memory",
        Role::Skill,
        "write into the namespace's init through /proc/1/mem (code that outlives the run)",
    ),
    case(
        "page_cache",
        Role::Skill,
        "evict the interpreter's pages from the page cache and ask which are cached (a channel \
         to any other process)",
    ),
    case(
        "kill_everyone",
        Role::Builder,
        "signal every process it may (kill -9 -1)",
    ),
    case("memory", Role::Builder, "hold 4 GiB of memory"),
    case("processes", Role::Skill, "start 500 processes"),
    case(
        "exec_ctypes",
        Role::Skill,
        "start a program through ctypes' execv (no scanner rule names it)",
    ),
    case(
        "exec_spawn",
        Role::Skill,
        "start a program through the os module's spawn call, reached by a computed name",
    ),
    case(
        "exec_loader",
        Role::Skill,
        "start a program through the ELF loader run as a program",
    ),
    case(
        "exec_memfd",
        Role::Skill,
        "start a program from memory (a memfd, by its descriptor)",
    ),
    case(
        "exec_self",
        Role::Skill,
        "replace itself with another program (execv)",
    ),
    case("big_file", Role::Skill, "allocate a 3 GiB file"),
    case(
        "fill_disk",
        Role::Skill,
        "fill its folders with 512 MiB of small files",
    ),
    case("open_files", Role::Skill, "hold 100,000 files open"),
    case("mknod", Role::Builder, "make a device node"),
    case("capabilities", Role::Builder, "hold a capability"),
    case(
        "sysctl",
        Role::Gate,
        "write a kernel setting through /proc/sys",
    ),
    x86(
        "user_namespace",
        Role::Builder,
        "make a user namespace (capabilities inside it)",
    ),
    x86(
        "io_uring",
        Role::Builder,
        "make an io_uring (sockets without `socket`)",
    ),
    x86("keyctl", Role::Skill, "reach the kernel keyring"),
    x86(
        "inotify",
        Role::Builder,
        "take the account's inotify instances (a limit per account, across namespaces), which \
         kavi's tripwires need to start the next launch",
    ),
    case(
        "pty_count",
        Role::Skill,
        "open a pseudo-terminal (a count every account on the machine reads)",
    ),
    x86(
        "process_name",
        Role::Skill,
        "rename itself where every account on the machine reads it (/proc/self/comm, prctl)",
    ),
    x86("perf_event", Role::Builder, "open a performance counter"),
    x86("ptrace", Role::Builder, "attach to a process with ptrace"),
    x86(
        "forbidden_in_child",
        Role::Builder,
        "attach with ptrace from a child, and carry on as if it had not died",
    ),
    x86("mount", Role::Builder, "mount a file system"),
    x86("bpf", Role::Builder, "load BPF"),
    x86("x32", Role::Builder, "make a call through the x32 ABI"),
];

/// How one attack ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Refused,
    Allowed,
    /// The attack could not run here (an architecture, a missing interpreter): not passed.
    NotRun,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub attack: &'static str,
    pub role: Role,
    pub what: &'static str,
    pub verdict: Verdict,
    /// What refused it, or why it could not run, or what it got.
    pub mechanism: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DrillError {
    #[error("failed to set up the drill: {0}")]
    Setup(#[from] std::io::Error),
    #[error("{0}")]
    Confinement(String),
}

/// What the attack printed.
#[derive(Debug, serde::Deserialize)]
struct Report {
    allowed: bool,
    errno: Option<String>,
    detail: String,
}

/// The mechanism an errno points at.
fn mechanism_of(errno: &str) -> &'static str {
    match errno {
        "ENOENT" | "ENOTDIR" => "mount view: not there",
        "EROFS" => "mount view: read-only",
        "EACCES" => "access refused: a hidden file, Landlock or permissions",
        "EPERM" => "seccomp or no capabilities",
        "ESRCH" => "PID namespace",
        "ENETUNREACH" | "ECONNREFUSED" | "EADDRNOTAVAIL" => "network namespace",
        "ENXIO" | "ENOTTY" => "no controlling terminal",
        "ENOMEM" => "memory bound",
        "EAGAIN" => "process bound",
        "EFBIG" => "file size bound",
        "EMFILE" => "open files bound",
        "ENOSPC" => "no new user namespaces",
        "ENOSYS" => "seccomp",
        "SIGSYS" => "seccomp: a class that starts no programs, execve killed the caller",
        // What `forbidden_in_child` says where kavi does not see every death in a tree: the
        // child was killed, and only the attack's own report says so.
        "CHILD_KILLED" => "seccomp killed the child; kavi cannot see every death in a tree here",
        "FORBIDDEN" => "kavi's proxy: not in [processes] allowed_hosts, 403",
        "STAND_IN" => "mount view: kavi's stand-in accounts file, not the host's",
        _ => "refused",
    }
}

/// Everything the attacks are pointed at, made for the drill and gone with it.
struct Targets {
    dir: tempfile::TempDir,
    home_canary: Option<PathBuf>,
    secret_dir: PathBuf,
    udp: UdpSocket,
    tcp: TcpListener,
    unix: UnixListener,
    /// In the workspace, which every role's view shows; a short name, as a socket's path is
    /// at most 107 bytes.
    unix_in_workspace: (UnixListener, PathBuf),
    _abstract: UnixListener,
    abstract_name: String,
    token: String,
}

/// Where a workspace holds secrets, each a file `workspace_secret` tries to read: the usual
/// names, and the less usual ones an attacker tried.
const SECRET_FILES: &[&str] = &[
    ".env",
    ".vault-token",
    "id_dsa",
    ".gnupg/secring.gpg",
    "prod.tfvars",
    ".bash_history",
    "passwords.kdbx",
    ".config/gh/hosts.yml",
    "service-account.json",
    ".s3cfg",
    // A vendored repository's config (its remote's URL may hold a token), and another
    // workspace's state.
    "vendor/lib/.git/config",
    "nested/.kavi/artifacts/registry.json",
];

/// A credential file in the workspace that no hide pattern names but git ignores (a `.gitignore`
/// beside it says so): a confined process's view holds only what git lists, so it is not there.
const IGNORED_SECRET: &str = "deploy-notes.txt";

/// A note in the workspace that is a link to the host's `/etc/passwd`.
const PASSWD_LINK: &str = "link.md";

impl Targets {
    fn make(workspace: &Path) -> Result<Self, DrillError> {
        let dir = tempfile::Builder::new().prefix("kavi-drill-").tempdir()?;
        let token = format!("kavi-drill-{}", uuid::Uuid::new_v4().simple());
        // A canary where kavi's user keeps secrets; the attack must not read it. Named apart
        // from the workspace's secrets folder, which it would meet where the workspace is home.
        let home_canary = std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(format!(".{token}-home")))
            .filter(|path| std::fs::write(path, &token).is_ok());
        let secret_dir = workspace.join(format!(".{token}"));
        std::fs::create_dir_all(&secret_dir)?;
        for name in SECRET_FILES {
            let path = secret_dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap_or(&secret_dir))?;
            std::fs::write(path, "API_KEY=kavi-drill-secret\n")?;
        }
        std::fs::write(
            secret_dir.join(".gitignore"),
            format!("/{IGNORED_SECRET}\n"),
        )?;
        std::fs::write(
            secret_dir.join(IGNORED_SECRET),
            "deploy password: kavi-drill-secret\n",
        )?;
        std::os::unix::fs::symlink("/etc/passwd", secret_dir.join(PASSWD_LINK))?;
        std::fs::create_dir_all(dir.path().join("sandbox"))?;
        let udp = UdpSocket::bind("127.0.0.1:0")?;
        udp.set_nonblocking(true)?;
        let tcp = TcpListener::bind("127.0.0.1:0")?;
        tcp.set_nonblocking(true)?;
        let unix = UnixListener::bind(dir.path().join("drill.sock"))?;
        unix.set_nonblocking(true)?;
        let unix_in_workspace = {
            let path = workspace.join(format!(".{}.sock", &token[token.len() - 8..]));
            let listener = UnixListener::bind(&path)?;
            listener.set_nonblocking(true)?;
            (listener, path)
        };
        let abstract_name = token.clone();
        let address = {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())?
        };
        let abstract_listener = UnixListener::bind_addr(&address)?;
        abstract_listener.set_nonblocking(true)?;
        Ok(Self {
            dir,
            home_canary,
            secret_dir,
            udp,
            tcp,
            unix,
            unix_in_workspace,
            _abstract: abstract_listener,
            abstract_name,
            token,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// An empty temporary folder for one attack, as every launch gets one: what an attack
    /// leaves in it (a bound's attack fills it) must not stop the next one at that bound.
    fn fresh_tmp(&self, role: Role) -> std::io::Result<PathBuf> {
        let tmp = self.path(&format!("{}-tmp", role.name()));
        match std::fs::remove_dir_all(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::create_dir(&tmp)?;
        Ok(tmp)
    }

    /// Whether anything reached a listener since the last look.
    fn reached(&self) -> bool {
        let mut buffer = [0u8; 64];
        self.udp.recv(&mut buffer).is_ok()
            || self.tcp.accept().is_ok()
            || self.unix.accept().is_ok()
            || self.unix_in_workspace.0.accept().is_ok()
    }

    /// Whether a process carrying the token is alive on this machine.
    fn survivor(&self) -> bool {
        std::fs::read_dir("/proc").is_ok_and(|entries| {
            entries.flatten().any(|entry| {
                let mut cmdline = Vec::new();
                std::fs::File::open(entry.path().join("cmdline"))
                    .and_then(|mut f| f.read_to_end(&mut cmdline))
                    .is_ok()
                    && String::from_utf8_lossy(&cmdline).contains(&self.token)
            })
        })
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        if let Some(canary) = &self.home_canary {
            let _ = std::fs::remove_file(canary);
        }
        let _ = std::fs::remove_dir_all(&self.secret_dir);
        let _ = std::fs::remove_file(&self.unix_in_workspace.1);
    }
}

/// Runs every attack (of `only`, when given) under `policy`'s profiles for `workspace`.
pub async fn isolation(
    workspace: &Path,
    policy: &ConfinementPolicy,
    templates: &TemplateEngine,
    only: Option<Role>,
) -> Result<Vec<Outcome>, DrillError> {
    let targets = Targets::make(workspace)?;
    // The builder's sandbox holds what the forge's sandbox node copies into one: the files git
    // lists, the drill's targets among them.
    let listed = process::git::listed(workspace)
        .await
        .map_err(|reason| DrillError::Setup(std::io::Error::other(reason)))?;
    kavi_foundation::sandbox::copy_tree(
        workspace,
        &targets.path("sandbox"),
        &listed.into_iter().collect(),
        &globset::GlobSet::empty(),
        &[workspace.join(".kavi")],
    )?;
    let policy_file = workspace.join(crate::confinement::policy::DEFAULT_POLICY);
    let mut outcomes = Vec::new();
    for case in CASES
        .iter()
        .filter(|c| only.is_none_or(|role| c.role == role))
    {
        let outcome = if case.x86_64_only && !cfg!(target_arch = "x86_64") {
            Outcome {
                attack: case.attack,
                role: case.role,
                what: case.what,
                verdict: Verdict::NotRun,
                mechanism: "its system call numbers are x86-64's".to_owned(),
            }
        } else {
            let before = std::fs::read(&policy_file).ok();
            let mut outcome = attack(case, workspace, policy, templates, &targets).await?;
            let landed = targets.path("beside.txt").exists();
            let changed = std::fs::read(&policy_file).ok() != before;
            let reached = targets.reached();
            // A daemon is given a moment: the namespace's processes die as it goes.
            let survived = case.outside == Outside::Survived && {
                let mut alive = targets.survivor();
                for _ in 0..50 {
                    if !alive {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    alive = targets.survivor();
                }
                alive
            };
            let seen = match case.outside {
                Outside::Nothing => None,
                Outside::Reached => reached.then_some("the drill's listener was reached"),
                Outside::Survived => survived.then_some("a process outlived the run"),
                Outside::Landed => landed.then_some("the file landed beside the sandbox"),
                Outside::PolicyChanged => changed.then_some("the policy file changed"),
            };
            if let Some(seen) = seen {
                outcome.verdict = Verdict::Allowed;
                outcome.mechanism = seen.to_owned();
            } else if outcome.verdict == Verdict::Allowed && case.outside != Outside::Nothing {
                // The attack did what it could, and nothing came of it outside.
                outcome.verdict = Verdict::Refused;
                outcome.mechanism = match case.outside {
                    Outside::Reached => "network namespace: nothing left the sandbox",
                    Outside::Survived => "PID namespace: nothing outlived the run",
                    _ => "mount view: it landed in the sandbox's private view",
                }
                .to_owned();
            }
            let _ = std::fs::remove_file(targets.path("beside.txt"));
            outcome
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// Runs one attack under its role's profile.
async fn attack(
    case: &Case,
    workspace: &Path,
    policy: &ConfinementPolicy,
    templates: &TemplateEngine,
    targets: &Targets,
) -> Result<Outcome, DrillError> {
    let sandbox = targets.path("sandbox");
    let tmp = targets.fresh_tmp(case.role)?;
    let (profile, values, cwd): (&RoleProfile, _, PathBuf) = match case.role {
        Role::Builder => {
            let values = minijinja::context! { sandbox => &sandbox, tmp => &tmp };
            (&policy.builder, values, sandbox.clone())
        }
        Role::Gate => {
            let values =
                minijinja::context! { workspace => workspace, tmp => &tmp, snapshot => workspace };
            (&policy.gate, values, workspace.to_owned())
        }
        Role::Skill => {
            let values =
                minijinja::context! { workspace => workspace, tmp => &tmp, snapshot => workspace };
            let profile = if case.network {
                &policy.network
            } else {
                &policy.read_only
            };
            (profile, values, workspace.to_owned())
        }
    };
    let outcome = |verdict, mechanism: String| Outcome {
        attack: case.attack,
        role: case.role,
        what: case.what,
        verdict,
        mechanism,
    };
    let confinement = profile
        .confine(templates, &values, &[], &[])
        .map_err(DrillError::Confinement)?;
    if !confinement.isolated() {
        let why = confinement.unconfined_because.clone().unwrap_or_default();
        return Ok(outcome(
            Verdict::NotRun,
            format!("the role runs unconfined: {why}"),
        ));
    }
    let mut env = process::base_env();
    env.extend(
        [
            ("TMPDIR", tmp.display().to_string()),
            ("KAVI_DRILL_KAVI_PID", std::process::id().to_string()),
            (
                "KAVI_DRILL_HOME_CANARY",
                targets
                    .home_canary
                    .as_ref()
                    .map_or("/nonexistent".into(), |p| p.display().to_string()),
            ),
            (
                "KAVI_DRILL_LEDGER",
                workspace.join(".kavi").display().to_string(),
            ),
            (
                "KAVI_DRILL_SECRET",
                SECRET_FILES
                    .iter()
                    .map(|name| targets.secret_dir.join(name).display().to_string())
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            (
                "KAVI_DRILL_IGNORED",
                match case.role {
                    // Where the sandbox's copy of the workspace would have it.
                    Role::Builder => sandbox.join(
                        targets
                            .secret_dir
                            .strip_prefix(workspace)
                            .unwrap_or(&targets.secret_dir),
                    ),
                    Role::Gate | Role::Skill => targets.secret_dir.clone(),
                }
                .join(IGNORED_SECRET)
                .display()
                .to_string(),
            ),
            (
                "KAVI_DRILL_POLICY",
                workspace
                    .join(crate::confinement::policy::DEFAULT_POLICY)
                    .display()
                    .to_string(),
            ),
            (
                "KAVI_DRILL_BESIDE",
                targets.path("beside.txt").display().to_string(),
            ),
            (
                "KAVI_DRILL_UDP_PORT",
                targets.udp.local_addr()?.port().to_string(),
            ),
            (
                "KAVI_DRILL_TCP_PORT",
                targets.tcp.local_addr()?.port().to_string(),
            ),
            (
                "KAVI_DRILL_UNIX",
                targets.path("drill.sock").display().to_string(),
            ),
            (
                "KAVI_DRILL_UNIX_WORKSPACE",
                targets.unix_in_workspace.1.display().to_string(),
            ),
            (
                "KAVI_DRILL_PASSWD_LINK",
                targets.secret_dir.join(PASSWD_LINK).display().to_string(),
            ),
            (
                "KAVI_DRILL_PASSWD_SHA256",
                kavi_foundation::hash::sha256_hex(
                    &std::fs::read("/etc/passwd").unwrap_or_default(),
                ),
            ),
            ("KAVI_DRILL_ABSTRACT", targets.abstract_name.clone()),
            ("KAVI_DRILL_TOKEN", targets.token.clone()),
        ]
        .map(|(key, value)| (key.to_owned(), value)),
    );
    let spec = CommandSpec {
        program: "python3".into(),
        args: ["-I", "-B", "-", case.attack].map(str::to_owned).into(),
        env,
        cwd,
        stdin: Some(ATTACKS.as_bytes().to_vec()),
        confinement: Some(confinement),
    };
    let options = CaptureOptions {
        limit: 64 * 1024,
        spill_dir: targets.dir.path().to_owned(),
        roster: None,
        live: None,
    };
    let stop = CancellationToken::new();
    let timer = stop.clone();
    let guard = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        timer.cancel();
    });
    let finished = process::run(&spec, &options, &stop).await;
    guard.abort();
    let finished = match finished {
        Ok(finished) => finished,
        Err(e) => return Ok(outcome(Verdict::NotRun, format!("could not start: {e}"))),
    };
    // What the proxy refused must be in its record, or the ledger would not know.
    if case.attack.starts_with("proxy_") {
        let port = targets.tcp.local_addr()?.port();
        let recorded = finished
            .network
            .as_ref()
            .is_some_and(|log| log.connections.iter().any(|c| c.port == port && !c.allowed));
        if !recorded {
            let stdout = String::from_utf8_lossy(&finished.stdout.head);
            if stdout.contains("\"allowed\": false") {
                return Ok(outcome(
                    Verdict::Allowed,
                    "refused, but the proxy's record does not say so".to_owned(),
                ));
            }
        }
    }
    Ok(match &finished.violation {
        Some(Violation::ForbiddenCall) if finished.exit == Exit::Signal(nix::libc::SIGSYS) => {
            outcome(
                Verdict::Refused,
                "seccomp: the process was killed".to_owned(),
            )
        }
        // A process the attack started was killed, whatever the attack says of it (unless it
        // got through some other way).
        Some(Violation::ForbiddenCall) => match reported(&finished) {
            Some((Verdict::Allowed, detail)) => outcome(Verdict::Allowed, detail),
            _ => outcome(
                Verdict::Refused,
                "seccomp: a process it started was killed, which fails the run as a security \
                 violation"
                    .to_owned(),
            ),
        },
        Some(Violation::Bound(bound)) => outcome(Verdict::Refused, format!("stopped at {bound}")),
        Some(Violation::Tripwire(path)) => outcome(
            Verdict::Refused,
            format!(
                "tripwire: {} is a decoy; the process was stopped",
                path.display()
            ),
        ),
        Some(Violation::Daemon) => outcome(
            Verdict::Refused,
            "watch: a daemon was seen; the process was stopped".to_owned(),
        ),
        Some(Violation::Repository(what)) => outcome(
            Verdict::Refused,
            format!("a repository it made in its write scope was removed ({what})"),
        ),
        Some(Violation::Unwatched) => outcome(
            Verdict::Refused,
            "watch: not every process could be watched; the process was stopped".to_owned(),
        ),
        None => {
            let (verdict, detail) = reported(&finished).unwrap_or_else(|| {
                let stderr = String::from_utf8_lossy(&finished.stderr.head);
                let last = stderr.trim_end().lines().last().unwrap_or("no output");
                (
                    Verdict::NotRun,
                    format!("ended with {:?}: {last}", finished.exit),
                )
            });
            outcome(verdict, detail)
        }
    })
}

/// What an attack that was not stopped for a violation says of itself: its JSON report, its
/// kill at a bound, or the errno it raised with; `None` when it says nothing of these.
fn reported(finished: &process::Finished) -> Option<(Verdict, String)> {
    let stdout = String::from_utf8_lossy(&finished.stdout.head);
    match stdout.lines().last().map(serde_json::from_str::<Report>) {
        Some(Ok(report)) if report.allowed => Some((Verdict::Allowed, report.detail)),
        Some(Ok(report)) => {
            let errno = report.errno.unwrap_or_default();
            Some((
                Verdict::Refused,
                format!("{} ({errno})", mechanism_of(&errno)),
            ))
        }
        _ if finished.exit == Exit::Signal(nix::libc::SIGKILL) => {
            Some((Verdict::Refused, "killed at a bound".to_owned()))
        }
        _ => {
            let stderr = String::from_utf8_lossy(&finished.stderr.head);
            let last = stderr.trim_end().lines().last().unwrap_or("no output");
            // An attack that raised: the errno that stopped it.
            let (_, rest) = last.rsplit_once("[Errno ")?;
            let number: i32 = rest
                .split(']')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let errno = nix::errno::Errno::from_raw(number);
            Some((
                Verdict::Refused,
                format!("{} ({errno:?})", mechanism_of(&format!("{errno:?}"))),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_name_the_mechanism_that_refused() {
        assert_eq!(mechanism_of("EROFS"), "mount view: read-only");
        assert_eq!(mechanism_of("ESRCH"), "PID namespace");
        assert_eq!(mechanism_of("EPERM"), "seccomp or no capabilities");
        assert_eq!(mechanism_of("EWHATEVER"), "refused");
    }

    #[test]
    fn every_case_names_an_attack_of_the_script() {
        for case in CASES {
            assert!(
                ATTACKS.contains(&format!("\ndef {}():", case.attack)),
                "{} is not in attacks.py",
                case.attack
            );
        }
    }
}
