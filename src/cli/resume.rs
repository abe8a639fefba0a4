//! `kavi runs resume RUN`: run a pipeline again after a failure, taking the outputs of the nodes
//! that succeeded from the run it resumes, and running only the rest: the nodes that did not
//! succeed, those whose definition, scripts or inputs changed since, and what needs them.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::output::table;
use crate::config::Workspace;
use crate::dag;
use crate::error::{Error, exit};
use crate::executor::{Reused, RunStart};
use crate::ledger::{Ledger, NodeRunRow, RunOrigin};
use crate::state::{NodeState, RunStatus};
use kavi_cli::RunOptions;

pub async fn run(
    workspace: &Workspace,
    reference: &str,
    allow_changed: bool,
    dry_run: bool,
    options: RunOptions,
) -> Result<i32, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let id = ledger.resolve_run(reference)?;
    let detail = ledger.run_detail(id)?;
    let old = &detail.run;
    if let Some(parent) = old.parent_run {
        return Err(Error::Usage(format!(
            "run {id} is a child run of run {parent}: resume that one (`kavi runs resume {parent}`)"
        )));
    }
    match old.status {
        RunStatus::Succeeded | RunStatus::Approved => {
            outln!("run {id} {}: nothing to resume", old.status);
            return Ok(exit::SUCCESS);
        }
        RunStatus::Running => {
            return Err(Error::Usage(format!("run {id} is still running")));
        }
        RunStatus::AwaitingReview => {
            return Err(Error::Usage(format!(
                "run {id} waits for a person: decide with `kavi approve {id}` or `kavi reject {id}`"
            )));
        }
        RunStatus::Failed | RunStatus::Cancelled | RunStatus::Interrupted | RunStatus::Rejected => {
        }
    }
    let (pipeline, _) = super::pipeline::load(workspace, &old.spec_path)?;
    let dag = dag::compile(&pipeline)?;
    // The pipeline file and the scripts its nodes run are weighed node by node below. Any other
    // change (a policy, a template, a chain, an included pipeline, the configuration) is to
    // rules every output was made under: those are not reused unless the user says they may be.
    let scripts: HashSet<&str> = pipeline
        .nodes
        .iter()
        .flat_map(|node| node.scripts.iter().map(String::as_str))
        .collect();
    let (replanned, rules): (Vec<_>, Vec<_>) =
        super::policy::changed_since(workspace, &ledger, id)?
            .into_iter()
            .partition(|file| match file.role.as_str() {
                "pipeline" => file.path == old.spec_path,
                "script" => scripts.contains(file.path.as_str()),
                _ => false,
            });
    let lines: Vec<String> = rules
        .iter()
        .map(|file| format!("{} {} ({})", file.change, file.path, file.role))
        .collect();
    if !rules.is_empty() && !allow_changed {
        return Err(Error::Usage(format!(
            "the files that govern run {id} changed since it ran:\n  {}\nits outputs were made \
             under the old ones; `kavi policy diff {id}` shows the change, and `--allow-changed` \
             resumes anyway (a node whose own definition, scripts or inputs changed runs again \
             either way)",
            lines.join("\n  ")
        )));
    }
    let changed_scripts: HashSet<&str> = replanned
        .iter()
        .filter(|file| file.role == "script")
        .map(|file| file.path.as_str())
        .collect();
    let (_, old_text) = ledger.spec_text(&old.spec_hash)?;
    let (old_tables, new_tables) = (node_tables(&old_text), node_tables(&pipeline.source.text));
    let finals: HashMap<&str, &NodeRunRow> = crate::ledger::final_attempts(&detail.nodes)
        .into_iter()
        .map(|node| (node.node_id.as_str(), node))
        .collect();
    let inputs_now = InputsNow::open(workspace)?;
    // A run of targets is resumed as one: its nodes, and what they need now.
    let targets: Vec<String> = pipeline
        .nodes
        .iter()
        .filter(|node| finals.contains_key(node.id.as_str()))
        .map(|node| node.id.clone())
        .collect();
    let subset = super::pipeline::Subset {
        targets: &targets,
        only: false,
    };
    let params = match &old.params {
        serde_json::Value::Object(params) => params.clone(),
        _ => serde_json::Map::new(),
    };
    let kept = super::pipeline::subset_nodes(workspace, &pipeline, subset, &params, &ledger)?;

    // Decided in the order a run decides them: a node is reused only when what it needs is.
    let mut plan: Vec<Option<(bool, String)>> = vec![None; dag.len()];
    // A fan-out that runs again for its own end alone: its instances' plan, by node.
    let mut instance_plans: HashMap<usize, Vec<(bool, String, String)>> = HashMap::new();
    let mut reuse: HashMap<String, Reused> = HashMap::new();
    for &index in &dag.order {
        let node = &pipeline.nodes[index];
        if !kept.contains(&node.id) {
            continue;
        }
        let again = |reason: String| Some((false, reason));
        plan[index] = if let Some(dep) = dag
            .dependencies(index)
            .find(|&dep| plan[dep].as_ref().is_some_and(|(reused, _)| !reused))
        {
            again(format!(
                "needs `{}`, which runs again",
                pipeline.nodes[dep].id
            ))
        } else if let Some(then) = finals.get(node.id.as_str()) {
            let succeeded = matches!(then.state, NodeState::Succeeded | NodeState::Reused);
            if !succeeded && node.fan_out.is_none() {
                again(format!("{} in run {id}", then.state))
            } else if old_tables.get(&node.id) != new_tables.get(&node.id) {
                again("its definition changed".into())
            } else if let Some(script) = node
                .scripts
                .iter()
                .find(|script| changed_scripts.contains(script.as_str()))
            {
                again(format!("script `{script}` changed"))
            } else if !succeeded {
                // As Argo retries a workflow from its failed pods: the instances that succeeded
                // are taken, the failed, cancelled and interrupted ones run again.
                let instances = plan_instances(&ledger, &inputs_now, node, &finals, id)?;
                let taken = instances.iter().filter(|(reused, ..)| *reused).count();
                let plans = instance_plans.entry(index).or_default();
                for (reused, instance_id, reason, then) in instances {
                    if reused {
                        reuse.insert(instance_id.clone(), reused_from(then, id));
                    }
                    plans.push((reused, instance_id, reason));
                }
                again(format!(
                    "{} in run {id}; {taken} of its {} instance(s) reused",
                    then.state,
                    plans.len()
                ))
            } else if let Some(change) = inputs_now.changed(&ledger, node, then)? {
                again(change)
            } else {
                reuse.insert(node.id.clone(), reused_from(then, id));
                Some((true, format!("{} in run {id}", then.state)))
            }
        } else {
            again(format!("not in run {id}"))
        };
    }
    let (taken, again): (Vec<bool>, Vec<bool>) = plan
        .iter()
        .flatten()
        .map(|(reused, _)| *reused)
        .partition(|reused| *reused);
    // A dry run's plan is its result (stdout); a real one's is progress before the run's own.
    let heading = format!(
        "resuming run {id} ({}): {} of its nodes reused, {} run again",
        old.spec_path,
        taken.len(),
        again.len(),
    );
    let verb = |reused: bool| if reused { "reuse" } else { "run" }.to_owned();
    let rows: Vec<Vec<String>> = dag
        .order
        .iter()
        .filter_map(|&i| {
            let (reused, reason) = plan[i].as_ref()?;
            let node = vec![verb(*reused), pipeline.nodes[i].id.clone(), reason.clone()];
            let instances = instance_plans.get(&i).into_iter().flatten();
            Some(
                std::iter::once(node).chain(instances.map(|(reused, instance_id, reason)| {
                    vec![verb(*reused), instance_id.clone(), reason.clone()]
                })),
            )
        })
        .flatten()
        .collect();
    let plan = table(&rows);
    if dry_run {
        outln!("{heading}");
        out!("{plan}");
        return Ok(exit::SUCCESS);
    }
    super::progress::note(format_args!("{heading}\n{}", plan.trim_end()));
    let sets = super::review::param_sets(&old.params);
    let path = workspace.root.join(&old.spec_path);
    drop(ledger);
    super::pipeline::run_subset(
        workspace,
        &path.to_string_lossy(),
        &sets,
        options,
        RunStart {
            origin: RunOrigin::Resume { of: id },
            reuse,
            // Recorded on the new run: its outputs were made over these changes by choice.
            allowed_changes: (!lines.is_empty()).then(|| lines.join("\n")),
            ..RunStart::default()
        },
        subset,
        None,
    )
    .await
}

/// Node run `then` of run `run`, as a resumed run takes it.
fn reused_from(then: &NodeRunRow, run: i64) -> Reused {
    Reused {
        node_run_id: then.id,
        run_id: run,
        outputs: then.outputs.clone().unwrap_or_default(),
    }
}

/// The instances fan-out `node` had in run `run`, in order, each with whether it is reused (it
/// succeeded and its inputs are as they were), its id, why, and its node run.
fn plan_instances<'r>(
    ledger: &Ledger,
    inputs_now: &InputsNow,
    node: &crate::spec::NodeSpec,
    finals: &HashMap<&str, &'r NodeRunRow>,
    run: i64,
) -> Result<Vec<(bool, String, String, &'r NodeRunRow)>, Error> {
    let mut instances = Vec::new();
    for position in 0.. {
        let instance_id = crate::spec::FanOut::instance_id(&node.id, position);
        let Some(&then) = finals.get(instance_id.as_str()) else {
            break;
        };
        let (reused, reason) = if !matches!(then.state, NodeState::Succeeded | NodeState::Reused) {
            (false, format!("{} in run {run}", then.state))
        } else if let Some(change) = inputs_now.changed(ledger, node, then)? {
            (false, change)
        } else {
            (true, format!("{} in run {run}", then.state))
        };
        instances.push((reused, instance_id, reason, then));
    }
    Ok(instances)
}

/// A pipeline text's node tables, by id, as TOML values: comments and spacing aside, equal when
/// the node is defined the same.
fn node_tables(text: &str) -> BTreeMap<String, toml::Value> {
    text.parse::<toml::Table>()
        .ok()
        .and_then(|mut table| table.remove("nodes"))
        .and_then(|nodes| match nodes {
            toml::Value::Table(nodes) => Some(nodes.into_iter().collect()),
            _ => None,
        })
        .unwrap_or_default()
}

/// The input files of nodes, hashed as they are now, to compare with the key a node run recorded.
struct InputsNow {
    root: std::path::PathBuf,
    state_paths: Vec<std::path::PathBuf>,
    memo: crate::cache::DigestMemo,
}

impl InputsNow {
    fn open(workspace: &Workspace) -> Result<Self, Error> {
        let store = super::open_store(workspace)?;
        Ok(Self {
            root: workspace.root.clone(),
            state_paths: workspace.state_paths(),
            memo: crate::cache::DigestMemo::of_store(&store),
        })
    }

    /// What changed in `node`'s input files since node run `then` (or the one it reused)
    /// recorded its key; `None` when nothing did, or when it has no key to compare with.
    fn changed(
        &self,
        ledger: &Ledger,
        node: &crate::spec::NodeSpec,
        then: &NodeRunRow,
    ) -> Result<Option<String>, Error> {
        let Some(cache) = &node.cache else {
            return Ok(None);
        };
        let recorded = match ledger.recorded_key(then.id)? {
            Some(key) => Some(key),
            None => match then.reused_from {
                Some(source) => ledger.recorded_key(source)?,
                None => None,
            },
        };
        let Some(recorded) = recorded else {
            return Ok(None);
        };
        let mut now = crate::cache::Key::default();
        if let Err(e) = now.add_inputs(
            &self.root,
            &cache.inputs,
            &self.state_paths,
            &self.memo,
            &|| false,
        ) {
            return Ok(Some(format!("its inputs cannot be read: {e}")));
        }
        let then_inputs: BTreeMap<String, String> = recorded
            .parts
            .into_iter()
            .filter(|(name, _)| name.starts_with("input:"))
            .collect();
        let changed = crate::cache::differences(&then_inputs, &now.parts);
        Ok((!changed.is_empty()).then(|| changed.join(", ")))
    }
}
