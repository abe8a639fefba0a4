//! Tests of pipeline loading with the engine's kinds: fields, errors with their places,
//! loading on threads, and the DAG compiled from what loaded.

use std::path::Path;
use std::sync::LazyLock;

use crate::dag::compile;
use crate::diagnostic::Diagnostic;
use crate::node::{FailureKinds, NodeConfig, Registry};
use crate::spec::{LoadContext, Pipeline, SpecError, load_pipeline_str};
use crate::template::TemplateEngine;

/// The engine's kinds alone. The failure kinds `retry.on` names are the forge classifier's,
/// which stands above the engine, so these tests have none.
static REGISTRY: LazyLock<Registry> =
    LazyLock::new(|| Registry::new(&[super::KINDS], no_failure_kinds));

fn no_failure_kinds(config: &mut NodeConfig<'_>) -> Result<Box<dyn FailureKinds>, Diagnostic> {
    Err(config.error(
        "the engine's tests load no failure kinds: `retry.on` names only exit codes and states here",
        config.span.clone(),
    ))
}

fn load_text(text: &str) -> Result<Pipeline, SpecError> {
    crate::spec::load_text(text, &REGISTRY)
}

/// What a layout must not change: the nodes in order with their tries, and the parameters.
fn summary(text: &str) -> (Vec<(String, u32)>, Vec<String>) {
    let pipeline = load_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let nodes = pipeline
        .nodes
        .iter()
        .map(|node| (node.id.clone(), node.retry.attempts))
        .collect();
    (nodes, pipeline.params.keys().cloned().collect())
}

fn messages(text: &str) -> Vec<String> {
    match load_text(text) {
        Ok(_) => panic!("loaded\n{text}"),
        Err(SpecError::Invalid(problems)) => problems.0.iter().map(|p| p.message.clone()).collect(),
        Err(e) => vec![e.to_string()],
    }
}

/// A node's kind-specific fields are read with every problem they have, as its common fields
/// are: each kind's own, with the name meant (a field every node has included), and nothing
/// reported missing that a problem took out.
#[test]
fn every_problem_of_a_kind_s_own_fields_is_reported_in_one_pass() {
    let text = "[pipeline]\nname = \"p\"\n\
                [nodes.a]\nkind = \"exec\"\nrnu = [\"true\"]\ninherit_env = \"yes\"\n\
                stdout = \"jsn\"\nneds = [\"b\"]\n\
                [nodes.b]\nkind = \"http\"\nurl = \"https://example.com\"\nmethd = \"GET\"\n\
                kind_of = 1\n";
    let problems = match load_text(text) {
        Err(SpecError::Invalid(problems)) => problems.0,
        other => panic!("{other:?}"),
    };
    let found: Vec<_> = problems
        .iter()
        .map(|p| {
            let word = p.message.split(',').next().unwrap().to_owned();
            let meant = p.help.as_deref().and_then(|help| {
                help.strip_prefix("did you mean `")
                    .and_then(|rest| rest.split('`').next())
            });
            (word, p.position().unwrap(), meant.map(str::to_owned))
        })
        .collect();
    let row = |word: &str, at: &str, meant: Option<&str>| {
        (
            word.to_owned(),
            format!("p.toml:{at}"),
            meant.map(str::to_owned),
        )
    };
    assert_eq!(
        found,
        [
            row("unknown field `rnu`", "5:1", Some("run")),
            row("invalid type: string \"yes\"", "6:15", None),
            row("unknown variant `jsn`", "7:10", Some("json")),
            row("unknown field `neds`", "8:1", Some("needs")),
            row("unknown field `methd`", "12:1", Some("method")),
            row("unknown field `kind_of`", "13:1", None),
        ],
        "{problems:#?}"
    );
}

#[test]
fn nodes_load_alike_however_their_tables_are_laid_out() {
    let head = "[pipeline]\nname = \"p\"\n";
    let x = "[params.x]\ntype = \"string\"\ndefault = \"v\"\n";
    let a = "[nodes.a]\nkind = \"exec\"\nrun = [\"echo\", \"{{ params.x }}\"]\n";
    let b = "[nodes.b]\nkind = \"exec\"\nrun = [\"true\"]\nneeds = [\"a\"]\n";
    let retry = "[nodes.a.retry]\nattempts = 3\n";
    // Nothing read as the file is read: the nodes are values of a `[nodes]` table.
    let inline = format!(
        "{head}{x}[nodes]\na = {{ kind = \"exec\", run = [\"echo\", \"{{{{ params.x }}}}\"], retry = {{ attempts = 3 }} }}\n\
             b = {{ kind = \"exec\", run = [\"true\"], needs = [\"a\"] }}\n"
    );
    let expected = summary(&inline);
    assert_eq!(expected.0, [("a".to_owned(), 3), ("b".to_owned(), 1)]);
    for text in [
        // Every node loaded as it is read.
        format!("{head}{x}{}retry.attempts = 3\n{b}", a),
        // A header adds to the node just read: it and the rest are loaded at the end.
        format!("{head}{x}{a}{retry}{b}"),
        // A header reaches into a node already loaded, or parameters come after one:
        // read again, all loaded at the end.
        format!("{head}{x}{a}{b}{retry}"),
        format!("{head}{a}retry.attempts = 3\n{b}{x}"),
        format!("{a}retry.attempts = 3\n{x}{b}{head}"),
    ] {
        assert_eq!(summary(&text), expected, "{text}");
    }
}

/// Ten nodes, whichever way they load: handed to the loading thread as they are read
/// (parameters first), or in three shares on three threads from the tree (parameters
/// last, so the file is read again). Nodes, governing files and problems keep the file's
/// order.
#[test]
fn a_long_pipeline_loads_in_the_file_s_order_on_any_thread() {
    let head = "[pipeline]\nname = \"p\"\n";
    let x = "[params.x]\ntype = \"string\"\ndefault = \"v\"\n";
    let nodes = |broken: &[usize]| {
        (0..10)
            .map(|i| {
                let kind = if broken.contains(&i) { "nope" } else { "exec" };
                let needs = if i > 0 {
                    format!("needs = [\"n{}\"]\n", i - 1)
                } else {
                    String::new()
                };
                format!("[nodes.n{i}]\nkind = \"{kind}\"\nrun = [\"sh\", \"f{i}\"]\n{needs}")
            })
            .collect::<String>()
    };
    let layouts = |broken: &[usize]| {
        let nodes = nodes(broken);
        [format!("{head}{x}{nodes}"), format!("{head}{nodes}{x}")]
    };
    let root = tempfile::tempdir().unwrap();
    for i in 0..10 {
        std::fs::write(root.path().join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let templates = TemplateEngine::new(&root.path().join("templates"));
    let context = LoadContext {
        root: root.path(),
        templates: &templates,
        including: &[],
        registry: &REGISTRY,
    };
    let load = |text: &String| load_pipeline_str(Path::new("p.toml"), text.clone(), &context);
    let ids: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
    // Each share's files too (the members come sorted by path).
    let files: Vec<String> = (0..10)
        .map(|i| format!("f{i}"))
        .chain(std::iter::once("p.toml".to_owned()))
        .collect();
    for text in layouts(&[]) {
        let pipeline = load(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let loaded: Vec<_> = pipeline.nodes.iter().map(|n| n.id.clone()).collect();
        assert_eq!(loaded, ids, "{text}");
        let governing: Vec<_> = pipeline
            .governing
            .members()
            .into_iter()
            .map(|(_, path, ..)| path)
            .collect();
        assert_eq!(governing, files, "{text}");
    }
    for text in layouts(&[1, 4, 5, 9]) {
        let Err(SpecError::Invalid(problems)) = load(&text) else {
            panic!("loaded\n{text}");
        };
        let at: Vec<_> = problems
            .0
            .iter()
            .map(|p| {
                (
                    p.message.clone(),
                    p.location.as_ref().map(|(_, span)| span.start),
                )
            })
            .collect();
        let expected: Vec<_> = [1, 4, 5, 9]
            .iter()
            .map(|&i| {
                let start = text.find(&format!("[nodes.n{i}]")).unwrap()
                    + format!("[nodes.n{i}]\nkind = ").len();
                ("unknown node kind `nope`".to_owned(), Some(start))
            })
            .collect();
        assert_eq!(at, expected, "{text}");
    }
}

#[test]
fn problems_come_in_the_file_s_order_however_its_nodes_are_read() {
    let head = "[pipeline]\nname = \"p\"\n";
    let x = "[params.x]\ntype = \"integer\"\ndefault = \"v\"\n";
    let a = "[nodes.a]\nkind = \"nope\"\n";
    let b = "[nodes.b]\nkind = \"exec\"\nrun = [\"true\"]\nneeds = [\"zz\"]\n";
    let first = messages(&format!("{head}{x}{a}{b}"));
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(first[0].contains("parameter `x`"), "{first:?}");
    assert!(first[1].contains("unknown node kind"), "{first:?}");
    assert_eq!(
        messages(&format!("{head}{x}{a}{b}[nodes.b.retry]\nattempts = 1\n")),
        first
    );
    assert_eq!(messages(&format!("{head}{a}{b}{x}")), first);
}

#[test]
fn a_need_listed_twice_makes_one_edge() {
    let text = "[pipeline]\nname = \"p\"\n\
                [nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n\
                [nodes.b]\nkind = \"exec\"\nrun = [\"true\"]\n\
                [nodes.c]\nkind = \"exec\"\nrun = [\"true\"]\nneeds = [\"a\", \"b\", \"a\"]\n";
    let pipeline = load_text(text).unwrap();
    let dag = compile(&pipeline).unwrap();
    assert_eq!(dag.graph.edge_count(), 2);
    let mut needed: Vec<usize> = dag.dependencies(2).collect();
    needed.sort_unstable();
    assert_eq!(needed, [0, 1]);
    assert_eq!(dag.stage, [0, 0, 1]);
}

/// Without the forge's classifier a failure kind in `retry.on` is refused, at the node; exit
/// codes and states are the spec's own and still load.
#[test]
fn retry_on_a_failure_kind_needs_the_forge_s_classifier() {
    let head = "[pipeline]\nname = \"p\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n";
    let states = format!("{head}[nodes.a.retry]\nattempts = 2\non = [\"failed\", 3]\n");
    assert_eq!(summary(&states).0, [("a".to_owned(), 2)]);
    let kinds = format!("{head}[nodes.a.retry]\nattempts = 2\non = [\"COMPILE_ERROR\"]\n");
    let problems = messages(&kinds);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("no failure kinds"), "{problems:?}");
}
