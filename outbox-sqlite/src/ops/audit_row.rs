//! The audit row every SQLite repair writes before it changes anything (who,
//! when, why, which ids) and completes with what happened to each id.

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{IdOutcome, OpsError, RepairReport};
use sqlx::{Sqlite, SqliteExecutor, SqlitePool, Transaction};

use crate::now_ms;

/// Begins a repair's transaction as the writer (`BEGIN IMMEDIATE`), so its
/// reads and writes see one state and it never upgrades a read lock.
pub(super) async fn begin_repair(
    pool: &SqlitePool,
) -> Result<Transaction<'static, Sqlite>, OpsError> {
    pool.begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(OpsError::database("beginning a repair"))
}

/// Writes a repair's audit row; returns its id. `ids` is what the repair
/// was asked to touch, stored as given.
pub(super) async fn open_audit(
    executor: impl SqliteExecutor<'_>,
    request: &RepairRequest,
    action: &str,
    target: &str,
    ids: &serde_json::Value,
) -> Result<i64, OpsError> {
    insert_audit(executor, request, action, target, &ids.to_string())
        .await
        .map_err(OpsError::database("writing the audit row"))
}

/// The audit row's insert, for the operations API and for the consumer
/// (which audits the replays it runs); `ids_json` is a JSON array.
pub(crate) async fn insert_audit(
    executor: impl SqliteExecutor<'_>,
    request: &RepairRequest,
    action: &str,
    target: &str,
    ids_json: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "INSERT INTO outbox_audit (at, operator, reason, action, target, ids)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
    )
    .bind(now_ms())
    .bind(request.operator())
    .bind(request.reason())
    .bind(action)
    .bind(target)
    .bind(ids_json)
    .fetch_one(executor)
    .await
}

/// Stores what a repair did on its audit row.
pub(super) async fn complete_audit(
    executor: impl SqliteExecutor<'_>,
    audit_id: i64,
    outcomes: &serde_json::Value,
) -> Result<(), OpsError> {
    sqlx::query("UPDATE outbox_audit SET outcomes = ?1 WHERE id = ?2")
        .bind(outcomes.to_string())
        .bind(audit_id)
        .execute(executor)
        .await
        .map_err(OpsError::database("completing the audit row"))?;
    Ok(())
}

/// Records each id's outcome on the audit row and commits the repair.
pub(super) async fn close_audit(
    mut tx: Transaction<'_, Sqlite>,
    audit_id: i64,
    outcomes: Vec<IdOutcome>,
) -> Result<RepairReport, OpsError> {
    let json = serde_json::to_value(&outcomes).map_err(|e| OpsError::Database {
        doing: "completing the audit row",
        source: sqlx::Error::Encode(e.into()),
    })?;
    complete_audit(&mut *tx, audit_id, &json).await?;
    tx.commit()
        .await
        .map_err(OpsError::database("committing a repair"))?;
    Ok(RepairReport { audit_id, outcomes })
}
