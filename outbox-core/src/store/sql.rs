//! The SQL text of every statement, built once per schema. Identifiers come
//! from a validated [`SchemaName`]; every value is a bind parameter.
//!
//! Emit statements do their work in one round trip each: the version
//! counter upsert, the event insert, the idempotency key claim and the
//! guarded NOTIFY are CTEs of a single statement.

use super::schema::SchemaName;

/// A one-row relation that sends NOTIFY only while some relay sleeps
/// waiting for it (and has shown signs of life recently). A notifying
/// commit takes PostgreSQL's global notify lock and serializes with every
/// other notifying commit; under load the relays are busy, nobody waits,
/// and nobody pays. Joined into the insert's FROM list it runs once per
/// statement (measured: cheaper than a materialized CTE).
fn notified(s: &str, channel_param: &str) -> String {
    format!(
        "(SELECT count(*) FROM (
            SELECT pg_notify({channel_param}, '') FROM {s}.outbox_relay_listeners
            WHERE waiting AND heartbeat_at > now() - interval '5 minutes' LIMIT 1
        ) AS wake) AS notified"
    )
}

/// Emit statements.
#[derive(Debug, Clone)]
pub(crate) struct EmitSql {
    /// One event, version from the counter. Binds: id, aggregate_type,
    /// aggregate_id, event_type, schema_version, payload, traceparent,
    /// channel. Returns aggregate_version.
    pub(crate) counter: String,
    /// One event with its own version. Binds as `counter` plus
    /// aggregate_version ($9). Returns nothing (one row affected).
    pub(crate) explicit: String,
    /// As `counter`, claiming an idempotency key ($9) first; no row when
    /// the key exists.
    pub(crate) counter_with_key: String,
    /// As `explicit`, claiming an idempotency key ($10) first; no row
    /// affected when the key exists.
    pub(crate) explicit_with_key: String,
    /// The event id stored under an idempotency key. Binds: key.
    pub(crate) existing_key: String,
    /// Many events (arrays, in order). Binds: ids, aggregate_types,
    /// aggregate_ids, explicit versions (NULL = counter), event_types,
    /// schema_versions, payloads, traceparents, channel.
    /// Returns id, aggregate_version in input order.
    pub(crate) batch: String,
}

impl EmitSql {
    pub(crate) fn new(schema: &SchemaName) -> EmitSql {
        let s = schema.quoted();
        let notified_single = notified(&s, "$8");
        let columns = "id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload, traceparent";
        let counter_cte = |source: &str| {
            format!(
                "version AS (
                    INSERT INTO {s}.outbox_aggregate_versions AS v (aggregate_type, aggregate_id, version)
                    SELECT $2, $3, 1 {source}
                    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET version = v.version + 1
                    RETURNING version
                )"
            )
        };
        let counter = format!(
            "WITH {version}
            INSERT INTO {s}.outbox_events ({columns})
            SELECT $1, $2, $3, version.version, $4, $5, $6, $7 FROM version, {notified_single}
            RETURNING aggregate_version",
            version = counter_cte("")
        );
        let explicit = format!(
            "INSERT INTO {s}.outbox_events ({columns})
            SELECT $1, $2, $3, $9, $4, $5, $6, $7 FROM {notified_single}"
        );
        let claimed = |key_param: &str| {
            format!(
                "claimed AS (
                    INSERT INTO {s}.outbox_idempotency_keys (idempotency_key, event_id)
                    VALUES ({key_param}, $1)
                    ON CONFLICT (idempotency_key) DO NOTHING
                    RETURNING event_id
                )"
            )
        };
        let counter_with_key = format!(
            "WITH {claimed}, {version}
            INSERT INTO {s}.outbox_events ({columns})
            SELECT $1, $2, $3, version.version, $4, $5, $6, $7 FROM version, {notified_single}
            RETURNING aggregate_version",
            claimed = claimed("$9"),
            version = counter_cte("FROM claimed")
        );
        let explicit_with_key = format!(
            "WITH {claimed}
            INSERT INTO {s}.outbox_events ({columns})
            SELECT $1, $2, $3, $10, $4, $5, $6, $7 FROM claimed, {notified_single}",
            claimed = claimed("$10")
        );
        let existing_key =
            format!("SELECT event_id FROM {s}.outbox_idempotency_keys WHERE idempotency_key = $1");
        let notified_batch = notified(&s, "$9");
        let batch = format!(
            "WITH input AS (
                SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[],
                                     $6::integer[], $7::jsonb[], $8::text[])
                    WITH ORDINALITY AS i(id, aggregate_type, aggregate_id, explicit_version, event_type,
                                         schema_version, payload, traceparent, ord)
            ),
            counted AS (
                SELECT aggregate_type, aggregate_id, count(*) AS n FROM input
                WHERE explicit_version IS NULL GROUP BY aggregate_type, aggregate_id
            ),
            bumped AS (
                INSERT INTO {s}.outbox_aggregate_versions AS v (aggregate_type, aggregate_id, version)
                SELECT aggregate_type, aggregate_id, n FROM counted ORDER BY aggregate_type, aggregate_id
                ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET version = v.version + EXCLUDED.version
                RETURNING aggregate_type, aggregate_id, version AS last_version
            ),
            numbered AS (
                SELECT i.*, coalesce(
                    i.explicit_version,
                    b.last_version - c.n + row_number() OVER (
                        PARTITION BY i.aggregate_type, i.aggregate_id, i.explicit_version IS NULL ORDER BY i.ord)
                ) AS aggregate_version
                FROM input i
                LEFT JOIN bumped b ON b.aggregate_type = i.aggregate_type AND b.aggregate_id = i.aggregate_id
                LEFT JOIN counted c ON c.aggregate_type = i.aggregate_type AND c.aggregate_id = i.aggregate_id
            ),
            inserted AS (
                INSERT INTO {s}.outbox_events ({columns})
                SELECT id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
                       payload, traceparent
                FROM numbered, {notified_batch}
                ORDER BY ord
                RETURNING id, aggregate_version
            )
            SELECT inserted.id, inserted.aggregate_version
            FROM inserted JOIN input USING (id)
            ORDER BY input.ord"
        );
        EmitSql {
            counter,
            explicit,
            counter_with_key,
            explicit_with_key,
            existing_key,
            batch,
        }
    }
}

/// Relay statements.
#[derive(Debug, Clone)]
pub(crate) struct RelaySql {
    /// Claims due events, a prefix per aggregate, locked until the claim
    /// transaction ends. Binds: lock namespace (int4), limit (int8), the
    /// statuses that block later versions (text[]), the idle timeout of the
    /// claim transaction (text, e.g. '120000ms').
    pub(crate) claim: String,
    /// Records a batch outcome. Binds: published ids, failed ids, their
    /// aggregate types, aggregate ids, errors, retry delays (ms), give-up
    /// flags, and whether a failed head stops blocking (bool).
    pub(crate) complete: String,
    /// Upserts a relay's waiting flag. Binds: relay id, waiting.
    pub(crate) set_waiting: String,
    /// Removes a relay's listener row. Binds: relay id.
    pub(crate) deregister: String,
    /// Backlog figures. Binds: the outbox table's regclass text.
    pub(crate) stats: String,
    /// Lists blocked aggregates. Binds: limit.
    pub(crate) blocked: String,
    /// Deletes one batch of published rows older than an age. Binds: age
    /// (seconds, float8), batch size.
    pub(crate) purge_published: String,
    /// Deletes one batch of idempotency keys older than an age. Binds: age
    /// (seconds), batch size.
    pub(crate) purge_keys: String,
}

impl RelaySql {
    pub(crate) fn new(schema: &SchemaName) -> RelaySql {
        let s = schema.quoted();
        let claim = format!(
            "WITH candidates AS MATERIALIZED (
                SELECT e.id, e.aggregate_type, e.aggregate_id, e.aggregate_version
                FROM {s}.outbox_events e
                WHERE e.status = 'pending'
                  AND e.next_attempt_at <= now()
                  AND NOT EXISTS (
                      SELECT 1 FROM {s}.outbox_blocked_aggregates b
                      WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                        AND b.head_event_id <> e.id)
                  AND pg_try_advisory_xact_lock($1, hashtext(e.aggregate_type || '/' || e.aggregate_id))
                ORDER BY e.id
                LIMIT $2
                FOR UPDATE OF e SKIP LOCKED
            ),
            heads AS (
                SELECT c.aggregate_type, c.aggregate_id
                FROM candidates c
                GROUP BY c.aggregate_type, c.aggregate_id
                HAVING count(*) = (
                    SELECT count(*) FROM {s}.outbox_events o
                    WHERE o.aggregate_type = c.aggregate_type AND o.aggregate_id = c.aggregate_id
                      AND o.status <> 'published' AND o.status = ANY($3)
                      AND o.aggregate_version <= max(c.aggregate_version))
            )
            SELECT e.id, e.aggregate_type, e.aggregate_id, e.aggregate_version, e.event_type,
                   e.schema_version, e.payload, e.traceparent, e.created_at, e.attempt_count
            FROM candidates c
            JOIN heads h ON h.aggregate_type = c.aggregate_type AND h.aggregate_id = c.aggregate_id
            JOIN {s}.outbox_events e ON e.id = c.id,
            (SELECT set_config('idle_in_transaction_session_timeout', $4, true)) AS guard
            ORDER BY e.aggregate_type, e.aggregate_id, e.aggregate_version"
        );
        let complete = format!(
            "WITH published AS (
                UPDATE {s}.outbox_events
                SET status = 'published', published_at = now(), attempt_count = attempt_count + 1,
                    last_error = NULL
                WHERE id = ANY($1)
                RETURNING id, aggregate_type, aggregate_id
            ),
            failures AS (
                SELECT * FROM UNNEST($2::uuid[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::boolean[])
                    AS f(id, aggregate_type, aggregate_id, error, delay_ms, give_up)
            ),
            unblocked AS (
                DELETE FROM {s}.outbox_blocked_aggregates b USING published p
                WHERE b.aggregate_type = p.aggregate_type AND b.aggregate_id = p.aggregate_id
                  AND b.head_event_id = p.id
                  AND NOT EXISTS (SELECT 1 FROM failures f
                                  WHERE f.aggregate_type = p.aggregate_type AND f.aggregate_id = p.aggregate_id)
                RETURNING 1
            ),
            retried AS (
                UPDATE {s}.outbox_events e SET
                    attempt_count = e.attempt_count + 1,
                    last_error = f.error,
                    next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
                    status = CASE WHEN f.give_up THEN 'failed' ELSE 'pending' END,
                    failed_at = CASE WHEN f.give_up THEN now() END
                FROM failures f WHERE e.id = f.id
                RETURNING e.id, e.aggregate_type, e.aggregate_id, f.give_up
            ),
            blocked AS (
                INSERT INTO {s}.outbox_blocked_aggregates (aggregate_type, aggregate_id, head_event_id)
                SELECT aggregate_type, aggregate_id, id FROM retried WHERE NOT (give_up AND $8)
                ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET head_event_id = EXCLUDED.head_event_id
                RETURNING 1
            ),
            skipped AS (
                DELETE FROM {s}.outbox_blocked_aggregates b USING retried r
                WHERE r.give_up AND $8
                  AND b.aggregate_type = r.aggregate_type AND b.aggregate_id = r.aggregate_id
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM published) AS published,
                   (SELECT count(*) FROM retried WHERE give_up) AS failed,
                   (SELECT count(*) FROM unblocked) + (SELECT count(*) FROM skipped) AS unblocked,
                   (SELECT count(*) FROM blocked) AS blocked"
        );
        let set_waiting = format!(
            "INSERT INTO {s}.outbox_relay_listeners (relay_id, waiting, heartbeat_at) VALUES ($1, $2, now())
             ON CONFLICT (relay_id) DO UPDATE SET waiting = EXCLUDED.waiting, heartbeat_at = now()"
        );
        let deregister = format!("DELETE FROM {s}.outbox_relay_listeners WHERE relay_id = $1");
        let stats = format!(
            "SELECT
                (SELECT count(*) FROM {s}.outbox_events WHERE status = 'pending') AS pending,
                (SELECT count(*) FROM {s}.outbox_events WHERE status = 'failed') AS failed,
                (SELECT created_at FROM {s}.outbox_events WHERE status = 'pending' ORDER BY id LIMIT 1) AS oldest,
                (SELECT count(*) FROM {s}.outbox_blocked_aggregates) AS blocked,
                coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0) AS dead,
                coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0) AS live"
        );
        let blocked = format!(
            "SELECT b.aggregate_type, b.aggregate_id, b.head_event_id, coalesce(e.status, 'missing'),
                    e.last_error, b.blocked_since
             FROM {s}.outbox_blocked_aggregates b
             LEFT JOIN {s}.outbox_events e ON e.id = b.head_event_id
             ORDER BY b.blocked_since LIMIT $1"
        );
        let purge_published = format!(
            "WITH doomed AS (
                SELECT id FROM {s}.outbox_events
                WHERE status = 'published' AND published_at < now() - $1 * interval '1 second'
                ORDER BY published_at LIMIT $2
                FOR UPDATE SKIP LOCKED
            )
            DELETE FROM {s}.outbox_events e USING doomed d WHERE e.id = d.id"
        );
        let purge_keys = format!(
            "DELETE FROM {s}.outbox_idempotency_keys WHERE idempotency_key IN (
                SELECT idempotency_key FROM {s}.outbox_idempotency_keys
                WHERE created_at < now() - $1 * interval '1 second'
                LIMIT $2 FOR UPDATE SKIP LOCKED)"
        );
        RelaySql {
            claim,
            complete,
            set_waiting,
            deregister,
            stats,
            blocked,
            purge_published,
            purge_keys,
        }
    }
}
