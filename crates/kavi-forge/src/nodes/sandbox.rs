//! `sandbox`: copy a tree into a fresh folder outside the workspace and record its manifest.
//!
//! What is left out, the limits on what a build may bring back, and how long a failed run's
//! sandbox is kept come from a policy file (default `policies/sandbox.toml`); kavi's own state is
//! always left out. The folder also gets a git repository with one baseline commit
//! (`outputs.baseline`), for the builder's convenience only: the diff gate and copy-back compare
//! with the manifest in the ledger. The run that made the sandbox removes it when it ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use globset::GlobSet;
use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use crate::diagnostic::Diagnostic;
use crate::git;
use crate::ledger::{Ledger, NewSandbox, SandboxLimits};
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::policy::SandboxPolicy;
use crate::sandbox::{self, manifest};

pub const KIND: NodeKind = NodeKind {
    name: "sandbox",
    parse,
    schema: <SandboxConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

pub const DEFAULT_POLICY: &str = "policies/sandbox.toml";

/// How long a failed attempt's sandbox is kept when the policy does not say.
const DEFAULT_KEEP: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SandboxConfig {
    /// The tree to copy, relative to the workspace (default: the workspace itself).
    #[schemars(with = "Option<String>")]
    source: Option<Spanned<String>>,
    /// The policy naming what to leave out.
    #[schemars(with = "Option<String>")]
    policy: Option<Spanned<String>>,
}

#[derive(Debug)]
struct Sandbox {
    source: String,
    skip: GlobSet,
    limits: SandboxLimits,
    policy_path: String,
}

/// The longest `keep_failed` a policy may set.
const MAX_KEEP: Duration = Duration::from_secs(365 * 24 * 3600);

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: SandboxConfig = config.deserialize()?;
    if let Some(source) = &raw.source {
        config.check_template(source)?;
    }
    let policy = config.load_policy::<SandboxPolicy>(raw.policy.as_ref(), DEFAULT_POLICY)?;
    let skip = crate::diagnostic::glob_set(&policy.value.skip, &policy.source)?;
    let keep_failed = match &policy.value.keep_failed {
        None => DEFAULT_KEEP,
        Some(text) => humantime::parse_duration(text.get_ref())
            .ok()
            .filter(|keep| *keep <= MAX_KEEP)
            .ok_or_else(|| {
                Diagnostic::new(format!(
                    "invalid `keep_failed`: {:?} is not a duration from 0s to 365days",
                    text.get_ref()
                ))
                .at(&policy.source, text.span())
            })?,
    };
    let limits = &policy.value.limits;
    Ok(Arc::new(Sandbox {
        source: raw
            .source
            .map_or_else(|| ".".to_owned(), Spanned::into_inner),
        skip,
        limits: SandboxLimits {
            max_file_bytes: limits.max_file_bytes,
            max_total_bytes: limits.max_total_bytes,
            max_changed_files: limits.max_changed_files,
            keep_failed,
            keep_max_bytes: policy
                .value
                .keep_max_bytes
                .unwrap_or(crate::ledger::DEFAULT_KEEP_MAX_BYTES),
        },
        policy_path: policy.source.path.display().to_string(),
    }))
}

impl Sandbox {
    async fn build(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let source = ctx.env.workspace.join(ctx.render("source", &self.source)?);
        if !source.is_dir() {
            return Err(format!("source {} is not a folder", source.display()));
        }
        let prefix = format!("kavi-sandbox-run{}-{}-", ctx.run_id, ctx.node_id);
        let mut apart: Vec<&std::path::Path> = vec![&ctx.env.workspace];
        apart.extend(ctx.env.state_paths.iter().map(PathBuf::as_path));
        let dest = sandbox::create(&ctx.env.sandboxes, &prefix, &apart).map_err(|e| {
            format!(
                "failed to create a sandbox in {}: {e}",
                ctx.env.sandboxes.display()
            )
        })?;
        // Recorded before anything is copied, so that even a failed copy is cleaned up.
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let skip = self.skip.clone();
        let exclude = ctx.env.state_paths.to_vec();
        let (from, to) = (source.clone(), dest.clone());
        // What the builder gets is what git tracks or would track of the workspace: a file git
        // ignores never reaches the sandbox, whatever its name.
        let listed = git::listed(&ctx.env.workspace).await.map(|files| {
            let below = source.strip_prefix(&ctx.env.workspace).unwrap_or(&source);
            files
                .into_iter()
                .filter_map(|file| file.strip_prefix(below).ok().map(PathBuf::from))
                .collect::<std::collections::HashSet<_>>()
        });
        let copied = match listed {
            Ok(listed) => tokio::task::spawn_blocking(move || {
                sandbox::copy_tree(&from, &to, &listed, &skip, &exclude)
            })
            .await
            .map_err(|e| format!("the copy stopped: {e}")),
            Err(e) => Err(e),
        };
        let record = |ledger: &mut Ledger, manifest: &[manifest::Entry]| {
            ledger
                .record_sandbox(NewSandbox {
                    path: &dest,
                    run_id: ctx.run_id,
                    node_id: ctx.node_id,
                    policy: &self.policy_path,
                    limits: self.limits.clone(),
                    manifest,
                })
                .map_err(|e| e.to_string())
        };
        let stats = match copied.and_then(|c| {
            c.map_err(|e| format!("failed to copy {} into the sandbox: {e}", source.display()))
        }) {
            Ok(stats) => stats,
            Err(e) => {
                record(&mut ledger, &[])?;
                return Err(e);
            }
        };
        let baseline = match git::init_baseline(&dest).await {
            Ok(commit) => commit,
            Err(e) => {
                record(&mut ledger, &[])?;
                return Err(e);
            }
        };
        // kavi's record of the tree, taken after the git baseline so that `.git/` is part of it:
        // whatever the builder does to the repository shows as a change.
        let root = dest.clone();
        let manifest = tokio::task::spawn_blocking(move || manifest::record(&root))
            .await
            .map_err(|e| format!("the manifest stopped: {e}"))?
            .map_err(|e| format!("failed to record the sandbox's manifest: {e}"))?;
        record(&mut ledger, &manifest)?;
        Ok(NodeOutcome::succeeded(json!({
            "path": dest,
            "baseline": baseline,
            "files": stats.files,
            "skipped": stats.skipped,
            "links_left_out": stats.links_left_out,
            "manifest_entries": manifest.len(),
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
