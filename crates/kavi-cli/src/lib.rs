//! kavi's command line as clap parses it: every command, subcommand and flag with its help, and
//! the man page and shell completions made from them ([`help`], [`complete`]). What a command does is the
//! `kavi` binary's (its `cli` module, which matches on these types); nothing here opens a
//! workspace or runs anything.

mod args;
pub mod complete;
pub mod help;

pub use args::{
    ArtifactCommand, BuildsCommand, ChainCommand, Cli, Command, DrillCommand, ExecutionsCommand,
    LedgerCommand, LogFormat, PipelineArgs, PipelineCommand, PolicyCommand, RunOptions,
    RunsCommand, SkillCommand, SpecCommand, ToolchainCommand, TopCommand,
};

// The value types some arguments parse into, under the names the arguments use.
use kavi_engine::export;
use kavi_foundation::state;
use kavi_spec::{dag, spec};
