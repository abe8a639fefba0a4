//! Proof that tests ran: a test gate with `junit` passes on pytest's JUnit report, never on its
//! exit status alone.
//!
//! kavi has pytest write the report into a fresh folder of its own inside the gate's private
//! temporary folder (the only place the confined process may write), loads its witness
//! (`witness.py`) with autoloaded plugins off, and then requires: the report exists and parses
//! as one document; it carries the witness's properties with this run's nonce; the number of
//! test cases equals what pytest collected, nothing was deselected, and each test function the
//! test files declare is among them; at least `min_tests`; none failed or erred; no more
//! skipped than allowed; the test framework (its modules, the classes pytest runs a test
//! through, each test item) was not replaced at run time and no plugin was registered once tests
//! began to load; every test not skipped had its test function entered while pytest ran it; and
//! the process exited 0, in agreement with the report.
//!
//! Limits: the tests run in pytest's own process, which must write the report, so code in a test
//! can find the report's path and the witness and forge both (kavi reads the nonce from a file
//! the witness removes, but it stays in the process's memory). What this catches is every
//! ordinary way to end early or hide a failure (`os._exit(0)`, `sys.exit` at import, an
//! `atexit` hook forcing the status, a patched assertion, skipped or deselected tests, a report
//! overwritten without the witness's mark); a forgery aimed at kavi itself is for the policy
//! scanner and review to catch.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::policy::gates::JunitSpec;

const WITNESS: &str = include_str!("witness.py");

/// The witness's module name, as `-p` loads it.
const WITNESS_MODULE: &str = "kavi_witness";

/// One run's report folder and what pytest is given to fill it.
pub struct Prepared {
    pub report: PathBuf,
    nonce: String,
    /// Arguments kavi adds to the gate's argv.
    pub args: Vec<String>,
    /// Variables kavi adds to the gate's environment.
    pub env: Vec<(String, String)>,
    /// Where coverage.py writes its JSON report, when the gate measures branch coverage.
    coverage: Option<PathBuf>,
    _folder: kavi_foundation::sandbox::PrivateFolder,
}

/// The bytes of a file the tests' process could have replaced: only a regular file is read, never
/// what a link put in its place leads to (a file of the host's, or kavi's own environment), and
/// never a FIFO that would keep kavi waiting.
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut crate::files::open_regular(path)?, &mut bytes)?;
    Ok(bytes)
}

/// coverage.py's configuration, kavi's own (no `.coveragerc`, `setup.cfg` or `pyproject.toml`
/// is read): branches measured, the data file in the report folder, the tests themselves left
/// out of what is measured, and no line or branch excluded: coverage.py's default exclusions
/// (`# pragma: no cover`, `# pragma: no branch`) are comments in the code under review, which
/// may not decide what its tests must take.
const COVERAGE_RC: &str = "[run]\nbranch = True\ndata_file = {data}\nomit = */test_*.py\n\n\
[report]\nexclude_lines =\npartial_branches =\n";

/// Makes the report folder inside `tmp` (the gate's write scope), with the witness and its
/// nonce; with `measured` (the folder whose code is measured), coverage.py through pytest-cov
/// too, configured by kavi alone.
pub fn prepare(tmp: &Path, measured: Option<&Path>) -> Result<Prepared, String> {
    let folder = kavi_foundation::sandbox::private_folder(tmp, "kavi-junit-")
        .map_err(|e| format!("failed to make the test report's folder: {e}"))?;
    let witness = folder.path().join("witness");
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    std::fs::create_dir(&witness)
        .and_then(|()| std::fs::write(witness.join(format!("{WITNESS_MODULE}.py")), WITNESS))
        .and_then(|()| std::fs::write(witness.join("nonce"), &nonce))
        .map_err(|e| format!("failed to write kavi's pytest witness: {e}"))?;
    let report = folder.path().join("report.xml");
    let mut args = vec![
        "-p".to_owned(),
        WITNESS_MODULE.to_owned(),
        format!("--junitxml={}", report.display()),
    ];
    let coverage = match measured {
        None => None,
        Some(measured) => {
            let rc = folder.path().join("coveragerc");
            let data = folder.path().join("coverage.data");
            std::fs::write(
                &rc,
                COVERAGE_RC.replace("{data}", &data.display().to_string()),
            )
            .map_err(|e| format!("failed to write kavi's coverage configuration: {e}"))?;
            let json = folder.path().join("coverage.json");
            args.extend([
                "-p".to_owned(),
                "pytest_cov.plugin".to_owned(),
                format!("--cov={}", measured.display()),
                "--cov-branch".to_owned(),
                format!("--cov-config={}", rc.display()),
                format!("--cov-report=json:{}", json.display()),
            ]);
            Some(json)
        }
    };
    Ok(Prepared {
        args,
        coverage,
        env: vec![
            ("PYTHONPATH".to_owned(), witness.display().to_string()),
            // Only the plugins the policy names (`-p`) load, never whatever is installed.
            ("PYTEST_DISABLE_PLUGIN_AUTOLOAD".to_owned(), "1".to_owned()),
        ],
        report,
        nonce,
        _folder: folder,
    })
}

impl Prepared {
    /// The test the witness saw start last, if any: the one that hung when the gate timed out.
    pub fn running(&self) -> Option<String> {
        let bytes = read_regular(&self._folder.path().join("running")).ok()?;
        let text: String = String::from_utf8_lossy(&bytes)
            .trim()
            .chars()
            .take(300)
            .collect();
        (!text.is_empty()).then_some(text)
    }
}

/// What the report says, once judged sound: the counts recorded with the result.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub collected: usize,
    pub tests: usize,
    pub passed: usize,
    pub failed: usize,
    pub errors: usize,
    pub skipped: usize,
    /// Branches taken and branches in all, where the gate measures branch coverage.
    pub branches: Option<(u64, u64)>,
    /// Statements run and statements in all, where the gate measures line coverage.
    pub lines: Option<(u64, u64)>,
}

impl Counts {
    pub fn record(&self) -> serde_json::Value {
        let mut record = json!({
            "collected": self.collected,
            "tests": self.tests,
            "passed": self.passed,
            "failed": self.failed,
            "errors": self.errors,
            "skipped": self.skipped,
        });
        if let Some((covered, branches)) = self.branches {
            record["branches"] = json!({ "covered": covered, "total": branches });
        }
        if let Some((run, lines)) = self.lines {
            record["lines"] = json!({ "covered": run, "total": lines });
        }
        record
    }

    pub fn summary(&self) -> String {
        let mut summary = format!(
            "{} collected, {} ran: {} passed, {} failed, {} errors, {} skipped",
            self.collected, self.tests, self.passed, self.failed, self.errors, self.skipped
        );
        if let Some((covered, branches)) = self.branches {
            summary.push_str(&format!("; {covered} of {branches} branches taken"));
        }
        if let Some((run, lines)) = self.lines {
            summary.push_str(&format!("; {run} of {lines} lines run"));
        }
        summary
    }
}

/// Why a test gate fails on its report: a named reason and what it saw.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub detail: String,
    pub counts: Option<Box<Counts>>,
}

fn refuse(reason: &'static str, detail: impl Into<String>) -> Refusal {
    Refusal {
        reason,
        detail: detail.into(),
        counts: None,
    }
}

/// The test functions `text` declares (`def test…` at any depth), by name.
pub fn declared_tests(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("async ").map_or(line, str::trim_start);
            let name = line.strip_prefix("def ")?.trim_start();
            let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
            name[..end]
                .starts_with("test")
                .then(|| name[..end].to_owned())
        })
        .collect()
}

/// Judges the report `prepared` asked for, after pytest exited with `exit` (`None`: it did not
/// exit by itself). `declared` are the test functions of the gate's files.
pub fn judge(
    prepared: &Prepared,
    spec: &JunitSpec,
    exit: Option<i32>,
    declared: &BTreeSet<String>,
) -> Result<Counts, Refusal> {
    let text = match read_regular(&prepared.report) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(refuse(
                "no_report",
                format!(
                    "pytest wrote no report{}: the process ended before its session did \
                     (`os._exit`, a crash or a kill), so no test is known to have run{}",
                    exit.map(|code| format!(" yet exited with code {code}"))
                        .unwrap_or_default(),
                    prepared
                        .running()
                        .map(|test| format!("; the last test started was {test}"))
                        .unwrap_or_default()
                ),
            ));
        }
        Err(e) => {
            return Err(refuse(
                "no_report",
                format!("the report is unreadable: {e}"),
            ));
        }
    };
    let counts = judge_text(&text, &prepared.nonce, spec, exit, declared)?;
    match &prepared.coverage {
        Some(json) if spec.measures_coverage() => judge_coverage(json, spec, counts),
        _ => Ok(counts),
    }
}

/// Every test passed; the branches they took and the lines they ran must be at least the
/// policy's shares of the measured code's, by coverage.py's JSON report. Branches are judged
/// first: an untaken branch names where a decision was left untested.
fn judge_coverage(json: &Path, spec: &JunitSpec, mut counts: Counts) -> Result<Counts, Refusal> {
    let refused = |reason, detail: String, counts| Refusal {
        reason,
        detail,
        counts: Some(Box::new(counts)),
    };
    let report: serde_json::Value = match read_regular(json) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            refused(
                "no_coverage_report",
                format!("the coverage report cannot be read: {e}"),
                counts,
            )
        })?,
        Err(e) => {
            return Err(refused(
                "no_coverage_report",
                format!("coverage.py wrote no report ({e}): no line is known to have run"),
                counts,
            ));
        }
    };
    let files = report["files"].as_object();
    let totals = &report["totals"];
    let total = |key: &str| totals[key].as_u64().unwrap_or(0);
    // The part that meets `minimum` percent of `all`; nothing at all leaves nothing untested.
    let enough =
        |part: u64, all: u64, minimum: u8| all == 0 || part * 100 >= u64::from(minimum) * all;
    if let Some(minimum) = spec.branch_coverage {
        let (covered, branches) = (total("covered_branches"), total("num_branches"));
        counts.branches = Some((covered, branches));
        if !enough(covered, branches, minimum) {
            let mut missing = Vec::new();
            for (file, data) in files.into_iter().flatten() {
                for pair in data["missing_branches"].as_array().into_iter().flatten() {
                    let (from, to) = (&pair[0], &pair[1]);
                    // coverage.py marks a branch that leaves the function with a negative line.
                    let to = match to.as_i64() {
                        Some(line) if line < 0 => "exit".to_owned(),
                        _ => to.to_string(),
                    };
                    missing.push(format!("{file}:{from}->{to}"));
                }
            }
            return Err(refused(
                "branch_coverage",
                format!(
                    "the tests took {covered} of {branches} branches ({}%), the policy requires \
                     {minimum}%; never taken: {}",
                    covered * 100 / branches,
                    missing.join(", ")
                ),
                counts,
            ));
        }
    }
    if let Some(minimum) = spec.line_coverage {
        let (run, lines) = (total("covered_lines"), total("num_statements"));
        counts.lines = Some((run, lines));
        if !enough(run, lines, minimum) {
            let missing: Vec<String> = files
                .into_iter()
                .flatten()
                .flat_map(|(file, data)| {
                    data["missing_lines"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(move |line| format!("{file}:{line}"))
                })
                .collect();
            return Err(refused(
                "line_coverage",
                format!(
                    "the tests ran {run} of {lines} lines ({}%), the policy requires {minimum}%; \
                     never run: {}",
                    run * 100 / lines,
                    missing.join(", ")
                ),
                counts,
            ));
        }
    }
    Ok(counts)
}

fn judge_text(
    text: &str,
    nonce: &str,
    spec: &JunitSpec,
    exit: Option<i32>,
    declared: &BTreeSet<String>,
) -> Result<Counts, Refusal> {
    let doc = roxmltree::Document::parse(text).map_err(|e| {
        refuse(
            "incomplete_report",
            format!(
                "the report is not one complete XML document (cut short or written twice): {e}"
            ),
        )
    })?;
    let property = |name: &str| {
        doc.descendants()
            .filter(|n| n.has_tag_name("property") && n.attribute("name") == Some(name))
            .map(|n| n.attribute("value").unwrap_or_default())
            .collect::<Vec<_>>()
    };
    let nonces = property("kavi_nonce");
    if nonces.len() != 1 || nonces[0] != nonce {
        return Err(refuse(
            "forged_report",
            "the report does not carry this run's mark from kavi's witness: it was written or \
             rewritten by something other than this run's pytest",
        ));
    }
    let one = |name: &str| {
        property(name)
            .first()
            .copied()
            .unwrap_or_default()
            .to_owned()
    };
    let mut counts = Counts::default();
    let mut failures = Vec::new();
    let mut ran = BTreeSet::new();
    for case in doc.descendants().filter(|n| n.has_tag_name("testcase")) {
        counts.tests += 1;
        let name = case.attribute("name").unwrap_or_default();
        let full = match case.attribute("classname") {
            Some(class) if !class.is_empty() => format!("{class}.{name}"),
            _ => name.to_owned(),
        };
        ran.insert(name.split('[').next().unwrap_or_default().to_owned());
        let outcome = case.children().find(|c| {
            c.has_tag_name("failure") || c.has_tag_name("error") || c.has_tag_name("skipped")
        });
        match outcome {
            None => counts.passed += 1,
            Some(node) => {
                let message = node
                    .attribute("message")
                    .unwrap_or_default()
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect::<String>();
                match node.tag_name().name() {
                    "skipped" => counts.skipped += 1,
                    tag => {
                        if tag == "failure" {
                            counts.failed += 1;
                        } else {
                            counts.errors += 1;
                        }
                        failures.push(format!("{full} {tag}: {message}"));
                    }
                }
            }
        }
    }
    counts.collected = one("kavi_collected").parse().unwrap_or(usize::MAX);
    let counted = |counts: Counts, reason, detail: String| Refusal {
        reason,
        detail,
        counts: Some(Box::new(counts)),
    };
    if !failures.is_empty() {
        let reason = if failures.iter().any(|f| f.contains("Timeout (>")) {
            "test_timed_out"
        } else {
            "tests_failed"
        };
        return Err(counted(counts, reason, failures.join("\n")));
    }
    let replaced = one("kavi_replaced");
    if !replaced.trim().is_empty() {
        return Err(counted(
            counts,
            "framework_replaced",
            format!("the tests replaced parts of the test framework while they ran: {replaced}"),
        ));
    }
    let plugins = one("kavi_plugins");
    if !plugins.trim().is_empty() {
        return Err(counted(
            counts,
            "framework_replaced",
            format!(
                "plugins were registered once the tests began to load, so hooks kavi did not \
                 choose ran with them: {plugins}"
            ),
        ));
    }
    let not_run = one("kavi_not_run");
    if !not_run.trim().is_empty() {
        return Err(counted(
            counts,
            "tests_not_run",
            format!(
                "pytest reported these tests without their test function having been entered \
                 while it ran them: {not_run}"
            ),
        ));
    }
    let swallowed = one("kavi_swallowed");
    if !swallowed.trim().is_empty() {
        return Err(counted(
            counts,
            "assertion_swallowed",
            format!(
                "these tests passed although an assertion failed while they ran (what it raised \
                 was caught and hidden): {swallowed}"
            ),
        ));
    }
    if one("kavi_optimized") != "0" {
        return Err(counted(
            counts,
            "asserts_off",
            "Python ran optimized (-O): `assert` statements did not run".to_owned(),
        ));
    }
    if counts.collected == usize::MAX {
        return Err(counted(
            counts,
            "not_collected",
            "pytest's session ended before it finished collecting tests".to_owned(),
        ));
    }
    let deselected: usize = one("kavi_deselected").parse().unwrap_or(0);
    if deselected > 0 || counts.collected != counts.tests {
        return Err(counted(
            counts,
            "tests_not_run",
            format!(
                "pytest collected {} tests{} but the report holds {}",
                counts.collected,
                if deselected > 0 {
                    format!(" and deselected {deselected}")
                } else {
                    String::new()
                },
                counts.tests
            ),
        ));
    }
    let missing: Vec<&str> = declared
        .iter()
        .filter(|name| !ran.contains(*name))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(counted(
            counts,
            "tests_not_run",
            format!(
                "the test files declare tests that did not run: {}",
                missing.join(", ")
            ),
        ));
    }
    if counts.tests < spec.min_tests as usize {
        return Err(counted(
            counts,
            "too_few_tests",
            format!(
                "{} tests ran; the gate set requires at least {} (`min_tests`)",
                counts.tests, spec.min_tests
            ),
        ));
    }
    if counts.skipped > spec.allow_skipped as usize {
        let detail = format!(
            "{} of {} tests were skipped; the gate set allows {} (`allow_skipped`)",
            counts.skipped, counts.tests, spec.allow_skipped
        );
        return Err(counted(counts, "tests_skipped", detail));
    }
    let status = one("kavi_exitstatus");
    match exit {
        Some(0) if status == "0" => Ok(counts),
        Some(code) => {
            let detail = format!(
                "pytest's session ended with status {status:?} but the process exited with code \
                 {code}: something outside pytest decided the exit status"
            );
            Err(counted(counts, "exit_mismatch", detail))
        }
        None => Err(counted(
            counts,
            "exit_mismatch",
            "the process did not exit by itself".to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: JunitSpec = JunitSpec {
        min_tests: 1,
        allow_skipped: 0,
        branch_coverage: None,
        line_coverage: None,
    };

    fn report(props: &[(&str, &str)], cases: &str) -> String {
        let props: String = props
            .iter()
            .map(|(n, v)| format!("<property name=\"{n}\" value=\"{v}\" />"))
            .collect();
        format!(
            "<?xml version=\"1.0\"?><testsuites><testsuite name=\"pytest\"><properties>{props}\
             </properties>{cases}</testsuite></testsuites>"
        )
    }

    fn sound(collected: &str) -> Vec<(&'static str, String)> {
        vec![
            ("kavi_nonce", "n1".to_owned()),
            ("kavi_collected", collected.to_owned()),
            ("kavi_deselected", "0".to_owned()),
            ("kavi_replaced", String::new()),
            ("kavi_plugins", String::new()),
            ("kavi_not_run", String::new()),
            ("kavi_swallowed", String::new()),
            ("kavi_optimized", "0".to_owned()),
            ("kavi_exitstatus", "0".to_owned()),
        ]
    }

    fn judge_with(
        props: &[(&'static str, String)],
        cases: &str,
        exit: Option<i32>,
    ) -> Result<Counts, Refusal> {
        let props: Vec<(&str, &str)> = props.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let declared = declared_tests("def test_a(): pass\n");
        judge_text(&report(&props, cases), "n1", &SPEC, exit, &declared)
    }

    const PASSED: &str = "<testcase classname=\"test_skill\" name=\"test_a\" />";

    fn reason(result: Result<Counts, Refusal>) -> &'static str {
        result.unwrap_err().reason
    }

    #[test]
    fn a_complete_passing_report_with_exit_zero_passes_with_its_counts() {
        let counts = judge_with(&sound("1"), PASSED, Some(0)).unwrap();
        assert_eq!((counts.collected, counts.tests, counts.passed), (1, 1, 1));
    }

    #[test]
    fn every_way_a_report_falls_short_is_named() {
        let with = |name: &'static str, value: &str| {
            let mut props = sound("1");
            props.retain(|(n, _)| *n != name);
            props.push((name, value.to_owned()));
            props
        };
        assert_eq!(
            reason(judge_with(&with("kavi_nonce", "x"), PASSED, Some(0))),
            "forged_report"
        );
        assert_eq!(
            reason(judge_with(
                &with("kavi_replaced", "unittest.TestCase.assertEqual"),
                PASSED,
                Some(0)
            )),
            "framework_replaced"
        );
        assert_eq!(
            reason(judge_with(
                &with("kavi_plugins", "skill_plugin"),
                PASSED,
                Some(0)
            )),
            "framework_replaced"
        );
        assert_eq!(
            reason(judge_with(
                &with("kavi_not_run", "test_skill.py::test_a"),
                PASSED,
                Some(0)
            )),
            "tests_not_run"
        );
        assert_eq!(
            reason(judge_with(
                &with("kavi_swallowed", "test_skill.py::T::test_a"),
                PASSED,
                Some(0)
            )),
            "assertion_swallowed"
        );
        assert_eq!(
            reason(judge_with(&with("kavi_collected", "2"), PASSED, Some(0))),
            "tests_not_run"
        );
        assert_eq!(
            reason(judge_with(&with("kavi_deselected", "1"), PASSED, Some(0))),
            "tests_not_run"
        );
        assert_eq!(
            reason(judge_with(&with("kavi_exitstatus", "1"), PASSED, Some(0))),
            "exit_mismatch"
        );
        assert_eq!(
            reason(judge_with(&sound("1"), PASSED, Some(1))),
            "exit_mismatch"
        );
        assert_eq!(
            reason(judge_with(&sound("0"), "", Some(0))),
            "tests_not_run"
        );
        assert_eq!(
            reason(judge_with(
                &sound("1"),
                "<testcase name=\"test_a\"><skipped message=\"no\" /></testcase>",
                Some(0)
            )),
            "tests_skipped"
        );
        let failed = judge_with(
            &sound("1"),
            "<testcase classname=\"test_skill.T\" name=\"test_a\"><failure message=\"Failed: Timeout (&gt;20.0s) from pytest-timeout.\" /></testcase>",
            Some(1),
        )
        .unwrap_err();
        assert_eq!(failed.reason, "test_timed_out");
        assert!(
            failed
                .detail
                .contains("test_skill.T.test_a failure: Failed: Timeout")
        );
        let cut = report(&[("kavi_nonce", "n1")], PASSED);
        assert_eq!(
            reason(judge_text(
                &cut[..cut.len() - 10],
                "n1",
                &SPEC,
                Some(0),
                &BTreeSet::new()
            )),
            "incomplete_report"
        );
        assert_eq!(
            reason(judge_text(
                &format!("{cut}{cut}"),
                "n1",
                &SPEC,
                Some(0),
                &BTreeSet::new()
            )),
            "incomplete_report"
        );
    }

    #[test]
    fn a_declared_test_missing_from_the_report_and_too_few_tests_fail() {
        let declared =
            declared_tests("def test_a(): pass\nclass T:\n    async def test_b(self): pass\n");
        assert_eq!(declared.len(), 2);
        let props: Vec<(&str, String)> = sound("1");
        let props: Vec<(&str, &str)> = props.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let result = judge_text(&report(&props, PASSED), "n1", &SPEC, Some(0), &declared);
        let refusal = result.unwrap_err();
        assert_eq!(refusal.reason, "tests_not_run");
        assert!(refusal.detail.contains("test_b"));
        let two = JunitSpec {
            min_tests: 2,
            allow_skipped: 0,
            branch_coverage: None,
            line_coverage: None,
        };
        let result = judge_text(
            &report(&props, PASSED),
            "n1",
            &two,
            Some(0),
            &BTreeSet::new(),
        );
        assert_eq!(reason(result), "too_few_tests");
    }

    /// A report as coverage.py 7 writes it: every branch taken, one function never called.
    const COVERAGE: &str = r#"{"files": {"skills/demo/skill.py": {"missing_lines": [11, 12],
        "missing_branches": []}}, "totals": {"covered_lines": 6, "num_statements": 8,
        "covered_branches": 2, "num_branches": 2}}"#;

    #[test]
    fn lines_no_test_runs_fail_line_coverage_though_every_branch_was_taken() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("coverage.json");
        std::fs::write(&json, COVERAGE).unwrap();
        let spec = |branch_coverage, line_coverage| JunitSpec {
            branch_coverage,
            line_coverage,
            ..SPEC
        };
        let counts = judge_coverage(&json, &spec(Some(100), None), Counts::default()).unwrap();
        assert_eq!(counts.branches, Some((2, 2)));
        assert_eq!(counts.lines, None);
        let refusal =
            judge_coverage(&json, &spec(Some(100), Some(100)), Counts::default()).unwrap_err();
        assert_eq!(refusal.reason, "line_coverage");
        assert_eq!(
            refusal.detail,
            "the tests ran 6 of 8 lines (75%), the policy requires 100%; never run: \
             skills/demo/skill.py:11, skills/demo/skill.py:12"
        );
        let counts = judge_coverage(&json, &spec(None, Some(75)), Counts::default()).unwrap();
        assert_eq!(counts.lines, Some((6, 8)));
        assert!(
            counts.summary().ends_with("; 6 of 8 lines run"),
            "{}",
            counts.summary()
        );
    }
}
