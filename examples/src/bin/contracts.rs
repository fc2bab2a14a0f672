//! Lists the event contracts linked into the example: for each event type
//! its aggregate, its versions with their Rust types, upcast steps and
//! redacted fields. `--schemas` adds each version's JSON Schema.

use anyhow::Context as _;
use outbox_core::ContractRegistry;

// Link the example's contracts into this binary so they register.
#[allow(unused_extern_crates)]
extern crate outbox_examples;

fn main() -> anyhow::Result<()> {
    let with_schemas = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--schemas") => true,
        Some(other) => {
            anyhow::bail!("unknown argument {other:?}; use --schemas to print the JSON Schemas")
        }
    };
    let registry = ContractRegistry::global().map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "contracts: {} event types, {} versions",
        registry.event_types().count(),
        registry.len()
    );
    for event_type in registry.event_types() {
        let current = registry
            .current(event_type)
            .context("event type without versions")?;
        let versions: Vec<String> = registry
            .versions(event_type)
            .map(|c| format!("v{}", c.schema_version))
            .collect();
        let upcasts: Vec<String> = registry
            .versions(event_type)
            .flat_map(|c| c.upcasts.iter())
            .map(|link| format!("v{}→v{} {}", link.from, link.from + 1, link.kind))
            .collect();
        println!(
            "  {event_type:<18} aggregate {:<8} {:<10} current {}{}{}",
            current.aggregate_type,
            versions.join(","),
            current
                .rust_type
                .rsplit("::")
                .next()
                .unwrap_or(current.rust_type),
            if upcasts.is_empty() {
                String::new()
            } else {
                format!("; upcasts {}", upcasts.join(", "))
            },
            if current.redacted_fields.is_empty() {
                String::new()
            } else {
                format!("; redacted {}", current.redacted_fields.join(", "))
            },
        );
        if with_schemas {
            for contract in registry.versions(event_type) {
                println!("    v{} schema:", contract.schema_version);
                let schema = serde_json::to_string_pretty(&contract.json_schema())?;
                for line in schema.lines() {
                    println!("      {line}");
                }
            }
        }
    }
    if !with_schemas {
        println!(
            "  (JSON Schemas: cargo run -p outbox-examples --bin contracts -- --schemas; the registry is in schemas/)"
        );
    }
    Ok(())
}
