//! What children start with from kavi's own process: the variables passed through, and the
//! open-file limits kavi raised for itself and gives back.

use std::sync::OnceLock;

/// Variables passed through from kavi's own environment to a command that does not inherit it:
/// what ordinary tools need to find programs and behave, and nothing that tends to hold secrets.
const BASE_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR", "TZ",
];

/// The minimal environment: the `BASE_ENV` variables that are set. Read from kavi's own
/// environment once, which kavi never changes: each node's start asked for all ten anew, each
/// ask a scan of the environment under its lock, between one node's end and the next's start.
pub fn base_env() -> Vec<(String, String)> {
    static BASE: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        BASE_ENV
            .iter()
            .filter_map(|key| std::env::var(key).ok().map(|v| ((*key).to_owned(), v)))
            .collect()
    })
    .clone()
}

/// The open files kavi keeps for itself (the ledger and its journal, locks, the runtime,
/// stdio: 22 counted in `/proc/PID/fd` during a run), and what each node running at once adds:
/// its stdin, stdout and stderr pipes, its process descriptor, a spill file for each stream past
/// 64 KiB and a live log for each stream it prints to, 8 in all. With 4 (no spill files, no live
/// logs), 8 nodes printing 100 KB each under a limit of 64 had half of 100 fail with "Too many
/// open files".
const RESERVED_FILES: u64 = 32;
const FILES_PER_NODE: u64 = 8;

/// The open-file limits kavi was started with, where it raised its own: its children get
/// them back, since a program may walk every descriptor up to its limit.
pub(crate) static STARTED_WITH_OPEN_FILES: OnceLock<(u64, u64)> = OnceLock::new();

/// Raises this process's open-file soft limit to its hard limit, as build tools that run many
/// commands at once do (a shell's default soft limit is often 1,024 or less).
pub fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok()
    {
        let _ = STARTED_WITH_OPEN_FILES.set((soft, hard));
    }
}

/// This process's open-file soft limit (unlimited where it cannot be read).
pub fn open_file_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(u64::MAX, |(soft, _)| soft)
}

/// How many nodes may run at once within the open-file limit `limit`, at most `jobs`; an
/// error when not even one may.
pub fn jobs_within_open_files(limit: u64, jobs: usize) -> Result<usize, String> {
    let room = limit.saturating_sub(RESERVED_FILES) / FILES_PER_NODE;
    if room == 0 {
        return Err(format!(
            "the open-file limit is {limit}; kavi needs at least {} to run a node (raise it with \
             `ulimit -n`)",
            RESERVED_FILES + FILES_PER_NODE
        ));
    }
    Ok(jobs.min(usize::try_from(room).unwrap_or(usize::MAX)))
}

/// Whether `name` can name an environment variable: letters, digits and `_`, not starting
/// with a digit. Anything else (empty, `=`, spaces, shell syntax) is refused where it is declared.
pub fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
