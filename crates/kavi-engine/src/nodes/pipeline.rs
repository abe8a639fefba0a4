//! `pipeline`: run another pipeline file as one node. The child is a run of its own in the ledger,
//! with this run as its parent; the node ends as the child run ended (succeeded, failed,
//! cancelled, awaiting_review), so `retry` on this node repeats the whole child pipeline. That is
//! how the forge loops over build attempts: `pipelines/forge.toml` retries its attempt pipeline.
//!
//! The child file is loaded and compiled when this pipeline is, so `kavi pipeline check` reports
//! its errors (and an include cycle) before anything runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use toml::Spanned;

use super::child_params::ChildParams;
use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::spec::{self, Pipeline, SpecError};
use crate::state::{NodeState, RunStatus};

/// The kind whose succeeded run names a failed child run's failure kind (its `kind` output):
/// the forge's classifier. The engine knows it only by this name.
const CLASSIFY: &str = "classify";

/// What `outputs.nodes.<id>` holds of each child node.
const CHILD_NODE_FIELDS: &[&str] = &["state", "outputs"];

pub const KIND: NodeKind = NodeKind {
    name: "pipeline",
    parse,
    schema: <PipelineConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct PipelineConfig {
    /// The child pipeline: a name looked up in `pipelines/`, or a path in the workspace.
    #[schemars(with = "String")]
    file: Spanned<String>,
    /// The child's parameters, as templated strings (parsed by the child's declared types).
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    params: IndexMap<String, Spanned<String>>,
}

#[derive(Debug)]
struct SubPipeline {
    pipeline: Arc<Pipeline>,
    params: ChildParams,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: PipelineConfig = config.deserialize()?;
    let file_span = raw.file.span();
    let path = crate::spec::spec_in_workspace(config.root, "pipelines", raw.file.get_ref())
        .map_err(|message| config.error(format!("pipeline {message}"), file_span.clone()))?;
    let canonical = path.canonicalize().map_err(|e| {
        config.error(
            format!("cannot resolve the pipeline: {e}"),
            file_span.clone(),
        )
    })?;
    if let Some(first) = config.including.iter().position(|p| *p == canonical) {
        let cycle: Vec<String> = config.including[first..]
            .iter()
            .chain(std::iter::once(&canonical))
            .map(|p| display(config.root, p))
            .collect();
        return Err(config.error(
            format!("pipeline include cycle: {}", cycle.join(" -> ")),
            file_span,
        ));
    }
    let context = spec::LoadContext {
        root: config.root,
        templates: config.templates,
        including: config.including,
        registry: config.registry,
    };
    let display_path = PathBuf::from(display(config.root, &path));
    let pipeline = spec::load_pipeline(&path, &display_path, &context)
        .and_then(|pipeline| {
            crate::dag::compile(&pipeline)?;
            Ok(pipeline)
        })
        .map_err(|e| match e {
            // The child's own diagnostics point into the child's file, each of them reported
            // with the parent's; the first says where they come from.
            SpecError::Invalid(mut problems) if !problems.0.is_empty() => {
                let first = &mut problems.0[0];
                let note = format!(
                    "this pipeline is run by a `pipeline` node; `kavi pipeline check {}` lists every problem in it",
                    display_path.display()
                );
                first.help = Some(match first.help.take() {
                    Some(help) => format!("{help}\n{note}"),
                    None => note,
                });
                config.refuse(problems.0)
            }
            other => config.error(other.to_string(), file_span.clone()),
        })?;

    let owner = format!("pipeline `{}`", pipeline.name);
    let params = ChildParams::check(config, raw.params, &pipeline.params, &owner, file_span)?;
    config.governing.extend(&pipeline.governing);
    Ok(Arc::new(SubPipeline {
        pipeline: Arc::new(pipeline),
        params,
    }))
}

/// A path as messages show it: relative to the workspace when inside it.
fn display(root: &Path, path: &Path) -> String {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_owned());
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

impl SubPipeline {
    async fn execute(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let params = self.params.resolve(ctx, &self.pipeline.params)?;
        let outcome = ctx
            .env
            .child_runs
            .run_child(
                &self.pipeline,
                params,
                ctx.env,
                ctx.run_id,
                ctx.cancel.child_token(),
            )
            .await?;
        let ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let detail = ledger
            .run_detail(outcome.run_id)
            .map_err(|e| e.to_string())?;
        let mut nodes = Map::new();
        for node in crate::ledger::final_attempts(&detail.nodes) {
            nodes.insert(
                node.node_id.clone(),
                json!({ "state": node.state, "outputs": node.outputs.clone().unwrap_or(json!({})) }),
            );
        }
        // The child's own classification of its failure, for `retry.on` and for readers.
        let failure_kind = crate::ledger::final_attempts(&detail.nodes)
            .into_iter()
            .filter(|n| n.kind == CLASSIFY && n.state == NodeState::Succeeded)
            .find_map(|n| n.outputs.as_ref()?.get("kind")?.as_str().map(str::to_owned));
        let outputs = json!({
            "run_id": outcome.run_id,
            "status": outcome.status,
            "nodes": Value::Object(nodes),
            "failure_kind": failure_kind,
        });
        let (state, error) = match outcome.status {
            RunStatus::Succeeded => (NodeState::Succeeded, None),
            RunStatus::AwaitingReview => (
                NodeState::AwaitingReview,
                // The child's own node names the decision to make.
                Some(format!("child run {} awaits review", outcome.run_id)),
            ),
            RunStatus::Cancelled => (NodeState::Cancelled, None),
            _ => {
                let cause = crate::ledger::final_attempts(&detail.nodes)
                    .into_iter()
                    .find(|n| matches!(n.state, NodeState::Failed | NodeState::TimedOut))
                    .map(|n| {
                        format!(
                            " at `{}`: {}",
                            n.node_id,
                            // The first line says what; the child run has the rest.
                            n.error
                                .as_deref()
                                .and_then(|e| e.lines().next())
                                .unwrap_or(n.state.as_str())
                        )
                    })
                    .or_else(|| detail.run.error.as_ref().map(|e| format!(": {e}")))
                    .unwrap_or_default();
                (
                    NodeState::Failed,
                    Some(format!(
                        "child run {} {}{cause}",
                        outcome.run_id, outcome.status
                    )),
                )
            }
        };
        Ok(NodeOutcome {
            state,
            exit_code: None,
            outputs,
            artifacts: Vec::new(),
            error,
        })
    }
}

#[async_trait::async_trait]
impl NodeAction for SubPipeline {
    fn output_names(&self, key: &str) -> Option<Vec<&str>> {
        (key == "nodes").then(|| self.pipeline.nodes.iter().map(|n| n.id.as_str()).collect())
    }

    fn output_entry_fields(&self, key: &str) -> Option<&'static [&'static str]> {
        (key == "nodes").then_some(CHILD_NODE_FIELDS)
    }

    fn output_node(&self, key: &str, name: &str) -> Option<&spec::NodeSpec> {
        (key == "nodes")
            .then(|| self.pipeline.nodes.iter().find(|n| n.id == name))
            .flatten()
    }

    fn child_nodes(&self) -> &[spec::NodeSpec] {
        &self.pipeline.nodes
    }

    fn output_keys(&self) -> Option<&'static [&'static str]> {
        Some(&["run_id", "status", "nodes", "failure_kind"])
    }

    fn describe(&self) -> String {
        format!(
            "run pipeline `{}` ({}) as a child run",
            self.pipeline.name,
            self.pipeline.source.path.display()
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.execute(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}
