//! kavi's engine: running a pipeline, whatever its kinds.
//!
//! [`executor`] runs a compiled DAG on tokio and records every node run in the ledger; [`cache`]
//! finds the nodes that are up to date; [`export`] writes a pipeline for another runner (Argo).
//! [`nodes`] are the generic kinds (commands, templates, HTTP calls, child pipelines), handed
//! to the registry as [`nodes::KINDS`]; the forge's and the consumers' kinds live above.

pub mod cache;
pub mod executor;
pub mod export;
pub mod groups;
pub mod heartbeat;
pub mod nodes;

pub use kavi_foundation::{diagnostic, files, hash, jsonpath, redact, sandbox, state, template};
pub use kavi_ledger as ledger;
pub use kavi_process::{self as process, confinement};
pub use kavi_spec::{dag, node, spec};
