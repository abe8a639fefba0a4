//! One node's table to a [`NodeSpec`], and the checks across nodes: parameters, `needs`,
//! inputs, outputs and cache.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;
use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::LoadContext;
use super::raw::{COMMON_FIELDS, MAX_ATTEMPTS, RawCommon, RawParam, retry_on};
use crate::diagnostic::{Diagnostic, SourceFile, closest, read_table, toml_error};
use crate::node::NodeConfig;
use crate::spec::document::Key;
use crate::spec::governing::{GoverningSet, NamedFiles, Role};
use crate::spec::params::ParamDecl;
use crate::spec::{ForEach, NodeSpec, OnFailure, RetryPolicy, Trigger};
use crate::template::describe_error;

/// Reads a pipeline's `[params]` table one parameter at a time, so that every broken one is
/// reported in the same pass. A broken one stays declared (the load fails anyway): a template
/// that reads it is not also reported as reading an undeclared parameter.
pub fn read_params(
    file: &Arc<SourceFile>,
    table: Option<Spanned<DeValue<'_>>>,
    problems: &mut Vec<Diagnostic>,
) -> IndexMap<String, ParamDecl> {
    let Some(table) = table else {
        return IndexMap::new();
    };
    let span = table.span();
    let DeValue::Table(table) = table.into_inner() else {
        problems
            .push(Diagnostic::new("`params` must be a table of parameter tables").at(file, span));
        return IndexMap::new();
    };
    let mut raw = IndexMap::with_capacity(table.len());
    let mut broken = Vec::new();
    for (name, value) in table {
        let span = value.span();
        // A parameter's table is read with every problem of its fields.
        let (param, found) = match value.into_inner() {
            DeValue::Table(fields) => read_table::<RawParam>(file, span.clone(), fields),
            other => match RawParam::deserialize(toml::de::ValueDeserializer::from(Spanned::new(
                span.clone(),
                other,
            ))) {
                Ok(param) => (Some(param), Vec::new()),
                Err(e) => (None, vec![toml_error(file, &e)]),
            },
        };
        problems.extend(found);
        match param {
            Some(param) => {
                raw.insert(name.into_inner().into_owned(), Spanned::new(span, param));
            }
            None => broken.push(name.into_inner().into_owned()),
        }
    }
    let mut params = load_params(file, raw, problems);
    for name in broken {
        params.entry(name).or_insert(BROKEN_PARAM);
    }
    params
}

/// What a parameter that failed to load stands as, so that reading it is no second problem.
const BROKEN_PARAM: ParamDecl = ParamDecl {
    ty: crate::spec::params::ParamType::String,
    default: None,
    description: None,
};

/// "an integer", "a string": a TOML type's name as a sentence says it.
fn with_article(name: &str) -> String {
    let article = if name.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {name}")
}

fn load_params(
    file: &Arc<SourceFile>,
    raw: IndexMap<String, Spanned<RawParam>>,
    problems: &mut Vec<Diagnostic>,
) -> IndexMap<String, ParamDecl> {
    let mut params = IndexMap::new();
    for (name, raw) in raw {
        let span = raw.span();
        let raw = raw.into_inner();
        let default = match &raw.default {
            None => None,
            Some(value) => match raw.ty.accepts(value.get_ref()) {
                Some(json) => Some(json),
                None => {
                    problems.push(
                        Diagnostic::new(format!(
                            "default of parameter `{name}` is {}, but its type is {}",
                            with_article(value.get_ref().type_str()),
                            raw.ty.name()
                        ))
                        .at(file, value.span())
                        .with_help(format!(
                            "write {} default, or change `type`",
                            with_article(raw.ty.name())
                        )),
                    );
                    // Declared all the same: its reads are not also "undeclared".
                    params.insert(name, BROKEN_PARAM);
                    continue;
                }
            },
        };
        match (&raw.required, &default) {
            (Some(required), Some(_)) if *required.get_ref() => problems.push(
                Diagnostic::new(format!(
                    "parameter `{name}` is required but also has a default"
                ))
                .at(file, required.span())
                .with_help("drop `required`, or drop the default"),
            ),
            (Some(required), None) if !*required.get_ref() => problems.push(
                Diagnostic::new(format!("optional parameter `{name}` needs a default"))
                    .at(file, span.clone()),
            ),
            _ => {}
        }
        params.insert(
            name,
            ParamDecl {
                ty: raw.ty,
                default,
                description: raw.description,
            },
        );
    }
    params
}

fn is_valid_node_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A node that did not load: every independent problem found in it, and what it `needs`
/// (when that much was read), which is checked as a loaded node's is.
pub(super) struct Refused {
    pub problems: Vec<Diagnostic>,
    pub needs: Vec<Spanned<String>>,
}

impl From<Diagnostic> for Refused {
    fn from(problem: Diagnostic) -> Self {
        Self {
            problems: vec![problem],
            needs: Vec::new(),
        }
    }
}

pub(super) fn load_node(
    file: &Arc<SourceFile>,
    id: Key<'_>,
    node: Spanned<DeValue<'_>>,
    context: &LoadContext<'_>,
    params: &IndexMap<String, ParamDecl>,
    named_files: &mut NamedFiles,
) -> Result<(NodeSpec, GoverningSet), Refused> {
    let templates = context.templates;
    let id_span = id.span();
    let id = id.into_inner().into_owned();
    if !is_valid_node_id(&id) {
        return Err(Diagnostic::new(format!("invalid node id `{id}`"))
            .at(file, id_span)
            .with_help(
                "node ids start with a letter or `_` and hold only letters, digits, `_` and `-`",
            )
            .into());
    }
    let node_span = node.span();
    // A cached node's key covers its whole definition, as written.
    let definition = match node.get_ref() {
        DeValue::Table(table) if table.contains_key("inputs") => Some(definition_hash(
            Spanned::new(node_span.clone(), table.clone()),
        )),
        _ => None,
    };
    let DeValue::Table(table) = node.into_inner() else {
        return Err(Diagnostic::new(format!("node `{id}` must be a table"))
            .at(file, node_span)
            .into());
    };

    // Each made at its size: growing them rehashes every key again.
    let common_fields = table
        .keys()
        .filter(|key| COMMON_FIELDS.contains(&key.get_ref().as_ref()))
        .count();
    let mut common = DeTable::with_capacity(common_fields);
    let mut specific = DeTable::with_capacity(table.len() - common_fields);
    for (key, value) in table {
        if COMMON_FIELDS.contains(&key.get_ref().as_ref()) {
            common.insert(key, value);
        } else {
            specific.insert(key, value);
        }
    }
    // Without a `kind`, serde would say only "missing field `kind`"; a misspelt one is named.
    if !common.contains_key("kind")
        && let Some(typo) = specific
            .keys()
            .find(|key| closest(key.get_ref(), ["kind"]).is_some())
    {
        return Err(
            Diagnostic::new(format!("unknown field `{}`", typo.get_ref()))
                .at(file, typo.span())
                .with_help("did you mean `kind`?")
                .into(),
        );
    }
    let unknown_kind = |kind: &Spanned<String>| {
        context.registry.get(kind.get_ref()).is_none().then(|| {
            Diagnostic::new(format!("unknown node kind `{}`", kind.get_ref()))
                .at(file, kind.span())
                .with_help(context.registry.unknown_help(kind.get_ref()))
        })
    };
    let common = match read_table::<RawCommon>(file, node_span.clone(), common) {
        (Some(common), problems) if problems.is_empty() => common,
        (common, mut problems) => {
            // The fields that do read are still checked, in the same pass: the kind they name,
            // and what they need.
            let needs = match common {
                Some(common) => {
                    problems.extend(unknown_kind(&common.kind));
                    common.needs
                }
                None => Vec::new(),
            };
            return Err(Refused { problems, needs });
        }
    };

    let Some(kind) = context.registry.get(common.kind.get_ref()) else {
        return Err(Refused {
            problems: unknown_kind(&common.kind).into_iter().collect(),
            needs: common.needs,
        });
    };

    // From here each check is independent of the others: all their problems are reported in
    // one pass, as rustc reports a file's errors.
    let mut problems = Vec::new();
    let fan_out = fan_out(file, &common)
        .map_err(|problem| problems.push(problem))
        .ok()
        .flatten();
    let mut config = NodeConfig {
        // A broken `for_each` is still one: its `item` reads are not a second problem.
        fans_out: common.for_each.is_some(),
        file,
        table: Some(Spanned::new(node_span.clone(), specific)),
        span: id_span.clone(),
        root: context.root,
        templates,
        including: context.including,
        registry: context.registry,
        reads: Vec::new(),
        governing: GoverningSet::default(),
        named_files,
        further: Vec::new(),
    };
    let action = match (kind.parse)(&mut config) {
        Ok(action) => Some(action),
        Err(first) => {
            let found = std::iter::once(first).chain(std::mem::take(&mut config.further));
            problems.extend(found.map(|problem| name_shared_field(file, problem)));
            None
        }
    };

    for script in &common.uses {
        if config.govern_declared(script.get_ref()).is_none() {
            problems.push(
                Diagnostic::new(format!(
                    "`uses` names `{}`, which is not a file of the workspace",
                    script.get_ref()
                ))
                .at(file, script.span())
                .with_help(
                    "`uses` lists the scripts the node runs, relative to the workspace root",
                ),
            );
        }
    }
    if let Some(when) = &common.when {
        match templates.check_expression(when.get_ref()) {
            Err(e) => problems.push(
                Diagnostic::new(format!("invalid `when` expression: {}", describe_error(&e)))
                    .at(file, when.span()),
            ),
            Ok(reads) => match config.scope().unknown(&reads) {
                Some((_, message, help)) => problems.push(
                    Diagnostic::new(message)
                        .at(file, when.span())
                        .with_help(help),
                ),
                None => config
                    .reads
                    .extend(reads.into_iter().map(|path| (path, when.span()))),
            },
        }
    }
    if let Some(crate::spec::FanOut {
        items: ForEach::Expression(expression),
        ..
    }) = &fan_out
    {
        match templates.check_expression(expression.get_ref()) {
            Err(e) => problems.push(
                Diagnostic::new(format!(
                    "invalid `for_each` expression: {}",
                    describe_error(&e)
                ))
                .at(file, expression.span()),
            ),
            // The items are known before any instance: `item` is not among what they may read.
            Ok(reads) => match crate::template::Scope::node().unknown(&reads) {
                Some((_, message, help)) => problems.push(
                    Diagnostic::new(message)
                        .at(file, expression.span())
                        .with_help(help),
                ),
                None => config
                    .reads
                    .extend(reads.into_iter().map(|path| (path, expression.span()))),
            },
        }
    }
    check_param_reads(file, &config.reads, params, &mut problems);

    let mut cache = cache_spec(file, context.root, &common, definition)
        .map_err(|problem| problems.push(problem))
        .ok()
        .flatten();
    let retry = match common.retry {
        None => Some(RetryPolicy::default()),
        Some(raw) => retry_policy(file, raw, &mut config)
            .map_err(|problem| problems.push(problem))
            .ok(),
    };
    let (Some(action), Some(retry), true) = (action, retry, problems.is_empty()) else {
        return Err(Refused {
            problems,
            needs: common.needs,
        });
    };

    if let Some(cache) = &mut cache {
        // The policies, templates, chains and scripts that govern this node are part of its
        // key; the pipeline file is, through its definition.
        cache.governing = config
            .governing
            .members()
            .into_iter()
            .filter(|(role, ..)| *role != Role::Pipeline)
            .map(|(role, path, hash, _)| (format!("{role}:{path}"), hash))
            .collect();
    }
    let node = NodeSpec {
        id,
        span: id_span,
        kind: kind.name,
        calls_http: kind.calls_http,
        description: common.description,
        needs: common.needs,
        when: common.when,
        timeout: common.timeout,
        retry,
        on_failure: common.on_failure.unwrap_or(OnFailure::Stop),
        trigger: common.trigger.unwrap_or(Trigger::Success),
        reads: config.reads,
        cache,
        scripts: config
            .governing
            .iter()
            .filter(|member| member.role == Role::Script)
            .map(|member| member.source.path.display().to_string())
            .collect(),
        fan_out,
        concurrency: common.concurrency,
        action,
    };
    Ok((node, config.governing))
}

/// A kind's parser knows only its own fields: to its "unknown field" in the pipeline's file, the
/// fields every node takes are added, and the one a misspelt shared field probably meant.
fn name_shared_field(file: &Arc<SourceFile>, mut problem: Diagnostic) -> Diagnostic {
    let in_this_file = problem
        .location
        .as_ref()
        .is_some_and(|(f, _)| Arc::ptr_eq(f, file));
    if in_this_file && let Some(rest) = problem.message.strip_prefix("unknown field `") {
        let also = format!("every node also takes: {}", COMMON_FIELDS.join(", "));
        let word = rest.split('`').next().unwrap_or_default();
        let shared = closest(word, COMMON_FIELDS.iter().copied());
        problem.help = Some(match (problem.help.take(), shared) {
            (Some(suggestion), _) => format!("{suggestion} {also}"),
            (None, Some(close)) => format!("did you mean `{close}`? {also}"),
            (None, None) => also,
        });
    }
    problem
}

/// Reads `retry`: how many tries, how long between them, and on which failures.
fn retry_policy(
    file: &Arc<SourceFile>,
    raw: super::raw::RawRetry,
    config: &mut NodeConfig<'_>,
) -> Result<RetryPolicy, Diagnostic> {
    if !(1..=MAX_ATTEMPTS).contains(raw.attempts.get_ref()) {
        return Err(Diagnostic::new(format!(
            "`retry.attempts` counts every try and must be from 1 to {MAX_ATTEMPTS}"
        ))
        .at(file, raw.attempts.span()));
    }
    Ok(RetryPolicy {
        attempts: raw.attempts.into_inner(),
        backoff: raw.backoff.unwrap_or(Duration::ZERO),
        factor: match raw.factor {
            None => 2,
            Some(factor) if (1..=10).contains(factor.get_ref()) => factor.into_inner(),
            Some(factor) => {
                return Err(
                    Diagnostic::new("`retry.factor` must be from 1 to 10").at(file, factor.span())
                );
            }
        },
        max_backoff: raw.max_backoff,
        on: retry_on(file, &raw.on, config)?,
    })
}

/// Reads `for_each` and `max_parallel`: items written out, or one `{{ expression }}` (kept
/// without its braces, as `when` is); `max_parallel` only beside `for_each`, and at least 1.
fn fan_out(
    file: &Arc<SourceFile>,
    common: &RawCommon,
) -> Result<Option<crate::spec::FanOut>, Diagnostic> {
    let max_parallel = match &common.max_parallel {
        Some(max) if common.for_each.is_none() => {
            return Err(Diagnostic::new("`max_parallel` without `for_each`")
                .at(file, max.span())
                .with_help(
                    "only a node that runs once per item (`for_each`) has instances to limit",
                ));
        }
        Some(max) if *max.get_ref() == 0 => {
            return Err(Diagnostic::new("`max_parallel` must be at least 1").at(file, max.span()));
        }
        max => max.as_ref().map(|max| *max.get_ref()),
    };
    let Some(for_each) = &common.for_each else {
        return Ok(None);
    };
    let usage = "write the items (`for_each = [\"a\", \"b\"]`) or one expression giving a list \
                 or a JSON array (`for_each = \"{{ params.items }}\"`)";
    let items = match for_each.get_ref() {
        toml::Value::Array(items) => ForEach::Items(
            items
                .iter()
                .map(|item| serde_json::to_value(item).unwrap_or_default())
                .collect(),
        ),
        toml::Value::String(text) => {
            let inner = text
                .trim()
                .strip_prefix("{{")
                .and_then(|rest| rest.strip_suffix("}}"))
                .filter(|inner| !inner.contains("{{") && !inner.contains("}}"));
            let Some(inner) = inner else {
                return Err(Diagnostic::new(
                    "`for_each` is one expression inside `{{ }}`, giving the items",
                )
                .at(file, for_each.span())
                .with_help(usage));
            };
            ForEach::Expression(Spanned::new(for_each.span(), inner.trim().to_owned()))
        }
        other => {
            return Err(Diagnostic::new(format!(
                "`for_each` is a list or an expression, not {}",
                with_article(other.type_str())
            ))
            .at(file, for_each.span())
            .with_help(usage));
        }
    };
    Ok(Some(crate::spec::FanOut {
        items,
        span: for_each.span(),
        max_parallel,
    }))
}

/// The SHA-256 of a node's table as TOML would give it back: the same for the same fields and
/// values, however they are spaced or commented.
fn definition_hash(node: Spanned<DeTable<'_>>) -> String {
    let table = toml::Table::deserialize(toml::de::Deserializer::from(node))
        .map(|table| table.to_string())
        .unwrap_or_default();
    crate::hash::sha256_hex(table.as_bytes())
}

/// Checks `inputs`, `outputs` and `cache`: paths inside the workspace, valid globs, and no
/// outputs or `cache` without inputs (there would be nothing to key on).
fn cache_spec(
    file: &Arc<SourceFile>,
    root: &Path,
    common: &RawCommon,
    definition: Option<String>,
) -> Result<Option<crate::spec::CacheSpec>, Diagnostic> {
    if common.inputs.is_empty() {
        let stray = common
            .outputs
            .first()
            .map(|o| ("outputs", o.span()))
            .or_else(|| common.cache.as_ref().map(|c| ("cache", c.span())));
        return match stray {
            None => Ok(None),
            Some((field, span)) => Err(Diagnostic::new(format!(
                "`{field}` without `inputs`: a node is cached only when it declares its inputs"
            ))
            .at(file, span)
            .with_help("list the files its result depends on in `inputs`")),
        };
    }
    let check = |path: &Spanned<String>| {
        crate::sandbox::contained_path(root, path.get_ref())
            .map_err(|e| Diagnostic::new(format!("invalid path: {e}")).at(file, path.span()))
    };
    let mut inputs = Vec::with_capacity(common.inputs.len());
    for input in &common.inputs {
        check(input)?;
        inputs.push(
            crate::spec::InputPattern::parse(input.get_ref())
                .map_err(|e| Diagnostic::new(e).at(file, input.span()))?,
        );
    }
    let mut outputs = Vec::with_capacity(common.outputs.len());
    for output in &common.outputs {
        crate::spec::output_path(root, output.get_ref())
            .map_err(|e| Diagnostic::new(format!("invalid path: {e}")).at(file, output.span()))?;
        if output.get_ref().contains(['*', '?', '[', '{']) {
            return Err(
                Diagnostic::new("`outputs` name files; globs are for `inputs`")
                    .at(file, output.span()),
            );
        }
        outputs.push(output.get_ref().clone());
    }
    Ok(Some(crate::spec::CacheSpec {
        inputs,
        outputs,
        enabled: common.cache.as_ref().is_none_or(|c| *c.get_ref()),
        definition: definition.unwrap_or_default(),
        governing: Vec::new(),
    }))
}

/// A template that reads `params.x` for an undeclared `x` would fail at run time; say so now,
/// for each one.
fn check_param_reads(
    file: &Arc<SourceFile>,
    reads: &[(String, std::ops::Range<usize>)],
    params: &IndexMap<String, ParamDecl>,
    problems: &mut Vec<Diagnostic>,
) {
    for (path, span) in reads {
        let mut parts = path.split('.');
        if parts.next() == Some("params")
            && let Some(name) = parts.next()
            && !params.contains_key(name)
        {
            let help = match closest(name, params.keys().map(String::as_str)) {
                Some(close) => format!(
                    "did you mean `{close}`? or declare `{name}` with a [params.{name}] table"
                ),
                None => format!("declare it with a [params.{name}] table"),
            };
            problems.push(
                Diagnostic::new(format!("template reads undeclared parameter `{name}`"))
                    .at(file, span.clone())
                    .with_help(help),
            );
        }
    }
}

/// Every `needs` entry must name another node of this pipeline: a loaded node's, and a
/// refused one's (`unloaded`, by id, with what it needs).
pub(super) fn check_needs(
    file: &Arc<SourceFile>,
    nodes: &[NodeSpec],
    unloaded: &[(String, Vec<Spanned<String>>)],
    problems: &mut Vec<Diagnostic>,
) {
    // foldhash, not SipHash: the ids are the operator's, and there can be tens of thousands.
    let ids: std::collections::HashSet<&str, foldhash::fast::RandomState> = nodes
        .iter()
        .map(|n| n.id.as_str())
        .chain(unloaded.iter().map(|(id, _)| id.as_str()))
        .collect();
    let every = nodes
        .iter()
        .map(|n| (&n.id, &n.needs))
        .chain(unloaded.iter().map(|(id, needs)| (id, needs)));
    for (id, needs) in every {
        for need in needs {
            if !ids.contains(need.get_ref().as_str()) {
                let problem = Diagnostic::new(format!(
                    "node `{id}` needs `{}`, which is not a node of this pipeline",
                    need.get_ref()
                ))
                .at(file, need.span());
                problems.push(match closest(need.get_ref(), ids.iter().copied()) {
                    Some(close) => problem.with_help(format!("did you mean `{close}`?")),
                    None => problem,
                });
            }
        }
    }
}
