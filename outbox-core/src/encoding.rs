//! Putting event values where brokers allow only some characters: header
//! values under the CloudEvents percent-encoding rule, and subject or
//! routing-key tokens that must not contain the broker's separators.
//!
//! Both encodings are reversible and deterministic, so a consumer (or an
//! operator building a filter for one aggregate) can compute the same
//! token from the same value. Transports call these; the relay and the
//! consumer loops never see encoded text.

use std::fmt::Write as _;

/// A header value or token could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} cannot be decoded: {reason}")]
pub struct DecodeHeaderError {
    /// What was decoded (`header ce-subject`).
    pub what: String,
    /// The raw text (truncated to 80 characters).
    pub value: String,
    /// Why it was refused.
    pub reason: &'static str,
}

/// Encodes an attribute value for a CloudEvents binary-mode header (NATS
/// and HTTP bindings): space, `"`, `%`, and every character outside
/// printable ASCII (`U+0021..=U+007E`) become `%XY` per UTF-8 byte, with
/// upper-case hex. Everything else is kept, so ordinary values (UUIDs,
/// timestamps, event types) are unchanged.
///
/// ```
/// use outbox_core::encoding::encode_header_value;
/// assert_eq!(encode_header_value("Zoë 100%"), "Zo%C3%AB%20100%25");
/// assert_eq!(encode_header_value("order.created"), "order.created");
/// ```
pub fn encode_header_value(value: &str) -> String {
    let keep = |b: u8| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'%';
    encode_bytes(value, keep)
}

/// Decodes a CloudEvents binary-mode header value: a double-quoted value
/// is unquoted first (backslash escapes, as older producers wrote them),
/// then `%XY` sequences are decoded (either case of hex). Malformed
/// escapes and byte sequences that are not UTF-8 (overlong encodings
/// included) are refused, as the binding requires.
pub fn decode_header_value(name: &str, raw: &str) -> Result<String, DecodeHeaderError> {
    let error = |reason| DecodeHeaderError {
        what: format!("header {name}"),
        value: raw.chars().take(80).collect(),
        reason,
    };
    let unquoted = if raw.len() >= 2 && raw.starts_with('"') && raw.ends_with('"') {
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw[1..raw.len() - 1].chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                out.push(
                    chars
                        .next()
                        .ok_or_else(|| error("a quoted value ends in `\\`"))?,
                );
            } else if c == '"' {
                return Err(error("an unescaped `\"` inside a quoted value"));
            } else {
                out.push(c);
            }
        }
        std::borrow::Cow::Owned(out)
    } else {
        std::borrow::Cow::Borrowed(raw)
    };
    percent_decode(&unquoted).map_err(error)
}

/// Encodes a value as one subject or routing-key token: ASCII letters,
/// digits, `-` and `_` are kept; every other byte of its UTF-8 form
/// (`.`, `*`, `>`, `#`, `%`, whitespace, control and non-ASCII characters)
/// becomes `%XY`. The token never contains a separator or a wildcard, is
/// never empty for a non-empty value, and decodes back with
/// [`decode_token`].
///
/// ```
/// use outbox_core::encoding::{decode_token, encode_token};
/// assert_eq!(encode_token("a.b"), "a%2Eb");
/// assert_eq!(encode_token("Zoë 100%"), "Zo%C3%AB%20100%25");
/// assert_eq!(decode_token("a%2Eb").unwrap(), "a.b");
/// ```
pub fn encode_token(value: &str) -> String {
    encode_bytes(value, |b| {
        b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
    })
}

/// Decodes a token written by [`encode_token`].
pub fn decode_token(token: &str) -> Result<String, DecodeHeaderError> {
    percent_decode(token).map_err(|reason| DecodeHeaderError {
        what: "subject token".into(),
        value: token.chars().take(80).collect(),
        reason,
    })
}

/// A path segment of a URI reference: the unreserved characters of RFC
/// 3986 (letters, digits, `-`, `.`, `_`, `~`) stay, every other byte is
/// `%XY`.
pub fn encode_path_segment(value: &str) -> String {
    encode_bytes(value, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
    })
}

fn encode_bytes(value: &str, keep: impl Fn(u8) -> bool) -> String {
    if value.bytes().all(&keep) {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len() + 8);
    for byte in value.bytes() {
        if keep(byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

fn percent_decode(text: &str) -> Result<String, &'static str> {
    if !text.contains('%') {
        return Ok(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = bytes
                .get(index + 1..index + 3)
                .ok_or("a `%` is not followed by two hex digits")?;
            let high = hex_value(hex[0]).ok_or("a `%` is not followed by two hex digits")?;
            let low = hex_value(hex[1]).ok_or("a `%` is not followed by two hex digits")?;
            out.push(high << 4 | low);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the decoded bytes are not UTF-8")
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The awkward ids of the hardening issue, and a few more.
    const AWKWARD: &[&str] = &[
        "a.b",
        "a b",
        "a%20b",
        "Zoë 100%",
        "*",
        ">",
        "line\nbreak",
        "tab\there",
        "quote\"d",
        "emoji 😀",
        "#",
        "",
    ];

    #[test]
    fn header_values_follow_the_cloudevents_rule_and_round_trip() {
        assert_eq!(
            encode_header_value("Euro € 😀"),
            "Euro%20%E2%82%AC%20%F0%9F%98%80"
        );
        assert_eq!(encode_header_value("a%20b"), "a%2520b");
        assert_eq!(encode_header_value("line\nbreak"), "line%0Abreak");
        for value in AWKWARD.iter().copied().chain([&*"é".repeat(600)]) {
            let encoded = encode_header_value(value);
            assert!(
                encoded
                    .bytes()
                    .all(|b| (0x21..=0x7e).contains(&b) && b != b'"'),
                "{encoded:?}"
            );
            assert_eq!(decode_header_value("ce-x", &encoded).unwrap(), value);
        }
    }

    #[test]
    fn decoding_accepts_lower_case_and_quoted_values_and_refuses_bad_bytes() {
        assert_eq!(decode_header_value("ce-x", "a%2eb").unwrap(), "a.b");
        assert_eq!(decode_header_value("ce-x", "\"a b\"").unwrap(), "a b");
        assert_eq!(
            decode_header_value("ce-x", r#""say \"hi\"""#).unwrap(),
            "say \"hi\""
        );
        for bad in ["%", "%4", "%zz", "%C0%A0", "%FF", "\"a\"b\""] {
            let error = decode_header_value("ce-subject", bad).unwrap_err();
            assert!(error.to_string().contains("ce-subject"), "{error}");
        }
    }

    #[test]
    fn tokens_never_hold_separators_or_wildcards_and_round_trip() {
        for value in AWKWARD.iter().copied().chain([&*"x".repeat(1024)]) {
            let token = encode_token(value);
            assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'%')),
                "{token:?}"
            );
            assert_eq!(decode_token(&token).unwrap(), value);
        }
        assert_eq!(encode_token("order-42_a"), "order-42_a");
        assert_ne!(encode_token("a.b"), encode_token("a%2Eb"));
    }
}
