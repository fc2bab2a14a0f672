//! Fuzzing the edges where outside data enters: CloudEvents header values
//! and subject tokens, envelopes rebuilt from a message's attributes, the
//! payload decoded and upcast to the handler's version, and the schema
//! registry folder. Each target is a bolero harness: under `cargo test` it
//! replays its committed corpus (`tests/fuzz-corpus/<target>/`) and then a
//! bounded number of random inputs (`BOLERO_RANDOM_ITERATIONS`, bolero's
//! default otherwise); `cargo bolero test fuzz_edges::<target>` runs it
//! under a coverage-guided engine. The property everywhere: no panic, and
//! an error that names the problem for every input that is refused.

use std::path::Path;

use outbox_core::encoding::{decode_header_value, decode_token, encode_header_value, encode_token};
use outbox_core::{Envelope, OutboxEvent};
use outbox_tests::events::ParcelBooked;
use serde_json::value::RawValue;

/// Runs `check` on every file of the target's committed corpus.
fn replay_corpus(target: &str, check: impl Fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz-corpus")
        .join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {} is missing: {e}", dir.display()));
    let mut count = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        check(&std::fs::read(&path).unwrap());
        count += 1;
    }
    assert!(count > 0, "corpus {} is empty", dir.display());
}

fn header_values(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    if let Ok(decoded) = decode_header_value("ce-subject", &text) {
        let again = decode_header_value("ce-subject", &encode_header_value(&decoded))
            .expect("an encoded value decodes");
        assert_eq!(again, decoded, "encode after decode is reversible");
    } else if let Err(error) = decode_header_value("ce-subject", &text) {
        assert!(!error.to_string().is_empty());
    }
    if let Ok(decoded) = decode_token(&text) {
        assert_eq!(decode_token(&encode_token(&decoded)).unwrap(), decoded);
    }
    let encoded = encode_token(&text);
    assert!(
        encoded
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'%')),
        "a token holds no separator: {encoded:?}"
    );
    assert_eq!(decode_token(&encoded).unwrap(), text);
}

/// Attributes as `name=value` lines, then a blank line, then the payload.
fn envelope_and_payload(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    let (head, payload) = text.split_once("\n\n").unwrap_or((&text, ""));
    let attributes: Vec<(String, String)> = head
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let lookup = |name: &str| {
        attributes
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    match Envelope::from_cloudevents(lookup, payload.as_bytes()) {
        Ok(envelope) => {
            let _ = ParcelBooked::decode(envelope.schema_version, &envelope.payload);
        }
        Err(error) => assert!(!error.to_string().is_empty()),
    }
    // The payload alone at every version the contract knows of, and one it
    // does not.
    if let Ok(raw) = RawValue::from_string(payload.to_owned()) {
        for version in 0..=4 {
            if let Err(error) = ParcelBooked::decode(version, &raw) {
                assert!(!error.to_string().is_empty());
            }
        }
    }
}

/// `registry.json`, then a line `---`, then one schema file's text.
fn registry_folder(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    let (registry, schema) = text.split_once("\n---\n").unwrap_or((&text, "{}"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("registry.json"), registry.as_bytes()).unwrap();
    std::fs::create_dir_all(dir.path().join("parcel.booked")).unwrap();
    std::fs::write(dir.path().join("parcel.booked/v1.json"), schema.as_bytes()).unwrap();
    match outbox_codegen::load(dir.path()) {
        Ok(_) => {
            let _ = outbox_codegen::check_folder(dir.path());
        }
        Err(error) => assert!(!error.to_string().is_empty()),
    }
}

#[test]
fn fuzz_header_values() {
    replay_corpus("header_values", header_values);
    bolero::check!().for_each(header_values);
}

#[test]
fn fuzz_envelope_and_payload() {
    replay_corpus("envelope_and_payload", envelope_and_payload);
    bolero::check!().for_each(envelope_and_payload);
}

#[test]
fn fuzz_registry_folder() {
    replay_corpus("registry_folder", registry_folder);
    bolero::check!().for_each(registry_folder);
}
