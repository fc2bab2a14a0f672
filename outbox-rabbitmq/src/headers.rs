//! The CloudEvents AMQP binding: attributes as `cloudEvents:`-prefixed
//! application properties, written and read back.

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

/// The prefix of CloudEvents attributes in message headers.
pub const HEADER_PREFIX: &str = "cloudEvents:";

/// The header name of a CloudEvents attribute (`cloudEvents:id`).
pub fn header_name(attribute: &str) -> String {
    format!("{HEADER_PREFIX}{attribute}")
}

/// The headers of one message: each attribute as a long string.
pub(crate) fn write(attributes: Vec<(&'static str, String)>) -> FieldTable {
    let mut table = FieldTable::default();
    for (attribute, value) in attributes {
        table.insert(
            ShortString::from(header_name(attribute)),
            AMQPValue::LongString(LongString::from(value)),
        );
    }
    table
}

/// The CloudEvents attributes of received headers: names matched without
/// regard to case (also the `cloudEvents_` spelling some JMS bridges use),
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
        let text = match value {
            AMQPValue::LongString(text) => std::str::from_utf8(text.as_bytes()).ok(),
            AMQPValue::ShortString(text) => Some(text.as_str()),
            _ => None,
        };
        match text {
            Some(text) => attributes.push((attribute, text.to_owned())),
            None => {
                problem.get_or_insert_with(|| {
                    format!("header {name} is not a UTF-8 string ({value:?})")
                });
            }
        }
    }
    (attributes, problem)
}

fn attribute_of(name: &str) -> Option<String> {
    let prefix_len = HEADER_PREFIX.len();
    let prefix = name.get(..prefix_len)?;
    let matches =
        prefix.eq_ignore_ascii_case(HEADER_PREFIX) || prefix.eq_ignore_ascii_case("cloudEvents_");
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
    }
}
