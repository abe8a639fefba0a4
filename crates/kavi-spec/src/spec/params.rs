//! Pipeline parameters: declared with a type, given a default or marked required, and set from
//! the command line with `--set key=value`.

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;

use crate::diagnostic::Diagnostic;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ParamType {
    String,
    Integer,
    Float,
    Boolean,
    /// A list of values: a node's `for_each` runs it once per item.
    List,
}

impl ParamType {
    pub fn name(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Integer => "integer",
            ParamType::Float => "float",
            ParamType::Boolean => "boolean",
            ParamType::List => "list",
        }
    }

    /// Parses a command-line value as this type.
    pub fn parse(self, text: &str) -> Result<Value, String> {
        let bad = || {
            let accepted = match self {
                ParamType::String => "any text",
                ParamType::Integer => "a whole number, such as 3 or -1",
                ParamType::Float => "a number, such as 0.5 or 2",
                ParamType::Boolean => "true or false",
                ParamType::List => "a JSON array, such as [\"a\", 2], or words between commas",
            };
            format!(
                "`{text}` is not a valid {} (accepted: {accepted})",
                self.name()
            )
        };
        Ok(match self {
            ParamType::String => Value::String(text.to_owned()),
            ParamType::Integer => Value::from(text.parse::<i64>().map_err(|_| bad())?),
            ParamType::Float => Value::from(
                text.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .ok_or_else(bad)?,
            ),
            // `True` too: Jinja-minded tools print booleans that way.
            ParamType::Boolean => match text.to_ascii_lowercase().as_str() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => return Err(bad()),
            },
            // A JSON array as Argo's `withParam` takes it (what a template prints of a list
            // is one), else `a,b,c` as typed on a command line.
            ParamType::List if text.trim_start().starts_with('[') => {
                match serde_json::from_str::<Value>(text) {
                    Ok(list @ Value::Array(_)) => list,
                    _ => return Err(bad()),
                }
            }
            ParamType::List => Value::Array(
                text.split(',')
                    .map(|word| Value::String(word.trim().to_owned()))
                    .filter(|word| word != "")
                    .collect(),
            ),
        })
    }

    /// Whether a TOML default has this type (an integer is accepted where a float is declared).
    pub fn accepts(self, value: &toml::Value) -> Option<Value> {
        match (self, value) {
            (ParamType::String, toml::Value::String(s)) => Some(Value::String(s.clone())),
            (ParamType::Integer, toml::Value::Integer(i)) => Some(Value::from(*i)),
            (ParamType::Float, toml::Value::Float(f)) => Some(Value::from(*f)),
            (ParamType::Float, toml::Value::Integer(i)) => Some(Value::from(*i as f64)),
            (ParamType::Boolean, toml::Value::Boolean(b)) => Some(Value::Bool(*b)),
            (ParamType::List, list @ toml::Value::Array(_)) => serde_json::to_value(list).ok(),
            _ => None,
        }
    }
}

/// A declared parameter. A parameter without a default is required.
#[derive(Debug, Clone)]
pub struct ParamDecl {
    pub ty: ParamType,
    pub default: Option<Value>,
    pub description: Option<String>,
}

/// Splits one `--set key=value` argument.
pub fn parse_set(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.to_owned()))
        }
        _ => Err(format!("`{arg}` is not of the form key=value")),
    }
}

/// Resolves the final parameter values: defaults, overridden by `--set`, each checked by type.
pub fn resolve(
    declared: &IndexMap<String, ParamDecl>,
    sets: &[(String, String)],
) -> Result<serde_json::Map<String, Value>, Vec<Diagnostic>> {
    let mut problems = Vec::new();
    for (key, _) in sets {
        if !declared.contains_key(key) {
            let known: Vec<_> = declared.keys().map(|k| format!("`{k}`")).collect();
            let help = match crate::diagnostic::closest(key, declared.keys().map(String::as_str)) {
                _ if known.is_empty() => "this pipeline declares no parameters".to_owned(),
                Some(close) => format!(
                    "did you mean `{close}`? declared parameters: {}",
                    known.join(", ")
                ),
                None => format!("declared parameters: {}", known.join(", ")),
            };
            problems.push(Diagnostic::new(format!("unknown parameter `{key}`")).with_help(help));
        }
    }
    let mut values = serde_json::Map::new();
    for (name, decl) in declared {
        let set = sets.iter().rev().find(|(key, _)| key == name);
        match (set, &decl.default) {
            (Some((_, text)), _) => match decl.ty.parse(text) {
                Ok(value) => {
                    values.insert(name.clone(), value);
                }
                Err(reason) => problems.push(Diagnostic::new(format!(
                    "invalid value for parameter `{name}`: {reason}"
                ))),
            },
            (None, Some(default)) => {
                values.insert(name.clone(), default.clone());
            }
            (None, None) => problems.push(
                Diagnostic::new(format!("missing required parameter `{name}`"))
                    .with_help(format!("pass it with `--set {name}=<{}>`", decl.ty.name())),
            ),
        }
    }
    if problems.is_empty() {
        Ok(values)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decls() -> IndexMap<String, ParamDecl> {
        let mut map = IndexMap::new();
        map.insert(
            "greeting".into(),
            ParamDecl {
                ty: ParamType::String,
                default: Some(Value::from("hello")),
                description: None,
            },
        );
        map.insert(
            "count".into(),
            ParamDecl {
                ty: ParamType::Integer,
                default: None,
                description: None,
            },
        );
        map
    }

    #[test]
    fn sets_override_defaults_and_are_typed() {
        let sets = vec![
            ("count".into(), "3".into()),
            ("greeting".into(), "hi".into()),
        ];
        let values = resolve(&decls(), &sets).unwrap();
        assert_eq!(values["greeting"], Value::from("hi"));
        assert_eq!(values["count"], Value::from(3));
    }

    #[test]
    fn missing_required_unknown_and_mistyped_are_all_reported() {
        let err = resolve(&decls(), &[("nope".into(), "1".into())]).unwrap_err();
        let messages: Vec<_> = err.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "unknown parameter `nope`",
                "missing required parameter `count`"
            ]
        );
        let err = resolve(&decls(), &[("cuont".into(), "3".into())]).unwrap_err();
        assert_eq!(
            err[0].help.as_deref(),
            Some("did you mean `count`? declared parameters: `greeting`, `count`")
        );
        let err = resolve(&decls(), &[("count".into(), "three".into())]).unwrap_err();
        assert_eq!(
            err[0].message,
            "invalid value for parameter `count`: `three` is not a valid integer (accepted: a \
             whole number, such as 3 or -1)"
        );
    }

    /// What a template prints for a boolean is accepted back as one, so a value can go from
    /// one pipeline's template into another's `--set` or child parameters.
    #[test]
    fn booleans_round_trip_through_templates() {
        let engine = crate::template::TemplateEngine::new(std::path::Path::new("."));
        for flag in [true, false] {
            let context = minijinja::Value::from_serialize(serde_json::json!({ "flag": flag }));
            let rendered = engine.render_str("{{ flag }}", &context).unwrap();
            assert_eq!(rendered, flag.to_string());
            assert_eq!(
                ParamType::Boolean.parse(&rendered).unwrap(),
                Value::Bool(flag)
            );
        }
        assert_eq!(ParamType::Boolean.parse("True").unwrap(), Value::Bool(true));
        let refused = ParamType::Boolean.parse("yes").unwrap_err();
        assert!(refused.contains("accepted: true or false"), "{refused}");
    }

    #[test]
    fn a_list_is_a_json_array_or_words_between_commas() {
        let list = ParamType::List;
        assert_eq!(
            list.parse(r#"["a b", 2]"#).unwrap(),
            serde_json::json!(["a b", 2])
        );
        assert_eq!(
            list.parse("a, b,c").unwrap(),
            serde_json::json!(["a", "b", "c"])
        );
        assert_eq!(list.parse("").unwrap(), serde_json::json!([]));
        let refused = list.parse(r#"[1, "#).unwrap_err();
        assert!(refused.contains("not a valid list"), "{refused}");
        let default = toml::Value::Array(vec![toml::Value::Integer(1), "x".into()]);
        assert_eq!(list.accepts(&default), Some(serde_json::json!([1, "x"])));
        assert_eq!(list.accepts(&toml::Value::Integer(1)), None);
    }

    #[test]
    fn set_arguments_need_an_equals_sign() {
        assert_eq!(parse_set("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert!(parse_set("novalue").is_err());
        assert!(parse_set("=x").is_err());
    }
}
