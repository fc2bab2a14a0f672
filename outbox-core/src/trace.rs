//! W3C trace context (`traceparent`) carried from the command through the
//! relay to the consumer handler.
//!
//! Where the context comes from, in order: an explicit value passed to emit,
//! the scope set by [`scope`] (the consumer sets it around every handler, so
//! events emitted by a handler continue the incoming trace), then, with the
//! `opentelemetry` feature, the current `tracing` span's OpenTelemetry
//! context. This file parses, formats and scopes the value; it does not
//! export spans.

use std::fmt;
use std::future::Future;
use std::str::FromStr;

/// A parsed W3C `traceparent` (version 00).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// 16-byte trace id; never all zero.
    pub trace_id: [u8; 16],
    /// 8-byte parent span id; never all zero.
    pub span_id: [u8; 8],
    /// Trace flags (bit 0: sampled).
    pub flags: u8,
}

/// A `traceparent` string that is not valid W3C trace context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid traceparent {value:?}: {reason}")]
pub struct TraceParentError {
    /// The rejected value (truncated to 64 characters).
    pub value: String,
    /// Why it was rejected.
    pub reason: &'static str,
}

impl TraceParent {
    /// The trace id as 32 lowercase hex characters.
    pub fn trace_id_hex(&self) -> String {
        hex_lower(&self.trace_id)
    }

    /// A child context: same trace, a new random span id.
    pub fn child(&self) -> TraceParent {
        let mut span_id = [0u8; 8];
        let random = uuid::Uuid::new_v4();
        span_id.copy_from_slice(&random.as_bytes()[..8]);
        if span_id == [0; 8] {
            span_id[7] = 1;
        }
        TraceParent {
            trace_id: self.trace_id,
            span_id,
            flags: self.flags,
        }
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex_lower(&self.trace_id),
            hex_lower(&self.span_id),
            self.flags
        )
    }
}

impl FromStr for TraceParent {
    type Err = TraceParentError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let error = |reason| TraceParentError {
            value: value.chars().take(64).collect(),
            reason,
        };
        let parts: Vec<&str> = value.trim().split('-').collect();
        if parts.len() < 4 {
            return Err(error("expected version-traceid-spanid-flags"));
        }
        if parts[0].len() != 2 || parts[0] == "ff" {
            return Err(error("unsupported version"));
        }
        if parts[0] == "00" && parts.len() != 4 {
            return Err(error("version 00 has exactly four fields"));
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        let mut flags = [0u8; 1];
        decode_hex(parts[1], &mut trace_id)
            .ok_or_else(|| error("trace id is not 32 lowercase hex characters"))?;
        decode_hex(parts[2], &mut span_id)
            .ok_or_else(|| error("span id is not 16 lowercase hex characters"))?;
        decode_hex(parts[3], &mut flags)
            .ok_or_else(|| error("flags are not 2 lowercase hex characters"))?;
        if trace_id == [0; 16] {
            return Err(error("trace id is all zero"));
        }
        if span_id == [0; 8] {
            return Err(error("span id is all zero"));
        }
        Ok(TraceParent {
            trace_id,
            span_id,
            flags: flags[0],
        })
    }
}

fn hex_lower(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[(byte >> 4) as usize] as char);
        out.push(DIGITS[(byte & 0x0f) as usize] as char);
    }
    out
}

fn decode_hex(text: &str, out: &mut [u8]) -> Option<()> {
    let bytes = text.as_bytes();
    if bytes.len() != out.len() * 2 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    for (index, slot) in out.iter_mut().enumerate() {
        *slot = (nibble(bytes[index * 2])? << 4) | nibble(bytes[index * 2 + 1])?;
    }
    Some(())
}

tokio::task_local! {
    static SCOPED: Option<TraceParent>;
}

/// Runs `future` with `traceparent` as the ambient trace context: every
/// event emitted inside it carries a child of this context.
pub async fn scope<F: Future>(traceparent: Option<TraceParent>, future: F) -> F::Output {
    SCOPED.scope(traceparent, future).await
}

/// The ambient trace context for an event emitted now, as a child span of
/// the context in scope; `None` when there is none.
pub fn current() -> Option<TraceParent> {
    if let Ok(Some(scoped)) = SCOPED.try_with(|scoped| *scoped) {
        return Some(scoped.child());
    }
    otel::current_span_context()
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use super::TraceParent;
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    pub(super) fn current_span_context() -> Option<TraceParent> {
        let context = tracing::Span::current().context();
        let span = context.span();
        let span_context = span.span_context();
        if !span_context.is_valid() {
            return None;
        }
        Some(TraceParent {
            trace_id: span_context.trace_id().to_bytes(),
            span_id: span_context.span_id().to_bytes(),
            flags: span_context.trace_flags().to_u8(),
        })
    }
}

#[cfg(not(feature = "opentelemetry"))]
mod otel {
    use super::TraceParent;

    pub(super) fn current_span_context() -> Option<TraceParent> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_formats_the_w3c_example() {
        let parsed: TraceParent = SAMPLE.parse().unwrap();
        assert_eq!(parsed.to_string(), SAMPLE);
        assert_eq!(parsed.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed.flags, 1);
    }

    #[test]
    fn rejects_malformed_values_with_a_reason() {
        for (value, reason) in [
            ("", "expected version-traceid-spanid-flags"),
            (
                "00-0000000000000000000000000000000-00f067aa0ba902b7-01",
                "trace id is not 32 lowercase hex characters",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "trace id is all zero",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "span id is all zero",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "trace id is not 32 lowercase hex characters",
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "unsupported version",
            ),
        ] {
            let error = value.parse::<TraceParent>().unwrap_err();
            assert_eq!(error.reason, reason, "{value}");
        }
    }

    #[tokio::test]
    async fn scope_gives_children_of_the_same_trace() {
        let parent: TraceParent = SAMPLE.parse().unwrap();
        assert_eq!(current(), None);
        let child = scope(Some(parent), async { current() }).await.unwrap();
        assert_eq!(child.trace_id, parent.trace_id);
        assert_ne!(child.span_id, parent.span_id);
    }
}
