//! Skills: small code units built by an external agent, and the lifecycle they move through.
//!
//! A skill starts as a proposal (name, description, schemas, side-effect class, secrets, the
//! command that runs it). Its name is the one source of naming truth: every path the forge uses
//! derives from it, so it may hold no path characters.

pub mod conventions;
pub mod promotion;
pub mod propose;
pub mod registry;
pub mod snapshot;
mod tree;
pub mod trust;

pub use kavi_foundation::side_effect::{SideEffect, SideEffects};

/// The skill lifecycle every skill command and node follows unless told otherwise.
pub const LIFECYCLE_POLICY: &str = "policies/lifecycle.toml";

/// The state a promotion reaches, and the one `kavi skill verify` checks.
pub const TRUSTED: &str = "TRUSTED";

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::policy::roles::{Requirement, Roles};

/// Why a skill name is unusable, if it is: names become paths, so only `[a-z][a-z0-9_]*` (at
/// most 64 characters) is accepted.
pub fn invalid_name_reason(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let valid = name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    (!valid).then(|| {
        format!(
            "invalid skill name `{name}`: use a lowercase letter, then lowercase letters, digits \
             or `_` (at most 64 characters)"
        )
    })
}

/// A skill proposal, as written in a proposal file.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Proposal {
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    pub description: String,
    /// One class, or several (see [`SideEffects`]).
    pub side_effect: SideEffects,
    /// Environment variables holding secrets the skill may read; nothing else reaches it.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub secrets: Vec<Spanned<String>>,
    /// The argv that runs the skill; it reads JSON on stdin and writes JSON on stdout. A file it
    /// names in the workspace lies in the skill's folder (see [`Proposal::check_command`]).
    #[schemars(with = "Vec<String>")]
    pub command: Spanned<Vec<String>>,
    /// For a FILE_WRITE skill: the paths (files or folders, relative to the workspace) it may
    /// write under. Its confinement profile allows writes there and nowhere else.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub writes: Vec<Spanned<String>>,
    pub input_schema: serde_json::Value,
    pub output_schema: serde_json::Value,
    /// What the skill does, as input and the output it must give: the contract a `contract`
    /// gate runs the skill against (see [`Example`]).
    #[serde(default)]
    #[schemars(with = "Vec<Example>")]
    pub examples: Vec<Spanned<Example>>,
}

/// One example of a proposal's contract: run with `input`, in a scratch workspace holding
/// `files`, the skill must print exactly `output`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Example {
    /// Valid against the input schema.
    pub input: serde_json::Value,
    /// Valid against the output schema; the skill's output must equal it.
    pub output: serde_json::Value,
    /// Files (relative path: text) the scratch workspace the example runs in holds, such as a
    /// note a READ_ONLY skill reads.
    #[serde(default)]
    pub files: std::collections::BTreeMap<String, String>,
}

impl Proposal {
    /// Parses and validates a proposal file's text.
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let proposal: Proposal =
            toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
        if let Some(reason) = invalid_name_reason(proposal.name.get_ref()) {
            return Err(Diagnostic::new(reason).at(source, proposal.name.span()));
        }
        if proposal.command.get_ref().is_empty() {
            return Err(
                Diagnostic::new("`command` needs at least the program to run")
                    .at(source, proposal.command.span()),
            );
        }
        for (field, schema) in [
            ("input_schema", &proposal.input_schema),
            ("output_schema", &proposal.output_schema),
        ] {
            if !schema.is_object() {
                return Err(Diagnostic::new(format!(
                    "`{field}` must be a table (a JSON Schema object)"
                ))
                .with_help(format!("in {}", source.path.display())));
            }
            if let Err(e) = jsonschema::validator_for(schema) {
                return Err(
                    Diagnostic::new(format!("`{field}` is not a valid JSON Schema: {e}"))
                        .with_help(format!("in {}", source.path.display())),
                );
            }
        }
        for (n, example) in proposal.examples.iter().enumerate() {
            let checks = [
                ("input", &proposal.input_schema, &example.get_ref().input),
                ("output", &proposal.output_schema, &example.get_ref().output),
            ];
            for (what, schema, value) in checks {
                if let Err(e) = crate::json_schema::validate(schema, value, what) {
                    return Err(Diagnostic::new(format!("example {}: {e}", n + 1))
                        .at(source, example.span()));
                }
            }
            for path in example.get_ref().files.keys() {
                if let Some(reason) = crate::sandbox::unsafe_path_reason(path) {
                    return Err(Diagnostic::new(format!(
                        "example {}: file `{path}`: {reason}; an example's files are named \
                         relative to its scratch workspace",
                        n + 1
                    ))
                    .at(source, example.span()));
                }
            }
        }
        for secret in &proposal.secrets {
            if !crate::process::is_variable_name(secret.get_ref()) {
                return Err(Diagnostic::new(format!(
                    "secret `{}` is not an environment variable name (letters, digits, `_`, not \
                     starting with a digit)",
                    secret.get_ref()
                ))
                .at(source, secret.span()));
            }
        }
        if !proposal.secrets.is_empty() && !proposal.side_effect.contains(SideEffect::SecretRead) {
            return Err(Diagnostic::new(format!(
                "`secrets` is for SECRET_READ skills; this one is {}",
                proposal.side_effect
            ))
            .with_help(
                "add SECRET_READ to its classes, as in `side_effect = [\"NETWORK\", \"SECRET_READ\"]`",
            )
            .at(source, proposal.name.span()));
        }
        for write in &proposal.writes {
            if !proposal.side_effect.contains(SideEffect::FileWrite) {
                return Err(Diagnostic::new(format!(
                    "`writes` is for FILE_WRITE skills; this one is {}",
                    proposal.side_effect
                ))
                .at(source, write.span()));
            }
            if let Some(refused) = write_scope_refusal(None, write.get_ref()) {
                return Err(refused.at(source, write.span()));
            }
        }
        Ok(proposal)
    }

    /// Refuses a `writes` entry that passes through a symlink in the workspace at `root`, on
    /// top of what [`Proposal::parse`] refuses: the link's target is not the scope reviewed.
    pub fn check_writes(
        &self,
        source: &Arc<SourceFile>,
        root: &std::path::Path,
    ) -> Result<(), Diagnostic> {
        for write in &self.writes {
            if let Some(refused) = write_scope_refusal(Some(root), write.get_ref()) {
                return Err(refused.at(source, write.span()));
            }
        }
        Ok(())
    }

    /// Refuses a `command` that would run a workspace file outside the skill's folder (relative
    /// to `root`): trust vouches for that folder and the proposal, and nothing else.
    ///
    /// The program is a bare name (found on PATH) or a path inside the folder. Any argument that
    /// looks like a path (it holds a `/`, or names something in the workspace root), and the
    /// value of a `--flag=value`, must lie inside the folder too. What an interpreter finds by
    /// its own lookup (`python3 -m package`) is beyond this check.
    pub fn check_command(
        &self,
        source: &Arc<SourceFile>,
        root: &std::path::Path,
        folder: &str,
    ) -> Result<(), Diagnostic> {
        if let Some(reason) = untrusted_program(self.command.get_ref(), folder) {
            return Err(Diagnostic::new(format!(
                "`command` may run bytes trust cannot vouch for: {reason}"
            ))
            .at(source, self.command.span())
            .with_help(format!(
                "a skill's command runs a file of its folder (`{folder}`), itself or as the \
                 script of a Python interpreter named bare (`python3`; kavi adds -I -B, and only \
                 options such as -u or -O that load no code may come before the script); \
                 arguments after the script are the script's own"
            )));
        }
        for (i, arg) in self.command.get_ref().iter().enumerate() {
            let Some(value) = path_value(i, arg) else {
                continue;
            };
            let looks_like_path = (value.contains('/') && !value.contains("://"))
                || (i > 0 && !value.is_empty() && root.join(value).symlink_metadata().is_ok());
            if !looks_like_path {
                continue;
            }
            let reason = if value.starts_with('/') {
                Some("it is absolute")
            } else if let Some(reason) = crate::sandbox::unsafe_path_reason(value) {
                Some(reason)
            } else if !std::path::Path::new(value).starts_with(folder) {
                Some("it lies outside the skill's folder")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(Diagnostic::new(format!(
                    "`command` names `{value}`, which trust cannot vouch for: {reason} \
                     (`{folder}`)"
                ))
                .at(source, self.command.span())
                .with_help(
                    "trust covers the skill's folder and its proposal alone: put the files the \
                     skill runs in its folder, and name programs bare, as found on PATH",
                ));
            }
        }
        Ok(())
    }

    /// The command with every argument that names something in the skill's `folder` (a path
    /// relative to the workspace) pointed into `base` instead: how a trusted version runs from
    /// its kept files while a newer version occupies the folder.
    pub fn command_under(&self, folder: &str, base: &std::path::Path) -> Vec<String> {
        let command = self.command.get_ref();
        command
            .iter()
            .enumerate()
            .map(|(i, arg)| match path_value(i, arg) {
                Some(value) if std::path::Path::new(value).starts_with(folder) => {
                    let prefix = &arg[..arg.len() - value.len()];
                    format!("{prefix}{}", base.join(value).display())
                }
                _ => arg.clone(),
            })
            .collect()
    }

    /// The paths a FILE_WRITE skill may write under, relative to the workspace.
    pub fn write_paths(&self) -> Vec<String> {
        self.writes.iter().map(|w| w.get_ref().clone()).collect()
    }
}

/// The workspace's top-level entries that hold kavi's state, its governance or the skills
/// themselves, with what each holds. A skill's `writes` may not equal, contain or lie under one:
/// a skill that could write them could rewrite its own rules, the ledger, or another skill.
const RESERVED: &[(&str, &str)] = &[
    (".kavi", "the ledger, artifacts and registry"),
    (".git", "the repository"),
    ("kavi.toml", "the workspace configuration"),
    ("policies", "the policies that govern every run"),
    ("pipelines", "the pipelines"),
    ("chains", "the chains"),
    ("templates", "the templates"),
    ("proposals", "the skill proposals"),
    ("skills", "the skills' trusted files"),
];

/// Why the `writes` entry `path` is refused, if it is: a path that is not a plain relative one
/// inside the workspace, one that names what [`RESERVED`] lists or another hidden entry at the
/// workspace root (tool configuration such as `.python-version` or `.envrc` lives there), or,
/// given the workspace `root`, one that passes through a symlink. The diagnostic says what was
/// probably meant.
pub fn write_scope_refusal(root: Option<&std::path::Path>, path: &str) -> Option<Diagnostic> {
    let refused =
        |reason: String| Diagnostic::new(format!("`writes` path `{path}` is refused: {reason}"));
    let data = "name the folder of the data the skill writes, relative to the workspace, such as \
                `notes` or `out/reports`";
    if let Some(reason) = crate::sandbox::unsafe_path_reason(path) {
        let help = match path.trim_start_matches('/').trim_end_matches('/') {
            plain if !plain.is_empty() && crate::sandbox::unsafe_path_reason(plain).is_none() => {
                format!(
                    "write it as `{plain}`, relative to the workspace, without leading or trailing `/`"
                )
            }
            _ => data.to_owned(),
        };
        return Some(refused(reason.to_owned()).with_help(help));
    }
    let top = path.split('/').next().unwrap_or(path);
    if let Some((name, holds)) = RESERVED.iter().find(|(name, _)| *name == top) {
        let help = if *name == "skills" {
            "a skill's files change only through the forge (propose, build, verify, promote); \
             for data the skill produces, name a folder of its own, such as `notes`"
                .to_owned()
        } else {
            format!(
                "kavi's own state changes only through kavi's commands and a person's review; {data}"
            )
        };
        return Some(
            refused(format!("`{name}` holds {holds}, which no skill may write")).with_help(help),
        );
    }
    if top.starts_with('.') {
        return Some(
            refused(format!(
                "`{top}` is hidden at the workspace root, where tools read their configuration"
            ))
            .with_help(data),
        );
    }
    let root = root?;
    let mut walked = root.to_path_buf();
    for part in path.split('/') {
        walked.push(part);
        match walked.symlink_metadata() {
            Ok(meta) if meta.file_type().is_symlink() => {
                let shown = walked
                    .strip_prefix(root)
                    .unwrap_or(&walked)
                    .display()
                    .to_string();
                return Some(
                    refused(format!(
                        "`{shown}` is a symlink, and a scope is never followed out of itself"
                    ))
                    .with_help(format!(
                        "replace the link `{shown}` with a real folder, or name the folder it \
                         points to if that lies in the workspace"
                    )),
                );
            }
            Ok(_) => {}
            // Nothing further exists, so nothing further is a link yet; the run makes it.
            Err(_) => break,
        }
    }
    None
}

/// The part of the command's `i`th argument that may name a file: the program, a plain
/// argument, or the value of a `--flag=value`; none for a bare flag.
/// Whether `name` (a program's file name) is a Python interpreter: `python`, `python3`,
/// `python3.X`.
pub fn is_python(name: &str) -> bool {
    name.strip_prefix("python")
        .is_some_and(|version| version.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// Why `command` could run bytes other than the skill's own, if it could. Only two shapes run
/// nothing else: a file of the skill's `folder` run itself, and a Python interpreter running
/// one. Any other program's arguments are its to interpret (`env LD_PRELOAD=...`, `sh -c`,
/// `python3 -c`, `-X pycache_prefix=...`), and could load code from anywhere the run can read.
pub fn untrusted_program(command: &[String], folder: &str) -> Option<String> {
    let program = command.first()?;
    let in_folder = |arg: &str| std::path::Path::new(arg).starts_with(folder);
    if in_folder(program) {
        return None;
    }
    if !is_python(program) {
        return Some(format!(
            "`{program}` is not a file of the skill's folder nor a Python interpreter running \
             one, and its arguments could make it load code from anywhere"
        ));
    }
    // Options that change how the script runs, never what code it loads (`-W` imports the
    // warning category it names, `-X`, `-c` and `-m` load code of their own).
    const HARMLESS: [&str; 10] = ["-u", "-O", "-OO", "-q", "-b", "-bb", "-E", "-s", "-S", "-P"];
    let mut rest = command[1..].iter();
    loop {
        match rest.next() {
            None => return None,
            Some(option) if HARMLESS.contains(&option.as_str()) => {}
            Some(script) if in_folder(script) => return None,
            Some(option) if option.starts_with('-') => {
                return Some(format!(
                    "`{option}` is an interpreter option that could load code from outside the \
                     skill's folder"
                ));
            }
            Some(other) => {
                return Some(format!("`{other}` is not a script in the skill's folder"));
            }
        }
    }
}

fn path_value(i: usize, arg: &str) -> Option<&str> {
    match (i, arg.split_once('=')) {
        (0, _) => Some(arg),
        (_, Some((flag, value))) if flag.starts_with('-') => Some(value),
        (_, None) if arg.starts_with('-') => None,
        _ => Some(arg),
    }
}

impl Proposal {
    /// The proposal a skill was recorded from: its SKILL_SPEC artifact, parsed again.
    pub fn from_artifact(
        store: &crate::ledger::ArtifactStore,
        sha256: &str,
    ) -> Result<Self, String> {
        let text = store
            .read_text(sha256)
            .map_err(|e| format!("the stored skill spec: {e}"))?;
        let path = store.path_of_sha256(sha256);
        Proposal::parse(&SourceFile::new(path.display().to_string(), text))
            .map_err(|d| d.to_string())
    }
}

/// `policies/lifecycle.toml`, as written.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLifecycle {
    #[schemars(with = "String")]
    initial: Spanned<String>,
    #[schemars(with = "Vec<String>")]
    states: Vec<Spanned<String>>,
    #[schemars(with = "Vec<String>")]
    buildable: Vec<Spanned<String>>,
    /// Where re-verification moves a trusted skill whose files changed.
    #[schemars(with = "Option<String>")]
    drifted: Option<Spanned<String>>,
    /// Where `kavi skill revoke` moves a skill.
    #[schemars(with = "Option<String>")]
    revoked: Option<Spanned<String>>,
    /// Where `kavi reject` moves the skill of a rejected run.
    #[schemars(with = "Option<String>")]
    rejected: Option<Spanned<String>>,
    /// States a skill may stay in for good: not dead ends.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    terminal: Vec<Spanned<String>>,
    #[serde(rename = "transition", default)]
    transitions: Vec<RawTransition>,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawTransition {
    #[schemars(with = "String")]
    from: Spanned<String>,
    #[schemars(with = "String")]
    to: Spanned<String>,
    /// `true` (one approval), or `{ approvals = N }`: N accounts other than the run's starter.
    #[schemars(with = "Option<RawApproval>")]
    approval: Option<Spanned<RawApproval>>,
    #[expect(dead_code, reason = "documentation for people reading the policy")]
    description: Option<String>,
}

/// A transition's `approval`, as written.
#[derive(Debug, Clone, schemars::JsonSchema)]
#[serde(untagged)]
enum RawApproval {
    Flag(bool),
    Requirement(Requirement),
}

/// By hand, so that a requirement's own error (a missing `role`, say) is the one reported,
/// where an untagged enum only says that no form matched.
impl<'de> Deserialize<'de> for RawApproval {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(deserializer)? {
            toml::Value::Boolean(flag) => Ok(Self::Flag(flag)),
            table @ toml::Value::Table(_) => Requirement::deserialize(table)
                .map(Self::Requirement)
                .map_err(|e| D::Error::custom(format!("`approval`: {}", e.message()))),
            _ => Err(D::Error::custom(
                "`approval` is `true`, or the approvals a role gives, as \
                 `{ role = \"reviewer\", approvals = 2 }`",
            )),
        }
    }
}

/// What a move needs before it is made. `approval = true` is one recorded approval, which the
/// starter may give unless the escalation rules forbid it (`self_approval`);
/// `{ role = "reviewer", approvals = 2 }` needs that many distinct accounts holding the role in
/// `policies/roles.toml`, never the run's starter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    Recorded,
    Roles(Requirement),
}

impl std::fmt::Display for Approval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Recorded => write!(f, "a recorded approval"),
            Self::Roles(Requirement { role, approvals: 1 }) => write!(
                f,
                "an approval by an account holding `{role}` other than the run's starter"
            ),
            Self::Roles(Requirement { role, approvals }) => write!(
                f,
                "{approvals} approvals by distinct accounts holding `{role}` other than the \
                 run's starter"
            ),
        }
    }
}

/// The lifecycle state machine: which moves are allowed, and which need an approval.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    pub initial: String,
    pub states: Vec<String>,
    pub buildable: Vec<String>,
    /// Where re-verification moves a trusted skill whose files changed (such as SUSPENDED).
    pub drifted: Option<String>,
    /// Where `kavi skill revoke` moves a skill (such as REVOKED).
    pub revoked: Option<String>,
    /// Where `kavi reject` moves the skill of a rejected run (such as REJECTED).
    pub rejected: Option<String>,
    /// States a skill may stay in for good.
    pub terminal: Vec<String>,
    /// (from, to, what it needs before it is made)
    transitions: Vec<(String, String, Option<Approval>)>,
    pub source: Arc<SourceFile>,
    /// The file as written, for diagnostics that point into it.
    declared: RawLifecycle,
}

impl Lifecycle {
    /// Parses and checks a lifecycle policy: every state it names must be declared, and it may
    /// have none of [`Lifecycle::problems`].
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let lifecycle = Self::parse_declared(source)?;
        match lifecycle.problems().into_iter().next() {
            Some(problem) => Err(problem),
            None => Ok(lifecycle),
        }
    }

    /// Parses a lifecycle policy without looking for its problems: for `kavi policy check`,
    /// which lists them all.
    pub fn parse_declared(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let raw: RawLifecycle =
            toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
        let states: Vec<String> = raw.states.iter().map(|s| s.get_ref().clone()).collect();
        let known = |state: &Spanned<String>| -> Result<String, Diagnostic> {
            if states.contains(state.get_ref()) {
                Ok(state.get_ref().clone())
            } else {
                Err(Diagnostic::new(format!(
                    "`{}` is not one of the declared states",
                    state.get_ref()
                ))
                .at(source, state.span())
                .with_help(format!("declared states: {}", states.join(", "))))
            }
        };
        let initial = known(&raw.initial)?;
        let buildable = raw.buildable.iter().map(known).collect::<Result<_, _>>()?;
        let drifted = raw.drifted.as_ref().map(known).transpose()?;
        let revoked = raw.revoked.as_ref().map(known).transpose()?;
        let rejected = raw.rejected.as_ref().map(known).transpose()?;
        let terminal = raw.terminal.iter().map(known).collect::<Result<_, _>>()?;
        let mut transitions = Vec::new();
        for t in &raw.transitions {
            let approval = match t.approval.as_ref().map(Spanned::get_ref) {
                None | Some(RawApproval::Flag(false)) => None,
                Some(RawApproval::Flag(true)) => Some(Approval::Recorded),
                Some(RawApproval::Requirement(requirement)) => {
                    Some(Approval::Roles(requirement.clone()))
                }
            };
            transitions.push((known(&t.from)?, known(&t.to)?, approval));
        }
        Ok(Self {
            initial,
            states,
            buildable,
            drifted,
            revoked,
            rejected,
            terminal,
            transitions,
            source: Arc::clone(source),
            declared: raw,
        })
    }

    /// Whether any transition leads to `state`.
    pub fn has_way_into(&self, state: &str) -> bool {
        self.transitions.iter().any(|(_, to, _)| to == state)
    }

    /// Everything that keeps the forge and kavi's commands from carrying this lifecycle out, each
    /// pointing into the file: TRUSTED undeclared; a state no chain of transitions reaches from
    /// `initial`; a state from which none reaches TRUSTED (unless it is `terminal`); a state
    /// both buildable and terminal; a buildable state no transition leads to; a move kavi makes
    /// without a person (revoke, drift, restore, reject) that is missing or needs an approval.
    pub fn problems(&self) -> Vec<Diagnostic> {
        let at = |message: String, span: std::ops::Range<usize>| {
            Diagnostic::new(message).at(&self.source, span)
        };
        let mut found = Vec::new();
        if !self.states.iter().any(|s| s == TRUSTED) {
            found.push(
                at(
                    format!(
                        "the lifecycle declares no {TRUSTED} state, the state whose skills run"
                    ),
                    self.declared.initial.span(),
                )
                .with_help(format!("add \"{TRUSTED}\" to `states`")),
            );
            return found;
        }
        let reached = self.closure(&self.initial, false);
        let reaches = self.closure(TRUSTED, true);
        for state in &self.declared.states {
            let name = state.get_ref();
            if !reached.contains(name) {
                found.push(
                    at(
                        format!(
                            "`{name}` is unreachable: no chain of transitions leads to it from \
                             `initial` ({})",
                            self.initial
                        ),
                        state.span(),
                    )
                    .with_help("add a [[transition]] into it, or remove it from `states`"),
                );
            }
            if !reaches.contains(name) && !self.terminal.contains(name) {
                found.push(
                    at(
                        format!(
                            "`{name}` is a dead end: no chain of transitions leads from it to {TRUSTED}"
                        ),
                        state.span(),
                    )
                    .with_help(
                        "add a [[transition]] out of it, or list it in `terminal` if a skill may \
                         stay there for good",
                    ),
                );
            }
        }
        for state in &self.declared.buildable {
            let name = state.get_ref();
            if self.terminal.contains(name) {
                found.push(
                    at(
                        format!(
                            "`{name}` is both buildable and terminal: a build would overwrite a \
                             skill that is meant to stay {name} for good"
                        ),
                        state.span(),
                    )
                    .with_help("remove it from `buildable` or from `terminal`"),
                );
            }
            if name != &self.initial && !self.has_way_into(name) {
                found.push(at(
                    format!("buildable state `{name}` has no way in: no transition leads to it"),
                    state.span(),
                ));
            }
        }
        // The moves kavi's commands make without a person, each declared by the key that
        // names its state: they must exist, and no approval can be given for them.
        let mut unattended: Vec<(&str, String, String, std::ops::Range<usize>)> = Vec::new();
        if let (Some(drifted), Some(key)) = (&self.drifted, &self.declared.drifted) {
            for (from, to, by) in [
                (TRUSTED, drifted.as_str(), "`kavi skill verify` (on drift)"),
                (drifted.as_str(), TRUSTED, "`kavi skill restore`"),
            ] {
                unattended.push((by, from.to_owned(), to.to_owned(), key.span()));
            }
        }
        if let (Some(revoked), Some(key)) = (&self.revoked, &self.declared.revoked) {
            for from in std::iter::once(TRUSTED).chain(self.drifted.as_deref()) {
                let by = "`kavi skill revoke`";
                unattended.push((by, from.to_owned(), revoked.clone(), key.span()));
            }
        }
        if let (Some(rejected), Some(key)) = (&self.rejected, &self.declared.rejected) {
            // A run may stop for review with its skill in any state but these.
            for from in self
                .states
                .iter()
                .filter(|s| *s != TRUSTED && *s != rejected && !self.terminal.contains(s))
            {
                let by = "`kavi reject`";
                unattended.push((by, from.clone(), rejected.clone(), key.span()));
            }
        }
        for (by, from, to, key) in unattended {
            match self.declared_move(&from, &to) {
                None => found.push(
                    at(
                        format!("no transition {from} -> {to} is declared: {by} makes that move"),
                        key,
                    )
                    .with_help(format!(
                        "add [[transition]] from = \"{from}\" to = \"{to}\", without `approval`"
                    )),
                ),
                Some(Some((approval, span))) => found.push(
                    at(
                        format!(
                            "the transition {from} -> {to} needs {approval}, but {by} makes it \
                             without stopping for one: it could never happen"
                        ),
                        span,
                    )
                    .with_help("remove its `approval`"),
                ),
                Some(None) => {}
            }
        }
        found
    }

    /// The approvals no one could give, given the workspace's roles (`None`: it has no roles
    /// file): a role that is not declared, `approvals = 0`, or more approvals than the role has
    /// members when its members are all named accounts. Each points at its `approval`.
    pub fn role_problems(&self, roles: Option<&Roles>) -> Vec<Diagnostic> {
        let mut found = Vec::new();
        for ((from, to, approval), declared) in
            self.transitions.iter().zip(&self.declared.transitions)
        {
            let (Some(Approval::Roles(requirement)), Some(written)) =
                (approval, &declared.approval)
            else {
                continue;
            };
            let span = written.span();
            let refused = |reason: String| {
                Diagnostic::new(format!(
                    "no one can give the approval {from} -> {to} needs: {reason}"
                ))
                .at(&self.source, span.clone())
            };
            let Some(roles) = roles else {
                found.push(refused(format!(
                    "role `{}` is named, but the workspace has no {}",
                    requirement.role,
                    crate::policy::roles::DEFAULT_POLICY
                )));
                continue;
            };
            if let Err(problem) = roles.check(requirement, &self.source, span.clone()) {
                found.push(problem);
                continue;
            }
            if let Some(members) = roles.named_members(&requirement.role)
                && members < requirement.approvals as usize
            {
                found.push(refused(format!(
                    "role `{}` has {members} named members, fewer than the {} approvals needed",
                    requirement.role, requirement.approvals
                )));
            }
        }
        found
    }

    /// The declared move `from -> to`, if any, with the approval it needs and where that is
    /// written.
    fn declared_move(
        &self,
        from: &str,
        to: &str,
    ) -> Option<Option<(&Approval, std::ops::Range<usize>)>> {
        let i = self
            .transitions
            .iter()
            .position(|(f, t, _)| f == from && t == to)?;
        let written = self.declared.transitions[i].approval.as_ref();
        Some(
            self.transitions[i]
                .2
                .as_ref()
                .zip(written.map(Spanned::span)),
        )
    }

    /// The states reached from `start` by following transitions (`backwards`: the states
    /// from which `start` is reached).
    fn closure(&self, start: &str, backwards: bool) -> Vec<String> {
        let mut seen = vec![start.to_owned()];
        let mut grew = true;
        while grew {
            grew = false;
            for (from, to, _) in &self.transitions {
                let (from, to) = if backwards { (to, from) } else { (from, to) };
                if seen.contains(from) && !seen.contains(to) {
                    seen.push(to.clone());
                    grew = true;
                }
            }
        }
        seen
    }

    /// The next move of a verified skill in state `from` toward TRUSTED, and what it needs: the
    /// first of the shortest chain of transitions to TRUSTED that passes through no buildable,
    /// terminal, drifted, revoked or rejected state (a promotion never rebuilds, nor leaves the
    /// way to trust), from a state that is none of these either: a buildable skill (BUILT, say)
    /// has no such way, since the gates, not a promotion, earn the verified state. `promote` and
    /// `kavi approve` walk it one move at a time.
    pub fn toward_trusted(&self, from: &str) -> Option<(String, Option<Approval>)> {
        let passable = |state: &String| {
            state == TRUSTED
                || !(self.buildable.contains(state)
                    || self.terminal.contains(state)
                    || [&self.drifted, &self.revoked, &self.rejected]
                        .iter()
                        .any(|key| key.as_ref() == Some(state)))
        };
        // Distances to TRUSTED, walking backwards through passable states.
        let mut distance: Vec<(String, usize)> = vec![(TRUSTED.to_owned(), 0)];
        let mut frontier = vec![TRUSTED.to_owned()];
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for (f, t, _) in &self.transitions {
                if frontier.contains(t) && !distance.iter().any(|(s, _)| s == f) && passable(f) {
                    let d = distance
                        .iter()
                        .find(|(s, _)| s == t)
                        .map_or(0, |(_, d)| d + 1);
                    distance.push((f.clone(), d));
                    next.push(f.clone());
                }
            }
            frontier = next;
        }
        let here = distance.iter().find(|(s, _)| s == from)?.1;
        self.transitions
            .iter()
            .find(|(f, t, _)| f == from && distance.iter().any(|(s, d)| s == t && *d + 1 == here))
            .map(|(_, t, approval)| (t.clone(), approval.clone()))
    }

    /// Whether a skill left in `state` on the way to TRUSTED (its promotion refused) is built
    /// again: the lifecycle declares a move from it back to a buildable state, which a new
    /// build makes. A skill that awaits a person's decision there is held by the escalation.
    pub fn rebuilds(&self, state: &str) -> bool {
        self.toward_trusted(state).is_some()
            && self.transitions.iter().any(|(f, t, approval)| {
                f == state && approval.is_none() && self.buildable.contains(t)
            })
    }

    /// What the move needs before it is made, if it is declared with an `approval`.
    pub fn needs_approval(&self, from: &str, to: &str) -> Option<&Approval> {
        self.transitions
            .iter()
            .find(|(f, t, _)| f == from && t == to)
            .and_then(|(_, _, approval)| approval.as_ref())
    }

    /// Whether any move needs approvals by a role.
    pub fn has_role_approvals(&self) -> bool {
        self.transitions
            .iter()
            .any(|(_, _, approval)| matches!(approval, Some(Approval::Roles(_))))
    }

    /// Whether any move needs an approval.
    pub fn has_approvals(&self) -> bool {
        self.transitions
            .iter()
            .any(|(_, _, approval)| approval.is_some())
    }

    /// Checks a move that a person approved: declared, approval or not.
    pub fn check_approved(&self, from: &str, to: &str) -> Result<(), String> {
        if self.needs_approval(from, to).is_some() {
            Ok(())
        } else {
            self.check(from, to)
        }
    }

    /// Checks a move; the error says what is allowed instead.
    pub fn check(&self, from: &str, to: &str) -> Result<(), String> {
        match self
            .transitions
            .iter()
            .find(|(f, t, _)| f == from && t == to)
        {
            Some((_, _, None)) => Ok(()),
            Some((_, _, Some(approval))) => Err(format!(
                "the transition {from} -> {to} needs {approval} ({})",
                self.source.path.display()
            )),
            None => {
                let allowed: Vec<&str> = self
                    .transitions
                    .iter()
                    .filter(|(f, _, _)| f == from)
                    .map(|(_, t, _)| t.as_str())
                    .collect();
                let instead = if allowed.is_empty() {
                    format!("no transition leaves {from}")
                } else {
                    format!("from {from} it allows: {}", allowed.join(", "))
                };
                Err(format!(
                    "the transition {from} -> {to} is not allowed by {} ({instead})",
                    self.source.path.display()
                ))
            }
        }
    }
}

/// Why `skill` may not be built now, if it may not: its state is not buildable, or a person's
/// review of it is pending or ended in a rejection. The forge asks before each attempt.
pub fn build_refusal(
    ledger: &crate::ledger::Ledger,
    lifecycle: &Lifecycle,
    skill: &str,
) -> Result<Option<String>, crate::ledger::LedgerError> {
    let row = ledger.skill(skill)?;
    let state = row.state;
    let not_buildable = (!lifecycle.buildable.contains(&state) && !lifecycle.rebuilds(&state))
        .then(|| {
            format!(
                "`{skill}` is {state}, which is not buildable (buildable: {})",
                lifecycle.buildable.join(", ")
            )
        });
    // A person's pending or negative decision says more than the state it left the skill in.
    // A decision about an older version (one rejected, say) does not bind a newer one.
    let Some(escalation) = ledger
        .latest_escalation(skill)?
        .filter(|e| e.raised_at >= row.version_proposed_at)
    else {
        return Ok(not_buildable);
    };
    Ok(match escalation.status.as_str() {
        "pending" => Some(format!(
            "`{skill}` awaits review since run {run}; decide with `kavi approve {run}` or `kavi reject {run}`",
            run = ledger.root_run(escalation.run_id)?.id
        )),
        "rejected" => Some(format!(
            "`{skill}` was rejected in review of run {} by {}{}; it is not built again",
            ledger.root_run(escalation.run_id)?.id,
            escalation.decided_by.as_deref().unwrap_or("unknown"),
            escalation
                .comment
                .as_deref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default()
        )),
        _ => not_buildable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_runs_only_a_file_of_the_skill_folder() {
        let refused = |argv: &[&str]| {
            let argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
            untrusted_program(&argv, "skills/demo")
        };
        for fine in [
            &["python3", "skills/demo/skill.py"][..],
            &[
                "python3.11",
                "-u",
                "-O",
                "skills/demo/skill.py",
                "-X",
                "whatever",
            ],
            &["skills/demo/run"],
            &["python3"],
        ] {
            assert_eq!(refused(fine), None, "{fine:?}");
        }
        for (bad, says) in [
            (
                &[
                    "python3",
                    "-X",
                    "pycache_prefix=pyc",
                    "skills/demo/skill.py",
                ][..],
                "`-X`",
            ),
            (&["python3", "-c", "print(1)"], "`-c`"),
            (&["python3", "-uX", "skills/demo/skill.py"], "`-uX`"),
            (
                &["python3", "helpers/x.py"],
                "`helpers/x.py` is not a script",
            ),
            (
                &["env", "LD_PRELOAD=x.so", "python3", "skills/demo/skill.py"],
                "`env`",
            ),
            (&["sh", "skills/demo/run.sh"], "`sh`"),
            (&["python3-config"], "`python3-config`"),
        ] {
            let reason = refused(bad).unwrap_or_else(|| panic!("{bad:?} was allowed"));
            assert!(reason.contains(says), "{bad:?}: {reason}");
        }
    }

    #[test]
    fn names_that_could_be_paths_are_refused() {
        assert_eq!(invalid_name_reason("write_note"), None);
        for bad in [
            "../x",
            "a/b",
            "Note",
            "",
            "1abc",
            "a-b",
            "a.b",
            &"a".repeat(65),
        ] {
            assert!(invalid_name_reason(bad).is_some(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_kept_version_runs_its_own_files_and_nothing_else_is_rewritten() {
        let text = r#"
name = "demo"
description = "d"
side_effect = "READ_ONLY"
command = ["python3", "-u", "skills/demo/run.py", "--config=skills/demo/c.json", "--mode=fast", "skills/demo2/x"]
input_schema = { type = "object" }
output_schema = { type = "object" }
"#;
        let proposal = Proposal::parse(&SourceFile::new("proposals/demo.toml", text)).unwrap();
        let base = std::path::Path::new("/tmp/kept");
        assert_eq!(
            proposal.command_under("skills/demo", base),
            [
                "python3",
                "-u",
                "/tmp/kept/skills/demo/run.py",
                "--config=/tmp/kept/skills/demo/c.json",
                "--mode=fast",
                "skills/demo2/x",
            ]
        );
    }

    #[test]
    fn terminal_states_are_not_dead_ends_and_drift_needs_its_transition() {
        let lifecycle = |text: &str| {
            Lifecycle::parse_declared(&SourceFile::new("policies/lifecycle.toml", text)).unwrap()
        };
        let base = "initial = \"P\"\nstates = [\"P\", \"TRUSTED\", \"GONE\", \"S\"]\nbuildable = [\"P\"]\n\
                    drifted = \"S\"\n[[transition]]\nfrom = \"P\"\nto = \"TRUSTED\"\n\
                    [[transition]]\nfrom = \"TRUSTED\"\nto = \"GONE\"\n";
        let found: Vec<String> = lifecycle(base)
            .problems()
            .iter()
            .map(|d| d.message.clone())
            .collect();
        assert_eq!(
            found,
            [
                "`GONE` is a dead end: no chain of transitions leads from it to TRUSTED",
                "`S` is unreachable: no chain of transitions leads to it from `initial` (P)",
                "`S` is a dead end: no chain of transitions leads from it to TRUSTED",
                "no transition TRUSTED -> S is declared: `kavi skill verify` (on drift) makes that move",
                "no transition S -> TRUSTED is declared: `kavi skill restore` makes that move",
            ]
        );
        let fixed = format!(
            "terminal = [\"GONE\"]\n{base}[[transition]]\nfrom = \"TRUSTED\"\nto = \"S\"\n\
             [[transition]]\nfrom = \"S\"\nto = \"TRUSTED\"\n"
        );
        assert!(lifecycle(&fixed).problems().is_empty());
    }

    /// Each lifecycle issue 53 found the forge could not carry out, refused with its reason.
    #[test]
    fn a_lifecycle_kavi_cannot_carry_out_is_refused_with_the_reason() {
        let shipped = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/policies/lifecycle.toml"
        ))
        .unwrap();
        let roles = Roles::parse(&SourceFile::new(
            crate::policy::roles::DEFAULT_POLICY,
            "[role.reviewer]\nmembers = [\"*\"]\n[role.pair]\nmembers = [\"alice\"]\n",
        ))
        .unwrap();
        let problems = |text: &str| -> Vec<String> {
            match Lifecycle::parse_declared(&SourceFile::new("policies/lifecycle.toml", text)) {
                Ok(lifecycle) => [lifecycle.problems(), lifecycle.role_problems(Some(&roles))]
                    .concat()
                    .iter()
                    .map(|d| d.message.clone())
                    .collect(),
                Err(refused) => vec![refused.message],
            }
        };
        assert!(problems(&shipped).is_empty(), "{:?}", problems(&shipped));
        let gated = |from: &str, to: &str, approval: &str| {
            let block = format!("from = \"{from}\"\nto = \"{to}\"\n");
            assert!(shipped.contains(&block), "{block}");
            shipped.replacen(&block, &format!("{block}approval = {approval}\n"), 1)
        };
        for (text, reason) in [
            (
                gated("TRUSTED", "REVOKED", "true"),
                "the transition TRUSTED -> REVOKED needs a recorded approval, but `kavi skill \
                 revoke` makes it without stopping for one: it could never happen",
            ),
            (
                gated(
                    "SUSPENDED",
                    "TRUSTED",
                    "{ role = \"reviewer\", approvals = 2 }",
                ),
                "the transition SUSPENDED -> TRUSTED needs 2 approvals by distinct accounts \
                 holding `reviewer` other than the run's starter, but `kavi skill restore` makes \
                 it without stopping for one: it could never happen",
            ),
            (
                gated("VERIFIED", "REJECTED", "true"),
                "the transition VERIFIED -> REJECTED needs a recorded approval, but `kavi reject` \
                 makes it without stopping for one: it could never happen",
            ),
            (
                gated(
                    "VERIFIED",
                    "TRUSTED",
                    "{ role = \"auditor\", approvals = 1 }",
                ),
                "role `auditor` is not declared in policies/roles.toml: known: `pair`, `reviewer`",
            ),
            (
                gated("VERIFIED", "TRUSTED", "{ role = \"pair\", approvals = 2 }"),
                "no one can give the approval VERIFIED -> TRUSTED needs: role `pair` has 1 named \
                 members, fewer than the 2 approvals needed",
            ),
            (
                gated(
                    "VERIFIED",
                    "TRUSTED",
                    "{ role = \"reviewer\", approvals = 0 }",
                ),
                "`approvals` counts distinct approvers and must be at least 1",
            ),
            (
                shipped.replace(
                    "terminal = [\"REVOKED\", \"REJECTED\"]",
                    "terminal = [\"REVOKED\", \"REJECTED\", \"BUILT\"]",
                ),
                "`BUILT` is both buildable and terminal: a build would overwrite a skill that is \
                 meant to stay BUILT for good",
            ),
            (
                shipped.replace(
                    "\"REJECTED\"]\n# A build",
                    "\"REJECTED\", \"LOST\"]\n# A build",
                ) + "[[transition]]\nfrom = \"LOST\"\nto = \"PROPOSED\"\n",
                "`LOST` is unreachable: no chain of transitions leads to it from `initial` \
                 (PROPOSED)",
            ),
            (
                shipped.replace(
                    "[[transition]]\nfrom = \"VERIFIED\"\nto = \"REJECTED\"\n\
                     description = \"a person rejected the run that was building it\"\n",
                    "",
                ),
                "no transition VERIFIED -> REJECTED is declared: `kavi reject` makes that move",
            ),
        ] {
            let found = problems(&text);
            assert!(
                found.iter().any(|p| p == reason),
                "{reason}\nnot in {found:?}"
            );
        }
    }

    /// A promotion walks through the states between the verified one and TRUSTED, never back
    /// through a buildable one.
    #[test]
    fn the_way_to_trusted_passes_a_review_state_and_says_what_each_move_needs() {
        let text = "initial = \"P\"\nstates = [\"P\", \"V\", \"R\", \"TRUSTED\"]\n\
                    buildable = [\"P\"]\n\
                    [[transition]]\nfrom = \"P\"\nto = \"V\"\n\
                    [[transition]]\nfrom = \"V\"\nto = \"P\"\n\
                    [[transition]]\nfrom = \"V\"\nto = \"R\"\n\
                    approval = { role = \"reviewer\", approvals = 2 }\n\
                    [[transition]]\nfrom = \"R\"\nto = \"TRUSTED\"\n\
                    [[transition]]\nfrom = \"TRUSTED\"\nto = \"P\"\n";
        let lifecycle =
            Lifecycle::parse(&SourceFile::new("policies/lifecycle.toml", text)).unwrap();
        let two = Approval::Roles(Requirement {
            role: "reviewer".to_owned(),
            approvals: 2,
        });
        assert_eq!(
            lifecycle.toward_trusted("V"),
            Some(("R".to_owned(), Some(two)))
        );
        assert_eq!(
            lifecycle.toward_trusted("R"),
            Some((TRUSTED.to_owned(), None))
        );
        assert_eq!(lifecycle.toward_trusted(TRUSTED), None);
        // P -> V is the gates' move, never a promotion's.
        assert_eq!(lifecycle.toward_trusted("P"), None);
        assert_eq!(
            lifecycle.check("V", "R").unwrap_err(),
            "the transition V -> R needs 2 approvals by distinct accounts holding `reviewer` \
             other than the run's starter (policies/lifecycle.toml)"
        );
    }

    #[test]
    fn the_lifecycle_allows_only_declared_transitions_and_says_what_is_allowed() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/policies/lifecycle.toml"
        ))
        .unwrap();
        let lifecycle =
            Lifecycle::parse(&SourceFile::new("policies/lifecycle.toml", text)).unwrap();
        assert_eq!(lifecycle.initial, "PROPOSED");
        assert!(lifecycle.check("PROPOSED", "BUILT").is_ok());
        assert_eq!(
            lifecycle.check("PROPOSED", "TRUSTED").unwrap_err(),
            "the transition PROPOSED -> TRUSTED is not allowed by policies/lifecycle.toml (from PROPOSED it allows: BUILT, REJECTED)"
        );
    }

    #[test]
    fn a_lifecycle_naming_an_undeclared_state_points_at_it() {
        let source = SourceFile::new(
            "l.toml",
            "initial = \"NEW\"\nstates = [\"NEW\"]\nbuildable = [\"NEW\"]\n[[transition]]\nfrom = \"NEW\"\nto = \"DONE\"\n",
        );
        let err = Lifecycle::parse(&source).unwrap_err();
        assert_eq!(err.message, "`DONE` is not one of the declared states");
        assert_eq!(err.position().as_deref(), Some("l.toml:6:6"));
    }
}
