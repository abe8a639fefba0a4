//! The diff allowlist, shared by `diff_gate` and `copy_back`: which paths a build may change,
//! rendered per run from the policy's templates and the node's `vars`.

use std::path::Path;

use globset::GlobSet;
use indexmap::IndexMap;
use serde::Serialize;
use toml::Spanned;

use super::vars::Vars;
use super::{NodeConfig, NodeContext};
use crate::diagnostic::Diagnostic;
use crate::policy::{self, AllowlistPolicy};
use crate::sandbox;

pub const DEFAULT_POLICY: &str = "policies/allowlist.toml";

#[derive(Debug)]
pub struct Allowlist {
    /// Path templates over `vars`, and whether each is required.
    paths: Vec<(String, bool)>,
    ignore: GlobSet,
    /// The node's values for the templates; each is itself a template over the run.
    vars: Vars,
    pub policy_path: String,
}

/// How the changes in a sandbox measure up against the allowlist.
#[derive(Debug, Default, Serialize)]
pub struct Review {
    pub changed: Vec<String>,
    pub allowed: Vec<String>,
    pub ignored: Vec<String>,
    pub violations: Vec<String>,
    pub missing_required: Vec<String>,
}

impl Review {
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.missing_required.is_empty()
    }

    /// One line naming every offending path.
    pub fn failure(&self) -> String {
        let mut parts = Vec::new();
        if !self.violations.is_empty() {
            parts.push(format!(
                "changed outside the allowlist: {}",
                self.violations.join(", ")
            ));
        }
        if !self.missing_required.is_empty() {
            parts.push(format!(
                "required but missing: {}",
                self.missing_required.join(", ")
            ));
        }
        parts.join("; ")
    }
}

impl Allowlist {
    /// Loads the allowlist policy and checks that its templates read only the given `vars`.
    pub fn load(
        config: &mut NodeConfig<'_>,
        field: Option<&Spanned<String>>,
        vars: IndexMap<String, Spanned<String>>,
    ) -> Result<Self, Diagnostic> {
        let vars = Vars::load(config, vars)?;
        let policy = config.load_policy::<AllowlistPolicy>(field, DEFAULT_POLICY)?;
        for allowed in &policy.value.paths {
            vars.check_policy_template(config.templates, &allowed.path, &policy.source)?;
        }
        Ok(Self {
            paths: policy
                .value
                .paths
                .iter()
                .map(|p| (p.path.get_ref().clone(), p.required))
                .collect(),
            ignore: policy::glob_set(&policy.value.ignore, &policy.source)?,
            vars,
            policy_path: policy.source.path.display().to_string(),
        })
    }

    /// The node's vars, rendered for this run.
    pub fn vars_value(&self, ctx: &NodeContext<'_>) -> Result<minijinja::Value, String> {
        self.vars.render(ctx)
    }

    /// The allowed paths for this run, with whether each is required.
    pub fn resolve(&self, ctx: &NodeContext<'_>) -> Result<Vec<(String, bool)>, String> {
        let context = self.vars.render(ctx)?;
        let mut resolved = Vec::with_capacity(self.paths.len());
        for (template, required) in &self.paths {
            let path = Vars::apply(ctx, template, &context)?;
            // A value such as a skill named `../x` must not widen what may be written.
            if let Some(reason) = sandbox::unsafe_path_reason(&path) {
                return Err(format!("allowlist path `{path}` is refused: {reason}"));
            }
            resolved.push((path, *required));
        }
        Ok(resolved)
    }

    /// Lists what changed in the sandbox and sorts each path into allowed, ignored or violation.
    pub async fn review(
        &self,
        sandbox_dir: &Path,
        allowed: &[(String, bool)],
    ) -> Result<Review, String> {
        let changed = sandbox::changed_paths(sandbox_dir).await?;
        let mut review = Review::default();
        for path in &changed {
            if self.ignore.is_match(path) {
                review.ignored.push(path.clone());
            } else if allowed.iter().any(|(a, _)| a == path) {
                review.allowed.push(path.clone());
            } else {
                review.violations.push(path.clone());
            }
        }
        for (path, required) in allowed {
            // A required path must be a real file: a link or a folder does not count.
            let present = sandbox_dir
                .join(path)
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_file());
            if *required && !present {
                review.missing_required.push(path.clone());
            }
        }
        review.changed = changed;
        Ok(review)
    }
}
