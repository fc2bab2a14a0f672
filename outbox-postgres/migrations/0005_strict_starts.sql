-- Strict ordering remembers where each aggregate started: the first
-- version applied (or held open for a letter). A version below it arrived
-- after the start was decided and was never applied; it goes to the dead
-- letters with that reason instead of passing as stale. NULL: not started,
-- or started before this migration (then it passes as stale, as before).
ALTER TABLE outbox_consumer_positions ADD COLUMN start_version bigint;

-- The open letters of an aggregate: strict ordering's start takes the
-- lowest version seen, lettered ones included, and the versions waiting
-- behind a letter name it in their reason.
CREATE INDEX outbox_dead_letters_open_aggregate_idx
    ON outbox_dead_letters (consumer_name, aggregate_type, aggregate_id, aggregate_version)
    WHERE resolved_at IS NULL;

-- A strict consumer's message whose handler failed and that is due back
-- (a redelivery after its backoff): its aggregate and version, and when it
-- is due. The versions parked behind it wait for it instead of going to
-- the dead letters after the park timeout while it is still retrying.
ALTER TABLE outbox_consumer_attempts ADD COLUMN aggregate_type text;
ALTER TABLE outbox_consumer_attempts ADD COLUMN aggregate_id text;
ALTER TABLE outbox_consumer_attempts ADD COLUMN aggregate_version bigint;
ALTER TABLE outbox_consumer_attempts ADD COLUMN retry_at timestamptz;
CREATE INDEX outbox_consumer_attempts_aggregate_idx
    ON outbox_consumer_attempts (consumer_name, aggregate_type, aggregate_id, aggregate_version);
