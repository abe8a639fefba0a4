//! Confinement: the isolation every process kavi starts for a builder, a gate or a skill runs
//! under.
//!
//! A role's profile (`policies/confinement.toml`) says what the process may read, where it may
//! write, what is hidden from it, whether it may use the network, and its resource bounds.
//! [`prepare`] turns it into an isolated launch: bubblewrap ([`runtime`]) builds new namespaces
//! and a mount view of exactly those paths, with no capabilities and no terminal; seccomp
//! programs ([`seccomp`]) kill the calls only an attack makes and refuse the sockets the profile
//! does not allow; a profile with the network reaches out only through a proxy kavi runs for the
//! launch, which holds it to `policies/network.toml`'s `[processes]` hosts and records every
//! connection ([`proxy`], [`bridge`]); cgroups and rlimits ([`bounds`]) bound memory, processes,
//! CPU and files. The
//! one place that spawns processes ([`crate`]) starts bubblewrap in place of the
//! program, its descriptors and bounds set between clone and exec.
//!
//! Where the machine cannot isolate (no bubblewrap, no namespaces), the profile's `require`
//! decides: refuse to run the role, naming what is missing, or run it unconfined and record
//! `none`.

pub mod bounds;
pub mod bridge;
pub mod network;
pub mod policy;
pub mod proxy;
pub mod runtime;
mod seccomp;
pub mod tripwire;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use bounds::Limits;

/// The failure kind of a process its confinement stopped for what only an attack does (a
/// forbidden system call, a sprung tripwire, a daemon): the shipped escalation rules send it
/// to a person at once.
pub const SECURITY_KIND: &str = "SECURITY_VIOLATION";

/// The failure kind of a process its confinement stopped at a resource bound.
pub const RESOURCE_KIND: &str = "RESOURCE_LIMIT";
use serde::Serialize;

/// What one role's process may touch, with every path resolved.
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    pub role: String,
    /// Read-only in the view (the system's programs and libraries among them).
    pub read: Vec<PathBuf>,
    /// Read-write in the view.
    pub write: Vec<PathBuf>,
    /// Present in the view but empty: an empty read-only folder, or an empty file.
    pub hide: Vec<PathBuf>,
    /// Globs, and the folders below which each match is hidden too: the role's own readable
    /// folders (the workspace), searched when the profile is prepared.
    #[serde(skip)]
    pub hide_matching: Option<(Arc<globset::GlobSet>, Vec<PathBuf>)>,
    /// Whether the process may reach the network, through kavi's proxy and only to `hosts`;
    /// either way it has a network namespace of its own with only loopback, and without the
    /// network only local sockets.
    pub network: bool,
    /// The hosts the proxy lets a process with the network reach (none when empty).
    #[serde(skip)]
    pub hosts: Arc<proxy::HostAllowlist>,
    /// Refuse to run the role where the machine cannot isolate it.
    pub require: bool,
    pub limits: Limits,
    /// The search path programs are found on, inside the view.
    pub path: String,
    /// Where decoys are laid, where the view shows nothing else (see [`tripwire`]).
    pub tripwires: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfinementError {
    #[error(
        "refusing to run the {role} unconfined: {missing} (policies/confinement.toml requires \
         confinement; set `require = false` for the role to run it unconfined instead)"
    )]
    Unsupported { role: String, missing: String },
    #[error("refusing to run the {role}: {}: {reason}", path.display())]
    Path {
        role: String,
        path: PathBuf,
        reason: String,
    },
    #[error("failed to prepare the {role}'s confinement: {reason}")]
    Filters { role: String, reason: String },
}

/// A policy file, as the ledger names it: its path and `sha256:` hash (the text is among the
/// stored specs, `kavi spec show <hash>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRef {
    pub path: String,
    pub hash: String,
}

/// A profile made ready for a child process, or the decision to run it unconfined.
#[derive(Debug, Clone)]
pub struct Confinement {
    pub profile: Profile,
    /// The policy the profile comes from.
    pub policy: Option<PolicyRef>,
    /// The policy its `hosts` come from, for a profile with the network.
    pub hosts_policy: Option<PolicyRef>,
    /// The seccomp programs; `None` when running unconfined.
    filters: Option<Arc<Vec<Vec<u8>>>>,
    /// The Landlock ruleset applied before bubblewrap starts, and the ABI it was made for.
    landlock: Option<(Arc<OwnedFd>, i32)>,
    /// Why the process runs unconfined, when it does.
    pub unconfined_because: Option<String>,
}

/// How [`crate`] starts a confined program: bubblewrap, its arguments, the seccomp
/// programs it reads from descriptors 3, 4, ..., the cgroup the child joins and the rlimits it
/// sets.
pub struct Launch {
    /// The Landlock ruleset the child restricts itself with before it execs bubblewrap.
    pub landlock: Option<Arc<OwnedFd>>,
    /// The write scopes, opened without following a symlink, that bubblewrap mounts from
    /// descriptors after the seccomp programs' (see [`runtime::arguments`]).
    pub scopes: Vec<OwnedFd>,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub filters: Arc<Vec<Vec<u8>>>,
    pub cgroup: Option<(bounds::Cgroup, Vec<std::os::fd::OwnedFd>)>,
    pub rlimits: Vec<(nix::libc::__rlimit_resource_t, u64)>,
    /// The decoys laid in the view, watched while the process runs.
    pub tripwires: Option<tripwire::Tripwires>,
    /// For a profile with the network: the proxy's socket, to serve while the process runs,
    /// and the variables that point the process at it.
    pub proxy: Option<proxy::Listening>,
    pub env: Vec<(String, String)>,
}

impl Confinement {
    /// Whether the process will be isolated.
    pub fn isolated(&self) -> bool {
        self.filters.is_some()
    }

    /// The launch of `program` (absolute, and inside the view) with `args` in `cwd`; `None`
    /// when running unconfined.
    pub fn launch(
        &self,
        program: &Path,
        args: &[String],
        cwd: &Path,
    ) -> std::io::Result<Option<Launch>> {
        let Some(filters) = &self.filters else {
            return Ok(None);
        };
        let bwrap = runtime::bwrap()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::Unsupported, e))?;
        let mut read = self.profile.read.clone();
        read.extend(installation_of(program));
        // Each write scope is opened here, once, and mounted from that descriptor: a path that
        // bubblewrap resolved again could have been swapped for a symlink in between (by
        // another skill writing the folder around it) and mounted a host folder writable.
        let mut scopes = Vec::new();
        let mut write = Vec::new();
        for path in &self.profile.write {
            match open_scope(path) {
                Ok(fd) => {
                    write.push((path.clone(), 3 + filters.len() + scopes.len()));
                    scopes.push(fd);
                }
                // A scope that does not exist is not mounted, as a read path is not.
                Err(nix::errno::Errno::ENOENT) => {}
                Err(nix::errno::Errno::ELOOP) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!(
                            "refusing to run the {}: its write scope {} is reached through a \
                             symlink",
                            self.profile.role,
                            path.display()
                        ),
                    ));
                }
                Err(e) => {
                    return Err(std::io::Error::other(format!(
                        "cannot open the write scope {}: {e}",
                        path.display()
                    )));
                }
            }
        }
        let mounted: Vec<&Path> = read
            .iter()
            .chain(write.iter().map(|(path, _)| path))
            .chain(&self.profile.hide)
            .map(PathBuf::as_path)
            .collect();
        let tripwires = tripwire::Tripwires::lay(&self.profile.tripwires, &mounted)?;
        // With the network: a proxy for this launch, its socket and the bridge mounted in, and
        // the bridge run in place of the program. Without a bridge, nothing runs.
        let proxy = match self.profile.network {
            false => None,
            true => {
                let bridge = bridge::program().map_err(|reason| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("refusing to run the {}: {reason}", self.profile.role),
                    )
                })?;
                let listening = proxy::Listening::bind(Arc::clone(&self.profile.hosts))?;
                Some((listening, bridge))
            }
        };
        let socket = proxy.as_ref().map(|(listening, _)| listening.socket());
        let mut wrapped = runtime::arguments(
            &runtime::View {
                read: &read,
                write: &write,
                hide: &self.profile.hide,
                decoys: tripwires.as_ref().map_or(&[], |t| t.mounts()),
            },
            socket
                .as_deref()
                .zip(proxy.as_ref().map(|(_, b)| b.as_path())),
            cwd,
            filters.len(),
            self.profile.limits.memory_mib.map(|mib| mib << 20),
        );
        if proxy.is_some() {
            wrapped.extend([
                bridge::PROGRAM_IN_VIEW.to_owned(),
                bridge::SUBCOMMAND.to_owned(),
                proxy::PORT.to_string(),
                proxy::SOCKET_IN_VIEW.to_owned(),
                "--".to_owned(),
            ]);
        }
        wrapped.push(program.display().to_string());
        wrapped.extend(args.iter().cloned());
        let cgroup = bounds::Cgroup::make(&self.profile.limits)?;
        let rlimits = bounds::rlimits(&self.profile.limits, cgroup.is_some());
        Ok(Some(Launch {
            landlock: self.landlock.as_ref().map(|(fd, _)| Arc::clone(fd)),
            scopes,
            program: bwrap.to_owned(),
            args: wrapped,
            filters: Arc::clone(filters),
            cgroup,
            rlimits,
            tripwires,
            env: if proxy.is_some() {
                proxy::environment()
            } else {
                Vec::new()
            },
            proxy: proxy.map(|(listening, _)| listening),
        }))
    }

    /// What the ledger records of this confinement, before its process has run.
    pub fn record(&self) -> serde_json::Value {
        self.record_run(None)
    }

    /// What the ledger records of this confinement, with the connections its process's proxy
    /// allowed and refused, once it has run.
    pub fn record_run(&self, network: Option<&proxy::ProxyLog>) -> serde_json::Value {
        let proxied = self.isolated() && self.profile.network;
        let mut record = serde_json::json!({
            "role": self.profile.role,
            "enforced": if self.isolated() { "bubblewrap" } else { "none" },
            "isolation": self.isolated().then(|| serde_json::json!({
                "namespaces": ["user", "pid", "mount", "ipc", "uts", "cgroup", "net"],
                "seccomp": true,
                "capabilities": "none",
                "terminal": "none",
                "bounds": bounds::cgroup_support().describe(),
                "landlock": self.landlock.as_ref().map(|(_, abi)| format!(
                    "ABI {abi}: signals and abstract unix sockets scoped to the sandbox{}",
                    match (*abi >= 4, self.profile.network) {
                        (false, _) => "",
                        (true, true) => ", TCP connect only to the proxy's port",
                        (true, false) => ", TCP denied",
                    }
                )),
            })),
            "unconfined_because": self.unconfined_because,
            "read": self.profile.read,
            "write": self.profile.write,
            "hide": self.profile.hide,
            "tripwires": self.profile.tripwires,
            "network": match (self.profile.network, proxied) {
                (false, _) => "none",
                (true, true) => "proxy",
                (true, false) => "host",
            },
            "limits": self.profile.limits,
            "policy": self.policy.as_ref().map(|p| &p.path),
            "policy_hash": self.policy.as_ref().map(|p| &p.hash),
        });
        // Only a profile with the network has a proxy to record.
        if proxied && let Some(fields) = record.as_object_mut() {
            fields.insert(
                "proxy".to_owned(),
                serde_json::json!({
                    "listen": format!("127.0.0.1:{}", proxy::PORT),
                    "allowed_hosts": self.profile.hosts.texts(),
                    "policy": self.hosts_policy.as_ref().map(|p| &p.path),
                    "policy_hash": self.hosts_policy.as_ref().map(|p| &p.hash),
                    "connections": network.map(|log| &log.connections),
                    "allowed": network.map(|log| log.allowed),
                    "refused": network.map(|log| log.refused),
                    "unrecorded": network.map(|log| log.unrecorded),
                }),
            );
        }
        record
    }
}

/// `path` opened as a place to mount (`O_PATH`), refusing a symlink in any of its components.
fn open_scope(path: &Path) -> nix::Result<OwnedFd> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    nix::fcntl::openat2(
        nix::fcntl::AT_FDCWD,
        path,
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )
}

/// What a program needs besides itself when it lives in a Python virtual environment (a pinned
/// toolchain): the environment, and the installation of the interpreter it was made from,
/// read from its `pyvenv.cfg`. Nothing for any other program.
fn installation_of(program: &Path) -> Vec<PathBuf> {
    let Some(venv) = program.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    let Ok(cfg) = std::fs::read_to_string(venv.join("pyvenv.cfg")) else {
        return Vec::new();
    };
    let home = cfg.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "home").then(|| PathBuf::from(value.trim()))
    });
    let mut paths = vec![venv.to_owned()];
    // `home` is the interpreter's bin folder; its installation is the folder above.
    if let Some(prefix) =
        home.and_then(|home| home.canonicalize().ok()?.parent().map(Path::to_owned))
    {
        paths.push(prefix);
    }
    paths
}

/// Makes the isolation for `profile` ready, or decides to run it unconfined where the machine
/// cannot isolate and the profile allows that.
pub fn prepare(profile: Profile) -> Result<Confinement, ConfinementError> {
    prepare_with(profile, runtime::bwrap().err())
}

/// [`prepare`] on a machine that cannot isolate for the reason `missing`, if any.
fn prepare_with(profile: Profile, missing: Option<&str>) -> Result<Confinement, ConfinementError> {
    let role = profile.role.clone();
    if let Some(missing) = missing {
        if profile.require {
            return Err(ConfinementError::Unsupported {
                role,
                missing: missing.to_owned(),
            });
        }
        tracing::warn!("running the {role} unconfined: {missing}");
        return Ok(Confinement {
            profile,
            policy: None,
            hosts_policy: None,
            filters: None,
            landlock: None,
            unconfined_because: Some(missing.to_owned()),
        });
    }
    // A write scope is mounted where it points: one reached through a symlink would grant
    // whatever the link names (the ledger, the policies), so it is refused.
    for path in &profile.write {
        if let Ok(real) = path.canonicalize()
            && real != *path
        {
            return Err(ConfinementError::Path {
                role,
                path: path.clone(),
                reason: format!(
                    "a write scope reached through a symlink (it leads to {})",
                    real.display()
                ),
            });
        }
    }
    let mut profile = profile;
    let matches = matching(&profile).map_err(|reason| ConfinementError::Path {
        role: role.clone(),
        path: reason.0,
        reason: format!(
            "cannot search it for what `hide_matching` hides ({}); a folder that cannot be \
             searched could hold a secret, so nothing runs",
            reason.1
        ),
    })?;
    profile.hide.extend(matches);
    let filters = seccomp::filters(profile.network)
        .map_err(|reason| ConfinementError::Filters { role, reason })?;
    let landlock = landlock_layer(profile.network).map(|fd| (Arc::new(fd), kernel_abi()));
    Ok(Confinement {
        profile,
        policy: None,
        hosts_policy: None,
        filters: Some(Arc::new(filters)),
        landlock,
        unconfined_because: None,
    })
}

/// The paths below the profile's own folders that its `hide_matching` globs match, each
/// outermost match once (a matching folder is hidden whole), never inside what is hidden
/// already or through a symlink. A folder that cannot be searched (unreadable, or nested past
/// the longest path) is an error, never skipped: what it holds could match.
fn matching(profile: &Profile) -> Result<Vec<PathBuf>, (PathBuf, String)> {
    let Some((globs, roots)) = &profile.hide_matching else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for root in roots {
        let mut walker = walkdir::WalkDir::new(root).follow_links(false).into_iter();
        while let Some(entry) = walker.next() {
            let entry = entry.map_err(|e| {
                let path = e.path().unwrap_or(root).to_owned();
                (path, e.to_string())
            })?;
            let path = entry.path();
            if profile.hide.iter().any(|hidden| path.starts_with(hidden)) {
                if entry.file_type().is_dir() {
                    walker.skip_current_dir();
                }
                continue;
            }
            let Ok(relative) = path.strip_prefix(root) else {
                continue;
            };
            if !relative.as_os_str().is_empty() && globs.is_match(relative) {
                found.push(path.to_owned());
                if entry.file_type().is_dir() {
                    walker.skip_current_dir();
                }
            }
        }
    }
    Ok(found)
}

/// The Landlock ABI version this kernel offers (0: none).
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: with a null attribute and size 0, this call only reports the ABI version.
    let version = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(version).unwrap_or(0).max(0)
}

/// Landlock as a second layer under the namespaces, where the kernel has it: signals and
/// abstract unix sockets scoped to the sandbox (ABI 6), TCP bind and connect denied without the
/// network, and with it TCP connect only to the bridge's port, the one way out (ABI 4). No file
/// rights: a ruleset that handles them forbids the mounts bubblewrap makes.
fn landlock_layer(network: bool) -> Option<OwnedFd> {
    use landlock::{
        AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr,
        Scope,
    };
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .ok()?;
    // TCP rules from ABI 4 on; asked for only there, so that an older kernel keeps the rest.
    let tcp = kernel_abi() >= 4;
    let ruleset = match (network, tcp) {
        (false, _) => ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .ok()?,
        (true, true) => ruleset.handle_access(AccessNet::ConnectTcp).ok()?,
        (true, false) => ruleset,
    };
    let mut created = ruleset.create().ok()?;
    if network && tcp {
        created = created
            .add_rule(NetPort::new(proxy::PORT, AccessNet::ConnectTcp))
            .ok()?;
    }
    let fd: Option<OwnedFd> = created.into();
    fd
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CaptureOptions, CommandSpec, Exit, Violation};

    /// A profile like the shipped skill ones, over `dir`.
    fn profile(dir: &Path, write: Vec<PathBuf>, limits: Limits) -> Profile {
        Profile {
            role: "test".into(),
            read: ["/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache"]
                .map(PathBuf::from)
                .into_iter()
                .chain([dir.to_owned()])
                .collect(),
            write,
            hide: vec![dir.join("hidden")],
            tripwires: vec![
                dir.join("hidden/id_rsa"),
                PathBuf::from("/root/.ssh/id_rsa"),
                PathBuf::from("/etc/shadow"),
            ],
            hide_matching: None,
            network: false,
            hosts: Arc::default(),
            require: true,
            limits,
            path: "/usr/bin:/bin".into(),
        }
    }

    /// Says why a test cannot run on this machine, which it then skips; under CI, whose
    /// machine has what these tests need, that fails instead.
    fn skipping(missing: &str) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to run this: {missing}"
        );
        eprintln!("skipping: {missing}");
    }

    /// Runs `script` with `sh` under `profile`, in `dir`. `None` when this machine cannot
    /// isolate: the caller skips (and fails under CI, where it must).
    async fn run_sh(dir: &Path, profile: Profile, script: &str) -> Option<crate::Finished> {
        if let Err(missing) = runtime::bwrap() {
            skipping(missing);
            return None;
        }
        let spec = CommandSpec {
            program: "sh".into(),
            args: vec!["-c".into(), script.to_owned()],
            env: vec![("SECRET_OF_KAVI".into(), "hunter2".into())],
            cwd: dir.to_owned(),
            stdin: None,
            confinement: Some(prepare(profile).unwrap()),
        };
        let options = CaptureOptions {
            limit: 1 << 20,
            spill_dir: dir.to_owned(),
            roster: None,
            live: None,
        };
        Some(
            crate::run(&spec, &options, &Default::default())
                .await
                .unwrap(),
        )
    }

    fn stdout(finished: &crate::Finished) -> String {
        String::from_utf8_lossy(&finished.stdout.head).into_owned()
    }

    #[tokio::test]
    async fn a_confined_child_sees_and_writes_only_its_view() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let inside = dir.join("inside");
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::create_dir_all(dir.join("hidden")).unwrap();
        std::fs::write(dir.join("hidden/ledger"), "rows").unwrap();
        std::fs::write(dir.join("read-only"), "trusted").unwrap();
        std::fs::create_dir_all(dir.join("app")).unwrap();
        std::fs::write(dir.join("app/.env"), "API_KEY=sk-live").unwrap();
        // The decoys (/etc/shadow here, a hidden `.env`) are read last: the tripwire stops the
        // process as soon as it sees one opened, and what follows might not run.
        let script = format!(
            "echo ok > {inside}/a; echo no > {dir}/b; chmod 777 {dir}/read-only; \
             ls /root /home 2>&1; cat {dir}/hidden/ledger 2>&1; \
             cat /proc/1/environ /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n' | grep -c SECRET; \
             v=$(cat /proc/sys/kernel/printk_ratelimit_burst); \
             (echo $v > /proc/sys/kernel/printk_ratelimit_burst) 2>/dev/null || echo sysctl-refused; \
             (echo > /proc/sysrq-trigger) 2>/dev/null || echo sysrq-refused; \
             printf processes=; ls /proc | grep -c '^[0-9]'; \
             cat {dir}/app/.env /etc/shadow 2>&1",
            inside = inside.display(),
            dir = dir.display()
        );
        let mut profile = profile(&dir, vec![inside.clone()], Limits::default());
        let mut secrets = globset::GlobSetBuilder::new();
        secrets.add(globset::Glob::new("**/.env").unwrap());
        profile.hide_matching = Some((Arc::new(secrets.build().unwrap()), vec![dir.clone()]));
        let Some(finished) = run_sh(&dir, profile, &script).await else {
            return;
        };
        let out = stdout(&finished);
        assert_eq!(std::fs::read_to_string(inside.join("a")).unwrap(), "ok\n");
        assert!(!dir.join("b").exists(), "wrote outside its scope");
        assert_eq!(
            std::fs::metadata(dir.join("read-only"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o644,
            "changed a read-only file's mode"
        );
        assert!(out.contains("No such file"), "{out}");
        assert!(!out.contains("rows"), "read a hidden file: {out}");
        assert!(
            !out.contains("sk-live"),
            "read a secret the globs hide: {out}"
        );
        // uid 0 inside may be the host's: the kernel's knobs must not be writable through /proc.
        assert!(
            out.contains("sysctl-refused") && out.contains("sysrq-refused"),
            "{out}"
        );
        // /etc/shadow is not in the view (a decoy is); no process outside it (kavi's environment) is.
        assert!(!out.lines().any(|line| line.starts_with("root:")), "{out}");
        let processes: usize = out
            .lines()
            .find_map(|line| line.strip_prefix("processes="))
            .unwrap_or_else(|| panic!("no process count: {out}"))
            .parse()
            .unwrap();
        assert!(processes <= 4, "sees {processes} processes: {out}");
        use std::os::unix::fs::PermissionsExt;
    }

    #[tokio::test]
    async fn nothing_a_confined_child_starts_outlives_it() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let token = format!("kavi-daemon-{}", std::process::id());
        // A double-forked, setsid daemon that would sleep for a minute.
        let script =
            format!("setsid sh -c 'sleep 60; echo {token}' >/dev/null 2>&1 & echo started");
        let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), &script).await
        else {
            return;
        };
        assert_eq!(stdout(&finished).trim(), "started");
        // The namespace is gone with its init; the kernel kills the rest as it goes.
        let alive = || {
            std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
                std::fs::read(entry.path().join("cmdline"))
                    .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&token))
            })
        };
        for _ in 0..100 {
            if !alive() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("the daemon outlived its run");
    }

    #[tokio::test]
    async fn reading_a_secret_where_it_usually_lives_springs_a_tripwire() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let script = "cat /root/.ssh/id_rsa; echo read";
        let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), script).await
        else {
            return;
        };
        assert_eq!(
            finished.violation,
            Some(Violation::Tripwire("/root/.ssh/id_rsa".into()))
        );
        assert!(finished.violation.as_ref().unwrap().is_security());
        // Opened by a process that dies with the namespace at once (it holds the decoy open
        // when its parent exits), or without waiting and closed straight away: seen all the same.
        for script in [
            "(exec 3</etc/shadow; touch /tmp/opened; sleep 30) & \
             while [ ! -e /tmp/opened ]; do sleep 0.01; done; exit 0",
            "python3 -c 'import os; os.close(os.open(\"/etc/shadow\", os.O_RDONLY | os.O_NONBLOCK))'",
        ] {
            let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), script)
                .await
                .unwrap();
            assert_eq!(
                finished.violation,
                Some(Violation::Tripwire("/etc/shadow".into())),
                "{script}"
            );
        }
        // Inside a hidden folder the view shows nothing, and no decoy is laid there.
        let script = "ls -A /root/.ssh; cat hidden/id_rsa || echo absent";
        let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), script)
            .await
            .unwrap();
        assert_eq!(finished.violation, None);
        assert_eq!(stdout(&finished), "id_rsa\nabsent\n");
    }

    #[tokio::test]
    async fn a_daemon_is_seen_and_stops_the_process_that_left_it() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        // The double fork of a daemon: the middle process exits, its child is orphaned.
        let script = "(setsid sleep 30 &) ; sleep 20; echo finished";
        let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), script).await
        else {
            return;
        };
        assert_eq!(finished.violation, Some(Violation::Daemon));
        assert_eq!(stdout(&finished), "");
        // A child the program waits for is no daemon.
        let script = "sleep 0.5 & wait; echo finished";
        let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), script)
            .await
            .unwrap();
        assert_eq!(finished.violation, None);
        assert_eq!(stdout(&finished), "finished\n");
    }

    #[tokio::test]
    async fn terminal_injection_is_killed_as_a_security_violation() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        // TIOCSTI on stdin (whatever it is): seccomp kills before the kernel looks at the fd.
        let script = "python3 -c 'import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b\"x\")'";
        let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), script).await
        else {
            return;
        };
        assert_eq!(finished.exit, Exit::Signal(nix::libc::SIGSYS));
        assert_eq!(finished.violation, Some(Violation::ForbiddenCall));
    }

    #[tokio::test]
    async fn without_the_network_only_socket_pairs_open_and_reaching_out_is_a_violation() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let probe = r#"python3 -c '
import socket
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); print("netlink allowed")
except OSError as e:
    print("netlink refused", e.errno)
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); print("unix allowed")
except OSError as e:
    print("unix refused", e.errno)
socket.socketpair(); print("pair")
'"#;
        let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), probe).await
        else {
            return;
        };
        assert_eq!(
            stdout(&finished),
            "netlink refused 1\nunix refused 1\npair\n"
        );
        // UDP, TCP over IPv6, and MPTCP: each kills the process that tries.
        for (family, kind, proto) in [
            ("AF_INET", "SOCK_DGRAM", 0),
            ("AF_INET6", "SOCK_STREAM", 0),
            ("AF_INET", "SOCK_STREAM", 262),
        ] {
            let script = format!(
                "exec python3 -c 'import socket; socket.socket(socket.{family}, socket.{kind}, {proto}); print(\"open\")'"
            );
            let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), &script)
                .await
                .unwrap();
            assert_eq!(
                finished.violation,
                Some(Violation::ForbiddenCall),
                "{family} {kind} {proto}"
            );
            assert_eq!(stdout(&finished), "");
        }
    }

    #[tokio::test]
    async fn a_process_tree_past_its_bounds_is_stopped_and_says_which() {
        if matches!(bounds::cgroup_support(), bounds::CgroupSupport::None(_)) {
            skipping(&bounds::cgroup_support().describe());
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let limits = Limits {
            memory_mib: Some(64),
            processes: Some(16),
            ..Limits::default()
        };
        let grow = "python3 -c 'b = bytearray(256 << 20); print(len(b))'";
        let Some(finished) = run_sh(&dir, profile(&dir, vec![], limits), grow).await else {
            return;
        };
        assert_eq!(
            finished.violation,
            Some(Violation::Bound("its memory bound (64 MiB)".into()))
        );
        let fork = "for i in $(seq 40); do sleep 5 & done; wait";
        let finished = run_sh(&dir, profile(&dir, vec![], limits), fork)
            .await
            .unwrap();
        assert_eq!(
            finished.violation,
            Some(Violation::Bound("its process bound (16 processes)".into()))
        );
    }

    #[tokio::test]
    async fn a_process_that_fills_its_write_folders_past_the_disk_bound_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let scope = dir.join("scope");
        std::fs::create_dir_all(&scope).unwrap();
        let limits = Limits {
            disk_mib: Some(8),
            ..Limits::default()
        };
        // 4 MiB a step, never one file past any file-size bound, for up to 30 seconds.
        let fill = format!(
            "for i in $(seq 120); do head -c 4194304 /dev/zero > {}/f$i; sleep 0.25; done",
            scope.display()
        );
        let Some(finished) = run_sh(&dir, profile(&dir, vec![scope.clone()], limits), &fill).await
        else {
            return;
        };
        assert_eq!(
            finished.violation,
            Some(Violation::Bound("its disk bound (8 MiB)".into()))
        );
        let held = bounds::disk_used(&[scope]).unwrap();
        assert!(
            held < 64 << 20,
            "{held} bytes written before it was stopped"
        );
    }

    /// Each process's CPU rlimit is below the bound, yet three of them together pass it: the
    /// tree's time is what is bounded, where the cgroup counts it.
    #[tokio::test]
    async fn a_tree_that_spends_more_cpu_than_its_bound_is_stopped() {
        if !matches!(
            bounds::cgroup_support(),
            bounds::CgroupSupport::V1 {
                cpuacct: Some(_),
                ..
            } | bounds::CgroupSupport::V2(_)
        ) {
            skipping(&bounds::cgroup_support().describe());
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let limits = Limits {
            cpu_seconds: Some(2),
            ..Limits::default()
        };
        // Three spinners of 1.5 CPU seconds each, for at most 20 seconds.
        let spin = "for i in 1 2 3; do timeout 20 python3 -c 'import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass' & done; wait; sleep 20";
        let Some(finished) = run_sh(&dir, profile(&dir, vec![], limits), spin).await else {
            return;
        };
        assert_eq!(
            finished.violation,
            Some(Violation::Bound("its CPU bound (2 s)".into()))
        );
    }

    #[test]
    fn without_isolation_a_required_profile_refuses_and_an_optional_one_runs_unconfined() {
        let dir = tempfile::tempdir().unwrap();
        let mut optional = profile(dir.path(), vec![], Limits::default());
        let err = prepare_with(
            optional.clone(),
            Some("bubblewrap (`bwrap`) is not installed"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("refusing to run the test unconfined: bubblewrap"),
            "{err}"
        );
        optional.require = false;
        let unconfined = prepare_with(optional, Some("no namespaces")).unwrap();
        assert!(!unconfined.isolated());
        assert_eq!(unconfined.record()["enforced"], "none");
        assert_eq!(unconfined.record()["unconfined_because"], "no namespaces");
    }

    /// A scope swapped for a symlink between the check and the start (another skill racing
    /// in the folder around it) is refused when the process starts, never mounted.
    #[tokio::test]
    async fn a_write_scope_swapped_for_a_symlink_after_the_check_is_not_mounted() {
        if let Err(missing) = runtime::bwrap() {
            skipping(missing);
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let (scope, elsewhere) = (dir.join("scope"), dir.join("elsewhere"));
        std::fs::create_dir_all(&scope).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        let confinement = prepare(profile(&dir, vec![scope.clone()], Limits::default())).unwrap();
        std::fs::remove_dir(&scope).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &scope).unwrap();
        let spec = CommandSpec {
            program: "sh".into(),
            args: vec!["-c".into(), format!("echo x > {}/planted", scope.display())],
            env: vec![],
            cwd: dir.clone(),
            stdin: None,
            confinement: Some(confinement),
        };
        let options = CaptureOptions {
            limit: 4096,
            spill_dir: dir.clone(),
            roster: None,
            live: None,
        };
        let err = crate::run(&spec, &options, &Default::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("reached through a symlink"), "{err}");
        assert!(!elsewhere.join("planted").exists());
    }

    /// A folder nested past the longest path cannot be searched for secrets: the profile is
    /// refused, never prepared with what the search reached before it.
    #[test]
    fn a_workspace_that_cannot_be_searched_for_secrets_refuses_the_role() {
        use nix::fcntl::{OFlag, open, openat};
        use nix::sys::stat::Mode;
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let name = "d".repeat(200);
        let mut fd = open(&dir, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty()).unwrap();
        for _ in 0..25 {
            nix::sys::stat::mkdirat(&fd, name.as_str(), Mode::from_bits_truncate(0o755)).unwrap();
            fd = openat(
                &fd,
                name.as_str(),
                OFlag::O_DIRECTORY | OFlag::O_RDONLY,
                Mode::empty(),
            )
            .unwrap();
        }
        std::fs::write(dir.join("zz.env"), "API_KEY=1").unwrap();
        let mut profile = profile(&dir, vec![], Limits::default());
        let mut secrets = globset::GlobSetBuilder::new();
        secrets.add(globset::Glob::new("**/*.env").unwrap());
        profile.hide_matching = Some((Arc::new(secrets.build().unwrap()), vec![dir.clone()]));
        let err = prepare_with(profile, None).unwrap_err().to_string();
        assert!(
            err.contains("cannot search it for what `hide_matching` hides"),
            "{err}"
        );
        // The tree goes as it came, one level at a time below the longest path.
        let _ = std::process::Command::new("rm")
            .arg("-rf")
            .arg(&dir)
            .status();
    }

    #[test]
    fn a_write_scope_reached_through_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(dir.join(".kavi")).unwrap();
        std::os::unix::fs::symlink(".kavi", dir.join("notes")).unwrap();
        let err = prepare_with(
            profile(&dir, vec![dir.join("notes")], Limits::default()),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("through a symlink"), "{err}");
    }
}
