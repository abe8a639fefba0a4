//! The node interface: what a node kind and the executor agree on. A kind parses its fields
//! from a [`NodeConfig`] into a [`NodeAction`], which the executor runs with a [`NodeContext`];
//! neither side names the other. The kinds themselves live in the layers above.

mod environment;
mod policy_file;
mod registry;

pub use environment::{ChildRun, ChildRuns, Environment, LiveNodeOutput};
pub use policy_file::{GOVERNING_FOLDERS, Policy, read};
pub use registry::{FailureKinds, LoadFailureKinds, PolicyProblems, Registry};

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toml::Spanned;
use toml::de::DeTable;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::ledger::Artifact;
use crate::spec::governing::{GoverningSet, NamedFiles, Role};
use crate::state::NodeState;
use crate::template::{Scope, TemplateEngine, describe_error, find_read};

/// A node kind: its name in TOML, how to parse its fields, and their JSON Schema (for editors;
/// see `crate::schemas`).
pub struct NodeKind {
    pub name: &'static str,
    pub parse: fn(&mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic>,
    pub schema: fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
    /// Whether its attempts call out over HTTP, counted by `[pipeline.budget] http_calls`.
    pub calls_http: bool,
}

/// The settings that choose what does a node's work: the builder command, the model gateway, the
/// toolchains kavi was pointed at.
pub const RESULT_SETTINGS: &[&str] = &["builder", "gateway", "toolchain"];

/// What one node does when it runs.
#[async_trait::async_trait]
pub trait NodeAction: Send + Sync + Debug {
    /// One line for `pipeline plan`, e.g. the command it runs.
    fn describe(&self) -> String;

    /// The keys its `outputs` can have, so `check` can refuse a template that reads one it
    /// never has; `None` when they are not known before it runs.
    fn output_keys(&self) -> Option<&'static [&'static str]> {
        None
    }

    /// The names the output `key` holds, where they are known before it runs (a chain's
    /// `steps`, a child pipeline's `nodes`, an http node's `extract`), so `check` can refuse a
    /// template that reads one it never has.
    fn output_names(&self, _key: &str) -> Option<Vec<&str>> {
        None
    }

    /// The fields each entry of the output `key` has, where they are fixed (a chain's step:
    /// `status`, `output`...; a child pipeline's node: `state`, `outputs`), so `check` can
    /// refuse a template that reads a field an entry never has.
    fn output_entry_fields(&self, _key: &str) -> Option<&'static [&'static str]> {
        None
    }

    /// The node behind the entry `name` of the output `key` (a child pipeline's node), so
    /// `check` reads on into that node's own outputs.
    fn output_node(&self, _key: &str, _name: &str) -> Option<&crate::spec::NodeSpec> {
        None
    }

    /// The nodes it runs inside itself (a child pipeline's), so `check` can refuse a node
    /// that waits for a concurrency group this one holds while they run.
    fn child_nodes(&self) -> &[crate::spec::NodeSpec] {
        &[]
    }

    /// The workspace file it reads when it runs, as its template (a proposal named by a
    /// parameter), so that a run whose parameters name one that is not there is refused before
    /// it is recorded.
    fn reads_file(&self) -> Option<&str> {
        None
    }

    /// Whether the process it starts gets all of kavi's environment (not just the base
    /// variables), which then is part of its key when it is cached.
    fn inherits_environment(&self) -> bool {
        false
    }

    /// The settings of the run's configuration its result depends on, by name (`builder`,
    /// `gateway`), part of its key when it is cached; a setting its templates read is one too.
    /// By default those that choose what does the work (see [`RESULT_SETTINGS`]): where things
    /// are kept, how many nodes run at once and how long they may take change no result.
    fn config_settings(&self) -> &'static [&'static str] {
        RESULT_SETTINGS
    }

    /// Whether running it reads or writes the ledger. The executor records a node's start
    /// after the process of one that does not has started, so the two overlap; one that does
    /// starts after what the run decided so far is committed, and sees it.
    fn uses_ledger(&self) -> bool {
        true
    }

    /// Runs the node once. Must return promptly after `ctx.cancel` fires, having stopped
    /// everything it started; the executor decides whether that was a timeout or a cancel.
    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome;
}

/// Everything a running node may use.
pub struct NodeContext<'a> {
    pub node_id: &'a str,
    pub run_id: i64,
    /// The workspace, ledger, artifact store and settings the run was started with.
    pub env: &'a Environment,
    /// The template context: `params`, `nodes`, `run` and `config`.
    pub vars: &'a minijinja::Value,
    pub cancel: CancellationToken,
}

impl NodeContext<'_> {
    /// Renders one templated field, naming the field in the error.
    pub fn render(&self, field: &str, source: &str) -> Result<String, String> {
        self.env
            .templates
            .render_str(source, self.vars)
            .map_err(|e| format!("failed to render `{field}`: {}", describe_error(&e)))
    }

    /// How a process this node starts is captured: by the run's owner, written to the node's
    /// live log as it comes (for `kavi runs logs` while it runs), and seen live by whoever
    /// watches the run's output, with `redactor`'s secrets hidden.
    pub fn capture(
        &self,
        limit: usize,
        redactor: Option<&crate::redact::Redactor>,
    ) -> crate::process::CaptureOptions {
        let mut options = self.env.owner.capture(limit);
        let watcher = self.env.live_output.clone();
        let watched = watcher.is_some();
        let lines = environment::LiveLines {
            node: self.node_id.to_owned(),
            watcher,
            log: environment::LiveLog::new(&self.env.owner, self.run_id, self.node_id),
            redactor: redactor.map(crate::redact::Redactor::line_wise),
            partial: Default::default(),
        };
        options.live = Some(crate::process::LiveOutput {
            chunks: Arc::new(move |stream, chunk| lines.push(stream, chunk)),
            watched,
        });
        options
    }

    /// Renders an optional templated field.
    pub fn render_optional(
        &self,
        field: &str,
        source: Option<&String>,
    ) -> Result<Option<String>, String> {
        source.map(|s| self.render(field, s)).transpose()
    }
}

/// What a node run produced.
#[derive(Debug)]
pub struct NodeOutcome {
    pub state: NodeState,
    pub exit_code: Option<i32>,
    pub outputs: Value,
    /// Artifacts already in the store, by the role they play for this node (`stdout`, ...).
    pub artifacts: Vec<(&'static str, Artifact)>,
    pub error: Option<String>,
}

impl NodeOutcome {
    pub fn succeeded(outputs: Value) -> Self {
        Self {
            state: NodeState::Succeeded,
            exit_code: None,
            outputs,
            artifacts: Vec::new(),
            error: None,
        }
    }

    /// Stopped by the run's cancel token (the executor turns it into a timeout where it was one).
    pub fn cancelled() -> Self {
        Self {
            state: NodeState::Cancelled,
            ..Self::succeeded(Value::Object(Default::default()))
        }
    }

    pub fn failed(error: impl Into<String>) -> Self {
        Self {
            state: NodeState::Failed,
            exit_code: None,
            outputs: Value::Object(Default::default()),
            artifacts: Vec::new(),
            error: Some(error.into()),
        }
    }
}

/// A node's kind-specific TOML fields, handed to the kind's parser with what it needs to check
/// them (templates, the source file for spans).
pub struct NodeConfig<'a> {
    pub(crate) file: &'a Arc<SourceFile>,
    pub(crate) table: Option<Spanned<DeTable<'a>>>,
    /// Where the node is declared (its `[nodes.<id>]` key): errors about the node as a whole,
    /// such as a missing default policy, point here.
    pub span: std::ops::Range<usize>,
    /// The workspace root: policy files are named relative to it.
    pub root: &'a Path,
    pub templates: &'a TemplateEngine,
    /// The pipeline files being loaded, outermost first (see [`crate::spec::LoadContext`]).
    pub including: &'a [PathBuf],
    /// The kinds the pipeline is loaded with; a child pipeline is loaded with the same.
    pub registry: &'a Registry,
    /// Variable paths read by this node's templates, collected for the DAG's reference check.
    pub reads: Vec<(String, std::ops::Range<usize>)>,
    /// Files this node is governed by: policies, templates, the scripts it declares or executes.
    pub governing: GoverningSet,
    /// What command words name on disk, shared by the nodes of one pipeline file.
    pub(crate) named_files: &'a mut NamedFiles,
    /// The node has `for_each`: its templates read `item` too.
    pub(crate) fans_out: bool,
    /// The problems found beside the one the kind's parser returns (see [`Self::refuse`]),
    /// reported with it in the same pass.
    pub(crate) further: Vec<Diagnostic>,
}

impl<'a> NodeConfig<'a> {
    /// Deserializes the kind's fields; unknown fields and type errors point at the TOML, and
    /// every one of them is reported, not only the first.
    pub fn deserialize<T: DeserializeOwned>(&mut self) -> Result<T, Diagnostic> {
        let table = self.table.take().expect("node config is deserialized once");
        let span = table.span();
        match crate::diagnostic::read_table(self.file, span, table.into_inner()) {
            (Some(value), problems) if problems.is_empty() => Ok(value),
            (_, problems) => Err(self.refuse(problems)),
        }
    }

    /// Refuses the node with every one of `problems`, at least one: the first is what the
    /// kind's parser returns, and the others are kept here, so that the loader reports them
    /// all in one pass without each kind's parser returning a list.
    pub fn refuse(&mut self, problems: Vec<Diagnostic>) -> Diagnostic {
        let mut problems = problems.into_iter();
        let first = problems
            .next()
            .unwrap_or_else(|| self.error("the node is refused", self.span.clone()));
        self.further.extend(problems);
        first
    }

    /// Loads the policy file a field names (or `default` when the field is absent), with every
    /// problem of its shape. A policy that cannot be read is reported at the field.
    pub fn load_policy<T: DeserializeOwned>(
        &mut self,
        field: Option<&Spanned<String>>,
        default: &str,
    ) -> Result<Policy<T>, Diagnostic> {
        let source = self.load_policy_source(field, default)?;
        let root = toml::de::DeTable::parse(&source.text)
            .map_err(|e| crate::diagnostic::toml_error(&source, &e))?;
        let span = root.span();
        match crate::diagnostic::read_table(&source, span, root.into_inner()) {
            (Some(value), problems) if problems.is_empty() => Ok(Policy { value, source }),
            (_, problems) => Err(self.refuse(problems)),
        }
    }

    /// The hosts confined processes with the network may reach, from `policies/network.toml`,
    /// given to `policy`'s roles when `needed` (a role the node runs has the network); the file
    /// then governs the node's runs. Without the file, no host.
    pub fn load_process_hosts(
        &mut self,
        policy: crate::confinement::policy::ConfinementPolicy,
        needed: bool,
    ) -> Result<crate::confinement::policy::ConfinementPolicy, Diagnostic> {
        let path = crate::confinement::network::DEFAULT_POLICY;
        if !needed || !self.root.join(path).is_file() {
            return Ok(policy);
        }
        let source = self.load_policy_source(None, path)?;
        policy.with_hosts(Some(&source))
    }

    /// Reads a policy file's text for a kind that parses it itself, recording it as governing.
    pub fn load_policy_source(
        &mut self,
        field: Option<&Spanned<String>>,
        default: &str,
    ) -> Result<Arc<SourceFile>, Diagnostic> {
        let (name, span) = match field {
            Some(field) => (field.get_ref().as_str(), field.span()),
            None => (default, self.span.clone()),
        };
        let source = read(self.root, name)
            .map_err(|message| Diagnostic::new(message).at(self.file, span))?;
        self.governing.add(Role::Policy, Arc::clone(&source));
        Ok(source)
    }

    /// A diagnostic located at `span` in this node's file.
    pub fn error(&self, message: impl Into<String>, span: std::ops::Range<usize>) -> Diagnostic {
        Diagnostic::new(message).at(self.file, span)
    }

    /// Checks the environment a node gives its process: each name must be a variable name (one
    /// with `=` would set another variable: `"PATH=/tmp/evil:"` sets PATH), each value may not
    /// hold NUL, and is a template.
    pub fn check_env(
        &mut self,
        env: &indexmap::IndexMap<Spanned<String>, Spanned<String>>,
    ) -> Result<(), Diagnostic> {
        for name in env.keys() {
            self.check_variable_name(name)?;
        }
        for value in env.values() {
            if value.get_ref().contains('\0') {
                return Err(self.error(
                    "an environment variable's value may not hold a NUL character",
                    value.span(),
                ));
            }
            self.check_template(value)?;
        }
        Ok(())
    }

    /// Refuses, at its place, a name that is not an environment variable name.
    pub fn check_variable_name(&self, name: &Spanned<String>) -> Result<(), Diagnostic> {
        if crate::process::is_variable_name(name.get_ref()) {
            return Ok(());
        }
        let shown = match name.get_ref().as_str() {
            "" => "the empty string".to_owned(),
            name => format!("`{}`", name.escape_debug()),
        };
        Err(self.error(
            format!(
                "{shown} is not an environment variable name (letters, digits, `_`, not \
                 starting with a digit)"
            ),
            name.span(),
        ))
    }

    /// Checks a templated string field, rendered with the node's context, and records what it
    /// reads.
    pub fn check_template(&mut self, field: &Spanned<String>) -> Result<(), Diagnostic> {
        let reads = self
            .templates
            .check_str(field.get_ref())
            .map_err(|e| self.template_error(&e, field.span()))?;
        // Most fields are plain text and read nothing: no scope to build for them (six
        // allocations a field, two fields a node on a plain chain).
        if reads.is_empty() {
            return Ok(());
        }
        if let Some((read, message, help)) = self.scope().unknown(&reads) {
            let help = match read.split('.').next() {
                Some("item") => {
                    "only a node with `for_each` runs once per item, with `item`".into()
                }
                _ => help,
            };
            return Err(self.error(message, field.span()).with_help(help));
        }
        self.record_reads(reads, field.span());
        Ok(())
    }

    /// What this node's templates are rendered with: a node's scope, and `item` when it fans out.
    pub fn scope<'s>(&self) -> Scope<'s> {
        let scope = Scope::node();
        if self.fans_out {
            scope.with("item", None)
        } else {
            scope
        }
    }

    /// Checks a template file under `templates/`, rendered with `scope`, and the templates it
    /// includes, extends or imports by name (rendered with the same values): what one reads that
    /// the scope lacks is reported in that file. Records what they read, and each file as
    /// governing, so that editing an included template is a change of governance too.
    pub fn check_template_file(
        &mut self,
        name: &Spanned<String>,
        scope: &Scope<'_>,
    ) -> Result<(), Diagnostic> {
        let mut pending = vec![name.get_ref().clone()];
        let mut seen = BTreeSet::new();
        while let Some(file) = pending.pop() {
            if !seen.insert(file.clone()) {
                continue;
            }
            let (reads, text) = self
                .templates
                .check_file(&file)
                .map_err(|e| self.template_error(&e, name.span()))?;
            let dir = self.templates.dir();
            let path = dir.strip_prefix(self.root).unwrap_or(dir).join(&file);
            let source = SourceFile::new(path, text);
            if let Some((read, message, help)) = scope.unknown(&reads) {
                let diagnostic = Diagnostic::new(message).with_help(help);
                return Err(match find_read(&source.text, &read) {
                    Some(span) => diagnostic.at(&source, span),
                    None => diagnostic.at(self.file, name.span()),
                });
            }
            pending.extend(crate::template::named_templates(&source.text));
            self.record_reads(reads, name.span());
            self.governing.add(Role::Template, source);
        }
        Ok(())
    }

    /// Records what a command's words make governing: the script it executes, the policies it
    /// names (see [`GoverningSet::add_command`]).
    pub fn govern_command<'w>(&mut self, words: impl IntoIterator<Item = &'w str>) {
        let words: Vec<&str> = words.into_iter().collect();
        self.governing.add_command(self.named_files, &words);
    }

    /// Records a script the node declares in `uses` as governing; `None` when it names no
    /// file of the workspace.
    pub(crate) fn govern_declared(&mut self, path: &str) -> Option<()> {
        let source = self.named_files.lookup(path)?;
        self.governing.add(Role::Script, source);
        Some(())
    }

    fn record_reads(&mut self, reads: BTreeSet<String>, span: std::ops::Range<usize>) {
        self.reads
            .extend(reads.into_iter().map(|path| (path, span.clone())));
    }

    fn template_error(&self, err: &minijinja::Error, span: std::ops::Range<usize>) -> Diagnostic {
        self.error(format!("invalid template: {}", describe_error(err)), span)
    }
}
