//! The attribute keys the derive understands, as constants.

use std::fmt::{self, Display};

use syn::{Ident, Path};

/// One attribute key.
#[derive(Copy, Clone)]
pub(crate) struct Symbol(&'static str);

pub(crate) const OUTBOX: Symbol = Symbol("outbox");
pub(crate) const SERDE: Symbol = Symbol("serde");

// container keys
pub(crate) const EVENT_TYPE: Symbol = Symbol("event_type");
pub(crate) const AGGREGATE: Symbol = Symbol("aggregate");
pub(crate) const VERSION: Symbol = Symbol("version");
pub(crate) const UPCAST_FROM: Symbol = Symbol("upcast_from");
pub(crate) const UPCAST: Symbol = Symbol("upcast");
pub(crate) const CRATE: Symbol = Symbol("crate");
pub(crate) const COMPATIBILITY: Symbol = Symbol("compatibility");
pub(crate) const FROM: Symbol = Symbol("from");
pub(crate) const WITH: Symbol = Symbol("with");

// field keys
pub(crate) const AGGREGATE_ID: Symbol = Symbol("aggregate_id");
pub(crate) const AGGREGATE_VERSION: Symbol = Symbol("aggregate_version");
pub(crate) const REDACT: Symbol = Symbol("redact");

// serde keys we read (never reject: serde owns them)
pub(crate) const RENAME: Symbol = Symbol("rename");
pub(crate) const RENAME_ALL: Symbol = Symbol("rename_all");
pub(crate) const FLATTEN: Symbol = Symbol("flatten");
pub(crate) const SERIALIZE: Symbol = Symbol("serialize");

/// The container keys, for "expected one of" messages.
pub(crate) const CONTAINER_KEYS: &str = "`event_type`, `aggregate`, `version`, `upcast_from`, `upcast(from = N, with = path)`, `compatibility`, `crate`";

/// The compatibility modes and the variant each names.
pub(crate) const COMPATIBILITY_MODES: &[(&str, &str)] = &[
    ("none", "None"),
    ("backward", "Backward"),
    ("forward", "Forward"),
    ("full", "Full"),
    ("backward_transitive", "BackwardTransitive"),
    ("forward_transitive", "ForwardTransitive"),
    ("full_transitive", "FullTransitive"),
];
/// The field keys, for "expected one of" messages.
pub(crate) const FIELD_KEYS: &str = "`aggregate_id`, `aggregate_version`, `redact`";

impl PartialEq<Symbol> for Ident {
    fn eq(&self, word: &Symbol) -> bool {
        self == word.0
    }
}

impl PartialEq<Symbol> for &Ident {
    fn eq(&self, word: &Symbol) -> bool {
        *self == word.0
    }
}

impl PartialEq<Symbol> for Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

impl PartialEq<Symbol> for &Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

impl Display for Symbol {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.0)
    }
}
