//! The order service's write side: each command changes the business rows
//! and emits its event in the same transaction.

use anyhow::{Context, bail};
use outbox_core::{EmitOptions, EmitOutcome};
use outbox_postgres::Outbox;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use crate::contracts::{
    CancelReason, Money, OrderCancelled, OrderCreated, OrderLine, OrderShipped,
};

/// What placing an order did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// A new order and its `order.created` event.
    New(Uuid),
    /// The command was seen before (same command id): nothing changed.
    Repeated,
}

/// Commands on orders.
#[derive(Debug, Clone)]
pub struct OrderService {
    pool: PgPool,
    outbox: Outbox,
    orders: String,
}

impl OrderService {
    /// The service on `pool`, with its `orders` table next to the outbox in
    /// the outbox's schema.
    pub fn new(pool: PgPool, outbox: Outbox) -> OrderService {
        let orders = format!("{}.orders", outbox.schema().quoted());
        OrderService {
            pool,
            outbox,
            orders,
        }
    }

    /// Creates the `orders` table.
    pub async fn create_tables(&self) -> anyhow::Result<()> {
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {} (
                id uuid PRIMARY KEY,
                customer_email text NOT NULL,
                total_minor bigint NOT NULL CHECK (total_minor > 0),
                status text NOT NULL
            )",
            self.orders
        )))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Places an order: the row and `order.created` commit together. A
    /// repeated `command_id` (a client retry) changes nothing. An order
    /// whose total is not positive fails the table's check: the transaction
    /// rolls back and no event exists.
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
        let mut tx = self.pool.begin().await?;
        let outcome = self
            .outbox
            .emit_with(
                &mut tx,
                &event,
                EmitOptions {
                    idempotency_key: Some(command_id.to_owned()),
                    ..EmitOptions::default()
                },
            )
            .await?;
        if let EmitOutcome::Duplicate { .. } = outcome {
            tx.rollback().await?;
            return Ok(Placed::Repeated);
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (id, customer_email, total_minor, status) VALUES ($1, $2, $3, 'created')",
            self.orders
        )))
        .bind(order_id)
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
        let mut tx = self.pool.begin().await?;
        self.set_status(&mut tx, order_id, "shipped").await?;
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
        let mut tx = self.pool.begin().await?;
        self.set_status(&mut tx, order_id, "cancelled").await?;
        let event = OrderCancelled {
            order_id,
            reason,
            note: None,
        };
        self.outbox.emit(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn set_status(
        &self,
        tx: &mut sqlx::PgConnection,
        order_id: Uuid,
        status: &str,
    ) -> anyhow::Result<()> {
        let updated = sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET status = $2 WHERE id = $1 AND status = 'created'",
            self.orders
        )))
        .bind(order_id)
        .bind(status)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if updated != 1 {
            bail!("order {order_id} is not open");
        }
        Ok(())
    }
}
