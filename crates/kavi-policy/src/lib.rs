//! kavi's forge policy: the policy files that govern a build, as data under `policies/`, and the
//! skill lifecycle and trust they govern.
//!
//! A node kind that is governed by a policy names the file; the file is loaded (with spans, like
//! a pipeline) when the pipeline is checked, so a bad policy stops the run before it starts. Each
//! policy text is recorded in the ledger with the runs it governed. [`skills`] shares the crate
//! because the two read each other: adoption reads the lifecycle, the lifecycle reads [`roles`].
//!
//! The crate's root is the `policy` module the layers above name (`kavi::policy::gates`).

pub mod adoption;
pub mod classifier;
pub mod diff;
pub mod gates;
pub mod invariants;
pub mod roles;
pub mod scanner;
pub mod skills;

// The lower crates under the names the code uses (`crate::ledger`, `crate::spec`...). Not
// re-exported: this root is `kavi::policy`, where they would be second paths to the same crates.
use kavi_foundation::{diagnostic, files, hash, identity, json_schema, sandbox, state, template};
use kavi_ledger as ledger;
use kavi_process as process;
use kavi_spec::{node, spec};

use serde::Deserialize;
use toml::Spanned;

pub use crate::node::{Policy, read};

/// The lines of Python source as Python, ruff and mypy read them: `\r\n`, a lone `\r` and `\n`
/// each end one. Split at `\n` alone, a comment after a bare carriage return (`# ruff: noqa`,
/// say) would hide in the line before it.
pub fn python_lines(text: &str) -> impl Iterator<Item = &str> {
    text.split('\n')
        .flat_map(|line| line.strip_suffix('\r').unwrap_or(line).split('\r'))
}

/// `policies/sandbox.toml`: what a sandbox copy of the target leaves out, what a build may bring
/// back, and how long a failed attempt's sandbox is kept.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxPolicy {
    /// Globs matched against each path relative to the tree root (`**/.env`, `.git`, ...). A
    /// matching folder is skipped with everything in it.
    #[schemars(with = "Vec<String>")]
    pub skip: Vec<Spanned<String>>,
    #[serde(default)]
    pub limits: SandboxLimitsPolicy,
    /// How long a sandbox is kept after its run failed, such as `24h` (`0s`: removed at once).
    #[schemars(with = "Option<String>")]
    pub keep_failed: Option<Spanned<String>>,
    /// The most bytes a failed run's sandbox may hold and still be kept; a larger one is
    /// removed at once, and the ledger says why.
    #[serde(default)]
    pub keep_max_bytes: Option<u64>,
}

/// What the diff gate and copy-back accept from one build. Over a limit is a gate violation.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxLimitsPolicy {
    /// Bytes in one copied-back file.
    pub max_file_bytes: u64,
    /// Bytes in all copied-back files together.
    pub max_total_bytes: u64,
    /// Paths a build may change (ignored by-products not counted).
    pub max_changed_files: u64,
}

impl Default for SandboxLimitsPolicy {
    fn default() -> Self {
        Self {
            max_file_bytes: 1024 * 1024,
            max_total_bytes: 8 * 1024 * 1024,
            max_changed_files: 100,
        }
    }
}

/// `policies/allowlist.toml`: what a build may change.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AllowlistPolicy {
    /// Paths a build may create or change, as templates over the pipeline's variables
    /// (`skills/{{ skill }}/skill.py`).
    #[serde(rename = "path")]
    pub paths: Vec<AllowedPath>,
    /// Globs of changes that are neither allowed nor violations, and are never copied back:
    /// by-products such as `**/__pycache__/**`.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub ignore: Vec<Spanned<String>>,
    /// Globs of paths never admitted, even where `path` allows them: files that configure a
    /// gate's tools (`**/conftest.py`, `**/setup.cfg`). A change to one is refused.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub deny: Vec<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AllowedPath {
    #[schemars(with = "String")]
    pub path: Spanned<String>,
    /// A required path must exist in the sandbox after the build.
    #[serde(default)]
    pub required: bool,
    pub description: Option<String>,
}
