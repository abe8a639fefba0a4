//! Skills: small code units built by an external agent, and the lifecycle they move through.
//!
//! A skill starts as a proposal (name, description, schemas, side-effect class, secrets, the
//! command that runs it). Its name is the one source of naming truth: every path the forge uses
//! derives from it, so it may hold no path characters.

pub mod conventions;
pub mod promotion;
pub mod propose;
pub mod registry;
mod side_effect;
pub mod snapshot;
mod tree;
pub mod trust;

pub use side_effect::{SideEffect, SideEffects};

/// The state a promotion reaches, and the one `kavi skill verify` checks.
pub const TRUSTED: &str = "TRUSTED";

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};

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
            toml::from_str(&source.text).map_err(|e| crate::spec::toml_error(source, &e))?;
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
                if let Err(e) = crate::executions::validate(schema, value, what) {
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
    #[serde(default)]
    approval: bool,
    #[expect(dead_code, reason = "documentation for people reading the policy")]
    description: Option<String>,
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
    /// (from, to, needs approval)
    transitions: Vec<(String, String, bool)>,
    pub source: Arc<SourceFile>,
    /// The file as written, for diagnostics that point into it.
    declared: RawLifecycle,
}

impl Lifecycle {
    /// Parses and checks a lifecycle policy: every state it names must be declared, and it may
    /// have no dead end (see [`Lifecycle::dead_ends`]).
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let lifecycle = Self::parse_declared(source)?;
        match lifecycle.dead_ends().into_iter().next() {
            Some(dead_end) => Err(dead_end),
            None => Ok(lifecycle),
        }
    }

    /// Parses a lifecycle policy without looking for dead ends: for `kavi policy check`, which
    /// lists them all.
    pub fn parse_declared(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let raw: RawLifecycle =
            toml::from_str(&source.text).map_err(|e| crate::spec::toml_error(source, &e))?;
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
            transitions.push((known(&t.from)?, known(&t.to)?, t.approval));
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

    /// Where a skill could get stuck: TRUSTED undeclared; a state from which no chain of
    /// transitions reaches TRUSTED (unless it is `terminal`); a buildable state no transition
    /// leads to; a `drifted` state TRUSTED cannot move to; a `revoked` state nothing leads to.
    pub fn dead_ends(&self) -> Vec<Diagnostic> {
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
        // Every state from which TRUSTED can be reached, walking transitions backwards.
        let mut reaches = vec![TRUSTED.to_owned()];
        let mut grew = true;
        while grew {
            grew = false;
            for (from, to, _) in &self.transitions {
                if reaches.contains(to) && !reaches.contains(from) {
                    reaches.push(from.clone());
                    grew = true;
                }
            }
        }
        for state in &self.declared.states {
            let name = state.get_ref();
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
            if name != &self.initial && !self.has_way_into(name) {
                found.push(at(
                    format!("buildable state `{name}` has no way in: no transition leads to it"),
                    state.span(),
                ));
            }
        }
        if let (Some(drifted), Some(declared)) = (&self.drifted, &self.declared.drifted)
            && self.check(TRUSTED, drifted).is_err()
        {
            found.push(at(
                format!(
                    "`drifted` is {drifted}, but no transition {TRUSTED} -> {drifted} (without approval) is declared"
                ),
                declared.span(),
            ));
        }
        for (key, state, declared) in [
            ("revoked", &self.revoked, &self.declared.revoked),
            ("rejected", &self.rejected, &self.declared.rejected),
        ] {
            if let (Some(state), Some(declared)) = (state, declared)
                && !self.has_way_into(state)
            {
                found.push(at(
                    format!("`{key}` is {state}, but no transition leads to it"),
                    declared.span(),
                ));
            }
        }
        found
    }

    /// Whether the move is declared with `approval = true`.
    pub fn needs_approval(&self, from: &str, to: &str) -> bool {
        self.transitions
            .iter()
            .any(|(f, t, approval)| f == from && t == to && *approval)
    }

    /// Whether any move needs an approval.
    pub fn has_approvals(&self) -> bool {
        self.transitions.iter().any(|(_, _, approval)| *approval)
    }

    /// Checks a move that a person approved: declared, approval or not.
    pub fn check_approved(&self, from: &str, to: &str) -> Result<(), String> {
        if self.needs_approval(from, to) {
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
            Some((_, _, false)) => Ok(()),
            Some((_, _, true)) => Err(format!(
                "the transition {from} -> {to} needs a recorded approval ({})",
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
    let not_buildable = (!lifecycle.buildable.contains(&state)).then(|| {
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
            .dead_ends()
            .iter()
            .map(|d| d.message.clone())
            .collect();
        assert_eq!(
            found,
            [
                "`GONE` is a dead end: no chain of transitions leads from it to TRUSTED",
                "`S` is a dead end: no chain of transitions leads from it to TRUSTED",
                "`drifted` is S, but no transition TRUSTED -> S (without approval) is declared",
            ]
        );
        let fixed = format!(
            "terminal = [\"GONE\"]\n{base}[[transition]]\nfrom = \"TRUSTED\"\nto = \"S\"\n\
             [[transition]]\nfrom = \"S\"\nto = \"TRUSTED\"\n"
        );
        assert!(lifecycle(&fixed).dead_ends().is_empty());
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
