//! `kavi approve RUN` and `kavi reject RUN` without their printing: a person's decision on a run
//! that stopped for review.
//!
//! The decision covers the run a user started and every child run under it (a forge attempt
//! escalates in its own child run), so either id may be given. It is made under the adopted
//! rules: which approvals count, recording an approval of an escalation, the lifecycle moves an
//! approval makes (a promotion walks on to TRUSTED), and undoing the files of a rejected run.
//! Resuming an approved run (running its pipeline again) is the CLI's.

use serde_json::Value;

use kavi_forge::nodes::escalate::{self, ApprovalRule};
use kavi_forge::nodes::review::approval_triggers;

use crate::config::Workspace;
use crate::hash::short_hash;
use crate::ledger::{APPROVAL, RecordedApproval};
use crate::ledger::{EscalationRow, Ledger, RunRow};
use crate::policy::adoption::Governing;
use crate::policy::roles::{Excluded, Requirement};
use crate::signing::{self, Signer, Subject};
use crate::skill::LIFECYCLE_POLICY as LIFECYCLE;
use crate::skill::promotion::{Advanced, Promotion};
use crate::skill::trust::SkillTree;
use crate::skill::{Approval, TRUSTED};
use crate::template::TemplateEngine;
use crate::{GovernanceError, Result};

/// What a person decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Reject,
}

/// A decision on a run, made: the run a user started, who decided, and what came of it.
#[derive(Debug)]
pub struct Review {
    pub root: RunRow,
    pub actor: String,
    pub outcome: Outcome,
}

/// What came of a decision.
#[derive(Debug)]
pub enum Outcome {
    /// The approval is recorded, but the escalation rules ask for more: what is missing.
    NeedsApprovals(String),
    /// A lifecycle move still needs approvals, or the walk to TRUSTED reached one that does: the
    /// run keeps awaiting review.
    Waiting,
    Decided(Decided),
}

/// The escalations a decision settled and what it did besides.
#[derive(Debug)]
pub struct Decided {
    pub escalations: Vec<EscalationRow>,
    /// What a rejection did to each skill's files and lifecycle, to say after the escalations.
    pub undone: Vec<String>,
    /// The approval asked only for lifecycle moves, and made them all.
    pub only_moves: bool,
    /// Each move made led its skill to TRUSTED.
    pub reached_trust: bool,
}

/// Decides on `run` (or the run above it) as the current account. `say` is told each step of a
/// lifecycle move as it is made, before a later one may fail.
pub fn decide(
    workspace: &Workspace,
    run: &str,
    verdict: Verdict,
    comment: Option<&str>,
    say: &mut dyn FnMut(String),
) -> Result<Review> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let root = ledger.root_run(ledger.resolve_run(run)?)?;
    let actor = crate::adoption::deciding_actor()?;
    let approve = verdict == Verdict::Approve;
    let verb = if approve { "approved" } else { "rejected" };
    // Decided under the adopted rules, never under weaker ones on disk.
    let governing = if approve {
        crate::policy::adoption::for_decision(&ledger, &workspace.root)
    } else {
        crate::policy::adoption::for_withdrawal(&ledger)
    }
    .map_err(|why| GovernanceError::Usage(format!("run {} may not be {verb}: {why}", root.id)))?;
    let review = |outcome| Review {
        root: root.clone(),
        actor: actor.clone(),
        outcome,
    };
    if approve {
        let starter = root.started_by.as_deref().unwrap_or_default();
        if let Some(missing) =
            record_escalation_approval(&governing, &mut ledger, root.id, starter, &actor)?
        {
            return Ok(review(Outcome::NeedsApprovals(missing)));
        }
    }
    // The approved moves are made first: one the lifecycle or the verified hash refuses now
    // leaves the run awaiting review, to be decided again once the cause is fixed. A move that
    // needs more approvals than were given keeps the run awaiting them.
    let (mut only_moves, mut reached_trust) = (false, false);
    if approve {
        let pending = ledger.pending_escalations(root.id)?;
        let moves = Approved {
            workspace,
            governing: &governing,
            root: &root,
            actor: &actor,
            comment,
        };
        match moves.make(&mut ledger, &pending, say)? {
            Moves::Waiting => return Ok(review(Outcome::Waiting)),
            Moves::None => {}
            Moves::Made { only, trusted } => (only_moves, reached_trust) = (only, trusted),
        }
    }
    let (escalations, undone) = match verdict {
        Verdict::Reject => reject(workspace, &governing, &mut ledger, root.id, &actor, comment)?,
        Verdict::Approve => (
            ledger.decide_escalations(root.id, true, &actor, comment)?,
            Vec::new(),
        ),
    };
    Ok(review(Outcome::Decided(Decided {
        escalations,
        undone,
        only_moves,
        reached_trust,
    })))
}

/// What approving did to the APPROVAL escalations of a run.
enum Moves {
    /// It had none.
    None,
    /// A move still needs approvals, or the walk to TRUSTED reached one that does: the run
    /// keeps awaiting review.
    Waiting,
    /// Every move asked for is made; `only`: nothing else was asked for, and `trusted`: each
    /// move led its skill to TRUSTED.
    Made { only: bool, trusted: bool },
}

/// What an approval of run `root` is made with: the adopted rules it is decided under.
struct Approved<'a> {
    workspace: &'a Workspace,
    governing: &'a Governing,
    root: &'a RunRow,
    actor: &'a str,
    comment: Option<&'a str>,
}

impl Approved<'_> {
    /// Records `actor`'s approval of the moves the APPROVAL escalations of run `root` ask for, and
    /// makes each move whose requirement in the adopted lifecycle is met, checked against that
    /// lifecycle and recorded as approved by `actor`. A move on the way to TRUSTED is followed by
    /// the rest of that way ([`Promotion::advance`]): the run goes on from where it stopped.
    fn make(
        &self,
        ledger: &mut Ledger,
        pending: &[EscalationRow],
        say: &mut dyn FnMut(String),
    ) -> Result<Moves> {
        let Self {
            workspace,
            governing,
            root,
            actor,
            comment,
        } = *self;
        let moves: Vec<(&EscalationRow, &Value)> = pending
            .iter()
            .flat_map(|e| {
                e.triggers
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(move |t| (e, t))
            })
            .filter(|(_, t)| t["trigger"] == APPROVAL)
            .collect();
        if moves.is_empty() {
            return Ok(Moves::None);
        }
        let lifecycle = governing.lifecycle().map_err(GovernanceError::Usage)?;
        let templates = TemplateEngine::new(&workspace.templates_dir());
        let trust = crate::load_trust(workspace, &templates)?;
        let store = crate::open_store(workspace)?;
        let note = match comment {
            Some(comment) => format!("approved in review by {actor}: {comment}"),
            None => format!("approved in review by {actor}"),
        };
        let (mut waiting, mut trusted) = (false, true);
        for (escalation, trigger) in &moves {
            let (from, to) = (
                trigger["from"].as_str().unwrap_or_default(),
                trigger["to"].as_str().unwrap_or_default(),
            );
            let skill = escalation.skill.as_str();
            // What the adopted lifecycle asks of the move, or else what it asked when the run
            // stopped: rules on disk, then or now, never lower it.
            let required = match lifecycle.needs_approval(from, to) {
                Some(Approval::Roles(requirement)) => Some(requirement.clone()),
                _ => serde_json::from_value::<Requirement>(trigger["requires"].clone()).ok(),
            };
            if let Some(requirement) = &required {
                let given = record_approval(
                    ledger,
                    governing,
                    requirement,
                    root,
                    escalation,
                    trigger,
                    actor,
                )?;
                let starter = Excluded {
                    actor: root.started_by.as_deref().unwrap_or_default(),
                    described: "the account that started the run",
                };
                if let Err(missing) = requirement.met_by(&given, starter) {
                    say(format!(
                        "approval by {actor} ({}) of {from} -> {to} of `{skill}` recorded; run {} \
                     still awaits review: it {missing} (`kavi approve {}` by another account)",
                        requirement.role, root.id, root.id
                    ));
                    waiting = true;
                    continue;
                }
            }
            // The skill must still be where it was when the run stopped.
            let check = |now: &str, to: &str| {
                if now == from {
                    lifecycle.check_approved(now, to)
                } else {
                    Err(format!(
                        "`{skill}` is now {now}, not {from}: the approved move no longer applies"
                    ))
                }
            };
            let origin = (Some(escalation.run_id), Some(escalation.node_id.as_str()));
            let refused = |reason: String| {
                GovernanceError::Usage(format!(
                    "the approved move {from} -> {to} of `{skill}` was not made: {reason}"
                ))
            };
            let source = trigger["source"].as_str();
            let promotion = Promotion {
                store: &store,
                trust: &trust,
                templates: &templates,
                workspace: &workspace.root,
                source: &workspace.root.join(source.unwrap_or(".")),
            };
            if to == TRUSTED {
                promotion
                    .promote(
                        ledger,
                        skill,
                        |now, to| check(now, to).map(|_| ()),
                        origin,
                        Some(&note),
                    )
                    .map_err(refused)?;
            } else {
                ledger
                    .transition_skill(skill, to, check, origin, actor, Some(&note))
                    .map_err(|e| refused(e.to_string()))?;
            }
            say(format!("moved `{skill}` {from} -> {to}"));
            // A move `promote` stopped for: the way to TRUSTED goes on from here.
            let Some(source) = source.filter(|_| to != TRUSTED) else {
                trusted &= to == TRUSTED;
                continue;
            };
            match promotion
                .advance(ledger, &lifecycle, skill, origin, Some(&note))
                .map_err(|reason| {
                    GovernanceError::Usage(format!("`{skill}` did not reach {TRUSTED}: {reason}"))
                })? {
                Advanced::Promoted(promoted) => {
                    say(format!("moved `{skill}` {} -> {TRUSTED}", promoted.from));
                    match &promoted.attestation {
                        Ok(sha) => say(format!("attested: artifact {}", &sha[..12])),
                        Err(why) => say(why.clone()),
                    }
                }
                Advanced::Awaits { from, to } => {
                    let triggers = approval_triggers(&lifecycle, &from, &to, Some(source));
                    ledger.pass_on_escalation(escalation, actor, comment, &triggers)?;
                    say(format!(
                        "`{skill}` is {from}; run {} awaits review again: {}",
                        root.id,
                        triggers[0]["reason"].as_str().unwrap_or_default()
                    ));
                    waiting = true;
                }
            }
        }
        if waiting {
            return Ok(Moves::Waiting);
        }
        let only_moves = pending.iter().all(|e| {
            e.triggers
                .as_array()
                .into_iter()
                .flatten()
                .all(|t| t["trigger"] == APPROVAL)
        });
        Ok(Moves::Made {
            only: only_moves,
            trusted,
        })
    }
}

/// Records `actor`'s approval of the move `trigger` asks for, with the roles it holds now, on the
/// pending `escalation`, and returns every approval given so far. Refused: the run's starter, an
/// account that already approved it, or one that does not hold the role.
fn record_approval(
    ledger: &mut Ledger,
    governing: &Governing,
    requirement: &Requirement,
    root: &RunRow,
    escalation: &EscalationRow,
    trigger: &Value,
    actor: &str,
) -> Result<Vec<RecordedApproval>> {
    let (from, to) = (&trigger["from"], &trigger["to"]);
    let refused = |why: String| {
        GovernanceError::Usage(format!(
            "{actor} may not approve the transition {} -> {} of `{}` in run {}: {why}; it needs \
             {} ({LIFECYCLE})",
            from.as_str().unwrap_or_default(),
            to.as_str().unwrap_or_default(),
            escalation.skill,
            root.id,
            Approval::Roles(requirement.clone()),
        ))
    };
    if crate::identity::same_account(root.started_by.as_deref().unwrap_or_default(), actor) {
        return Err(refused("it started the run".to_owned()));
    }
    let held = governing
        .held_by_current_process()
        .map_err(GovernanceError::Usage)?;
    if !held.contains(&requirement.role) {
        return Err(refused(format!(
            "it does not hold `{}` in the adopted {}",
            requirement.role,
            crate::policy::roles::DEFAULT_POLICY
        )));
    }
    let move_ = (
        from.as_str().unwrap_or_default(),
        to.as_str().unwrap_or_default(),
    );
    let roles = governing.roles().map_err(GovernanceError::Usage)?;
    let approval = RecordedApproval {
        signature: Signer::for_actor(roles.as_ref(), ledger, actor)?
            .map(|signer| signer.sign(&move_subject(escalation, move_))),
        actor: actor.to_owned(),
        roles: held,
    };
    let given = ledger
        .add_move_approval(escalation.id, move_, &approval)?
        .ok_or_else(|| refused("it has already approved it".to_owned()))?;
    signing::vouched(
        roles.as_ref(),
        ledger,
        &move_subject(escalation, move_),
        &given,
    )
}

/// What an approval of the lifecycle move `from -> to` asked by `escalation` is of.
fn move_subject(escalation: &EscalationRow, (from, to): (&str, &str)) -> Subject {
    Subject {
        kind: "lifecycle-move",
        id: escalation.id,
        what: format!("{} {from} -> {to}", escalation.skill),
    }
}

/// What an approval of `escalation` is of: the run and node that stopped, under which rules.
fn escalation_subject(escalation: &EscalationRow) -> Subject {
    Subject {
        kind: "escalation",
        id: escalation.id,
        what: format!(
            "run {} node {} rules {}",
            escalation.run_id,
            escalation.node_id,
            escalation.policy.as_deref().unwrap_or_default()
        ),
    }
}

/// Rejects a run: undoes what it left in the workspace (a skill's files go back to its last
/// trusted version when there is one, and otherwise the files the run's copy-back nodes wrote
/// are removed), then records, in one transaction, the decision and each skill's move to the
/// lifecycle's `rejected` state (or back to its trusted version). It completes or changes
/// nothing: files are put back as they were when a file cannot be written or the ledger
/// refuses, and the rejection can be made again once the cause is fixed. Returns the
/// escalations decided and what was done, to say after them.
fn reject(
    workspace: &Workspace,
    governing: &Governing,
    ledger: &mut Ledger,
    run: i64,
    actor: &str,
    comment: Option<&str>,
) -> Result<(Vec<EscalationRow>, Vec<String>)> {
    let pending = ledger.pending_escalations(run)?;
    if pending.is_empty() {
        return Err(crate::ledger::LedgerError::NothingToDecide(run).into());
    }
    let lifecycle = governing.lifecycle().map_err(GovernanceError::Usage)?;
    let mut skills: Vec<&str> = pending.iter().map(|e| e.skill.as_str()).collect();
    skills.dedup();
    let mut undo = Undo::default();
    let mut undone = Vec::new();
    for skill in &skills {
        match undo_files(workspace, ledger, run, skill, &mut undo) {
            Ok(what) => undone.push(what),
            Err(reason) => return Err(undo.put_back(skill, reason)),
        }
    }
    let moves: Vec<(String, String)> = skills
        .iter()
        .zip(&undone)
        .map(|(skill, what)| {
            let note = match comment {
                Some(comment) => format!("rejected in review by {actor}: {comment}; {what}"),
                None => format!("rejected in review by {actor}; {what}"),
            };
            ((*skill).to_owned(), note)
        })
        .collect();
    let recorded = ledger.reject_run(
        run,
        actor,
        comment,
        lifecycle.rejected.as_deref(),
        TRUSTED,
        &moves,
        |from, to| lifecycle.check(from, to),
    );
    let (decided, returned) = match recorded {
        Ok(recorded) => recorded,
        Err(e) => return Err(undo.put_back(skills[0], e.to_string())),
    };
    let mut said = Vec::new();
    for ((skill, what), version) in skills.iter().zip(&undone).zip(returned) {
        said.push(format!("`{skill}`: {what}"));
        match (&lifecycle.rejected, version) {
            (_, Some(version)) => {
                said.push(format!("`{skill}` is back at version {version}, {TRUSTED}"))
            }
            (Some(rejected), None) => said.push(format!("`{skill}` is {rejected}")),
            (None, None) => {}
        }
    }
    Ok((decided, said))
}

/// Puts `skill`'s files back where the rejected run left them: to its trusted version's, or
/// without the files the run copied back. What each file was is kept in `undo` first.
fn undo_files(
    workspace: &Workspace,
    ledger: &Ledger,
    run: i64,
    skill: &str,
    undo: &mut Undo,
) -> std::result::Result<String, String> {
    let row = ledger.skill(skill).map_err(|e| e.to_string())?;
    if let (Some(tree), Some(hash)) = (&row.trusted_tree, &row.trusted_hash) {
        let templates = TemplateEngine::new(&workspace.templates_dir());
        let trust = crate::load_trust(workspace, &templates).map_err(|e| e.to_string())?;
        let store = crate::open_store(workspace).map_err(|e| e.to_string())?;
        let tree = SkillTree::load(&store, tree, hash)?;
        undo.keep(&crate::sandbox::destination(
            &workspace.root,
            &tree.proposal_path,
        )?)?;
        undo.keep_folder(&crate::sandbox::destination(&workspace.root, &tree.folder)?)?;
        tree.write_into(&workspace.root, |path| trust.exclude.is_match(path))?;
        return Ok(format!(
            "its files are those trusted at {}",
            short_hash(hash)
        ));
    }
    let mut removed = 0;
    for (target, path) in ledger.copied_back(run).map_err(|e| e.to_string())? {
        // Only inside the workspace, whatever the record says.
        let folder = std::path::Path::new(&target)
            .strip_prefix(&workspace.root)
            .map_err(|_| format!("{target} is outside the workspace"))?;
        let relative = folder.join(&path);
        let target = crate::sandbox::destination(&workspace.root, &relative.to_string_lossy())?;
        undo.keep(&target)?;
        match std::fs::remove_file(&target) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{path}: {e}")),
        }
    }
    Ok(format!(
        "removed the {removed} files its builds copied back"
    ))
}

/// A file as it was: its bytes and mode, or `None` when there was none.
type Was = Option<(Vec<u8>, u32)>;

/// What was in the workspace where a rejection writes, to put back when it cannot complete.
#[derive(Default)]
struct Undo {
    files: Vec<(std::path::PathBuf, Was)>,
    /// Folders whose every file was kept: a file found in one afterwards was not there.
    folders: Vec<std::path::PathBuf>,
}

impl Undo {
    fn keep(&mut self, path: &std::path::Path) -> std::result::Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let was = match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_file() => Some((
                std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?,
                meta.permissions().mode(),
            )),
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        self.files.push((path.to_owned(), was));
        Ok(())
    }

    fn keep_folder(&mut self, folder: &std::path::Path) -> std::result::Result<(), String> {
        for entry in walkdir::WalkDir::new(folder).follow_links(false) {
            match entry {
                Ok(entry) if entry.file_type().is_file() => self.keep(entry.path())?,
                Ok(_) => {}
                Err(e)
                    if e.io_error().map(std::io::Error::kind)
                        == Some(std::io::ErrorKind::NotFound) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        self.folders.push(folder.to_owned());
        Ok(())
    }

    /// Puts every kept file back, and says why the rejection of `skill` did not complete.
    fn put_back(&self, skill: &str, reason: String) -> GovernanceError {
        let mut failures = Vec::new();
        for folder in &self.folders {
            for entry in walkdir::WalkDir::new(folder)
                .follow_links(false)
                .into_iter()
                .flatten()
            {
                let new = entry.file_type().is_file()
                    && !self.files.iter().any(|(path, _)| path == entry.path());
                if new && let Err(e) = std::fs::remove_file(entry.path()) {
                    failures.push(format!("{}: {e}", entry.path().display()));
                }
            }
        }
        for (path, was) in &self.files {
            let put = match was {
                Some((bytes, mode)) => {
                    crate::sandbox::write_file(bytes, path, false).and_then(|()| {
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode))
                    })
                }
                None => match std::fs::remove_file(path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                },
            };
            if let Err(e) = put {
                failures.push(format!("{}: {e}", path.display()));
            }
        }
        let outcome = if failures.is_empty() {
            "its files were put back as they were and nothing was recorded: fix the cause and \
             reject again"
                .to_owned()
        } else {
            format!(
                "nothing was recorded, but these files could not be put back: {}",
                failures.join("; ")
            )
        };
        GovernanceError::Io {
            context: format!("failed to reject `{skill}`; {outcome}"),
            source: std::io::Error::other(reason),
        }
    }
}

/// Records `actor`'s approval, with the roles they hold now, on each pending escalation of the
/// run, and returns what is still missing: the rules that stopped the run (as the ledger kept
/// them, not as the workspace has them now) name how many distinct role holders must approve,
/// never counting `starter`. Refuses the starter where those rules do.
fn record_escalation_approval(
    governing: &Governing,
    ledger: &mut Ledger,
    run: i64,
    starter: &str,
    actor: &str,
) -> Result<Option<String>> {
    let mut rules = Vec::new();
    for escalation in ledger.pending_escalations(run)? {
        let Some(policy) = &escalation.policy else {
            continue;
        };
        // The rules asked of an approval are the adopted ones: a run stopped under other
        // escalation rules is decided by running it again under the adopted set.
        if !governing.holds(policy) {
            return Err(GovernanceError::Usage(format!(
                "run {run} stopped under escalation rules ({}) that are not in the adopted rule \
                 set ({}): `kavi reject {run}`, or run the pipeline again under the adopted rules",
                short_hash(policy),
                short_hash(&governing.row.set_hash)
            )));
        }
        let (_, text) = ledger.spec_text(policy)?;
        let source = crate::diagnostic::SourceFile::new("escalation rules", text);
        let rule = escalate::approval_rule(&source).map_err(GovernanceError::Usage)?;
        let refusal = match &rule {
            ApprovalRule::Anyone {
                self_approval: false,
            } => {
                "forbid approving a run by the account that started it (`self_approval = \
                  false`): another account must approve it"
            }
            ApprovalRule::Requires(_) => {
                "never count the account that started it (`approval`): another account with the \
                 role must approve it"
            }
            ApprovalRule::Anyone {
                self_approval: true,
            } => "",
        };
        if crate::identity::same_account(actor, starter) && !refusal.is_empty() {
            return Err(GovernanceError::Usage(format!(
                "{actor} started run {run}, and its escalation rules ({}) {refusal}",
                short_hash(policy)
            )));
        }
        rules.push((escalation.id, rule));
    }
    // Roles as the adopted set has them; one made before roles existed gives none.
    let held = governing
        .held_by_current_process()
        .map_err(GovernanceError::Usage)?;
    let roles = governing.roles().map_err(GovernanceError::Usage)?;
    let signer = Signer::for_actor(roles.as_ref(), ledger, actor)?;
    let pending = ledger.add_escalation_approval(run, |escalation| RecordedApproval {
        signature: signer
            .as_ref()
            .map(|signer| signer.sign(&escalation_subject(escalation))),
        actor: actor.to_owned(),
        roles: held.clone(),
    })?;
    let excluded = Excluded {
        actor: starter,
        described: "the account that started the run",
    };
    for escalation in &pending {
        if let Some((_, ApprovalRule::Requires(requirement))) =
            rules.iter().find(|(id, _)| *id == escalation.id)
        {
            let counted = signing::vouched(
                roles.as_ref(),
                ledger,
                &escalation_subject(escalation),
                &escalation.approvals,
            )?;
            if let Err(missing) = requirement.met_by(&counted, excluded) {
                return Ok(Some(missing));
            }
        }
    }
    Ok(None)
}
