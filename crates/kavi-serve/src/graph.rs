//! A run's graph laid out for the run page's SVG, on the server: each node in the layer of the
//! longest path that reaches it, so every edge points rightwards, and the nodes of a layer in
//! the pipeline's topological order.

use std::collections::HashMap;

use serde::Serialize;

/// A node's box, in SVG user units.
const WIDTH: u32 = 200;
const HEIGHT: u32 = 44;
const COLUMN_GAP: u32 = 56;
const ROW_GAP: u32 = 16;
const MARGIN: u32 = 8;
/// The longest name written in a box; the whole name is the link's title.
const SHOWN_CHARS: usize = 26;

#[derive(Debug, Serialize)]
pub struct Drawing {
    pub width: u32,
    pub height: u32,
    /// Every node's box.
    pub box_width: u32,
    pub box_height: u32,
    pub nodes: Vec<Placed>,
    pub edges: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Placed {
    pub id: String,
    /// The name as written in the box, cut to fit.
    pub label: String,
    pub state: String,
    pub x: u32,
    pub y: u32,
}

/// Lays out `graph` (each node with the nodes it depends on, in a topological order); `state`
/// gives a node's state in words.
pub fn layout(graph: &[(String, Vec<String>)], state: impl Fn(&str) -> String) -> Drawing {
    let mut layer_of: HashMap<&str, u32> = HashMap::new();
    let mut rows_in: Vec<u32> = Vec::new();
    let mut at: HashMap<&str, (u32, u32)> = HashMap::new();
    let mut nodes = Vec::with_capacity(graph.len());
    for (id, needs) in graph {
        // In a topological order each dependency is placed before the node that needs it.
        let layer = needs
            .iter()
            .filter_map(|need| layer_of.get(need.as_str()))
            .map(|l| l + 1)
            .max()
            .unwrap_or(0);
        layer_of.insert(id, layer);
        let column = usize::try_from(layer).unwrap_or(usize::MAX);
        if rows_in.len() <= column {
            rows_in.resize(column + 1, 0);
        }
        let row = rows_in[column];
        rows_in[column] += 1;
        let (x, y) = (
            MARGIN + layer * (WIDTH + COLUMN_GAP),
            MARGIN + row * (HEIGHT + ROW_GAP),
        );
        at.insert(id, (x, y));
        let label = match id.chars().count() > SHOWN_CHARS {
            true => format!("{}…", id.chars().take(SHOWN_CHARS - 1).collect::<String>()),
            false => id.clone(),
        };
        nodes.push(Placed {
            id: id.clone(),
            label,
            state: state(id),
            x,
            y,
        });
    }
    let edges = graph
        .iter()
        .flat_map(|(id, needs)| needs.iter().map(move |need| (need, id)))
        .filter_map(|(from, to)| {
            let ((x1, y1), (x2, y2)) = (at.get(from.as_str())?, at.get(to.as_str())?);
            let (x1, y1, y2) = (x1 + WIDTH, y1 + HEIGHT / 2, y2 + HEIGHT / 2);
            let bend = (x1 + x2) / 2;
            Some(format!("M{x1},{y1} C{bend},{y1} {bend},{y2} {x2},{y2}"))
        })
        .collect();
    let columns = u32::try_from(rows_in.len()).unwrap_or(u32::MAX);
    let rows = rows_in.iter().copied().max().unwrap_or(0);
    Drawing {
        width: 2 * MARGIN + columns * WIDTH + columns.saturating_sub(1) * COLUMN_GAP,
        height: 2 * MARGIN + rows * HEIGHT + rows.saturating_sub(1) * ROW_GAP,
        box_width: WIDTH,
        box_height: HEIGHT,
        nodes,
        edges,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
        edges
            .iter()
            .map(|(id, needs)| {
                (
                    (*id).to_owned(),
                    needs.iter().map(|n| (*n).to_owned()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn each_node_stands_in_the_layer_of_its_longest_path() {
        // a → b → c, and a → c directly: c is after b, not beside it.
        let drawing = layout(
            &graph(&[("a", &[]), ("b", &["a"]), ("d", &[]), ("c", &["a", "b"])]),
            |id| format!("state of {id}"),
        );
        let place: Vec<(&str, u32, u32)> = drawing
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.x, n.y))
            .collect();
        let (column, row) = (WIDTH + COLUMN_GAP, HEIGHT + ROW_GAP);
        assert_eq!(
            place,
            [
                ("a", MARGIN, MARGIN),
                ("b", MARGIN + column, MARGIN),
                ("d", MARGIN, MARGIN + row),
                ("c", MARGIN + 2 * column, MARGIN),
            ]
        );
        assert_eq!(drawing.nodes[3].state, "state of c");
        assert_eq!(drawing.edges.len(), 3);
        // Every edge leaves a box's right side and enters the next one's left.
        assert_eq!(
            drawing.edges[0],
            format!(
                "M{},{} C{},{} {},{} {},{}",
                MARGIN + WIDTH,
                MARGIN + HEIGHT / 2,
                MARGIN + WIDTH + COLUMN_GAP / 2,
                MARGIN + HEIGHT / 2,
                MARGIN + WIDTH + COLUMN_GAP / 2,
                MARGIN + HEIGHT / 2,
                MARGIN + column,
                MARGIN + HEIGHT / 2
            )
        );
        assert_eq!(drawing.width, 2 * MARGIN + 3 * WIDTH + 2 * COLUMN_GAP);
        assert_eq!(drawing.height, 2 * MARGIN + 2 * HEIGHT + ROW_GAP);
    }

    #[test]
    fn a_long_name_is_cut_in_its_box_and_an_empty_graph_is_empty() {
        let long = "n".repeat(40);
        let drawing = layout(&graph(&[(&long, &[])]), |_| String::new());
        assert_eq!(drawing.nodes[0].label.chars().count(), SHOWN_CHARS);
        assert!(drawing.nodes[0].label.ends_with('…'));
        assert_eq!(drawing.nodes[0].id, long);
        let empty = layout(&[], |_| String::new());
        assert_eq!((empty.width, empty.height), (2 * MARGIN, 2 * MARGIN));
    }
}
