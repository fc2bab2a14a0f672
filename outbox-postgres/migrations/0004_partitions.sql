-- Fourth migration: relay scale-out. Each event belongs to one of a fixed
-- number of partitions derived from its aggregate, and live relay workers
-- divide the partitions among themselves (session advisory locks on each
-- worker's claiming connection, see DESIGN.md "Relay scale-out"). Runs with
-- search_path set to the configured schema.
--
-- The partition count is fixed here (256). Changing it is an offline step:
-- stop every relay, then in one transaction
--   ALTER TABLE outbox_events DROP COLUMN partition;
--   ALTER TABLE outbox_events ADD COLUMN partition smallint GENERATED ALWAYS AS
--     (((hashtextextended(aggregate_type || '/' || aggregate_id, 0) % N) + N) % N)::smallint) STORED;
--   UPDATE outbox_partitioning SET partitions = N;
-- (both rewrite the table), and start the relays again.
CREATE TABLE outbox_partitioning (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    partitions integer NOT NULL CHECK (partitions BETWEEN 1 AND 32767)
);
INSERT INTO outbox_partitioning (partitions) VALUES (256);

-- A stable hash of the aggregate (PostgreSQL's hashtextextended is what
-- hash partitioning uses, so it cannot change between server versions
-- without breaking pg_upgrade). Stored: existing rows are backfilled by the
-- table rewrite this statement does.
ALTER TABLE outbox_events ADD COLUMN partition smallint
    GENERATED ALWAYS AS ((((hashtextextended(aggregate_type || '/' || aggregate_id, 0) % 256) + 256) % 256)::smallint) STORED;

-- Membership: a worker's claiming connection (its backend pid, so a worker
-- whose session ended counts as gone at once) and the partitions it owns.
ALTER TABLE outbox_relay_listeners ADD COLUMN backend_pid integer;
ALTER TABLE outbox_relay_listeners ADD COLUMN partitions smallint[] NOT NULL DEFAULT '{}';
