//! `policies/network.toml`: the hosts kavi itself may reach (the LLM gateway of an `advise`
//! node). A request to any other host is refused before anything is sent, and redirects are not
//! followed, so an allowed host cannot hand a request on to one that is not.
//!
//! Its `[processes]` section lists, apart from those, the hosts a confined process with the
//! network (a NETWORK skill, a builder given `network = true`) may reach through kavi's proxy
//! (see [`crate::proxy`]).

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use crate::proxy::{HostAllowlist, HostPattern};
use kavi_foundation::diagnostic::{Diagnostic, SourceFile};

pub const DEFAULT_POLICY: &str = "policies/network.toml";

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Host names or IP addresses, compared exactly (case-insensitively).
    pub allowed_hosts: Vec<String>,
    /// What confined processes with the network may reach; nothing when absent.
    #[serde(default)]
    pub processes: ProcessesPolicy,
}

/// `[processes]`: the hosts a confined process with the network may reach through kavi's proxy.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessesPolicy {
    /// `host` (any port), `host:port`, `*.domain` (any name below `domain`, not `domain`
    /// itself, optionally with `:port`), or an IP address (`127.0.0.1:8080`, `::1`,
    /// `[::1]:8080`). Names and addresses are never interchangeable: an allowed name does not
    /// allow its address, and a name that resolves to an address of this machine, a link-local,
    /// private, unspecified or multicast address is refused unless that address is listed
    /// itself. Empty: no host.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub allowed_hosts: Vec<Spanned<String>>,
}

impl NetworkPolicy {
    /// Parses the policy; an entry of `[processes] allowed_hosts` that is not a host pattern is
    /// an error at the entry.
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let policy: Self = toml::from_str(&source.text)
            .map_err(|e| kavi_foundation::diagnostic::toml_error(source, &e))?;
        policy.process_hosts(source)?;
        Ok(policy)
    }

    /// The hosts confined processes may reach, checked.
    pub fn process_hosts(&self, source: &Arc<SourceFile>) -> Result<HostAllowlist, Diagnostic> {
        let entries = self
            .processes
            .allowed_hosts
            .iter()
            .map(|entry| {
                HostPattern::parse(entry.get_ref()).map_err(|reason| {
                    Diagnostic::new(format!(
                        "invalid entry of [processes] allowed_hosts: {reason}"
                    ))
                    .at(source, entry.span())
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(HostAllowlist { entries })
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

    /// Sends one request to an allowed URL and returns the status and the body text. Every
    /// failure to get an answer (refused host, unreachable, timeout) is an `Err` that says which.
    /// `bearer` is sent as the Authorization header and appears in no message.
    pub async fn send(&self, request: Request<'_>) -> Result<(u16, String), String> {
        let url = self.check(request.url)?;
        let mut client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none());
        if let Some(timeout) = request.timeout {
            client = client.timeout(timeout);
        }
        let client = client
            .build()
            .map_err(|e| format!("failed to set up the HTTP client: {e}"))?;
        let method = reqwest::Method::from_bytes(request.method.as_bytes())
            .map_err(|_| format!("invalid HTTP method `{}`", request.method))?;
        let mut builder = client.request(method, url.clone());
        for (name, value) in request.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if let Some(body) = request.body {
            builder = builder.json(body);
        }
        if let Some(token) = request.bearer {
            builder = builder.bearer_auth(token);
        }
        let timed_out = |what: &str| match request.timeout {
            Some(timeout) => format!(
                "{url} did not {what} within {}",
                humantime::format_duration(timeout)
            ),
            None => format!("{url} did not {what} in time"),
        };
        let response = builder.send().await.map_err(|e| {
            if e.is_timeout() {
                timed_out("answer")
            } else if e.is_connect() {
                format!("{url} is unreachable: {}", root_cause(&e))
            } else {
                format!("request to {url} failed: {}", root_cause(&e))
            }
        })?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| {
            if e.is_timeout() {
                timed_out("finish its answer")
            } else {
                format!("failed to read the answer of {url}: {}", root_cause(&e))
            }
        })?;
        Ok((status, text))
    }

    /// POSTs a JSON body and returns the JSON answer; an HTTP error status or a body that is not
    /// JSON is an `Err` too.
    pub async fn post_json(
        &self,
        url: &str,
        body: &Value,
        bearer: Option<&str>,
        timeout: Duration,
    ) -> Result<Value, String> {
        let (status, text) = self
            .send(Request {
                method: "POST",
                url,
                headers: &[],
                body: Some(body),
                bearer,
                timeout: Some(timeout),
            })
            .await?;
        if !(200..300).contains(&status) {
            let head: String = text.chars().take(200).collect();
            return Err(format!("{url} answered {status}: {head}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("{url} answered with no JSON: {e}"))
    }
}

/// How long connecting may take, whatever the request's own timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP request, as kavi sends it.
pub struct Request<'a> {
    pub method: &'a str,
    pub url: &'a str,
    pub headers: &'a [(String, String)],
    /// Sent as JSON.
    pub body: Option<&'a Value>,
    pub bearer: Option<&'a str>,
    pub timeout: Option<Duration>,
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
            processes: ProcessesPolicy::default(),
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

    #[test]
    fn a_malformed_process_host_is_refused_at_its_line_and_column() {
        let text =
            "allowed_hosts = []\n[processes]\nallowed_hosts = [\n  \"pypi.org\",\n  \"*\",\n]\n";
        let source = SourceFile::new("policies/network.toml", text.to_owned());
        let err = NetworkPolicy::parse(&source).unwrap_err().to_string();
        assert!(err.contains("policies/network.toml:5:3"), "{err}");
        assert!(err.contains("would allow every host"), "{err}");
        let ok = "allowed_hosts = []\n[processes]\nallowed_hosts = [\"pypi.org:443\"]\n";
        let source = SourceFile::new("policies/network.toml", ok.to_owned());
        let policy = NetworkPolicy::parse(&source).unwrap();
        assert_eq!(
            policy.process_hosts(&source).unwrap().texts(),
            ["pypi.org:443"]
        );
        // Absent, no host.
        let none = SourceFile::new("policies/network.toml", "allowed_hosts = []\n".to_owned());
        let policy = NetworkPolicy::parse(&none).unwrap();
        assert!(policy.process_hosts(&none).unwrap().entries.is_empty());
    }
}
