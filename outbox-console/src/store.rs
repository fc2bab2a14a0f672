//! What the console needs of a store: the relay side of the operations
//! seam ([`OperationsStore`]) and, where the store's operations API reads
//! them, the consumer's letters. PostgreSQL ([`Ops`]) does; SQLite (which
//! keeps the tables) and MySQL (which keeps none) do not yet, and their
//! consoles say so instead of showing empty lists.

use std::future::Future;

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{
    LetterFilter, LetterKind, LetterRecord, OperationsStore, Ops, Page, RepairReport,
};

use crate::ConsoleError;

/// A store the console can serve. Cheap to clone (a pool inside).
pub trait ConsoleStore: OperationsStore + Clone + Send + Sync + 'static {
    /// Whether the console can read this store's consumer tables
    /// (letters, replays). When false the letter methods are never called.
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

impl ConsoleStore for Ops {
    fn keeps_letters(&self) -> bool {
        true
    }

    async fn letters(&self, filter: &LetterFilter) -> Result<Page<LetterRecord>, ConsoleError> {
        Ok(Ops::letters(self, filter).await?)
    }

    async fn letter(&self, consumer: &str, id: i64) -> Result<Option<LetterRecord>, ConsoleError> {
        Ok(Ops::letter(self, consumer, id).await?)
    }

    async fn request_replay(
        &self,
        consumer: &str,
        kind: LetterKind,
        ids: &[i64],
        request: &RepairRequest,
    ) -> Result<RepairReport, ConsoleError> {
        Ok(Ops::request_replay(self, consumer, kind, ids, request).await?)
    }

    async fn discard(
        &self,
        consumer: &str,
        kind: LetterKind,
        ids: &[i64],
        request: &RepairRequest,
    ) -> Result<RepairReport, ConsoleError> {
        Ok(Ops::discard(self, consumer, kind, ids, request).await?)
    }
}

/// Implements [`ConsoleStore`] for a store whose letters the console
/// cannot read.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
macro_rules! without_letters {
    ($ops:ty) => {
        impl ConsoleStore for $ops {
            fn keeps_letters(&self) -> bool {
                false
            }

            async fn letters(&self, _: &LetterFilter) -> Result<Page<LetterRecord>, ConsoleError> {
                Err(ConsoleError::NoConsumerTables)
            }

            async fn letter(&self, _: &str, _: i64) -> Result<Option<LetterRecord>, ConsoleError> {
                Err(ConsoleError::NoConsumerTables)
            }

            async fn request_replay(
                &self,
                _: &str,
                _: LetterKind,
                _: &[i64],
                _: &RepairRequest,
            ) -> Result<RepairReport, ConsoleError> {
                Err(ConsoleError::NoConsumerTables)
            }

            async fn discard(
                &self,
                _: &str,
                _: LetterKind,
                _: &[i64],
                _: &RepairRequest,
            ) -> Result<RepairReport, ConsoleError> {
                Err(ConsoleError::NoConsumerTables)
            }
        }
    };
}

#[cfg(feature = "sqlite")]
without_letters!(outbox_sqlite::SqliteOps);
#[cfg(feature = "mysql")]
without_letters!(outbox_mysql::MySqlOps);
