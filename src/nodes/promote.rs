//! `promote`: make a verified skill trusted, for the exact source hash that was verified.
//!
//! The skill's files are hashed now (per the trust policy) and must equal the hash its last
//! passing gate run recorded; the lifecycle must allow the move. Both checks and the writes
//! (state, trusted hash, promotion row, transition) happen in one ledger transaction. The
//! registry file is then regenerated from the ledger.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use super::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::sandbox::contained_path;
use crate::skills::registry::write_registry;
use crate::skills::trust::TrustPolicy;
use crate::skills::{Lifecycle, TRUSTED};

pub const KIND: NodeKind = NodeKind {
    name: "promote",
    parse,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PromoteConfig {
    skill: Spanned<String>,
    /// The tree holding the skill's files, relative to the workspace (default: the workspace).
    source: Option<Spanned<String>>,
    trust: Option<Spanned<String>>,
    lifecycle: Option<Spanned<String>>,
    comment: Option<Spanned<String>>,
}

#[derive(Debug)]
struct Promote {
    skill: String,
    source: String,
    comment: Option<String>,
    trust: TrustPolicy,
    lifecycle: Lifecycle,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: PromoteConfig = config.deserialize()?;
    for field in [Some(&raw.skill), raw.source.as_ref(), raw.comment.as_ref()]
        .into_iter()
        .flatten()
    {
        config.check_template(field)?;
    }
    let trust = config.load_trust(raw.trust.as_ref())?;
    let lifecycle_source =
        config.load_policy_source(raw.lifecycle.as_ref(), super::transition::DEFAULT_POLICY)?;
    Ok(Arc::new(Promote {
        skill: raw.skill.into_inner(),
        source: raw
            .source
            .map_or_else(|| ".".to_owned(), Spanned::into_inner),
        comment: raw.comment.map(Spanned::into_inner),
        trust,
        lifecycle: Lifecycle::parse(&lifecycle_source)?,
    }))
}

impl Promote {
    fn promote(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let skill = ctx.render_skill(&self.skill)?;
        let root = ctx.env.workspace.join(ctx.render("source", &self.source)?);
        let comment = ctx.render_optional("comment", self.comment.as_ref())?;
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let proposal = ledger
            .skill(&skill)
            .map_err(|e| e.to_string())?
            .proposal_path;
        // The bytes hashed are the bytes kept: restore puts back exactly what was trusted.
        let tree = self
            .trust
            .read_tree(&ctx.env.templates, &root, &skill, &proposal)?;
        let hash = tree.hash();
        let kept = tree
            .store(&ctx.env.artifacts)
            .map_err(|e| format!("failed to keep the trusted tree: {e}"))?;
        let actor = crate::identity::actor();
        let moved = ledger
            .promote_skill(
                &skill,
                TRUSTED,
                &hash,
                |from, to| self.lifecycle.check(from, to),
                (Some(ctx.run_id), Some(ctx.node_id)),
                &actor,
                comment.as_deref(),
                &kept,
            )
            .map_err(|e| e.to_string())?;
        let registry = contained_path(&ctx.env.workspace, &self.trust.registry)
            .map_err(|e| format!("refused registry path: {e}"))?;
        let listed = write_registry(&ledger, &registry, TRUSTED)?;
        Ok(NodeOutcome::succeeded(json!({
            "skill": skill,
            "from": moved.from,
            "to": moved.to,
            "source_hash": hash,
            "trusted_tree": kept[0].sha256,
            "registry": self.trust.registry,
            "registry_skills": listed,
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
