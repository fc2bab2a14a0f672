//! Relays in several processes (`store-relay-process`) on one SQLite file
//! or one MySQL/MariaDB database, publishing to a real JetStream; shared by
//! `sqlite_relay_processes.rs` and `mysql_relay_processes.rs`.
//!
//! First a relay hangs right after its claim (failpoint
//! `relay::after_claim`): the others publish nothing of the aggregates it
//! holds, not even their later versions, until it is killed and its lease
//! has run out. Then, while a producer emits, relay processes are killed
//! with SIGKILL (between claim, publish and mark, wherever they are) and
//! started again, and one is stopped with SIGSTOP past its lease and
//! continued. Every event reaches the stream, and in each aggregate the
//! first arrival of every version comes in version order (a republished
//! suffix after a crash is the at-least-once duplicate the inbox drops; a
//! version before its predecessor would be a broken order).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_core::EventDraft;

use crate::events::Ticked;
use crate::faults::signal;
use crate::jetstream::read_all;
use crate::{NatsServer, wait};

const AGGREGATES: usize = 100;
const VERSIONS: u64 = 30;
/// Versions emitted before any relay runs (the backlog the hung relay
/// claims from).
const BACKLOG_VERSIONS: u64 = 5;
/// The lease of the relays that are killed and stopped.
const LEASE_MS: u64 = 2000;
/// The lease of the relay that hangs after its claim: long enough for the
/// others to show they leave its aggregates alone.
const HUNG_LEASE: Duration = Duration::from_secs(8);

/// The store the relay processes share, with its outbox tables migrated.
#[derive(Debug, Clone)]
pub enum SharedStore {
    /// A SQLite file.
    Sqlite(sqlx::SqlitePool),
    /// A MySQL/MariaDB database.
    MySql(sqlx::MySqlPool),
}

impl SharedStore {
    /// Emits one tick of every aggregate per round, 20 events per
    /// transaction, pausing `pause` between rounds.
    async fn emit_ticks(&self, ticks: std::ops::RangeInclusive<u64>, pause: Duration) {
        for tick in ticks {
            for chunk in (0..AGGREGATES).collect::<Vec<_>>().chunks(20) {
                let drafts: Vec<EventDraft> = chunk
                    .iter()
                    .map(|a| EventDraft::new(&Ticked::new(format!("c{a}"), tick)).unwrap())
                    .collect();
                match self {
                    SharedStore::Sqlite(pool) => {
                        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
                        outbox_sqlite::SqliteOutbox::new()
                            .emit_drafts(&mut tx, drafts)
                            .await
                            .unwrap();
                        tx.commit().await.unwrap();
                    }
                    SharedStore::MySql(pool) => {
                        let mut tx = pool.begin().await.unwrap();
                        outbox_mysql::MySqlOutbox::new()
                            .emit_drafts(&mut tx, drafts)
                            .await
                            .unwrap();
                        tx.commit().await.unwrap();
                    }
                }
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// The distinct values of a one-column query.
    async fn strings(&self, sql: &'static str) -> Vec<String> {
        match self {
            SharedStore::Sqlite(pool) => sqlx::query_scalar(sql).fetch_all(pool).await,
            SharedStore::MySql(pool) => sqlx::query_scalar(sql).fetch_all(pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn count(&self, sql: &'static str) -> i64 {
        match self {
            SharedStore::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            SharedStore::MySql(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn published(&self) -> i64 {
        self.count("SELECT count(*) FROM outbox_events WHERE status = 'published'")
            .await
    }

    async fn leased(&self) -> i64 {
        self.count("SELECT count(*) FROM outbox_events WHERE claim_token IS NOT NULL")
            .await
    }
}

/// Per aggregate id, the versions in stream order, and the message count.
async fn arrivals(nats_url: &str) -> (usize, HashMap<String, Vec<i64>>) {
    let messages = read_all(nats_url, "OUTBOX").await;
    let mut arrivals: HashMap<String, Vec<i64>> = HashMap::new();
    for message in &messages {
        let aggregate = message.header("ce-aggregateid").unwrap().to_owned();
        let version: i64 = message
            .header("ce-aggregateversion")
            .unwrap()
            .parse()
            .unwrap();
        arrivals.entry(aggregate).or_default().push(version);
    }
    (messages.len(), arrivals)
}

fn start_relay(binary: &Path, db_url: &str, nats_url: &str, failpoints: &str) -> Child {
    let hung = !failpoints.is_empty();
    Command::new(binary)
        .env("OUTBOX_DATABASE_URL", db_url)
        .env("OUTBOX_FAILPOINTS", failpoints)
        // A hung relay's two workers hold 60 of the 100 aggregates.
        .env("OUTBOX_BATCH_SIZE", if hung { "30" } else { "100" })
        .env("OUTBOX_NATS_URL", nats_url)
        .env(
            "OUTBOX_CLAIM_TIMEOUT_MS",
            if hung {
                HUNG_LEASE.as_millis() as u64
            } else {
                LEASE_MS
            }
            .to_string(),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a relay process")
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs the scenario on `store` (reachable by the processes at `db_url`)
/// with relays from `binary` (`store-relay-process`) and panics on a
/// broken order, a lost event or a hung relay's aggregate published by
/// another.
pub async fn run(store: SharedStore, db_url: &str, binary: &Path) {
    let server = NatsServer::start();
    store.emit_ticks(1..=BACKLOG_VERSIONS, Duration::ZERO).await;
    // A relay that claims and hangs before publishing anything.
    let mut hung = start_relay(binary, db_url, &server.url(), "relay::after_claim=hang");
    // Both of its workers' claims: 30 events each.
    wait::until(
        "the hung relay's claims",
        Duration::from_secs(30),
        || async { store.leased().await >= 60 },
    )
    .await;
    let claimed_at = Instant::now();
    let held = store
        .strings("SELECT DISTINCT aggregate_id FROM outbox_events WHERE claim_token IS NOT NULL")
        .await;
    let mut relays: Vec<Child> = (0..3)
        .map(|_| start_relay(binary, db_url, &server.url(), ""))
        .collect();
    // The others drain what is free; the held aggregates wait, even their
    // versions the hung relay did not claim.
    let free = (AGGREGATES - held.len()) as i64;
    wait::until(
        "the free aggregates published",
        Duration::from_secs(60),
        || async { store.published().await >= free * BACKLOG_VERSIONS as i64 },
    )
    .await;
    // Time for a wrong claim to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, early) = arrivals(&server.url()).await;
    for aggregate in &held {
        assert!(
            !early.contains_key(aggregate),
            "{aggregate} is held by the hung relay, yet {:?} reached the stream",
            early[aggregate]
        );
    }
    assert_eq!(early.len() as i64, free, "the free aggregates went");
    assert!(
        claimed_at.elapsed() < HUNG_LEASE - Duration::from_secs(1),
        "the check ran {:?} after the hung claim, too close to its lease of {HUNG_LEASE:?} to mean anything",
        claimed_at.elapsed()
    );
    assert!(
        held.len() >= 30,
        "the hung relay holds {} aggregates",
        held.len()
    );
    kill(&mut hung);

    let producer = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .emit_ticks(BACKLOG_VERSIONS + 1..=VERSIONS, Duration::from_millis(20))
                .await;
        })
    };

    // Faults while the producer runs and the relays drain.
    for round in 0..8 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let victim = round % relays.len();
        kill(&mut relays[victim]);
        relays[victim] = start_relay(binary, db_url, &server.url(), "");
    }
    signal(&relays[0], "STOP");
    tokio::time::sleep(Duration::from_millis(3000)).await;
    signal(&relays[0], "CONT");
    producer.await.unwrap();

    let total = AGGREGATES as i64 * VERSIONS as i64;
    wait::until(
        "every event published",
        Duration::from_secs(120),
        || async { store.published().await == total },
    )
    .await;
    for relay in &mut relays {
        kill(relay);
    }

    let (messages, arrivals) = arrivals(&server.url()).await;
    assert_eq!(arrivals.len(), AGGREGATES);
    for (aggregate, versions) in &arrivals {
        let mut first_arrivals = Vec::new();
        for &version in versions {
            if !first_arrivals.contains(&version) {
                first_arrivals.push(version);
            }
        }
        assert_eq!(
            first_arrivals,
            (1..=VERSIONS as i64).collect::<Vec<_>>(),
            "aggregate {aggregate}: first arrivals out of order; all arrivals {versions:?}"
        );
    }
    eprintln!(
        "{} messages for {total} events ({} republished after kills)",
        messages,
        messages as i64 - total
    );
}
