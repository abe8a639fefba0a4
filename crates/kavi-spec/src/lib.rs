//! kavi's spec layer: what a pipeline says, before anything runs.
//!
//! [`config`] (the workspace) → [`spec`] (pipeline TOML to a validated model, with spans, and
//! the set of files that govern it) → [`dag`] (petgraph, cycles, stages). [`node`] is the
//! interface every node kind implements and the [`node::Registry`] of kinds the loader is
//! handed: the kinds themselves live in the layers above, which hand their lists over.

pub mod config;
pub mod dag;
pub mod node;
pub mod spec;

pub use kavi_foundation::{
    diagnostic, files, hash, identity, json_schema, jsonpath, redact, sandbox, state, template,
};
pub use kavi_ledger as ledger;
pub use kavi_process::{self as process, confinement, git};
