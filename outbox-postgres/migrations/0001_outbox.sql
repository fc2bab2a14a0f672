-- The outbox schema. Runs with search_path set to the configured schema, so
-- names are unqualified; every object carries the outbox_ prefix.

-- The outbox: one row per emitted event (the article's columns, plus a
-- status for the failed state and the producer's idempotency key).
CREATE TABLE outbox_events (
    id                uuid        PRIMARY KEY,
    -- Insertion order, from a sequence without cache: writers of one
    -- aggregate are serialized (version counter row, or the business row
    -- carrying the version), so within an aggregate seq follows version and
    -- commit order, whatever the producers' clocks say (UUID v7 ids would
    -- follow the clocks).
    seq               bigint      GENERATED ALWAYS AS IDENTITY (CACHE 1),
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    schema_version    integer     NOT NULL CHECK (schema_version >= 1),
    payload           jsonb       NOT NULL,
    traceparent       text,
    trace_id          text        GENERATED ALWAYS AS (nullif(split_part(traceparent, '-', 2), '')) STORED,
    created_at        timestamptz NOT NULL DEFAULT now(),
    status            text        NOT NULL DEFAULT 'pending'
                                  CHECK (status IN ('pending', 'published', 'failed')),
    published_at      timestamptz,
    attempt_count     integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    last_error        text,
    failed_at         timestamptz
);

-- The claim index: only pending rows, in insertion order. Its size follows
-- the backlog, not the published history.
CREATE INDEX outbox_events_pending_idx ON outbox_events (seq) WHERE status = 'pending';

-- One unpublished event per aggregate version: catches two writers that
-- raced on one aggregate. Partial, so it does not grow with history.
CREATE UNIQUE INDEX outbox_events_unpublished_version_key
    ON outbox_events (aggregate_type, aggregate_id, aggregate_version) WHERE status <> 'published';

-- Failed rows are few and must be listed fast (status, replay).
CREATE INDEX outbox_events_failed_idx ON outbox_events (id) WHERE status = 'failed';

-- Retention walks published rows by age.
CREATE INDEX outbox_events_published_idx ON outbox_events (published_at) WHERE status = 'published';

-- Per-aggregate version counters for events whose contract carries no
-- version: gap-free, assigned in commit order (the row lock serializes
-- writers of one aggregate).
CREATE TABLE outbox_aggregate_versions (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    version        bigint NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- Producer idempotency: a retried command with the same key emits nothing.
CREATE TABLE outbox_idempotency_keys (
    idempotency_key text        PRIMARY KEY,
    event_id        uuid        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- Aggregates whose head event is retrying or failed: their later events wait.
CREATE TABLE outbox_blocked_aggregates (
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    head_event_id  uuid        NOT NULL,
    blocked_since  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- Relays that sleep until woken: emit sends NOTIFY only while one waits, so
-- busy systems do not pay for the commit-time notification lock. Unlogged:
-- a heartbeat never waits for a WAL flush, and after a crash the relays
-- register again.
CREATE UNLOGGED TABLE outbox_relay_listeners (
    relay_id     uuid        PRIMARY KEY,
    waiting      boolean     NOT NULL DEFAULT false,
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- Consumer inbox: one row per (consumer, event) processed.
CREATE TABLE outbox_processed_events (
    consumer_name text        NOT NULL,
    event_id      uuid        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, event_id)
);

-- Handler starts of redelivered messages, committed before the handler
-- runs: a message that kills the process every time is dead-lettered after
-- max_attempts starts, while redeliveries during a database outage (no
-- start possible) do not count. First deliveries write nothing here.
CREATE TABLE outbox_consumer_attempts (
    consumer_name text        NOT NULL,
    event_id      uuid        NOT NULL,
    starts        integer     NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, event_id)
);

-- Consumer positions per aggregate, for the ordering policies.
CREATE TABLE outbox_consumer_positions (
    consumer_name  text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, aggregate_type, aggregate_id)
);

-- Messages that arrived ahead of a gap (strict ordering), kept until the
-- missing version arrives or the wait times out.
CREATE TABLE outbox_consumer_parked (
    consumer_name     text        NOT NULL,
    event_id          uuid        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    envelope          jsonb       NOT NULL,
    parked_at         timestamptz NOT NULL DEFAULT now(),
    attempts          integer     NOT NULL DEFAULT 0,
    last_error        text,
    PRIMARY KEY (consumer_name, event_id)
);
CREATE INDEX outbox_consumer_parked_aggregate_idx
    ON outbox_consumer_parked (consumer_name, aggregate_type, aggregate_id, aggregate_version);

-- Quarantine (cannot be read) and dead letters (could not be handled):
-- the raw message, its headers and the reason, for an operator.
CREATE TABLE outbox_dead_letters (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_name     text        NOT NULL,
    kind              text        NOT NULL CHECK (kind IN ('quarantined', 'dead_lettered')),
    event_id          uuid,
    event_type        text,
    schema_version    integer,
    aggregate_type    text,
    aggregate_id      text,
    aggregate_version bigint,
    headers           jsonb       NOT NULL DEFAULT '{}',
    payload           bytea       NOT NULL,
    reason            text        NOT NULL,
    attempts          integer     NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    resolved_at       timestamptz,
    resolution        text
);
CREATE INDEX outbox_dead_letters_open_idx ON outbox_dead_letters (consumer_name, created_at)
    WHERE resolved_at IS NULL;

-- Audit of replays: who, when, why, which ids.
CREATE TABLE outbox_replays (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    requested_by text        NOT NULL,
    reason       text        NOT NULL CHECK (length(trim(reason)) > 0),
    target       text        NOT NULL,
    event_ids    uuid[]      NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now()
);
