//! The process-wide registry of contracts linked into this binary.
//!
//! Every `#[derive(OutboxEvent)]` submits its [`EventContract`] through the
//! `inventory` crate; nothing needs to be listed by hand. [`ContractRegistry`]
//! collects them once, sorted by (event type, version), and refuses an
//! inconsistent set: two types claiming one (event type, version), or one
//! event type announced for two aggregate types.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use crate::contract::{ContractKey, EventContract};

/// What a contract submits to the inventory. Built by the derive only.
#[doc(hidden)]
pub struct ContractEntry(pub &'static EventContract);

inventory::collect!(ContractEntry);

/// Every contract submitted by a derive in this binary, in link order,
/// duplicates included. Prefer [`ContractRegistry::global`].
pub fn submitted_contracts() -> impl Iterator<Item = &'static EventContract> {
    inventory::iter::<ContractEntry>
        .into_iter()
        .map(|entry| entry.0)
}

/// The set of contracts in a binary is inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Two Rust types claim the same (event type, version).
    #[error(
        "{key} is claimed by two types: {first} and {second}; give one of them another version or event type"
    )]
    DuplicateContract {
        /// The contested identity.
        key: ContractKey,
        /// The first type (in sorted order of Rust paths).
        first: &'static str,
        /// The second type.
        second: &'static str,
    },
    /// Versions of one event type name different aggregate types.
    #[error(
        "event type {event_type} is announced for aggregate {first_aggregate} by {first} and for aggregate {second_aggregate} by {second}; an event type belongs to one aggregate type"
    )]
    ConflictingAggregate {
        /// The event type.
        event_type: &'static str,
        /// One contract.
        first: &'static str,
        /// Its aggregate type.
        first_aggregate: &'static str,
        /// The other contract.
        second: &'static str,
        /// Its aggregate type.
        second_aggregate: &'static str,
    },
}

/// A validated, sorted view of contracts.
#[derive(Debug, Clone, Default)]
pub struct ContractRegistry {
    by_type: BTreeMap<&'static str, BTreeMap<u32, &'static EventContract>>,
}

/// All problems found while building a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryErrors(pub Vec<RegistryError>);

impl fmt::Display for RegistryErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} problem(s) in the contract registry", self.0.len())?;
        for error in &self.0 {
            write!(f, "\n  - {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RegistryErrors {}

impl ContractRegistry {
    /// The registry of every contract linked into this binary, built once.
    pub fn global() -> Result<&'static ContractRegistry, &'static RegistryErrors> {
        static GLOBAL: OnceLock<Result<ContractRegistry, RegistryErrors>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| ContractRegistry::from_contracts(submitted_contracts()))
            .as_ref()
    }

    /// Builds a registry from any set of contracts, reporting every
    /// duplicate and conflict found (not only the first).
    pub fn from_contracts(
        contracts: impl IntoIterator<Item = &'static EventContract>,
    ) -> Result<ContractRegistry, RegistryErrors> {
        let mut all: Vec<&'static EventContract> = contracts.into_iter().collect();
        all.sort_by(|a, b| (a.key(), a.rust_type).cmp(&(b.key(), b.rust_type)));
        let mut errors = Vec::new();
        let mut by_type: BTreeMap<&'static str, BTreeMap<u32, &'static EventContract>> =
            BTreeMap::new();
        let mut aggregate_of: BTreeMap<&'static str, &'static EventContract> = BTreeMap::new();
        for contract in all {
            let versions = by_type.entry(contract.event_type).or_default();
            if let Some(first) = versions.get(&contract.schema_version) {
                if first.rust_type != contract.rust_type {
                    errors.push(RegistryError::DuplicateContract {
                        key: contract.key(),
                        first: first.rust_type,
                        second: contract.rust_type,
                    });
                }
                continue;
            }
            match aggregate_of.get(contract.event_type) {
                Some(first) if first.aggregate_type != contract.aggregate_type => {
                    errors.push(RegistryError::ConflictingAggregate {
                        event_type: contract.event_type,
                        first: first.rust_type,
                        first_aggregate: first.aggregate_type,
                        second: contract.rust_type,
                        second_aggregate: contract.aggregate_type,
                    });
                }
                Some(_) => {}
                None => {
                    aggregate_of.insert(contract.event_type, contract);
                }
            }
            versions.insert(contract.schema_version, contract);
        }
        if errors.is_empty() {
            Ok(ContractRegistry { by_type })
        } else {
            Err(RegistryErrors(errors))
        }
    }

    /// Every contract, sorted by event type then version.
    pub fn contracts(&self) -> impl Iterator<Item = &'static EventContract> + '_ {
        self.by_type
            .values()
            .flat_map(|versions| versions.values().copied())
    }

    /// The contract of one event type at one version.
    pub fn get(&self, event_type: &str, schema_version: u32) -> Option<&'static EventContract> {
        self.by_type.get(event_type)?.get(&schema_version).copied()
    }

    /// Every version of one event type, oldest first.
    pub fn versions(&self, event_type: &str) -> impl Iterator<Item = &'static EventContract> + '_ {
        self.by_type
            .get(event_type)
            .into_iter()
            .flat_map(|versions| versions.values().copied())
    }

    /// The newest version of an event type: the one producers emit.
    pub fn current(&self, event_type: &str) -> Option<&'static EventContract> {
        self.by_type
            .get(event_type)?
            .last_key_value()
            .map(|(_, contract)| *contract)
    }

    /// The distinct event types, sorted.
    pub fn event_types(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.by_type.keys().copied()
    }

    /// The number of contracts.
    pub fn len(&self) -> usize {
        self.by_type.values().map(BTreeMap::len).sum()
    }

    /// Whether the registry holds no contract.
    pub fn is_empty(&self) -> bool {
        self.by_type.is_empty()
    }
}
