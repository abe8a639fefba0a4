//! Tests of the one-pass reader: its tables against toml's, spans included, whole and in parts.

use super::parts::PART_BYTES;
use super::*;
use proptest::prelude::*;

/// Reads `text` on the fast path and checks it against toml.
fn read_here(text: &str) {
    assert_eq!(agrees_with_toml(text), Ok(true), "{text}");
}

/// Leaves `text` to toml.
fn left_to_toml(text: &str) {
    assert_eq!(agrees_with_toml(text), Ok(false), "{text}");
}

#[test]
fn the_shapes_of_a_pipeline_are_read_here_as_toml_reads_them() {
    read_here("");
    read_here("# only a comment\n");
    read_here(
        "top = 1\n[pipeline]\nname = \"p\" # trailing\n\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n",
    );
    read_here("[nodes.a]\nretry.attempts = 3\nretry.backoff = \"1s\"\nretry.on.exit = [1, 2]\n");
    read_here("[ nodes . \"quoted key\" ]\n'literal' = 'x'\n\"esc\\tkey\" = \"a\\u00e9\\n\"\n");
    read_here("[a]\nx = 1\n[a.b.c]\ny = 2\n[a.d]\nz = [[1, 2], [\"x\"], [], { k = true }]\n");
    read_here("a.x = 1\n[a.b]\n");
    read_here("s = \"\"\"\nmulti\\\n  line\"\"\"\nl = '''\nraw\\n'''\n");
    read_here(
        "i = [0x1F, 0o17, 0b11, -3, +4, 1_000]\nf = [1.5, -0.0, 1e3, inf, -nan, 6.626e-34]\n",
    );
    read_here("d = [1979-05-27T07:32:00Z, 1979-05-27 07:32:00-07:00, 1979-05-27, 07:32:00.999]\n");
    read_here("t = { a = 1, b = { c = [1, { d = 'e' }] } }\nempty = {}\n");
    read_here("arr = [\n  1, # one\n  2,\n]\n");
    // Lines that open with `[` inside brackets are not headers: no chunk ends there. Nor
    // inside a string that holds a line opening with `[`.
    read_here("a = 1\nb = 2\nmatrix = [\n[1, 2],\n[3, [4]],\n]\n[t]\nx = 1\n[u]\n");
    read_here("a = 1\nb = 2\ns = '''\n[not.a.header]\n'''\n[t]\nx = 1\n");
    // A later header adds to a table read before another: handed over, it must not be.
    read_here("[a.b]\nx = 1\n[c]\n[a.b.c]\ny = 2\n[a.d]\n");
}

#[test]
fn a_document_is_cut_before_a_line_opening_with_a_bracket_past_each_share() {
    let text = "top = 1\n[a]\nx = \"[\"\n[b]\ny = 2\n[c]\nz = [\n[3],\n]\n[d]\n";
    let cuts = cut_points(text, 3);
    assert_eq!(cuts.len(), 2, "{cuts:?}");
    for (i, &cut) in cuts.iter().enumerate() {
        assert!(
            text[..cut].ends_with('\n') && text[cut..].starts_with('['),
            "{cut}"
        );
        assert!(
            cut >= text.len() * (i + 1) / 3,
            "cut {cut} before its share"
        );
    }
    assert!(cuts[0] < cuts[1]);
    // No line opens with `[` past the share: no cut, and one part.
    assert_eq!(cut_points("[a]\nx = 1\ny = 2\n", 2), Vec::<usize>::new());
    assert_eq!(parts_for(PART_BYTES), 1);
}

#[test]
fn parts_whose_tables_do_not_join_as_reading_on_would_are_left_to_toml() {
    // A header in a later part that reopens a table an earlier one made, defines a key an
    // earlier one defined, or goes through a value or an inline table.
    for text in [
        "[a.b]\nx = 1\n[a]\ny = 2\n",
        "[a]\nx = 1\n[a]\ny = 2\n",
        "[a]\nb = 1\n[a.b]\n",
        "a = { x = 1 }\n[a.y]\n",
        "a = 1\n[a.y]\n",
    ] {
        let cut = text.rfind("\n[").unwrap() + 1;
        assert!(parse_parts(text, &[cut]).is_none(), "{text}");
    }
    // A later part that extends a table an earlier one made on a header's path, or made
    // with a header, joins.
    let text = "[nodes.a]\nkind = 'exec'\n[nodes.b]\nkind = 'exec'\n[x]\ny = 1\n[x.z]\n";
    let cut = text.find("[nodes.b]").unwrap();
    let joined = parse_parts(text, &[cut]).expect("joined");
    let nodes = joined
        .iter()
        .find(|(key, _)| key.get_ref() == "nodes")
        .unwrap()
        .1;
    assert_eq!(nodes.get_ref().as_table().unwrap().len(), 2);
    assert_eq!(agrees_with_toml(text), Ok(true));
}

#[test]
fn what_toml_refuses_or_reopens_is_left_to_toml() {
    // Errors: a key or table twice, a dotted key through a value or an inline table.
    left_to_toml("a = 1\na = 2\n");
    left_to_toml("[a]\n[a]\n");
    left_to_toml("a = 1\na.b = 2\n");
    left_to_toml("a = { x = 1 }\na.y = 2\n");
    left_to_toml("a = { x = 1 }\n[a.y]\n");
    left_to_toml("a = [1]\n[a.b]\n");
    left_to_toml("[a]\nb.c = 1\n[a.b]\n");
    left_to_toml("x = \"unterminated\n");
    left_to_toml("x = \"bad \\q escape\"\n");
    left_to_toml("[a\n");
    // Valid, but left to toml: arrays of tables, a header reopening an implicit table, a
    // dotted key in an inline table.
    left_to_toml("[[a]]\nx = 1\n[[a]]\nx = 2\n");
    left_to_toml("[a.b]\n[a]\n");
    left_to_toml("t = { a.b = 1 }\n");
    // Nested past toml's limit.
    left_to_toml(&format!("x = {}{}\n", "[".repeat(100), "]".repeat(100)));
}

#[test]
fn every_toml_file_in_the_repository_reads_the_same_and_pipelines_read_here() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let mut files = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | ".kavi" | "node_modules") {
                    folders.push(path);
                }
            } else if name.ends_with(".toml") {
                files.push(path);
            }
        }
    }
    assert!(files.len() > 20, "found {} TOML files", files.len());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let read = agrees_with_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if file.parent() == Some(&root.join("pipelines")) {
            assert!(read, "{} was left to toml", file.display());
        }
    }
}

/// Keys from a small set, so that generated documents reuse them: tables reopened, keys
/// twice, dotted keys through values.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_owned()),
        Just("b".to_owned()),
        Just("\"c d\"".to_owned()),
        Just("'e'".to_owned()),
        Just("\"\\u0061\"".to_owned()),
    ]
}

fn dotted_key() -> impl Strategy<Value = String> {
    prop::collection::vec(key(), 1..4).prop_map(|keys| keys.join("."))
}

fn value() -> impl Strategy<Value = String> {
    let scalar = prop_oneof![
        Just("\"s\"".to_owned()),
        Just("\"t\\tab\\u00e9\"".to_owned()),
        Just("'lit'".to_owned()),
        Just("\"\"\"\nml\\\n  x\"\"\"".to_owned()),
        Just("'''\nraw'''".to_owned()),
        Just("1".to_owned()),
        Just("0x1f".to_owned()),
        Just("-1_000".to_owned()),
        Just("3.5e2".to_owned()),
        Just("nan".to_owned()),
        Just("true".to_owned()),
        Just("1979-05-27T07:32:00Z".to_owned()),
        Just("07:32:00".to_owned()),
        Just("\"bad \\q\"".to_owned()),
    ];
    scalar.prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4)
                .prop_map(|items| format!("[{}]", items.join(", "))),
            prop::collection::vec((dotted_key(), inner), 0..3).prop_map(|pairs| {
                let pairs: Vec<String> = pairs
                    .into_iter()
                    .map(|(k, v)| format!("{k} = {v}"))
                    .collect();
                format!("{{ {} }}", pairs.join(", "))
            }),
        ]
    })
}

fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (dotted_key(), value()).prop_map(|(k, v)| format!("{k} = {v}")),
        2 => dotted_key().prop_map(|k| format!("[{k}]")),
        1 => dotted_key().prop_map(|k| format!("[[{k}]]")),
        1 => Just("# comment".to_owned()),
        1 => Just(String::new()),
    ]
}

proptest! {
    /// On generated documents, valid or not, the fast path either leaves the text to toml
    /// or builds exactly toml's tables.
    #[test]
    fn generated_documents_read_as_toml_reads_them(
        lines in prop::collection::vec(line(), 0..12)
    ) {
        let text = lines.join("\n");
        prop_assert!(agrees_with_toml(&text).is_ok(), "{:?}\n{text}", agrees_with_toml(&text));
    }
}
