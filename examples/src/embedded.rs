//! The order service on one SQLite file, no server and no broker: the same
//! commands as [`crate::orders`] (the business row and the event in one
//! transaction) and the same two consumers as [`crate::projections`]
//! (billing, the order-status projection under strict ordering), written
//! for `&mut SqliteConnection`. The relay hands events to the consumers
//! through the in-process bus, which acknowledges a publish only after
//! every consumer committed it.

use std::time::Duration;

use anyhow::{Context, bail};
use outbox_core::consumer::{ConsumerBuilder, EventMeta, HandlerError, Ordering, Received};
use outbox_core::{EmitOptions, EmitOutcome};
use outbox_sqlite::SqliteOutbox;
use sqlx::{Connection, SqliteConnection, SqlitePool};
use uuid::Uuid;

use crate::contracts::{
    CancelReason, Money, OrderCancelled, OrderCreated, OrderLine, OrderShipped,
};
use crate::orders::Placed;

/// The business tables and the consumers' tables, next to the outbox's.
const TABLES: &str = "
CREATE TABLE IF NOT EXISTS orders (
    id             TEXT    PRIMARY KEY,
    customer_email TEXT    NOT NULL,
    total_minor    INTEGER NOT NULL CHECK (total_minor > 0),
    status         TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS invoices (
    order_id     TEXT    PRIMARY KEY,
    amount_minor INTEGER NOT NULL,
    currency     TEXT    NOT NULL,
    -- sent to the payment provider as its Idempotency-Key
    provider_key TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS order_status (
    order_id TEXT    PRIMARY KEY,
    status   TEXT    NOT NULL,
    version  INTEGER NOT NULL,
    trace_id TEXT
);";

/// Commands on orders, on a SQLite file.
#[derive(Debug, Clone)]
pub struct EmbeddedOrders {
    pool: SqlitePool,
    outbox: SqliteOutbox,
}

impl EmbeddedOrders {
    /// The service on `pool` (migrated with `outbox_sqlite::migrate`).
    pub fn new(pool: SqlitePool) -> EmbeddedOrders {
        EmbeddedOrders {
            pool,
            outbox: SqliteOutbox::new(),
        }
    }

    /// Creates the orders table and the consumers' tables.
    pub async fn create_tables(&self) -> anyhow::Result<()> {
        sqlx::raw_sql(TABLES).execute(&self.pool).await?;
        Ok(())
    }

    /// Places an order: the row and `order.created` commit together; a
    /// repeated `command_id` changes nothing; a total that is not positive
    /// fails the table's check and rolls both back.
    pub async fn place(
        &self,
        command_id: &str,
        customer_email: &str,
        lines: Vec<OrderLine>,
    ) -> anyhow::Result<Placed> {
        let order_id = Uuid::now_v7();
        let total: i64 = lines
            .iter()
            .map(|l| l.unit_price.amount_minor * i64::from(l.quantity))
            .sum();
        let event = OrderCreated {
            order_id,
            customer_email: customer_email.to_owned(),
            lines,
            total: Money {
                amount_minor: total,
                currency: "EUR".into(),
            },
        };
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let options = EmitOptions {
            idempotency_key: Some(command_id.to_owned()),
            ..EmitOptions::default()
        };
        if let EmitOutcome::Duplicate { .. } =
            self.outbox.emit_with(&mut tx, &event, options).await?
        {
            tx.rollback().await?;
            return Ok(Placed::Repeated);
        }
        sqlx::query(
            "INSERT INTO orders (id, customer_email, total_minor, status) VALUES (?1, ?2, ?3, 'created')",
        )
        .bind(order_id.to_string())
        .bind(customer_email)
        .bind(total)
        .execute(&mut *tx)
        .await
        .context("inserting the order")?;
        tx.commit().await?;
        Ok(Placed::New(order_id))
    }

    /// Ships an order.
    pub async fn ship(&self, order_id: Uuid, carrier: &str) -> anyhow::Result<()> {
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        set_order_status(&mut tx, order_id, "shipped").await?;
        let event = OrderShipped {
            order_id,
            carrier: carrier.to_owned(),
            tracking_number: Some(format!("TRK-{}", &order_id.simple().to_string()[..8])),
            shipped_at: chrono::Utc::now(),
        };
        self.outbox.emit(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Cancels an order.
    pub async fn cancel(&self, order_id: Uuid, reason: CancelReason) -> anyhow::Result<()> {
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        set_order_status(&mut tx, order_id, "cancelled").await?;
        let event = OrderCancelled {
            order_id,
            reason,
            note: None,
        };
        self.outbox.emit(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(())
    }
}

async fn set_order_status(
    tx: &mut SqliteConnection,
    order_id: Uuid,
    status: &str,
) -> anyhow::Result<()> {
    let updated = sqlx::query("UPDATE orders SET status = ?2 WHERE id = ?1 AND status = 'created'")
        .bind(order_id.to_string())
        .bind(status)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if updated != 1 {
        bail!("order {order_id} is not open");
    }
    Ok(())
}

/// Billing: an invoice per `order.created`, with the idempotency key a
/// payment provider would get.
pub fn billing() -> ConsumerBuilder<SqliteConnection> {
    ConsumerBuilder::for_connection("billing").on_fn::<OrderCreated, _>(
        |order: Received<OrderCreated>, tx| {
            Box::pin(async move {
                sqlx::query(
                    "INSERT INTO invoices (order_id, amount_minor, currency, provider_key)
                     VALUES (?1, ?2, ?3, ?4)",
                )
                .bind(order.event.order_id.to_string())
                .bind(order.event.total.amount_minor)
                .bind(&order.event.total.currency)
                .bind(order.meta.idempotency_key().to_string())
                .execute(&mut *tx)
                .await?;
                Ok::<(), HandlerError>(())
            })
        },
    )
}

/// The order-status projection: created → shipped | cancelled, applied in
/// version order per order.
pub fn order_status() -> ConsumerBuilder<SqliteConnection> {
    ConsumerBuilder::for_connection("order-status")
        .ordering(Ordering::Strict {
            park_timeout: Duration::from_secs(60),
        })
        .on_fn::<OrderCreated, _>(|e: Received<OrderCreated>, tx| {
            Box::pin(async move { set_status(e.event.order_id, "created", &e.meta, tx).await })
        })
        .on_fn::<OrderShipped, _>(|e: Received<OrderShipped>, tx| {
            Box::pin(async move { set_status(e.event.order_id, "shipped", &e.meta, tx).await })
        })
        .on_fn::<OrderCancelled, _>(|e: Received<OrderCancelled>, tx| {
            Box::pin(async move { set_status(e.event.order_id, "cancelled", &e.meta, tx).await })
        })
}

async fn set_status(
    order_id: Uuid,
    status: &str,
    meta: &EventMeta,
    tx: &mut SqliteConnection,
) -> Result<(), HandlerError> {
    let trace_id = meta
        .traceparent
        .as_deref()
        .and_then(|t| t.parse::<outbox_core::trace::TraceParent>().ok())
        .map(|t| t.trace_id_hex());
    sqlx::query(
        "INSERT INTO order_status (order_id, status, version, trace_id) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (order_id) DO UPDATE SET status = excluded.status, version = excluded.version",
    )
    .bind(order_id.to_string())
    .bind(status)
    .bind(meta.aggregate_version)
    .bind(trace_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
