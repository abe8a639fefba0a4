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

/// The first value `path` selects in `value`; selecting nothing is an error that names the path.
pub fn select_one(value: &Value, path: &str) -> Result<Value, String> {
    let found = value
        .query(path)
        .map_err(|e| format!("invalid JSONPath `{path}`: {}", reason(&e)))?;
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
    fn selects_the_first_match_and_names_a_path_that_selects_nothing() {
        let value = json!({"results": [{"path": "a.md"}, {"path": "b.md"}]});
        assert_eq!(select_one(&value, "$.results[0].path").unwrap(), "a.md");
        assert_eq!(select_one(&value, "$.results[*].path").unwrap(), "a.md");
        assert_eq!(
            select_one(&value, "$.results[5].path").unwrap_err(),
            "`$.results[5].path` selects nothing"
        );
        assert!(check("$.results[0]").is_ok());
        assert!(
            check("results[")
                .unwrap_err()
                .starts_with("invalid JSONPath `results[`")
        );
    }
}
