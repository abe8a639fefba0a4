//! One question to the LLM gateway: an OpenAI-compatible chat-completions request, to a host
//! `policies/network.toml` allows, within `gateway.timeout`, with the API key from the variable
//! `gateway.api_key_env` names as a bearer token (never written anywhere).

use serde_json::{Value, json};

use crate::config::GatewayConfig;
use crate::confinement::network::NetworkPolicy;

/// Whether a gateway is configured at all (`[gateway] base_url`).
pub fn configured(gateway: &GatewayConfig) -> bool {
    !gateway.base_url.is_empty()
}

/// Cuts `text` to at most `max` characters, on a character boundary.
pub fn bounded(text: String, max: usize) -> (String, bool) {
    match text.char_indices().nth(max) {
        Some((cut, _)) => (text[..cut].to_owned(), true),
        None => (text, false),
    }
}

/// The text of a chat-completions answer, if the answer holds one.
pub fn answer_text(answer: &Value) -> Result<&str, String> {
    answer
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|content| !content.is_empty())
        .ok_or_else(|| {
            "the gateway answered nonsense: no text at choices[0].message.content".to_owned()
        })
}

/// Sends `system` and `prompt` as one chat-completions request; the whole answer.
pub async fn ask(
    gateway: &GatewayConfig,
    network: &NetworkPolicy,
    system: &str,
    prompt: &str,
) -> Result<Value, String> {
    if !configured(gateway) {
        return Err("no gateway is configured (`[gateway] base_url` in kavi.toml)".into());
    }
    let url = format!(
        "{}/chat/completions",
        gateway.base_url.trim_end_matches('/')
    );
    let body = json!({
        "model": gateway.model,
        "temperature": 0,
        "messages": [
            { "role": "system", "content": system },
            { "role": "user", "content": prompt },
        ],
    });
    let token = std::env::var(&gateway.api_key_env).ok();
    let timeout = gateway.timeout()?;
    network
        .post_json(&url, &body, token.as_deref(), timeout)
        .await
}
