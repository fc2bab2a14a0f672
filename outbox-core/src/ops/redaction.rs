//! How the operations API shows payloads: through the contract of the
//! event's type and version when the binary has it (its `redact` fields
//! masked), and for event types the binary does not know either every value
//! masked (the default: nothing says which fields are safe) or only the
//! keys an operator lists.

use serde::Serialize;
use serde_json::Value;

use crate::redact::{REDACTED, mask_all, mask_fields};
use crate::registry::ContractRegistry;

/// The redaction policy for shown payloads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Redaction {
    /// For event types without a contract in this binary: `None` masks
    /// every value; `Some(keys)` masks only these top-level keys.
    pub unknown_type_keys: Option<Vec<String>>,
    /// Keys masked in every payload, on top of the contracts' own.
    pub extra_keys: Vec<String>,
}

impl Redaction {
    /// A payload's text as it may be shown.
    pub fn show(&self, event_type: Option<&str>, schema_version: Option<u32>, text: &str) -> Value {
        let Ok(mut value) = serde_json::from_str::<Value>(text) else {
            return Value::String(format!("[{} bytes, not JSON]", text.len()));
        };
        let contract = match (event_type, schema_version) {
            (Some(event_type), Some(version)) => ContractRegistry::global()
                .ok()
                .and_then(|registry| registry.get(event_type, version)),
            _ => None,
        };
        match (contract, &self.unknown_type_keys) {
            (Some(contract), _) => mask_fields(&mut value, contract.redacted_fields),
            (None, None) => mask_all(&mut value),
            (None, Some(keys)) => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                mask_fields(&mut value, &keys);
            }
        }
        if !self.extra_keys.is_empty() {
            let keys: Vec<&str> = self.extra_keys.iter().map(String::as_str).collect();
            mask_fields(&mut value, &keys);
        }
        value
    }

    /// Raw bytes (a letter's payload) as they may be shown.
    pub fn show_bytes(
        &self,
        event_type: Option<&str>,
        schema_version: Option<u32>,
        bytes: &[u8],
    ) -> Value {
        match std::str::from_utf8(bytes) {
            Ok(text) => self.show(event_type, schema_version, text),
            Err(_) => Value::String(format!("[{} bytes, not UTF-8: {REDACTED}]", bytes.len())),
        }
    }
}
