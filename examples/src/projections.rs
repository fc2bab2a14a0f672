//! The consumers of the example: billing (one invoice per created order)
//! and the order-status projection (a state machine that needs every
//! version in sequence, so it uses strict ordering).

use outbox_postgres::PgConsumerBuilder;
use outbox_postgres::prelude::*;
use std::time::Duration;

use outbox_core::consumer::{ConsumerBuilder, HandlerError, Ordering, Received};
use sqlx::AssertSqlSafe;

use crate::contracts::{OrderCancelled, OrderCreated, OrderShipped};

/// SQL creating the consumers' tables in `schema` (quoted).
pub fn create_tables_sql(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {schema}.invoices (
            order_id uuid PRIMARY KEY,
            amount_minor bigint NOT NULL,
            currency text NOT NULL,
            -- sent to the payment provider as its Idempotency-Key
            provider_key uuid NOT NULL
        );
        CREATE TABLE IF NOT EXISTS {schema}.order_status (
            order_id uuid PRIMARY KEY,
            status text NOT NULL,
            version bigint NOT NULL,
            trace_id text
        );"
    )
}

/// Billing: an invoice per `order.created`, with the idempotency key a
/// payment provider would get.
pub fn billing(schema: &str) -> PgConsumerBuilder {
    let sql = format!(
        "INSERT INTO {schema}.invoices (order_id, amount_minor, currency, provider_key) VALUES ($1, $2, $3, $4)"
    );
    ConsumerBuilder::new("billing").on_fn::<OrderCreated, _>(
        move |order: Received<OrderCreated>, tx| {
            let sql = sql.clone();
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(order.event.order_id)
                    .bind(order.event.total.amount_minor)
                    .bind(&order.event.total.currency)
                    .bind(order.meta.idempotency_key())
                    .execute(&mut *tx)
                    .await?;
                Ok::<(), HandlerError>(())
            })
        },
    )
}

/// The order-status projection: created → shipped | cancelled, applied in
/// version order per order.
pub fn order_status(schema: &str) -> PgConsumerBuilder {
    let upsert = format!(
        "INSERT INTO {schema}.order_status (order_id, status, version, trace_id)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (order_id) DO UPDATE SET status = EXCLUDED.status, version = EXCLUDED.version"
    );
    let (created, shipped, cancelled) = (upsert.clone(), upsert.clone(), upsert);
    ConsumerBuilder::new("order-status")
        .ordering(Ordering::Strict {
            park_timeout: Duration::from_secs(60),
        })
        .on_fn::<OrderCreated, _>(move |e: Received<OrderCreated>, tx| {
            let sql = created.clone();
            Box::pin(
                async move { set_status(&sql, e.event.order_id, "created", &e.meta, tx).await },
            )
        })
        .on_fn::<OrderShipped, _>(move |e: Received<OrderShipped>, tx| {
            let sql = shipped.clone();
            Box::pin(
                async move { set_status(&sql, e.event.order_id, "shipped", &e.meta, tx).await },
            )
        })
        .on_fn::<OrderCancelled, _>(move |e: Received<OrderCancelled>, tx| {
            let sql = cancelled.clone();
            Box::pin(
                async move { set_status(&sql, e.event.order_id, "cancelled", &e.meta, tx).await },
            )
        })
}

async fn set_status(
    sql: &str,
    order_id: uuid::Uuid,
    status: &str,
    meta: &outbox_core::consumer::EventMeta,
    tx: &mut sqlx::PgConnection,
) -> Result<(), HandlerError> {
    let trace_id = meta
        .traceparent
        .as_deref()
        .and_then(|t| t.parse::<outbox_core::trace::TraceParent>().ok())
        .map(|t| t.trace_id_hex());
    sqlx::query(AssertSqlSafe(sql.to_owned()))
        .bind(order_id)
        .bind(status)
        .bind(meta.aggregate_version)
        .bind(trace_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}
