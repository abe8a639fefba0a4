//! The operations on skills the adopted rules govern: proposing one, verifying the trusted ones
//! (and suspending those that drifted), restoring and revoking one, and re-verifying those
//! trusted under an older rule set once a new one is adopted.

pub mod pending;

use serde_json::json;

use crate::config::Workspace;
use crate::diagnostic::{Diagnostic, SourceFile};
use crate::ledger::{self, Ledger, LedgerError, SkillRow};
use crate::policy::adoption::{Governing, OnChange};
use crate::skill::propose::{ProposeError, Proposed, Proposing};
use crate::skill::trust::{Drift, SkillTree, TrustPolicy};
use crate::skill::{LIFECYCLE_POLICY as LIFECYCLE, Lifecycle, Proposal, TRUSTED};
use crate::spec::SpecError;
use crate::template::TemplateEngine;
use crate::{GovernanceError, Result, load_lifecycle, load_trust, open_store};

/// The adopted rules a decision on a skill is taken under, with their lifecycle: only while the
/// files on disk do not weaken them (see [`crate::policy::adoption::for_decision`]).
fn adopted_lifecycle(
    workspace: &Workspace,
    ledger: &Ledger,
    refused: &str,
) -> Result<(Governing, Lifecycle)> {
    crate::policy::adoption::for_decision(ledger, &workspace.root)
        .and_then(|governing| {
            governing
                .lifecycle()
                .map(|lifecycle| (governing, lifecycle))
        })
        .map_err(|why| GovernanceError::Usage(format!("{refused}: {why}")))
}

/// Which rule set a skill's trusted version was promoted under, in words.
pub fn trusted_under(skill: &SkillRow) -> String {
    skill
        .trusted_rules
        .map_or("no recorded rule set".to_owned(), |id| {
            format!("rule set {id}")
        })
}

/// `[adoption] on_change = "reverify"` of the set adopted now: each skill trusted under an older
/// set moves to the lifecycle's `drifted` state, to be built and gated again by the forge.
/// Returns the skills moved.
pub fn reverify_older(workspace: &Workspace, ledger: &mut Ledger) -> Result<Vec<String>> {
    let governing = crate::adoption::adopted(ledger)?;
    let on_change = governing
        .adoption()
        .map_err(GovernanceError::Usage)?
        .map(|policy| policy.on_change)
        .unwrap_or_default();
    if on_change != OnChange::Reverify {
        return Ok(Vec::new());
    }
    let lifecycle = governing.lifecycle().map_err(GovernanceError::Usage)?;
    let Some(drifted) = &lifecycle.drifted else {
        return Err(GovernanceError::Usage(format!(
            "`on_change = \"reverify\"` moves skills trusted under an older rule set to the \
             lifecycle's `drifted` state, and the adopted {LIFECYCLE} declares none"
        )));
    };
    let trust = load_trust(workspace, &TemplateEngine::new(&workspace.templates_dir()))?;
    let mut moved = Vec::new();
    for trusted in ledger.trusted_skills(TRUSTED)? {
        let skill = ledger.skill(&trusted.name)?;
        if skill.state != TRUSTED || skill.trusted_rules == Some(governing.row.id) {
            continue;
        }
        let comment = format!(
            "trusted under {}; rule set {} was adopted, which re-verifies it \
             (`on_change = \"reverify\"`): the forge builds and gates it again",
            trusted_under(&skill),
            governing.row.id
        );
        move_skill(
            workspace,
            &trust,
            ledger,
            &lifecycle,
            &skill.name,
            drifted,
            &comment,
        )?;
        moved.push(skill.name);
    }
    Ok(moved)
}

/// A skill proposed, with the state a new one starts in and its row as recorded now.
pub struct ProposedSkill {
    pub proposed: Proposed,
    pub initial: String,
    pub skill: SkillRow,
}

/// Records the proposal in `file` (as the user named it, from the current folder), which must
/// lie inside the workspace.
pub fn propose(workspace: &Workspace, file: &str) -> Result<ProposedSkill> {
    let relative = workspace_relative(workspace, file)?;
    let lifecycle = load_lifecycle(workspace)?;
    let templates = TemplateEngine::new(&workspace.templates_dir());
    let trust = load_trust(workspace, &templates)?;
    let store = open_store(workspace)?;
    let mut ledger = Ledger::open(&workspace.config.ledger)?;
    let proposed = Proposing {
        root: &workspace.root,
        store: &store,
        templates: &templates,
        trust: &trust,
        lifecycle: &lifecycle,
    }
    .record(&mut ledger, &relative)
    .map_err(|e| match e {
        ProposeError::Spec(e) => GovernanceError::Spec(e),
        ProposeError::Ledger(e) => GovernanceError::Ledger(e),
        other => GovernanceError::Usage(other.to_string()),
    })?;
    let skill = ledger.skill(proposed.proposal.name.get_ref())?;
    Ok(ProposedSkill {
        proposed,
        initial: lifecycle.initial,
        skill,
    })
}

/// `file` (as the user named it, from the current folder) relative to the workspace: a proposal
/// lives in the workspace, where trust re-reads it.
fn workspace_relative(workspace: &Workspace, file: &str) -> Result<String> {
    let not_found = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::NotFound {
            GovernanceError::NotFound(format!("no proposal file `{file}`"))
        } else {
            GovernanceError::Spec(SpecError::Read {
                path: file.into(),
                source,
            })
        }
    };
    let absolute = std::path::Path::new(file)
        .canonicalize()
        .map_err(not_found)?;
    let root = workspace.root.canonicalize().map_err(not_found)?;
    absolute
        .strip_prefix(&root)
        .ok()
        .and_then(|relative| relative.to_str())
        .map(str::to_owned)
        .ok_or_else(|| {
            GovernanceError::Usage(format!(
                "refused `{file}`: a proposal file must lie inside the workspace ({}), where \
                 trust re-reads it",
                workspace.root.display()
            ))
        })
}

/// Each proposal under `proposals/`, parsed and its `writes` checked against the workspace as it
/// is now (a symlink made since it was proposed is found here), in name order.
pub fn workspace_proposals(workspace: &Workspace) -> Vec<std::result::Result<(), Diagnostic>> {
    let Ok(entries) = std::fs::read_dir(workspace.root.join("proposals")) else {
        return Vec::new();
    };
    let mut paths: Vec<std::path::PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let shown = path.strip_prefix(&workspace.root).unwrap_or(path);
            let text = crate::diagnostic::read_spec(path)
                .map_err(|e| Diagnostic::new(format!("cannot read {}: {e}", shown.display())))?;
            let source = SourceFile::new(shown, text);
            Proposal::parse(&source)?.check_writes(&source, &workspace.root)
        })
        .collect()
}

/// Each trusted skill (or the one named), re-hashed: its trusted hash, its hash now (or why it
/// cannot be read) and whether it drifted. A trusted version whose folder holds a newer version
/// being forged is checked in the tree kept at its promotion, which is what runs.
pub fn rehash_trusted(workspace: &Workspace, name: Option<&str>) -> Result<Vec<serde_json::Value>> {
    // No ledger: no skill was ever trusted (one named is not found).
    let ledger = match Ledger::open_existing(&workspace.config.ledger) {
        Err(LedgerError::Missing(_)) if name.is_none() => return Ok(Vec::new()),
        ledger => ledger?,
    };
    let mut skills = ledger.trusted_skills(TRUSTED)?;
    if let Some(name) = name {
        skills.retain(|s| s.name == name);
        if skills.is_empty() {
            let skill = ledger.skill(name)?;
            return Err(GovernanceError::Usage(format!(
                "skill `{name}` is not trusted (it is {}); only trusted skills have a hash to check",
                skill.state
            )));
        }
    }
    if skills.is_empty() {
        // Nothing to re-hash: the trust policy is not needed, so a workspace without one is fine.
        return Ok(Vec::new());
    }
    // The hashes checked against are the journal's, not an editable row's.
    for skill in &skills {
        ledger.check_skill_journaled(&skill.name)?;
    }
    let templates = TemplateEngine::new(&workspace.templates_dir());
    let trust = load_trust(workspace, &templates)?;
    let store = open_store(workspace)?;
    // With a server ledger, the trusted bytes every machine runs are in the shared store: a
    // checkout whose files differ is this machine's condition, not the skill's.
    let shared = ledger::postgres_url(&workspace.config.ledger).is_some();
    Ok(skills
        .iter()
        .map(|skill| {
            // The hash now, and what else drifted (the bytes are the trusted ones but a file's
            // mode or time changed) or why the files cannot be read.
            let (now, problem) = match (skill.newer_version, &skill.trusted_tree) {
                (None, kept) => match trust.check_tree(
                    &templates,
                    &workspace.root,
                    &skill.name,
                    &skill.proposal_path,
                    &skill.trusted_hash,
                    kept.as_deref().map(|manifest| (&store, manifest)),
                ) {
                    Ok(_) => (Some(skill.trusted_hash.clone()), None),
                    Err(Drift::Hash(now)) => (Some(now), None),
                    Err(Drift::Metadata(reason)) => {
                        (Some(skill.trusted_hash.clone()), Some(reason))
                    }
                    Err(Drift::Unreadable(reason)) => (None, Some(reason)),
                },
                (Some(_), Some(tree)) => match SkillTree::load(&store, tree, &skill.trusted_hash) {
                    Ok(tree) => (Some(tree.hash()), None),
                    Err(reason) => (None, Some(reason)),
                },
                (Some(_), None) => (
                    None,
                    Some("no kept tree: it was promoted before kavi kept them".to_owned()),
                ),
            };
            let differs = problem.is_some() || now.as_ref() != Some(&skill.trusted_hash);
            // Which file differs, from the trusted bytes kept at promotion, when they load.
            let kept = match (differs, &skill.trusted_tree) {
                (true, Some(tree)) => Some(SkillTree::load(&store, tree, &skill.trusted_hash)),
                _ => None,
            };
            let evidence = match &kept {
                Some(Ok(trusted)) if skill.newer_version.is_none() => trust
                    .read_tree(
                        &templates,
                        &workspace.root,
                        &skill.name,
                        &skill.proposal_path,
                    )
                    .ok()
                    .and_then(|here| here.first_difference(trusted)),
                _ => None,
            };
            let stale_here = shared && skill.newer_version.is_none() && matches!(kept, Some(Ok(_)));
            json!({
                "skill": skill.name,
                "version": skill.version,
                "newer_version": skill.newer_version,
                "trusted_hash": skill.trusted_hash,
                "current_hash": now,
                "error": problem,
                "evidence": evidence,
                "drifted": differs && !stale_here,
                "stale_here": stale_here,
            })
        })
        .collect())
}

/// What verifying the trusted skills found.
pub struct Verified {
    /// One per skill checked, as [`rehash_trusted`] has it, with the `state` a drifted one moved
    /// to.
    pub results: Vec<serde_json::Value>,
    /// How many drifted.
    pub drifted: usize,
    /// The workspace's lifecycle, read when any skill drifted.
    pub lifecycle: Option<Lifecycle>,
}

/// Re-hashes trusted skills (or the one named); a drifted skill moves to the lifecycle's
/// `drifted` state (SUSPENDED), so it neither runs nor is listed until restored or rebuilt.
pub fn verify(workspace: &Workspace, name: Option<&str>) -> Result<Verified> {
    let mut results = rehash_trusted(workspace, name)?;
    let drifted = results.iter().filter(|r| r["drifted"] == true).count();
    let lifecycle = if drifted > 0 {
        Some(load_lifecycle(workspace)?)
    } else {
        None
    };
    if let Some(lifecycle) = &lifecycle
        && let Some(state) = &lifecycle.drifted
    {
        let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
        let trust = load_trust(workspace, &TemplateEngine::new(&workspace.templates_dir()))?;
        // A kept tree that no longer hashes right is refused when it would run; the skill's
        // state belongs to the newer version, so nothing moves.
        for r in results
            .iter_mut()
            .filter(|r| r["drifted"] == true && r["newer_version"].is_null())
        {
            let skill = r["skill"].as_str().unwrap_or_default().to_owned();
            // Where it was seen, and which file: a team reads the suspension from any machine.
            let mut comment = format!(
                "drift on {}: its files hash to {}, trusted {}",
                ledger::this_host(),
                r["current_hash"].as_str().unwrap_or("nothing readable"),
                r["trusted_hash"].as_str().unwrap_or_default()
            );
            for detail in [&r["evidence"], &r["error"]] {
                if let Some(detail) = detail.as_str() {
                    comment.push_str(&format!("; {detail}"));
                }
            }
            move_skill(
                workspace,
                &trust,
                &mut ledger,
                lifecycle,
                &skill,
                state,
                &comment,
            )?;
            r["state"] = json!(state);
        }
    }
    Ok(Verified {
        results,
        drifted,
        lifecycle,
    })
}

/// Moves `skill` to `to` as the lifecycle allows, recorded with the account and `comment`,
/// and rewrites the registry of trusted skills.
fn move_skill(
    workspace: &Workspace,
    trust: &TrustPolicy,
    ledger: &mut Ledger,
    lifecycle: &Lifecycle,
    skill: &str,
    to: &str,
    comment: &str,
) -> Result<()> {
    ledger
        .transition_skill(
            skill,
            to,
            |from, to| lifecycle.check_move(from, to),
            (None, None),
            &crate::identity::actor(),
            Some(comment),
        )
        .map_err(refused_move)?;
    rewrite_registry(workspace, trust, ledger)
}

/// A refused move is the user's to fix (exit 2); anything else is the ledger's.
fn refused_move(e: LedgerError) -> GovernanceError {
    match e {
        LedgerError::TransitionRefused(reason) => GovernanceError::Usage(reason),
        other => other.into(),
    }
}

/// Rewrites the registry of trusted skills after a move into or out of TRUSTED.
fn rewrite_registry(workspace: &Workspace, trust: &TrustPolicy, ledger: &Ledger) -> Result<()> {
    crate::skill::registry::write_registry(ledger, &workspace.root, trust).map_err(|e| {
        GovernanceError::Io {
            context: "failed to rewrite the registry".into(),
            source: std::io::Error::other(e),
        }
    })?;
    Ok(())
}

/// Puts a skill's trusted files back, byte for byte as they were promoted, and (when it was
/// suspended for drift) returns it to TRUSTED. Returns the trusted hash.
pub fn restore(workspace: &Workspace, name: &str, comment: Option<&str>) -> Result<String> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let skill = ledger.skill(name)?;
    let (governing, lifecycle) =
        adopted_lifecycle(workspace, &ledger, &format!("`{name}` may not be restored"))?;
    let reverifies = governing
        .adoption()
        .map_err(GovernanceError::Usage)?
        .is_some_and(|policy| policy.on_change == OnChange::Reverify);
    if reverifies && skill.trusted_rules != Some(governing.row.id) {
        return Err(GovernanceError::Usage(format!(
            "`{name}` was trusted under {}, and the adopted rule set {} re-verifies skills \
             trusted under an older one (`on_change = \"reverify\"`): build it again with the \
             forge",
            trusted_under(&skill),
            governing.row.id
        )));
    }
    let restorable = skill.state == TRUSTED || lifecycle.drifted.as_ref() == Some(&skill.state);
    let (Some(trusted_hash), true) = (&skill.trusted_hash, restorable) else {
        return Err(GovernanceError::Usage(format!(
            "`{name}` is {}: only a trusted skill, or one suspended for drift, is restored",
            skill.state
        )));
    };
    let Some(tree) = &skill.trusted_tree else {
        return Err(GovernanceError::Usage(format!(
            "`{name}` was promoted before kavi kept trusted files; build it again with the forge"
        )));
    };
    let store = open_store(workspace)?;
    let templates = TemplateEngine::new(&workspace.templates_dir());
    let trust = crate::governing_trust(&governing, &templates)?;
    let refused = |reason: String| GovernanceError::Io {
        context: format!("failed to restore `{name}`"),
        source: std::io::Error::other(reason),
    };
    let tree = SkillTree::load(&store, tree, trusted_hash).map_err(refused)?;
    tree.write_into(&workspace.root, |path| trust.exclude.is_match(path))
        .map_err(refused)?;
    let now = trust
        .source_hash(&templates, &workspace.root, name, &skill.proposal_path)
        .map_err(refused)?;
    if &now != trusted_hash {
        return Err(refused(format!(
            "after writing the trusted files, it hashes to {now}, not {trusted_hash}"
        )));
    }
    if skill.state != TRUSTED {
        let comment = comment.map_or_else(
            || format!("restored the files trusted at {trusted_hash}"),
            str::to_owned,
        );
        move_skill(
            workspace,
            &trust,
            &mut ledger,
            &lifecycle,
            name,
            TRUSTED,
            &comment,
        )?;
    }
    Ok(trusted_hash.clone())
}

/// Revokes a skill: it moves to the lifecycle's `revoked` state and no version of it runs again.
/// Returns that state.
pub fn revoke(workspace: &Workspace, name: &str, comment: &str) -> Result<String> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let lifecycle = crate::policy::adoption::for_withdrawal(&ledger)
        .and_then(|governing| governing.lifecycle())
        .map_err(|why| GovernanceError::Usage(format!("`{name}` may not be revoked: {why}")))?;
    let Some(revoked) = lifecycle.revoked.clone() else {
        return Err(GovernanceError::Usage(format!(
            "{LIFECYCLE} declares no `revoked` state to move `{name}` to"
        )));
    };
    ledger.skill(name)?;
    let trust = load_trust(workspace, &TemplateEngine::new(&workspace.templates_dir()))?;
    ledger
        .revoke_skill(
            name,
            &revoked,
            |from, to| lifecycle.check(from, to),
            &crate::identity::actor(),
            comment,
        )
        .map_err(refused_move)?;
    rewrite_registry(workspace, &trust, &ledger)?;
    Ok(revoked)
}

/// The attestation of `name`'s latest promotion (of `version`, when given), a DSSE envelope's
/// JSON text: the one kept at promotion or, for a promotion made while kavi had no signing key,
/// one signed now from the ledger's records and kept.
pub fn attest(workspace: &Workspace, name: &str, version: Option<i64>) -> Result<String> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let promotion = ledger.promotion(name, version).map_err(|e| match e {
        LedgerError::SkillNotFound(what) => {
            GovernanceError::NotFound(format!("no promotion of skill {what}"))
        }
        e => e.into(),
    })?;
    let store = open_store(workspace)?;
    let unreadable = |reason: String| GovernanceError::Io {
        context: format!("failed to attest `{name}`"),
        source: std::io::Error::other(reason),
    };
    if let Some(kept) = &promotion.attestation {
        return store.read_text(kept).map_err(unreadable);
    }
    // The files are kept by name only for the trusted version: an older promotion without an
    // attestation cannot be attested now.
    let skill = ledger.skill(name)?;
    let tree = match (&skill.trusted_tree, &skill.trusted_hash) {
        (Some(tree), Some(hash)) if *hash == promotion.source_hash => tree,
        _ => {
            return Err(GovernanceError::Usage(format!(
                "version {} of `{name}` was promoted without an attestation, and its files are \
                 no longer the trusted ones; only the trusted version can be attested after its \
                 promotion",
                promotion.version.unwrap_or_default()
            )));
        }
    };
    let tree = SkillTree::load(&store, tree, &promotion.source_hash).map_err(unreadable)?;
    let kept = crate::skill::promotion::attest(&store, &mut ledger, &promotion, &tree)
        .map_err(GovernanceError::Usage)?;
    store.read_text(&kept).map_err(unreadable)
}

/// A bundle of `name`'s trusted version: its files, the attestation of its promotion, and the
/// public key that signed it, as JSON text.
pub fn export(workspace: &Workspace, name: &str) -> Result<String> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let skill = ledger.skill(name)?;
    if skill.state != TRUSTED {
        return Err(GovernanceError::Usage(format!(
            "`{name}` is {}: only a trusted skill is exported",
            skill.state
        )));
    }
    let attestation = attest(workspace, name, None)?;
    let store = open_store(workspace)?;
    let (Some(tree), Some(hash)) = (&skill.trusted_tree, &skill.trusted_hash) else {
        return Err(GovernanceError::Usage(format!(
            "`{name}` has no trusted files kept to export"
        )));
    };
    let tree = SkillTree::load(&store, tree, hash).map_err(|reason| GovernanceError::Io {
        context: format!("failed to export `{name}`"),
        source: std::io::Error::other(reason),
    })?;
    // The key that signed the attestation, which a rotation since may have replaced.
    let key = kavi_provenance::key_ids(&attestation)
        .into_iter()
        .find(|id| {
            crate::ledger::checkpoint::parse_public(id)
                .is_some_and(|key| kavi_provenance::verify(&attestation, &key).is_ok())
        })
        .ok_or_else(|| {
            GovernanceError::Usage(format!(
                "the attestation of `{name}` names no key that verifies it"
            ))
        })?;
    let bundle = kavi_provenance::Bundle {
        skill: name.to_owned(),
        key,
        attestation,
        files: tree
            .subjects()
            .into_iter()
            .map(|subject| (subject.name, subject.bytes.to_vec()))
            .collect(),
    };
    Ok(bundle.to_json())
}

/// The largest bundle read: a skill's files with their evidence, far below this.
const BUNDLE_LIMIT: u64 = 64 << 20;

/// A bundle accepted for import: its skill, the SKILL_BUNDLE artifact kept, its signer, and
/// the files the import wrote that were not there before (what to take back out if the import
/// pipeline does not promote them), listed until the import settles.
pub struct Accepted {
    pub skill: String,
    pub bundle: String,
    pub signer: String,
    pub written: pending::PendingImport,
}

/// Takes in the bundle at `path` as far as this workspace's policy lets a bundle go by itself:
/// its attestation must be signed by a key the adopted `policies/trust.toml` `[import]` lists, its files
/// exactly the attested ones, for a skill this workspace has never had, at the paths this
/// workspace's conventions give it, none of which exists with other content. Then its files are
/// written and the bundle kept as an artifact; the import pipeline's gates and promotion decide
/// the rest.
pub fn accept_bundle(workspace: &Workspace, path: &std::path::Path) -> Result<Accepted> {
    let refused = |why: String| GovernanceError::Usage(format!("refusing the bundle: {why}"));
    let unreadable = |source| GovernanceError::Io {
        context: format!("failed to read the bundle {}", path.display()),
        source,
    };
    let bytes = std::fs::File::open(path)
        .and_then(|file| crate::sandbox::read_bounded(file, BUNDLE_LIMIT))
        .map_err(unreadable)?;
    let text = String::from_utf8(bytes).map_err(|_| refused("it is not UTF-8 text".to_owned()))?;
    let bundle = kavi_provenance::Bundle::from_json(&text).map_err(|e| refused(e.to_string()))?;
    let name = &bundle.skill;
    let templates = TemplateEngine::new(&workspace.templates_dir());
    let ledger = Ledger::open(&workspace.config.ledger)?;
    // An import that died before it settled left files a skill's folder must not hold.
    pending::settle_abandoned(workspace, &ledger)?;
    // The keys the adopted rules trust: a key added on disk is a rule change to review first.
    let trust = crate::decision_trust(workspace, &ledger, &templates)?;
    let statement = trust.check_bundle(&bundle).map_err(refused)?;
    let signer = bundle.key.to_lowercase();
    if let Some(reason) = crate::skill::invalid_name_reason(name) {
        return Err(refused(format!("`{name}` is not a skill name: {reason}")));
    }
    match ledger.skill(name) {
        Err(LedgerError::SkillNotFound(_)) => {}
        Ok(_) => {
            return Err(refused(format!(
                "this workspace has a skill `{name}` already; import brings in new skills"
            )));
        }
        Err(e) => return Err(e.into()),
    }
    let folder = trust
        .folder_of(&templates, name)
        .map_err(GovernanceError::Usage)?;
    let proposal = format!("proposals/{name}.toml");
    for (path, _) in &bundle.files {
        let at_home = *path == proposal || path.starts_with(&format!("{folder}/"));
        if let Some(reason) = crate::sandbox::unsafe_path_reason(path) {
            return Err(refused(format!("it names `{path}`: {reason}")));
        }
        if !at_home {
            return Err(refused(format!(
                "it names `{path}`, outside `{proposal}` and `{folder}/` where this workspace \
                 keeps `{name}`"
            )));
        }
    }
    // No link on the way to any of them: the files land where their paths say, nowhere else.
    for (path, _) in &bundle.files {
        if crate::sandbox::links_below(&workspace.root, std::path::Path::new(path)) {
            return Err(refused(format!(
                "a symlink lies on the way to `{path}` here"
            )));
        }
    }
    // The skill's folder holds nothing else: what trust hashes is the bundle's files alone.
    let listed = |relative: &str| bundle.files.iter().any(|(path, _)| path == relative);
    for entry in walkdir::WalkDir::new(workspace.root.join(&folder)).follow_links(false) {
        let entry = match entry {
            Ok(entry) => entry,
            // No folder yet: nothing of this workspace's own in it.
            Err(e)
                if e.io_error().map(std::io::Error::kind) == Some(std::io::ErrorKind::NotFound) =>
            {
                continue;
            }
            Err(e) => return Err(refused(format!("cannot list {folder}: {e}"))),
        };
        let relative = entry
            .path()
            .strip_prefix(&workspace.root)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !entry.file_type().is_dir() && !listed(&relative) {
            return Err(refused(format!(
                "`{relative}` is here and not in the bundle; the skill's folder must hold only \
                 the bundle's files"
            )));
        }
    }
    // A file already there is refused unless it is the attested one, byte for byte (the
    // shipped proposals are in every new workspace): nothing here is written over.
    for (path, bytes) in &bundle.files {
        let there = workspace.root.join(path);
        match there.symlink_metadata() {
            Err(_) => {}
            Ok(meta) if meta.is_file() && std::fs::read(&there).is_ok_and(|b| b == *bytes) => {}
            Ok(_) => {
                return Err(refused(format!(
                    "`{path}` exists in this workspace already, with other content"
                )));
            }
        }
    }
    let store = open_store(workspace)?;
    let kept = store
        .put_bytes("SKILL_BUNDLE", text.as_bytes())
        .map_err(|source| GovernanceError::Io {
            context: "failed to keep the bundle".to_owned(),
            source,
        })?;
    let mut targets = Vec::new();
    for (path, bytes) in &bundle.files {
        let target = crate::sandbox::destination(&workspace.root, path).map_err(refused)?;
        targets.push((target, path, bytes.as_slice()));
    }
    // Listed before the first is written: a kill from here on leaves a list the next import or
    // run settles.
    let new: Vec<_> = targets
        .iter()
        .filter(|(target, ..)| target.symlink_metadata().is_err())
        .map(|(target, _, bytes)| (target.clone(), *bytes))
        .collect();
    let written = pending::PendingImport::begin(workspace, name, &new)?;
    for (target, path, bytes) in &targets {
        let executable = kavi_provenance::attested_executable(&statement, path);
        crate::sandbox::write_beneath(&workspace.root, path, bytes, executable).map_err(
            |source| GovernanceError::Io {
                context: format!("failed to write {}", target.display()),
                source,
            },
        )?;
    }
    Ok(Accepted {
        skill: name.clone(),
        bundle: kept.sha256,
        signer,
        written,
    })
}
