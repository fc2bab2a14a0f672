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
