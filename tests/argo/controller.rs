//! A stand-in for the Argo Workflows controller, not Argo itself, for the manifests `kavi
//! pipeline export` writes: Kubernetes cannot run here. It carries out the part of Argo's
//! semantics those manifests use, on real processes: the DAG's tasks in dependency order, each
//! task's `depends` expression (`&&`, `||`, parentheses, `task.Phase`), a task's `arguments`
//! into its template's `inputs` (every declared input given, or the task cannot start), output
//! parameters read from files (a task's, `tasks.X.outputs.parameters.Y`, and global ones),
//! `retryStrategy` with `limit` and an exit-code `expression`, nested DAG templates, loops and
//! the `onExit` handler. A loop (`withItems`, or `withParam`: text that must parse as a JSON
//! list, or the task errors as in Argo) runs its template once per item, started in item order,
//! `{{item}}` its item (a string as it is, anything else as JSON) and `{{item.KEY}}` a field of
//! an object item; no item is a `Skipped` task, a failed item a `Failed` one. Items run at once,
//! up to the enclosing template's `parallelism`. Other tasks run one at a time.
//!
//! Each task is a pod of its own: its container's `command` and `args` run in a mount namespace
//! of its own (`unshare --mount`) whose `/tmp` is a new, empty tmpfs, with only the environment
//! the image gives every container ([`IMAGE_ENV`]) and the manifest's `env` (a value, or a
//! Secret's key: `secretKeyRef`, from the Secrets given; one missing is a pod that cannot
//! start). What one task writes outside the volumes the manifest declares is gone for the next:
//! the workspace's claim is the workspace, at its own path, and every other claim is the
//! folder the test gives for it, mounted where the manifest says.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// What became of one workflow.
#[derive(Debug)]
pub struct Outcome {
    /// Each task's phase: Succeeded, Failed or Omitted (its `depends` was false).
    pub phases: HashMap<String, &'static str>,
    /// Each task's exit codes, one per try.
    pub exits: HashMap<String, Vec<i32>>,
    /// The exit handler's exit code.
    pub on_exit: Option<i32>,
    /// The workflow's global output parameters.
    pub globals: HashMap<String, String>,
}

/// The environment variables the tests' image gives every container, as a real image's
/// `ENV` would: where `kavi` and the tools are, and kavi's configuration outside the workspace.
const IMAGE_ENV: &[&str] = &["PATH", "HOME", "KAVI_TOOLCHAINS", "XDG_CONFIG_HOME"];

/// Whether pods can be stood in for here (a mount namespace needs root, and util-linux's
/// `unshare`); where not, the caller skips, saying why, and under CI that fails.
pub fn available() -> bool {
    let missing = if !nix::unistd::getuid().is_root() {
        "a task's mount namespace needs root"
    } else if Command::new("unshare").arg("--version").output().is_err() {
        "a task's mount namespace needs unshare (util-linux)"
    } else {
        return true;
    };
    assert!(std::env::var_os("CI").is_none(), "CI must: {missing}");
    eprintln!("skipping: {missing}");
    false
}

/// A PersistentVolumeClaim's name, and the folder that stands in for it.
pub type Claim<'a> = (&'a str, &'a Path);

/// A Kubernetes Secret's key, and its value: `((secret, key), value)`.
pub type Secret<'a> = ((&'a str, &'a str), &'a str);

/// Runs `manifest` in `workspace`, with `kavi` (the binary under test) for the containers'
/// `kavi` command, `parameters` for the workflow's arguments (defaults otherwise), `secrets`
/// for the Secrets the cluster holds and `claims` for its other volumes.
pub fn run(
    manifest: &Value,
    workspace: &Path,
    kavi: &Path,
    parameters: &[(&str, &str)],
    (secrets, claims): (&[Secret<'_>], &[Claim<'_>]),
) -> Outcome {
    let spec = &manifest["spec"];
    let templates: HashMap<&str, &Value> = spec["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t))
        .collect();
    let mut params: HashMap<String, String> = HashMap::new();
    for p in spec["arguments"]["parameters"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(value) = p["value"].as_str() {
            params.insert(p["name"].as_str().unwrap().to_owned(), value.to_owned());
        }
    }
    for (name, value) in parameters {
        params.insert((*name).to_owned(), (*value).to_owned());
    }
    // Each volume the workflow declares, by name: the folder standing in for its claim.
    let volumes: HashMap<String, &Path> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|volume| {
            let claim = volume["persistentVolumeClaim"]["claimName"]
                .as_str()
                .unwrap();
            let folder = claims
                .iter()
                .find(|(name, _)| *name == claim)
                .map_or(workspace, |(_, folder)| *folder);
            (volume["name"].as_str().unwrap().to_owned(), folder)
        })
        .collect();
    let cluster = Cluster {
        templates,
        workspace,
        kavi,
        params,
        secrets,
        volumes,
    };
    let mut outcome = Outcome {
        phases: HashMap::new(),
        exits: HashMap::new(),
        on_exit: None,
        globals: HashMap::new(),
    };
    let entry = cluster.templates[spec["entrypoint"].as_str().unwrap()];
    cluster.run_dag(entry, "", &HashMap::new(), &mut outcome);
    if let Some(handler) = spec["onExit"].as_str() {
        let (_, exits, _) = cluster.run_template(
            cluster.templates[handler],
            &HashMap::new(),
            &mut outcome.globals,
        );
        outcome.on_exit = exits.last().copied();
    }
    outcome
}

/// What the workflow runs with: its templates, parameters, Secrets and volumes.
struct Cluster<'a> {
    templates: HashMap<&'a str, &'a Value>,
    workspace: &'a Path,
    kavi: &'a Path,
    params: HashMap<String, String>,
    secrets: &'a [Secret<'a>],
    volumes: HashMap<String, &'a Path>,
}

/// A task's output parameters, by name.
type Outputs = HashMap<String, String>;

impl Cluster<'_> {
    /// Runs a DAG template with its `inputs`; each task's phase and exit codes go into
    /// `outcome` under `prefix` (a nested template's tasks under `outer.`). Returns the
    /// template's phase: Failed when a task failed or errored that does not continue on.
    fn run_dag(
        &self,
        template: &Value,
        prefix: &str,
        inputs: &HashMap<String, String>,
        outcome: &mut Outcome,
    ) -> &'static str {
        let tasks = template["dag"]["tasks"].as_array().unwrap();
        let mut phases: HashMap<String, &'static str> = HashMap::new();
        let mut outputs: HashMap<String, Outputs> = HashMap::new();
        let mut failed = false;
        while phases.len() < tasks.len() {
            let next = tasks.iter().find(|task| {
                let name = task["name"].as_str().unwrap();
                !phases.contains_key(name)
                    && referenced_tasks(task["depends"].as_str().unwrap_or(""))
                        .iter()
                        .all(|dep| phases.contains_key(dep.as_str()))
            });
            let task =
                next.expect("a task is ready: the DAG has no cycle and every depends names a task");
            let name = task["name"].as_str().unwrap().to_owned();
            let depends = task["depends"].as_str().unwrap_or("");
            let phase = if !depends.is_empty() && !Depends::new(depends, &phases).expression() {
                "Omitted"
            } else {
                let (phase, task_outputs) =
                    self.run_task(task, template, (prefix, inputs, &outputs), outcome);
                outputs.insert(name.clone(), task_outputs);
                phase
            };
            let continues = task["continueOn"]["failed"] == true;
            failed |= matches!(phase, "Failed" | "Errored") && !continues;
            phases.insert(name.clone(), phase);
            outcome.phases.insert(format!("{prefix}{name}"), phase);
        }
        if failed { "Failed" } else { "Succeeded" }
    }

    /// Runs one task of `dag` (a container, a nested DAG, or either once per item of its loop);
    /// returns its phase and output parameters.
    fn run_task(
        &self,
        task: &Value,
        dag: &Value,
        (prefix, inputs, outputs): (&str, &HashMap<String, String>, &HashMap<String, Outputs>),
        outcome: &mut Outcome,
    ) -> (&'static str, Outputs) {
        let name = format!("{prefix}{}", task["name"].as_str().unwrap());
        let template = self.templates[task["template"].as_str().unwrap()];
        // What the task's fields may read before its items: inputs, other tasks' outputs.
        let resolve = |text: &str| {
            let mut text = self.substitute(text, &HashMap::new());
            for (input, value) in inputs {
                text = text.replace(&format!("{{{{inputs.parameters.{input}}}}}"), value);
            }
            for (other, values) in outputs {
                for (parameter, value) in values {
                    text = text.replace(
                        &format!("{{{{tasks.{other}.outputs.parameters.{parameter}}}}}"),
                        value,
                    );
                }
            }
            text
        };
        let items: Option<Vec<Value>> = if let Some(items) = task["withItems"].as_array() {
            Some(items.clone())
        } else if let Some(param) = task["withParam"].as_str() {
            let text = resolve(param);
            assert!(!text.contains("{{"), "an unresolved variable in `{text}`");
            match serde_json::from_str::<Value>(&text) {
                Ok(Value::Array(items)) => Some(items),
                // Argo: "withParam value could not be parsed as a JSON list".
                _ => return ("Errored", Outputs::new()),
            }
        } else {
            None
        };
        let arguments = |item: Option<&Value>| -> HashMap<String, String> {
            task["arguments"]["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let mut value = resolve(p["value"].as_str().unwrap());
                    if let Some(item) = item {
                        value = substitute_item(&value, item);
                    }
                    assert!(!value.contains("{{"), "an unresolved variable in `{value}`");
                    (p["name"].as_str().unwrap().to_owned(), value)
                })
                .collect()
        };
        let Some(items) = items else {
            let arguments = arguments(None);
            if template.get("dag").is_some() {
                let phase = self.run_dag(template, &format!("{name}."), &arguments, outcome);
                return (phase, Outputs::new());
            }
            let (phase, exits, task_outputs) =
                self.run_template(template, &arguments, &mut outcome.globals);
            outcome.exits.insert(name, exits);
            return (phase, task_outputs);
        };
        if items.is_empty() {
            return ("Skipped", Outputs::new());
        }
        assert!(
            template.get("container").is_some(),
            "the stand-in loops over container templates: {name}"
        );
        // Started in item order, at most `parallelism` of them at once.
        let limit = dag["parallelism"]
            .as_u64()
            .map_or(items.len(), |n| usize::try_from(n).unwrap());
        assert!(limit > 0, "parallelism is at least 1");
        let next = std::sync::Mutex::new(0..items.len());
        let ended = std::sync::Mutex::new(Vec::new());
        // The items read the workflow's globals; they set none.
        let globals = outcome.globals.clone();
        std::thread::scope(|scope| {
            for _ in 0..limit.min(items.len()) {
                scope.spawn(|| {
                    loop {
                        let Some(i) = next.lock().unwrap().next() else {
                            break;
                        };
                        let arguments = arguments(Some(&items[i]));
                        let (phase, exits, _) =
                            self.run_template(template, &arguments, &mut globals.clone());
                        ended.lock().unwrap().push((i, phase, exits));
                    }
                });
            }
        });
        let mut ended = ended.into_inner().unwrap();
        ended.sort_by_key(|(i, ..)| *i);
        let mut phase = "Succeeded";
        for (i, item_phase, exits) in ended {
            outcome.phases.insert(format!("{name}({i})"), item_phase);
            outcome.exits.insert(format!("{name}({i})"), exits);
            if item_phase != "Succeeded" {
                phase = "Failed";
            }
        }
        (phase, Outputs::new())
    }

    /// `text` with the workflow's parameters and global outputs in place.
    fn substitute(&self, text: &str, globals: &HashMap<String, String>) -> String {
        let mut text = text.to_owned();
        for (name, value) in &self.params {
            text = text.replace(&format!("{{{{workflow.parameters.{name}}}}}"), value);
        }
        for (name, value) in globals {
            text = text.replace(
                &format!("{{{{workflow.outputs.parameters.{name}}}}}"),
                value,
            );
        }
        text
    }

    /// Runs a container template with its `inputs`, trying again as its `retryStrategy` says;
    /// returns its phase, the exit code of each try and its output parameters.
    fn run_template(
        &self,
        template: &Value,
        inputs: &HashMap<String, String>,
        globals: &mut HashMap<String, String>,
    ) -> (&'static str, Vec<i32>, Outputs) {
        let (workspace, kavi, secrets, volumes) =
            (self.workspace, self.kavi, self.secrets, &self.volumes);
        for declared in template["inputs"]["parameters"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let name = declared["name"].as_str().unwrap();
            assert!(
                inputs.contains_key(name),
                "input `{name}` of `{}` is not given: the task cannot start",
                template["name"]
            );
        }
        let container = &template["container"];
        assert_eq!(container["command"], serde_json::json!(["kavi"]));
        // The pod's own /tmp as the controller sees it, where it reads output parameters from.
        let own_tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let substitute = |arg: &str, globals: &HashMap<String, String>| {
            let mut arg = self.substitute(arg, globals);
            for (name, value) in inputs {
                arg = arg.replace(&format!("{{{{inputs.parameters.{name}}}}}"), value);
            }
            assert!(!arg.contains("{{"), "an unresolved variable in `{arg}`");
            arg
        };
        let retry = &template["retryStrategy"];
        let limit = retry["limit"].as_u64().unwrap_or(0);
        // The exported expression is `asInt(lastRetry.exitCode) == N`.
        let retry_on: Option<i32> = retry["expression"].as_str().map(|e| {
            e.strip_prefix("asInt(lastRetry.exitCode) == ")
                .and_then(|code| code.parse().ok())
                .unwrap_or_else(|| panic!("an expression the stand-in does not know: {e}"))
        });
        let mut exits = Vec::new();
        loop {
            let args: Vec<String> = container["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| substitute(a.as_str().unwrap(), globals))
                .collect();
            // In the task's namespace: a tmpfs on /tmp (the workspace, when under /tmp, bound back
            // at its path from the working folder it was entered by), its volumes mounted, then
            // kavi with the container's args; then its output parameters' files copied out to
            // `own_tmp`, where the controller reads them as Argo reads them from the pod.
            // A pod's file system is its own, its home's cache folder (where kavi keeps its
            // sandboxes by default) included: it is in the pod's /tmp here.
            let mut script = String::from(
                "mount -t tmpfs pod-tmp /tmp && mkdir -p \"$0\" && \
             mount --no-canonicalize --bind /proc/self/cwd \"$0\" && cd \"$0\" && \
             export XDG_CACHE_HOME=/tmp/pod-cache",
            );
            for mount in container["volumeMounts"].as_array().into_iter().flatten() {
                let path = mount["mountPath"].as_str().unwrap();
                if path == container["workingDir"] {
                    // The workspace's claim: the workspace, at its own path.
                    continue;
                }
                assert!(
                    path.starts_with("/tmp/"),
                    "the stand-in mounts volumes under /tmp: {path}"
                );
                let folder = volumes[mount["name"].as_str().unwrap()];
                script.push_str(&format!(
                    " && mkdir -p '{path}' && mount --bind '{}' '{path}'",
                    folder.display()
                ));
            }
            script.push_str(" && \"$@\"; code=$?");
            for output in template["outputs"]["parameters"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let path = output["valueFrom"]["path"].as_str().unwrap();
                script.push_str(&format!(
                    "; cp '{path}' '{}' 2>/dev/null",
                    own_tmp.path().join(in_pod(path)).display()
                ));
            }
            script.push_str("; exit $code");
            let mut command = Command::new("unshare");
            command
                .args(["--mount", "--propagation", "private", "sh", "-c", &script])
                .arg(workspace)
                .arg(kavi)
                .args(&args)
                .current_dir(workspace)
                .env_clear();
            for name in IMAGE_ENV {
                if let Some(value) = std::env::var_os(name) {
                    command.env(name, value);
                }
            }
            command
                .env("KAVI_TOOLCHAINS", super::common::toolchains())
                .env("XDG_CONFIG_HOME", super::common::config_home());
            // The container's environment, as the manifest gives it (the shared ledger).
            for variable in container["env"].as_array().into_iter().flatten() {
                let value = match variable["value"].as_str() {
                    Some(value) => value,
                    None => {
                        let reference = &variable["valueFrom"]["secretKeyRef"];
                        let wanted = (
                            reference["name"].as_str().unwrap(),
                            reference["key"].as_str().unwrap(),
                        );
                        secrets
                            .iter()
                            .find(|(secret, _)| *secret == wanted)
                            .unwrap_or_else(|| {
                                panic!("no Secret key {wanted:?}: the pod cannot start")
                            })
                            .1
                    }
                };
                command.env(variable["name"].as_str().unwrap(), value);
            }
            let status = command.output().unwrap();
            let code = status.status.code().unwrap_or(-1);
            exits.push(code);
            let tries = u64::try_from(exits.len()).unwrap();
            if code != 0 && retry_on == Some(code) && tries <= limit {
                continue;
            }
            if code != 0 {
                return ("Failed", exits, Outputs::new());
            }
            break;
        }
        let mut outputs = Outputs::new();
        for output in template["outputs"]["parameters"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let path = output["valueFrom"]["path"].as_str().unwrap();
            let value = std::fs::read_to_string(own_tmp.path().join(in_pod(path)))
                .unwrap()
                .trim()
                .to_owned();
            if let Some(global) = output["globalName"].as_str() {
                globals.insert(global.to_owned(), value.clone());
            }
            outputs.insert(output["name"].as_str().unwrap().to_owned(), value);
        }
        ("Succeeded", exits, outputs)
    }
}

/// `text` with `{{item}}` (a string item as it is, any other as JSON) and `{{item.KEY}}` (a
/// field of an object item, likewise) in place, as Argo substitutes a loop's item.
fn substitute_item(text: &str, item: &Value) -> String {
    let show = |value: &Value| match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let mut text = text.replace("{{item}}", &show(item));
    if let Value::Object(fields) = item {
        for (key, value) in fields {
            text = text.replace(&format!("{{{{item.{key}}}}}"), &show(value));
        }
    }
    text
}

/// Where an output parameter's file is in the pod's /tmp.
fn in_pod(path: &str) -> &str {
    path.strip_prefix("/tmp/")
        .unwrap_or_else(|| panic!("the stand-in reads outputs from the pod's /tmp: {path}"))
}

/// The task names a `depends` expression reads.
fn referenced_tasks(depends: &str) -> Vec<String> {
    depends
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'))
        .filter(|word| !word.is_empty())
        .map(|word| word.split('.').next().unwrap().to_owned())
        .collect()
}

/// Evaluates a `depends` expression over the phases of the tasks that ended.
struct Depends<'a> {
    tokens: Vec<String>,
    at: usize,
    phases: &'a HashMap<String, &'static str>,
}

impl<'a> Depends<'a> {
    fn new(text: &str, phases: &'a HashMap<String, &'static str>) -> Self {
        let spaced = text
            .replace('(', " ( ")
            .replace(')', " ) ")
            .replace("&&", " && ")
            .replace("||", " || ");
        Depends {
            tokens: spaced.split_whitespace().map(str::to_owned).collect(),
            at: 0,
            phases,
        }
    }

    fn next(&mut self) -> Option<String> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn expression(&mut self) -> bool {
        let mut value = self.conjunction();
        while self.peek() == Some("||") {
            self.next();
            value |= self.conjunction();
        }
        value
    }

    fn conjunction(&mut self) -> bool {
        let mut value = self.operand();
        while self.peek() == Some("&&") {
            self.next();
            value &= self.operand();
        }
        value
    }

    fn operand(&mut self) -> bool {
        let token = self.next().expect("an operand");
        if token == "(" {
            let value = self.expression();
            assert_eq!(self.next().as_deref(), Some(")"));
            return value;
        }
        let (task, phase) = token.split_once('.').unwrap_or((token.as_str(), ""));
        let actual = self.phases[task];
        match phase {
            // A bare name: the task succeeded (or was skipped).
            "" => matches!(actual, "Succeeded" | "Skipped"),
            phase => actual == phase,
        }
    }
}
