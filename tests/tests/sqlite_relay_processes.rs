//! Relays in several processes on one SQLite file, publishing to a real
//! JetStream: one hangs after its claim and holds its aggregates; the
//! others are killed with SIGKILL and started again, and one is stopped
//! with SIGSTOP past its lease, while a producer emits. Every event
//! reaches the stream, each aggregate's versions first arrive in order
//! (the scenario: `outbox_tests::relay_processes`).

use std::path::Path;

use outbox_tests::relay_processes::{self, SharedStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_processes_killed_and_stopped_on_one_file_keep_every_aggregate_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let db_url = format!("sqlite://{}", dir.path().join("outbox.db").display());
    let pool = outbox_sqlite::connect(&db_url).await.unwrap();
    outbox_sqlite::migrate(&pool).await.unwrap();
    relay_processes::run(
        SharedStore::Sqlite(pool),
        &db_url,
        Path::new(env!("CARGO_BIN_EXE_store-relay-process")),
    )
    .await;
}
