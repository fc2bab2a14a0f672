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
