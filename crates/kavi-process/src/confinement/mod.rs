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

pub mod accounts;
pub mod bounds;
pub mod bridge;
pub mod deaths;
pub mod listing;
pub mod policy;
pub mod programs;
pub mod runtime;
mod seccomp;
pub mod tripwire;

// The proxy and the network policy are a crate of their own below this one; here where they were.
pub use kavi_proxy::{network, proxy};

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
    /// Whether the program may start other programs (see [`programs`]).
    pub programs: bool,
    /// Whether its processes may take file locks (see [`seccomp`]).
    pub locks: bool,
    /// Refuse to run the role where the machine cannot isolate it.
    pub require: bool,
    pub limits: Limits,
    /// The search path programs are found on, inside the view.
    pub path: String,
    /// Where decoys are laid, where the view shows nothing else (see [`tripwire`]).
    pub tripwires: Vec<PathBuf>,
    /// The workspace, when the view shows it: it is shown as only the files git tracks or
    /// would track (see [`listing`]), whatever the profile's paths say.
    pub workspace: Option<PathBuf>,
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
    /// Where no cgroup bounds the tree's processes, the bound set as `RLIMIT_NPROC` on the
    /// namespace's init before its program starts (see [`bounds::processes_by_rlimit`]):
    /// bubblewrap is handed two more descriptors after the write scopes', the first to tell
    /// the init's pid on, the second to wait on until the bound is set.
    pub processes: Option<u64>,
    /// The decoys laid in the view, watched while the process runs.
    pub tripwires: Option<tripwire::Tripwires>,
    /// The accounts files mounted over the host's, kept until the process ends.
    pub accounts: Option<accounts::Accounts>,
    /// For a profile with the network: the proxy's socket, to serve while the process runs,
    /// and the variables that point the process at it.
    pub proxy: Option<proxy::Listening>,
    pub env: Vec<(String, String)>,
    /// The workspace's view, mounted in its place, kept until the process ends.
    pub listed: Option<listing::Listed>,
    /// The version-control state each write scope in the workspace held before the launch
    /// (see [`repositories_made`]).
    pub vcs_before: Vec<(PathBuf, Vec<PathBuf>)>,
}

/// The version-control state (a `.git`, a folder git takes for a repository, ...) a launch's
/// process made in its write scopes in the workspace, given what each held before
/// ([`Launch::vcs_before`]), each made inert already: a person's `git status` in that folder
/// would run its configuration as them. `Err` names a scope that could not be looked at.
pub fn repositories_made(vcs_before: &[(PathBuf, Vec<PathBuf>)]) -> Result<Vec<PathBuf>, String> {
    let mut made = Vec::new();
    for (scope, before) in vcs_before {
        let now =
            kavi_foundation::vcs::states(scope).map_err(|e| format!("{}: {e}", scope.display()))?;
        for state in now.into_iter().filter(|state| !before.contains(state)) {
            kavi_foundation::vcs::remove(scope, &state)
                .map_err(|e| format!("{}: {e}", state.display()))?;
            made.push(state);
        }
    }
    Ok(made)
}

impl Confinement {
    /// Whether the process will be isolated.
    pub fn isolated(&self) -> bool {
        self.filters.is_some()
    }

    /// The workspace's view for a launch (see [`listing`]): git's list of its files, taken
    /// now, in a folder of their own. `None` when the process runs unconfined or its view does
    /// not show the workspace. A workspace git cannot list runs nothing.
    pub async fn list_workspace(&self) -> std::io::Result<Option<listing::Listed>> {
        let Some((root, files)) = self.listed_files().await? else {
            return Ok(None);
        };
        // A write scope is mounted on a folder or file in the view, which git may list nothing
        // of. A hidden path the list leaves out needs nothing: it is not there.
        let points: Vec<PathBuf> = self
            .profile
            .write
            .iter()
            .filter(|path| path.starts_with(&root))
            .cloned()
            .collect();
        tokio::task::spawn_blocking(move || listing::Listed::build(&root, &files, &points))
            .await
            .map_err(std::io::Error::other)?
            .map(Some)
    }

    /// What the workspace's view for a launch now would hold (see [`listing::stamp`]): a view
    /// built earlier still shows the workspace while this is what it was then. `None` where
    /// the process would not see the workspace.
    pub async fn workspace_stamp(&self) -> std::io::Result<Option<String>> {
        let Some((root, mut files)) = self.listed_files().await? else {
            return Ok(None);
        };
        // What the view hides (kavi's state, `.git`) is not shown, and changes with every run.
        files.retain(|file| {
            !self
                .profile
                .hide
                .iter()
                .any(|hidden| root.join(file).starts_with(hidden))
        });
        tokio::task::spawn_blocking(move || listing::stamp(&root, &files))
            .await
            .map_err(std::io::Error::other)?
            .map(Some)
    }

    /// The workspace the view shows and git's list of its files, taken now.
    async fn listed_files(&self) -> std::io::Result<Option<(PathBuf, Vec<PathBuf>)>> {
        let Some(root) = self.profile.workspace.clone().filter(|_| self.isolated()) else {
            return Ok(None);
        };
        // Boxed: git is started through the same `run` that calls this.
        let files = Box::pin(crate::git::listed(&root)).await.map_err(|reason| {
            std::io::Error::other(format!(
                "refusing to run the {}: its view of the workspace is what git lists, and {reason}",
                self.profile.role
            ))
        })?;
        Ok(Some((root, files)))
    }

    /// The launch of `program` (absolute, and inside the view) with `args` in `cwd`, showing
    /// `listed` in the workspace's place; `None` when running unconfined.
    pub fn launch(
        &self,
        program: &Path,
        args: &[String],
        cwd: &Path,
        listed: Option<listing::Listed>,
    ) -> std::io::Result<Option<Launch>> {
        let Some(filters) = &self.filters else {
            return Ok(None);
        };
        if self.profile.limits.need_cgroup() {
            // Launches close together (a gate's tools) all find the move fast.
            bounds::move_soon();
        }
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
        let accounts = accounts::Accounts::write(&read)?;
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
        // Only what the workspace's view holds is hidden in it; bubblewrap cannot make a
        // place to mount on in its read-only folder.
        let hide: Vec<PathBuf> = self
            .profile
            .hide
            .iter()
            .filter(|path| match &listed {
                Some(view) => path.strip_prefix(&view.root).map_or(true, |relative| {
                    view.folder().join(relative).symlink_metadata().is_ok()
                }),
                None => true,
            })
            .cloned()
            .collect();
        let cgroup = bounds::Cgroup::make(&self.profile.limits)?;
        let processes = bounds::processes_by_rlimit(&self.profile.limits, cgroup.is_some());
        let mut wrapped = runtime::arguments(
            &runtime::View {
                read: &read,
                write: &write,
                hide: &hide,
                decoys: tripwires.as_ref().map_or(&[], |t| t.mounts()),
                files: accounts.as_ref().map_or(&[], |a| a.mounts()),
                listed: listed.as_ref().map(|l| (l.root.as_path(), l.folder())),
            },
            socket
                .as_deref()
                .zip(proxy.as_ref().map(|(_, b)| b.as_path())),
            cwd,
            filters.len(),
            self.profile.limits.memory_mib.map(|mib| mib << 20),
            processes.map(|_| 3 + filters.len() + scopes.len()),
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
        if self.profile.programs {
            wrapped.extend(args.iter().cloned());
        } else {
            let held = programs::held(program, args).map_err(|reason| {
                std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("refusing to run the {}: {reason}", self.profile.role),
                )
            })?;
            wrapped.extend(held);
        }
        // What version control's state each write scope in the workspace holds now: one the
        // process makes is found when it ends (a nested `.git` is hidden from it, so it cannot
        // change one that was there).
        let vcs_before = match &self.profile.workspace {
            Some(workspace) => write
                .iter()
                .map(|(scope, _)| scope)
                .filter(|scope| scope.starts_with(workspace))
                .map(|scope| {
                    kavi_foundation::vcs::states(scope)
                        .map(|states| (scope.clone(), states))
                        .map_err(|e| {
                            std::io::Error::other(format!(
                                "cannot look for version control's state in the write scope \
                                 {}: {e}",
                                scope.display()
                            ))
                        })
                })
                .collect::<std::io::Result<_>>()?,
            None => Vec::new(),
        };
        let rlimits = bounds::rlimits(&self.profile.limits, cgroup.is_some());
        Ok(Some(Launch {
            landlock: self.landlock.as_ref().map(|(fd, _)| Arc::clone(fd)),
            scopes,
            program: bwrap.to_owned(),
            args: wrapped,
            filters: Arc::clone(filters),
            cgroup,
            rlimits,
            processes,
            tripwires,
            accounts,
            env: if proxy.is_some() {
                proxy::environment()
            } else {
                Vec::new()
            },
            proxy: proxy.map(|(listening, _)| listening),
            listed,
            vcs_before,
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
                // Asked only of a role that may start programs: a skill's run starts no reader.
                "seccomp_kills": if !self.profile.programs {
                    "seen only when the program itself is killed: a child's may be a library \
                     trying to start a program"
                        .to_owned()
                } else {
                    match deaths::availability() {
                        Ok(()) => "seen in every process of the tree (the kernel's process events)"
                            .to_owned(),
                        Err(why) => format!("seen only when the program itself is killed: {why}"),
                    }
                },
                "programs": if self.profile.programs {
                    "any"
                } else {
                    "none: execve and execveat kill the process once its interpreter has started"
                },
                "locks": if self.profile.locks {
                    "any"
                } else {
                    "none: every file lock and lease is refused"
                },
                "capabilities": "none",
                "terminal": "none",
                "workspace": self.profile.workspace.as_ref().map(|workspace| {
                    if self.profile.write.iter().any(|path| path.starts_with(workspace)) {
                        "only the files git tracks or would track, and all its write scopes \
                         hold: an ignored file elsewhere is not there"
                    } else {
                        "only the files git tracks or would track: an ignored file is not there"
                    }
                }),
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
    let filters = seccomp::filters(profile.network, profile.locks)
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
mod tests;
