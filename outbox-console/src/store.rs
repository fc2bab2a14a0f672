//! What the console needs of a store: the relay side of the operations
//! seam ([`OperationsStore`]) and, where the store keeps a consumer's
//! tables, the consumer's letters ([`outbox_core::ops::LetterStore`]):
//! PostgreSQL ([`Ops`]), SQLite and MySQL all do (features `sqlite` and
//! `mysql`). A store of your own without consumer tables answers `false`
//! from [`ConsoleStore::keeps_letters`], and its letter pages say so (404)
//! instead of showing empty lists.

use std::future::Future;

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{
    LetterFilter, LetterKind, LetterRecord, OperationsStore, Page, RepairReport,
};
use outbox_postgres::Ops;

use crate::ConsoleError;

/// A store the console can serve. Cheap to clone (a pool inside).
pub trait ConsoleStore: OperationsStore + Clone + Send + Sync + 'static {
    /// Whether this store keeps consumer tables (letters, replays). When
    /// false the letter methods are never called.
    fn keeps_letters(&self) -> bool;

    /// A consumer's letters, filtered, oldest first.
    fn letters(
        &self,
        filter: &LetterFilter,
    ) -> impl Future<Output = Result<Page<LetterRecord>, ConsoleError>> + Send;

    /// One letter of a consumer.
    fn letter(
        &self,
        consumer: &str,
        id: i64,
    ) -> impl Future<Output = Result<Option<LetterRecord>, ConsoleError>> + Send;

    /// Asks the running consumer to replay letters.
    fn request_replay(
        &self,
        consumer: &str,
        kind: LetterKind,
        ids: &[i64],
        request: &RepairRequest,
    ) -> impl Future<Output = Result<RepairReport, ConsoleError>> + Send;

    /// Closes letters without running them.
    fn discard(
        &self,
        consumer: &str,
        kind: LetterKind,
        ids: &[i64],
        request: &RepairRequest,
    ) -> impl Future<Output = Result<RepairReport, ConsoleError>> + Send;
}

/// Implements [`ConsoleStore`] for a store that keeps a consumer's tables,
/// through its [`LetterStore`](outbox_core::ops::LetterStore).
macro_rules! with_letters {
    ($ops:ty) => {
        impl ConsoleStore for $ops {
            fn keeps_letters(&self) -> bool {
                true
            }

            async fn letters(
                &self,
                filter: &LetterFilter,
            ) -> Result<Page<LetterRecord>, ConsoleError> {
                Ok(outbox_core::ops::LetterStore::letters(self, filter).await?)
            }

            async fn letter(
                &self,
                consumer: &str,
                id: i64,
            ) -> Result<Option<LetterRecord>, ConsoleError> {
                Ok(outbox_core::ops::LetterStore::letter(self, consumer, id).await?)
            }

            async fn request_replay(
                &self,
                consumer: &str,
                kind: LetterKind,
                ids: &[i64],
                request: &RepairRequest,
            ) -> Result<RepairReport, ConsoleError> {
                Ok(outbox_core::ops::LetterStore::request_replay(
                    self, consumer, kind, ids, request,
                )
                .await?)
            }

            async fn discard(
                &self,
                consumer: &str,
                kind: LetterKind,
                ids: &[i64],
                request: &RepairRequest,
            ) -> Result<RepairReport, ConsoleError> {
                Ok(
                    outbox_core::ops::LetterStore::discard(self, consumer, kind, ids, request)
                        .await?,
                )
            }
        }
    };
}

with_letters!(Ops);
#[cfg(feature = "sqlite")]
with_letters!(outbox_sqlite::SqliteOps);

#[cfg(feature = "mysql")]
with_letters!(outbox_mysql::MySqlOps);
