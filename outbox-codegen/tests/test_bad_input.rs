//! Bad input never panics and never writes: a missing folder, a folder
//! without `registry.json`, a malformed or hand-edited `registry.json`, a
//! schema file that is missing, not UTF-8, not JSON or not a JSON Schema
//! (`tests/fixtures/bad/<case>`, each a consistent folder with one edit)
//! give an error naming the file (and the JSON pointer for schemas) from
//! every entry point: `load`, `check_folder`, `diff` on either side,
//! `check_with`, `write_with` (safe and forced) and `retire`.

mod common;
#[path = "common/parcel.rs"]
mod parcel;

use std::path::Path;

use outbox_codegen::{
    CodegenError, LoadError, WriteMode, check_folder, check_with, diff, load, retire, write_with,
};
use outbox_core::{ContractRegistry, OutboxEvent};

use common::{copy_fixture, fixture, snapshot};

/// Which `LoadError` a case gives.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    MissingManifest,
    Io,
    Json,
    Manifest,
    InvalidSchema,
}

fn kind(error: &LoadError) -> Kind {
    match error {
        LoadError::MissingFolder(_) => panic!("unexpected {error:?}"),
        LoadError::MissingManifest(_) => Kind::MissingManifest,
        LoadError::Io { .. } => Kind::Io,
        LoadError::Json { .. } => Kind::Json,
        LoadError::Manifest { .. } => Kind::Manifest,
        LoadError::InvalidSchema { .. } => Kind::InvalidSchema,
    }
}

/// Case, kind, the file named, and the message after the file's path (for
/// `Io`, the message is `cannot read <file>: <rest>`).
const CASES: &[(&str, Kind, &str, &str)] = &[
    (
        "no_manifest",
        Kind::MissingManifest,
        "registry.json",
        " is missing: the folder is not a schema registry",
    ),
    (
        "manifest_not_json",
        Kind::Json,
        "registry.json",
        " is not valid JSON: EOF while parsing a value at line 12 column 1",
    ),
    (
        "manifest_not_an_object",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: invalid length 0, expected struct Manifest with 3 \
         elements at line 1 column 2",
    ),
    (
        "manifest_unknown_field",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: unknown field `owner`, expected one of `format`, \
         `settings`, `event_types` at line 19 column 9",
    ),
    (
        "manifest_misspelled_key",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: unknown field `sha`, expected one of `version`, \
         `schema`, `sha256`, `redacted_fields`, `upcast_from`, `compatibility` at line 13 column \
         15",
    ),
    (
        "manifest_missing_field",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: missing field `sha256` at line 14 column 9",
    ),
    (
        "manifest_wrong_type",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: invalid type: string \"one\", expected u32 at line 14 \
         column 26",
    ),
    (
        "manifest_wrong_format",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: format is \"outbox-schema-registry/2\", expected \
         \"outbox-schema-registry/1\"",
    ),
    (
        "manifest_version_zero",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: parcel.sent lists version 0; versions start at 1",
    ),
    (
        "manifest_wrong_schema_path",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: parcel.sent v1 points at \
         \"schemas/parcel.sent/v1.json\"; schema files live at \"parcel.sent/v1.json\"",
    ),
    (
        "manifest_wrong_upcast_link",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: parcel.sent v2 has an upcaster from v5; the upcaster \
         into v2 reads v1",
    ),
    (
        "manifest_version_twice",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: parcel.sent lists v1 twice",
    ),
    (
        "manifest_event_type_twice",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: event type parcel.sent is listed twice",
    ),
    (
        "manifest_retired_without_reason",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: parcel.sent v2 is retired without a reason; record \
         why it could go",
    ),
    (
        "manifest_retired_version_zero",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: parcel.sent retires version 0; versions start at 1",
    ),
    (
        "manifest_listed_and_retired",
        Kind::Manifest,
        "registry.json",
        " is not a valid registry manifest: parcel.sent v1 is both listed and retired",
    ),
    (
        "schema_missing",
        Kind::Io,
        "parcel.sent/v1.json",
        "listed in registry.json but missing",
    ),
    (
        "schema_not_utf8",
        Kind::Io,
        "parcel.sent/v1.json",
        "stream did not contain valid UTF-8",
    ),
    (
        "schema_not_json",
        Kind::Json,
        "parcel.sent/v1.json",
        " is not valid JSON: trailing comma at line 27 column 1",
    ),
    (
        "schema_not_an_object",
        Kind::InvalidSchema,
        "parcel.sent/v1.json",
        " is not a valid JSON Schema at /: a registry schema must be a JSON object",
    ),
    (
        "schema_bad_type",
        Kind::InvalidSchema,
        "parcel.sent/v1.json",
        " is not a valid JSON Schema at /properties/weight_grams/type: `type` must be one of \
         [\"array\", \"boolean\", \"integer\", \"null\", \"number\", \"object\", \"string\"] or a \
         non-empty array of them, found \"int\"",
    ),
    (
        "schema_bad_ref",
        Kind::InvalidSchema,
        "parcel.sent/v1.json",
        " is not a valid JSON Schema at /properties/weight_grams/$ref: `$ref` \"#/$defs/Grams\" \
         does not resolve inside the file",
    ),
    (
        "schema_required_not_array",
        Kind::InvalidSchema,
        "parcel.sent/v1.json",
        " is not a valid JSON Schema at /required: `required` must be an array of property names",
    ),
];

fn expected_message(dir: &Path, kind: Kind, file: &str, rest: &str) -> String {
    let path = dir.join(file);
    match kind {
        Kind::Io => format!("cannot read {}: {rest}", path.display()),
        _ => format!("{}{rest}", path.display()),
    }
}

fn contracts() -> ContractRegistry {
    ContractRegistry::from_contracts([
        parcel::ParcelSentV1::contract(),
        parcel::ParcelSent::contract(),
    ])
    .unwrap()
}

#[test]
fn every_bad_fixture_is_listed() {
    let mut on_disk: Vec<String> = std::fs::read_dir(fixture("bad"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = CASES.iter().map(|c| c.0.to_owned()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}

#[test]
fn loading_names_the_file_and_what_is_wrong() {
    for (case, expected_kind, file, rest) in CASES {
        let dir = fixture(&format!("bad/{case}"));
        let error = load(&dir).unwrap_err();
        assert_eq!(kind(&error), *expected_kind, "{case}: {error}");
        assert_eq!(
            error.to_string(),
            expected_message(&dir, *expected_kind, file, rest),
            "{case}"
        );
    }
}

#[test]
fn every_entry_point_reports_the_same_error_and_writes_nothing() {
    let good = fixture("registry/parcel");
    let registry = contracts();
    for (case, expected_kind, file, rest) in CASES {
        let (_temp, dir) = copy_fixture(&format!("bad/{case}"));
        let before = snapshot(&dir);
        let message = expected_message(&dir, *expected_kind, file, rest);
        let errors: Vec<(&str, String)> = vec![
            ("check_folder", check_folder(&dir).unwrap_err().to_string()),
            ("diff old", diff(&dir, &good).unwrap_err().to_string()),
            ("diff new", diff(&good, &dir).unwrap_err().to_string()),
            (
                "check_with",
                check_with(&registry, &dir).unwrap_err().to_string(),
            ),
            (
                "write_with",
                write_with(&registry, &dir, WriteMode::Safe)
                    .unwrap_err()
                    .to_string(),
            ),
            (
                "write_with force",
                write_with(&registry, &dir, WriteMode::Force)
                    .unwrap_err()
                    .to_string(),
            ),
            (
                "retire",
                retire(&dir, "parcel.sent", 1, "gone")
                    .unwrap_err()
                    .to_string(),
            ),
        ];
        for (entry, error) in errors {
            assert_eq!(error, message, "{case} via {entry}");
        }
        assert_eq!(snapshot(&dir), before, "{case} was modified");
    }
}

#[test]
fn load_errors_keep_their_details() {
    let dir = fixture("bad/schema_bad_type");
    match load(&dir).unwrap_err() {
        LoadError::InvalidSchema {
            path,
            pointer,
            reason,
        } => {
            assert_eq!(path, dir.join("parcel.sent/v1.json"));
            assert_eq!(pointer, "/properties/weight_grams/type");
            assert!(reason.contains("found \"int\""), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let dir = fixture("bad/manifest_not_json");
    match load(&dir).unwrap_err() {
        LoadError::Json { path, source } => {
            assert_eq!(path, dir.join("registry.json"));
            assert!(source.is_eof());
        }
        other => panic!("{other:?}"),
    }
    let dir = fixture("bad/schema_missing");
    match load(&dir).unwrap_err() {
        LoadError::Io { path, source } => {
            assert_eq!(path, dir.join("parcel.sent/v1.json"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_missing_folder_is_named_with_how_to_create_it() {
    let temp = tempfile::tempdir().unwrap();
    let missing = temp.path().join("schemas");
    let message = format!(
        "registry folder {} does not exist (generate it by running the registry test with \
         OUTBOX_REGISTRY_WRITE=1)",
        missing.display()
    );
    let error = load(&missing).unwrap_err();
    assert!(matches!(error, LoadError::MissingFolder(ref p) if *p == missing));
    assert_eq!(error.to_string(), message);
    let good = fixture("registry/parcel");
    assert_eq!(check_folder(&missing).unwrap_err().to_string(), message);
    assert_eq!(diff(&missing, &good).unwrap_err().to_string(), message);
    assert_eq!(diff(&good, &missing).unwrap_err().to_string(), message);
    let error = check_with(&contracts(), &missing).unwrap_err();
    assert!(matches!(
        error,
        CodegenError::Load(LoadError::MissingFolder(_))
    ));
    assert_eq!(error.to_string(), message);
    assert_eq!(
        retire(&missing, "parcel.sent", 1, "gone")
            .unwrap_err()
            .to_string(),
        message
    );
    assert!(!missing.exists());
    // A path that is a file is not a folder either.
    let file = temp.path().join("registry.json");
    std::fs::write(&file, "{}").unwrap();
    assert!(matches!(
        load(&file).unwrap_err(),
        LoadError::MissingFolder(_)
    ));
}
