//! The CloudEvents Kafka binding (binary content mode): attributes as
//! `ce_`-prefixed headers with UTF-8 values, `datacontenttype` as the
//! `content-type` header; plus an `id` header with the event id, as
//! Debezium's outbox event router writes it.

use outbox_core::ce;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};

/// The prefix of CloudEvents attributes in record headers.
pub const HEADER_PREFIX: &str = "ce_";

/// The header name of a CloudEvents attribute (`ce_id`); `datacontenttype`
/// travels as `content-type`.
pub fn header_name(attribute: &str) -> String {
    if attribute == ce::DATACONTENTTYPE {
        "content-type".to_owned()
    } else {
        format!("{HEADER_PREFIX}{attribute}")
    }
}

/// The headers of one record.
pub(crate) fn write(attributes: Vec<(&'static str, String)>, event_id: &str) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(attributes.len() + 1);
    for (attribute, value) in &attributes {
        headers = headers.insert(Header {
            key: &header_name(attribute),
            value: Some(value.as_bytes()),
        });
    }
    headers.insert(Header {
        key: "id",
        value: Some(event_id.as_bytes()),
    })
}

/// The CloudEvents attributes of a received record, or the reason they
/// cannot be read. rdkafka panics on a header name that is not UTF-8 (any
/// producer can write one); that panic is caught here and the record is
/// quarantined with the reason instead of taking the consumer down.
pub(crate) fn read_checked<M: Message>(message: &M) -> (Vec<(String, String)>, Option<String>) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(message.headers()))) {
        Ok(read) => read,
        Err(_) => (
            Vec::new(),
            Some("a header name of the record is not UTF-8".to_owned()),
        ),
    }
}

/// The CloudEvents attributes of received headers: `ce_` names matched
/// without regard to case and lower-cased, `content-type` as
/// `datacontenttype`, other headers ignored. The first value that is
/// missing or not UTF-8 is returned as the problem.
pub(crate) fn read<H: Headers>(headers: Option<&H>) -> (Vec<(String, String)>, Option<String>) {
    let mut attributes = Vec::new();
    let mut problem = None;
    let Some(headers) = headers else {
        return (attributes, problem);
    };
    for header in headers.iter() {
        let attribute = if header.key.eq_ignore_ascii_case("content-type") {
            ce::DATACONTENTTYPE.to_owned()
        } else {
            match header.key.get(..HEADER_PREFIX.len()) {
                Some(prefix) if prefix.eq_ignore_ascii_case(HEADER_PREFIX) => {
                    header.key[HEADER_PREFIX.len()..].to_ascii_lowercase()
                }
                _ => continue,
            }
        };
        match header.value.map(std::str::from_utf8) {
            Some(Ok(text)) => attributes.push((attribute, text.to_owned())),
            Some(Err(_)) => {
                problem.get_or_insert_with(|| format!("header {} is not UTF-8", header.key));
            }
            None => {
                problem.get_or_insert_with(|| format!("header {} has no value", header.key));
            }
        }
    }
    (attributes, problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_and_bad_values_are_named() {
        let headers = write(
            vec![
                ("id", "e-1".into()),
                ("datacontenttype", "application/json".into()),
                ("subject", "Zoë 100%".into()),
            ],
            "e-1",
        )
        .insert(Header {
            key: "CE_Type",
            value: Some("order.created".as_bytes()),
        });
        let (attributes, problem) = read(Some(&headers));
        assert!(problem.is_none());
        assert!(attributes.contains(&("subject".into(), "Zoë 100%".into())));
        assert!(attributes.contains(&("type".into(), "order.created".into())));
        assert!(attributes.contains(&("datacontenttype".into(), "application/json".into())));
        assert_eq!(attributes.len(), 4, "the `id` header is not an attribute");

        let broken = headers.insert(Header {
            key: "ce_time",
            value: Some(&[0xff_u8, 0xfe][..]),
        });
        assert!(read(Some(&broken)).1.unwrap().contains("ce_time"));
    }
}
