//! Promotion: a verified skill becomes TRUSTED at the hash its gates passed, and the bytes that
//! hash covers are kept for `kavi skill restore`. The `promote` node promotes, and so does `kavi
//! approve` when the lifecycle made the move wait for a person.

use std::path::Path;

use super::registry::write_registry;
use super::trust::TrustPolicy;
use super::{Lifecycle, TRUSTED};
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
    /// The ATTESTATION artifact signed for it, or why there is none (no signing key).
    pub attestation: Result<String, String>,
}

/// Where walking a verified skill toward TRUSTED ended.
#[derive(Debug)]
pub enum Advanced {
    Promoted(Promoted),
    /// The next move, `from -> to`, needs an approval: the skill waits in `from` for it.
    Awaits {
        from: String,
        to: String,
    },
}

impl Promotion<'_> {
    /// Walks `skill` toward TRUSTED, one move at a time along [`Lifecycle::toward_trusted`]:
    /// each move that needs no approval is made (recorded from `origin`, by the current
    /// account), the last one by [`Promotion::promote`]; the walk stops before a move that
    /// needs an approval. `promote` walks from the verified state, and `kavi approve` on from
    /// the state an approved move reached, so a lifecycle with more states on the way (a
    /// REVIEWED before TRUSTED, say) needs no other pipeline.
    pub fn advance(
        &self,
        ledger: &mut Ledger,
        lifecycle: &Lifecycle,
        skill: &str,
        origin: (Option<i64>, Option<&str>),
        comment: Option<&str>,
    ) -> Result<Advanced, String> {
        let check = |from: &str, to: &str| lifecycle.check(from, to);
        loop {
            let from = ledger.skill(skill).map_err(|e| e.to_string())?.state;
            match lifecycle.toward_trusted(&from) {
                Some((to, Some(_))) => return Ok(Advanced::Awaits { from, to }),
                Some((to, None)) if to != TRUSTED => {
                    let actor = crate::identity::actor();
                    let check = |from: &str, to: &str| lifecycle.check_move(from, to);
                    ledger
                        .transition_skill(skill, &to, check, origin, &actor, comment)
                        .map_err(|e| e.to_string())?;
                }
                // TRUSTED next, or no way there: the promotion's own check says what the
                // lifecycle allows instead.
                _ => {
                    return self
                        .promote(ledger, skill, check, origin, comment)
                        .map(Advanced::Promoted);
                }
            }
        }
    }

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
        self.governed(ledger, skill, &hash, origin.0)?;
        // Whatever path it came by, a promotion happens only under the adopted rules: those on
        // disk now, and those its runs ran under (a file weakened for the gates and put back
        // before the promotion is not the adopted one).
        let adopted = crate::adoption::for_decision(ledger, self.workspace)
            .map_err(|why| format!("`{skill}` may not be promoted: {why}"))?;
        ran_under(ledger, &adopted, origin.0)
            .map_err(|why| format!("`{skill}` may not be promoted: {why}"))?;
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
        // The promotion stands either way; its record says whether it was attested.
        let attestation = ledger
            .promotion(skill, None)
            .map_err(|e| e.to_string())
            .and_then(|promotion| attest(self.store, ledger, &promotion, &tree));
        Ok(Promoted {
            from: moved.from,
            source_hash: hash,
            trusted_tree: kept[0].sha256.clone(),
            registry_skills,
            attestation,
        })
    }

    /// Refuses a promotion that did not come the governed way (`policies/trust.toml`,
    /// `[promotion]`): from a run of a pipeline it names, every run above it one too; of a skill
    /// no other run holds for review and no one rejected; after the gate set it names passed the
    /// skill at `hash` in the same run lineage.
    fn governed(
        &self,
        ledger: &Ledger,
        skill: &str,
        hash: &str,
        run: Option<i64>,
    ) -> Result<(), String> {
        let refused = |why: String| Err(format!("`{skill}` may not be promoted: {why}"));
        let Some(rule) = &self.trust.promotion else {
            return refused(format!(
                "{} names no pipeline that may promote (its [promotion] table)",
                self.trust.source.path.display()
            ));
        };
        let Some(run) = run else {
            return refused("a promotion is made by a run of a governed pipeline".to_owned());
        };
        let root = ledger.root_run(run).map_err(|e| e.to_string())?.id;
        let mut lineage = Some(run);
        while let Some(id) = lineage {
            let row = ledger.run(id).map_err(|e| e.to_string())?;
            if !rule.pipelines.contains(&row.spec_path) {
                return refused(format!(
                    "run {id} is of {}, which {} does not name among the pipelines that may \
                     promote ({})",
                    row.spec_path,
                    self.trust.source.path.display(),
                    rule.pipelines.join(", ")
                ));
            }
            lineage = row.parent_run;
        }
        let version_at = ledger
            .skill(skill)
            .map_err(|e| e.to_string())?
            .version_proposed_at;
        if let Some(escalation) = ledger
            .latest_escalation(skill)
            .map_err(|e| e.to_string())?
            .filter(|e| e.raised_at >= version_at)
        {
            let held_by = ledger
                .root_run(escalation.run_id)
                .map_err(|e| e.to_string())?
                .id;
            match escalation.status.as_str() {
                "rejected" => {
                    return refused(format!("it was rejected in review of run {held_by}"));
                }
                // A person deciding that run's review promotes within it; no other run may.
                "pending" if held_by != root => {
                    return refused(format!(
                        "it awaits review in run {held_by}; decide with `kavi approve {held_by}` \
                         or `kavi reject {held_by}`"
                    ));
                }
                _ => {}
            }
        }
        let passing = ledger
            .passing_gate_runs(skill, hash)
            .map_err(|e| e.to_string())?;
        // No gate run passed these bytes at all: they changed since their verification, which
        // the ledger refuses, naming both hashes.
        if passing.is_empty() {
            return Ok(());
        }
        for (gate_run, _, report) in passing {
            if ledger.root_run(gate_run).map_err(|e| e.to_string())?.id != root {
                continue;
            }
            let set = report
                .and_then(|sha| self.store.read_text(&sha).ok())
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
                .and_then(|report| report["set"].as_str().map(str::to_owned));
            if set.as_deref() == Some(rule.gates.as_str()) {
                return Ok(());
            }
        }
        refused(format!(
            "no run of {} in run {root} passed it at {hash}",
            rule.gates
        ))
    }
}

/// Refuses unless every run from `run` up to its root ran under the adopted rules: each
/// governing file it recorded from the rule set's folders had the adopted text. (A run records
/// the configuration it resolved, not `kavi.toml`'s text; the file itself is checked against the
/// adopted one when the promotion is decided.)
fn ran_under(
    ledger: &Ledger,
    adopted: &crate::adoption::Governing,
    run: Option<i64>,
) -> Result<(), String> {
    let mut lineage = run;
    while let Some(id) = lineage {
        for member in ledger.governing(id).map_err(|e| e.to_string())? {
            if !crate::adoption::in_governing_folder(&member.path) {
                continue;
            }
            let adopted_hash = adopted
                .files
                .iter()
                .find(|(path, _)| *path == member.path)
                .map(|(_, text)| crate::hash::spec_hash(text));
            if adopted_hash.as_deref() != Some(member.spec_hash.as_str()) {
                return Err(format!(
                    "run {id} ran under a {} that is not the adopted rule set {}'s (see `kavi \
                     policy diff`); run it again under the adopted rules",
                    member.path, adopted.row.id
                ));
            }
        }
        lineage = ledger.run(id).map_err(|e| e.to_string())?.parent_run;
    }
    Ok(())
}

/// Signs the attestation of `promotion`, whose files are `tree`, with kavi's signing key, and
/// keeps it: its artifact's hash, or why there is none.
pub fn attest(
    store: &ArtifactStore,
    ledger: &mut Ledger,
    promotion: &crate::ledger::PromotionRow,
    tree: &super::tree::SkillTree,
) -> Result<String, String> {
    let key_path = crate::ledger::keys::signing_key();
    if !key_path.exists() {
        return Err(format!(
            "not attested: kavi has no signing key ({}); `kavi ledger keygen` makes one, and \
             `kavi skill attest {}` attests this promotion then",
            key_path.display(),
            promotion.skill
        ));
    }
    let key = crate::ledger::checkpoint::load(&key_path)?;
    let statement = kavi_provenance::statement(ledger, promotion, &tree.subjects())
        .map_err(|e| e.to_string())?;
    let envelope = kavi_provenance::envelope(&statement, &key);
    let artifact = store
        .put_bytes("ATTESTATION", envelope.as_bytes())
        .map_err(|e| format!("failed to keep the attestation: {e}"))?;
    ledger
        .record_attestation(promotion.id, &artifact)
        .map_err(|e| e.to_string())?;
    Ok(artifact.sha256)
}
