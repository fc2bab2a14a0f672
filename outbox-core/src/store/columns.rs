//! Column conventions of the stores that keep times as integer
//! milliseconds since the Unix epoch and ids as UUID text (`outbox-sqlite`,
//! `outbox-mysql`): the clock, durations and row decoding they share,
//! generic over sqlx's [`Row`] so no database is named here.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{ColumnIndex, Decode, Row, Type};
use uuid::Uuid;

/// Milliseconds since the Unix epoch, as the time columns hold them.
pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// A duration in milliseconds for a time column, saturating.
pub fn millis(duration: Duration) -> i64 {
    duration.as_millis().min(i64::MAX as u128) as i64
}

/// How old a time column's value is now, in seconds (0 for the future).
pub fn age_seconds(at_ms: Option<i64>) -> Option<f64> {
    at_ms.map(|ms| ((now_ms() - ms).max(0) as f64) / 1000.0)
}

fn decode_time(column: &str, ms: i64) -> Result<DateTime<Utc>, sqlx::Error> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| {
        sqlx::Error::Decode(format!("{column} {ms} is not a time in milliseconds").into())
    })
}

/// A UUID stored as text.
pub fn uuid_column<R>(row: &R, column: &str) -> Result<Uuid, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
{
    let text: String = row.try_get(column)?;
    text.parse()
        .map_err(|error: uuid::Error| sqlx::Error::Decode(error.into()))
}

/// A time stored as milliseconds since the epoch.
pub fn time_column<R>(row: &R, column: &str) -> Result<DateTime<Utc>, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    decode_time(column, row.try_get(column)?)
}

/// A time stored as milliseconds since the epoch, or NULL.
pub fn optional_time_column<R>(row: &R, column: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
{
    let ms: Option<i64> = row.try_get(column)?;
    ms.map(|ms| decode_time(column, ms)).transpose()
}
