//! From pipeline TOML text to a validated [`Pipeline`].
//!
//! The document is parsed once into a span-keeping table. The header and parameters are
//! deserialized with `deny_unknown_fields`; each node's table is split into the fields every
//! kind shares and the fields of its kind, and the kind's own parser takes the latter. Because
//! all of it deserializes from the one parsed table, every error keeps its place in the file.
//!
//! A long pipeline uses the cores: its nodes are loaded on a thread of their own as the reader
//! hands their tables over ([`Courier`]), and the nodes left in the tree are loaded in shares,
//! one per core ([`NodeLoader::load_all`]). Nodes, problems and governing files come out in
//! the file's order either way.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use indexmap::IndexMap;
use serde::{Deserialize, Deserializer};
use sha2::{Digest, Sha256};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::document::{Key, Read, Tables};
use super::governing::{GoverningSet, NamedFiles, Role};
use super::params::{ParamDecl, ParamType};
use super::{Budget, NodeSpec, OnFailure, Pipeline, RetryOn, RetryPolicy, SpecError, Trigger};
use crate::diagnostic::{Diagnostic, SourceFile};
use crate::nodes::{self, NodeConfig};
use crate::state::NodeState;
use crate::template::{TemplateEngine, describe_error};

/// Fields every node has, whatever its kind.
const COMMON_FIELDS: &[&str] = &[
    "kind",
    "description",
    "needs",
    "when",
    "timeout",
    "retry",
    "on_failure",
    "trigger",
    "inputs",
    "outputs",
    "cache",
];

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHeader {
    /// The pipeline's name and run-wide settings.
    pipeline: RawPipelineSection,
    /// Parameters, by name: set with `--set NAME=VALUE`, read as `{{ params.NAME }}`.
    #[serde(default)]
    #[schemars(with = "IndexMap<String, RawParam>")]
    params: IndexMap<String, Spanned<RawParam>>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawPipelineSection {
    /// The pipeline's name, as runs record it.
    name: String,
    /// What it is for, shown by `kavi pipeline list`.
    description: Option<String>,
    /// Stop starting nodes once one fails (running ones finish).
    #[serde(default)]
    fail_fast: bool,
    /// Limits on the whole run: wall time, node attempts, HTTP calls.
    #[serde(default)]
    budget: Budget,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawParam {
    /// `string`, `integer`, `float` or `boolean`.
    #[serde(rename = "type")]
    ty: ParamType,
    /// The value when `--set` does not give one; without one, the parameter is required.
    #[schemars(with = "Option<serde_json::Value>")]
    default: Option<Spanned<toml::Value>>,
    /// Say `true` to make a parameter without a default explicitly required.
    #[schemars(with = "Option<bool>")]
    required: Option<Spanned<bool>>,
    /// What it means, shown by `kavi pipeline plan`.
    description: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCommon {
    /// What the node does: `exec`, `render`, `sandbox`, `build`, `gate`, ... (docs/pipelines.md).
    #[schemars(with = "String")]
    kind: Spanned<String>,
    /// What it is for.
    description: Option<String>,
    /// The nodes that must finish first, by id.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    needs: Vec<Spanned<String>>,
    /// A minijinja expression; the node runs when it is true, and is `skipped` otherwise.
    #[schemars(with = "Option<String>")]
    when: Option<Spanned<String>>,
    /// How long one attempt may take, such as `30s` or `5m`; then it is killed, `timed_out`.
    #[serde(default, deserialize_with = "timeout")]
    #[schemars(with = "Option<String>")]
    timeout: Option<Duration>,
    /// Try again after a failure: attempts, backoff, and which failures.
    retry: Option<RawRetry>,
    /// `stop` (default): dependants are blocked and the run fails. `continue`: they run.
    on_failure: Option<OnFailure>,
    /// `success` (default), `failure` (a failure handler) or `always` (cleanup).
    trigger: Option<Trigger>,
    /// Files whose contents decide the node's result: paths (a folder means every file under
    /// it) or globs (`src/**/*.py`), relative to the workspace. A node that declares them is
    /// `cached` when a run with the same key (its definition, these files, the parameters and
    /// outputs it reads, its environment, the governing files) succeeded before.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    inputs: Vec<Spanned<String>>,
    /// Files the node writes, relative to the workspace: stored when it succeeds, and put back
    /// when it is cached. Each must exist, as a regular file, when the node succeeds.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    outputs: Vec<Spanned<String>>,
    /// `false`: always run the node, even with `inputs` declared.
    #[schemars(with = "Option<bool>")]
    cache: Option<Spanned<bool>>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    /// How many tries in all, the first included.
    #[schemars(with = "u32")]
    attempts: Spanned<u32>,
    /// The wait before the second try, such as `1s`.
    #[serde(default, deserialize_with = "backoff")]
    #[schemars(with = "Option<String>")]
    backoff: Option<Duration>,
    /// The backoff is multiplied by this before each later try (default 2; 1 keeps it constant).
    #[schemars(with = "Option<u32>")]
    factor: Option<Spanned<u32>>,
    /// The longest wait, however many tries came before, such as `1m`.
    #[serde(default, deserialize_with = "backoff")]
    #[schemars(with = "Option<String>")]
    max_backoff: Option<Duration>,
    /// What is retried: exit codes, states (`failed`, `timed_out`) and failure kinds. Empty:
    /// every failure.
    #[serde(default)]
    #[schemars(with = "Vec<RawRetryOn>")]
    on: Vec<Spanned<RawRetryOn>>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum RawRetryOn {
    Code(i64),
    Name(String),
}

/// The range of a node's `timeout`: a zero timeout would stop every node at once, and one past
/// 30 days is a mistake, not a plan.
const TIMEOUT_RANGE: (Duration, Duration) = (
    Duration::from_millis(1),
    Duration::from_secs(30 * 24 * 3600),
);

/// The range of `retry.backoff`.
const BACKOFF_RANGE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(24 * 3600));

/// The most tries `retry.attempts` may ask for.
const MAX_ATTEMPTS: u32 = 100;

/// Deserializes `"5s"`, `"1m 30s"`, `"250ms"` (humantime) into a duration within `range`; the
/// error says the range, and the TOML error points at the value.
fn duration_in<'de, D: Deserializer<'de>>(
    deserializer: D,
    field: &str,
    (min, max): (Duration, Duration),
) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    let range = format!(
        "`{field}` must be from {} to {}",
        humantime::format_duration(min),
        humantime::format_duration(max)
    );
    let parsed = humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!("invalid duration `{text}`: {e}; {range}"))
    })?;
    if parsed < min || parsed > max {
        return Err(serde::de::Error::custom(format!(
            "duration `{text}` is out of range: {range}"
        )));
    }
    Ok(Some(parsed))
}

/// A `timeout` field: a duration from 1ms to 30 days (a node's, a gate's).
pub(crate) fn timeout<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    duration_in(deserializer, "timeout", TIMEOUT_RANGE)
}

fn backoff<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    duration_in(deserializer, "retry.backoff", BACKOFF_RANGE)
}

/// Checks what `retry.on` names: an exit code other than 0, a state a node is retried from, or
/// a failure kind the classifier declares (its file then governs the node).
fn retry_on(
    file: &Arc<SourceFile>,
    raw: &[Spanned<RawRetryOn>],
    config: &mut NodeConfig<'_>,
) -> Result<Vec<RetryOn>, Diagnostic> {
    let retried = [NodeState::Failed, NodeState::TimedOut];
    let mut classifier = None;
    let mut on = Vec::with_capacity(raw.len());
    for item in raw {
        on.push(match item.get_ref() {
            RawRetryOn::Code(code) if (1..=255).contains(code) => RetryOn::Exit(*code),
            RawRetryOn::Code(_) => {
                return Err(Diagnostic::new(
                    "`retry.on` exit codes are from 1 to 255 (0 is success, never retried)",
                )
                .at(file, item.span()));
            }
            RawRetryOn::Name(name) => match name.parse::<NodeState>().ok() {
                Some(state) if retried.contains(&state) => RetryOn::State(state),
                Some(_) => {
                    return Err(Diagnostic::new(format!(
                        "a node is never retried from `{name}`; `retry.on` states are failed and timed_out"
                    ))
                    .at(file, item.span()));
                }
                None => {
                    if classifier.is_none() {
                        classifier = Some(config.load_classifier(None)?);
                    }
                    let named = Spanned::new(item.span(), name.clone());
                    if let Some(classifier) = &classifier {
                        classifier.check_kind(&named, file)?;
                    }
                    RetryOn::Kind(name.clone())
                }
            },
        });
    }
    Ok(on)
}

/// A TOML error as a diagnostic located in `file`.
pub(crate) fn toml_error(file: &Arc<SourceFile>, err: &toml::de::Error) -> Diagnostic {
    let mut message = err.message().trim_end().to_owned();
    if message == "duplicate key"
        && let Some(key) = err.span().and_then(|span| file.text.get(span))
    {
        message = format!("duplicate key `{key}`: it is defined twice");
    }
    let help = crate::diagnostic::suggest_expected(&message);
    let diagnostic = match err.span() {
        Some(span) => Diagnostic::new(message).at(file, span),
        None => Diagnostic::new(format!("{message} (in {})", file.path.display())),
    };
    match help {
        Some(help) => diagnostic.with_help(help),
        None => diagnostic,
    }
}

/// Finds a pipeline file: a path as given, or a bare name looked up in `<root>/pipelines/`.
pub fn resolve_pipeline_path(root: &Path, name: &str) -> Result<PathBuf, SpecError> {
    resolve_spec_path(root, "pipelines", "pipeline", name)
}

/// Finds a spec file: a path as given, or a bare name looked up in `<root>/<folder>/`, with or
/// without `.toml`. `what` names the kind of spec in the error.
pub fn resolve_spec_path(
    root: &Path,
    folder: &str,
    what: &'static str,
    name: &str,
) -> Result<PathBuf, SpecError> {
    let given = PathBuf::from(name);
    if given.is_file() {
        return Ok(given);
    }
    let mut tried = vec![given];
    if !name.contains('/') {
        let in_folder = root.join(folder).join(name);
        tried.push(in_folder.clone());
        if in_folder.is_file() {
            return Ok(in_folder);
        }
        if !name.ends_with(".toml") {
            let with_ext = root.join(folder).join(format!("{name}.toml"));
            tried.push(with_ext.clone());
            if with_ext.is_file() {
                return Ok(with_ext);
            }
        }
    }
    Err(SpecError::NotFound {
        what,
        name: name.to_owned(),
        tried,
    })
}

/// What loading a pipeline needs besides its text.
pub struct LoadContext<'a> {
    /// The workspace root: policy files are named relative to it.
    pub root: &'a Path,
    pub templates: &'a TemplateEngine,
    /// The pipeline files being loaded, outermost first, each canonical: a `pipeline` node that
    /// names one of them again would include itself forever.
    pub including: &'a [PathBuf],
}

/// `sha256:<hex>` of a spec or policy text: how the ledger names it.
pub fn spec_hash(text: &str) -> String {
    format!("sha256:{:x}", Sha256::digest(text.as_bytes()))
}

/// Reads and validates a pipeline file. `display_path` is how messages name the file.
pub fn load_pipeline(
    path: &Path,
    display_path: &Path,
    context: &LoadContext<'_>,
) -> Result<Pipeline, SpecError> {
    let read_error = |source| SpecError::Read {
        path: display_path.to_owned(),
        source,
    };
    let text = crate::diagnostic::read_spec(path).map_err(read_error)?;
    let mut including = context.including.to_vec();
    including.push(path.canonicalize().map_err(read_error)?);
    let context = LoadContext {
        including: &including,
        ..*context
    };
    load_pipeline_str(display_path, text, &context)
}

/// Validates pipeline text. Everything is checked before returning, and all problems found in
/// the nodes are reported together.
pub fn load_pipeline_str(
    display_path: &Path,
    text: String,
    context: &LoadContext<'_>,
) -> Result<Pipeline, SpecError> {
    let file = SourceFile::new(display_path, text);
    let loader = Mutex::new(NodeLoader::new(&file, context));
    // Each node is loaded as soon as its table is read, and the table dropped: the nodes'
    // tables are never all held at once. A long pipeline's nodes are loaded on a thread of
    // their own while the reading goes on (see [`Courier`]).
    let read = std::thread::scope(|scope| {
        let mut courier = Courier::new(&loader, scope);
        let read = super::document::parse_taking(&file.text, "nodes", &["params"], &mut courier);
        courier.finish();
        read
    });
    let mut loader = loader.into_inner().unwrap_or_else(PoisonError::into_inner);
    let spec_hash = file.spec_hash().to_owned();
    let (root, handed) = match read {
        Read::Tables { root, handed } => (root, handed),
        Read::LeftToToml => (
            DeTable::parse(&file.text).map_err(|e| toml_error(&file, &e))?,
            0,
        ),
    };
    loader.keep_first(handed);
    let root_span = root.span();

    let mut header_table = DeTable::new();
    let mut raw_nodes = None;
    for (key, value) in root.into_inner() {
        if key.get_ref() == "nodes" {
            raw_nodes = Some(value);
        } else {
            header_table.insert(key, value);
        }
    }
    let header = RawHeader::deserialize(toml::de::Deserializer::from(Spanned::new(
        root_span.clone(),
        header_table,
    )))
    .map_err(|e| toml_error(&file, &e))?;
    if loader.params.is_none() {
        let params = load_params(&file, header.params, &mut loader.problems);
        loader.params = Some(params);
    }

    match raw_nodes {
        None => loader.problems.push(
            Diagnostic::new("a pipeline needs at least one node")
                .at(&file, 0..0)
                .with_help("add a table such as [nodes.hello] with kind = \"exec\""),
        ),
        Some(value) => {
            let span = value.span();
            match value.into_inner() {
                // The first `handed` stand for the nodes loaded as they were read.
                DeValue::Table(table) => loader.load_all(table.into_iter().skip(handed).collect()),
                _ => loader.problems.push(
                    Diagnostic::new("`nodes` must be a table of node tables").at(&file, span),
                ),
            }
        }
    }
    let NodeLoader {
        params,
        mut problems,
        nodes,
        governing,
        unloaded,
        ..
    } = loader;
    let params = params.unwrap_or_default();
    check_needs(&file, &nodes, &unloaded, &mut problems);

    if !problems.is_empty() {
        return Err(problems.into());
    }
    Ok(Pipeline {
        name: header.pipeline.name,
        description: header.pipeline.description,
        source: file,
        spec_hash,
        fail_fast: header.pipeline.fail_fast,
        budget: header.pipeline.budget,
        params,
        nodes,
        governing,
    })
}

/// Loads a pipeline's nodes, one at a time, in the file's order: as the reader hands their
/// tables over, then those it left in the tree.
struct NodeLoader<'a, 'c> {
    file: &'a Arc<SourceFile>,
    context: &'a LoadContext<'c>,
    /// Read from the document before the first node, or from its header after the last.
    params: Option<IndexMap<String, ParamDecl>>,
    problems: Vec<Diagnostic>,
    nodes: Vec<NodeSpec>,
    governing: GoverningSet,
    /// Nodes declared but refused: a `needs` naming one is not a second problem.
    unloaded: Vec<String>,
    named_files: NamedFiles,
    /// How many node tables were taken from the reader, refused ones too.
    taken: usize,
    /// How many nodes it has room for: the headers that may name one, or its share's size.
    headers: usize,
}

impl<'a, 'c> NodeLoader<'a, 'c> {
    fn new(file: &'a Arc<SourceFile>, context: &'a LoadContext<'c>) -> Self {
        // Sized once, by the headers that may name nodes: a node spec is large, and growing
        // the vector by doubling copies every spec and touches fresh memory each time.
        let headers = memchr::memmem::find_iter(file.text.as_bytes(), b"\n[nodes.").count() + 1;
        Self::sized(file, context, headers)
    }

    /// A loader with room for `headers` nodes.
    fn sized(file: &'a Arc<SourceFile>, context: &'a LoadContext<'c>, headers: usize) -> Self {
        let mut governing = GoverningSet::default();
        governing.add(Role::Pipeline, Arc::clone(file));
        Self {
            file,
            context,
            params: None,
            problems: Vec::new(),
            nodes: Vec::with_capacity(headers),
            governing,
            unloaded: Vec::new(),
            named_files: NamedFiles::new(context.root),
            taken: 0,
            headers,
        }
    }

    /// Loads `nodes`, in the file's order. A long list is loaded in shares, one per core, the
    /// first here and each other on a thread of its own with a loader of its own, whose nodes,
    /// problems and governing files are then added in order.
    fn load_all(&mut self, nodes: Tables<'_>) {
        let shares = shares().min(nodes.len() / LOAD_APART_FROM).max(1);
        let size = nodes.len().div_ceil(shares);
        let mut nodes = nodes.into_iter();
        let mut first: Vec<_> = nodes.by_ref().take(size).collect();
        // Each in a lock its thread takes, so that a thread that cannot start leaves its
        // share here, to be loaded on this one.
        let later: Vec<_> = (1..shares)
            .map(|_| Mutex::new(nodes.by_ref().take(size).collect::<Vec<_>>()))
            .collect();
        let loaded = std::thread::scope(|scope| {
            let threads: Vec<_> = later
                .iter()
                .map(|share| {
                    let mut sibling = self.sibling(size);
                    let thread = std::thread::Builder::new()
                        .name("kavi-load".into())
                        .spawn_scoped(scope, move || {
                            sibling.load_each(&mut lock(share));
                            sibling
                        });
                    (share, thread)
                })
                .collect();
            self.load_each(&mut first);
            threads
                .into_iter()
                .map(|(share, thread)| match thread.map(|t| t.join()) {
                    Ok(Ok(sibling)) => sibling,
                    Ok(Err(panic)) => std::panic::resume_unwind(panic),
                    Err(_) => {
                        let mut sibling = self.sibling(size);
                        sibling.load_each(&mut lock(share));
                        sibling
                    }
                })
                .collect::<Vec<_>>()
        });
        for sibling in loaded {
            self.append(sibling);
        }
    }

    /// Loads and empties `nodes`.
    fn load_each(&mut self, nodes: &mut Tables<'_>) {
        for (id, node) in nodes.drain(..) {
            self.load(id, node);
        }
    }

    /// A loader for a later share of this one's nodes, `size` of them: the same file and
    /// parameters.
    fn sibling(&self, size: usize) -> Self {
        Self {
            params: self.params.clone(),
            ..Self::sized(self.file, self.context, size)
        }
    }

    /// Adds what `later`, a [`NodeLoader::sibling`], loaded after what this one did.
    fn append(&mut self, later: Self) {
        self.nodes.extend(later.nodes);
        self.problems.extend(later.problems);
        self.governing.extend(&later.governing);
        self.unloaded.extend(later.unloaded);
    }

    fn load(&mut self, id: Key<'_>, node: Spanned<DeValue<'_>>) {
        let params = self
            .params
            .as_ref()
            .expect("parameters are read before nodes");
        let name = id.get_ref().to_string();
        match load_node(
            self.file,
            id,
            node,
            self.context,
            params,
            &mut self.named_files,
        ) {
            Ok((node, used)) => {
                self.nodes.push(node);
                self.governing.extend(&used);
            }
            Err(diagnostic) => {
                self.problems.push(diagnostic);
                self.unloaded.push(name);
            }
        }
    }

    /// Keeps what the first `handed` tables taken made: a reading that was spoiled, or left
    /// to toml, hands over none, and everything is loaded again from the tree.
    fn keep_first(&mut self, handed: usize) {
        if handed == 0 && self.taken > 0 {
            let fresh = Self::sized(self.file, self.context, self.headers);
            *self = fresh;
        }
        debug_assert!(handed == 0 || handed == self.taken);
    }
}

/// The parameters alone, as [`RawHeader`] reads them.
#[derive(Deserialize)]
struct RawParams {
    #[serde(default)]
    params: IndexMap<String, Spanned<RawParam>>,
}

impl NodeLoader<'_, '_> {
    /// Reads the parameters from `root`, the document before its first node, unless they are
    /// read already: false when they hold a mistake, which is reported with the header's, the
    /// nodes waiting for the tree.
    fn read_params(&mut self, root: &DeTable<'_>) -> bool {
        if self.params.is_some() {
            return true;
        }
        let mut params = DeTable::new();
        if let Some((key, value)) = root.get_key_value("params") {
            params.insert(key.clone(), value.clone());
        }
        let Ok(raw) =
            RawParams::deserialize(toml::de::Deserializer::from(Spanned::new(0..0, params)))
        else {
            return false;
        };
        self.params = Some(load_params(self.file, raw.params, &mut self.problems));
        true
    }

    /// Loads a node the reader handed over.
    fn load_taken(&mut self, name: Key<'_>, table: Spanned<DeValue<'_>>) {
        self.taken += 1;
        self.load(name, table);
    }
}

/// How many nodes a pipeline has before they are loaded on threads of their own (while the
/// reader goes on, or in shares): below it, starting a thread and handing the tables over
/// cost more than the loading they move. Tests take the threads for any pipeline of two nodes
/// or more.
const LOAD_APART_FROM: usize = if cfg!(test) { 2 } else { 512 };

/// How many shares a long list of nodes is loaded in: one per core; three in tests, whatever
/// the machine, so that shares are joined in order there.
fn shares() -> usize {
    if cfg!(test) {
        3
    } else {
        crate::config::cores()
    }
}

/// Node tables handed to the loading thread at once: one wake for many nodes.
const BATCH: usize = 64;

/// Batches handed over and not loaded yet, at most: where the loader falls behind, the reader
/// waits, so that the tables of a long pipeline are still never all held at once.
const QUEUED: usize = 8;

/// Hands the reader's node tables to the [`NodeLoader`]: directly, or, for a long pipeline,
/// to a thread that loads them while the reader goes on, in batches and in order. The two
/// cores then share what one did in turn: reading a node's table, and turning it into a node
/// spec (a quarter of `check` on a 10,000-node pipeline).
struct Courier<'scope, 'env, 'a, 'c, 'i> {
    loader: &'scope Mutex<NodeLoader<'a, 'c>>,
    scope: &'scope std::thread::Scope<'scope, 'env>,
    loading: Loading<'scope, 'i>,
}

/// Where the nodes are loaded.
enum Loading<'scope, 'i> {
    /// Not decided: no node taken yet.
    Undecided,
    /// On the reader's thread.
    Here,
    /// On a thread of their own, handed over a batch at a time.
    Apart {
        batch: Tables<'i>,
        sender: mpsc::SyncSender<Tables<'i>>,
        thread: std::thread::ScopedJoinHandle<'scope, ()>,
    },
}

/// What `mutex` holds, even if a thread failed while holding it: that failure is the
/// thread's own, and reported as such when it is joined.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<'scope, 'env, 'a, 'c, 'i> Courier<'scope, 'env, 'a, 'c, 'i>
where
    'a: 'scope,
    'c: 'scope,
    'i: 'scope,
{
    fn new(
        loader: &'scope Mutex<NodeLoader<'a, 'c>>,
        scope: &'scope std::thread::Scope<'scope, 'env>,
    ) -> Self {
        Self {
            loader,
            scope,
            loading: Loading::Undecided,
        }
    }

    /// Loads apart when the pipeline is long and the thread starts. The thread holds the
    /// loader until the reader is done, and first hashes the file (the run and the plan name
    /// the pipeline by it) while the first batch is read.
    fn decide(&self) -> Loading<'scope, 'i> {
        if lock(self.loader).headers < LOAD_APART_FROM {
            return Loading::Here;
        }
        let (sender, receiver) = mpsc::sync_channel::<Tables<'i>>(QUEUED);
        let loader = self.loader;
        let thread = std::thread::Builder::new()
            .name("kavi-load".into())
            .spawn_scoped(self.scope, move || {
                let mut loader = lock(loader);
                loader.file.spec_hash();
                for batch in receiver {
                    for (name, table) in batch {
                        loader.load_taken(name, table);
                    }
                }
            });
        match thread {
            Ok(thread) => Loading::Apart {
                batch: Vec::with_capacity(BATCH),
                sender,
                thread,
            },
            Err(_) => Loading::Here,
        }
    }

    /// Hands over what is left, and waits until the thread has loaded it.
    fn finish(self) {
        if let Loading::Apart {
            batch,
            sender,
            thread,
        } = self.loading
        {
            if !batch.is_empty() {
                let _ = sender.send(batch);
            }
            drop(sender);
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

impl<'scope, 'a, 'c, 'i> super::document::Taker<'i> for Courier<'scope, '_, 'a, 'c, 'i>
where
    'a: 'scope,
    'c: 'scope,
    'i: 'scope,
{
    fn take(
        &mut self,
        root: &DeTable<'i>,
        name: Key<'i>,
        table: Spanned<DeValue<'i>>,
    ) -> Option<Spanned<DeValue<'i>>> {
        if let Loading::Undecided = self.loading {
            if !lock(self.loader).read_params(root) {
                return Some(table);
            }
            self.loading = self.decide();
        }
        match &mut self.loading {
            Loading::Apart { batch, sender, .. } => {
                batch.push((name, table));
                if batch.len() == BATCH {
                    // The thread ends only once the channel closes.
                    let _ = sender.send(std::mem::replace(batch, Vec::with_capacity(BATCH)));
                }
            }
            _ => lock(self.loader).load_taken(name, table),
        }
        None
    }
}

pub(crate) fn load_params(
    file: &Arc<SourceFile>,
    raw: IndexMap<String, Spanned<RawParam>>,
    problems: &mut Vec<Diagnostic>,
) -> IndexMap<String, ParamDecl> {
    let mut params = IndexMap::new();
    for (name, raw) in raw {
        let span = raw.span();
        let raw = raw.into_inner();
        let default = match &raw.default {
            None => None,
            Some(value) => match raw.ty.accepts(value.get_ref()) {
                Some(json) => Some(json),
                None => {
                    problems.push(
                        Diagnostic::new(format!(
                            "default of parameter `{name}` is a {}, but its type is {}",
                            value.get_ref().type_str(),
                            raw.ty.name()
                        ))
                        .at(file, value.span()),
                    );
                    continue;
                }
            },
        };
        match (&raw.required, &default) {
            (Some(required), Some(_)) if *required.get_ref() => problems.push(
                Diagnostic::new(format!(
                    "parameter `{name}` is required but also has a default"
                ))
                .at(file, required.span())
                .with_help("drop `required`, or drop the default"),
            ),
            (Some(required), None) if !*required.get_ref() => problems.push(
                Diagnostic::new(format!("optional parameter `{name}` needs a default"))
                    .at(file, span.clone()),
            ),
            _ => {}
        }
        params.insert(
            name,
            ParamDecl {
                ty: raw.ty,
                default,
                description: raw.description,
            },
        );
    }
    params
}

fn is_valid_node_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn load_node(
    file: &Arc<SourceFile>,
    id: Key<'_>,
    node: Spanned<DeValue<'_>>,
    context: &LoadContext<'_>,
    params: &IndexMap<String, ParamDecl>,
    named_files: &mut NamedFiles,
) -> Result<(NodeSpec, GoverningSet), Diagnostic> {
    let templates = context.templates;
    let id_span = id.span();
    let id = id.into_inner().into_owned();
    if !is_valid_node_id(&id) {
        return Err(Diagnostic::new(format!("invalid node id `{id}`"))
            .at(file, id_span)
            .with_help(
                "node ids start with a letter or `_` and hold only letters, digits, `_` and `-`",
            ));
    }
    let node_span = node.span();
    // A cached node's key covers its whole definition, as written.
    let definition = match node.get_ref() {
        DeValue::Table(table) if table.contains_key("inputs") => Some(definition_hash(
            Spanned::new(node_span.clone(), table.clone()),
        )),
        _ => None,
    };
    let DeValue::Table(table) = node.into_inner() else {
        return Err(Diagnostic::new(format!("node `{id}` must be a table")).at(file, node_span));
    };

    // Each made at its size: growing them rehashes every key again.
    let common_fields = table
        .keys()
        .filter(|key| COMMON_FIELDS.contains(&key.get_ref().as_ref()))
        .count();
    let mut common = DeTable::with_capacity(common_fields);
    let mut specific = DeTable::with_capacity(table.len() - common_fields);
    for (key, value) in table {
        if COMMON_FIELDS.contains(&key.get_ref().as_ref()) {
            common.insert(key, value);
        } else {
            specific.insert(key, value);
        }
    }
    let common = RawCommon::deserialize(toml::de::Deserializer::from(Spanned::new(
        node_span.clone(),
        common,
    )))
    .map_err(|e| toml_error(file, &e))?;

    let kind_name = common.kind.get_ref();
    let Some(kind) = nodes::kind(kind_name) else {
        let known: Vec<_> = nodes::KINDS
            .iter()
            .map(|k| format!("`{}`", k.name))
            .collect();
        let help = match crate::diagnostic::closest(kind_name, nodes::KINDS.iter().map(|k| k.name))
        {
            Some(close) => format!("did you mean `{close}`? known kinds: {}", known.join(", ")),
            None => format!("known kinds: {}", known.join(", ")),
        };
        return Err(Diagnostic::new(format!("unknown node kind `{kind_name}`"))
            .at(file, common.kind.span())
            .with_help(help));
    };

    let mut config = NodeConfig {
        file,
        table: Some(Spanned::new(node_span.clone(), specific)),
        span: id_span.clone(),
        root: context.root,
        templates,
        including: context.including,
        reads: Vec::new(),
        governing: GoverningSet::default(),
        named_files,
    };
    let action = (kind.parse)(&mut config).map_err(|mut d| {
        let in_this_file = d
            .location
            .as_ref()
            .is_some_and(|(f, _)| Arc::ptr_eq(f, file));
        if in_this_file && d.message.starts_with("unknown field") {
            let also = format!("every node also takes: {}", COMMON_FIELDS.join(", "));
            d.help = Some(match d.help.take() {
                Some(suggestion) => format!("{suggestion} {also}"),
                None => also,
            });
        }
        d
    })?;

    if let Some(when) = &common.when {
        let reads = templates.check_expression(when.get_ref()).map_err(|e| {
            Diagnostic::new(format!("invalid `when` expression: {}", describe_error(&e)))
                .at(file, when.span())
        })?;
        if let Some((_, message, help)) = crate::template::Scope::node().unknown(&reads) {
            return Err(Diagnostic::new(message)
                .at(file, when.span())
                .with_help(help));
        }
        config
            .reads
            .extend(reads.into_iter().map(|path| (path, when.span())));
    }
    check_param_reads(file, &config.reads, params)?;

    let mut cache = cache_spec(file, context.root, &common, definition)?;
    let retry = match common.retry {
        None => RetryPolicy::default(),
        Some(raw) if !(1..=MAX_ATTEMPTS).contains(raw.attempts.get_ref()) => {
            return Err(Diagnostic::new(format!(
                "`retry.attempts` counts every try and must be from 1 to {MAX_ATTEMPTS}"
            ))
            .at(file, raw.attempts.span()));
        }
        Some(raw) => RetryPolicy {
            attempts: raw.attempts.into_inner(),
            backoff: raw.backoff.unwrap_or(Duration::ZERO),
            factor: match raw.factor {
                None => 2,
                Some(factor) if (1..=10).contains(factor.get_ref()) => factor.into_inner(),
                Some(factor) => {
                    return Err(Diagnostic::new("`retry.factor` must be from 1 to 10")
                        .at(file, factor.span()));
                }
            },
            max_backoff: raw.max_backoff,
            on: retry_on(file, &raw.on, &mut config)?,
        },
    };

    if let Some(cache) = &mut cache {
        // The policies, templates and chains that govern this node are part of its key; the
        // pipeline file is, through its definition. The files its command happens to name are
        // not: that is a guess (a log it appends to changes every run), and a key is declared,
        // so a script it runs belongs in its `inputs`.
        cache.governing = config
            .governing
            .members()
            .into_iter()
            .filter(|(role, ..)| !matches!(role, Role::Pipeline | Role::Script))
            .map(|(role, path, hash, _)| (format!("{role}:{path}"), hash))
            .collect();
    }
    let node = NodeSpec {
        id,
        span: id_span,
        kind: kind.name,
        description: common.description,
        needs: common.needs,
        when: common.when,
        timeout: common.timeout,
        retry,
        on_failure: common.on_failure.unwrap_or(OnFailure::Stop),
        trigger: common.trigger.unwrap_or(Trigger::Success),
        reads: config.reads,
        cache,
        action,
    };
    Ok((node, config.governing))
}

/// The SHA-256 of a node's table as TOML would give it back: the same for the same fields and
/// values, however they are spaced or commented.
fn definition_hash(node: Spanned<DeTable<'_>>) -> String {
    let table = toml::Table::deserialize(toml::de::Deserializer::from(node))
        .map(|table| table.to_string())
        .unwrap_or_default();
    crate::cache::sha256_hex(table.as_bytes())
}

/// Checks `inputs`, `outputs` and `cache`: paths inside the workspace, valid globs, and no
/// outputs or `cache` without inputs (there would be nothing to key on).
fn cache_spec(
    file: &Arc<SourceFile>,
    root: &Path,
    common: &RawCommon,
    definition: Option<String>,
) -> Result<Option<crate::cache::CacheSpec>, Diagnostic> {
    if common.inputs.is_empty() {
        let stray = common
            .outputs
            .first()
            .map(|o| ("outputs", o.span()))
            .or_else(|| common.cache.as_ref().map(|c| ("cache", c.span())));
        return match stray {
            None => Ok(None),
            Some((field, span)) => Err(Diagnostic::new(format!(
                "`{field}` without `inputs`: a node is cached only when it declares its inputs"
            ))
            .at(file, span)
            .with_help("list the files its result depends on in `inputs`")),
        };
    }
    let check = |path: &Spanned<String>| {
        crate::sandbox::contained_path(root, path.get_ref())
            .map_err(|e| Diagnostic::new(format!("invalid path: {e}")).at(file, path.span()))
    };
    let mut inputs = Vec::with_capacity(common.inputs.len());
    for input in &common.inputs {
        check(input)?;
        inputs.push(
            crate::cache::InputPattern::parse(input.get_ref())
                .map_err(|e| Diagnostic::new(e).at(file, input.span()))?,
        );
    }
    let mut outputs = Vec::with_capacity(common.outputs.len());
    for output in &common.outputs {
        crate::cache::output_path(root, output.get_ref())
            .map_err(|e| Diagnostic::new(format!("invalid path: {e}")).at(file, output.span()))?;
        if output.get_ref().contains(['*', '?', '[', '{']) {
            return Err(
                Diagnostic::new("`outputs` name files; globs are for `inputs`")
                    .at(file, output.span()),
            );
        }
        outputs.push(output.get_ref().clone());
    }
    Ok(Some(crate::cache::CacheSpec {
        inputs,
        outputs,
        enabled: common.cache.as_ref().is_none_or(|c| *c.get_ref()),
        definition: definition.unwrap_or_default(),
        governing: Vec::new(),
    }))
}

/// A template that reads `params.x` for an undeclared `x` would fail at run time; say so now.
fn check_param_reads(
    file: &Arc<SourceFile>,
    reads: &[(String, std::ops::Range<usize>)],
    params: &IndexMap<String, ParamDecl>,
) -> Result<(), Diagnostic> {
    for (path, span) in reads {
        let mut parts = path.split('.');
        if parts.next() == Some("params")
            && let Some(name) = parts.next()
            && !params.contains_key(name)
        {
            return Err(
                Diagnostic::new(format!("template reads undeclared parameter `{name}`"))
                    .at(file, span.clone())
                    .with_help(format!("declare it with a [params.{name}] table")),
            );
        }
    }
    Ok(())
}

/// Every `needs` entry must name another node of this pipeline.
fn check_needs(
    file: &Arc<SourceFile>,
    nodes: &[NodeSpec],
    unloaded: &[String],
    problems: &mut Vec<Diagnostic>,
) {
    // foldhash, not SipHash: the ids are the operator's, and there can be tens of thousands.
    let ids: std::collections::HashSet<&str, foldhash::fast::RandomState> = nodes
        .iter()
        .map(|n| n.id.as_str())
        .chain(unloaded.iter().map(String::as_str))
        .collect();
    for node in nodes {
        for need in &node.needs {
            if !ids.contains(need.get_ref().as_str()) {
                problems.push(
                    Diagnostic::new(format!(
                        "node `{}` needs `{}`, which is not a node of this pipeline",
                        node.id,
                        need.get_ref()
                    ))
                    .at(file, need.span()),
                );
            }
        }
    }
}

/// `text`, loaded as `p.toml` in an empty workspace: for tests.
#[cfg(test)]
pub(crate) fn load_text(text: &str) -> Result<Pipeline, SpecError> {
    let root = tempfile::tempdir().unwrap();
    let templates = TemplateEngine::new(&root.path().join("templates"));
    let context = LoadContext {
        root: root.path(),
        templates: &templates,
        including: &[],
    };
    load_pipeline_str(Path::new("p.toml"), text.into(), &context)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a layout must not change: the nodes in order with their tries, and the parameters.
    fn summary(text: &str) -> (Vec<(String, u32)>, Vec<String>) {
        let pipeline = load_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let nodes = pipeline
            .nodes
            .iter()
            .map(|node| (node.id.clone(), node.retry.attempts))
            .collect();
        (nodes, pipeline.params.keys().cloned().collect())
    }

    fn messages(text: &str) -> Vec<String> {
        match load_text(text) {
            Ok(_) => panic!("loaded\n{text}"),
            Err(SpecError::Invalid(problems)) => {
                problems.0.iter().map(|p| p.message.clone()).collect()
            }
            Err(e) => vec![e.to_string()],
        }
    }

    #[test]
    fn nodes_load_alike_however_their_tables_are_laid_out() {
        let head = "[pipeline]\nname = \"p\"\n";
        let x = "[params.x]\ntype = \"string\"\ndefault = \"v\"\n";
        let a = "[nodes.a]\nkind = \"exec\"\nrun = [\"echo\", \"{{ params.x }}\"]\n";
        let b = "[nodes.b]\nkind = \"exec\"\nrun = [\"true\"]\nneeds = [\"a\"]\n";
        let retry = "[nodes.a.retry]\nattempts = 3\n";
        // Nothing read as the file is read: the nodes are values of a `[nodes]` table.
        let inline = format!(
            "{head}{x}[nodes]\na = {{ kind = \"exec\", run = [\"echo\", \"{{{{ params.x }}}}\"], retry = {{ attempts = 3 }} }}\n\
             b = {{ kind = \"exec\", run = [\"true\"], needs = [\"a\"] }}\n"
        );
        let expected = summary(&inline);
        assert_eq!(expected.0, [("a".to_owned(), 3), ("b".to_owned(), 1)]);
        for text in [
            // Every node loaded as it is read.
            format!("{head}{x}{}retry.attempts = 3\n{b}", a),
            // A header adds to the node just read: it and the rest are loaded at the end.
            format!("{head}{x}{a}{retry}{b}"),
            // A header reaches into a node already loaded, or parameters come after one:
            // read again, all loaded at the end.
            format!("{head}{x}{a}{b}{retry}"),
            format!("{head}{a}retry.attempts = 3\n{b}{x}"),
            format!("{a}retry.attempts = 3\n{x}{b}{head}"),
        ] {
            assert_eq!(summary(&text), expected, "{text}");
        }
    }

    /// Ten nodes, whichever way they load: handed to the loading thread as they are read
    /// (parameters first), or in three shares on three threads from the tree (parameters
    /// last, so the file is read again). Nodes, governing files and problems keep the file's
    /// order.
    #[test]
    fn a_long_pipeline_loads_in_the_file_s_order_on_any_thread() {
        let head = "[pipeline]\nname = \"p\"\n";
        let x = "[params.x]\ntype = \"string\"\ndefault = \"v\"\n";
        let nodes = |broken: &[usize]| {
            (0..10)
                .map(|i| {
                    let kind = if broken.contains(&i) { "nope" } else { "exec" };
                    let needs = if i > 0 {
                        format!("needs = [\"n{}\"]\n", i - 1)
                    } else {
                        String::new()
                    };
                    format!("[nodes.n{i}]\nkind = \"{kind}\"\nrun = [\"cat\", \"f{i}\"]\n{needs}")
                })
                .collect::<String>()
        };
        let layouts = |broken: &[usize]| {
            let nodes = nodes(broken);
            [format!("{head}{x}{nodes}"), format!("{head}{nodes}{x}")]
        };
        let root = tempfile::tempdir().unwrap();
        for i in 0..10 {
            std::fs::write(root.path().join(format!("f{i}")), format!("{i}")).unwrap();
        }
        let templates = TemplateEngine::new(&root.path().join("templates"));
        let context = LoadContext {
            root: root.path(),
            templates: &templates,
            including: &[],
        };
        let load = |text: &String| load_pipeline_str(Path::new("p.toml"), text.clone(), &context);
        let ids: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
        // Each share's files too (the members come sorted by path).
        let files: Vec<String> = (0..10)
            .map(|i| format!("f{i}"))
            .chain(std::iter::once("p.toml".to_owned()))
            .collect();
        for text in layouts(&[]) {
            let pipeline = load(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            let loaded: Vec<_> = pipeline.nodes.iter().map(|n| n.id.clone()).collect();
            assert_eq!(loaded, ids, "{text}");
            let governing: Vec<_> = pipeline
                .governing
                .members()
                .into_iter()
                .map(|(_, path, ..)| path)
                .collect();
            assert_eq!(governing, files, "{text}");
        }
        for text in layouts(&[1, 4, 5, 9]) {
            let Err(SpecError::Invalid(problems)) = load(&text) else {
                panic!("loaded\n{text}");
            };
            let at: Vec<_> = problems
                .0
                .iter()
                .map(|p| {
                    (
                        p.message.clone(),
                        p.location.as_ref().map(|(_, span)| span.start),
                    )
                })
                .collect();
            let expected: Vec<_> = [1, 4, 5, 9]
                .iter()
                .map(|&i| {
                    let start = text.find(&format!("[nodes.n{i}]")).unwrap()
                        + format!("[nodes.n{i}]\nkind = ").len();
                    ("unknown node kind `nope`".to_owned(), Some(start))
                })
                .collect();
            assert_eq!(at, expected, "{text}");
        }
    }

    #[test]
    fn problems_come_in_the_file_s_order_however_its_nodes_are_read() {
        let head = "[pipeline]\nname = \"p\"\n";
        let x = "[params.x]\ntype = \"integer\"\ndefault = \"v\"\n";
        let a = "[nodes.a]\nkind = \"nope\"\n";
        let b = "[nodes.b]\nkind = \"exec\"\nrun = [\"true\"]\nneeds = [\"zz\"]\n";
        let first = messages(&format!("{head}{x}{a}{b}"));
        assert_eq!(first.len(), 3, "{first:?}");
        assert!(first[0].contains("parameter `x`"), "{first:?}");
        assert!(first[1].contains("unknown node kind"), "{first:?}");
        assert_eq!(
            messages(&format!("{head}{x}{a}{b}[nodes.b.retry]\nattempts = 1\n")),
            first
        );
        assert_eq!(messages(&format!("{head}{a}{b}{x}")), first);
    }
}
