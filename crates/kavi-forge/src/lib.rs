//! The forge, what kavi exists for, built on the engine as an ordinary set of node kinds: a
//! skill is built in a sandbox, its diff held to an allowlist, copied back, gated, its failures
//! classified, researched and escalated, and its lifecycle moved on to TRUSTED
//! ([`nodes`], run by `pipelines/forge.toml`). [`executions`] runs a trusted skill (a consumer's
//! call, and the contract gate's); [`research`] turns a failed attempt into a note and asks the
//! LLM gateway for advice. The rules each kind applies are `kavi_policy`'s.

pub mod executions;
pub mod nodes;
pub mod research;

use kavi_foundation::{
    diagnostic, files, hash, identity, json_schema, redact, sandbox, state, template,
};
use kavi_ledger as ledger;
use kavi_policy::{self as policy, skills};
use kavi_process::{self as process, confinement, git};
use kavi_spec::{config, node, spec};
use kavi_toolchains as toolchains;
