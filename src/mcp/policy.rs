//! `policies/mcp.toml`: which side-effect classes an MCP client may call without confirming.
//!
//! A READ_ONLY skill is callable by any client. Any other class must be pre-approved for the
//! client by name, where the name is the one the person who configured the agent gave on kavi's
//! command line (`kavi mcp --client NAME`), never the name a client reports about itself in
//! `initialize`: that one is the client's to choose, so it cannot be what grants anything.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::skills::{SideEffect, SideEffects};

pub const DEFAULT_POLICY: &str = "policies/mcp.toml";

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpPolicy {
    /// By the name given with `kavi mcp --client NAME`: what that client may call beyond
    /// READ_ONLY skills.
    #[serde(default)]
    pub clients: BTreeMap<String, ClientGrant>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientGrant {
    /// Side-effect classes (`FILE_WRITE`, `NETWORK`, `SECRET_READ`) the client may call without
    /// confirming: a skill runs when every class it has is listed.
    #[serde(default)]
    pub allow: Vec<SideEffect>,
}

impl McpPolicy {
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        toml::from_str(&source.text).map_err(|e| crate::spec::toml_error(source, &e))
    }

    /// Why `client` may not call a skill of `classes` without confirming, if it may not.
    pub fn refusal(&self, client: Option<&str>, classes: SideEffects) -> Option<String> {
        if classes.is_read_only() {
            return None;
        }
        let allowed: &[SideEffect] = client
            .and_then(|name| self.clients.get(name))
            .map_or(&[], |grant| grant.allow.as_slice());
        let missing: Vec<&str> = classes
            .iter()
            .filter(|class| !allowed.contains(class))
            .map(SideEffect::as_str)
            .collect();
        if missing.is_empty() {
            return None;
        }
        Some(match client {
            None => format!(
                "it is {classes}, and only READ_ONLY skills run for a client kavi was not told the \
                 name of; start the server with `kavi mcp --client NAME` and pre-approve \
                 {} for NAME in {DEFAULT_POLICY}",
                missing.join(", ")
            ),
            Some(name) => format!(
                "it is {classes}, and {DEFAULT_POLICY} does not pre-approve {} for client \
                 `{name}`; nothing was run",
                missing.join(", ")
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_runs_unless_every_class_is_granted_to_the_named_client() {
        let source = SourceFile::new(
            DEFAULT_POLICY,
            "[clients.editor]\nallow = [\"FILE_WRITE\"]\n".to_owned(),
        );
        let policy = McpPolicy::parse(&source).unwrap();
        let read_only = SideEffects::parse("READ_ONLY").unwrap();
        let write = SideEffects::parse("FILE_WRITE").unwrap();
        let write_and_network = SideEffects::parse("FILE_WRITE+NETWORK").unwrap();
        assert_eq!(policy.refusal(None, read_only), None);
        assert_eq!(policy.refusal(Some("editor"), write), None);
        let refused = policy.refusal(Some("editor"), write_and_network).unwrap();
        assert!(
            refused.contains("does not pre-approve NETWORK for client `editor`"),
            "{refused}"
        );
        assert!(policy.refusal(Some("other"), write).is_some());
        let unnamed = policy.refusal(None, write).unwrap();
        assert!(unnamed.contains("kavi mcp --client NAME"), "{unnamed}");
        let typo = SourceFile::new(DEFAULT_POLICY, "[clients.x]\nalow = []\n".to_owned());
        assert!(McpPolicy::parse(&typo).is_err());
    }
}
