//! Destination templates: where a transport sends an event, written as text
//! with placeholders (`events.{aggregate_type}.{event_type}`,
//! `outbox.event.{aggregate_type}`). Every transport parses its template
//! here and adds its own rules (which characters a subject, topic or routing
//! key may hold, and whether the aggregate id may appear at all).

use crate::envelope::Envelope;
use crate::store::ConfigError;

/// A value a template can put into a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholder {
    /// `{aggregate_type}`: a contract's aggregate type (one lowercase word).
    AggregateType,
    /// `{event_type}`: a contract's event type (lowercase, dot-separated).
    EventType,
    /// `{aggregate_id}`: the aggregate id, any text; each transport encodes it.
    AggregateId,
}

impl Placeholder {
    /// Every placeholder with its spelling in a template.
    pub const ALL: &'static [(&'static str, Placeholder)] = &[
        ("{aggregate_type}", Placeholder::AggregateType),
        ("{event_type}", Placeholder::EventType),
        ("{aggregate_id}", Placeholder::AggregateId),
    ];
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Text copied as it is.
    Literal(String),
    /// A value of the event.
    Value(Placeholder),
}

/// A parsed template. Parsing checks the braces and the placeholder names,
/// that the literal text holds only characters `literal_ok` accepts, and
/// that at least one placeholder is used (a fixed destination is usually a
/// mistake; a transport that wants one takes a plain name instead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationTemplate {
    text: String,
    segments: Vec<Segment>,
}

impl DestinationTemplate {
    /// Parses `text`; `what` names the setting in errors (`Kafka topic
    /// template`).
    pub fn parse(
        what: &'static str,
        text: &str,
        literal_ok: impl Fn(char) -> bool,
    ) -> Result<DestinationTemplate, ConfigError> {
        let bad = |reason: String| ConfigError::InvalidValue {
            what,
            reason: format!("{text:?}: {reason}"),
        };
        let mut segments = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('{') {
                let Some((name, tail)) = after.split_once('}') else {
                    return Err(bad("unclosed `{`".into()));
                };
                let spelled = format!("{{{name}}}");
                let Some((_, placeholder)) = Placeholder::ALL.iter().find(|(p, _)| *p == spelled)
                else {
                    return Err(bad(format!(
                        "unknown placeholder {spelled}; use {{aggregate_type}}, {{event_type}} or {{aggregate_id}}"
                    )));
                };
                segments.push(Segment::Value(*placeholder));
                rest = tail;
            } else {
                let end = rest.find('{').unwrap_or(rest.len());
                let literal = &rest[..end];
                if let Some(bad_char) = literal.chars().find(|c| !literal_ok(*c)) {
                    return Err(bad(format!("character {bad_char:?} is not allowed here")));
                }
                segments.push(Segment::Literal(literal.to_owned()));
                rest = &rest[end..];
            }
        }
        if !segments.iter().any(|s| matches!(s, Segment::Value(_))) {
            return Err(bad(
                "it uses no placeholder, so every event would share one destination".into(),
            ));
        }
        Ok(DestinationTemplate {
            text: text.to_owned(),
            segments,
        })
    }

    /// The template as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Its pieces, in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Whether it uses `placeholder`.
    pub fn uses(&self, placeholder: Placeholder) -> bool {
        self.segments.contains(&Segment::Value(placeholder))
    }

    /// The destination of `envelope`, with the aggregate id written by
    /// `encode_id` (the transport's reversible encoding).
    pub fn render(&self, envelope: &Envelope, encode_id: impl Fn(&str) -> String) -> String {
        self.render_with(
            &envelope.aggregate_type,
            &envelope.event_type,
            &encode_id(&envelope.aggregate_id),
        )
    }

    /// The destination for the given values, each inserted as it is (a
    /// wildcard for a filter, say).
    pub fn render_with(
        &self,
        aggregate_type: &str,
        event_type: &str,
        aggregate_id: &str,
    ) -> String {
        let mut out = String::with_capacity(self.text.len() + 32);
        for segment in &self.segments {
            match segment {
                Segment::Literal(literal) => out.push_str(literal),
                Segment::Value(Placeholder::AggregateType) => out.push_str(aggregate_type),
                Segment::Value(Placeholder::EventType) => out.push_str(event_type),
                Segment::Value(Placeholder::AggregateId) => out.push_str(aggregate_id),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_renders_and_names_mistakes() {
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        let template =
            DestinationTemplate::parse("topic", "outbox.event.{aggregate_type}", ok).unwrap();
        assert!(template.uses(Placeholder::AggregateType));
        assert!(!template.uses(Placeholder::AggregateId));
        assert_eq!(
            template.render_with("order", "x", "y"),
            "outbox.event.order"
        );
        for (text, reason) in [
            ("outbox.{aggregate}", "unknown placeholder"),
            ("outbox.{event_type", "unclosed"),
            ("out box.{event_type}", "not allowed"),
            ("outbox.all", "no placeholder"),
        ] {
            let error = DestinationTemplate::parse("topic", text, ok)
                .unwrap_err()
                .to_string();
            assert!(error.contains(reason), "{text}: {error}");
        }
    }
}
