//! `chain`: run a declared chain (`chains/*.toml`) as one node. The chain is loaded when the
//! pipeline is, so `kavi pipeline check` reports its errors. Each step leaves an execution
//! record that names this run. Side effects other than READ_ONLY run only when the node's
//! `confirm` lists their class: a pipeline has nobody to ask.

use std::path::Path;
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::{Map, json};
use toml::Spanned;

use crate::chains::{self, Chain, ChainContext, Confirm};
use crate::confinement::policy::ConfinementPolicy;
use crate::diagnostic::Diagnostic;
use crate::executions::{Lineage, Runner};
use crate::ledger::ArtifactStore;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::skills::trust::TrustPolicy;
use crate::skills::{SideEffect, SideEffects};
use crate::spec::SpecError;
use crate::spec::governing::Role;
use crate::state::NodeState;
use kavi_engine::nodes::ChildParams;

pub const KIND: NodeKind = NodeKind {
    name: "chain",
    parse,
    schema: <ChainConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ChainConfig {
    /// A chain file: a name looked up in `chains/`, or a path in the workspace.
    #[schemars(with = "String")]
    chain: Spanned<String>,
    /// The chain's parameters, as templated strings.
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    params: IndexMap<String, Spanned<String>>,
    /// Side-effect classes the pipeline's author confirms for the chain's steps.
    #[serde(default)]
    confirm: Vec<SideEffect>,
}

#[derive(Debug)]
struct ChainNode {
    chain: Chain,
    params: ChildParams,
    confirm: Vec<SideEffect>,
    trust: TrustPolicy,
    confinement: ConfinementPolicy,
}

impl Confirm for ChainNode {
    /// Every class of the skill must be one the node confirms.
    fn confirmed(&self, _skill: &str, classes: SideEffects) -> bool {
        classes.iter().all(|class| self.confirm.contains(&class))
    }
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: ChainConfig = config.deserialize()?;
    let name = raw.chain.get_ref();
    let path = crate::spec::spec_in_workspace(config.root, "chains", name)
        .map_err(|message| config.error(format!("chain {message}"), raw.chain.span()))?;
    let display = path
        .strip_prefix(config.root)
        .map_or_else(|_| path.clone(), Path::to_path_buf);
    let chain = chains::load(&path, &display, config.templates).map_err(|e| match e {
        SpecError::Invalid(mut problems) if !problems.0.is_empty() => problems.0.swap_remove(0),
        other => config.error(other.to_string(), raw.chain.span()),
    })?;
    config.governing.add(Role::Chain, Arc::clone(&chain.source));
    let owner = format!("chain `{}`", chain.name);
    let params = ChildParams::check(config, raw.params, &chain.params, &owner, raw.chain.span())?;
    let trust = crate::skills::trust::load(config, None)?;
    let confinement_source =
        config.load_policy_source(None, crate::confinement::policy::DEFAULT_POLICY)?;
    let confinement = ConfinementPolicy::parse(&confinement_source, config.templates)?;
    let needed = confinement.any_network();
    let confinement = config.load_process_hosts(confinement, needed)?;
    Ok(Arc::new(ChainNode {
        chain,
        params,
        confirm: raw.confirm,
        trust,
        confinement,
    }))
}

impl ChainNode {
    async fn execute(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let params = self.params.resolve(ctx, &self.chain.params)?;
        let config = &ctx.env.config;
        let log = config["executions_log"].as_str().map(Path::new);
        let timeout = config["skill_timeout"]
            .as_str()
            .map(humantime::parse_duration)
            .transpose()
            .map_err(|e| format!("`skill_timeout`: {e}"))?
            .unwrap_or(std::time::Duration::from_secs(60));
        let artifacts: &ArtifactStore = &ctx.env.artifacts;
        let runner = Runner {
            root: &ctx.env.workspace,
            ledger: &ctx.env.ledger,
            held: None,
            // A pipeline's node runs its skills itself.
            pool: false,
            artifacts,
            templates: &ctx.env.templates,
            trust: &self.trust,
            log,
            timeout,
            confinement: &self.confinement,
            owner: &ctx.env.owner,
            kavi_state: &ctx.env.state_paths,
            deferred: None,
        };
        let context = ChainContext {
            runner: &runner,
            templates: &ctx.env.templates,
            confirm: self,
            lineage: Lineage {
                run_id: Some(ctx.run_id),
                ..Lineage::default()
            },
            cancel: &ctx.cancel,
        };
        let results = chains::run(&self.chain, &params, &context)
            .await
            .map_err(|e| e.to_string())?;
        let mut steps = Map::new();
        for result in &results {
            steps.insert(
                result.id.clone(),
                json!({
                    "status": result.status,
                    "skill": result.skill,
                    "execution_id": result.record.as_ref().map(|r| &r.execution_id),
                    "output": result.record.as_ref().and_then(|r| r.output.clone()),
                    "error": result.record.as_ref().and_then(|r| r.error.clone()),
                }),
            );
        }
        let failed: Vec<String> = results
            .iter()
            .filter(|r| r.status == "failed")
            .map(|r| {
                format!(
                    "step `{}`: {}",
                    r.id,
                    r.record
                        .as_ref()
                        .and_then(|rec| rec.error.as_deref())
                        .unwrap_or("failed")
                )
            })
            .collect();
        let mut outcome =
            NodeOutcome::succeeded(json!({ "chain": self.chain.name, "steps": steps }));
        if ctx.cancel.is_cancelled() {
            outcome.state = NodeState::Cancelled;
        } else if !failed.is_empty() {
            outcome.state = NodeState::Failed;
            outcome.error = Some(format!(
                "chain `{}` failed: {}",
                self.chain.name,
                failed.join("; ")
            ));
        }
        Ok(outcome)
    }
}

#[async_trait::async_trait]
impl NodeAction for ChainNode {
    fn output_names(&self, key: &str) -> Option<Vec<&str>> {
        (key == "steps").then(|| self.chain.steps.iter().map(|s| s.id.as_str()).collect())
    }

    fn output_entry_fields(&self, key: &str) -> Option<&'static [&'static str]> {
        (key == "steps").then_some(&["status", "skill", "execution_id", "output", "error"])
    }

    fn output_keys(&self) -> Option<&'static [&'static str]> {
        Some(&["chain", "steps"])
    }

    fn describe(&self) -> String {
        format!(
            "run chain `{}` ({} steps)",
            self.chain.name,
            self.chain.steps.len()
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.execute(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}
