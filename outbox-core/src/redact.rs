//! Masking of fields marked `#[outbox(redact)]`.
//!
//! The derive records the serialized keys of redacted fields; this file masks
//! them in a JSON payload. Every place that shows or logs a payload (errors,
//! quarantine listings, operator tools, `Debug` output) goes through here,
//! and error messages that could quote a value (serde's "invalid type:
//! string \"...\"") are scrubbed of quoted values first.

use serde_json::Value;

use crate::registry::ContractRegistry;

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

/// A payload as it may be shown: the fields the contract of (`event_type`,
/// `schema_version`) marks redacted are masked; for an event type or
/// version this binary has no contract for, every value is masked (nothing
/// says which fields are safe); text that is not JSON is not shown at all.
pub fn redacted_payload(event_type: &str, schema_version: u32, payload: &str) -> Value {
    let Ok(mut value) = serde_json::from_str::<Value>(payload) else {
        return Value::String(format!("[{} bytes, not JSON]", payload.len()));
    };
    let contract = ContractRegistry::global()
        .ok()
        .and_then(|registry| registry.get(event_type, schema_version));
    match contract {
        Some(contract) => mask_fields(&mut value, contract.redacted_fields),
        None => mask_all(&mut value),
    }
    value
}

/// Masks every value of an object (or the whole value when it is not one).
pub fn mask_all(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for field in map.values_mut() {
                *field = Value::String(REDACTED.to_owned());
            }
        }
        other => *other = Value::String(REDACTED.to_owned()),
    }
}

/// An error message with the values it quotes taken out, so that an error
/// about a redacted field cannot carry its secret into a log, a stored
/// reason or an operator's screen.
///
/// serde and most `Deserialize` impls quote the offending input in `"…"`,
/// `` `…` `` or `'…'` ("invalid type: string \"alice@…\", expected u64").
/// Every quoted span is replaced by `…`, except the ones that name the
/// schema rather than the input: a span right after the word `field`
/// (`missing field `email``) and the spans of an `expected …` clause, until
/// a `found` or `got` clause starts.
///
/// ```
/// use outbox_core::scrub_message;
/// assert_eq!(
///     scrub_message("invalid type: string \"4111-1111\", expected u64 at line 1 column 20"),
///     "invalid type: string \"…\", expected u64 at line 1 column 20"
/// );
/// assert_eq!(scrub_message("missing field `email`"), "missing field `email`");
/// ```
pub fn scrub_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(['"', '`', '\'']) {
        let (before, from_quote) = rest.split_at(start);
        out.push_str(before);
        let lower = out.to_ascii_lowercase();
        let keep = in_expected_clause(&lower);
        let quote = from_quote.chars().next().unwrap_or('"');
        let inner = &from_quote[quote.len_utf8()..];
        let Some(end) = inner.find(quote) else {
            // An unterminated quote: hide everything after it.
            out.push(quote);
            out.push('…');
            return out;
        };
        let quoted = &inner[..end];
        let names_the_schema =
            keep || lower.trim_end().ends_with("field") || lower.trim_end().ends_with("fields");
        out.push(quote);
        if names_the_schema {
            out.push_str(quoted);
        } else {
            out.push('…');
        }
        out.push(quote);
        rest = &inner[end + quote.len_utf8()..];
    }
    out.push_str(rest);
    out
}

/// The values a payload holds under the fields a contract marks redacted,
/// as text (strings as they are, numbers as written): what must never
/// appear in a message about that payload. `fields` is `None` when no
/// contract says which fields are safe: then every value counts.
pub fn secret_values(payload: &Value, fields: Option<&[&str]>) -> Vec<String> {
    let mut secrets = Vec::new();
    match (fields, payload) {
        (Some(fields), Value::Object(map)) => {
            for field in fields {
                if let Some(value) = map.get(*field) {
                    leaf_texts(value, &mut secrets);
                }
            }
        }
        (Some(_), _) => {}
        (None, value) => leaf_texts(value, &mut secrets),
    }
    secrets.sort_unstable_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
    secrets
}

fn leaf_texts(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(text) if !text.is_empty() => out.push(text.clone()),
        Value::Number(number) => out.push(number.to_string()),
        Value::Array(items) => items.iter().for_each(|item| leaf_texts(item, out)),
        Value::Object(map) => map.values().for_each(|item| leaf_texts(item, out)),
        _ => {}
    }
}

/// A handler's error message as the framework may show and store it, for
/// a payload whose redacted values are `secrets` (see [`secret_values`]):
/// every occurrence of a secret that stands on its own (not inside a
/// longer word or number) becomes [`REDACTED`], and then every quoted span
/// is scrubbed as [`scrub_message`] does (a value the handler transformed
/// before passing it on, which no secret matches, is usually quoted by
/// whoever complains about it). Without secrets the message is returned
/// unchanged: nothing in the payload is marked sensitive.
///
/// ```
/// use outbox_core::scrub_with_secrets;
/// let secrets = vec!["4111999988887777".to_owned()];
/// assert_eq!(
///     scrub_with_secrets(
///         "invalid input syntax for type uuid: \"4111999988887777\"",
///         &secrets
///     ),
///     "invalid input syntax for type uuid: \"…\""
/// );
/// assert_eq!(
///     scrub_with_secrets("card 4111999988887777 declined", &secrets),
///     "card [REDACTED] declined"
/// );
/// assert_eq!(scrub_with_secrets("relation \"x\" does not exist", &[]), "relation \"x\" does not exist");
/// ```
pub fn scrub_with_secrets(message: &str, secrets: &[String]) -> String {
    if secrets.is_empty() {
        return message.to_owned();
    }
    let mut text = message.to_owned();
    for secret in secrets {
        text = replace_standalone(&text, secret, REDACTED);
    }
    scrub_message(&text)
}

/// `text` with every control character but newline and tab written as
/// its escape (`\u{0}` for NUL): reasons and errors a consumer stores,
/// logs and shows operators quote external text, and must be text every
/// store keeps (PostgreSQL's `text` refuses NUL) and a terminal prints as
/// written.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let unprintable = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unprintable) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unprintable(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Replaces the occurrences of `needle` in `text`, ignoring ASCII case,
/// whose neighbours are not letters or digits.
fn replace_standalone(text: &str, needle: &str, with: &str) -> String {
    if needle.is_empty() {
        return text.to_owned();
    }
    // ASCII lower-casing keeps every byte offset.
    let (haystack, needle) = (text.to_ascii_lowercase(), needle.to_ascii_lowercase());
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    while let Some(found) = haystack[from..].find(&needle) {
        let (at, end) = (from + found, from + found + needle.len());
        let before = text[..at].chars().next_back();
        let after = text[end..].chars().next();
        out.push_str(&text[from..at]);
        if word(before) || word(after) {
            out.push_str(&text[at..end]);
        } else {
            out.push_str(with);
        }
        from = end;
    }
    out.push_str(&text[from..]);
    out
}

/// Whether a quoted span after `before` belongs to an `expected` clause:
/// the latest of "expected" and the markers of input text wins.
fn in_expected_clause(before: &str) -> bool {
    let expected = before.rfind("expected");
    let input = ["found", "got", "invalid", "unknown variant", "value:"]
        .iter()
        .filter_map(|marker| before.rfind(marker))
        .max();
    match (expected, input) {
        (Some(e), Some(i)) => e > i,
        (Some(_), None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn printable_text_escapes_control_characters_but_newline_and_tab() {
        assert_eq!(printable("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            printable("found `\0` at 1; bell \u{7}, escape \u{1b}[31m"),
            "found `\\u{0}` at 1; bell \\u{7}, escape \\u{1b}[31m"
        );
        assert!(matches!(printable("ok"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn scrubbing_takes_out_quoted_input_and_keeps_schema_names() {
        for (message, expected) in [
            (
                "invalid type: string \"alice@example.org\", expected u64 at line 1 column 30",
                "invalid type: string \"…\", expected u64 at line 1 column 30",
            ),
            (
                "invalid value: integer `4111`, expected a card",
                "invalid value: integer `…`, expected a card",
            ),
            (
                "unknown variant `secret`, expected one of `Card`, `Cash`",
                "unknown variant `…`, expected one of `Card`, `Cash`",
            ),
            (
                "invalid character: expected an optional prefix of `urn:uuid:` followed by [0-9a-fA-F-], found `z` at 1",
                "invalid character: expected an optional prefix of `urn:uuid:` followed by [0-9a-fA-F-], found `…` at 1",
            ),
            ("missing field `email`", "missing field `email`"),
            (
                "unknown field `emial`, expected one of `email`, `name`",
                "unknown field `emial`, expected one of `email`, `name`",
            ),
            (
                "invalid type: char 'x', expected u8",
                "invalid type: char '…', expected u8",
            ),
            ("a quote \" that never ends secret", "a quote \"…"),
            ("no quotes at all", "no quotes at all"),
        ] {
            assert_eq!(scrub_message(message), expected, "{message}");
        }
    }

    #[test]
    fn secrets_are_masked_where_they_stand_alone_and_quoted_spans_scrubbed() {
        let payload = json!({"card": 4111, "email": "a@b.c", "tags": ["x1", {"k": 12}], "id": 7});
        let secrets = secret_values(&payload, Some(&["card", "email", "tags", "absent"]));
        assert_eq!(secrets, vec!["a@b.c", "4111", "12", "x1"]);
        assert_eq!(
            scrub_with_secrets("card 4111 or 41112 for a@b.c, line 12", &secrets),
            "card [REDACTED] or 41112 for [REDACTED], line [REDACTED]"
        );
        assert_eq!(
            scrub_with_secrets("duplicate key (email)=(A@B.C) in \"users\"", &secrets),
            "duplicate key (email)=([REDACTED]) in \"…\"",
            "case does not hide a secret"
        );
        // No contract: every value is a secret.
        assert_eq!(secret_values(&json!({"id": 7}), None), vec!["7"]);
        assert_eq!(scrub_with_secrets("as is \"q\"", &[]), "as is \"q\"");
    }

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
