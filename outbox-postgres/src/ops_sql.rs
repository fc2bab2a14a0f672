//! The SQL of the operations API: backlog figures, listings with filters
//! and keyset paging, and the repairs. Every value is a bind parameter;
//! filters are optional parameters (`$n IS NULL OR …`), text filters match
//! with `strpos` (no wildcard characters to escape).

use outbox_core::store::SchemaName;

/// The operations statements of one schema.
#[derive(Debug, Clone)]
pub(crate) struct OpsSql {
    /// Per event type: pending, retrying, failed, skipped, oldest pending.
    pub(crate) per_event_type: String,
    /// Dead and live tuples. Binds: regclass text.
    pub(crate) tuples: String,
    /// Relay workers: heartbeat, session, owned partitions; and the
    /// partition count. No binds.
    pub(crate) relay_workers: String,
    /// Consumers known from their stats, parked messages and open
    /// letters, with their counts.
    pub(crate) consumers: String,
    /// Events by status with filters. Binds: status, event_type,
    /// aggregate_type, aggregate_id, since, until, error text, after seq,
    /// limit.
    pub(crate) events: String,
    /// One event. Binds: id.
    pub(crate) event: String,
    /// Letters with filters. Binds: consumer, kind, event_type,
    /// aggregate_type, aggregate_id, since, until, reason text, after id,
    /// limit, include resolved.
    pub(crate) letters: String,
    /// One letter. Binds: consumer, id.
    pub(crate) letter: String,
    /// Audit rows, newest first. Binds: before id, limit.
    pub(crate) audit: String,
    /// Failed events back to pending, attempts reset. Binds: ids.
    pub(crate) retry_failed: String,
    /// Failed events to skipped; their blocked rows go. Binds: ids, note.
    pub(crate) skip_failed: String,
    /// Published events back to pending. Binds: ids.
    pub(crate) republish: String,
    /// Pending heads of blocked aggregates due now, attempts reset. Binds: ids.
    pub(crate) retry_blocked: String,
    /// The status of events by id. Binds: ids.
    pub(crate) statuses: String,
    /// Open letters of a consumer marked for replay. Binds: consumer, ids,
    /// audit id.
    pub(crate) request_replay: String,
    /// Open letters of a consumer closed as discarded. Binds: consumer,
    /// ids, resolution.
    pub(crate) discard: String,
    /// Letters of a consumer that exist, open or not. Binds: consumer, ids.
    pub(crate) letter_states: String,
    /// One audit row. Binds: id.
    pub(crate) audit_entry: String,
    /// One aggregate's position at a consumer. Binds: consumer,
    /// aggregate type, aggregate id.
    pub(crate) position: String,
    /// Moves a position one version on, only from the version before.
    /// Binds: consumer, aggregate type, aggregate id, version passed.
    pub(crate) pass_version: String,
    /// Counts published rows older than an age and idempotency keys
    /// older than another. Binds: seconds, seconds.
    pub(crate) count_old_published: String,
}

impl OpsSql {
    pub(crate) fn new(schema: &SchemaName) -> OpsSql {
        let s = schema.quoted();
        let event_columns = "id, seq, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version,
                             payload::text AS payload, traceparent, created_at, status, published_at, attempt_count,
                             next_attempt_at, last_error, failed_at";
        let letter_columns = "id, consumer_name, kind, event_id, event_type, schema_version, aggregate_type,
                              aggregate_id, aggregate_version, headers::text AS headers, payload, reason, attempts,
                              created_at, resolved_at, resolution, replays, last_replay_error, replay_requested_at";
        OpsSql {
            // Each arm reads one status through its partial index, never
            // the published history.
            per_event_type: format!(
                "SELECT event_type,
                        count(*) FILTER (WHERE status = 'pending' AND attempt_count = 0) AS pending,
                        count(*) FILTER (WHERE status = 'pending' AND attempt_count > 0) AS retrying,
                        count(*) FILTER (WHERE status = 'failed') AS failed,
                        count(*) FILTER (WHERE status = 'skipped') AS skipped,
                        min(created_at) FILTER (WHERE status = 'pending') AS oldest_pending
                 FROM (
                    SELECT event_type, status, attempt_count, created_at FROM {s}.outbox_events WHERE status = 'pending'
                    UNION ALL
                    SELECT event_type, status, attempt_count, created_at FROM {s}.outbox_events WHERE status = 'failed'
                    UNION ALL
                    SELECT event_type, status, attempt_count, created_at FROM {s}.outbox_events WHERE status = 'skipped'
                 ) unpublished
                 GROUP BY event_type ORDER BY event_type"
            ),
            tuples: "SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0),
                            coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)"
                .to_owned(),
            relay_workers: format!(
                "SELECT relay_id, heartbeat_at, waiting, backend_pid,
                        backend_pid IS NOT NULL AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = backend_pid) AS connected,
                        partitions::int4[] AS partitions,
                        (SELECT partitions FROM {s}.outbox_partitioning) AS partition_count
                 FROM {s}.outbox_relay_listeners ORDER BY relay_id"
            ),
            consumers: format!(
                "WITH names AS (
                    SELECT consumer_name FROM {s}.outbox_consumer_stats
                    UNION SELECT consumer_name FROM {s}.outbox_consumer_parked
                    UNION SELECT consumer_name FROM {s}.outbox_dead_letters WHERE resolved_at IS NULL
                 )
                 SELECT n.consumer_name,
                        (SELECT count(*) FROM {s}.outbox_consumer_parked k WHERE k.consumer_name = n.consumer_name) AS parked,
                        (SELECT min(parked_at) FROM {s}.outbox_consumer_parked k WHERE k.consumer_name = n.consumer_name) AS oldest_parked,
                        (SELECT count(*) FROM {s}.outbox_dead_letters d
                         WHERE d.consumer_name = n.consumer_name AND d.resolved_at IS NULL AND d.kind = 'quarantined') AS quarantined,
                        (SELECT count(*) FROM {s}.outbox_dead_letters d
                         WHERE d.consumer_name = n.consumer_name AND d.resolved_at IS NULL AND d.kind = 'dead_lettered') AS dead_lettered,
                        (SELECT count(*) FROM {s}.outbox_dead_letters d
                         WHERE d.consumer_name = n.consumer_name AND d.resolved_at IS NULL AND d.replay_requested_at IS NOT NULL) AS replays_requested,
                        t.applied, t.duplicates, t.last_applied_at, t.lag_seconds, t.updated_at AS stats_at
                 FROM names n LEFT JOIN {s}.outbox_consumer_stats t ON t.consumer_name = n.consumer_name
                 ORDER BY n.consumer_name"
            ),
            events: format!(
                "SELECT {event_columns} FROM {s}.outbox_events
                 WHERE status = $1
                   AND ($2::text IS NULL OR event_type = $2)
                   AND ($3::text IS NULL OR aggregate_type = $3)
                   AND ($4::text IS NULL OR aggregate_id = $4)
                   AND ($5::timestamptz IS NULL OR coalesce(failed_at, created_at) >= $5)
                   AND ($6::timestamptz IS NULL OR coalesce(failed_at, created_at) < $6)
                   AND ($7::text IS NULL OR strpos(lower(coalesce(last_error, '')), lower($7)) > 0)
                   AND ($8::bigint IS NULL OR seq > $8)
                 ORDER BY seq LIMIT $9"
            ),
            event: format!("SELECT {event_columns} FROM {s}.outbox_events WHERE id = $1"),
            letters: format!(
                "SELECT {letter_columns} FROM {s}.outbox_dead_letters
                 WHERE consumer_name = $1 AND kind = $2
                   AND ($3::text IS NULL OR event_type = $3)
                   AND ($4::text IS NULL OR aggregate_type = $4)
                   AND ($5::text IS NULL OR aggregate_id = $5)
                   AND ($6::timestamptz IS NULL OR created_at >= $6)
                   AND ($7::timestamptz IS NULL OR created_at < $7)
                   AND ($8::text IS NULL OR strpos(lower(reason), lower($8)) > 0)
                   AND ($9::bigint IS NULL OR id > $9)
                   AND ($11 OR resolved_at IS NULL)
                 ORDER BY id LIMIT $10"
            ),
            letter: format!(
                "SELECT {letter_columns} FROM {s}.outbox_dead_letters WHERE consumer_name = $1 AND id = $2"
            ),
            audit: format!(
                "SELECT id, at, operator, reason, action, target, ids, outcomes FROM {s}.outbox_audit
                 WHERE ($1::bigint IS NULL OR id < $1) ORDER BY id DESC LIMIT $2"
            ),
            // Back to pending, from the first attempt. A failed event under
            // `Block` is its aggregate's head: the blocked row stays and
            // offers only this event until it is published, so the
            // aggregate goes on in order.
            retry_failed: format!(
                "UPDATE {s}.outbox_events
                 SET status = 'pending', attempt_count = 0, next_attempt_at = now(), failed_at = NULL
                 WHERE id = ANY($1) AND status = 'failed'
                 RETURNING id"
            ),
            skip_failed: format!(
                "WITH skipped AS (
                    UPDATE {s}.outbox_events
                    SET status = 'skipped', last_error = $2 || coalesce(' (last error: ' || last_error || ')', '')
                    WHERE id = ANY($1) AND status = 'failed'
                    RETURNING id
                 ),
                 released AS (
                    DELETE FROM {s}.outbox_blocked_aggregates
                    WHERE head_event_id IN (SELECT id FROM skipped)
                 )
                 SELECT id FROM skipped"
            ),
            republish: format!(
                "UPDATE {s}.outbox_events
                 SET status = 'pending', published_at = NULL, attempt_count = 0, next_attempt_at = now(),
                     last_error = NULL
                 WHERE id = ANY($1) AND status = 'published'
                 RETURNING id"
            ),
            retry_blocked: format!(
                "UPDATE {s}.outbox_events e
                 SET next_attempt_at = now(), attempt_count = 0
                 FROM {s}.outbox_blocked_aggregates b
                 WHERE e.id = ANY($1) AND e.status = 'pending' AND b.head_event_id = e.id
                 RETURNING e.id"
            ),
            statuses: format!("SELECT id, status FROM {s}.outbox_events WHERE id = ANY($1)"),
            request_replay: format!(
                "UPDATE {s}.outbox_dead_letters
                 SET replay_requested_at = now(), replay_audit_id = $3
                 WHERE consumer_name = $1 AND id = ANY($2) AND kind = $4
                   AND resolved_at IS NULL AND replay_requested_at IS NULL
                 RETURNING id"
            ),
            discard: format!(
                "UPDATE {s}.outbox_dead_letters
                 SET resolved_at = now(), resolution = $3, replay_requested_at = NULL
                 WHERE consumer_name = $1 AND id = ANY($2) AND kind = $4 AND resolved_at IS NULL
                 RETURNING id"
            ),
            audit_entry: format!(
                "SELECT id, at, operator, reason, action, target, ids, outcomes FROM {s}.outbox_audit WHERE id = $1"
            ),
            position: format!(
                "SELECT version, pinned, updated_at FROM {s}.outbox_consumer_positions
                 WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3"
            ),
            pass_version: format!(
                "UPDATE {s}.outbox_consumer_positions
                 SET version = $4, pinned = true, updated_at = now()
                 WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
                   AND version = $4 - 1
                 RETURNING version"
            ),
            letter_states: format!(
                "SELECT id, kind, resolution, replay_requested_at IS NOT NULL AS requested
                 FROM {s}.outbox_dead_letters WHERE consumer_name = $1 AND id = ANY($2)"
            ),
            count_old_published: format!(
                "SELECT (SELECT count(*) FROM {s}.outbox_events
                         WHERE status = 'published' AND published_at < now() - $1 * interval '1 second'),
                        (SELECT count(*) FROM {s}.outbox_idempotency_keys
                         WHERE created_at < now() - $2 * interval '1 second')"
            ),
        }
    }
}
