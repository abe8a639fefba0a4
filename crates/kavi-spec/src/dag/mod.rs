//! Compiling a validated pipeline into a petgraph DAG.
//!
//! Edges point from a dependency to its dependant. Compilation refuses cycles (naming every node
//! on the cycle, in order) and templates that read the outputs of a node that is not upstream,
//! which would otherwise depend on scheduling luck.

mod render;

use std::collections::{HashMap, HashSet};

use petgraph::Direction;
use petgraph::graph::{DiGraph, NodeIndex};

pub use render::{GraphFormat, render_graph};

use crate::diagnostic::Diagnostic;
use crate::spec::{Pipeline, SpecError};

/// The fields of `nodes.<id>` in templates (see `Executor::finish_node`).
pub const NODE_ENTRY_FIELDS: &[&str] = &["state", "kind", "error", "outputs"];

/// A pipeline whose dependencies form a DAG. Graph node weights index `pipeline.nodes`.
#[derive(Debug)]
pub struct Dag<'p> {
    pub pipeline: &'p Pipeline,
    pub graph: DiGraph<usize, ()>,
    /// A topological order, stable: ties go to the node declared first.
    pub order: Vec<usize>,
    /// Longest distance from a root, per node: nodes of one stage can run side by side.
    pub stage: Vec<usize>,
}

impl<'p> Dag<'p> {
    /// Indices of the nodes that `index` needs.
    pub fn dependencies(&self, index: usize) -> impl Iterator<Item = usize> + '_ {
        self.graph
            .neighbors_directed(NodeIndex::new(index), Direction::Incoming)
            .map(|n| self.graph[n])
    }

    /// Indices of the nodes that need `index`.
    pub fn dependants(&self, index: usize) -> impl Iterator<Item = usize> + '_ {
        self.graph
            .neighbors_directed(NodeIndex::new(index), Direction::Outgoing)
            .map(|n| self.graph[n])
    }

    pub fn len(&self) -> usize {
        self.pipeline.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pipeline.nodes.is_empty()
    }
}

/// Each node's index by its id. Hashed with foldhash rather than SipHash: ids come from the
/// operator's pipeline file, and a 10,000-node pipeline hashes 40,000 of them.
type NodeIndexOf<'p> = HashMap<&'p str, usize, foldhash::fast::RandomState>;

pub fn compile(pipeline: &Pipeline) -> Result<Dag<'_>, SpecError> {
    let index_of: NodeIndexOf<'_> = pipeline
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id.as_str(), i))
        .collect();
    let edges = pipeline.nodes.iter().map(|n| n.needs.len()).sum();
    let mut graph = DiGraph::with_capacity(pipeline.nodes.len(), edges);
    for i in 0..pipeline.nodes.len() {
        graph.add_node(i);
    }
    // `needed_by[d] == i` once node `i` has its edge from `d`: a need listed twice makes one
    // edge, with no set allocated per node.
    let mut needed_by = vec![usize::MAX; pipeline.nodes.len()];
    for (i, node) in pipeline.nodes.iter().enumerate() {
        for need in &node.needs {
            let dep = index_of[need.get_ref().as_str()];
            if needed_by[dep] != i {
                needed_by[dep] = i;
                graph.add_edge(NodeIndex::new(dep), NodeIndex::new(i), ());
            }
        }
    }

    let order = stable_topological_order(&graph).map_err(|cycle| cycle_error(pipeline, &cycle))?;
    let mut stage = vec![0; pipeline.nodes.len()];
    for &i in &order {
        let level = graph
            .neighbors_directed(NodeIndex::new(i), Direction::Incoming)
            .map(|d| stage[graph[d]] + 1)
            .max()
            .unwrap_or(0);
        stage[i] = level;
    }
    let dag = Dag {
        pipeline,
        graph,
        order,
        stage,
    };
    check_node_reads(&dag, &index_of)?;
    Ok(dag)
}

/// Kahn's algorithm with a min-heap, so the order is the same on every run. On a cycle, returns
/// the nodes of one cycle, in dependency order.
fn stable_topological_order(graph: &DiGraph<usize, ()>) -> Result<Vec<usize>, Vec<usize>> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut indegree: Vec<usize> = graph
        .node_indices()
        .map(|n| graph.neighbors_directed(n, Direction::Incoming).count())
        .collect();
    let mut ready: BinaryHeap<Reverse<usize>> = indegree
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == 0)
        .map(|(i, _)| Reverse(i))
        .collect();
    let mut order = Vec::with_capacity(indegree.len());
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for next in graph.neighbors_directed(NodeIndex::new(i), Direction::Outgoing) {
            let d = &mut indegree[next.index()];
            *d -= 1;
            if *d == 0 {
                ready.push(Reverse(next.index()));
            }
        }
    }
    if order.len() == indegree.len() {
        return Ok(order);
    }
    // Every node left has an unfinished dependency; walking dependencies backwards from the
    // first of them must revisit a node, and the walk from that node's first visit is a cycle.
    let start = (0..indegree.len())
        .find(|&i| indegree[i] > 0)
        .expect("a node is left");
    let mut path = vec![start];
    let mut position = HashMap::from([(start, 0)]);
    let mut current = start;
    loop {
        let previous = graph
            .neighbors_directed(NodeIndex::new(current), Direction::Incoming)
            .map(|n| n.index())
            .filter(|&n| indegree[n] > 0)
            .min()
            .expect("a node on a cycle has an unfinished dependency");
        if let Some(&at) = position.get(&previous) {
            let mut cycle = path.split_off(at);
            // The walk went from dependant to dependency; report dependencies first, starting
            // from the node declared first so the message is the same however it was found.
            cycle.reverse();
            let first = (0..cycle.len())
                .min_by_key(|&i| cycle[i])
                .expect("a cycle has nodes");
            cycle.rotate_left(first);
            return Err(cycle);
        }
        position.insert(previous, path.len());
        path.push(previous);
        current = previous;
    }
}

fn cycle_error(pipeline: &Pipeline, cycle: &[usize]) -> SpecError {
    let names: Vec<&str> = cycle
        .iter()
        .map(|&i| pipeline.nodes[i].id.as_str())
        .collect();
    let mut path = names.join(" -> ");
    path.push_str(" -> ");
    path.push_str(names[0]);
    // Point at the `needs` entry of the first node's dependant that closes the loop.
    let second = &pipeline.nodes[cycle[1 % cycle.len()]];
    let span = second
        .needs
        .iter()
        .find(|n| n.get_ref() == names[0])
        .map_or(second.span.clone(), |n| n.span());
    Diagnostic::new(format!("dependency cycle: {path}"))
        .at(&pipeline.source, span)
        .with_help("each node in the cycle needs the one before it; remove one of these `needs`")
        .into()
}

/// A node that reads `nodes.X` must have X upstream; otherwise X may not have run yet.
fn check_node_reads(dag: &Dag<'_>, index_of: &NodeIndexOf<'_>) -> Result<(), SpecError> {
    let mut problems = Vec::new();
    let mut upstream = Upstream::new(dag);
    for (i, node) in dag.pipeline.nodes.iter().enumerate() {
        for (path, span) in &node.reads {
            let mut parts = path.split('.');
            if parts.next() != Some("nodes") {
                continue;
            }
            let Some(target) = parts.next() else { continue };
            let Some(&t) = index_of.get(target) else {
                problems.push(
                    Diagnostic::new(format!(
                        "node `{}` reads `nodes.{target}`, which is not a node",
                        node.id
                    ))
                    .at(&dag.pipeline.source, span.clone()),
                );
                continue;
            };
            if let Some(problem) = unknown_node_field(&dag.pipeline.nodes[t], parts) {
                let (message, help) = problem;
                problems.push(
                    Diagnostic::new(format!("node `{}` reads `{path}`: {message}", node.id))
                        .at(&dag.pipeline.source, span.clone())
                        .with_help(help),
                );
                continue;
            }
            if !upstream.holds(t, i) {
                problems.push(
                    Diagnostic::new(format!(
                        "node `{}` reads the outputs of `{target}` but does not need it",
                        node.id
                    ))
                    .at(&dag.pipeline.source, span.clone())
                    .with_help(format!("add \"{target}\" to the `needs` of `{}`", node.id)),
                );
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.into())
    }
}

/// What is wrong with reading `nodes.<target>.<rest>`: a field the entry does not have, or an
/// output the target's kind never produces.
fn unknown_node_field<'p>(
    target: &crate::spec::NodeSpec,
    mut rest: impl Iterator<Item = &'p str>,
) -> Option<(String, String)> {
    use crate::diagnostic::suggest;
    let field = rest.next()?;
    if !NODE_ENTRY_FIELDS.contains(&field) {
        return Some((
            format!("a node has no `{field}`"),
            suggest(field, NODE_ENTRY_FIELDS),
        ));
    }
    if field != "outputs" {
        return None;
    }
    if target.fan_out.is_some() {
        // Its outputs are a list: `nodes.f.outputs[0].x` and loops read no further than this.
        let output = rest.next()?;
        let id = &target.id;
        return Some((
            format!(
                "`{id}` runs once per item (`for_each`): its `outputs` is a list, one entry per \
                 instance, with no `{output}`"
            ),
            format!(
                "read one instance's as `nodes.{id}.outputs[0].{output}`, or each in a loop: \
                 `{{% for o in nodes.{id}.outputs %}}{{{{ o.{output} }}}}{{% endfor %}}`"
            ),
        ));
    }
    unknown_output(target, rest)
}

/// What is wrong with reading `<rest>` in a node's outputs: an output its kind never produces,
/// a name the output never holds (a chain's step, a child pipeline's node, an http extract), a
/// field that name's entry never has, or, in a child pipeline's node, any of these in turn.
fn unknown_output<'p>(
    target: &crate::spec::NodeSpec,
    mut rest: impl Iterator<Item = &'p str>,
) -> Option<(String, String)> {
    use crate::diagnostic::suggest;
    let output = rest.next()?;
    let keys = target.action.output_keys()?;
    if !keys.contains(&output) {
        return Some((
            format!("`{}` nodes have no output `{output}`", target.kind),
            suggest(output, keys),
        ));
    }
    let name = rest.next()?;
    let names = target.action.output_names(output)?;
    if !names.contains(&name) {
        return Some((
            format!(
                "`{}` has no `{name}` in its `{output}` (it has: {})",
                target.id,
                names.join(", ")
            ),
            suggest(name, &names),
        ));
    }
    let field = rest.next()?;
    let fields = target.action.output_entry_fields(output)?;
    if !fields.contains(&field) {
        return Some((
            format!(
                "`{}`'s `{output}.{name}` has no `{field}` (it has: {})",
                target.id,
                fields.join(", ")
            ),
            suggest(field, fields),
        ));
    }
    match target.action.output_node(output, name) {
        Some(child) if field == "outputs" => unknown_output(child, rest),
        _ => None,
    }
}

/// Answers whether one node is upstream of another, for every template read of a pipeline.
/// Gathering each reader's whole ancestry made checking a long chain whose nodes read what they
/// need quadratic (8,000 nodes: over a minute); a walk from the reader that stops at the target,
/// never climbs to the target's stage or above (every node between them lies strictly below
/// it), and stops at a node already known to lie below the target costs what lies between.
struct Upstream<'d, 'p> {
    dag: &'d Dag<'p>,
    /// `walked[n] == walk` once the current walk has been at `n`.
    walked: Vec<u32>,
    walk: u32,
    /// By target, the nodes a walk found it upstream of.
    below: HashMap<usize, HashSet<usize>>,
}

impl<'d, 'p> Upstream<'d, 'p> {
    fn new(dag: &'d Dag<'p>) -> Self {
        Self {
            dag,
            walked: vec![0; dag.len()],
            walk: 0,
            below: HashMap::new(),
        }
    }

    /// Whether `target` is upstream of `reader`.
    fn holds(&mut self, target: usize, reader: usize) -> bool {
        let stage = &self.dag.stage;
        if stage[target] >= stage[reader] {
            return false;
        }
        if self.dag.dependencies(reader).any(|d| d == target) {
            return true;
        }
        self.walk += 1;
        let below = self.below.entry(target).or_default();
        self.walked[reader] = self.walk;
        // The walk's path from the reader, each node with the dependencies it has left to try.
        let mut path: Vec<(usize, Vec<usize>)> =
            vec![(reader, self.dag.dependencies(reader).collect())];
        while let Some((_, left)) = path.last_mut() {
            let Some(dep) = left.pop() else {
                path.pop();
                continue;
            };
            if dep == target || below.contains(&dep) {
                below.extend(path.iter().map(|(n, _)| *n));
                return true;
            }
            if self.walked[dep] != self.walk && stage[dep] > stage[target] {
                self.walked[dep] = self.walk;
                path.push((dep, self.dag.dependencies(dep).collect()));
            }
        }
        false
    }
}
