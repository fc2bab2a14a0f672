//! Canonical JSON text for committed registry files: object keys sorted at
//! every level (independently of serde_json's `preserve_order` feature, which
//! any crate in a build can switch on), `required` lists sorted (they are
//! sets), two-space indentation, `\n` line ends, one newline at the end. The
//! same value gives the same bytes on every run and platform.

use serde_json::Value;

/// Renders `value` canonically.
pub fn to_canonical_string(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, &normalize(value), 0);
    out.push('\n');
    out
}

/// The value with `required` arrays sorted; what canonical text encodes.
pub(crate) fn normalize(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut normalized = serde_json::Map::new();
            for (key, child) in map {
                let child = if key == "required" {
                    sorted_strings(child)
                } else {
                    normalize(child)
                };
                normalized.insert(key.clone(), child);
            }
            Value::Object(normalized)
        }
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

fn sorted_strings(value: &Value) -> Value {
    match value {
        Value::Array(items) if items.iter().all(Value::is_string) => {
            let mut items = items.clone();
            items.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
            Value::Array(items)
        }
        other => normalize(other),
    }
}

fn write_value(out: &mut String, value: &Value, depth: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (index, key) in keys.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                newline(out, depth + 1);
                out.push_str(&Value::String((*key).clone()).to_string());
                out.push_str(": ");
                write_value(out, &map[*key], depth + 1);
            }
            newline(out, depth);
            out.push('}');
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                newline(out, depth + 1);
                write_value(out, item, depth + 1);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(_) => out.push_str("{}"),
        Value::Array(_) => out.push_str("[]"),
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn newline(out: &mut String, depth: usize) {
    out.push('\n');
    for _ in 0..depth {
        out.push_str("  ");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_and_required_and_ends_with_a_newline() {
        let value =
            json!({"b": 1, "a": {"z": [], "y": {}}, "required": ["x", "a"], "list": [3, 1]});
        assert_eq!(
            to_canonical_string(&value),
            "{\n  \"a\": {\n    \"y\": {},\n    \"z\": []\n  },\n  \"b\": 1,\n  \"list\": [\n    3,\n    1\n  ],\n  \"required\": [\n    \"a\",\n    \"x\"\n  ]\n}\n"
        );
    }

    #[test]
    fn escapes_strings_like_json() {
        assert_eq!(to_canonical_string(&json!("a\"b\n")), "\"a\\\"b\\n\"\n");
    }
}
