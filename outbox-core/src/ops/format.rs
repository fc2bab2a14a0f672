//! How operator tools word what the operations API returns, shared by the
//! `outbox` CLI and the web console so they say the same thing: ages as
//! short durations, times in UTC, long texts cut to one short line,
//! partitions as ranges, and error texts reduced to a fingerprint so that
//! the same failure of many messages shows once, with a count.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::LetterRecord;

/// An age in seconds as a short duration (`42s`, `3m 12s`, `2h 5m`,
/// `3d 4h`); empty for none.
pub fn short_age(seconds: Option<f64>) -> String {
    let Some(seconds) = seconds else {
        return String::new();
    };
    let s = seconds.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A point in time as tables show it: UTC, to the second
/// (`2026-12-06 10:40:00 UTC`).
pub fn utc_time(at: &DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// `text` on one line: line breaks become spaces.
pub fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

/// `line` cut to `max` characters, the last of them `…`; `None` when it
/// fits.
pub fn cut_chars(line: &str, max: usize) -> Option<String> {
    if line.chars().count() <= max {
        return None;
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    Some(cut)
}

/// Partitions as ranges, ascending input: `0-3, 8, 10-12`; empty for none.
pub fn partition_ranges(partitions: &[i32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut iter = partitions.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end = iter.next().unwrap_or(end);
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    parts.join(", ")
}

/// The most characters of an error's shape that count.
const SHAPE_CHARS: usize = 240;

/// An error text with what differs between occurrences of the same failure
/// replaced by placeholders: quoted values (`'…'`, `"…"`, opening after a
/// non-word character) become `'?'`, whole numbers `<n>`, and other words
/// that hold a digit (ids such as `c17`, `order-0042`, a UUID, a hex
/// digest, a decimal such as `1.5`) `<id>`;
/// whitespace is collapsed and the text cut at 240 characters.
///
/// `handler failed: invalid input for "4000…": row 17 of order-81` and the
/// same message for another value, row and order have one shape.
pub fn error_shape(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len().min(SHAPE_CHARS));
    let mut i = 0;
    while i < chars.len() && out.chars().count() < SHAPE_CHARS {
        let c = chars[i];
        let after_word = i > 0 && is_token(chars[i - 1]);
        if (c == '\'' || c == '"')
            && !after_word
            && let Some(end) = chars[i + 1..].iter().position(|&q| q == c)
        {
            out.push_str("'?'");
            i += end + 2;
            continue;
        }
        if is_token(c) {
            let len = chars[i..].iter().take_while(|c| is_token(**c)).count();
            let mut token = &chars[i..i + len];
            // A sentence's full stop or a dash after a word is not part of it.
            while let Some((last, rest)) = token.split_last() {
                if *last == '.' || *last == '-' {
                    token = rest;
                } else {
                    break;
                }
            }
            let word: String = token.iter().collect();
            if token.iter().all(char::is_ascii_digit) && !token.is_empty() {
                out.push_str("<n>");
            } else if token.iter().any(char::is_ascii_digit) {
                out.push_str("<id>");
            } else {
                out.push_str(&word);
            }
            out.extend(&chars[i + token.len()..i + len]);
            i += len;
            continue;
        }
        if c.is_whitespace() {
            if !out.ends_with(' ') {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
        i += 1;
    }
    out.trim().to_owned()
}

/// A character of a word, an id or a number (`order-0042`, `1.5`).
fn is_token(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// The fingerprint of an error text: the first 12 hex digits of the
/// SHA-256 of its [`error_shape`]. Errors with one shape share it.
pub fn error_fingerprint(text: &str) -> String {
    let digest = Sha256::digest(error_shape(text).as_bytes());
    hex::encode(&digest[..6])
}

/// The most letters a grouping reads (the oldest first), in the CLI and
/// the console: enough to see the shape of an incident; both say when
/// there were more.
pub const GROUP_SCAN: usize = 5_000;

/// How many example letter ids an [`ErrorGroup`] keeps.
pub const GROUP_EXAMPLES: usize = 5;

/// Letters that failed the same way: one [`error_fingerprint`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorGroup {
    /// The fingerprint of the letters' reasons.
    pub fingerprint: String,
    /// The reasons' shape (what the fingerprint hashes).
    pub shape: String,
    /// How many letters.
    pub count: usize,
    /// The oldest letter's time.
    pub first_seen: DateTime<Utc>,
    /// The newest letter's time.
    pub last_seen: DateTime<Utc>,
    /// The event types and schema versions among them (`order.created v2`;
    /// `unreadable` for a message that could not be read), sorted.
    pub event_types: Vec<String>,
    /// The oldest letters' ids, up to [`GROUP_EXAMPLES`].
    pub examples: Vec<i64>,
}

/// `letters` grouped by the fingerprint of their reasons, the largest
/// group first (ties: the one seen first).
pub fn group_by_error(letters: &[LetterRecord]) -> Vec<ErrorGroup> {
    let mut groups: Vec<ErrorGroup> = Vec::new();
    for letter in letters {
        let fingerprint = error_fingerprint(&letter.reason);
        let event_type = match (&letter.event_type, letter.schema_version) {
            (Some(t), Some(v)) => format!("{t} v{v}"),
            (Some(t), None) => t.clone(),
            _ => "unreadable".to_owned(),
        };
        match groups.iter_mut().find(|g| g.fingerprint == fingerprint) {
            Some(group) => {
                group.count += 1;
                group.first_seen = group.first_seen.min(letter.created_at);
                group.last_seen = group.last_seen.max(letter.created_at);
                if !group.event_types.contains(&event_type) {
                    group.event_types.push(event_type);
                }
                if group.examples.len() < GROUP_EXAMPLES {
                    group.examples.push(letter.id);
                }
            }
            None => groups.push(ErrorGroup {
                fingerprint,
                shape: error_shape(&letter.reason),
                count: 1,
                first_seen: letter.created_at,
                last_seen: letter.created_at,
                event_types: vec![event_type],
                examples: vec![letter.id],
            }),
        }
    }
    for group in &mut groups {
        group.event_types.sort();
    }
    groups.sort_by(|a, b| b.count.cmp(&a.count).then(a.first_seen.cmp(&b.first_seen)));
    groups
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn ages_are_short() {
        assert_eq!(short_age(None), "");
        assert_eq!(short_age(Some(42.7)), "42s");
        assert_eq!(short_age(Some(192.0)), "3m 12s");
        assert_eq!(short_age(Some(7_500.0)), "2h 5m");
        assert_eq!(short_age(Some(273_600.0)), "3d 4h");
    }

    #[test]
    fn long_texts_are_one_cut_line_and_times_utc() {
        assert_eq!(one_line("a\nb\r\nc"), "a b  c");
        assert_eq!(cut_chars("short", 5), None);
        assert_eq!(cut_chars("é longer", 4).as_deref(), Some("é l…"));
        use chrono::TimeZone;
        let at = Utc.with_ymd_and_hms(2026, 12, 6, 10, 40, 5).unwrap();
        assert_eq!(utc_time(&at), "2026-12-06 10:40:05 UTC");
    }

    /// A dead letter of `billing` with `reason`, written at 05:`minute` on
    /// 2026-12-06 (also the letters of the scan's tests).
    pub(crate) fn letter(id: i64, reason: &str, minute: u32) -> LetterRecord {
        use chrono::TimeZone;
        LetterRecord {
            id,
            consumer: "billing".into(),
            kind: "dead_lettered".into(),
            event_id: None,
            event_type: Some("counter.ticked".into()),
            schema_version: Some(1),
            aggregate_type: None,
            aggregate_id: None,
            aggregate_version: None,
            headers: serde_json::Value::Null,
            payload: serde_json::Value::Null,
            reason: reason.into(),
            attempts: 1,
            created_at: Utc.with_ymd_and_hms(2026, 12, 6, 5, minute, 0).unwrap(),
            resolved_at: None,
            resolution: None,
            replays: 0,
            last_replay_error: None,
            replay_requested_at: None,
        }
    }

    #[test]
    fn letters_group_by_failure_largest_first() {
        let letters = [
            letter(1, "timeout after 30 s", 1),
            letter(2, "downstream refuses counter c1", 2),
            letter(3, "downstream refuses counter c2", 3),
            letter(4, "downstream refuses counter c3", 4),
        ];
        let groups = group_by_error(&letters);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].count, 3);
        assert_eq!(groups[0].examples, vec![2, 3, 4]);
        assert_eq!(groups[0].shape, "downstream refuses counter <id>");
        assert_eq!(groups[0].first_seen.format("%M").to_string(), "02");
        assert_eq!(groups[0].last_seen.format("%M").to_string(), "04");
        assert_eq!(groups[0].event_types, vec!["counter.ticked v1"]);
        assert_eq!(groups[1].examples, vec![1]);
    }

    #[test]
    fn partitions_as_ranges() {
        assert_eq!(
            partition_ranges(&[0, 1, 2, 3, 8, 10, 11, 12]),
            "0-3, 8, 10-12"
        );
        assert_eq!(partition_ranges(&[]), "");
    }

    #[test]
    fn occurrences_of_one_failure_share_a_shape() {
        let a = error_shape(
            "handler failed: invalid input syntax for type uuid: \"abc\" (row 17, event 0193b6f0-1c2d-7e3f-8a9b-0c1d2e3f4a5b)",
        );
        let b = error_shape(
            "handler failed:  invalid input syntax for type uuid: \"[REDACTED]\" (row 4, event 0193b6f0-1c2d-7e3f-8a9b-0c1d2e3f4a5c)",
        );
        assert_eq!(a, b);
        assert_eq!(
            a,
            "handler failed: invalid input syntax for type uuid: '?' (row <n>, event <id>)"
        );
        assert_eq!(
            error_fingerprint("downstream refuses counter c1."),
            error_fingerprint("downstream refuses counter c27.")
        );
        assert_eq!(
            error_shape("order order-0042 timed out after 1.5 s."),
            "order <id> timed out after <id> s."
        );
    }

    #[test]
    fn different_failures_differ_and_plain_words_stay() {
        assert_ne!(
            error_fingerprint("connection refused"),
            error_fingerprint("permission denied")
        );
        assert_eq!(
            error_shape("card.charged is unknown"),
            "card.charged is unknown"
        );
        assert_eq!(error_shape("it's 'unclosed"), "it's 'unclosed");
        assert_eq!(error_shape("a - b"), "a - b");
        assert_eq!(error_fingerprint("x").len(), 12);
    }
}
