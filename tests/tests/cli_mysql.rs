//! The `outbox` CLI on MariaDB (`--database-url mysql://…`, the
//! `outbox-mysql` store), run as a process: a status on a database without
//! the outbox tables is refused; `migrate` creates them; a publish failure
//! blocks an aggregate and
//! `status --check` names it; `failed show` masks the redacted card
//! number; `failed retry` without a reason changes nothing, with one it
//! puts the head back and the relay drains the aggregate in order; the
//! audit shows the repair; `cleanup` counts before it deletes. A MySQL
//! consumer's dead letters are listed, shown, grouped, replayed through
//! the running consumer and discarded, its position shown, each repair
//! audited.

use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::relay::{Backoff, RelayConfig};
use outbox_core::transport::PublishFailure;
use outbox_mysql::MySqlOutbox;
use outbox_tests::events::CardCharged;
use outbox_tests::mysql::MySqlTestDb;
use outbox_tests::transports::RecordingTransport;
use outbox_tests::wait;
use serde_json::Value;

const SECRET: u64 = 4_111_999_988_887_777;

fn tool(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-tool"))
        .env_remove("DATABASE_URL")
        .args(["--database-url", url])
        .args(args)
        .env("USER", "ci-operator")
        .output()
        .expect("run outbox-tool")
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn json(url: &str, args: &[&str], code: i32) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let output = tool(url, &all);
    assert_eq!(output.status.code(), Some(code), "{}", text(&output));
    serde_json::from_slice(&output.stdout).expect("one JSON document")
}

fn charge(id: &str, cents: i64) -> CardCharged {
    CardCharged {
        charge_id: id.into(),
        card_number: SECRET,
        amount_cents: cents,
    }
}

fn quick(max_attempts: u32) -> RelayConfig {
    RelayConfig {
        poll_interval: Duration::from_millis(20),
        max_attempts,
        backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(10),
            multiplier: 1.0,
            jitter: 0.0,
        },
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_on_mariadb_is_found_repaired_and_audited_with_the_cli() {
    let db = MySqlTestDb::new().await;
    let url = db.url();
    sqlx::query("DROP TABLE outbox_events")
        .execute(&db.pool)
        .await
        .unwrap();
    let missing = tool(&url, &["status"]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(
        text(&missing).contains("no outbox tables"),
        "{}",
        text(&missing)
    );

    let migrated = json(&url, &["migrate"], 0);
    assert_eq!(migrated["migrated"], true);
    assert_eq!(migrated["schema_version"], outbox_mysql::SCHEMA_VERSION);

    // Three versions of charge-1 and one of charge-2; the broker refuses
    // charge-1 for good until it is "fixed".
    let pool = db.pool.clone();
    let outbox = MySqlOutbox::new();
    for (id, cents) in [
        ("charge-1", 100),
        ("charge-1", 200),
        ("charge-1", 300),
        ("charge-2", 50),
    ] {
        let mut tx = pool.begin().await.unwrap();
        outbox.emit(&mut tx, &charge(id, cents)).await.unwrap();
        tx.commit().await.unwrap();
    }
    let fixed = Arc::new(AtomicBool::new(false));
    let broker_fixed = Arc::clone(&fixed);
    let transport = RecordingTransport::failing(move |envelope| {
        (envelope.aggregate_id == "charge-1" && !broker_fixed.load(Ordering::SeqCst))
            .then(|| PublishFailure::permanent("message too large for the stream"))
    });
    let relay = outbox_mysql::start_relay(pool.clone(), transport.clone(), quick(1))
        .await
        .unwrap();
    wait::until("charge-1's head to fail", Duration::from_secs(20), || {
        let url = url.clone();
        async move { json(&url, &["status"], 0)["backlog"]["failed"] == 1 }
    })
    .await;

    let status = tool(&url, &["status", "--check"]);
    assert_eq!(status.status.code(), Some(1), "{}", text(&status));
    let shown = text(&status);
    assert!(shown.contains("card/charge-1"), "{shown}");
    assert!(shown.contains("1 event(s) failed"), "{shown}");

    let failed = json(&url, &["failed", "list"], 0);
    let head = failed["items"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(failed["items"].as_array().unwrap().len(), 1);
    assert_eq!(failed["items"][0]["aggregate_version"], 1);

    let show = tool(&url, &["failed", "show", &head]);
    let shown = text(&show);
    assert_eq!(show.status.code(), Some(0), "{shown}");
    assert!(shown.contains("message too large"), "{shown}");
    assert!(shown.contains("amount_cents"), "{shown}");
    assert!(!shown.contains(&SECRET.to_string()), "{shown}");

    let refused = tool(&url, &["failed", "retry", "--id", &head]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert_eq!(
        json(&url, &["audit", "list"], 0)["items"],
        Value::Array(vec![])
    );

    fixed.store(true, Ordering::SeqCst);
    let report = json(
        &url,
        &[
            "failed",
            "retry",
            "--id",
            &head,
            "--reason",
            "stream limit raised in INC-9",
        ],
        0,
    );
    assert_eq!(report["outcomes"][0]["outcome"], "retried");
    wait::until("every event published", Duration::from_secs(20), || {
        let transport = transport.clone();
        async move { transport.published_count() == 4 }
    })
    .await;
    // Every outcome recorded before the tool looks.
    relay.drain(Duration::from_secs(5)).await.unwrap();
    let versions: Vec<i64> = transport
        .published()
        .iter()
        .filter(|e| e.aggregate_id == "charge-1")
        .map(|e| e.aggregate_version)
        .collect();
    assert_eq!(versions, [1, 2, 3]);
    let healthy = tool(&url, &["status", "--check"]);
    assert_eq!(healthy.status.code(), Some(0), "{}", text(&healthy));

    let audit = json(&url, &["audit", "list"], 0);
    let row = &audit["items"][0];
    assert_eq!(row["action"], "relay.retry");
    assert_eq!(row["operator"], "ci-operator");
    assert_eq!(row["reason"], "stream limit raised in INC-9");
    assert_eq!(row["ids"][0], head.as_str());

    let consumer = json(&url, &["quarantine", "list", "--consumer", "billing"], 0);
    assert_eq!(consumer["items"], serde_json::json!([]), "{consumer}");

    let dry = json(&url, &["cleanup", "--older-than", "0s"], 0);
    assert_eq!(
        (dry["eligible"].as_i64(), dry["executed"].as_bool()),
        (Some(4), Some(false))
    );
    let published = json(&url, &["events", "list", "--status", "published"], 0);
    assert_eq!(published["items"].as_array().unwrap().len(), 4);
    db.drop_database().await;
}

/// A consumer on the database whose handler refuses every counter but
/// `c1` while `broken` is set (permanently: straight to the dead letters).
fn ledger(
    pool: &sqlx::MySqlPool,
    broken: Arc<AtomicBool>,
) -> outbox_core::consumer::Consumer<outbox_mysql::MySqlConsumerStore> {
    use outbox_core::consumer::{ConsumerBuilder, ConsumerConfig, HandlerError, Ordering as Order};
    ConsumerBuilder::<sqlx::MySqlConnection>::for_connection("billing")
        .config(ConsumerConfig {
            ordering: Order::Strict {
                park_timeout: Duration::from_secs(60),
            },
            sweep_interval: Duration::from_millis(100),
            ..ConsumerConfig::default()
        })
        .on_fn::<outbox_tests::events::Ticked, _>(move |tick, tx| {
            let broken = broken.load(Ordering::SeqCst);
            Box::pin(async move {
                if broken && tick.event.counter != "c1" {
                    return Err(HandlerError::permanent("the ledger refuses this counter"));
                }
                sqlx::query("INSERT INTO effects (counter, version) VALUES (?, ?)")
                    .bind(&tick.event.counter)
                    .bind(tick.meta.aggregate_version)
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            })
        })
        .build_on(outbox_mysql::MySqlConsumerStore::new(pool.clone()))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_reads_and_repairs_a_mysql_consumers_letters_and_positions() {
    use outbox_core::consumer::Outcome;
    use outbox_tests::consumers::tick;
    let db = MySqlTestDb::new().await;
    let url = db.url();
    sqlx::query(
        "CREATE TABLE effects (seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                               counter VARCHAR(100) NOT NULL, version BIGINT NOT NULL)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let broken = Arc::new(AtomicBool::new(true));
    let consumer = ledger(&db.pool, Arc::clone(&broken));
    assert_eq!(
        consumer.handle_envelope(&tick("c1", 1)).await.unwrap(),
        Outcome::Applied
    );
    for counter in ["c9", "c8"] {
        let outcome = consumer.handle_envelope(&tick(counter, 1)).await.unwrap();
        assert!(
            matches!(outcome, Outcome::DeadLettered { .. }),
            "{outcome:?}"
        );
    }
    let letters = json(&url, &["dead-letters", "--consumer", "billing", "list"], 0);
    let items = letters["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{letters}");
    assert_eq!(items[0]["kind"], "dead_lettered");
    assert_eq!(items[0]["aggregate_id"], "c9");
    assert!(
        items[0]["reason"]
            .as_str()
            .unwrap()
            .contains("the ledger refuses this counter")
    );
    let c9 = items[0]["id"].as_i64().unwrap().to_string();
    let c8 = items[1]["id"].as_i64().unwrap().to_string();
    let shown = tool(
        &url,
        &["dead-letters", "--consumer", "billing", "show", &c9],
    );
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
    assert!(text(&shown).contains("c9"), "{}", text(&shown));
    let grouped = tool(
        &url,
        &["dead-letters", "--consumer", "billing", "list", "--group"],
    );
    assert!(
        text(&grouped).contains("the ledger refuses this counter"),
        "{}",
        text(&grouped)
    );

    // The fixed consumer runs; the tool asks it to replay c9 and waits.
    broken.store(false, Ordering::SeqCst);
    let (sender, source) = outbox_core::consumer::channel();
    let task = ledger(&db.pool, Arc::clone(&broken)).spawn(source);
    let replayed = tool(
        &url,
        &[
            "dead-letters",
            "--consumer",
            "billing",
            "replay",
            "--id",
            &c9,
            "--reason",
            "the ledger accepts c9 again",
            "--wait",
            "20s",
        ],
    );
    assert_eq!(replayed.status.code(), Some(0), "{}", text(&replayed));
    let applied: Vec<(String, i64)> =
        sqlx::query_as("SELECT counter, version FROM effects ORDER BY seq")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(applied, [("c1".to_owned(), 1), ("c9".to_owned(), 1)]);
    drop(sender);
    task.drain(Duration::from_secs(5)).await.unwrap();

    // c8 is discarded instead; a second discard finds it resolved.
    let discard = [
        "dead-letters",
        "--consumer",
        "billing",
        "discard",
        "--id",
        &c8,
        "--reason",
        "c8 was a test counter",
    ];
    let discarded = json(&url, &discard, 0);
    assert_eq!(
        discarded["outcomes"][0]["outcome"], "discarded",
        "{discarded}"
    );
    let again = tool(&url, &discard);
    assert!(
        text(&again).contains("already_resolved"),
        "{}",
        text(&again)
    );
    let open = json(&url, &["dead-letters", "--consumer", "billing", "list"], 0);
    assert_eq!(open["items"], serde_json::json!([]), "{open}");
    let position = json(
        &url,
        &[
            "positions",
            "--consumer",
            "billing",
            "show",
            "--aggregate-type",
            "counter",
            "--aggregate-id",
            "c9",
        ],
        0,
    );
    assert_eq!(position["version"], 1, "{position}");
    let audit = json(&url, &["audit", "list"], 0);
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["consumer.discard", "consumer.discard", "consumer.replay"]
    );
    let replay_row = &audit["items"][2];
    assert_eq!(replay_row["operator"], "ci-operator");
    assert!(
        replay_row["outcomes"].to_string().contains("applied"),
        "the consumer appended what the replay did: {replay_row}"
    );
    db.drop_database().await;
}
