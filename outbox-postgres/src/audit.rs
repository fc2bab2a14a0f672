//! The audit table's statements: a row is written when a repair starts
//! (who, why, what, which ids) and completed with what happened to each
//! id, so a repair cut short still shows that it was asked for.

use sqlx::{AssertSqlSafe, PgConnection};

use outbox_core::audit::RepairRequest;
use outbox_core::store::SchemaName;

/// The audit statements of one schema.
#[derive(Debug, Clone)]
pub(crate) struct AuditSql {
    begin: String,
    finish: String,
    append: String,
}

impl AuditSql {
    pub(crate) fn new(schema: &SchemaName) -> AuditSql {
        let s = schema.quoted();
        AuditSql {
            begin: format!(
                "INSERT INTO {s}.outbox_audit (operator, reason, action, target, ids)
                 VALUES ($1, $2, $3, $4, $5) RETURNING id"
            ),
            finish: format!("UPDATE {s}.outbox_audit SET outcomes = $2 WHERE id = $1"),
            append: format!("UPDATE {s}.outbox_audit SET outcomes = outcomes || $2 WHERE id = $1"),
        }
    }

    /// Records that a repair starts; returns the audit row's id.
    pub(crate) async fn begin(
        &self,
        conn: &mut PgConnection,
        request: &RepairRequest,
        action: &str,
        target: &str,
        ids: &[String],
    ) -> sqlx::Result<i64> {
        sqlx::query_scalar(AssertSqlSafe(self.begin.as_str()))
            .bind(request.operator())
            .bind(request.reason())
            .bind(action)
            .bind(target)
            .bind(ids)
            .fetch_one(conn)
            .await
    }

    /// Adds outcomes to a row (a requested replay that ran later).
    pub(crate) async fn append(
        &self,
        conn: &mut PgConnection,
        audit_id: i64,
        outcomes: &serde_json::Value,
    ) -> sqlx::Result<()> {
        sqlx::query(AssertSqlSafe(self.append.as_str()))
            .bind(audit_id)
            .bind(outcomes)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Records what happened to each id.
    pub(crate) async fn finish(
        &self,
        conn: &mut PgConnection,
        audit_id: i64,
        outcomes: &serde_json::Value,
    ) -> sqlx::Result<()> {
        sqlx::query(AssertSqlSafe(self.finish.as_str()))
            .bind(audit_id)
            .bind(outcomes)
            .execute(conn)
            .await?;
        Ok(())
    }
}
