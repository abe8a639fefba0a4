//! JSONPath (`$.results[0].path`) over JSON values, for `http` node extracts and chain mappings.
//! A thin layer over jsonpath-rust that turns its answers into messages naming the path.

use jsonpath_rust::JsonPath;
use serde_json::Value;

/// The parser's verdict in one line: its messages come as a multi-line source excerpt.
fn reason(error: &impl std::fmt::Display) -> String {
    let text = error.to_string();
    text.lines()
        .rev()
        .find_map(|line| line.trim_start().strip_prefix("= "))
        .map_or_else(
            || text.lines().next().unwrap_or_default().to_owned(),
            str::to_owned,
        )
}

/// Checks that `path` is a JSONPath expression, so a spec can be refused before anything runs.
pub fn check(path: &str) -> Result<(), String> {
    Value::Null
        .query(path)
        .map(|_| ())
        .map_err(|e| format!("invalid JSONPath `{path}`: {}", reason(&e)))
}

/// Whether `path` can select at most one value (RFC 9535's singular query: names and single
/// indices only). A wildcard, a slice, a filter, a union or a descent may select many.
fn selects_one(path: &str) -> bool {
    let mut quote = None;
    let mut depth = 0usize;
    let mut previous = ' ';
    for c in path.chars() {
        match (quote, c) {
            (Some(q), c) if c == q && previous != '\\' => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') => depth = depth.saturating_sub(1),
            (None, '*' | '?') => return false,
            (None, '.') if previous == '.' => return false,
            (None, ':' | ',') if depth > 0 => return false,
            _ => {}
        }
        previous = c;
    }
    true
}

/// What `path` selects in `value`: for a path that names one place (`$.results[0].path`) that
/// value, and selecting nothing is an error that names the path; for one that may select many
/// (`$.results[*].score`), every match, in order, as a list (empty when none).
pub fn select(value: &Value, path: &str) -> Result<Value, String> {
    let found = value
        .query(path)
        .map_err(|e| format!("invalid JSONPath `{path}`: {}", reason(&e)))?;
    if !selects_one(path) {
        return Ok(Value::Array(found.into_iter().cloned().collect()));
    }
    found
        .first()
        .map(|v| (*v).clone())
        .ok_or_else(|| format!("`{path}` selects nothing"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_singular_path_selects_one_value_and_names_a_path_that_selects_nothing() {
        let value = json!({"results": [{"path": "a.md"}, {"path": "b.md"}]});
        assert_eq!(select(&value, "$.results[0].path").unwrap(), "a.md");
        assert_eq!(select(&value, "$['results'][1]['path']").unwrap(), "b.md");
        assert_eq!(
            select(&value, "$.results[5].path").unwrap_err(),
            "`$.results[5].path` selects nothing"
        );
        assert!(check("$.results[0]").is_ok());
        assert!(
            check("results[")
                .unwrap_err()
                .starts_with("invalid JSONPath `results[`")
        );
    }

    #[test]
    fn a_path_that_may_select_many_selects_every_match() {
        let value =
            json!({"results": [{"score": 3}, {"score": 5}, {"score": 8}], "n": {"score": 1}});
        for (path, expected) in [
            ("$.results[*].score", json!([3, 5, 8])),
            ("$.results[0:2].score", json!([3, 5])),
            ("$.results[0,2].score", json!([3, 8])),
            ("$.results[?@.score > 4].score", json!([5, 8])),
            ("$.missing[*]", json!([])),
        ] {
            assert_eq!(select(&value, path).unwrap(), expected, "{path}");
        }
        // A descent's order over an object's members is the parser's to choose.
        let mut all = select(&value, "$..score").unwrap();
        all.as_array_mut().unwrap().sort_by_key(Value::as_i64);
        assert_eq!(all, json!([1, 3, 5, 8]));
        // A star or a colon inside a quoted name is a name.
        let odd = json!({"a*b": 1, "c:d": 2});
        assert_eq!(select(&odd, "$['a*b']").unwrap(), 1);
        assert_eq!(select(&odd, "$['c:d']").unwrap(), 2);
    }
}
