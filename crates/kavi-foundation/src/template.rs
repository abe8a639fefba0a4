//! Template rendering with minijinja, strict about undefined values.
//!
//! No template is ever rendered into shell code: an exec node's `shell` string may not hold one
//! (`check` refuses it), so values reach a shell only through the environment, as data.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use minijinja::{Environment, UndefinedBehavior, Value};

/// The keys of `config` in templates (the workspace configuration as runs see it).
pub const RUN_CONFIG_KEYS: &[&str] = &[
    "workspace",
    "ledger",
    "artifacts",
    "sandboxes",
    "builder",
    "gateway",
    "executions_log",
    "skill_timeout",
    "jobs",
    "toolchains",
    "toolchain",
    "object_store",
];

/// Renders string templates, template files from `templates/` and `when` conditions.
pub struct TemplateEngine {
    plain: Environment<'static>,
    dir: PathBuf,
}

impl std::fmt::Debug for TemplateEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TemplateEngine").finish_non_exhaustive()
    }
}

/// Whether a string contains template syntax at all (`{{`, `{%` or `{#`); most strings do not,
/// and skipping them keeps large pipelines cheap to check and run. One pass over the bytes:
/// three substring searches cost some 200 instructions each in setting up, on strings such as
/// `out/5` (12,000 of them in checking a 1,000-node chain).
pub fn is_templated(text: &str) -> bool {
    text.as_bytes()
        .windows(2)
        .any(|pair| pair[0] == b'{' && matches!(pair[1], b'{' | b'%' | b'#'))
}

fn strict_environment(templates_dir: &Path) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    // Keeps each error's template source, so an error can quote the expression that failed
    // (minijinja turns this off in release builds).
    env.set_debug(true);
    env.set_keep_trailing_newline(true);
    // Booleans print as TOML and JSON write them (`true`, not Python's `True`), so a rendered
    // value can be handed back as a boolean parameter.
    env.set_formatter(|out, state, value| {
        if value.kind() == minijinja::value::ValueKind::Bool {
            out.write_str(if value.is_true() { "true" } else { "false" })?;
            Ok(())
        } else {
            minijinja::escape_formatter(out, state, value)
        }
    });
    env.set_loader(minijinja::path_loader(templates_dir));
    env
}

impl TemplateEngine {
    /// An engine whose file templates are looked up under `templates_dir`.
    pub fn new(templates_dir: &Path) -> Self {
        Self {
            plain: strict_environment(templates_dir),
            dir: templates_dir.to_owned(),
        }
    }

    /// The folder file templates are read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Renders a string template; strings without template syntax are returned unchanged.
    pub fn render_str(&self, source: &str, context: &Value) -> Result<String, minijinja::Error> {
        if !is_templated(source) {
            return Ok(source.to_owned());
        }
        self.plain.render_str(source, context)
    }

    /// Renders a template file from the templates folder.
    pub fn render_file(&self, name: &str, context: &Value) -> Result<String, minijinja::Error> {
        self.plain.get_template(name)?.render(context)
    }

    /// Evaluates an expression (a `for_each`) to its value.
    pub fn eval_expression(&self, expr: &str, context: &Value) -> Result<Value, minijinja::Error> {
        self.plain.compile_expression(expr)?.eval(context)
    }

    /// Evaluates a `when` expression; the node runs when the result is truthy.
    pub fn eval_condition(&self, expr: &str, context: &Value) -> Result<bool, minijinja::Error> {
        Ok(self
            .plain
            .compile_expression(expr)?
            .eval(context)?
            .is_true())
    }

    /// Checks a string template's syntax and returns the variable paths it reads
    /// (`nodes.a.outputs`, `params.name`, ...).
    pub fn check_str(&self, source: &str) -> Result<BTreeSet<String>, minijinja::Error> {
        if !is_templated(source) {
            return Ok(BTreeSet::new());
        }
        let template = self.plain.template_from_str(source)?;
        Ok(template.undeclared_variables(true).into_iter().collect())
    }

    /// Checks an expression's syntax and returns the variable paths it reads.
    pub fn check_expression(&self, expr: &str) -> Result<BTreeSet<String>, minijinja::Error> {
        let expression = self.plain.compile_expression(expr)?;
        Ok(expression.undeclared_variables(true).into_iter().collect())
    }

    /// Checks that a template file exists and parses, and returns the variable paths it reads
    /// with its text.
    pub fn check_file(&self, name: &str) -> Result<(BTreeSet<String>, String), minijinja::Error> {
        let template = self.plain.get_template(name)?;
        let reads = template.undeclared_variables(true).into_iter().collect();
        Ok((reads, template.source().to_owned()))
    }
}

/// What a template may read: the roots it is rendered with, each with its fields when those are
/// fixed, so `check` refuses `{{ run.nosuch }}` instead of the run failing on it.
#[derive(Debug, Clone, Default)]
pub struct Scope<'a> {
    roots: Vec<(&'a str, Option<Vec<&'a str>>)>,
}

/// The fields of `run` in a node's templates (see `Executor::context_for`).
pub const RUN_FIELDS: &[&str] = &["id", "pipeline", "spec_hash"];

impl<'a> Scope<'a> {
    /// What every node's templates are rendered with: `params` and `nodes`, whose names the
    /// pipeline declares and `check` resolves against it, `run` and `config`.
    pub fn node() -> Self {
        Self::default()
            .with("params", None)
            .with("nodes", None)
            .with("run", Some(RUN_FIELDS.to_vec()))
            .with("config", Some(RUN_CONFIG_KEYS.to_vec()))
    }

    /// Adds a root, with its fields when they are fixed.
    pub fn with(mut self, root: &'a str, fields: Option<Vec<&'a str>>) -> Self {
        self.roots.push((root, fields));
        self
    }

    /// The first path in `reads` this scope does not have, with why and a suggestion.
    pub fn unknown(&self, reads: &BTreeSet<String>) -> Option<(String, String, String)> {
        let names: Vec<&str> = self.roots.iter().map(|(root, _)| *root).collect();
        reads.iter().find_map(|path| {
            let mut parts = path.split('.');
            let root = parts.next()?;
            let Some((_, fields)) = self.roots.iter().find(|(name, _)| *name == root) else {
                return Some((
                    path.clone(),
                    format!("template reads `{root}`, which templates here do not have"),
                    crate::diagnostic::suggest(root, &names),
                ));
            };
            let field = parts.next()?;
            let fields = fields.as_ref()?;
            (!fields.contains(&field)).then(|| {
                (
                    path.clone(),
                    format!("template reads `{root}.{field}`, but `{root}` has no `{field}`"),
                    crate::diagnostic::suggest(field, fields),
                )
            })
        })
    }
}

/// The templates a template names literally in `{% include %}`, `{% extends %}`,
/// `{% import %}` or `{% from ... import %}`: they are rendered with it, so they govern what it
/// renders. (A name computed at render time cannot be known before.)
pub fn named_templates(text: &str) -> Vec<String> {
    static NAMED: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r#"\{%-?\s*(?:include|extends|import|from)\s+(?:\[\s*)?["']([^"']+)["']"#)
            .expect("the pattern is valid")
    });
    NAMED
        .captures_iter(text)
        .map(|found| found[1].to_owned())
        .collect()
}

/// Where a template first reads `path` inside a `{{ }}` or `{% %}` block, for pointing at it.
pub fn find_read(text: &str, path: &str) -> Option<std::ops::Range<usize>> {
    let is_name = |c: char| c.is_alphanumeric() || c == '_' || c == '.';
    text.match_indices(path).map(|(at, _)| at).find_map(|at| {
        let before = &text[..at];
        let opened = before.rfind("{{").max(before.rfind("{%"));
        let closed = before.rfind("}}").max(before.rfind("%}"));
        let inside = opened.is_some() && opened > closed;
        let bounded = !before.chars().next_back().is_some_and(is_name)
            && !text[at + path.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_alphanumeric() || c == '_');
        (inside && bounded).then(|| at..at + path.len())
    })
}

/// A one-line description of a minijinja error, without its debug dump: for a value that is not
/// there, the expression that reads it; and the template's own line.
pub fn describe_error(err: &minijinja::Error) -> String {
    let culprit = err
        .template_source()
        .zip(err.range())
        .and_then(|(source, range)| source.get(range));
    let mut text = match (err.kind(), err.detail(), culprit) {
        (minijinja::ErrorKind::UndefinedError, _, Some(culprit)) => {
            format!("undefined value `{culprit}`")
        }
        (kind, Some(detail), _) => format!("{kind}: {detail}"),
        (kind, None, _) => kind.to_string(),
    };
    match (err.name(), err.line()) {
        (Some(name), Some(line)) if name != "<string>" && name != "<expression>" => {
            text.push_str(&format!(" ({name} line {line})"));
        }
        (_, Some(line)) => text.push_str(&format!(" (template line {line})")),
        _ => {}
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> TemplateEngine {
        TemplateEngine::new(Path::new("templates"))
    }

    fn ctx() -> Value {
        Value::from_serialize(serde_json::json!({
            "params": { "greeting": "it's $(rm -rf /)", "n": 2 },
            "nodes": { "a": { "outputs": { "exit_code": 0 } } }
        }))
    }

    /// Template syntax is found wherever it starts, and a lone brace is not syntax.
    #[test]
    fn template_syntax_is_told_from_plain_text() {
        for templated in ["{{ x }}", "a{%if%}", "{# note #}", "x{{", "{{"] {
            assert!(is_templated(templated), "{templated}");
        }
        for plain in ["", "{", "out/5", "{ a }", "a}}", "{x{", "{ {", "%}"] {
            assert!(!is_templated(plain), "{plain}");
        }
    }

    #[test]
    fn undefined_values_are_errors_not_empty_strings() {
        let err = engine()
            .render_str("{{ params.missing }}", &ctx())
            .unwrap_err();
        assert_eq!(err.kind(), minijinja::ErrorKind::UndefinedError);
        assert_eq!(
            describe_error(&err),
            "undefined value `params.missing` (template line 1)"
        );
    }

    /// A template file's error names the variable and the line in that file, not in the
    /// pipeline that renders it.
    #[test]
    fn errors_in_a_template_file_name_the_variable_and_its_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("report.md.j2"),
            "# Report\n\n{{ params.greeting }}\n{% if true %}\n{{ vars.titel | upper }}\n{% endif %}\n",
        )
        .unwrap();
        let err = TemplateEngine::new(dir.path())
            .render_file("report.md.j2", &ctx())
            .unwrap_err();
        assert_eq!(
            describe_error(&err),
            "undefined value `vars.titel` (report.md.j2 line 5)"
        );
    }

    #[test]
    fn a_scope_refuses_roots_and_fields_templates_do_not_have() {
        let reads = |paths: &[&str]| paths.iter().map(|p| p.to_string()).collect();
        let scope = Scope::node().with("vars", Some(vec!["title"]));
        assert_eq!(
            scope.unknown(&reads(&["params.x", "nodes.a.outputs", "run.id"])),
            None
        );
        let (path, message, help) = scope.unknown(&reads(&["run.idd"])).unwrap();
        assert_eq!(path, "run.idd");
        assert_eq!(message, "template reads `run.idd`, but `run` has no `idd`");
        assert_eq!(help, "did you mean `id`?");
        let (_, message, help) = scope.unknown(&reads(&["env.HOME"])).unwrap();
        assert_eq!(
            message,
            "template reads `env`, which templates here do not have"
        );
        assert!(help.starts_with("known: `params`, `nodes`"), "{help}");
        let (_, _, help) = scope.unknown(&reads(&["vars.titel"])).unwrap();
        assert_eq!(help, "did you mean `title`?");
        assert_eq!(scope.unknown(&reads(&["config.workspace"])), None);
    }

    #[test]
    fn included_extended_and_imported_templates_are_named() {
        let text = "{% extends \"base.j2\" %}{%- include 'part.j2' %}{% import \"m.j2\" as m %}\
                    {% from 'f.j2' import x %}{% include params.dynamic %}";
        assert_eq!(
            named_templates(text),
            ["base.j2", "part.j2", "m.j2", "f.j2"]
        );
    }

    #[test]
    fn a_read_is_found_inside_a_block_not_in_prose() {
        let text = "run.id is the run\n{{ run.idd }} and {{ run.id }}";
        assert_eq!(find_read(text, "run.id"), Some(39..45));
        assert_eq!(find_read(text, "run.idd"), Some(21..28));
        assert_eq!(find_read(text, "run.x"), None);
    }

    #[test]
    fn conditions_read_params_and_node_outputs() {
        let e = engine();
        assert!(
            e.eval_condition("nodes.a.outputs.exit_code == 0", &ctx())
                .unwrap()
        );
        assert!(!e.eval_condition("params.n > 5", &ctx()).unwrap());
    }

    #[test]
    fn check_lists_the_variable_paths_a_template_reads() {
        let vars = engine()
            .check_str("{{ nodes.b.outputs.stdout }} {{ params.x }}")
            .unwrap();
        assert!(vars.contains("nodes.b.outputs.stdout"), "{vars:?}");
        assert!(vars.contains("params.x"), "{vars:?}");
        assert!(engine().check_str("{{ unclosed").is_err());
    }
}
