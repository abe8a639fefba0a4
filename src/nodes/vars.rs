//! `vars`: values a node passes into the templates of a policy file (an allowlist's paths, a
//! gate's argv). Policy templates see only these, so a policy does not depend on how a pipeline
//! names its parameters, and `check` can refuse a template that reads something not passed.

use std::sync::Arc;

use indexmap::IndexMap;
use toml::Spanned;

use super::{NodeConfig, NodeContext};
use crate::diagnostic::{Diagnostic, SourceFile};
use crate::template::{TemplateEngine, describe_error};

#[derive(Debug, Clone)]
pub struct Vars(IndexMap<String, String>);

impl Vars {
    /// Takes a node's `vars` table, checking each value's template.
    pub fn load(
        config: &mut NodeConfig<'_>,
        vars: IndexMap<String, Spanned<String>>,
    ) -> Result<Self, Diagnostic> {
        for value in vars.values() {
            config.check_template(value)?;
        }
        Ok(Self(
            vars.into_iter().map(|(k, v)| (k, v.into_inner())).collect(),
        ))
    }

    /// Checks a template in a policy file: it must parse and read only these vars.
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
            let name = read.split('.').next().unwrap_or(&read);
            if !self.0.contains_key(name) {
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
        for (key, value) in &self.0 {
            rendered.insert(
                key.clone(),
                ctx.render(&format!("vars.{key}"), value)?.into(),
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
        ctx.templates
            .render_str(template, context)
            .map_err(|e| format!("failed to render `{template}`: {}", describe_error(&e)))
    }
}
