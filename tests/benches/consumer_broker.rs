//! Consumers through a real broker, side by side in one run: JetStream (a
//! private nats-server) holding 40,000 events, 400 aggregates x 100
//! versions published as the relay publishes them (version k of every
//! aggregate, then k+1), each message writing one business row. Variants:
//!
//!   a  hand-written, per message: what a competent engineer writes with
//!      async-nats + sqlx: a durable pull consumer (async-nats' default
//!      prefetch), read the event id header, decode the payload, BEGIN,
//!      inbox INSERT … ON CONFLICT DO NOTHING, the business INSERT when
//!      new, COMMIT, ack;
//!   b  hand-written, batched: the messages ready (up to 100) in one
//!      transaction: one inbox INSERT of all ids (unnest … RETURNING), a
//!      business INSERT per new one, COMMIT, then ack each;
//!   c  `RejectStale`, batch 1;   d  `Strict`, batch 1;
//!   e  `RejectStale`, batch 100; f  `Strict`, batch 100
//!      (`Consumer::spawn` on a `JetStreamSource` from `for_consumer`).
//!
//! Each round publishes a fresh stream that every variant drains with its
//! own durable consumer, in a rotating order, with the inbox, positions and
//! business table emptied before each; a variant's time runs from its
//! start to its last acknowledgement (counted by a wrapper around the
//! source: acks come after the commit). The report gives each variant's
//! median rate and the per-round ratios c/a, d/a, e/b, f/b.
//!
//! Then end to end, producers → relay (woken by NOTIFY) → JetStream →
//! `Strict` consumer (batch 100, then 1), all on this machine: the rate the
//! whole pipeline sustains (a backlog emitted as fast as four producers
//! can), and emit commit → consumer commit (its ack) at half the
//! consumer's drain rate and at half the pipeline's capacity, p50/p99/max,
//! with the part up to the broker.
//!
//! `cargo bench -p outbox-tests --bench consumer_broker -- --bench` (about
//! fifteen minutes); under `cargo test` one small round runs as a smoke
//! test. `OUTBOX_BENCH_ROUNDS` sets the rounds (default 5).

use outbox_postgres::prelude::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull};
use futures_util::{FutureExt, StreamExt};
use outbox_core::Envelope;
use outbox_core::consumer::{
    ConsumerBuilder, Delivery, HandlerError, Incoming, MessageSource, Ordering, SourceError,
};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::Transport;
use outbox_nats::{JetStreamSource, JetStreamSourceConfig, NatsConfig, NatsTransport};
use outbox_tests::events::Ticked;
use outbox_tests::stats::{median, percentile, summary};
use outbox_tests::{NatsServer, TestDb};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

struct Scale {
    aggregates: usize,
    versions: i64,
    rounds: usize,
    latency_seconds: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    HandSingle,
    HandBatch,
    Stale1,
    Strict1,
    Stale100,
    Strict100,
}

impl Variant {
    const ALL: [Variant; 6] = [
        Variant::HandSingle,
        Variant::HandBatch,
        Variant::Stale1,
        Variant::Strict1,
        Variant::Stale100,
        Variant::Strict100,
    ];

    fn label(self) -> &'static str {
        match self {
            Variant::HandSingle => "a hand-written, per message",
            Variant::HandBatch => "b hand-written, batched",
            Variant::Stale1 => "c RejectStale, batch 1",
            Variant::Strict1 => "d Strict, batch 1",
            Variant::Stale100 => "e RejectStale, batch 100",
            Variant::Strict100 => "f Strict, batch 100",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Variant::HandSingle => "hand-1",
            Variant::HandBatch => "hand-100",
            Variant::Stale1 => "stale-1",
            Variant::Strict1 => "strict-1",
            Variant::Stale100 => "stale-100",
            Variant::Strict100 => "strict-100",
        }
    }
}

/// Counts a source's acknowledgements and notes when each event's came
/// (acks come after the consumer's commit).
#[derive(Clone, Default)]
struct Acks {
    count: Arc<AtomicU64>,
    at: Option<Arc<Mutex<HashMap<String, Instant>>>>,
}

struct CountingSource<S> {
    inner: S,
    acks: Acks,
}

struct CountedDelivery<D> {
    inner: D,
    acks: Acks,
}

impl<D: Delivery> Delivery for CountedDelivery<D> {
    fn incoming(&self) -> &Incoming {
        self.inner.incoming()
    }

    async fn ack(self) -> Result<(), SourceError> {
        let id = self.acks.at.as_ref().and_then(|_| {
            self.inner
                .incoming()
                .attribute(outbox_core::ce::ID)
                .map(str::to_owned)
        });
        let result = self.inner.ack().await;
        if let (Some(at), Some(id)) = (&self.acks.at, id) {
            at.lock().unwrap().insert(id, Instant::now());
        }
        self.acks.count.fetch_add(1, AtomicOrdering::SeqCst);
        result
    }

    async fn retry_later(self, delay: Duration) -> Result<(), SourceError> {
        self.inner.retry_later(delay).await
    }
}

impl<S: MessageSource> MessageSource for CountingSource<S> {
    type Delivery = CountedDelivery<S::Delivery>;

    async fn next_batch(&mut self, max: usize) -> Result<Vec<Self::Delivery>, SourceError> {
        let batch = self.inner.next_batch(max).await?;
        Ok(batch
            .into_iter()
            .map(|inner| CountedDelivery {
                inner,
                acks: self.acks.clone(),
            })
            .collect())
    }
}

fn nats_config(server: &NatsServer, stream: &str) -> NatsConfig {
    NatsConfig {
        url: server.url(),
        stream: stream.into(),
        subject_template: format!(
            "{}.{{aggregate_type}}.{{event_type}}",
            stream.to_lowercase()
        ),
        ..NatsConfig::default()
    }
}

/// Publishes `aggregates` x `versions` events to a new stream, as the
/// relay does: version k of every aggregate, then k+1.
async fn publish_stream(server: &NatsServer, stream: &str, scale: &Scale) {
    let transport = NatsTransport::connect(nats_config(server, stream))
        .await
        .expect("NATS");
    for version in 1..=scale.versions {
        let envelopes: Vec<Envelope> = (0..scale.aggregates)
            .map(|a| {
                Envelope::for_event(&Ticked::new(format!("c{a}"), version as u64), version)
                    .expect("serializable")
            })
            .collect();
        let refs: Vec<&Envelope> = envelopes.iter().collect();
        for outcome in transport.publish(&refs).await {
            outcome.expect("published");
        }
    }
}

async fn empty_tables(db: &TestDb) {
    db.execute(
        "TRUNCATE {s}.outbox_processed_events, {s}.outbox_consumer_positions,
                  {s}.outbox_consumer_parked, {s}.bench_rows",
    )
    .await;
}

/// One of ours: `ordering`, `batch_size`, on a JetStream source; events/s.
async fn ours(db: &TestDb, server: &NatsServer, stream: &str, variant: Variant, total: u64) -> f64 {
    let (ordering, batch_size) = match variant {
        Variant::Stale1 => (Ordering::RejectStale, 1),
        Variant::Strict1 => (strict(), 1),
        Variant::Stale100 => (Ordering::RejectStale, 100),
        Variant::Strict100 => (strict(), 100),
        _ => unreachable!("hand-written variants run elsewhere"),
    };
    let table = db.table("bench_rows");
    let consumer = ConsumerBuilder::new(format!("{}-{stream}", variant.name()))
        .ordering(ordering)
        .batch_size(batch_size)
        .on_fn::<Ticked, _>(business_row(table))
        .build(db.pool.clone(), db.schema.clone())
        .expect("consumer builds");
    let source = JetStreamSource::connect(
        JetStreamSourceConfig::for_consumer(&consumer, nats_config(server, stream))
            .expect("source settings"),
    )
    .await
    .expect("JetStream source");
    let acks = Acks::default();
    let started = Instant::now();
    let task = consumer.spawn(CountingSource {
        inner: source,
        acks: acks.clone(),
    });
    while acks.count.load(AtomicOrdering::SeqCst) < total {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = total as f64 / started.elapsed().as_secs_f64();
    task.drain(Duration::from_secs(10)).await.expect("drains");
    rate
}

fn strict() -> Ordering {
    Ordering::Strict {
        park_timeout: Duration::from_secs(60),
    }
}

/// The handler of our variants: the same business row as the
/// hand-written ones.
fn business_row(
    table: String,
) -> impl for<'a> Fn(
    outbox_core::consumer::Received<Ticked>,
    &'a mut sqlx::PgConnection,
) -> futures_util::future::BoxFuture<'a, Result<(), HandlerError>>
+ Send
+ Sync
+ 'static {
    move |received, tx| {
        let sql = format!("INSERT INTO {table} (event_id, counter, tick) VALUES ($1, $2, $3)");
        Box::pin(async move {
            sqlx::query(AssertSqlSafe(sql))
                .bind(received.meta.event_id)
                .bind(&received.event.counter)
                .bind(received.event.tick as i64)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}

/// The hand-written consumer, per message or batched; events/s.
async fn hand(db: &TestDb, server: &NatsServer, stream: &str, variant: Variant, total: u64) -> f64 {
    let name = format!("{}-{stream}", variant.name());
    let client = async_nats::connect(server.url()).await.expect("NATS");
    let context = jetstream::new(client);
    let consumer = context
        .get_stream(stream)
        .await
        .expect("stream")
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(60),
                ..Default::default()
            },
        )
        .await
        .expect("durable consumer");
    let mut messages = consumer.messages().await.expect("pull stream");
    let inbox_one = format!(
        "INSERT INTO {} (consumer_name, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        db.table("outbox_processed_events")
    );
    let inbox_many = format!(
        "INSERT INTO {} (consumer_name, event_id) SELECT $1, unnest($2::uuid[])
         ON CONFLICT DO NOTHING RETURNING event_id",
        db.table("outbox_processed_events")
    );
    let row = format!(
        "INSERT INTO {} (event_id, counter, tick) VALUES ($1, $2, $3)",
        db.table("bench_rows")
    );
    let read = |message: &jetstream::Message| -> (Uuid, Ticked) {
        let id = message
            .headers
            .as_ref()
            .and_then(|h| h.get("ce-id"))
            .and_then(|v| v.as_str().parse().ok())
            .expect("an event id");
        let tick: Ticked = serde_json::from_slice(&message.payload).expect("a tick");
        (id, tick)
    };
    let started = Instant::now();
    let mut done = 0u64;
    while done < total {
        let first = messages.next().await.expect("open").expect("message");
        if variant == Variant::HandSingle {
            let (id, tick) = read(&first);
            let mut tx = db.pool.begin().await.unwrap();
            let new = sqlx::query(AssertSqlSafe(inbox_one.as_str()))
                .bind(&name)
                .bind(id)
                .execute(&mut *tx)
                .await
                .unwrap()
                .rows_affected()
                == 1;
            if new {
                sqlx::query(AssertSqlSafe(row.as_str()))
                    .bind(id)
                    .bind(&tick.counter)
                    .bind(tick.tick as i64)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
            first.ack().await.unwrap();
            done += 1;
            continue;
        }
        let mut batch = vec![first];
        while batch.len() < 100 {
            match messages.next().now_or_never() {
                Some(Some(Ok(message))) => batch.push(message),
                _ => break,
            }
        }
        let read: Vec<(Uuid, Ticked)> = batch.iter().map(read).collect();
        let ids: Vec<Uuid> = read.iter().map(|(id, _)| *id).collect();
        let mut tx = db.pool.begin().await.unwrap();
        let new: HashSet<Uuid> = sqlx::query_scalar(AssertSqlSafe(inbox_many.as_str()))
            .bind(&name)
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await
            .unwrap()
            .into_iter()
            .collect();
        for (id, tick) in &read {
            if new.contains(id) {
                sqlx::query(AssertSqlSafe(row.as_str()))
                    .bind(id)
                    .bind(&tick.counter)
                    .bind(tick.tick as i64)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
        }
        tx.commit().await.unwrap();
        for message in batch {
            message.ack().await.unwrap();
            done += 1;
        }
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// Runs a variant; its rate, and the CPU microseconds per event of this
/// process (the consumer) and of the PostgreSQL server.
async fn run(
    db: &TestDb,
    server: &NatsServer,
    stream: &str,
    variant: Variant,
    total: u64,
    postmaster: u32,
) -> (f64, f64, f64) {
    empty_tables(db).await;
    let (client, postgres) = (
        outbox_tests::cpu::own_seconds(),
        outbox_tests::cpu::tree_seconds(postmaster),
    );
    let rate = match variant {
        Variant::HandSingle | Variant::HandBatch => hand(db, server, stream, variant, total).await,
        _ => ours(db, server, stream, variant, total).await,
    };
    let per_event = |seconds: f64| seconds / total as f64 * 1e6;
    (
        rate,
        per_event(outbox_tests::cpu::own_seconds() - client),
        per_event(outbox_tests::cpu::tree_seconds(postmaster) - postgres),
    )
}

/// How the producers load a pipeline run.
#[derive(Clone, Copy, Debug)]
enum Load {
    /// Open loop at this many events/s for this many seconds.
    Rate(f64, u64),
    /// This many events as fast as four producers can commit them.
    Backlog(u64),
}

/// What a pipeline run measured: emit commit → consumer commit (its
/// ack) in ms (p50, p99, max), the same to the broker (p50, p99), the
/// events, and the rate they went through at (events/s, from the first
/// commit to the last ack).
struct PipelineRun {
    end_to_end: (f64, f64, f64),
    to_broker: (f64, f64),
    events: usize,
    rate: f64,
}

/// Producers → relay (woken by NOTIFY) → JetStream → a `Strict` consumer
/// with `batch_size`, all in this process and on this machine's two cores.
async fn pipeline(
    server: &NatsServer,
    label: &str,
    batch_size: usize,
    load: Load,
    aggregates: usize,
) -> PipelineRun {
    let db = Arc::new(TestDb::with_pool_size(24).await);
    db.execute("CREATE TABLE {s}.bench_rows (event_id uuid NOT NULL, counter text NOT NULL, tick bigint NOT NULL)")
        .await;
    let stream = label.to_uppercase();
    let transport = NatsTransport::connect(nats_config(server, &stream))
        .await
        .unwrap();
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport,
        RelayConfig {
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    let consumer = ConsumerBuilder::new(label.to_lowercase())
        .ordering(strict())
        .batch_size(batch_size)
        .on_fn::<Ticked, _>(business_row(db.table("bench_rows")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let source = JetStreamSource::connect(
        JetStreamSourceConfig::for_consumer(&consumer, nats_config(server, &stream)).unwrap(),
    )
    .await
    .unwrap();
    let acks = Acks {
        at: Some(Arc::default()),
        ..Acks::default()
    };
    let task = consumer.spawn(CountingSource {
        inner: source,
        acks: acks.clone(),
    });
    // When each event reached the broker (a core subscription on the
    // stream's subjects), to split the latency into relay and consumer.
    let arrivals: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let recorder = {
        let arrivals = Arc::clone(&arrivals);
        let client = async_nats::connect(server.url()).await.unwrap();
        let mut subscription = client
            .subscribe(format!("{}.>", stream.to_lowercase()))
            .await
            .unwrap();
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
    let commits: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let aggregates = aggregates as u64;
    let transaction = move |db: Arc<TestDb>,
                            commits: Arc<Mutex<Vec<(String, Instant)>>>,
                            first: u64,
                            size: u64| async move {
        let events: Vec<Ticked> = (first..first + size)
            .map(|i| Ticked::new(format!("c{}", i % aggregates), i))
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
    let started = Instant::now();
    match load {
        // Open loop: transactions of five events (five aggregates), each in
        // its own task so a slow commit does not delay the schedule.
        Load::Rate(rate, seconds) => {
            let per_transaction = 5u64;
            let interval = Duration::from_secs_f64(per_transaction as f64 / rate);
            let mut next = 0u64;
            let mut producers = Vec::new();
            while started.elapsed() < Duration::from_secs(seconds) {
                producers.push(tokio::spawn(transaction(
                    Arc::clone(&db),
                    Arc::clone(&commits),
                    next,
                    per_transaction,
                )));
                next += per_transaction;
                let due = started + interval * (next / per_transaction) as u32;
                tokio::time::sleep_until(due.into()).await;
            }
            for producer in producers {
                producer.await.unwrap();
            }
        }
        // Closed loop: four producers, transactions of 25 events.
        Load::Backlog(events) => {
            let producers: Vec<_> = (0..4u64)
                .map(|p| {
                    let (db, commits) = (Arc::clone(&db), Arc::clone(&commits));
                    tokio::spawn(async move {
                        let mut first = p * 25;
                        while first < events {
                            transaction(Arc::clone(&db), Arc::clone(&commits), first, 25).await;
                            first += 100;
                        }
                    })
                })
                .collect();
            for producer in producers {
                producer.await.unwrap();
            }
        }
    }
    let emitted = commits.lock().unwrap().len() as u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while acks.count.load(AtomicOrdering::SeqCst) < emitted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let through = started.elapsed();
    task.drain(Duration::from_secs(10)).await.unwrap();
    relay.drain(Duration::from_secs(10)).await.unwrap();
    recorder.abort();
    let acked = acks.at.as_ref().unwrap().lock().unwrap().clone();
    let arrived = arrivals.lock().unwrap().clone();
    let ms = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64() * 1000.0;
    let mut latencies = Vec::new();
    let mut to_broker = Vec::new();
    for (id, committed) in commits.lock().unwrap().iter() {
        if let Some(at) = acked.get(id) {
            latencies.push(ms(*committed, *at));
        }
        if let Some(at) = arrived.get(id) {
            to_broker.push(ms(*committed, *at));
        }
    }
    assert_eq!(
        latencies.len() as u64,
        emitted,
        "every emitted event reached the consumer"
    );
    if to_broker.is_empty() {
        to_broker.push(f64::NAN);
    }
    let run = PipelineRun {
        end_to_end: (
            percentile(&mut latencies, 0.5),
            percentile(&mut latencies, 0.99),
            percentile(&mut latencies, 1.0),
        ),
        to_broker: (
            percentile(&mut to_broker, 0.5),
            percentile(&mut to_broker, 0.99),
        ),
        events: latencies.len(),
        rate: emitted as f64 / through.as_secs_f64(),
    };
    if let Ok(db) = Arc::try_unwrap(db) {
        db.drop_schema().await;
    }
    run
}

fn print_pipeline(what: &str, run: &PipelineRun) {
    let (p50, p99, max) = run.end_to_end;
    println!(
        "  {what}: emit commit → consumer commit p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms over {} events (of which → broker p50 {:.1} ms, p99 {:.1} ms)",
        run.events, run.to_broker.0, run.to_broker.1
    );
}

/// Where each variant's database time goes: one drain each on a private
/// server with `pg_stat_statements` (fsync on), per statement and as
/// client and server CPU per event (`OUTBOX_BENCH_ONLY=statements`).
async fn statements(server: &NatsServer, scale: &Scale, total: u64) {
    let cluster = outbox_tests::pgcluster::PgCluster::start_with(&[
        "shared_preload_libraries=pg_stat_statements",
        "pg_stat_statements.track=all",
        "pg_stat_statements.track_planning=on",
        "fsync=on",
        "shared_buffers=1GB",
        &format!(
            "plan_cache_mode={}",
            std::env::var("OUTBOX_BENCH_PLAN_CACHE_MODE").unwrap_or_else(|_| "auto".into())
        ),
    ]);
    let db = TestDb::on_server(&cluster.url(), 10).await;
    db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await;
    db.execute("CREATE TABLE {s}.bench_rows (event_id uuid NOT NULL, counter text NOT NULL, tick bigint NOT NULL)")
        .await;
    println!(
        "\n== where each variant's time goes ({total} events, private server with pg_stat_statements)"
    );
    publish_stream(server, "STATEMENTS", scale).await;
    for variant in Variant::ALL {
        if let Ok(picked) = std::env::var("OUTBOX_BENCH_VARIANTS")
            && !picked.split(',').any(|p| variant.label().starts_with(p))
        {
            continue;
        }
        empty_tables(&db).await;
        let cost = outbox_tests::statements::measured(&db, cluster.server_pid(), async {
            match variant {
                Variant::HandSingle | Variant::HandBatch => {
                    hand(&db, server, "STATEMENTS", variant, total).await;
                }
                _ => {
                    ours(&db, server, "STATEMENTS", variant, total).await;
                }
            }
        })
        .await;
        outbox_tests::statements::print(variant.label(), total as i64, &cost, 8);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let scale = if full {
        Scale {
            aggregates: 400,
            versions: 100,
            rounds: std::env::var("OUTBOX_BENCH_ROUNDS")
                .map(|r| r.parse().expect("a number"))
                .unwrap_or(5),
            latency_seconds: 30,
        }
    } else {
        Scale {
            aggregates: 20,
            versions: 5,
            rounds: 1,
            latency_seconds: 2,
        }
    };
    let total = scale.aggregates as u64 * scale.versions as u64;
    let server = NatsServer::start();
    let db = TestDb::with_pool_size(10).await;
    db.execute("CREATE TABLE {s}.bench_rows (event_id uuid NOT NULL, counter text NOT NULL, tick bigint NOT NULL)")
        .await;
    let fsync: String = db.scalar("SHOW fsync").await;
    println!(
        "consumer bench through JetStream: fsync={fsync}, {} aggregates x {} versions = {total} events, {} rounds",
        scale.aggregates, scale.versions, scale.rounds
    );
    let only = std::env::var("OUTBOX_BENCH_ONLY").unwrap_or_default();
    if only == "statements" {
        db.drop_schema().await;
        statements(&server, &scale, total).await;
        return;
    }
    if only == "latency" {
        // `OUTBOX_BENCH_RATE` events/s and `OUTBOX_BENCH_BATCH`.
        let rate: f64 = std::env::var("OUTBOX_BENCH_RATE").map_or(1000.0, |r| r.parse().unwrap());
        let batch: usize = std::env::var("OUTBOX_BENCH_BATCH").map_or(100, |b| b.parse().unwrap());
        let run = pipeline(
            &server,
            &format!("lat{batch}"),
            batch,
            Load::Rate(rate, scale.latency_seconds),
            scale.aggregates,
        )
        .await;
        print_pipeline(&format!("Strict batch {batch} at {rate:.0} events/s"), &run);
        db.drop_schema().await;
        return;
    }
    let backend: i32 = db.scalar("SELECT pg_backend_pid()").await;
    let postmaster = outbox_tests::cpu::parent_of(backend as u32).expect("the postmaster");
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    let mut cpu: Vec<Vec<(f64, f64)>> = vec![Vec::new(); Variant::ALL.len()];
    for round in 0..scale.rounds {
        let stream = format!("BENCH{round}");
        publish_stream(&server, &stream, &scale).await;
        for offset in 0..Variant::ALL.len() {
            let index = (round + offset) % Variant::ALL.len();
            let variant = Variant::ALL[index];
            // `OUTBOX_BENCH_VARIANTS=b,f` runs only those (for profiling);
            // the others' figures are then NaN.
            if let Ok(picked) = std::env::var("OUTBOX_BENCH_VARIANTS")
                && !picked.split(',').any(|p| variant.label().starts_with(p))
            {
                rates[index].push(f64::NAN);
                continue;
            }
            let (rate, client, postgres) =
                run(&db, &server, &stream, variant, total, postmaster).await;
            println!(
                "  round {round} {:<28} {rate:>8.0} events/s, CPU per event: consumer {client:.0} µs, PostgreSQL {postgres:.0} µs",
                variant.label()
            );
            rates[index].push(rate);
            cpu[index].push((client, postgres));
        }
    }
    for (index, variant) in Variant::ALL.iter().enumerate() {
        let mut values = rates[index].clone();
        let mut client: Vec<f64> = cpu[index].iter().map(|c| c.0).collect();
        let mut postgres: Vec<f64> = cpu[index].iter().map(|c| c.1).collect();
        if client.is_empty() {
            continue;
        }
        println!(
            "  {:<28} median {:>8.0} events/s, CPU per event: consumer {:.0} µs, PostgreSQL {:.0} µs",
            variant.label(),
            median(&mut values),
            median(&mut client),
            median(&mut postgres)
        );
    }
    let ratio = |x: Variant, y: Variant| -> Vec<f64> {
        let (x, y) = (x as usize, y as usize);
        (0..scale.rounds)
            .map(|r| rates[x][r] / rates[y][r])
            .collect()
    };
    for (x, y, what) in [
        (
            Variant::Stale1,
            Variant::HandSingle,
            "c/a RejectStale batch 1 vs hand-written per message",
        ),
        (
            Variant::Strict1,
            Variant::HandSingle,
            "d/a Strict batch 1 vs hand-written per message",
        ),
        (
            Variant::Stale100,
            Variant::HandBatch,
            "e/b RejectStale batch 100 vs hand-written batched",
        ),
        (
            Variant::Strict100,
            Variant::HandBatch,
            "f/b Strict batch 100 vs hand-written batched",
        ),
    ] {
        println!("  {}", summary(what, &ratio(x, y)));
    }
    db.drop_schema().await;

    println!(
        "\n== end to end: producers → relay (NOTIFY) → JetStream → Strict consumer, all on this machine"
    );
    for (variant, batch_size) in [(Variant::Strict100, 100), (Variant::Strict1, 1)] {
        let mut drained = rates[variant as usize].clone();
        let half_drain = median(&mut drained) / 2.0;
        if half_drain.is_nan() {
            continue;
        }
        // What the whole pipeline sustains here: producers, relay,
        // nats-server, consumer and PostgreSQL share two cores.
        let capacity = pipeline(
            &server,
            &format!("capacity{batch_size}"),
            batch_size,
            Load::Backlog(scale.aggregates as u64 * 50),
            scale.aggregates,
        )
        .await
        .rate;
        println!(
            "  Strict batch {batch_size}: drain rate alone {:.0} events/s, the whole pipeline sustains {capacity:.0} events/s",
            half_drain * 2.0
        );
        for (what, rate) in [
            ("half the consumer's drain rate", half_drain),
            ("half the pipeline's capacity", capacity / 2.0),
        ] {
            let run = pipeline(
                &server,
                &format!("lat{batch_size}{}", what.len()),
                batch_size,
                Load::Rate(rate, scale.latency_seconds),
                scale.aggregates,
            )
            .await;
            print_pipeline(
                &format!("Strict batch {batch_size} at {rate:.0} events/s ({what})"),
                &run,
            );
        }
    }
}
