//! The DAG as DOT (Graphviz) or Mermaid text.

use std::fmt::Write;

use super::Dag;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GraphFormat {
    Dot,
    Mermaid,
}

fn dot_quote(text: &str) -> String {
    let escaped = text
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    format!("\"{escaped}\"")
}

pub fn render_graph(dag: &Dag<'_>, format: GraphFormat) -> String {
    let nodes = &dag.pipeline.nodes;
    let mut out = String::new();
    match format {
        GraphFormat::Dot => {
            let _ = writeln!(out, "digraph {} {{", dot_quote(&dag.pipeline.name));
            let _ = writeln!(out, "  rankdir=LR;");
            for &i in &dag.order {
                let node = &nodes[i];
                let label = format!("{}\n{}", node.id, node.kind);
                // Conditional nodes are dashed: they may be skipped.
                let style = if node.when.is_some() {
                    ", style=dashed"
                } else {
                    ""
                };
                let _ = writeln!(
                    out,
                    "  {} [label={}{style}];",
                    dot_quote(&node.id),
                    dot_quote(&label)
                );
            }
            for &i in &dag.order {
                for dep in dag
                    .dependencies(i)
                    .collect::<std::collections::BTreeSet<_>>()
                {
                    let _ = writeln!(
                        out,
                        "  {} -> {};",
                        dot_quote(&nodes[dep].id),
                        dot_quote(&nodes[i].id)
                    );
                }
            }
            out.push_str("}\n");
        }
        GraphFormat::Mermaid => {
            out.push_str("flowchart LR\n");
            // Mermaid ids are positional, so any node id (hyphens included) is safe as a label.
            for &i in &dag.order {
                let node = &nodes[i];
                let label = format!("{} ({})", node.id, node.kind).replace('"', "#quot;");
                let _ = writeln!(out, "  n{i}[\"{label}\"]");
            }
            for &i in &dag.order {
                for dep in dag
                    .dependencies(i)
                    .collect::<std::collections::BTreeSet<_>>()
                {
                    let _ = writeln!(out, "  n{dep} --> n{i}");
                }
            }
        }
    }
    out
}
