//! `promote`: make a verified skill trusted, for the exact source hash that was verified.
//!
//! The skill walks the lifecycle's way from its verified state to TRUSTED (see
//! [`Promotion::advance`]), stopping for review before a move that needs an approval. The
//! skill's files are hashed now (per the trust policy) and must equal the hash its last passing
//! gate run recorded; the lifecycle must allow the move. Both checks and the writes
//! (state, trusted hash, promotion row, transition) happen in one ledger transaction. The
//! registry file is then regenerated from the ledger.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use super::review;
use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::skills::promotion::{Advanced, Promotion};
use crate::skills::trust::TrustPolicy;
use crate::skills::{Lifecycle, TRUSTED};

pub const KIND: NodeKind = NodeKind {
    name: "promote",
    parse,
    schema: <PromoteConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct PromoteConfig {
    #[schemars(with = "String")]
    skill: Spanned<String>,
    /// The tree holding the skill's files, relative to the workspace (default: the workspace).
    #[schemars(with = "Option<String>")]
    source: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    trust: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    lifecycle: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    comment: Option<Spanned<String>>,
}

#[derive(Debug)]
struct Promote {
    skill: String,
    source: String,
    comment: Option<String>,
    trust: TrustPolicy,
    lifecycle: Lifecycle,
    /// The spec hash of the escalation rules, when promotion may need an approval.
    approval_rules: Option<String>,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: PromoteConfig = config.deserialize()?;
    for field in [Some(&raw.skill), raw.source.as_ref(), raw.comment.as_ref()]
        .into_iter()
        .flatten()
    {
        config.check_template(field)?;
    }
    let trust = crate::skills::trust::load(config, raw.trust.as_ref())?;
    let lifecycle_source =
        config.load_policy_source(raw.lifecycle.as_ref(), super::transition::DEFAULT_POLICY)?;
    let lifecycle = Lifecycle::parse(&lifecycle_source)?;
    let approval_rules = review::approval_rules(config, &lifecycle)?;
    Ok(Arc::new(Promote {
        skill: raw.skill.into_inner(),
        source: raw
            .source
            .map_or_else(|| ".".to_owned(), Spanned::into_inner),
        comment: raw.comment.map(Spanned::into_inner),
        trust,
        lifecycle,
        approval_rules,
    }))
}

impl Promote {
    fn promote(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let skill = crate::skills::render_name(ctx, &self.skill)?;
        let source = ctx.render("source", &self.source)?;
        let root = ctx.env.workspace.join(&source);
        let comment = ctx.render_optional("comment", self.comment.as_ref())?;
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let promotion = Promotion {
            store: &ctx.env.artifacts,
            trust: &self.trust,
            templates: &ctx.env.templates,
            workspace: &ctx.env.workspace,
            source: &root,
        };
        let origin = (Some(ctx.run_id), Some(ctx.node_id));
        let promoted = match promotion.advance(
            &mut ledger,
            &self.lifecycle,
            &skill,
            origin,
            comment.as_deref(),
        )? {
            Advanced::Promoted(promoted) => promoted,
            Advanced::Awaits { from, to } => {
                let triggers =
                    review::approval_triggers(&self.lifecycle, &from, &to, Some(&source));
                return review::stop_for_approval(
                    ctx,
                    &mut ledger,
                    &skill,
                    triggers,
                    self.approval_rules.as_deref(),
                );
            }
        };
        Ok(NodeOutcome::succeeded(json!({
            "skill": skill,
            "from": promoted.from,
            "to": TRUSTED,
            "source_hash": promoted.source_hash,
            "trusted_tree": promoted.trusted_tree,
            "registry": self.trust.registry,
            "registry_skills": promoted.registry_skills,
            "attestation": promoted.attestation.as_ref().ok(),
            "attestation_missing": promoted.attestation.as_ref().err(),
        })))
    }
}

#[async_trait::async_trait]
impl NodeAction for Promote {
    fn describe(&self) -> String {
        format!(
            "promote skill {} to {TRUSTED} at its verified hash",
            self.skill
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.promote(ctx).unwrap_or_else(NodeOutcome::failed)
    }
}
