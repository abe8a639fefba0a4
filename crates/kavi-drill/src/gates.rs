//! `kavi drill gates`: the ways code under review tries to talk its gates out of their verdict,
//! each run through the workspace's own gate set and reported caught (by which gate, and why)
//! or missed.
//!
//! Each case is a small skill that is broken (an unused import, a type error, a failing test,
//! a forbidden call) and tries to hide it: a suppression comment, a test that ends the process
//! early or patches the framework, a tool configuration file in the skill's folder, at the
//! workspace's root or above it. Each runs in a workspace of its own (in a temporary folder,
//! holding a copy of this workspace's `policies/`), as `kavi pipeline run` of one gate node, so
//! that what the drill exercises is exactly what a forge run does. A case is caught when every
//! gate it targets did not pass.

use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use serde::Serialize;

use super::DrillError;
use crate::config::Workspace;
use cases::{At, Case, SKILL, TEST, TOOL_CASES};
use scanner_cases::SCANNER_CASES;

mod cases;
mod scanner_cases;

/// How many cases run at once.
const PARALLEL: usize = 2;

/// How one case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every gate it targets did not pass.
    Caught,
    /// A gate it targets passed.
    Missed,
    /// The gates could not be run on it: never counted as caught.
    NotRun,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub case: &'static str,
    pub what: &'static str,
    pub targets: &'static [&'static str],
    pub verdict: Verdict,
    /// Per targeted gate, its status and the first line of its detail.
    pub detail: String,
}

/// The folders and settings each case's workspace takes from this one.
struct Setup {
    exe: PathBuf,
    policies: PathBuf,
    kavi_toml: String,
    toolchains: PathBuf,
    sandboxes: PathBuf,
}

/// Runs every case (or those whose name contains `only`) against `workspace`'s policies.
pub async fn run(workspace: &Workspace, only: Option<&str>) -> Result<Vec<Outcome>, DrillError> {
    let mut kavi_toml = String::new();
    for (name, existing) in &workspace.config.toolchain {
        kavi_toml.push_str(&format!(
            "[toolchain.{}]\npath = {}\n",
            toml_string(name),
            toml_string(&workspace.root.join(&existing.path).display().to_string())
        ));
    }
    let setup = Setup {
        exe: std::env::current_exe()?,
        policies: workspace.root.join("policies"),
        kavi_toml,
        toolchains: workspace.config.toolchains.clone(),
        sandboxes: workspace.config.sandboxes.clone(),
    };
    let cases: Vec<&Case> = TOOL_CASES
        .iter()
        .chain(SCANNER_CASES)
        .filter(|c| only.is_none_or(|only| c.name.contains(only)))
        .collect();
    let outcomes = futures_util::stream::iter(cases.into_iter().map(|case| run_case(&setup, case)))
        .buffered(PARALLEL)
        .collect::<Vec<_>>()
        .await;
    Ok(outcomes)
}

fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

async fn run_case(setup: &Setup, case: &'static Case) -> Outcome {
    let outcome = |verdict, detail: String| Outcome {
        case: case.name,
        what: case.what,
        targets: case.targets,
        verdict,
        detail,
    };
    let dir = match tempfile::Builder::new()
        .prefix("kavi-drill-gates-")
        .tempdir()
    {
        Ok(dir) => dir,
        Err(e) => return outcome(Verdict::NotRun, format!("no temporary folder: {e}")),
    };
    let root = dir.path().join("workspace");
    if let Err(e) = lay_out(setup, case, dir.path(), &root) {
        return outcome(Verdict::NotRun, format!("could not lay out the case: {e}"));
    }
    let proposed = kavi(setup, &root, &["skill", "propose", "demo.toml"]).await;
    if !matches!(&proposed, Ok((Some(0), _))) {
        return outcome(Verdict::NotRun, failed_to("propose the skill", proposed));
    }
    let ran = kavi(setup, &root, &["pipeline", "run", "verify"]).await;
    if !matches!(&ran, Ok((Some(0 | 1), _))) {
        return outcome(Verdict::NotRun, failed_to("run the gates", ran));
    }
    let shown = kavi(setup, &root, &["runs", "show", "--json"]).await;
    let Ok((Some(0), json)) = &shown else {
        return outcome(Verdict::NotRun, failed_to("read the run", shown));
    };
    let run: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let empty = Vec::new();
    let results = run["verifications"].as_array().unwrap_or(&empty);
    let mut caught = true;
    let mut details = Vec::new();
    for target in case.targets {
        let Some(result) = results.iter().find(|r| r["gate"] == *target) else {
            return outcome(
                Verdict::NotRun,
                format!("the gate set has no gate `{target}`"),
            );
        };
        let status = result["status"].as_str().unwrap_or_default();
        if status == "error" {
            return outcome(
                Verdict::NotRun,
                format!(
                    "{target}: could not run: {}",
                    first_line(result["detail"].as_str())
                ),
            );
        }
        caught &= status != "passed";
        // Failed, but named for less than it is: not caught as what it is.
        if let Some(kind) = case.kind {
            caught &= result["failure_kind"] == kind;
        }
        details.push(format!(
            "{target} {status}: {}",
            first_lines(result["detail"].as_str())
        ));
    }
    outcome(
        if caught {
            Verdict::Caught
        } else {
            Verdict::Missed
        },
        details.join("; "),
    )
}

fn first_line(text: Option<&str>) -> String {
    let line = text.unwrap_or_default().lines().next().unwrap_or_default();
    let mut cut: String = line.chars().take(110).collect();
    if cut.len() < line.len() {
        cut.push('…');
    }
    cut
}

/// The first line of a gate's detail, and the tool's first line when the first only says how
/// it exited.
fn first_lines(text: Option<&str>) -> String {
    let mut lines = text
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or_default();
    match lines.next() {
        Some(second) if first.starts_with("exited with code") => {
            first_line(Some(&format!("{first}: {}", second.trim())))
        }
        _ => first_line(Some(first)),
    }
}

fn failed_to(what: &str, result: std::io::Result<(Option<i32>, String)>) -> String {
    match result {
        Ok((code, output)) => format!(
            "could not {what} (exit {}): {}",
            code.map_or_else(|| "by signal".to_owned(), |c| c.to_string()),
            first_line(Some(output.trim()))
        ),
        Err(e) => format!("could not {what}: {e}"),
    }
}

/// The case's workspace: this one's policies, a pipeline of one gate node, the proposal, the
/// skill's files and the case's extra files.
fn lay_out(setup: &Setup, case: &Case, above: &Path, root: &Path) -> std::io::Result<()> {
    let skill = root.join("skills/demo");
    std::fs::create_dir_all(&skill)?;
    std::fs::create_dir_all(root.join("pipelines"))?;
    std::fs::create_dir_all(root.join("policies"))?;
    for entry in std::fs::read_dir(&setup.policies)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), root.join("policies").join(entry.file_name()))?;
        }
    }
    keep_only_targets(&root.join("policies/gates.toml"), case.targets)?;
    std::fs::write(root.join("kavi.toml"), &setup.kavi_toml)?;
    std::fs::write(
        root.join("pipelines/verify.toml"),
        "[pipeline]\nname = \"verify\"\n\n[nodes.verify]\nkind = \"gate\"\nskill = \"demo\"\n\
         vars = { skill = \"demo\" }\n",
    )?;
    std::fs::write(
        root.join("demo.toml"),
        "name = \"demo\"\ndescription = \"A drill case\"\nside_effect = \"READ_ONLY\"\n\
         command = [\"python3\", \"skills/demo/skill.py\"]\ninput_schema = {}\noutput_schema = {}\n",
    )?;
    std::fs::write(skill.join("skill.py"), case.skill.unwrap_or(SKILL))?;
    std::fs::write(skill.join("test_skill.py"), case.test.unwrap_or(TEST))?;
    for (at, name, text) in case.extra {
        let folder = match at {
            At::Skill => skill.clone(),
            At::Root => root.to_owned(),
            At::Above => above.to_owned(),
        };
        std::fs::write(folder.join(name), text)?;
    }
    Ok(())
}

/// Cuts the case's copy of the gate set down to the gates it targets (and kavi's own checks,
/// which cost nothing), so that a case pays for no tool it does not exercise, and turns branch
/// coverage on (every branch) in each test gate: off in the shipped set, on in the drill. A
/// gate set that does not read as TOML is left as it is, for the run to report.
fn keep_only_targets(gates: &Path, targets: &[&str]) -> std::io::Result<()> {
    let Ok(text) = std::fs::read_to_string(gates) else {
        return Ok(());
    };
    let Ok(mut set) = text.parse::<toml::Table>() else {
        return Ok(());
    };
    if let Some(toml::Value::Array(list)) = set.get_mut("gate") {
        list.retain(|gate| {
            gate.get("kind").and_then(toml::Value::as_str) != Some("command")
                || gate
                    .get("id")
                    .and_then(toml::Value::as_str)
                    .is_some_and(|id| targets.contains(&id))
        });
        for gate in list.iter_mut() {
            if let Some(toml::Value::Table(junit)) = gate.get_mut("junit") {
                for threshold in ["branch_coverage", "line_coverage"] {
                    junit.entry(threshold).or_insert(toml::Value::Integer(100));
                }
            }
        }
    }
    std::fs::write(gates, set.to_string())
}

/// Runs kavi in the case's workspace, as a user would (unconfined, through the one place kavi
/// starts processes); its exit code and output.
async fn kavi(setup: &Setup, root: &Path, args: &[&str]) -> std::io::Result<(Option<i32>, String)> {
    // The case's workspace is configured by its own kavi.toml and these, not by the caller's
    // KAVI_* variables (a ledger or artifact store elsewhere). A variable that is not UTF-8
    // cannot be passed on, and is left out.
    let text = |path: &Path| path.display().to_string();
    let env = std::env::vars_os()
        .filter_map(|(key, value)| Some((key.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(key, _)| !key.starts_with("KAVI_"))
        .chain([
            ("KAVI_TOOLCHAINS".to_owned(), text(&setup.toolchains)),
            ("KAVI_SANDBOXES".to_owned(), text(&setup.sandboxes)),
        ])
        .collect();
    let spec = crate::process::CommandSpec {
        program: text(&setup.exe),
        args: ["--workspace".to_owned(), text(root)]
            .into_iter()
            .chain(args.iter().map(|arg| (*arg).to_owned()))
            .collect(),
        env,
        cwd: root.to_owned(),
        stdin: None,
        confinement: None,
    };
    let options = crate::process::CaptureOptions {
        limit: OUTPUT_LIMIT,
        spill_dir: setup.sandboxes.clone(),
        roster: None,
        live: None,
    };
    let finished = crate::process::run(&spec, &options, &Default::default()).await?;
    let shown = |captured: &crate::process::Captured| {
        let mut text = String::from_utf8_lossy(&captured.head).into_owned();
        if captured.total > captured.head.len() as u64 {
            text.push_str("\n[output cut short]\n");
        }
        text
    };
    let code = match finished.exit {
        crate::process::Exit::Code(code) => Some(code),
        crate::process::Exit::Signal(_) | crate::process::Exit::Cancelled => None,
    };
    let mut text = shown(&finished.stdout);
    if code != Some(0) {
        text.push_str(&shown(&finished.stderr));
    }
    Ok((code, text))
}

/// The most of a case's output kept: what the drill reads of it is a few lines.
const OUTPUT_LIMIT: usize = 1 << 20;
