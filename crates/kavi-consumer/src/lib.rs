//! What uses trusted skills once the forge has made them so: [`chains`] (skills run one after
//! another, each one's output mapped into the next one's input), the [`chat`] (a message matched
//! to a skill or a chain by the chat policy's intents), the [`mcp`] server (trusted skills as
//! tools for an agent), and the chain node kind ([`nodes`]). Every skill they run goes through
//! `kavi_forge::executions`, confined and recorded as any run.

pub mod chains;
pub mod chat;
pub mod mcp;
pub mod nodes;

use kavi_forge::{executions, research};
use kavi_foundation::{diagnostic, jsonpath, state, template};
use kavi_ledger as ledger;
use kavi_policy::skills;
use kavi_process::confinement;
use kavi_spec::{config, node, spec};
