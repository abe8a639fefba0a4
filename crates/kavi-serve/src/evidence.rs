//! What a person needs on one page to decide on a run: what `kavi runs show`, `kavi builds list`,
//! `kavi research`, `kavi policy diff` and `kavi policy status` each print, gathered for the run
//! a user started and its attempts, plus the builder's files against the trusted version.

use serde::Serialize;
use similar::TextDiff;

use kavi_foundation::hash::sha256_hex;
use kavi_foundation::template::TemplateEngine;
use kavi_governance::adoption::{self, FileChange};
use kavi_ledger::{
    ArtifactStore, BuildRow, EscalationRow, Ledger, RuleSetRow, RunDetail, VerificationRow,
    final_attempts,
};
use kavi_policy::skills::trust::SkillTree;
use kavi_spec::config::Workspace;

use crate::App;
use crate::graph::{self, Drawing};

/// A run's page: the run, its nodes, and when it awaits review, the evidence.
#[derive(Serialize)]
pub struct RunPage {
    pub detail: RunDetail,
    /// The nodes as they ended (the last attempt of each), in the order they were recorded.
    pub nodes: Vec<Node>,
    /// The run's graph drawn with its nodes' states, or why the kept spec gives none.
    pub graph: Result<Drawing, String>,
    pub attempts: Vec<Attempt>,
    pub escalations: Vec<EscalationRow>,
    pub skills: Vec<SkillEvidence>,
    pub policy_diff: Result<Vec<FileChange>, String>,
    /// The governing files on disk against the adopted rule set, and the pending rule changes.
    pub rules: Result<Rules, String>,
    /// The roles the account running the server holds in the adopted rules, recorded with its
    /// approval.
    pub roles: Result<Vec<String>, String>,
    /// What the forms carry to refuse a decision on a run that changed since the page was shown.
    pub seen: String,
}

#[derive(Serialize)]
pub struct Node {
    pub id: String,
    pub kind: String,
    pub state: String,
    pub attempt: i64,
    pub detail: Option<String>,
    pub outputs: Option<String>,
}

/// A child run of the one a user started: one forge attempt, with its gates.
#[derive(Serialize)]
pub struct Attempt {
    pub run: i64,
    pub status: String,
    pub verifications: Vec<VerificationRow>,
    /// The classifier's kind, from the `classify` node.
    pub classified: Option<String>,
}

/// A skill the stopped run builds: its state, builds and their research, and its files.
#[derive(Serialize)]
pub struct SkillEvidence {
    pub name: String,
    pub state: String,
    pub builds: Vec<Build>,
    pub files: Result<Vec<FileDiff>, String>,
    /// What the files are compared with.
    pub against: String,
}

#[derive(Serialize)]
pub struct Build {
    #[serde(flatten)]
    pub row: BuildRow,
    pub note: Option<String>,
}

#[derive(Serialize)]
pub struct FileDiff {
    pub path: String,
    /// `added`, `removed` or `changed`.
    pub change: &'static str,
    pub diff: String,
}

#[derive(Serialize)]
pub struct Rules {
    pub adopted: i64,
    pub changes: Vec<(String, String)>,
    pub pending: Vec<PendingChange>,
}

/// A pending rule change, with what its form carries to refuse a decision on it once changed.
#[derive(Serialize)]
pub struct PendingChange {
    #[serde(flatten)]
    pub row: RuleSetRow,
    pub seen: String,
}

/// The state of a run a decision is made on, as a hash: the run, its nodes and children, and its
/// pending escalations with their approvals. Any change to these makes a form shown before it
/// stale.
pub fn fingerprint(ledger: &Ledger, root: i64) -> Result<String, String> {
    let detail = ledger.run_detail(root).map_err(|e| e.to_string())?;
    let pending = ledger
        .pending_escalations(root)
        .map_err(|e| e.to_string())?;
    let state = serde_json::to_vec(&(&detail, &pending)).map_err(|e| e.to_string())?;
    Ok(sha256_hex(&state))
}

/// The state of pending rule change `id` as a hash: its status and approvals.
pub fn rules_fingerprint(ledger: &Ledger, id: i64) -> Result<String, String> {
    let row = ledger.rule_set(id).map_err(|e| e.to_string())?;
    rule_change_fingerprint(&row)
}

fn rule_change_fingerprint(row: &RuleSetRow) -> Result<String, String> {
    let state = serde_json::to_vec(row).map_err(|e| e.to_string())?;
    Ok(sha256_hex(&state))
}

/// The governing files on disk against the adopted rule set, and the rule changes pending, as
/// `kavi policy diff` reports them, each change with what its forms carry.
pub fn rules(workspace: &Workspace) -> Result<Rules, String> {
    let status = adoption::status(workspace).map_err(|e| e.to_string())?;
    let pending = status
        .pending
        .into_iter()
        .map(|row| {
            Ok(PendingChange {
                seen: rule_change_fingerprint(&row)?,
                row,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(Rules {
        adopted: status.adopted.row.id,
        changes: status
            .changes
            .into_iter()
            .map(|(change, class)| (change, class.as_str().to_owned()))
            .collect(),
        pending,
    })
}

pub fn gather(app: &App, ledger: &Ledger, run_id: i64) -> Result<RunPage, String> {
    let workspace = &app.workspace;
    let err = |e: kavi_ledger::LedgerError| e.to_string();
    let detail = ledger.run_detail(run_id).map_err(err)?;
    let nodes: Vec<Node> = final_attempts(&detail.nodes)
        .into_iter()
        .map(|n| Node {
            id: n.node_id.clone(),
            kind: n.kind.clone(),
            state: n.state.to_string(),
            attempt: n.attempt,
            detail: n.error.clone().or_else(|| n.reason.clone()),
            outputs: n
                .outputs
                .as_ref()
                .filter(|o| o.as_object().is_some_and(|o| !o.is_empty()))
                .and_then(|o| serde_json::to_string_pretty(o).ok()),
        })
        .collect();
    let graph = app.cli.graph(workspace, run_id).map(|declared| {
        graph::layout(&declared, |id| {
            nodes
                .iter()
                .find(|n| n.id == id)
                .map_or_else(|| "not recorded".to_owned(), |n| n.state.clone())
        })
    });
    let mut attempts = Vec::new();
    for child in &detail.children {
        let child_detail = ledger.run_detail(child.id).map_err(err)?;
        let classified = final_attempts(&child_detail.nodes)
            .into_iter()
            .find(|n| n.kind == "classify")
            .and_then(|n| n.outputs.as_ref()?["kind"].as_str().map(str::to_owned));
        attempts.push(Attempt {
            run: child.id,
            status: child.status.to_string(),
            verifications: child_detail.verifications,
            classified,
        });
    }
    let escalations = ledger.pending_escalations(run_id).map_err(err)?;
    let store = kavi_governance::open_store(workspace).map_err(|e| e.to_string())?;
    let mut names: Vec<&str> = escalations.iter().map(|e| e.skill.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let skills = names
        .into_iter()
        .map(|name| skill_evidence(workspace, ledger, &store, name))
        .collect::<Result<_, _>>()?;
    let policy_diff = app.cli.policy_diff(workspace, run_id);
    let rules = rules(workspace);
    let roles = kavi_policy::adoption::Governing::adopted(ledger)
        .and_then(|set| set.map(|set| set.roles()).transpose())
        .map(|roles| {
            roles
                .flatten()
                .map(|r| r.held_by_current_process())
                .unwrap_or_default()
        });
    let seen = fingerprint(ledger, run_id)?;
    Ok(RunPage {
        detail,
        nodes,
        graph,
        attempts,
        escalations,
        skills,
        policy_diff,
        rules,
        roles,
        seen,
    })
}

fn skill_evidence(
    workspace: &Workspace,
    ledger: &Ledger,
    store: &ArtifactStore,
    name: &str,
) -> Result<SkillEvidence, String> {
    let skill = ledger.skill(name).map_err(|e| e.to_string())?;
    // Every build of the skill, each naming the one it follows: the attempts' lineage.
    let builds = ledger
        .builds(name)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|row| {
            let note = row
                .research_note
                .as_deref()
                .map(|sha| store.read_text(sha).unwrap_or_else(|e| format!("({e})")));
            Build { row, note }
        })
        .collect();
    let (files, against) = files_against_trusted(workspace, store, &skill);
    Ok(SkillEvidence {
        name: name.to_owned(),
        state: skill.state,
        builds,
        files,
        against,
    })
}

/// The skill's files in the workspace (what the builder's copy-back left) against the trusted
/// version kept in the artifact store, or against nothing for a skill never trusted.
fn files_against_trusted(
    workspace: &Workspace,
    store: &ArtifactStore,
    skill: &kavi_ledger::SkillRow,
) -> (Result<Vec<FileDiff>, String>, String) {
    let templates = TemplateEngine::new(&workspace.templates_dir());
    let (trusted, against) = match (&skill.trusted_tree, &skill.trusted_hash) {
        (Some(tree), Some(hash)) => (
            SkillTree::load(store, tree, hash).map(Some),
            format!(
                "the trusted version {}",
                skill.trusted_version.unwrap_or_default()
            ),
        ),
        _ => (Ok(None), "nothing: no version was trusted yet".to_owned()),
    };
    let files = kavi_governance::load_trust(workspace, &templates)
        .map_err(|e| e.to_string())
        .and_then(|trust| {
            trust.read_tree(
                &templates,
                &workspace.root,
                &skill.name,
                &skill.proposal_path,
            )
        })
        .and_then(|now| Ok(diff_trees(trusted?.as_ref(), &now)));
    (files, against)
}

fn tree_files(tree: &SkillTree) -> Vec<(String, &[u8])> {
    std::iter::once((tree.proposal_path.clone(), tree.proposal.as_slice()))
        .chain(
            tree.files
                .iter()
                .map(|f| (format!("{}/{}", tree.folder, f.path), f.bytes.as_slice())),
        )
        .collect()
}

fn diff_trees(before: Option<&SkillTree>, after: &SkillTree) -> Vec<FileDiff> {
    let before = before.map(tree_files).unwrap_or_default();
    let after = tree_files(after);
    let mut paths: Vec<&str> = before
        .iter()
        .chain(&after)
        .map(|(p, _)| p.as_str())
        .collect();
    paths.sort_unstable();
    paths.dedup();
    let find = |side: &[(String, &[u8])], path: &str| {
        side.iter()
            .find(|(p, _)| p == path)
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
    };
    paths
        .into_iter()
        .filter_map(|path| {
            let (old, new) = (find(&before, path), find(&after, path));
            let change = match (&old, &new) {
                (None, Some(_)) => "added",
                (Some(_), None) => "removed",
                (Some(a), Some(b)) if a != b => "changed",
                _ => return None,
            };
            let (old, new) = (old.unwrap_or_default(), new.unwrap_or_default());
            let diff = TextDiff::from_lines(&old, &new)
                .unified_diff()
                .header(&format!("a/{path}"), &format!("b/{path}"))
                .to_string();
            Some(FileDiff {
                path: path.to_owned(),
                change,
                diff,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kavi_policy::skills::trust::TreeFile;

    fn tree(files: &[(&str, &str)]) -> SkillTree {
        SkillTree {
            proposal_path: "proposals/s.toml".into(),
            proposal: b"name = \"s\"\n".to_vec(),
            folder: "skills/s".into(),
            files: files
                .iter()
                .map(|(path, text)| TreeFile {
                    path: (*path).into(),
                    bytes: text.as_bytes().to_vec(),
                    executable: false,
                    meta: None,
                })
                .collect(),
        }
    }

    #[test]
    fn the_diff_names_each_file_added_removed_or_changed_and_skips_the_same() {
        let trusted = tree(&[("a.py", "x = 1\n"), ("gone.py", "y\n"), ("same.py", "z\n")]);
        let built = tree(&[("a.py", "x = 2\n"), ("new.py", "w\n"), ("same.py", "z\n")]);
        let diffs = diff_trees(Some(&trusted), &built);
        let changes: Vec<(&str, &str)> =
            diffs.iter().map(|d| (d.path.as_str(), d.change)).collect();
        assert_eq!(
            changes,
            [
                ("skills/s/a.py", "changed"),
                ("skills/s/gone.py", "removed"),
                ("skills/s/new.py", "added"),
            ]
        );
        assert_eq!(
            diffs[0].diff,
            "--- a/skills/s/a.py\n+++ b/skills/s/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
        );
        // Never trusted: every file, the proposal too, is added.
        let first = diff_trees(None, &built);
        assert_eq!(first.len(), 4);
        assert!(first.iter().all(|d| d.change == "added"));
    }
}
