//! The CloudEvents AMQP binding: attributes as `cloudEvents_`-prefixed
//! application properties (the binding's preferred spelling, which JMS
//! selectors can use; the CloudEvents SDKs write it), written and read
//! back; `cloudEvents:` is read too. `datacontenttype` travels as the
//! message's `content_type` property, not as a header.

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

/// The prefix of CloudEvents attributes in message headers.
pub const HEADER_PREFIX: &str = "cloudEvents_";

/// The binding's other spelling, read as well.
const COLON_PREFIX: &str = "cloudEvents:";

/// The header name of a CloudEvents attribute (`cloudEvents_id`).
pub fn header_name(attribute: &str) -> String {
    format!("{HEADER_PREFIX}{attribute}")
}

/// The headers of one message: each attribute as a long string, but
/// `datacontenttype` (the `content_type` property carries it).
pub(crate) fn write(attributes: Vec<(&'static str, String)>) -> FieldTable {
    let mut table = FieldTable::default();
    for (attribute, value) in attributes {
        if attribute == outbox_core::ce::DATACONTENTTYPE {
            continue;
        }
        table.insert(
            ShortString::from(header_name(attribute)),
            AMQPValue::LongString(LongString::from(value)),
        );
    }
    table
}

/// The CloudEvents attributes of received headers: names matched without
/// regard to case, with either prefix (`cloudEvents_`, `cloudEvents:`),
/// lower-cased and stripped of the prefix. Values must be strings in UTF-8;
/// the first one that is not is returned as the problem, so the message is
/// quarantined with the header named.
pub(crate) fn read(table: Option<&FieldTable>) -> (Vec<(String, String)>, Option<String>) {
    let mut attributes = Vec::new();
    let mut problem = None;
    let Some(table) = table else {
        return (attributes, problem);
    };
    for (name, value) in table.inner() {
        let Some(attribute) = attribute_of(name.as_str()) else {
            continue;
        };
        match text_of(value) {
            Some(text) => attributes.push((attribute, text)),
            None => {
                problem.get_or_insert_with(|| {
                    format!("header {name} is not a UTF-8 string ({value:?})")
                });
            }
        }
    }
    (attributes, problem)
}

/// An attribute value as text: strings as they are, and the other types
/// the CloudEvents AMQP binding allows (booleans, integers, timestamps in
/// milliseconds since the epoch, written as RFC 3339 times) converted.
fn text_of(value: &AMQPValue) -> Option<String> {
    Some(match value {
        AMQPValue::LongString(text) => std::str::from_utf8(text.as_bytes()).ok()?.to_owned(),
        AMQPValue::ShortString(text) => text.as_str().to_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Timestamp(millis) => {
            let millis = i64::try_from(*millis).ok()?;
            chrono::DateTime::from_timestamp_millis(millis)?
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        }
        _ => return None,
    })
}

fn attribute_of(name: &str) -> Option<String> {
    let prefix_len = HEADER_PREFIX.len();
    let prefix = name.get(..prefix_len)?;
    let matches =
        prefix.eq_ignore_ascii_case(HEADER_PREFIX) || prefix.eq_ignore_ascii_case(COLON_PREFIX);
    matches.then(|| name[prefix_len..].to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_and_bad_values_are_named() {
        let mut table = write(vec![("id", "e-1".into()), ("subject", "Zoë 100%".into())]);
        table.insert(
            "CLOUDEVENTS:Type".into(),
            AMQPValue::LongString("order.created".into()),
        );
        table.insert("other".into(), AMQPValue::LongString("x".into()));
        let (attributes, problem) = read(Some(&table));
        assert!(problem.is_none());
        assert!(attributes.contains(&("subject".into(), "Zoë 100%".into())));
        assert!(attributes.contains(&("type".into(), "order.created".into())));
        assert_eq!(attributes.len(), 3);

        table.insert(
            "cloudEvents:time".into(),
            AMQPValue::LongString(LongString::from(vec![0xff, 0xfe])),
        );
        let (_, problem) = read(Some(&table));
        assert!(problem.unwrap().contains("cloudEvents:time"));

        let mut typed = FieldTable::default();
        typed.insert(
            "cloudEvents:time".into(),
            AMQPValue::Timestamp(1_767_225_600_000),
        );
        typed.insert(
            "cloudEvents:aggregateversion".into(),
            AMQPValue::LongLongInt(7),
        );
        let (attributes, problem) = read(Some(&typed));
        assert!(problem.is_none());
        assert!(attributes.contains(&("time".into(), "2026-01-01T00:00:00.000Z".into())));
        assert!(attributes.contains(&("aggregateversion".into(), "7".into())));
    }
}
