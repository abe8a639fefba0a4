//! Running one gate: its check (a command, the scanner, invariants, trust, secrets), under
//! confinement, and its result.

use std::path::Path;

use super::verify::Toolchains;
use super::{
    Check, CompiledGate, DETAIL_LINES, READ_OTHERWISE, Scope, TEST_REPORT, Verdict, contract,
    junit, suppressions, tail,
};
use crate::ledger::GateResult;
use crate::node::NodeContext;
use crate::nodes::vars::Vars;
use crate::policy::gates::TIMEOUT_KIND;
use crate::policy::invariants;
use crate::policy::scanner::Scanner;
use crate::process::{self, CommandSpec, Exit};

impl CompiledGate {
    pub(super) async fn run(
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

    pub(super) fn result(
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
    pub(super) async fn check(
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
            live,
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
                        let measured = files
                            .first()
                            .filter(|_| spec.measures_coverage())
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
                let options = ctx.capture(64 * 1024, live);
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
                            evidence.insert(TEST_REPORT.to_owned(), counts.record());
                            Verdict::PassedNoting(match &allowed_note {
                                Some(note) => format!("{}; {note}", counts.summary()),
                                None => counts.summary(),
                            })
                        }
                        Err(refusal) => {
                            if let Some(counts) = &refusal.counts {
                                evidence.insert(TEST_REPORT.to_owned(), counts.record());
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
                let findings = crate::nodes::scan::policy(
                    ctx, scanner, &files, class, cwd, confined, python, *timeout,
                )
                .await?;
                let detail = findings
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n");
                let hidden = Scanner::read_otherwise(&findings);
                if !hidden.is_empty() {
                    evidence.insert(READ_OTHERWISE.to_owned(), serde_json::json!(hidden));
                }
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
                let detail = crate::nodes::scan::secrets(
                    ctx, scanner, &files, cwd, confined, tool, *timeout, secrets,
                )
                .await?;
                Ok(Verdict::failed_if(detail))
            }
        }
    }
}
