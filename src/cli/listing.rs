//! `kavi pipeline list` and `kavi chain list`: what the workspace offers to run, each file
//! checked as `check` would, so a broken one shows with its first problem.

use serde_json::{Value, json};

use super::output::table;
use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::template::TemplateEngine;

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
        outln!(
            "{}",
            serde_json::to_string_pretty(listed).expect("a listing serializes")
        );
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

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_owned()
}

pub fn pipelines(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let templates = TemplateEngine::new(&workspace.templates_dir());
    let listed: Vec<Value> = super::doctor::specs_in(workspace, "pipelines")
        .iter()
        .map(|path| {
            let shown = path.strip_prefix(&workspace.root).unwrap_or(path);
            let context = crate::spec::LoadContext {
                root: &workspace.root,
                templates: &templates,
                including: &[],
            };
            let loaded = crate::spec::load_pipeline(path, shown, &context)
                .and_then(|p| {
                    crate::dag::compile(&p)?;
                    Ok((p.name.clone(), p.nodes.len(), p.description.clone()))
                })
                .map_err(|e| first_line(&e.to_string()));
            entry(&shown.display().to_string(), "nodes", loaded)
        })
        .collect();
    print(&listed, "nodes", json)
}

pub fn chains(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let templates = TemplateEngine::new(&workspace.templates_dir());
    let listed: Vec<Value> = super::doctor::specs_in(workspace, "chains")
        .iter()
        .map(|path| {
            let shown = path.strip_prefix(&workspace.root).unwrap_or(path);
            let loaded = crate::chains::load(path, shown, &templates)
                .map(|c| (c.name.clone(), c.steps.len(), c.description.clone()))
                .map_err(|e| first_line(&e.to_string()));
            entry(&shown.display().to_string(), "steps", loaded)
        })
        .collect();
    print(&listed, "steps", json)
}
