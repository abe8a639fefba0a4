//! Pipelines written out for other engines to run, node by node, through `kavi pipeline step`
//! (see [`crate::executor::execute_step`]): the engine orders the work, kavi still decides and
//! records each node.

pub mod argo;

/// The engines kavi can export to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// An Argo Workflows `Workflow` manifest (argoproj.io/v1alpha1), as JSON.
    Argo,
}
