//! A scripted incident, repaired with the `outbox` CLI run as a process
//! (the tool a service builds with its contracts linked in): a publish
//! failure blocks an aggregate, `status --check` names it, `failed show`
//! masks the redacted field, `failed retry` with a reason publishes it and
//! the aggregate continues in order; a v3 message quarantined at a v2
//! consumer is replayed after the upgrade and applied once; a dead letter
//! is replayed once; repairs without a reason or without ids are refused
//! and change nothing; every repair left an audit row. Human tables are
//! golden (insta), `--json` is checked field by field.

use outbox_postgres::prelude::*;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use outbox_core::consumer::{
    ConsumerBuilder, ConsumerConfig, Ordering, Outcome, RetryPolicy, channel,
};
use outbox_core::relay::{Backoff, Relay, RelayConfig};
use outbox_core::transport::PublishFailure;
use outbox_core::{ContractRegistry, Envelope, OutboxEvent};
use outbox_postgres::PgRelayStore;
use outbox_tests::consumers::{create_effects, effect_handler, effects, tick, tick_consumer};
use outbox_tests::events::{CardCharged, ParcelBooked, ParcelBookedV2};
use outbox_tests::transports::RecordingTransport;
use outbox_tests::{TestDb, db, wait};
use serde_json::Value;

const SECRET: u64 = 4_111_999_988_887_777;

struct Tool<'a> {
    db: &'a TestDb,
}

impl Tool<'_> {
    fn run(&self, args: &[&str]) -> Output {
        let url = db::test_database_url();
        Command::new(env!("CARGO_BIN_EXE_outbox-tool"))
            .env_remove("DATABASE_URL")
            .args(["--database-url", &url, "--schema", self.db.schema.as_str()])
            .args(args)
            .env("USER", "ci-operator")
            .output()
            .expect("run outbox-tool")
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "outbox {args:?} failed ({:?}):\n{}{}",
            output.status.code(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }
}

fn code(output: &Output) -> Option<i32> {
    output.status.code()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Golden output with what changes from run to run replaced.
fn golden(name: &str, text: &str) {
    insta::with_settings!({
        filters => vec![
            (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "[uuid]"),
            (r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", "[time]"),
            (r"\d{4}-\d{2}-\d{2}T[0-9:.]+(Z|[+-]\d{2}:\d{2})", "[time]"),
            (r"\b\d+[smhd]( \d+[smhd])?\b", "[age]"),
            (r"dead tuples \d+ \(live \d+\)", "dead tuples [n] (live [n])"),
            (r"audit row \d+", "audit row [n]"),
            (r"(?m)^\d+(\s+)\[time\]", "[n]$1[time]"),
            (r"t\d+_\d+_\d+x*", "[schema]"),
            // The relay worker's session and how many partitions it had
            // reported by then (its row is refreshed every second).
            (r"pid \d+( \(gone\))?\s+\d+ of 256(: [0-9, -]+)?", "pid [pid] [n] of 256"),
            (r"SESSION\s+PARTITIONS", "SESSION PARTITIONS"),
        ],
        prepend_module_to_snapshot => false,
    }, {
        insta::assert_snapshot!(name, text);
    });
}

fn charge(id: &str, cents: i64) -> CardCharged {
    CardCharged {
        charge_id: id.into(),
        card_number: SECRET,
        amount_cents: cents,
    }
}

// The tool runs as a blocking child process while the relay and the
// consumer run on the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_is_found_repaired_and_audited_with_the_cli() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let tool = Tool { db: &db };

    // ---- A publish failure blocks an aggregate.
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox
        .emit_all(
            &mut tx,
            &[
                charge("ch-1", 100),
                charge("ch-1", 200),
                charge("ch-1", 300),
            ],
        )
        .await
        .unwrap();
    db.outbox.emit(&mut tx, &charge("ch-2", 50)).await.unwrap();
    tx.commit().await.unwrap();
    let broken = Arc::new(AtomicBool::new(true));
    let flag = Arc::clone(&broken);
    let transport = RecordingTransport::failing(move |e: &Envelope| {
        (flag.load(AtomicOrdering::SeqCst) && e.aggregate_id == "ch-1" && e.aggregate_version == 1)
            .then(|| PublishFailure::permanent("message too large for the broker"))
    });
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        backoff: Backoff {
            initial: Duration::from_millis(30),
            max: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.0,
        },
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let store = PgRelayStore::new(
        db.pool.clone(),
        db.schema.clone(),
        config.failed_head_policy,
        config.claim_timeout,
    );
    let relay = Relay::start(store, transport.clone(), config, "cli")
        .await
        .unwrap();
    wait::until(
        "ch-1 v1 failed, ch-2 published",
        Duration::from_secs(20),
        || async {
            db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events WHERE status = 'failed'")
                .await
                == 1
                && db.published().await == 1
        },
    )
    .await;

    // ---- status --check finds it.
    let status = tool.run(&["status", "--check"]);
    assert_eq!(code(&status), Some(1), "{}", stderr(&status));
    let text = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(
        text.contains("aggregate card/ch-1 is blocked by") && text.contains("message too large"),
        "{text}"
    );
    golden("status_check", &text);
    let json = tool.json(&["status"]);
    assert_eq!(json["backlog"]["failed"], 1);
    assert_eq!(json["blocked"][0]["aggregate_id"], "ch-1");
    assert_eq!(json["blocked"][0]["head_status"], "failed");
    let failed_id = json["blocked"][0]["head_event_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // ---- failed list / show, payload redacted.
    golden("failed_list", &tool.ok(&["failed", "list"]));
    let listed = tool.json(&["failed", "list"]);
    assert_eq!(listed["items"][0]["id"], failed_id.as_str());
    assert_eq!(listed["items"][0]["attempts"], 1);
    assert_eq!(listed["items"][0]["payload"]["card_number"], "[REDACTED]");
    let shown = tool.ok(&["failed", "show", &failed_id]);
    golden("failed_show", &shown);
    assert!(!shown.contains(&SECRET.to_string()), "{shown}");
    assert!(shown.contains("\"amount_cents\": 100"), "{shown}");

    // ---- Refusals change nothing.
    let no_reason = tool.run(&["failed", "retry", "--id", &failed_id]);
    assert_eq!(code(&no_reason), Some(2));
    assert!(
        stderr(&no_reason).contains("needs a reason"),
        "{}",
        stderr(&no_reason)
    );
    let no_ids = tool.run(&["failed", "retry", "--reason", "fixed"]);
    assert_eq!(code(&no_ids), Some(2));
    assert!(
        stderr(&no_ids).contains("there is no repair of everything"),
        "{}",
        stderr(&no_ids)
    );
    let no_limit = tool.run(&[
        "failed",
        "retry",
        "--event-type",
        "card.charged",
        "--reason",
        "fixed",
    ]);
    assert_eq!(code(&no_limit), Some(2));
    assert!(
        stderr(&no_limit).contains("explicit --limit"),
        "{}",
        stderr(&no_limit)
    );
    let unconfirmed = tool.run(&[
        "failed",
        "retry",
        "--event-type",
        "card.charged",
        "--limit",
        "5",
        "--reason",
        "fixed",
    ]);
    assert_eq!(code(&unconfirmed), Some(2));
    assert!(
        stderr(&unconfirmed).contains("--yes"),
        "{}",
        stderr(&unconfirmed)
    );
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events WHERE status = 'failed'")
            .await,
        1
    );
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_audit")
            .await,
        0
    );

    // ---- The broker is fixed; retry the head with a reason.
    broken.store(false, AtomicOrdering::SeqCst);
    let retried = tool.ok(&[
        "failed",
        "retry",
        "--id",
        &failed_id,
        "--reason",
        "broker max_payload raised to 8 MB",
        "--operator",
        "ada",
    ]);
    golden("failed_retry", &retried);
    wait::until(
        "ch-1 published in order",
        Duration::from_secs(20),
        || async { db.published().await == 4 },
    )
    .await;
    relay.drain(Duration::from_secs(5)).await.unwrap();
    let ch1: Vec<i64> = transport
        .published()
        .iter()
        .filter(|e| e.aggregate_id == "ch-1")
        .map(|e| e.aggregate_version)
        .collect();
    assert_eq!(ch1, vec![1, 2, 3], "the aggregate continued in order");
    let after = tool.run(&["status", "--check"]);
    assert_eq!(
        code(&after),
        Some(0),
        "{}",
        String::from_utf8_lossy(&after.stdout)
    );

    // ---- A v3 message quarantined at a v2 consumer, replayed after the upgrade.
    let strict = ConsumerConfig {
        ordering: Ordering::Strict {
            park_timeout: Duration::from_secs(60),
        },
        sweep_interval: Duration::from_millis(100),
        ..ConsumerConfig::default()
    };
    let old = ConsumerBuilder::new("parcels")
        .config(strict.clone())
        .registry(ContractRegistry::from_contracts([ParcelBookedV2::contract()]).unwrap())
        .on_fn::<ParcelBookedV2, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let v3 = Envelope::for_event(
        &ParcelBooked {
            parcel_id: "p1".into(),
            weight_kg: 2.5,
            carrier: "DHL".into(),
        },
        1,
    )
    .unwrap();
    assert!(matches!(
        old.handle_envelope(&v3).await.unwrap(),
        Outcome::Quarantined { .. }
    ));
    golden(
        "quarantine_list",
        // --consumer goes before or after the subcommand.
        &tool.ok(&["quarantine", "list", "--consumer", "parcels"]),
    );
    let quarantined = tool.json(&["quarantine", "--consumer", "parcels", "list"]);
    let letter_id = quarantined["items"][0]["id"].as_i64().unwrap().to_string();
    assert_eq!(quarantined["items"][0]["kind"], "quarantined");
    assert!(
        quarantined["items"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("schema version 3 is newer")
    );
    // The upgraded consumer runs; the operator asks it to replay.
    let upgraded = ConsumerBuilder::new("parcels")
        .config(strict)
        .on_fn::<ParcelBooked, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let (sender, source) = channel();
    let task = upgraded.spawn(source);
    let replayed = tool.ok(&[
        "quarantine",
        "--consumer",
        "parcels",
        "replay",
        "--id",
        &letter_id,
        "--reason",
        "parcels upgraded to read parcel.booked v3",
        "--wait",
        "20s",
    ]);
    assert!(
        replayed.contains("1 of 1 replay(s) ran by parcels applied their event"),
        "{replayed}"
    );
    golden("quarantine_replay", &replayed);
    assert_eq!(effects(&db, "parcels").await.len(), 1, "applied once");
    // Asking again: the letter is closed; nothing changes and the tool
    // exits 1.
    let again = tool.run(&[
        "--json",
        "quarantine",
        "--consumer",
        "parcels",
        "replay",
        "--id",
        &letter_id,
        "--reason",
        "again",
    ]);
    assert_eq!(code(&again), Some(1), "{}", stderr(&again));
    let again: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["outcomes"][0]["outcome"], "already_resolved");
    drop(sender);
    task.drain(Duration::from_secs(5)).await.unwrap();
    assert_eq!(effects(&db, "parcels").await.len(), 1, "still once");

    // ---- A dead letter, replayed once after the handler is fixed.
    let retry_once = ConsumerConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        sweep_interval: Duration::from_millis(100),
        ..ConsumerConfig::default()
    };
    let broken_consumer =
        tick_consumer(&db, "billing", retry_once.clone(), Duration::ZERO, &["c9"]);
    assert!(matches!(
        broken_consumer
            .handle_envelope(&tick("c9", 1))
            .await
            .unwrap(),
        Outcome::DeadLettered { .. }
    ));
    let letters = tool.json(&["dead-letters", "--consumer", "billing", "list"]);
    let dead_id = letters["items"][0]["id"].as_i64().unwrap().to_string();
    assert_eq!(letters["items"][0]["kind"], "dead_lettered");
    assert_eq!(letters["items"][0]["aggregate_id"], "c9");
    golden(
        "dead_letter_show",
        &tool.ok(&["dead-letters", "--consumer", "billing", "show", &dead_id]),
    );
    let fixed = tick_consumer(&db, "billing", retry_once, Duration::ZERO, &[]);
    let (sender, source) = channel();
    let task = fixed.spawn(source);
    tool.ok(&[
        "dead-letters",
        "--consumer",
        "billing",
        "replay",
        "--id",
        &dead_id,
        "--reason",
        "downstream accepts c9 again",
        "--wait",
        "20s",
    ]);
    assert_eq!(effects(&db, "billing").await.len(), 1);
    drop(sender);
    task.drain(Duration::from_secs(5)).await.unwrap();

    // ---- Every repair left an audit row.
    let audit = tool.json(&["audit", "list"]);
    let rows = audit["items"].as_array().unwrap();
    let actions: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["operator"].as_str().unwrap(),
                r["target"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        vec![
            ("consumer.replay", "ci-operator", "billing"),
            ("consumer.replay", "ci-operator", "parcels"),
            ("consumer.replay", "ci-operator", "parcels"),
            ("relay.retry", "ada", "relay"),
        ]
    );
    let retry_row = &rows[3];
    assert_eq!(retry_row["reason"], "broker max_payload raised to 8 MB");
    assert_eq!(retry_row["ids"][0], failed_id.as_str());
    assert_eq!(retry_row["outcomes"][0]["outcome"], "retried");
    let replay_row = &rows[2];
    let replay_outcomes: Vec<&str> = replay_row["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(replay_outcomes, vec!["replay_requested", "applied"]);
    golden("audit_list", &tool.ok(&["audit", "list"]));

    // ---- An event type the tool has no contract for: every value masked.
    db.execute(
        "INSERT INTO {s}.outbox_events (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload, status, failed_at, last_error)
         VALUES (gen_random_uuid(), 'secret', 's1', 1, 'secret.kept', 1, '{\"pin\": \"9999\", \"name\": \"x\"}', 'failed', now(), 'refused')",
    )
    .await;
    let unknown = tool.json(&["failed", "list", "--event-type", "secret.kept"]);
    assert_eq!(unknown["items"][0]["payload"]["pin"], "[REDACTED]");
    assert_eq!(unknown["items"][0]["payload"]["name"], "[REDACTED]");
    let keys_only = tool.json(&[
        "--redact-keys",
        "pin",
        "failed",
        "list",
        "--event-type",
        "secret.kept",
    ]);
    assert_eq!(keys_only["items"][0]["payload"]["pin"], "[REDACTED]");
    assert_eq!(keys_only["items"][0]["payload"]["name"], "x");
    db.drop_schema().await;
}
