//! The operations API over the MySQL/MariaDB outbox: the relay side of
//! [`outbox_core::ops::OperationsStore`] (status, listings, blocked
//! aggregates, the audit log, the relay's repairs, retention) with the
//! same records, filters, pages, reports and outcomes as the PostgreSQL
//! store's [`outbox_core::ops::Ops`].

mod reads;
mod repair;

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{
    AuditRecord, BlockedRecord, Cleanup, CleanupProgress, CleanupReport, EventFilter, EventRecord,
    OperationsStore, OpsError, Page, Redaction, RepairReport, Status, StatusOptions,
};
use sqlx::MySqlPool;
use uuid::Uuid;

/// The operations API over the MySQL/MariaDB outbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MySqlOps {
    pool: MySqlPool,
    redaction: Redaction,
}

impl MySqlOps {
    /// Operations through `pool`.
    pub fn new(pool: MySqlPool) -> MySqlOps {
        MySqlOps {
            pool,
            redaction: Redaction::default(),
        }
    }

    /// Shows payloads with `redaction` (default: the contracts in this
    /// binary, every value of unknown event types masked).
    pub fn with_redaction(mut self, redaction: Redaction) -> MySqlOps {
        self.redaction = redaction;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
}

fn database(doing: &'static str) -> impl FnOnce(sqlx::Error) -> OpsError {
    move |source| OpsError::Database { doing, source }
}

impl OperationsStore for MySqlOps {
    async fn status(&self, options: &StatusOptions) -> Result<Status, OpsError> {
        MySqlOps::status(self, options).await
    }

    async fn events(&self, filter: &EventFilter) -> Result<Page<EventRecord>, OpsError> {
        MySqlOps::events(self, filter).await
    }

    async fn event(&self, id: Uuid) -> Result<Option<EventRecord>, OpsError> {
        MySqlOps::event(self, id).await
    }

    async fn blocked(&self, limit: i64) -> Result<Vec<BlockedRecord>, OpsError> {
        MySqlOps::blocked(self, limit).await
    }

    async fn audit(
        &self,
        before: Option<i64>,
        limit: Option<i64>,
    ) -> Result<Page<AuditRecord>, OpsError> {
        MySqlOps::audit(self, before, limit).await
    }

    async fn retry_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        MySqlOps::retry_failed(self, ids, request).await
    }

    async fn skip_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        MySqlOps::skip_failed(self, ids, request).await
    }

    async fn republish(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        MySqlOps::republish(self, ids, request).await
    }

    async fn retry_blocked(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        MySqlOps::retry_blocked(self, ids, request).await
    }

    async fn cleanup(
        &self,
        plan: &Cleanup,
        request: &RepairRequest,
        progress: CleanupProgress<'_>,
    ) -> Result<CleanupReport, OpsError> {
        MySqlOps::cleanup(self, plan, request, |deleted, eligible| {
            progress(deleted, eligible)
        })
        .await
    }
}
