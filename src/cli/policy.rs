//! `kavi policy diff`: what changed in governance between two runs, or between a run and the
//! workspace as it is now, in words first and then as a text diff.

use serde::Serialize;
use similar::TextDiff;

use crate::config::Workspace;
use crate::diagnostic::SourceFile;
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::error::{Error, exit};
use crate::hash::set_hash;
use crate::hash::short_hash;
use crate::ledger::Ledger;
use crate::ledger::RecordedApproval;
use crate::ledger::{NewRuleSet, RuleSetRow};
use crate::policy::adoption::{self, AdoptionPolicy, Class, Governing, RuleSet};
use crate::policy::roles::{DEFAULT_POLICY as ROLES, Excluded, Roles};
use crate::skills::Lifecycle;
use crate::spec::SpecError;

/// The lifecycle every skill command follows.
const LIFECYCLE: &str = crate::skills::LIFECYCLE_POLICY;

/// One side of the comparison: its governing set, member by member.
#[derive(Debug, Serialize)]
struct Side {
    /// The run, or none for the workspace as it is now.
    run: Option<i64>,
    governing_hash: String,
    #[serde(skip)]
    members: Vec<Member>,
}

#[derive(Debug)]
struct Member {
    role: String,
    path: String,
    hash: String,
    text: String,
}

impl Side {
    fn label(&self) -> String {
        match self.run {
            Some(id) => format!("run {id}"),
            None => "the workspace now".to_owned(),
        }
    }

    fn member(&self, path: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.path == path)
    }
}

#[derive(Debug, Serialize)]
struct FileChange {
    path: String,
    role: String,
    /// `added`, `removed` or `changed`.
    change: &'static str,
    from_hash: Option<String>,
    to_hash: Option<String>,
    /// What the change means, one sentence each (TOML files only).
    meaning: Vec<String>,
    /// The unified text diff.
    diff: String,
}

#[derive(Debug, Serialize)]
struct PolicyDiff {
    from: Side,
    to: Side,
    files: Vec<FileChange>,
}

/// What changed in the files that govern run `run_id`'s pipeline since it ran, one line each
/// (`changed policies/gates.toml (policy)`); empty when nothing did.
pub(super) fn changed_since(
    workspace: &Workspace,
    ledger: &Ledger,
    run_id: i64,
) -> Result<Vec<String>, Error> {
    let from = run_side(ledger, &run_id.to_string())?;
    let to = workspace_side(workspace, &ledger.run(run_id)?.spec_path)?;
    Ok(compare(&from, &to)
        .into_iter()
        .map(|file| format!("{} {} ({})", file.change, file.path, file.role))
        .collect())
}

/// A recorded run's governing set.
fn run_side(ledger: &Ledger, reference: &str) -> Result<Side, Error> {
    let run = ledger.run(ledger.resolve_run(reference)?)?;
    let mut members = Vec::new();
    for file in ledger.governing(run.id)? {
        let (_, text) = ledger.spec_text(&file.spec_hash)?;
        members.push(Member {
            role: file.role,
            path: file.path,
            hash: file.spec_hash,
            text,
        });
    }
    let governing_hash = run.governing_hash.clone().unwrap_or_else(|| {
        set_hash(
            members
                .iter()
                .map(|m| (m.role.as_str(), m.path.as_str(), m.hash.as_str())),
        )
    });
    Ok(Side {
        run: Some(run.id),
        governing_hash,
        members,
    })
}

/// The set a run of `spec_path` would be governed by if it started now.
fn workspace_side(workspace: &Workspace, spec_path: &str) -> Result<Side, Error> {
    let (pipeline, _) = super::pipeline::load(workspace, spec_path)?;
    let governing = pipeline
        .governing
        .resolved(&workspace.run_config(), &workspace.root);
    let members: Vec<Member> = governing
        .members()
        .into_iter()
        .map(|(role, path, hash, text)| Member {
            role: role.as_str().to_owned(),
            path,
            hash,
            text: text.to_owned(),
        })
        .collect();
    let governing_hash = set_hash(
        members
            .iter()
            .map(|m| (m.role.as_str(), m.path.as_str(), m.hash.as_str())),
    );
    Ok(Side {
        run: None,
        governing_hash,
        members,
    })
}

fn compare(from: &Side, to: &Side) -> Vec<FileChange> {
    let mut paths: Vec<&str> = from
        .members
        .iter()
        .chain(&to.members)
        .map(|m| m.path.as_str())
        .collect();
    paths.sort_unstable();
    paths.dedup();
    let (from_label, to_label) = (from.label(), to.label());
    paths
        .into_iter()
        .filter_map(|path| {
            let (before, after) = (from.member(path), to.member(path));
            let change = match (before, after) {
                (Some(b), Some(a)) if b.hash == a.hash => return None,
                (Some(_), Some(_)) => "changed",
                (Some(_), None) => "removed",
                (None, _) => "added",
            };
            let old_text = before.map_or("", |m| m.text.as_str());
            let new_text = after.map_or("", |m| m.text.as_str());
            let meaning = match (before, after) {
                (Some(_), Some(_)) if path.ends_with(".toml") => {
                    crate::policy::diff::describe(old_text, new_text).unwrap_or_else(|| {
                        vec!["one version is not valid TOML; see the text diff".to_owned()]
                    })
                }
                _ => Vec::new(),
            };
            let diff = TextDiff::from_lines(old_text, new_text)
                .unified_diff()
                .context_radius(3)
                .header(
                    &format!("{from_label}/{path}"),
                    &format!("{to_label}/{path}"),
                )
                .to_string();
            let role = after.or(before).map(|m| m.role.clone()).unwrap_or_default();
            Some(FileChange {
                path: path.to_owned(),
                role,
                change,
                from_hash: before.map(|m| m.hash.clone()),
                to_hash: after.map(|m| m.hash.clone()),
                meaning,
                diff,
            })
        })
        .collect()
}

/// Exits 0 when both sides are governed by the same files, 1 when governance changed.
pub fn diff(workspace: &Workspace, from: &str, to: Option<&str>, json: bool) -> Result<i32, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let from = run_side(&ledger, from)?;
    let to = match to {
        Some(reference) => run_side(&ledger, reference)?,
        None => {
            let spec_path = ledger.run(from.run.unwrap_or_default())?.spec_path;
            workspace_side(workspace, &spec_path)?
        }
    };
    let files = compare(&from, &to);
    let code = if files.is_empty() {
        exit::SUCCESS
    } else {
        exit::RUN_FAILED
    };
    let report = PolicyDiff { from, to, files };
    if json {
        super::print_json(&report);
        return Ok(code);
    }
    let (from, to) = (&report.from, &report.to);
    if report.files.is_empty() {
        outln!(
            "no change in governance: {} and {} are governed by the same files ({})",
            from.label(),
            to.label(),
            short_hash(&to.governing_hash)
        );
        return Ok(code);
    }
    outln!(
        "governance changed from {} ({}) to {} ({}):",
        from.label(),
        short_hash(&from.governing_hash),
        to.label(),
        short_hash(&to.governing_hash)
    );
    for file in &report.files {
        outln!("  {:<8} {} ({})", file.change, file.path, file.role);
        for sentence in &file.meaning {
            outln!("             {sentence}");
        }
    }
    for file in &report.files {
        outln!();
        out!("{}", file.diff);
    }
    Ok(code)
}

/// Checks the workspace's governance as a whole: what keeps the lifecycle from being carried
/// out (see [`Lifecycle::problems`]), then every pipeline and chain with every policy they read.
/// Every problem is reported, each pointing into its file (exit 3 when there is one).
pub fn check(workspace: &Workspace) -> Result<i32, Error> {
    let mut problems: Vec<Diagnostic> = Vec::new();
    let mut add = |found: Vec<Diagnostic>| {
        for diagnostic in found {
            // A pipeline that reads a broken policy reports what `check` already found there,
            // perhaps with a note of its own: the same message at the same place is one problem.
            if !problems
                .iter()
                .any(|p| p.message == diagnostic.message && p.position() == diagnostic.position())
            {
                problems.push(diagnostic);
            }
        }
    };
    let spec_problems = |error: &SpecError| match error {
        SpecError::Invalid(found) => found.0.clone(),
        other => vec![Diagnostic::new(other.to_string())],
    };
    // A workspace made before roles existed has no roles file; one that has it must read.
    let roles = match workspace.root.join(ROLES).exists() {
        true => match Roles::load(&workspace.root) {
            Ok(roles) => Some(roles),
            Err(problem) => {
                add(vec![problem]);
                None
            }
        },
        false => None,
    };
    match crate::policy::read(&workspace.root, LIFECYCLE)
        .map_err(Diagnostic::new)
        .and_then(|source| Lifecycle::parse_declared(&source))
    {
        Ok(lifecycle) => {
            add(lifecycle.problems());
            if roles.is_some() || !workspace.root.join(ROLES).exists() {
                add(lifecycle.role_problems(roles.as_ref()));
            }
        }
        Err(problem) => add(vec![problem]),
    }
    let pipelines = super::listing::workspace_pipelines(workspace);
    for (_, loaded) in &pipelines {
        if let Err(error) = loaded {
            add(spec_problems(error));
        }
    }
    let chains = super::listing::workspace_chains(workspace);
    for (_, loaded) in &chains {
        if let Err(error) = loaded {
            add(spec_problems(error));
        }
    }
    let proposals = workspace_proposals(workspace);
    for loaded in &proposals {
        if let Err(problem) = loaded {
            add(vec![problem.clone()]);
        }
    }
    if !problems.is_empty() {
        return Err(Error::Spec(SpecError::Invalid(Diagnostics(problems))));
    }
    outln!(
        "ok: {LIFECYCLE} has no dead end; {} pipelines, {} chains and {} proposals check, with every policy they read",
        pipelines.len(),
        chains.len(),
        proposals.len()
    );
    Ok(exit::SUCCESS)
}

/// Each proposal under `proposals/`, parsed and its `writes` checked against the workspace as it
/// is now (a symlink made since it was proposed is found here), in name order.
fn workspace_proposals(workspace: &Workspace) -> Vec<Result<(), Diagnostic>> {
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
            let source = crate::diagnostic::SourceFile::new(shown, text);
            crate::skills::Proposal::parse(&source)?.check_writes(&source, &workspace.root)
        })
        .collect()
}

/// Trust on first use: a ledger with no rule set recorded adopts the governing files the first
/// run finds, recorded as `first-use`.
pub(super) fn adopt_on_first_use(workspace: &Workspace, ledger: &mut Ledger) -> Result<(), Error> {
    if !ledger.rule_sets()?.is_empty() {
        return Ok(());
    }
    let set = RuleSet::read(&workspace.root).map_err(Error::Usage)?;
    let files = keep_rule_set(ledger, &set)?;
    ledger.record_rule_set(
        &NewRuleSet {
            set_hash: &set.hash,
            files: &files,
            class: "first-use",
            changes: &serde_json::json!([]),
            based_on: None,
            actor: &crate::identity::actor(),
            message: Some("adopted on first use"),
        },
        true,
    )?;
    Ok(())
}

/// Keeps each file's text in the ledger; returns path -> spec hash.
fn keep_rule_set(ledger: &Ledger, set: &RuleSet) -> Result<serde_json::Value, Error> {
    let mut files = serde_json::Map::new();
    for (path, text) in &set.files {
        let hash = ledger.keep_spec(&SourceFile::new(path.as_str(), text.as_str()))?;
        files.insert(path.clone(), hash.into());
    }
    Ok(files.into())
}

/// The adopted set, or an error saying none is.
fn adopted(ledger: &Ledger) -> Result<Governing, Error> {
    Governing::adopted(ledger)
        .map_err(Error::Usage)?
        .ok_or_else(|| {
            Error::Usage(
                "no rule set is adopted in this ledger yet: the first `kavi pipeline run` adopts \
                 the one it runs under"
                    .to_owned(),
            )
        })
}

/// The adoption rules and roles as the adopted set has them: a proposal cannot reclassify itself
/// nor grant its proposer a role.
fn adopted_rules(set: &Governing) -> Result<(AdoptionPolicy, Roles), Error> {
    let policy = set.adoption().map_err(Error::Usage)?.ok_or_else(|| {
        Error::Usage(format!(
            "the adopted {} has no [adoption] table: changes to the rules cannot be classified",
            crate::skills::trust::DEFAULT_POLICY
        ))
    })?;
    let roles = set.roles().map_err(Error::Usage)?.ok_or_else(|| {
        Error::Usage(format!(
            "the adopted rule set has no {ROLES}: no one holds a role"
        ))
    })?;
    Ok((policy, roles))
}

/// `kavi policy diff` without a run: the governing files on disk against the adopted set, each
/// change classified by the adopted `[adoption]` rules, and the rule changes pending. Exits 0
/// when the files are the adopted set, 1 when they differ.
pub fn adoption_diff(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let base = adopted(&ledger)?;
    let set = RuleSet::read(&workspace.root).map_err(Error::Usage)?;
    let changes = base.changes_to(&set).map_err(Error::Usage)?;
    let class = adoption::overall(&changes.iter().map(|(_, c)| *c).collect::<Vec<_>>());
    let pending: Vec<RuleSetRow> = ledger
        .rule_sets()?
        .into_iter()
        .filter(|s| s.status == "pending")
        .collect();
    let code = if changes.is_empty() {
        exit::SUCCESS
    } else {
        exit::RUN_FAILED
    };
    if json {
        super::print_json(&serde_json::json!({
            "adopted": base.row,
            "files_hash": set.hash,
            "class": (!changes.is_empty()).then_some(class),
            "changes": changes
                .iter()
                .map(|(change, class)| serde_json::json!({ "change": change, "class": class }))
                .collect::<Vec<_>>(),
            "pending": pending,
        }));
        return Ok(code);
    }
    outln!(
        "adopted: rule set {} ({}, {}, by {})",
        base.row.id,
        short_hash(&base.row.set_hash),
        base.row.class,
        base.row
            .decided_by
            .as_deref()
            .unwrap_or(&base.row.proposed_by)
    );
    if changes.is_empty() {
        outln!("the governing files are the adopted rule set");
    } else {
        outln!(
            "the governing files differ from it ({}), {}:",
            short_hash(&set.hash),
            class.as_str()
        );
        for (change, class) in &changes {
            outln!("  {:<13}  {change}", class.as_str());
        }
    }
    let policy = base.adoption().map_err(Error::Usage)?;
    for change in &pending {
        let these = if change.set_hash == set.hash {
            ", of exactly these files"
        } else {
            ""
        };
        let approvals = match (&policy, change.class == Class::Weakening.as_str()) {
            (Some(policy), true) => {
                match policy.weakening.met_by(&change.approvals, proposer(change)) {
                    Ok(()) => "its approvals are complete".to_owned(),
                    Err(missing) => format!("it {missing}"),
                }
            }
            _ => "it may be adopted at once".to_owned(),
        };
        outln!(
            "pending: rule change {} ({}{these}) by {}: {approvals}",
            change.id,
            change.class,
            change.proposed_by
        );
    }
    if !changes.is_empty() && !pending.iter().any(|c| c.set_hash == set.hash) {
        outln!("no pending change proposes these files: `kavi policy propose`");
    }
    Ok(code)
}

/// What `kavi ledger verify` checks of the rule sets, and their story: each set's files still
/// make its hash and are kept; exactly one is adopted; only the first was adopted on first use;
/// each one adopted weakening the rules had the approvals its base's `[adoption]` asked, never
/// its proposer's. Returns (problems, one line per set).
pub(super) fn audit(ledger: &Ledger) -> Result<(Vec<String>, Vec<String>), Error> {
    let sets = ledger.rule_sets()?;
    let mut problems = Vec::new();
    let mut story = Vec::new();
    let adopted = sets.iter().filter(|s| s.status == "adopted").count();
    if !sets.is_empty() && adopted != 1 {
        problems.push(format!(
            "{adopted} rule sets are adopted, where exactly one must be"
        ));
    }
    for set in &sets {
        let id = set.id;
        let members: Vec<(&str, &str)> = set
            .files
            .as_object()
            .into_iter()
            .flatten()
            .map(|(path, hash)| (path.as_str(), hash.as_str().unwrap_or_default()))
            .collect();
        let hash = set_hash(members.iter().map(|(p, h)| (adoption::ROLE, *p, *h)));
        if hash != set.set_hash {
            problems.push(format!(
                "rule set {id}: its files hash to {hash}, not the {} recorded",
                set.set_hash
            ));
        }
        for (path, hash) in &members {
            if let Err(e) = ledger.spec_text(hash) {
                problems.push(format!("rule set {id}: {path}: {e}"));
            }
        }
        if set.class == "first-use" && sets.first().map(|s| s.id) != Some(id) {
            problems.push(format!(
                "rule set {id} says it was adopted on first use, but rule sets were recorded \
                 before it"
            ));
        }
        let was_adopted = matches!(set.status.as_str(), "adopted" | "superseded");
        if was_adopted && set.class == Class::Weakening.as_str() {
            let base = sets.iter().find(|s| Some(s.id) == set.based_on);
            let required = base
                .map(|base| Governing::of(ledger, base.clone()).and_then(|g| g.adoption()))
                .transpose()
                .map_err(Error::Usage)?
                .flatten();
            match required {
                None => problems.push(format!(
                    "rule set {id} was adopted weakening the rules, but no adopted set it was \
                     based on names what that needs"
                )),
                Some(policy) => {
                    if let Err(missing) = policy.weakening.met_by(&set.approvals, proposer(set)) {
                        problems.push(format!(
                            "rule set {id} was adopted weakening the rules, but it {missing}"
                        ));
                    }
                }
            }
        }
        let approved = match set.approvals.as_slice() {
            [] => String::new(),
            approvals => format!(
                ", approved by {}",
                approvals
                    .iter()
                    .map(|a| a.actor.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let decided = match (set.status.as_str(), &set.decided_by) {
            ("superseded", Some(by)) => format!(", adopted by {by}, since superseded"),
            (status, Some(by)) => format!(", {status} by {by}"),
            (status, None) => format!(", {status}"),
        };
        story.push(format!(
            "rule set {id} ({}): {}, proposed by {}{approved}{decided}",
            short_hash(&set.set_hash),
            set.class,
            set.proposed_by
        ));
    }
    Ok((problems, story))
}

/// `kavi policy propose`: records the working copy of the governing files as a pending change to
/// the adopted set, each part classified.
pub fn propose(workspace: &Workspace, message: Option<&str>) -> Result<i32, Error> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let base = adopted(&ledger)?;
    let set = RuleSet::read(&workspace.root).map_err(Error::Usage)?;
    if set.hash == base.row.set_hash {
        outln!(
            "the governing files are the adopted rule set ({}): nothing to propose",
            short_hash(&base.row.set_hash)
        );
        return Ok(exit::SUCCESS);
    }
    let (policy, _) = adopted_rules(&base)?;
    let changes = base.changes_to(&set).map_err(Error::Usage)?;
    let class = adoption::overall(&changes.iter().map(|(_, c)| *c).collect::<Vec<_>>());
    let recorded = serde_json::Value::Array(
        changes
            .iter()
            .map(|(change, class)| serde_json::json!({ "change": change, "class": class }))
            .collect(),
    );
    let kept = keep_rule_set(&ledger, &set)?;
    let actor = crate::identity::actor();
    let id = ledger.record_rule_set(
        &NewRuleSet {
            set_hash: &set.hash,
            files: &kept,
            class: class.as_str(),
            changes: &recorded,
            based_on: Some(base.row.id),
            actor: &actor,
            message,
        },
        false,
    )?;
    outln!(
        "proposed rule change {id} ({}): {} -> {} by {actor}",
        class.as_str(),
        short_hash(&base.row.set_hash),
        short_hash(&set.hash)
    );
    for (change, class) in &changes {
        outln!("  {:<13}  {change}", class.as_str());
    }
    if class == Class::Weakening {
        outln!(
            "it weakens the rules: it needs {} approvals by a {} other than its proposer \
             (`kavi policy approve {id}`), then `kavi policy adopt {id}`",
            policy.weakening.approvals,
            policy.weakening.role
        );
    } else {
        outln!("it does not weaken the rules: adopt it with `kavi policy adopt {id}`");
    }
    Ok(exit::SUCCESS)
}

/// A pending change, or an error saying what became of it.
fn pending(ledger: &Ledger, id: i64) -> Result<RuleSetRow, Error> {
    let change = ledger.rule_set(id)?;
    if change.status != "pending" {
        return Err(Error::Usage(format!(
            "rule change {id} is {}, not pending",
            change.status
        )));
    }
    Ok(change)
}

/// `kavi policy approve ID` / `kavi policy reject ID`.
pub fn decide(workspace: &Workspace, id: i64, approve: bool) -> Result<i32, Error> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let change = pending(&ledger, id)?;
    let actor = crate::identity::actor();
    if !approve {
        ledger.decide_rule_set(id, "rejected", &actor)?;
        outln!("rejected rule change {id} by {actor}");
        return Ok(exit::SUCCESS);
    }
    if change.proposed_by == actor {
        return Err(Error::Usage(format!(
            "{actor} proposed rule change {id}: the proposer's approval never counts, another \
             account must approve it"
        )));
    }
    let (policy, roles) = adopted_rules(&adopted(&ledger)?)?;
    let held = roles.held_by_current_process();
    let approval = RecordedApproval {
        actor: actor.clone(),
        roles: held.clone(),
    };
    let change = ledger.approve_rule_set(id, &approval)?;
    outln!(
        "approved rule change {id} by {actor} (roles: {})",
        if held.is_empty() {
            "none".to_owned()
        } else {
            held.join(", ")
        }
    );
    match policy
        .weakening
        .met_by(&change.approvals, proposer(&change))
    {
        Ok(()) => outln!("its approvals are complete: adopt it with `kavi policy adopt {id}`"),
        Err(missing) => outln!("not yet adoptable: {missing}"),
    }
    Ok(exit::SUCCESS)
}

fn proposer(change: &RuleSetRow) -> Excluded<'_> {
    Excluded {
        actor: &change.proposed_by,
        described: "the proposer",
    }
}

/// `kavi policy adopt ID`: makes a pending change the adopted set, once its files are still those
/// proposed, it changes the set adopted now, and a weakening one has its approvals.
pub fn adopt(workspace: &Workspace, id: i64) -> Result<i32, Error> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let change = pending(&ledger, id)?;
    let base = adopted(&ledger)?;
    if change.based_on != Some(base.row.id) {
        return Err(Error::Usage(format!(
            "rule change {id} was proposed against another adopted set than {} (now adopted): \
             propose it again",
            short_hash(&base.row.set_hash)
        )));
    }
    let set = RuleSet::read(&workspace.root).map_err(Error::Usage)?;
    if set.hash != change.set_hash {
        return Err(Error::Usage(format!(
            "the governing files changed since rule change {id} was proposed ({} then, {} now): \
             propose them again",
            short_hash(&change.set_hash),
            short_hash(&set.hash)
        )));
    }
    if change.class == Class::Weakening.as_str() {
        let (policy, _) = adopted_rules(&base)?;
        policy
            .weakening
            .met_by(&change.approvals, proposer(&change))
            .map_err(|missing| {
                Error::Usage(format!("rule change {id} weakens the rules and {missing}"))
            })?;
    }
    let actor = crate::identity::actor();
    ledger.decide_rule_set(id, "adopted", &actor)?;
    outln!(
        "adopted rule change {id} ({}) by {actor}: {} governs",
        change.class,
        short_hash(&change.set_hash)
    );
    let governing = adopted(&ledger)?;
    for skill in super::skills::reverify_older(workspace, &mut ledger, &governing)? {
        outln!(
            "`{skill}` was trusted under an older rule set: it is suspended until the forge \
             builds and gates it again (`on_change = \"reverify\"`)"
        );
    }
    Ok(exit::SUCCESS)
}
