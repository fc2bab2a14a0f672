//! One process of the fault suite (`tests/tests/fault_suite.rs`): a relay,
//! a consumer or a producer, run as its own OS process so the suite can
//! kill it (SIGKILL), stop it (SIGSTOP) and start it again.
//!
//! `fault-node relay [batch]` | `fault-node consumer <name> <strict|stale> [batch]` |
//! `fault-node producer <aggregates> <rounds> <writers> <pause_ms>` (a pause
//! before each round spreads the load over the fault window) |
//! `fault-node stream <aggregates> <events> <events_per_s> <writers> <seed>`
//! (the soak's load: a steady rate until `events` are committed) |
//! `fault-node relay-log <batch> <file> <delay_ms>` (one relay worker whose
//! transport appends what it publishes to a file; short lease and timeouts
//! for the scale-out tests)
//!
//! Settings from the environment: `OUTBOX_TEST_SCHEMA` (the schema in the
//! test database), `OUTBOX_PG_ADDR` (`host:port` to reach PostgreSQL
//! through, the suite's proxy), `OUTBOX_BROKER` (`nats`, the default,
//! `kafka` or `rabbitmq`) with `OUTBOX_NATS_URL`, `OUTBOX_KAFKA_BOOTSTRAP`
//! or `OUTBOX_AMQP_URL`, and for consumers `OUTBOX_PARK_TIMEOUT_MS`
//! (strict; default 600 s) and `OUTBOX_CHAOS` (`<seed>:<duplicates per
//! mille>:<shuffle 0|1>`: a [`ChaosSource`] around the broker's source).

use outbox_postgres::PgConsumer;
use outbox_postgres::prelude::*;
use std::time::Duration;

use outbox_core::consumer::{
    ConsumerBuilder, ConsumerConfig, ConsumerTask, MessageSource, Ordering, RetryPolicy,
};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::Transport;
use outbox_core::{EmitError, EmitOptions, EmitOutcome, EventDraft};
use outbox_kafka::{KafkaConfig, KafkaSource, KafkaSourceConfig, KafkaTransport};
use outbox_nats::{JetStreamSource, JetStreamSourceConfig, NatsConfig, NatsTransport};
use outbox_postgres::Outbox;
use outbox_postgres::SchemaName;
use outbox_rabbitmq::{RabbitConfig, RabbitSource, RabbitSourceConfig, RabbitTransport};
use outbox_tests::chaos::{Chaos, ChaosSource};
use outbox_tests::consumers::tick_handler;
use outbox_tests::events::{PieceMoved, Ticked};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

async fn pool(size: u32) -> PgPool {
    let mut options: PgConnectOptions = outbox_tests::db::test_database_options();
    if let Ok(addr) = std::env::var("OUTBOX_PG_ADDR") {
        let (host, port) = addr.rsplit_once(':').expect("OUTBOX_PG_ADDR is host:port");
        options = options.host(host).port(port.parse().expect("a port"));
    }
    // Lazy: the database may be unreachable at start (a cut proxy); every
    // loop retries with its backoff.
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy_with(options)
}

fn nats() -> NatsConfig {
    NatsConfig {
        url: env("OUTBOX_NATS_URL"),
        connect_timeout: Duration::from_secs(2),
        ack_timeout: Duration::from_secs(3),
        ..NatsConfig::default()
    }
}

/// The rig's Kafka (its mock cluster): deliveries bounded below the
/// relay's publish timeout, reconnects tried every half second at most.
fn kafka() -> KafkaConfig {
    KafkaConfig {
        bootstrap_servers: env("OUTBOX_KAFKA_BOOTSTRAP"),
        delivery_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        client: vec![("reconnect.backoff.max.ms".into(), "500".into())],
        ..KafkaConfig::default()
    }
}

/// The rig's RabbitMQ node, through the rig's proxy.
fn rabbit() -> RabbitConfig {
    RabbitConfig {
        url: env("OUTBOX_AMQP_URL"),
        connect_timeout: Duration::from_secs(2),
        confirm_timeout: Duration::from_secs(2),
        ..RabbitConfig::default()
    }
}

/// `OUTBOX_BROKER`: `nats` (default), `kafka` or `rabbitmq`.
fn broker() -> String {
    std::env::var("OUTBOX_BROKER").unwrap_or_else(|_| "nats".to_owned())
}

fn schema() -> SchemaName {
    SchemaName::new(env("OUTBOX_TEST_SCHEMA")).expect("valid schema")
}

async fn relay(batch_size: usize) {
    match broker().as_str() {
        "nats" => {
            relay_to(
                retrying("NATS", || NatsTransport::connect(nats())).await,
                batch_size,
            )
            .await
        }
        "kafka" => {
            relay_to(
                retrying("Kafka", || KafkaTransport::connect(kafka())).await,
                batch_size,
            )
            .await
        }
        "rabbitmq" => {
            relay_to(
                retrying("RabbitMQ", || RabbitTransport::connect(rabbit())).await,
                batch_size,
            )
            .await
        }
        other => panic!("OUTBOX_BROKER {other:?}: nats, kafka or rabbitmq"),
    }
}

/// Connects with `connect`, again every half second for up to a minute:
/// the rig may have the broker down (or restarting) when it starts a
/// process.
async fn retrying<T, E, F, Fut>(what: &str, connect: F) -> T
where
    E: std::fmt::Display,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut tries = 0;
    loop {
        match connect().await {
            Ok(connected) => return connected,
            Err(error) if tries < 120 => {
                tries += 1;
                eprintln!("{what}: {error}; again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => panic!("{what}: {error}"),
        }
    }
}

async fn relay_to<T: Transport>(transport: T, batch_size: usize) {
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        publish_timeout: Duration::from_secs(2),
        claim_timeout: Duration::from_secs(3),
        statement_timeout: outbox_tests::faults::RELAY_STATEMENT_TIMEOUT,
        error_backoff: Duration::from_millis(200),
        stats_interval: Duration::ZERO,
        batch_size,
        ..RelayConfig::default()
    };
    let _relay = Relay::start_postgres(pool(4).await, schema(), transport, config)
        .await
        .expect("relay");
    println!("relay started");
    std::future::pending::<()>().await;
}

/// One relay worker publishing to a [`LogTransport`](outbox_tests::transports::LogTransport),
/// straight to PostgreSQL (no proxy), with a 2 s lease.
async fn relay_log(batch_size: usize, file: &str, delay: Duration) {
    let transport =
        outbox_tests::transports::LogTransport::create(file.as_ref(), delay).expect("log file");
    let config = RelayConfig {
        poll_interval: Duration::from_millis(100),
        publish_timeout: Duration::from_secs(2),
        claim_timeout: Duration::from_secs(3),
        lease: Duration::from_secs(2),
        rebalance_interval: Duration::from_millis(200),
        error_backoff: Duration::from_millis(100),
        stats_interval: Duration::ZERO,
        batch_size,
        ..RelayConfig::default()
    };
    let _relay = Relay::start_postgres(pool_direct(3).await, schema(), transport, config)
        .await
        .expect("relay");
    std::future::pending::<()>().await;
}

async fn consumer(name: &str, ordering: &str, batch_size: usize) {
    let park_timeout = std::env::var("OUTBOX_PARK_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_secs(600), Duration::from_millis);
    let ordering = match ordering {
        "strict" => Ordering::Strict { park_timeout },
        "stale" => Ordering::RejectStale,
        other => panic!("ordering {other:?}: strict or stale"),
    };
    let pool = pool(4).await;
    let schema = schema();
    let table = format!("{}.effects", schema.quoted());
    let consumer = ConsumerBuilder::new(name)
        .config(ConsumerConfig {
            ordering,
            batch_size,
            retry: RetryPolicy {
                max_attempts: 1_000,
                ..RetryPolicy::default()
            },
            ..ConsumerConfig::default()
        })
        .on_fn::<Ticked, _>(tick_handler(
            table.clone(),
            Duration::ZERO,
            std::sync::Arc::new(Vec::new()),
        ))
        .on_fn::<PieceMoved, _>(outbox_tests::consumers::effect_handler(table))
        .build(pool, schema)
        .expect("consumer builds");
    let task = match broker().as_str() {
        "nats" => {
            let config = JetStreamSourceConfig {
                ack_wait: Duration::from_secs(5),
                ..JetStreamSourceConfig::for_consumer(&consumer, nats()).expect("source settings")
            };
            let source = retrying("NATS", || JetStreamSource::connect(config.clone())).await;
            spawn_with_chaos(&consumer, source)
        }
        "kafka" => {
            let mut config =
                KafkaSourceConfig::for_consumer(&consumer, kafka()).expect("source settings");
            // A killed instance's partitions move to the others quickly.
            config.kafka.client.extend([
                ("session.timeout.ms".into(), "6000".into()),
                ("heartbeat.interval.ms".into(), "500".into()),
            ]);
            // With a 6 s session, a membership unsettled for 30 s is stuck.
            config.rejoin_after = Duration::from_secs(30);
            let source = retrying("Kafka", || KafkaSource::connect(config.clone())).await;
            spawn_with_chaos(&consumer, source)
        }
        "rabbitmq" => {
            let config =
                RabbitSourceConfig::for_consumer(&consumer, rabbit()).expect("source settings");
            let source = retrying("RabbitMQ", || RabbitSource::connect(config.clone())).await;
            spawn_with_chaos(&consumer, source)
        }
        other => panic!("OUTBOX_BROKER {other:?}: nats, kafka or rabbitmq"),
    };
    println!("consumer {name} started");
    task.join().await.expect("consumer task");
}

/// Runs `consumer` on `source`, inside a [`ChaosSource`] when
/// `OUTBOX_CHAOS` asks for one (each process its own choices, from the
/// suite's seed).
fn spawn_with_chaos<S: MessageSource>(consumer: &PgConsumer, source: S) -> ConsumerTask {
    match Chaos::from_env() {
        Some(chaos) => consumer.spawn(ChaosSource::new(
            source,
            Chaos {
                seed: chaos.seed ^ u64::from(std::process::id()),
                ..chaos
            },
        )),
        None => consumer.spawn(source),
    }
}

/// From `writers` concurrent writers, each round: every writer emits a
/// tick on every counter (several writers per aggregate, versions counted
/// by the outbox), and the writer that owns a piece emits its move with
/// the round as the carried version. Every fifth round's ticks carry an
/// idempotency key and are sent twice (a client retry). The producer
/// reaches PostgreSQL directly (not through the suite's proxy), but the
/// suite restarts the server: each command is retried until it is known
/// to be committed once (see [`run_once`]). Prints `produced` at the end.
async fn producer(aggregates: usize, rounds: u64, writers: usize, pause: Duration) {
    let pool = pool_direct(writers as u32 + 1).await;
    let outbox = Outbox::new(schema());
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        tasks.push(tokio::spawn(async move {
            for round in 1..=rounds {
                tokio::time::sleep(pause).await;
                for aggregate in 0..aggregates {
                    let key = (round % 5 == 0).then(|| format!("cmd-{writer}-{aggregate}-{round}"));
                    let sends = if key.is_some() { 2 } else { 1 };
                    for _ in 0..sends {
                        let tick = Ticked::new(format!("c{aggregate}"), round);
                        let key = key.clone();
                        run_once(&pool, &outbox, |tx, outbox| {
                            let (tick, key) = (tick.clone(), key.clone());
                            Box::pin(async move {
                                let options = EmitOptions {
                                    idempotency_key: key,
                                    ..EmitOptions::default()
                                };
                                Ok(match outbox.emit_with(tx, &tick, options).await? {
                                    EmitOutcome::Emitted(emitted) => Some(emitted.event_id),
                                    EmitOutcome::Duplicate { .. } => None,
                                })
                            })
                        })
                        .await;
                    }
                    if aggregate % writers == writer {
                        let moved = PieceMoved::new(format!("p{aggregate}"), round as i64);
                        run_once(&pool, &outbox, |tx, outbox| {
                            let moved = moved.clone();
                            Box::pin(
                                async move { Ok(Some(outbox.emit(tx, &moved).await?.event_id)) },
                            )
                        })
                        .await;
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    println!("produced");
}

/// The soak's load: `writers` concurrent writers commit `events` events
/// in all at `rate` events per second. Most transactions carry 25 events:
/// ticks of random counters (versions counted by the outbox, counters
/// shared by all writers) and moves of the writer's own pieces (a quarter
/// as many pieces as counters, versions carried). Every 20th command is
/// one tick with an idempotency key, sent twice. Each command commits once
/// ([`run_once`]).
async fn stream(aggregates: usize, events: u64, rate: f64, writers: usize, seed: u64) {
    let pool = pool_direct(writers as u32 + 1).await;
    let outbox = Outbox::new(schema());
    let pieces = (aggregates / 4).max(writers);
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        let quota = events / writers as u64 + u64::from(writer == 0) * (events % writers as u64);
        let per_second = rate / writers as f64;
        let mut random = outbox_tests::faults::Schedule::new(seed ^ (writer as u64 + 1));
        tasks.push(tokio::spawn(async move {
            let started = std::time::Instant::now();
            let own: Vec<usize> = (0..pieces).filter(|p| p % writers == writer).collect();
            let mut versions = vec![0i64; own.len()];
            let mut produced = 0u64;
            let mut command = 0u64;
            while produced < quota {
                command += 1;
                if command.is_multiple_of(20) {
                    let tick =
                        Ticked::new(format!("c{}", random.below(aggregates as u64)), command);
                    let key = format!("stream-{seed}-{writer}-{command}");
                    for _ in 0..2 {
                        let (tick, key) = (tick.clone(), key.clone());
                        run_once(&pool, &outbox, move |tx, outbox| {
                            let (tick, key) = (tick.clone(), key.clone());
                            Box::pin(async move {
                                let options = EmitOptions {
                                    idempotency_key: Some(key),
                                    ..EmitOptions::default()
                                };
                                Ok(match outbox.emit_with(tx, &tick, options).await? {
                                    EmitOutcome::Emitted(emitted) => Some(emitted.event_id),
                                    EmitOutcome::Duplicate { .. } => None,
                                })
                            })
                        })
                        .await;
                    }
                    produced += 1;
                } else {
                    let size = (quota - produced).min(25);
                    let mut next = versions.clone();
                    let mut drafts = Vec::with_capacity(size as usize);
                    for _ in 0..size {
                        let draft = if random.below(5) == 0 {
                            let i = random.below(own.len() as u64) as usize;
                            next[i] += 1;
                            EventDraft::new(&PieceMoved::new(format!("p{}", own[i]), next[i]))
                        } else {
                            EventDraft::new(&Ticked::new(
                                format!("c{}", random.below(aggregates as u64)),
                                command,
                            ))
                        };
                        drafts.push(draft.expect("serializable"));
                    }
                    run_once(&pool, &outbox, |tx, outbox| {
                        let drafts = drafts.clone();
                        Box::pin(async move {
                            let emitted = outbox.emit_drafts(tx, drafts).await?;
                            Ok(emitted.first().map(|e| e.event_id))
                        })
                    })
                    .await;
                    versions = next;
                    produced += size;
                }
                let due = Duration::from_secs_f64(produced as f64 / per_second);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    println!("produced");
}

type Command<'a> = futures_util::future::BoxFuture<'a, Result<Option<uuid::Uuid>, EmitError>>;

/// Runs one command (a transaction with one emit) until it is known to
/// have committed exactly once: an error before the commit rolls it back
/// and it runs again; a commit whose answer was lost (the server went down
/// meanwhile) is settled by looking the event id up, as a careful client
/// does, and runs again only when the event is not there.
async fn run_once<F>(pool: &PgPool, outbox: &Outbox, command: F)
where
    F: for<'a> Fn(&'a mut sqlx::PgConnection, &'a Outbox) -> Command<'a>,
{
    loop {
        let mut tx = match pool.begin().await {
            Ok(tx) => tx,
            Err(error) => {
                eprintln!("producer: begin: {error}; again");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let event_id = match command(&mut tx, outbox).await {
            Ok(id) => id,
            Err(error) => {
                eprintln!("producer: emit: {error}; again");
                drop(tx);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        match tx.commit().await {
            Ok(()) => return,
            Err(error) => {
                eprintln!("producer: commit: {error}; checking whether it committed");
                let Some(id) = event_id else {
                    // A repeated keyed command wrote nothing either way.
                    return;
                };
                loop {
                    let found: Result<bool, _> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                        "SELECT EXISTS (SELECT 1 FROM {}.outbox_events WHERE id = $1)",
                        outbox.schema().quoted()
                    )))
                    .bind(id)
                    .fetch_one(pool)
                    .await;
                    match found {
                        Ok(true) => return,
                        Ok(false) => break,
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            }
        }
    }
}

async fn pool_direct(size: u32) -> PgPool {
    let options = outbox_tests::db::test_database_options().application_name("fault-producer");
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy_with(options)
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["relay"] => relay(50).await,
        ["relay", batch] => relay(batch.parse().expect("batch")).await,
        ["consumer", name, ordering] => consumer(name, ordering, 8).await,
        ["consumer", name, ordering, batch] => {
            consumer(name, ordering, batch.parse().expect("batch")).await
        }
        ["relay-log", batch, file, delay_ms] => {
            relay_log(
                batch.parse().expect("batch"),
                file,
                Duration::from_millis(delay_ms.parse().expect("delay_ms")),
            )
            .await
        }
        ["stream", aggregates, events, rate, writers, seed] => {
            stream(
                aggregates.parse().expect("aggregates"),
                events.parse().expect("events"),
                rate.parse().expect("events_per_s"),
                writers.parse().expect("writers"),
                seed.parse().expect("seed"),
            )
            .await
        }
        ["producer", aggregates, rounds, writers, pause_ms] => {
            producer(
                aggregates.parse().expect("aggregates"),
                rounds.parse().expect("rounds"),
                writers.parse().expect("writers"),
                Duration::from_millis(pause_ms.parse().expect("pause_ms")),
            )
            .await
        }
        _ => panic!(
            "usage: fault-node relay [batch] | consumer <name> <strict|stale> [batch] | producer <aggregates> <rounds> <writers> <pause_ms> | stream <aggregates> <events> <events_per_s> <writers> <seed> | relay-log <batch> <file> <delay_ms>"
        ),
    }
}
