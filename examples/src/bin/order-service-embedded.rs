//! The example order service on one SQLite file, with no server and no
//! broker: commands write orders and emit events in one transaction; the
//! SQLite relay hands the events to the two consumers (billing, order
//! status) through the in-process bus, which counts a publish only once
//! every consumer committed it; the consumers apply each event once, on the
//! same file. Checks the result and exits non-zero when anything is off.
//!
//! `OUTBOX_SQLITE_PATH` names the file (default `target/outbox-demo.db`,
//! recreated on each run and left behind to look at). Serves Prometheus
//! metrics at `http://METRICS_ADDR/metrics` (default `127.0.0.1:0`) and
//! scrapes itself at the end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use outbox_core::relay::RelayConfig;
use outbox_core::trace::{self, TraceParent};
use outbox_core::transport::InProcessBus;
use outbox_examples::contracts::{CancelReason, Money, OrderLine};
use outbox_examples::embedded::{self, EmbeddedOrders};
use outbox_examples::metrics_endpoint;
use outbox_examples::orders::Placed;
use outbox_sqlite::SqliteConsumerStore;
use sqlx::SqlitePool;

const ORDERS: usize = 300;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = PathBuf::from(
        std::env::var("OUTBOX_SQLITE_PATH").unwrap_or_else(|_| "target/outbox-demo.db".into()),
    );
    let metrics_addr: std::net::SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:0".into())
        .parse()
        .context("METRICS_ADDR is not an address such as 127.0.0.1:9464")?;
    let metrics = metrics_endpoint::install_recorder()?;
    let metrics_addr = metrics_endpoint::serve(metrics_addr, metrics).await?;

    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        if file.exists() {
            std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
        }
    }
    let url = format!("sqlite://{}", path.display());
    let pool = outbox_sqlite::connect(&url)
        .await
        .with_context(|| format!("opening {url}"))?;
    outbox_sqlite::migrate(&pool).await?;
    let service = EmbeddedOrders::new(pool.clone());
    service.create_tables().await?;

    // Consumers first: the bus is down (publishes nothing) until every
    // consumer it delivers to is subscribed.
    let bus = InProcessBus::new();
    let mut tasks = Vec::new();
    for builder in [embedded::billing(), embedded::order_status()] {
        let consumer = builder.build_on(SqliteConsumerStore::new(pool.clone()))?;
        tasks.push(consumer.spawn(bus.subscribe(consumer.name())));
    }
    let relay =
        outbox_sqlite::start_relay(pool.clone(), bus.transport(), RelayConfig::default()).await?;
    println!(
        "order service: SQLite file {}, in-process delivery, metrics at http://{metrics_addr}/metrics",
        path.display()
    );

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
    let retried = service
        .place("place-7", "customer7@example.org", Vec::new())
        .await?;
    ensure!(
        retried == Placed::Repeated,
        "a repeated command must be a no-op"
    );
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

    let expected = (ORDERS - shipped - cancelled, shipped, cancelled);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (invoices, published) = progress(&pool).await?;
        if invoices == ORDERS as i64
            && published == events as i64
            && final_statuses(&pool).await? == expected
        {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "consumers did not catch up within 60 s: {invoices} invoices, {published} published of {events}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();

    let (open, shipped_now, cancelled_now) = final_statuses(&pool).await?;
    let letters = scalar(&pool, "SELECT count(*) FROM outbox_dead_letters").await?;
    let keys = scalar(&pool, "SELECT count(DISTINCT provider_key) FROM invoices").await?;
    let traced: i64 = sqlx::query_scalar("SELECT count(*) FROM order_status WHERE trace_id = ?1")
        .bind(request.trace_id_hex())
        .fetch_one(&pool)
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
        "all {events} events published (each only after both consumers committed it) and applied in {:.2} s",
        elapsed.as_secs_f64()
    );

    for task in tasks {
        let _ = task.drain(Duration::from_secs(5)).await;
    }
    let _ = relay.drain(Duration::from_secs(5)).await;

    let scraped = metrics_endpoint::scrape(metrics_addr).await?;
    let value = |series: &str| -> Option<f64> {
        scraped
            .lines()
            .find(|line| line.starts_with(series))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    let published = value("outbox_relay_published_total{").unwrap_or(0.0);
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
    println!("metrics: /metrics shows {published} published, {applied} applied by billing");
    println!("ok");
    Ok(())
}

async fn scalar(pool: &SqlitePool, sql: &'static str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

async fn progress(pool: &SqlitePool) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT (SELECT count(*) FROM invoices),
                (SELECT count(*) FROM outbox_events WHERE status = 'published')",
    )
    .fetch_one(pool)
    .await?)
}

async fn final_statuses(pool: &SqlitePool) -> anyhow::Result<(usize, usize, usize)> {
    let row: (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'created'), count(*) FILTER (WHERE status = 'shipped'),
                count(*) FILTER (WHERE status = 'cancelled') FROM order_status",
    )
    .fetch_one(pool)
    .await?;
    Ok((row.0 as usize, row.1 as usize, row.2 as usize))
}
