//! The chat: a bounded conversational surface over trusted skills (`kavi chat`).
//!
//! One message is at most one execution: one skill, or one declared chain; no loops, no
//! retries, no planning beyond what an intent in `policies/chat.toml` declares ([`intents`]).
//! The deterministic parser matches the message against the intents' patterns; the plan is the
//! intent's skill or chain with its templates rendered over the message's named groups and the
//! session's earlier results (`last`, `last_<skill>`: "summarize that"; `exec:<id>` and
//! `ref:last_<skill>` name the one meant). A READ_ONLY plan runs
//! at once; any other class the policy allows waits for a yes, which runs the stashed plan as it
//! was shown, never a re-parse. Every execution is an ordinary execution record (caller `chat`),
//! run through [`crate::executions::Runner`], like `kavi skill run`.

pub mod intents;
pub mod llm;

use std::collections::VecDeque;
use std::time::Instant;

use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::chains::{self, Chain, ChainContext, Confirm};
use crate::executions::{Lineage, Runner};
use crate::ledger::{ExecutionRecord, Ledger};
use crate::skills::SideEffects;
use crate::template::TemplateEngine;

pub use intents::{ChatPolicy, Target, Understood};

/// How many earlier results a session keeps to refer to.
const ANCHORS: usize = 10;

/// How an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The plan ran and succeeded.
    Executed,
    /// The plan ran and failed (its records say how).
    Failed,
    /// The plan has a side effect nobody confirmed yet; nothing ran.
    NeedsConfirmation,
    /// The plan may not run (not trusted, a class the chat may not run, nothing to refer to).
    Refused,
    /// No intent matches.
    Unsupported,
    /// A stashed plan was declined.
    Declined,
    /// A yes came after the plan had waited longer than `confirm_within`; nothing ran.
    Expired,
    /// The message asks for more than one thing, or refers to something the chat cannot tell;
    /// nothing ran, and the answer asks back (`question`, `candidates`).
    NeedsClarification,
    /// The list of what the chat understands.
    Help,
}

/// What a message was understood as.
#[derive(Debug, Clone, Serialize)]
pub struct ParsedIntent {
    pub name: String,
    /// Which parser decided: `llm`, `deterministic`, or `again` for a repeat of the last plan.
    pub parser: &'static str,
    /// The message's named groups.
    pub groups: Map<String, Value>,
    /// For the LLM parser: by group, what justifies the value the model gave it (`message`: it
    /// is text of the message; `path`: a path whose file name the message says; `earlier
    /// result`: a value an earlier result of the session holds).
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub grounding: Map<String, Value>,
}

/// What would run: shown before it runs, and run exactly as shown.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub intent: String,
    #[serde(flatten)]
    pub target: Target,
    /// The skill's input, or the chain's parameters.
    pub input: Map<String, Value>,
    /// Every side-effect class it has (a chain's: all of its steps').
    pub side_effect: String,
    #[serde(skip)]
    classes: SideEffects,
}

/// The answer to one message: everything that was decided and done, for a person or a script.
#[derive(Debug, Serialize)]
pub struct Answer {
    pub message: String,
    pub status: Status,
    pub intent: Option<ParsedIntent>,
    pub plan: Option<Plan>,
    pub records: Vec<ExecutionRecord>,
    pub error: Option<String>,
    /// Why the LLM parser's answer was not used, when a gateway is configured and it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm_error: Option<String>,
    /// For `help` and `unsupported`: what the chat understands.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub supported: Vec<String>,
    /// For `needs_clarification`: what the chat asks back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// For `needs_clarification`: messages that would each be one clear request.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<String>,
    /// A plan that waited for a yes when this message came, and what became of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub put_aside: Option<PutAside>,
}

/// A plan that waited for a yes and was put aside, unrun.
#[derive(Debug, Serialize)]
pub struct PutAside {
    pub plan: Plan,
    pub why: String,
}

/// What the chat asks back instead of running anything.
struct Clarification {
    question: String,
    candidates: Vec<String>,
}

impl Answer {
    fn new(message: &str, status: Status) -> Self {
        Self {
            message: message.to_owned(),
            status,
            intent: None,
            plan: None,
            records: Vec::new(),
            error: None,
            llm_error: None,
            supported: Vec::new(),
            question: None,
            candidates: Vec::new(),
            put_aside: None,
        }
    }

    fn clarify(message: &str, clarification: Clarification) -> Self {
        let mut answer = Self::new(message, Status::NeedsClarification);
        answer.question = Some(clarification.question);
        answer.candidates = clarification.candidates;
        answer
    }
}

/// An earlier result the session can refer to.
#[derive(Debug, Clone)]
struct Anchor {
    skill: String,
    execution_id: String,
    output: Value,
}

/// How many executions an ambiguous `exec:` prefix offers to choose from.
const CANDIDATES: usize = 10;

/// A reference that names its result: `exec:<id>` (an execution id or a unique prefix of it,
/// any session's) or `ref:last_<skill>` (the newest result of that skill in this session).
enum Explicit {
    Execution(String),
    LastOf(String),
}

impl Explicit {
    fn parse(value: &str) -> Option<Self> {
        let value = value.trim().to_lowercase();
        if let Some(id) = value.strip_prefix("exec:") {
            return (!id.is_empty()).then(|| Explicit::Execution(id.to_owned()));
        }
        value
            .strip_prefix("ref:last_")
            .filter(|skill| !skill.is_empty())
            .map(|skill| Explicit::LastOf(skill.to_owned()))
    }
}

/// The distinct strings at `paths` in `output`, in order.
fn values_at(output: &Value, paths: &[String]) -> Vec<String> {
    let mut values: Vec<String> = Vec::new();
    for path in paths {
        let selected = match crate::jsonpath::select(output, path) {
            Ok(Value::Array(items)) => items,
            Ok(one) => vec![one],
            Err(_) => Vec::new(),
        };
        for item in selected {
            if let Some(text) = item.as_str()
                && !values.iter().any(|v| v == text)
            {
                values.push(text.to_owned());
            }
        }
    }
    values
}

/// One conversation: the policy, what runs skills, and what was said and done so far.
pub struct Session<'a> {
    pub policy: &'a ChatPolicy,
    pub runner: &'a Runner<'a>,
    pub templates: &'a TemplateEngine,
    /// Loads a chain by name (from the workspace's `chains/`).
    pub load_chain: &'a dyn Fn(&str) -> Result<Chain, String>,
    /// Tried first when a gateway is configured.
    pub llm: Option<llm::LlmParser<'a>>,
    anchors: VecDeque<Anchor>,
    last_plan: Option<Plan>,
    /// The plan that waits for a yes, and since when.
    stashed: Option<(Plan, Instant)>,
}

/// Steps of a confirmed (or READ_ONLY) chain plan are confirmed already.
struct Confirmed;

impl Confirm for Confirmed {
    fn confirmed(&self, _skill: &str, _classes: SideEffects) -> bool {
        true
    }
}

impl<'a> Session<'a> {
    pub fn new(
        policy: &'a ChatPolicy,
        runner: &'a Runner<'a>,
        templates: &'a TemplateEngine,
        load_chain: &'a dyn Fn(&str) -> Result<Chain, String>,
    ) -> Self {
        Self {
            policy,
            runner,
            templates,
            load_chain,
            llm: None,
            anchors: VecDeque::new(),
            last_plan: None,
            stashed: None,
        }
    }

    /// Whether a plan waits for a yes.
    pub fn has_stashed_plan(&self) -> bool {
        self.stashed.is_some()
    }

    fn supported(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.policy.intents.iter().map(|i| i.help.clone()).collect();
        lines.extend(["again".to_owned(), "help".to_owned()]);
        lines
    }

    /// Answers one message; `confirmed` says yes in advance to a side effect the policy allows.
    /// A plan that waited for a yes is put aside, and the answer says so.
    pub async fn message(
        &mut self,
        text: &str,
        confirmed: bool,
        cancel: &CancellationToken,
    ) -> Answer {
        let put_aside = self.stashed.take().map(|(plan, since)| PutAside {
            plan,
            why: if since.elapsed() > self.policy.confirm_within {
                self.expired_why()
            } else {
                "a message other than yes or no came before a yes; nothing was run".into()
            },
        });
        let mut answer = self.answer(text, confirmed, cancel).await;
        answer.put_aside = put_aside;
        answer
    }

    fn expired_why(&self) -> String {
        format!(
            "it waited more than {} for a yes (`confirm_within` in {}); nothing was run",
            humantime::format_duration(self.policy.confirm_within),
            intents::DEFAULT_POLICY
        )
    }

    async fn answer(&mut self, text: &str, confirmed: bool, cancel: &CancellationToken) -> Answer {
        let words = text.trim().to_lowercase();
        if matches!(words.as_str(), "help" | "?") {
            let mut answer = Answer::new(text, Status::Help);
            answer.supported = self.supported();
            return answer;
        }
        let mut llm_error = None;
        let (intent, plan) = if matches!(words.as_str(), "again" | "do it again") {
            let Some(plan) = self.last_plan.clone() else {
                let mut answer = Answer::new(text, Status::Refused);
                answer.error = Some("nothing ran yet in this session to run again".into());
                return answer;
            };
            let intent = ParsedIntent {
                name: plan.intent.clone(),
                parser: "again",
                groups: Map::new(),
                grounding: Map::new(),
            };
            (intent, Ok(plan))
        } else {
            // One request a message: never a part of the message run as if it were all, whichever
            // parser would pick one part.
            let understood = self.policy.understand(text);
            if let Understood::Several(parts) = &understood {
                let names: Vec<String> = parts
                    .iter()
                    .map(|(part, intent)| format!("`{part}` ({})", intent.name))
                    .collect();
                return Answer::clarify(
                    text,
                    Clarification {
                        question: format!(
                            "the message asks for {} things: {}; the chat runs one request a \
                             message, so nothing was run: send them one at a time",
                            parts.len(),
                            names.join(", ")
                        ),
                        candidates: parts.iter().map(|(part, _)| part.clone()).collect(),
                    },
                );
            }
            // The model first, when there is one; on any failure the patterns decide.
            let mut grounding = Map::new();
            let by_model = match &self.llm {
                None => None,
                Some(llm) => match llm.parse(self.policy, text).await {
                    // The model's values count only where the message or the session justify
                    // them; otherwise the patterns decide, as when it fails.
                    Ok(Some(chosen)) => match self.grounding(text, &chosen.1) {
                        Ok(grounds) => {
                            grounding = grounds;
                            Some((chosen, "llm"))
                        }
                        Err(reason) => {
                            llm_error = Some(reason);
                            None
                        }
                    },
                    Ok(None) => None,
                    Err(reason) => {
                        llm_error = Some(reason);
                        None
                    }
                },
            };
            let chosen = match by_model {
                Some(chosen) => Some(chosen),
                None => match understood {
                    Understood::One(chosen) => Some((chosen, "deterministic")),
                    Understood::Nothing => None,
                    // Found above, before the model was asked.
                    Understood::Several(_) => None,
                },
            };
            let Some(((intent, groups), parser)) = chosen else {
                let mut answer = Answer::new(text, Status::Unsupported);
                answer.error = Some("no intent of policies/chat.toml matches the message".into());
                answer.llm_error = llm_error;
                answer.supported = self.supported();
                return answer;
            };
            let mut groups: Map<String, Value> = groups
                .into_iter()
                .map(|(k, v)| (k, Value::String(intents::unquote(&v).to_owned())))
                .collect();
            if let Err(clarification) = self.resolve_references(text, intent, &mut groups) {
                let mut answer = Answer::clarify(text, clarification);
                answer.intent = Some(ParsedIntent {
                    name: intent.name.clone(),
                    parser,
                    groups,
                    grounding: Map::new(),
                });
                answer.llm_error = llm_error;
                return answer;
            }
            let plan = self.plan(intent, &groups);
            let parsed = ParsedIntent {
                name: intent.name.clone(),
                parser,
                groups,
                grounding: if parser == "llm" {
                    grounding
                } else {
                    Map::new()
                },
            };
            (parsed, plan)
        };
        let mut answer = Answer::new(text, Status::Refused);
        answer.intent = Some(intent);
        answer.llm_error = llm_error;
        let plan = match plan {
            Ok(plan) => plan,
            Err(error) => {
                answer.error = Some(error);
                return answer;
            }
        };
        answer.plan = Some(plan.clone());
        let classes = plan.classes;
        if let Some(class) = classes.iter().find(|c| !self.policy.allow.contains(c)) {
            answer.error = Some(format!(
                "the chat may not run {} skills (`allow` in {}); nothing was run",
                class.as_str(),
                intents::DEFAULT_POLICY
            ));
            return answer;
        }
        if !classes.is_read_only() && !confirmed {
            answer.status = Status::NeedsConfirmation;
            answer.error = Some(format!(
                "`{}` is {classes}: nothing was run; confirm to run it as planned",
                plan.target.name()
            ));
            self.stashed = Some((plan, Instant::now()));
            return answer;
        }
        self.execute(plan, answer, cancel).await
    }

    /// Runs the plan that waited for a yes, as it was shown.
    pub async fn confirm(&mut self, text: &str, cancel: &CancellationToken) -> Answer {
        let Some((plan, since)) = self.stashed.take() else {
            let mut answer = Answer::new(text, Status::Refused);
            answer.error = Some("nothing waits for a yes".into());
            return answer;
        };
        if since.elapsed() > self.policy.confirm_within {
            let mut answer = Answer::new(text, Status::Expired);
            answer.error = Some(format!("{}; send the message again", self.expired_why()));
            answer.plan = Some(plan);
            return answer;
        }
        let mut answer = Answer::new(text, Status::Refused);
        answer.plan = Some(plan.clone());
        self.execute(plan, answer, cancel).await
    }

    /// Puts aside the plan that waited for a yes.
    pub fn decline(&mut self, text: &str) -> Answer {
        let mut answer = Answer::new(text, Status::Declined);
        answer.plan = self.stashed.take().map(|(plan, _)| plan);
        answer
    }

    /// What justifies each value the model gave, or why one is not: a value must be text of the
    /// message, a path whose file name (without its extension) the message says, or a value
    /// an earlier result of this session holds.
    fn grounding(
        &self,
        message: &str,
        groups: &indexmap::IndexMap<String, String>,
    ) -> Result<Map<String, Value>, String> {
        let said = message.to_lowercase();
        let words: Vec<&str> = said
            .split(|c: char| !c.is_alphanumeric() && c != '_' && c != '-')
            .filter(|w| !w.is_empty())
            .collect();
        let mut grounds = Map::new();
        for (group, value) in groups {
            let value = intents::unquote(value);
            let lowered = value.to_lowercase();
            let stem = std::path::Path::new(&lowered)
                .file_stem()
                .and_then(|stem| stem.to_str())
                .filter(|stem| *stem != lowered);
            let ground = if !lowered.is_empty() && said.contains(&lowered) {
                "message"
            } else if stem.is_some_and(|stem| stem.len() >= 3 && words.contains(&stem)) {
                "path"
            } else if self.anchors.iter().any(|a| holds(&a.output, value)) {
                "earlier result"
            } else {
                return Err(format!(
                    "the model gave `{group}` the value {}, which neither the message nor an \
                     earlier result of this session says",
                    Value::String(value.to_owned())
                ));
            };
            grounds.insert(group.clone(), Value::String(ground.into()));
        }
        Ok(grounds)
    }

    /// Puts in place of each reference word ("that") in `groups` the value it stands for: from
    /// the newest earlier result that holds a value the group can take (`references` in the
    /// policy). Asks back instead when none does, when that result holds several, or when the
    /// group cannot be given by reference.
    fn resolve_references(
        &self,
        message: &str,
        intent: &intents::Intent,
        groups: &mut Map<String, Value>,
    ) -> Result<(), Clarification> {
        for (group, value) in groups.iter_mut() {
            let Some(word) = value.as_str() else {
                continue;
            };
            let explicit = Explicit::parse(word);
            if explicit.is_none() && !self.policy.is_reference(word) {
                continue;
            }
            let word = word.to_owned();
            let Some(paths) = self.policy.references.get(group) else {
                let again = self
                    .last_plan
                    .as_ref()
                    .is_some_and(|plan| plan.intent == intent.name);
                return Err(Clarification {
                    question: format!(
                        "`{word}` cannot stand for the {group} of `{}`: say which {group}{}; \
                         nothing was run",
                        intent.name,
                        if again {
                            ", or `again` to run the last plan again"
                        } else {
                            ""
                        }
                    ),
                    candidates: if again {
                        vec!["again".into()]
                    } else {
                        Vec::new()
                    },
                });
            };
            let found = match explicit {
                Some(explicit) => {
                    Some(self.named_result(message, intent, &word, explicit, group, paths)?)
                }
                None => self.anchors.iter().rev().find_map(|anchor| {
                    let values = values_at(&anchor.output, paths);
                    (!values.is_empty()).then(|| (anchor.skill.clone(), values))
                }),
            };
            match found {
                None => {
                    return Err(Clarification {
                        question: format!(
                            "nothing earlier in this session is a {group} `{}` can take for \
                             `{word}`: say which {group}; nothing was run",
                            intent.name
                        ),
                        candidates: Vec::new(),
                    });
                }
                Some((_, mut values)) if values.len() == 1 => {
                    *value = Value::String(values.remove(0));
                }
                Some((skill, values)) => {
                    return Err(Clarification {
                        question: format!(
                            "`{word}` could be any of {} {group}s `{skill}` gave: say which; \
                             nothing was run",
                            values.len()
                        ),
                        candidates: values
                            .iter()
                            .map(|v| message.trim().replacen(&word, v, 1))
                            .collect(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The values for `group` that the result an explicit reference names holds, with the
    /// skill that gave it; asks back when there is no such result, when an `exec:` prefix
    /// names several executions, or when the result holds no such value.
    fn named_result(
        &self,
        message: &str,
        intent: &intents::Intent,
        word: &str,
        explicit: Explicit,
        group: &str,
        paths: &[String],
    ) -> Result<(String, Vec<String>), Clarification> {
        // Messages that would each name one of this session's results that holds a value
        // for the group, newest first.
        let instead = |name: &dyn Fn(&Anchor) -> String| {
            let mut candidates: Vec<String> = Vec::new();
            for anchor in self.anchors.iter().rev() {
                let candidate = message.trim().replacen(word, &name(anchor), 1);
                if !values_at(&anchor.output, paths).is_empty() && !candidates.contains(&candidate)
                {
                    candidates.push(candidate);
                }
            }
            candidates
        };
        let ask = |question: String, candidates: Vec<String>| Clarification {
            question: format!("{question}; nothing was run"),
            candidates,
        };
        let (skill, output) = match explicit {
            Explicit::LastOf(skill) => {
                let Some(anchor) = self.anchors.iter().rev().find(|a| a.skill == skill) else {
                    return Err(ask(
                        format!(
                            "nothing earlier in this session came from `{skill}` for `{word}`: \
                             say which {group}"
                        ),
                        instead(&|anchor| format!("ref:last_{}", anchor.skill)),
                    ));
                };
                (anchor.skill.clone(), anchor.output.clone())
            }
            Explicit::Execution(id) => {
                let found = Ledger::open_existing(self.runner.ledger)
                    .and_then(|ledger| ledger.executions_by_prefix(&id, CANDIDATES + 1))
                    .map_err(|e| ask(format!("`{word}` cannot be looked up: {e}"), Vec::new()))?;
                match found.as_slice() {
                    [] => {
                        return Err(ask(
                            format!(
                                "no execution in the ledger has an id starting with `{id}`: say \
                                 which {group}"
                            ),
                            instead(&|anchor| format!("exec:{}", short_id(&anchor.execution_id))),
                        ));
                    }
                    [record] => match (&record.output, record.success) {
                        (Some(output), true) => (record.skill.clone(), output.clone()),
                        _ => {
                            return Err(ask(
                                format!(
                                    "execution {} (`{}`) failed, so it has no result for `{word}`",
                                    record.execution_id, record.skill
                                ),
                                Vec::new(),
                            ));
                        }
                    },
                    several => {
                        return Err(ask(
                            format!(
                                "`{word}` could be {} executions: say which",
                                if several.len() > CANDIDATES {
                                    format!("more than {CANDIDATES}")
                                } else {
                                    several.len().to_string()
                                }
                            ),
                            several
                                .iter()
                                .take(CANDIDATES)
                                .map(|r| {
                                    message.trim().replacen(
                                        word,
                                        &format!("exec:{}", r.execution_id),
                                        1,
                                    )
                                })
                                .collect(),
                        ));
                    }
                }
            }
        };
        let values = values_at(&output, paths);
        if values.is_empty() {
            return Err(ask(
                format!(
                    "`{word}` is a result of `{skill}`, which holds no {group} `{}` can take: say \
                     which {group}",
                    intent.name
                ),
                Vec::new(),
            ));
        }
        Ok((skill, values))
    }

    /// The template variables: the message's groups, and the session's earlier results.
    fn variables(&self, groups: &Map<String, Value>) -> minijinja::Value {
        let mut vars = groups.clone();
        if let Some(last) = self.anchors.back() {
            vars.insert("last".into(), last.output.clone());
        }
        for anchor in &self.anchors {
            vars.insert(format!("last_{}", anchor.skill), anchor.output.clone());
        }
        minijinja::Value::from_serialize(Value::Object(vars))
    }

    fn plan(&self, intent: &intents::Intent, groups: &Map<String, Value>) -> Result<Plan, String> {
        let vars = self.variables(groups);
        let mut input = Map::new();
        for (field, template) in &intent.fields {
            let value = self.templates.render_str(template, &vars).map_err(|e| {
                if self.anchors.is_empty() && template.contains("last") {
                    "there is no earlier result in this session to refer to".to_owned()
                } else {
                    format!(
                        "intent `{}`: failed to render `{field}`: {}",
                        intent.name,
                        crate::template::describe_error(&e)
                    )
                }
            })?;
            if value.is_empty() {
                return Err(format!(
                    "intent `{}`: `{field}` came out empty; nothing to run it with",
                    intent.name
                ));
            }
            input.insert(field.clone(), Value::String(value));
        }
        let classes = match &intent.target {
            Target::Skill(skill) => {
                let ready = self.runner.ready(skill).map_err(|e| e.to_string())?;
                ready.proposal.side_effect
            }
            Target::Chain(name) => {
                let chain = (self.load_chain)(name)?;
                let mut classes: Option<SideEffects> = None;
                for step in &chain.steps {
                    let ready = self.runner.ready(&step.skill).map_err(|e| e.to_string())?;
                    let step_classes = ready.proposal.side_effect;
                    classes = Some(match classes {
                        None => step_classes,
                        Some(classes) => classes.union(step_classes),
                    });
                }
                classes.ok_or_else(|| format!("chain `{name}` has no steps"))?
            }
        };
        Ok(Plan {
            intent: intent.name.clone(),
            target: intent.target.clone(),
            input,
            side_effect: classes.to_string(),
            classes,
        })
    }

    async fn execute(
        &mut self,
        plan: Plan,
        mut answer: Answer,
        cancel: &CancellationToken,
    ) -> Answer {
        let lineage = Lineage {
            caller: Some("chat".into()),
            ..Lineage::default()
        };
        let records = match &plan.target {
            Target::Skill(skill) => self.run_skill(skill, &plan.input, &lineage, cancel).await,
            Target::Chain(chain) => self.run_chain(chain, &plan.input, lineage, cancel).await,
        };
        match records {
            Err(error) => answer.error = Some(error),
            Ok(records) => {
                let failed = records.iter().find(|r| !r.success);
                answer.status = if failed.is_some() || records.is_empty() {
                    Status::Failed
                } else {
                    Status::Executed
                };
                answer.error = failed.and_then(|r| r.error.clone());
                for record in records.iter().filter(|r| r.success) {
                    if let Some(output) = &record.output {
                        self.anchors.push_back(Anchor {
                            skill: record.skill.clone(),
                            execution_id: record.execution_id.clone(),
                            output: output.clone(),
                        });
                    }
                }
                while self.anchors.len() > ANCHORS {
                    self.anchors.pop_front();
                }
                answer.records = records;
            }
        }
        self.last_plan = Some(plan);
        answer
    }

    async fn run_skill(
        &self,
        skill: &str,
        input: &Map<String, Value>,
        lineage: &Lineage,
        cancel: &CancellationToken,
    ) -> Result<Vec<ExecutionRecord>, String> {
        // The trust check again: the files may have changed since the plan was shown.
        let ready = self.runner.ready(skill).map_err(|e| e.to_string())?;
        let record = self
            .runner
            .run(&ready, Value::Object(input.clone()), lineage, cancel)
            .await
            .map_err(|e| e.to_string())?;
        Ok(vec![record])
    }

    async fn run_chain(
        &self,
        name: &str,
        input: &Map<String, Value>,
        lineage: Lineage,
        cancel: &CancellationToken,
    ) -> Result<Vec<ExecutionRecord>, String> {
        let chain = (self.load_chain)(name)?;
        let sets: Vec<(String, String)> = input
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect();
        let params = crate::spec::resolve_params(&chain.params, &sets).map_err(|problems| {
            problems
                .iter()
                .map(|p| p.message.clone())
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        let context = ChainContext {
            runner: self.runner,
            templates: self.templates,
            confirm: &Confirmed,
            lineage,
            cancel,
        };
        let results = chains::run(&chain, &params, &context)
            .await
            .map_err(|e| e.to_string())?;
        Ok(results.into_iter().filter_map(|r| r.record).collect())
    }
}

/// The first eight characters of an execution id, as answers show it.
fn short_id(id: &str) -> &str {
    &id[..8.min(id.len())]
}

/// Whether `value` is a string somewhere in `output`.
fn holds(output: &Value, value: &str) -> bool {
    match output {
        Value::String(text) => text == value,
        Value::Array(items) => items.iter().any(|item| holds(item, value)),
        Value::Object(fields) => fields.values().any(|field| holds(field, value)),
        _ => false,
    }
}

/// The answer as a person reads it.
pub fn describe(answer: &Answer) -> String {
    let mut lines = Vec::new();
    if let Some(put_aside) = &answer.put_aside {
        lines.push(format!(
            "put aside: {} {}: {}",
            put_aside.plan.target,
            Value::Object(put_aside.plan.input.clone()),
            put_aside.why
        ));
    }
    if let Some(reason) = &answer.llm_error {
        lines.push(format!("the gateway's parse was not used: {reason}"));
    }
    if let Some(intent) = &answer.intent {
        lines.push(format!("intent: {} ({})", intent.name, intent.parser));
    }
    if let Some(plan) = &answer.plan {
        lines.push(format!(
            "plan: {} {} [{}]",
            plan.target,
            Value::Object(plan.input.clone()),
            plan.side_effect
        ));
    }
    match answer.status {
        Status::Help => lines.push("I understand:".into()),
        Status::Unsupported => lines.push("unsupported; I understand:".into()),
        Status::NeedsConfirmation => lines.push(format!(
            "needs confirmation: {} (answer `yes`, or pass --confirmed)",
            answer.error.as_deref().unwrap_or_default()
        )),
        Status::Declined => lines.push("declined: nothing was run".into()),
        Status::Expired => lines.push(format!(
            "expired: {}",
            answer.error.as_deref().unwrap_or_default()
        )),
        Status::NeedsClarification => {
            lines.push(format!(
                "needs clarification: {}",
                answer.question.as_deref().unwrap_or_default()
            ));
            lines.extend(answer.candidates.iter().map(|c| format!("  {c}")));
        }
        Status::Refused => lines.push(format!(
            "refused: {}",
            answer.error.as_deref().unwrap_or_default()
        )),
        Status::Executed | Status::Failed => {
            for record in &answer.records {
                let result = if record.success {
                    record
                        .output
                        .as_ref()
                        .map_or_else(String::new, Value::to_string)
                } else {
                    format!("failed: {}", record.error.as_deref().unwrap_or("unknown"))
                };
                lines.push(format!(
                    "ran `{}` (execution {}): {result}",
                    record.skill,
                    short_id(&record.execution_id)
                ));
            }
            if answer.records.is_empty()
                && let Some(error) = &answer.error
            {
                lines.push(format!("failed: {error}"));
            }
        }
    }
    lines.extend(answer.supported.iter().map(|s| format!("  {s}")));
    lines.join("\n")
}

/// The JSON of an answer (one line in the REPL, pretty for a single message).
pub fn to_json(answer: &Answer, pretty: bool) -> String {
    let value = json!(answer);
    if pretty {
        serde_json::to_string_pretty(&value).expect("an answer serializes")
    } else {
        value.to_string()
    }
}
