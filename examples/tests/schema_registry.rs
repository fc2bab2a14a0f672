//! The examples' committed schema registry (`schemas/` at the repository
//! root) matches their event contracts. Changing a published contract makes
//! this test fail with the event, version and field; new versions are added
//! with `OUTBOX_REGISTRY_WRITE=1 cargo test -p outbox-examples --test schema_registry`.

// Link the contracts into this test binary.
#[allow(unused_extern_crates)]
extern crate outbox_examples;

#[test]
fn schema_registry_is_up_to_date() {
    outbox_codegen::assert_registry_up_to_date!("../schemas");
}
