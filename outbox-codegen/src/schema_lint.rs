//! A structural check that a value is a JSON Schema (draft 2020-12): every
//! keyword the registry relies on has the type the specification gives it,
//! subschemas are schemas, and local `$ref`s resolve. Not a full
//! meta-schema validation: enough to refuse a hand-edited file that tools
//! would misread, with the JSON pointer of the problem.

use serde_json::Value;

/// What is wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LintProblem {
    /// JSON pointer of the offending keyword.
    pub pointer: String,
    /// What is wrong.
    pub reason: String,
}

const TYPES: &[&str] = &[
    "array", "boolean", "integer", "null", "number", "object", "string",
];

/// Checks `schema`; `Ok` when it is structurally a JSON Schema.
pub(crate) fn check(schema: &Value) -> Result<(), LintProblem> {
    if !schema.is_object() {
        return Err(problem("", "a registry schema must be a JSON object"));
    }
    walk(schema, schema, "")
}

fn problem(pointer: &str, reason: impl Into<String>) -> LintProblem {
    LintProblem {
        pointer: if pointer.is_empty() {
            "/".into()
        } else {
            pointer.into()
        },
        reason: reason.into(),
    }
}

fn walk(root: &Value, node: &Value, pointer: &str) -> Result<(), LintProblem> {
    let map = match node {
        Value::Bool(_) => return Ok(()),
        Value::Object(map) => map,
        _ => return Err(problem(pointer, "a schema must be an object or a boolean")),
    };
    for (key, value) in map {
        let here = format!("{pointer}/{key}");
        match key.as_str() {
            "type" => match value {
                Value::String(t) if TYPES.contains(&t.as_str()) => {}
                Value::Array(items)
                    if !items.is_empty()
                        && items
                            .iter()
                            .all(|t| t.as_str().is_some_and(|t| TYPES.contains(&t))) => {}
                _ => {
                    return Err(problem(
                        &here,
                        format!(
                            "`type` must be one of {TYPES:?} or a non-empty array of them, found {value}"
                        ),
                    ));
                }
            },
            "properties" | "$defs" | "definitions" | "patternProperties" => {
                let Value::Object(children) = value else {
                    return Err(problem(
                        &here,
                        format!("`{key}` must be an object of schemas"),
                    ));
                };
                for (name, child) in children {
                    walk(root, child, &format!("{here}/{name}"))?;
                }
            }
            "items"
            | "additionalProperties"
            | "not"
            | "contains"
            | "propertyNames"
            | "unevaluatedProperties"
            | "unevaluatedItems"
            | "if"
            | "then"
            | "else" => {
                walk(root, value, &here)?;
            }
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                let Value::Array(items) = value else {
                    return Err(problem(
                        &here,
                        format!("`{key}` must be an array of schemas"),
                    ));
                };
                if items.is_empty() && key != "prefixItems" {
                    return Err(problem(&here, format!("`{key}` must not be empty")));
                }
                for (index, item) in items.iter().enumerate() {
                    walk(root, item, &format!("{here}/{index}"))?;
                }
            }
            "required" => {
                let ok = value
                    .as_array()
                    .is_some_and(|items| items.iter().all(Value::is_string));
                if !ok {
                    return Err(problem(
                        &here,
                        "`required` must be an array of property names",
                    ));
                }
            }
            "enum" if !value.is_array() => {
                return Err(problem(&here, "`enum` must be an array"));
            }
            "$ref" => {
                let Some(reference) = value.as_str() else {
                    return Err(problem(&here, "`$ref` must be a string"));
                };
                if let Some(local) = reference.strip_prefix('#')
                    && root.pointer(local).is_none()
                {
                    return Err(problem(
                        &here,
                        format!("`$ref` {reference:?} does not resolve inside the file"),
                    ));
                }
            }
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf"
                if !value.is_number() =>
            {
                return Err(problem(&here, format!("`{key}` must be a number")));
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties"
            | "maxProperties"
                if value.as_u64().is_none() =>
            {
                return Err(problem(
                    &here,
                    format!("`{key}` must be a non-negative integer"),
                ));
            }
            "format" | "pattern" | "title" | "description" | "$schema" | "$id" | "$comment"
                if !value.is_string() =>
            {
                return Err(problem(&here, format!("`{key}` must be a string")));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accepts_what_schemars_writes() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"type": ["string", "null"]}},
            "required": ["a"],
            "$defs": {"A": {"oneOf": [{"const": "x", "type": "string"}]}}
        });
        assert_eq!(check(&schema), Ok(()));
    }

    #[test]
    fn names_the_pointer_of_the_problem() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "text"}}});
        let found = check(&schema).unwrap_err();
        assert_eq!(found.pointer, "/properties/a/type");
        let schema = json!({"properties": {"a": {"$ref": "#/$defs/Missing"}}});
        assert_eq!(check(&schema).unwrap_err().pointer, "/properties/a/$ref");
        assert_eq!(check(&json!([1])).unwrap_err().pointer, "/");
        assert_eq!(
            check(&json!({"required": "a"})).unwrap_err().pointer,
            "/required"
        );
    }
}
