//! Reading a committed registry folder into the model, and writing one.
//!
//! Reading never panics on bad input: a missing folder, a malformed or
//! hand-edited `registry.json`, a schema file that is not JSON or not a JSON
//! Schema each give a [`LoadError`] naming the file. Writing happens only
//! when asked for, and only changes files whose content differs.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value;

use outbox_core::CompatibilityMode;

use crate::model::{
    ASYNCAPI_FILE, EventTypeModel, FORMAT, MANIFEST_FILE, Manifest, RegistryModel,
    RegistrySettings, VersionModel, schema_path,
};
use crate::schema_lint;

/// A registry folder could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The folder does not exist.
    #[error(
        "registry folder {0} does not exist (generate it by running the registry test with OUTBOX_REGISTRY_WRITE=1)"
    )]
    MissingFolder(PathBuf),
    /// The manifest is missing.
    #[error("{0} is missing: the folder is not a schema registry")]
    MissingManifest(PathBuf),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A file is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// Where and why parsing failed.
        #[source]
        source: serde_json::Error,
    },
    /// The manifest has the wrong structure.
    #[error("{path} is not a valid registry manifest: {reason}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A schema file is not a JSON Schema.
    #[error("{path} is not a valid JSON Schema at {pointer}: {reason}")]
    InvalidSchema {
        /// The schema file.
        path: PathBuf,
        /// JSON pointer of the offending keyword.
        pointer: String,
        /// What is wrong.
        reason: String,
    },
}

/// A folder as read: the model, the manifest as written, and every file's
/// text (for byte comparison).
#[derive(Debug, Clone)]
pub struct LoadedFolder {
    /// The folder's path.
    pub dir: PathBuf,
    /// The model rebuilt from manifest and schema files.
    pub model: RegistryModel,
    /// The manifest as found on disk.
    pub manifest: Manifest,
    /// Relative path → file text, for every `.json` file under the folder.
    pub files: BTreeMap<String, String>,
    /// The `$id` each schema file holds, by (event type, version); the
    /// model's schemas are kept without it.
    pub ids: BTreeMap<(String, u32), Option<String>>,
}

/// Reads a registry folder.
pub(crate) fn load(dir: &Path) -> Result<LoadedFolder, LoadError> {
    if !dir.is_dir() {
        return Err(LoadError::MissingFolder(dir.to_path_buf()));
    }
    let manifest_path = dir.join(MANIFEST_FILE);
    if !manifest_path.is_file() {
        return Err(LoadError::MissingManifest(manifest_path));
    }
    let files = read_json_files(dir)?;
    let manifest_text = &files[MANIFEST_FILE];
    let manifest: Manifest = serde_json::from_str(manifest_text).map_err(|error| {
        if error.is_syntax() || error.is_eof() {
            LoadError::Json {
                path: manifest_path.clone(),
                source: error,
            }
        } else {
            LoadError::Manifest {
                path: manifest_path.clone(),
                reason: error.to_string(),
            }
        }
    })?;
    let (model, ids) = model_from_manifest(dir, &manifest_path, &manifest, &files)?;
    Ok(LoadedFolder {
        dir: dir.to_path_buf(),
        model,
        manifest,
        files,
        ids,
    })
}

type SchemaIds = BTreeMap<(String, u32), Option<String>>;

fn model_from_manifest(
    dir: &Path,
    manifest_path: &Path,
    manifest: &Manifest,
    files: &BTreeMap<String, String>,
) -> Result<(RegistryModel, SchemaIds), LoadError> {
    let bad = |reason: String| LoadError::Manifest {
        path: manifest_path.to_path_buf(),
        reason,
    };
    if manifest.format != FORMAT {
        return Err(bad(format!(
            "format is {:?}, expected {FORMAT:?}",
            manifest.format
        )));
    }
    check_settings(&manifest.settings).map_err(bad)?;
    let mut model = RegistryModel {
        settings: manifest.settings.clone(),
        ..RegistryModel::default()
    };
    let mut ids = SchemaIds::new();
    for entry in &manifest.event_types {
        let mode = match &entry.compatibility_mode {
            None => None,
            Some(name) => Some(CompatibilityMode::from_name(name).ok_or_else(|| {
                bad(format!(
                    "{} has compatibility_mode {name:?}; expected one of {}",
                    entry.event_type,
                    CompatibilityMode::ALL
                        .iter()
                        .map(|m| format!("{:?}", m.name()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?),
        };
        let mut event_type = EventTypeModel {
            aggregate_type: entry.aggregate_type.clone(),
            mode,
            ..EventTypeModel::default()
        };
        for version in &entry.versions {
            if version.version == 0 {
                return Err(bad(format!(
                    "{} lists version 0; versions start at 1",
                    entry.event_type
                )));
            }
            if let Some(link) = version.upcast_from
                && link.version.checked_add(1) != Some(version.version)
            {
                return Err(bad(format!(
                    "{} v{} has an upcaster from v{}; the upcaster into v{} reads v{}",
                    entry.event_type,
                    version.version,
                    link.version,
                    version.version,
                    version.version - 1
                )));
            }
            let expected = schema_path(&entry.event_type, version.version);
            if version.schema != expected {
                return Err(bad(format!(
                    "{} v{} points at {:?}; schema files live at {expected:?}",
                    entry.event_type, version.version, version.schema
                )));
            }
            let path = dir.join(&version.schema);
            let text = files.get(&version.schema).ok_or_else(|| LoadError::Io {
                path: path.clone(),
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    "listed in registry.json but missing",
                ),
            })?;
            let mut schema: Value =
                serde_json::from_str(text).map_err(|source| LoadError::Json {
                    path: path.clone(),
                    source,
                })?;
            let id = schema
                .as_object_mut()
                .and_then(|map| map.remove("$id"))
                .map(|id| {
                    id.as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| id.to_string())
                });
            ids.insert((entry.event_type.clone(), version.version), id);
            schema_lint::check(&schema).map_err(|problem| LoadError::InvalidSchema {
                path: path.clone(),
                pointer: problem.pointer,
                reason: problem.reason,
            })?;
            if event_type
                .versions
                .insert(
                    version.version,
                    VersionModel {
                        schema,
                        redacted_fields: version.redacted_fields.clone(),
                        upcast_from: version.upcast_from,
                    },
                )
                .is_some()
            {
                return Err(bad(format!(
                    "{} lists v{} twice",
                    entry.event_type, version.version
                )));
            }
        }
        for retirement in &entry.retired {
            if retirement.version == 0 {
                return Err(bad(format!(
                    "{} retires version 0; versions start at 1",
                    entry.event_type
                )));
            }
            if retirement.reason.trim().is_empty() {
                return Err(bad(format!(
                    "{} v{} is retired without a reason; record why it could go",
                    entry.event_type, retirement.version
                )));
            }
            if event_type.versions.contains_key(&retirement.version) {
                return Err(bad(format!(
                    "{} v{} is both listed and retired",
                    entry.event_type, retirement.version
                )));
            }
            event_type
                .retired
                .insert(retirement.version, retirement.reason.clone());
        }
        if model
            .event_types
            .insert(entry.event_type.clone(), event_type)
            .is_some()
        {
            return Err(bad(format!(
                "event type {} is listed twice",
                entry.event_type
            )));
        }
    }
    Ok((model, ids))
}

/// The settings a person wrote: a base URL that ends in `/`, a subject
/// template with known placeholders and a literal prefix, servers with a
/// host and a protocol.
fn check_settings(settings: &RegistrySettings) -> Result<(), String> {
    if let Some(base) = &settings.schema_base
        && (!base.ends_with('/') || base.contains(char::is_whitespace) || !base.contains(':'))
    {
        return Err(format!(
            "settings.schema_base {base:?} must be an absolute URI ending in `/` (where the folder is served)"
        ));
    }
    if let Some(template) = &settings.subject_template {
        crate::asyncapi::parse_template(template)
            .map_err(|reason| format!("settings.subject_template {template:?}: {reason}"))?;
    }
    for (name, server) in &settings.servers {
        if server.host.trim().is_empty() || server.protocol.trim().is_empty() {
            return Err(format!(
                "settings.servers.{name} needs a host and a protocol"
            ));
        }
    }
    Ok(())
}

/// Relative path → text of every `.json` file under `dir`.
fn read_json_files(dir: &Path) -> Result<BTreeMap<String, String>, LoadError> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = fs::read_dir(&current).map_err(|source| LoadError::Io {
            path: current.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| LoadError::Io {
                path: current.clone(),
                source,
            })?;
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                let text = fs::read_to_string(&path).map_err(|source| LoadError::Io {
                    path: path.clone(),
                    source,
                })?;
                let relative = path
                    .strip_prefix(dir)
                    .unwrap_or(&path)
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                files.insert(relative, text);
            }
        }
    }
    Ok(files)
}

/// What a write changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteSummary {
    /// Files created or rewritten (relative paths).
    pub written: Vec<String>,
    /// Schema files removed because their version is no longer listed.
    pub removed: Vec<String>,
}

/// Writes `files` into `dir`: creates or rewrites files whose content
/// differs and removes schema files (`<event_type>/v<N>.json`) that are not
/// part of `files`. Other files are left alone.
pub(crate) fn write(dir: &Path, files: &BTreeMap<String, String>) -> io::Result<WriteSummary> {
    fs::create_dir_all(dir)?;
    let mut summary = WriteSummary::default();
    for (relative, content) in files {
        let path = dir.join(relative);
        if fs::read_to_string(&path).ok().as_deref() == Some(content.as_str()) {
            continue;
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let temporary = path.with_extension("json.tmp");
        fs::write(&temporary, content)?;
        fs::rename(&temporary, &path)?;
        summary.written.push(relative.clone());
    }
    let existing = match read_json_files(dir) {
        Ok(existing) => existing,
        Err(LoadError::Io { source, .. }) => return Err(source),
        Err(other) => return Err(io::Error::other(other.to_string())),
    };
    let keep: BTreeSet<&String> = files.keys().collect();
    for relative in existing.keys() {
        // Only `<event_type>/v<N>.json` files are ours to remove.
        let is_schema_file = relative.split_once('/').is_some_and(|(_, name)| {
            name.strip_prefix('v')
                .and_then(|rest| rest.strip_suffix(".json"))
                .is_some_and(|digits| {
                    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
                })
        });
        if is_schema_file && !keep.contains(relative) && relative != ASYNCAPI_FILE {
            fs::remove_file(dir.join(relative))?;
            summary.removed.push(relative.clone());
        }
    }
    Ok(summary)
}
