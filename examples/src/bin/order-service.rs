//! The example order service, end to end on real PostgreSQL and a real
//! broker (NATS JetStream by default; `OUTBOX_BROKER=kafka` or
//! `OUTBOX_BROKER=rabbitmq`, see `outbox_examples::brokers`): commands write orders and emit events in one transaction; a
//! relay publishes them; two consumers (billing, order status) apply them
//! once each. Checks the result and exits non-zero when anything is off.
//!
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`)
//! and the broker's URL. Uses the schema `outbox_demo` and the broker's
//! demo stream, topics or exchange and queues, recreated on each run.
//! Serves Prometheus metrics at `http://METRICS_ADDR/metrics` (default
//! `127.0.0.1:0`, any free port; the address is printed) and scrapes itself
//! at the end to show the figures an operator's dashboard reads.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use outbox_core::Envelope;
use outbox_core::trace::{self, TraceParent};
use outbox_examples::brokers::{self, BrokerKind};
use outbox_examples::contracts::{CancelReason, Money, OrderLine};
use outbox_examples::orders::{OrderService, Placed};
use outbox_examples::{metrics_endpoint, projections};
use outbox_postgres::Outbox;
use outbox_postgres::prelude::*;
use outbox_postgres::{SchemaName, migrate};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

const ORDERS: usize = 300;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let metrics_addr: std::net::SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:0".into())
        .parse()
        .context("METRICS_ADDR is not an address such as 127.0.0.1:9464")?;
    let metrics = metrics_endpoint::install_recorder()?;
    let metrics_addr = metrics_endpoint::serve(metrics_addr, metrics).await?;
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(&database_url)
        .await
        .with_context(|| format!("PostgreSQL at {database_url}"))?;
    let schema = SchemaName::new("outbox_demo")?;
    sqlx::query(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await?;
    migrate(&pool, &schema).await?;
    let outbox = Outbox::new(schema.clone());
    let service = OrderService::new(pool.clone(), outbox.clone());
    service.create_tables().await?;
    sqlx::raw_sql(AssertSqlSafe(projections::create_tables_sql(
        &schema.quoted(),
    )))
    .execute(&pool)
    .await?;

    let kind = BrokerKind::from_env()?;
    let mut consumers = Vec::new();
    for builder in [
        projections::billing(&schema.quoted()),
        projections::order_status(&schema.quoted()),
    ] {
        consumers.push(builder.build(pool.clone(), schema.clone())?);
    }
    let wired = brokers::wire(kind, &pool, &schema, consumers).await?;
    let (relay, consumers) = (wired.relay, wired.consumers);
    println!(
        "order service: schema {}, {}, metrics at http://{metrics_addr}/metrics",
        schema.as_str(),
        wired.destination
    );

    // Commands. Each runs in the trace of its (simulated) HTTP request.
    let started = Instant::now();
    let request: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse()?;
    let mut placed = Vec::new();
    for n in 0..ORDERS {
        let lines = vec![OrderLine {
            sku: format!("SKU-{}", n % 17),
            quantity: 1 + (n % 3) as u32,
            unit_price: Money {
                amount_minor: 990 + n as i64,
                currency: "EUR".into(),
            },
        }];
        let command = format!("place-{n}");
        match trace::scope(
            Some(request),
            service.place(&command, &format!("customer{n}@example.org"), lines),
        )
        .await?
        {
            Placed::New(order_id) => placed.push(order_id),
            Placed::Repeated => bail!("command {command} was new"),
        }
    }
    // A client retries a command: no second order, no second event.
    let retried = service
        .place("place-7", "customer7@example.org", Vec::new())
        .await?;
    ensure!(
        retried == Placed::Repeated,
        "a repeated command must be a no-op"
    );
    // An invalid order (total 0) fails the business check: rolled back, no event.
    let invalid = service
        .place("place-invalid", "nobody@example.org", Vec::new())
        .await;
    ensure!(invalid.is_err(), "an order with total 0 must fail");
    for order_id in placed.iter().step_by(2) {
        service.ship(*order_id, "DHL").await?;
    }
    for order_id in placed.iter().skip(1).step_by(10) {
        service
            .cancel(*order_id, CancelReason::CustomerRequest)
            .await?;
    }
    let shipped = placed.len().div_ceil(2);
    let cancelled = placed.iter().skip(1).step_by(10).count();
    let events = ORDERS + shipped + cancelled;
    println!(
        "commands: {ORDERS} orders placed, {shipped} shipped, {cancelled} cancelled, 1 retried command, 1 rejected order ({events} events)"
    );

    // Wait for both consumers to catch up.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (invoices, statuses, published) = progress(&pool, &schema).await?;
        if invoices == ORDERS as i64 && statuses == ORDERS as i64 && published == events as i64 {
            let settled = final_statuses(&pool, &schema).await?;
            if settled == (ORDERS - shipped - cancelled, shipped, cancelled) {
                break;
            }
        }
        if Instant::now() > deadline {
            bail!(
                "consumers did not catch up within 60 s: {invoices} invoices, {statuses} statuses, {published} published of {events}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();

    let (open, shipped_now, cancelled_now) = final_statuses(&pool, &schema).await?;
    let scalar = |sql: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
        }
    };
    let s = schema.quoted();
    let letters = scalar(format!("SELECT count(*) FROM {s}.outbox_dead_letters")).await?;
    let traced = scalar(format!(
        "SELECT count(*) FROM {s}.order_status WHERE trace_id = '{}'",
        request.trace_id_hex()
    ))
    .await?;
    let keys = scalar(format!(
        "SELECT count(DISTINCT provider_key) FROM {s}.invoices"
    ))
    .await?;
    ensure!(
        letters == 0,
        "{letters} messages in quarantine or dead letters"
    );
    ensure!(keys == ORDERS as i64, "one idempotency key per invoice");
    ensure!(traced > 0, "the request's trace reached the consumer");
    println!(
        "consumers: billing wrote {ORDERS} invoices (one provider idempotency key each); order-status shows {open} open, {shipped_now} shipped, {cancelled_now} cancelled"
    );
    println!(
        "trace: {traced} order-status rows carry the request's trace id {}",
        request.trace_id_hex()
    );
    println!("quarantine and dead letters: {letters}");
    println!(
        "all {events} events published and applied in {:.2} s",
        elapsed.as_secs_f64()
    );

    // What an operator sees of an event: sensitive fields masked.
    type Row = (
        uuid::Uuid,
        String,
        i32,
        String,
        String,
        i64,
        chrono::DateTime<chrono::Utc>,
        Option<String>,
        String,
    );
    let row: Row = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, created_at,
                traceparent, payload::text
         FROM {s}.outbox_events WHERE event_type = 'order.created' ORDER BY seq LIMIT 1"
    )))
    .fetch_one(&pool)
    .await?;
    let shown = Envelope {
        id: row.0,
        event_type: row.1,
        schema_version: u32::try_from(row.2)?,
        aggregate_type: row.3,
        aggregate_id: row.4,
        aggregate_version: row.5,
        occurred_at: row.6,
        traceparent: row.7,
        payload: serde_json::value::RawValue::from_string(row.8)?,
    };
    println!("an event as logs show it: {shown}");
    ensure!(
        !shown.to_string().contains("@example.org"),
        "the e-mail address must be redacted"
    );

    for consumer in consumers {
        let _ = consumer.drain(Duration::from_secs(5)).await;
    }
    let _ = relay.drain(Duration::from_secs(5)).await;

    // What Prometheus scrapes: the relay's and the consumers' figures.
    let scraped = metrics_endpoint::scrape(metrics_addr).await?;
    let value = |series: &str| -> Option<f64> {
        scraped
            .lines()
            .find(|line| line.starts_with(series))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    let published = value(&format!(
        "outbox_relay_published_total{{schema=\"{}\"",
        schema.as_str()
    ))
    .unwrap_or(0.0);
    let applied = value("outbox_consumer_messages_total{consumer=\"billing\",outcome=\"applied\"}")
        .unwrap_or(0.0);
    ensure!(
        published >= events as f64,
        "/metrics shows {published} published events, expected {events}:\n{scraped}"
    );
    ensure!(
        applied >= ORDERS as f64,
        "/metrics shows {applied} events applied by billing, expected {ORDERS}"
    );
    ensure!(
        scraped.contains("# HELP outbox_oldest_pending_age_seconds"),
        "/metrics lacks the backlog gauges' help"
    );
    println!(
        "metrics: /metrics shows {published} published, {applied} applied by billing, {} series of outbox_*",
        scraped.lines().filter(|l| l.starts_with("outbox_")).count()
    );
    println!("ok");
    Ok(())
}

async fn progress(pool: &PgPool, schema: &SchemaName) -> anyhow::Result<(i64, i64, i64)> {
    let s = schema.quoted();
    let row: (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT (SELECT count(*) FROM {s}.invoices), (SELECT count(*) FROM {s}.order_status),
                (SELECT count(*) FROM {s}.outbox_events WHERE status = 'published')"
    )))
    .fetch_one(pool)
    .await?;
    Ok(row)
}

async fn final_statuses(
    pool: &PgPool,
    schema: &SchemaName,
) -> anyhow::Result<(usize, usize, usize)> {
    let s = schema.quoted();
    let row: (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE status = 'created'), count(*) FILTER (WHERE status = 'shipped'),
                count(*) FILTER (WHERE status = 'cancelled') FROM {s}.order_status"
    )))
    .fetch_one(pool)
    .await?;
    Ok((row.0 as usize, row.1 as usize, row.2 as usize))
}
