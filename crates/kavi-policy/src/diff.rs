//! What a change to a governing TOML file means, in words: for `kavi policy diff`.
//!
//! The comparison is structural, so it works for every policy file, the pipelines and the
//! configuration alike: tables are compared key by key, arrays of scalars as sets ("added
//! `socket`"), and arrays of tables element by element, each element known by its identity (its
//! `id`, `name`, `from`/`to` pair or `path`, whichever is unique in both versions). A gate whose
//! `required` turns false is "made advisory", because that is the change a reviewer must see.

use toml::{Table, Value};

/// The changes from `old` to `new`, one sentence each; `None` when either is not TOML.
pub fn describe(old: &str, new: &str) -> Option<Vec<String>> {
    let old: Table = toml::from_str(old).ok()?;
    let new: Table = toml::from_str(new).ok()?;
    let mut changes = Vec::new();
    tables(&mut changes, "", &old, &new);
    Some(changes)
}

/// A dotted path for messages: `nodes.gate.set`.
fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        unticked(key)
    } else {
        format!("{prefix}.{}", unticked(key))
    }
}

/// Text a file supplies (a key, a value, an id) with its backticks made quotes: the words wrap
/// keys and ids in backticks, and the `[adoption]` rules match those, so a value must not forge
/// them (`builder = "x # : gate `t` added"` read as adding a gate). File names too: a file
/// named `x: gate `g` added.toml` must not read as adding a gate.
pub(crate) fn unticked(text: &str) -> String {
    text.replace('`', "'")
}

fn tables(changes: &mut Vec<String>, prefix: &str, old: &Table, new: &Table) {
    for (key, old_value) in old {
        let path = join(prefix, key);
        match new.get(key) {
            None => changes.push(format!("`{path}` removed (was {})", inline(old_value))),
            Some(new_value) => values(changes, &path, key, old_value, new_value),
        }
    }
    for (key, new_value) in new {
        if !old.contains_key(key) {
            let path = join(prefix, key);
            changes.push(format!("`{path}` added: {}", inline(new_value)));
        }
    }
}

fn values(changes: &mut Vec<String>, path: &str, key: &str, old: &Value, new: &Value) {
    if old == new {
        return;
    }
    match (old, new) {
        (Value::Table(old), Value::Table(new)) => tables(changes, path, old, new),
        (Value::Array(old), Value::Array(new)) if is_table_array(old) && is_table_array(new) => {
            table_arrays(changes, path, key, old, new);
        }
        (Value::Array(old), Value::Array(new)) => {
            let removed: Vec<String> = old
                .iter()
                .filter(|v| !new.contains(v))
                .map(inline)
                .collect();
            let added: Vec<String> = new
                .iter()
                .filter(|v| !old.contains(v))
                .map(inline)
                .collect();
            // Additions and removals are separate changes, each classified on its own: one
            // sentence for both would let a rule for additions (`deny`: added *) pass removals.
            if !added.is_empty() {
                changes.push(format!("`{path}`: added {}", added.join(", ")));
            }
            if !removed.is_empty() {
                changes.push(format!("`{path}`: removed {}", removed.join(", ")));
            }
            if added.is_empty() && removed.is_empty() {
                changes.push(format!("`{path}`: reordered"));
            }
        }
        _ => changes.push(format!("`{path}`: {} -> {}", inline(old), inline(new))),
    }
}

fn is_table_array(items: &[Value]) -> bool {
    items.iter().all(Value::is_table)
}

/// How an element of an array of tables is known: the first identity that is present and
/// unique in both versions.
type Identity = fn(&Table) -> Option<String>;

const IDENTITIES: [Identity; 4] = [
    |t| t.get("id").map(plain),
    |t| t.get("name").map(plain),
    |t| {
        Some(format!(
            "{} -> {}",
            plain(t.get("from")?),
            plain(t.get("to")?)
        ))
    },
    |t| t.get("path").map(plain),
];

fn identity_for(old: &[Value], new: &[Value]) -> Option<Identity> {
    IDENTITIES.into_iter().find(|identity| {
        [old, new].iter().all(|items| {
            let keys: Option<Vec<String>> = items
                .iter()
                .map(|v| v.as_table().and_then(identity))
                .collect();
            keys.is_some_and(|mut keys| {
                let count = keys.len();
                keys.sort();
                keys.dedup();
                keys.len() == count
            })
        })
    })
}

fn table_arrays(changes: &mut Vec<String>, path: &str, key: &str, old: &[Value], new: &[Value]) {
    let Some(identity) = identity_for(old, new) else {
        // No identity: elements are compared whole, so a changed one reads as removed + added.
        for item in old.iter().filter(|v| !new.contains(v)) {
            changes.push(format!("`{path}`: {key} {} removed", inline(item)));
        }
        for item in new.iter().filter(|v| !old.contains(v)) {
            changes.push(format!("`{path}`: {key} {} added", inline(item)));
        }
        return;
    };
    let id_of = |v: &Value| v.as_table().and_then(identity).unwrap_or_default();
    for item in old {
        let id = id_of(item);
        let name = format!("{key} `{id}`");
        match new.iter().find(|n| id_of(n) == id) {
            None => changes.push(format!("{name} removed")),
            Some(now) => {
                let (Some(before), Some(after)) = (item.as_table(), now.as_table()) else {
                    continue;
                };
                if before == after {
                    continue;
                }
                if key == "gate" && required(before) != required(after) {
                    changes.push(format!(
                        "{name} made {}",
                        if required(after) {
                            "required"
                        } else {
                            "advisory"
                        }
                    ));
                }
                let mut inner = Vec::new();
                tables(&mut inner, "", before, after);
                changes.extend(
                    inner
                        .into_iter()
                        .filter(|c| !(key == "gate" && c.starts_with("`required`")))
                        .map(|c| format!("{name}: {c}")),
                );
            }
        }
    }
    for item in new {
        let id = id_of(item);
        if !old.iter().any(|o| id_of(o) == id) {
            changes.push(format!("{key} `{id}` added: {}", inline(item)));
        }
    }
    let order = |items: &[Value]| -> Vec<String> { items.iter().map(id_of).collect() };
    let (before, after) = (order(old), order(new));
    let kept_before: Vec<&String> = before.iter().filter(|id| after.contains(id)).collect();
    let kept_after: Vec<&String> = after.iter().filter(|id| before.contains(id)).collect();
    if kept_before != kept_after {
        changes.push(format!(
            "`{path}` reordered (order decides which {key} applies first)"
        ));
    }
}

/// A gate is required unless it says otherwise.
fn required(gate: &Table) -> bool {
    gate.get("required")
        .and_then(Value::as_bool)
        .unwrap_or(true)
}

/// A value as it reads in TOML, on one line.
fn inline(value: &Value) -> String {
    unticked(&value.to_string())
}

/// A string without its quotes; other values as TOML.
fn plain(value: &Value) -> String {
    unticked(
        &value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned),
    )
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn gates_added_removed_and_made_advisory_are_named() {
        let old = r#"
[[gate]]
id = "lint"
kind = "command"
run = ["ruff", "check"]
failure = "VERIFY_LINT"

[[gate]]
id = "tests"
kind = "command"
run = ["pytest"]
failure = "VERIFY_TESTS"
"#;
        let new = r#"
[[gate]]
id = "lint"
kind = "command"
run = ["ruff", "check", "--fix"]
failure = "VERIFY_LINT"
required = false

[[gate]]
id = "types"
kind = "command"
run = ["mypy"]
failure = "VERIFY_TYPES"
"#;
        let changes = describe(old, new).unwrap();
        assert_eq!(
            changes,
            [
                "gate `lint` made advisory",
                "gate `lint`: `run`: added \"--fix\"",
                "gate `tests` removed",
                "gate `types` added: { id = \"types\", kind = \"command\", run = [\"mypy\"], failure = \"VERIFY_TYPES\" }",
            ]
        );
    }

    #[test]
    fn transitions_thresholds_sets_and_profiles_are_named() {
        let old = r#"
repeated_failure = 3
security_kinds = ["VERIFY_POLICY"]
[builder]
network = false
[[transition]]
from = "BUILT"
to = "VERIFIED"
"#;
        let new = r#"
repeated_failure = 5
security_kinds = ["VERIFY_POLICY", "CONFINEMENT_DENIED"]
[builder]
network = true
[[transition]]
from = "PROPOSED"
to = "TRUSTED"
"#;
        let changes = describe(old, new).unwrap();
        assert_eq!(
            changes,
            [
                "`repeated_failure`: 3 -> 5",
                "`security_kinds`: added \"CONFINEMENT_DENIED\"",
                "`builder.network`: false -> true",
                "transition `BUILT -> VERIFIED` removed",
                "transition `PROPOSED -> TRUSTED` added: { from = \"PROPOSED\", to = \"TRUSTED\" }",
            ]
        );
    }

    #[test]
    fn rules_without_identity_and_reordering_are_reported() {
        let old = "[[rule]]\nkind = \"A\"\n[[rule]]\nkind = \"A\"\nstate = \"x\"\n";
        let new = "[[rule]]\nkind = \"A\"\nstate = \"x\"\n[[rule]]\nkind = \"B\"\n";
        let changes = describe(old, new).unwrap();
        assert_eq!(
            changes,
            [
                "`rule`: rule { kind = \"A\" } removed",
                "`rule`: rule { kind = \"B\" } added",
            ]
        );
        let reordered = describe(
            "[[rule]]\nid = \"a\"\n[[rule]]\nid = \"b\"\n",
            "[[rule]]\nid = \"b\"\n[[rule]]\nid = \"a\"\n",
        )
        .unwrap();
        assert_eq!(
            reordered,
            ["`rule` reordered (order decides which rule applies first)"]
        );
        assert_eq!(describe("a = 1", "a = 1").unwrap(), Vec::<String>::new());
        // A value cannot forge the backticks the adoption rules match keys and ids by.
        assert_eq!(
            describe("b = \"x\"", "b = \"y # : gate `t` added\"").unwrap(),
            ["`b`: \"x\" -> \"y # : gate 't' added\""]
        );
        assert!(describe("a = ", "a = 1").is_none());
    }
}
