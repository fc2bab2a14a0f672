//! The operations seam: what an operator reads and repairs of the relay's
//! side of an outbox (backlog, events, blocked aggregates, audit, the
//! relay's repairs and retention), whatever store keeps it. `outbox_postgres::Ops` is the
//! PostgreSQL store's; `outbox_sqlite::SqliteOps` is SQLite's,
//! `outbox_mysql::MySqlOps` MySQL's. The `outbox`
//! CLI drives its relay commands through this trait only, so a store that
//! implements it gets `status`, `failed`, `events`, `blocked`, `audit` and
//! `cleanup`.
//!
//! The consumer's side (letters, positions, replay requests, passing a
//! version) is [`LetterStore`], implemented by the stores that keep
//! consumer tables (`outbox_postgres::Ops`, `outbox_sqlite::SqliteOps` and
//! `outbox_mysql::MySqlOps`); the CLI's
//! `quarantine`, `dead-letters` and `positions` commands are written
//! against it.
//!
//! Every method returns a `Send` future, so a generic caller can run it on
//! a multi-threaded runtime (it borrows its arguments: wrap it in an
//! `async move` block that owns them to spawn it).

use std::future::Future;

use uuid::Uuid;

use super::{
    AuditRecord, BlockedRecord, Cleanup, CleanupReport, EventFilter, EventRecord, LetterFilter,
    LetterKind, LetterRecord, OpsError, Page, PositionRecord, RepairReport, Status, StatusOptions,
};
use crate::audit::RepairRequest;

/// Progress of a cleanup: `(events deleted so far, events eligible)`.
pub type CleanupProgress<'a> = &'a mut (dyn FnMut(u64, i64) + Send);

/// An outbox store's operations over the relay's side. Each method means
/// what the method of the same name on `outbox_postgres::Ops` documents; stores differ
/// only in figures that exist on one of them (see [`Status`]).
pub trait OperationsStore: Send + Sync {
    /// The outbox at a glance, with the problems a check should flag.
    fn status(
        &self,
        options: &StatusOptions,
    ) -> impl Future<Output = Result<Status, OpsError>> + Send;

    /// Events with a status, filtered, oldest first.
    fn events(
        &self,
        filter: &EventFilter,
    ) -> impl Future<Output = Result<Page<EventRecord>, OpsError>> + Send;

    /// One event by id.
    fn event(&self, id: Uuid)
    -> impl Future<Output = Result<Option<EventRecord>, OpsError>> + Send;

    /// Aggregates whose head still blocks them, oldest first.
    fn blocked(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<BlockedRecord>, OpsError>> + Send;

    /// Audit rows, newest first; `before` is a page's `next`.
    fn audit(
        &self,
        before: Option<i64>,
        limit: Option<i64>,
    ) -> impl Future<Output = Result<Page<AuditRecord>, OpsError>> + Send;

    /// Failed events back to pending, from the first attempt.
    fn retry_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> impl Future<Output = Result<RepairReport, OpsError>> + Send;

    /// Failed heads to skipped; their aggregates go on.
    fn skip_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> impl Future<Output = Result<RepairReport, OpsError>> + Send;

    /// Published events published again, with their own ids.
    fn republish(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> impl Future<Output = Result<RepairReport, OpsError>> + Send;

    /// Retrying heads of blocked aggregates tried now.
    fn retry_blocked(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> impl Future<Output = Result<RepairReport, OpsError>> + Send;

    /// Retention: published events and idempotency keys older than their
    /// ages, in batches; a dry run unless `plan.execute`.
    fn cleanup(
        &self,
        plan: &Cleanup,
        request: &RepairRequest,
        progress: CleanupProgress<'_>,
    ) -> impl Future<Output = Result<CleanupReport, OpsError>> + Send;
}

/// The consumer's side of the operations API, for stores that keep consumer
/// tables. Each method means what the method of the same name on `outbox_postgres::Ops`
/// documents: the same filters, pages (payloads redacted), outcomes and
/// audit rows.
pub trait LetterStore: Send + Sync {
    /// A consumer's letters of one kind, filtered, oldest first.
    fn letters(
        &self,
        filter: &LetterFilter,
    ) -> impl Future<Output = Result<Page<LetterRecord>, OpsError>> + Send;

    /// One letter of a consumer by id.
    fn letter(
        &self,
        consumer: &str,
        id: i64,
    ) -> impl Future<Output = Result<Option<LetterRecord>, OpsError>> + Send;

    /// A consumer's position on one aggregate.
    fn position(
        &self,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> impl Future<Output = Result<Option<PositionRecord>, OpsError>> + Send;

    /// Moves a strict consumer's position past a version the producer
    /// skipped, only from the version before (audited).
    fn pass_version(
        &self,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
        version: i64,
        request: &RepairRequest,
    ) -> impl Future<Output = Result<RepairReport, OpsError>> + Send;

    /// Asks the running consumer to replay open letters (audited; the
    /// consumer appends each outcome to the audit row).
    fn request_replay(
        &self,
        consumer: &str,
        kind: LetterKind,
        letter_ids: &[i64],
        request: &RepairRequest,
    ) -> impl Future<Output = Result<RepairReport, OpsError>> + Send;

    /// Closes open letters without running them (audited).
    fn discard(
        &self,
        consumer: &str,
        kind: LetterKind,
        letter_ids: &[i64],
        request: &RepairRequest,
    ) -> impl Future<Output = Result<RepairReport, OpsError>> + Send;

    /// One audit row (a replay request's, with the outcomes the consumer
    /// appended when it ran them).
    fn audit_entry(
        &self,
        id: i64,
    ) -> impl Future<Output = Result<Option<AuditRecord>, OpsError>> + Send;
}

/// Implements [`OperationsStore`] for a store's operations type by calling
/// its inherent methods of the same names and signatures (each store keeps
/// them inherent, so its users need not import the trait).
#[macro_export]
macro_rules! operations_store_by_inherent_methods {
    ($ops:ty) => {
        impl $crate::ops::OperationsStore for $ops {
            async fn status(
                &self,
                options: &$crate::ops::StatusOptions,
            ) -> ::core::result::Result<$crate::ops::Status, $crate::ops::OpsError> {
                <$ops>::status(self, options).await
            }

            async fn events(
                &self,
                filter: &$crate::ops::EventFilter,
            ) -> ::core::result::Result<
                $crate::ops::Page<$crate::ops::EventRecord>,
                $crate::ops::OpsError,
            > {
                <$ops>::events(self, filter).await
            }

            async fn event(
                &self,
                id: $crate::__private::Uuid,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::ops::EventRecord>,
                $crate::ops::OpsError,
            > {
                <$ops>::event(self, id).await
            }

            async fn blocked(
                &self,
                limit: i64,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::ops::BlockedRecord>,
                $crate::ops::OpsError,
            > {
                <$ops>::blocked(self, limit).await
            }

            async fn audit(
                &self,
                before: ::core::option::Option<i64>,
                limit: ::core::option::Option<i64>,
            ) -> ::core::result::Result<
                $crate::ops::Page<$crate::ops::AuditRecord>,
                $crate::ops::OpsError,
            > {
                <$ops>::audit(self, before, limit).await
            }

            async fn retry_failed(
                &self,
                ids: &[$crate::__private::Uuid],
                request: &$crate::audit::RepairRequest,
            ) -> ::core::result::Result<$crate::ops::RepairReport, $crate::ops::OpsError> {
                <$ops>::retry_failed(self, ids, request).await
            }

            async fn skip_failed(
                &self,
                ids: &[$crate::__private::Uuid],
                request: &$crate::audit::RepairRequest,
            ) -> ::core::result::Result<$crate::ops::RepairReport, $crate::ops::OpsError> {
                <$ops>::skip_failed(self, ids, request).await
            }

            async fn republish(
                &self,
                ids: &[$crate::__private::Uuid],
                request: &$crate::audit::RepairRequest,
            ) -> ::core::result::Result<$crate::ops::RepairReport, $crate::ops::OpsError> {
                <$ops>::republish(self, ids, request).await
            }

            async fn retry_blocked(
                &self,
                ids: &[$crate::__private::Uuid],
                request: &$crate::audit::RepairRequest,
            ) -> ::core::result::Result<$crate::ops::RepairReport, $crate::ops::OpsError> {
                <$ops>::retry_blocked(self, ids, request).await
            }

            async fn cleanup(
                &self,
                plan: &$crate::ops::Cleanup,
                request: &$crate::audit::RepairRequest,
                progress: $crate::ops::CleanupProgress<'_>,
            ) -> ::core::result::Result<$crate::ops::CleanupReport, $crate::ops::OpsError> {
                <$ops>::cleanup(self, plan, request, |deleted, eligible| {
                    progress(deleted, eligible)
                })
                .await
            }
        }
    };
}

/// Implements [`LetterStore`] for a store's operations type by calling its
/// inherent methods of the same names and signatures, as
/// [`operations_store_by_inherent_methods!`] does for [`OperationsStore`].
#[macro_export]
macro_rules! letter_store_by_inherent_methods {
    ($ops:ty) => {
        impl $crate::ops::LetterStore for $ops {
            async fn letters(
                &self,
                filter: &$crate::ops::LetterFilter,
            ) -> ::core::result::Result<
                $crate::ops::Page<$crate::ops::LetterRecord>,
                $crate::ops::OpsError,
            > {
                <$ops>::letters(self, filter).await
            }

            async fn letter(
                &self,
                consumer: &str,
                id: i64,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::ops::LetterRecord>,
                $crate::ops::OpsError,
            > {
                <$ops>::letter(self, consumer, id).await
            }

            async fn position(
                &self,
                consumer: &str,
                aggregate_type: &str,
                aggregate_id: &str,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::ops::PositionRecord>,
                $crate::ops::OpsError,
            > {
                <$ops>::position(self, consumer, aggregate_type, aggregate_id).await
            }

            async fn pass_version(
                &self,
                consumer: &str,
                aggregate_type: &str,
                aggregate_id: &str,
                version: i64,
                request: &$crate::audit::RepairRequest,
            ) -> ::core::result::Result<$crate::ops::RepairReport, $crate::ops::OpsError> {
                <$ops>::pass_version(
                    self,
                    consumer,
                    aggregate_type,
                    aggregate_id,
                    version,
                    request,
                )
                .await
            }

            async fn request_replay(
                &self,
                consumer: &str,
                kind: $crate::ops::LetterKind,
                letter_ids: &[i64],
                request: &$crate::audit::RepairRequest,
            ) -> ::core::result::Result<$crate::ops::RepairReport, $crate::ops::OpsError> {
                <$ops>::request_replay(self, consumer, kind, letter_ids, request).await
            }

            async fn discard(
                &self,
                consumer: &str,
                kind: $crate::ops::LetterKind,
                letter_ids: &[i64],
                request: &$crate::audit::RepairRequest,
            ) -> ::core::result::Result<$crate::ops::RepairReport, $crate::ops::OpsError> {
                <$ops>::discard(self, consumer, kind, letter_ids, request).await
            }

            async fn audit_entry(
                &self,
                id: i64,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::ops::AuditRecord>,
                $crate::ops::OpsError,
            > {
                <$ops>::audit_entry(self, id).await
            }
        }
    };
}
