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
//! A client's `notifications/cancelled` stops the call: its skill's process tree is stopped and
//! the record says `cancelled`.
//!
//! The protocol itself is the official SDK's (`rmcp`); this module maps skills to tools, and
//! [`wire`] frames stdio so that every malformed line gets the error JSON-RPC names.

pub mod policy;
pub mod prompts;
pub mod resources;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::ErrorData as McpError;
use rmcp::RoleServer;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestMethod, CallToolRequestParams, CallToolResponse, CallToolResult,
    CompleteRequestMethod, ConstString, ContentBlock, CustomRequest, CustomResult,
    DiscoverRequestMethod, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationSchema, ErrorCode, GetPromptRequestMethod, GetPromptRequestParams,
    GetPromptResponse, InputRequest, InputRequests, InputRequiredResult, ListPromptsRequestMethod,
    ListPromptsResult, ListResourceTemplatesRequestMethod, ListResourceTemplatesResult,
    ListResourcesRequestMethod, ListResourcesResult, ListToolsRequestMethod, ListToolsResult,
    PaginatedRequestParams, PingRequestMethod, ReadResourceRequestMethod,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
    SetLevelRequestMethod, SubscribeRequestMethod, SubscribeRequestParams, SubscriptionFilter,
    Tool, ToolAnnotations, UnsubscribeRequestMethod, UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use serde_json::{Value, json};

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
    /// Questions asked through `input_required` results (2026-07-28), by the state the client
    /// echoes when it calls again with the answer; kept here, so the echoed state is only a key.
    questions: Arc<Mutex<BTreeMap<String, Question>>>,
    /// How many such questions were asked: keeps their keys in the order they were asked.
    asked: Arc<AtomicU64>,
    /// The client's subscriptions to execution records and runs (see [`resources`]).
    watch: Arc<resources::Watch>,
}

impl SkillServer {
    pub fn new(runners: Arc<dyn Runners>, policy: McpPolicy, client: Option<String>) -> Self {
        Self {
            runners,
            policy: Arc::new(policy),
            client,
            listed: Arc::new(Mutex::new(None)),
            questions: Arc::new(Mutex::new(BTreeMap::new())),
            asked: Arc::new(AtomicU64::new(0)),
            watch: Arc::new(resources::Watch::default()),
        }
    }

    /// The ledger the records are read from, open for one request.
    fn ledger(&self) -> Result<Ledger, McpError> {
        Ledger::open_existing(self.runners.runner().ledger)
            .map_err(|e| McpError::internal_error(format!("the ledger cannot be read: {e}"), None))
    }

    /// How many records a page of resources holds.
    fn page(&self) -> usize {
        self.policy.resources_page.get()
    }

    /// Starts telling the client about new records and changed resources.
    fn watch(&self, context: &RequestContext<RoleServer>) {
        self.watch
            .start(&context.peer, self.runners.runner().ledger, self.page());
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
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let caller = self.caller(context);
        let input = Value::Object(request.arguments.clone().unwrap_or_default());
        let runner = self.runners.runner();
        let mut lineage = Lineage {
            caller: Some(caller),
            ..Lineage::default()
        };
        // A tool name is a skill name or nothing: one that is not never reaches the ledger whole.
        let name = match crate::skills::invalid_name_reason(&request.name) {
            None => request.name.to_string(),
            Some(_) => {
                let shown = shortened(&request.name);
                let error = format!(
                    "no tool `{shown}`: a tool name is a skill name (a lowercase letter, then \
                     lowercase letters, digits or `_`, at most 64 characters); nothing was run"
                );
                let record =
                    runner.record_failure(&shown, "UNKNOWN", Some(input), &error, &lineage);
                return tool_error(&error, record.ok().as_ref()).into();
            }
        };
        let name = name.as_str();
        let refused = |error: String, side_effect: &str, input: Value, lineage: &Lineage| {
            let record = runner.record_failure(name, side_effect, Some(input), &error, lineage);
            CallToolResponse::from(tool_error(&error, record.ok().as_ref()))
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
            Decision::Confirm => {
                let question = Question {
                    skill: name.to_owned(),
                    input: input.clone(),
                    hash: ready.hash.clone(),
                };
                let asked = tokio::select! {
                    asked = self.ask(question, classes, &request, context) => asked,
                    () = context.ct.cancelled() => Err(
                        "cancelled by the client while its user was asked; nothing was run".into()
                    ),
                };
                let confirmed_hash = match asked {
                    Ok(Asked::Pending(pending)) => return pending.into(),
                    Ok(Asked::Confirmed(hash)) => hash,
                    Err(why) => {
                        let error = format!("refusing to run `{name}`: it is {classes}, and {why}");
                        return refused(error, &classes.to_string(), input, &lineage);
                    }
                };
                if let Some(caller) = &mut lineage.caller {
                    caller.push_str(", confirmed by its user");
                }
                // The question waited on a person: the skill is checked again, and runs only if
                // it is still the trusted version the question was about.
                match runner.ready(name) {
                    Ok(again) if again.hash == confirmed_hash => ready = again,
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
        }
        // `notifications/cancelled` for this call cancels `ct`: the runner stops the skill's
        // process tree and records the execution as cancelled.
        let result = match runner.run(&ready, input, &lineage, &context.ct).await {
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
        };
        result.into()
    }

    /// Asks the client's user whether to run the skill of `question`, through elicitation, the
    /// way the call's protocol version has it: up to 2025-11-25 an `elicitation/create` request
    /// to the client, awaited here; from 2026-07-28, which has no server-to-client requests, an
    /// `input_required` result holding the question, whose answer comes with the client's retry
    /// of the same call. Only a yes (the form accepted with `confirm` true) to this very
    /// question confirms it: the hash it was asked about comes back; why not, otherwise.
    async fn ask(
        &self,
        question: Question,
        classes: SideEffects,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<Asked, String> {
        // The capabilities come from `initialize` on older versions, with each request from
        // 2026-07-28 on: the SDK's context has both.
        let can_ask = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.elicitation.is_some());
        if !can_ask {
            return Err(format!(
                "{DEFAULT_POLICY} runs it once the client's user confirms it, but the client \
                 cannot ask its user (it did not declare the elicitation capability); nothing \
                 was run",
                DEFAULT_POLICY = policy::DEFAULT_POLICY
            ));
        }
        let params = question_params(&question, classes)?;
        let has_requests = context
            .protocol_version()
            .is_none_or(|version| version.has_initialize());
        if has_requests {
            let answer =
                context.peer.create_elicitation(params).await.map_err(|e| {
                    format!("asking the client's user failed ({e}); nothing was run")
                })?;
            return says_yes(&answer).map(|()| Asked::Confirmed(question.hash));
        }
        // A retry answers the question its state names, if that question was about this very
        // skill and input; anything else is asked (again).
        let mut asked = self.questions.lock().expect("questions lock");
        let answered = request
            .request_state
            .as_ref()
            .and_then(|state| asked.remove(state))
            .filter(|earlier| earlier.skill == question.skill && earlier.input == question.input);
        if let Some(earlier) = answered {
            let answer = request
                .input_responses
                .as_ref()
                .and_then(|responses| responses.get(CONFIRM_KEY))
                .ok_or("the client retried without its user's answer; nothing was run")?;
            let answer: ElicitResult = serde_json::from_value(answer.clone()).map_err(|e| {
                format!("the client's answer is not an elicitation result ({e}); nothing was run")
            })?;
            return says_yes(&answer).map(|()| Asked::Confirmed(earlier.hash));
        }
        // Questions nobody answers are not kept forever: the oldest goes first.
        while asked.len() >= OPEN_QUESTIONS {
            let oldest = asked.keys().next().cloned().expect("not empty");
            asked.remove(&oldest);
        }
        // Only one client talks to this server (stdio), so a count names a question well enough.
        let state = format!("{:020}", self.asked.fetch_add(1, Ordering::Relaxed));
        asked.insert(state.clone(), question);
        let mut requests = InputRequests::new();
        requests.insert(
            CONFIRM_KEY.to_owned(),
            InputRequest::Elicitation(ElicitRequest::new(params)),
        );
        Ok(Asked::Pending(InputRequiredResult::new(
            Some(requests),
            Some(state),
        )))
    }
}

/// How many unanswered questions (2026-07-28's `input_required`) the server keeps.
const OPEN_QUESTIONS: usize = 64;

/// The key of kavi's question in an `input_required` result and of its answer in the retry.
const CONFIRM_KEY: &str = "confirm";

/// What the client's user is asked about: this skill, at this trusted version, with this input.
struct Question {
    skill: String,
    input: Value,
    hash: String,
}

/// Where asking got to: confirmed (for the skill's version it was asked about), or a question
/// the client answers by calling again (2026-07-28).
enum Asked {
    Confirmed(String),
    Pending(InputRequiredResult),
}

/// The question kavi asks: the skill, its classes and its input, with a form of one required
/// boolean, `confirm`.
fn question_params(
    question: &Question,
    classes: SideEffects,
) -> Result<ElicitRequestParams, String> {
    let name = &question.skill;
    let schema = ElicitationSchema::builder()
        .required_bool_with("confirm", |b| {
            b.title("Run it")
                .description(format!("Run `{name}` ({classes})"))
        })
        .build()
        .map_err(|e| format!("kavi could not build its question: {e}"))?;
    let message = format!(
        "An agent asks kavi to run the trusted skill `{name}`, which is {classes}, with this \
         input: {input}. It runs confined and is recorded. Run it?",
        input = question.input
    );
    Ok(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    })
}

/// Whether the client's user said yes: the form accepted with `confirm` true; why not, otherwise.
fn says_yes(answer: &ElicitResult) -> Result<(), String> {
    let confirmed = answer.action == ElicitationAction::Accept
        && answer
            .content
            .as_ref()
            .is_some_and(|content| content["confirm"] == Value::Bool(true));
    match (confirmed, &answer.action) {
        (true, _) => Ok(()),
        (false, ElicitationAction::Cancel) => {
            Err("the client's user cancelled the question; nothing was run".into())
        }
        (false, _) => Err("the client's user declined to run it; nothing was run".into()),
    }
}

/// A name too long to show whole: its first 64 characters, and how long it was.
fn shortened(name: &str) -> String {
    if name.chars().count() <= 64 {
        return name.to_owned();
    }
    let head: String = name.chars().take(64).collect();
    format!("{head}... ({} bytes)", name.len())
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
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        let mut config = ServerConfig::new(capabilities);
        config.server_info.name = "kavi".into();
        config.server_info.version = env!("CARGO_PKG_VERSION").into();
        config.instructions = Some(
            "Trusted skills of this kavi workspace. READ_ONLY skills run when called; others \
             only when the workspace's policies/mcp.toml pre-approves them for this client, or \
             lets its user confirm them (kavi then asks through elicitation). Its execution \
             records and runs are resources (kavi://executions/{id}, kavi://runs/{id}), newest \
             first; subscribe to kavi://executions or kavi://runs to hear of new ones. Its \
             chains are prompts: each says which tools to call, in order, with which input."
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

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let runner = self.runners.runner();
        let cursor = request.and_then(|r| r.cursor);
        prompts::list(
            runner.root,
            runner.templates,
            cursor.as_deref(),
            self.page(),
        )
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let runner = self.runners.runner();
        prompts::get(
            runner.root,
            runner.templates,
            &request.name,
            request.arguments,
        )
        .map(Into::into)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let cursor = request.and_then(|r| r.cursor);
        let listed = resources::list(&self.ledger()?, cursor.as_deref(), self.page())?;
        // A client that lists the records is told when there are new ones.
        self.watch(&context);
        Ok(listed)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(resources::templates()).with_ttl_ms(0))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        resources::read(&self.ledger()?, &request.uri, self.page()).map(Into::into)
    }

    /// Up to 2025-11-25: `notifications/resources/updated` for `uri` from now on.
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // Reading it checks that it exists, and is what a change is measured against.
        let ledger = self.ledger()?;
        resources::read(&ledger, &request.uri, self.page())?;
        self.watch.subscribe(&ledger, &request.uri, self.page());
        self.watch(&context);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.watch.unsubscribe(&request.uri);
        Ok(())
    }

    /// From 2026-07-28: what a `subscriptions/listen` stream may carry: the tool and resource
    /// lists' changes, and updates of kavi's own resources.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let uris: Vec<String> = requested
            .resource_subscriptions
            .iter()
            .flatten()
            .filter(|uri| resources::is_kavi_uri(uri))
            .cloned()
            .collect();
        Some(
            SubscriptionFilter::builder()
                .tools_list_changed()
                .resources_list_changed()
                .resource_subscriptions(uris)
                .build(),
        )
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let sink = context.sink().clone();
        self.watch
            .listen(&self.ledger()?, sink.clone(), self.page());
        self.watch(context.request_context());
        context.cancelled().await;
        self.watch.stop_listening(&sink);
        Ok(())
    }

    /// The SDK hands a request of the protocol here, as an unknown method, when its params do not
    /// fit the method's shape: that is invalid params (-32602), not a missing method.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let CustomRequest { method, params, .. } = request;
        if method == CallToolRequestMethod::VALUE {
            let why = serde_json::from_value::<CallToolRequestParams>(params.unwrap_or_default())
                .err()
                .map_or_else(String::new, |e| format!(": {e}"));
            return Err(McpError::invalid_params(
                format!("invalid params for `{method}`{why}"),
                None,
            ));
        }
        let typed = [
            PingRequestMethod::VALUE,
            DiscoverRequestMethod::VALUE,
            ListToolsRequestMethod::VALUE,
            ListResourcesRequestMethod::VALUE,
            ListResourceTemplatesRequestMethod::VALUE,
            ReadResourceRequestMethod::VALUE,
            SubscribeRequestMethod::VALUE,
            UnsubscribeRequestMethod::VALUE,
            ListPromptsRequestMethod::VALUE,
            GetPromptRequestMethod::VALUE,
            CompleteRequestMethod::VALUE,
            SetLevelRequestMethod::VALUE,
        ];
        if typed.contains(&method.as_str()) {
            return Err(McpError::invalid_params(
                format!("invalid params for `{method}`"),
                None,
            ));
        }
        Err(McpError::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!("Method not found: `{method}`"),
            None,
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let result = self.call(request, &context).await;
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
            // From 2026-07-28, notifications go to the client's `subscriptions/listen` streams.
            for sink in self.watch.listeners() {
                let _ = sink.notify_tool_list_changed().await;
            }
        }
        Ok(result)
    }
}
