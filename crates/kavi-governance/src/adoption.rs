//! Adopting rule sets: a working copy of the governing files proposed against the adopted set,
//! approved by others when it weakens the rules, adopted; the audit of their story; and what
//! changed in the files that govern a run.

use serde::Serialize;
use similar::TextDiff;

use crate::config::Workspace;
use crate::diagnostic::SourceFile;
use crate::hash::{set_hash, short_hash};
use crate::ledger::{Ledger, NewRuleSet, RecordedApproval, RuleSetRow};
use crate::policy::adoption::{self, AdoptionPolicy, Class, Governing, RuleSet};
use crate::policy::roles::{DEFAULT_POLICY as ROLES, Excluded, Roles};
use crate::signing::{self, Signer, Subject};
use crate::{GovernanceError, Result};

mod index;

/// One side of a comparison of governing sets, member by member.
#[derive(Debug, Serialize)]
pub struct Side {
    /// The run, or none for the workspace as it is now.
    pub run: Option<i64>,
    pub governing_hash: String,
    #[serde(skip)]
    members: Vec<Member>,
}

/// One file of a governing set, with its text.
#[derive(Debug)]
pub struct Member {
    pub role: String,
    pub path: String,
    pub hash: String,
    pub text: String,
}

impl Side {
    /// A recorded run's governing set.
    pub fn of_run(ledger: &Ledger, reference: &str) -> Result<Side> {
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
        let governing_hash = run
            .governing_hash
            .clone()
            .unwrap_or_else(|| members_hash(&members));
        Ok(Side {
            run: Some(run.id),
            governing_hash,
            members,
        })
    }

    /// The set a run would be governed by if it started now.
    pub fn of_workspace(members: Vec<Member>) -> Side {
        Side {
            run: None,
            governing_hash: members_hash(&members),
            members,
        }
    }

    pub fn label(&self) -> String {
        match self.run {
            Some(id) => format!("run {id}"),
            None => "the workspace now".to_owned(),
        }
    }

    fn member(&self, path: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.path == path)
    }
}

fn members_hash(members: &[Member]) -> String {
    set_hash(
        members
            .iter()
            .map(|m| (m.role.as_str(), m.path.as_str(), m.hash.as_str())),
    )
}

/// A file added, removed or changed between two sides.
#[derive(Debug, Serialize)]
pub struct FileChange {
    pub path: String,
    pub role: String,
    /// `added`, `removed` or `changed`.
    pub change: &'static str,
    pub from_hash: Option<String>,
    pub to_hash: Option<String>,
    /// What the change means, one sentence each (TOML files only).
    pub meaning: Vec<String>,
    /// The unified text diff.
    pub diff: String,
}

/// What changed in governance from one side to the other.
#[derive(Debug, Serialize)]
pub struct PolicyDiff {
    pub from: Side,
    pub to: Side,
    pub files: Vec<FileChange>,
}

impl PolicyDiff {
    pub fn between(from: Side, to: Side) -> PolicyDiff {
        let files = compare(&from, &to);
        PolicyDiff { from, to, files }
    }
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

/// Trust on first use: a ledger with no rule set recorded adopts the governing files the first
/// run finds, recorded as `first-use`. Unless the workspace's rules were adopted in another
/// ledger before (the one kavi's keys folder remembers for it, or the workspace's default
/// `.kavi/ledger.db`): then that ledger's adopted set is carried over, so that pointing
/// `kavi.toml` at a new ledger adopts nothing its rules did not (a weakening on disk stays one).
///
/// First of all, the ledger must be the one checkpointed here ([`check_ledger_here`]): this is
/// where a run takes its governing set from it.
pub fn adopt_on_first_use(workspace: &Workspace, ledger: &mut Ledger) -> Result<()> {
    check_ledger_here(workspace, ledger)?;
    if !ledger.rule_sets()?.is_empty() {
        return Ok(());
    }
    let here = crate::ledger::canonical_location(&workspace.config.ledger);
    let mut carried = None;
    for previous in previous_ledgers(workspace)?
        .into_iter()
        .filter(|previous| crate::ledger::canonical_location(previous) != here)
    {
        if let Some(adopted) = earlier_adoption(&previous, "adopt the rules on first use")? {
            carried = Some((previous, adopted));
            break;
        }
    }
    let (set, message) = match carried {
        Some((previous, adopted)) => (
            RuleSet {
                hash: adopted.row.set_hash.clone(),
                files: adopted.files,
            },
            format!(
                "carried over on first use from the ledger at {}, where it is rule set {}",
                crate::ledger::display_location(&previous),
                adopted.row.id
            ),
        ),
        None => (
            RuleSet::read(&workspace.root).map_err(GovernanceError::Usage)?,
            "adopted on first use".to_owned(),
        ),
    };
    let files = keep_rule_set(ledger, &set)?;
    ledger.record_rule_set(
        &NewRuleSet {
            set_hash: &set.hash,
            files: &files,
            class: "first-use",
            changes: &serde_json::json!([]),
            based_on: None,
            actor: &crate::identity::actor(),
            message: Some(&message),
        },
        true,
    )?;
    index::remember(
        &workspace.root,
        &index::ledger_key(&workspace.config.ledger),
    );
    Ok(())
}

/// Refuses a ledger swapped for another since it was last checkpointed at the workspace's
/// ledger location, or rolled back from before that checkpoint (see
/// `Ledger::check_checkpointed_here`): the rules it adopted are not the ones reviewed here.
///
/// And refuses a ledger elsewhere than the one this workspace's rules were adopted in (kavi's
/// keys folder remembers it, [`index`]) that adopted other rules: pointing `kavi.toml`'s
/// `ledger` at another workspace's ledger (or team's) would bring in its rules, reviewed by no
/// one here. A switch to a ledger that adopted the same set (`kavi ledger copy` to a server,
/// then `ledger = "postgres://..."`) is taken on, and remembered; one from a remembered ledger
/// that is gone is not held back (nothing is left to compare with).
pub fn check_ledger_here(workspace: &Workspace, ledger: &Ledger) -> Result<()> {
    ledger.check_checkpointed_here(&crate::ledger::canonical_location(&workspace.config.ledger))?;
    let here = index::ledger_key(&workspace.config.ledger);
    // The usual case, the remembered ledger, costs a read of the index and no query.
    let remembered = index::remembered(&workspace.root);
    if matches!(&remembered, Ok(None)) || matches!(&remembered, Ok(Some(at)) if *at == here) {
        return Ok(());
    }
    let Some(ours) = Governing::adopted(ledger).map_err(GovernanceError::Usage)? else {
        // Nothing adopted yet: the first run carries the remembered ledger's set over (and
        // says so when the index cannot be read).
        return Ok(());
    };
    let Some(remembered) = remembered.map_err(|why| {
        GovernanceError::Usage(format!(
            "refused to take the rules of {}: {why}",
            here.display()
        ))
    })?
    else {
        return Ok(());
    };
    let Some(theirs) = earlier_adoption(&remembered, "take the rules of another ledger")? else {
        return Ok(());
    };
    if ours.row.set_hash != theirs.row.set_hash {
        return Err(GovernanceError::Usage(format!(
            "refused: this workspace's rules were adopted in the ledger at {}, where rule set {} \
             governs; the ledger at {} adopted another set (rule set {}), which no one reviewed \
             for this workspace. Point `ledger` (kavi.toml, KAVI_LEDGER) back at the first, or \
             bring the rules there to the same set through review (`kavi policy propose`, \
             `approve`, `adopt`) and switch then",
            crate::ledger::display_location(&remembered),
            theirs.row.id,
            crate::ledger::display_location(&workspace.config.ledger),
            ours.row.id
        )));
    }
    index::remember(&workspace.root, &here);
    Ok(())
}

/// The rule set an earlier ledger adopted; `None` when there is no such ledger or it adopted
/// none. An earlier ledger that is there but cannot be vouched for (another keys folder's, a
/// schema this kavi cannot read, rows changed outside kavi) is a refusal: adopting the disk's
/// rules instead would trust on first use exactly what that ledger may have held back.
fn earlier_adoption(previous: &std::path::Path, doing: &str) -> Result<Option<Governing>> {
    let refused = |why: String| {
        GovernanceError::Usage(format!(
            "refused to {doing}: this workspace's rules were adopted in the \
             ledger at {}, which cannot be vouched for with the keys in use ({}): {why}. Run with \
             the keys folder that ledger was kept with (KAVI_KEYS), or keep using that ledger \
             and change the rules there through review (`kavi policy propose`, `approve`, \
             `adopt`)",
            crate::ledger::display_location(previous),
            crate::ledger::keys::dir().display()
        ))
    };
    // A server's location is remembered without its password; the connection takes it from
    // PGPASSWORD or ~/.pgpass.
    let location = crate::ledger::location_without_password(previous);
    let earlier = match Ledger::open_read_only(&location) {
        Ok(earlier) => earlier,
        Err(crate::ledger::LedgerError::Missing(_)) => return Ok(None),
        Err(error) => return Err(refused(error.to_string())),
    };
    Governing::adopted(&earlier).map_err(refused)
}

/// The ledgers this workspace's rules may have been adopted in before: the one kavi's keys
/// folder remembers ([`index`]), then the default one in the workspace.
fn previous_ledgers(workspace: &Workspace) -> Result<Vec<std::path::PathBuf>> {
    let remembered = index::remembered(&workspace.root).map_err(|why| {
        GovernanceError::Usage(format!("refused to adopt the rules on first use: {why}"))
    })?;
    Ok(remembered
        .into_iter()
        .chain(std::iter::once(workspace.root.join(".kavi/ledger.db")))
        .collect())
}

/// Keeps each file's text in the ledger; returns path -> spec hash.
fn keep_rule_set(ledger: &Ledger, set: &RuleSet) -> Result<serde_json::Value> {
    let mut files = serde_json::Map::new();
    for (path, text) in &set.files {
        let hash = ledger.keep_spec(&SourceFile::new(path.as_str(), text.as_str()))?;
        files.insert(path.clone(), hash.into());
    }
    Ok(files.into())
}

/// The adopted set, or an error saying none is.
pub fn adopted(ledger: &Ledger) -> Result<Governing> {
    Governing::adopted(ledger)
        .map_err(GovernanceError::Usage)?
        .ok_or_else(|| {
            GovernanceError::Usage(
                "no rule set is adopted in this ledger yet: the first `kavi pipeline run` adopts \
                 the one it runs under"
                    .to_owned(),
            )
        })
}

/// The adoption rules and roles as the adopted set has them: a proposal cannot reclassify itself
/// nor grant its proposer a role.
fn adopted_rules(set: &Governing) -> Result<(AdoptionPolicy, Roles)> {
    let policy = set
        .adoption()
        .map_err(GovernanceError::Usage)?
        .ok_or_else(|| {
            GovernanceError::Usage(format!(
                "the adopted {} has no [adoption] table: changes to the rules cannot be classified",
                crate::skill::trust::DEFAULT_POLICY
            ))
        })?;
    let roles = set
        .roles()
        .map_err(GovernanceError::Usage)?
        .ok_or_else(|| {
            GovernanceError::Usage(format!(
                "the adopted rule set has no {ROLES}: no one holds a role"
            ))
        })?;
    Ok((policy, roles))
}

/// The governing files on disk against the adopted set.
pub struct Status {
    pub adopted: Governing,
    /// The hash of the files on disk.
    pub files_hash: String,
    /// Each change from the adopted set, classified by the adopted `[adoption]` rules.
    pub changes: Vec<(String, Class)>,
    /// The changes as a whole.
    pub class: Class,
    /// The rule changes pending.
    pub pending: Vec<RuleSetRow>,
    /// Of each pending change, the approvals that count ([`vouched`]).
    vouched: Vec<Vec<RecordedApproval>>,
}

impl Status {
    /// For each pending change that weakens the rules, whether it has the approvals the adopted
    /// `[adoption]` rules ask, or what it misses (`None`: it may be adopted at once).
    pub fn approvals(&self) -> Result<Vec<Option<std::result::Result<(), String>>>> {
        let policy = self.adopted.adoption().map_err(GovernanceError::Usage)?;
        Ok(self
            .pending
            .iter()
            .zip(&self.vouched)
            .map(
                |(change, vouched)| match (&policy, change.class == Class::Weakening.as_str()) {
                    (Some(policy), true) => {
                        Some(policy.weakening.met_by(vouched, proposer(change)))
                    }
                    _ => None,
                },
            )
            .collect())
    }
}

/// Where the governing files on disk stand against the adopted set.
pub fn status(workspace: &Workspace) -> Result<Status> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let adopted = adopted(&ledger)?;
    let set = RuleSet::read(&workspace.root).map_err(GovernanceError::Usage)?;
    let changes = adopted.changes_to(&set).map_err(GovernanceError::Usage)?;
    let class = adoption::overall(&changes.iter().map(|(_, c)| *c).collect::<Vec<_>>());
    let pending: Vec<RuleSetRow> = ledger
        .rule_sets()?
        .into_iter()
        .filter(|s| s.status == "pending")
        .collect();
    let roles = adopted.roles().map_err(GovernanceError::Usage)?;
    let vouched = pending
        .iter()
        .map(|change| match &roles {
            Some(roles) => vouched(&ledger, roles, change),
            None => Ok(change.approvals.clone()),
        })
        .collect::<Result<_>>()?;
    Ok(Status {
        adopted,
        files_hash: set.hash,
        changes,
        class,
        pending,
        vouched,
    })
}

/// What `kavi ledger verify` checks of the rule sets, and their story: each set's files still
/// make its hash and are kept; exactly one is adopted; only the first was adopted on first use;
/// each one adopted weakening the rules had the approvals its base's `[adoption]` asked, never
/// its proposer's. Returns (problems, one line per set).
pub fn audit(ledger: &Ledger) -> Result<(Vec<String>, Vec<String>)> {
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
        let base = sets.iter().find(|s| Some(s.id) == set.based_on);
        // A set recorded as anything but weakening whose texts weaken its base's, by the base's
        // own `[adoption]` rules, needed the approvals all the same.
        let weakens = set.class == Class::Weakening.as_str()
            || match base {
                Some(base) if was_adopted => weakens_its_base(ledger, base, set)?,
                _ => false,
            };
        if was_adopted && weakens {
            let base = base
                .map(|base| Governing::of(ledger, base.clone()))
                .transpose()
                .map_err(GovernanceError::Usage)?;
            let required = base
                .as_ref()
                .map(Governing::adoption)
                .transpose()
                .map_err(GovernanceError::Usage)?
                .flatten();
            let roles = base
                .as_ref()
                .map(Governing::roles)
                .transpose()
                .map_err(GovernanceError::Usage)?
                .flatten();
            let approvals = match &roles {
                Some(roles) => vouched(ledger, roles, set)?,
                None => set.approvals.clone(),
            };
            match required {
                None => problems.push(format!(
                    "rule set {id} was adopted weakening the rules, but no adopted set it was \
                     based on names what that needs"
                )),
                Some(policy) => {
                    if let Err(missing) = policy.weakening.met_by(&approvals, proposer(set)) {
                        let recorded = match set.class.as_str() {
                            "weakening" => String::new(),
                            other => format!(" (recorded as {other})"),
                        };
                        problems.push(format!(
                            "rule set {id} was adopted weakening the rules{recorded}, but it \
                             {missing}"
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

/// Whether `set`'s texts weaken `base`'s by `base`'s `[adoption]` rules, whatever `set` records.
fn weakens_its_base(ledger: &Ledger, base: &RuleSetRow, set: &RuleSetRow) -> Result<bool> {
    let base = Governing::of(ledger, base.clone()).map_err(GovernanceError::Usage)?;
    let now = Governing::of(ledger, set.clone()).map_err(GovernanceError::Usage)?;
    let now = RuleSet {
        files: now.files,
        hash: set.set_hash.clone(),
    };
    let changes = base.changes_to(&now).map_err(GovernanceError::Usage)?;
    Ok(changes.iter().any(|(_, class)| *class == Class::Weakening))
}

/// What proposing the working copy came to.
#[derive(Debug)]
pub enum Proposed {
    /// The files are the adopted set (its hash): nothing was recorded.
    Unchanged(String),
    Recorded(Proposal),
}

/// A rule change recorded as pending.
#[derive(Debug)]
pub struct Proposal {
    pub id: i64,
    pub actor: String,
    pub from_hash: String,
    pub to_hash: String,
    pub class: Class,
    pub changes: Vec<(String, Class)>,
    /// The adopted rules it is to be decided under.
    pub policy: AdoptionPolicy,
}

/// Records the working copy of the governing files as a pending change to the adopted set, each
/// part classified.
pub fn propose(workspace: &Workspace, message: Option<&str>) -> Result<Proposed> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let base = adopted(&ledger)?;
    let set = RuleSet::read(&workspace.root).map_err(GovernanceError::Usage)?;
    if set.hash == base.row.set_hash {
        return Ok(Proposed::Unchanged(base.row.set_hash));
    }
    let (policy, _) = adopted_rules(&base)?;
    let changes = base.changes_to(&set).map_err(GovernanceError::Usage)?;
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
    Ok(Proposed::Recorded(Proposal {
        id,
        actor,
        from_hash: base.row.set_hash,
        to_hash: set.hash,
        class,
        changes,
        policy,
    }))
}

/// A pending change, or an error saying what became of it.
fn pending(ledger: &Ledger, id: i64) -> Result<RuleSetRow> {
    // Its class, approvals and files decide what may govern: a row the journal's keyed entries
    // do not vouch for (edited with raw SQL by a process without the key) is never read.
    ledger.check_rule_set_journaled(id)?;
    let change = ledger.rule_set(id)?;
    if change.status != "pending" {
        return Err(GovernanceError::Usage(format!(
            "rule change {id} is {}, not pending",
            change.status
        )));
    }
    Ok(change)
}

/// Rejects pending change `id` as the current account; returns the account.
pub fn reject(workspace: &Workspace, id: i64) -> Result<String> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    pending(&ledger, id)?;
    let actor = deciding_actor()?;
    ledger.decide_rule_set(id, "rejected", &actor)?;
    Ok(actor)
}

/// An approval recorded.
#[derive(Debug)]
pub struct Approved {
    pub actor: String,
    /// The roles the approver holds.
    pub roles: Vec<String>,
    /// What the change still needs before it may be adopted (`None`: nothing).
    pub missing: Option<String>,
}

/// Approves pending change `id` as the current account, never its proposer.
pub fn approve(workspace: &Workspace, id: i64) -> Result<Approved> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let change = pending(&ledger, id)?;
    let actor = deciding_actor()?;
    if crate::identity::same_account(&change.proposed_by, &actor) {
        return Err(GovernanceError::Usage(format!(
            "{actor} proposed rule change {id}: the proposer's approval never counts, another \
             account must approve it"
        )));
    }
    let (policy, roles) = adopted_rules(&adopted(&ledger)?)?;
    let held = roles.held_by_current_process();
    let signature = Signer::for_actor(Some(&roles), &ledger, &actor)?
        .map(|signer| signer.sign(&subject(&change)));
    let approval = RecordedApproval {
        actor: actor.clone(),
        roles: held.clone(),
        signature,
    };
    let change = ledger.approve_rule_set(id, &approval)?;
    let missing = policy
        .weakening
        .met_by(&vouched(&ledger, &roles, &change)?, proposer(&change))
        .err();
    Ok(Approved {
        actor,
        roles: held,
        missing,
    })
}

/// The current account to record a decision under; refused where its name cannot be trusted.
pub(crate) fn deciding_actor() -> Result<String> {
    crate::identity::deciding_actor().map_err(GovernanceError::Usage)
}

/// What an approval of `change` is of: the change and the files it proposes.
fn subject(change: &RuleSetRow) -> Subject {
    Subject {
        kind: "rule-set",
        id: change.id,
        what: change.set_hash.clone(),
    }
}

/// The approvals of `change` that count under `roles` (see [`signing::vouched`]), so that an
/// account that can write the ledger (with the journal key every writer holds) cannot record
/// another's approval.
fn vouched(ledger: &Ledger, roles: &Roles, change: &RuleSetRow) -> Result<Vec<RecordedApproval>> {
    signing::vouched(Some(roles), ledger, &subject(change), &change.approvals)
}

fn proposer(change: &RuleSetRow) -> Excluded<'_> {
    Excluded {
        actor: &change.proposed_by,
        described: "the proposer",
    }
}

/// A rule change adopted.
#[derive(Debug)]
pub struct Adopted {
    pub change: RuleSetRow,
    pub actor: String,
    /// The skills trusted under an older set, moved to be built and gated again
    /// ([`crate::skills::reverify_older`]).
    pub suspended: Vec<String>,
}

/// What adopting a rule change did, a line each, as `kavi policy adopt` and the review page
/// report it.
pub fn adopted_lines(adopted: &Adopted) -> Vec<String> {
    let Adopted {
        change,
        actor,
        suspended,
    } = adopted;
    std::iter::once(format!(
        "adopted rule change {} ({}) by {actor}: {} governs",
        change.id,
        change.class,
        short_hash(&change.set_hash)
    ))
    .chain(suspended.iter().map(|skill| {
        format!(
            "`{skill}` was trusted under an older rule set: it is suspended until the forge \
             builds and gates it again (`on_change = \"reverify\"`)"
        )
    }))
    .collect()
}

/// Makes pending change `id` the adopted set, once its files are still those proposed, it
/// changes the set adopted now, and a weakening one has its approvals; then suspends the skills
/// trusted under an older set, as the newly adopted rules ask.
pub fn adopt(workspace: &Workspace, id: i64) -> Result<Adopted> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let change = pending(&ledger, id)?;
    let base = adopted(&ledger)?;
    if change.based_on != Some(base.row.id) {
        return Err(GovernanceError::Usage(format!(
            "rule change {id} was proposed against another adopted set than {} (now adopted): \
             propose it again",
            short_hash(&base.row.set_hash)
        )));
    }
    let set = RuleSet::read(&workspace.root).map_err(GovernanceError::Usage)?;
    if set.hash != change.set_hash {
        return Err(GovernanceError::Usage(format!(
            "the governing files changed since rule change {id} was proposed ({} then, {} now): \
             propose them again",
            short_hash(&change.set_hash),
            short_hash(&set.hash)
        )));
    }
    // The class is worked out again from the texts, by the adopted `[adoption]` rules: the
    // recorded one is what propose found, and a record that says less is not taken at its word.
    let changes = base.changes_to(&set).map_err(GovernanceError::Usage)?;
    let class = adoption::overall(&changes.iter().map(|(_, c)| *c).collect::<Vec<_>>());
    if class.as_str() != change.class {
        return Err(GovernanceError::Usage(format!(
            "rule change {id} is recorded as {}, but by the adopted [adoption] rules its changes \
             are {}: the record was altered, or made by another version of kavi; propose it again",
            change.class,
            class.as_str()
        )));
    }
    if class == Class::Weakening {
        let (policy, roles) = adopted_rules(&base)?;
        policy
            .weakening
            .met_by(&vouched(&ledger, &roles, &change)?, proposer(&change))
            .map_err(|missing| {
                GovernanceError::Usage(format!("rule change {id} weakens the rules and {missing}"))
            })?;
    }
    let actor = deciding_actor()?;
    ledger.decide_rule_set(id, "adopted", &actor)?;
    let suspended = crate::skills::reverify_older(workspace, &mut ledger)?;
    Ok(Adopted {
        change,
        actor,
        suspended,
    })
}

#[cfg(test)]
mod tests {
    use super::{Member, PolicyDiff, Side};

    fn member(path: &str, hash: &str, text: &str) -> Member {
        Member {
            role: "policy".to_owned(),
            path: path.to_owned(),
            hash: hash.to_owned(),
            text: text.to_owned(),
        }
    }

    /// Each path once, in path order: an unchanged file is left out, a changed TOML file says
    /// what its change means, and the text diff names both sides.
    #[test]
    fn a_diff_lists_what_was_added_removed_and_changed() {
        let from = Side::of_workspace(vec![
            member("policies/gates.toml", "h1", "a = 1\n"),
            member("policies/same.toml", "h2", "b = 1\n"),
            member("policies/gone.txt", "h3", "gone\n"),
        ]);
        let to = Side::of_workspace(vec![
            member("policies/same.toml", "h2", "b = 1\n"),
            member("policies/gates.toml", "h4", "a = 2\n"),
            member("policies/new.txt", "h5", "new\n"),
        ]);
        let diff = PolicyDiff::between(from, to);
        let seen: Vec<(&str, &str)> = diff
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.change))
            .collect();
        assert_eq!(
            seen,
            [
                ("policies/gates.toml", "changed"),
                ("policies/gone.txt", "removed"),
                ("policies/new.txt", "added"),
            ]
        );
        let gates = &diff.files[0];
        assert_eq!(
            (gates.from_hash.as_deref(), gates.to_hash.as_deref()),
            (Some("h1"), Some("h4"))
        );
        assert!(
            !gates.meaning.is_empty(),
            "a changed TOML file is described"
        );
        assert!(diff.files[1].meaning.is_empty());
        assert!(
            gates
                .diff
                .contains("--- the workspace now/policies/gates.toml\n")
                && gates.diff.contains("-a = 1\n+a = 2\n"),
            "{}",
            gates.diff
        );
        assert_ne!(diff.from.governing_hash, diff.to.governing_hash);
    }
}
