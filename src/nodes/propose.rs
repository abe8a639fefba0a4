//! `propose`: make sure a skill's proposal is in the ledger, and hand it to later nodes.
//!
//! Proposing is idempotent: a skill already proposed from the same text is left as it is. A
//! proposal file that changed since is refused, because the skill's lifecycle so far was earned
//! by the old text.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use super::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome, contained_path};
use crate::diagnostic::{Diagnostic, SourceFile};
use crate::ledger::{Ledger, LedgerError, NewSkill};
use crate::skills::{Lifecycle, Proposal};

pub const KIND: NodeKind = NodeKind {
    name: "propose",
    parse,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProposeConfig {
    /// The proposal file, relative to the workspace.
    file: Spanned<String>,
    lifecycle: Option<Spanned<String>>,
    /// Fail unless the skill may be built now (see [`crate::skills::build_refusal`]): the forge
    /// asks once, before its attempt loop, so a skill that cannot be built is not retried.
    #[serde(default)]
    require_buildable: bool,
}

#[derive(Debug)]
struct Propose {
    file: String,
    lifecycle: Lifecycle,
    require_buildable: bool,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: ProposeConfig = config.deserialize()?;
    config.check_template(&raw.file)?;
    let source =
        config.load_policy_source(raw.lifecycle.as_ref(), super::transition::DEFAULT_POLICY)?;
    Ok(Arc::new(Propose {
        file: raw.file.into_inner(),
        lifecycle: Lifecycle::parse(&source)?,
        require_buildable: raw.require_buildable,
    }))
}

impl Propose {
    fn propose(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let relative = ctx.render("file", &self.file)?;
        let path = contained_path(&ctx.env.workspace, &relative)
            .map_err(|e| format!("refused `file`: {e}"))?;
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("failed to read {relative}: {e}"))?;
        let source = SourceFile::new(&relative, text);
        let proposal = Proposal::parse(&source).map_err(|d| d.to_string())?;
        let spec = ctx
            .env
            .artifacts
            .put_bytes("SKILL_SPEC", source.text.as_bytes())
            .map_err(|e| format!("failed to store the skill spec: {e}"))?;
        let name = proposal.name.get_ref();
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let actor = crate::skills::actor();
        let created = match ledger.propose_skill(&NewSkill {
            name,
            description: &proposal.description,
            side_effect: proposal.side_effect.as_str(),
            spec: &spec,
            initial_state: &self.lifecycle.initial,
            actor: &actor,
        }) {
            Ok(()) => true,
            Err(LedgerError::SkillExists(_)) => {
                let existing = ledger.skill(name).map_err(|e| e.to_string())?;
                if existing.spec_artifact != spec.sha256 {
                    return Err(format!(
                        "{relative} changed since `{name}` was proposed (proposed sha256:{}, now sha256:{}); \
                         a proposal is fixed once recorded: propose the change under a new name",
                        &existing.spec_artifact[..12],
                        &spec.sha256[..12]
                    ));
                }
                false
            }
            Err(e) => return Err(e.to_string()),
        };
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

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.propose(ctx).unwrap_or_else(NodeOutcome::failed)
    }
}
