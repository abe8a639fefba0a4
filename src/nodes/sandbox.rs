//! `sandbox`: copy a tree into a fresh folder and commit it as a git baseline.
//!
//! What is left out comes from a policy file (default `policies/sandbox.toml`); kavi's own state
//! (ledger, artifacts, sandboxes) is always left out. Later nodes work in `outputs.path` and
//! compare against `outputs.baseline`.

use std::sync::Arc;

use globset::GlobSet;
use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use super::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::diagnostic::Diagnostic;
use crate::policy::{self, SandboxPolicy};
use crate::sandbox;

pub const KIND: NodeKind = NodeKind {
    name: "sandbox",
    parse,
};

pub const DEFAULT_POLICY: &str = "policies/sandbox.toml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxConfig {
    /// The tree to copy, relative to the workspace (default: the workspace itself).
    source: Option<Spanned<String>>,
    /// The policy naming what to leave out.
    policy: Option<Spanned<String>>,
}

#[derive(Debug)]
struct Sandbox {
    source: String,
    skip: GlobSet,
    policy_path: String,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: SandboxConfig = config.deserialize()?;
    if let Some(source) = &raw.source {
        config.check_template(source)?;
    }
    let policy = config.load_policy::<SandboxPolicy>(raw.policy.as_ref(), DEFAULT_POLICY)?;
    let skip = policy::glob_set(&policy.value.skip, &policy.source)?;
    Ok(Arc::new(Sandbox {
        source: raw
            .source
            .map_or_else(|| ".".to_owned(), Spanned::into_inner),
        skip,
        policy_path: policy.source.path.display().to_string(),
    }))
}

impl Sandbox {
    async fn build(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let source = ctx.env.workspace.join(ctx.render("source", &self.source)?);
        if !source.is_dir() {
            return Err(format!("source {} is not a folder", source.display()));
        }
        std::fs::create_dir_all(&ctx.env.sandboxes)
            .map_err(|e| format!("failed to create {}: {e}", ctx.env.sandboxes.display()))?;
        let dest = tempfile::Builder::new()
            .prefix(&format!("run{}-{}-", ctx.run_id, ctx.node_id))
            .tempdir_in(&ctx.env.sandboxes)
            .map_err(|e| format!("failed to create a sandbox folder: {e}"))?
            .keep();
        let skip = self.skip.clone();
        let exclude = ctx.env.state_paths.to_vec();
        let (from, to) = (source.clone(), dest.clone());
        let stats =
            tokio::task::spawn_blocking(move || sandbox::copy_tree(&from, &to, &skip, &exclude))
                .await
                .map_err(|e| format!("the copy stopped: {e}"))?
                .map_err(|e| {
                    format!("failed to copy {} into the sandbox: {e}", source.display())
                })?;
        let baseline = sandbox::init_baseline(&dest).await?;
        Ok(NodeOutcome::succeeded(json!({
            "path": dest,
            "baseline": baseline,
            "files": stats.files,
            "skipped": stats.skipped,
            "policy": self.policy_path,
        })))
    }
}

#[async_trait::async_trait]
impl NodeAction for Sandbox {
    fn describe(&self) -> String {
        format!(
            "sandbox copy of {} (skip list: {})",
            self.source, self.policy_path
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.build(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}
