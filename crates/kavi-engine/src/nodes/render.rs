//! `render`: render a template from `templates/` into an artifact (and optionally a file).
//!
//! Rendering is strict: a variable the template reads but the context lacks is an error.

use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use crate::diagnostic::Diagnostic;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::sandbox::contained_path;
use crate::template::describe_error;

pub const KIND: NodeKind = NodeKind {
    name: "render",
    parse,
    schema: <RenderConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RenderConfig {
    /// A file name under `templates/`.
    #[schemars(with = "String")]
    template: Spanned<String>,
    /// Extra values for the template, as `vars.<name>`; each is itself a string template.
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    vars: IndexMap<String, Spanned<String>>,
    /// Also write the result to this path, relative to the workspace and inside it.
    #[schemars(with = "Option<String>")]
    dest: Option<Spanned<String>>,
    /// The artifact kind recorded in the ledger.
    #[serde(default = "default_kind")]
    artifact_kind: String,
}

fn default_kind() -> String {
    "RENDERED".to_owned()
}

#[derive(Debug)]
struct Render {
    template: String,
    vars: IndexMap<String, String>,
    dest: Option<String>,
    artifact_kind: String,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: RenderConfig = config.deserialize()?;
    let vars = raw.vars.keys().map(String::as_str).collect();
    let scope = config.scope().with("vars", Some(vars));
    config.check_template_file(&raw.template, &scope)?;
    for value in raw.vars.values() {
        config.check_template(value)?;
    }
    if let Some(dest) = &raw.dest {
        config.check_template(dest)?;
    }
    Ok(Arc::new(Render {
        template: raw.template.into_inner(),
        vars: raw
            .vars
            .into_iter()
            .map(|(k, v)| (k, v.into_inner()))
            .collect(),
        dest: raw.dest.map(Spanned::into_inner),
        artifact_kind: raw.artifact_kind,
    }))
}

impl Render {
    async fn render(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let mut vars = serde_json::Map::new();
        for (key, value) in &self.vars {
            vars.insert(
                key.clone(),
                ctx.render(&format!("vars.{key}"), value)?.into(),
            );
        }
        let context = minijinja::context! { vars => vars, ..ctx.vars.clone() };
        let text = ctx
            .env
            .templates
            .render_file(&self.template, &context)
            .map_err(|e| format!("failed to render {}: {}", self.template, describe_error(&e)))?;
        let artifact = ctx
            .env
            .artifacts
            .put_bytes(&self.artifact_kind, text.as_bytes())
            .map_err(|e| format!("failed to store the rendered text: {e}"))?;
        let mut outputs = json!({
            "artifact": artifact.sha256,
            "path": ctx.env.artifacts.path_of(&artifact),
            "bytes": artifact.size,
        });
        if let Some(dest) = &self.dest {
            let dest = ctx.render("dest", dest)?;
            let path = contained_path(&ctx.env.workspace, &dest)
                .map_err(|e| format!("refused `dest`: {e}"))?;
            if let Some(parent) = path.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .map_err(|e| format!("failed to create {}: {e}", parent.display()))?;
            }
            tokio::fs::write(&path, &text)
                .await
                .map_err(|e| format!("failed to write {}: {e}", path.display()))?;
            outputs["dest"] = json!(dest);
        }
        let mut outcome = NodeOutcome::succeeded(outputs);
        outcome.artifacts.push(("rendered", artifact));
        Ok(outcome)
    }
}

#[async_trait::async_trait]
impl NodeAction for Render {
    /// It reads no setting but through its templates.
    fn config_settings(&self) -> &'static [&'static str] {
        &[]
    }

    fn output_keys(&self) -> Option<&'static [&'static str]> {
        Some(&["artifact", "path", "bytes", "dest"])
    }

    fn describe(&self) -> String {
        match &self.dest {
            Some(dest) => format!("render {} -> {dest}", self.template),
            None => format!("render {}", self.template),
        }
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.render(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}
