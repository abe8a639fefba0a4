//! `policies/mcp.toml`: which side-effect classes an MCP client may call, and which only once its
//! user confirms the call.
//!
//! A READ_ONLY skill is callable by any client. Any other class must be granted to the client by
//! name, where the name is the one the person who configured the agent gave on kavi's command
//! line (`kavi mcp --client NAME`), never the name a client reports about itself in
//! `initialize`: that one is the client's to choose, so it cannot be what grants anything.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use serde::Deserialize;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::skills::{SideEffect, SideEffects};

pub const DEFAULT_POLICY: &str = "policies/mcp.toml";

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpPolicy {
    /// The most bytes one message from a client may have (one line on stdio), which bounds a
    /// tool's input before it reaches a skill or the ledger. A longer one is answered with an
    /// error and not read. 1 MiB unless set.
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
    /// How many execution records or runs one page of `resources/list` holds; the client asks
    /// for the next page with the cursor the page ends with. 50 unless set.
    #[serde(default = "default_resources_page")]
    pub resources_page: NonZeroUsize,
    /// By the name given with `kavi mcp --client NAME`: what that client may call beyond
    /// READ_ONLY skills.
    #[serde(default)]
    pub clients: BTreeMap<String, ClientGrant>,
}

/// 1 MiB: far more than any shipped skill's input, far less than a ledger should hold per call.
fn default_max_request_bytes() -> usize {
    1 << 20
}

fn default_resources_page() -> NonZeroUsize {
    NonZeroUsize::new(50).expect("not zero")
}

impl Default for McpPolicy {
    fn default() -> Self {
        Self {
            max_request_bytes: default_max_request_bytes(),
            resources_page: default_resources_page(),
            clients: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientGrant {
    /// Side-effect classes (`FILE_WRITE`, `NETWORK`, `SECRET_READ`) the client may call without
    /// confirming: a skill runs when every class it has is listed.
    #[serde(default)]
    pub allow: Vec<SideEffect>,
    /// Side-effect classes the client may call once its user confirms each call: kavi asks
    /// through MCP elicitation, which the client shows to its user. The client relays the
    /// answer, so grant this only to a client whose application shows such questions to a
    /// person.
    #[serde(default)]
    pub confirm: Vec<SideEffect>,
}

/// What the policy says of one call.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Run,
    /// Runs once the client's user confirms it.
    Confirm,
    /// Refused, and why.
    Refuse(String),
}

impl McpPolicy {
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))
    }

    /// Whether `client` may call a skill of `classes`: at once, once its user confirms, or not.
    pub fn decide(&self, client: Option<&str>, classes: SideEffects) -> Decision {
        if classes.is_read_only() {
            return Decision::Run;
        }
        let grant = client.and_then(|name| self.clients.get(name));
        let allowed: &[SideEffect] = grant.map_or(&[], |grant| grant.allow.as_slice());
        let confirmable: &[SideEffect] = grant.map_or(&[], |grant| grant.confirm.as_slice());
        let missing: Vec<SideEffect> = classes
            .iter()
            .filter(|class| !allowed.contains(class))
            .collect();
        if missing.is_empty() {
            return Decision::Run;
        }
        if missing.iter().all(|class| confirmable.contains(class)) {
            return Decision::Confirm;
        }
        let missing: Vec<&str> = missing
            .iter()
            .filter(|class| !confirmable.contains(*class))
            .map(|class| class.as_str())
            .collect();
        Decision::Refuse(match client {
            None => format!(
                "it is {classes}, and only READ_ONLY skills run for a client kavi was not told the \
                 name of; start the server with `kavi mcp --client NAME` and pre-approve \
                 {} for NAME in {DEFAULT_POLICY}",
                missing.join(", ")
            ),
            Some(name) => format!(
                "it is {classes}, and {DEFAULT_POLICY} neither pre-approves {} for client \
                 `{name}` nor lets its user confirm it; nothing was run",
                missing.join(", ")
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(decision: Decision) -> String {
        match decision {
            Decision::Refuse(why) => why,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn only_read_only_runs_unless_every_class_is_granted_to_the_named_client() {
        let source = SourceFile::new(
            DEFAULT_POLICY,
            "[clients.editor]\nallow = [\"FILE_WRITE\"]\n\n\
             [clients.desk]\nallow = [\"NETWORK\"]\nconfirm = [\"FILE_WRITE\"]\n"
                .to_owned(),
        );
        let policy = McpPolicy::parse(&source).unwrap();
        let read_only = SideEffects::parse("READ_ONLY").unwrap();
        let write = SideEffects::parse("FILE_WRITE").unwrap();
        let write_and_network = SideEffects::parse("FILE_WRITE+NETWORK").unwrap();
        let secret = SideEffects::parse("SECRET_READ").unwrap();
        assert_eq!(policy.decide(None, read_only), Decision::Run);
        assert_eq!(policy.decide(Some("editor"), write), Decision::Run);
        let refused = refusal(policy.decide(Some("editor"), write_and_network));
        assert!(
            refused.contains("neither pre-approves NETWORK for client `editor`"),
            "{refused}"
        );
        assert!(matches!(
            policy.decide(Some("other"), write),
            Decision::Refuse(_)
        ));
        let unnamed = refusal(policy.decide(None, write));
        assert!(unnamed.contains("kavi mcp --client NAME"), "{unnamed}");
        // What is allowed runs; what is only confirmable waits for the user; the rest is refused.
        assert_eq!(policy.decide(Some("desk"), write), Decision::Confirm);
        assert_eq!(
            policy.decide(Some("desk"), write_and_network),
            Decision::Confirm
        );
        let refused = refusal(policy.decide(Some("desk"), secret));
        assert!(refused.contains("SECRET_READ"), "{refused}");
        let typo = SourceFile::new(DEFAULT_POLICY, "[clients.x]\nalow = []\n".to_owned());
        assert!(McpPolicy::parse(&typo).is_err());
    }
}
