-- Second migration: exact payload text, replayable quarantine and dead
-- letters, a defined start for strict consumers, backoff for parked
-- retries, an audit trail for operator actions, and autovacuum settings
-- that keep the claim's plan right while a backlog builds. Runs with
-- search_path set to the configured schema.

-- The payload is stored as the exact JSON text the producer serialized
-- (json, not jsonb): jsonb reorders keys and re-renders numbers, and
-- rendering jsonb back to text costs the relay more than the whole claim
-- per row (measured: reading 400k payloads 0.5 s as json, 1.7 s as jsonb;
-- writing 200k 1.0 s as json, 2.4 s as jsonb). Existing rows keep the
-- text jsonb gave them.
ALTER TABLE outbox_events ALTER COLUMN payload TYPE json USING payload::json;

-- The claim's plan must not depend on statistics gathered before a
-- backlog arrived (a broker outage or a bulk import): analyze and vacuum
-- after a fixed number of changed rows, not a fraction of the table.
ALTER TABLE outbox_events SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 10000
);

-- Parked envelopes keep their exact text too, and a parked message whose
-- handler failed waits for its backoff before the next start.
ALTER TABLE outbox_consumer_parked ALTER COLUMN envelope TYPE json USING envelope::json;
ALTER TABLE outbox_consumer_parked ADD COLUMN retry_at timestamptz;

-- Strict ordering: a position row created only to lock an aggregate that
-- has never been started is not pinned; the first handler start (or the
-- park timeout, see DESIGN.md) pins the aggregate's starting point.
ALTER TABLE outbox_consumer_positions ADD COLUMN pinned boolean NOT NULL DEFAULT true;

-- Quarantine and dead letters no longer hold an inbox row: the event was
-- not applied, so a replay after a fix must be able to apply it once.
-- Rows written before this migration did hold one; release it.
DELETE FROM outbox_processed_events p
USING outbox_dead_letters d
WHERE d.resolved_at IS NULL
  AND d.event_id IS NOT NULL
  AND p.consumer_name = d.consumer_name
  AND p.event_id = d.event_id;

-- At most one open letter per (consumer, event): a redelivery of a
-- quarantined message does not write a second row.
UPDATE outbox_dead_letters SET resolved_at = now(), resolution = 'superseded by a newer row (migration 2)'
WHERE id IN (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY consumer_name, event_id ORDER BY id DESC) AS n
        FROM outbox_dead_letters
        WHERE resolved_at IS NULL AND event_id IS NOT NULL
    ) ranked
    WHERE n > 1
);
CREATE UNIQUE INDEX outbox_dead_letters_open_event_key
    ON outbox_dead_letters (consumer_name, event_id)
    WHERE resolved_at IS NULL AND event_id IS NOT NULL;
ALTER TABLE outbox_dead_letters ADD COLUMN replays integer NOT NULL DEFAULT 0;
ALTER TABLE outbox_dead_letters ADD COLUMN last_replay_error text;

-- Audit of every operator action (replay, retry, skip, discard, cleanup):
-- who, when, why, which ids, and what happened to each.
DROP TABLE outbox_replays;
CREATE TABLE outbox_audit (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    operator  text        NOT NULL CHECK (length(trim(operator)) > 0),
    reason    text        NOT NULL CHECK (length(trim(reason)) > 0),
    action    text        NOT NULL,
    target    text        NOT NULL,
    ids       text[]      NOT NULL,
    outcomes  jsonb       NOT NULL DEFAULT '[]'
);
CREATE INDEX outbox_audit_at_idx ON outbox_audit (at);
