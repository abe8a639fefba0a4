//! `kavi approve RUN` and `kavi reject RUN`: a person's decision on a run that stopped for review.
//!
//! The decision covers the run a user started and every child run under it (a forge attempt
//! escalates in its own child run), so either id may be given. An approval resumes by default:
//! the stopped run's pipeline runs again, from its file as it is now, with the same parameters,
//! recorded as a new run that names the one it resumed. A run stopped for a lifecycle move's
//! approvals goes on instead from the move: each approval is recorded, and once the move has
//! the approvals it needs it is made, and a promotion walks on to TRUSTED.

use serde_json::Value;

use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::hash::short_hash;
use crate::ledger::{APPROVAL, RecordedApproval};
use crate::ledger::{EscalationRow, Ledger, RunOrigin, RunRow};
use crate::nodes::escalate::{self, ApprovalRule};
use crate::nodes::review::approval_triggers;
use crate::policy::adoption::Governing;
use crate::policy::roles::{Excluded, Requirement};
use crate::skills::LIFECYCLE_POLICY as LIFECYCLE;
use crate::skills::promotion::{Advanced, Promotion};
use crate::skills::trust::SkillTree;
use crate::skills::{Approval, TRUSTED};
use crate::state::RunStatus;
use crate::template::TemplateEngine;

#[derive(Debug, Clone, Copy)]
pub enum Decision {
    Approve { resume: bool },
    Reject,
}

pub async fn decide(
    workspace: &Workspace,
    run: &str,
    decision: Decision,
    comment: Option<&str>,
) -> Result<i32, Error> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let root = ledger.root_run(ledger.resolve_run(run)?)?;
    let actor = crate::identity::actor();
    let approve = matches!(decision, Decision::Approve { .. });
    let verdict = if approve { "approved" } else { "rejected" };
    // Decided under the adopted rules, never under weaker ones on disk.
    let governing = if approve {
        crate::policy::adoption::for_decision(&ledger, &workspace.root)
    } else {
        crate::policy::adoption::for_withdrawal(&ledger)
    }
    .map_err(|why| Error::Usage(format!("run {} may not be {verdict}: {why}", root.id)))?;
    if approve {
        let starter = root.started_by.as_deref().unwrap_or_default();
        if let Some(missing) =
            record_escalation_approval(&governing, &mut ledger, root.id, starter, &actor)?
        {
            outln!(
                "recorded the approval of run {} by {actor}; it stays awaiting review: {missing}",
                root.id
            );
            return Ok(exit::SUCCESS);
        }
    }
    // The approved moves are made first: one the lifecycle or the verified hash refuses now
    // leaves the run awaiting review, to be decided again once the cause is fixed. A move that
    // needs more approvals than were given keeps the run awaiting them.
    let mut reached_trust = false;
    let only_moves = approve && {
        let pending = ledger.pending_escalations(root.id)?;
        let moves = Approved {
            workspace,
            governing: &governing,
            root: &root,
            actor: &actor,
            comment,
        };
        match moves.make(&mut ledger, &pending)? {
            Moves::Waiting => return Ok(exit::AWAITING_REVIEW),
            Moves::None => false,
            Moves::Made {
                only_moves,
                trusted,
            } => {
                reached_trust = trusted;
                only_moves
            }
        }
    };
    let (decided, cleaned_up) = match decision {
        Decision::Reject => reject(workspace, &governing, &mut ledger, root.id, &actor, comment)?,
        Decision::Approve { .. } => (
            ledger.decide_escalations(root.id, true, &actor, comment)?,
            Vec::new(),
        ),
    };
    for escalation in &decided {
        let triggers: Vec<&str> = escalation
            .triggers
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["trigger"].as_str())
            .collect();
        outln!(
            "{verdict} run {} for `{}` ({}) by {actor}",
            root.id,
            escalation.skill,
            triggers.join(", "),
        );
    }
    match decision {
        Decision::Approve { resume: true } if only_moves && reached_trust => {
            outln!(
                "the promotion run {} stopped for is complete: nothing is left to resume",
                root.id
            );
            Ok(exit::SUCCESS)
        }
        Decision::Approve { resume: true } if only_moves => {
            outln!(
                "the approved moves are made; run `kavi pipeline run {}` to go on",
                root.spec_path
            );
            Ok(exit::SUCCESS)
        }
        Decision::Reject => {
            for line in &cleaned_up {
                outln!("{line}");
            }
            for escalation in &decided {
                outln!("`{}` is not built again", escalation.skill);
            }
            Ok(exit::SUCCESS)
        }
        Decision::Approve { resume: false } => {
            outln!(
                "not resumed; run `kavi pipeline run {}` to go on",
                root.spec_path
            );
            Ok(exit::SUCCESS)
        }
        Decision::Approve { resume: true } => {
            if root.status != RunStatus::AwaitingReview {
                outln!("run {} is {}: nothing to resume", root.id, root.status);
                return Ok(exit::SUCCESS);
            }
            drop(ledger);
            outln!("resuming run {} ({})", root.id, root.spec_path);
            let sets = param_sets(&root.params);
            let path = workspace.root.join(&root.spec_path);
            super::pipeline::run(
                workspace,
                &path.to_string_lossy(),
                &sets,
                kavi_cli::RunOptions::default(),
                RunOrigin::Resume { of: root.id }.into(),
            )
            .await
        }
    }
}

/// What approving did to the APPROVAL escalations of a run.
enum Moves {
    /// It had none.
    None,
    /// A move still needs approvals, or the walk to TRUSTED reached one that does: the run
    /// keeps awaiting review.
    Waiting,
    /// Every move asked for is made; `only_moves`: nothing else was asked for, and `trusted`:
    /// each move led its skill to TRUSTED.
    Made { only_moves: bool, trusted: bool },
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
    fn make(&self, ledger: &mut Ledger, pending: &[EscalationRow]) -> Result<Moves, Error> {
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
        let lifecycle = governing.lifecycle().map_err(Error::Usage)?;
        let templates = TemplateEngine::new(&workspace.templates_dir());
        let trust = kavi_governance::load_trust(workspace, &templates)?;
        let store = super::open_store(workspace)?;
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
                    outln!(
                        "approval by {actor} ({}) of {from} -> {to} of `{skill}` recorded; run {} \
                     still awaits review: it {missing} (`kavi approve {}` by another account)",
                        requirement.role,
                        root.id,
                        root.id
                    );
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
                Error::Usage(format!(
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
                    .promote(ledger, skill, check, origin, Some(&note))
                    .map_err(refused)?;
            } else {
                ledger
                    .transition_skill(skill, to, check, origin, actor, Some(&note))
                    .map_err(|e| refused(e.to_string()))?;
            }
            outln!("moved `{skill}` {from} -> {to}");
            // A move `promote` stopped for: the way to TRUSTED goes on from here.
            let Some(source) = source.filter(|_| to != TRUSTED) else {
                trusted &= to == TRUSTED;
                continue;
            };
            match promotion
                .advance(ledger, &lifecycle, skill, origin, Some(&note))
                .map_err(|reason| {
                    Error::Usage(format!("`{skill}` did not reach {TRUSTED}: {reason}"))
                })? {
                Advanced::Promoted(promoted) => {
                    outln!("moved `{skill}` {} -> {TRUSTED}", promoted.from);
                }
                Advanced::Awaits { from, to } => {
                    let triggers = approval_triggers(&lifecycle, &from, &to, Some(source));
                    ledger.pass_on_escalation(escalation, actor, comment, &triggers)?;
                    outln!(
                        "`{skill}` is {from}; run {} awaits review again: {}",
                        root.id,
                        triggers[0]["reason"].as_str().unwrap_or_default()
                    );
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
            only_moves,
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
) -> Result<Vec<RecordedApproval>, Error> {
    let (from, to) = (&trigger["from"], &trigger["to"]);
    let refused = |why: String| {
        Error::Usage(format!(
            "{actor} may not approve the transition {} -> {} of `{}` in run {}: {why}; it needs \
             {} ({LIFECYCLE})",
            from.as_str().unwrap_or_default(),
            to.as_str().unwrap_or_default(),
            escalation.skill,
            root.id,
            Approval::Roles(requirement.clone()),
        ))
    };
    if root.started_by.as_deref() == Some(actor) {
        return Err(refused("it started the run".to_owned()));
    }
    let held = governing.held_by_current_process().map_err(Error::Usage)?;
    if !held.contains(&requirement.role) {
        return Err(refused(format!(
            "it does not hold `{}` in the adopted {}",
            requirement.role,
            crate::policy::roles::DEFAULT_POLICY
        )));
    }
    let approval = RecordedApproval {
        actor: actor.to_owned(),
        roles: held,
    };
    let move_ = (
        from.as_str().unwrap_or_default(),
        to.as_str().unwrap_or_default(),
    );
    ledger
        .add_move_approval(escalation.id, move_, &approval)?
        .ok_or_else(|| refused("it has already approved it".to_owned()))
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
) -> Result<(Vec<EscalationRow>, Vec<String>), Error> {
    let pending = ledger.pending_escalations(run)?;
    if pending.is_empty() {
        return Err(crate::ledger::LedgerError::NothingToDecide(run).into());
    }
    let lifecycle = governing.lifecycle().map_err(Error::Usage)?;
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
) -> Result<String, String> {
    let row = ledger.skill(skill).map_err(|e| e.to_string())?;
    if let (Some(tree), Some(hash)) = (&row.trusted_tree, &row.trusted_hash) {
        let templates = TemplateEngine::new(&workspace.templates_dir());
        let trust =
            kavi_governance::load_trust(workspace, &templates).map_err(|e| e.to_string())?;
        let store = super::open_store(workspace).map_err(|e| e.to_string())?;
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
    fn keep(&mut self, path: &std::path::Path) -> Result<(), String> {
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

    fn keep_folder(&mut self, folder: &std::path::Path) -> Result<(), String> {
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
    fn put_back(&self, skill: &str, reason: String) -> Error {
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
        Error::Io {
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
) -> Result<Option<String>, Error> {
    let mut rules = Vec::new();
    for escalation in ledger.pending_escalations(run)? {
        let Some(policy) = &escalation.policy else {
            continue;
        };
        // The rules asked of an approval are the adopted ones: a run stopped under other
        // escalation rules is decided by running it again under the adopted set.
        if !governing.holds(policy) {
            return Err(Error::Usage(format!(
                "run {run} stopped under escalation rules ({}) that are not in the adopted rule \
                 set ({}): `kavi reject {run}`, or run the pipeline again under the adopted rules",
                short_hash(policy),
                short_hash(&governing.row.set_hash)
            )));
        }
        let (_, text) = ledger.spec_text(policy)?;
        let source = crate::diagnostic::SourceFile::new("escalation rules", text);
        let rule = escalate::approval_rule(&source).map_err(Error::Usage)?;
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
        if actor == starter && !refusal.is_empty() {
            return Err(Error::Usage(format!(
                "{actor} started run {run}, and its escalation rules ({}) {refusal}",
                short_hash(policy)
            )));
        }
        rules.push((escalation.id, rule));
    }
    // Roles as the adopted set has them; one made before roles existed gives none.
    let held = governing.held_by_current_process().map_err(Error::Usage)?;
    let approval = RecordedApproval {
        actor: actor.to_owned(),
        roles: held,
    };
    let pending = ledger.add_escalation_approval(run, &approval)?;
    let excluded = Excluded {
        actor: starter,
        described: "the account that started the run",
    };
    for escalation in &pending {
        if let Some((_, ApprovalRule::Requires(requirement))) =
            rules.iter().find(|(id, _)| *id == escalation.id)
            && let Err(missing) = requirement.met_by(&escalation.approvals, excluded)
        {
            return Ok(Some(missing));
        }
    }
    Ok(None)
}

/// A run's recorded parameters as `--set` pairs: strings as they are, other values as JSON
/// (which each parameter type parses back).
pub(super) fn param_sets(params: &Value) -> Vec<(String, String)> {
    params
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, value)| {
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (name.clone(), text)
        })
        .collect()
}
