//! Recording a proposal: the one way in, for `kavi skill propose` and the forge's `propose` node.
//!
//! A proposal is read from a file inside the workspace (trust re-reads that file for as long as
//! the skill is trusted), parsed, checked against the skill's folder, stored as a `SKILL_SPEC`
//! artifact and recorded in the ledger. Proposing the same text again is a no-op. A proposal file
//! that changed since it was recorded is a new version when the skill is TRUSTED or suspended for
//! drift (and the lifecycle allows the move to its initial state): the trusted version keeps
//! running, from the files kept at its promotion, until the new one is promoted. Otherwise a changed file is refused, because the skill's lifecycle so far
//! was earned by the old text.

use std::path::Path;

use super::trust::TrustPolicy;
use super::{Lifecycle, Proposal, TRUSTED};
use crate::diagnostic::{Diagnostic, SourceFile};
use crate::ledger::{Artifact, ArtifactStore, Ledger, LedgerError, NewSkill};
use crate::spec::SpecError;
use crate::template::TemplateEngine;

/// What recording a proposal needs besides the file.
pub struct Proposing<'a> {
    pub root: &'a Path,
    pub store: &'a ArtifactStore,
    pub templates: &'a TemplateEngine,
    pub trust: &'a TrustPolicy,
    /// A new skill starts in its initial state; a new version moves there as it allows.
    pub lifecycle: &'a Lifecycle,
}

/// A recorded proposal.
#[derive(Debug)]
pub struct Proposed {
    pub proposal: Proposal,
    pub spec: Artifact,
    /// False when the same text was recorded before.
    pub created: bool,
    /// The version the text is: above 1 for a new version of a trusted skill.
    pub version: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    /// The file cannot be read or is not a valid proposal (the diagnostic points into it).
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("refused `{path}`: {reason}")]
    Path { path: String, reason: String },
    #[error(
        "{path} changed since `{name}` was proposed (proposed sha256:{proposed}, now \
         sha256:{now}), and {reason}"
    )]
    Changed {
        path: String,
        name: String,
        proposed: String,
        now: String,
        /// Why it cannot be a new version.
        reason: String,
    },
    #[error("failed to store the skill spec: {0}")]
    Store(std::io::Error),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl Proposing<'_> {
    /// Why a proposal file that is not there is refused: with the ones that are, since the
    /// usual cause is a skill's name mistyped in `--set skill=`.
    fn no_such_proposal(&self) -> String {
        let mut names: Vec<String> = std::fs::read_dir(self.root.join("proposals"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".toml").map(str::to_owned)
            })
            .collect();
        names.sort();
        match names.is_empty() {
            true => "there is no such file, and proposals/ holds none".to_owned(),
            false => format!(
                "there is no such file; proposals/ holds {}",
                names.join(", ")
            ),
        }
    }

    /// Records the proposal in `relative` (a path inside the workspace).
    pub fn record(&self, ledger: &mut Ledger, relative: &str) -> Result<Proposed, ProposeError> {
        let refused = |reason: String| ProposeError::Path {
            path: relative.to_owned(),
            reason,
        };
        if let Some(reason) = crate::sandbox::unsafe_path_reason(relative) {
            return Err(refused(format!(
                "{reason}; a proposal file is named relative to the workspace"
            )));
        }
        let text = crate::sandbox::open_beneath(self.root, relative)
            .and_then(|file| crate::sandbox::read_bounded(file, super::trust::PROPOSAL_LIMIT))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => refused(self.no_such_proposal()),
                _ => refused(e.to_string()),
            })?;
        let text = String::from_utf8(text).map_err(|_| refused("it is not UTF-8".into()))?;
        let source = SourceFile::new(relative, text);
        let proposal = Proposal::parse(&source).map_err(SpecError::from)?;
        let name = proposal.name.get_ref();
        // The file's name is the skill's: a mismatch would make every attempt build the wrong
        // thing, and fail the same way each time.
        let stem = std::path::Path::new(relative)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        if stem != name {
            return Err(SpecError::from(
                Diagnostic::new(format!(
                    "the proposal names the skill `{name}`, but its file is named `{stem}`"
                ))
                .at(&source, proposal.name.span())
                .with_help(format!(
                    "rename the file to {name}.toml, or the skill to `{stem}`"
                )),
            )
            .into());
        }
        let folder = self
            .trust
            .folder_of(self.templates, name)
            .map_err(|message| SpecError::from(Diagnostic::new(message)))?;
        proposal
            .check_command(&source, self.root, &folder)
            .map_err(SpecError::from)?;
        proposal
            .check_writes(&source, self.root)
            .map_err(SpecError::from)?;
        let spec = self
            .store
            .put_bytes("SKILL_SPEC", source.text.as_bytes())
            .map_err(ProposeError::Store)?;
        let new = NewSkill {
            name,
            description: &proposal.description,
            side_effect: &proposal.side_effect.to_string(),
            spec: &spec,
            proposal_path: relative,
            initial_state: &self.lifecycle.initial,
            actor: &crate::identity::actor(),
        };
        let (created, version) = match ledger.propose_skill(&new) {
            Ok(()) => (true, 1),
            Err(LedgerError::SkillExists(_)) => {
                let existing = ledger.skill(name)?;
                if existing.spec_artifact == spec.sha256 {
                    (false, existing.version)
                } else {
                    let from: Vec<&str> = std::iter::once(TRUSTED)
                        .chain(self.lifecycle.drifted.as_deref())
                        .collect();
                    let version = ledger
                        .propose_version(&new, &from, |from, to| self.lifecycle.check(from, to))
                        .map_err(|e| match e {
                            LedgerError::TransitionRefused(reason) => ProposeError::Changed {
                                path: relative.to_owned(),
                                name: name.clone(),
                                proposed: existing.spec_artifact[..12].to_owned(),
                                now: spec.sha256[..12].to_owned(),
                                reason: format!(
                                    "it cannot be a new version: {reason}; promote or restore \
                                     the skill first, or propose the change under a new name"
                                ),
                            },
                            other => other.into(),
                        })?;
                    (true, version)
                }
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Proposed {
            proposal,
            spec,
            created,
            version,
        })
    }
}
