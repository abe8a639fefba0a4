//! `vars`: values a node passes into the templates of a policy file (an allowlist's paths, a
//! gate's argv). Policy templates see only these, so a policy does not depend on how a pipeline
//! names its parameters, and `check` can refuse a template that reads something not passed.
//!
//! When a node passes `skill`, policy templates also see `paths.<name>`: the skill's paths from
//! the naming conventions (`policies/conventions.toml`), the one source of naming truth.

use std::sync::Arc;

use indexmap::IndexMap;
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::node::{NodeConfig, NodeContext};
use crate::skills::conventions::{self, Conventions};
use crate::template::{TemplateEngine, describe_error};

#[derive(Debug, Clone)]
pub struct Vars {
    values: IndexMap<String, String>,
    /// Loaded when `skill` is passed.
    conventions: Option<Conventions>,
}

impl Vars {
    /// Takes a node's `vars` table, checking each value's template.
    pub fn load(
        config: &mut NodeConfig<'_>,
        vars: IndexMap<String, Spanned<String>>,
    ) -> Result<Self, Diagnostic> {
        for value in vars.values() {
            config.check_template(value)?;
        }
        let conventions = if vars.contains_key("skill") {
            let source = config.load_policy_source(None, conventions::DEFAULT_POLICY)?;
            Some(Conventions::parse(&source, config.templates)?)
        } else {
            None
        };
        Ok(Self {
            values: vars.into_iter().map(|(k, v)| (k, v.into_inner())).collect(),
            conventions,
        })
    }

    /// Checks a template in a policy file: it must parse and read only these vars (and, with
    /// `skill`, declared conventions).
    pub fn check_policy_template(
        &self,
        templates: &TemplateEngine,
        template: &Spanned<String>,
        policy: &Arc<SourceFile>,
    ) -> Result<(), Diagnostic> {
        let reads = templates.check_str(template.get_ref()).map_err(|e| {
            Diagnostic::new(format!("invalid template: {}", describe_error(&e)))
                .at(policy, template.span())
        })?;
        for read in reads {
            let mut parts = read.split('.');
            let name = parts.next().unwrap_or(&read);
            if name == "paths" {
                let Some(conventions) = &self.conventions else {
                    return Err(Diagnostic::new(format!(
                        "a template in {} reads `paths`, which needs `skill` in the node's `vars`",
                        policy.path.display()
                    ))
                    .at(policy, template.span()));
                };
                if let Some(path) = parts.next().filter(|p| !conventions.has(p)) {
                    let known: Vec<&str> = conventions.names().collect();
                    return Err(Diagnostic::new(format!(
                        "`paths.{path}` is not a convention in {}",
                        conventions.source.path.display()
                    ))
                    .at(policy, template.span())
                    .with_help(format!("conventions: {}", known.join(", "))));
                }
            } else if !self.values.contains_key(name) {
                return Err(Diagnostic::new(format!(
                    "a template in {} reads `{name}`, which the node does not pass in `vars`",
                    policy.path.display()
                ))
                .at(policy, template.span())
                .with_help(format!("add `vars = {{ {name} = \"...\" }}` to the node")));
            }
        }
        Ok(())
    }

    /// Renders the vars for this run: the context policy templates are rendered with.
    pub fn render(&self, ctx: &NodeContext<'_>) -> Result<minijinja::Value, String> {
        let mut rendered = serde_json::Map::new();
        for (key, value) in &self.values {
            rendered.insert(
                key.clone(),
                ctx.render(&format!("vars.{key}"), value)?.into(),
            );
        }
        if let (Some(conventions), Some(skill)) = (&self.conventions, rendered.get("skill")) {
            let skill = skill.as_str().unwrap_or_default().to_owned();
            let paths = conventions.render(&ctx.env.templates, &skill)?;
            rendered.insert(
                "paths".into(),
                serde_json::to_value(paths).expect("paths serialize"),
            );
        }
        Ok(minijinja::Value::from_serialize(&rendered))
    }

    /// Renders one policy template with rendered vars.
    pub fn apply(
        ctx: &NodeContext<'_>,
        template: &str,
        context: &minijinja::Value,
    ) -> Result<String, String> {
        ctx.env
            .templates
            .render_str(template, context)
            .map_err(|e| format!("failed to render `{template}`: {}", describe_error(&e)))
    }

    /// Renders each of `templates` with rendered vars.
    pub fn apply_all(
        ctx: &NodeContext<'_>,
        templates: &[String],
        context: &minijinja::Value,
    ) -> Result<Vec<String>, String> {
        templates
            .iter()
            .map(|template| Self::apply(ctx, template, context))
            .collect()
    }
}
