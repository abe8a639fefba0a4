//! The names a shell completes (`COMPLETE=bash kavi -- ...`, see `kavi_cli::complete`), read
//! from the workspace the line would run in. Nothing is made: no ledger, no folder; a name that
//! cannot be read is simply not offered.

use kavi_cli::complete::{Line, Names};

use crate::config::{Overrides, Workspace};
use crate::ledger::Ledger;

/// Every name of `kind` the workspace of `line` has, each with what it is in a few words.
pub fn names(kind: Names, line: &Line) -> Vec<(String, Option<String>)> {
    let Ok(workspace) = Workspace::load(line.workspace.as_deref(), &Overrides::default()) else {
        return Vec::new();
    };
    match kind {
        Names::Pipeline => specs(super::listing::workspace_pipelines(&workspace), |p| {
            p.description
        }),
        Names::Chain => specs(super::listing::workspace_chains(&workspace), |c| {
            c.description
        }),
        Names::PipelineNode => line
            .file
            .as_deref()
            .and_then(|file| super::pipeline::load(&workspace, file).ok())
            .map(|(pipeline, _)| {
                pipeline
                    .nodes
                    .into_iter()
                    .map(|node| (node.id, node.description))
                    .collect()
            })
            .unwrap_or_default(),
        Names::Skill => skills(&workspace),
        Names::Run => runs(&workspace),
        Names::RunNode => run_nodes(&workspace, line.run.as_deref()),
    }
}

/// Each spec file that loads, by its file name, described.
fn specs<T>(
    loaded: Vec<(std::path::PathBuf, Result<T, crate::spec::SpecError>)>,
    description: impl Fn(T) -> Option<String>,
) -> Vec<(String, Option<String>)> {
    loaded
        .into_iter()
        .filter_map(|(path, spec)| {
            let name = path.file_name()?.to_string_lossy().into_owned();
            Some((name, spec.ok().and_then(&description)))
        })
        .collect()
}

/// The skills proposed in `proposals/`, and those the ledger trusts.
fn skills(workspace: &Workspace) -> Vec<(String, Option<String>)> {
    let mut names: std::collections::BTreeMap<String, Option<String>> =
        std::fs::read_dir(workspace.root.join("proposals"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let path = entry.path();
                let name = path.file_stem()?.to_string_lossy().into_owned();
                (path.extension()? == "toml").then_some((name, None))
            })
            .collect();
    if let Ok(ledger) = Ledger::open_existing(&workspace.config.ledger)
        && let Ok(trusted) = ledger.trusted_skills(crate::skills::TRUSTED)
    {
        for skill in trusted {
            names.insert(
                skill.name,
                Some(format!("trusted, version {}", skill.version)),
            );
        }
    }
    names.into_iter().collect()
}

/// The most recent runs, newest first.
fn runs(workspace: &Workspace) -> Vec<(String, Option<String>)> {
    let Ok(ledger) = Ledger::open_existing(&workspace.config.ledger) else {
        return Vec::new();
    };
    ledger
        .list_runs(20)
        .unwrap_or_default()
        .into_iter()
        .map(|run| {
            let what = format!("{} {} {}", run.pipeline, run.status, run.started_at);
            (run.id.to_string(), Some(what))
        })
        .collect()
}

/// The nodes the run named on the line recorded.
fn run_nodes(workspace: &Workspace, run: Option<&str>) -> Vec<(String, Option<String>)> {
    let Some(run) = run else {
        return Vec::new();
    };
    let Ok(ledger) = Ledger::open_existing(&workspace.config.ledger) else {
        return Vec::new();
    };
    let Ok(detail) = ledger.resolve_run(run).and_then(|id| ledger.run_detail(id)) else {
        return Vec::new();
    };
    let mut nodes: Vec<(String, Option<String>)> = detail
        .nodes
        .into_iter()
        .map(|node| (node.node_id, Some(node.state.to_string())))
        .collect();
    nodes.dedup_by(|a, b| a.0 == b.0);
    nodes
}
