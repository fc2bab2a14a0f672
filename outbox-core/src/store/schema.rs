//! The configured PostgreSQL schema that holds the outbox's objects, and the
//! validation of configurable identifiers. Every configurable name that
//! ends up in SQL text goes through here; values are always bound.

use std::fmt;

use sha2::Digest;

/// PostgreSQL's limit for identifiers and channel names (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;

/// A configuration value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An identifier that would be pasted into SQL is not a plain name.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidIdentifier {
        /// Which setting.
        what: &'static str,
        /// The rejected value.
        value: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// A setting is out of range or inconsistent.
    #[error("invalid {what}: {reason}")]
    InvalidValue {
        /// Which setting.
        what: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

/// A validated schema name: `[a-z_][a-z0-9_]*`, at most 63 bytes, not
/// starting with `pg_`. Always quoted when written into SQL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SchemaName(String);

impl SchemaName {
    /// The schema used when none is configured.
    pub const DEFAULT: &'static str = "outbox";

    /// Validates a schema name.
    pub fn new(name: impl Into<String>) -> Result<SchemaName, ConfigError> {
        let name = name.into();
        validate_identifier("schema name", &name)?;
        Ok(SchemaName(name))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name quoted for SQL text (`"outbox"`).
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// The NOTIFY channel of this schema's outbox: `outbox_events.<schema>`
    /// when that fits PostgreSQL's 63-byte limit for channel names (schemas
    /// of up to 49 bytes); for longer schemas `outbox_events.` followed by
    /// the schema's first 32 bytes, a `.` and 16 hex digits of its SHA-256,
    /// so the channel always fits and no two schemas share one (a schema
    /// name cannot contain `.`, so the long form never equals a short one).
    pub fn notify_channel(&self) -> String {
        const PREFIX: &str = "outbox_events.";
        if PREFIX.len() + self.0.len() <= MAX_IDENTIFIER_BYTES {
            return format!("{PREFIX}{}", self.0);
        }
        let digest = sha2::Sha256::digest(self.0.as_bytes());
        format!("{PREFIX}{}.{}", &self.0[..32], hex::encode(&digest[..8]))
    }
}

impl Default for SchemaName {
    fn default() -> Self {
        SchemaName(SchemaName::DEFAULT.to_owned())
    }
}

impl fmt::Display for SchemaName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks that `value` is a plain lowercase SQL identifier.
pub(crate) fn validate_identifier(what: &'static str, value: &str) -> Result<(), ConfigError> {
    let error = |reason| ConfigError::InvalidIdentifier {
        what,
        value: value.chars().take(80).collect(),
        reason,
    };
    if value.is_empty() {
        return Err(error("it is empty"));
    }
    if value.len() > MAX_IDENTIFIER_BYTES {
        return Err(error("PostgreSQL identifiers have at most 63 bytes"));
    }
    let mut chars = value.chars();
    if !matches!(chars.next(), Some('a'..='z' | '_')) {
        return Err(error("it must start with a lowercase letter or _"));
    }
    if !chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_')) {
        return Err(error("only lowercase letters, digits and _ are allowed"));
    }
    if value.starts_with("pg_") {
        return Err(error("names starting with pg_ are reserved by PostgreSQL"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names_and_rejects_everything_else() {
        assert_eq!(
            SchemaName::new("outbox_1").unwrap().quoted(),
            "\"outbox_1\""
        );
        for (bad, reason) in [
            ("", "it is empty"),
            ("Outbox", "it must start with a lowercase letter or _"),
            (
                "out box",
                "only lowercase letters, digits and _ are allowed",
            ),
            (
                "a\"; drop table x; --",
                "only lowercase letters, digits and _ are allowed",
            ),
            (
                "pg_catalog",
                "names starting with pg_ are reserved by PostgreSQL",
            ),
        ] {
            match SchemaName::new(bad) {
                Err(ConfigError::InvalidIdentifier { reason: got, .. }) => {
                    assert_eq!(got, reason, "{bad}")
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        assert!(SchemaName::new("x".repeat(64)).is_err());
    }

    #[test]
    fn notify_channels_fit_and_differ() {
        assert_eq!(
            SchemaName::new("app").unwrap().notify_channel(),
            "outbox_events.app"
        );
        let fits = "a".repeat(49);
        assert_eq!(
            SchemaName::new(fits.clone()).unwrap().notify_channel(),
            format!("outbox_events.{fits}")
        );
        let long_a = SchemaName::new(format!("{}x", "a".repeat(62))).unwrap();
        let long_b = SchemaName::new(format!("{}y", "a".repeat(62))).unwrap();
        for name in [&long_a, &long_b] {
            let channel = name.notify_channel();
            assert!(channel.len() <= 63, "{channel} is {} bytes", channel.len());
        }
        assert_ne!(long_a.notify_channel(), long_b.notify_channel());
        // Stable across versions of the crate: relays and emitters of
        // different builds must meet on one channel.
        assert_eq!(
            SchemaName::new("b".repeat(63)).unwrap().notify_channel(),
            format!(
                "outbox_events.{}.{}",
                "b".repeat(32),
                golden_digest_of_63_bs()
            )
        );
    }

    fn golden_digest_of_63_bs() -> &'static str {
        "94e419fabac7f930"
    }
}
