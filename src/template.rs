//! Template rendering with minijinja, strict about undefined values.
//!
//! No template is ever rendered into shell code: an exec node's `shell` string may not hold one
//! (`check` refuses it), so values reach a shell only through the environment, as data.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use minijinja::{Environment, UndefinedBehavior, Value};

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

/// Whether a string contains template syntax at all; most strings do not, and skipping them
/// keeps large pipelines cheap to check and run.
pub fn is_templated(text: &str) -> bool {
    text.contains("{{") || text.contains("{%") || text.contains("{#")
}

fn strict_environment(templates_dir: &Path) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_keep_trailing_newline(true);
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

/// A one-line description of a minijinja error, without its debug dump.
pub fn describe_error(err: &minijinja::Error) -> String {
    let mut text = match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    };
    if let Some(line) = err.line() {
        text.push_str(&format!(" (template line {line})"));
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

    #[test]
    fn undefined_values_are_errors_not_empty_strings() {
        let err = engine()
            .render_str("{{ params.missing }}", &ctx())
            .unwrap_err();
        assert_eq!(err.kind(), minijinja::ErrorKind::UndefinedError);
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
