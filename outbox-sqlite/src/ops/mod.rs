//! The operations API over the SQLite outbox: the relay side of
//! [`outbox_core::ops::OperationsStore`] (status, listings, blocked
//! aggregates, the audit log, the relay's repairs, retention), with the same
//! records, filters, pages, reports and outcomes as the PostgreSQL store's
//! [`outbox_core::ops::Ops`], so the `outbox` CLI runs its relay commands
//! on a SQLite file unchanged.

mod cleanup;
mod reads;
mod repair;

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{
    AuditRecord, BlockedRecord, Cleanup, CleanupProgress, CleanupReport, EventFilter, EventRecord,
    OperationsStore, OpsError, Page, Redaction, RepairReport, Status, StatusOptions,
};
use sqlx::SqlitePool;
use uuid::Uuid;

/// The operations API over the SQLite outbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteOps {
    pool: SqlitePool,
    redaction: Redaction,
}

impl SqliteOps {
    /// Operations through `pool` (the service's pool is fine: repairs are
    /// rare and commit with `pool`'s durability).
    pub fn new(pool: SqlitePool) -> SqliteOps {
        SqliteOps {
            pool,
            redaction: Redaction::default(),
        }
    }

    /// Shows payloads with `redaction` (default: the contracts in this
    /// binary, every value of unknown event types masked).
    pub fn with_redaction(mut self, redaction: Redaction) -> SqliteOps {
        self.redaction = redaction;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

fn database(doing: &'static str) -> impl FnOnce(sqlx::Error) -> OpsError {
    move |source| OpsError::Database { doing, source }
}

impl OperationsStore for SqliteOps {
    async fn status(&self, options: &StatusOptions) -> Result<Status, OpsError> {
        SqliteOps::status(self, options).await
    }

    async fn events(&self, filter: &EventFilter) -> Result<Page<EventRecord>, OpsError> {
        SqliteOps::events(self, filter).await
    }

    async fn event(&self, id: Uuid) -> Result<Option<EventRecord>, OpsError> {
        SqliteOps::event(self, id).await
    }

    async fn blocked(&self, limit: i64) -> Result<Vec<BlockedRecord>, OpsError> {
        SqliteOps::blocked(self, limit).await
    }

    async fn audit(
        &self,
        before: Option<i64>,
        limit: Option<i64>,
    ) -> Result<Page<AuditRecord>, OpsError> {
        SqliteOps::audit(self, before, limit).await
    }

    async fn retry_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        SqliteOps::retry_failed(self, ids, request).await
    }

    async fn skip_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        SqliteOps::skip_failed(self, ids, request).await
    }

    async fn republish(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        SqliteOps::republish(self, ids, request).await
    }

    async fn retry_blocked(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        SqliteOps::retry_blocked(self, ids, request).await
    }

    async fn cleanup(
        &self,
        plan: &Cleanup,
        request: &RepairRequest,
        progress: CleanupProgress<'_>,
    ) -> Result<CleanupReport, OpsError> {
        SqliteOps::cleanup(self, plan, request, |deleted, eligible| {
            progress(deleted, eligible)
        })
        .await
    }
}
