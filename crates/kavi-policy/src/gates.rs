//! `policies/gates.toml`: the gate set, as written.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GateSet {
    /// How long a command gate may run unless it says otherwise (default [`DEFAULT_TIMEOUT`]).
    #[serde(default, deserialize_with = "crate::spec::deserialize_timeout")]
    #[schemars(with = "Option<String>")]
    pub timeout: Option<Duration>,
    /// Which failure kind names an attempt when several required gates fail: the first listed;
    /// kinds not listed come after, in the order of their gates.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub precedence: Vec<Spanned<String>>,
    /// The policy declaring the toolchains gates name (default `policies/toolchains.toml`).
    #[schemars(with = "Option<String>")]
    pub toolchains: Option<Spanned<String>>,
    /// The suppressions the code under review may use, which kavi's check would otherwise fail.
    #[serde(default)]
    pub suppressions: SuppressionPolicy,
    #[serde(rename = "gate")]
    pub gates: Vec<GateSpec>,
}

/// A command gate's time limit when neither it nor its set names one: no gate may hang a run,
/// and three attempts whose gates all hang still end within five minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);

/// `[suppressions]`: which suppressions the code under review may use, of those kavi looks for
/// before a gate's tool runs. Each allowed one found is listed in the gate's result; any other
/// fails the gate that looks for it.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SuppressionPolicy {
    /// Kinds of suppression allowed: `file_noqa`, `mypy_inline_config`, `module_type_ignore`,
    /// `no_type_check`, `line_noqa`, `line_type_ignore`.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub allow: Vec<Spanned<String>>,
}

/// `junit`: how a test gate's JUnit report is judged.
#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JunitSpec {
    /// The fewest tests the report may hold (default 1): a test file with none fails.
    #[serde(default = "one")]
    pub min_tests: u32,
    /// How many skipped (or expected-to-fail) tests the report may hold (default 0).
    #[serde(default)]
    pub allow_skipped: u32,
    /// The least share of the skill's branches (percent, 0 to 100) the tests must take, measured
    /// by coverage.py (the toolchain's `coverage` and `pytest-cov`) with kavi's configuration;
    /// unset: not measured.
    #[schemars(range(max = 100))]
    pub branch_coverage: Option<u8>,
    /// The least share of the skill's statements (percent, 0 to 100) the tests must run,
    /// measured as `branch_coverage` is; unset: not measured. A function no test calls has
    /// no branch, so only this finds it.
    #[schemars(range(max = 100))]
    pub line_coverage: Option<u8>,
}

impl JunitSpec {
    /// The coverage thresholds that are set, by name.
    pub fn coverage_thresholds(&self) -> impl Iterator<Item = (&'static str, u8)> {
        [
            ("branch_coverage", self.branch_coverage),
            ("line_coverage", self.line_coverage),
        ]
        .into_iter()
        .filter_map(|(name, percent)| percent.map(|percent| (name, percent)))
    }

    /// Whether coverage.py measures the tests' run.
    pub fn measures_coverage(&self) -> bool {
        self.coverage_thresholds().next().is_some()
    }
}

fn one() -> u32 {
    1
}

/// The failure kind of a gate that ran past its time limit.
pub const TIMEOUT_KIND: &str = "TIMEOUT";

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum GateKind {
    Command,
    PolicyScan,
    SecretScan,
    Invariant,
    /// Runs the skill against its proposal's `examples`, as `kavi skill run` would.
    Contract,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GateSpec {
    #[schemars(with = "String")]
    pub id: Spanned<String>,
    pub kind: GateKind,
    /// `command`: the argv, each element a template over the node's `vars`.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub run: Vec<Spanned<String>>,
    /// `command`: the declared toolchain whose environment runs `run`'s program, which must be
    /// one of its tools. Without it, the program is found on PATH. `policy_scan`: the toolchain
    /// whose interpreter parses the skill's Python files (required). `secret_scan`: the
    /// toolchain whose `detect-secrets` scans beside kavi's own secret rules (optional).
    #[schemars(with = "Option<String>")]
    pub toolchain: Option<Spanned<String>>,
    /// `policy_scan` and `secret_scan`: the scanner policy; `invariant`: the invariants policy.
    #[schemars(with = "Option<String>")]
    pub rules: Option<Spanned<String>>,
    /// `policy_scan` and `secret_scan`: the files to scan, a folder meaning every file in it;
    /// `command`: the files kavi checks for `suppressions`. Templates over `vars`.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub files: Vec<Spanned<String>>,
    /// The failure kind a failure of this gate is classified as.
    #[schemars(with = "String")]
    pub failure: Spanned<String>,
    #[serde(default = "yes")]
    pub required: bool,
    /// `command`, `policy_scan`, `secret_scan`, `contract` (each example's run): how long it may run before its process group is killed and it is recorded
    /// `timed_out` (failure kind TIMEOUT).
    #[serde(default, deserialize_with = "crate::spec::deserialize_timeout")]
    #[schemars(with = "Option<String>")]
    pub timeout: Option<Duration>,
    pub description: Option<String>,
    /// `command`: the kinds of suppression kavi looks for in `files` before the tool runs; one
    /// that `[suppressions]` does not allow fails the gate (the tools catch the others
    /// themselves, by the rules of their kavi-owned configuration).
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub suppressions: Vec<Spanned<String>>,
    /// `command` running pytest: kavi has pytest write a JUnit report where kavi reads it, loads
    /// its witness, and passes the gate only on a complete report in which every collected test
    /// ran and passed, as many as `min_tests` at least, with no more skipped than allowed.
    pub junit: Option<JunitSpec>,
    /// `contract`: the fewest `[[examples]]` a proposal may declare (default 0); a proposal with
    /// fewer fails the gate, since a contract of no example checks nothing.
    pub min_examples: Option<usize>,
}

fn yes() -> bool {
    true
}
