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
use toml::Spanned;

mod check;
mod contract;
mod junit;
pub mod suppressions;
mod verify;

use super::vars::Vars;
use crate::confinement::Confinement;
use crate::confinement::policy::{self, ConfinementPolicy, RoleProfile};
use crate::diagnostic::Diagnostic;
use crate::node::{NodeAction, NodeConfig, NodeKind};
use crate::policy::gates::{DEFAULT_TIMEOUT, GateKind, GateSet, JunitSpec};
use crate::policy::invariants::{self, Invariant};
use crate::policy::scanner::Scanner;
use crate::skills::trust::TrustPolicy;
use crate::spec::governing::Role;
use crate::toolchains::{Toolchain, ToolchainSet};

pub const KIND: NodeKind = NodeKind {
    name: "gate",
    parse,
    schema: <GateConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

pub const DEFAULT_POLICY: &str = "policies/gates.toml";

/// How many lines of each failed gate's detail the node's error repeats.
const DETAIL_IN_ERROR: usize = 5;

/// How many lines of a failed command's output a result keeps.
const DETAIL_LINES: usize = 20;

/// The evidence of a scan gate that found files Python reads otherwise than the tools (its
/// rule `source`): their names.
const READ_OTHERWISE: &str = "read_otherwise";

/// The evidence of a gate whose verdict is a test report (`junit`): its counts.
const TEST_REPORT: &str = "tests";

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
        Some(_) => Some(crate::skills::trust::load(config, raw.trust.as_ref())?),
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
    let classifier = crate::policy::classifier::load(config, raw.classifier.as_ref())?;
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
                for (name, percent) in gate.junit.iter().flat_map(JunitSpec::coverage_thresholds) {
                    if percent > 100 {
                        return Err(Diagnostic::new(format!(
                            "`{name}` is a percentage, 0 to 100, not {percent}"
                        ))
                        .at(&source, gate.id.span()));
                    }
                    if gate.files.is_empty() {
                        return Err(Diagnostic::new(format!(
                            "a gate that measures `{name}` needs `files`: the folder of its \
                             test files is what coverage measures"
                        ))
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
    /// The secrets the scans find in the skill's files, hidden from what a gate's tool prints
    /// as it prints it (the live log, `--stream`), not only from the result kept.
    live: Option<&'a crate::redact::Redactor>,
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
