//! `kavi pipeline run --junit FILE`: the recorded run as JUnit XML, in nextest's shape, for CI
//! systems that show test results: the run is a test suite, each node a test case (its last
//! attempt; earlier ones are its reruns), skipped and blocked nodes are skipped, not passed.

use std::path::Path;
use std::time::Duration;

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestRerun, TestSuite};

use crate::error::Error;
use crate::ledger::{NodeRunRow, RunDetail};
use crate::state::NodeState;

/// Writes `detail` as a JUnit report into `path`.
pub fn write(detail: &RunDetail, path: &Path) -> Result<(), Error> {
    let io = |source| Error::Io {
        context: format!("failed to write the JUnit report {}", path.display()),
        source,
    };
    let xml = report(detail)
        .to_string()
        .map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(path, xml).map_err(io)
}

fn report(detail: &RunDetail) -> Report {
    let run = &detail.run;
    let mut suite = TestSuite::new(run.pipeline.as_str());
    suite.add_property(("run_id", run.id.to_string().as_str()));
    suite.add_property(("status", run.status.as_str()));
    suite.add_property(("spec_hash", run.spec_hash.as_str()));
    if let Some(ms) = run.duration_ms {
        suite.set_time(millis(ms));
    }
    // The ledger lists a node's attempts together, in order: the last is the node's result.
    let mut earlier: Vec<&NodeRunRow> = Vec::new();
    for (i, node) in detail.nodes.iter().enumerate() {
        let last = detail
            .nodes
            .get(i + 1)
            .is_none_or(|next| next.node_id != node.node_id);
        if last {
            suite.add_test_case(test_case(&run.pipeline, node, &earlier));
            earlier.clear();
        } else {
            earlier.push(node);
        }
    }
    let mut report = Report::new("kavi");
    if let Some(ms) = run.duration_ms {
        report.set_time(millis(ms));
    }
    report.add_test_suite(suite);
    report
}

/// One node's test case: `last` is its result, `earlier` its attempts before, oldest first.
fn test_case(pipeline: &str, last: &NodeRunRow, earlier: &[&NodeRunRow]) -> TestCase {
    let mut status = match last.state {
        state if state.is_success() => TestCaseStatus::success(),
        NodeState::Failed | NodeState::TimedOut | NodeState::Interrupted => {
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
            status.set_type(last.state.as_str());
            if let Some(error) = &last.error {
                status.set_message(error.as_str());
            }
            status
        }
        // Skipped, blocked, cancelled, awaiting review: it did not pass, and did not fail.
        state => {
            let mut status = TestCaseStatus::skipped();
            status.set_type(state.as_str());
            let why = last.reason.as_ref().or(last.error.as_ref());
            status.set_message(why.map_or(state.as_str(), String::as_str));
            status
        }
    };
    for attempt in earlier {
        let mut rerun = TestRerun::new(NonSuccessKind::Failure);
        rerun.set_type(attempt.state.as_str());
        if let Some(error) = &attempt.error {
            rerun.set_message(error.as_str());
        }
        if let Some(ms) = attempt.duration_ms {
            rerun.set_time(millis(ms));
        }
        status.add_rerun(rerun);
    }
    let mut case = TestCase::new(last.node_id.as_str(), status);
    case.set_classname(format!("{pipeline}.{}", last.kind));
    if let Some(ms) = last.duration_ms {
        case.set_time(millis(ms));
    }
    // What the node's process wrote, as the ledger kept it (secrets hidden), where CI shows it.
    let written = |stream| last.outputs.as_ref()?.get(stream)?.as_str();
    if let Some(text) = written("stdout").filter(|t| !t.is_empty()) {
        case.set_system_out(text);
    }
    if let Some(text) = written("stderr").filter(|t| !t.is_empty()) {
        case.set_system_err(text);
    }
    case
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}
