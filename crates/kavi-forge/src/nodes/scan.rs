//! The processes a `policy_scan` and a `secret_scan` gate start: kavi's analyser, run with the
//! pinned interpreter of the gate's toolchain, and `detect-secrets`. Each runs under the gates'
//! confinement, as every command gate does; one that cannot run, is stopped, or answers what kavi
//! cannot read is the gate's error, never a pass.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use crate::confinement::Confinement;
use crate::node::NodeContext;
use crate::policy::scanner::{self, Finding, Scanner, SkillFile};
use crate::process::{self, CommandSpec, Exit, Finished};
use crate::redact::Redactor;

/// How much of the analyser's or detect-secrets' answer is read.
const ANSWER_LIMIT: usize = 8 * 1024 * 1024;

/// Runs `program` confined in `cwd` with `stdin`, stopped after `timeout`.
async fn run_confined(
    ctx: &NodeContext<'_>,
    program: &Path,
    args: Vec<String>,
    stdin: Option<Vec<u8>>,
    cwd: &Path,
    confined: Option<(&Confinement, &Path)>,
    timeout: Duration,
) -> Result<Finished, String> {
    let (confinement, tmp) = confined.ok_or("a scan gate ran without its confinement")?;
    let mut env = process::base_env();
    env.push(("TMPDIR".to_owned(), tmp.display().to_string()));
    env.push(("PYTHONDONTWRITEBYTECODE".to_owned(), "1".to_owned()));
    let spec = CommandSpec {
        program: program.display().to_string(),
        args,
        env,
        cwd: cwd.to_owned(),
        stdin,
        confinement: Some(confinement.clone()),
    };
    // The answer is read whole, never shown live: it is parsed, then summarised.
    let mut options = ctx.capture(ANSWER_LIMIT, None);
    options.live = None;
    let stop = ctx.cancel.child_token();
    let run = process::run(&spec, &options, &stop);
    tokio::pin!(run);
    let mut timed_out = false;
    let finished = tokio::select! {
        finished = &mut run => finished,
        () = tokio::time::sleep(timeout) => {
            timed_out = true;
            stop.cancel();
            run.await
        }
    }
    .map_err(|e| format!("could not run `{}`: {e}", program.display()))?;
    let stderr = String::from_utf8_lossy(&finished.stderr.head);
    let stderr = stderr.lines().rev().take(10).collect::<Vec<_>>();
    let stderr = stderr.into_iter().rev().collect::<Vec<_>>().join("\n");
    if let Some(violation) = &finished.violation {
        return Err(format!("stopped by its confinement: {violation}\n{stderr}"));
    }
    match finished.exit {
        Exit::Code(0) if finished.stdout.total <= ANSWER_LIMIT as u64 => Ok(finished),
        Exit::Code(0) => Err(format!(
            "its answer is larger than {ANSWER_LIMIT} bytes, so it was not read"
        )),
        Exit::Code(code) => Err(format!("exited with code {code}\n{stderr}")),
        Exit::Signal(signal) => Err(format!("killed by signal {signal}")),
        Exit::Cancelled if timed_out => Err(format!(
            "timed out after {}; its processes were stopped",
            humantime::format_duration(timeout)
        )),
        Exit::Cancelled => Err("cancelled".into()),
    }
}

/// The policy scan of `files`: kavi's findings (files it cannot read as Python, text rules) and
/// the analyser's, in file and line order.
#[allow(
    clippy::too_many_arguments,
    reason = "what a gate hands a check, spelled out"
)]
pub(super) async fn policy(
    ctx: &NodeContext<'_>,
    scanner: &Scanner,
    files: &[String],
    class: Option<&str>,
    cwd: &Path,
    confined: Option<(&Confinement, &Path)>,
    python: &Path,
    timeout: Duration,
) -> Result<Vec<Finding>, String> {
    let (read, mut findings) = scanner::read_skill_files(cwd, files)?;
    let (request, text_findings) = scanner.analyser_request(class, &read)?;
    findings.extend(text_findings);
    let stdin = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
    let args = ["-I", "-B", "-c", scanner::ANALYSER]
        .map(str::to_owned)
        .to_vec();
    let finished = run_confined(ctx, python, args, Some(stdin), cwd, confined, timeout)
        .await
        .map_err(|e| format!("the analyser did not run to the end: {e}"))?;
    findings.extend(Scanner::analyser_findings(&finished.stdout.head)?);
    findings.sort_by(|a, b| (&a.file, a.line, a.col).cmp(&(&b.file, b.line, b.col)));
    Ok(findings)
}

/// The secret scan of `files`: kavi's own rules over the text, then, when the gate names a
/// toolchain with `detect-secrets`, the same rules over the strings the files build from pieces
/// (folded by the analyser, run with that toolchain's interpreter), and `detect-secrets`. The
/// findings name where and what kind of secret, never its value; the built strings a rule
/// matched go into `found`, for whatever else is printed to be redacted.
#[allow(
    clippy::too_many_arguments,
    reason = "what a gate hands a check, spelled out"
)]
pub(super) async fn secrets(
    ctx: &NodeContext<'_>,
    scanner: &Scanner,
    files: &[String],
    cwd: &Path,
    confined: Option<(&Confinement, &Path)>,
    detect_secrets: Option<&Path>,
    timeout: Duration,
    found: &Mutex<Vec<String>>,
) -> Result<String, String> {
    // A file no rule here can read (not UTF-8, compiled, not a regular file) may hide a key
    // from all of them: it fails the scan, as it fails the policy scan.
    let (read, unreadable) = scanner::read_skill_files(cwd, files)?;
    let mut findings = unreadable;
    let mut values = Vec::new();
    for file in &read {
        let (found, secret) = scanner.scan_secrets(&file.name, &file.text);
        findings.extend(found);
        values.extend(secret);
    }
    if let Some(program) = detect_secrets {
        // Run as a library by kavi's launcher, with the toolchain's interpreter beside it.
        let python = program.with_file_name(crate::toolchains::INTERPRETER_TOOL);
        // A key built from pieces is the whole key once the program runs: the analyser folds
        // what the files build from literals, and kavi's rules read the result.
        let stdin =
            serde_json::to_vec(&Scanner::strings_request(&read)).map_err(|e| e.to_string())?;
        let args = ["-I", "-B", "-c", scanner::ANALYSER]
            .map(str::to_owned)
            .to_vec();
        let finished = run_confined(ctx, &python, args, Some(stdin), cwd, confined, timeout)
            .await
            .map_err(|e| format!("the analyser did not run to the end: {e}"))?;
        let (built, secret) = scanner.scan_built(&finished.stdout.head)?;
        for found in built {
            // One place, one finding: a rule may have read the line whole already.
            if !findings
                .iter()
                .any(|f| f.file == found.file && f.line == found.line && f.rule == found.rule)
            {
                findings.push(found);
            }
        }
        // The text rules' values the gate set finds itself; these only the fold does.
        found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(secret.iter().cloned());
        values.extend(secret);
        let mut args = ["-I", "-B", "-c", scanner::DETECT_SECRETS]
            .map(str::to_owned)
            .to_vec();
        args.extend(read.iter().map(|f: &SkillFile| f.name.clone()));
        let finished = run_confined(ctx, &python, args, None, cwd, confined, timeout)
            .await
            .map_err(|e| format!("detect-secrets did not run to the end: {e}"))?;
        for found in detect_secrets_findings(&finished.stdout.head)? {
            // One place, one finding: kavi's own rule already named it.
            if !findings
                .iter()
                .any(|f| f.file == found.file && f.line == found.line)
            {
                findings.push(found);
            }
        }
    }
    findings.sort_by(|a, b| (&a.file, a.line, a.col).cmp(&(&b.file, b.line, b.col)));
    let detail = findings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    Ok(match Redactor::new(&values).map(|r| r.line_wise()) {
        Some(redactor) => redactor.text(&detail),
        None => detail,
    })
}

/// detect-secrets' baseline (`{"results": {file: [{"type", "line_number", ...}]}}`) as findings:
/// the kind of secret and where, never its hash or value.
fn detect_secrets_findings(stdout: &[u8]) -> Result<Vec<Finding>, String> {
    let answer: serde_json::Value = serde_json::from_slice(stdout)
        .map_err(|e| format!("detect-secrets' answer is not JSON: {e}"))?;
    let results = answer
        .get("results")
        .and_then(serde_json::Value::as_object)
        .ok_or("detect-secrets' answer has no `results`")?;
    let mut findings = Vec::new();
    for (file, found) in results {
        for secret in found.as_array().into_iter().flatten() {
            let kind = secret
                .get("type")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("a secret");
            findings.push(Finding {
                file: file.clone(),
                line: secret
                    .get("line_number")
                    .and_then(serde_json::Value::as_u64)
                    .and_then(|n| usize::try_from(n).ok())
                    .unwrap_or(1),
                col: None,
                rule: "detect-secrets".to_owned(),
                message: format!("{kind} (redacted)"),
                excerpt: String::new(),
            });
        }
    }
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detect_secrets_results_become_findings_without_the_hash() {
        let answer = br#"{"version": "1.5.0", "results": {"skills/a/skill.py": [{"type": "Secret Keyword", "filename": "skills/a/skill.py", "hashed_secret": "0123abcd", "is_verified": false, "line_number": 3}]}}"#;
        let findings = detect_secrets_findings(answer).unwrap();
        assert_eq!(
            findings.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["skills/a/skill.py:3: [detect-secrets] Secret Keyword (redacted)"]
        );
        assert!(detect_secrets_findings(b"not json").is_err());
        assert!(detect_secrets_findings(b"{}").is_err());
    }
}
