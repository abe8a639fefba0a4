//! MCP prompts: one per chain of the workspace (`chains/*.toml`), its arguments the chain's
//! declared parameters. Getting one gives the chain's steps, rendered with the arguments, as
//! the message an agent follows with the server's tools: which skill to call, in which order,
//! with which input, and which field comes from which earlier result. A chain that does not
//! load is not offered. Listed in name order, paged as resources are.

use std::path::Path;

use rmcp::ErrorData as McpError;
use rmcp::model::{
    GetPromptResult, JsonObject, ListPromptsResult, Prompt, PromptArgument, PromptMessage, Role,
};
use serde_json::{Value, json};

use crate::chains::{Chain, Step};
use crate::diagnostic::Diagnostics;
use crate::template::TemplateEngine;

/// Every chain of the workspace at `root` that loads, by name.
fn chains(root: &Path, templates: &TemplateEngine) -> Vec<Chain> {
    let Ok(entries) = std::fs::read_dir(root.join("chains")) else {
        return Vec::new();
    };
    let mut chains: Vec<Chain> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .filter_map(|path| {
            let shown = path.strip_prefix(root).unwrap_or(&path).to_owned();
            crate::chains::load(&path, &shown, templates).ok()
        })
        .collect();
    chains.sort_by(|a, b| a.name.cmp(&b.name));
    chains
}

/// A page of prompts: after the prompt named `cursor`, at most `page`.
pub fn list(
    root: &Path,
    templates: &TemplateEngine,
    cursor: Option<&str>,
    page: usize,
) -> Result<ListPromptsResult, McpError> {
    let chains = chains(root, templates);
    let start = match cursor {
        None => 0,
        Some(after) => {
            chains.iter().position(|c| c.name == after).ok_or_else(|| {
                McpError::invalid_params(
                    format!(
                        "invalid cursor `{after}`: give the `nextCursor` a page of \
                             prompts/list ended with"
                    ),
                    None,
                )
            })? + 1
        }
    };
    let shown: Vec<&Chain> = chains.iter().skip(start).take(page).collect();
    let mut result = ListPromptsResult::with_all_items(shown.iter().map(|c| prompt(c)).collect());
    if start + shown.len() < chains.len() {
        result.next_cursor = shown.last().map(|c| c.name.clone());
    }
    Ok(result)
}

/// A chain as a prompt: each parameter an argument, required when it has no default.
fn prompt(chain: &Chain) -> Prompt {
    let arguments = chain
        .params
        .iter()
        .map(|(name, decl)| {
            let about = match &decl.default {
                Some(default) => format!("a {} (default {default})", decl.ty.name()),
                None => format!("a {}", decl.ty.name()),
            };
            let description = match &decl.description {
                Some(description) => format!("{description}: {about}"),
                None => about,
            };
            PromptArgument::new(name)
                .with_description(description)
                .with_required(decl.default.is_none())
        })
        .collect();
    let description = chain
        .description
        .clone()
        .unwrap_or_else(|| format!("the chain `{}`", chain.name));
    Prompt::new(&chain.name, Some(description), Some(arguments))
}

/// The prompt named `name`, its arguments checked as `kavi chain run --set` checks them.
pub fn get(
    root: &Path,
    templates: &TemplateEngine,
    name: &str,
    arguments: Option<JsonObject>,
) -> Result<GetPromptResult, McpError> {
    let chains = chains(root, templates);
    let Some(chain) = chains.iter().find(|c| c.name == name) else {
        let known: Vec<String> = chains.iter().map(|c| format!("`{}`", c.name)).collect();
        return Err(McpError::invalid_params(
            format!(
                "no prompt `{name}`: the prompts are the workspace's chains ({})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ),
            None,
        ));
    };
    // Arguments are strings in MCP; a client that sends a number or a flag means its text.
    let sets: Vec<(String, String)> = arguments
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| match value {
            Value::String(text) => (key, text),
            other => (key, other.to_string()),
        })
        .collect();
    let params = crate::spec::resolve_params(&chain.params, &sets).map_err(|problems| {
        McpError::invalid_params(
            format!("invalid arguments for `{name}`: {}", Diagnostics(problems)),
            None,
        )
    })?;
    let context = minijinja::Value::from_serialize(json!({
        "params": params,
        "chain": { "name": chain.name },
    }));
    let mut text = format!(
        "Run the chain `{}` with this server's tools, one call after another{}:\n",
        chain.name,
        if chain.stop_on_failure {
            ", stopping at the first that fails"
        } else {
            ""
        }
    );
    for (n, step) in chain.steps.iter().enumerate() {
        text.push_str(&format!(
            "{}. {}\n",
            n + 1,
            call(chain, step, templates, &context)?
        ));
    }
    let mut result = GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)]);
    result.description = chain.description.clone();
    Ok(result)
}

/// One step as the call an agent makes.
fn call(
    chain: &Chain,
    step: &Step,
    templates: &TemplateEngine,
    context: &minijinja::Value,
) -> Result<String, McpError> {
    let mut input = step.input.clone();
    crate::chains::render_input(&mut input, templates, context)
        .map_err(|e| McpError::invalid_params(format!("step `{}`: {e}", step.id), None))?;
    let mut line = format!("call `{}` with {input}", step.skill);
    if let Some(from) = step.from.filter(|_| !step.map.is_empty()) {
        let source = &chain.steps[from];
        let fields: Vec<String> = step
            .map
            .iter()
            .map(|(field, path)| format!("`{field}` set to `{path}` of its result"))
            .collect();
        line.push_str(&format!(
            ", and {} of step {} (`{}`)",
            fields.join(" and "),
            from + 1,
            source.id
        ));
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("chains")).unwrap();
        std::fs::write(
            dir.path().join("chains/find.toml"),
            "[chain]\nname = \"find_and_sum\"\ndescription = \"Find, then summarize\"\n\n\
             [params.query]\ntype = \"string\"\n\n[params.folder]\ntype = \"string\"\n\
             default = \"notes\"\n\n[[step]]\nid = \"search\"\nskill = \"find_notes\"\n\
             input = { query = \"{{ params.query }}\", folder = \"{{ params.folder }}\" }\n\n\
             [[step]]\nid = \"sum\"\nskill = \"summarize_note\"\n\
             map = { path = \"$.results[0].path\" }\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("chains/other.toml"),
            "[chain]\nname = \"again\"\n\n[[step]]\nid = \"a\"\nskill = \"word_count\"\n",
        )
        .unwrap();
        // Broken: not offered.
        std::fs::write(dir.path().join("chains/broken.toml"), "[chain]\nnmae = 1\n").unwrap();
        dir
    }

    #[test]
    fn each_chain_that_loads_is_a_prompt_with_its_parameters_paged_by_name() {
        let dir = workspace();
        let templates = TemplateEngine::new(&dir.path().join("templates"));
        let first = list(dir.path(), &templates, None, 1).unwrap();
        assert_eq!(first.prompts.len(), 1);
        assert_eq!(first.prompts[0].name, "again");
        let cursor = first.next_cursor.clone().unwrap();
        let second = list(dir.path(), &templates, Some(&cursor), 1).unwrap();
        let prompt = &second.prompts[0];
        assert_eq!(prompt.name, "find_and_sum");
        assert!(second.next_cursor.is_none());
        let arguments = prompt.arguments.as_ref().unwrap();
        let required: Vec<(&str, Option<bool>)> = arguments
            .iter()
            .map(|a| (a.name.as_str(), a.required))
            .collect();
        assert_eq!(required, [("query", Some(true)), ("folder", Some(false))]);
        assert!(list(dir.path(), &templates, Some("nope"), 1).is_err());
    }

    #[test]
    fn a_prompt_renders_the_steps_with_its_arguments_and_refuses_bad_ones() {
        let dir = workspace();
        let templates = TemplateEngine::new(&dir.path().join("templates"));
        let mut arguments = JsonObject::new();
        arguments.insert("query".into(), json!("governed"));
        let got = get(dir.path(), &templates, "find_and_sum", Some(arguments)).unwrap();
        let text = serde_json::to_value(&got.messages[0].content).unwrap()["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            text.contains(
                "1. call `find_notes` with {\"query\":\"governed\",\"folder\":\"notes\"}"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "2. call `summarize_note` with {}, and `path` set to `$.results[0].path` of its \
                 result of step 1 (`search`)"
            ),
            "{text}"
        );
        let missing = get(dir.path(), &templates, "find_and_sum", None).unwrap_err();
        assert!(
            missing
                .message
                .contains("missing required parameter `query`"),
            "{missing:?}"
        );
        let unknown = get(dir.path(), &templates, "broken", None).unwrap_err();
        assert!(
            unknown.message.contains("`again`, `find_and_sum`"),
            "{unknown:?}"
        );
    }
}
