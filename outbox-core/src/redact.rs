//! Masking of fields marked `#[outbox(redact)]`.
//!
//! The derive records the serialized keys of redacted fields; this file masks
//! them in a JSON payload. Every place that shows or logs a payload (errors,
//! quarantine listings, operator tools) goes through here.

use serde_json::Value;

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Replaces the value of every top-level key in `fields` with [`REDACTED`].
/// Keys that are absent (skipped by serde) stay absent.
pub fn mask_fields(payload: &mut Value, fields: &[&str]) {
    if fields.is_empty() {
        return;
    }
    if let Value::Object(map) = payload {
        for field in fields {
            if let Some(value) = map.get_mut(*field) {
                *value = Value::String(REDACTED.to_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masks_present_keys_and_leaves_the_rest() {
        let mut payload = json!({"email": "a@b.c", "card": {"n": 1}, "id": 7});
        mask_fields(&mut payload, &["email", "card", "absent"]);
        assert_eq!(
            payload,
            json!({"email": REDACTED, "card": REDACTED, "id": 7})
        );
    }

    #[test]
    fn leaves_non_objects_alone() {
        let mut payload = json!([1, 2]);
        mask_fields(&mut payload, &["email"]);
        assert_eq!(payload, json!([1, 2]));
    }
}
