//! The checks: the contracts in code against the committed folder (for CI),
//! and a folder on its own (for the CLI, which has no contracts linked).
//!
//! Rules, each a finding kind: a committed version is frozen; a contract in
//! code must be in the folder and a version in the folder must have a
//! contract, an upcaster that reads it, or a recorded retirement; versions
//! 1..=current have no holes; every version N > 1 has an upcaster from N-1
//! (unless N-1 is retired); two types may not claim one (event type,
//! version); manifest, AsyncAPI document and hashes match the schemas.

use std::collections::BTreeMap;

use outbox_core::{CompatibilityMode, ContractRegistry, RegistryError, RegistryErrors};
use serde_json::Value;

use crate::canonical::to_canonical_string;
use crate::compat::{self, Compatibility};
use crate::folder::LoadedFolder;
use crate::generate;
use crate::model::{ASYNCAPI_FILE, EventTypeModel, MANIFEST_FILE, RegistryModel, contract_hash};
use crate::report::{Finding, FindingKind, Report, Severity};

fn finding(
    severity: Severity,
    kind: FindingKind,
    event_type: &str,
    version: Option<u32>,
    path: Option<String>,
    message: impl Into<String>,
) -> Finding {
    Finding {
        severity,
        kind,
        event_type: event_type.to_owned(),
        version,
        path,
        message: message.into(),
    }
}

/// Checks the contracts linked into this binary against a committed folder.
pub(crate) fn check_code(
    registry: Result<&ContractRegistry, &RegistryErrors>,
    folder: &LoadedFolder,
) -> Report {
    let mut report = Report::new(format!("schema registry check of {}", folder.dir.display()));
    let registry = match registry {
        Ok(registry) => registry,
        Err(errors) => {
            for error in &errors.0 {
                report.push(duplicate_finding(error));
            }
            return report.sorted();
        }
    };
    let expected = generate::model_from_code(registry, Some(&folder.model));
    let committed = &folder.model;

    for contract in registry.contracts() {
        let event_type = contract.event_type;
        let version = contract.schema_version;
        let committed_type = committed.event_types.get(event_type);
        if let Some(reason) = committed_type.and_then(|t| t.retired.get(&version)) {
            report.push(finding(
                Severity::Error,
                FindingKind::RemovedWithoutRetirement,
                event_type,
                Some(version),
                None,
                format!(
                    "v{version} is retired in registry.json ({reason:?}) but {} still defines it; delete the struct or remove the retirement",
                    contract.rust_type
                ),
            ));
            continue;
        }
        let Some(published) = committed_type.and_then(|t| t.versions.get(&version)) else {
            report.push(finding(
                Severity::Error,
                FindingKind::MissingInRegistry,
                event_type,
                Some(version),
                None,
                format!(
                    "{} is in code but not in the registry folder; add it by running the registry test with OUTBOX_REGISTRY_WRITE=1 (or `write` from a binary that links the contracts) and commit the files",
                    contract.rust_type
                ),
            ));
            continue;
        };
        let generated = generate::contract_schema(contract);
        compare_published(
            &mut report,
            event_type,
            version,
            &published.schema,
            &generated,
            &{
                let current = registry.current(event_type).unwrap_or(contract);
                let next = expected.event_types[event_type].current_version() + 1;
                let current_type = current
                    .rust_type
                    .rsplit("::")
                    .next()
                    .unwrap_or(current.rust_type);
                format!(
                    "revert v{version} and make the change in a new version {next} with `upcast_from = {current_type}` (v{})",
                    current.schema_version
                )
            },
        );
    }

    for (event_type, committed_type) in &committed.event_types {
        let code_versions: Vec<_> = registry.versions(event_type).collect();
        if let Some(current) = code_versions.last()
            && current.aggregate_type != committed_type.aggregate_type
        {
            report.push(finding(
                Severity::Error,
                FindingKind::FrozenChanged,
                event_type,
                None,
                None,
                format!(
                    "aggregate type changed from {} to {} ({}); an event type belongs to one aggregate for good: keep `aggregate = \"{}\"` or announce a new event type",
                    committed_type.aggregate_type,
                    current.aggregate_type,
                    current.rust_type,
                    committed_type.aggregate_type
                ),
            ));
        }
        for version in committed_type.versions.keys() {
            if code_versions.iter().any(|c| c.schema_version == *version) {
                continue;
            }
            // A contract reads the versions from its READABLE_FROM up to its
            // own, not newer ones.
            let readable = code_versions
                .iter()
                .any(|c| c.readable_from <= *version && *version <= c.schema_version);
            if !readable {
                report.push(finding(
                    Severity::Error,
                    FindingKind::RemovedWithoutRetirement,
                    event_type,
                    Some(*version),
                    None,
                    format!(
                        "v{version} is in the registry but no contract or upcaster reads it; a published version may only go with a recorded retirement: `outbox-codegen retire <dir> {event_type} {version} --reason \"...\"`"
                    ),
                ));
            }
        }
    }

    check_model_rules(&mut report, &expected);
    // Stale generated files follow from the errors above and share their
    // remedy; report them only when nothing else is wrong.
    if !report.has_errors() {
        compare_schema_ids(&mut report, &expected, folder);
        compare_generated_files(&mut report, &expected, folder);
    }
    report.sorted()
}

/// Each schema file's `$id` must be the URI producers put in `dataschema`
/// for that version (`settings.schema_base`, or the `urn:outbox:schema:`
/// form), so a consumer can resolve what an event points at.
fn compare_schema_ids(report: &mut Report, model: &RegistryModel, folder: &LoadedFolder) {
    for ((event_type, version), found) in &folder.ids {
        let expected = model.settings.schema_id(event_type, *version);
        if found.as_deref() == Some(expected.as_str()) {
            continue;
        }
        report.push(finding(
            Severity::Error,
            FindingKind::SchemaIdMismatch,
            event_type,
            Some(*version),
            Some("/$id".to_owned()),
            format!(
                "the schema file's $id is {}, but events carry dataschema {expected:?}; regenerate the folder with OUTBOX_REGISTRY_WRITE=1 (or set settings.schema_base to the transport's dataschema_base)",
                found.as_deref().map_or_else(|| "missing".to_owned(), |id| format!("{id:?}"))
            ),
        ));
    }
}

/// Checks a folder on its own: chain, upcasters, hashes, manifest and
/// AsyncAPI consistency, stray files.
pub(crate) fn check_folder(folder: &LoadedFolder) -> Report {
    let mut report = Report::new(format!("schema registry check of {}", folder.dir.display()));
    for entry in &folder.manifest.event_types {
        for version in &entry.versions {
            if let Some(model) = folder
                .model
                .event_types
                .get(&entry.event_type)
                .and_then(|t| t.versions.get(&version.version))
            {
                let actual = contract_hash(&model.schema);
                if actual != version.sha256 {
                    report.push(finding(
                        Severity::Error,
                        FindingKind::HashMismatch,
                        &entry.event_type,
                        Some(version.version),
                        None,
                        format!(
                            "{} does not match the hash in registry.json (file {actual}, manifest {}); was it edited by hand?",
                            version.schema, version.sha256
                        ),
                    ));
                }
            }
        }
    }
    check_model_rules(&mut report, &folder.model);
    compare_schema_ids(&mut report, &folder.model, folder);
    compare_generated_files(&mut report, &folder.model, folder);
    report.sorted()
}

/// The model rules alone (chain, upcasters), for a model with no folder yet.
pub(crate) fn check_folder_model(model: &RegistryModel) -> Report {
    let mut report = Report::new("schema registry check of the contracts");
    check_model_rules(&mut report, model);
    report.sorted()
}

/// Compares a published schema with what the code (or a newer folder)
/// says now; pushes a frozen-version error or a docs warning.
pub(crate) fn compare_published(
    report: &mut Report,
    event_type: &str,
    version: u32,
    published: &Value,
    current: &Value,
    remedy: &str,
) {
    let published_contract = compat::strip_annotations(published);
    let current_contract = compat::strip_annotations(current);
    if published_contract != current_contract {
        let classification = compat::classify(published, current);
        let (path, what) = match classification.changes.first() {
            Some(first) => (first.path.clone(), classification.describe()),
            None => {
                let (pointer, before, after) =
                    compat::first_difference(&published_contract, &current_contract)
                        .unwrap_or_else(|| ("/".to_owned(), None, None));
                (pointer, format!("{} → {}", show(before), show(after)))
            }
        };
        report.push(finding(
            Severity::Error,
            FindingKind::FrozenChanged,
            event_type,
            Some(version),
            Some(path),
            format!(
                "the published schema changed ({what}; {}); a published version is frozen: {remedy}",
                classification.compatibility()
            ),
        ));
    } else if to_canonical_string(published) != to_canonical_string(current) {
        let pointer = compat::first_difference(published, current)
            .map(|(pointer, _, _)| pointer)
            .unwrap_or_else(|| "/".to_owned());
        report.push(finding(
            Severity::Warning,
            FindingKind::DocsChanged,
            event_type,
            Some(version),
            Some(pointer),
            "only documentation changed (descriptions, titles); not a contract change. Refresh the file with OUTBOX_REGISTRY_WRITE=1",
        ));
    }
}

fn show(value: Option<Value>) -> String {
    value.map_or_else(|| "(absent)".to_owned(), |v| v.to_string())
}

/// Chain holes, missing upcasters, and the compatibility class of each
/// consecutive pair.
fn check_model_rules(report: &mut Report, model: &RegistryModel) {
    for (event_type, entry) in &model.event_types {
        let current = entry.current_version();
        // Holes as ranges: a hand-edited version number like 4294967295
        // must give one finding, not billions.
        let mut expected_next = 1u32;
        let present: Vec<u32> = entry
            .versions
            .keys()
            .chain(entry.retired.keys())
            .copied()
            .collect::<std::collections::BTreeSet<u32>>()
            .into_iter()
            .collect();
        for version in present
            .iter()
            .copied()
            .chain(std::iter::once(current.saturating_add(1)))
        {
            if version > expected_next {
                let hole = if version - 1 == expected_next {
                    format!("v{expected_next} is")
                } else {
                    format!("v{expected_next}..=v{} are", version - 1)
                };
                report.push(finding(
                    Severity::Error,
                    FindingKind::ChainHole,
                    event_type,
                    Some(expected_next),
                    None,
                    format!(
                        "the version chain has a hole: {hole} neither in the registry nor retired (versions run 1..={current})"
                    ),
                ));
            }
            expected_next = version.saturating_add(1);
        }
        for (version, model_version) in &entry.versions {
            if *version <= 1 || entry.retired.contains_key(&(version - 1)) {
                continue;
            }
            let previous = version - 1;
            match (model_version.upcast_from, entry.versions.get(&previous)) {
                (None, _) => report.push(finding(
                    Severity::Error,
                    FindingKind::MissingUpcaster,
                    event_type,
                    Some(*version),
                    None,
                    format!(
                        "v{version} has no upcaster from v{previous}: add `upcast_from = <v{previous} struct>` or `upcast(from = {previous}, with = path::to::fn)` to the v{version} contract"
                    ),
                )),
                (Some(link), Some(previous_model)) => {
                    let classification = compat::classify(&previous_model.schema, &model_version.schema);
                    let class = classification.compatibility();
                    let verdict = if class == Compatibility::Full || class == Compatibility::Backward {
                        "no upcaster needed, one exists".to_owned()
                    } else {
                        format!(
                            "allowed because an upcaster exists ({} from v{})",
                            serde_json::to_value(link.kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
                            link.version
                        )
                    };
                    report.push(finding(
                        Severity::Note,
                        FindingKind::Compatibility,
                        event_type,
                        Some(*version),
                        None,
                        format!("v{previous} → v{version}: {class} ({}); {verdict}", classification.describe()),
                    ));
                }
                (Some(_), None) => {}
            }
        }
        for version in entry.versions.keys() {
            report
                .findings
                .extend(mode_findings(event_type, entry, *version));
        }
    }
}

/// Whether version `to` reads data of `from` through upcasters: every
/// version from `from + 1` to `to` has its schema and an upcaster from its
/// predecessor.
fn upcast_path(entry: &EventTypeModel, from: u32, to: u32) -> bool {
    (from + 1..=to).all(|v| {
        entry
            .versions
            .get(&v)
            .is_some_and(|m| m.upcast_from.is_some())
    })
}

/// The findings of version `version` against the event type's compatibility
/// mode: the previous version, or every earlier one for a transitive mode.
/// Backward is met by the schemas or by an upcast path; forward only by the
/// schemas (old readers have no upcaster for data newer than they are).
pub(crate) fn mode_findings(
    event_type: &str,
    entry: &EventTypeModel,
    version: u32,
) -> Vec<Finding> {
    let mode = entry.effective_mode();
    let Some(current) = entry.versions.get(&version) else {
        return Vec::new();
    };
    if mode == CompatibilityMode::None {
        return Vec::new();
    }
    let earlier: Vec<u32> = if mode.transitive() {
        entry.versions.range(..version).map(|(v, _)| *v).collect()
    } else {
        entry
            .versions
            .contains_key(&(version.wrapping_sub(1)))
            .then(|| version - 1)
            .into_iter()
            .collect()
    };
    let mut findings = Vec::new();
    for from in earlier {
        let classification = compat::classify(&entry.versions[&from].schema, &current.schema);
        // A version without its own upcaster is the missing-upcaster
        // finding already; here only a broken longer path counts.
        if mode.backward()
            && current.upcast_from.is_some()
            && !classification.compatibility().is_backward()
            && !upcast_path(entry, from, version)
        {
            let breaking: Vec<String> = classification
                .changes
                .iter()
                .filter(|c| !c.backward)
                .map(|c| format!("{} [{}]", c.description, c.rule))
                .collect();
            findings.push(finding(
                Severity::Error,
                FindingKind::CompatibilityMode,
                event_type,
                Some(version),
                classification.changes.iter().find(|c| !c.backward).map(|c| c.path.clone()),
                format!(
                    "compatibility mode {mode}: readers of v{version} cannot read v{from} data ({}) and no upcast path leads from v{from} to v{version}",
                    breaking.join("; ")
                ),
            ));
        }
        if mode.forward() && !classification.changes.iter().all(|c| c.forward) {
            let breaking: Vec<String> = classification
                .changes
                .iter()
                .filter(|c| !c.forward)
                .map(|c| format!("{} [{}]", c.description, c.rule))
                .collect();
            findings.push(finding(
                Severity::Error,
                FindingKind::CompatibilityMode,
                event_type,
                Some(version),
                classification.changes.iter().find(|c| !c.forward).map(|c| c.path.clone()),
                format!(
                    "compatibility mode {mode}: readers of v{from} cannot read v{version} data ({}); upcasters do not help old readers: make the change forward compatible, or declare another mode",
                    breaking.join("; ")
                ),
            ));
        }
    }
    findings
}

/// Manifest, AsyncAPI document and stray files against what `model` gives.
fn compare_generated_files(report: &mut Report, model: &RegistryModel, folder: &LoadedFolder) {
    let expected = model.files();
    for (file, kind) in [
        (MANIFEST_FILE, FindingKind::ManifestStale),
        (ASYNCAPI_FILE, FindingKind::AsyncApiStale),
    ] {
        let committed = folder.files.get(file);
        if committed.map(String::as_str) == expected.get(file).map(String::as_str) {
            continue;
        }
        let pointer = match (
            committed.and_then(|t| serde_json::from_str::<Value>(t).ok()),
            expected
                .get(file)
                .and_then(|t| serde_json::from_str::<Value>(t).ok()),
        ) {
            (Some(a), Some(b)) => compat::first_difference(&a, &b).map(|(p, _, _)| p),
            _ => None,
        };
        report.push(finding(
            Severity::Error,
            kind,
            file,
            None,
            pointer,
            format!(
                "{file} is not what the schemas produce; regenerate it with OUTBOX_REGISTRY_WRITE=1"
            ),
        ));
    }
    let listed: BTreeMap<&String, ()> = expected.keys().map(|k| (k, ())).collect();
    for file in folder.files.keys() {
        if !listed.contains_key(file) {
            report.push(finding(
                Severity::Error,
                FindingKind::UnlistedFile,
                file,
                None,
                None,
                "this file is in the registry folder but belongs to no version in registry.json; remove it or register its contract",
            ));
        }
    }
}

fn duplicate_finding(error: &RegistryError) -> Finding {
    match error {
        RegistryError::DuplicateContract { key, .. } => finding(
            Severity::Error,
            FindingKind::DuplicateContract,
            key.event_type,
            Some(key.schema_version),
            None,
            error.to_string(),
        ),
        RegistryError::ConflictingAggregate { event_type, .. } => finding(
            Severity::Error,
            FindingKind::DuplicateContract,
            event_type,
            None,
            None,
            error.to_string(),
        ),
    }
}
