//! `advise`: ask the LLM gateway (`[gateway]` in kavi.toml) for a revised packet for the skill's
//! latest build, which a `classify` node has just given a research note. See
//! [`crate::research::advisory`] for what is sent and how the answer is used.
//!
//! When the gateway gives no usable advisory, the node fails with the reason (recorded on the
//! build as well); give it `on_failure = "continue"` so the run goes on deterministically, and
//! the `escalate` node raises AMBIGUOUS. Skip it with `when` where no gateway is configured.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use crate::config::GatewayConfig;
use crate::confinement::network::{self, NetworkPolicy};
use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::research::advisory::{Advice, Advisor, PROMPT_TEMPLATE};
use crate::template::Scope;

pub const KIND: NodeKind = NodeKind {
    name: "advise",
    parse,
    schema: <AdviseConfig as schemars::JsonSchema>::json_schema,
    calls_http: true,
};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AdviseConfig {
    #[schemars(with = "String")]
    skill: Spanned<String>,
    /// The host allowlist (default `policies/network.toml`).
    #[schemars(with = "Option<String>")]
    network: Option<Spanned<String>>,
}

#[derive(Debug)]
struct Advise {
    skill: String,
    network: NetworkPolicy,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: AdviseConfig = config.deserialize()?;
    config.check_template(&raw.skill)?;
    let template = Spanned::new(config.span.clone(), PROMPT_TEMPLATE.to_owned());
    // The prompt is rendered with the failed build, its packet and its research note only.
    let prompt_scope = Scope::default()
        .with("build", None)
        .with("packet", None)
        .with("note", None);
    config.check_template_file(&template, &prompt_scope)?;
    let source = config.load_policy_source(raw.network.as_ref(), network::DEFAULT_POLICY)?;
    Ok(Arc::new(Advise {
        skill: raw.skill.into_inner(),
        network: NetworkPolicy::parse(&source)?,
    }))
}

impl Advise {
    async fn advise(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let skill = crate::skills::render_name(ctx, &self.skill)?;
        let gateway: GatewayConfig = serde_json::from_value(ctx.env.config["gateway"].clone())
            .map_err(|e| format!("the gateway configuration is unusable: {e}"))?;
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let build = ledger
            .builds(&skill)
            .map_err(|e| e.to_string())?
            .pop()
            .ok_or_else(|| format!("`{skill}` has no build to advise on"))?;
        let advisor = Advisor {
            gateway: &gateway,
            network: &self.network,
            templates: &ctx.env.templates,
            artifacts: &ctx.env.artifacts,
        };
        let advice = tokio::select! {
            advice = advisor.advise(&mut ledger, build.id) => advice?,
            () = ctx.cancel.cancelled() => return Ok(NodeOutcome::cancelled()),
        };
        Ok(match advice {
            Advice::Revised {
                artifact,
                prompt_chars,
                truncated,
            } => {
                let mut outcome = NodeOutcome::succeeded(json!({
                    "build_id": build.id,
                    "advisory": artifact.sha256,
                    "advisory_path": ctx.env.artifacts.path_of(&artifact),
                    "prompt_chars": prompt_chars,
                    "prompt_truncated": truncated,
                }));
                outcome.artifacts.push(("advisory", artifact));
                outcome
            }
            Advice::Unavailable(reason) => {
                let mut outcome =
                    NodeOutcome::failed(format!("no advisory for build {}: {reason}", build.id));
                outcome.outputs = json!({ "build_id": build.id, "unavailable": reason });
                outcome
            }
        })
    }
}

#[async_trait::async_trait]
impl NodeAction for Advise {
    fn describe(&self) -> String {
        format!(
            "ask the LLM gateway to revise the latest packet of {}",
            self.skill
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.advise(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}
