//! Prints every event contract linked into the example: metadata, upcast
//! chain, redacted fields and JSON Schema.

use anyhow::Context as _;
use outbox_core::ContractRegistry;

// Link the example's contracts into this binary so they register.
#[allow(unused_extern_crates)]
extern crate outbox_examples;

fn main() -> anyhow::Result<()> {
    let registry = ContractRegistry::global().map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("{} contracts registered\n", registry.len());
    for event_type in registry.event_types() {
        let current = registry
            .current(event_type)
            .context("event type without versions")?;
        println!(
            "{event_type} (aggregate {}, current v{})",
            current.aggregate_type, current.schema_version
        );
        for contract in registry.versions(event_type) {
            println!("  v{}  {}", contract.schema_version, contract.rust_type);
            for link in contract.upcasts {
                println!(
                    "      upcast v{} -> v{}: {}",
                    link.from,
                    link.from + 1,
                    link.kind
                );
            }
            if !contract.redacted_fields.is_empty() {
                println!("      redacted: {}", contract.redacted_fields.join(", "));
            }
            if contract.readable_from < contract.schema_version {
                println!(
                    "      reads v{}..=v{}",
                    contract.readable_from, contract.schema_version
                );
            }
            let schema = serde_json::to_string_pretty(&contract.json_schema())?;
            for line in schema.lines() {
                println!("      {line}");
            }
        }
        println!();
    }
    Ok(())
}
