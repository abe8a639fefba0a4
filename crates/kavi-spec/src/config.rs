//! Workspace configuration, layered with figment:
//! built-in defaults < `kavi.toml` < `KAVI_*` environment < command-line flags.
//!
//! The workspace root is the folder holding `kavi.toml` (searched upwards from the current
//! folder, as cargo finds `Cargo.toml`), or the current folder when there is none. Relative
//! paths in the configuration are resolved against the root.

use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::diagnostic::{Diagnostic, Diagnostics, SourceFile};

pub const CONFIG_FILE: &str = "kavi.toml";

// `default` so that kavi.toml alone can be checked against this type, with toml's spans.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The SQLite ledger file.
    pub ledger: PathBuf,
    /// The content-addressed artifact store.
    pub artifacts: PathBuf,
    /// The folder in which `sandbox` nodes make their copies, apart from the workspace. Empty:
    /// `$XDG_CACHE_HOME/kavi/sandboxes` (or `~/.cache/kavi/sandboxes`).
    pub sandboxes: PathBuf,
    /// How many nodes may run at once.
    pub jobs: usize,
    /// The command a `build` node runs in the sandbox (through `sh -c`), with the build packet
    /// on stdin: the external coding agent.
    pub builder: String,
    /// The LLM gateway an `advise` node asks for a revised packet.
    pub gateway: GatewayConfig,
    /// The append-only JSONL log of skill executions (the ledger holds them too).
    pub executions_log: PathBuf,
    /// How long one run of a skill may take, such as `60s`.
    pub skill_timeout: String,
    /// The largest spec file (pipeline, chain, policy, proposal, kavi.toml) kavi reads, in KiB.
    pub max_spec_kib: u64,
    /// How long a run's or a claimed node attempt's lease holds without being renewed (kavi
    /// renews it every third of it), such as `30s`: how long after its machine dies another
    /// machine may recover the run or take the attempt over.
    pub lease: String,
    /// The fewest characters a declared secret's value may have (at least 2): a shorter one is
    /// refused before what declares it starts, since redacting it would hide ordinary text.
    pub min_secret_chars: usize,
    /// Where kavi provisions the toolchains gates run (`policies/toolchains.toml`), one folder
    /// per declaration. Empty: `$XDG_CACHE_HOME/kavi/toolchains` (or `~/.cache/kavi/toolchains`).
    pub toolchains: PathBuf,
    /// Existing environments to use instead of provisioning, by toolchain name: for a machine
    /// with no package registry. Their versions must still be the pinned ones.
    pub toolchain: std::collections::BTreeMap<String, ExistingToolchain>,
    /// An S3-compatible object store that keeps every file artifact's content for every
    /// machine (docs/distributed.md). None: a server ledger keeps it; a SQLite ledger's machine
    /// has the files.
    pub object_store: Option<ObjectStoreConfig>,
}

/// `[object_store]` in kavi.toml: where, never with what credentials (those come from the
/// environment, as the AWS tools read them).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectStoreConfig {
    /// The bucket the objects go in.
    pub bucket: String,
    /// The URL of an S3-compatible server, such as `https://minio.example:9000`; empty: AWS's.
    #[serde(default)]
    pub endpoint: String,
    /// The bucket's region; empty: `AWS_REGION` or `AWS_DEFAULT_REGION`, else `us-east-1`.
    #[serde(default)]
    pub region: String,
    /// The folder of the bucket kavi's objects go in, such as `team/kavi`; empty: its root.
    #[serde(default)]
    pub prefix: String,
    /// How long one request may take, such as `60s`.
    #[serde(default = "default_object_timeout")]
    pub timeout: String,
}

fn default_object_timeout() -> String {
    "60s".to_owned()
}

/// The keys of `[object_store]`: anything else there (an access key, a secret) is refused
/// without being shown.
const OBJECT_STORE_KEYS: [&str; 5] = ["bucket", "endpoint", "region", "prefix", "timeout"];

impl ObjectStoreConfig {
    /// What is wrong with these settings, naming the key.
    fn check(&self) -> Result<(), (&'static str, String)> {
        if self.bucket.is_empty() {
            return Err(("bucket", "`object_store.bucket` must name a bucket".into()));
        }
        if !self.endpoint.is_empty() {
            let authority = self
                .endpoint
                .strip_prefix("https://")
                .or_else(|| self.endpoint.strip_prefix("http://"))
                .ok_or((
                    "endpoint",
                    "`object_store.endpoint` must be an http:// or https:// URL".to_owned(),
                ))?;
            // Shown nowhere: what is there may be a credential.
            if authority.contains(['@', '?', '#']) {
                return Err((
                    "endpoint",
                    "`object_store.endpoint` may hold no user, password or query: credentials \
                     come only from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, \
                     AWS_SESSION_TOKEN)"
                        .to_owned(),
                ));
            }
        }
        self.timeout()
            .map(|_| ())
            .map_err(|message| ("timeout", message))
    }

    fn timeout(&self) -> Result<std::time::Duration, String> {
        let timeout = humantime::parse_duration(&self.timeout)
            .map_err(|e| format!("`object_store.timeout` = {:?}: {e}", self.timeout))?;
        if timeout < std::time::Duration::from_secs(1) {
            return Err(format!(
                "`object_store.timeout` = {:?}: must be at least 1s",
                self.timeout
            ));
        }
        Ok(timeout)
    }
}

/// `[toolchain.NAME]` in kavi.toml.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExistingToolchain {
    /// A virtual environment holding the toolchain's pinned packages.
    pub path: PathBuf,
}

impl Config {
    /// The object store artifacts go to, when one is configured (checked when the
    /// configuration is loaded).
    pub fn object_settings(&self) -> Option<crate::ledger::ObjectSettings> {
        let store = self.object_store.as_ref()?;
        let set = |text: &str| Some(text.to_owned()).filter(|text| !text.is_empty());
        Some(crate::ledger::ObjectSettings {
            bucket: store.bucket.clone(),
            endpoint: set(&store.endpoint),
            region: set(&store.region),
            prefix: store.prefix.trim_matches('/').to_owned(),
            timeout: store
                .timeout()
                .unwrap_or(std::time::Duration::from_secs(60)),
        })
    }

    /// How long one run of a skill may take, checked when the configuration is loaded.
    pub fn skill_timeout(&self) -> Result<std::time::Duration, String> {
        humantime::parse_duration(&self.skill_timeout)
            .map_err(|e| format!("`skill_timeout` = {:?}: {e}", self.skill_timeout))
    }

    /// The lease kavi takes, checked when the configuration is loaded: at least a second, as
    /// it is renewed every third of it.
    pub fn lease(&self) -> Result<std::time::Duration, String> {
        let lease = humantime::parse_duration(&self.lease)
            .map_err(|e| format!("`lease` = {:?}: {e}", self.lease))?;
        if lease < std::time::Duration::from_secs(1) {
            return Err(format!(
                "`lease` = {:?}: must be at least 1s, as it is renewed every third of it",
                self.lease
            ));
        }
        Ok(lease)
    }
}

/// An OpenAI-compatible chat-completions endpoint. With no `base_url`, there is no advisory and
/// the forge's `advise` node is skipped.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// The API base, such as `https://llm.example/v1`; `/chat/completions` is appended.
    pub base_url: String,
    pub model: String,
    /// How long one request may take, such as `30s`.
    pub timeout: String,
    /// The prompt is cut to this many characters before it is sent.
    pub max_prompt_chars: usize,
    /// The environment variable holding the API key, sent as a bearer token. The key itself is
    /// never written to the ledger, the artifacts or the logs.
    pub api_key_env: String,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            base_url: String::new(),
            model: "gpt-4o-mini".to_owned(),
            timeout: "30s".to_owned(),
            max_prompt_chars: 16_000,
            api_key_env: "KAVI_GATEWAY_API_KEY".to_owned(),
        }
    }
}

impl GatewayConfig {
    /// The request timeout, checked when the configuration is loaded.
    pub fn timeout(&self) -> Result<std::time::Duration, String> {
        humantime::parse_duration(&self.timeout)
            .map_err(|e| format!("`gateway.timeout` = {:?}: {e}", self.timeout))
    }
}

/// The headless coding-CLI invocation: edit tools only, no shell, the packet on stdin.
pub const DEFAULT_BUILDER: &str =
    "claude -p --output-format text --allowedTools Edit Write Glob Grep Read";

impl Default for Config {
    fn default() -> Self {
        Self {
            ledger: PathBuf::from(".kavi/ledger.db"),
            artifacts: PathBuf::from(".kavi/artifacts"),
            sandboxes: PathBuf::new(),
            jobs: cores(),
            builder: DEFAULT_BUILDER.to_owned(),
            gateway: GatewayConfig::default(),
            executions_log: PathBuf::from(".kavi/executions.jsonl"),
            skill_timeout: "60s".to_owned(),
            max_spec_kib: crate::diagnostic::DEFAULT_MAX_SPEC_KIB,
            lease: humantime::format_duration(crate::ledger::DEFAULT_LEASE).to_string(),
            min_secret_chars: crate::redact::DEFAULT_MIN_SECRET_CHARS,
            toolchains: PathBuf::new(),
            toolchain: std::collections::BTreeMap::new(),
            object_store: None,
        }
    }
}

/// How many processors kavi may use: the default number of jobs, and how many parts a large
/// pipeline is read and loaded in. Asked once per process: std reads the cgroup's CPU quota
/// each time (four files), and a run asked it in three places.
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// Where toolchains are provisioned unless configured: this user's cache folder, shared by
/// every workspace, so one environment serves them all.
fn default_toolchains() -> PathBuf {
    kavi_foundation::sandbox::cache_home().join("toolchains")
}

/// Where sandboxes go unless configured: a folder of this user's own (see
/// [`kavi_foundation::sandbox::cache_home`]), apart from any workspace kept elsewhere.
fn default_sandboxes() -> PathBuf {
    kavi_foundation::sandbox::cache_home().join("sandboxes")
}

/// Values given on the command line; only those given override the layers below.
#[derive(Debug, Default, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Values in kavi.toml, `KAVI_*` variables or flags that cannot be used, every one found;
    /// each located in kavi.toml when it comes from there.
    #[error("{0}")]
    Invalid(Diagnostics),
    #[error("failed to read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to read the current directory: {0}")]
    CurrentDir(std::io::Error),
    #[error("workspace {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
}

impl ConfigError {
    fn invalid(diagnostic: Diagnostic) -> Self {
        Self::all_invalid(vec![diagnostic])
    }

    /// Every one of `problems`, each said to be of the configuration.
    fn all_invalid(problems: Vec<Diagnostic>) -> Self {
        ConfigError::Invalid(Diagnostics(
            problems
                .into_iter()
                .map(|mut problem| {
                    problem.message = format!("invalid configuration: {}", problem.message);
                    problem
                })
                .collect(),
        ))
    }
}

/// What is wrong with the values of `config` that no type says (a zero, a duration that does
/// not parse, an object store without a bucket), every one, each with the key that holds it.
fn value_problems(config: &Config) -> Vec<(Vec<&'static str>, String)> {
    let mut problems = Vec::new();
    if config.jobs == 0 {
        problems.push((vec!["jobs"], "`jobs` must be at least 1".to_owned()));
    }
    if let Err(message) = config.gateway.timeout() {
        problems.push((vec!["gateway", "timeout"], message));
    }
    if let Err(message) = config.skill_timeout() {
        problems.push((vec!["skill_timeout"], message));
    }
    if let Err(message) = config.lease() {
        problems.push((vec!["lease"], message));
    }
    if config.max_spec_kib == 0 {
        problems.push((
            vec!["max_spec_kib"],
            "`max_spec_kib` must be at least 1".to_owned(),
        ));
    }
    if config.min_secret_chars < crate::redact::LEAST_MIN_SECRET_CHARS {
        problems.push((
            vec!["min_secret_chars"],
            format!(
                "`min_secret_chars` must be at least {}: a single character is no secret",
                crate::redact::LEAST_MIN_SECRET_CHARS
            ),
        ));
    }
    if let Some(Err((key, message))) = config.object_store.as_ref().map(|store| store.check()) {
        problems.push((vec!["object_store", key], message));
    }
    problems
}

/// A problem of the value at `key`, located in kavi.toml's `file` where the key is written.
fn at_key(file: &Arc<SourceFile>, key: &[&str], message: String) -> Diagnostic {
    let diagnostic = Diagnostic::new(message);
    match value_span(&file.text, key) {
        Some(span) => diagnostic.at(file, span),
        None => diagnostic,
    }
}

/// What is wrong with a `KAVI_*` variable (kavi.toml was checked before, and flags by clap),
/// naming the variable as the user set it.
fn from_environment(error: &figment::Error) -> String {
    let from_env = error
        .metadata
        .as_ref()
        .is_some_and(|metadata| metadata.name.contains("environment"));
    if !from_env || error.path.is_empty() {
        return error.to_string();
    }
    let variable = variable_name(&error.path);
    let value = std::env::var(&variable).unwrap_or_default();
    format!("{variable}={value:?}: {}", error.kind)
}

/// The `KAVI_*` variable that sets a key: `gateway.timeout` is `KAVI_GATEWAY_TIMEOUT`.
fn variable_name(key: &[impl AsRef<str>]) -> String {
    let parts: Vec<&str> = key.iter().map(AsRef::as_ref).collect();
    format!("KAVI_{}", parts.join("_").to_ascii_uppercase())
}

/// Where kavi.toml's `[object_store]` holds what may be a credential: a key it does not know
/// (an access key, a secret), or an endpoint with a user, password or query. Said as
/// `LINE:COLUMN: why`, never showing the value: the line may hold the secret.
fn object_store_secret(text: &str, source: &SourceFile) -> Option<String> {
    let root = toml::de::DeTable::parse(text).ok()?;
    let toml::de::DeValue::Table(store) = root.get_ref().get("object_store")?.get_ref() else {
        return None;
    };
    let (key, span) = store.iter().find_map(|(key, value)| {
        let endpoint_with_secrets = key.get_ref() == "endpoint"
            && value.get_ref().as_str().is_some_and(|endpoint| {
                endpoint
                    .split_once("://")
                    .is_some_and(|(_, rest)| rest.contains(['@', '?', '#']))
            });
        let unknown = !OBJECT_STORE_KEYS.contains(&key.get_ref().as_ref());
        (unknown || endpoint_with_secrets).then(|| (key.get_ref().to_string(), key.span()))
    })?;
    let (line, column) = source.line_col(span.start);
    Some(format!(
        "{line}:{column}: `object_store.{key}` is refused, and not shown: kavi.toml is a file \
         of the workspace every builder, gate and skill reads, so it names where the object \
         store is (bucket, endpoint without a user or query, region, prefix, timeout), and \
         credentials come only from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, \
         AWS_SESSION_TOKEN)"
    ))
}

/// The span of the value at `key` (a dotted path) in TOML text.
fn value_span(text: &str, key: &[&str]) -> Option<std::ops::Range<usize>> {
    let root = toml::de::DeTable::parse(text).ok()?;
    let mut table = root.get_ref();
    let (last, parents) = key.split_last()?;
    for part in parents {
        match table.get(*part)?.get_ref() {
            toml::de::DeValue::Table(inner) => table = inner,
            _ => return None,
        }
    }
    Some(table.get(*last)?.span())
}

/// Where toolchains live on this machine: the cache folder kavi provisions into, and the
/// environments `kavi.toml` names instead (`[toolchain.NAME] path`). Plain data, so that the
/// node interface can carry it; what a toolchain's folder is, is `crate::toolchains`'.
#[derive(Debug, Clone, Default)]
pub struct ToolchainHome {
    pub cache: PathBuf,
    pub existing: std::collections::BTreeMap<String, PathBuf>,
}

impl ToolchainHome {
    /// Where `workspace`'s toolchains are, or are made.
    pub fn of(workspace: &Workspace) -> Self {
        Self {
            cache: workspace.config.toolchains.clone(),
            existing: workspace
                .config
                .toolchain
                .iter()
                .map(|(name, existing)| (name.clone(), existing.path.clone()))
                .collect(),
        }
    }
}

/// A resolved workspace: its root and its configuration with absolute paths.
#[derive(Debug, Clone)]
pub struct Workspace {
    pub root: PathBuf,
    pub config: Config,
    pub config_file: Option<PathBuf>,
}

/// The workspace `dir` is in: the nearest folder upwards, `dir` included, holding kavi.toml.
pub fn enclosing_workspace(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|dir| dir.join(CONFIG_FILE).is_file())
        .map(Path::to_owned)
}

impl Workspace {
    /// Finds the workspace from `explicit_root` or the current folder, then layers configuration.
    pub fn load(explicit_root: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let cwd = std::env::current_dir().map_err(ConfigError::CurrentDir)?;
        let root = match explicit_root {
            Some(root) => {
                let root = cwd.join(root);
                if !root.is_dir() {
                    return Err(ConfigError::NotADirectory(root));
                }
                root
            }
            None => enclosing_workspace(&cwd).unwrap_or(cwd),
        };
        let config_file = Some(root.join(CONFIG_FILE)).filter(|p| p.is_file());
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        let file_text = match &config_file {
            Some(file) => {
                let text =
                    crate::diagnostic::read_spec(file).map_err(|source| ConfigError::Read {
                        path: file.clone(),
                        source,
                    })?;
                let source = SourceFile::new(file, text.clone());
                // The keys are the root of trust a workspace's own files must not redirect.
                if let Some(span) = value_span(&text, &["signing_key"]) {
                    return Err(ConfigError::invalid(
                        Diagnostic::new(
                            "`signing_key` is no longer read from kavi.toml: whoever can edit the \
                             workspace could point kavi at a key of their own. Remove it; kavi's \
                             keys live in $KAVI_KEYS, else ~/.config/kavi (see docs/ledger.md)",
                        )
                        .at(&source, span),
                    ));
                }
                // kavi.toml is a workspace file, which builders, gates and skills read: a
                // server's password in it would be theirs too.
                let ledger = toml::from_str::<toml::Table>(&text)
                    .ok()
                    .and_then(|table| table.get("ledger")?.as_str().map(str::to_owned));
                if let (Some(url), Some(span)) = (ledger, value_span(&text, &["ledger"]))
                    && crate::ledger::postgres_url(Path::new(&url)).is_some()
                    && crate::ledger::display_location(Path::new(&url)) != url
                {
                    // Named by line and column, not shown: the line holds the password.
                    let (line, column) = source.line_col(span.start);
                    return Err(ConfigError::invalid(Diagnostic::new(format!(
                        "{}:{line}:{column}: a password in kavi.toml's `ledger` URL would be \
                         readable by every builder, gate and skill kavi runs here (kavi.toml is \
                         a file of the workspace they see): leave it out of the URL and set \
                         PGPASSWORD, or give the whole URL in KAVI_LEDGER",
                        file.display()
                    ))));
                }
                if let Some(refused) = object_store_secret(&text, &source) {
                    return Err(ConfigError::invalid(Diagnostic::new(format!(
                        "{}:{refused}",
                        file.display()
                    ))));
                }
                // toml knows where each value is; figment does not, so the file is checked here,
                // with every problem it has: those of its shape, and those of the values that
                // read.
                let root = toml::de::DeTable::parse(&text).map_err(|e| {
                    ConfigError::invalid(crate::diagnostic::toml_error(&source, &e))
                })?;
                let span = root.span();
                let (read, mut problems) =
                    crate::diagnostic::read_table::<Config>(&source, span, root.into_inner());
                if !problems.is_empty() {
                    let values = read.as_ref().map(value_problems).unwrap_or_default();
                    problems.extend(
                        values
                            .into_iter()
                            .map(|(key, message)| at_key(&source, &key, message)),
                    );
                    return Err(ConfigError::all_invalid(problems));
                }
                figment = figment.merge(Toml::string(&text));
                Some(source)
            }
            None => None,
        };
        if let Some(refused) = crate::ledger::keys::refuse_inside(&root) {
            return Err(ConfigError::invalid(Diagnostic::new(refused)));
        }
        let figment = figment
            .merge(Env::prefixed("KAVI_").only(&[
                "ledger",
                "artifacts",
                "sandboxes",
                "jobs",
                "builder",
                "executions_log",
                "skill_timeout",
                "max_spec_kib",
                "min_secret_chars",
                "toolchains",
                "lease",
            ]))
            // KAVI_GATEWAY_BASE_URL and friends; the API key's variable is read only when used.
            .merge(
                Env::prefixed("KAVI_GATEWAY_")
                    .only(&["base_url", "model", "timeout", "max_prompt_chars"])
                    .map(|key| format!("gateway.{key}").into()),
            )
            .merge(
                Env::prefixed("KAVI_OBJECT_STORE_")
                    .only(&OBJECT_STORE_KEYS)
                    .map(|key| format!("object_store.{key}").into()),
            )
            .merge(Serialized::defaults(overrides));
        // Points at the layer that set a value: its place in kavi.toml, or its variable.
        let located = |key: &[&str], message: String| {
            let source = figment
                .find_metadata(&key.join("."))
                .map_or("", |metadata| metadata.name.as_ref());
            if source.contains("environment") {
                return Diagnostic::new(format!("{} ({message})", variable_name(key)));
            }
            match (&file_text, source.contains("TOML")) {
                (Some(file), true) => at_key(file, key, message),
                _ => Diagnostic::new(message),
            }
        };
        let mut config: Config = figment
            .extract()
            .map_err(|e| ConfigError::invalid(Diagnostic::new(from_environment(&e))))?;
        let problems: Vec<Diagnostic> = value_problems(&config)
            .into_iter()
            .map(|(key, message)| located(&key, message))
            .collect();
        if !problems.is_empty() {
            return Err(ConfigError::all_invalid(problems));
        }
        if let Ok(lease) = config.lease() {
            crate::ledger::set_lease(lease);
        }
        crate::diagnostic::set_max_spec_kib(config.max_spec_kib);
        crate::redact::set_min_secret_chars(config.min_secret_chars);
        // A server's URL is no path in the workspace.
        if crate::ledger::postgres_url(&config.ledger).is_none() {
            config.ledger = root.join(&config.ledger);
        }
        config.artifacts = root.join(&config.artifacts);
        config.sandboxes = if config.sandboxes.as_os_str().is_empty() {
            default_sandboxes()
        } else {
            root.join(&config.sandboxes)
        };
        config.executions_log = root.join(&config.executions_log);
        config.toolchains = if config.toolchains.as_os_str().is_empty() {
            default_toolchains()
        } else {
            root.join(&config.toolchains)
        };
        for existing in config.toolchain.values_mut() {
            existing.path = root.join(&existing.path);
        }
        Ok(Self {
            root,
            config,
            config_file,
        })
    }

    pub fn templates_dir(&self) -> PathBuf {
        self.root.join("templates")
    }

    /// kavi's own files (the ledger, its journal files and locks, the artifact store, the
    /// executions log): never a node's inputs, never copied into a sandbox, and hidden from
    /// every process kavi confines, wherever the configuration puts them.
    pub fn state_paths(&self) -> Vec<PathBuf> {
        let config = &self.config;
        vec![
            config.ledger.clone(),
            PathBuf::from(format!("{}-wal", config.ledger.display())),
            PathBuf::from(format!("{}-shm", config.ledger.display())),
            crate::ledger::locks_dir(&config.ledger),
            config.artifacts.clone(),
            config.executions_log.clone(),
        ]
    }

    /// The configuration as runs see it: `config` in templates, and the `config` member of
    /// every run's governing set. Its keys are [`RUN_CONFIG_KEYS`](crate::template::RUN_CONFIG_KEYS).
    pub fn run_config(&self) -> serde_json::Value {
        serde_json::json!({
            "workspace": self.root,
            "ledger": self.config.ledger,
            "artifacts": self.config.artifacts,
            "sandboxes": self.config.sandboxes,
            "builder": self.config.builder,
            "gateway": self.config.gateway,
            "executions_log": self.config.executions_log,
            "skill_timeout": self.config.skill_timeout,
            "jobs": self.config.jobs,
            "toolchains": self.config.toolchains,
            "toolchain": self.config.toolchain,
            "object_store": self.config.object_store,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    #[expect(
        clippy::result_large_err,
        reason = "figment::Jail fixes the closure's error type"
    )]
    fn layers_apply_in_order_defaults_file_env_flags() {
        Jail::expect_with(|jail| {
            jail.create_file("kavi.toml", "jobs = 3\nledger = \"db/from-file.db\"\n")?;
            let ws = Workspace::load(None, &Overrides::default()).unwrap();
            assert_eq!(ws.config.jobs, 3);
            assert!(ws.config.ledger.ends_with("db/from-file.db"));
            assert!(ws.config.artifacts.ends_with(".kavi/artifacts"));

            jail.set_env("KAVI_JOBS", "5");
            assert_eq!(
                Workspace::load(None, &Overrides::default())
                    .unwrap()
                    .config
                    .jobs,
                5
            );

            let flags = Overrides {
                jobs: Some(7),
                ledger: None,
            };
            assert_eq!(Workspace::load(None, &flags).unwrap().config.jobs, 7);

            jail.create_file(
                "kavi.toml",
                "[gateway]\nbase_url = \"http://file\"\nmodel = \"m\"\n",
            )?;
            jail.set_env("KAVI_GATEWAY_BASE_URL", "http://127.0.0.1:9");
            let gateway = Workspace::load(None, &Overrides::default())
                .unwrap()
                .config
                .gateway;
            assert_eq!(gateway.base_url, "http://127.0.0.1:9");
            assert_eq!(gateway.model, "m");
            assert_eq!(gateway.max_prompt_chars, 16_000);
            Ok(())
        });
    }

    /// `check` knows the keys of `config` in templates from [`RUN_CONFIG_KEYS`].
    #[test]
    #[expect(
        clippy::result_large_err,
        reason = "figment::Jail fixes the closure's error type"
    )]
    fn run_config_has_exactly_the_keys_check_knows() {
        Jail::expect_with(|_| {
            let ws = Workspace::load(None, &Overrides::default()).unwrap();
            let keys: Vec<String> = ws
                .run_config()
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            assert_eq!(keys, crate::template::RUN_CONFIG_KEYS);
            Ok(())
        });
    }

    #[test]
    #[expect(
        clippy::result_large_err,
        reason = "figment::Jail fixes the closure's error type"
    )]
    fn unknown_keys_in_kavi_toml_are_refused() {
        Jail::expect_with(|jail| {
            jail.create_file("kavi.toml", "jobz = 3\n")?;
            let err = Workspace::load(None, &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains("jobz"), "{err}");
            Ok(())
        });
    }

    /// Every problem of kavi.toml is reported at once, each at its place: those of its shape
    /// (keys, types, in a nested table too), and those of the values that do read.
    #[test]
    #[expect(
        clippy::result_large_err,
        reason = "figment::Jail fixes the closure's error type"
    )]
    fn every_problem_of_kavi_toml_is_reported_in_one_pass() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "kavi.toml",
                "jobz = 3\nskill_timeout = 30\nlease = \"soon\"\n[gateway]\ntimout = \"1s\"\n",
            )?;
            let Err(ConfigError::Invalid(problems)) = Workspace::load(None, &Overrides::default())
            else {
                panic!("kavi.toml was taken");
            };
            let found: Vec<_> = problems
                .0
                .iter()
                .map(|p| {
                    let (file, span) = p.location.as_ref().expect("located in kavi.toml");
                    let (line, column) = file.line_col(span.start);
                    (line, column, p.help.clone())
                })
                .collect();
            assert_eq!(
                found,
                [
                    (1, 1, Some("did you mean `jobs`?".to_owned())),
                    (2, 17, None),
                    (5, 1, Some("did you mean `timeout`?".to_owned())),
                    (3, 9, None),
                ],
                "{problems}"
            );
            assert!(problems.0[3].message.contains("`lease` = \"soon\""));
            assert!(
                problems
                    .0
                    .iter()
                    .all(|p| p.message.starts_with("invalid configuration: ")),
                "{problems}"
            );
            // Values that only the layers together give are checked together too.
            jail.create_file("kavi.toml", "jobs = 0\nlease = \"0s\"\n")?;
            let Err(ConfigError::Invalid(problems)) = Workspace::load(None, &Overrides::default())
            else {
                panic!("kavi.toml was taken");
            };
            assert_eq!(problems.0.len(), 2, "{problems}");
            Ok(())
        });
    }

    /// A server's password is refused in kavi.toml, which confined processes read, at its place;
    /// the same URL without it, or in the environment, is taken.
    #[test]
    #[expect(
        clippy::result_large_err,
        reason = "figment::Jail fixes the closure's error type"
    )]
    fn a_ledger_password_in_kavi_toml_is_refused_where_it_is() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "kavi.toml",
                "jobs = 2
ledger = \"postgres://kavi:hunter2@db.example/kavi\"\n",
            )?;
            let err = Workspace::load(None, &Overrides::default()).unwrap_err();
            let said = err.to_string();
            assert!(said.contains("kavi.toml:2:10"), "{said}");
            assert!(said.contains("set PGPASSWORD"), "{said}");
            assert!(!said.contains("hunter2"), "{said}");
            jail.create_file(
                "kavi.toml",
                "ledger = \"postgres://kavi@db.example/kavi\"\n",
            )?;
            assert!(Workspace::load(None, &Overrides::default()).is_ok());
            jail.create_file("kavi.toml", "")?;
            jail.set_env("KAVI_LEDGER", "postgres://kavi:hunter2@db.example/kavi");
            assert!(Workspace::load(None, &Overrides::default()).is_ok());
            Ok(())
        });
    }

    #[test]
    #[expect(
        clippy::result_large_err,
        reason = "figment::Jail fixes the closure's error type"
    )]
    fn a_bad_value_is_named_where_it_was_set() {
        Jail::expect_with(|jail| {
            jail.create_file("kavi.toml", "# comment\njobs = \"four\"\n")?;
            let err = Workspace::load(None, &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains("kavi.toml:2:8"), "{err}");

            jail.create_file("kavi.toml", "[gateway]\ntimeout = \"soon\"\n")?;
            let err = Workspace::load(None, &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains("kavi.toml:2:11"), "{err}");

            jail.create_file("kavi.toml", "")?;
            jail.set_env("KAVI_JOBS", "abc");
            let err = Workspace::load(None, &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains("KAVI_JOBS=\"abc\""), "{err}");

            jail.set_env("KAVI_JOBS", "0");
            let err = Workspace::load(None, &Overrides::default()).unwrap_err();
            assert!(
                err.to_string().contains("KAVI_JOBS (`jobs` must be"),
                "{err}"
            );

            jail.set_env("KAVI_JOBS", "1");
            jail.create_file("kavi.toml", "lease = \"300ms\"\n")?;
            let err = Workspace::load(None, &Overrides::default()).unwrap_err();
            assert!(
                err.to_string().contains("kavi.toml:1:9")
                    && err.to_string().contains("must be at least 1s"),
                "{err}"
            );
            Ok(())
        });
    }

    /// `[object_store]` says where the store is; a credential is refused wherever it is put
    /// (a key of its own, an endpoint's user or query, inline or in the environment), at its
    /// place, never shown.
    #[test]
    #[expect(
        clippy::result_large_err,
        reason = "figment::Jail fixes the closure's error type"
    )]
    fn an_object_store_is_named_in_kavi_toml_and_its_credentials_never_are() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "kavi.toml",
                "[object_store]\nbucket = \"b\"\nendpoint = \"http://127.0.0.1:9000\"\nprefix = \"/t/k/\"\n",
            )?;
            let config = Workspace::load(None, &Overrides::default()).unwrap().config;
            let settings = config.object_settings().unwrap();
            assert_eq!(settings.bucket, "b");
            assert_eq!(settings.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
            assert_eq!((settings.region, settings.prefix.as_str()), (None, "t/k"));
            assert_eq!(settings.timeout, std::time::Duration::from_secs(60));
            for (text, at) in [
                (
                    "[object_store]\nbucket = \"b\"\nsecret_access_key = \"hunter2secret\"\n",
                    "kavi.toml:3:1",
                ),
                (
                    "jobs = 1\n[object_store]\nendpoint = \"https://AKIA:hunter2secret@s3.example\"\nbucket = \"b\"\n",
                    "kavi.toml:3:1",
                ),
                (
                    "object_store = { bucket = \"b\", token = \"hunter2secret\" }\n",
                    "kavi.toml:1:32",
                ),
                (
                    "[object_store]\nbucket = \"b\"\nendpoint = \"https://s3.example/?X-Amz-Credential=hunter2secret\"\n",
                    "kavi.toml:3:1",
                ),
            ] {
                jail.create_file("kavi.toml", text)?;
                let said = Workspace::load(None, &Overrides::default())
                    .unwrap_err()
                    .to_string();
                assert!(said.contains(at), "{said}");
                assert!(said.contains("AWS_SECRET_ACCESS_KEY"), "{said}");
                assert!(!said.contains("hunter2secret"), "{said}");
            }
            jail.create_file("kavi.toml", "[object_store]\nbucket = \"b\"\n")?;
            jail.set_env(
                "KAVI_OBJECT_STORE_ENDPOINT",
                "https://AKIA:hunter2secret@s3.example",
            );
            let said = Workspace::load(None, &Overrides::default())
                .unwrap_err()
                .to_string();
            assert!(said.contains("KAVI_OBJECT_STORE_ENDPOINT ("), "{said}");
            assert!(!said.contains("hunter2secret"), "{said}");
            jail.set_env("KAVI_OBJECT_STORE_ENDPOINT", "");
            jail.create_file("kavi.toml", "[object_store]\nbucket = \"\"\n")?;
            let said = Workspace::load(None, &Overrides::default())
                .unwrap_err()
                .to_string();
            assert!(said.contains("kavi.toml:2:10"), "{said}");
            Ok(())
        });
    }
}
