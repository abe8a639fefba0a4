//! The registry file: the trusted skills, derived from the ledger and rewritten whole each time.
//! The ledger wins: a hand edit to the file is overwritten by the next promotion.

use std::path::Path;

use serde_json::json;

use super::trust::TrustPolicy;
use crate::ledger::Ledger;

/// Rewrites the registry of TRUSTED skills where the trust policy puts it (inside `workspace`),
/// atomically; after every move into or out of TRUSTED. Returns how many skills it lists.
pub fn write_registry(
    ledger: &Ledger,
    workspace: &Path,
    trust: &TrustPolicy,
) -> Result<usize, String> {
    let path = crate::sandbox::contained_path(workspace, &trust.registry)
        .map_err(|e| format!("refused registry path: {e}"))?;
    let path = path.as_path();
    let skills = ledger
        .trusted_skills(super::TRUSTED)
        .map_err(|e| e.to_string())?;
    let text = serde_json::to_string_pretty(&json!({
        "derived_from": "the kavi ledger; regenerated on every promotion, edits are overwritten",
        "skills": skills,
    }))
    .expect("registry serializes");
    let parent = path.parent().ok_or("the registry path has no folder")?;
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("failed to create {}: {e}", parent.display()))?;
    let temp = tempfile::NamedTempFile::new_in(parent).map_err(|e| e.to_string())?;
    std::fs::write(temp.path(), text).map_err(|e| e.to_string())?;
    temp.persist(path)
        .map_err(|e| format!("failed to write {}: {}", path.display(), e.error))?;
    Ok(skills.len())
}
