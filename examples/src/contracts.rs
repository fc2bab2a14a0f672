//! The order service's event contracts, with two schema evolutions:
//! `order.created` went from v1 to v2 by a typed upcast (both structs still
//! exist), `order.cancelled` went from v1 to v2 by a JSON upcast (the v1
//! struct was deleted).

use chrono::{DateTime, Utc};
use outbox_core::{OutboxEvent, UpcastError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

/// v1 of `order.created`: a single total in cents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 1)]
pub struct OrderCreatedV1 {
    /// The order.
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    /// Who ordered; personal data.
    #[outbox(redact)]
    pub customer_email: String,
    /// The order total in euro cents.
    pub total_cents: i64,
}

/// A money amount.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Money {
    /// Minor units (cents).
    pub amount_minor: i64,
    /// ISO 4217 currency code.
    pub currency: String,
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrderLine {
    /// The product's SKU.
    pub sku: String,
    /// How many.
    pub quantity: u32,
    /// Price of one unit.
    pub unit_price: Money,
}

/// v2 of `order.created`: lines and an explicit currency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "order.created",
    aggregate = "order",
    version = 2,
    upcast_from = OrderCreatedV1
)]
pub struct OrderCreated {
    /// The order.
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    /// Who ordered; personal data.
    #[outbox(redact)]
    pub customer_email: String,
    /// The ordered lines (empty for orders upcast from v1).
    pub lines: Vec<OrderLine>,
    /// The order total.
    pub total: Money,
}

impl From<OrderCreatedV1> for OrderCreated {
    fn from(v1: OrderCreatedV1) -> Self {
        OrderCreated {
            order_id: v1.order_id,
            customer_email: v1.customer_email,
            lines: Vec::new(),
            total: Money {
                amount_minor: v1.total_cents,
                currency: "EUR".to_owned(),
            },
        }
    }
}

/// `order.shipped` v1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.shipped", aggregate = "order", version = 1)]
pub struct OrderShipped {
    /// The order.
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    /// The carrier's name.
    pub carrier: String,
    /// The carrier's tracking number, when known.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tracking_number: Option<String>,
    /// When the parcel left.
    pub shipped_at: DateTime<Utc>,
}

/// Why an order was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancelReason {
    /// The customer asked for it.
    CustomerRequest,
    /// Payment did not go through.
    PaymentFailed,
    /// Nothing left to ship.
    OutOfStock,
    /// Anything else (see the note).
    Other,
}

/// `order.cancelled` v2. Version 1 (`{"order_id", "reason": "<free text>"}`)
/// no longer has a struct; [`cancelled_v1_to_v2`] reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "order.cancelled",
    aggregate = "order",
    version = 2,
    upcast(from = 1, with = cancelled_v1_to_v2)
)]
pub struct OrderCancelled {
    /// The order.
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    /// Why.
    pub reason: CancelReason,
    /// Free text from v1, or extra detail.
    pub note: Option<String>,
}

/// `order.cancelled` v1 → v2: the free-text reason becomes `other` plus a note.
pub fn cancelled_v1_to_v2(mut v1: Value) -> Result<Value, UpcastError> {
    let object = v1
        .as_object_mut()
        .ok_or_else(|| UpcastError::new("order.cancelled v1 payload is not an object"))?;
    let reason = object
        .remove("reason")
        .ok_or_else(|| UpcastError::new("order.cancelled v1 payload has no `reason`"))?;
    object.insert("reason".to_owned(), json!("other"));
    object.insert("note".to_owned(), reason);
    Ok(v1)
}

/// `payment.captured` v1, of the payment aggregate; the order's version lives
/// in the business row, so the payment row's own version is carried here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[serde(rename_all = "camelCase")]
#[outbox(event_type = "payment.captured", aggregate = "payment", version = 1)]
pub struct PaymentCaptured {
    /// The payment.
    #[outbox(aggregate_id)]
    pub payment_id: Uuid,
    /// The payment row's version after the capture.
    #[outbox(aggregate_version)]
    pub payment_version: i64,
    /// The order paid for.
    pub order_id: Uuid,
    /// The amount captured.
    pub amount: Money,
    /// The last four card digits; personal data.
    #[outbox(redact)]
    pub card_last4: String,
}
