//! Pipeline specs: the validated model a pipeline TOML file becomes.
//!
//! Loading happens in two tiers (as ripgrep does with its flags): [`load`] reads the raw TOML,
//! keeping byte spans, and turns it into a [`Pipeline`] whose nodes already hold their parsed
//! kind-specific action. Anything wrong is reported as a [`SpecError`] pointing into the file.

mod cache;
mod document;
mod error;
pub mod governing;
mod load;
mod params;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;
use toml::Spanned;

pub use cache::{CacheSpec, InputPattern, output_path};
#[doc(hidden)]
pub use document::agrees_with_toml;
pub use error::SpecError;
pub use load::{
    LoadContext, RawCommon, RawHeader, RawParam, load_pipeline, load_pipeline_str, load_text,
    read_params, resolve_pipeline_path, resolve_spec_path, spec_in_workspace,
    timeout as deserialize_timeout,
};
pub use params::{ParamDecl, ParamType, parse_set, resolve as resolve_params};

use crate::diagnostic::SourceFile;
use crate::node::NodeAction;

/// A validated pipeline: parameters, nodes in declaration order, and the text that defined them.
#[derive(Debug)]
pub struct Pipeline {
    pub name: String,
    pub description: Option<String>,
    pub source: Arc<SourceFile>,
    /// `sha256:<hex>` of the file text; recorded with every run so a run names its governing spec.
    pub spec_hash: String,
    /// Stop starting new nodes after the first failure (nodes already running finish).
    pub fail_fast: bool,
    /// Limits on the whole run (`[pipeline.budget]`).
    pub budget: Budget,
    /// The concurrency group its runs belong to (`[pipeline] concurrency`).
    pub concurrency: Option<Concurrency>,
    pub params: IndexMap<String, ParamDecl>,
    pub nodes: Vec<NodeSpec>,
    /// The files that govern a run of it (this file, its policies, templates, ...), recorded
    /// with each run.
    pub governing: governing::GoverningSet,
}

impl Pipeline {
    pub fn node(&self, id: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

/// One node: the generic part every kind shares, plus the kind's own parsed action.
#[derive(Debug)]
pub struct NodeSpec {
    pub id: String,
    pub span: Range<usize>,
    pub kind: &'static str,
    /// Whether its kind's attempts call out over HTTP, counted by `[pipeline.budget] http_calls`.
    pub calls_http: bool,
    pub description: Option<String>,
    pub needs: Vec<Spanned<String>>,
    /// A minijinja expression over `params`, `nodes`, `run` and `config`; false skips the node.
    pub when: Option<Spanned<String>>,
    pub timeout: Option<Duration>,
    pub retry: RetryPolicy,
    pub on_failure: OnFailure,
    pub trigger: Trigger,
    /// Variable paths this node's templates read (`nodes.a.outputs`), with where they are read.
    pub reads: Vec<(String, Range<usize>)>,
    /// What makes it up to date: declared when it has `inputs`.
    pub cache: Option<CacheSpec>,
    /// The scripts it declares in `uses` or executes, as governing members' paths: a resumed run
    /// runs it again when one changed.
    pub scripts: Vec<String>,
    /// Runs it once per item (`for_each`).
    pub fan_out: Option<FanOut>,
    /// The concurrency group its attempts belong to (`concurrency`), where it is written.
    pub concurrency: Option<Spanned<Concurrency>>,
    pub action: Arc<dyn NodeAction>,
}

/// A node run once per item of a list, each instance recorded as its own node run, `id[0]`,
/// `id[1]`, ... with its item; what needs it sees the list of their outputs.
#[derive(Debug, Clone)]
pub struct FanOut {
    pub items: ForEach,
    /// Where `for_each` is written in the pipeline file.
    pub span: Range<usize>,
    /// How many instances run at once; `None`: as many as `--jobs` allows.
    pub max_parallel: Option<u32>,
}

/// Where a fan-out's items come from.
#[derive(Debug, Clone)]
pub enum ForEach {
    /// Written in the pipeline (`for_each = ["a", "b"]`).
    Items(Vec<serde_json::Value>),
    /// An expression (inside `{{ }}`) evaluated when the node is ready: a list, or text holding
    /// a JSON array (what a node printed).
    Expression(Spanned<String>),
}

impl FanOut {
    /// The id of the instance at `position`, as the ledger records it.
    pub fn instance_id(node: &str, position: usize) -> String {
        format!("{node}[{position}]")
    }

    /// The node and position an instance id names (`id[2]`), when it names one.
    pub fn instance_of(id: &str) -> Option<(&str, usize)> {
        let (node, rest) = id.strip_suffix(']')?.split_once('[')?;
        let position = rest
            .parse()
            .ok()
            .filter(|_| rest.bytes().all(|b| b.is_ascii_digit()))?;
        Some((node, position))
    }
}

/// How many times a node is tried, which failures are tried again, and how long to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total tries, the first included (1 means no retry).
    pub attempts: u32,
    /// Wait before the second try.
    pub backoff: Duration,
    /// The wait is multiplied by this before each later try.
    pub factor: u32,
    /// The longest wait.
    pub max_backoff: Option<Duration>,
    /// What is retried; empty: every failure.
    pub on: Vec<RetryOn>,
}

/// `[pipeline.budget]`: what one run may spend. When a budget is spent the run stops, failed,
/// with a reason naming it: running nodes are cancelled and nothing more starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Wall-clock time for the whole run.
    #[serde(default, deserialize_with = "load::timeout")]
    #[schemars(with = "Option<String>")]
    pub wall: Option<Duration>,
    /// Node attempts, retries included.
    pub attempts: Option<u32>,
    /// Attempts of the nodes that call out over HTTP (`http`, `advise`).
    pub http_calls: Option<u32>,
}

/// `[pipeline] concurrency`: runs of every pipeline naming `group` are at most `limit` at once
/// on one ledger, across processes. A node's `concurrency` holds its attempts likewise.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Concurrency {
    /// The group's name: letters, digits, `_`, `-` and `.`.
    #[serde(deserialize_with = "load::group_name")]
    pub group: String,
    /// How many of its runs may run at once (default 1: one at a time).
    #[serde(default = "one")]
    pub limit: std::num::NonZeroU32,
    /// What a run that finds the group full does: `queue` (default) waits for a slot, `refuse`
    /// ends at once, `cancel-running` cancels the runs holding it and then waits.
    #[serde(default)]
    pub on_conflict: OnConflict,
}

fn one() -> std::num::NonZeroU32 {
    std::num::NonZeroU32::MIN
}

/// What a run that finds its concurrency group full does.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum OnConflict {
    /// Wait for a run of the group to end.
    #[default]
    Queue,
    /// End at once, starting nothing.
    Refuse,
    /// Cancel the runs holding the group (as Ctrl-C would), then wait for a slot.
    CancelRunning,
}

/// One thing `retry.on` names.
#[derive(Debug, Clone, PartialEq, Eq, schemars::JsonSchema)]
pub enum RetryOn {
    Exit(i64),
    State(crate::state::NodeState),
    /// A failure kind, as a node reports it in its `failure_kind` output (a gate node; a
    /// `pipeline` node whose child run classified its failure).
    Kind(String),
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 1,
            backoff: Duration::ZERO,
            factor: 2,
            max_backoff: None,
            on: Vec::new(),
        }
    }
}

impl RetryPolicy {
    /// The wait before try number `attempt` (2 for the first retry).
    pub fn delay_before(&self, attempt: u32) -> Duration {
        let growths = attempt.saturating_sub(2).min(16);
        let delay = self
            .backoff
            .saturating_mul(self.factor.saturating_pow(growths));
        self.max_backoff.map_or(delay, |max| delay.min(max))
    }

    /// Whether a failed try with this state, exit code and outputs is tried again (attempts
    /// allowing).
    pub fn retries(
        &self,
        state: crate::state::NodeState,
        exit_code: Option<i32>,
        outputs: &serde_json::Value,
    ) -> bool {
        use crate::state::NodeState;
        if !matches!(state, NodeState::Failed | NodeState::TimedOut) {
            return false;
        }
        self.on.is_empty()
            || self.on.iter().any(|on| match on {
                RetryOn::Exit(code) => exit_code.map(i64::from) == Some(*code),
                RetryOn::State(named) => state == *named,
                RetryOn::Kind(kind) => outputs["failure_kind"].as_str() == Some(kind.as_str()),
            })
    }
}

/// When a node runs, given how its dependencies ended.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Only when every dependency succeeded (or was skipped): the default.
    Success,
    /// Only when some dependency did not succeed: a failure handler. Otherwise skipped.
    Failure,
    /// Whatever its dependencies did: cleanup.
    Always,
}

/// What a node's failure does to the nodes that need it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Dependants are blocked and the run fails.
    Stop,
    /// The failure is recorded, dependants run anyway, and the run does not fail because of it.
    Continue,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_id_names_its_node_and_position() {
        assert_eq!(
            FanOut::instance_of(&FanOut::instance_id("fan", 12)),
            Some(("fan", 12))
        );
        for id in ["fan", "fan[]", "fan[+1]", "fan[1]x", "fan[a]"] {
            assert_eq!(FanOut::instance_of(id), None, "{id}");
        }
    }

    #[test]
    fn backoff_doubles_from_the_second_retry() {
        let retry = RetryPolicy {
            attempts: 4,
            backoff: Duration::from_millis(100),
            ..RetryPolicy::default()
        };
        assert_eq!(retry.delay_before(2), Duration::from_millis(100));
        assert_eq!(retry.delay_before(3), Duration::from_millis(200));
        assert_eq!(retry.delay_before(4), Duration::from_millis(400));
    }

    #[test]
    fn the_backoff_grows_by_its_factor_up_to_its_cap() {
        let policy = RetryPolicy {
            attempts: 5,
            backoff: Duration::from_secs(1),
            factor: 3,
            max_backoff: Some(Duration::from_secs(5)),
            on: Vec::new(),
        };
        let delays: Vec<u64> = (2..=5).map(|a| policy.delay_before(a).as_secs()).collect();
        assert_eq!(delays, [1, 3, 5, 5]);
        let constant = RetryPolicy {
            factor: 1,
            max_backoff: None,
            ..policy
        };
        assert_eq!(constant.delay_before(5), Duration::from_secs(1));
    }
}
