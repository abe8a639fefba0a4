//! `gate`: run a gate set (default `policies/gates.toml`) and pass only if every required gate
//! passes.
//!
//! All gates run side by side. Each result is `passed`, `failed` or `error` (the gate could not
//! run at all: a missing tool is never a pass); each is a `verifications` row, and together they
//! form a VERIFICATION_REPORT artifact. Editing the gate set changes the next run. Command gates
//! run under the `gate` profile of `policies/confinement.toml`: by default they may write only a
//! private temporary folder, so a gate cannot change what it verifies. A command gate that names
//! a toolchain runs its tool from that toolchain's environment, provisioned on first use (see
//! [`crate::toolchains`]), and its result records the tool's version.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

mod contract;
mod junit;
pub mod suppressions;

use super::vars::Vars;
use super::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::confinement::Confinement;
use crate::confinement::policy::{self, ConfinementPolicy, RoleProfile};
use crate::diagnostic::Diagnostic;
use crate::ledger::{GateResult, Ledger};
use crate::policy::gates::{DEFAULT_TIMEOUT, GateKind, GateSet, JunitSpec, TIMEOUT_KIND};
use crate::policy::invariants::{self, Invariant};
use crate::policy::scanner::Scanner;
use crate::process::{self, CommandSpec, Exit};
use crate::skills::trust::TrustPolicy;
use crate::spec::governing::Role;
use crate::state::NodeState;
use crate::toolchains::{Provisioned, Toolchain, ToolchainSet};

pub const KIND: NodeKind = NodeKind {
    name: "gate",
    parse,
    schema: <GateConfig as schemars::JsonSchema>::json_schema,
};

pub const DEFAULT_POLICY: &str = "policies/gates.toml";

/// How many lines of each failed gate's detail the node's error repeats.
const DETAIL_IN_ERROR: usize = 5;

/// How many lines of a failed command's output a result keeps.
const DETAIL_LINES: usize = 20;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GateConfig {
    /// The gate set policy.
    #[schemars(with = "Option<String>")]
    set: Option<Spanned<String>>,
    /// Where commands run and files are found, relative to the workspace (default: the workspace).
    #[schemars(with = "Option<String>")]
    cwd: Option<Spanned<String>>,
    /// The skill being verified: recorded with each result, and its source hash (per the trust
    /// policy) becomes its verified hash when every required gate passes.
    #[schemars(with = "Option<String>")]
    skill: Option<Spanned<String>>,
    /// The trust policy naming the skill's files (default `policies/trust.toml`).
    #[schemars(with = "Option<String>")]
    trust: Option<Spanned<String>>,
    /// Values for the gate set's templates, such as `skill`.
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    vars: IndexMap<String, Spanned<String>>,
    /// The confinement policy whose `gate` profile command gates run under.
    #[schemars(with = "Option<String>")]
    confinement: Option<Spanned<String>>,
    /// The classifier declaring the failure kinds a gate's `failure` may name (default
    /// `policies/classifier.toml`).
    #[schemars(with = "Option<String>")]
    classifier: Option<Spanned<String>>,
}

#[derive(Debug)]
enum Check {
    Command {
        argv: Vec<String>,
        timeout: Duration,
        /// The toolchain whose environment runs `argv[0]`, one of its tools.
        toolchain: Option<Arc<Toolchain>>,
        /// The files checked for `suppressions`, and read for the tests they declare.
        files: Vec<String>,
        /// The suppressions kavi looks for before the tool runs.
        suppressions: Vec<suppressions::Kind>,
        /// Judge pytest's JUnit report, not only its exit status.
        junit: Option<JunitSpec>,
    },
    /// kavi's analyser over the skill's files, run by the toolchain's interpreter.
    Scan {
        scanner: Scanner,
        files: Vec<String>,
        timeout: Duration,
        toolchain: Arc<Toolchain>,
    },
    /// kavi's secret rules over the skill's files, and the toolchain's `detect-secrets`.
    Secrets {
        scanner: Scanner,
        files: Vec<String>,
        timeout: Duration,
        toolchain: Option<Arc<Toolchain>>,
    },
    Invariants(Vec<Invariant>),
    /// The skill run against its proposal's examples, each under its class's run-time profile.
    Contract {
        timeout: Duration,
        /// The profiles skills run under, by side-effect class.
        confinement: Arc<ConfinementPolicy>,
        /// The fewest examples a proposal may declare.
        min_examples: usize,
    },
}

/// The tool a `secret_scan` gate runs from its toolchain.
const DETECT_SECRETS: &str = "detect-secrets";

impl Check {
    /// The toolchain this check runs a tool of, and which tool.
    fn tool(&self) -> Option<(&Arc<Toolchain>, &str)> {
        match self {
            Check::Command {
                argv,
                toolchain: Some(toolchain),
                ..
            } => Some((toolchain, argv[0].as_str())),
            Check::Scan { toolchain, .. } => Some((toolchain, crate::toolchains::INTERPRETER_TOOL)),
            Check::Secrets {
                toolchain: Some(toolchain),
                ..
            } => Some((toolchain, DETECT_SECRETS)),
            _ => None,
        }
    }

    /// Whether the check starts a process, which then runs confined.
    fn starts_process(&self) -> bool {
        match self {
            Check::Command { .. } | Check::Scan { .. } | Check::Contract { .. } => true,
            Check::Secrets { toolchain, .. } => toolchain.is_some(),
            Check::Invariants(_) => false,
        }
    }
}

#[derive(Debug)]
struct CompiledGate {
    id: String,
    kind: GateKind,
    check: Check,
    failure: String,
    required: bool,
}

#[derive(Debug)]
struct Gate {
    gates: Vec<CompiledGate>,
    /// Failure kinds in the order they name an attempt (see [`GateSet::precedence`]).
    precedence: Vec<String>,
    vars: Vars,
    cwd: String,
    skill: Option<String>,
    trust: Option<TrustPolicy>,
    set_path: String,
    confinement: RoleProfile,
    /// The suppressions the gate set allows.
    allowed: Vec<suppressions::Kind>,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: GateConfig = config.deserialize()?;
    for field in [raw.cwd.as_ref(), raw.skill.as_ref()].into_iter().flatten() {
        config.check_template(field)?;
    }
    let vars = Vars::load(config, raw.vars)?;
    let trust = match &raw.skill {
        None => None,
        Some(_) => Some(config.load_trust(raw.trust.as_ref())?),
    };
    let confinement_source =
        config.load_policy_source(raw.confinement.as_ref(), policy::DEFAULT_POLICY)?;
    let confinement = ConfinementPolicy::parse(&confinement_source, config.templates)?;
    let source = config.load_policy_source(raw.set.as_ref(), DEFAULT_POLICY)?;
    let set: GateSet =
        toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(&source, &e))?;
    // A contract gate runs the skill under the profile of its class, which may have the network.
    let contract = set.gates.iter().any(|g| g.kind == GateKind::Contract);
    let needed = confinement.gate.network() || (contract && confinement.any_network());
    let skills = Arc::new(config.load_process_hosts(confinement, needed)?);
    let confinement = skills.gate.clone();
    let classifier = config.load_classifier(raw.classifier.as_ref())?;
    let set_timeout = set.timeout.unwrap_or(DEFAULT_TIMEOUT);
    for kind in &set.precedence {
        classifier.check_kind(kind, &source)?;
    }
    let precedence = set.precedence.iter().map(|k| k.get_ref().clone()).collect();
    let toolchains = if set.toolchains.is_some()
        || set
            .gates
            .iter()
            .any(|g| g.toolchain.is_some() || g.kind == GateKind::PolicyScan)
    {
        let toolchains_source = config
            .load_policy_source(set.toolchains.as_ref(), crate::toolchains::DEFAULT_POLICY)?;
        // The lock beside the declarations governs the run too: an edit to it is a new toolchain.
        let lock_path = crate::toolchains::lock::lock_path(
            set.toolchains
                .as_ref()
                .map_or(crate::toolchains::DEFAULT_POLICY, |p| p.get_ref().as_str()),
        );
        let lock = if config.root.join(&lock_path).is_file() {
            Some(config.load_policy_source(None, &lock_path)?)
        } else {
            None
        };
        Some(ToolchainSet::parse(&toolchains_source)?.with_lock(lock.as_ref())?)
    } else {
        None
    };
    let suppression_kind = |name: &Spanned<String>| {
        suppressions::Kind::parse(name.get_ref()).ok_or_else(|| {
            Diagnostic::new(format!("unknown suppression `{}`", name.get_ref()))
                .at(&source, name.span())
                .with_help(format!(
                    "kinds kavi checks for: {}",
                    suppressions::KINDS
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
        })
    };
    let allowed = set
        .suppressions
        .allow
        .iter()
        .map(suppression_kind)
        .collect::<Result<Vec<_>, _>>()?;
    let mut seen = HashSet::new();
    let mut gates = Vec::new();
    for gate in set.gates {
        classifier.check_kind(&gate.failure, &source)?;
        if !seen.insert(gate.id.get_ref().clone()) {
            return Err(
                Diagnostic::new(format!("gate `{}` is defined twice", gate.id.get_ref()))
                    .at(&source, gate.id.span()),
            );
        }
        if gate.kind != GateKind::Command
            && let Some(field) = (!gate.suppressions.is_empty())
                .then_some("suppressions")
                .or(gate.junit.is_some().then_some("junit"))
        {
            return Err(
                Diagnostic::new(format!("`{field}` applies to a command gate only"))
                    .at(&source, gate.id.span()),
            );
        }
        if gate.kind != GateKind::Contract && gate.min_examples.is_some() {
            return Err(
                Diagnostic::new("`min_examples` applies to a contract gate only")
                    .at(&source, gate.id.span()),
            );
        }
        let check = match gate.kind {
            GateKind::Command => {
                if gate.run.is_empty() {
                    return Err(Diagnostic::new("a command gate needs `run`, an argv array")
                        .at(&source, gate.id.span()));
                }
                for arg in &gate.run {
                    vars.check_policy_template(config.templates, arg, &source)?;
                }
                for file in &gate.files {
                    vars.check_policy_template(config.templates, file, &source)?;
                }
                if let Some(junit) = &gate.junit
                    && let Some(percent) = junit.branch_coverage
                {
                    if percent > 100 {
                        return Err(Diagnostic::new(format!(
                            "`branch_coverage` is a percentage, 0 to 100, not {percent}"
                        ))
                        .at(&source, gate.id.span()));
                    }
                    if gate.files.is_empty() {
                        return Err(Diagnostic::new(
                            "a gate that measures `branch_coverage` needs `files`: the folder of \
                             its test files is what coverage measures",
                        )
                        .at(&source, gate.id.span()));
                    }
                }
                if !gate.suppressions.is_empty() && gate.files.is_empty() {
                    return Err(Diagnostic::new(
                        "a gate that checks `suppressions` needs `files` to check",
                    )
                    .at(&source, gate.id.span()));
                }
                config.govern_command(gate.run.iter().map(|a| a.get_ref().as_str()));
                Check::Command {
                    argv: gate.run.iter().map(|a| a.get_ref().clone()).collect(),
                    timeout: gate.timeout.unwrap_or(set_timeout),
                    toolchain: tool_of(&gate, toolchains.as_ref(), &source)?,
                    files: gate.files.iter().map(|f| f.get_ref().clone()).collect(),
                    suppressions: gate
                        .suppressions
                        .iter()
                        .map(suppression_kind)
                        .collect::<Result<Vec<_>, _>>()?,
                    junit: gate.junit,
                }
            }
            GateKind::PolicyScan | GateKind::SecretScan => {
                let rules_source = load_rules(config, &source, &gate)?;
                let scanner = Scanner::parse(&rules_source)?;
                if let Some(kind) = scanner.syntax_failure() {
                    classifier.check_kind(kind, &rules_source)?;
                }
                if gate.files.is_empty() {
                    return Err(Diagnostic::new(format!(
                        "a {} gate needs `files` to scan",
                        kind_name(gate.kind)
                    ))
                    .at(&source, gate.id.span()));
                }
                for file in &gate.files {
                    vars.check_policy_template(config.templates, file, &source)?;
                }
                let files = gate.files.iter().map(|f| f.get_ref().clone()).collect();
                let timeout = gate.timeout.unwrap_or(set_timeout);
                if gate.kind == GateKind::PolicyScan {
                    let Some(named) = &gate.toolchain else {
                        return Err(Diagnostic::new(
                            "a policy_scan gate needs `toolchain`: its interpreter parses the \
                             skill's Python files",
                        )
                        .at(&source, gate.id.span())
                        .with_help("add `toolchain = \"python\"` (policies/toolchains.toml)"));
                    };
                    let toolchains = toolchains.as_ref().expect("a policy_scan gate loads them");
                    let toolchain = named_toolchain(
                        &gate,
                        named,
                        crate::toolchains::INTERPRETER_TOOL,
                        toolchains,
                        &source,
                    )?;
                    Check::Scan {
                        scanner,
                        files,
                        timeout,
                        toolchain,
                    }
                } else {
                    if !scanner.has_secret_rules() && gate.toolchain.is_none() {
                        return Err(Diagnostic::new(
                            "this secret_scan gate would check nothing: its rules declare no \
                             `[[secret]]` and it names no toolchain with detect-secrets",
                        )
                        .at(&source, gate.id.span()));
                    }
                    let toolchain = match &gate.toolchain {
                        None => None,
                        Some(named) => Some(named_toolchain(
                            &gate,
                            named,
                            DETECT_SECRETS,
                            toolchains.as_ref().expect("a gate names a toolchain"),
                            &source,
                        )?),
                    };
                    Check::Secrets {
                        scanner,
                        files,
                        timeout,
                        toolchain,
                    }
                }
            }
            GateKind::Invariant => {
                let rules_source = load_rules(config, &source, &gate)?;
                let invariants = invariants::parse(&rules_source)?;
                for invariant in &invariants {
                    vars.check_policy_template(config.templates, &invariant.file, &rules_source)?;
                }
                Check::Invariants(invariants)
            }
            GateKind::Contract => {
                if raw.skill.is_none() {
                    return Err(Diagnostic::new(
                        "a contract gate runs a proposed skill: the gate node needs `skill`",
                    )
                    .at(&source, gate.id.span()));
                }
                Check::Contract {
                    timeout: gate.timeout.unwrap_or(set_timeout),
                    confinement: Arc::clone(&skills),
                    min_examples: gate.min_examples.unwrap_or(0),
                }
            }
        };
        gates.push(CompiledGate {
            id: gate.id.into_inner(),
            kind: gate.kind,
            check,
            failure: gate.failure.into_inner(),
            required: gate.required,
        });
    }
    Ok(Arc::new(Gate {
        gates,
        precedence,
        vars,
        cwd: raw.cwd.map_or_else(|| ".".to_owned(), Spanned::into_inner),
        skill: raw.skill.map(Spanned::into_inner),
        trust,
        set_path: source.path.display().to_string(),
        confinement,
        allowed,
    }))
}

/// The toolchain a command gate runs its program from: the one it names, which must declare
/// the program as a tool. A gate that names no toolchain but runs a declared tool is refused:
/// it would run whatever version PATH has instead of the pinned one.
fn tool_of(
    gate: &crate::policy::gates::GateSpec,
    toolchains: Option<&ToolchainSet>,
    set: &Arc<crate::diagnostic::SourceFile>,
) -> Result<Option<Arc<Toolchain>>, Diagnostic> {
    let program = &gate.run[0];
    let Some(named) = &gate.toolchain else {
        if let Some(declaring) = toolchains
            .into_iter()
            .flat_map(|set| &set.toolchains)
            .find(|t| t.has_tool(program.get_ref()))
        {
            return Err(Diagnostic::new(format!(
                "gate `{}` runs `{}` from PATH, but toolchain `{}` declares it",
                gate.id.get_ref(),
                program.get_ref(),
                declaring.name
            ))
            .at(set, program.span())
            .with_help(format!(
                "add `toolchain = \"{}\"` to the gate, so that the pinned version runs",
                declaring.name
            )));
        }
        return Ok(None);
    };
    let toolchains = toolchains.expect("a gate names a toolchain, so the set was loaded");
    named_toolchain(gate, named, program.get_ref(), toolchains, set).map(Some)
}

/// The name of a gate kind, as gates.toml spells it.
fn kind_name(kind: GateKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The toolchain `named`, which must declare `program` as a tool.
fn named_toolchain(
    gate: &crate::policy::gates::GateSpec,
    named: &Spanned<String>,
    program: &str,
    toolchains: &ToolchainSet,
    set: &Arc<crate::diagnostic::SourceFile>,
) -> Result<Arc<Toolchain>, Diagnostic> {
    let toolchain = toolchains.get(named.get_ref()).ok_or_else(|| {
        Diagnostic::new(format!(
            "gate `{}` names toolchain `{}`, which {} does not declare",
            gate.id.get_ref(),
            named.get_ref(),
            toolchains.source.path.display()
        ))
        .at(set, named.span())
        .with_help(format!("declared toolchains: {}", toolchains.names()))
    })?;
    if !toolchain.has_tool(program) {
        let tools: Vec<&str> = toolchain.tools().collect();
        let at = gate.run.first().map_or_else(|| named.span(), Spanned::span);
        return Err(Diagnostic::new(format!(
            "gate `{}` runs `{}`, which is not a tool of toolchain `{}`",
            gate.id.get_ref(),
            program,
            toolchain.name
        ))
        .at(set, at)
        .with_help(format!(
            "its tools: {}; declare the package in {}",
            tools.join(", "),
            toolchains.source.path.display()
        )));
    }
    Ok(Arc::clone(toolchain))
}

/// Reads the rules file a policy_scan or invariant gate names, recording it as governing.
fn load_rules(
    config: &mut NodeConfig<'_>,
    set: &Arc<crate::diagnostic::SourceFile>,
    gate: &crate::policy::gates::GateSpec,
) -> Result<Arc<crate::diagnostic::SourceFile>, Diagnostic> {
    let Some(rules) = &gate.rules else {
        return Err(
            Diagnostic::new("this gate needs `rules`, the policy file it applies")
                .at(set, gate.id.span()),
        );
    };
    let source = crate::policy::read(config.root, rules.get_ref())
        .map_err(|message| Diagnostic::new(message).at(set, rules.span()))?;
    config.governing.add(Role::Policy, Arc::clone(&source));
    Ok(source)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What every gate of one verification runs with.
#[derive(Clone, Copy)]
struct Scope<'a> {
    /// Where commands run and files are found.
    cwd: &'a Path,
    /// The values of the gate set's templates.
    vars: &'a minijinja::Value,
    /// The side-effect class the skill was proposed with.
    class: Option<&'a str>,
    /// The command gates' confinement and private temporary folder.
    confined: Option<(&'a Confinement, &'a Path)>,
    /// The suppressions the gate set allows.
    allowed: &'a [suppressions::Kind],
    /// The skill verified, its proposal file, and the trust policy naming its files.
    skill: Option<(&'a str, &'a str, &'a TrustPolicy)>,
    /// The values the secret scans found (written whole, or built from pieces), for every
    /// gate's detail to be redacted of.
    secrets: &'a std::sync::Mutex<Vec<String>>,
}

/// How a gate that ran came out.
enum Verdict {
    Passed,
    /// Passed, with a note worth keeping in the ledger's row (a test report's counts).
    PassedNoting(String),
    Failed(String),
    /// Failed, and named by another failure kind than the gate's own.
    FailedAs {
        kind: String,
        detail: String,
    },
    TimedOut(String),
}

impl Verdict {
    /// Failed with `detail`, or passed when there is none.
    fn failed_if(detail: String) -> Self {
        if detail.is_empty() {
            Verdict::Passed
        } else {
            Verdict::Failed(detail)
        }
    }
}

impl CompiledGate {
    async fn run(
        &self,
        ctx: &NodeContext<'_>,
        scope: &Scope<'_>,
        toolchains: &Toolchains,
    ) -> GateResult {
        // A toolchain that could not be provisioned is this gate's error: never a pass.
        let tool = match self.check.tool() {
            Some((toolchain, tool)) => match &toolchains[&toolchain.name] {
                Ok(provisioned) => Some((provisioned, tool)),
                Err(error) => return self.result("error", Some(error.clone()), None, None),
            },
            None => None,
        };
        let program = tool.map(|(provisioned, tool)| provisioned.tool_path(tool));
        let mut named = None;
        let mut evidence = serde_json::Map::new();
        let (status, detail) = match self
            .check(ctx, scope, program.as_deref(), &mut evidence)
            .await
        {
            Ok(Verdict::Passed) => ("passed", None),
            Ok(Verdict::PassedNoting(note)) => ("passed", Some(note)),
            Ok(Verdict::Failed(detail)) => ("failed", Some(detail)),
            Ok(Verdict::FailedAs { kind, detail }) => {
                named = Some(kind);
                ("failed", Some(detail))
            }
            Ok(Verdict::TimedOut(detail)) => ("timed_out", Some(detail)),
            Err(detail) => ("error", Some(detail)),
        };
        let mut result = self.result(
            status,
            detail,
            tool.map(|(provisioned, tool)| provisioned.record(tool)),
            (!evidence.is_empty()).then_some(serde_json::Value::Object(evidence)),
        );
        // What the code under review tried, or what the gate found, is named for what it is,
        // not as the gate's failure (a forbidden call during the tests is not a failing test).
        if named.is_some() {
            result.failure_kind = named;
        }
        result
    }

    fn result(
        &self,
        status: &str,
        detail: Option<String>,
        tool: Option<serde_json::Value>,
        evidence: Option<serde_json::Value>,
    ) -> GateResult {
        let failure_kind = match status {
            "passed" => None,
            "timed_out" => Some(TIMEOUT_KIND.to_owned()),
            _ => Some(self.failure.clone()),
        };
        GateResult {
            gate: self.id.clone(),
            kind: serde_json::to_value(self.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            required: self.required,
            status: status.to_owned(),
            failure_kind,
            detail,
            tool,
            evidence,
        }
    }

    /// The verdict, or `Err(why)` when the gate could not run. `tool` is the toolchain's
    /// executable a command gate runs in place of its program's name. What the gate saw beyond
    /// its verdict (allowed suppressions, a test report's counts, the connections its proxy
    /// allowed and refused) goes in `evidence`.
    async fn check(
        &self,
        ctx: &NodeContext<'_>,
        scope: &Scope<'_>,
        tool: Option<&Path>,
        evidence: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Verdict, String> {
        let Scope {
            cwd,
            vars,
            class,
            confined,
            allowed,
            skill,
            secrets,
        } = *scope;
        match &self.check {
            Check::Invariants(invariants) => {
                let mut violations = Vec::new();
                for invariant in invariants {
                    let file = Vars::apply(ctx, invariant.file.get_ref(), vars)?;
                    let text = invariants::read(cwd, &file)?;
                    violations.extend(invariant.check(&file, &text, class));
                }
                Ok(Verdict::failed_if(violations.join("\n")))
            }
            Check::Command {
                argv,
                timeout,
                files,
                suppressions: kinds,
                junit: junit_spec,
                ..
            } => {
                let mut args = Vars::apply_all(ctx, argv, vars)?;
                let files = Vars::apply_all(ctx, files, vars)?;
                // Suppressions the tool would honour without a word: a policy decision, checked
                // before the tool runs. The allowed ones are listed with the result.
                let (permitted, refused): (Vec<_>, Vec<_>) =
                    suppressions::find(cwd, &files, kinds)?
                        .into_iter()
                        .partition(|found| allowed.contains(&found.kind));
                // A passing gate's row in the ledger names what it let through.
                let allowed_note = (!permitted.is_empty()).then(|| {
                    format!(
                        "allowed suppressions: {}",
                        permitted
                            .iter()
                            .map(|f| format!("{}:{} {}", f.file, f.line, f.kind.name()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                });
                if !permitted.is_empty() {
                    evidence.insert(
                        "allowed_suppressions".to_owned(),
                        serde_json::to_value(&permitted).unwrap_or_default(),
                    );
                }
                if !refused.is_empty() {
                    return Ok(Verdict::Failed(format!(
                        "suppression_not_allowed: {}",
                        refused
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("\n")
                    )));
                }
                let named = args.remove(0);
                let program = tool.map_or(named, |tool| tool.display().to_string());
                let (confinement, tmp) =
                    confined.ok_or("a command gate ran without its confinement")?;
                // The tool's environment is kavi's, built here: nothing of kavi's own (a
                // PYTHONPATH, PYTEST_ADDOPTS, MYPYPATH, RUFF_*) reaches it, and its home is its
                // temporary folder, so no user configuration there applies either.
                let mut env: Vec<(String, String)> = process::base_env()
                    .into_iter()
                    .filter(|(key, _)| key != "HOME")
                    .collect();
                env.push(("HOME".to_owned(), tmp.display().to_string()));
                env.push(("TMPDIR".to_owned(), tmp.display().to_string()));
                // A gate may not write where it reads; Python would try, for its bytecode cache.
                env.push(("PYTHONDONTWRITEBYTECODE".to_owned(), "1".to_owned()));
                env.push(("PYTHONNOUSERSITE".to_owned(), "1".to_owned()));
                let prepared = match junit_spec {
                    Some(spec) => {
                        // What coverage measures: the folder of the tests' files, the skill's.
                        let measured = spec
                            .branch_coverage
                            .and(files.first())
                            .and_then(|file| Path::new(file).parent())
                            .map(|folder| cwd.join(folder));
                        let prepared = junit::prepare(tmp, measured.as_deref())?;
                        args.splice(0..0, prepared.args.iter().cloned());
                        env.extend(prepared.env.iter().cloned());
                        Some(prepared)
                    }
                    None => None,
                };
                let spec = CommandSpec {
                    program: program.clone(),
                    args,
                    env,
                    cwd: cwd.to_owned(),
                    stdin: None,
                    confinement: Some(confinement.clone()),
                };
                let options = ctx.capture(64 * 1024, None);
                // Past its time limit the gate's own token stops it (its whole process group);
                // the node's token still stops it for a cancel or the node's timeout.
                let stop = ctx.cancel.child_token();
                let run = process::run(&spec, &options, &stop);
                tokio::pin!(run);
                let finished = tokio::select! {
                    finished = &mut run => finished,
                    () = tokio::time::sleep(*timeout) => {
                        stop.cancel();
                        run.await
                    }
                }
                .map_err(|e| format!("could not run `{program}`: {e}"))?;
                if let Some(log) = finished
                    .network
                    .as_ref()
                    .and_then(|log| serde_json::to_value(log).ok())
                {
                    evidence.insert("network".to_owned(), log);
                }
                let output = format!(
                    "{}{}",
                    String::from_utf8_lossy(&finished.stdout.head),
                    String::from_utf8_lossy(&finished.stderr.head)
                );
                // Stopped by its confinement: the code under review tried something it may
                // not, or outgrew a bound. A failure, never "could not run".
                if let Some(violation) = &finished.violation {
                    return Ok(Verdict::FailedAs {
                        kind: violation.failure_kind().to_owned(),
                        detail: format!("{violation}\n{}", tail(&output, DETAIL_LINES)),
                    });
                }
                if let (Some(spec), Some(prepared)) = (junit_spec, &prepared) {
                    let exit = match finished.exit {
                        Exit::Code(code) => Some(code),
                        Exit::Cancelled if ctx.cancel.is_cancelled() => {
                            return Err("cancelled".into());
                        }
                        Exit::Cancelled => {
                            return Ok(Verdict::TimedOut(format!(
                                "timed out after {}; its processes were stopped; {}\n{}",
                                humantime::format_duration(*timeout),
                                prepared.running().map_or_else(
                                    || "no test had started (the tests were being collected)"
                                        .to_owned(),
                                    |test| format!("the test running was {test}")
                                ),
                                tail(&output, DETAIL_LINES)
                            )));
                        }
                        Exit::Signal(_) => None,
                    };
                    let mut declared = std::collections::BTreeSet::new();
                    for file in &files {
                        if let Ok(bytes) = junit::read_regular(&cwd.join(file)) {
                            declared
                                .extend(junit::declared_tests(&String::from_utf8_lossy(&bytes)));
                        }
                    }
                    return Ok(match junit::judge(prepared, spec, exit, &declared) {
                        Ok(counts) => {
                            evidence.insert("tests".to_owned(), counts.record());
                            Verdict::PassedNoting(match &allowed_note {
                                Some(note) => format!("{}; {note}", counts.summary()),
                                None => counts.summary(),
                            })
                        }
                        Err(refusal) => {
                            if let Some(counts) = &refusal.counts {
                                evidence.insert("tests".to_owned(), counts.record());
                            }
                            Verdict::Failed(format!(
                                "{}: {}{}\n{}",
                                refusal.reason,
                                refusal.detail,
                                refusal
                                    .counts
                                    .as_ref()
                                    .map(|c| format!(" ({})", c.summary()))
                                    .unwrap_or_default(),
                                tail(&output, DETAIL_LINES)
                            ))
                        }
                    });
                }
                match finished.exit {
                    Exit::Code(0) => {
                        Ok(allowed_note.map_or(Verdict::Passed, Verdict::PassedNoting))
                    }
                    Exit::Code(code) => Ok(Verdict::Failed(format!(
                        "exited with code {code}\n{}",
                        tail(&output, DETAIL_LINES)
                    ))),
                    Exit::Signal(signal) => Err(format!("killed by signal {signal}")),
                    Exit::Cancelled if !ctx.cancel.is_cancelled() => {
                        Ok(Verdict::TimedOut(format!(
                            "timed out after {}; its processes were stopped\n{}",
                            humantime::format_duration(*timeout),
                            tail(&output, DETAIL_LINES)
                        )))
                    }
                    Exit::Cancelled => Err("cancelled".into()),
                }
            }
            Check::Scan {
                scanner,
                files,
                timeout,
                ..
            } => {
                let files = Vars::apply_all(ctx, files, vars)?;
                let python = tool.ok_or("the policy scan has no interpreter")?;
                let findings = super::scan::policy(
                    ctx, scanner, &files, class, cwd, confined, python, *timeout,
                )
                .await?;
                let detail = findings
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n");
                // Code that does not parse cannot be checked, so the gate fails; alone, it is
                // named for its cause.
                match scanner.syntax_failure() {
                    Some(kind) if Scanner::only_syntax(&findings) => Ok(Verdict::FailedAs {
                        kind: kind.get_ref().clone(),
                        detail,
                    }),
                    _ => Ok(Verdict::failed_if(detail)),
                }
            }
            Check::Contract {
                timeout,
                confinement,
                min_examples,
            } => {
                let (name, proposal, trust) =
                    skill.ok_or("the contract gate has no proposed skill to run")?;
                let candidate = contract::Candidate {
                    workspace: cwd,
                    name,
                    proposal,
                    trust,
                    confinement,
                    timeout: *timeout,
                    min_examples: *min_examples,
                };
                candidate.check(ctx, evidence).await
            }
            Check::Secrets {
                scanner,
                files,
                timeout,
                ..
            } => {
                let files = Vars::apply_all(ctx, files, vars)?;
                let detail = super::scan::secrets(
                    ctx, scanner, &files, cwd, confined, tool, *timeout, secrets,
                )
                .await?;
                Ok(Verdict::failed_if(detail))
            }
        }
    }
}

/// Each toolchain the gates name, ready or why not, by name.
type Toolchains = std::collections::HashMap<String, Result<Provisioned, String>>;

impl Gate {
    /// The values the secret rules of this set's `secret_scan` gates find in their files' text,
    /// even when a gate could not run its tools. A file that cannot be read has been reported
    /// by its gate already.
    fn secrets_in(
        &self,
        ctx: &NodeContext<'_>,
        cwd: &Path,
        vars: &minijinja::Value,
    ) -> Vec<String> {
        let mut values = Vec::new();
        for gate in &self.gates {
            let Check::Secrets { scanner, files, .. } = &gate.check else {
                continue;
            };
            let files: Vec<String> = files
                .iter()
                .filter_map(|f| Vars::apply(ctx, f, vars).ok())
                .collect();
            let Ok((read, _)) = crate::policy::scanner::read_skill_files(cwd, &files) else {
                continue;
            };
            for file in &read {
                values.extend(scanner.scan_secrets(&file.name, &file.text).1);
            }
        }
        values
    }

    /// Makes ready, once each, the toolchains the gates name; an install is reported on stderr
    /// as it happens.
    async fn provision(&self, ctx: &NodeContext<'_>) -> Toolchains {
        let mut ready = Toolchains::new();
        for gate in &self.gates {
            let Some((toolchain, _)) = gate.check.tool() else {
                continue;
            };
            if ready.contains_key(&toolchain.name) {
                continue;
            }
            let provisioned = crate::toolchains::provision::ensure(
                toolchain,
                &ctx.env.toolchains,
                &ctx.capture(64 * 1024, None),
                &ctx.cancel,
                &|line| eprintln!("{line}"),
            )
            .await
            .map_err(|e| e.to_string());
            ready.insert(toolchain.name.clone(), provisioned);
        }
        ready
    }

    async fn verify(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let vars = self.vars.render(ctx)?;
        let cwd = ctx.env.workspace.join(ctx.render("cwd", &self.cwd)?);
        if !cwd.is_dir() {
            return Err(format!(
                "working directory {} does not exist",
                cwd.display()
            ));
        }
        let skill = ctx.render_optional("skill", self.skill.as_ref())?;
        // The gates' paths follow `vars.skill`: gating another skill's files would record them
        // as this one's verification.
        if let (Some(skill), Ok(named)) = (&skill, vars.get_attr("skill"))
            && !named.is_undefined()
            && named.as_str() != Some(skill.as_str())
        {
            return Err(format!(
                "`vars.skill` ({named}) is not the skill this node verifies (`{skill}`): the \
                 gates would check other files than the ones recorded as verified"
            ));
        }
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let row = match &skill {
            Some(skill) => match ledger.skill(skill) {
                Ok(row) => Some(row),
                Err(crate::ledger::LedgerError::SkillNotFound(_)) => None,
                Err(e) => return Err(e.to_string()),
            },
            None => None,
        };
        // The hash covers the proposal too, so only a proposed skill has one.
        let hash = || match (&self.trust, &row) {
            (Some(trust), Some(row)) => trust
                .source_hash(&ctx.env.templates, &cwd, &row.name, &row.proposal_path)
                .map(Some),
            _ => Ok(None),
        };
        let before = hash()?;
        // Invariants compare what the skill declares with what it was proposed as.
        let class = row.as_ref().map(|row| row.side_effect.clone());
        // Gates that start a process (commands, the analyser, detect-secrets) share one private
        // temporary folder and one confinement; a set of invariants alone needs neither.
        let confined = if self.gates.iter().any(|g| g.check.starts_process()) {
            let tmp = crate::sandbox::private_temp(&ctx.env.sandboxes, "kavi-tmp-gates-")
                .and_then(|tmp| ctx.env.owner.track(tmp.path()).map(|()| tmp))
                .map_err(|e| format!("failed to create the gates' temporary folder: {e}"))?;
            let confinement = self.confinement.confine(
                &ctx.env.templates,
                &minijinja::context! { workspace => &*ctx.env.workspace, tmp => tmp.path() },
                &[],
            )?;
            Some((confinement, tmp))
        } else {
            None
        };
        let for_commands = confined.as_ref().map(|(c, tmp)| (c, tmp.path()));
        let toolchains = self.provision(ctx).await;
        let secrets = std::sync::Mutex::new(Vec::new());
        let scope = Scope {
            cwd: &cwd,
            vars: &vars,
            class: class.as_deref(),
            confined: for_commands,
            allowed: &self.allowed,
            skill: match (&row, &self.trust) {
                (Some(row), Some(trust)) => Some((&row.name, &row.proposal_path, trust)),
                _ => None,
            },
            secrets: &secrets,
        };
        let mut results = futures_util::future::join_all(
            self.gates
                .iter()
                .map(|gate| gate.run(ctx, &scope, &toolchains)),
        )
        .await;
        // A secret the secret scan found is printed by no gate: a test's traceback or a type
        // error may quote the line that holds it, or print the key the code builds.
        let mut found = self.secrets_in(ctx, &cwd, &vars);
        found.extend(
            secrets
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if let Some(redactor) = crate::redact::Redactor::new(&found).map(|r| r.line_wise()) {
            for result in &mut results {
                if let Some(detail) = &mut result.detail {
                    *detail = redactor.text(detail);
                }
            }
        }
        // What passed must be what is recorded: files that changed under the gates void the run.
        if hash()? != before {
            return Err(
                "the skill's files changed while the gates ran; nothing is recorded as verified"
                    .into(),
            );
        }
        let blocking: Vec<&GateResult> = results
            .iter()
            .filter(|r| r.required && r.status != "passed")
            .collect();
        // The kind that names the attempt: by the declared precedence, then by gate order.
        let rank = |r: &GateResult| {
            r.failure_kind
                .as_ref()
                .and_then(|kind| self.precedence.iter().position(|p| p == kind))
                .unwrap_or(usize::MAX)
        };
        let deciding = blocking
            .iter()
            .enumerate()
            .min_by_key(|(order, r)| (rank(r), *order))
            .map(|(_, r)| r);

        let report = json!({
            "set": self.set_path,
            "skill": skill,
            "source_hash": before,
            "gates": results,
        });
        let report_text = serde_json::to_string_pretty(&report).expect("report serializes");
        let artifact = ctx
            .env
            .artifacts
            .put_bytes("VERIFICATION_REPORT", report_text.as_bytes())
            .map_err(|e| format!("failed to store the verification report: {e}"))?;
        ledger
            .record_verifications(
                ctx.run_id,
                ctx.node_id,
                skill.as_deref(),
                before.as_deref(),
                blocking.is_empty(),
                &results,
                &artifact,
            )
            .map_err(|e| format!("failed to record verifications: {e}"))?;

        let mut outcome = NodeOutcome::succeeded(json!({
            "passed": blocking.is_empty(),
            "gates": results,
            "failure_kind": deciding.and_then(|r| r.failure_kind.clone()),
            "source_hash": before,
            "report": artifact.sha256,
            "confinement": confined.as_ref().map(|(c, _)| c.record()),
        }));
        outcome.artifacts.push(("report", artifact));
        if !blocking.is_empty() {
            outcome.state = NodeState::Failed;
            // Name each gate that held the skill back, with the start of its detail, so the
            // reason is visible where the run is watched and not only in the ledger.
            let mut error = String::from("required gates did not pass:");
            for r in &blocking {
                error.push_str(&format!("\n  {} ({})", r.gate, r.status));
                for line in r
                    .detail
                    .as_deref()
                    .unwrap_or_default()
                    .lines()
                    .take(DETAIL_IN_ERROR)
                {
                    error.push_str(&format!("\n    {line}"));
                }
            }
            outcome.error = Some(error);
        }
        Ok(outcome)
    }
}

#[async_trait::async_trait]
impl NodeAction for Gate {
    fn describe(&self) -> String {
        let ids: Vec<&str> = self.gates.iter().map(|g| g.id.as_str()).collect();
        format!("gate set {} ({})", self.set_path, ids.join(", "))
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.verify(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}
