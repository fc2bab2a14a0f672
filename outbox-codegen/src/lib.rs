//! # outbox-codegen
//!
//! The schema registry of event contracts, for CI:
//!
//! - **generate**: from every contract linked into a binary, a folder with
//!   one JSON Schema per (event type, version), `registry.json` (versions,
//!   aggregate, current version, upcast links, compatibility, content hash)
//!   and `asyncapi.json` (AsyncAPI 3 channels and messages). Canonical text:
//!   byte-identical on every run.
//! - **check**: the code against the committed folder. A published version
//!   is frozen; versions appear and go only on purpose; chains have no holes
//!   and every version N > 1 has an upcaster.
//! - **diff**: two folders (a branch against main), with a compatibility
//!   class (full / backward / forward / breaking) for every change.
//!
//! The easiest CI hook is one test in the crate that links the contracts:
//!
//! ```ignore
//! #[test]
//! fn schema_registry_is_up_to_date() {
//!     outbox_codegen::assert_registry_up_to_date!("schemas");
//! }
//! ```
//!
//! Run it with `OUTBOX_REGISTRY_WRITE=1` to write new versions (never a
//! changed published one; `OUTBOX_REGISTRY_WRITE=force` overwrites those
//! too, for a version that was never released).
//!
//! The same steps by hand: write the folder for the contracts linked into
//! this binary, then check the code against it.
//!
//! ```
//! use outbox_codegen::{WriteMode, check, write};
//! use outbox_core::OutboxEvent;
//!
//! #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
//! #[outbox(event_type = "doc.parcel_sent", aggregate = "doc_parcel", version = 1)]
//! struct ParcelSent {
//!     #[outbox(aggregate_id)]
//!     parcel_id: String,
//!     weight_grams: u32,
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let written = write(dir.path(), WriteMode::Safe)?;
//! println!("{written:?}");
//! assert!(dir.path().join("doc.parcel_sent/v1.json").exists());
//! let report = check(dir.path())?;
//! assert!(!report.has_errors(), "{}", report.render_text());
//! # Ok(()) }
//! ```

mod asyncapi;
mod canonical;
mod check;
pub mod cli;
mod compat;
mod diff;
mod folder;
mod generate;
mod model;
mod report;
mod schema_lint;

use std::io;
use std::path::{Path, PathBuf};

use outbox_core::{ContractRegistry, RegistryErrors};

pub use asyncapi::default_address;
pub use canonical::to_canonical_string;
pub use compat::{
    Change, Classification, Compatibility, classify, first_difference, strip_annotations,
};
pub use folder::{LoadError, LoadedFolder, WriteSummary};
pub use model::{
    DEFAULT_MODE, EventTypeEntry, EventTypeModel, Manifest, RegistryModel, RegistrySettings,
    Retirement, Server, UpcastEntry, UpcastKind, VersionEntry, VersionModel,
};
pub use report::{Finding, FindingKind, Report, Severity};

/// The environment variable that makes [`assert_registry_up_to_date!`]
/// write the folder: `1` for new versions and refreshed files, `force` to
/// also overwrite changed published versions.
pub const WRITE_ENV: &str = "OUTBOX_REGISTRY_WRITE";

/// Errors of the registry operations.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// The folder could not be read.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The folder could not be written.
    #[error("cannot write the registry folder {dir}: {source}")]
    Write {
        /// The folder.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Writing would hide a problem that needs a code change.
    #[error("refusing to write the registry:\n{}", .0.render_text())]
    Refused(Report),
    /// The contracts in this binary are inconsistent.
    #[error("the contracts linked into this binary are inconsistent: {0}")]
    Registry(RegistryErrors),
    /// No such event type or version (retire).
    #[error("{0}")]
    NotFound(String),
}

/// How [`write()`] treats published versions whose schema changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Refuse: a published version is frozen.
    Safe,
    /// Overwrite (for a version that was committed but never released).
    Force,
}

/// The registry the contracts in `registry` describe, without any folder.
pub fn generate(registry: &ContractRegistry) -> RegistryModel {
    generate::model_from_code(registry, None)
}

/// Reads a registry folder.
pub fn load(dir: &Path) -> Result<LoadedFolder, LoadError> {
    folder::load(dir)
}

/// Checks the contracts linked into this binary against the folder.
pub fn check(dir: &Path) -> Result<Report, CodegenError> {
    let folder = folder::load(dir)?;
    Ok(check::check_code(ContractRegistry::global(), &folder))
}

/// Checks `registry` against the folder.
pub fn check_with(registry: &ContractRegistry, dir: &Path) -> Result<Report, CodegenError> {
    let folder = folder::load(dir)?;
    Ok(check::check_code(Ok(registry), &folder))
}

/// Checks a folder on its own (no contracts needed).
pub fn check_folder(dir: &Path) -> Result<Report, LoadError> {
    Ok(check::check_folder(&folder::load(dir)?))
}

/// Compares two folders.
pub fn diff(old: &Path, new: &Path) -> Result<Report, LoadError> {
    Ok(diff::diff(&folder::load(old)?, &folder::load(new)?))
}

/// Writes the folder from the contracts linked into this binary.
pub fn write(dir: &Path, mode: WriteMode) -> Result<WriteSummary, CodegenError> {
    let registry = ContractRegistry::global().map_err(|e| CodegenError::Registry(e.clone()))?;
    write_with(registry, dir, mode)
}

/// Writes the folder from `registry`. Refuses when the check finds a
/// problem that writing would hide: a changed published version (unless
/// `Force`), a version removed without retirement, a hole, a missing
/// upcaster.
pub fn write_with(
    registry: &ContractRegistry,
    dir: &Path,
    mode: WriteMode,
) -> Result<WriteSummary, CodegenError> {
    // A folder that does not exist yet, or exists but is empty, is new.
    let is_new = !dir.exists()
        || std::fs::read_dir(dir)
            .map(|mut entries| entries.next().is_none())
            .unwrap_or(false);
    let committed = if is_new {
        None
    } else {
        Some(folder::load(dir)?)
    };
    let model = generate::model_from_code(registry, committed.as_ref().map(|f| &f.model));
    let report = match &committed {
        Some(folder) => check::check_code(Ok(registry), folder),
        None => check::check_folder_model(&model),
    };
    let blocking: Vec<Finding> = report
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .filter(|f| match f.kind {
            FindingKind::FrozenChanged => mode == WriteMode::Safe,
            FindingKind::MissingInRegistry
            | FindingKind::ManifestStale
            | FindingKind::AsyncApiStale
            | FindingKind::HashMismatch
            | FindingKind::SchemaIdMismatch
            | FindingKind::UnlistedFile => false,
            _ => true,
        })
        .cloned()
        .collect();
    if !blocking.is_empty() {
        return Err(CodegenError::Refused(Report {
            subject: report.subject,
            findings: blocking,
        }));
    }
    folder::write(dir, &model.files()).map_err(|source| CodegenError::Write {
        dir: dir.to_path_buf(),
        source,
    })
}

/// Records the retirement of a version: removes its schema from the folder
/// and lists it with the reason in `registry.json`.
pub fn retire(
    dir: &Path,
    event_type: &str,
    version: u32,
    reason: &str,
) -> Result<WriteSummary, CodegenError> {
    if reason.trim().is_empty() {
        return Err(CodegenError::NotFound(
            "a retirement needs a reason (--reason \"...\")".to_owned(),
        ));
    }
    let mut folder = folder::load(dir)?;
    let entry = folder
        .model
        .event_types
        .get_mut(event_type)
        .ok_or_else(|| {
            CodegenError::NotFound(format!("no event type {event_type} in {}", dir.display()))
        })?;
    if entry.versions.remove(&version).is_none() {
        return Err(CodegenError::NotFound(format!(
            "{event_type} has no v{version} in {}",
            dir.display()
        )));
    }
    entry.retired.insert(version, reason.trim().to_owned());
    folder::write(dir, &folder.model.files()).map_err(|source| CodegenError::Write {
        dir: dir.to_path_buf(),
        source,
    })
}

/// What [`assert_registry_up_to_date!`] runs: writes when [`WRITE_ENV`] asks
/// for it, then checks, and panics with the report when the check fails.
pub fn assert_up_to_date(dir: &Path) {
    let mode = match std::env::var(WRITE_ENV).ok().as_deref() {
        Some("force") => Some(WriteMode::Force),
        Some("1" | "true" | "yes") => Some(WriteMode::Safe),
        _ => None,
    };
    if let Some(mode) = mode {
        match write(dir, mode) {
            Ok(summary) => {
                for file in &summary.written {
                    println!("wrote {}", dir.join(file).display());
                }
                for file in &summary.removed {
                    println!("removed {}", dir.join(file).display());
                }
            }
            Err(error) => panic!("{error}"),
        }
    }
    match check(dir) {
        Ok(report) if !report.has_errors() => print!("{}", report.render_text()),
        Ok(report) => panic!(
            "{}\nThe schema registry in {} does not match the event contracts. \
             New versions: rerun with {WRITE_ENV}=1 and commit the files. \
             A changed published version: revert it and add a new version with an upcaster.",
            report.render_text(),
            dir.display()
        ),
        Err(error) => panic!("{error}"),
    }
}

/// One test that keeps a crate's committed schema registry honest:
/// `outbox_codegen::assert_registry_up_to_date!("schemas")`, with the path
/// relative to the crate's `Cargo.toml`. See [`assert_up_to_date`].
#[macro_export]
macro_rules! assert_registry_up_to_date {
    ($dir:expr) => {
        $crate::assert_up_to_date(
            &::std::path::Path::new(::core::env!("CARGO_MANIFEST_DIR")).join($dir),
        )
    };
}
