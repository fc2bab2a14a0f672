//! The AsyncAPI 3.0 document of the registry, matching what the NATS
//! transport puts on the wire: one channel per event type addressed with
//! the registry's subject template (`settings.subject_template`, the
//! transport's default `events.{aggregate_type}.{event_type}` otherwise;
//! an `{aggregate_id}` in it becomes a channel parameter), one message per
//! version with its payload schema file and every header the transport
//! writes (`ce-*` per the CloudEvents NATS binding, percent-encoded, and
//! `Nats-Msg-Id`), the servers of `settings.servers`, and one `send`
//! operation per channel. Browse it with any AsyncAPI tool.

use serde_json::{Map, Value, json};

use outbox_core::encoding::encode_header_value;

use crate::model::{RegistryModel, schema_path};

/// One piece of a subject template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TemplatePart {
    Literal(String),
    AggregateType,
    EventType,
    AggregateId,
}

/// Parses a subject template the way the NATS transport does: known
/// placeholders, at least one of them, a literal prefix ending in `.`.
pub(crate) fn parse_template(template: &str) -> Result<Vec<TemplatePart>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('{') {
            let (name, tail) = after
                .split_once('}')
                .ok_or_else(|| "unclosed `{`".to_owned())?;
            parts.push(match name {
                "aggregate_type" => TemplatePart::AggregateType,
                "event_type" => TemplatePart::EventType,
                "aggregate_id" => TemplatePart::AggregateId,
                other => {
                    return Err(format!(
                        "unknown placeholder {{{other}}}; use {{aggregate_type}}, {{event_type}} or {{aggregate_id}}"
                    ));
                }
            });
            rest = tail;
        } else {
            let end = rest.find('{').unwrap_or(rest.len());
            let literal = &rest[..end];
            if let Some(bad) = literal
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
            {
                return Err(format!("character {bad:?} is not allowed in a subject"));
            }
            parts.push(TemplatePart::Literal(literal.to_owned()));
            rest = &rest[end..];
        }
    }
    match parts.first() {
        Some(TemplatePart::Literal(prefix)) if prefix.ends_with('.') && prefix.len() > 1 => {}
        _ => return Err("it must start with a fixed prefix ending in `.`".to_owned()),
    }
    if !parts.iter().any(|p| !matches!(p, TemplatePart::Literal(_))) {
        return Err("it uses no placeholder".to_owned());
    }
    Ok(parts)
}

/// The default subject of an event type, as the relay publishes it.
pub fn default_address(aggregate_type: &str, event_type: &str) -> String {
    format!("events.{aggregate_type}.{event_type}")
}

/// The channel address of an event type under a template, with
/// `{aggregate_id}` left as an AsyncAPI parameter.
pub(crate) fn address(template: &str, aggregate_type: &str, event_type: &str) -> String {
    let Ok(parts) = parse_template(template) else {
        return default_address(aggregate_type, event_type);
    };
    parts
        .iter()
        .map(|part| match part {
            TemplatePart::Literal(literal) => literal.as_str(),
            TemplatePart::AggregateType => aggregate_type,
            TemplatePart::EventType => event_type,
            TemplatePart::AggregateId => "{aggregate_id}",
        })
        .collect()
}

/// Builds the document.
pub(crate) fn document(model: &RegistryModel) -> Value {
    let settings = &model.settings;
    let template = settings.subject_template();
    let with_id = parse_template(template)
        .map(|parts| parts.contains(&TemplatePart::AggregateId))
        .unwrap_or(false);
    let mut channels = Map::new();
    let mut operations = Map::new();
    let mut messages = Map::new();
    for (event_type, entry) in &model.event_types {
        let mut channel_messages = Map::new();
        for (version, version_entry) in &entry.versions {
            let message_id = format!("{event_type}.v{version}");
            let mut message = json!({
                "name": event_type,
                "title": format!("{event_type} v{version}"),
                "contentType": "application/json",
                "headers": {
                    "allOf": [
                        {"$ref": "#/components/schemas/CloudEventsHeaders"},
                        {
                            "type": "object",
                            "properties": {
                                "ce-type": {"const": event_type},
                                "ce-schemaversion": {"const": version.to_string()},
                                "ce-aggregatetype": {"const": entry.aggregate_type},
                                "ce-dataschema": {"const": encode_header_value(&settings.schema_id(event_type, *version))},
                            }
                        }
                    ]
                },
                "payload": {
                    "schemaFormat": "application/schema+json;version=draft-2020-12",
                    "schema": {"$ref": format!("./{}", schema_path(event_type, *version))}
                },
                "x-outbox-schema-version": version,
                "x-outbox-aggregate-type": entry.aggregate_type,
            });
            if !version_entry.redacted_fields.is_empty() {
                message["x-outbox-redacted-fields"] = json!(version_entry.redacted_fields);
            }
            messages.insert(message_id.clone(), message);
            channel_messages.insert(
                message_id.clone(),
                json!({"$ref": format!("#/components/messages/{message_id}")}),
            );
        }
        let mut channel = json!({
            "address": address(template, &entry.aggregate_type, event_type),
            "messages": channel_messages,
        });
        if with_id {
            channel["parameters"] = json!({
                "aggregate_id": {
                    "description": "The aggregate id as one subject token: ASCII letters, digits, `-` and `_` as they are, every other UTF-8 byte as %XY (outbox_core::encoding::encode_token)."
                }
            });
        }
        if !settings.servers.is_empty() {
            channel["servers"] = Value::Array(
                settings
                    .servers
                    .keys()
                    .map(|name| json!({"$ref": format!("#/servers/{name}")}))
                    .collect(),
            );
        }
        channels.insert(event_type.clone(), channel);
        operations.insert(
            format!("publish.{event_type}"),
            json!({
                "action": "send",
                "channel": {"$ref": format!("#/channels/{event_type}")},
            }),
        );
    }
    let mut document = json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": "outbox event catalogue",
            "version": "1.0.0",
            "description": "Generated by outbox-codegen from the event contracts; do not edit by hand."
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": messages,
            "schemas": {
                "CloudEventsHeaders": cloudevents_headers(settings.message_id_header.unwrap_or(true))
            }
        }
    });
    if !settings.servers.is_empty() {
        let servers: Map<String, Value> = settings
            .servers
            .iter()
            .map(|(name, server)| {
                let mut value = json!({"host": server.host, "protocol": server.protocol});
                if let Some(description) = &server.description {
                    value["description"] = json!(description);
                }
                (name.clone(), value)
            })
            .collect();
        document["servers"] = Value::Object(servers);
    }
    document
}

/// Every header the NATS transport writes, as printable ASCII per the
/// CloudEvents NATS binding (values percent-encoded).
fn cloudevents_headers(message_id_header: bool) -> Value {
    let printable = json!({"type": "string", "pattern": "^[\\x21-\\x7e]*$"});
    let mut properties = Map::new();
    for name in [
        "ce-id",
        "ce-source",
        "ce-type",
        "ce-subject",
        "ce-dataschema",
        "ce-schemaversion",
        "ce-aggregatetype",
        "ce-aggregateid",
        "ce-aggregateversion",
        "ce-traceparent",
    ] {
        properties.insert(name.to_owned(), printable.clone());
    }
    properties.insert("ce-specversion".into(), json!({"const": "1.0"}));
    properties.insert(
        "ce-datacontenttype".into(),
        json!({"const": "application/json"}),
    );
    properties.insert(
        "ce-time".into(),
        json!({"type": "string", "format": "date-time"}),
    );
    let mut required: Vec<&str> = vec![
        "ce-specversion",
        "ce-id",
        "ce-source",
        "ce-type",
        "ce-subject",
        "ce-time",
        "ce-datacontenttype",
        "ce-dataschema",
        "ce-schemaversion",
        "ce-aggregatetype",
        "ce-aggregateid",
        "ce-aggregateversion",
    ];
    if message_id_header {
        properties.insert(
            "Nats-Msg-Id".into(),
            json!({"type": "string", "format": "uuid"}),
        );
        required.push("Nats-Msg-Id");
    }
    json!({
        "type": "object",
        "description": "CloudEvents NATS binding, binary content mode: every attribute as a `ce-` header, values percent-encoded (space, `\"`, `%` and everything outside printable ASCII); `Nats-Msg-Id` is the event id for JetStream's duplicate window.",
        "properties": properties,
        "required": required
    })
}
