//! `parcel.sent` v1 and v2 (typed upcast): the contracts that the fixture
//! folder `tests/fixtures/registry/parcel` was generated from. Changing them
//! changes their schemas, and the tests comparing them with that folder fail.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `parcel.sent` v1.
#[derive(Serialize, Deserialize, JsonSchema, outbox_core::OutboxEvent)]
#[outbox(event_type = "parcel.sent", aggregate = "parcel", version = 1)]
pub(crate) struct ParcelSentV1 {
    /// The parcel.
    #[outbox(aggregate_id)]
    pub(crate) parcel_id: String,
    /// Who receives it; personal data.
    #[outbox(redact)]
    pub(crate) recipient: String,
    /// Weight in grams.
    pub(crate) weight_grams: u32,
}

/// `parcel.sent` v2: the carrier is known.
#[derive(Serialize, Deserialize, JsonSchema, outbox_core::OutboxEvent)]
#[outbox(
    event_type = "parcel.sent",
    aggregate = "parcel",
    version = 2,
    upcast_from = ParcelSentV1
)]
pub(crate) struct ParcelSent {
    /// The parcel.
    #[outbox(aggregate_id)]
    pub(crate) parcel_id: String,
    /// Who receives it; personal data.
    #[outbox(redact)]
    pub(crate) recipient: String,
    /// Weight in grams.
    pub(crate) weight_grams: u32,
    /// The carrier's name.
    pub(crate) carrier: String,
}

impl From<ParcelSentV1> for ParcelSent {
    fn from(v1: ParcelSentV1) -> Self {
        ParcelSent {
            parcel_id: v1.parcel_id,
            recipient: v1.recipient,
            weight_grams: v1.weight_grams,
            carrier: "unknown".to_owned(),
        }
    }
}
