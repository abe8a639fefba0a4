//! The forge's node kinds, one module each: its TOML config struct and its action together.
//! [`KINDS`] is the list the binary puts in the registry beside the engine's and the consumers'.
//! `vars`, `review` and `scan` are what several kinds share: the values a node passes into a
//! policy's templates, stopping a run for a person's decision, and the scanners a gate starts.

mod advise;
mod allowlist;
mod build;
mod classify;
mod copy_back;
mod diff_gate;
pub mod escalate;
mod gate;
mod imported;
mod promote;
mod propose;
pub mod review;
mod sandbox;
mod scan;
mod transition;
mod vars;

use crate::node::NodeKind;

/// The forge's kinds: a skill's sandbox, build, diff gate, gates, failure handling and lifecycle.
pub const KINDS: &[NodeKind] = &[
    sandbox::KIND,
    diff_gate::KIND,
    copy_back::KIND,
    transition::KIND,
    gate::KIND,
    promote::KIND,
    imported::KIND,
    propose::KIND,
    build::KIND,
    classify::KIND,
    escalate::KIND,
    advise::KIND,
];
