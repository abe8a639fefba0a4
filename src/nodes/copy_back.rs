//! `copy_back`: copy the allowlisted changes of a sandbox into the target tree, safely.
//!
//! It does not trust an upstream gate: it lists the changes again and refuses the whole copy if
//! anything outside the allowlist changed. Each file must be a regular file (never a symlink),
//! its path relative and normalised, and its destination inside the target once links are
//! resolved. Everything is checked before the first byte is written; each file is written to a
//! temporary name and renamed into place.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use super::allowlist::Allowlist;
use super::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome, contained_path};
use crate::diagnostic::Diagnostic;

pub const KIND: NodeKind = NodeKind {
    name: "copy_back",
    parse,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CopyBackConfig {
    /// The sandbox folder, usually `{{ nodes.<sandbox>.outputs.path }}`.
    sandbox: Spanned<String>,
    /// The tree to copy into, relative to the workspace (default: the workspace).
    target: Option<Spanned<String>>,
    /// The allowlist policy (default `policies/allowlist.toml`).
    allowlist: Option<Spanned<String>>,
    /// Values for the allowlist's path templates, such as `skill`.
    #[serde(default)]
    vars: IndexMap<String, Spanned<String>>,
}

#[derive(Debug)]
struct CopyBack {
    sandbox: String,
    target: String,
    allowlist: Allowlist,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: CopyBackConfig = config.deserialize()?;
    config.check_template(&raw.sandbox)?;
    if let Some(target) = &raw.target {
        config.check_template(target)?;
    }
    let allowlist = Allowlist::load(config, raw.allowlist.as_ref(), raw.vars)?;
    Ok(Arc::new(CopyBack {
        sandbox: raw.sandbox.into_inner(),
        target: raw
            .target
            .map_or_else(|| ".".to_owned(), Spanned::into_inner),
        allowlist,
    }))
}

/// Why one file may not be copied, if it may not.
fn refusal(sandbox: &Path, target: &Path, path: &str) -> Result<Option<PathBuf>, String> {
    let source = sandbox.join(path);
    let metadata = match source.symlink_metadata() {
        Err(_) => return Ok(None),
        Ok(metadata) => metadata,
    };
    if metadata.file_type().is_symlink() {
        return Err(format!("`{path}` is a symlink"));
    }
    if !metadata.is_file() {
        return Err(format!("`{path}` is not a regular file"));
    }
    let destination = contained_path(target, path)?;
    if destination
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        return Err(format!("the destination of `{path}` is a symlink"));
    }
    Ok(Some(destination))
}

fn copy_file(source: &Path, destination: &Path) -> std::io::Result<()> {
    let parent = destination
        .parent()
        .expect("a destination inside the target has a parent");
    std::fs::create_dir_all(parent)?;
    let temp = tempfile::NamedTempFile::new_in(parent)?;
    std::fs::copy(source, temp.path())?;
    temp.persist(destination).map_err(|e| e.error)?;
    Ok(())
}

impl CopyBack {
    async fn copy(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let sandbox = PathBuf::from(ctx.render("sandbox", &self.sandbox)?);
        let target = ctx.env.workspace.join(ctx.render("target", &self.target)?);
        if !target.is_dir() {
            return Err(format!("target {} is not a folder", target.display()));
        }
        let allowed = self.allowlist.resolve(ctx)?;
        let review = self.allowlist.review(&sandbox, &allowed).await?;
        if !review.violations.is_empty() {
            return Err(format!("refusing to copy back: {}", review.failure()));
        }
        let mut plan = Vec::new();
        let mut not_copied = Vec::new();
        let mut refused = Vec::new();
        for path in &review.allowed {
            match refusal(&sandbox, &target, path) {
                Ok(Some(destination)) => plan.push((path.clone(), destination)),
                Ok(None) => not_copied.push(path.clone()),
                Err(reason) => refused.push(reason),
            }
        }
        if !refused.is_empty() {
            return Err(format!("refusing to copy back: {}", refused.join("; ")));
        }
        for (path, destination) in &plan {
            copy_file(&sandbox.join(path), destination).map_err(|e| {
                format!("failed to copy `{path}` to {}: {e}", destination.display())
            })?;
        }
        Ok(NodeOutcome::succeeded(json!({
            "copied": plan.iter().map(|(path, _)| path).collect::<Vec<_>>(),
            // Deleted in the sandbox: deletions are not carried to the target.
            "not_copied": not_copied,
            "target": target,
        })))
    }
}

#[async_trait::async_trait]
impl NodeAction for CopyBack {
    fn describe(&self) -> String {
        format!(
            "copy allowlisted changes from {} to {} ({})",
            self.sandbox, self.target, self.allowlist.policy_path
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.copy(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}
