//! The configured PostgreSQL schema that holds the outbox's objects, and the
//! validation of configurable identifiers. Every configurable name that
//! ends up in SQL text goes through here; values are always bound.

use std::fmt;

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

    /// The NOTIFY channel of this schema's outbox.
    pub fn notify_channel(&self) -> String {
        format!("outbox_events.{}", self.0)
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
    if value.len() > 63 {
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
}
