//! `diff_gate`: pass only if every change in a sandbox, measured against the manifest kavi
//! recorded when it made the sandbox, is allowlisted, within the sandbox's limits, and of a kind
//! copy-back takes, and every required path exists. A failure names each offending path and rule.

use std::path::PathBuf;
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use toml::Spanned;

use super::allowlist::Allowlist;
use crate::diagnostic::Diagnostic;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::state::NodeState;

pub const KIND: NodeKind = NodeKind {
    name: "diff_gate",
    parse,
    schema: <DiffGateConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct DiffGateConfig {
    /// The sandbox folder, usually `{{ nodes.<sandbox>.outputs.path }}`.
    #[schemars(with = "String")]
    sandbox: Spanned<String>,
    /// The allowlist policy (default `policies/allowlist.toml`).
    #[schemars(with = "Option<String>")]
    allowlist: Option<Spanned<String>>,
    /// Values for the allowlist's path templates, such as `skill`.
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    vars: IndexMap<String, Spanned<String>>,
}

#[derive(Debug)]
struct DiffGate {
    sandbox: String,
    allowlist: Allowlist,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: DiffGateConfig = config.deserialize()?;
    config.check_template(&raw.sandbox)?;
    let allowlist = Allowlist::load(config, raw.allowlist.as_ref(), raw.vars)?;
    Ok(Arc::new(DiffGate {
        sandbox: raw.sandbox.into_inner(),
        allowlist,
    }))
}

impl DiffGate {
    async fn check(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let sandbox = PathBuf::from(ctx.render("sandbox", &self.sandbox)?);
        let allowed = self.allowlist.resolve(ctx)?;
        let (review, _) = self.allowlist.review(ctx, &sandbox, &allowed).await?;
        // The whole review, however long its lists: the outputs show the first paths only.
        let full = serde_json::to_vec_pretty(&review).expect("review serializes");
        let artifact = ctx
            .env
            .artifacts
            .put_bytes("DIFF_REVIEW", &full)
            .map_err(|e| format!("failed to store the review: {e}"))?;
        let mut outcome = NodeOutcome::succeeded(review.summary());
        outcome.artifacts.push(("review", artifact));
        if !review.passed() {
            outcome.state = NodeState::Failed;
            outcome.error = Some(review.failure());
        }
        Ok(outcome)
    }
}

#[async_trait::async_trait]
impl NodeAction for DiffGate {
    fn describe(&self) -> String {
        format!(
            "diff gate on {} against {}",
            self.sandbox, self.allowlist.policy_path
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.check(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}
