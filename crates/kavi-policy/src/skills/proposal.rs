//! A skill proposal: its fields as a proposal file writes them, and their checks.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::scope::path_value;
use super::{SideEffect, SideEffects, invalid_name_reason, untrusted_program, write_scope_refusal};
use crate::diagnostic::{Diagnostic, SourceFile};

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
