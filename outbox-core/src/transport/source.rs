//! The CloudEvents `source` a producer reports: the service that emits the
//! events. Every transport's settings default it to the running program's
//! name, so two services that keep the defaults still report different
//! sources; `source_of("orders")` gives `/orders` for an explicit name.

use crate::store::ConfigError;

/// `/` and the running program's file name without its extension
/// (`/order-service`); `/outbox` when the name cannot be read.
pub fn default_source() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|path| {
            path.file_stem()
                .and_then(|stem| stem.to_str())
                .map(str::to_owned)
        })
        .filter(|name| !name.is_empty())
        .map_or_else(|| "/outbox".to_owned(), |name| source_of(&name))
}

/// The source of a service called `name`: `/name`, with characters a URI
/// path segment cannot hold percent-encoded.
pub fn source_of(name: &str) -> String {
    format!(
        "/{}",
        crate::encoding::encode_path_segment(name.trim_matches('/'))
    )
}

/// Checks a configured source: a non-empty URI reference without spaces
/// or control characters (CloudEvents requires one).
pub fn validate_source(what: &'static str, source: &str) -> Result<(), ConfigError> {
    if source.is_empty() || source.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::InvalidValue {
            what,
            reason: format!(
                "{source:?}: name the service that emits the events, as a URI reference without spaces (e.g. `/order-service`)"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_name_the_service() {
        assert_eq!(source_of("orders"), "/orders");
        assert_eq!(source_of("orders.v2"), "/orders.v2");
        assert_eq!(source_of("/billing/"), "/billing");
        assert_eq!(source_of("a b"), "/a%20b");
        assert!(default_source().starts_with('/'));
        assert_ne!(default_source(), "/");
        // This test binary has a name of its own (`outbox_core-<hash>`):
        // not the shared constant every service used to report.
        assert!(
            default_source().starts_with("/outbox_core"),
            "{}",
            default_source()
        );
        assert!(validate_source("source", "/orders").is_ok());
        assert!(validate_source("source", "").is_err());
        assert!(validate_source("source", "/a b").is_err());
    }
}
