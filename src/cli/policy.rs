//! `kavi policy diff`: what changed in governance between two runs, or between a run and the
//! workspace as it is now, in words first and then as a text diff.

use serde::Serialize;
use similar::TextDiff;

use crate::config::Workspace;
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::error::{Error, exit};
use crate::ledger::{Ledger, short_hash};
use crate::policy::roles::{DEFAULT_POLICY as ROLES, Roles};
use crate::skills::Lifecycle;
use crate::spec::SpecError;
use crate::spec::governing::set_hash;

/// The lifecycle every skill command follows.
const LIFECYCLE: &str = crate::nodes::LIFECYCLE_POLICY;

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
            let text = std::fs::read_to_string(path)
                .map_err(|e| Diagnostic::new(format!("cannot read {}: {e}", shown.display())))?;
            let source = crate::diagnostic::SourceFile::new(shown, text);
            crate::skills::Proposal::parse(&source)?.check_writes(&source, &workspace.root)
        })
        .collect()
}
