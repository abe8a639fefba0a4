//! `kavi pipeline status`: which nodes a run started now would take from the cache and which it
//! would run, and why, without running anything (as `make -n` and `dvc status` tell).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use super::caching::{KeyFacts, key_but_inputs};
use crate::cache::DigestMemo;
use crate::dag::Dag;
use crate::ledger::{Ledger, LedgerError};
use crate::spec::governing::config_settings;
use crate::state::NodeState;

/// Whether a node is up to date, and why.
#[derive(Debug, Serialize)]
pub struct NodeStatus {
    pub node: String,
    /// A run started now would take its recorded result.
    pub fresh: bool,
    pub reason: String,
    /// The parts of its key that differ from the last one recorded for it, said as `explain`
    /// says them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<String>,
}

/// Where a node's inputs are read from: the workspace, kavi's own state under it (never an
/// input), and the digests of large inputs already read.
pub struct Inputs<'i> {
    pub workspace: &'i Path,
    pub state_paths: &'i [PathBuf],
    pub memo: &'i DigestMemo,
}

/// Each node of `dag`, in the order a run would decide them, as a run with `params` under the
/// resolved `config` would find it: fresh when its key, its input files hashed now, is one a
/// node run that succeeded recorded. A node after a stale one is stale: what it reads of it is
/// known only once it has run.
pub fn status(
    dag: &Dag<'_>,
    params: &Value,
    config: &Value,
    inputs: &Inputs<'_>,
    ledger: &Ledger,
) -> Result<Vec<NodeStatus>, LedgerError> {
    let pipeline = dag.pipeline;
    let settings = config_settings(config);
    let run = json!({ "pipeline": pipeline.name, "spec_hash": pipeline.spec_hash });
    let facts = KeyFacts {
        nodes: &pipeline.nodes,
        params,
        run: &run,
        settings: &settings,
    };
    // A fresh node's entry as templates would see it: its recorded result.
    let mut entries: Vec<Option<Value>> = vec![None; dag.len()];
    let mut found: Vec<Option<NodeStatus>> = (0..dag.len()).map(|_| None).collect();
    for &index in &dag.order {
        let node = &pipeline.nodes[index];
        let stale = |reason: String| NodeStatus {
            node: node.id.clone(),
            fresh: false,
            reason,
            changed: Vec::new(),
        };
        let stale_need = dag
            .dependencies(index)
            .find(|&dep| found[dep].as_ref().is_some_and(|s| !s.fresh));
        let status = if let Some(dep) = stale_need {
            stale(format!(
                "needs `{}`, which runs: what it gets from it is known only then",
                pipeline.nodes[dep].id
            ))
        } else if node.fan_out.is_some() {
            stale("it runs once per item: each instance's key is known only when it runs".into())
        } else if let Some(cache) = &node.cache {
            if !cache.enabled {
                stale("it has `cache = false`".into())
            } else if node
                .reads
                .iter()
                .any(|(path, _)| path == "run" || path == "run.id")
            {
                stale("its templates read the run's id, new every run".into())
            } else {
                let mut key = key_but_inputs(index, &facts, |i| entries[i].as_ref());
                match key.add_inputs(
                    inputs.workspace,
                    &cache.inputs,
                    inputs.state_paths,
                    inputs.memo,
                    &|| false,
                ) {
                    Err(e) => stale(format!("its inputs cannot be read: {e}")),
                    Ok(()) => match ledger.cache_hit(&key.digest())? {
                        Some(hit) => {
                            entries[index] = Some(json!({
                                "state": NodeState::Succeeded,
                                "kind": node.kind,
                                "error": null,
                                "outputs": hit.outputs,
                            }));
                            NodeStatus {
                                node: node.id.clone(),
                                fresh: true,
                                reason: format!(
                                    "node run {} of run {} had the same key",
                                    hit.node_run_id, hit.run_id
                                ),
                                changed: Vec::new(),
                            }
                        }
                        None => match ledger.previous_key(&pipeline.name, &node.id, i64::MAX)? {
                            None => stale("no run of it recorded a key".into()),
                            Some(previous) => {
                                let against = format!(
                                    "node run {} of run {}",
                                    previous.node_run_id, previous.run_id
                                );
                                let changed =
                                    crate::cache::differences(&previous.parts, &key.parts);
                                if changed.is_empty() {
                                    stale(format!("{against} had this key, and did not succeed"))
                                } else {
                                    NodeStatus {
                                        changed,
                                        ..stale(format!("against {against}:"))
                                    }
                                }
                            }
                        },
                    },
                }
            }
        } else {
            stale("it declares no `inputs`, so it always runs".into())
        };
        found[index] = Some(status);
    }
    Ok(dag.order.iter().filter_map(|&i| found[i].take()).collect())
}
