//! `copy_back`: copy the allowlisted changes of a sandbox into the target tree, safely.
//!
//! It does not trust an upstream gate: it reviews the sandbox against kavi's manifest again and
//! refuses the whole copy if anything outside the allowlist changed or a limit is exceeded. Each
//! file is opened beneath the sandbox with no link on the way, and must be a regular file with
//! one link and within the size limits; its destination must lie inside the target once links
//! are resolved. Everything is read and checked before the first byte is written; each file is
//! written to a temporary name and renamed into place.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use super::allowlist::{self, Allowlist};
use crate::diagnostic::Diagnostic;
use crate::ledger::{Ledger, SandboxLimits};
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::sandbox;
use crate::sandbox::{destination, write_beneath};
use crate::skills::trust::TrustPolicy;

pub const KIND: NodeKind = NodeKind {
    name: "copy_back",
    parse,
    schema: <CopyBackConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct CopyBackConfig {
    /// The sandbox folder, usually `{{ nodes.<sandbox>.outputs.path }}`.
    #[schemars(with = "String")]
    sandbox: Spanned<String>,
    /// The tree to copy into, relative to the workspace (default: the workspace).
    #[schemars(with = "Option<String>")]
    target: Option<Spanned<String>>,
    /// The allowlist policy (default `policies/allowlist.toml`).
    #[schemars(with = "Option<String>")]
    allowlist: Option<Spanned<String>>,
    /// Values for the allowlist's path templates, such as `skill`.
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    vars: IndexMap<String, Spanned<String>>,
    /// The skill a build in the sandbox built: the copy records the hash of its files after
    /// it, which a move into BUILT rests on (a skill is BUILT only by such a copy or an import).
    #[schemars(with = "Option<String>")]
    skill: Option<Spanned<String>>,
    /// The trust policy naming the skill's files (default `policies/trust.toml`).
    #[schemars(with = "Option<String>")]
    trust: Option<Spanned<String>>,
}

#[derive(Debug)]
struct CopyBack {
    sandbox: String,
    target: String,
    allowlist: Allowlist,
    /// The skill built, and the trust policy that hashes its files.
    skill: Option<(String, TrustPolicy)>,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: CopyBackConfig = config.deserialize()?;
    config.check_template(&raw.sandbox)?;
    if let Some(target) = &raw.target {
        config.check_template(target)?;
    }
    let allowlist = Allowlist::load(config, raw.allowlist.as_ref(), raw.vars)?;
    let skill = match raw.skill {
        Some(skill) => {
            config.check_template(&skill)?;
            let trust = crate::skills::trust::load(config, raw.trust.as_ref())?;
            Some((skill.into_inner(), trust))
        }
        None => None,
    };
    Ok(Arc::new(CopyBack {
        skill,
        sandbox: raw.sandbox.into_inner(),
        target: raw
            .target
            .map_or_else(|| ".".to_owned(), Spanned::into_inner),
        allowlist,
    }))
}

/// Reads an allowed file from the sandbox as copy-back will write it: beneath the sandbox with no
/// link on the way, a regular file with one link, within the size limit. The checks are made on
/// the open file, so nothing can be swapped in between check and read.
fn read_allowed(sandbox: &Path, path: &str, limits: &SandboxLimits) -> Result<Vec<u8>, String> {
    let file = sandbox::open_beneath(sandbox, path).map_err(|e| e.to_string())?;
    let metadata = file.metadata().map_err(|e| format!("`{path}`: {e}"))?;
    if !metadata.is_file() {
        return Err(allowlist::not_a_regular_file(
            path,
            "no longer a regular file",
        ));
    }
    if metadata.nlink() > 1 {
        return Err(allowlist::a_hard_link(path, metadata.nlink()));
    }
    sandbox::read_bounded(file, limits.max_file_bytes)
        .map_err(|e| format!("`{path}`: {e}, over `max_file_bytes`"))
}

impl CopyBack {
    async fn copy(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let sandbox = PathBuf::from(ctx.render("sandbox", &self.sandbox)?);
        let target = ctx.env.workspace.join(ctx.render("target", &self.target)?);
        if !target.is_dir() {
            return Err(format!("target {} is not a folder", target.display()));
        }
        let allowed = self.allowlist.resolve(ctx)?;
        let (review, limits) = self.allowlist.review(ctx, &sandbox, &allowed).await?;
        if !review.passed() {
            return Err(format!("refusing to copy back: {}", review.failure()));
        }
        // Everything is read and checked before the first byte is written.
        let mut plan = Vec::new();
        let mut not_copied = Vec::new();
        let mut refused = Vec::new();
        let mut total = 0u64;
        for path in &review.allowed {
            // The review passed, so no folder on the way is a link: lstat tells.
            if sandbox.join(path).symlink_metadata().is_err() {
                // Deleted in the sandbox: deletions are not carried to the target.
                not_copied.push(path.clone());
                continue;
            }
            match read_allowed(&sandbox, path, &limits)
                .and_then(|bytes| Ok((bytes, destination(&target, path)?)))
            {
                Ok((bytes, destination)) => {
                    total = total.saturating_add(bytes.len() as u64);
                    plan.push((path.clone(), bytes, destination));
                }
                Err(reason) => refused.push(reason),
            }
        }
        if total > limits.max_total_bytes {
            refused.push(format!(
                "the allowed files hold {total} bytes together, over `max_total_bytes` = {}",
                limits.max_total_bytes
            ));
        }
        if !refused.is_empty() {
            return Err(format!("refusing to copy back: {}", refused.join("; ")));
        }
        for (path, bytes, destination) in &plan {
            write_beneath(&target, path, bytes, false).map_err(|e| {
                format!("failed to copy `{path}` to {}: {e}", destination.display())
            })?;
        }
        let mut outputs = json!({
            "copied": plan.iter().map(|(path, _, _)| path).collect::<Vec<_>>(),
            "not_copied": not_copied,
            "target": target,
            "sandbox": sandbox,
        });
        if let Some((skill, hash)) = self.built(ctx, &target)? {
            outputs["skill"] = json!(skill);
            outputs["source_hash"] = json!(hash);
        }
        Ok(NodeOutcome::succeeded(outputs))
    }

    /// The skill built and the hash of its files in `target` after the copy, when the node
    /// names one. Its allowlist must be the skill's: the copy of another skill's paths is no
    /// build of this one.
    fn built(
        &self,
        ctx: &NodeContext<'_>,
        target: &Path,
    ) -> Result<Option<(String, String)>, String> {
        let Some((skill, trust)) = &self.skill else {
            return Ok(None);
        };
        let skill = crate::skills::render_name(ctx, skill)?;
        let vars = self.allowlist.vars_value(ctx)?;
        if let Ok(named) = vars.get_attr("skill")
            && !named.is_undefined()
            && named.as_str() != Some(skill.as_str())
        {
            return Err(format!(
                "`vars.skill` ({named}) is not the skill this node copies back (`{skill}`): the \
                 allowlist would admit other files than the ones recorded as built"
            ));
        }
        let ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let proposal = ledger
            .skill(&skill)
            .map_err(|e| e.to_string())?
            .proposal_path;
        let hash = trust.source_hash(&ctx.env.templates, target, &skill, &proposal)?;
        Ok(Some((skill, hash)))
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
