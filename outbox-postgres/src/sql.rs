//! The SQL text of every statement, built once per schema. Identifiers come
//! from a validated [`SchemaName`]; every value is a bind parameter.
//!
//! Emit statements do their work in one round trip each: the version
//! counter upsert, the event insert, the idempotency key claim and the
//! guarded NOTIFY are CTEs of a single statement.

use outbox_core::store::SchemaName;

/// Mixed into a schema's lock namespace for the partition ownership locks,
/// so they never collide with the per-aggregate claim locks.
pub(crate) const OWNERSHIP_SALT: i32 = 0x5EED_0F0B;

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
///
/// Within an aggregate, insertion order (`seq`) must follow the version:
/// the relay's claim relies on it. Counter versions follow it by
/// construction (the counter row serializes writers); carried versions
/// are written only when no unpublished event of the aggregate has a
/// higher version (`behind` finds one), and a batch inserts its rows in
/// version order per aggregate.
#[derive(Debug, Clone)]
pub(crate) struct EmitSql {
    /// One event, version from the counter. Binds: id, aggregate_type,
    /// aggregate_id, event_type, schema_version, payload (text), traceparent,
    /// channel. Returns aggregate_version.
    pub(crate) counter: String,
    /// One event with its own version. Binds as `counter` plus
    /// aggregate_version ($9). Returns nothing; no row affected when an
    /// unpublished event of the aggregate has a higher version.
    pub(crate) explicit: String,
    /// As `counter`, claiming an idempotency key ($9) first; no row when
    /// the key exists.
    pub(crate) counter_with_key: String,
    /// As `explicit` (version $9), claiming an idempotency key ($10) first;
    /// no row affected when the key exists or a higher version is
    /// unpublished.
    pub(crate) explicit_with_key: String,
    /// The event id stored under an idempotency key. Binds: key.
    pub(crate) existing_key: String,
    /// The highest unpublished version of an aggregate above a version.
    /// Binds: aggregate_type, aggregate_id, version.
    pub(crate) newer_version: String,
    /// Many events (arrays, in order). Binds: ids, aggregate_types,
    /// aggregate_ids, explicit versions (NULL = counter), event_types,
    /// schema_versions, payloads (text), traceparents, channel.
    /// Returns id, aggregate_version in input order, or, when a carried
    /// version lies below an unpublished one of its aggregate, nothing
    /// written and one row (NULL id, the carried version, the aggregate,
    /// the newer version).
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
        // A carried version goes in only when nothing unpublished of its
        // aggregate is newer (one probe of the unpublished-version index).
        let in_order = |version: &str| {
            format!(
                "NOT EXISTS (
                    SELECT 1 FROM {s}.outbox_events newer
                    WHERE newer.aggregate_type = $2 AND newer.aggregate_id = $3
                      AND newer.status <> 'published' AND newer.aggregate_version > {version})"
            )
        };
        let counter = format!(
            "WITH {version}
            INSERT INTO {s}.outbox_events ({columns})
            SELECT $1, $2, $3, version.version, $4, $5, $6::json, $7 FROM version, {notified_single}
            RETURNING aggregate_version",
            version = counter_cte("")
        );
        let explicit = format!(
            "INSERT INTO {s}.outbox_events ({columns})
            SELECT $1, $2, $3, $9, $4, $5, $6::json, $7 FROM {notified_single}
            WHERE {in_order}",
            in_order = in_order("$9")
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
            SELECT $1, $2, $3, version.version, $4, $5, $6::json, $7 FROM version, {notified_single}
            RETURNING aggregate_version",
            claimed = claimed("$9"),
            version = counter_cte("FROM claimed")
        );
        // The version check comes before the key claim, so an out-of-order
        // emit does not use up its key.
        let claimed_in_order = format!(
            "claimed AS (
                INSERT INTO {s}.outbox_idempotency_keys (idempotency_key, event_id)
                SELECT $10, $1 WHERE {in_order}
                ON CONFLICT (idempotency_key) DO NOTHING
                RETURNING event_id
            )",
            in_order = in_order("$9")
        );
        let explicit_with_key = format!(
            "WITH {claimed_in_order}
            INSERT INTO {s}.outbox_events ({columns})
            SELECT $1, $2, $3, $9, $4, $5, $6::json, $7 FROM claimed, {notified_single}"
        );
        let existing_key =
            format!("SELECT event_id FROM {s}.outbox_idempotency_keys WHERE idempotency_key = $1");
        let newer_version = format!(
            "SELECT max(aggregate_version) FROM {s}.outbox_events
             WHERE aggregate_type = $1 AND aggregate_id = $2 AND status <> 'published'
               AND aggregate_version > $3"
        );
        let notified_batch = notified(&s, "$9");
        let batch = format!(
            "WITH input AS (
                SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[],
                                     $6::integer[], $7::text[], $8::text[])
                    WITH ORDINALITY AS i(id, aggregate_type, aggregate_id, explicit_version, event_type,
                                         schema_version, payload, traceparent, ord)
            ),
            -- Carried versions below an unpublished version of their
            -- aggregate: nothing of the batch is written.
            behind AS (
                SELECT i.aggregate_type, i.aggregate_id, i.explicit_version, max(e.aggregate_version) AS newer
                FROM input i
                JOIN {s}.outbox_events e
                  ON e.aggregate_type = i.aggregate_type AND e.aggregate_id = i.aggregate_id
                 AND e.status <> 'published' AND e.aggregate_version > i.explicit_version
                WHERE i.explicit_version IS NOT NULL
                GROUP BY i.aggregate_type, i.aggregate_id, i.explicit_version
                LIMIT 1
            ),
            counted AS (
                SELECT aggregate_type, aggregate_id, count(*) AS n FROM input
                WHERE explicit_version IS NULL AND NOT EXISTS (SELECT 1 FROM behind)
                GROUP BY aggregate_type, aggregate_id
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
            -- Each aggregate's rows take the input positions of that
            -- aggregate in version order: seq follows the version within an
            -- aggregate whatever order the caller passed, and the caller's
            -- interleaving of aggregates is kept.
            ranked AS (
                SELECT n.*,
                       row_number() OVER (PARTITION BY aggregate_type, aggregate_id ORDER BY ord) AS position_rank,
                       row_number() OVER (PARTITION BY aggregate_type, aggregate_id ORDER BY aggregate_version) AS version_rank
                FROM numbered n
            ),
            inserted AS (
                INSERT INTO {s}.outbox_events ({columns})
                SELECT v.id, v.aggregate_type, v.aggregate_id, v.aggregate_version, v.event_type,
                       v.schema_version, v.payload::json, v.traceparent
                FROM ranked v
                JOIN ranked p ON p.aggregate_type = v.aggregate_type AND p.aggregate_id = v.aggregate_id
                             AND p.position_rank = v.version_rank,
                     {notified_batch}
                WHERE NOT EXISTS (SELECT 1 FROM behind)
                ORDER BY p.ord
                RETURNING id, aggregate_version
            )
            SELECT inserted.id, inserted.aggregate_version, NULL::text, NULL::text, NULL::bigint, input.ord
            FROM inserted JOIN input USING (id)
            UNION ALL
            SELECT NULL::uuid, explicit_version, aggregate_type, aggregate_id, newer, 0 FROM behind
            ORDER BY 6"
        );
        EmitSql {
            counter,
            explicit,
            counter_with_key,
            explicit_with_key,
            existing_key,
            newer_version,
            batch,
        }
    }
}

/// Relay statements.
#[derive(Debug, Clone)]
pub(crate) struct RelaySql {
    /// Claims due events in insertion order, for each aggregate only a
    /// prefix starting at its oldest pending version, skipping aggregates
    /// that another claim holds, the later events of blocked aggregates,
    /// and the partitions a relay worker owns; locked until the claim
    /// transaction ends, and marked published in that transaction. For
    /// [`RelayStore::claim`](outbox_core::relay::RelayStore::claim) callers
    /// outside a worker's session. Binds: lock namespace (int4), limit
    /// (int8), whether failed heads are skipped (bool).
    pub(crate) claim_shared: String,
    /// As `claim_shared` without the per-aggregate advisory locks, when no
    /// other worker is live.
    pub(crate) claim_alone: String,
    /// `claim_shared` without the partition locks, for `explain_claim`.
    pub(crate) explain_shared: String,
    /// A worker's first claim after its set of partitions grew, over
    /// every partition (it owns them all): skips locked rows and checks
    /// each aggregate's head unless nothing was skipped. Binds: owned
    /// partitions (bytea bitmap, unused here), limit, whether failed heads
    /// are skipped.
    pub(crate) claim_checked_all: String,
    /// As `claim_checked_all`, only from the owned partitions ($1).
    pub(crate) claim_checked_owned: String,
    /// A worker's claim while its partitions are unchanged since a
    /// checked claim: nobody else claims from them, so it takes the first
    /// pending rows in `seq` order without the head check. It never passes
    /// over a locked row: one locked elsewhere fails it at once (`NOWAIT`,
    /// SQLSTATE 55P03) and the batch takes the checked claim. Binds as
    /// `claim_checked_all`.
    pub(crate) claim_steady_all: String,
    /// As `claim_steady_all`, only from the owned partitions ($1).
    pub(crate) claim_steady_owned: String,
    /// Refreshes a worker's membership row (heartbeat, backend pid, owned
    /// partitions) and returns the live workers' ids in order, itself
    /// included: recent heartbeat and a session that still exists. Binds:
    /// worker id, owned partitions, lease (seconds).
    pub(crate) membership: String,
    /// Takes the ownership locks of partitions and gives up others, on the
    /// worker's claiming connection. Binds: lock namespace, partitions to
    /// give up, partitions to take; returns those taken, the count given
    /// up, and, when it took any, the statement's transaction id (the
    /// fencing token; no transaction id is used up otherwise).
    pub(crate) rebalance: String,
    /// The partition count fixed at migration. No binds.
    pub(crate) partitions: String,
    /// Sets back what the claim marked published but was not: failed
    /// events (retry or failed state, blocking their aggregate) and events
    /// not attempted. Binds: failed ids, their aggregate types, aggregate
    /// ids, errors, retry delays (ms), give-up flags, attempts before the
    /// claim; unattempted ids; whether a failed head stops blocking (bool).
    pub(crate) complete: String,
    /// Upserts a worker's heartbeat and waiting flag and counts the other
    /// live workers. Binds: worker id, waiting.
    pub(crate) heartbeat: String,
    /// Removes a relay's listener row. Binds: relay id.
    pub(crate) deregister: String,
    /// Counts relay workers with a recent heartbeat. No binds.
    pub(crate) live_workers: String,
    /// Backlog figures. Binds: the outbox table's regclass text, whether
    /// failed heads are skipped.
    pub(crate) stats: String,
    /// Lists blocked aggregates (whose head still blocks). Binds: limit,
    /// whether failed heads are skipped.
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
        let claim = |lock: &str, scope: &str, kind: ClaimKind| {
            let (row_lock, gap_free, fast_path) = match kind {
                ClaimKind::Checked => (
                    "FOR UPDATE OF e SKIP LOCKED",
                    gap_free(&s, scope),
                    "(SELECT complete FROM gap_free)\n                        AND ",
                ),
                ClaimKind::Steady => ("FOR UPDATE OF e NOWAIT", String::new(), ""),
            };
            format!(
            "WITH blocking AS MATERIALIZED (
                -- Blocked aggregates whose head still blocks: retrying, or
                -- failed unless failed heads are skipped ($3). A head fixed
                -- by hand or replayed no longer blocks.
                SELECT b.aggregate_type, b.aggregate_id, b.head_event_id,
                       h.aggregate_version AS head_version, h.next_attempt_at <= now() AS head_due
                FROM {s}.outbox_blocked_aggregates b
                JOIN {s}.outbox_events h ON h.id = b.head_event_id
                WHERE h.status = 'pending' OR (h.status = 'failed' AND NOT $3)
            ),
            offered AS MATERIALIZED (
                -- What a blocked aggregate offers: its head once its retry
                -- is due, and any pending version below the head (one
                -- published again, or a failed head retried under Skip,
                -- while a later version retries): those go first, in
                -- version order, and never wait for the head's backoff.
                SELECT head_event_id AS id FROM blocking WHERE head_due
                UNION ALL
                SELECT p.id FROM blocking k
                JOIN {s}.outbox_events p
                  ON p.aggregate_type = k.aggregate_type AND p.aggregate_id = k.aggregate_id
                 AND p.status <> 'published' AND p.status = 'pending'
                 AND p.aggregate_version < k.head_version
            ),
            candidates AS MATERIALIZED (
                SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id, e.aggregate_version
                FROM {s}.outbox_events e
                WHERE e.status = 'pending'
                  -- A blocked aggregate offers only what `offered` names
                  -- (hashed once). Any other pending row is offered
                  -- whatever its next_attempt_at: only a retrying head has
                  -- one ahead, and a fresh row's is its transaction's
                  -- start, which may come after this claim's own (claims
                  -- run in a transaction opened ahead). A due test there
                  -- would pass over version k from a transaction that
                  -- began later and offer k+1 from one that began earlier
                  -- but committed after it.
                  AND (e.id IN (SELECT id FROM offered)
                       OR (e.aggregate_type, e.aggregate_id) NOT IN (
                           SELECT aggregate_type, aggregate_id FROM blocking))
{lock}
                ORDER BY e.seq
                LIMIT $2
                {row_lock}
            ),
{gap_free}            heads AS (
                -- A checked claim skips rows locked elsewhere, and within
                -- one scan a row refused for version k can be free for
                -- version k+1 a moment later (its holder committed in
                -- between). So an aggregate's candidates go only if nothing
                -- unpublished precedes them (one index descent) and no
                -- unpublished version lies between them (free when their
                -- versions are consecutive). A steady claim passes over no
                -- pending row but a blocked aggregate's later ones: only
                -- non-consecutive versions take the check.
                SELECT array_agg(c.id) AS ids
                FROM candidates c
                GROUP BY c.aggregate_type, c.aggregate_id
                HAVING ({fast_path}max(c.aggregate_version) - min(c.aggregate_version) + 1 = count(*))
                    OR (NOT EXISTS (
                        SELECT 1 FROM {s}.outbox_events o
                        WHERE o.aggregate_type = c.aggregate_type AND o.aggregate_id = c.aggregate_id
                          AND o.status = 'pending'
                          AND o.aggregate_version < min(c.aggregate_version))
                   AND CASE WHEN max(c.aggregate_version) - min(c.aggregate_version) + 1 = count(*) THEN true
                       ELSE count(*) = (
                           SELECT count(*) FROM {s}.outbox_events o
                           WHERE o.aggregate_type = c.aggregate_type AND o.aggregate_id = c.aggregate_id
                             AND o.status = 'pending'
                             AND o.aggregate_version BETWEEN min(c.aggregate_version) AND max(c.aggregate_version))
                       END)
            ),
            unblocked AS (
                -- Claimed heads, and rows whose head no longer blocks (locked
                -- rows are left to whoever holds them).
                DELETE FROM {s}.outbox_blocked_aggregates
                WHERE head_event_id IN (SELECT unnest(ids) FROM heads)
                   OR (aggregate_type, aggregate_id) IN (
                       SELECT b.aggregate_type, b.aggregate_id FROM {s}.outbox_blocked_aggregates b
                       WHERE NOT EXISTS (
                           SELECT 1 FROM blocking k
                           WHERE k.aggregate_type = b.aggregate_type AND k.aggregate_id = b.aggregate_id)
                       FOR UPDATE SKIP LOCKED)
            )
            -- Marked published right away, inside the claim transaction that
            -- stays open while the batch is published: when every ack comes
            -- back the relay only commits. Failed and unattempted events are
            -- set back before the commit; a crash rolls everything back.
            UPDATE {s}.outbox_events e
            SET status = 'published', published_at = now(), attempt_count = e.attempt_count + 1,
                last_error = NULL
            WHERE e.id IN (SELECT unnest(ids) FROM heads)
            RETURNING e.id, e.aggregate_type, e.aggregate_id, e.aggregate_version, e.event_type,
                      e.schema_version, e.payload::text AS payload, e.traceparent, e.created_at,
                      e.attempt_count - 1 AS attempt_count"
        )
        };
        // Outside a worker's session (`RelayStore::claim`): only from
        // partitions no worker owns (a shared transaction lock on each
        // candidate's partition fails while a worker holds it, and keeps
        // workers from taking it until this claim ends), and with other
        // live claimers only the aggregates no other claim holds
        // (transaction advisory locks). Order never depends on these
        // locks: the head check guarantees it.
        let yield_to_owners = format!(
            "                  AND pg_try_advisory_xact_lock_shared($1 # {OWNERSHIP_SALT}, e.partition::integer)"
        );
        let aggregate_lock = "                  AND pg_try_advisory_xact_lock($1, hashtext(e.aggregate_type || '/' || e.aggregate_id))";
        let claim_shared = claim(
            &format!("{yield_to_owners}\n{aggregate_lock}"),
            "",
            ClaimKind::Checked,
        );
        let claim_alone = claim(&yield_to_owners, "", ClaimKind::Checked);
        // What `explain_claim` shows for several live workers: the shared
        // claim without the partition locks, which would make it read past
        // every row of an owned partition and claim nothing while workers
        // own them all (explaining rolls back, so it never keeps a row).
        let explain_shared = claim(aggregate_lock, "", ClaimKind::Checked);
        // A worker's session: only the partitions it owns (all of them: no
        // filter), and the fast path's count only over them. Nobody else
        // claims from them (the ownership lock lives on this connection),
        // so no per-row lock. The owned partitions come as a bitmap (bit p of the bytea set for
        // partition p): one bit test per row read, where `= ANY(array)` of a
        // bound array compares with each element in turn (the claim reads
        // past the other workers' rows in seq order, about three of four
        // with four workers; measured: half the time per row passed over).
        let every_partition = "                  AND $1::bytea IS NOT NULL";
        let owned = "                  AND get_bit($1::bytea, e.partition) = 1";
        let owned_scope = " AND get_bit($1::bytea, o.partition) = 1";
        let claim_checked_all = claim(every_partition, "", ClaimKind::Checked);
        let claim_checked_owned = claim(owned, owned_scope, ClaimKind::Checked);
        let claim_steady_all = claim(every_partition, "", ClaimKind::Steady);
        let claim_steady_owned = claim(owned, "", ClaimKind::Steady);
        let complete = format!(
            "WITH failures AS (
                SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bigint[],
                                     $6::boolean[], $7::integer[])
                    AS f(id, aggregate_type, aggregate_id, error, delay_ms, give_up, previous_attempts)
            ),
            retried AS (
                UPDATE {s}.outbox_events e SET
                    status = CASE WHEN f.give_up THEN 'failed' ELSE 'pending' END,
                    published_at = NULL,
                    attempt_count = f.previous_attempts + 1,
                    last_error = f.error,
                    next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
                    failed_at = CASE WHEN f.give_up THEN now() END
                FROM failures f WHERE e.id = f.id
                RETURNING e.id, e.aggregate_type, e.aggregate_id, f.give_up
            ),
            reverted AS (
                UPDATE {s}.outbox_events
                SET status = 'pending', published_at = NULL, attempt_count = attempt_count - 1
                WHERE id = ANY($8)
                RETURNING 1
            ),
            blocked AS (
                INSERT INTO {s}.outbox_blocked_aggregates (aggregate_type, aggregate_id, head_event_id)
                SELECT aggregate_type, aggregate_id, id FROM retried WHERE NOT (give_up AND $9)
                ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET head_event_id = EXCLUDED.head_event_id
                RETURNING 1
            ),
            skipped AS (
                DELETE FROM {s}.outbox_blocked_aggregates b USING retried r
                WHERE r.give_up AND $9
                  AND b.aggregate_type = r.aggregate_type AND b.aggregate_id = r.aggregate_id
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM retried WHERE give_up) AS failed,
                   (SELECT count(*) FROM reverted) AS reverted,
                   (SELECT count(*) FROM blocked) AS blocked,
                   (SELECT count(*) FROM skipped) AS unblocked"
        );
        let heartbeat = format!(
            "WITH me AS (
                INSERT INTO {s}.outbox_relay_listeners (relay_id, waiting, heartbeat_at) VALUES ($1, $2, now())
                ON CONFLICT (relay_id) DO UPDATE SET waiting = EXCLUDED.waiting, heartbeat_at = now()
            )
            SELECT count(*) FROM {s}.outbox_relay_listeners
            WHERE relay_id <> $1 AND heartbeat_at > now() - interval '30 seconds'"
        );
        let deregister = format!("DELETE FROM {s}.outbox_relay_listeners WHERE relay_id = $1");
        let live_workers = format!(
            "SELECT count(*) FROM {s}.outbox_relay_listeners WHERE heartbeat_at > now() - interval '30 seconds'"
        );
        // One pass over the pending and failed rows, each status through
        // its partial index (never the published history), grouped by
        // event type; the totals are summed from it.
        let stats = format!(
            "SELECT
                (SELECT coalesce(json_agg(t ORDER BY t.event_type), '[]')::text FROM (
                    SELECT event_type,
                           count(*) FILTER (WHERE status = 'pending') AS pending,
                           count(*) FILTER (WHERE status = 'failed') AS failed,
                           min(created_at) FILTER (WHERE status = 'pending') AS oldest_pending_at
                    FROM (SELECT event_type, status, created_at FROM {s}.outbox_events WHERE status = 'pending'
                          UNION ALL
                          SELECT event_type, status, created_at FROM {s}.outbox_events WHERE status = 'failed') u
                    GROUP BY event_type) t) AS event_types,
                (SELECT count(*) FROM {s}.outbox_blocked_aggregates b
                 JOIN {s}.outbox_events h ON h.id = b.head_event_id
                 WHERE h.status = 'pending' OR (h.status = 'failed' AND NOT $2)) AS blocked,
                coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0) AS dead,
                coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0) AS live"
        );
        let blocked = format!(
            "SELECT b.aggregate_type, b.aggregate_id, b.head_event_id, coalesce(e.status, 'missing'),
                    e.last_error, b.blocked_since
             FROM {s}.outbox_blocked_aggregates b
             JOIN {s}.outbox_events e ON e.id = b.head_event_id
             WHERE e.status = 'pending' OR (e.status = 'failed' AND NOT $2)
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
        let membership = format!(
            "WITH me AS (
                INSERT INTO {s}.outbox_relay_listeners AS l (relay_id, heartbeat_at, backend_pid, partitions)
                VALUES ($1, now(), pg_backend_pid(), $2)
                ON CONFLICT (relay_id) DO UPDATE
                SET heartbeat_at = now(), backend_pid = EXCLUDED.backend_pid, partitions = EXCLUDED.partitions
            )
            SELECT array_agg(id ORDER BY id) FROM (
                SELECT relay_id AS id FROM {s}.outbox_relay_listeners l
                WHERE l.relay_id <> $1
                  AND l.heartbeat_at > now() - make_interval(secs => $3)
                  AND (l.backend_pid IS NULL
                       OR EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.backend_pid))
                UNION ALL SELECT $1
            ) AS live"
        );
        // The transaction id is the fencing token of what it took: ids are
        // handed out in increasing order, and a partition is free only
        // after its previous owner let go.
        let rebalance = "WITH taken AS (
                SELECT ARRAY(SELECT p FROM unnest($3::smallint[]) AS p
                             WHERE pg_try_advisory_lock($1, p::integer))::smallint[] AS partitions
            ),
            given_up AS (
                SELECT count(*) AS n FROM unnest($2::smallint[]) AS p
                WHERE pg_advisory_unlock($1, p::integer)
            )
            SELECT taken.partitions, given_up.n,
                   CASE WHEN cardinality(taken.partitions) > 0
                        THEN pg_current_xact_id()::text::bigint END
            FROM taken, given_up"
            .to_owned();
        let partitions = format!("SELECT partitions FROM {s}.outbox_partitioning");
        RelaySql {
            claim_shared,
            claim_alone,
            explain_shared,
            claim_checked_all,
            claim_checked_owned,
            claim_steady_all,
            claim_steady_owned,
            membership,
            rebalance,
            partitions,
            complete,
            heartbeat,
            deregister,
            live_workers,
            stats,
            blocked,
            purge_published,
            purge_keys,
        }
    }
}

/// How a claim makes sure each aggregate's claimed events start at its
/// oldest pending version.
#[derive(Debug, Clone, Copy)]
enum ClaimKind {
    /// Locked rows are skipped, so a skipped row may precede a candidate of
    /// its aggregate: each aggregate's head is checked, unless the
    /// candidates are every pending row up to the last one (the fast path).
    Checked,
    /// Nobody else claims from the scanned rows (the worker owns their
    /// partitions and its set did not change since a checked claim), a
    /// row locked elsewhere fails the claim instead of being skipped
    /// (`NOWAIT`), and only blocked heads are held to their retry time: the
    /// candidates are the first pending rows in `seq` order (blocked
    /// aggregates' later rows left out) and each aggregate's begin at its
    /// oldest pending version; only the guard for non-consecutive versions
    /// remains.
    Steady,
}

/// The fast path's test for a checked claim, as a CTE.
fn gap_free(s: &str, scope: &str) -> String {
    format!(
        "            -- Fast path: when the candidates are every pending row up to the
            -- last one taken (nothing was skipped: no lock held elsewhere, no
            -- retrying or blocked row in between), each candidate aggregate's
            -- pending rows below it are candidates too, and the per-aggregate
            -- check below is not needed. One short scan of the pending index
            -- instead of one index descent per aggregate. It relies on seq
            -- following the version within an aggregate, which emit keeps
            -- (carried versions below an unpublished one are refused, a batch
            -- is written in version order); as a guard, an aggregate whose
            -- candidate versions are not consecutive takes the full check.
            gap_free AS (
                SELECT count(*) = (SELECT count(*) FROM candidates) AS complete
                FROM {s}.outbox_events o
                WHERE o.status = 'pending' AND o.seq <= (SELECT max(seq) FROM candidates){scope}
            ),\n"
    )
}
