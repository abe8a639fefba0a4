//! The LLM parser: one bounded call to the configured gateway, which may only pick one of the
//! declared intents and fill its named groups. Its answer is checked against the intent list;
//! anything else (no gateway, unreachable, timed out, not JSON, an intent that does not exist, a
//! group the intent does not have) is a reason, and the deterministic parser decides instead.
//! What the model chooses is never more than what a message could say: each value it fills must
//! be grounded in the message or the session (the session checks, see `Session::grounding`), and
//! the intent still runs only its declared skill or chain, through the same gates.

use indexmap::IndexMap;
use serde_json::{Value, json};

use super::intents::{ChatPolicy, Chosen};
use crate::config::GatewayConfig;
use crate::confinement::network::NetworkPolicy;
use crate::research::gateway;

const SYSTEM: &str = "You map one user message to one of the listed intents of a command \
                      runner. Answer with one JSON object and nothing else: \
                      {\"intent\": \"<name>\", \"groups\": {\"<group>\": \"<text from the \
                      message>\"}}, using only the listed intent names and their groups, or \
                      {\"intent\": \"unsupported\"} when none fits.";

pub struct LlmParser<'a> {
    pub gateway: &'a GatewayConfig,
    pub network: &'a NetworkPolicy,
}

impl LlmParser<'_> {
    /// The intent the gateway picked for `message`, with its groups; `Ok(None)` when it says
    /// none fits; `Err` with the reason when its answer cannot be used.
    pub async fn parse<'p>(
        &self,
        policy: &'p ChatPolicy,
        message: &str,
    ) -> Result<Option<Chosen<'p>>, String> {
        let intents: Vec<Value> = policy
            .intents
            .iter()
            .map(|intent| {
                json!({ "name": intent.name, "help": intent.help, "groups": intent.groups() })
            })
            .collect();
        let prompt = format!(
            "Intents:\n{}\n\nMessage:\n{message}\n",
            serde_json::to_string_pretty(&intents).expect("JSON serializes")
        );
        let (prompt, _) = gateway::bounded(prompt, self.gateway.max_prompt_chars);
        let answer = gateway::ask(self.gateway, self.network, SYSTEM, &prompt).await?;
        choose(policy, gateway::answer_text(&answer)?)
    }
}

/// Checks the model's answer against the intent list.
fn choose<'p>(policy: &'p ChatPolicy, text: &str) -> Result<Option<Chosen<'p>>, String> {
    // Models like to fence JSON in Markdown.
    let text = text
        .trim()
        .trim_start_matches("```json")
        .trim_start_matches("```")
        .trim_end_matches("```")
        .trim();
    let answer: Value = serde_json::from_str(text)
        .map_err(|e| format!("the gateway's answer is not the JSON asked for: {e}"))?;
    let name = answer["intent"]
        .as_str()
        .ok_or("the gateway's answer names no intent")?;
    if name == "unsupported" {
        return Ok(None);
    }
    let intent = policy
        .intents
        .iter()
        .find(|i| i.name == name)
        .ok_or_else(|| format!("the gateway picked `{name}`, which is not a declared intent"))?;
    let allowed = intent.groups();
    let mut groups = IndexMap::new();
    for (group, value) in answer["groups"].as_object().into_iter().flatten() {
        if !allowed.contains(&group.as_str()) {
            return Err(format!(
                "the gateway filled `{group}`, which intent `{name}` does not have"
            ));
        }
        let value = value
            .as_str()
            .ok_or_else(|| format!("the gateway's `{group}` is not text"))?;
        groups.insert(group.clone(), value.to_owned());
    }
    Ok(Some((intent, groups)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostic::SourceFile;

    #[test]
    fn only_a_declared_intent_with_its_own_text_groups_is_taken() {
        let policy = ChatPolicy::parse(&SourceFile::new(
            "policies/chat.toml",
            "allow = [\"READ_ONLY\"]\n[[intent]]\nname = \"summarize\"\nhelp = \"h\"\n\
             patterns = ['summarize (?P<path>\\S+)']\nskill = \"summarize_note\"\n"
                .to_owned(),
        ))
        .unwrap();
        let (intent, groups) = choose(
            &policy,
            "```json\n{\"intent\": \"summarize\", \"groups\": {\"path\": \"notes/a.md\"}}\n```",
        )
        .unwrap()
        .unwrap();
        assert_eq!(intent.name, "summarize");
        assert_eq!(groups["path"], "notes/a.md");
        assert!(
            choose(&policy, "{\"intent\": \"unsupported\"}")
                .unwrap()
                .is_none()
        );
        for (answer, reason) in [
            ("summarize it", "not the JSON asked for"),
            ("{\"intent\": \"rm_rf\"}", "not a declared intent"),
            (
                "{\"intent\": \"summarize\", \"groups\": {\"command\": \"x\"}}",
                "does not have",
            ),
            (
                "{\"intent\": \"summarize\", \"groups\": {\"path\": 3}}",
                "is not text",
            ),
        ] {
            let error = choose(&policy, answer).unwrap_err();
            assert!(error.contains(reason), "{answer}: {error}");
        }
    }
}
