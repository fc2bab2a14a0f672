//! The PostgreSQL side of a consumer: the inbox (processed events), the
//! per-aggregate positions of the ordering policies, parked messages of
//! strict ordering, and quarantine / dead letters. Every statement takes
//! the consumer's name as a bind parameter; the schema is a validated
//! identifier.

use std::time::Duration;

use futures_util::StreamExt;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Either, PgConnection, PgPool, Postgres, Row, Transaction};
use uuid::Uuid;

use crate::audit::AuditSql;
use outbox_core::Envelope;
use outbox_core::audit::RepairRequest;
use outbox_core::consumer::HandlerError;
use outbox_core::consumer::Incoming;
use outbox_core::consumer::store::{
    CheckedCommit, ConsumerStore, ExpiredAggregate, Letter, MovedPosition, ParkedMessage, Position,
    StoredLetter, StrictClaim,
};
use outbox_core::consumer::{HANDLER_ENDED_TRANSACTION, SWALLOWED};
use outbox_core::store::SchemaName;

/// Reads a position from `version, pinned, start_version` at columns
/// `first`, `first + 1` and `first + 2` of a row.
fn position_from_row(row: &sqlx::postgres::PgRow, first: usize) -> sqlx::Result<Position> {
    Ok(Position {
        version: row.try_get(first)?,
        pinned: row.try_get(first + 1)?,
        start_version: row.try_get(first + 2)?,
    })
}

/// The SQL of the consumer statements for one schema.
#[derive(Debug)]
struct ConsumerSql {
    count_start: String,
    note_retry: String,
    forget_starts: String,
    forget_processed: String,
    inbox_one: String,
    inbox_replay: String,
    inbox_many: String,
    create_positions: String,
    lock_positions: String,
    advance_if_newer: String,
    claim_strict: String,
    claim_stale: String,
    lock_position: String,
    try_lock_position: String,
    set_position: String,
    settle_strict: String,
    settle_moved: String,
    settle_batch: String,
    pin_first: String,
    baseline: String,
    open_letter_at: String,
    park: String,
    start_parked: String,
    lock_parked: String,
    unpark: String,
    unpark_through: String,
    parked_failed: String,
    ready_parked: String,
    expired_parked: String,
    dead_letter_parked: String,
    expire_parked: String,
    letter: String,
    lock_letter: String,
    requested_replays: String,
    flush_stats: String,
    take_replay_request: String,
    resolve_letter: String,
    letter_replay_failed: String,
}

impl ConsumerSql {
    fn new(schema: &SchemaName) -> ConsumerSql {
        let s = schema.quoted();
        let moved_headers = "jsonb_strip_nulls(jsonb_build_object(
                            'specversion', '1.0', 'id', envelope->>'id', 'type', envelope->>'event_type',
                            'schemaversion', envelope->>'schema_version',
                            'aggregatetype', envelope->>'aggregate_type', 'aggregateid', envelope->>'aggregate_id',
                            'aggregateversion', envelope->>'aggregate_version', 'time', envelope->>'occurred_at',
                            'traceparent', envelope->>'traceparent'))";
        // One message's inbox key (both single-message claims start with
        // it), unless an open letter holds the event.
        let inbox_cte = format!(
            "WITH inbox AS (
                INSERT INTO {s}.outbox_processed_events (consumer_name, event_id)
                SELECT $1, $2 WHERE NOT EXISTS (
                    SELECT 1 FROM {s}.outbox_dead_letters
                    WHERE consumer_name = $1 AND event_id = $2 AND resolved_at IS NULL)
                ON CONFLICT DO NOTHING
                RETURNING event_id
             )"
        );
        // The aggregates a batch moved whose next version waits parked (and
        // may start), as a JSON array of [type, id] pairs.
        let ready = format!(
            "(SELECT coalesce(json_agg(json_build_array(m.aggregate_type, m.aggregate_id)), '[]')::text
              FROM moved m WHERE EXISTS (
                SELECT 1 FROM {s}.outbox_consumer_parked k
                WHERE k.consumer_name = $1 AND k.aggregate_type = m.aggregate_type
                  AND k.aggregate_id = m.aggregate_id AND k.aggregate_version = m.version + 1
                  AND (k.retry_at IS NULL OR k.retry_at <= now())))"
        );
        let restore =
            "set_config('plan_cache_mode', current_setting('outbox.plan_cache_mode'), true)";
        ConsumerSql {
            // A redelivery's handler start, counted (first deliveries
            // count as start 1 without a row).
            count_start: format!(
                "INSERT INTO {s}.outbox_consumer_attempts AS a (consumer_name, event_id, starts)
                 VALUES ($1, $2, 2)
                 ON CONFLICT (consumer_name, event_id)
                 DO UPDATE SET starts = a.starts + 1, updated_at = now()
                 RETURNING a.starts"
            ),
            // Strict: a message whose handler failed and that comes back
            // after `$6` ms: its aggregate's later versions wait for it.
            // A first delivery's failure leaves start 1 (the redelivery's
            // count makes it 2).
            note_retry: format!(
                "INSERT INTO {s}.outbox_consumer_attempts AS a
                    (consumer_name, event_id, starts, aggregate_type, aggregate_id, aggregate_version, retry_at)
                 VALUES ($1, $2, 1, $3, $4, $5, now() + $6 * interval '1 millisecond')
                 ON CONFLICT (consumer_name, event_id) DO UPDATE SET
                    aggregate_type = EXCLUDED.aggregate_type, aggregate_id = EXCLUDED.aggregate_id,
                    aggregate_version = EXCLUDED.aggregate_version, retry_at = EXCLUDED.retry_at,
                    updated_at = now()"
            ),
            forget_starts: format!(
                "DELETE FROM {s}.outbox_consumer_attempts WHERE consumer_name = $1 AND event_id = $2"
            ),
            forget_processed: format!(
                "DELETE FROM {s}.outbox_processed_events WHERE consumer_name = $1 AND event_id = $2"
            ),
            // The inbox key, unless an open letter holds the event: a
            // redelivery of a quarantined or dead-lettered message is a
            // duplicate until the letter is replayed or discarded.
            inbox_one: format!(
                "INSERT INTO {s}.outbox_processed_events (consumer_name, event_id)
                 SELECT $1, $2 WHERE NOT EXISTS (
                     SELECT 1 FROM {s}.outbox_dead_letters
                     WHERE consumer_name = $1 AND event_id = $2 AND resolved_at IS NULL)
                 ON CONFLICT DO NOTHING"
            ),
            // A replay: the letter being replayed holds the event.
            inbox_replay: format!(
                "INSERT INTO {s}.outbox_processed_events (consumer_name, event_id) VALUES ($1, $2)
                 ON CONFLICT DO NOTHING"
            ),
            inbox_many: format!(
                "INSERT INTO {s}.outbox_processed_events (consumer_name, event_id)
                 SELECT $1, id FROM unnest($2::uuid[]) AS t(id)
                 WHERE NOT EXISTS (
                     SELECT 1 FROM {s}.outbox_dead_letters d
                     WHERE d.consumer_name = $1 AND d.event_id = t.id AND d.resolved_at IS NULL)
                 ORDER BY id
                 ON CONFLICT DO NOTHING RETURNING event_id"
            ),
            // Batch mode: locks and reads the positions of the batch's
            // aggregates in one sorted pass, so two instances with
            // overlapping batches wait for each other instead of
            // deadlocking. A row lock writes no new row version (an upsert
            // would write one per aggregate per batch). The batch's
            // ordering decisions are made in memory from here.
            lock_positions: format!(
                "SELECT p.aggregate_type, p.aggregate_id, p.version, p.pinned, p.start_version
                 FROM {s}.outbox_consumer_positions p
                 JOIN unnest($2::text[], $3::text[]) AS u(t, i)
                   ON p.consumer_name = $1 AND p.aggregate_type = u.t AND p.aggregate_id = u.i
                 ORDER BY p.aggregate_type, p.aggregate_id
                 FOR UPDATE OF p"
            ),
            // Batch mode, for aggregates without a position yet (their
            // first message): creates the rows (sorted; locked by the
            // insert) and says which it created. One that another
            // transaction created meanwhile is locked with
            // `lock_positions`, a new statement that sees it.
            create_positions: format!(
                "INSERT INTO {s}.outbox_consumer_positions
                    (consumer_name, aggregate_type, aggregate_id, version, pinned)
                 SELECT $1, t, i, 0, false FROM unnest($2::text[], $3::text[]) AS u(t, i)
                 ORDER BY t, i
                 ON CONFLICT (consumer_name, aggregate_type, aggregate_id) DO NOTHING
                 RETURNING aggregate_type, aggregate_id"
            ),
            // RejectStale: one statement locks the position row and moves
            // it forward only when the message is newer; no row back means
            // stale.
            advance_if_newer: format!(
                "INSERT INTO {s}.outbox_consumer_positions AS p
                    (consumer_name, aggregate_type, aggregate_id, version)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (consumer_name, aggregate_type, aggregate_id)
                 DO UPDATE SET version = EXCLUDED.version, updated_at = now()
                 WHERE p.version < EXCLUDED.version
                 RETURNING p.version"
            ),
            // Strict, one message, in one round trip: the inbox key, then
            // (only for a new event, and always after the inbox key: both
            // read the inbox insert's result) the position moved to this
            // version when it is the next one, saying whether its successor
            // waits parked; otherwise the position locked and read for the
            // ordering decision. One row version per applied message: the
            // handler's transaction commits the move or rolls it back.
            // `fresh` 0: a duplicate (or an open letter holds the event); no
            // `advanced` and no version: the aggregate has no position row.
            claim_strict: format!(
                "{inbox_cte},
                 advanced AS (
                    UPDATE {s}.outbox_consumer_positions p
                    SET version = $5, pinned = true, updated_at = now(),
                        start_version = CASE WHEN p.pinned THEN p.start_version
                                             ELSE coalesce(p.start_version, $5) END
                    WHERE p.consumer_name = $1 AND p.aggregate_type = $3 AND p.aggregate_id = $4
                      AND p.version = $5 - 1 AND EXISTS (SELECT 1 FROM inbox)
                    RETURNING EXISTS (
                        SELECT 1 FROM {s}.outbox_consumer_parked k
                        WHERE k.consumer_name = $1 AND k.aggregate_type = $3 AND k.aggregate_id = $4
                          AND k.aggregate_version = $5 + 1 AND (k.retry_at IS NULL OR k.retry_at <= now())
                    ) AS successor_parked
                 ),
                 locked AS (
                    SELECT p.version, p.pinned, p.start_version FROM {s}.outbox_consumer_positions p
                    WHERE p.consumer_name = $1 AND p.aggregate_type = $3 AND p.aggregate_id = $4
                      AND EXISTS (SELECT 1 FROM inbox) AND NOT EXISTS (SELECT 1 FROM advanced)
                    FOR UPDATE
                 )
                 SELECT (SELECT count(*) FROM inbox) AS fresh,
                        (SELECT bool_or(successor_parked) FROM advanced) AS advanced,
                        l.version, l.pinned, l.start_version
                 FROM (SELECT 1) AS one LEFT JOIN locked l ON true"
            ),
            // RejectStale, one message: the inbox key, then the position
            // moved forward when the message is newer (locked either way).
            claim_stale: format!(
                "{inbox_cte},
                 moved AS (
                    INSERT INTO {s}.outbox_consumer_positions AS p
                        (consumer_name, aggregate_type, aggregate_id, version)
                    SELECT $1, $3, $4, $5 FROM inbox
                    ON CONFLICT (consumer_name, aggregate_type, aggregate_id)
                    DO UPDATE SET version = EXCLUDED.version, updated_at = now()
                    WHERE p.version < EXCLUDED.version
                    RETURNING 1
                 )
                 SELECT (SELECT count(*) FROM inbox) AS fresh, (SELECT count(*) FROM moved) AS moved"
            ),
            // Strict: lock the position row (creating it at 0, not pinned)
            // and read it.
            lock_position: format!(
                "INSERT INTO {s}.outbox_consumer_positions AS p
                    (consumer_name, aggregate_type, aggregate_id, version, pinned)
                 VALUES ($1, $2, $3, 0, false)
                 ON CONFLICT (consumer_name, aggregate_type, aggregate_id)
                 DO UPDATE SET version = p.version
                 RETURNING p.version, p.pinned, p.start_version"
            ),
            // Strict, the sweep: the position, locked, unless another
            // transaction holds it (a message of the aggregate in hand).
            try_lock_position: format!(
                "SELECT version, pinned, start_version FROM {s}.outbox_consumer_positions
                 WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                 FOR UPDATE SKIP LOCKED"
            ),
            // Strict: the locked position moves to $4; an aggregate that
            // starts here keeps $4 as its start.
            set_position: format!(
                "UPDATE {s}.outbox_consumer_positions
                 SET version = $4, pinned = true, updated_at = now(),
                     start_version = CASE WHEN pinned THEN start_version ELSE coalesce(start_version, $4) END
                 WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3"
            ),
            // Strict, after a handler: as `set_position`, and says whether
            // the next version waits parked (and may start): only then is
            // there a drain to run after the commit. Also the statement
            // that finds a transaction the handler left aborted.
            settle_strict: format!(
                "UPDATE {s}.outbox_consumer_positions
                 SET version = $4, pinned = true, updated_at = now(),
                     start_version = CASE WHEN pinned THEN start_version ELSE coalesce(start_version, $4) END
                 WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                 RETURNING EXISTS (
                    SELECT 1 FROM {s}.outbox_consumer_parked k
                    WHERE k.consumer_name = $1 AND k.aggregate_type = $2 AND k.aggregate_id = $3
                      AND k.aggregate_version = $4 + 1 AND (k.retry_at IS NULL OR k.retry_at <= now()))"
            ),
            // Batch mode, before the handlers, when nothing was parked (the
            // common case): the positions the batch moved (or pinned:
            // version unchanged, start given), and the aggregates whose next
            // version waits parked. It also ends the batch's generic-plan
            // window (see `Consumer::begin_batch`): the setting the
            // transaction began with is back for the handlers' statements.
            // Binds: consumer; aggregate types, ids, new versions, start
            // versions.
            settle_moved: format!(
                "WITH moved AS (
                    UPDATE {s}.outbox_consumer_positions p
                    SET version = u.v, pinned = true, updated_at = now(),
                        start_version = CASE WHEN p.pinned THEN p.start_version
                                             ELSE coalesce(p.start_version, u.first) END
                    FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS u(t, i, v, first)
                    WHERE p.consumer_name = $1 AND p.aggregate_type = u.t AND p.aggregate_id = u.i
                    RETURNING p.aggregate_type, p.aggregate_id, p.version
                 )
                 SELECT {ready}, {restore}"
            ),
            // As `settle_moved`, also parking messages. Binds as
            // `settle_moved`, then parked event ids, their aggregate types,
            // ids, versions, envelopes (JSON text).
            settle_batch: format!(
                "WITH moved AS (
                    UPDATE {s}.outbox_consumer_positions p
                    SET version = u.v, pinned = true, updated_at = now(),
                        start_version = CASE WHEN p.pinned THEN p.start_version
                                             ELSE coalesce(p.start_version, u.first) END
                    FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS u(t, i, v, first)
                    WHERE p.consumer_name = $1 AND p.aggregate_type = u.t AND p.aggregate_id = u.i
                    RETURNING p.aggregate_type, p.aggregate_id, p.version
                 ),
                 parked AS (
                    INSERT INTO {s}.outbox_consumer_parked
                        (consumer_name, event_id, aggregate_type, aggregate_id, aggregate_version, envelope)
                    SELECT $1, e, t, i, v, j::json
                    FROM unnest($6::uuid[], $7::text[], $8::text[], $9::bigint[], $10::text[]) AS k(e, t, i, v, j)
                    ON CONFLICT DO NOTHING
                 )
                 SELECT {ready}, {restore}"
            ),
            // Strict: fixes the start of never-started aggregates at
            // version 1, committed before a handler starts on their
            // version 1 (or a letter is written for it): a failure, a crash
            // or a quarantine of that version then holds its successors
            // instead of letting the sweep start the aggregate past it.
            // Sorted, so two instances lock in one order.
            pin_first: format!(
                "INSERT INTO {s}.outbox_consumer_positions AS p
                    (consumer_name, aggregate_type, aggregate_id, version, pinned, start_version)
                 SELECT $1, t, i, 0, true, 1 FROM unnest($2::text[], $3::text[]) AS u(t, i)
                 ORDER BY t, i
                 ON CONFLICT (consumer_name, aggregate_type, aggregate_id)
                 DO UPDATE SET pinned = true, start_version = 1, updated_at = now()
                 WHERE NOT p.pinned"
            ),
            // Strict, start at the lowest version seen: an aggregate never
            // started whose parked messages waited past the timeout starts
            // at the lowest version that arrived, parked or lettered (a
            // quarantined or dead-lettered version arrived too: nothing
            // above it may start the aggregate). Under the position lock.
            // Returns the new position and whether that lowest version is
            // parked (false: it is in a letter, and the aggregate waits
            // for it).
            baseline: format!(
                "UPDATE {s}.outbox_consumer_positions p
                 SET version = k.lowest - 1, pinned = true, start_version = k.lowest, updated_at = now()
                 FROM (SELECT min(v) AS lowest FROM (
                          SELECT aggregate_version AS v FROM {s}.outbox_consumer_parked
                          WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                          UNION ALL
                          SELECT aggregate_version FROM {s}.outbox_dead_letters
                          WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                            AND resolved_at IS NULL AND aggregate_version IS NOT NULL) seen) k
                 WHERE p.consumer_name = $1 AND p.aggregate_type = $2 AND p.aggregate_id = $3
                   AND NOT p.pinned AND k.lowest IS NOT NULL
                 RETURNING p.version, EXISTS (
                    SELECT 1 FROM {s}.outbox_consumer_parked
                    WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                      AND aggregate_version = k.lowest) AS parked"
            ),
            // The open letter holding an aggregate's version, if any.
            open_letter_at: format!(
                "SELECT id, kind FROM {s}.outbox_dead_letters
                 WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                   AND aggregate_version = $4 AND resolved_at IS NULL
                 ORDER BY id LIMIT 1"
            ),
            park: format!(
                "INSERT INTO {s}.outbox_consumer_parked
                    (consumer_name, event_id, aggregate_type, aggregate_id, aggregate_version, envelope)
                 VALUES ($1, $2, $3, $4, $5, $6::json)
                 ON CONFLICT DO NOTHING"
            ),
            // Takes the parked message with the next version, when its
            // backoff or another instance's lease is over, counts its start
            // (committed before the handler runs) and leases it to this
            // instance for $5 milliseconds: other instances' sweeps leave it
            // alone while this one is on its way to the handler, and take it
            // again if this one died.
            start_parked: format!(
                "UPDATE {s}.outbox_consumer_parked
                 SET attempts = attempts + 1,
                     retry_at = now() + $5 * interval '1 millisecond'
                 WHERE consumer_name = $1 AND event_id = (
                     SELECT event_id FROM {s}.outbox_consumer_parked
                     WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                       AND aggregate_version = $4 AND (retry_at IS NULL OR retry_at <= now())
                     ORDER BY parked_at LIMIT 1)
                 RETURNING envelope::text AS envelope, attempts"
            ),
            // Locks a parked message and says whether it is still there
            // (another instance may have applied or dead-lettered it).
            lock_parked: format!(
                "SELECT 1 FROM {s}.outbox_consumer_parked
                 WHERE consumer_name = $1 AND event_id = $2 FOR UPDATE"
            ),
            unpark: format!(
                "DELETE FROM {s}.outbox_consumer_parked WHERE consumer_name = $1 AND event_id = $2"
            ),
            // After applying version $4: it and any parked duplicates of
            // versions up to it are done.
            unpark_through: format!(
                "DELETE FROM {s}.outbox_consumer_parked
                 WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                   AND aggregate_version <= $4"
            ),
            parked_failed: format!(
                "UPDATE {s}.outbox_consumer_parked
                 SET last_error = $3, retry_at = now() + $4 * interval '1 millisecond'
                 WHERE consumer_name = $1 AND event_id = $2 RETURNING attempts"
            ),
            // Aggregates whose next version is parked (a crash between a
            // commit and the drain that follows it leaves these).
            ready_parked: format!(
                "SELECT DISTINCT k.aggregate_type, k.aggregate_id
                 FROM {s}.outbox_consumer_parked k
                 LEFT JOIN {s}.outbox_consumer_positions p
                   ON p.consumer_name = k.consumer_name AND p.aggregate_type = k.aggregate_type
                  AND p.aggregate_id = k.aggregate_id
                 WHERE k.consumer_name = $1 AND k.aggregate_version = coalesce(p.version, 0) + 1
                   AND (k.retry_at IS NULL OR k.retry_at <= now())
                 LIMIT 1000"
            ),
            // Aggregates that have waited too long for a missing version,
            // with the version they wait for.
            expired_parked: format!(
                "SELECT k.aggregate_type, k.aggregate_id, coalesce(max(p.version), 0) AS position,
                        min(k.aggregate_version) AS first_parked
                 FROM {s}.outbox_consumer_parked k
                 LEFT JOIN {s}.outbox_consumer_positions p
                   ON p.consumer_name = k.consumer_name AND p.aggregate_type = k.aggregate_type
                  AND p.aggregate_id = k.aggregate_id
                 WHERE k.consumer_name = $1
                 GROUP BY k.aggregate_type, k.aggregate_id
                 HAVING min(k.parked_at) < now() - make_interval(secs => $2)
                 LIMIT 1000"
            ),
            // The parked messages of an aggregate to the dead letters: their
            // inbox rows go (they were never applied, so a replay can apply
            // them once), their attributes become the letter's headers.
            dead_letter_parked: format!(
                "WITH gone AS (
                    DELETE FROM {s}.outbox_consumer_parked
                    WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                    RETURNING *
                 ),
                 released AS (
                    DELETE FROM {s}.outbox_processed_events pe USING gone g
                    WHERE pe.consumer_name = $1 AND pe.event_id = g.event_id
                 )
                 INSERT INTO {s}.outbox_dead_letters
                    (consumer_name, kind, event_id, event_type, schema_version, aggregate_type,
                     aggregate_id, aggregate_version, headers, payload, reason, attempts)
                 SELECT $1, 'dead_lettered', event_id, envelope->>'event_type',
                        (envelope->>'schema_version')::int, aggregate_type, aggregate_id,
                        aggregate_version, {moved_headers},
                        convert_to((envelope->'payload')::text, 'UTF8'), $4, attempts
                 FROM gone ORDER BY aggregate_version
                 ON CONFLICT (consumer_name, event_id) WHERE resolved_at IS NULL AND event_id IS NOT NULL
                 DO NOTHING"
            ),
            // Dead-letters the aggregate's parked messages only if, under
            // the position lock, the next version ($4 + 1) is still not
            // parked, is not retrying (a failed handler's message due back
            // less than the timeout ago) and the oldest parked message is
            // past the timeout ($5 s).
            expire_parked: format!(
                "WITH due AS (
                    SELECT 1 FROM {s}.outbox_consumer_parked
                    WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                    HAVING min(parked_at) < now() - make_interval(secs => $5)
                       AND NOT bool_or(aggregate_version = $4 + 1)
                       AND NOT EXISTS (
                           SELECT 1 FROM {s}.outbox_consumer_attempts a
                           WHERE a.consumer_name = $1 AND a.aggregate_type = $2 AND a.aggregate_id = $3
                             AND a.aggregate_version = $4 + 1
                             AND a.retry_at > now() - make_interval(secs => $5))
                 ),
                 gone AS (
                    DELETE FROM {s}.outbox_consumer_parked
                    WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                      AND EXISTS (SELECT 1 FROM due)
                    RETURNING *
                 ),
                 released AS (
                    DELETE FROM {s}.outbox_processed_events pe USING gone g
                    WHERE pe.consumer_name = $1 AND pe.event_id = g.event_id
                 )
                 INSERT INTO {s}.outbox_dead_letters
                    (consumer_name, kind, event_id, event_type, schema_version, aggregate_type,
                     aggregate_id, aggregate_version, headers, payload, reason, attempts)
                 SELECT $1, 'dead_lettered', event_id, envelope->>'event_type',
                        (envelope->>'schema_version')::int, aggregate_type, aggregate_id,
                        aggregate_version, {moved_headers},
                        convert_to((envelope->'payload')::text, 'UTF8'), $6, attempts
                 FROM gone ORDER BY aggregate_version
                 ON CONFLICT (consumer_name, event_id) WHERE resolved_at IS NULL AND event_id IS NOT NULL
                 DO NOTHING"
            ),
            // A letter is written only for an event this consumer has not
            // applied, and at most once while it is open (a redelivery of a
            // quarantined message writes nothing). No row back: not written.
            letter: format!(
                "INSERT INTO {s}.outbox_dead_letters
                    (consumer_name, kind, event_id, event_type, schema_version, aggregate_type,
                     aggregate_id, aggregate_version, headers, payload, reason, attempts)
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12
                 WHERE $3::uuid IS NULL OR NOT EXISTS (
                     SELECT 1 FROM {s}.outbox_processed_events WHERE consumer_name = $1 AND event_id = $3)
                 ON CONFLICT (consumer_name, event_id) WHERE resolved_at IS NULL AND event_id IS NOT NULL
                 DO NOTHING"
            ),
            // Replay: the open letter, locked for the replay's transaction.
            lock_letter: format!(
                "SELECT headers::text AS headers, payload FROM {s}.outbox_dead_letters
                 WHERE id = $1 AND consumer_name = $2 AND resolved_at IS NULL
                 FOR UPDATE"
            ),
            // Replays an operator asked for (the CLI marks them; this
            // consumer has the handlers).
            requested_replays: format!(
                "SELECT id FROM {s}.outbox_dead_letters
                 WHERE consumer_name = $1 AND replay_requested_at IS NOT NULL AND resolved_at IS NULL
                 ORDER BY id LIMIT 100"
            ),
            // Added up across the instances of a consumer; the lag is the
            // one of the most recently applied event.
            flush_stats: format!(
                "INSERT INTO {s}.outbox_consumer_stats AS t
                    (consumer_name, applied, duplicates, last_applied_at, lag_seconds, updated_at)
                 VALUES ($1, $2, $3, $4, $5, now())
                 ON CONFLICT (consumer_name) DO UPDATE SET
                    applied = t.applied + EXCLUDED.applied,
                    duplicates = t.duplicates + EXCLUDED.duplicates,
                    lag_seconds = CASE
                        WHEN EXCLUDED.last_applied_at >= coalesce(t.last_applied_at, '-infinity')
                        THEN EXCLUDED.lag_seconds ELSE t.lag_seconds END,
                    last_applied_at = greatest(t.last_applied_at, EXCLUDED.last_applied_at),
                    updated_at = now()"
            ),
            // Takes a request: of several instances, one gets the row.
            take_replay_request: format!(
                "UPDATE {s}.outbox_dead_letters SET replay_requested_at = NULL
                 WHERE id = $1 AND consumer_name = $2
                   AND replay_requested_at IS NOT NULL AND resolved_at IS NULL
                 RETURNING replay_audit_id"
            ),
            resolve_letter: format!(
                "UPDATE {s}.outbox_dead_letters
                 SET resolved_at = now(), resolution = $3, replays = replays + 1
                 WHERE id = $1 AND consumer_name = $2 AND resolved_at IS NULL"
            ),
            letter_replay_failed: format!(
                "UPDATE {s}.outbox_dead_letters
                 SET replays = replays + 1, last_replay_error = $3
                 WHERE id = $1 AND consumer_name = $2 AND resolved_at IS NULL"
            ),
        }
    }
}

/// The PostgreSQL consumer store: the [`ConsumerStore`] a consumer built
/// with [`ConsumerBuilder::build`](crate::ConsumerBuilderPostgresExt::build)
/// runs on (its tables in `schema`, migrated with [`crate::migrate`]).
#[derive(Debug, Clone)]
pub struct PgConsumerStore {
    pool: PgPool,
    schema: SchemaName,
    sql: std::sync::Arc<ConsumerSql>,
    audit: std::sync::Arc<AuditSql>,
}

impl PgConsumerStore {
    /// The store of the consumer tables in `schema` on `pool`.
    pub fn new(pool: PgPool, schema: SchemaName) -> PgConsumerStore {
        PgConsumerStore {
            sql: std::sync::Arc::new(ConsumerSql::new(&schema)),
            audit: std::sync::Arc::new(AuditSql::new(&schema)),
            pool,
            schema,
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema of the consumer tables.
    pub fn schema(&self) -> &SchemaName {
        &self.schema
    }

    async fn select_for_update(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregates: &[(String, String)],
    ) -> sqlx::Result<Vec<((String, String), Position)>> {
        let (types, ids): (Vec<&str>, Vec<&str>) = aggregates
            .iter()
            .map(|(t, i)| (t.as_str(), i.as_str()))
            .unzip();
        let rows = sqlx::query(AssertSqlSafe(self.sql.lock_positions.as_str()))
            .bind(consumer)
            .bind(types)
            .bind(ids)
            .fetch_all(conn)
            .await?;
        rows.into_iter()
            .map(|row| {
                Ok((
                    (row.try_get(0)?, row.try_get(1)?),
                    position_from_row(&row, 2)?,
                ))
            })
            .collect()
    }
}

/// What a failed release of the message's savepoint says: 25P02, the
/// handler caught a statement's error and went on; 25P01 (no transaction)
/// or 3B001 (no such savepoint, in a transaction the handler began), the
/// handler ended ours; anything else, the attempt failed with it.
fn failed_check(error: sqlx::Error) -> HandlerError {
    if crate::has_sqlstate(&error, "25P02") {
        HandlerError::retryable(SWALLOWED)
    } else if crate::has_sqlstate(&error, "25P01") || crate::has_sqlstate(&error, "3B001") {
        HandlerError::retryable(HANDLER_ENDED_TRANSACTION)
    } else {
        HandlerError::retryable(error)
    }
}

/// Cuts a handler's statements off after `timeout`, and takes the
/// savepoint `transaction_intact` looks for (same round trip as BEGIN).
fn begin_sql(timeout: Duration) -> String {
    format!(
        "BEGIN; SET LOCAL statement_timeout = {}; SAVEPOINT outbox_message",
        timeout.as_millis().max(1)
    )
}

impl ConsumerStore for PgConsumerStore {
    type Db = Postgres;

    /// PostgreSQL text and jsonb cannot hold NUL characters: a message
    /// that carries one in an attribute, or as `\u0000` in its payload, is
    /// refused before any statement would fail on it at every delivery.
    /// SQLSTATE 25P02: the handler caught a statement's error and went on.
    fn is_failed_transaction(&self, error: &sqlx::Error) -> bool {
        crate::has_sqlstate(error, "25P02")
    }

    fn refuses(&self, incoming: &Incoming, _envelope: &Envelope) -> Option<String> {
        if let Some((name, _)) = incoming
            .attributes()
            .iter()
            .find(|(name, value)| name.contains('\0') || value.contains('\0'))
        {
            return Some(format!(
                "attribute {:?} contains a NUL character, which PostgreSQL text cannot store",
                name.replace('\0', "\\0")
            ));
        }
        let payload = incoming.payload();
        if payload.contains(&0) || payload.windows(6).any(|w| w == b"\\u0000") {
            return Some(
                "the payload contains a NUL character, which PostgreSQL jsonb cannot store".into(),
            );
        }
        None
    }

    /// Begins a transaction whose statements PostgreSQL cancels after the
    /// handler timeout (same round trip as BEGIN): a handler cut off by its
    /// timeout does not leave a statement running, holding locks, while
    /// the rollback waits for it.
    async fn begin(
        &self,
        handler_timeout: Duration,
    ) -> sqlx::Result<Transaction<'static, Postgres>> {
        self.pool
            .begin_with(AssertSqlSafe(begin_sql(handler_timeout)))
            .await
    }

    /// As `begin`, with generic plans for the batch's own statements until
    /// its settlement (which restores the session's setting before any
    /// handler runs). Their array parameters made PostgreSQL plan them
    /// anew on every batch (0.3 ms of a 1 ms statement); the handlers'
    /// statements are planned as the session plans them.
    async fn begin_batch(
        &self,
        handler_timeout: Duration,
    ) -> sqlx::Result<Transaction<'static, Postgres>> {
        self.pool
            .begin_with(AssertSqlSafe(format!(
                "{};
                 SELECT set_config('outbox.plan_cache_mode', current_setting('plan_cache_mode'), true);
                 SET LOCAL plan_cache_mode = force_generic_plan",
                begin_sql(handler_timeout)
            )))
            .await
    }

    async fn acquire(&self) -> sqlx::Result<PoolConnection<Postgres>> {
        self.pool.acquire().await
    }

    /// A handler that caught a statement error and returned `Ok` leaves
    /// the transaction failed; PostgreSQL would turn the COMMIT into a
    /// silent ROLLBACK. A handler that sent `ROLLBACK` or `COMMIT` itself
    /// ended the transaction the inbox row and position were written in.
    /// One round trip finds out (sqlx does not expose the server's
    /// transaction status): releasing the savepoint `begin` took fails
    /// with 25P02 in a failed transaction, and with 25P01 (no transaction)
    /// or 3B001 (no such savepoint, in a transaction the handler began)
    /// when the handler ended ours. The savepoint is taken anew for the
    /// next handler of a batch.
    async fn transaction_intact(&self, conn: &mut PgConnection) -> Result<(), HandlerError> {
        sqlx::raw_sql("RELEASE SAVEPOINT outbox_message; SAVEPOINT outbox_message")
            .execute(&mut *conn)
            .await
            .map(|_| ())
            .map_err(failed_check)
    }

    /// The check of [`transaction_intact`](Self::transaction_intact) and
    /// the commit in one round trip: `RELEASE SAVEPOINT outbox_message;
    /// COMMIT; BEGIN` as one simple query. PostgreSQL runs its statements
    /// in order and stops at the first error: an error before the first
    /// statement completed is the check's (a failed attempt, mapped as
    /// `transaction_intact` maps it, nothing committed, the transaction
    /// handed back); one after it is the commit's. The trailing `BEGIN`
    /// opens an empty transaction that takes the committed one's place in
    /// sqlx's books: dropping `tx` queues its `ROLLBACK`, which goes out
    /// with the pool's check of the returned connection (one round trip,
    /// which that check makes anyway).
    async fn commit_checked(
        &self,
        mut tx: Transaction<'static, Postgres>,
    ) -> sqlx::Result<CheckedCommit<Postgres>> {
        let failure = {
            let mut results = sqlx::raw_sql("RELEASE SAVEPOINT outbox_message; COMMIT; BEGIN")
                .fetch_many(&mut *tx);
            let mut completed = 0;
            let mut failure = None;
            while let Some(result) = results.next().await {
                match result {
                    Ok(Either::Left(_)) => completed += 1,
                    Ok(Either::Right(_)) => {}
                    Err(error) => {
                        failure = Some((completed, error));
                        break;
                    }
                }
            }
            failure
        };
        match failure {
            None => {
                drop(tx);
                Ok(CheckedCommit::Committed)
            }
            Some((0, error)) => Ok(CheckedCommit::HandlerFailed(tx, failed_check(error))),
            Some((_, error)) => Err(error),
        }
    }

    async fn audit_begin(
        &self,
        conn: &mut PgConnection,
        request: &RepairRequest,
        action: &str,
        target: &str,
        ids: &[String],
    ) -> sqlx::Result<i64> {
        self.audit.begin(conn, request, action, target, ids).await
    }

    async fn audit_append(
        &self,
        conn: &mut PgConnection,
        audit_id: i64,
        outcomes: &serde_json::Value,
    ) -> sqlx::Result<()> {
        self.audit.append(conn, audit_id, outcomes).await
    }

    async fn audit_finish(
        &self,
        conn: &mut PgConnection,
        audit_id: i64,
        outcomes: &serde_json::Value,
    ) -> sqlx::Result<()> {
        self.audit.finish(conn, audit_id, outcomes).await
    }

    /// Counts a handler start of a redelivered message (committed on its
    /// own, before the handler runs); returns the start number (2 for the
    /// first redelivery).
    async fn count_start(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<u32> {
        let starts: i32 = sqlx::query_scalar(AssertSqlSafe(self.sql.count_start.as_str()))
            .bind(consumer)
            .bind(event_id)
            .fetch_one(conn)
            .await?;
        Ok(starts.max(1) as u32)
    }

    /// Strict: commits the retry record on a connection of its own while
    /// `tx` still holds the position, then rolls `tx` back.
    async fn roll_back_for_retry(
        &self,
        tx: Transaction<'static, Postgres>,
        consumer: &str,
        envelope: &Envelope,
        retry_in: Duration,
    ) -> sqlx::Result<()> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query(AssertSqlSafe(self.sql.note_retry.as_str()))
            .bind(consumer)
            .bind(envelope.id)
            .bind(&envelope.aggregate_type)
            .bind(&envelope.aggregate_id)
            .bind(envelope.aggregate_version)
            .bind(retry_in.as_millis().min(i64::MAX as u128) as i64)
            .execute(&mut *conn)
            .await?;
        let _ = tx.rollback().await;
        Ok(())
    }

    /// Drops the start count of a settled message.
    async fn forget_starts(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query(AssertSqlSafe(self.sql.forget_starts.as_str()))
            .bind(consumer)
            .bind(event_id)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Removes the inbox row of an event that is not applied after all (a
    /// parked message that goes to the quarantine or the dead letters).
    async fn forget_processed(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query(AssertSqlSafe(self.sql.forget_processed.as_str()))
            .bind(consumer)
            .bind(event_id)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Records `event_id` as processed by `consumer`; false when it already
    /// was, or an open letter holds it.
    async fn claim_one(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(AssertSqlSafe(self.sql.inbox_one.as_str()))
            .bind(consumer)
            .bind(event_id)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records `event_id` for a replay of its open letter; false when the
    /// consumer applied it already.
    async fn claim_replay(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(AssertSqlSafe(self.sql.inbox_replay.as_str()))
            .bind(consumer)
            .bind(event_id)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records many event ids in one statement; returns those that were new.
    async fn claim_many(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> sqlx::Result<Vec<Uuid>> {
        sqlx::query_scalar(AssertSqlSafe(self.sql.inbox_many.as_str()))
            .bind(consumer)
            .bind(event_ids)
            .fetch_all(conn)
            .await
    }

    /// Locks the positions of `aggregates` (sorted, distinct) and returns
    /// them (created at 0, not pinned, when new): one statement when every
    /// aggregate has its position row, as in a steady stream.
    async fn lock_positions(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregates: &[(String, String)],
    ) -> sqlx::Result<Vec<((String, String), Position)>> {
        let mut locked = self.select_for_update(conn, consumer, aggregates).await?;
        if locked.len() == aggregates.len() {
            return Ok(locked);
        }
        let have: std::collections::HashSet<&(String, String)> =
            locked.iter().map(|(aggregate, _)| aggregate).collect();
        let missing: Vec<(String, String)> = aggregates
            .iter()
            .filter(|a| !have.contains(a))
            .cloned()
            .collect();
        let (types, ids): (Vec<&str>, Vec<&str>) = missing
            .iter()
            .map(|(t, i)| (t.as_str(), i.as_str()))
            .unzip();
        let created: Vec<(String, String)> =
            sqlx::query_as(AssertSqlSafe(self.sql.create_positions.as_str()))
                .bind(consumer)
                .bind(types)
                .bind(ids)
                .fetch_all(&mut *conn)
                .await?;
        let raced: Vec<(String, String)> = missing
            .into_iter()
            .filter(|a| !created.contains(a))
            .collect();
        locked.extend(
            created
                .into_iter()
                .map(|aggregate| (aggregate, Position::NEW)),
        );
        if !raced.is_empty() {
            locked.extend(self.select_for_update(conn, consumer, &raced).await?);
        }
        Ok(locked)
    }

    /// Strict, one message: records the event in the inbox and, when it is
    /// new, either moves its aggregate's position to it (it is the next
    /// version) or locks and returns the position for the ordering
    /// decision (creating it at 0, not pinned, for the aggregate's first
    /// message: a second statement); `None` for a duplicate (or an event
    /// an open letter holds).
    async fn claim_strict(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<Option<StrictClaim>> {
        let row = sqlx::query(AssertSqlSafe(self.sql.claim_strict.as_str()))
            .bind(consumer)
            .bind(envelope.id)
            .bind(&envelope.aggregate_type)
            .bind(&envelope.aggregate_id)
            .bind(envelope.aggregate_version)
            .fetch_one(&mut *conn)
            .await?;
        let fresh: i64 = row.try_get(0)?;
        if fresh == 0 {
            return Ok(None);
        }
        if let Some(successor_parked) = row.try_get::<Option<bool>, _>(1)? {
            return Ok(Some(StrictClaim::Advanced { successor_parked }));
        }
        let position = match row.try_get::<Option<i64>, _>(2)? {
            Some(_) => position_from_row(&row, 2)?,
            None => {
                self.lock_position(
                    conn,
                    consumer,
                    &envelope.aggregate_type,
                    &envelope.aggregate_id,
                )
                .await?
            }
        };
        Ok(Some(StrictClaim::Locked(position)))
    }

    /// RejectStale, one message: records the event in the inbox and, when
    /// it is new, moves the position if the message is newer; `None` for
    /// a duplicate, `Some(moved)` otherwise.
    async fn claim_stale(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<Option<bool>> {
        let (fresh, moved): (i64, i64) =
            sqlx::query_as(AssertSqlSafe(self.sql.claim_stale.as_str()))
                .bind(consumer)
                .bind(envelope.id)
                .bind(&envelope.aggregate_type)
                .bind(&envelope.aggregate_id)
                .bind(envelope.aggregate_version)
                .fetch_one(conn)
                .await?;
        Ok((fresh > 0).then_some(moved > 0))
    }

    /// Strict, after a handler: moves the locked position to the
    /// envelope's version; true when the next version waits parked.
    async fn settle_strict(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<bool> {
        let ready: Option<bool> =
            sqlx::query_scalar(AssertSqlSafe(self.sql.settle_strict.as_str()))
                .bind(consumer)
                .bind(&envelope.aggregate_type)
                .bind(&envelope.aggregate_id)
                .bind(envelope.aggregate_version)
                .fetch_optional(conn)
                .await?;
        Ok(ready.unwrap_or(false))
    }

    /// Batch mode, before the handlers: writes the moved positions and the
    /// parked messages and ends the batch's generic-plan window; returns
    /// the aggregates whose next version waits parked.
    async fn settle_batch(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        moved: &[MovedPosition],
        parked: &[Envelope],
    ) -> sqlx::Result<Vec<(String, String)>> {
        let types: Vec<&str> = moved.iter().map(|m| m.aggregate.0.as_str()).collect();
        let ids: Vec<&str> = moved.iter().map(|m| m.aggregate.1.as_str()).collect();
        let versions: Vec<i64> = moved.iter().map(|m| m.version).collect();
        let starts: Vec<i64> = moved.iter().map(|m| m.start).collect();
        let (ready, _restored): (String, String) = if parked.is_empty() {
            sqlx::query_as(AssertSqlSafe(self.sql.settle_moved.as_str()))
                .bind(consumer)
                .bind(types)
                .bind(ids)
                .bind(versions)
                .bind(starts)
                .fetch_one(conn)
                .await?
        } else {
            let envelopes = parked
                .iter()
                .map(serde_json::to_string)
                .collect::<Result<Vec<String>, _>>()
                .map_err(|e| sqlx::Error::Encode(e.into()))?;
            sqlx::query_as(AssertSqlSafe(self.sql.settle_batch.as_str()))
                .bind(consumer)
                .bind(types)
                .bind(ids)
                .bind(versions)
                .bind(starts)
                .bind(parked.iter().map(|e| e.id).collect::<Vec<_>>())
                .bind(
                    parked
                        .iter()
                        .map(|e| e.aggregate_type.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    parked
                        .iter()
                        .map(|e| e.aggregate_id.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    parked
                        .iter()
                        .map(|e| e.aggregate_version)
                        .collect::<Vec<_>>(),
                )
                .bind(envelopes)
                .fetch_one(conn)
                .await?
        };
        serde_json::from_str(&ready).map_err(|e| sqlx::Error::Decode(e.into()))
    }

    /// Strict: fixes the start of the never-started ones among
    /// `aggregates` at version 1 (committed before a handler starts on a
    /// version 1, or with the letter for one).
    async fn pin_first(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregates: &[(&str, &str)],
    ) -> sqlx::Result<()> {
        let (types, ids): (Vec<&str>, Vec<&str>) = aggregates.iter().copied().unzip();
        sqlx::query(AssertSqlSafe(self.sql.pin_first.as_str()))
            .bind(consumer)
            .bind(types)
            .bind(ids)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// The open letter (id, kind) that holds `version` of an aggregate.
    async fn open_letter_at(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
    ) -> sqlx::Result<Option<(i64, String)>> {
        sqlx::query_as(AssertSqlSafe(self.sql.open_letter_at.as_str()))
            .bind(consumer)
            .bind(aggregate.0)
            .bind(aggregate.1)
            .bind(version)
            .fetch_optional(conn)
            .await
    }

    /// RejectStale: moves the position to `version` when it is newer;
    /// false when the message is stale.
    async fn advance_if_newer(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<bool> {
        let row = sqlx::query(AssertSqlSafe(self.sql.advance_if_newer.as_str()))
            .bind(consumer)
            .bind(&envelope.aggregate_type)
            .bind(&envelope.aggregate_id)
            .bind(envelope.aggregate_version)
            .fetch_optional(conn)
            .await?;
        Ok(row.is_some())
    }

    /// Strict: locks the aggregate's position and returns it (0 = none
    /// yet) with whether it is pinned (false: no handler was ever started
    /// on this aggregate).
    async fn lock_position(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> sqlx::Result<Position> {
        let row = sqlx::query(AssertSqlSafe(self.sql.lock_position.as_str()))
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .fetch_one(conn)
            .await?;
        position_from_row(&row, 0)
    }

    /// Strict, the sweep: locks and returns the aggregate's position;
    /// `None` when another transaction holds it (or there is none).
    async fn try_lock_position(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> sqlx::Result<Option<Position>> {
        let row = sqlx::query(AssertSqlSafe(self.sql.try_lock_position.as_str()))
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .fetch_optional(conn)
            .await?;
        row.map(|row| position_from_row(&row, 0)).transpose()
    }

    /// Strict: starts a never-started aggregate at its lowest version seen
    /// (parked or lettered); the new position and whether that version is
    /// parked, or `None` when it was pinned meanwhile or nothing is there.
    async fn baseline(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregate: (&str, &str),
    ) -> sqlx::Result<Option<(i64, bool)>> {
        sqlx::query_as(AssertSqlSafe(self.sql.baseline.as_str()))
            .bind(consumer)
            .bind(aggregate.0)
            .bind(aggregate.1)
            .fetch_optional(conn)
            .await
    }

    /// Strict: sets the locked position.
    async fn set_position(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<()> {
        sqlx::query(AssertSqlSafe(self.sql.set_position.as_str()))
            .bind(consumer)
            .bind(&envelope.aggregate_type)
            .bind(&envelope.aggregate_id)
            .bind(envelope.aggregate_version)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Strict: keeps a message that came ahead of a gap.
    async fn park(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<()> {
        let json = serde_json::to_string(envelope).map_err(|e| sqlx::Error::Encode(e.into()))?;
        sqlx::query(AssertSqlSafe(self.sql.park.as_str()))
            .bind(consumer)
            .bind(envelope.id)
            .bind(&envelope.aggregate_type)
            .bind(&envelope.aggregate_id)
            .bind(envelope.aggregate_version)
            .bind(json)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Strict: takes the parked message with `version` of an aggregate, if
    /// any and not waiting for its backoff or another instance's lease,
    /// counts its start and leases it to the caller for `lease`.
    async fn start_parked(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
        lease: Duration,
    ) -> sqlx::Result<Option<Result<ParkedMessage, serde_json::Error>>> {
        let lease_ms = lease.as_millis().min(i64::MAX as u128) as i64;
        let row = sqlx::query(AssertSqlSafe(self.sql.start_parked.as_str()))
            .bind(consumer)
            .bind(aggregate.0)
            .bind(aggregate.1)
            .bind(version)
            .bind(lease_ms)
            .fetch_optional(conn)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let json: String = row.try_get("envelope")?;
        let attempts: i32 = row.try_get("attempts")?;
        Ok(Some(serde_json::from_str(&json).map(|envelope| {
            ParkedMessage {
                envelope,
                attempts: attempts.max(1) as u32,
            }
        })))
    }

    /// Strict: locks a parked message; false when it is gone.
    async fn lock_parked(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<bool> {
        let row = sqlx::query(AssertSqlSafe(self.sql.lock_parked.as_str()))
            .bind(consumer)
            .bind(event_id)
            .fetch_optional(conn)
            .await?;
        Ok(row.is_some())
    }

    /// Strict: removes the parked messages of an aggregate up to `version`.
    async fn unpark_through(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
    ) -> sqlx::Result<()> {
        sqlx::query(AssertSqlSafe(self.sql.unpark_through.as_str()))
            .bind(consumer)
            .bind(aggregate.0)
            .bind(aggregate.1)
            .bind(version)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Strict: moves an aggregate's parked messages to the dead letters if
    /// it still waits for `position + 1` past the timeout; returns how many.
    async fn expire_parked(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregate: (&str, &str),
        position: i64,
        timeout_secs: f64,
        reason: &str,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query(AssertSqlSafe(self.sql.expire_parked.as_str()))
            .bind(consumer)
            .bind(aggregate.0)
            .bind(aggregate.1)
            .bind(position)
            .bind(timeout_secs)
            .bind(reason)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    /// Strict: removes a parked message once handled.
    async fn unpark(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query(AssertSqlSafe(self.sql.unpark.as_str()))
            .bind(consumer)
            .bind(event_id)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Strict: records the last error of a parked message and when it may
    /// start again; false when the message is no longer parked (another
    /// instance applied it).
    async fn parked_failed(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_id: Uuid,
        error: &str,
        retry_in: Duration,
    ) -> sqlx::Result<bool> {
        let attempts: Option<i32> =
            sqlx::query_scalar(AssertSqlSafe(self.sql.parked_failed.as_str()))
                .bind(consumer)
                .bind(event_id)
                .bind(error)
                .bind(retry_in.as_millis().min(i64::MAX as u128) as i64)
                .fetch_optional(conn)
                .await?;
        Ok(attempts.is_some())
    }

    /// Strict: aggregates whose next version waits in the parked table.
    async fn ready_parked(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
    ) -> sqlx::Result<Vec<(String, String)>> {
        let rows = sqlx::query(AssertSqlSafe(self.sql.ready_parked.as_str()))
            .bind(consumer)
            .fetch_all(conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| (row.get("aggregate_type"), row.get("aggregate_id")))
            .collect())
    }

    /// Strict: aggregates parked longer than `timeout_secs`, with their
    /// position and first parked version.
    async fn expired_parked(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        timeout_secs: f64,
    ) -> sqlx::Result<Vec<ExpiredAggregate>> {
        let rows = sqlx::query(AssertSqlSafe(self.sql.expired_parked.as_str()))
            .bind(consumer)
            .bind(timeout_secs)
            .fetch_all(conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| ExpiredAggregate {
                aggregate_type: row.get("aggregate_type"),
                aggregate_id: row.get("aggregate_id"),
                position: row.get("position"),
                first_parked: row.get("first_parked"),
            })
            .collect())
    }

    /// Strict: moves every parked message of an aggregate to the dead
    /// letters with `reason`; returns how many.
    async fn dead_letter_parked(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        aggregate: (&str, &str),
        reason: &str,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query(AssertSqlSafe(self.sql.dead_letter_parked.as_str()))
            .bind(consumer)
            .bind(aggregate.0)
            .bind(aggregate.1)
            .bind(reason)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    /// Writes a quarantine or dead-letter row; false when nothing was
    /// written because the consumer applied the event already or an open
    /// letter for it exists.
    async fn letter(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        letter: &Letter<'_>,
    ) -> sqlx::Result<bool> {
        let envelope = letter.envelope;
        let done = sqlx::query(AssertSqlSafe(self.sql.letter.as_str()))
            .bind(consumer)
            .bind(letter.kind.as_str())
            .bind(envelope.map(|e| e.id))
            .bind(envelope.map(|e| e.event_type.as_str()))
            .bind(envelope.and_then(|e| i32::try_from(e.schema_version).ok()))
            .bind(envelope.map(|e| e.aggregate_type.as_str()))
            .bind(envelope.map(|e| e.aggregate_id.as_str()))
            .bind(envelope.map(|e| e.aggregate_version))
            .bind(&letter.headers)
            .bind(letter.payload)
            .bind(letter.reason)
            .bind(letter.attempts.min(i32::MAX as u32) as i32)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Replay: locks an open letter of `consumer` and returns its headers
    /// (JSON text) and payload; `None` when there is no such open
    /// letter.
    async fn lock_letter(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        letter_id: i64,
    ) -> sqlx::Result<Option<StoredLetter>> {
        let row = sqlx::query(AssertSqlSafe(self.sql.lock_letter.as_str()))
            .bind(letter_id)
            .bind(consumer)
            .fetch_optional(conn)
            .await?;
        row.map(|row| {
            Ok(StoredLetter {
                headers: row.try_get("headers")?,
                payload: row.try_get("payload")?,
            })
        })
        .transpose()
    }

    /// Letters of `consumer` with a replay request.
    async fn requested_replays(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
    ) -> sqlx::Result<Vec<i64>> {
        sqlx::query_scalar(AssertSqlSafe(self.sql.requested_replays.as_str()))
            .bind(consumer)
            .fetch_all(conn)
            .await
    }

    /// Adds a consumer's counts since its last flush.
    async fn flush_stats(
        &self,
        consumer: &str,
        applied: i64,
        duplicates: i64,
        last_applied_at: Option<chrono::DateTime<chrono::Utc>>,
        lag_seconds: Option<f64>,
    ) -> sqlx::Result<()> {
        sqlx::query(AssertSqlSafe(self.sql.flush_stats.as_str()))
            .bind(consumer)
            .bind(applied)
            .bind(duplicates)
            .bind(last_applied_at)
            .bind(lag_seconds)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Takes a replay request: the audit row it names (`Some(None)` for a
    /// request without one), or `None` when another instance took it or
    /// the letter was closed.
    async fn take_replay_request(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        letter_id: i64,
    ) -> sqlx::Result<Option<Option<i64>>> {
        sqlx::query_scalar(AssertSqlSafe(self.sql.take_replay_request.as_str()))
            .bind(letter_id)
            .bind(consumer)
            .fetch_optional(conn)
            .await
    }

    /// Replay: closes a letter with what happened; false when it was not
    /// open any more.
    async fn resolve_letter(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        letter_id: i64,
        resolution: &str,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(AssertSqlSafe(self.sql.resolve_letter.as_str()))
            .bind(letter_id)
            .bind(consumer)
            .bind(resolution)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Replay: counts a replay that did not settle the letter, with why.
    async fn letter_replay_failed(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        letter_id: i64,
        error: &str,
    ) -> sqlx::Result<()> {
        sqlx::query(AssertSqlSafe(self.sql.letter_replay_failed.as_str()))
            .bind(letter_id)
            .bind(consumer)
            .bind(error)
            .execute(conn)
            .await?;
        Ok(())
    }
}
