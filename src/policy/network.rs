//! `policies/network.toml`: the hosts kavi itself may reach (the LLM gateway of an `advise`
//! node). A request to any other host is refused before anything is sent, and redirects are not
//! followed, so an allowed host cannot hand a request on to one that is not.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::diagnostic::{Diagnostic, SourceFile};

pub const DEFAULT_POLICY: &str = "policies/network.toml";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Host names or IP addresses, compared exactly (case-insensitively).
    pub allowed_hosts: Vec<String>,
}

impl NetworkPolicy {
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        toml::from_str(&source.text).map_err(|e| crate::spec::toml_error(source, &e))
    }

    /// Parses `url` and checks that its scheme is http(s) and its host is allowed.
    pub fn check(&self, url: &str) -> Result<reqwest::Url, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("invalid URL `{url}`: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("refused `{url}`: only http and https are allowed"));
        }
        let host = parsed
            .host_str()
            .ok_or_else(|| format!("refused `{url}`: it names no host"))?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if !self
            .allowed_hosts
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(bare))
        {
            return Err(format!(
                "refused `{url}`: host `{bare}` is not in allowed_hosts of {DEFAULT_POLICY}"
            ));
        }
        Ok(parsed)
    }

    /// POSTs a JSON body to an allowed URL and returns the JSON answer. Every failure (refused
    /// host, unreachable, timeout, an HTTP error status, a body that is not JSON) is an `Err`
    /// that says which. `bearer` is sent as the Authorization header and appears in no message.
    pub async fn post_json(
        &self,
        url: &str,
        body: &Value,
        bearer: Option<&str>,
        timeout: Duration,
    ) -> Result<Value, String> {
        let url = self.check(url)?;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("failed to set up the HTTP client: {e}"))?;
        let mut request = client.post(url.clone()).json(body);
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| {
            if e.is_timeout() {
                format!(
                    "{url} did not answer within {}",
                    humantime::format_duration(timeout)
                )
            } else if e.is_connect() {
                format!("{url} is unreachable: {}", root_cause(&e))
            } else {
                format!("request to {url} failed: {}", root_cause(&e))
            }
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|e| {
            if e.is_timeout() {
                format!("{url} did not finish its answer in time")
            } else {
                format!("failed to read the answer of {url}: {}", root_cause(&e))
            }
        })?;
        if !status.is_success() {
            let head: String = text.chars().take(200).collect();
            return Err(format!("{url} answered {status}: {head}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("{url} answered with no JSON: {e}"))
    }
}

/// The innermost error's text: reqwest's own message wraps the cause (connection refused, ...).
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> NetworkPolicy {
        NetworkPolicy {
            allowed_hosts: vec!["127.0.0.1".into(), "llm.example".into(), "::1".into()],
        }
    }

    #[test]
    fn only_allowed_hosts_and_web_schemes_pass() {
        assert!(policy().check("http://127.0.0.1:8080/v1").is_ok());
        assert!(policy().check("https://LLM.example/v1").is_ok());
        assert!(policy().check("http://[::1]:9/v1").is_ok());
        let refused = policy().check("https://evil.example/v1").unwrap_err();
        assert!(
            refused.contains("host `evil.example` is not in allowed_hosts"),
            "{refused}"
        );
        assert!(
            policy()
                .check("file:///etc/passwd")
                .unwrap_err()
                .contains("only http and https")
        );
        assert!(
            policy()
                .check("not a url")
                .unwrap_err()
                .contains("invalid URL")
        );
    }
}
