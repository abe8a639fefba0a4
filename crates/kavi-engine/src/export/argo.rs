//! A pipeline as an Argo Workflows `Workflow` (argoproj.io/v1alpha1).
//!
//! Argo orders the work; kavi still decides it. The workflow's DAG has one task per node, each
//! running `kavi pipeline step FILE --run RUN NODE` in a container of the given image, after a
//! `kavi-start` task that records the run (`kavi pipeline start`, whose id every task reads
//! from the workflow's global output `kavi-run`), and an exit handler, `kavi-end`, that closes it
//! whatever happened. Every task waits for the tasks of the nodes it needs to end, however they
//! ended, because a node's step is what decides whether it runs, is skipped, blocked or taken
//! from the cache, exactly as in `kavi pipeline run`.
//!
//! What maps onto Argo's own fields:
//! - `needs` → `depends`;
//! - `retry` → `retryStrategy`: `limit` is the attempts after the first, and only exit code 75
//!   retries (the step's "try again", given when kavi's own retry policy, `retry.on` included,
//!   wants another attempt); `backoff`, `factor` and `max_backoff` → `backoff`;
//! - `timeout` → the template's `activeDeadlineSeconds`, with a grace period for the step to
//!   record the timeout it enforces itself;
//! - `on_failure = "continue"` → `continueOn: {failed: true}`;
//! - `[pipeline.budget] wall` → the workflow's `activeDeadlineSeconds`;
//! - parameters → workflow parameters, passed to `kavi pipeline start`;
//! - the tasks' ledger → `KAVI_LEDGER`, written in, or from a Secret's key (`secretKeyRef`);
//! - the sandboxes → a declared volume every task mounts, which `KAVI_SANDBOXES` names (a
//!   pod's `/tmp` is its own).
//!
//! What does not is listed in [`Export::notes`], and in the manifest's `kavi.dev/notes`
//! annotation: never dropped silently.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::dag::Dag;
use crate::spec::{OnFailure, SpecError, Trigger};

/// How the exported workflow runs kavi.
#[derive(Debug, Clone)]
pub struct ArgoOptions {
    /// The container image with `kavi` on its PATH and the workspace at `workdir`.
    pub image: String,
    /// The workspace folder inside the container.
    pub workdir: String,
    /// A PersistentVolumeClaim mounted at `workdir` in every task, so that files one node
    /// writes (a sandbox, a built skill) are there for the next.
    pub workspace_claim: Option<String>,
    /// A PersistentVolumeClaim for the sandboxes (`KAVI_SANDBOXES`), mounted at
    /// [`SANDBOXES_PATH`] in every task: kavi keeps them outside the workspace, and each pod's
    /// own `/tmp` is not the next one's.
    pub sandbox_claim: Option<String>,
    /// The ledger every task records into (`KAVI_LEDGER`); the workspace's own when `None`.
    pub ledger: Option<TaskLedger>,
    /// At most this many tasks at once (the workflow's `parallelism`).
    pub parallelism: Option<u32>,
    /// The pipeline file as `kavi` inside the container names it, relative to `workdir`.
    pub file: String,
}

/// Where the tasks' `KAVI_LEDGER` comes from.
#[derive(Debug, Clone)]
pub enum TaskLedger {
    /// Written into the manifest: a file, or a server's URL without a password.
    Location(String),
    /// A key of a Kubernetes Secret (`secretKeyRef`): a URL with its password stays there.
    Secret { name: String, key: String },
}

/// The manifest, and what of the pipeline Argo does not carry out itself.
#[derive(Debug)]
pub struct Export {
    pub manifest: Value,
    pub notes: Vec<String>,
}

/// Where the sandboxes' volume (`--sandbox-claim`) is mounted in every task, and what the
/// tasks' `KAVI_SANDBOXES` names.
pub const SANDBOXES_PATH: &str = "/tmp/kavi-sandboxes";

/// Where a task finds the run id `kavi-start` recorded.
const RUN_ID: &str = "{{workflow.outputs.parameters.kavi-run}}";
/// Where `kavi-start` writes it, for Argo to read as the global output.
const RUN_ID_FILE: &str = "/tmp/kavi-run-id";
/// Where a fan-out's first step writes its instances, for Argo to read as the list it fans out
/// over (`withParam`).
const INSTANCES_FILE: &str = "/tmp/kavi-instances.json";
/// The exit code of a step whose node kavi's retry policy tries again.
const RETRY_EXIT: i32 = kavi_foundation::exit::RETRY;
/// How long after a node's timeout Argo stops its task: the step enforces the timeout itself
/// and needs a moment to stop the node's processes and record it.
const TIMEOUT_GRACE: Duration = Duration::from_secs(60);

/// Kinds that may stop the run for a person's review.
const REVIEW_KINDS: &[&str] = &["escalate", "transition", "promote", "pipeline"];

/// The workflow of `dag`'s pipeline.
pub fn export(dag: &Dag<'_>, options: &ArgoOptions) -> Result<Export, SpecError> {
    let pipeline = dag.pipeline;
    let mut notes = Vec::new();
    let (names, fan_names) = task_names(dag);

    let mut tasks = vec![json!({ "name": "kavi-start", "template": "kavi-start" })];
    let mut templates = Vec::new();
    for &index in &dag.order {
        let node = &pipeline.nodes[index];
        let name = &names[index];
        let mut deps: Vec<usize> = dag.dependencies(index).collect();
        deps.sort_unstable();
        let depends = if deps.is_empty() {
            "kavi-start".to_owned()
        } else {
            deps.iter()
                .map(|&dep| {
                    let dep = &names[dep];
                    format!("({dep}.Succeeded || {dep}.Failed || {dep}.Errored)")
                })
                .collect::<Vec<_>>()
                .join(" && ")
        };
        let mut task = json!({ "name": name, "template": name, "depends": depends });
        if node.on_failure == OnFailure::Continue {
            task["continueOn"] = json!({ "failed": true });
        }
        let step = |target: &str| {
            container(
                options,
                &["pipeline", "step", &options.file, "--run", RUN_ID, target],
            )
        };
        // The template of the node's attempts: its own task's, or each instance's.
        let mut attempts = match &node.fan_out {
            None => json!({ "name": name, "container": step(&node.id) }),
            Some(fan_out) => {
                let fan = &fan_names[index];
                // kavi decides it and records its instances, Argo fans out over them, and the
                // node's own task ends it once they have all ended, however.
                tasks.push(
                    json!({ "name": fan.expand, "template": fan.expand, "depends": depends }),
                );
                tasks.push(json!({
                    "name": fan.each,
                    "template": fan.each,
                    "depends": fan.expand,
                    "arguments": { "parameters": [{
                        "name": "instances",
                        "value": format!("{{{{tasks.{}.outputs.parameters.instances}}}}", fan.expand),
                    }]},
                }));
                task["depends"] = json!(format!(
                    "({each}.Succeeded || {each}.Failed || {each}.Errored || {each}.Skipped || \
                     {each}.Omitted)",
                    each = fan.each
                ));
                let mut expand = step(&node.id);
                expand["args"]
                    .as_array_mut()
                    .expect("a container's args")
                    .extend([json!("--instances-file"), json!(INSTANCES_FILE)]);
                templates.push(json!({
                    "name": fan.expand,
                    "container": expand,
                    "outputs": { "parameters": [{
                        "name": "instances",
                        "valueFrom": { "path": INSTANCES_FILE },
                    }]},
                }));
                let mut each = json!({
                    "name": fan.each,
                    "inputs": { "parameters": [{ "name": "instances" }] },
                    // kavi decides what a failed instance stops (`fail_fast`): the others' steps
                    // record it.
                    "dag": { "failFast": false, "tasks": [{
                        "name": "instance",
                        "template": fan.item,
                        "withParam": "{{inputs.parameters.instances}}",
                        "arguments": { "parameters": [{ "name": "instance", "value": "{{item.id}}" }] },
                    }]},
                });
                if let Some(max) = fan_out.max_parallel {
                    each["parallelism"] = json!(max);
                }
                templates.push(each);
                templates.push(json!({ "name": name, "container": step(&node.id) }));
                json!({
                    "name": fan.item,
                    "inputs": { "parameters": [{ "name": "instance" }] },
                    "container": step("{{inputs.parameters.instance}}"),
                })
            }
        };
        if node.retry.attempts > 1 {
            attempts["retryStrategy"] = retry_strategy(&node.retry);
        }
        if let Some(timeout) = node.timeout {
            attempts["activeDeadlineSeconds"] = json!(seconds(timeout + TIMEOUT_GRACE));
        }
        tasks.push(task);
        templates.push(attempts);

        if node.when.is_some() {
            notes.push(format!(
                "node `{}`: its `when` is decided by kavi inside its task; Argo shows the task \
                 succeeded when kavi records the node skipped",
                node.id
            ));
        }
        if node.trigger != Trigger::Success {
            notes.push(format!(
                "node `{}`: runs only {} in kavi; its task runs in every case and kavi records \
                 it skipped when it does not apply",
                node.id,
                match node.trigger {
                    Trigger::Failure => "when a node it needs did not succeed",
                    _ => "after the nodes it needs, whatever they did",
                }
            ));
        }
        if REVIEW_KINDS.contains(&node.kind) {
            notes.push(format!(
                "node `{}` ({}): may stop the run for a person's review; its task then exits 6, \
                 the run ends `awaiting_review`, and `kavi approve` resumes it outside Argo (no \
                 suspend template)",
                node.id, node.kind
            ));
        }
        if node.kind == "pipeline" {
            notes.push(format!(
                "node `{}`: its child pipeline runs inside its task, not as Argo tasks",
                node.id
            ));
        }
    }

    let mut start_args = vec![
        "pipeline".to_owned(),
        "start".to_owned(),
        options.file.clone(),
        "--id-file".to_owned(),
        RUN_ID_FILE.to_owned(),
    ];
    let mut parameters = Vec::new();
    for (name, decl) in &pipeline.params {
        start_args.push("--set".to_owned());
        start_args.push(format!("{name}={{{{workflow.parameters.{name}}}}}"));
        let mut parameter = json!({ "name": name });
        if let Some(default) = &decl.default {
            parameter["value"] = json!(match default {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            });
        }
        if let Some(description) = &decl.description {
            parameter["description"] = json!(description);
        }
        parameters.push(parameter);
    }
    let start_args: Vec<&str> = start_args.iter().map(String::as_str).collect();
    templates.insert(
        0,
        json!({
            "name": "kavi-start",
            "container": container(options, &start_args),
            "outputs": { "parameters": [{
                "name": "run",
                "valueFrom": { "path": RUN_ID_FILE },
                "globalName": "kavi-run",
            }]},
        }),
    );
    templates.insert(
        0,
        json!({
            "name": "kavi",
            // kavi decides what a failure stops (fail_fast, blocked nodes): Argo keeps going.
            "dag": { "failFast": false, "tasks": tasks },
        }),
    );
    templates.push(json!({
        "name": "kavi-end",
        "container": container(options, &["pipeline", "end", &options.file, "--run", RUN_ID]),
    }));

    let mut spec = json!({
        "entrypoint": "kavi",
        "onExit": "kavi-end",
        "templates": templates,
    });
    if !parameters.is_empty() {
        spec["arguments"] = json!({ "parameters": parameters });
    }
    if let Some(wall) = pipeline.budget.wall {
        spec["activeDeadlineSeconds"] = json!(seconds(wall));
    }
    if let Some(parallelism) = options.parallelism {
        spec["parallelism"] = json!(parallelism);
    }
    let mut volumes = Vec::new();
    if let Some(claim) = &options.sandbox_claim {
        volumes.push(json!({
            "name": "sandboxes",
            "persistentVolumeClaim": { "claimName": claim },
        }));
    } else if pipeline.nodes.iter().any(|node| node.kind == "sandbox") {
        notes.push(
            "the tasks share no sandboxes: a `sandbox` node's copy is in its own pod, not there \
             for the nodes that work in it; give --sandbox-claim"
                .to_owned(),
        );
    }
    if let Some(claim) = &options.workspace_claim {
        volumes.insert(
            0,
            json!({
                "name": "workspace",
                "persistentVolumeClaim": { "claimName": claim },
            }),
        );
    } else {
        notes.push(
            "the tasks share no workspace: files a node writes (a sandbox, a built skill, an \
             output) are not there for the next node's task; give --workspace-claim"
                .to_owned(),
        );
    }
    if !volumes.is_empty() {
        spec["volumes"] = json!(volumes);
    }
    if options.ledger.is_none() {
        notes.push(
            "every task records into the workspace's own ledger (kavi.toml): all tasks must \
             reach the same one; give --task-ledger"
                .to_owned(),
        );
    }
    if pipeline.budget.attempts.is_some() || pipeline.budget.http_calls.is_some() {
        notes.push(
            "[pipeline.budget] attempts and http_calls: each step counts the attempts recorded \
             so far; steps that start at the same moment can each take the last one"
                .to_owned(),
        );
    }
    if pipeline.nodes.iter().any(|node| node.calls_http) {
        notes.push(
            "the nodes that call the gateway need its API key (KAVI_GATEWAY_API_KEY): it is not \
             in the manifest; give the containers it from a Secret"
                .to_owned(),
        );
    }
    notes.push(
        "`kavi pipeline run --jobs` has no counterpart; Argo runs every task that is ready \
         unless --parallelism limits it"
            .to_owned(),
    );

    let mut annotations = Map::new();
    annotations.insert("kavi.dev/pipeline-file".into(), json!(options.file));
    annotations.insert("kavi.dev/spec-hash".into(), json!(pipeline.spec_hash));
    annotations.insert("kavi.dev/notes".into(), json!(notes.join("\n")));
    let manifest = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "generateName": format!("{}-", dns_label(&pipeline.name, 50)),
            "labels": { "kavi.dev/pipeline": dns_label(&pipeline.name, 63) },
            "annotations": annotations,
        },
        "spec": spec,
    });
    Ok(Export { manifest, notes })
}

/// A container that runs `kavi ARGS` in the workspace.
fn container(options: &ArgoOptions, args: &[&str]) -> Value {
    let mut container = json!({
        "image": options.image,
        "command": ["kavi"],
        "args": args,
        "workingDir": options.workdir,
    });
    let mut env = Vec::new();
    match &options.ledger {
        Some(TaskLedger::Location(ledger)) => {
            env.push(json!({ "name": "KAVI_LEDGER", "value": ledger }));
        }
        Some(TaskLedger::Secret { name, key }) => env.push(json!({
            "name": "KAVI_LEDGER",
            "valueFrom": { "secretKeyRef": { "name": name, "key": key } },
        })),
        None => {}
    }
    let mut mounts = Vec::new();
    if options.workspace_claim.is_some() {
        mounts.push(json!({ "name": "workspace", "mountPath": options.workdir }));
    }
    if options.sandbox_claim.is_some() {
        env.push(json!({ "name": "KAVI_SANDBOXES", "value": SANDBOXES_PATH }));
        mounts.push(json!({ "name": "sandboxes", "mountPath": SANDBOXES_PATH }));
    }
    if !env.is_empty() {
        container["env"] = json!(env);
    }
    if !mounts.is_empty() {
        container["volumeMounts"] = json!(mounts);
    }
    container
}

fn retry_strategy(retry: &crate::spec::RetryPolicy) -> Value {
    let mut strategy = json!({
        "limit": retry.attempts - 1,
        // Only the step's "try again": kavi's policy (`retry.on`) has decided already.
        "expression": format!("asInt(lastRetry.exitCode) == {RETRY_EXIT}"),
    });
    if !retry.backoff.is_zero() {
        let mut backoff = json!({
            "duration": duration(retry.backoff),
            "factor": retry.factor,
        });
        if let Some(max) = retry.max_backoff {
            backoff["cap"] = json!(duration(max));
        }
        strategy["backoff"] = backoff;
    }
    strategy
}

/// Whole seconds, rounded up: a deadline is never shorter than asked.
fn seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

/// An Argo duration: whole seconds (`"90s"`).
fn duration(duration: Duration) -> String {
    format!("{}s", seconds(duration))
}

/// The tasks and templates of a node that runs once per item, besides its own (which ends it).
#[derive(Debug, Default)]
struct FanNames {
    /// The task that decides it and records its instances.
    expand: String,
    /// The task that fans out over them, and its DAG template (whose `parallelism` is the
    /// node's `max_parallel`).
    each: String,
    /// The template of one instance.
    item: String,
}

/// One task and template name per node (and, for a fan-out, its [`FanNames`]): node ids may
/// hold `_` and capitals, which Kubernetes names may not; two that come out the same are told
/// apart by a number.
fn task_names(dag: &Dag<'_>) -> (Vec<String>, Vec<FanNames>) {
    let mut taken: HashSet<String> = ["kavi", "kavi-start", "kavi-end"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut fresh = |base: String| {
        let mut name = base.clone();
        let mut n = 2;
        while !taken.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        name
    };
    let nodes = &dag.pipeline.nodes;
    // The nodes' own names first: a fan-out's others never take one from a node.
    let names: Vec<String> = nodes
        .iter()
        .map(|node| fresh(format!("node-{}", dns_label(&node.id, 50))))
        .collect();
    let fans = nodes
        .iter()
        .zip(&names)
        .map(|(node, name)| match node.fan_out {
            Some(_) => FanNames {
                expand: fresh(format!("{name}-expand")),
                each: fresh(format!("{name}-each")),
                item: fresh(format!("{name}-instance")),
            },
            None => FanNames::default(),
        })
        .collect();
    (names, fans)
}

/// `text` as a DNS label: lowercase letters, digits and `-`, starting and ending with a letter
/// or digit, at most `max` long.
fn dns_label(text: &str, max: usize) -> String {
    let mapped: String = text
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .take(max)
        .collect();
    let trimmed = mapped.trim_matches('-');
    if trimmed.is_empty() {
        "kavi".to_owned()
    } else {
        trimmed.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels_and_distinct() {
        assert_eq!(dns_label("Build_Skill", 50), "build-skill");
        assert_eq!(dns_label("__", 50), "kavi");
        assert_eq!(dns_label(&"a".repeat(80), 50).len(), 50);
    }

    #[test]
    fn deadlines_round_up() {
        assert_eq!(seconds(Duration::from_millis(1500)), 2);
        assert_eq!(duration(Duration::from_secs(90)), "90s");
    }
}
