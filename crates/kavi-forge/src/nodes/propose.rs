//! `propose`: make sure a skill's proposal is in the ledger, and hand it to later nodes.
//!
//! Proposing is idempotent: a skill already proposed from the same text is left as it is. A
//! proposal file that changed since is a new version of a trusted skill, or refused (see
//! [`crate::skills::propose`]).

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::skills::Lifecycle;
use crate::skills::propose::{Proposed, Proposing};
use crate::skills::trust::TrustPolicy;

pub const KIND: NodeKind = NodeKind {
    name: "propose",
    parse,
    schema: <ProposeConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ProposeConfig {
    /// The proposal file, relative to the workspace.
    #[schemars(with = "String")]
    file: Spanned<String>,
    #[schemars(with = "Option<String>")]
    lifecycle: Option<Spanned<String>>,
    /// The trust policy whose skill folder a proposal's `command` must stay in.
    #[schemars(with = "Option<String>")]
    trust: Option<Spanned<String>>,
    /// Fail unless the skill may be built now (see [`crate::skills::build_refusal`]): the forge
    /// asks once, before its attempt loop, so a skill that cannot be built is not retried.
    #[serde(default)]
    require_buildable: bool,
}

#[derive(Debug)]
struct Propose {
    file: String,
    lifecycle: Lifecycle,
    trust: TrustPolicy,
    require_buildable: bool,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: ProposeConfig = config.deserialize()?;
    config.check_template(&raw.file)?;
    let source =
        config.load_policy_source(raw.lifecycle.as_ref(), super::transition::DEFAULT_POLICY)?;
    let trust = crate::skills::trust::load(config, raw.trust.as_ref())?;
    Ok(Arc::new(Propose {
        file: raw.file.into_inner(),
        lifecycle: Lifecycle::parse(&source)?,
        trust,
        require_buildable: raw.require_buildable,
    }))
}

impl Propose {
    fn propose(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let relative = ctx.render("file", &self.file)?;
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let Proposed {
            proposal,
            spec,
            created,
            version,
        } = Proposing {
            root: &ctx.env.workspace,
            store: &ctx.env.artifacts,
            templates: &ctx.env.templates,
            trust: &self.trust,
            lifecycle: &self.lifecycle,
        }
        .record(&mut ledger, &relative)
        .map_err(|e| e.to_string())?;
        let name = proposal.name.get_ref();
        if self.require_buildable
            && let Some(refusal) = crate::skills::build_refusal(&ledger, &self.lifecycle, name)
                .map_err(|e| e.to_string())?
        {
            return Err(refusal);
        }
        let state = ledger.skill(name).map_err(|e| e.to_string())?.state;
        let mut outcome = NodeOutcome::succeeded(json!({
            "skill": name,
            "state": state,
            "created": created,
            "version": version,
            "spec": spec.sha256,
            "proposal": proposal,
        }));
        outcome.artifacts.push(("spec", spec));
        Ok(outcome)
    }
}

#[async_trait::async_trait]
impl NodeAction for Propose {
    fn describe(&self) -> String {
        format!("propose the skill in {}", self.file)
    }

    fn reads_file(&self) -> Option<&str> {
        Some(&self.file)
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.propose(ctx).unwrap_or_else(NodeOutcome::failed)
    }
}
