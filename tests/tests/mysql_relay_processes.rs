//! Relays in several processes on one MariaDB database, publishing to a
//! real JetStream: one hangs after its claim and holds its aggregates; the
//! others are killed with SIGKILL and started again, and one is stopped
//! with SIGSTOP past its lease, while a producer emits. Every event
//! reaches the stream, each aggregate's versions first arrive in order
//! (the scenario: `outbox_tests::relay_processes`).

use std::path::Path;

use outbox_tests::mysql::MySqlTestDb;
use outbox_tests::relay_processes::{self, SharedStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_processes_killed_and_stopped_on_one_database_keep_every_aggregate_in_order() {
    let db = MySqlTestDb::new().await;
    relay_processes::run(
        SharedStore::MySql(db.pool.clone()),
        &db.url(),
        Path::new(env!("CARGO_BIN_EXE_store-relay-process")),
    )
    .await;
    db.drop_database().await;
}
