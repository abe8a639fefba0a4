//! The governing set of a run: every file whose text decided what the run did. The pipeline
//! and the pipelines it includes, the chains it runs, every policy file read, every template
//! rendered, the scripts its nodes declare (`uses`) or execute (see [`executed_word`]), and the
//! resolved configuration. Data a command names otherwise is an input, never governance. Each member is kept in the ledger by hash; the set has one hash over it, so a
//! change to any member changes the run's governing hash.
//!
//! The set hash is plain enough to recompute with `sqlite3` and `sha256sum`: the SHA-256 of one
//! line `<role> <path> <spec hash>` LF per member, sorted by path (byte order).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::diagnostic::SourceFile;

/// Why a file is in the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Pipeline,
    Chain,
    Policy,
    Template,
    /// A script a node declares in `uses` or executes (see [`executed_word`]).
    Script,
    /// The resolved configuration (`kavi.toml` and its overrides), secrets redacted.
    Config,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::Pipeline,
        Role::Chain,
        Role::Policy,
        Role::Template,
        Role::Script,
        Role::Config,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Pipeline => "pipeline",
            Role::Chain => "chain",
            Role::Policy => "policy",
            Role::Template => "template",
            Role::Script => "script",
            Role::Config => "config",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One member of the set.
#[derive(Debug, Clone)]
pub struct Governing {
    pub role: Role,
    pub source: Arc<SourceFile>,
}

/// The governing files, each path once, in the order they were first read.
#[derive(Debug, Clone, Default)]
pub struct GoverningSet {
    files: Vec<Governing>,
    /// A `build` node is among the nodes (its own or an included pipeline's): the builder
    /// command from the configuration governs the run, and so do the files it names.
    runs_builder: bool,
    /// The members' paths, so adding one is not a scan of the others (foldhash: SipHash of
    /// every path was a third of adding 1,000 named files).
    paths: HashSet<PathBuf, foldhash::fast::RandomState>,
}

impl GoverningSet {
    /// Adds a file; a path already in the set keeps its first role.
    pub fn add(&mut self, role: Role, source: Arc<SourceFile>) {
        if self.paths.insert(source.path.clone()) {
            self.files.push(Governing { role, source });
        }
    }

    pub fn extend(&mut self, other: &GoverningSet) {
        for member in &other.files {
            self.add(member.role, Arc::clone(&member.source));
        }
        self.runs_builder |= other.runs_builder;
    }

    /// Notes that the configured builder runs (see [`GoverningSet::runs_builder`]).
    pub fn mark_builder(&mut self) {
        self.runs_builder = true;
    }

    pub fn runs_builder(&self) -> bool {
        self.runs_builder
    }

    pub fn iter(&self) -> impl Iterator<Item = &Governing> {
        self.files.iter()
    }

    /// Adds what a command's `words` make governing: the workspace file it executes (see
    /// [`executed_word`]) as a script, and the files under `policies/` it names (a gate's
    /// `--config policies/ruff.toml`) as policies. Whatever else it names is its data.
    pub fn add_command(&mut self, named: &mut NamedFiles, words: &[&str]) {
        if let Some(source) = executed_word(words).and_then(|word| named.lookup(word)) {
            self.add(Role::Script, source);
        }
        for word in words {
            if word.starts_with(POLICIES)
                && let Some(source) = named.lookup(word)
            {
                self.add(Role::Policy, source);
            }
        }
    }

    /// The whole set of a run: this one (what the pipeline read when it was loaded), the resolved
    /// configuration the run sees as `config`, and, when a build node runs, the workspace files
    /// the builder command names.
    pub fn resolved(&self, config: &Value, root: &Path) -> GoverningSet {
        let mut governing = self.clone();
        governing.add(Role::Config, config_member(config));
        if self.runs_builder
            && let Some(builder) = config["builder"].as_str()
        {
            let words: Vec<&str> = builder.split_whitespace().collect();
            governing.add_command(&mut NamedFiles::new(root), &words);
        }
        governing
    }

    /// The set as (role, path, spec hash, text), sorted by path.
    pub fn members(&self) -> Vec<(Role, String, String, &str)> {
        let mut members: Vec<_> = self
            .files
            .iter()
            .map(|g| {
                (
                    g.role,
                    g.source.path.display().to_string(),
                    g.source.spec_hash().to_owned(),
                    g.source.text.as_str(),
                )
            })
            .collect();
        members.sort_by(|a, b| a.1.cmp(&b.1));
        members
    }
}

/// The folder of the workspace's policies: a file under it that a command names governs.
const POLICIES: &str = "policies/";

/// Programs whose first argument that is not an option is the script they run.
pub const INTERPRETERS: &[&str] = &["python", "python3", "sh", "bash", "perl", "node", "ruby"];

/// The word of a command that names what it executes: its program, or, when the program is a
/// known interpreter ([`INTERPRETERS`], by file name, so `/usr/bin/python3` is one), its first
/// argument that does not start with `-`. `sh -c 'code'` executes no file: its code is the
/// word, and it names no file of the workspace.
pub fn executed_word<'w>(words: &[&'w str]) -> Option<&'w str> {
    let (program, args) = words.split_first()?;
    let name = program.rsplit('/').next().unwrap_or(program);
    if !INTERPRETERS.contains(&name) {
        return Some(program);
    }
    args.iter().copied().find(|arg| !arg.starts_with('-'))
}

/// The workspace files command words name: a relative path to a regular file inside the root.
/// Options, `NAME=value` assignments, templates and programs found on `PATH` are not files of
/// the workspace and are left out; so is a path that leaves the root. Each word is looked up
/// once: a pipeline whose 10,000 nodes run `true` stats it once, not 10,000 times.
///
/// A word is opened with `openat2(RESOLVE_BENEATH)` below the root: the kernel refuses any
/// resolution that leaves it, in one call where resolving the path in user space took a
/// `readlink` per component. What that call cannot settle (an absolute symlink, a kernel
/// without it) is resolved the slow way, with the same answer.
///
/// Most words a pipeline names are empty files in a few folders (`touch out/1`): each folder is
/// opened below the root once, and such a file is known from one `stat` in it, where opening,
/// checking and closing it took three calls.
#[derive(Debug)]
pub struct NamedFiles {
    root: PathBuf,
    /// Opened on the first word looked up, with the device the root is on.
    root_dir: Option<Option<(std::os::fd::OwnedFd, u64)>>,
    /// The folders words are in (but the root), opened below the root as they come.
    folders: HashMap<String, Folder, foldhash::fast::RandomState>,
    /// Resolved on the first word the kernel could not settle.
    canonical_root: Option<Option<PathBuf>>,
    looked_up: HashMap<String, Option<Arc<SourceFile>>, foldhash::fast::RandomState>,
}

/// A folder of named words, as opening it below the root found it.
#[derive(Debug)]
enum Folder {
    Opened(std::os::fd::OwnedFd),
    /// Not there, or not a folder: nothing in it is a file.
    Absent,
    /// The kernel would not say (see [`Beneath::Unsettled`]).
    Unsettled,
}

/// What a `stat` of a word in its folder tells without opening it.
enum Glance {
    /// No regular file there.
    Absent,
    /// An empty regular file on the root's device that anyone may read: its text is "".
    Empty,
    /// Anything else (a link, a file with bytes, a folder the kernel would not open): opened.
    Unsure,
}

impl NamedFiles {
    pub fn new(root: &Path) -> Self {
        NamedFiles {
            root: root.to_owned(),
            root_dir: None,
            folders: HashMap::default(),
            canonical_root: None,
            looked_up: HashMap::default(),
        }
    }

    /// The file `word` names, read; `None` when it names no workspace file.
    pub fn lookup(&mut self, word: &str) -> Option<Arc<SourceFile>> {
        let word = word.trim_matches(|c| c == '"' || c == '\'');
        if word.is_empty()
            || word.starts_with('-')
            || word.contains('=')
            || Path::new(word).is_absolute()
            || crate::template::is_templated(word)
        {
            return None;
        }
        if let Some(found) = self.looked_up.get(word) {
            return found.clone();
        }
        let found = self.read(word);
        self.looked_up.insert(word.to_owned(), found.clone());
        found
    }

    fn read(&mut self, word: &str) -> Option<Arc<SourceFile>> {
        match self.glance(word) {
            Glance::Absent => return None,
            Glance::Empty => return Some(SourceFile::new(word, String::new())),
            Glance::Unsure => {}
        }
        let text = match self.open_beneath(word) {
            Beneath::Opened(file, root_device) => read_regular(file, Some(root_device))?,
            Beneath::Absent => return None,
            Beneath::Unsettled => self.read_resolved(word)?,
        };
        Some(SourceFile::new(word, text))
    }

    /// The root, opened on the first call, and the device it is on.
    fn root_dir<'a>(
        slot: &'a mut Option<Option<(std::os::fd::OwnedFd, u64)>>,
        root: &Path,
    ) -> Option<&'a (std::os::fd::OwnedFd, u64)> {
        use nix::fcntl::{OFlag, open};
        use nix::sys::stat::Mode;
        slot.get_or_insert_with(|| {
            let dir = open(
                root,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .ok()?;
            let device = nix::sys::stat::fstat(&dir).ok()?.st_dev;
            Some((dir, device))
        })
        .as_ref()
    }

    /// Looks at `word` with one `stat` in its folder, the folder opened below the root (once).
    /// Only what opening the word would answer the same is told: a link, or a file that has
    /// bytes or that not everyone may read, is left to [`NamedFiles::open_beneath`].
    fn glance(&mut self, word: &str) -> Glance {
        use nix::errno::Errno;
        use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat2};
        use nix::sys::stat::{SFlag, fstatat};
        use std::os::fd::AsFd;
        let (folder, name) = word.rsplit_once('/').unwrap_or(("", word));
        if matches!(name, "" | "." | "..") {
            return Glance::Unsure;
        }
        let Some((root_dir, root_device)) = Self::root_dir(&mut self.root_dir, &self.root) else {
            return Glance::Unsure;
        };
        let stat = if folder.is_empty() {
            fstatat(root_dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        } else {
            if !self.folders.contains_key(folder) {
                let how = OpenHow::new()
                    .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                    .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
                let opened = match openat2(root_dir, folder, how) {
                    Ok(fd) => Folder::Opened(fd),
                    Err(Errno::ENOENT | Errno::ENOTDIR) => Folder::Absent,
                    Err(_) => Folder::Unsettled,
                };
                self.folders.insert(folder.to_owned(), opened);
            }
            match &self.folders[folder] {
                Folder::Opened(fd) => fstatat(fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW),
                Folder::Absent => return Glance::Absent,
                Folder::Unsettled => return Glance::Unsure,
            }
        };
        let stat = match stat {
            Ok(stat) => stat,
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Glance::Absent,
            Err(_) => return Glance::Unsure,
        };
        let kind = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits());
        let readable = stat.st_mode & 0o444 == 0o444;
        match kind {
            SFlag::S_IFREG if stat.st_size == 0 && stat.st_dev == *root_device && readable => {
                Glance::Empty
            }
            SFlag::S_IFREG | SFlag::S_IFLNK => Glance::Unsure,
            _ => Glance::Absent,
        }
    }

    fn open_beneath(&mut self, word: &str) -> Beneath {
        use nix::errno::Errno;
        use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
        let Some((root_dir, root_device)) = Self::root_dir(&mut self.root_dir, &self.root) else {
            return Beneath::Unsettled;
        };
        // Non-blocking: opening a FIFO to read would otherwise wait for a writer.
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        match openat2(root_dir, word, how) {
            Ok(fd) => Beneath::Opened(std::fs::File::from(fd), *root_device),
            Err(Errno::ENOENT | Errno::ENOTDIR) => Beneath::Absent,
            // EXDEV: an absolute symlink or a `..` that leaves; ENOSYS: an older kernel.
            Err(_) => Beneath::Unsettled,
        }
    }

    /// The file `word` names, its path resolved in user space and compared with the root's.
    fn read_resolved(&mut self, word: &str) -> Option<String> {
        let named = self.root.join(word);
        named.symlink_metadata().ok()?;
        let path = named.canonicalize().ok()?;
        let root = self
            .canonical_root
            .get_or_insert_with(|| self.root.canonicalize().ok());
        if !path.is_file() || !root.as_ref().is_some_and(|root| path.starts_with(root)) {
            return None;
        }
        // Opened as below the root: a FIFO put in the file's place since is not waited on.
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
            .open(&path)
            .ok()?;
        read_regular(file, None)
    }
}

/// What opening a word below the workspace root found.
enum Beneath {
    /// The file, and the device the workspace root is on.
    Opened(std::fs::File, u64),
    /// Nothing there: the word names no file.
    Absent,
    /// The kernel would not say: resolve it the slow way.
    Unsettled,
}

/// What an opened file is in the set (see [`member_text`]), if it is a regular one.
///
/// An empty file on the root's own device (when it is known) is not read: a read would only
/// find its end, and it stamps the file's access time, a journaled inode write on ext4, for
/// every output a pipeline names (`touch out/1`). Elsewhere (procfs, sysfs), a file sized 0 may
/// still hold text.
fn read_regular(file: std::fs::File, root_device: Option<u64>) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let metadata = file.metadata().ok()?;
    if !metadata.is_file() {
        return None;
    }
    if metadata.len() == 0 && Some(metadata.dev()) == root_device {
        return Some(String::new());
    }
    member_text(file, metadata.len())
}

/// The most of a named file the set keeps as its text (see [`member_text`]).
const KEPT_WHOLE: u64 = 1024 * 1024;

/// What a named file of about `size` bytes is in the set: its text, as scripts and rules files
/// are. A binary file is named by its bytes' SHA-256 instead, and so is a file longer than
/// [`KEPT_WHOLE`], hashed as it is read rather than held: a command may name a data file of
/// any size (`python3 train.py data/big.csv`), and its hash binds its content as its text
/// would, without every `check` holding it or the ledger storing it.
fn member_text(mut file: std::fs::File, size: u64) -> Option<String> {
    use std::io::Read;
    let mut head = Vec::with_capacity(usize::try_from(size.min(KEPT_WHOLE + 1)).unwrap_or(0));
    // Through `Take`, not the `File`: std's `File::read_to_end` asks the kernel for the size
    // again (`statx` and `lseek`), two system calls per named file that `metadata` made moot.
    (&mut file)
        .take(KEPT_WHOLE + 1)
        .read_to_end(&mut head)
        .ok()?;
    if head.len() as u64 > KEPT_WHOLE {
        let mut hasher = Sha256::new();
        let size = std::io::copy(&mut head.as_slice().chain(file), &mut hasher).ok()?;
        return Some(format!(
            "file of {size} bytes, kept by its hash: sha256:{:x}",
            hasher.finalize()
        ));
    }
    Some(
        String::from_utf8(head)
            .unwrap_or_else(|e| format!("binary file, sha256:{:x}", Sha256::digest(e.as_bytes()))),
    )
}

/// The settings of the configuration that say how one machine is set up, not what a run may
/// do: where its ledger, artifacts, object store, sandboxes, log and toolchains are (the
/// sandbox folder comes from `$TMPDIR`; a server ledger's URL is spelt per machine, `localhost`
/// or `127.0.0.1`, with or without a password; an object store's endpoint may be a machine's
/// own way to it). The machines of a team differ in them, so they do not govern: a step or a
/// resume from a machine set up otherwise is not a change of rules.
pub const LOCAL_SETTINGS: [&str; 7] = [
    "ledger",
    "artifacts",
    "sandboxes",
    "executions_log",
    "toolchains",
    "toolchain",
    "object_store",
];

/// The machine's own [`LOCAL_SETTINGS`] of the resolved configuration, with the temporary
/// folder its processes get (`$TMPDIR`), credentials written into a URL taken out: what a run
/// records of how its machine was set up, beside its governing set, not in it.
pub fn local_settings(config: &Value) -> Value {
    let mut local: serde_json::Map<String, Value> = LOCAL_SETTINGS
        .iter()
        // A setting a machine leaves unset (`object_store`) is not listed.
        .filter_map(|name| {
            let value = config.get(*name).filter(|value| !value.is_null())?;
            Some(((*name).to_owned(), value.clone()))
        })
        .collect();
    local.insert(
        "temp".into(),
        Value::from(std::env::temp_dir().display().to_string()),
    );
    let mut local = Value::Object(local);
    scrub(&mut local, None, None);
    local
}

/// The resolved configuration a run sees as `config`, as a member named `kavi.toml`: TOML, with
/// paths inside the workspace made relative to it (so moving a workspace changes nothing),
/// without `jobs` (how many nodes run at once decides nothing a node did: `--jobs 1` is no
/// change of rules for `runs resume`) nor the machine's own [`LOCAL_SETTINGS`], and
/// secrets redacted: the gateway's API key, should its value appear anywhere, and credentials
/// written into a URL.
pub fn config_member(config: &Value) -> Arc<SourceFile> {
    let mut config = config.clone();
    if let Some(map) = config.as_object_mut() {
        map.remove("jobs");
        for local in LOCAL_SETTINGS {
            map.remove(local);
        }
    }
    let root = config
        .as_object_mut()
        .and_then(|map| map.remove("workspace"))
        .and_then(|root| {
            root.as_str()
                .map(|r| format!("{}/", r.trim_end_matches('/')))
        });
    let api_key = config["gateway"]["api_key_env"]
        .as_str()
        .and_then(|name| std::env::var(name).ok());
    let redactor = crate::redact::Redactor::new(&api_key.into_iter().collect::<Vec<_>>());
    scrub(&mut config, root.as_deref(), redactor.as_ref());
    let text = toml::to_string_pretty(&config)
        .unwrap_or_else(|_| serde_json::to_string_pretty(&config).unwrap_or_default());
    SourceFile::new(crate::config::CONFIG_FILE, text)
}

/// Each setting of the resolved configuration (but the workspace's path) as its own text, by
/// name: what [`config_member`] holds of it. A node's key takes the settings its result depends
/// on, so changing another one (`jobs`) leaves it up to date.
pub fn config_settings(config: &Value) -> std::collections::BTreeMap<String, String> {
    let Some(settings) = config.as_object() else {
        return Default::default();
    };
    settings
        .iter()
        .filter(|(name, _)| name.as_str() != "workspace")
        .map(|(name, value)| {
            let alone = serde_json::json!({ "workspace": config["workspace"], name: value });
            (name.clone(), config_member(&alone).text.clone())
        })
        .collect()
}

fn scrub(value: &mut Value, root: Option<&str>, redactor: Option<&crate::redact::Redactor>) {
    match value {
        Value::String(text) => {
            if let Some(relative) = root.and_then(|root| text.strip_prefix(root)) {
                *text = relative.to_owned();
            }
            *text = without_url_credentials(text);
            if let Some(redactor) = redactor {
                *text = redactor.text(text);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| scrub(v, root, redactor)),
        Value::Object(map) => map.values_mut().for_each(|v| scrub(v, root, redactor)),
        _ => {}
    }
}

/// `scheme://user:password@host/...` with the user information redacted.
fn without_url_credentials(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}@{}", crate::redact::REDACTED, &rest[at + 1..]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn the_configuration_member_is_relative_to_the_workspace_and_keeps_no_credentials_nor_jobs() {
        let member = config_member(&serde_json::json!({
            "workspace": "/w/ks",
            "builder": "/w/ks/builders/agent.py --fast",
            "jobs": 4,
            "gateway": {"base_url": "https://me:hunter2@llm.example/v1", "api_key_env": "KAVI_TEST_UNSET_KEY"},
        }));
        assert!(!member.text.contains("jobs"), "{}", member.text);
        assert_eq!(member.path, std::path::Path::new("kavi.toml"));
        assert!(
            member
                .text
                .contains("builder = \"builders/agent.py --fast\""),
            "{}",
            member.text
        );
        assert!(!member.text.contains("hunter2"), "{}", member.text);
        assert!(
            member.text.contains("https://[redacted]@llm.example/v1"),
            "{}",
            member.text
        );
        assert!(!member.text.contains("/w/ks"), "{}", member.text);
    }

    #[test]
    fn a_machines_own_settings_do_not_govern() {
        let here = serde_json::json!({
            "workspace": "/w/ks",
            "ledger": "postgres://kavi:one@127.0.0.1:5432/kavi",
            "artifacts": "/w/ks/.kavi/artifacts",
            "sandboxes": "/tmp/kavi-1000",
            "executions_log": "/w/ks/.kavi/executions.jsonl",
            "toolchains": "/root/.cache/kavi/toolchains",
            "toolchain": {"python": {"path": "/opt/venv"}},
            "skill_timeout": "60s",
        });
        let there = serde_json::json!({
            "workspace": "/home/b/ks",
            "ledger": "postgres://kavi@localhost/kavi?connect_timeout=3",
            "artifacts": "/mnt/team/artifacts",
            "sandboxes": "/var/tmp/kavi-0",
            "executions_log": "/home/b/log.jsonl",
            "toolchains": "/home/b/.cache/kavi/toolchains",
            "toolchain": {},
            "skill_timeout": "60s",
        });
        assert_eq!(config_member(&here).text, config_member(&there).text);
        assert_eq!(config_member(&here).text.trim(), "skill_timeout = \"60s\"");
    }

    #[test]
    fn only_workspace_files_a_command_names_are_added() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("checks")).unwrap();
        std::fs::write(dir.path().join("checks/lint.py"), "print('ok')\n").unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        let escape = format!("../{}", outside.path().display());
        let mut named = NamedFiles::new(dir.path());
        for word in [
            "python3",
            "--strict",
            "X=checks/lint.py",
            "{{ vars.file }}",
            "missing.py",
            escape.as_str(),
            "/etc/hostname",
            "checks",
        ] {
            assert!(named.lookup(word).is_none(), "{word}");
        }
        assert_eq!(
            named.lookup("checks/lint.py").unwrap().text,
            "print('ok')\n"
        );
    }

    /// What a command executes governs it; the data it names does not, but a policy does.
    #[test]
    fn a_command_is_governed_by_what_it_executes_and_the_policies_it_names() {
        let dir = tempfile::tempdir().unwrap();
        for folder in ["scripts", "data", "policies", "out"] {
            std::fs::create_dir(dir.path().join(folder)).unwrap();
        }
        for file in [
            "scripts/x.py",
            "scripts/run.sh",
            "data/in.csv",
            "policies/ruff.toml",
            "out/1",
            "FIXED",
        ] {
            std::fs::write(dir.path().join(file), file).unwrap();
        }
        let governed = |words: &[&str]| {
            let mut set = GoverningSet::default();
            set.add_command(&mut NamedFiles::new(dir.path()), words);
            set.members()
                .into_iter()
                .map(|m| format!("{} {}", m.0, m.1))
                .collect::<Vec<_>>()
        };
        let python = ["python3", "-u", "scripts/x.py", "data/in.csv"];
        assert_eq!(governed(&python), ["script scripts/x.py"]);
        let absolute = ["/usr/bin/python3", "scripts/x.py", "data/in.csv"];
        assert_eq!(governed(&absolute), ["script scripts/x.py"]);
        assert_eq!(
            governed(&["scripts/run.sh", "data/in.csv"]),
            ["script scripts/run.sh"]
        );
        assert_eq!(
            governed(&["bash", "scripts/run.sh"]),
            ["script scripts/run.sh"]
        );
        assert!(governed(&["touch", "out/1"]).is_empty());
        assert!(governed(&["test", "-e", "FIXED"]).is_empty());
        assert!(governed(&["sh", "-c", "cat data/in.csv"]).is_empty());
        assert_eq!(
            governed(&["ruff", "check", "--config", "policies/ruff.toml", "data"]),
            ["policy policies/ruff.toml"]
        );
    }

    /// A command may name a data file of any size: what governs the run is its content, which
    /// its SHA-256 binds as well as its text would, so a large one is neither held in memory
    /// whole nor stored in the ledger as text. One at the limit is still kept whole.
    #[test]
    fn a_large_named_file_is_governed_by_its_hash_not_its_text() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let limit = usize::try_from(KEPT_WHOLE).unwrap();
        let large: Vec<u8> = b"a,b\n".iter().copied().cycle().take(limit + 1).collect();
        std::fs::write(dir.path().join("data/large.csv"), &large).unwrap();
        std::fs::write(dir.path().join("data/kept.csv"), &large[..limit]).unwrap();
        let member = |word: &str| NamedFiles::new(dir.path()).lookup(word).unwrap();

        let expected = format!(
            "file of {} bytes, kept by its hash: sha256:{:x}",
            limit + 1,
            Sha256::digest(&large)
        );
        // Compared by hand: a failure prints the member's length, not a megabyte of it.
        let text = member("data/large.csv").text.clone();
        assert!(text == expected, "a member of {} bytes", text.len());
        assert_eq!(member("data/kept.csv").text.len(), limit);

        // Any byte of it, past the limit too, changes the member and so the set's hash.
        let mut changed = large.clone();
        changed[limit] = b'!';
        std::fs::write(dir.path().join("data/large.csv"), &changed).unwrap();
        let text = member("data/large.csv").text.clone();
        assert!(
            text.starts_with("file of ") && text != expected,
            "a member of {} bytes",
            text.len()
        );
    }

    /// Asserts that `words`, named below `root`, make a set of exactly `expected` (path, text).
    fn assert_named_members(root: &Path, words: &[&str], expected: &[(&str, &str)]) {
        let mut set = GoverningSet::default();
        let mut named = NamedFiles::new(root);
        for word in words {
            if let Some(source) = named.lookup(word) {
                set.add(Role::Script, source);
            }
        }
        let members = set.members();
        let members: Vec<_> = members.iter().map(|m| (m.1.as_str(), m.3)).collect();
        assert_eq!(members, expected);
    }

    #[test]
    fn links_count_where_they_resolve_inside_the_root_and_a_fifo_is_no_file() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("lint.py"), "print('ok')\n").unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        symlink("lint.py", root.join("relative.py")).unwrap();
        // The kernel will not resolve an absolute link below a root: the slow path does.
        symlink(root.join("lint.py"), root.join("absolute.py")).unwrap();
        symlink(outside.path(), root.join("away.py")).unwrap();
        // A relative link that climbs out of the root to a file that is there.
        let climbs = Path::new("../..").join(outside.path().file_name().unwrap());
        symlink(climbs, root.join("sub/up.py")).unwrap();
        assert!(root.join("sub/up.py").is_file());
        nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let ok = "print('ok')\n";
        assert_named_members(
            root,
            &[
                "relative.py",
                "absolute.py",
                "away.py",
                "sub/up.py",
                "sub/../lint.py",
                "fifo",
                "sub",
            ],
            &[
                ("absolute.py", ok),
                ("relative.py", ok),
                ("sub/../lint.py", ok),
            ],
        );
    }

    /// An empty file is known from a `stat` in its folder, opened below the root: a folder or a
    /// last part that leaves the root is still refused, and whatever the `stat` cannot settle
    /// is answered as opening it answers.
    #[test]
    fn empty_files_in_folders_count_only_below_the_root() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("empty"), "").unwrap();
        std::fs::create_dir_all(root.join("out/sub")).unwrap();
        std::fs::write(root.join("out/empty"), "").unwrap();
        std::fs::write(root.join("out/full"), "text").unwrap();
        std::fs::write(root.join("out/private"), "").unwrap();
        std::fs::set_permissions(root.join("out/private"), PermissionsExt::from_mode(0o600))
            .unwrap();
        symlink(outside.path(), root.join("away")).unwrap();
        symlink("../../", root.join("out/sub/up")).unwrap();
        symlink(outside.path().join("empty"), root.join("out/link")).unwrap();
        symlink("empty", root.join("out/relative")).unwrap();
        assert_named_members(
            root,
            &[
                "out/empty",
                "out/full",
                "out/private",
                "out/relative",
                "out/./empty",
                "out/sub",
                "out/missing",
                "missing/empty",
                "out/empty/x",
                "away/empty",
                "out/link",
                "out/sub/up/away/empty",
            ],
            // `out/./empty` is the same path as `out/empty`: one member.
            &[
                ("out/empty", ""),
                ("out/full", "text"),
                ("out/private", ""),
                ("out/relative", ""),
            ],
        );
    }

    #[test]
    fn every_set_a_word_is_looked_up_for_gets_its_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("lint.py"), "print('ok')\n").unwrap();
        let mut named = NamedFiles::new(dir.path());
        let (mut first, mut second) = (GoverningSet::default(), GoverningSet::default());
        first.add_command(&mut named, &["python3", "lint.py"]);
        second.add_command(&mut named, &["python3", "lint.py"]);
        for set in [first, second] {
            let paths: Vec<_> = set.members().into_iter().map(|m| m.1).collect();
            assert_eq!(paths, ["lint.py"]);
        }
    }

    #[test]
    fn an_empty_file_is_named_without_being_read() {
        use std::fs::{File, FileTimes};
        use std::time::{Duration, SystemTime};
        let dir = tempfile::tempdir().unwrap();
        // Read last long before it was changed: a read stamps it, even under relatime.
        let stale = FileTimes::new()
            .set_accessed(SystemTime::UNIX_EPOCH + Duration::from_secs(1))
            .set_modified(SystemTime::now());
        let accessed = |name: &str| std::fs::metadata(dir.path().join(name)).unwrap().accessed();
        for name in ["read", "named"] {
            File::create(dir.path().join(name))
                .unwrap()
                .set_times(stale)
                .unwrap();
        }
        let before = accessed("read").unwrap();
        std::fs::read(dir.path().join("read")).unwrap();
        if accessed("read").unwrap() == before {
            let missing = format!("{} is mounted without access times", dir.path().display());
            // CI's temporary folder keeps access times (relatime): there, this test must run.
            assert!(std::env::var_os("CI").is_none(), "CI must: {missing}");
            eprintln!("skipping: {missing}");
            return;
        }
        let before = accessed("named").unwrap();
        let named = NamedFiles::new(dir.path()).lookup("named").unwrap();
        assert_eq!(named.text, "");
        assert_eq!(
            accessed("named").unwrap(),
            before,
            "the empty file was read"
        );
    }
}
