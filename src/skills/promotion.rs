//! Promotion: a verified skill becomes TRUSTED at the hash its gates passed, and the bytes that
//! hash covers are kept for `kavi skill restore`. The `promote` node promotes, and so does `kavi
//! approve` when the lifecycle made the move wait for a person.

use std::path::Path;

use super::TRUSTED;
use super::registry::write_registry;
use super::trust::TrustPolicy;
use crate::ledger::{ArtifactStore, Ledger};
use crate::template::TemplateEngine;

/// Where a promotion reads from and writes to.
pub struct Promotion<'a> {
    pub store: &'a ArtifactStore,
    pub trust: &'a TrustPolicy,
    pub templates: &'a TemplateEngine,
    /// The workspace, where the registry is written.
    pub workspace: &'a Path,
    /// The tree holding the skill's files (usually the workspace).
    pub source: &'a Path,
}

/// A promotion that happened.
#[derive(Debug)]
pub struct Promoted {
    pub from: String,
    pub source_hash: String,
    /// The SKILL_TREE artifact kept.
    pub trusted_tree: String,
    /// How many skills the registry now lists.
    pub registry_skills: usize,
}

impl Promotion<'_> {
    /// Promotes `skill` to TRUSTED if `check(from, to)` allows the move and its files still hash
    /// to the hash its gates verified. `origin` is the run and node that promote, if any.
    pub fn promote(
        &self,
        ledger: &mut Ledger,
        skill: &str,
        check: impl FnOnce(&str, &str) -> Result<(), String>,
        origin: (Option<i64>, Option<&str>),
        comment: Option<&str>,
    ) -> Result<Promoted, String> {
        let proposal = ledger
            .skill(skill)
            .map_err(|e| e.to_string())?
            .proposal_path;
        // The bytes hashed are the bytes kept: restore puts back exactly what was trusted.
        let tree = self
            .trust
            .read_tree(self.templates, self.source, skill, &proposal)?;
        let hash = tree.hash();
        let kept = tree
            .store(self.store)
            .map_err(|e| format!("failed to keep the trusted tree: {e}"))?;
        let moved = ledger
            .promote_skill(
                skill,
                TRUSTED,
                &hash,
                check,
                origin,
                &crate::identity::actor(),
                comment,
                &kept,
            )
            .map_err(|e| e.to_string())?;
        let registry_skills = write_registry(ledger, self.workspace, self.trust)?;
        Ok(Promoted {
            from: moved.from,
            source_hash: hash,
            trusted_tree: kept[0].sha256.clone(),
            registry_skills,
        })
    }
}
