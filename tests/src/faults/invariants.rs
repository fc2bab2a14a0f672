//! What must hold after a fault run, read from the databases (the outbox,
//! the consumers' inbox, quarantine and dead letters, the effects table
//! the handlers write), not from logs.

use std::time::{Duration, Instant};

use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::rig::CONSUMERS;
use crate::TestDb;

/// One invariant and whether it held.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    /// What must hold.
    pub name: String,
    /// Whether it did.
    pub held: bool,
    /// The figures behind the answer (or the first counterexample).
    pub detail: String,
}

/// What the checks expect.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    /// Events the producer's commands committed (without the poison
    /// inserted by the rig): one per command, keyed commands sent twice
    /// included once.
    pub events: i64,
    /// Events no consumer can apply (in the outbox or only on the broker).
    pub poison: &'a [Uuid],
    /// Payloads of id-less messages published to the broker.
    pub garbage: &'a [Vec<u8>],
    /// Readable later versions of the outbox's poison aggregates: held
    /// behind the quarantined version 1 and dead-lettered by the strict
    /// consumer, applied by the stale one.
    pub poison_successors: &'a [Uuid],
}

async fn scalar(db: &TestDb, sql: &str) -> Result<i64, String> {
    sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.replace("{s}", &db.schema.quoted())))
        .fetch_one(&db.pool)
        .await
        .map_err(|e| format!("{sql}: {e}"))
}

/// Waits (up to `limit`, looking every `poll`) until every event is
/// published, the strict consumer applied every applicable event and
/// dead-lettered the poison aggregates' successors (after its park
/// timeout), and the stale consumer reached every aggregate's last version,
/// then lets late redeliveries settle. Returns what was still missing when the time ran
/// out. Each look counts whole tables: on a million events it costs a
/// second of database time, so look seldom there.
pub async fn settle(db: &TestDb, limit: Duration, poll: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let deadline = started + limit;
    let done = || async {
        let open = scalar(
            db,
            "SELECT count(*) FROM {s}.outbox_events WHERE status <> 'published'",
        )
        .await?;
        let applicable = scalar(
            db,
            "SELECT count(*) FROM {s}.outbox_events WHERE aggregate_id NOT LIKE 'poison-%'",
        )
        .await?;
        let strict = scalar(
            db,
            "SELECT count(DISTINCT event_id) FROM {s}.effects WHERE consumer = 'strict'",
        )
        .await?;
        let stale_behind = scalar(db, STALE_BEHIND).await?;
        let held = scalar(
            db,
            "SELECT count(*) FROM {s}.outbox_events o WHERE aggregate_id LIKE 'poison-%' AND aggregate_version > 1
             AND NOT EXISTS (SELECT 1 FROM {s}.outbox_dead_letters d
                             WHERE d.consumer_name = 'strict' AND d.event_id = o.id)",
        )
        .await?;
        Ok::<_, String>((open, applicable - strict + held, stale_behind))
    };
    loop {
        let state = done().await;
        if let Ok((0, 0, 0)) = state {
            break;
        }
        if Instant::now() > deadline {
            return Err(match state {
                Ok((open, strict, stale)) => format!(
                    "after {limit:?}: {open} events not published, {strict} not applied or (behind a poison version) dead-lettered by strict, {stale} aggregates behind in stale; strict's missing: {}",
                    strict_missing(db).await.unwrap_or_else(|error| error)
                ),
                Err(error) => format!("after {limit:?}: {error}"),
            });
        }
        tokio::time::sleep(poll).await;
    }
    let took = started.elapsed();
    // Redeliveries of the last messages settle as duplicates.
    tokio::time::sleep(Duration::from_secs(3)).await;
    Ok(took)
}

/// Up to ten events the strict consumer has neither applied nor (behind a
/// poison version) dead-lettered, each with what the consumer holds for
/// it: its inbox row, a parked row (attempts, retry due, last error), a
/// letter, its start count and retry record, and the aggregate's position.
async fn strict_missing(db: &TestDb) -> Result<String, String> {
    let sql = "SELECT o.aggregate_id || ' v' || o.aggregate_version || ' (' || o.status || ')'
            || ' inbox=' || EXISTS (SELECT 1 FROM {s}.outbox_processed_events p
                                    WHERE p.consumer_name = 'strict' AND p.event_id = o.id)
            || ' parked=' || coalesce((SELECT k.attempts || '/' || coalesce(k.retry_at::text, '-')
                                       || '/' || coalesce(left(k.last_error, 120), '-')
                                       FROM {s}.outbox_consumer_parked k
                                       WHERE k.consumer_name = 'strict' AND k.event_id = o.id), 'no')
            || ' letter=' || coalesce((SELECT string_agg(d.kind || ':' || coalesce(d.resolution, 'open'), ',')
                                       FROM {s}.outbox_dead_letters d
                                       WHERE d.consumer_name = 'strict' AND d.event_id = o.id), 'no')
            || ' attempts=' || coalesce((SELECT a::text FROM {s}.outbox_consumer_attempts a
                                         WHERE a.consumer_name = 'strict' AND a.event_id = o.id), 'no')
            || ' position=' || coalesce((SELECT p::text FROM {s}.outbox_consumer_positions p
                                         WHERE p.consumer_name = 'strict'
                                           AND p.aggregate_type = o.aggregate_type
                                           AND p.aggregate_id = o.aggregate_id), 'none')
        FROM {s}.outbox_events o
        WHERE NOT EXISTS (SELECT 1 FROM {s}.effects e WHERE e.consumer = 'strict' AND e.event_id = o.id)
          AND NOT (o.aggregate_id LIKE 'poison-%' AND (o.aggregate_version = 1 OR EXISTS (
                SELECT 1 FROM {s}.outbox_dead_letters d
                WHERE d.consumer_name = 'strict' AND d.event_id = o.id)))
        ORDER BY o.aggregate_id, o.aggregate_version LIMIT 10";
    let rows: Vec<Option<String>> =
        sqlx::query_scalar(AssertSqlSafe(sql.replace("{s}", &db.schema.quoted())))
            .fetch_all(&db.pool)
            .await
            .map_err(|e| e.to_string())?;
    Ok(rows.into_iter().flatten().collect::<Vec<_>>().join("; "))
}

/// Aggregates whose last version the stale consumer has not applied.
const STALE_BEHIND: &str = "SELECT count(*) FROM (
        SELECT aggregate_id, max(aggregate_version) AS last FROM {s}.outbox_events
        WHERE aggregate_id NOT LIKE 'poison-%' GROUP BY aggregate_id
    ) o LEFT JOIN (
        SELECT aggregate_id, max(aggregate_version) AS last FROM {s}.effects
        WHERE consumer = 'stale' GROUP BY aggregate_id
    ) e USING (aggregate_id)
    WHERE e.last IS DISTINCT FROM o.last";

/// Runs every check.
pub async fn check(db: &TestDb, expected: &Expected<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut push = |name: &str, result: Result<(bool, String), String>| {
        let (held, detail) = result.unwrap_or_else(|error| (false, error));
        checks.push(Check {
            name: name.to_owned(),
            held,
            detail,
        });
    };

    let events = scalar(
        db,
        "SELECT count(*) FROM {s}.outbox_events WHERE aggregate_id NOT LIKE 'poison-%'",
    )
    .await;
    push(
        "each producer command committed one event (idempotency keys gave one each)",
        events.map(|n| {
            (
                n == expected.events,
                format!("{n} events for {} commands", expected.events),
            )
        }),
    );

    let open = scalar(
        db,
        "SELECT count(*) FROM {s}.outbox_events WHERE status <> 'published'",
    )
    .await;
    push(
        "every committed event published; nothing pending, failed or claimed",
        open.map(|n| (n == 0, format!("{n} not published"))),
    );

    for (name, ordering) in CONSUMERS {
        let twice = scalar(
            db,
            &format!(
                "SELECT count(*) FROM (SELECT event_id FROM {{s}}.effects WHERE consumer = '{name}'
                 GROUP BY event_id HAVING count(*) > 1) AS twice"
            ),
        )
        .await;
        push(
            &format!("{name}: no event applied twice"),
            twice.map(|n| (n == 0, format!("{n} events applied more than once"))),
        );

        let unsettled = scalar(
            db,
            &format!(
                "SELECT count(*) FROM {{s}}.outbox_events o WHERE o.aggregate_id NOT LIKE 'poison-%'
                 AND NOT EXISTS (SELECT 1 FROM {{s}}.outbox_processed_events p
                                 WHERE p.consumer_name = '{name}' AND p.event_id = o.id)"
            ),
        )
        .await;
        push(
            &format!("{name}: every event reached it and is settled in its inbox"),
            unsettled.map(|n| (n == 0, format!("{n} events without an inbox row"))),
        );

        let behind_poison: &[Uuid] = if ordering == "strict" {
            expected.poison_successors
        } else {
            &[]
        };
        push(
            &if ordering == "strict" {
                format!(
                    "{name}: exactly the poison quarantined, once each, with a reason; the poison aggregates' later versions dead-lettered behind it, naming it; nothing else"
                )
            } else {
                format!(
                    "{name}: exactly the poison quarantined, once each, with a reason; nothing dead-lettered"
                )
            },
            letters(db, name, expected, behind_poison).await,
        );
        if ordering != "strict" {
            // RejectStale passes over a version that arrives after a newer
            // one (shuffled deliveries): the last one is what must land.
            push(
                &format!(
                    "{name}: the poison aggregates go on past their quarantined version 1 to their last version"
                ),
                poison_behind(db, name).await,
            );
        }
        if ordering == "strict" {
            push(
                "strict: each aggregate's versions applied gap-free and ascending",
                strict_order(db).await,
            );
        } else {
            let behind = scalar(db, STALE_BEHIND).await;
            push(
                "stale: each aggregate's final state is its last version",
                behind.map(|n| (n == 0, format!("{n} aggregates not at their last version"))),
            );
        }
    }
    checks
}

async fn letters(
    db: &TestDb,
    name: &str,
    expected: &Expected<'_>,
    behind_poison: &[Uuid],
) -> Result<(bool, String), String> {
    let rows: Vec<(Option<Uuid>, String, String, Vec<u8>)> =
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT event_id, kind, reason, payload FROM {} WHERE consumer_name = $1",
            db.table("outbox_dead_letters")
        )))
        .bind(name)
        .fetch_all(&db.pool)
        .await
        .map_err(|e| e.to_string())?;
    let mut with_id: Vec<Uuid> = rows.iter().filter_map(|r| r.0).collect();
    with_id.sort();
    let mut lettered = expected.poison.to_vec();
    lettered.extend_from_slice(behind_poison);
    lettered.sort();
    if with_id != lettered {
        return Ok((
            false,
            format!(
                "letters with an id: {} (expected the {} poison events and {} held behind them)",
                with_id.len(),
                expected.poison.len(),
                behind_poison.len()
            ),
        ));
    }
    let mut garbage: Vec<&[u8]> = rows
        .iter()
        .filter(|r| r.0.is_none())
        .map(|r| r.3.as_slice())
        .collect();
    let without_id = garbage.len();
    garbage.sort();
    garbage.dedup();
    let mut injected: Vec<&[u8]> = expected.garbage.iter().map(Vec::as_slice).collect();
    injected.sort();
    if garbage != injected {
        return Ok((
            false,
            format!(
                "{} distinct id-less letters, {} id-less messages injected",
                garbage.len(),
                injected.len()
            ),
        ));
    }
    let wrong = |row: &&(Option<Uuid>, String, String, Vec<u8>)| {
        let behind = row.0.is_some_and(|id| behind_poison.contains(&id));
        if behind {
            row.1 != "dead_lettered"
                || !(row.2.contains("version 1 ") && row.2.contains("quarantine"))
        } else {
            row.1 != "quarantined" || row.2.is_empty()
        }
    };
    if let Some(row) = rows.iter().find(wrong) {
        return Ok((
            false,
            format!("{:?}: kind {} reason {:?}", row.0, row.1, row.2),
        ));
    }
    Ok((
        true,
        format!(
            "{} poison events quarantined once each, {} later versions held behind them; {} id-less messages in {} letters",
            expected.poison.len(),
            behind_poison.len(),
            injected.len(),
            without_id
        ),
    ))
}

/// The poison aggregates whose last version consumer `name` has not
/// applied, each with what that consumer holds for it (applied versions,
/// inbox rows, letters), so a failure names its counterexample.
async fn poison_behind(db: &TestDb, name: &str) -> Result<(bool, String), String> {
    let sql = "SELECT o.aggregate_id, o.last,
            (SELECT coalesce(string_agg(e.aggregate_version::text, ',' ORDER BY e.seq), '')
             FROM {s}.effects e WHERE e.consumer = $1 AND e.aggregate_id = o.aggregate_id),
            (SELECT coalesce(string_agg(v.aggregate_version::text, ',' ORDER BY v.aggregate_version), '')
             FROM {s}.outbox_events v JOIN {s}.outbox_processed_events p
               ON p.event_id = v.id AND p.consumer_name = $1
             WHERE v.aggregate_id = o.aggregate_id),
            (SELECT coalesce(string_agg(d.kind || ':' || coalesce(v.aggregate_version::text, '?'), ',' ORDER BY d.kind), '')
             FROM {s}.outbox_dead_letters d LEFT JOIN {s}.outbox_events v ON v.id = d.event_id
             WHERE d.consumer_name = $1 AND v.aggregate_id = o.aggregate_id)
        FROM (SELECT aggregate_id, max(aggregate_version) AS last FROM {s}.outbox_events
              WHERE aggregate_id LIKE 'poison-%' GROUP BY aggregate_id) o
        WHERE o.last IS DISTINCT FROM (
            SELECT max(aggregate_version) FROM {s}.effects e
            WHERE e.consumer = $1 AND e.aggregate_id = o.aggregate_id)
        ORDER BY o.aggregate_id";
    let behind: Vec<(String, i64, String, String, String)> =
        sqlx::query_as(AssertSqlSafe(sql.replace("{s}", &db.schema.quoted())))
            .bind(name)
            .fetch_all(&db.pool)
            .await
            .map_err(|e| e.to_string())?;
    if behind.is_empty() {
        return Ok((
            true,
            "every poison aggregate at its last version".to_owned(),
        ));
    }
    let listed: Vec<String> = behind
        .iter()
        .map(|(aggregate, last, applied, inbox, letters)| {
            format!(
                "{aggregate} (last {last}; applied [{applied}], inbox [{inbox}], letters [{letters}])"
            )
        })
        .collect();
    Ok((
        false,
        format!(
            "{} poison aggregates not at their last version: {}",
            behind.len(),
            listed.join("; ")
        ),
    ))
}

async fn strict_order(db: &TestDb) -> Result<(bool, String), String> {
    let sql = "WITH applied AS (
            SELECT aggregate_id, array_agg(aggregate_version ORDER BY seq) AS versions
            FROM {s}.effects WHERE consumer = 'strict' GROUP BY aggregate_id
        ), written AS (
            SELECT aggregate_id, array_agg(aggregate_version ORDER BY aggregate_version) AS versions
            FROM {s}.outbox_events WHERE aggregate_id NOT LIKE 'poison-%' GROUP BY aggregate_id
        )
        SELECT aggregate_id, (SELECT count(*) FROM written)
        FROM written w FULL JOIN applied a USING (aggregate_id)
        WHERE w.versions IS DISTINCT FROM a.versions
           OR w.versions <> ARRAY(SELECT generate_series(1, cardinality(w.versions)))::bigint[]
        LIMIT 1";
    let wrong: Option<(Option<String>, i64)> =
        sqlx::query_as(AssertSqlSafe(sql.replace("{s}", &db.schema.quoted())))
            .fetch_optional(&db.pool)
            .await
            .map_err(|e| e.to_string())?;
    match wrong {
        None => {
            let aggregates = scalar(
                db,
                "SELECT count(DISTINCT aggregate_id) FROM {s}.effects WHERE consumer = 'strict'",
            )
            .await?;
            Ok((
                true,
                format!("{aggregates} aggregates, each 1..n in the order applied"),
            ))
        }
        Some((aggregate, _)) => Ok((
            false,
            format!("{aggregate:?}: applied versions differ from 1..n ascending"),
        )),
    }
}
