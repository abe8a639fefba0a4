//! The engine's node kinds, each in its own module: its TOML config struct and its action.

mod child_params;
mod exec;
mod http;
#[cfg(test)]
mod loading_tests;
mod pipeline;
mod render;

pub use child_params::ChildParams;

use crate::node::NodeKind;

/// The engine's kinds: any pipeline's commands, templates, HTTP calls and child pipelines.
pub const KINDS: &[NodeKind] = &[exec::KIND, render::KIND, pipeline::KIND, http::KIND];
