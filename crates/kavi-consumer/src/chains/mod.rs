//! Chains: ordered steps over trusted skills, declared in `chains/*.toml`.
//!
//! A step's input is a JSON value whose strings are templates over the chain's `params`, plus
//! `map`: fields set from an earlier step's output by JSONPath (`path = "$.results[0].path"`),
//! read from the previous step unless `from` names another (by id or index). Each step's
//! execution record points at its `parent` (the previous step's, unless named). A step whose
//! input cannot be built (a mapping that selects nothing, a source step that failed), whose
//! skill may not run, or whose input does not match the skill's schema, leaves a failed record
//! without the skill being invoked. `stop_on_failure` (default true) leaves later steps unrun.
//!
//! `kavi chain run` and the `chain` node kind both run chains through [`run`].

use std::path::Path;
use std::sync::Arc;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::diagnostic::{Diagnostic, Diagnostics, SourceFile};
use crate::executions::{ExecutionError, Lineage, Runner};
use crate::ledger::{ExecutionRecord, Ledger};
use crate::skills::SideEffects;
use crate::spec::{ParamDecl, RawParam, SpecError};
use crate::template::{TemplateEngine, describe_error};

/// A validated chain.
#[derive(Debug)]
pub struct Chain {
    pub name: String,
    pub description: Option<String>,
    pub source: Arc<SourceFile>,
    pub stop_on_failure: bool,
    pub params: IndexMap<String, ParamDecl>,
    pub steps: Vec<Step>,
}

#[derive(Debug)]
pub struct Step {
    pub id: String,
    pub skill: String,
    /// Strings in it are templates over `params` and `chain`.
    pub input: Value,
    /// Input fields (dotted, `a.b`) and the JSONPath that fills each from the source step.
    pub map: Vec<(String, String)>,
    /// The step `map` reads; `None` for the first step.
    pub from: Option<usize>,
    /// The step whose record is this step's parent; `None` for the first step.
    pub parent: Option<usize>,
}

// A chain file's whole shape, for its JSON Schema (not a doc comment: the schema would take it
// as its description); the loader reads its parts one by one.
#[derive(schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[expect(
    dead_code,
    reason = "only its schema is used: the loader reads the file part by part"
)]
pub struct RawChain {
    chain: RawHeader,
    #[serde(default)]
    #[schemars(with = "IndexMap<String, RawParam>")]
    params: IndexMap<String, Spanned<RawParam>>,
    #[serde(rename = "step", default)]
    #[schemars(with = "Vec<RawStep>")]
    steps: Vec<Spanned<RawStep>>,
}

/// A chain file's `[chain]` table, read apart from its parameters and steps (the whole file's
/// shape, for its schema, is [`RawChain`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChainHeader {
    chain: RawHeader,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawHeader {
    name: String,
    description: Option<String>,
    #[serde(default = "default_true")]
    stop_on_failure: bool,
}

fn default_true() -> bool {
    true
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawStep {
    #[schemars(with = "String")]
    id: Spanned<String>,
    #[schemars(with = "String")]
    skill: Spanned<String>,
    #[schemars(with = "Option<Value>")]
    input: Option<Spanned<toml::Value>>,
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    map: IndexMap<String, Spanned<String>>,
    #[schemars(with = "Option<Value>")]
    from: Option<Spanned<toml::Value>>,
    #[schemars(with = "Option<Value>")]
    parent: Option<Spanned<toml::Value>>,
}

/// Resolves a step reference (an earlier step's id or index).
fn step_ref(
    file: &Arc<SourceFile>,
    reference: &Spanned<toml::Value>,
    ids: &[String],
    field: &str,
) -> Result<usize, Diagnostic> {
    let here = ids.len();
    let found = match reference.get_ref() {
        toml::Value::String(id) => ids.iter().position(|i| i == id),
        toml::Value::Integer(index) => usize::try_from(*index).ok().filter(|i| *i < here),
        _ => None,
    };
    found.ok_or_else(|| {
        Diagnostic::new(format!(
            "`{field}` must name an earlier step, by id or by index"
        ))
        .at(file, reference.span())
        .with_help(if ids.is_empty() {
            "the first step has no earlier step to read from".to_owned()
        } else {
            let earlier = ids
                .iter()
                .enumerate()
                .map(|(i, id)| format!("{i} (`{id}`)"))
                .collect::<Vec<_>>()
                .join(", ");
            let close = reference
                .get_ref()
                .as_str()
                .and_then(|id| crate::diagnostic::closest(id, ids.iter().map(String::as_str)));
            match close {
                Some(close) => format!("did you mean `{close}`? earlier steps: {earlier}"),
                None => format!("earlier steps: {earlier}"),
            }
        })
    })
}

/// Reads and validates a chain file. `display_path` is how messages name it.
pub fn load(
    path: &Path,
    display_path: &Path,
    templates: &TemplateEngine,
) -> Result<Chain, SpecError> {
    let text = crate::diagnostic::read_spec(path).map_err(|source| SpecError::Read {
        path: display_path.to_owned(),
        source,
    })?;
    let file = SourceFile::new(display_path, text);
    let toml_error = |e: &toml::de::Error| crate::diagnostic::toml_error(&file, e);
    let root = DeTable::parse(&file.text).map_err(|e| toml_error(&e))?;
    // The header, each parameter and each step are read on their own: every broken one is
    // reported in the same pass.
    let root_span = root.span();
    let mut header = DeTable::new();
    let (mut raw_params, mut raw_steps) = (None, None);
    for (key, value) in root.into_inner() {
        match key.get_ref().as_ref() {
            "params" => raw_params = Some(value),
            "step" => raw_steps = Some(value),
            _ => {
                header.insert(key, value);
            }
        }
    }
    let mut problems = Vec::new();
    let (header, header_problems) =
        crate::diagnostic::read_table::<RawChainHeader>(&file, root_span, header);
    problems.extend(header_problems);
    let params = crate::spec::read_params(&file, raw_params, &mut problems);
    let raw_steps = match raw_steps.map(|steps| (steps.span(), steps.into_inner())) {
        None => Vec::new(),
        Some((_, DeValue::Array(steps))) => steps.into_iter().collect(),
        Some((span, _)) => {
            problems.push(
                Diagnostic::new("`step` must be an array of tables, each a [[step]]")
                    .at(&file, span),
            );
            Vec::new()
        }
    };
    if raw_steps.is_empty() && problems.is_empty() {
        problems.push(
            Diagnostic::new("a chain needs at least one step")
                .at(&file, 0..0)
                .with_help("add a [[step]] with an id and a skill"),
        );
    }
    let mut ids: Vec<String> = Vec::new();
    let mut steps = Vec::new();
    for raw_step in raw_steps {
        let id = step_id(&raw_step);
        // Every problem of a step, its fields' and then what they say, in one pass.
        let span = raw_step.span();
        let (read, mut found) = match raw_step.into_inner() {
            DeValue::Table(table) => crate::diagnostic::read_table::<RawStep>(&file, span, table),
            other => match RawStep::deserialize(toml::de::ValueDeserializer::from(Spanned::new(
                span, other,
            ))) {
                Ok(step) => (Some(step), Vec::new()),
                Err(e) => (None, vec![toml_error(&e)]),
            },
        };
        let loaded = match read.map(|step| load_step(&file, step, &ids, templates)) {
            Some(Ok(step)) if found.is_empty() => Ok(step),
            Some(Ok(_)) | None => Err(found),
            Some(Err(more)) => {
                found.extend(more);
                Err(found)
            }
        };
        match loaded {
            Ok(step) => {
                ids.push(step.id.clone());
                steps.push(step);
            }
            Err(found) => {
                problems.extend(found);
                // A broken step still stands in its place: a later step naming it is no
                // second problem.
                ids.push(id.unwrap_or_default());
            }
        }
    }
    let Some(RawChainHeader { chain }) = header.filter(|_| problems.is_empty()) else {
        return Err(SpecError::Invalid(Diagnostics(problems)));
    };
    Ok(Chain {
        name: chain.name,
        description: chain.description,
        source: file,
        stop_on_failure: chain.stop_on_failure,
        params,
        steps,
    })
}

/// A step table's `id`, read before the step is: what a later step's `from` may name.
fn step_id(step: &Spanned<DeValue<'_>>) -> Option<String> {
    let DeValue::Table(table) = step.get_ref() else {
        return None;
    };
    match table.get("id")?.get_ref() {
        DeValue::String(id) => Some(id.to_string()),
        _ => None,
    }
}

fn load_step(
    file: &Arc<SourceFile>,
    raw: RawStep,
    ids: &[String],
    templates: &TemplateEngine,
) -> Result<Step, Vec<Diagnostic>> {
    // Each check below is independent of the others: every one that fails is reported.
    let mut problems = Vec::new();
    let id = raw.id.get_ref().clone();
    if ids.contains(&id) {
        problems.push(Diagnostic::new(format!("duplicate step id `{id}`")).at(file, raw.id.span()));
    }
    if let Some(reason) = crate::skills::invalid_name_reason(raw.skill.get_ref()) {
        problems.push(Diagnostic::new(reason).at(file, raw.skill.span()));
    }
    let input = match &raw.input {
        None => Some(Value::Object(Map::new())),
        Some(input) => step_input(file, input, templates)
            .map_err(|problem| problems.push(problem))
            .ok(),
    };
    for path in raw.map.values() {
        if let Err(e) = crate::jsonpath::check(path.get_ref()) {
            problems.push(Diagnostic::new(e).at(file, path.span()));
        }
    }
    let first = ids.is_empty();
    let mut reference = |field: &Option<Spanned<toml::Value>>, name: &str| match field {
        Some(reference) => step_ref(file, reference, ids, name)
            .map_err(|problem| problems.push(problem))
            .ok(),
        None => ids.len().checked_sub(1),
    };
    let from = reference(&raw.from, "from");
    let parent = reference(&raw.parent, "parent");
    if raw.from.is_none() && first && !raw.map.is_empty() {
        problems.push(
            Diagnostic::new("the first step has no earlier step to `map` from")
                .at(file, raw.id.span()),
        );
    }
    let Some(input) = input.filter(|_| problems.is_empty()) else {
        return Err(problems);
    };
    Ok(Step {
        id,
        skill: raw.skill.into_inner(),
        input,
        map: raw
            .map
            .into_iter()
            .map(|(k, v)| (k, v.into_inner()))
            .collect(),
        from,
        parent,
    })
}

/// A step's `input` as JSON, its templates checked: they read only `params` and `chain`.
fn step_input(
    file: &Arc<SourceFile>,
    input: &Spanned<toml::Value>,
    templates: &TemplateEngine,
) -> Result<Value, Diagnostic> {
    let value = serde_json::to_value(input.get_ref()).map_err(|e| {
        Diagnostic::new(format!("the input is not JSON: {e}")).at(file, input.span())
    })?;
    if !value.is_object() {
        return Err(
            Diagnostic::new("`input` must be a table (a JSON object)").at(file, input.span())
        );
    }
    let mut found = Vec::new();
    kavi_foundation::sandbox::json_strings(&value, &mut found);
    for template in found {
        let reads = templates.check_str(template).map_err(|e| {
            Diagnostic::new(format!("invalid template: {}", describe_error(&e)))
                .at(file, input.span())
        })?;
        if let Some(bad) = reads
            .iter()
            .find(|r| !(r.starts_with("params") || r.starts_with("chain")))
        {
            return Err(Diagnostic::new(format!(
                "a step's input may read `params` and `chain`, not `{bad}`"
            ))
            .at(file, input.span())
            .with_help("take values from earlier steps with `map` and JSONPath"));
        }
    }
    Ok(value)
}

/// How one step ended.
#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    pub id: String,
    pub skill: String,
    /// `succeeded`, `failed`, or `not_run` (an earlier step failed under `stop_on_failure`, or
    /// the chain was cancelled).
    pub status: &'static str,
    /// None for a step that was not run.
    pub record: Option<ExecutionRecord>,
}

/// Who confirmed which side effects: `kavi chain run --yes`, a prompt, or a node's `confirm`.
pub trait Confirm: Sync {
    fn confirmed(&self, skill: &str, classes: SideEffects) -> bool;
}

/// Sets a dotted field (`a.b`) in a JSON object, making objects on the way.
fn set_field(input: &mut Value, field: &str, value: Value) {
    let mut target = input;
    let mut parts = field.split('.').peekable();
    while let Some(part) = parts.next() {
        if !target.is_object() {
            *target = Value::Object(Map::new());
        }
        let object = target.as_object_mut().expect("made an object above");
        if parts.peek().is_none() {
            object.insert(part.to_owned(), value);
            return;
        }
        target = object.entry(part.to_owned()).or_insert_with(|| json!({}));
    }
}

/// Renders every string of a step's input as a template.
pub(crate) fn render_input(
    value: &mut Value,
    templates: &TemplateEngine,
    context: &minijinja::Value,
) -> Result<(), String> {
    match value {
        Value::String(s) => {
            *s = templates
                .render_str(s, context)
                .map_err(|e| format!("failed to render the input: {}", describe_error(&e)))?;
        }
        Value::Array(items) => {
            for item in items {
                render_input(item, templates, context)?;
            }
        }
        Value::Object(map) => {
            for item in map.values_mut() {
                render_input(item, templates, context)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// What a chain run needs besides the chain.
pub struct ChainContext<'a> {
    pub runner: &'a Runner<'a>,
    pub templates: &'a TemplateEngine,
    pub confirm: &'a dyn Confirm,
    /// The parent of the first step, and the pipeline run behind the chain, if any.
    pub lineage: Lineage,
    pub cancel: &'a CancellationToken,
}

/// Runs a chain with resolved parameters, step by step.
pub async fn run(
    chain: &Chain,
    params: &Map<String, Value>,
    cx: &ChainContext<'_>,
) -> Result<Vec<StepResult>, ExecutionError> {
    let context = minijinja::Value::from_serialize(json!({
        "params": params,
        "chain": { "name": chain.name },
    }));
    let mut results: Vec<StepResult> = Vec::new();
    for step in &chain.steps {
        // A cancel stops the chain whatever `stop_on_failure` says.
        let stopped = cx.cancel.is_cancelled()
            || (chain.stop_on_failure && results.iter().any(|r| r.status != "succeeded"));
        if stopped {
            results.push(StepResult {
                id: step.id.clone(),
                skill: step.skill.clone(),
                status: "not_run",
                record: None,
            });
            continue;
        }
        let lineage = Lineage {
            parent: match step.parent {
                None => cx.lineage.parent.clone(),
                Some(index) => results[index]
                    .record
                    .as_ref()
                    .map(|r| r.execution_id.clone()),
            },
            chain: Some(chain.name.clone()),
            step: Some(step.id.clone()),
            run_id: cx.lineage.run_id,
            caller: cx.lineage.caller.clone(),
        };
        let record = run_step(step, &results, &context, cx, &lineage).await?;
        results.push(StepResult {
            id: step.id.clone(),
            skill: step.skill.clone(),
            status: if record.success {
                "succeeded"
            } else {
                "failed"
            },
            record: Some(record),
        });
    }
    Ok(results)
}

async fn run_step(
    step: &Step,
    earlier: &[StepResult],
    context: &minijinja::Value,
    cx: &ChainContext<'_>,
    lineage: &Lineage,
) -> Result<ExecutionRecord, ExecutionError> {
    let runner = cx.runner;
    // The skill's class, as far as it is known before the trust check: for records of steps
    // that never reached it.
    let class_of = || {
        Ledger::open(runner.ledger)
            .and_then(|ledger| ledger.skill(&step.skill))
            .map(|s| s.side_effect)
            .unwrap_or_else(|_| "UNKNOWN".to_owned())
    };
    let fail = |input: Option<Value>, error: String| {
        runner.record_failure(&step.skill, &class_of(), input, &error, lineage)
    };
    let mut input = step.input.clone();
    if let Err(error) = render_input(&mut input, cx.templates, context) {
        return fail(None, error);
    }
    if let Some(from) = step.from.filter(|_| !step.map.is_empty()) {
        let source = &earlier[from];
        let output = match (&source.record, source.status) {
            (Some(record), "succeeded") => record.output.clone().unwrap_or(Value::Null),
            _ => {
                let error = format!(
                    "maps from step `{}`, which {}; `{}` was not run",
                    source.id,
                    if source.status == "not_run" {
                        "did not run"
                    } else {
                        "failed"
                    },
                    step.skill
                );
                return fail(Some(input), error);
            }
        };
        for (field, path) in &step.map {
            match crate::jsonpath::select(&output, path) {
                Ok(value) => set_field(&mut input, field, value),
                Err(e) => {
                    let error = format!(
                        "mapping `{field}` from step `{}` failed: {e}; `{}` was not run",
                        source.id, step.skill
                    );
                    return fail(Some(input), error);
                }
            }
        }
    }
    let ready = match runner.ready(&step.skill) {
        Ok(ready) => ready,
        Err(refusal) => return fail(Some(input), refusal.to_string()),
    };
    let class = ready.proposal.side_effect;
    if !class.is_read_only() && !cx.confirm.confirmed(&step.skill, class) {
        let error = format!(
            "`{}` is {}, which nobody confirmed; nothing was run",
            step.skill, class
        );
        return fail(Some(input), error);
    }
    runner.run(&ready, input, lineage, cx.cancel).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_fields_make_objects_on_the_way() {
        let mut input = json!({"keep": 1});
        set_field(&mut input, "path", json!("a.md"));
        set_field(&mut input, "where.line", json!(3));
        assert_eq!(
            input,
            json!({"keep": 1, "path": "a.md", "where": {"line": 3}})
        );
    }
}
