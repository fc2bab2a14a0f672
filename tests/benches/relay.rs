//! Relay speed, measured side by side in one run:
//!
//! 1. drain: the relay (per-aggregate order kept, no-op transport) against
//!    raw SQL claim+mark (`UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP
//!    LOCKED LIMIT n) RETURNING …`, no order) on the same backlog shape
//!    (1,000 aggregates), same batch size (100 and 1,000) and as many
//!    clients as workers (1, 2, 4 workers in one relay, and two relays of
//!    two workers, each with its own pool and sessions as two processes
//!    would have);
//! 2. transports: the relay publishing the same 100k backlog to NATS
//!    JetStream, Kafka (librdkafka's mock cluster) and RabbitMQ, side by
//!    side;
//! 3. latency: commit → JetStream delivery at half the measured capacity,
//!    woken by NOTIFY, and with polling alone;
//! 4. claim: claim time with an empty history and with a million published
//!    rows (vacuumed), for the relay's claim and for the raw claim;
//! 5. statements (`OUTBOX_BENCH_ONLY=statements`): where a drain's time
//!    goes, relay and raw SQL on a private server with
//!    `pg_stat_statements` — per statement calls, time and rows, and
//!    client and server CPU per event.
//!
//! `cargo bench -p outbox-tests --bench relay` (about ten minutes); under
//! `cargo test` it runs a small smoke version.

use outbox_postgres::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::Transport;
use outbox_kafka::{KafkaConfig, KafkaTransport};
use outbox_nats::{NatsConfig, NatsTransport};
use outbox_postgres::PgRelayStore;
use outbox_rabbitmq::{RabbitConfig, RabbitTransport};
use outbox_tests::events::Ticked;
use outbox_tests::statements;
use outbox_tests::stats::{median, percentile};
use outbox_tests::transports::DiscardTransport;
use outbox_tests::{NatsServer, TestDb};
use rdkafka::mocking::MockCluster;
use serde_json::value::RawValue;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

const AGGREGATES: i64 = 1_000;

struct Scale {
    backlog: i64,
    jetstream_backlog: i64,
    latency_seconds: u64,
    /// (relay instances, workers each).
    worker_counts: Vec<(usize, usize)>,
    batch_sizes: Vec<usize>,
    rounds: usize,
}

async fn fill(db: &TestDb, events: i64, first_version: i64) {
    let per_aggregate = events / AGGREGATES;
    db.execute(&format!(
        "INSERT INTO {{s}}.outbox_events (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
         SELECT (lpad(to_hex(v * {AGGREGATES} + a), 12, '0') || '70008000000000000000')::uuid,
                'counter', 'c' || a, v, 'counter.ticked', 1,
                jsonb_build_object('counter', 'c' || a, 'tick', v, 'note', 'a payload of about one hundred bytes, like a small domain event')
         FROM generate_series({first_version}, {first_version} + {per_aggregate} - 1) AS v,
              generate_series(0, {AGGREGATES} - 1) AS a"
    ))
    .await;
    db.execute("VACUUM ANALYZE {s}.outbox_events").await;
}

async fn raw_drain(db: &Arc<TestDb>, workers: usize, batch: i64, total: i64) -> f64 {
    let sql = Arc::new(format!(
        "UPDATE {t} SET status = 'published', published_at = now(), attempt_count = attempt_count + 1
         WHERE id IN (SELECT id FROM {t} WHERE status = 'pending' ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)
         RETURNING id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload",
        t = db.table("outbox_events")
    ));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let db = Arc::clone(db);
        let sql = Arc::clone(&sql);
        tasks.push(tokio::spawn(async move {
            let mut done = 0i64;
            loop {
                let rows = sqlx::query(AssertSqlSafe(sql.as_str()))
                    .bind(batch)
                    .fetch_all(&db.pool)
                    .await
                    .unwrap();
                if rows.is_empty() {
                    return done;
                }
                for row in &rows {
                    let _: Uuid = row.get(0);
                    let _: Box<RawValue> = row.get(6);
                }
                done += rows.len() as i64;
            }
        }));
    }
    let mut done = 0;
    for task in tasks {
        done += task.await.unwrap();
    }
    assert_eq!(done, total);
    total as f64 / started.elapsed().as_secs_f64()
}

/// Drains with `instances` relays (each its own pool and sessions, as
/// separate processes would have) of `workers` workers each.
async fn relay_drain(
    db: &Arc<TestDb>,
    instances: usize,
    workers: usize,
    batch: usize,
    total: i64,
) -> f64 {
    let config = RelayConfig {
        batch_size: batch,
        workers,
        poll_interval: Duration::from_millis(100),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let transport = DiscardTransport::default();
    let started = Instant::now();
    let mut relays = Vec::new();
    for _ in 0..instances {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(workers as u32 + 2)
            .connect_with(db.pool.connect_options().as_ref().clone())
            .await
            .unwrap();
        let store = PgRelayStore::new(
            pool,
            db.schema.clone(),
            config.failed_head_policy,
            config.claim_timeout,
        )
        .with_partitioning(config.lease, config.rebalance_interval);
        relays.push(
            Relay::start(store, transport.clone(), config.clone(), "bench")
                .await
                .unwrap(),
        );
    }
    while (transport.count() as i64) < total {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = total as f64 / started.elapsed().as_secs_f64();
    for relay in relays {
        relay.drain(Duration::from_secs(10)).await.unwrap();
    }
    rate
}

/// Median of execution times of the relay's claim (ms).
async fn relay_claim_ms(db: &TestDb, samples: usize) -> f64 {
    let config = RelayConfig::default();
    let store = PgRelayStore::new(
        db.pool.clone(),
        db.schema.clone(),
        config.failed_head_policy,
        config.claim_timeout,
    );
    let mut times = Vec::new();
    for _ in 0..samples {
        let plan = store.explain_claim(1000).await.unwrap();
        times.push(plan.execution_ms().unwrap());
    }
    median(&mut times)
}

/// Median of execution times of the raw claim (ms).
async fn raw_claim_ms(db: &TestDb, samples: usize) -> f64 {
    let sql = format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) SELECT id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload
         FROM {t} WHERE status = 'pending' ORDER BY seq LIMIT 1000 FOR UPDATE SKIP LOCKED",
        t = db.table("outbox_events")
    );
    let mut times = Vec::new();
    for _ in 0..samples {
        let mut tx = db.pool.begin().await.unwrap();
        let plan: serde_json::Value = sqlx::query_scalar(AssertSqlSafe(sql.as_str()))
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        times.push(plan[0]["Execution Time"].as_f64().unwrap());
    }
    median(&mut times)
}

/// Where a drain's time goes: the relay and raw SQL side by side on a
/// private server with `pg_stat_statements` (fsync on, as the shared
/// server), per statement and as client/server CPU per event.
async fn bench_statements(scale: &Scale) {
    let cluster = outbox_tests::pgcluster::PgCluster::start_with(&[
        "shared_preload_libraries=pg_stat_statements",
        "pg_stat_statements.track=all",
        "pg_stat_statements.track_planning=on",
        "fsync=on",
        "shared_buffers=1GB",
    ]);
    let events = scale.backlog.min(200_000);
    println!(
        "\n== where a drain's time goes ({events} events, private server with pg_stat_statements)"
    );
    let extension = TestDb::on_server(&cluster.url(), 1).await;
    extension
        .execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await;
    for &batch in &scale.batch_sizes {
        for workers in [1_usize, 4] {
            let raw_db = Arc::new(TestDb::on_server(&cluster.url(), workers as u32 + 2).await);
            fill(&raw_db, events, 1).await;
            let cost = statements::measured(&raw_db, cluster.server_pid(), async {
                raw_drain(&raw_db, workers, batch as i64, events).await;
            })
            .await;
            statements::print(
                &format!("batch {batch}, {workers} client(s), raw SQL"),
                events,
                &cost,
                5,
            );
            let relay_db = Arc::new(TestDb::on_server(&cluster.url(), 2).await);
            fill(&relay_db, events, 1).await;
            let cost = statements::measured(&relay_db, cluster.server_pid(), async {
                relay_drain(&relay_db, 1, workers, batch, events).await;
            })
            .await;
            statements::print(
                &format!("batch {batch}, {workers} worker(s), relay"),
                events,
                &cost,
                5,
            );
        }
    }
}

async fn bench_drain(scale: &Scale) {
    println!(
        "\n== drain {} events on {AGGREGATES} aggregates (events/s), relay vs raw SQL with as many clients",
        scale.backlog
    );
    let mut summary = Vec::new();
    for &batch in &scale.batch_sizes {
        for &(instances, workers) in &scale.worker_counts {
            let clients = instances * workers;
            let mut ratios = Vec::new();
            let mut rates = Vec::new();
            for round in 0..scale.rounds {
                let raw_db = Arc::new(TestDb::with_pool_size(clients as u32 + 2).await);
                fill(&raw_db, scale.backlog, 1).await;
                let raw = raw_drain(&raw_db, clients, batch as i64, scale.backlog).await;
                let relay_db = Arc::new(TestDb::with_pool_size(2).await);
                fill(&relay_db, scale.backlog, 1).await;
                let relay = relay_drain(&relay_db, instances, workers, batch, scale.backlog).await;
                println!(
                    "  batch {batch} {instances}×{workers} round {round}: raw SQL {raw:.0}, relay {relay:.0}, relay/raw {:.3}",
                    relay / raw
                );
                ratios.push(relay / raw);
                rates.push((raw, relay));
                if let Ok(db) = Arc::try_unwrap(raw_db) {
                    db.drop_schema().await;
                }
                if let Ok(db) = Arc::try_unwrap(relay_db) {
                    db.drop_schema().await;
                }
            }
            let min = ratios.iter().cloned().fold(f64::MAX, f64::min);
            let max = ratios.iter().cloned().fold(f64::MIN, f64::max);
            let mut raws: Vec<f64> = rates.iter().map(|r| r.0).collect();
            let mut relays: Vec<f64> = rates.iter().map(|r| r.1).collect();
            summary.push((
                batch,
                instances,
                workers,
                median(&mut raws),
                median(&mut relays),
                median(&mut ratios),
                min,
                max,
            ));
        }
    }
    println!(
        "\n  | batch | relays × workers | raw SQL | relay | relay/raw (min–max) | relay vs 1 worker |"
    );
    println!("  |---|---|---|---|---|---|");
    for (batch, instances, workers, raw, relay, ratio, min, max) in &summary {
        let one = summary
            .iter()
            .find(|s| s.0 == *batch && s.1 * s.2 == 1)
            .map(|s| s.4)
            .unwrap_or(*relay);
        println!(
            "  | {batch} | {instances} × {workers} | {raw:.0} | {relay:.0} | {ratio:.3} ({min:.3}–{max:.3}) | {:.2}× |",
            relay / one
        );
    }
}

/// Drains a `backlog` through `transport` (2 workers, batch 1,000) and
/// returns events/s.
async fn drain_through<T: Transport>(backlog: i64, transport: T) -> f64 {
    let db = TestDb::with_pool_size(8).await;
    fill(&db, backlog, 1).await;
    let config = RelayConfig {
        batch_size: 1000,
        workers: 2,
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let started = Instant::now();
    let relay = Relay::start_postgres(db.pool.clone(), db.schema.clone(), transport, config)
        .await
        .unwrap();
    loop {
        let pending: i64 = db
            .scalar("SELECT count(*) FROM {s}.outbox_events WHERE status = 'pending'")
            .await;
        if pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rate = backlog as f64 / started.elapsed().as_secs_f64();
    relay.drain(Duration::from_secs(10)).await.unwrap();
    db.drop_schema().await;
    rate
}

/// The relay publishing the same backlog to each broker, side by side:
/// NATS JetStream (a private nats-server), Kafka (librdkafka's in-process
/// mock cluster: the real client and protocol, a broker without disk or
/// replication) and RabbitMQ (the shared server, confirms, a bound durable
/// queue so messages are stored).
async fn bench_transports(scale: &Scale, server: &NatsServer) {
    let backlog = scale.jetstream_backlog;
    println!("\n== relay to each broker from a {backlog} backlog (2 workers, batch 1000)");
    let mut results = Vec::new();
    for round in 0..scale.rounds {
        let nats = NatsTransport::connect(NatsConfig {
            url: server.url(),
            stream: format!("BENCH{round}"),
            subject_template: format!("bench{round}.{{aggregate_type}}.{{event_type}}"),
            ..NatsConfig::default()
        })
        .await
        .unwrap();
        results.push(("nats", drain_through(backlog, nats).await));

        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("outbox.event.counter", 4, 1).unwrap();
        let kafka = KafkaTransport::connect(KafkaConfig {
            bootstrap_servers: cluster.bootstrap_servers(),
            ..KafkaConfig::default()
        })
        .await
        .unwrap();
        results.push(("kafka (mock)", drain_through(backlog, kafka).await));
        drop(cluster);

        let url = std::env::var("AMQP_URL").unwrap_or_else(|_| RabbitConfig::default().url);
        let exchange = format!("bench-{}-{round}", std::process::id());
        let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .expect("RabbitMQ (run scripts/services.sh)");
        let channel = connection.create_channel().await.unwrap();
        let rabbit = RabbitTransport::connect(RabbitConfig {
            url: url.clone(),
            exchange: exchange.clone(),
            ..RabbitConfig::default()
        })
        .await
        .unwrap();
        channel
            .queue_declare(
                exchange.as_str().into(),
                lapin::options::QueueDeclareOptions::durable(),
                Default::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                exchange.as_str().into(),
                exchange.as_str().into(),
                "#".into(),
                Default::default(),
                Default::default(),
            )
            .await
            .unwrap();
        results.push(("rabbitmq", drain_through(backlog, rabbit).await));
        let _ = channel
            .queue_delete(exchange.as_str().into(), Default::default())
            .await;
        let _ = channel
            .exchange_delete(exchange.as_str().into(), Default::default())
            .await;
    }
    for name in ["nats", "kafka (mock)", "rabbitmq"] {
        let mut rates: Vec<f64> = results
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, r)| *r)
            .collect();
        println!(
            "  {name:<13} {:.0} events/s (median of {})",
            median(&mut rates),
            rates.len()
        );
    }
}

/// Runs producers and a relay together; with `rate = None` the producers
/// go flat out (closed loop); otherwise they keep `rate` events/s (open
/// loop). Returns p50 and p99 latency (ms) and the delivered rate.
async fn bench_latency(
    scale: &Scale,
    server: &NatsServer,
    rate: Option<f64>,
    listen: bool,
    poll: Duration,
) -> (f64, f64, f64) {
    let db = Arc::new(TestDb::with_pool_size(24).await);
    let stream = if listen { "LATNOTIFY" } else { "LATPOLL" };
    let transport = NatsTransport::connect(NatsConfig {
        url: server.url(),
        stream: stream.into(),
        subject_template: format!(
            "{}.{{aggregate_type}}.{{event_type}}",
            stream.to_lowercase()
        ),
        ..NatsConfig::default()
    })
    .await
    .unwrap();
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport,
        RelayConfig {
            listen,
            poll_interval: poll,
            workers: std::env::var("OUTBOX_BENCH_LATENCY_WORKERS")
                .map(|w| w.parse().unwrap())
                .unwrap_or(2),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    // Receive side: record when each event id arrives.
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut subscription = client
        .subscribe(format!("{}.>", stream.to_lowercase()))
        .await
        .unwrap();
    let arrivals: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let recorder = {
        let arrivals = Arc::clone(&arrivals);
        tokio::spawn(async move {
            while let Some(message) = subscription.next().await {
                if let Some(id) = message.headers.as_ref().and_then(|h| h.get("ce-id")) {
                    arrivals
                        .lock()
                        .unwrap()
                        .insert(id.as_str().to_owned(), Instant::now());
                }
            }
        })
    };
    // Producers: transactions of ten events (ten aggregates). Open loop at
    // `rate / 10` transactions per second, each in its own task so a slow
    // commit does not delay the schedule; or eight closed-loop producers.
    let commits: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let started = Instant::now();
    let duration = Duration::from_secs(scale.latency_seconds);
    let transaction = |db: Arc<TestDb>, commits: Arc<Mutex<Vec<(String, Instant)>>>, first: u64| async move {
        let events: Vec<Ticked> = (first..first + 10)
            .map(|i| Ticked::new(format!("c{}", i % 1000), i))
            .collect();
        let mut tx = db.pool.begin().await.unwrap();
        let emitted = db.outbox.emit_all(&mut tx, &events).await.unwrap();
        tx.commit().await.unwrap();
        let committed = Instant::now();
        commits
            .lock()
            .unwrap()
            .extend(emitted.iter().map(|e| (e.event_id.to_string(), committed)));
    };
    let mut producers = Vec::new();
    match rate {
        Some(rate) => {
            let interval = Duration::from_secs_f64(10.0 / rate);
            let mut next = started;
            let mut n = 0u64;
            while started.elapsed() < duration {
                next += interval;
                tokio::time::sleep_until(next.into()).await;
                producers.push(tokio::spawn(transaction(
                    Arc::clone(&db),
                    Arc::clone(&commits),
                    n,
                )));
                n += 10;
            }
        }
        None => {
            for producer in 0..8u64 {
                let db = Arc::clone(&db);
                let commits = Arc::clone(&commits);
                producers.push(tokio::spawn(async move {
                    let mut n = producer * 1_000_000_000;
                    while started.elapsed() < duration {
                        transaction(Arc::clone(&db), Arc::clone(&commits), n).await;
                        n += 10;
                    }
                }));
            }
        }
    }
    for producer in producers {
        producer.await.unwrap();
    }
    let commits = std::mem::take(&mut *commits.lock().unwrap());
    let deadline = Instant::now() + Duration::from_secs(120);
    while arrivals.lock().unwrap().len() < commits.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let delivered_rate = commits.len() as f64
        / arrivals
            .lock()
            .unwrap()
            .values()
            .max()
            .map(|last| last.duration_since(started).as_secs_f64())
            .unwrap_or(1.0);
    relay.drain(Duration::from_secs(10)).await.unwrap();
    recorder.abort();
    let arrivals = std::mem::take(&mut *arrivals.lock().unwrap());
    let mut latencies: Vec<f64> = commits
        .iter()
        .filter_map(|(id, committed)| {
            arrivals
                .get(id)
                .map(|arrived| arrived.saturating_duration_since(*committed).as_secs_f64() * 1000.0)
        })
        .collect();
    let received = latencies.len();
    assert_eq!(received, commits.len(), "every committed event arrived");
    let p50 = percentile(&mut latencies, 0.50);
    let p99 = percentile(&mut latencies, 0.99);
    if std::env::var("OUTBOX_BENCH_VERBOSE").is_ok() {
        for p in [0.9, 0.95, 0.98, 0.995, 0.999] {
            println!(
                "    p{}: {:.2} ms",
                p * 100.0,
                percentile(&mut latencies, p)
            );
        }
    }
    if let Ok(db) = Arc::try_unwrap(db) {
        db.drop_schema().await;
    }
    (p50, p99, delivered_rate)
}

async fn bench_claim(scale: &Scale) {
    println!(
        "\n== claim of 1000 pending: empty history vs {} published rows (vacuumed), median execution ms",
        scale.backlog
    );
    let db = TestDb::with_pool_size(4).await;
    fill(&db, AGGREGATES, 1).await;
    let relay_empty = relay_claim_ms(&db, 21).await;
    let raw_empty = raw_claim_ms(&db, 21).await;
    db.execute("DELETE FROM {s}.outbox_events").await;
    fill(&db, scale.backlog, 1).await;
    db.execute("UPDATE {s}.outbox_events SET status = 'published', published_at = now()")
        .await;
    fill(&db, AGGREGATES, scale.backlog / AGGREGATES + 1).await;
    let relay_full = relay_claim_ms(&db, 21).await;
    let raw_full = raw_claim_ms(&db, 21).await;
    let relay_ratio = relay_full / relay_empty;
    let raw_ratio = raw_full / raw_empty;
    println!(
        "  relay claim: {relay_empty:.2} ms empty, {relay_full:.2} ms with history, ratio {relay_ratio:.2}"
    );
    println!(
        "  raw claim:   {raw_empty:.2} ms empty, {raw_full:.2} ms with history, ratio {raw_ratio:.2}"
    );
    println!("  relay ratio / raw ratio: {:.2}", relay_ratio / raw_ratio);
    db.drop_schema().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let only = std::env::var("OUTBOX_BENCH_ONLY").ok();
    let scale = if full {
        Scale {
            backlog: 1_000_000,
            jetstream_backlog: 100_000,
            latency_seconds: 20,
            worker_counts: vec![(1, 1), (1, 2), (1, 4), (2, 2)],
            batch_sizes: vec![100, 1000],
            rounds: 2,
        }
    } else {
        Scale {
            backlog: 5_000,
            jetstream_backlog: 2_000,
            latency_seconds: 1,
            worker_counts: vec![(1, 1), (2, 2)],
            batch_sizes: vec![1000],
            rounds: 1,
        }
    };
    let mut scale = scale;
    if let Ok(backlog) = std::env::var("OUTBOX_BENCH_BACKLOG") {
        scale.backlog = backlog.parse().expect("OUTBOX_BENCH_BACKLOG is a number");
    }
    if let Ok(batches) = std::env::var("OUTBOX_BENCH_BATCHES") {
        scale.batch_sizes = batches
            .split(',')
            .map(|b| {
                b.trim()
                    .parse()
                    .expect("OUTBOX_BENCH_BATCHES is numbers, comma-separated")
            })
            .collect();
    }
    if let Ok(rounds) = std::env::var("OUTBOX_BENCH_ROUNDS") {
        scale.rounds = rounds.parse().expect("OUTBOX_BENCH_ROUNDS is a number");
    }
    let wants = |section: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|s| s == section))
    };
    if wants("drain") {
        bench_drain(&scale).await;
    }
    if wants("statements") {
        bench_statements(&scale).await;
    }
    let server = NatsServer::start();
    if wants("transports") || wants("jetstream") {
        bench_transports(&scale, &server).await;
    }
    if wants("latency") {
        let (_, _, capacity) =
            bench_latency(&scale, &server, None, true, Duration::from_secs(1)).await;
        println!(
            "\n== end-to-end capacity (8 producers, transactions of 10 events, relay to JetStream): {capacity:.0} events/s"
        );
        let fraction: f64 = std::env::var("OUTBOX_BENCH_LOAD_FRACTION")
            .map(|f| f.parse().unwrap())
            .unwrap_or(0.5);
        let rate = capacity * fraction;
        println!("== commit → JetStream delivery latency at {rate:.0} events/s (half of it)");
        let (p50, p99, _) =
            bench_latency(&scale, &server, Some(rate), true, Duration::from_secs(1)).await;
        println!("  NOTIFY wake-up (poll 1 s as fallback): p50 {p50:.2} ms, p99 {p99:.2} ms");
        let (p50, p99, _) = bench_latency(
            &scale,
            &server,
            Some(rate),
            false,
            Duration::from_millis(100),
        )
        .await;
        println!("  polling alone every 100 ms:            p50 {p50:.2} ms, p99 {p99:.2} ms");
    }
    if wants("claim") {
        bench_claim(&scale).await;
    }
}
