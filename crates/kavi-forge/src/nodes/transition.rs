//! `transition`: move a skill from one lifecycle state to another, as the lifecycle policy
//! (default `policies/lifecycle.toml`) allows. A refused move fails the node with a message that
//! says what the policy allows instead. Each move is recorded with run, node and actor.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use super::review;
use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::skills::Lifecycle;
use crate::template::is_templated;

pub const KIND: NodeKind = NodeKind {
    name: "transition",
    parse,
    schema: <TransitionConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

pub const DEFAULT_POLICY: &str = crate::skills::LIFECYCLE_POLICY;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct TransitionConfig {
    #[schemars(with = "String")]
    skill: Spanned<String>,
    #[schemars(with = "String")]
    to: Spanned<String>,
    #[schemars(with = "Option<String>")]
    lifecycle: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    comment: Option<Spanned<String>>,
}

#[derive(Debug)]
struct Transition {
    skill: String,
    to: String,
    comment: Option<String>,
    lifecycle: Lifecycle,
    /// The spec hash of the escalation rules, when a move may need an approval.
    approval_rules: Option<String>,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: TransitionConfig = config.deserialize()?;
    for field in [Some(&raw.skill), Some(&raw.to), raw.comment.as_ref()]
        .into_iter()
        .flatten()
    {
        config.check_template(field)?;
    }
    let source = config.load_policy_source(raw.lifecycle.as_ref(), DEFAULT_POLICY)?;
    let lifecycle = Lifecycle::parse(&source)?;
    if !is_templated(raw.to.get_ref()) && !lifecycle.states.contains(raw.to.get_ref()) {
        return Err(config
            .error(
                format!(
                    "`{}` is not a state of {}",
                    raw.to.get_ref(),
                    source.path.display()
                ),
                raw.to.span(),
            )
            .with_help(format!("states: {}", lifecycle.states.join(", "))));
    }
    if !is_templated(raw.to.get_ref()) && !lifecycle.has_way_into(raw.to.get_ref()) {
        return Err(config
            .error(
                format!(
                    "no transition in {} leads to `{}`: this node could never move a skill",
                    source.path.display(),
                    raw.to.get_ref()
                ),
                raw.to.span(),
            )
            .with_help("add a [[transition]] with this `to`, or remove the node"));
    }
    let approval_rules = review::approval_rules(config, &lifecycle)?;
    Ok(Arc::new(Transition {
        skill: raw.skill.into_inner(),
        to: raw.to.into_inner(),
        comment: raw.comment.map(Spanned::into_inner),
        lifecycle,
        approval_rules,
    }))
}

impl Transition {
    fn apply(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let skill = crate::skills::render_name(ctx, &self.skill)?;
        let to = ctx.render("to", &self.to)?;
        let comment = ctx.render_optional("comment", self.comment.as_ref())?;
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        if let Some(stopped) = review::approval(
            ctx,
            &mut ledger,
            &self.lifecycle,
            &skill,
            &to,
            self.approval_rules.as_deref(),
        )? {
            return Ok(stopped);
        }
        // What the move rests on is the stronger of what this node's lifecycle and the adopted
        // one ask: a lifecycle file of the node's own on which VERIFIED leads nowhere does not
        // make the adopted VERIFIED free.
        let adopted = crate::policy::adoption::Governing::adopted(&ledger)?
            .map(|governing| governing.lifecycle())
            .transpose()?;
        let actor = crate::identity::actor();
        let moved = ledger
            .transition_skill(
                &skill,
                &to,
                |from, to| {
                    let own = self.lifecycle.check_move(from, to)?;
                    // Trust is earned by a promotion (or given back by `kavi skill restore`), under
                    // the adopted rules: a plain move into TRUSTED would skip both.
                    if to == crate::skills::TRUSTED {
                        return Err(format!(
                            "a `transition` node does not move a skill into {to}: the `promote` \
                             node promotes it, and `kavi skill restore` returns a suspended one"
                        ));
                    }
                    Ok(adopted
                        .as_ref()
                        .map_or(own, |adopted| own.max(adopted.evidence(from, to))))
                },
                (Some(ctx.run_id), Some(ctx.node_id)),
                &actor,
                comment.as_deref(),
            )
            .map_err(|e| e.to_string())?;
        Ok(NodeOutcome::succeeded(json!({
            "skill": skill,
            "from": moved.from,
            "to": moved.to,
        })))
    }
}

#[async_trait::async_trait]
impl NodeAction for Transition {
    fn describe(&self) -> String {
        format!(
            "move skill {} to {} ({})",
            self.skill,
            self.to,
            self.lifecycle.source.path.display()
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.apply(ctx).unwrap_or_else(NodeOutcome::failed)
    }
}
