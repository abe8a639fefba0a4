//! `kavi policy diff`: what changed in governance between two runs, or between a run and the
//! workspace as it is now, in words first and then as a text diff; and the rule changes'
//! `propose|approve|reject|adopt`, whose logic is kavi_governance::adoption's.

use kavi_governance::adoption::{self, Member, PolicyDiff, Proposed, Side};

use crate::config::Workspace;
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::error::{Error, exit};
use crate::hash::short_hash;
use crate::ledger::Ledger;
use crate::policy::adoption::Class;
use crate::policy::roles::{DEFAULT_POLICY as ROLES, Roles};
use crate::skills::Lifecycle;
use crate::spec::SpecError;

/// The lifecycle every skill command follows.
const LIFECYCLE: &str = crate::skills::LIFECYCLE_POLICY;

pub(super) use kavi_governance::adoption::{adopt_on_first_use, audit};

/// What changed in the files that govern run `run_id`'s pipeline since it ran, each file once;
/// empty when nothing did.
pub(super) fn changed_since(
    workspace: &Workspace,
    ledger: &Ledger,
    run_id: i64,
) -> Result<Vec<adoption::FileChange>, Error> {
    let from = Side::of_run(ledger, &run_id.to_string())?;
    let to = workspace_side(workspace, &ledger.run(run_id)?.spec_path)?;
    Ok(PolicyDiff::between(from, to).files)
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
    Ok(Side::of_workspace(members))
}

/// Exits 0 when both sides are governed by the same files, 1 when governance changed.
pub fn diff(workspace: &Workspace, from: &str, to: Option<&str>, json: bool) -> Result<i32, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let from = Side::of_run(&ledger, from)?;
    let to = match to {
        Some(reference) => Side::of_run(&ledger, reference)?,
        None => {
            let spec_path = ledger.run(from.run.unwrap_or_default())?.spec_path;
            workspace_side(workspace, &spec_path)?
        }
    };
    let report = PolicyDiff::between(from, to);
    let code = if report.files.is_empty() {
        exit::SUCCESS
    } else {
        exit::RUN_FAILED
    };
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
pub fn check(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let mut problems: Vec<Diagnostic> = Vec::new();
    let mut add = |found: Vec<Diagnostic>| problems.extend(found);
    let spec_problems = |error: &SpecError| match error {
        SpecError::Invalid(found) => found.0.clone(),
        other => vec![Diagnostic::new(other.to_string())],
    };
    // Every policy file there is, whole, each with all its problems of shape: a file no
    // pipeline reads (the chat's, the MCP server's) is checked too, and a file's second typo
    // is shown with its first. Its loader's own checks follow below.
    for published in crate::schemas::all() {
        let Some(problems) = published.problems else {
            continue;
        };
        if !workspace.root.join(published.describes).exists() {
            continue;
        }
        match crate::policy::read(&workspace.root, published.describes) {
            Ok(source) => add(problems(&source)),
            Err(problem) => add(vec![Diagnostic::new(problem)]),
        }
    }
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
    let proposals = kavi_governance::skills::workspace_proposals(workspace);
    for loaded in &proposals {
        if let Err(problem) = loaded {
            add(vec![problem.clone()]);
        }
    }
    // A pipeline that reads a broken policy reports what `check` already found there, perhaps
    // with a note of its own: it is said once.
    let problems = crate::diagnostic::said_once(problems);
    if !problems.is_empty() {
        return Err(Error::Spec(SpecError::Invalid(Diagnostics(problems))));
    }
    if json {
        super::print_json(&serde_json::json!({
            "ok": true,
            "pipelines": pipelines.len(),
            "chains": chains.len(),
            "proposals": proposals.len(),
            "problems": [],
        }));
    } else {
        outln!(
            "ok: {LIFECYCLE} has no dead end; {} pipelines, {} chains and {} proposals check, with every policy they read",
            pipelines.len(),
            chains.len(),
            proposals.len()
        );
    }
    Ok(exit::SUCCESS)
}

/// `kavi policy diff` without a run: the governing files on disk against the adopted set, each
/// change classified by the adopted `[adoption]` rules, and the rule changes pending. Exits 0
/// when the files are the adopted set, 1 when they differ.
pub fn adoption_diff(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let status = adoption::status(workspace)?;
    let (base, changes) = (&status.adopted.row, &status.changes);
    let code = if changes.is_empty() {
        exit::SUCCESS
    } else {
        exit::RUN_FAILED
    };
    if json {
        super::print_json(&serde_json::json!({
            "adopted": base,
            "files_hash": status.files_hash,
            "class": (!changes.is_empty()).then_some(status.class),
            "changes": changes
                .iter()
                .map(|(change, class)| serde_json::json!({ "change": change, "class": class }))
                .collect::<Vec<_>>(),
            "pending": status.pending,
        }));
        return Ok(code);
    }
    outln!(
        "adopted: rule set {} ({}, {}, by {})",
        base.id,
        short_hash(&base.set_hash),
        base.class,
        base.decided_by.as_deref().unwrap_or(&base.proposed_by)
    );
    if changes.is_empty() {
        outln!("the governing files are the adopted rule set");
    } else {
        outln!(
            "the governing files differ from it ({}), {}:",
            short_hash(&status.files_hash),
            status.class.as_str()
        );
        for (change, class) in changes {
            outln!("  {:<13}  {change}", class.as_str());
        }
    }
    for (change, approvals) in status.pending.iter().zip(status.approvals()?) {
        let these = if change.set_hash == status.files_hash {
            ", of exactly these files"
        } else {
            ""
        };
        let approvals = match approvals {
            Some(Ok(())) => "its approvals are complete".to_owned(),
            Some(Err(missing)) => format!("it {missing}"),
            None => "it may be adopted at once".to_owned(),
        };
        outln!(
            "pending: rule change {} ({}{these}) by {}: {approvals}",
            change.id,
            change.class,
            change.proposed_by
        );
    }
    if !changes.is_empty()
        && !status
            .pending
            .iter()
            .any(|c| c.set_hash == status.files_hash)
    {
        outln!("no pending change proposes these files: `kavi policy propose`");
    }
    Ok(code)
}

/// `kavi policy propose`: records the working copy of the governing files as a pending change to
/// the adopted set, each part classified.
pub fn propose(workspace: &Workspace, message: Option<&str>) -> Result<i32, Error> {
    let proposal = match adoption::propose(workspace, message)? {
        Proposed::Unchanged(hash) => {
            outln!(
                "the governing files are the adopted rule set ({}): nothing to propose",
                short_hash(&hash)
            );
            return Ok(exit::SUCCESS);
        }
        Proposed::Recorded(proposal) => proposal,
    };
    let id = proposal.id;
    outln!(
        "proposed rule change {id} ({}): {} -> {} by {}",
        proposal.class.as_str(),
        short_hash(&proposal.from_hash),
        short_hash(&proposal.to_hash),
        proposal.actor
    );
    for (change, class) in &proposal.changes {
        outln!("  {:<13}  {change}", class.as_str());
    }
    if proposal.class == Class::Weakening {
        outln!(
            "it weakens the rules: it needs {} approvals by a {} other than its proposer \
             (`kavi policy approve {id}`), then `kavi policy adopt {id}`",
            proposal.policy.weakening.approvals,
            proposal.policy.weakening.role
        );
    } else {
        outln!("it does not weaken the rules: adopt it with `kavi policy adopt {id}`");
    }
    Ok(exit::SUCCESS)
}

/// `kavi policy approve ID` / `kavi policy reject ID`.
pub fn decide(workspace: &Workspace, id: i64, approve: bool) -> Result<i32, Error> {
    if !approve {
        let actor = adoption::reject(workspace, id)?;
        outln!("rejected rule change {id} by {actor}");
        return Ok(exit::SUCCESS);
    }
    let approved = adoption::approve(workspace, id)?;
    outln!(
        "approved rule change {id} by {} (roles: {})",
        approved.actor,
        if approved.roles.is_empty() {
            "none".to_owned()
        } else {
            approved.roles.join(", ")
        }
    );
    match approved.missing {
        None => outln!("its approvals are complete: adopt it with `kavi policy adopt {id}`"),
        Some(missing) => outln!("not yet adoptable: {missing}"),
    }
    Ok(exit::SUCCESS)
}

/// `kavi policy key`: this account's own key, made on first use, as the `[keys]` line of
/// `policies/roles.toml` that pins it.
pub fn key() -> Result<i32, Error> {
    let path = crate::ledger::keys::person_key();
    let key = crate::ledger::checkpoint::load_or_generate(&path).map_err(Error::Usage)?;
    let actor = crate::identity::actor();
    let account = actor
        .split_once(" (uid ")
        .map_or(actor.as_str(), |(name, _)| name);
    outln!(
        "\"{account}\" = \"ed25519:{}\"",
        crate::ledger::checkpoint::public_hex(&key.verifying_key())
    );
    Ok(exit::SUCCESS)
}

/// `kavi policy adopt ID`: makes a pending change the adopted set, then re-verifies the skills
/// trusted under an older one when its rules say so.
pub fn adopt(workspace: &Workspace, id: i64) -> Result<i32, Error> {
    let adopted = adoption::adopt(workspace, id)?;
    for line in adoption::adopted_lines(&adopted) {
        outln!("{line}");
    }
    Ok(exit::SUCCESS)
}
