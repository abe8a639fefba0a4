//! `kavi skill propose|show|list|run|verify`.

use crate::confinement::policy::ConfinementPolicy;
use serde_json::json;

use super::output::{short_hash, table};
use crate::config::Workspace;
use crate::error::{Error, exit};
use tokio_util::sync::CancellationToken;

use crate::executions::{Lineage, Runner};
use crate::ledger::{ArtifactStore, ExecutionRecord, Ledger, LedgerError, Owner};
use crate::policy::adoption::{Governing, OnChange};
use crate::skills::conventions::{self, Conventions};
use crate::skills::propose::{ProposeError, Proposing};
use crate::skills::trust::{self, Drift, SkillTree, TrustPolicy};
use crate::skills::{Lifecycle, Proposal, SideEffects, TRUSTED};
use crate::spec::SpecError;
use crate::template::TemplateEngine;

const LIFECYCLE: &str = crate::skills::LIFECYCLE_POLICY;

pub(super) fn load_lifecycle(workspace: &Workspace) -> Result<Lifecycle, Error> {
    let source = super::read_policy(workspace, LIFECYCLE)?;
    Ok(Lifecycle::parse(&source).map_err(SpecError::from)?)
}

/// The adopted rules a decision on a skill is taken under, with their lifecycle: only while the
/// files on disk do not weaken them (see [`crate::policy::adoption::for_decision`]).
fn adopted_lifecycle(
    workspace: &Workspace,
    ledger: &Ledger,
    refused: &str,
) -> Result<(Governing, Lifecycle), Error> {
    crate::policy::adoption::for_decision(ledger, &workspace.root)
        .and_then(|governing| {
            governing
                .lifecycle()
                .map(|lifecycle| (governing, lifecycle))
        })
        .map_err(|why| Error::Usage(format!("{refused}: {why}")))
}

/// Which rule set a skill's trusted version was promoted under, in words.
fn trusted_under(skill: &crate::ledger::SkillRow) -> String {
    skill
        .trusted_rules
        .map_or("no recorded rule set".to_owned(), |id| {
            format!("rule set {id}")
        })
}

/// `[adoption] on_change = "reverify"` of the set `governing` just adopted: each skill trusted
/// under an older set moves to the lifecycle's `drifted` state, to be built and gated again by
/// the forge. Returns the skills moved.
pub(super) fn reverify_older(
    workspace: &Workspace,
    ledger: &mut Ledger,
    governing: &Governing,
) -> Result<Vec<String>, Error> {
    let on_change = governing
        .adoption()
        .map_err(Error::Usage)?
        .map(|policy| policy.on_change)
        .unwrap_or_default();
    if on_change != OnChange::Reverify {
        return Ok(Vec::new());
    }
    let lifecycle = governing.lifecycle().map_err(Error::Usage)?;
    let Some(drifted) = &lifecycle.drifted else {
        return Err(Error::Usage(format!(
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

pub fn propose(workspace: &Workspace, file: &str, json: bool) -> Result<i32, Error> {
    let relative = workspace_relative(workspace, file)?;
    let lifecycle = load_lifecycle(workspace)?;
    let templates = TemplateEngine::new(&workspace.templates_dir());
    let trust = load_trust(workspace, &templates)?;
    let store = super::open_store(workspace)?;
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
        ProposeError::Spec(e) => Error::Spec(e),
        ProposeError::Ledger(e) => Error::Ledger(e),
        other => Error::Usage(other.to_string()),
    })?;
    let name = proposed.proposal.name.get_ref();
    if json {
        let skill = ledger.skill(name)?;
        super::print_json(&skill);
    } else if proposed.created && proposed.version > 1 {
        let skill = ledger.skill(name)?;
        outln!(
            "proposed version {} of `{name}` ({}): {}, spec {}; version {} stays trusted and runs \
             until this one is promoted",
            proposed.version,
            proposed.proposal.side_effect,
            skill.state,
            short_hash(&proposed.spec.sha256),
            skill.trusted_version.unwrap_or_default()
        );
    } else if proposed.created {
        outln!(
            "proposed skill `{name}` ({}): {}, spec {}",
            proposed.proposal.side_effect,
            lifecycle.initial,
            short_hash(&proposed.spec.sha256)
        );
    } else {
        outln!(
            "skill `{name}` was proposed from this text already (spec {}); nothing changed",
            short_hash(&proposed.spec.sha256)
        );
    }
    Ok(exit::SUCCESS)
}

/// `file` (as the user named it, from the current folder) relative to the workspace: a proposal
/// lives in the workspace, where trust re-reads it.
fn workspace_relative(workspace: &Workspace, file: &str) -> Result<String, Error> {
    let not_found = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound(format!("no proposal file `{file}`"))
        } else {
            Error::Spec(SpecError::Read {
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
            Error::Usage(format!(
                "refused `{file}`: a proposal file must lie inside the workspace ({}), where \
                 trust re-reads it",
                workspace.root.display()
            ))
        })
}

pub fn show(workspace: &Workspace, name: &str, json: bool) -> Result<i32, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let skill = ledger.skill(name)?;
    let transitions = ledger.skill_transitions(name)?;
    // What its latest verification's tools were installed from: the locked sets, by hash.
    let toolchains = ledger.latest_toolchains(name)?;
    if json {
        let value = json!({ "skill": skill, "transitions": transitions, "toolchains": toolchains });
        super::print_json(&value);
        return Ok(exit::SUCCESS);
    }
    outln!("skill {}: {}", skill.name, skill.state);
    outln!("  {}", skill.description);
    outln!("  version      {}", skill.version);
    if let Some(trusted) = skill.trusted_version
        && let Some(hash) = &skill.trusted_hash
    {
        outln!(
            "  trusted      version {trusted} at {}, under {}",
            short_hash(hash),
            trusted_under(&skill)
        );
    }
    outln!("  side effect  {}", skill.side_effect);
    outln!("  spec         sha256:{}", skill.spec_artifact);
    for toolchain in &toolchains {
        outln!(
            "  toolchain    {} lock {}",
            toolchain["toolchain"].as_str().unwrap_or_default(),
            toolchain["lock"]
                .as_str()
                .unwrap_or("- (an environment kavi.toml names)")
        );
    }
    outln!();
    let mut rows = vec![
        ["FROM", "TO", "RUN", "NODE", "BY", "AT"]
            .map(String::from)
            .to_vec(),
    ];
    for t in &transitions {
        rows.push(vec![
            t.from_state.clone().unwrap_or_else(|| "-".into()),
            t.to_state.clone(),
            t.run_id.map_or_else(|| "-".into(), |id| id.to_string()),
            t.node_id.clone().unwrap_or_else(|| "-".into()),
            t.actor.clone(),
            t.at.clone(),
        ]);
    }
    out!("{}", table(&rows));
    Ok(exit::SUCCESS)
}

/// Each trusted skill (or the one named), re-hashed: its trusted hash, its hash now (or why it
/// cannot be read) and whether it drifted. A trusted version whose folder holds a newer version
/// being forged is checked in the tree kept at its promotion, which is what runs.
pub(super) fn rehash_trusted(
    workspace: &Workspace,
    name: Option<&str>,
) -> Result<Vec<serde_json::Value>, Error> {
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
            return Err(Error::Usage(format!(
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
    let store = super::open_store(workspace)?;
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
            json!({
                "skill": skill.name,
                "version": skill.version,
                "newer_version": skill.newer_version,
                "trusted_hash": skill.trusted_hash,
                "current_hash": now,
                "error": problem,
                "drifted": problem.is_some() || now.as_ref() != Some(&skill.trusted_hash),
            })
        })
        .collect())
}

/// Re-hashes trusted skills and reports drift; a drifted skill moves to the lifecycle's
/// `drifted` state (SUSPENDED), so it neither runs nor is listed until restored or rebuilt.
/// Exit 1 when any skill drifted.
pub fn verify(workspace: &Workspace, name: Option<&str>, json: bool) -> Result<i32, Error> {
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
            let mut comment = format!(
                "drift: its files hash to {}, trusted {}",
                r["current_hash"].as_str().unwrap_or("nothing readable"),
                r["trusted_hash"].as_str().unwrap_or_default()
            );
            if let Some(reason) = r["error"].as_str() {
                comment.push_str(&format!("; {reason}"));
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
    if json {
        super::print_json(&results);
    } else if results.is_empty() {
        outln!("no trusted skills");
    } else {
        for r in &results {
            let name = r["skill"].as_str().unwrap_or_default();
            let trusted = short_hash(r["trusted_hash"].as_str().unwrap_or_default());
            match (
                r["drifted"] == true,
                r["current_hash"].as_str(),
                r["error"].as_str(),
            ) {
                (false, _, _) => outln!("ok     {name}  {trusted}"),
                (true, Some(_), Some(reason)) => {
                    outln!("DRIFT  {name}  trusted {trusted}, same bytes, but {reason}")
                }
                (true, Some(now), None) => {
                    outln!("DRIFT  {name}  trusted {trusted}, now {}", short_hash(now))
                }
                (true, None, error) => outln!(
                    "DRIFT  {name}  trusted {trusted}, now unreadable: {}",
                    error.unwrap_or_default()
                ),
            }
        }
        if let Some(lifecycle) = &lifecycle {
            let what = match &lifecycle.drifted {
                Some(state) => format!("they are now {state} and do not run"),
                None => format!("they will not run ({LIFECYCLE} declares no `drifted` state)"),
            };
            outln!(
                "{drifted} of {} trusted skills changed since promotion; {what}. \
                 `kavi skill restore NAME` puts the trusted files back, or the forge builds it again",
                results.len()
            );
        }
    }
    Ok(if drifted > 0 {
        exit::RUN_FAILED
    } else {
        exit::SUCCESS
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
) -> Result<(), Error> {
    ledger
        .transition_skill(
            skill,
            to,
            |from, to| lifecycle.check(from, to),
            (None, None),
            &crate::identity::actor(),
            Some(comment),
        )
        .map_err(refused_move)?;
    rewrite_registry(workspace, trust, ledger)
}

/// A refused move is the user's to fix (exit 2); anything else is the ledger's.
fn refused_move(e: LedgerError) -> Error {
    match e {
        LedgerError::TransitionRefused(reason) => Error::Usage(reason),
        other => other.into(),
    }
}

/// Rewrites the registry of trusted skills after a move into or out of TRUSTED.
fn rewrite_registry(
    workspace: &Workspace,
    trust: &TrustPolicy,
    ledger: &Ledger,
) -> Result<(), Error> {
    crate::skills::registry::write_registry(ledger, &workspace.root, trust).map_err(|e| {
        Error::Io {
            context: "failed to rewrite the registry".into(),
            source: std::io::Error::other(e),
        }
    })?;
    Ok(())
}

/// Puts a skill's trusted files back, byte for byte as they were promoted, and (when it was
/// suspended for drift) returns it to TRUSTED.
pub fn restore(workspace: &Workspace, name: &str, comment: Option<&str>) -> Result<i32, Error> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let skill = ledger.skill(name)?;
    let (governing, lifecycle) =
        adopted_lifecycle(workspace, &ledger, &format!("`{name}` may not be restored"))?;
    let reverifies = governing
        .adoption()
        .map_err(Error::Usage)?
        .is_some_and(|policy| policy.on_change == OnChange::Reverify);
    if reverifies && skill.trusted_rules != Some(governing.row.id) {
        return Err(Error::Usage(format!(
            "`{name}` was trusted under {}, and the adopted rule set {} re-verifies skills \
             trusted under an older one (`on_change = \"reverify\"`): build it again with the \
             forge",
            trusted_under(&skill),
            governing.row.id
        )));
    }
    let restorable = skill.state == TRUSTED || lifecycle.drifted.as_ref() == Some(&skill.state);
    let (Some(trusted_hash), true) = (&skill.trusted_hash, restorable) else {
        return Err(Error::Usage(format!(
            "`{name}` is {}: only a trusted skill, or one suspended for drift, is restored",
            skill.state
        )));
    };
    let Some(tree) = &skill.trusted_tree else {
        return Err(Error::Usage(format!(
            "`{name}` was promoted before kavi kept trusted files; build it again with the forge"
        )));
    };
    let store = super::open_store(workspace)?;
    let templates = TemplateEngine::new(&workspace.templates_dir());
    let trust = load_trust(workspace, &templates)?;
    let refused = |reason: String| Error::Io {
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
    outln!(
        "restored `{name}`: its files are those trusted at {}; it is {TRUSTED}",
        short_hash(trusted_hash)
    );
    Ok(exit::SUCCESS)
}

/// Revokes a skill: it moves to the lifecycle's `revoked` state and no version of it runs again.
pub fn revoke(workspace: &Workspace, name: &str, comment: &str) -> Result<i32, Error> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let lifecycle = crate::policy::adoption::for_withdrawal(&ledger)
        .and_then(|governing| governing.lifecycle())
        .map_err(|why| Error::Usage(format!("`{name}` may not be revoked: {why}")))?;
    let Some(revoked) = &lifecycle.revoked else {
        return Err(Error::Usage(format!(
            "{LIFECYCLE} declares no `revoked` state to move `{name}` to"
        )));
    };
    ledger.skill(name)?;
    let trust = load_trust(workspace, &TemplateEngine::new(&workspace.templates_dir()))?;
    ledger
        .revoke_skill(
            name,
            revoked,
            |from, to| lifecycle.check(from, to),
            &crate::identity::actor(),
            comment,
        )
        .map_err(refused_move)?;
    rewrite_registry(workspace, &trust, &ledger)?;
    outln!("revoked `{name}`: it is {revoked} and does not run");
    Ok(exit::SUCCESS)
}

/// What running skills needs, loaded once for a command.
pub(super) struct SkillEnv {
    pub store: ArtifactStore,
    pub templates: TemplateEngine,
    pub trust: TrustPolicy,
    pub timeout: std::time::Duration,
    pub confinement: ConfinementPolicy,
    pub owner: Owner,
}

impl SkillEnv {
    pub fn load(workspace: &Workspace) -> Result<Self, Error> {
        let store = super::open_store(workspace)?;
        let templates = TemplateEngine::new(&workspace.templates_dir());
        let trust = load_trust(workspace, &templates)?;
        let timeout = workspace.config.skill_timeout().map_err(Error::Usage)?;
        let confinement = super::read_confinement(workspace, &templates)?;
        let owner =
            Owner::claim(&workspace.config.ledger, &store.temp_dir()).map_err(|source| {
                Error::Io {
                    context: "failed to claim a lock beside the ledger".into(),
                    source,
                }
            })?;
        Ok(Self {
            store,
            templates,
            trust,
            timeout,
            confinement,
            owner,
        })
    }

    /// A runner that logs to the configured JSONL log unless `log` is false.
    pub fn runner<'a>(&'a self, workspace: &'a Workspace, log: bool) -> Runner<'a> {
        Runner {
            root: &workspace.root,
            ledger: &workspace.config.ledger,
            artifacts: &self.store,
            templates: &self.templates,
            trust: &self.trust,
            log: log.then_some(workspace.config.executions_log.as_path()),
            timeout: self.timeout,
            confinement: &self.confinement,
            owner: &self.owner,
        }
    }
}

/// Refuses a side effect that nobody confirmed: `--yes`, or a yes at the terminal prompt.
pub(super) fn require_confirmation(name: &str, class: SideEffects, yes: bool) -> Result<(), Error> {
    if class.is_read_only() || yes || confirm(name, class)? {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "`{name}` is {class}: confirm with --yes (or answer the prompt on a terminal); nothing was run"
    )))
}

/// Prints an execution record and maps it to an exit code: 0 when the skill succeeded, 130 when
/// Ctrl-C stopped it.
pub(super) fn report(record: &ExecutionRecord, cancel: &CancellationToken) -> i32 {
    super::print_json(record);
    if record.success {
        exit::SUCCESS
    } else if cancel.is_cancelled() {
        super::cancelled_exit_code()
    } else {
        errln!(
            "error: `{}` failed: {}",
            record.skill,
            record.error.as_deref().unwrap_or("unknown")
        );
        exit::RUN_FAILED
    }
}

/// Runs a trusted skill: re-hash first and refuse on drift, confirm side effects, validate the
/// input and output against the schemas, and print the execution record.
pub async fn run(workspace: &Workspace, name: &str, input: &str, yes: bool) -> Result<i32, Error> {
    let input: serde_json::Value = serde_json::from_str(input)
        .map_err(|e| Error::Usage(format!("--input is not valid JSON: {e}")))?;
    // A skill that does not exist is said so before policies are read or anything is made.
    match Ledger::open_existing(&workspace.config.ledger) {
        Err(LedgerError::Missing(_)) => {
            return Err(Error::NotFound(format!(
                "no skill `{name}`: nothing has been recorded in this workspace yet"
            )));
        }
        ledger => drop(ledger?.skill(name)?),
    }
    let env = SkillEnv::load(workspace)?;
    let runner = env.runner(workspace, true);
    let ready = runner.ready(name)?;
    require_confirmation(name, ready.proposal.side_effect, yes)?;
    let cancel = super::cancel_on_signals("the skill");
    let record = runner
        .run(&ready, input, &Lineage::default(), &cancel)
        .await?;
    Ok(report(&record, &cancel))
}

/// Lists trusted skills with what a caller needs: description, side effect, secrets, schemas.
pub fn list(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let mut listed = Vec::new();
    // No ledger is no skills: listing must not make one.
    match Ledger::open_existing(&workspace.config.ledger) {
        Err(LedgerError::Missing(_)) => {}
        ledger => {
            let ledger = ledger?;
            let store = super::open_store(workspace)?;
            for trusted in ledger.trusted_skills(TRUSTED)? {
                let proposal =
                    Proposal::from_artifact(&store, &trusted.spec_artifact).map_err(|e| {
                        Error::Io {
                            context: format!("failed to read the proposal of `{}`", trusted.name),
                            source: std::io::Error::other(e),
                        }
                    })?;
                listed.push(json!({
                    "name": trusted.name,
                    "version": trusted.version,
                    "description": proposal.description,
                    "side_effect": proposal.side_effect,
                    "secrets": proposal.secrets,
                    "input_schema": proposal.input_schema,
                    "output_schema": proposal.output_schema,
                    "trusted_hash": trusted.trusted_hash,
                }));
            }
        }
    }
    if json {
        super::print_json(&listed);
        return Ok(exit::SUCCESS);
    }
    if listed.is_empty() {
        outln!(
            "no trusted skills yet; the forge makes them: kavi pipeline run forge.toml --set skill=NAME"
        );
        return Ok(exit::SUCCESS);
    }
    let mut rows = vec![
        ["SKILL", "SIDE EFFECT", "SECRETS", "INPUT", "DESCRIPTION"]
            .map(String::from)
            .to_vec(),
    ];
    for skill in &listed {
        let secrets: Vec<&str> = skill["secrets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str())
            .collect();
        let fields: Vec<&str> = skill["input_schema"]["properties"]
            .as_object()
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        rows.push(vec![
            skill["name"].as_str().unwrap_or_default().to_owned(),
            skill["side_effect"].as_str().unwrap_or_default().to_owned(),
            if secrets.is_empty() {
                "-".into()
            } else {
                secrets.join(", ")
            },
            if fields.is_empty() {
                "-".into()
            } else {
                fields.join(", ")
            },
            skill["description"].as_str().unwrap_or_default().to_owned(),
        ]);
    }
    out!("{}", table(&rows));
    Ok(exit::SUCCESS)
}

/// Asks on the terminal; without one there is nobody to ask, so the answer is no.
pub(super) fn confirm(name: &str, class: SideEffects) -> Result<bool, Error> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("`{name}` is {class}. Run it? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|source| Error::Io {
            context: "failed to read the answer".into(),
            source,
        })?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

pub(super) fn load_trust(
    workspace: &Workspace,
    templates: &TemplateEngine,
) -> Result<TrustPolicy, Error> {
    let read = |path: &str| super::read_policy(workspace, path);
    let conventions = Conventions::parse(&read(conventions::DEFAULT_POLICY)?, templates)
        .map_err(SpecError::from)?;
    Ok(TrustPolicy::parse(&read(trust::DEFAULT_POLICY)?, conventions).map_err(SpecError::from)?)
}
