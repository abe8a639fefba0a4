//! `http`: one HTTP request (reqwest) to a host the network policy allows (default
//! `policies/network.toml`), with a JSON body whose strings are templates, and JSONPath extracts
//! from the JSON answer. Redirects are not followed; the node's `timeout` bounds the request
//! (connecting alone may take at most ten seconds). A token for the Authorization header comes
//! from an environment variable named in the spec, and is never recorded.

use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use toml::Spanned;

use crate::confinement::network::{self, NetworkPolicy, Request};
use crate::diagnostic::Diagnostic;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};

pub const KIND: NodeKind = NodeKind {
    name: "http",
    parse,
    schema: <HttpConfig as schemars::JsonSchema>::json_schema,
    calls_http: true,
};

const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE"];

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct HttpConfig {
    #[schemars(with = "String")]
    url: Spanned<String>,
    /// GET by default, POST when there is a `json` body.
    #[schemars(with = "Option<String>")]
    method: Option<Spanned<String>>,
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    headers: IndexMap<String, Spanned<String>>,
    /// The environment variable whose value is sent as a bearer token.
    bearer_env: Option<String>,
    /// The JSON body; every string in it is a template.
    #[schemars(with = "Option<Value>")]
    json: Option<Spanned<toml::Value>>,
    /// Values to pick out of the JSON answer, by JSONPath (`$.results[0].path`).
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    extract: IndexMap<String, Spanned<String>>,
    /// The statuses that count as success (default: any 2xx).
    ok_status: Option<Vec<u16>>,
    #[schemars(with = "Option<String>")]
    network: Option<Spanned<String>>,
}

#[derive(Debug)]
struct Http {
    url: String,
    method: String,
    headers: Vec<(String, String)>,
    bearer_env: Option<String>,
    json: Option<Value>,
    extract: Vec<(String, String)>,
    ok_status: Option<Vec<u16>>,
    network: NetworkPolicy,
}

/// Every string in a JSON value, in order.
fn strings(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::String(s) => found.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, found)),
        Value::Object(map) => map.values().for_each(|v| strings(v, found)),
        _ => {}
    }
}

/// Renders every string in a JSON value as a template.
fn render_strings(value: &mut Value, ctx: &NodeContext<'_>) -> Result<(), String> {
    match value {
        Value::String(s) => *s = ctx.render("json", s)?,
        Value::Array(items) => items.iter_mut().try_for_each(|v| render_strings(v, ctx))?,
        Value::Object(map) => map.values_mut().try_for_each(|v| render_strings(v, ctx))?,
        _ => {}
    }
    Ok(())
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: HttpConfig = config.deserialize()?;
    config.check_template(&raw.url)?;
    for value in raw.headers.values() {
        config.check_template(value)?;
    }
    let method = match &raw.method {
        Some(method) => {
            let upper = method.get_ref().to_ascii_uppercase();
            if !METHODS.contains(&upper.as_str()) {
                return Err(config.error(
                    format!(
                        "unknown method `{}`; use one of {}",
                        method.get_ref(),
                        METHODS.join(", ")
                    ),
                    method.span(),
                ));
            }
            upper
        }
        None if raw.json.is_some() => "POST".to_owned(),
        None => "GET".to_owned(),
    };
    let json = match &raw.json {
        None => None,
        Some(body) => {
            let span = body.span();
            let value = serde_json::to_value(body.get_ref())
                .map_err(|e| config.error(format!("the body is not JSON: {e}"), span.clone()))?;
            let mut templates = Vec::new();
            strings(&value, &mut templates);
            for template in templates {
                config.check_template(&Spanned::new(span.clone(), template))?;
            }
            Some(value)
        }
    };
    for path in raw.extract.values() {
        crate::jsonpath::check(path.get_ref()).map_err(|e| config.error(e, path.span()))?;
    }
    let network = config.load_policy_source(raw.network.as_ref(), network::DEFAULT_POLICY)?;
    Ok(Arc::new(Http {
        url: raw.url.into_inner(),
        method,
        headers: raw
            .headers
            .into_iter()
            .map(|(k, v)| (k, v.into_inner()))
            .collect(),
        bearer_env: raw.bearer_env,
        json,
        extract: raw
            .extract
            .into_iter()
            .map(|(k, v)| (k, v.into_inner()))
            .collect(),
        ok_status: raw.ok_status,
        network: NetworkPolicy::parse(&network)?,
    }))
}

impl Http {
    async fn request(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let url = ctx.render("url", &self.url)?;
        let mut headers = Vec::new();
        for (name, value) in &self.headers {
            headers.push((name.clone(), ctx.render(&format!("headers.{name}"), value)?));
        }
        let body = match &self.json {
            None => None,
            Some(template) => {
                let mut body = template.clone();
                render_strings(&mut body, ctx)?;
                Some(body)
            }
        };
        let token = match &self.bearer_env {
            None => None,
            Some(name) => Some(
                std::env::var(name)
                    .map_err(|_| format!("`bearer_env` names {name}, which is not set"))?,
            ),
        };
        let sent = self.network.send(Request {
            method: &self.method,
            url: &url,
            headers: &headers,
            body: body.as_ref(),
            bearer: token.as_deref(),
            timeout: None,
        });
        let (status, text) = tokio::select! {
            answer = sent => answer?,
            () = ctx.cancel.cancelled() => return Ok(NodeOutcome::cancelled()),
        };
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        let ok = match &self.ok_status {
            Some(statuses) => statuses.contains(&status),
            None => (200..300).contains(&status),
        };
        let mut outputs = json!({ "status": status, "body": answer });
        if !ok {
            let mut outcome = NodeOutcome::failed(format!("{url} answered {status}"));
            outcome.outputs = outputs;
            return Ok(outcome);
        }
        let mut extracted = Map::new();
        for (name, path) in &self.extract {
            let value = crate::jsonpath::select(&outputs["body"], path)
                .map_err(|e| format!("extract `{name}`: {e} in the answer of {url}"))?;
            extracted.insert(name.clone(), value);
        }
        outputs["extract"] = Value::Object(extracted);
        Ok(NodeOutcome::succeeded(outputs))
    }
}

#[async_trait::async_trait]
impl NodeAction for Http {
    /// It reads no setting but through its templates.
    fn config_settings(&self) -> &'static [&'static str] {
        &[]
    }

    fn uses_ledger(&self) -> bool {
        false
    }

    fn output_names(&self, key: &str) -> Option<Vec<&str>> {
        (key == "extract").then(|| self.extract.iter().map(|(name, _)| name.as_str()).collect())
    }

    fn output_keys(&self) -> Option<&'static [&'static str]> {
        Some(&["status", "body", "extract"])
    }

    fn describe(&self) -> String {
        format!("{} {}", self.method, self.url)
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.request(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}
