//! The advisory: ask an OpenAI-compatible chat-completions gateway to revise a failed build's
//! packet, given its research note. The prompt is `templates/advisory_prompt.md.j2`, cut to
//! `gateway.max_prompt_chars`; the request honours `gateway.timeout` and the host allowlist of
//! `policies/network.toml`.
//!
//! The advisory only ever adds text to the next packet: what a build may change (the allowlist)
//! and its side-effect class come from policy and the proposal, never from the packet. A revised
//! packet that asks for more is for the escalation rules to catch (PERMISSION_WIDENING).
//! A gateway that cannot be reached, times out or answers nonsense yields no advisory and a
//! reason, recorded on the build: the forge goes on deterministically, and escalation raises
//! AMBIGUOUS.

use serde_json::{Value, json};

use super::gateway::{self, bounded};
use crate::config::GatewayConfig;
use crate::confinement::network::NetworkPolicy;
use crate::ledger::{Artifact, ArtifactStore, Ledger};
use crate::template::{TemplateEngine, describe_error};

/// The prompt template under `templates/`.
pub const PROMPT_TEMPLATE: &str = "advisory_prompt.md.j2";

const SYSTEM: &str = "You revise build packets for a coding agent. Answer with the complete \
                      revised packet in Markdown and nothing else.";

/// What asking produced.
#[derive(Debug)]
pub enum Advice {
    /// The gateway answered with a revised packet, stored as an ADVISORY artifact.
    Revised {
        artifact: Artifact,
        prompt_chars: usize,
        truncated: bool,
    },
    /// No usable advisory, and why (unreachable, timed out, refused host, nonsense).
    Unavailable(String),
}

/// What the advisory needs from the workspace.
pub struct Advisor<'a> {
    pub gateway: &'a GatewayConfig,
    pub network: &'a NetworkPolicy,
    pub templates: &'a TemplateEngine,
    pub artifacts: &'a ArtifactStore,
}

impl Advisor<'_> {
    /// Asks for a revised packet for a classified build and records the answer (or why there is
    /// none) on the build. `Err` is a problem on kavi's side: no such build, no note yet.
    pub async fn advise(&self, ledger: &mut Ledger, build_id: i64) -> Result<Advice, String> {
        let build = ledger.build(build_id).map_err(|e| e.to_string())?;
        let read = |sha: Option<&String>, what: &str| -> Result<String, String> {
            let sha = sha.ok_or_else(|| {
                format!(
                    "build {build_id} has no {what}; classify it first (`kavi research {build_id}`)"
                )
            })?;
            self.artifacts
                .read_text(sha)
                .map_err(|e| format!("the {what} of build {build_id}: {e}"))
        };
        let packet = read(build.packet.as_ref(), "packet")?;
        let note: Value =
            serde_json::from_str(&read(build.research_note.as_ref(), "research note")?)
                .map_err(|e| format!("the research note of build {build_id} is not JSON: {e}"))?;
        let context = minijinja::Value::from_serialize(json!({
            "build": build,
            "packet": packet,
            "note": note,
        }));
        let prompt = self
            .templates
            .render_file(PROMPT_TEMPLATE, &context)
            .map_err(|e| format!("failed to render {PROMPT_TEMPLATE}: {}", describe_error(&e)))?;
        let (prompt, truncated) = bounded(prompt, self.gateway.max_prompt_chars);
        let prompt_chars = prompt.chars().count();

        let revised = self
            .ask(&prompt)
            .await
            .and_then(|answer| gateway::answer_text(&answer).map(str::to_owned));
        let advice = match revised {
            Ok(revised) => {
                let artifact = self
                    .artifacts
                    .put_bytes("ADVISORY", revised.as_bytes())
                    .map_err(|e| format!("failed to store the advisory: {e}"))?;
                ledger
                    .record_advisory(build_id, Ok(&artifact))
                    .map_err(|e| e.to_string())?;
                Advice::Revised {
                    artifact,
                    prompt_chars,
                    truncated,
                }
            }
            Err(reason) => {
                ledger
                    .record_advisory(build_id, Err(&reason))
                    .map_err(|e| e.to_string())?;
                Advice::Unavailable(reason)
            }
        };
        Ok(advice)
    }

    async fn ask(&self, prompt: &str) -> Result<Value, String> {
        gateway::ask(self.gateway, self.network, SYSTEM, prompt).await
    }
}

/// The keywords a revised packet mentions more often than the packet did: permissions the
/// advisory would add (network, money, messaging, secrets; the list is policy).
pub fn widening(packet: &str, revised: &str, keywords: &[String]) -> Vec<String> {
    let count = |text: &str, keyword: &str| {
        let lower = text.to_lowercase();
        lower.matches(&keyword.to_lowercase()).count()
    };
    keywords
        .iter()
        .filter(|k| count(revised, k) > count(packet, k))
        .cloned()
        .collect()
}

/// The share of the packet's lines that the revision removed or replaced (0.0 to 1.0).
pub fn changed_share(packet: &str, revised: &str) -> f64 {
    let diff = similar::TextDiff::from_lines(packet, revised);
    let total = packet.lines().count().max(1);
    let changed: usize = diff
        .ops()
        .iter()
        .filter(|op| !matches!(op, similar::DiffOp::Equal { .. }))
        .map(|op| op.old_range().len())
        .sum();
    changed as f64 / total as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_counts_keywords_the_packet_did_not_have() {
        let keywords = ["network".to_owned(), "secret".to_owned()];
        let packet = "Secrets it may read: none\n";
        assert!(widening(packet, "Secrets it may read: none\nbe careful\n", &keywords).is_empty());
        assert_eq!(
            widening(
                packet,
                "Secrets it may read: API_SECRET\nUse the Network.\n",
                &keywords
            ),
            ["network", "secret"]
        );
    }

    #[test]
    fn changed_share_is_the_part_of_the_packet_rewritten() {
        let packet = "a\nb\nc\nd\n";
        assert_eq!(changed_share(packet, packet), 0.0);
        assert_eq!(changed_share(packet, "a\nb\nc\nd\ne\n"), 0.0);
        assert_eq!(changed_share(packet, "a\nB\nc\nd\n"), 0.25);
        assert_eq!(changed_share(packet, "w\nx\ny\nd\n"), 0.75);
    }

    #[test]
    fn the_prompt_is_cut_on_a_character_boundary() {
        assert_eq!(bounded("héllo".into(), 2), ("hé".into(), true));
        assert_eq!(bounded("hé".into(), 2), ("hé".into(), false));
    }

    #[test]
    fn only_a_text_answer_is_a_revised_packet() {
        let answer = json!({"choices": [{"message": {"role": "assistant", "content": " # P \n"}}]});
        assert_eq!(gateway::answer_text(&answer).unwrap(), "# P");
        for nonsense in [
            json!({}),
            json!({"choices": []}),
            json!({"choices": [{"message": {"content": "  "}}]}),
            json!({"choices": [{"message": {"content": 7}}]}),
        ] {
            assert!(
                gateway::answer_text(&nonsense)
                    .unwrap_err()
                    .contains("nonsense")
            );
        }
    }
}
