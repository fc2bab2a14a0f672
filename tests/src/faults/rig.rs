//! The rig: a private PostgreSQL cluster (reached by relays and consumers
//! through a TCP proxy the rig owns), a broker of the rig's own (a private
//! nats-server, librdkafka's mock cluster or a private RabbitMQ node, see
//! [`RigBroker`]), relays and consumers as `fault-node` OS processes, and
//! the faults injected into them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::broker::{BrokerKind, RigBroker};
use super::schedule::Schedule;
use crate::TestDb;
use crate::consumers::create_effects;
use crate::pgcluster::PgCluster;
use crate::proxy::TcpProxy;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Fault {
    /// SIGKILL of a relay process (mid-batch or between broker ack and
    /// commit, wherever it is), started again.
    KillRelay,
    /// SIGSTOP of a relay past its claim timeout, then SIGCONT: its claim
    /// was cut off meanwhile and must not publish out of order.
    StopRelay,
    /// SIGKILL of a consumer process (before its commit or between commit
    /// and ack), started again.
    KillConsumer,
    /// The broker taken down and brought back with what it stored:
    /// nats-server or the RabbitMQ node killed and started again on its
    /// store, the Kafka mock broker down and up.
    RestartBroker,
    /// Every database connection of the relays and consumers cut, new
    /// ones refused for a while.
    CutDatabase,
    /// Every byte between the relays and consumers and both servers
    /// (PostgreSQL and the broker) held 20–200 ms before it is passed on,
    /// for a few seconds: slow round trips, not a failure.
    DelayNetwork,
    /// The network to PostgreSQL drops everything (no reset, no new
    /// connection gets through) for 1.5–4.5 s, then heals: clients see
    /// silence, the server ends sessions idle past their timeouts, and
    /// what was sent meanwhile arrives after.
    BlackholeDatabase,
    /// The network to the broker drops everything for 1.5–4.5 s, then
    /// heals: publishes and fetches time out instead of failing (Kafka:
    /// the mock broker answers only after that long).
    BlackholeBroker,
    /// `pg_ctl restart -m fast` of the private cluster.
    RestartPostgres,
    /// The outbox table locked (`ACCESS EXCLUSIVE`, as a migration would)
    /// longer than the relays' statement timeout: their claims time out.
    LockOutbox,
    /// Messages already on the broker published again (on JetStream under
    /// new message ids, so it cannot drop them as duplicates).
    BrokerDuplicates,
    /// Messages the outbox never wrote, published to the broker: one with
    /// an event's headers and a payload that does not decode, one without
    /// any headers.
    BrokerPoison,
}

/// Every fault kind.
pub const FAULTS: [Fault; 12] = [
    Fault::KillRelay,
    Fault::StopRelay,
    Fault::KillConsumer,
    Fault::RestartBroker,
    Fault::CutDatabase,
    Fault::DelayNetwork,
    Fault::BlackholeDatabase,
    Fault::BlackholeBroker,
    Fault::RestartPostgres,
    Fault::LockOutbox,
    Fault::BrokerDuplicates,
    Fault::BrokerPoison,
];

/// One injected fault: what, and when it began and ended (seconds since
/// the rig's start).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FaultRecord {
    /// The kind.
    pub fault: Fault,
    /// When it began.
    pub at: f64,
    /// When the rig undid it (a process restarted, a server back).
    pub until: f64,
}

/// Shape of a rig.
#[derive(Debug, Clone)]
pub struct RigConfig {
    /// The broker.
    pub broker: BrokerKind,
    /// The `fault-node` binary.
    pub node_binary: PathBuf,
    /// Relay processes.
    pub relays: usize,
    /// Rows claimed per relay batch.
    pub relay_batch: usize,
    /// Consumer processes per consumer (`strict`, `stale`).
    pub consumer_processes: usize,
    /// Messages per consumer batch.
    pub consumer_batch: usize,
    /// `OUTBOX_CHAOS` for the consumers' sources, if any.
    pub chaos: Option<String>,
    /// Where each process's stderr goes (`OUTBOX_FAULT_LOGS`), if kept.
    pub logs: Option<PathBuf>,
}

/// The consumers the rig runs: name and ordering.
pub const CONSUMERS: [(&str, &str); 2] = [("strict", "strict"), ("stale", "stale")];

/// A `fault-node` process; killed when dropped, so a failed run leaves
/// nothing behind.
pub struct Node {
    /// Its arguments.
    pub args: Vec<String>,
    /// The process.
    pub child: Child,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The running rig.
pub struct Rig {
    /// The seed of the schedule.
    pub seed: u64,
    /// The schedule's generator.
    pub schedule: Schedule,
    /// The private cluster.
    pub postgres: PgCluster,
    /// The test schema in it, reached directly (not through the proxy).
    pub db: TestDb,
    /// The broker.
    pub broker: RigBroker,
    /// Between the nodes and PostgreSQL.
    proxy: TcpProxy,
    config: RigConfig,
    env: Vec<(String, String)>,
    relays: Vec<Node>,
    consumers: Vec<Node>,
    started: Instant,
    /// Events no consumer can apply, by id: inserted into the outbox with
    /// a schema version from a newer producer or a payload that does not
    /// decode, and published to the broker directly. Each consumer must
    /// quarantine each once.
    pub poison: Vec<Uuid>,
    /// Payloads of messages without any event id published to the
    /// broker: each consumer must quarantine each (at least once: without
    /// an id a redelivery cannot be recognised).
    pub garbage: Vec<Vec<u8>>,
    /// Readable versions 2 and 3 of the outbox's poison aggregates (whose
    /// version 1 is the poison): the strict consumer must hold them behind
    /// the quarantined version 1 and dead-letter them after its park
    /// timeout, naming it; the stale consumer applies them.
    pub poison_successors: Vec<Uuid>,
}

/// The strict consumers' park timeout in the rig: above the longest gap a
/// fault opens (a redelivery after the ack wait, a restarted process),
/// short enough that the sweeps of both strict instances settle the poison
/// aggregates' successors during the run.
pub const STRICT_PARK_TIMEOUT: Duration = Duration::from_secs(30);

/// The relays' statement timeout in `fault-node` (the lock fault holds
/// the table longer).
pub const RELAY_STATEMENT_TIMEOUT: Duration = Duration::from_secs(1);

impl Rig {
    /// Starts the servers, the relays and the consumers.
    pub async fn start(seed: u64, config: RigConfig) -> Rig {
        let postgres = PgCluster::start();
        let db = TestDb::on_server(&postgres.url(), 4).await;
        create_effects(&db).await;
        let broker = RigBroker::start(config.broker).await;
        let proxy = TcpProxy::start(&format!("127.0.0.1:{}", postgres.port())).await;
        let mut env = vec![
            ("DATABASE_URL".to_owned(), postgres.url()),
            (
                "OUTBOX_TEST_SCHEMA".to_owned(),
                db.schema.as_str().to_owned(),
            ),
            ("OUTBOX_PG_ADDR".to_owned(), proxy.address()),
        ];
        env.extend(broker.env());
        if let Some(chaos) = &config.chaos {
            env.push(("OUTBOX_CHAOS".to_owned(), chaos.clone()));
        }
        env.push((
            "OUTBOX_PARK_TIMEOUT_MS".to_owned(),
            STRICT_PARK_TIMEOUT.as_millis().to_string(),
        ));
        let mut rig = Rig {
            seed,
            schedule: Schedule::new(seed),
            postgres,
            db,
            broker,
            proxy,
            env,
            relays: Vec::new(),
            consumers: Vec::new(),
            started: Instant::now(),
            poison: Vec::new(),
            garbage: Vec::new(),
            poison_successors: Vec::new(),
            config,
        };
        let batch = rig.config.relay_batch.to_string();
        rig.relays = (0..rig.config.relays)
            .map(|_| rig.spawn(&["relay", &batch]))
            .collect();
        let batch = rig.config.consumer_batch.to_string();
        for (name, ordering) in CONSUMERS {
            for _ in 0..rig.config.consumer_processes {
                let node = rig.spawn(&["consumer", name, ordering, &batch]);
                rig.consumers.push(node);
            }
        }
        // Nothing is written before the consumers' queues are bound (the
        // producer and the poison come after `start`).
        let queues: Vec<&str> = CONSUMERS.iter().map(|(name, _)| *name).collect();
        rig.broker
            .wait_for_queues(&queues, Duration::from_secs(60))
            .await;
        rig
    }

    /// Seconds since the rig started.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Starts a `fault-node` with `args` and the rig's environment.
    pub fn spawn(&self, args: &[&str]) -> Node {
        let stderr = match &self.config.logs {
            Some(dir) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(format!("{}.log", args.join("-"))))
                    .expect("log file"),
            ),
            None => Stdio::null(),
        };
        let child = Command::new(&self.config.node_binary)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.config.node_binary.display()));
        Node {
            args: args.iter().map(|s| s.to_string()).collect(),
            child,
        }
    }

    fn restart(&self, node: &mut Node) {
        let _ = node.child.kill();
        let _ = node.child.wait();
        let args: Vec<&str> = node.args.iter().map(String::as_str).collect();
        *node = self.spawn(&args);
    }

    /// Inserts `count` poison events into the outbox: half from a newer
    /// producer (schema version 99), half with a payload that does not
    /// decode; each is version 1 of its own aggregate, followed by readable
    /// versions 2 and 3 (a producer that shipped a new event version before
    /// its consumers could read it, then went on).
    pub async fn insert_poison(&mut self, count: usize) {
        let insert = format!(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
             VALUES (gen_random_uuid(), 'counter', $1, $2, 'counter.ticked', $3, $4::json) RETURNING id",
            self.db.table("outbox_events")
        );
        for n in 0..count {
            let (version, payload) = if n % 2 == 0 {
                (
                    99,
                    format!(
                        r#"{{"counter":"poison-{n}","tick":1,"note":"from a newer producer"}}"#
                    ),
                )
            } else {
                (1, r#"{"wrong":true}"#.to_owned())
            };
            let aggregate = format!("poison-{n}");
            let mut tx = self.db.pool.begin().await.expect("begin");
            let id: Uuid = sqlx::query_scalar(AssertSqlSafe(insert.clone()))
                .bind(&aggregate)
                .bind(1_i64)
                .bind(version)
                .bind(payload)
                .fetch_one(&mut *tx)
                .await
                .expect("insert a poison event");
            self.poison.push(id);
            for successor in [2_i64, 3] {
                let payload = serde_json::to_string(&crate::events::Ticked::new(
                    aggregate.clone(),
                    successor as u64,
                ))
                .expect("serializable");
                let id: Uuid = sqlx::query_scalar(AssertSqlSafe(insert.clone()))
                    .bind(&aggregate)
                    .bind(successor)
                    .bind(1_i32)
                    .bind(payload)
                    .fetch_one(&mut *tx)
                    .await
                    .expect("insert a poison aggregate's successor");
                self.poison_successors.push(id);
            }
            tx.commit().await.expect("commit the poison");
        }
    }

    /// Waits 1–3 s (from the schedule), then injects `fault` and undoes
    /// it; returns when and how long.
    pub async fn inject(&mut self, fault: Fault) -> FaultRecord {
        let pause = 1_000 + self.schedule.below(2_000);
        self.inject_after(fault, Duration::from_millis(pause)).await
    }

    /// Waits `pause`, then injects `fault` and undoes it.
    pub async fn inject_after(&mut self, fault: Fault, pause: Duration) -> FaultRecord {
        tokio::time::sleep(pause).await;
        let at = self.elapsed();
        match fault {
            Fault::KillRelay => {
                let i = self.schedule.below(self.relays.len() as u64) as usize;
                let mut node = self.relays.remove(i);
                self.restart(&mut node);
                self.relays.push(node);
            }
            Fault::StopRelay => {
                let i = self.schedule.below(self.relays.len() as u64) as usize;
                signal(&self.relays[i].child, "STOP");
                // Past the claim timeout (3 s): its claim transaction is
                // cut off by the server while it sleeps.
                tokio::time::sleep(Duration::from_millis(4_000)).await;
                signal(&self.relays[i].child, "CONT");
            }
            Fault::KillConsumer => {
                let i = self.schedule.below(self.consumers.len() as u64) as usize;
                let mut node = self.consumers.remove(i);
                self.restart(&mut node);
                self.consumers.push(node);
            }
            Fault::RestartBroker => {
                let down = 500 + self.schedule.below(1_500);
                self.broker.restart(Duration::from_millis(down)).await;
            }
            Fault::RestartPostgres => {
                // Blocks this worker for the restart (a second or two);
                // the proxy runs on the other.
                self.postgres.restart();
            }
            Fault::CutDatabase => {
                self.proxy.down();
                let down = 500 + self.schedule.below(2_000);
                tokio::time::sleep(Duration::from_millis(down)).await;
                self.proxy.up();
            }
            Fault::DelayNetwork => {
                let latency = Duration::from_millis(20 + self.schedule.below(180));
                let length = 2_000 + self.schedule.below(3_000);
                self.proxy.delay(latency);
                self.broker.delay(latency);
                tokio::time::sleep(Duration::from_millis(length)).await;
                self.proxy.heal();
                self.broker.heal();
            }
            Fault::BlackholeDatabase => {
                let length = 1_500 + self.schedule.below(3_000);
                self.proxy.blackhole();
                tokio::time::sleep(Duration::from_millis(length)).await;
                self.proxy.heal();
            }
            Fault::BlackholeBroker => {
                let length = 1_500 + self.schedule.below(3_000);
                self.broker.blackhole(Duration::from_millis(length)).await;
            }
            Fault::LockOutbox => {
                let hold =
                    RELAY_STATEMENT_TIMEOUT.as_millis() as u64 + 500 + self.schedule.below(1_500);
                self.lock_outbox(Duration::from_millis(hold)).await;
            }
            Fault::BrokerDuplicates => {
                let count = 5 + self.schedule.below(20);
                self.broker.republish(count, &mut self.schedule).await;
            }
            Fault::BrokerPoison => self.publish_poison().await,
        }
        FaultRecord {
            fault,
            at,
            until: self.elapsed(),
        }
    }

    /// Holds `ACCESS EXCLUSIVE` on the outbox table for `hold`.
    async fn lock_outbox(&self, hold: Duration) {
        // The server may be restarting after an earlier fault: try a few
        // times, then give up on this injection (it is reported as held
        // for zero time only in the log).
        for _ in 0..20 {
            let Ok(mut tx) = self.db.pool.begin().await else {
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            };
            let locked = sqlx::query(AssertSqlSafe(format!(
                "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
                self.db.table("outbox_events")
            )))
            .execute(&mut *tx)
            .await;
            if locked.is_ok() {
                tokio::time::sleep(hold).await;
                let _ = tx.rollback().await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!(
            "seed {}: could not lock the outbox table in 20 tries",
            self.seed
        );
    }

    /// Publishes an event-shaped message with a payload that does not
    /// decode (a new id, its own aggregate) and a message without headers.
    async fn publish_poison(&mut self) {
        let n = self.poison.len() + self.garbage.len();
        let garbage = format!("not an event {n} from seed {}", self.seed).into_bytes();
        let id = Uuid::new_v4();
        let mut tries = 0;
        loop {
            // The broker may be coming back from an earlier fault; a retry
            // sends the same id (a duplicate the consumers recognise).
            match self.broker.publish_poison(id, n, &garbage).await {
                Ok(()) => break,
                Err(error) if tries < 20 => {
                    tries += 1;
                    tracing::debug!(%error, "publish broker poison; again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => panic!("seed {}: publish broker poison: {error}", self.seed),
            }
        }
        self.poison.push(id);
        self.garbage.push(garbage);
    }

    /// An error naming the first relay or consumer that exited by itself.
    pub fn check_alive(&mut self) -> Result<(), String> {
        for node in self.relays.iter_mut().chain(self.consumers.iter_mut()) {
            if let Some(status) = node.child.try_wait().expect("try_wait") {
                return Err(format!(
                    "seed {}: fault-node {:?} exited by itself ({status}); run with OUTBOX_FAULT_LOGS=<dir> for its stderr",
                    self.seed, node.args
                ));
            }
        }
        Ok(())
    }

    /// Stops every relay and consumer.
    pub fn stop_nodes(&mut self) {
        self.relays.clear();
        self.consumers.clear();
    }
}

/// Sends signal `name` (`KILL`, `STOP`, `CONT`) to `child` with kill(1).
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success(), "kill -{name} failed");
}
