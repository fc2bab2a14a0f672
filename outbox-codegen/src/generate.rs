//! Building the registry model from the contracts linked into a binary.
//!
//! Versions whose struct no longer exists cannot be regenerated from code:
//! their schemas are carried over from the committed folder, as are
//! retirements (they are records, not code). The check decides whether a
//! carried-over version is still readable through an upcaster.

use std::collections::BTreeMap;

use outbox_core::{ContractRegistry, EventContract};
use serde_json::Value;

use crate::canonical::normalize;
use crate::model::{EventTypeModel, RegistryModel, UpcastEntry, UpcastKind, VersionModel};

/// The JSON Schema of a contract, normalized as committed files are.
pub(crate) fn contract_schema(contract: &EventContract) -> Value {
    normalize(&contract.json_schema().to_value())
}

/// The upcast link into each version of an event type, collected from every
/// contract of that type (a step from K to K+1 is owned by exactly one).
pub(crate) fn upcast_links<'a>(
    contracts: impl IntoIterator<Item = &'a EventContract>,
) -> BTreeMap<u32, UpcastEntry> {
    let mut links = BTreeMap::new();
    for contract in contracts {
        for link in contract.upcasts {
            let kind = match link.kind {
                outbox_core::UpcastKind::Typed { .. } => UpcastKind::Typed,
                outbox_core::UpcastKind::Json { .. } => UpcastKind::Json,
            };
            links.insert(
                link.from + 1,
                UpcastEntry {
                    version: link.from,
                    kind,
                },
            );
        }
    }
    links
}

/// The model the code describes, with historical versions and retirements
/// carried over from `committed`.
pub(crate) fn model_from_code(
    registry: &ContractRegistry,
    committed: Option<&RegistryModel>,
) -> RegistryModel {
    let mut model = RegistryModel {
        settings: committed.map(|c| c.settings.clone()).unwrap_or_default(),
        ..RegistryModel::default()
    };
    for event_type in registry.event_types() {
        let contracts: Vec<&EventContract> = registry.versions(event_type).collect();
        let links = upcast_links(contracts.iter().copied());
        // A mode in code (the newest version that declares one) wins over
        // the one written in registry.json.
        let declared = contracts.iter().rev().find_map(|c| c.compatibility);
        let committed_mode = committed
            .and_then(|c| c.event_types.get(event_type))
            .and_then(|t| t.mode);
        let mut entry = EventTypeModel {
            aggregate_type: contracts
                .last()
                .map(|c| c.aggregate_type.to_owned())
                .unwrap_or_default(),
            mode: declared.or(committed_mode),
            ..EventTypeModel::default()
        };
        for contract in &contracts {
            entry.versions.insert(
                contract.schema_version,
                VersionModel {
                    schema: contract_schema(contract),
                    redacted_fields: contract
                        .redacted_fields
                        .iter()
                        .map(|f| (*f).to_owned())
                        .collect(),
                    upcast_from: links.get(&contract.schema_version).copied(),
                },
            );
        }
        if let Some(previous) = committed.and_then(|c| c.event_types.get(event_type)) {
            for (version, historical) in &previous.versions {
                entry
                    .versions
                    .entry(*version)
                    .or_insert_with(|| VersionModel {
                        upcast_from: links.get(version).copied().or(historical.upcast_from),
                        ..historical.clone()
                    });
            }
            for (version, reason) in &previous.retired {
                if !entry.versions.contains_key(version) {
                    entry.retired.insert(*version, reason.clone());
                }
            }
        }
        model.event_types.insert(event_type.to_owned(), entry);
    }
    if let Some(committed) = committed {
        for (event_type, previous) in &committed.event_types {
            model
                .event_types
                .entry(event_type.clone())
                .or_insert_with(|| previous.clone());
        }
    }
    model
}
