//! The workspace's pipelines and chains, each loaded and checked as `check` would: listed by
//! `kavi pipeline list` and `kavi chain list`, and checked by `kavi doctor` and `kavi policy
//! check`.

use serde_json::{Value, json};

use super::output::table;
use std::path::{Path, PathBuf};

use crate::chains::Chain;
use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::spec::{Pipeline, SpecError};
use crate::template::TemplateEngine;

/// The `.toml` files of a workspace folder, sorted.
fn specs_in(workspace: &Workspace, folder: &str) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(workspace.root.join(folder))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

/// Every spec of a workspace folder, as (path shown, what `load` made of it).
fn load_all<T>(
    workspace: &Workspace,
    folder: &str,
    load: impl Fn(&Path, &Path, &TemplateEngine) -> Result<T, SpecError>,
) -> Vec<(PathBuf, Result<T, SpecError>)> {
    let templates = TemplateEngine::new(&workspace.templates_dir());
    specs_in(workspace, folder)
        .into_iter()
        .map(|path| {
            let shown = path
                .strip_prefix(&workspace.root)
                .unwrap_or(&path)
                .to_owned();
            let loaded = load(&path, &shown, &templates);
            (shown, loaded)
        })
        .collect()
}

/// Every pipeline of `pipelines/`, loaded and compiled.
pub(super) fn workspace_pipelines(
    workspace: &Workspace,
) -> Vec<(PathBuf, Result<Pipeline, SpecError>)> {
    load_all(workspace, "pipelines", |path, shown, templates| {
        let context = crate::spec::LoadContext {
            root: &workspace.root,
            templates,
            including: &[],
            registry: crate::nodes::registry(),
        };
        let pipeline = crate::spec::load_pipeline(path, shown, &context)?;
        crate::dag::compile(&pipeline)?;
        Ok(pipeline)
    })
}

/// Every chain of `chains/`, loaded.
pub(super) fn workspace_chains(workspace: &Workspace) -> Vec<(PathBuf, Result<Chain, SpecError>)> {
    load_all(workspace, "chains", crate::chains::load)
}

/// One listed file: its path, and its name, size (in `unit`) and description, or its first
/// problem.
fn entry(path: &str, unit: &str, loaded: Result<(String, usize, Option<String>), String>) -> Value {
    match loaded {
        Ok((name, size, description)) => {
            json!({ "file": path, "name": name, unit: size, "description": description })
        }
        Err(problem) => json!({ "file": path, "error": problem }),
    }
}

fn print(listed: &[Value], unit: &str, json: bool) -> Result<i32, Error> {
    if json {
        super::print_json(listed);
    } else {
        let mut rows = vec![
            ["NAME", &unit.to_uppercase(), "FILE", "DESCRIPTION"]
                .map(String::from)
                .to_vec(),
        ];
        for item in listed {
            let text = |key: &str| item[key].as_str().unwrap_or_default().to_owned();
            rows.push(match item.get("error") {
                Some(_) => vec![
                    "-".into(),
                    "-".into(),
                    text("file"),
                    format!("INVALID: {}", text("error")),
                ],
                None => vec![
                    text("name"),
                    item[unit].to_string(),
                    text("file"),
                    text("description"),
                ],
            });
        }
        out!("{}", table(&rows));
    }
    // A broken file is a problem with the workspace's specs.
    Ok(if listed.iter().any(|item| item.get("error").is_some()) {
        exit::INVALID_SPEC
    } else {
        exit::SUCCESS
    })
}

pub(super) fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_owned()
}

pub fn pipelines(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let listed: Vec<Value> = workspace_pipelines(workspace)
        .into_iter()
        .map(|(shown, loaded)| {
            let loaded = loaded
                .map(|p| (p.name, p.nodes.len(), p.description))
                .map_err(|e| first_line(&e.to_string()));
            entry(&shown.display().to_string(), "nodes", loaded)
        })
        .collect();
    print(&listed, "nodes", json)
}

pub fn chains(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let listed: Vec<Value> = workspace_chains(workspace)
        .into_iter()
        .map(|(shown, loaded)| {
            let loaded = loaded
                .map(|c| (c.name, c.steps.len(), c.description))
                .map_err(|e| first_line(&e.to_string()));
            entry(&shown.display().to_string(), "steps", loaded)
        })
        .collect();
    print(&listed, "steps", json)
}
