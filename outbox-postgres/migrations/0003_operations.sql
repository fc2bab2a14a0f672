-- Third migration: what operators need. Runs with search_path set to the
-- configured schema.

-- A failed head an operator skipped (with a reason): its aggregate goes on,
-- the event stays for inspection and is never published.
ALTER TABLE outbox_events DROP CONSTRAINT outbox_events_status_check;
ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_status_check
    CHECK (status IN ('pending', 'published', 'failed', 'skipped'));

-- A replay asked for by an operator (the CLI has no handlers): the running
-- consumer picks it up, runs it, and records the outcome in the audit row.
ALTER TABLE outbox_dead_letters ADD COLUMN replay_requested_at timestamptz;
ALTER TABLE outbox_dead_letters ADD COLUMN replay_audit_id bigint;
CREATE INDEX outbox_dead_letters_replay_idx ON outbox_dead_letters (consumer_name, id)
    WHERE replay_requested_at IS NOT NULL AND resolved_at IS NULL;

-- Skipped events, for the operations API's counts (each status has its
-- partial index, so counting never reads the published history).
CREATE INDEX outbox_events_skipped_idx ON outbox_events (seq) WHERE status = 'skipped';

-- Listing failed events by time and filtering letters by kind.
CREATE INDEX outbox_events_failed_at_idx ON outbox_events (failed_at) WHERE status = 'failed';
CREATE INDEX outbox_dead_letters_kind_idx ON outbox_dead_letters (consumer_name, kind, id)
    WHERE resolved_at IS NULL;

-- What each consumer did, flushed by its task every sweep interval (one
-- upsert per interval, summed over its instances): `outbox status` shows
-- applied and duplicate counts and the lag of the last applied event.
CREATE TABLE outbox_consumer_stats (
    consumer_name   text             PRIMARY KEY,
    applied         bigint           NOT NULL DEFAULT 0,
    duplicates      bigint           NOT NULL DEFAULT 0,
    last_applied_at timestamptz,
    lag_seconds     double precision,
    updated_at      timestamptz      NOT NULL DEFAULT now()
);
