//! The registry as data: event types, their versions with schemas, upcast
//! links and retirements; and the files it is written as (`registry.json`,
//! one schema file per version, `asyncapi.json`). Reading and writing the
//! folder is `folder.rs`; building the model from code is `generate.rs`.

use std::collections::BTreeMap;

use outbox_core::CompatibilityMode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::asyncapi;
use crate::canonical::to_canonical_string;
use crate::compat::{self, Compatibility};

/// The manifest's format marker.
pub(crate) const FORMAT: &str = "outbox-schema-registry/1";
/// The manifest's file name inside the folder.
pub(crate) const MANIFEST_FILE: &str = "registry.json";
/// The AsyncAPI document's file name inside the folder.
pub(crate) const ASYNCAPI_FILE: &str = "asyncapi.json";

/// How one version is reached from the previous one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpcastKind {
    /// `From`/`TryFrom` between two structs.
    Typed,
    /// A function on JSON values.
    Json,
}

/// The upcast link into a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpcastEntry {
    /// The version the upcaster reads (N-1).
    pub version: u32,
    /// How.
    pub kind: UpcastKind,
}

/// One version of an event type.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionModel {
    /// The JSON Schema.
    pub schema: Value,
    /// Serialized keys of redacted fields.
    pub redacted_fields: Vec<String>,
    /// The upcaster from the previous version, if any.
    pub upcast_from: Option<UpcastEntry>,
}

/// One event type with all its versions.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventTypeModel {
    /// The aggregate type.
    pub aggregate_type: String,
    /// Versions with a schema.
    pub versions: BTreeMap<u32, VersionModel>,
    /// Versions removed on purpose, with the recorded reason.
    pub retired: BTreeMap<u32, String>,
    /// The compatibility mode declared for it (in code with
    /// `#[outbox(compatibility = "…")]`, or in `registry.json`); `None` means
    /// the default, [`DEFAULT_MODE`].
    pub mode: Option<CompatibilityMode>,
}

/// The compatibility mode of an event type that declares none: new readers
/// read old data, through the upcaster the check demands for every version
/// (consumers upgrade first; a producer-first change also needs forward).
pub const DEFAULT_MODE: CompatibilityMode = CompatibilityMode::Backward;

impl EventTypeModel {
    /// The mode the checks enforce.
    pub fn effective_mode(&self) -> CompatibilityMode {
        self.mode.unwrap_or(DEFAULT_MODE)
    }
}

/// The registry's settings, written by hand into `registry.json` and kept
/// on every write: what the documents say about the wire.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// Where the folder is served (`https://schemas.example.com/orders/`,
    /// ending in `/`): each schema's `$id` and each event's `dataschema` are
    /// `<schema_base><event_type>/v<N>.json`. Without it both are
    /// `urn:outbox:schema:<event_type>:v<N>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_base: Option<String>,
    /// The NATS subject template the relay publishes with (the transport's
    /// `subject_template`), for the AsyncAPI channels. Default
    /// `events.{aggregate_type}.{event_type}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_template: Option<String>,
    /// AsyncAPI servers by name (`{"production": {"host": "nats.example.com:4222", "protocol": "nats"}}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub servers: BTreeMap<String, Server>,
    /// Whether the transport sends `Nats-Msg-Id` (its `message_id_header`,
    /// default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id_header: Option<bool>,
}

/// An AsyncAPI server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    /// `host[:port]`.
    pub host: String,
    /// `nats`, `kafka`, `amqp`.
    pub protocol: String,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl RegistrySettings {
    /// The `$id` of a version's schema file, equal to the `dataschema` the
    /// producer's envelope carries when its transport has the same base.
    pub fn schema_id(&self, event_type: &str, version: u32) -> String {
        outbox_core::dataschema_uri_with_base(self.schema_base.as_deref(), event_type, version)
    }

    /// The subject template, or the transport's default.
    pub fn subject_template(&self) -> &str {
        self.subject_template
            .as_deref()
            .unwrap_or("events.{aggregate_type}.{event_type}")
    }
}

impl EventTypeModel {
    /// The highest version, retired or not.
    pub fn current_version(&self) -> u32 {
        let live = self.versions.keys().next_back().copied().unwrap_or(0);
        let retired = self.retired.keys().next_back().copied().unwrap_or(0);
        live.max(retired)
    }
}

/// The whole registry.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RegistryModel {
    /// Event types by name.
    pub event_types: BTreeMap<String, EventTypeModel>,
    /// What `registry.json` says about the wire.
    pub settings: RegistrySettings,
}

/// `registry.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always `outbox-schema-registry/1`.
    pub format: String,
    /// Settings kept on every write (schema base URL, subject template,
    /// servers).
    #[serde(default, skip_serializing_if = "is_default_settings")]
    pub settings: RegistrySettings,
    /// One entry per event type, sorted.
    pub event_types: Vec<EventTypeEntry>,
}

fn is_default_settings(settings: &RegistrySettings) -> bool {
    *settings == RegistrySettings::default()
}

/// One event type in `registry.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventTypeEntry {
    /// The event type.
    pub event_type: String,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The newest version (the one producers emit).
    pub current_version: u32,
    /// Versions with a schema, oldest first.
    pub versions: Vec<VersionEntry>,
    /// Versions removed on purpose.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<Retirement>,
    /// The compatibility mode the checks enforce between its versions
    /// (`none`, `backward`, `forward`, `full`, each also `_transitive`);
    /// absent: `backward`. A mode declared in code wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compatibility_mode: Option<String>,
}

/// One version in `registry.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionEntry {
    /// The schema version.
    pub version: u32,
    /// The schema file, relative to the folder.
    pub schema: String,
    /// SHA-256 of the schema's contract (canonical text without annotations
    /// such as descriptions), hex.
    pub sha256: String,
    /// Serialized keys of redacted fields.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redacted_fields: Vec<String>,
    /// The upcaster into this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upcast_from: Option<UpcastEntry>,
    /// Compatibility with the previous version's schema, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compatibility: Option<Compatibility>,
}

/// A version removed on purpose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retirement {
    /// The retired version.
    pub version: u32,
    /// Why it could go (who still had data of it, when it was drained).
    pub reason: String,
}

/// The relative path of a version's schema file.
pub(crate) fn schema_path(event_type: &str, version: u32) -> String {
    format!("{event_type}/v{version}.json")
}

/// SHA-256 (hex) of a schema's contract: annotations stripped, canonical text.
pub(crate) fn contract_hash(schema: &Value) -> String {
    let text = to_canonical_string(&compat::strip_annotations(schema));
    hex::encode(Sha256::digest(text.as_bytes()))
}

impl RegistryModel {
    /// The manifest describing this model.
    pub fn manifest(&self) -> Manifest {
        let event_types = self
            .event_types
            .iter()
            .map(|(event_type, model)| {
                let versions = model
                    .versions
                    .iter()
                    .map(|(version, entry)| {
                        let compatibility = model.versions.get(&(version - 1)).map(|previous| {
                            compat::classify(&previous.schema, &entry.schema).compatibility()
                        });
                        VersionEntry {
                            version: *version,
                            schema: schema_path(event_type, *version),
                            sha256: contract_hash(&entry.schema),
                            redacted_fields: entry.redacted_fields.clone(),
                            upcast_from: entry.upcast_from,
                            compatibility,
                        }
                    })
                    .collect();
                EventTypeEntry {
                    event_type: event_type.clone(),
                    aggregate_type: model.aggregate_type.clone(),
                    current_version: model.current_version(),
                    compatibility_mode: model.mode.map(|m| m.name().to_owned()),
                    versions,
                    retired: model
                        .retired
                        .iter()
                        .map(|(version, reason)| Retirement {
                            version: *version,
                            reason: reason.clone(),
                        })
                        .collect(),
                }
            })
            .collect();
        Manifest {
            format: FORMAT.to_owned(),
            settings: self.settings.clone(),
            event_types,
        }
    }

    /// A version's schema as its file holds it: with `$id`, the URI the
    /// envelope's `dataschema` carries.
    pub fn schema_file(&self, event_type: &str, version: u32, schema: &Value) -> Value {
        let mut file = schema.clone();
        if let Value::Object(map) = &mut file {
            map.insert(
                "$id".to_owned(),
                Value::String(self.settings.schema_id(event_type, version)),
            );
        }
        file
    }

    /// Every file of the folder with its canonical content, by relative path.
    pub fn files(&self) -> BTreeMap<String, String> {
        let mut files = BTreeMap::new();
        for (event_type, model) in &self.event_types {
            for (version, entry) in &model.versions {
                files.insert(
                    schema_path(event_type, *version),
                    to_canonical_string(&self.schema_file(event_type, *version, &entry.schema)),
                );
            }
        }
        let manifest = serde_json::to_value(self.manifest()).unwrap_or(Value::Null);
        files.insert(MANIFEST_FILE.to_owned(), to_canonical_string(&manifest));
        files.insert(
            ASYNCAPI_FILE.to_owned(),
            to_canonical_string(&asyncapi::document(self)),
        );
        files
    }
}
