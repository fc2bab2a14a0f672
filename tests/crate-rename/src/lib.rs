//! A contract in a crate that depends on outbox-core under the name
//! `events`: the derive must reach every runtime item through the path
//! given by `crate = "events"`, never through `::outbox_core`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An example contract whose derive is pointed at the renamed dependency.
#[derive(Debug, Serialize, Deserialize, JsonSchema, events::OutboxEvent)]
#[outbox(
    crate = "events",
    event_type = "invoice.issued",
    aggregate = "invoice",
    version = 1
)]
pub struct InvoiceIssued {
    /// The invoice number.
    #[outbox(aggregate_id)]
    pub invoice_no: String,
    /// The customer's e-mail; personal data.
    #[outbox(redact)]
    pub email: String,
}

#[cfg(test)]
mod tests {
    use super::InvoiceIssued;
    use events::{ContractRegistry, OutboxEvent};

    #[test]
    fn contract_works_through_the_renamed_crate() {
        let invoice = InvoiceIssued {
            invoice_no: "INV-1".into(),
            email: "x@example.org".into(),
        };
        assert_eq!(invoice.aggregate_id(), "INV-1");
        assert_eq!(invoice.redacted_payload().unwrap()["email"], "[REDACTED]");
        let registry = ContractRegistry::global().unwrap();
        assert_eq!(
            registry.get("invoice.issued", 1).unwrap().rust_type,
            "outbox_crate_rename_test::InvoiceIssued"
        );
    }
}
