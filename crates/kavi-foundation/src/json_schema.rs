//! Values checked against a JSON Schema (a skill's declared input and output), with errors that
//! name each failing JSON pointer.

use serde_json::Value;

/// Checks `input` against a JSON Schema; the error names each failing JSON pointer.
pub fn validate(schema: &Value, input: &Value, what: &str) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| format!("the {what} schema is not valid: {e}"))?;
    let problems: Vec<String> = validator
        .iter_errors(input)
        .map(|e| {
            let pointer = e.instance_path().to_string();
            let at = if pointer.is_empty() { "/" } else { &pointer };
            format!("at {at}: {e}")
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the {what} does not match the {what} schema: {}",
            problems.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_errors_name_the_failing_json_pointer() {
        let schema = json!({
            "type": "object",
            "required": ["text"],
            "properties": { "text": { "type": "string" }, "n": { "type": "integer" } },
        });
        assert!(validate(&schema, &json!({"text": "a"}), "input").is_ok());
        let error = validate(&schema, &json!({"text": 3}), "input").unwrap_err();
        assert_eq!(
            error,
            "the input does not match the input schema: at /text: 3 is not of type \"string\""
        );
        let error = validate(&schema, &json!({"n": 1}), "output").unwrap_err();
        assert!(
            error.starts_with("the output does not match the output schema: at /: "),
            "{error}"
        );
    }
}
