//! A small contract for tests that need many events, and helpers to emit
//! them.

use outbox_core::{EventDraft, OutboxEvent};
use outbox_postgres::Outbox;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// A counter tick on an aggregate (`counter/<id>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "counter.ticked", aggregate = "counter", version = 1)]
pub struct Ticked {
    /// The counter.
    #[outbox(aggregate_id)]
    pub counter: String,
    /// Which tick this was, as the producer counted.
    pub tick: u64,
    /// Filler to give the payload a realistic size.
    pub note: String,
}

impl Ticked {
    /// Tick `tick` of counter `counter`.
    pub fn new(counter: impl Into<String>, tick: u64) -> Ticked {
        Ticked {
            counter: counter.into(),
            tick,
            note: "a payload of about one hundred bytes, like a small domain event".into(),
        }
    }
}

/// Emits `per_counter` ticks on each of `counters` counters (named
/// `c0`, `c1`, ...), interleaved, in transactions of `per_transaction`.
/// Returns the number emitted.
pub async fn emit_ticks(
    pool: &PgPool,
    outbox: &Outbox,
    counters: usize,
    per_counter: u64,
    per_transaction: usize,
) -> usize {
    let mut drafts = Vec::new();
    for tick in 1..=per_counter {
        for counter in 0..counters {
            drafts.push(
                EventDraft::new(&Ticked::new(format!("c{counter}"), tick)).expect("serializable"),
            );
        }
    }
    let total = drafts.len();
    let mut rest = drafts.into_iter().peekable();
    while rest.peek().is_some() {
        let chunk: Vec<EventDraft> = rest.by_ref().take(per_transaction).collect();
        let mut tx = pool.begin().await.expect("begin");
        outbox.emit_drafts(&mut tx, chunk).await.expect("emit");
        tx.commit().await.expect("commit");
    }
    total
}

// A contract with three versions: v1 exists only as JSON (its struct is
// gone; a JSON upcaster turns it into v2), v2 → v3 is typed.

/// v1 → v2: grams become kilograms.
pub fn parcel_v1_to_v2(
    mut value: serde_json::Value,
) -> Result<serde_json::Value, outbox_core::UpcastError> {
    let object = value.as_object_mut().ok_or_else(|| {
        outbox_core::UpcastError::new("a v1 parcel.booked payload must be an object")
    })?;
    let grams = object
        .remove("weight_grams")
        .and_then(|w| w.as_f64())
        .ok_or_else(|| {
            outbox_core::UpcastError::new("v1 parcel.booked has no numeric weight_grams")
        })?;
    object.insert("weight_kg".into(), serde_json::json!(grams / 1000.0));
    Ok(value)
}

/// `parcel.booked` v2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "parcel.booked",
    aggregate = "parcel",
    version = 2,
    upcast(from = 1, with = parcel_v1_to_v2)
)]
pub struct ParcelBookedV2 {
    /// The parcel.
    #[outbox(aggregate_id)]
    pub parcel_id: String,
    /// Its weight.
    pub weight_kg: f64,
}

/// `parcel.booked` v3 (current): adds the carrier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "parcel.booked",
    aggregate = "parcel",
    version = 3,
    upcast_from = ParcelBookedV2
)]
pub struct ParcelBooked {
    /// The parcel.
    #[outbox(aggregate_id)]
    pub parcel_id: String,
    /// Its weight.
    pub weight_kg: f64,
    /// Who carries it (`unassigned` for parcels booked before v3).
    pub carrier: String,
}

impl From<ParcelBookedV2> for ParcelBooked {
    fn from(v2: ParcelBookedV2) -> Self {
        ParcelBooked {
            parcel_id: v2.parcel_id,
            weight_kg: v2.weight_kg,
            carrier: "unassigned".into(),
        }
    }
}

/// A move of a game piece whose row carries its own version
/// (`#[outbox(aggregate_version)]`), for tests of carried versions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "piece.moved", aggregate = "piece", version = 1)]
pub struct PieceMoved {
    /// The piece.
    #[outbox(aggregate_id)]
    pub piece: String,
    /// The piece row's version after the move.
    #[outbox(aggregate_version)]
    pub version: i64,
    /// Where it went.
    pub square: String,
}

impl PieceMoved {
    /// Move number `version` of `piece`.
    pub fn new(piece: impl Into<String>, version: i64) -> PieceMoved {
        PieceMoved {
            piece: piece.into(),
            version,
            square: format!("square-{version}"),
        }
    }
}

/// A card charge whose card number is personal data (`#[outbox(redact)]`),
/// for tests that a secret never shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "card.charged", aggregate = "card", version = 1)]
pub struct CardCharged {
    /// The charge.
    #[outbox(aggregate_id)]
    pub charge_id: String,
    /// The card number.
    #[outbox(redact)]
    pub card_number: u64,
    /// The amount in cents.
    pub amount_cents: i64,
}
