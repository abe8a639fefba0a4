//! JSON Schemas of every TOML file kavi reads, generated from the types that read them.
//!
//! They are checked in under `docs/schemas/` (a test keeps them in step with the code), and
//! each shipped file names its schema in a `#:schema` comment on its first line, which TOML
//! language servers (taplo, tombi) read to complete and check the file as it is edited.

use std::sync::Arc;

use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Value, json};

use crate::diagnostic::{Diagnostic, SourceFile};

/// Where the schemas are, relative to the workspace (and this repository).
pub const DIR: &str = "docs/schemas";

/// One published schema: its file under [`DIR`], and the workspace files it describes (a folder
/// ending in `/` means every `.toml` in it).
pub struct Published {
    pub file: &'static str,
    pub describes: &'static str,
    pub schema: Value,
    /// Every problem of shape (unknown fields, wrong types) the file has, found by reading it
    /// whole as the type its schema is made from; `None` for the files read part by part
    /// (pipelines, chains, proposals, `kavi.toml`), whose loaders report theirs.
    pub problems: Option<Problems>,
}

/// The problems of one file's text (see [`Published::problems`]).
pub type Problems = fn(&Arc<SourceFile>) -> Vec<Diagnostic>;

/// Every schema kavi publishes.
pub fn all() -> Vec<Published> {
    use crate::{chains, config, confinement, nodes, policy, skills, toolchains};
    let published = |file, describes, title: &str, (schema, problems): (Value, _)| Published {
        file,
        describes,
        schema: titled(schema, title),
        problems,
    };
    vec![
        published(
            "kavi.json",
            "kavi.toml",
            "kavi.toml: workspace configuration",
            (of::<config::Config>(), None),
        ),
        published(
            "pipeline.json",
            "pipelines/",
            "A kavi pipeline",
            (pipeline(), None),
        ),
        published(
            "chain.json",
            "chains/",
            "A chain of trusted skills",
            (of::<chains::RawChain>(), None),
        ),
        published(
            "proposal.json",
            "proposals/",
            "A skill proposal",
            (of::<skills::Proposal>(), None),
        ),
        published(
            "policies/allowlist.json",
            "policies/allowlist.toml",
            "The diff gate's allowlist",
            whole::<policy::AllowlistPolicy>(),
        ),
        published(
            "policies/classifier.json",
            "policies/classifier.toml",
            "The failure classifier",
            whole::<policy::classifier::RawClassifier>(),
        ),
        published(
            "policies/confinement.json",
            "policies/confinement.toml",
            "What builders, gates and skills may touch",
            whole::<confinement::policy::RawPolicy>(),
        ),
        published(
            "policies/conventions.json",
            "policies/conventions.toml",
            "Where a skill's files are",
            whole::<skills::conventions::RawConventions>(),
        ),
        published(
            "policies/escalation.json",
            "policies/escalation.toml",
            "When a failed attempt goes to a person",
            whole::<nodes::escalate::Rules>(),
        ),
        published(
            "policies/gates.json",
            "policies/gates.toml",
            "The gates a skill must pass",
            whole::<policy::gates::GateSet>(),
        ),
        published(
            "policies/invariants.json",
            "policies/invariants.toml",
            "What every skill must hold to",
            whole::<policy::invariants::RawInvariants>(),
        ),
        published(
            "policies/lifecycle.json",
            "policies/lifecycle.toml",
            "A skill's lifecycle",
            whole::<skills::RawLifecycle>(),
        ),
        published(
            "policies/chat.json",
            "policies/chat.toml",
            "What `kavi chat` understands",
            whole::<crate::chat::intents::RawChatPolicy>(),
        ),
        published(
            "policies/mcp.json",
            "policies/mcp.toml",
            "What MCP clients may call beyond READ_ONLY skills",
            whole::<crate::mcp::McpPolicy>(),
        ),
        published(
            "policies/network.json",
            "policies/network.toml",
            "The hosts nodes may call",
            whole::<crate::confinement::network::NetworkPolicy>(),
        ),
        published(
            "policies/roles.json",
            "policies/roles.toml",
            "Who holds which role",
            whole::<policy::roles::RawRoles>(),
        ),
        published(
            "policies/sandbox.json",
            "policies/sandbox.toml",
            "The limits of a sandbox",
            whole::<policy::SandboxPolicy>(),
        ),
        published(
            "policies/scanner.json",
            "policies/scanner.toml",
            "The security scanner's rules",
            whole::<policy::scanner::RawScanner>(),
        ),
        published(
            "policies/toolchains.json",
            "policies/toolchains.toml",
            "The pinned toolchains gates run",
            whole::<toolchains::RawSet>(),
        ),
        published(
            "policies/toolchains-lock.json",
            "policies/toolchains.lock",
            "Every package each toolchain installs, with its wheel's sha256 (`kavi toolchain lock`)",
            whole::<toolchains::lock::RawLock>(),
        ),
        published(
            "policies/trust.json",
            "policies/trust.toml",
            "What a skill's trusted hash covers",
            whole::<skills::trust::RawTrust>(),
        ),
    ]
}

/// Every problem of shape of a policy file a schema describes, found by its path as
/// `kavi policy check` finds them; none for another file.
pub fn policy_problems(source: &Arc<SourceFile>) -> Vec<Diagnostic> {
    all()
        .into_iter()
        .find(|published| source.path == std::path::Path::new(published.describes))
        .and_then(|published| published.problems)
        .map_or_else(Vec::new, |problems| problems(source))
}

/// The schema of a file read as one `T`.
fn of<T: JsonSchema>() -> Value {
    schemars::schema_for!(T).to_value()
}

/// The schema of a file read whole as one `T`, and how its problems are found.
fn whole<T: JsonSchema + serde::de::DeserializeOwned>() -> (Value, Option<Problems>) {
    (of::<T>(), Some(problems_of::<T>))
}

fn problems_of<T: serde::de::DeserializeOwned>(file: &Arc<SourceFile>) -> Vec<Diagnostic> {
    match toml::de::DeTable::parse(&file.text) {
        Err(e) => vec![crate::diagnostic::toml_error(file, &e)],
        Ok(root) => {
            let span = root.span();
            crate::diagnostic::read_table::<T>(file, span, root.into_inner()).1
        }
    }
}

fn titled(mut schema: Value, title: &str) -> Value {
    schema["title"] = json!(title);
    schema
}

/// A pipeline: its header, and `nodes`, each a table whose `kind` picks which fields it takes
/// besides those every node takes (as the loader reads it: common fields, then the kind's).
fn pipeline() -> Value {
    let mut generator = SchemaGenerator::default();
    let mut root = schemars::schema_for!(crate::spec::RawHeader).to_value();
    let common = crate::spec::RawCommon::json_schema(&mut generator).to_value();
    let kinds: Vec<Value> = crate::nodes::registry()
        .kinds()
        .map(|kind| {
            let specific = (kind.schema)(&mut generator).to_value();
            let mut properties = common["properties"].clone();
            if let (Some(all), Some(own)) = (
                properties.as_object_mut(),
                specific["properties"].as_object(),
            ) {
                all.extend(own.clone());
                all.insert("kind".into(), json!({ "const": kind.name }));
            }
            let mut required = vec![json!("kind")];
            required.extend(specific["required"].as_array().cloned().unwrap_or_default());
            let mut node = json!({
                "title": format!("a `{}` node", kind.name),
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            });
            // A kind that runs a command takes it as an argv (`run`) or a shell line (`shell`),
            // exactly one of them, as the loader insists.
            if node["properties"]["run"].is_object() && node["properties"]["shell"].is_object() {
                node["oneOf"] = json!([{ "required": ["run"] }, { "required": ["shell"] }]);
            }
            // Chosen by `kind` (not tried one by one): a misspelt kind is reported at `kind`,
            // and the rest of the node against its own kind's fields.
            json!({
                "if": { "properties": { "kind": { "const": kind.name } }, "required": ["kind"] },
                "then": node,
            })
        })
        .collect();
    let kind_names: Vec<&str> = crate::nodes::registry().kinds().map(|k| k.name).collect();
    root["properties"]["params"] = json!({
        "description": "Parameters, by name: set with `--set NAME=VALUE`, read as `{{ params.NAME }}`.",
        "type": "object",
        "additionalProperties": generator.subschema_for::<crate::spec::RawParam>(),
    });
    root["properties"]["nodes"] = json!({
        "description": "The nodes, by id; `kind` says what each does",
        "type": "object",
        "propertyNames": { "pattern": "^[A-Za-z_][A-Za-z0-9_-]*$" },
        "additionalProperties": {
            "type": "object",
            "properties": { "kind": { "enum": kind_names } },
            "required": ["kind"],
            "allOf": kinds,
        },
    });
    let definitions = root["$defs"].as_object().cloned().unwrap_or_default();
    let mut merged = definitions;
    merged.extend(generator.take_definitions(true));
    if !merged.is_empty() {
        root["$defs"] = Value::Object(merged);
    }
    // A default of the declared type, as the loader checks it (an integer is a float too).
    root["$defs"]["RawParam"]["allOf"] = [
        ("string", json!("string")),
        ("integer", json!("integer")),
        ("float", json!("number")),
        ("boolean", json!("boolean")),
        ("list", json!("array")),
    ]
    .iter()
    .map(|(declared, json_type)| {
        json!({
            "if": { "properties": { "type": { "const": declared } }, "required": ["type"] },
            "then": { "properties": { "default": { "type": json_type } } },
        })
    })
    .collect();
    durations(&mut root);
    root
}

/// The fields of a pipeline that hold a duration (humantime: `500ms`, `5s`, `1m 30s`).
const DURATION_FIELDS: [&str; 4] = ["timeout", "backoff", "max_backoff", "wall"];

/// What humantime reads: numbers, each with its unit, spaces between them allowed.
const DURATION_PATTERN: &str = r"^\s*([0-9]+\s*(nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y)\s*)+$";

/// Gives every duration field under `schema` the pattern of a duration, so that an editor
/// flags `5 parsecs` as `check` does.
fn durations(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(properties)) = map.get_mut("properties") {
                for field in DURATION_FIELDS {
                    if let Some(Value::Object(property)) = properties.get_mut(field) {
                        property.insert("pattern".into(), json!(DURATION_PATTERN));
                    }
                }
            }
            map.values_mut().for_each(durations);
        }
        Value::Array(items) => items.iter_mut().for_each(durations),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn repo() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    /// The checked-in schemas are the ones the code makes. `KAVI_WRITE_SCHEMAS=1 cargo test
    /// schemas` rewrites them.
    #[test]
    fn the_checked_in_schemas_are_the_generated_ones() {
        let write = std::env::var_os("KAVI_WRITE_SCHEMAS").is_some();
        for published in all() {
            let path = repo().join(DIR).join(published.file);
            let text = serde_json::to_string_pretty(&published.schema).unwrap() + "\n";
            if write {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &text).unwrap();
            }
            let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                checked_in == text,
                "{} is out of date: run `KAVI_WRITE_SCHEMAS=1 cargo test schemas`",
                path.display()
            );
        }
    }

    fn shipped_files(describes: &str) -> Vec<std::path::PathBuf> {
        match describes.strip_suffix('/') {
            Some(folder) => std::fs::read_dir(repo().join(folder))
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
                .collect(),
            None => vec![repo().join(describes)],
        }
    }

    fn validator(published: &Published) -> jsonschema::Validator {
        jsonschema::validator_for(&published.schema)
            .unwrap_or_else(|e| panic!("{} is not a valid schema: {e}", published.file))
    }

    /// Every shipped file passes its schema and names it on its first line, so an editor finds
    /// it.
    #[test]
    fn every_shipped_file_passes_the_schema_it_names() {
        for published in all() {
            let validator = validator(&published);
            for path in shipped_files(published.describes) {
                let text = std::fs::read_to_string(&path).unwrap();
                let relative = path.strip_prefix(repo()).unwrap();
                let depth = relative.components().count() - 1;
                let expected = format!("#:schema {}{DIR}/{}", "../".repeat(depth), published.file);
                assert_eq!(
                    text.lines().next(),
                    Some(expected.as_str()),
                    "{}",
                    relative.display()
                );
                let value: Value = toml::from_str(&text).unwrap();
                let errors: Vec<String> = validator
                    .iter_errors(&value)
                    .map(|e| e.to_string())
                    .collect();
                assert!(errors.is_empty(), "{}: {errors:?}", relative.display());
            }
        }
    }

    /// The schemas refuse what kavi refuses: a mistyped field, a node kind that does not exist,
    /// a field of another kind, a value of the wrong type.
    #[test]
    fn the_schemas_refuse_what_kavi_refuses() {
        let schemas = all();
        let schema = |file: &str| schemas.iter().find(|p| p.file == file).unwrap();
        let pipeline = validator(schema("pipeline.json"));
        let valid = json!({
            "pipeline": { "name": "p" },
            "nodes": { "a": { "kind": "exec", "run": ["true"], "timeout": "5s" } }
        });
        assert!(pipeline.is_valid(&valid));
        for wrong in [
            json!({ "pipeline": { "name": "p", "nmae": 1 } }),
            json!({ "pipeline": { "name": "p" }, "nodes": { "a": { "kind": "exce" } } }),
            json!({ "pipeline": { "name": "p" }, "nodes": { "a": { "kind": "exec", "run": ["true"], "template": "x.j2" } } }),
            json!({ "pipeline": { "name": "p" }, "nodes": { "a": { "kind": "exec", "run": "true" } } }),
            json!({ "pipeline": { "name": "p" }, "nodes": { "a": { "kind": "exec", "run": [] } } }),
            json!({ "pipeline": { "name": "p" }, "nodes": { "a": { "kind": "exec", "run": ["true"], "env": { "PATH=/tmp/evil:": "x" } } } }),
        ] {
            assert!(!pipeline.is_valid(&wrong), "{wrong}");
        }
        // Files `check` refuses, each for one mistake: the schema refuses each too.
        let registry = crate::nodes::registry();
        let header = "[pipeline]\nname = \"p\"\n";
        let exec = "[nodes.a]\nkind = \"exec\"\n";
        for (mistake, body) in [
            (
                "run and shell",
                format!("{exec}run = [\"true\"]\nshell = \"true\"\n"),
            ),
            ("neither run nor shell", exec.to_owned()),
            (
                "a duration in no unit",
                format!("{exec}run = [\"true\"]\ntimeout = \"5 parsecs\"\n"),
            ),
            (
                "a backoff in no unit",
                format!("{exec}run = [\"true\"]\nretry = {{ attempts = 2, backoff = \"soon\" }}\n"),
            ),
            (
                "a budget in no unit",
                format!("[pipeline.budget]\nwall = \"1 fortnight\"\n{exec}run = [\"true\"]\n"),
            ),
            (
                "an integer's default a string",
                format!(
                    "[params.n]\ntype = \"integer\"\ndefault = \"three\"\n{exec}run = [\"true\"]\n"
                ),
            ),
            (
                "a string's default a boolean",
                format!("[params.s]\ntype = \"string\"\ndefault = true\n{exec}run = [\"true\"]\n"),
            ),
            (
                "a kind misspelt",
                "[nodes.a]\nkind = \"exce\"\nrun = [\"true\"]\n".to_owned(),
            ),
        ] {
            let text = format!("{header}{body}");
            assert!(
                crate::spec::load_text(&text, registry).is_err(),
                "check takes {mistake}"
            );
            let value: Value = toml::from_str(&text).unwrap();
            assert!(!pipeline.is_valid(&value), "the schema takes {mistake}");
        }
        // And what it takes, it takes: a float's default may be written as an integer.
        let text = format!(
            "{header}[params.f]\ntype = \"float\"\ndefault = 2\n{exec}shell = \"true\"\ntimeout = \"1m 30s\"\n"
        );
        assert!(crate::spec::load_text(&text, registry).is_ok());
        assert!(pipeline.is_valid(&toml::from_str::<Value>(&text).unwrap()));
        // A misspelt kind is reported at `kind`, not as a mismatch of every other kind.
        let wrong = json!({ "pipeline": { "name": "p" }, "nodes": { "a": { "kind": "exce", "run": ["true"] } } });
        let errors: Vec<String> = pipeline
            .iter_errors(&wrong)
            .map(|e| e.instance_path().to_string())
            .collect();
        assert_eq!(errors, ["/nodes/a/kind"]);
        let config = validator(schema("kavi.json"));
        assert!(config.is_valid(&json!({ "jobs": 4 })));
        assert!(!config.is_valid(&json!({ "jobs": "four" })));
        assert!(!config.is_valid(&json!({ "jobz": 4 })));
        // A side-effect class is one of the names, alone, joined by `+` or listed: an editor
        // completes them, and a misspelt one is refused as the loader refuses it.
        let proposal = validator(schema("proposal.json"));
        let with = |side_effect: Value| {
            json!({ "name": "s", "description": "d", "side_effect": side_effect,
                    "command": ["python3", "skills/s/skill.py"],
                    "input_schema": {}, "output_schema": {} })
        };
        for taken in [
            json!("READ_ONLY"),
            json!("NETWORK+SECRET_READ"),
            json!(["FILE_WRITE", "NETWORK"]),
        ] {
            assert!(proposal.is_valid(&with(taken.clone())), "{taken}");
        }
        for refused in [json!("READ_ONLYY"), json!("NETWORK+SECRETS"), json!("")] {
            assert!(!proposal.is_valid(&with(refused.clone())), "{refused}");
        }
    }
}
