//! `kavi mcp`: trusted skills as the tools of a Model Context Protocol server on stdio.
//!
//! An agent that calls a skill through here gets what `kavi skill run` gives a person, by the
//! same path ([`crate::executions::Runner`]): the trust check (the skill is TRUSTED and its files
//! still hash to what was trusted), its input checked against its schema, its confinement, and
//! an execution record in the ledger and the log, naming the client as its caller. `tools/list`
//! offers only skills that pass the trust check at that moment, so a drifted or revoked skill is
//! not offered; the server tells the client to list again when that set changes.
//!
//! A READ_ONLY skill runs when called. Any other class runs only when `policies/mcp.toml`
//! pre-approves it for the client, or lets the client's user confirm it and they do: kavi asks
//! through MCP elicitation, naming the skill, its classes and its input (see [`policy`]).
//! Otherwise the call is a tool error that says why, nothing runs, and the refusal is recorded
//! like any other.
//!
//! The protocol itself is the official SDK's (`rmcp`); this module only maps skills to tools.

pub mod policy;

use std::sync::{Arc, Mutex};

use rmcp::ErrorData as McpError;
use rmcp::RoleServer;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{Peer, RequestContext};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::executions::{Lineage, Ready, Runner};
use crate::ledger::{ExecutionRecord, Ledger};
use crate::skills::{SideEffect, SideEffects, TRUSTED};

pub use policy::{Decision, McpPolicy};

/// Lends the server a runner for each request: the same one `kavi skill run` uses.
pub trait Runners: Send + Sync + 'static {
    fn runner(&self) -> Runner<'_>;
}

/// The server: skills from `runners`, calls decided by `policy`.
#[derive(Clone)]
pub struct SkillServer {
    runners: Arc<dyn Runners>,
    policy: Arc<McpPolicy>,
    /// The name the person who started the server gave the client (`--client`), which is what
    /// the policy grants to.
    client: Option<String>,
    /// The tools last listed, to tell the client when the set changes.
    listed: Arc<Mutex<Option<Vec<String>>>>,
}

impl SkillServer {
    pub fn new(runners: Arc<dyn Runners>, policy: McpPolicy, client: Option<String>) -> Self {
        Self {
            runners,
            policy: Arc::new(policy),
            client,
            listed: Arc::new(Mutex::new(None)),
        }
    }

    /// Trusted skills that pass the trust check now, each ready to run.
    fn ready_skills(&self) -> Vec<Ready> {
        let runner = self.runners.runner();
        let Ok(ledger) = Ledger::open_existing(runner.ledger) else {
            return Vec::new();
        };
        let Ok(trusted) = ledger.trusted_skills(TRUSTED) else {
            return Vec::new();
        };
        drop(ledger);
        trusted
            .iter()
            .filter_map(|skill| runner.ready(&skill.name).ok())
            .collect()
    }

    /// Who made a call, as the execution record names it.
    fn caller(&self, context: &RequestContext<RoleServer>) -> String {
        let reported = context
            .peer
            .peer_info()
            .map(|info| info.client_info.name.clone());
        match (&self.client, reported) {
            (Some(name), Some(reported)) if *name != reported => {
                format!("mcp:{name} (reports itself as {reported})")
            }
            (Some(name), _) => format!("mcp:{name}"),
            (None, Some(reported)) => format!("mcp:unnamed (reports itself as {reported})"),
            (None, None) => "mcp:unnamed".to_owned(),
        }
    }

    async fn call(
        &self,
        name: &str,
        input: Value,
        caller: String,
        peer: &Peer<RoleServer>,
    ) -> CallToolResult {
        let runner = self.runners.runner();
        let mut lineage = Lineage {
            caller: Some(caller),
            ..Lineage::default()
        };
        let refused = |error: String, side_effect: &str, input: Value, lineage: &Lineage| {
            let record = runner.record_failure(name, side_effect, Some(input), &error, lineage);
            tool_error(&error, record.ok().as_ref())
        };
        let mut ready = match runner.ready(name) {
            Ok(ready) => ready,
            Err(refusal) => return refused(refusal.to_string(), "UNKNOWN", input, &lineage),
        };
        let classes = ready.proposal.side_effect;
        match self.policy.decide(self.client.as_deref(), classes) {
            Decision::Run => {}
            Decision::Refuse(why) => {
                let error = format!("refusing to run `{name}`: {why}");
                return refused(error, &classes.to_string(), input, &lineage);
            }
            Decision::Confirm => match confirm(peer, name, classes, &input).await {
                Ok(()) => {
                    if let Some(caller) = &mut lineage.caller {
                        caller.push_str(", confirmed by its user");
                    }
                    // The question waited on a person: the skill is checked again, and runs
                    // only if it is still the trusted version the question was about.
                    match runner.ready(name) {
                        Ok(again) if again.hash == ready.hash => ready = again,
                        Ok(_) => {
                            let error = format!(
                                "refusing to run `{name}`: its trusted version changed while its \
                                 user was asked; nothing was run"
                            );
                            return refused(error, &classes.to_string(), input, &lineage);
                        }
                        Err(refusal) => {
                            let error = format!("{refusal} (found after its user confirmed)");
                            return refused(error, &classes.to_string(), input, &lineage);
                        }
                    }
                }
                Err(why) => {
                    let error = format!("refusing to run `{name}`: it is {classes}, and {why}");
                    return refused(error, &classes.to_string(), input, &lineage);
                }
            },
        }
        match runner
            .run(&ready, input, &lineage, &CancellationToken::new())
            .await
        {
            Err(e) => tool_error(&e.to_string(), None),
            Ok(record) if record.success => {
                let mut result = CallToolResult::structured(json!({
                    "output": record.output,
                    "execution_id": record.execution_id,
                }));
                result.content = vec![ContentBlock::text(
                    serde_json::to_string(&record.output).expect("JSON serializes"),
                )];
                result
            }
            Ok(record) => tool_error(
                record.error.as_deref().unwrap_or("the skill failed"),
                Some(&record),
            ),
        }
    }
}

/// Asks the client's user, through elicitation, whether to run `name` with `input`. Only a yes
/// (the form accepted with `confirm` true) runs it; why not, otherwise.
async fn confirm(
    peer: &Peer<RoleServer>,
    name: &str,
    classes: SideEffects,
    input: &Value,
) -> Result<(), String> {
    let can_ask = peer
        .peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some());
    if !can_ask {
        return Err(format!(
            "{DEFAULT_POLICY} runs it once the client's user confirms it, but the client cannot \
             ask its user (it did not declare the elicitation capability); nothing was run",
            DEFAULT_POLICY = policy::DEFAULT_POLICY
        ));
    }
    let schema = ElicitationSchema::builder()
        .required_bool_with("confirm", |b| {
            b.title("Run it")
                .description(format!("Run `{name}` ({classes})"))
        })
        .build()
        .map_err(|e| format!("kavi could not build its question: {e}"))?;
    let message = format!(
        "An agent asks kavi to run the trusted skill `{name}`, which is {classes}, with this \
         input: {input}. It runs confined and is recorded. Run it?"
    );
    let answer = peer
        .create_elicitation(ElicitRequestParams::FormElicitationParams {
            meta: None,
            message,
            requested_schema: schema,
        })
        .await
        .map_err(|e| format!("asking the client's user failed ({e}); nothing was run"))?;
    let confirmed = answer.action == ElicitationAction::Accept
        && answer
            .content
            .as_ref()
            .is_some_and(|content| content["confirm"] == Value::Bool(true));
    match (confirmed, answer.action) {
        (true, _) => Ok(()),
        (false, ElicitationAction::Cancel) => {
            Err("the client's user cancelled the question; nothing was run".into())
        }
        (false, _) => Err("the client's user declined to run it; nothing was run".into()),
    }
}

/// A tool error: the reason for the model to read, and the execution record that holds it.
fn tool_error(error: &str, record: Option<&ExecutionRecord>) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(error.to_owned())]);
    result.structured_content = Some(json!({
        "error": error,
        "execution_id": record.map(|r| r.execution_id.clone()),
    }));
    result
}

/// A trusted skill as a tool: its input schema, and hints from its side-effect classes.
fn tool(ready: &Ready) -> Tool {
    let proposal = &ready.proposal;
    let classes: SideEffects = proposal.side_effect;
    let schema = match &proposal.input_schema {
        Value::Object(map) => map.clone(),
        _ => serde_json::Map::new(),
    };
    let annotations = ToolAnnotations::new()
        .read_only(classes.is_read_only())
        .destructive(classes.contains(SideEffect::FileWrite))
        .open_world(classes.contains(SideEffect::Network));
    let mut tool = Tool::new_with_raw(
        ready.name.clone(),
        Some(format!("{} (side effect: {classes})", proposal.description).into()),
        Arc::new(schema),
    );
    tool.annotations = Some(annotations);
    tool
}

impl ServerHandler for SkillServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        let mut config = ServerConfig::new(capabilities);
        config.server_info.name = "kavi".into();
        config.server_info.version = env!("CARGO_PKG_VERSION").into();
        config.instructions = Some(
            "Trusted skills of this kavi workspace. READ_ONLY skills run when called; others \
             only when the workspace's policies/mcp.toml pre-approves them for this client, or \
             lets its user confirm them (kavi then asks through elicitation)."
                .into(),
        );
        config
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools: Vec<Tool> = self.ready_skills().iter().map(tool).collect();
        let names = tools.iter().map(|t| t.name.to_string()).collect();
        *self.listed.lock().expect("listed lock") = Some(names);
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let caller = self.caller(&context);
        let input = Value::Object(request.arguments.unwrap_or_default());
        let result = self.call(&request.name, input, caller, &context.peer).await;
        // A call can be the moment a skill is found drifted: tell the client the list changed.
        let now: Vec<String> = self.ready_skills().iter().map(|r| r.name.clone()).collect();
        let changed = self
            .listed
            .lock()
            .expect("listed lock")
            .as_ref()
            .is_some_and(|listed| *listed != now);
        if changed {
            let _ = context.peer.notify_tool_list_changed().await;
        }
        Ok(result.into())
    }
}
