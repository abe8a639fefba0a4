//! kavi: a declarative pipeline runner for governed, agent-built code.
//!
//! The flow is a straight line of layers, each taking the previous one's output:
//! [`config`] (workspace) → [`spec`] (TOML to a validated model, with spans) → [`dag`] (petgraph,
//! cycles, stages) → [`executor`] (tokio, running [`nodes`] kinds) → [`ledger`] (SQLite, artifacts).
//! [`cli`] wires them to commands.

pub mod cli;
pub mod error;
#[cfg(test)]
mod fuzz;
pub mod nodes;
pub mod schemas;

pub use error::Error;
pub use kavi_consumer::{chains, chat, mcp};
pub use kavi_drill as drill;
pub use kavi_engine::{cache, executor, export, groups};
pub use kavi_forge::{executions, research};
pub use kavi_foundation::{
    diagnostic, files, hash, identity, json_schema, jsonpath, redact, sandbox, state, template,
};
pub use kavi_ledger as ledger;
pub use kavi_policy::{self as policy, skills};
pub use kavi_process::{self as process, confinement, git};
pub use kavi_spec::{config, dag, node, spec};
pub use kavi_toolchains as toolchains;
