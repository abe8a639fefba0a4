//! `classify`: name what kind of failure the first failed node was, and write a research note.
//!
//! Run it as a failure handler (`trigger = "failure"`) after the steps it watches, listed in
//! `from`. The first of them that did not succeed is the failure; blocked nodes are passed over,
//! since they only report someone else's failure. Ordered rules from a policy (default
//! `policies/classifier.toml`) decide the kind. The RESEARCH_NOTE artifact holds the kind, the
//! facts (failing gates, offending paths, first error lines) and a bounded excerpt of the log.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::policy::classifier::Classifier;
use crate::research::{Step, research};

pub const KIND: NodeKind = NodeKind {
    name: "classify",
    parse,
    schema: <ClassifyConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ClassifyConfig {
    /// The nodes to look at, in order; each must be upstream.
    #[schemars(with = "Vec<String>")]
    from: Vec<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    rules: Option<Spanned<String>>,
    /// The skill the note is about, recorded in it.
    #[schemars(with = "Option<String>")]
    skill: Option<Spanned<String>>,
}

#[derive(Debug)]
struct Classify {
    from: Vec<String>,
    skill: Option<String>,
    classifier: Classifier,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: ClassifyConfig = config.deserialize()?;
    if raw.from.is_empty() {
        return Err(config.error(
            "`from` needs at least one node to look at",
            config.span.clone(),
        ));
    }
    // Reading a node is what makes its state and outputs part of this node's context, and the
    // DAG check then insists it is upstream.
    for id in &raw.from {
        config
            .reads
            .push((format!("nodes.{}", id.get_ref()), id.span()));
    }
    if let Some(skill) = &raw.skill {
        config.check_template(skill)?;
    }
    let classifier = crate::policy::classifier::load(config, raw.rules.as_ref())?;
    Ok(Arc::new(Classify {
        from: raw.from.into_iter().map(Spanned::into_inner).collect(),
        skill: raw.skill.map(Spanned::into_inner),
        classifier,
    }))
}

impl Classify {
    fn classify(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let nodes = serde_json::to_value(ctx.vars.get_attr("nodes").map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let steps: Vec<Step<'_>> = self
            .from
            .iter()
            .map(|id| Step {
                id,
                entry: &nodes[id],
            })
            .collect();
        let skill = ctx.render_optional("skill", self.skill.as_ref())?;
        let found = research(
            &self.classifier,
            &ctx.env.artifacts,
            &steps,
            skill.as_deref(),
            ctx.run_id,
        )
        .map_err(|e| e.to_string())?;
        // The attempt's build (if one ran) carries the analysis to the next attempt's packet.
        if let Some(build_id) = found.build_id {
            Ledger::open(&ctx.env.ledger)
                .and_then(|mut ledger| ledger.record_research(build_id, &found.kind, &found.note))
                .map_err(|e| format!("failed to record the research note: {e}"))?;
        }
        let mut outcome = NodeOutcome::succeeded(json!({
            "build_id": found.build_id,
            "kind": found.kind,
            "facts": found.facts,
            "note": found.note.sha256,
            "note_path": ctx.env.artifacts.path_of(&found.note),
        }));
        outcome.artifacts.push(("note", found.note));
        Ok(outcome)
    }
}

#[async_trait::async_trait]
impl NodeAction for Classify {
    fn describe(&self) -> String {
        format!("classify the first failure among {}", self.from.join(", "))
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.classify(ctx).unwrap_or_else(NodeOutcome::failed)
    }
}
