//! From pipeline TOML text to a validated [`Pipeline`].
//!
//! The document is parsed once into a span-keeping table. The header and parameters are
//! deserialized with `deny_unknown_fields`; each node's table is split into the fields every
//! kind shares and the fields of its kind, and the kind's own parser takes the latter. Because
//! all of it deserializes from the one parsed table, every error keeps its place in the file.
//!
//! A long pipeline uses the cores: its nodes are loaded on a thread of their own as the reader
//! hands their tables over ([`Courier`]), and the nodes left in the tree are loaded in shares,
//! one per core ([`NodeLoader::load_all`]). Nodes, problems and governing files come out in
//! the file's order either way.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use toml::de::{DeTable, DeValue};

use super::document::Read;
use super::{Pipeline, SpecError};
use crate::diagnostic::{Diagnostic, SourceFile, toml_error};
use crate::node::Registry;
use crate::template::TemplateEngine;

mod loader;
mod node;
mod raw;

use loader::{Courier, NodeLoader};
use node::check_needs;
pub use node::read_params;
pub(crate) use raw::group_name;
pub use raw::{RawCommon, RawHeader, RawParam, timeout};

/// Finds a pipeline file: a path as given, or a bare name looked up in `<root>/pipelines/`.
/// Finds a spec file a node names: a bare name is looked up in `<root>/<folder>/` (with or
/// without `.toml`), anything else is a path inside the workspace. The current folder plays no
/// part, so a pipeline means the same wherever kavi is started.
pub fn spec_in_workspace(root: &Path, folder: &str, name: &str) -> Result<PathBuf, String> {
    let candidates = if name.contains('/') {
        vec![crate::sandbox::contained_path(root, name)?]
    } else {
        let folder = root.join(folder);
        vec![folder.join(name), folder.join(format!("{name}.toml"))]
    };
    candidates
        .into_iter()
        .find(|path| path.is_file())
        .ok_or_else(|| format!("`{name}` not found in {folder}/"))
}

pub fn resolve_pipeline_path(root: &Path, name: &str) -> Result<PathBuf, SpecError> {
    resolve_spec_path(root, "pipelines", "pipeline", name)
}

/// Finds a spec file: a path as given, or a bare name looked up in `<root>/<folder>/`, with or
/// without `.toml`. `what` names the kind of spec in the error.
pub fn resolve_spec_path(
    root: &Path,
    folder: &str,
    what: &'static str,
    name: &str,
) -> Result<PathBuf, SpecError> {
    let given = PathBuf::from(name);
    if given.is_file() {
        return Ok(given);
    }
    let mut tried = vec![given];
    if !name.contains('/') {
        let in_folder = root.join(folder).join(name);
        tried.push(in_folder.clone());
        if in_folder.is_file() {
            return Ok(in_folder);
        }
        if !name.ends_with(".toml") {
            let with_ext = root.join(folder).join(format!("{name}.toml"));
            tried.push(with_ext.clone());
            if with_ext.is_file() {
                return Ok(with_ext);
            }
        }
    }
    Err(SpecError::NotFound {
        what,
        name: name.to_owned(),
        tried,
    })
}

/// What loading a pipeline needs besides its text.
pub struct LoadContext<'a> {
    /// The workspace root: policy files are named relative to it.
    pub root: &'a Path,
    pub templates: &'a TemplateEngine,
    /// The pipeline files being loaded, outermost first, each canonical: a `pipeline` node that
    /// names one of them again would include itself forever.
    pub including: &'a [PathBuf],
    /// The node kinds the pipeline may use, as the layers that define them hand them over.
    pub registry: &'a Registry,
}

/// Reads and validates a pipeline file. `display_path` is how messages name the file.
pub fn load_pipeline(
    path: &Path,
    display_path: &Path,
    context: &LoadContext<'_>,
) -> Result<Pipeline, SpecError> {
    let read_error = |source| SpecError::Read {
        path: display_path.to_owned(),
        source,
    };
    let text = crate::diagnostic::read_spec(path).map_err(read_error)?;
    let mut including = context.including.to_vec();
    including.push(path.canonicalize().map_err(read_error)?);
    let context = LoadContext {
        including: &including,
        ..*context
    };
    load_pipeline_str(display_path, text, &context)
}

/// Validates pipeline text. Everything is checked before returning, and all problems found in
/// the nodes are reported together.
pub fn load_pipeline_str(
    display_path: &Path,
    text: String,
    context: &LoadContext<'_>,
) -> Result<Pipeline, SpecError> {
    let file = SourceFile::new(display_path, text);
    let loader = Mutex::new(NodeLoader::new(&file, context));
    // Each node is loaded as soon as its table is read, and the table dropped: the nodes'
    // tables are never all held at once. A long pipeline's nodes are loaded on a thread of
    // their own while the reading goes on (see [`Courier`]).
    let read = std::thread::scope(|scope| {
        let mut courier = Courier::new(&loader, scope);
        let read = super::document::parse_taking(&file.text, "nodes", &["params"], &mut courier);
        courier.finish();
        read
    });
    let mut loader = loader.into_inner().unwrap_or_else(PoisonError::into_inner);
    let spec_hash = file.spec_hash().to_owned();
    let (root, handed) = match read {
        Read::Tables { root, handed } => (root, handed),
        Read::LeftToToml => (
            DeTable::parse(&file.text).map_err(|e| toml_error(&file, &e))?,
            0,
        ),
    };
    loader.keep_first(handed);
    let root_span = root.span();

    let mut header_table = DeTable::new();
    let mut raw_nodes = None;
    let mut raw_params = None;
    for (key, value) in root.into_inner() {
        if key.get_ref() == "nodes" {
            raw_nodes = Some(value);
        } else if key.get_ref() == "params" {
            raw_params = Some(value);
        } else {
            header_table.insert(key, value);
        }
    }
    // A broken header is one problem among the others, said first as it comes first in the
    // file: the nodes are still checked.
    let (header, header_problems) =
        crate::diagnostic::read_table::<RawHeader>(&file, root_span.clone(), header_table);
    loader.problems.splice(0..0, header_problems);
    if loader.params.is_none() {
        let params = read_params(&file, raw_params, &mut loader.problems);
        loader.params = Some(params);
    }

    match raw_nodes {
        None => loader.problems.push(
            Diagnostic::new("a pipeline needs at least one node")
                .at(&file, 0..0)
                .with_help("add a table such as [nodes.hello] with kind = \"exec\""),
        ),
        Some(value) => {
            let span = value.span();
            match value.into_inner() {
                // The first `handed` stand for the nodes loaded as they were read.
                DeValue::Table(table) => loader.load_all(table.into_iter().skip(handed).collect()),
                _ => loader.problems.push(
                    Diagnostic::new("`nodes` must be a table of node tables").at(&file, span),
                ),
            }
        }
    }
    let NodeLoader {
        params,
        mut problems,
        nodes,
        governing,
        unloaded,
        ..
    } = loader;
    let params = params.unwrap_or_default();
    check_needs(&file, &nodes, &unloaded, &mut problems);
    let own = header
        .as_ref()
        .and_then(|h| h.pipeline.concurrency.as_ref());
    check_node_groups(&file, own, &nodes, &mut problems);
    let problems = with_every_policy_problem(&file, context.registry, problems);

    let Some(header) = header.filter(|_| problems.is_empty()) else {
        return Err(problems.into());
    };
    Ok(Pipeline {
        name: header.pipeline.name,
        description: header.pipeline.description,
        source: file,
        spec_hash,
        fail_fast: header.pipeline.fail_fast,
        budget: header.pipeline.budget,
        concurrency: header.pipeline.concurrency,
        params,
        nodes,
        governing,
    })
}

/// Each problem in another file (a policy a node reads) comes with every other problem of that
/// file's shape, as `kavi policy check` finds them, since a node's parser stops at the first it
/// meets; and each problem is said once, however many nodes read the file.
fn with_every_policy_problem(
    file: &std::sync::Arc<SourceFile>,
    registry: &Registry,
    problems: Vec<Diagnostic>,
) -> Vec<Diagnostic> {
    let mut files_read: Vec<PathBuf> = Vec::new();
    let mut all = Vec::with_capacity(problems.len());
    for problem in problems {
        if let Some((source, _)) = &problem.location
            && !std::sync::Arc::ptr_eq(source, file)
            && !files_read.contains(&source.path)
        {
            files_read.push(source.path.clone());
            all.extend(registry.policy_problems(source));
        }
        all.push(problem);
    }
    crate::diagnostic::said_once(all)
}

/// A node may not wait for a concurrency group that is held while it waits: its own
/// pipeline's (the run holds a slot of it), or, for a node a child pipeline runs, the group of
/// the node running that child (or of any node between). Two such runs would each wait for the
/// other forever, and with `limit = 1` one run waits for itself.
fn check_node_groups(
    file: &std::sync::Arc<SourceFile>,
    own: Option<&crate::spec::Concurrency>,
    nodes: &[crate::spec::NodeSpec],
    problems: &mut Vec<Diagnostic>,
) {
    for node in nodes {
        if let Some(group) = own.and_then(|own| {
            node.concurrency
                .as_ref()
                .filter(|group| group.get_ref().group == own.group)
        }) {
            problems.push(
                Diagnostic::new(format!(
                    "node `{}` names concurrency group `{}`, which its pipeline's runs belong to",
                    node.id,
                    group.get_ref().group
                ))
                .at(file, group.span())
                .with_help(
                    "a run holds its pipeline's group while its nodes wait for theirs: name \
                     another group for the node, or drop one of the two",
                ),
            );
        }
        let mut held: Vec<(&str, String)> = own
            .map(|own| (own.group.as_str(), "its pipeline's runs hold".to_owned()))
            .into_iter()
            .collect();
        if let Some(group) = &node.concurrency {
            held.push((&group.get_ref().group, format!("node `{}` holds", node.id)));
        }
        if let Some((path, group, holder)) = waits_inside(node, &held, &mut Vec::new()) {
            problems.push(
                Diagnostic::new(format!(
                    "node `{}` runs a child pipeline whose node `{path}` names concurrency group \
                     `{group}`, which {holder} while it runs",
                    node.id
                ))
                .at(file, node.span.clone())
                .with_help(
                    "the child's node would wait for a slot its own parent holds: name another \
                     group for one of them",
                ),
            );
        }
    }
}

/// The first node run inside `node` (through child pipelines, at any depth) that names one of
/// the `held` groups, as its path from `node`, the group and who holds it.
fn waits_inside<'a>(
    node: &'a crate::spec::NodeSpec,
    held: &[(&'a str, String)],
    path: &mut Vec<&'a str>,
) -> Option<(String, String, String)> {
    for child in node.action.child_nodes() {
        path.push(&child.id);
        let group = child
            .concurrency
            .as_ref()
            .map(|g| g.get_ref().group.as_str());
        if let Some((group, holder)) = group.and_then(|g| held.iter().find(|(h, _)| *h == g)) {
            return Some((path.join(" → "), (*group).to_owned(), holder.clone()));
        }
        let found = waits_inside(child, held, path);
        path.pop();
        if found.is_some() {
            return found;
        }
    }
    None
}

/// `text`, loaded as `p.toml` in an empty workspace with `registry`'s kinds: for the tests of
/// the layers that define kinds.
#[doc(hidden)]
pub fn load_text(text: &str, registry: &Registry) -> Result<Pipeline, SpecError> {
    let root = tempfile::tempdir().map_err(|e| SpecError::Read {
        path: std::env::temp_dir(),
        source: e,
    })?;
    let templates = TemplateEngine::new(&root.path().join("templates"));
    let context = LoadContext {
        root: root.path(),
        templates: &templates,
        including: &[],
        registry,
    };
    load_pipeline_str(Path::new("p.toml"), text.into(), &context)
}
