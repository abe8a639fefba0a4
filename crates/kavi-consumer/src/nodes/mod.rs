//! The consumers' node kind: a chain of trusted skills run as one node of a pipeline.
//! [`KINDS`] is the list the binary puts in the registry after the engine's and the forge's.

mod chain;

use crate::node::NodeKind;

/// The consumers' kinds: chains of trusted skills.
pub const KINDS: &[NodeKind] = &[chain::KIND];
