//! The raw shapes a pipeline's header and node tables deserialize into, and the checks of
//! their fields (durations, `retry.on`).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::node::NodeConfig;
use crate::spec::params::ParamType;
use crate::spec::{Budget, Concurrency, OnFailure, RetryOn, Trigger};
use crate::state::NodeState;

/// Fields every node has, whatever its kind.
pub(super) const COMMON_FIELDS: &[&str] = &[
    "kind",
    "description",
    "needs",
    "when",
    "timeout",
    "retry",
    "on_failure",
    "trigger",
    "inputs",
    "outputs",
    "cache",
    "uses",
    "for_each",
    "max_parallel",
    "concurrency",
];

// A pipeline's header: its `[params]` are read apart, one at a time, so that each broken one is
// reported (`read_params`), and its `[nodes]` one by one.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHeader {
    /// The pipeline's name and run-wide settings.
    pub(super) pipeline: RawPipelineSection,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPipelineSection {
    /// The pipeline's name, as runs record it.
    pub(super) name: String,
    /// What it is for, shown by `kavi pipeline list`.
    pub(super) description: Option<String>,
    /// Stop starting nodes once one fails (running ones finish).
    #[serde(default)]
    pub(super) fail_fast: bool,
    /// Limits on the whole run: wall time, node attempts, HTTP calls.
    #[serde(default)]
    pub(super) budget: Budget,
    /// A group whose runs, of this pipeline and any other naming it, are at most `limit` at
    /// once on the ledger, and what a run that finds it full does.
    pub(super) concurrency: Option<Concurrency>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawParam {
    /// `string`, `integer`, `float`, `boolean` or `list` (a TOML array; `--set` takes a JSON
    /// array or words between commas).
    #[serde(rename = "type")]
    pub(super) ty: ParamType,
    /// The value when `--set` does not give one; without one, the parameter is required.
    #[schemars(with = "Option<serde_json::Value>")]
    pub(super) default: Option<Spanned<toml::Value>>,
    /// Say `true` to make a parameter without a default explicitly required.
    #[schemars(with = "Option<bool>")]
    pub(super) required: Option<Spanned<bool>>,
    /// What it means, shown by `kavi pipeline plan`.
    pub(super) description: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCommon {
    /// What the node does: `exec`, `render`, `sandbox`, `build`, `gate`, ... (docs/pipelines.md).
    #[schemars(with = "String")]
    pub(super) kind: Spanned<String>,
    /// What it is for.
    pub(super) description: Option<String>,
    /// The nodes that must finish first, by id.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub(super) needs: Vec<Spanned<String>>,
    /// A minijinja expression; the node runs when it is true, and is `skipped` otherwise.
    #[schemars(with = "Option<String>")]
    pub(super) when: Option<Spanned<String>>,
    /// How long one attempt may take, such as `30s` or `5m`; then it is killed, `timed_out`.
    #[serde(default, deserialize_with = "timeout")]
    #[schemars(with = "Option<String>")]
    pub(super) timeout: Option<Duration>,
    /// Try again after a failure: attempts, backoff, and which failures.
    pub(super) retry: Option<RawRetry>,
    /// `stop` (default): dependants are blocked and the run fails. `continue`: they run.
    pub(super) on_failure: Option<OnFailure>,
    /// `success` (default), `failure` (a failure handler) or `always` (cleanup).
    pub(super) trigger: Option<Trigger>,
    /// Files whose contents decide the node's result: paths (a folder means every file under
    /// it) or globs (`src/**/*.py`), relative to the workspace. A node that declares them is
    /// `cached` when a run with the same key (its definition, these files, the parameters and
    /// outputs it reads, its environment, the files that govern it, the settings it depends
    /// on) succeeded before.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub(super) inputs: Vec<Spanned<String>>,
    /// Files the node writes, relative to the workspace: stored when it succeeds, and put back
    /// when it is cached. Each must exist, as a regular file, when the node succeeds.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub(super) outputs: Vec<Spanned<String>>,
    /// `false`: always run the node, even with `inputs` declared.
    #[schemars(with = "Option<bool>")]
    pub(super) cache: Option<Spanned<bool>>,
    /// Scripts the node runs, relative to the workspace (`["scripts/x.py"]`): they govern its
    /// runs and are part of its cache key. The file a command executes (its program, or the
    /// script a known interpreter runs) is one without being listed.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub(super) uses: Vec<Spanned<String>>,
    /// Runs the node once per item, each instance with `{{ item }}`: a list
    /// (`["a", "b"]`), or one expression giving a list or a JSON array
    /// (`"{{ params.items }}"`, `"{{ nodes.list.outputs.stdout }}"`). Nodes that need it see
    /// the list of the instances' outputs.
    #[schemars(schema_with = "for_each_schema")]
    pub(super) for_each: Option<Spanned<toml::Value>>,
    /// With `for_each`: how many of its instances run at once (default: as many as `--jobs`
    /// allows).
    #[schemars(with = "Option<std::num::NonZeroU32>")]
    pub(super) max_parallel: Option<Spanned<u32>>,
    /// A group whose node runs, of this node and of any other naming it in any pipeline, are at
    /// most `limit` at once on the ledger, and what an attempt that finds it full does.
    #[schemars(with = "Option<Concurrency>")]
    pub(super) concurrency: Option<Spanned<Concurrency>>,
}

/// What `for_each` takes: the items themselves, or an expression giving them.
fn for_each_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "oneOf": [
            { "type": "array" },
            { "type": "string", "pattern": "^\\s*\\{\\{.*\\}\\}\\s*$" },
        ]
    })
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetry {
    /// How many tries in all, the first included.
    #[schemars(with = "u32")]
    pub(super) attempts: Spanned<u32>,
    /// The wait before the second try, such as `1s`.
    #[serde(default, deserialize_with = "backoff")]
    #[schemars(with = "Option<String>")]
    pub(super) backoff: Option<Duration>,
    /// The backoff is multiplied by this before each later try (default 2; 1 keeps it constant).
    #[schemars(with = "Option<u32>")]
    pub(super) factor: Option<Spanned<u32>>,
    /// The longest wait, however many tries came before, such as `1m`.
    #[serde(default, deserialize_with = "backoff")]
    #[schemars(with = "Option<String>")]
    pub(super) max_backoff: Option<Duration>,
    /// What is retried: exit codes, states (`failed`, `timed_out`) and failure kinds. Empty:
    /// every failure.
    #[serde(default)]
    #[schemars(with = "Vec<RawRetryOn>")]
    pub(super) on: Vec<Spanned<RawRetryOn>>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub(super) enum RawRetryOn {
    Code(i64),
    Name(String),
}

/// A concurrency group's name: it names files in the ledger's locks folder.
pub(crate) fn group_name<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let name = String::deserialize(deserializer)?;
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if valid {
        Ok(name)
    } else {
        Err(serde::de::Error::custom(format!(
            "invalid group `{name}`: a group name starts with a letter or digit and holds only \
             letters, digits, `_`, `-` and `.`"
        )))
    }
}

/// The range of a node's `timeout`: a zero timeout would stop every node at once, and one past
/// 30 days is a mistake, not a plan.
const TIMEOUT_RANGE: (Duration, Duration) = (
    Duration::from_millis(1),
    Duration::from_secs(30 * 24 * 3600),
);

/// The range of `retry.backoff`.
const BACKOFF_RANGE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(24 * 3600));

/// The most tries `retry.attempts` may ask for.
pub(super) const MAX_ATTEMPTS: u32 = 100;

/// Deserializes `"5s"`, `"1m 30s"`, `"250ms"` (humantime) into a duration within `range`; the
/// error says the range, and the TOML error points at the value.
fn duration_in<'de, D: Deserializer<'de>>(
    deserializer: D,
    field: &str,
    (min, max): (Duration, Duration),
) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    let range = format!(
        "`{field}` must be from {} to {}",
        humantime::format_duration(min),
        humantime::format_duration(max)
    );
    let parsed = humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!("invalid duration `{text}`: {e}; {range}"))
    })?;
    if parsed < min || parsed > max {
        return Err(serde::de::Error::custom(format!(
            "duration `{text}` is out of range: {range}"
        )));
    }
    Ok(Some(parsed))
}

/// A `timeout` field: a duration from 1ms to 30 days (a node's, a gate's).
pub fn timeout<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    duration_in(deserializer, "timeout", TIMEOUT_RANGE)
}

pub(super) fn backoff<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    duration_in(deserializer, "retry.backoff", BACKOFF_RANGE)
}

/// Checks what `retry.on` names: an exit code other than 0, a state a node is retried from, or
/// a failure kind the classifier declares (its file then governs the node).
pub(super) fn retry_on(
    file: &Arc<SourceFile>,
    raw: &[Spanned<RawRetryOn>],
    config: &mut NodeConfig<'_>,
) -> Result<Vec<RetryOn>, Diagnostic> {
    let retried = [NodeState::Failed, NodeState::TimedOut];
    let mut classifier = None;
    let mut on = Vec::with_capacity(raw.len());
    for item in raw {
        on.push(match item.get_ref() {
            RawRetryOn::Code(code) if (1..=255).contains(code) => RetryOn::Exit(*code),
            RawRetryOn::Code(_) => {
                return Err(Diagnostic::new(
                    "`retry.on` exit codes are from 1 to 255 (0 is success, never retried)",
                )
                .at(file, item.span()));
            }
            RawRetryOn::Name(name) => match name.parse::<NodeState>().ok() {
                Some(state) if retried.contains(&state) => RetryOn::State(state),
                Some(_) => {
                    return Err(Diagnostic::new(format!(
                        "a node is never retried from `{name}`; `retry.on` states are failed and timed_out"
                    ))
                    .at(file, item.span()));
                }
                None => {
                    if classifier.is_none() {
                        let registry = config.registry;
                        classifier = Some(registry.failure_kinds(config)?);
                    }
                    let named = Spanned::new(item.span(), name.clone());
                    if let Some(classifier) = &classifier {
                        classifier.check_kind(&named, file)?;
                    }
                    RetryOn::Kind(name.clone())
                }
            },
        });
    }
    Ok(on)
}
