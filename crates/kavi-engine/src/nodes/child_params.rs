//! The parameters a `pipeline` or `chain` node hands to what it runs: templated strings,
//! checked against the declared parameters when the pipeline is loaded, and parsed by their
//! declared types when the node runs.

use indexmap::IndexMap;
use serde_json::{Map, Value};
use toml::Spanned;

use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::node::{NodeConfig, NodeContext};
use crate::spec::ParamDecl;

#[derive(Debug)]
pub struct ChildParams(IndexMap<String, String>);

impl ChildParams {
    /// Refuses a parameter `owner` (such as "chain `x`") does not declare, and a required one
    /// left unset (reported at `span`); checks each template.
    pub fn check(
        config: &mut NodeConfig<'_>,
        given: IndexMap<String, Spanned<String>>,
        declared: &IndexMap<String, ParamDecl>,
        owner: &str,
        span: std::ops::Range<usize>,
    ) -> Result<Self, Diagnostic> {
        for (name, value) in &given {
            if !declared.contains_key(name) {
                let known: Vec<_> = declared.keys().map(|k| format!("`{k}`")).collect();
                return Err(config
                    .error(format!("{owner} has no parameter `{name}`"), value.span())
                    .with_help(format!("its parameters: {}", known.join(", "))));
            }
            config.check_template(value)?;
        }
        if let Some((name, _)) = declared
            .iter()
            .find(|(name, decl)| decl.default.is_none() && !given.contains_key(*name))
        {
            return Err(config.error(
                format!("{owner} needs parameter `{name}`; set it in `params`"),
                span,
            ));
        }
        Ok(Self(
            given
                .into_iter()
                .map(|(k, v)| (k, v.into_inner()))
                .collect(),
        ))
    }

    /// Renders each value and parses it by its declared type.
    pub fn resolve(
        &self,
        ctx: &NodeContext<'_>,
        declared: &IndexMap<String, ParamDecl>,
    ) -> Result<Map<String, Value>, String> {
        let mut sets = Vec::new();
        for (name, source) in &self.0 {
            sets.push((name.clone(), ctx.render(&format!("params.{name}"), source)?));
        }
        crate::spec::resolve_params(declared, &sets)
            .map_err(|problems| Diagnostics(problems).to_string())
    }
}
