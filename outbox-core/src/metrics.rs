//! Metric names (Prometheus style, through the `metrics` facade) and the
//! helpers that record them. The alert signal is the age of the oldest
//! pending event, not the queue depth.

use std::collections::BTreeSet;

use crate::relay::store::OutboxStats;

/// Events waiting to be published (gauge, label `schema`).
pub const PENDING_EVENTS: &str = "outbox_pending_events";
/// Age of the oldest pending event in seconds (gauge, label `schema`).
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// Events in the failed state (gauge, label `schema`).
pub const FAILED_EVENTS: &str = "outbox_failed_events";
/// Aggregates blocked behind a retrying or failed head (gauge, label `schema`).
pub const BLOCKED_AGGREGATES: &str = "outbox_blocked_aggregates";
/// Dead tuples in the outbox table (gauge, label `schema`).
pub const DEAD_TUPLES: &str = "outbox_table_dead_tuples";
/// Live tuples in the outbox table (gauge, label `schema`).
pub const LIVE_TUPLES: &str = "outbox_table_live_tuples";
/// Publish attempts (counter, labels `schema`, `transport`).
pub const PUBLISH_ATTEMPTS: &str = "outbox_relay_publish_attempts_total";
/// Events acknowledged by the broker (counter, labels `schema`, `transport`).
pub const PUBLISHED: &str = "outbox_relay_published_total";
/// Failed publish attempts (counter, labels `schema`, `transport`, `kind` = retryable|permanent).
pub const PUBLISH_FAILURES: &str = "outbox_relay_publish_failures_total";
/// Events moved to the failed state (counter, label `schema`).
pub const MOVED_TO_FAILED: &str = "outbox_relay_failed_total";
/// Time from claim to recorded outcome of one batch (histogram, label `schema`).
pub const BATCH_DURATION: &str = "outbox_relay_batch_duration_seconds";
/// Events per claimed batch (histogram, label `schema`).
pub const BATCH_EVENTS: &str = "outbox_relay_batch_events";
/// Whether the relay's transport can publish: 1 up, 0 down (gauge, labels
/// `schema`, `transport`). While it is 0 the relay claims nothing.
pub const TRANSPORT_UP: &str = "outbox_relay_transport_up";
/// Claims or completions that failed on the database (counter, label `schema`).
pub const STORE_ERRORS: &str = "outbox_relay_store_errors_total";
/// Partitions a relay worker owns now (gauge, labels `schema`, `worker`).
/// Summed over the workers it is the partition count once ownership has
/// settled; a worker with none is waiting for its share.
pub const RELAY_PARTITIONS_OWNED: &str = "outbox_relay_partitions_owned";
/// Rebalances: a worker took or gave up partitions because the live
/// workers changed (counter, label `schema`).
pub const RELAY_REBALANCES: &str = "outbox_relay_rebalances_total";
/// Published rows deleted by retention (counter, label `schema`).
pub const RETENTION_DELETED: &str = "outbox_retention_deleted_total";
/// Idempotency keys deleted by retention (counter, label `schema`).
pub const RETENTION_KEYS_DELETED: &str = "outbox_retention_keys_deleted_total";

/// Events of one type waiting to be published (gauge, labels `schema`,
/// `event_type`).
pub const EVENT_TYPE_PENDING: &str = "outbox_event_type_pending_events";
/// Age of the oldest pending event of one type in seconds (gauge, labels
/// `schema`, `event_type`): the per-type alert signal.
pub const EVENT_TYPE_OLDEST_PENDING_AGE: &str = "outbox_event_type_oldest_pending_age_seconds";
/// Events of one type in the failed state (gauge, labels `schema`,
/// `event_type`).
pub const EVENT_TYPE_FAILED: &str = "outbox_event_type_failed_events";

/// The backlog gauges of one schema, as the relay refreshes them every
/// `stats_interval`. An event type that had figures and has none any more
/// is set to zero, so its series ends at zero rather than at its last
/// value.
#[derive(Debug)]
pub struct BacklogGauges {
    schema: String,
    reported: BTreeSet<String>,
}

impl BacklogGauges {
    /// Gauges labelled with `schema`.
    pub fn new(schema: &str) -> BacklogGauges {
        BacklogGauges {
            schema: schema.to_owned(),
            reported: BTreeSet::new(),
        }
    }

    /// Sets every backlog gauge from `stats`.
    pub fn record(&mut self, stats: &OutboxStats) {
        let schema = self.schema.clone();
        metrics::gauge!(PENDING_EVENTS, "schema" => schema.clone()).set(stats.pending as f64);
        metrics::gauge!(OLDEST_PENDING_AGE, "schema" => schema.clone())
            .set(stats.oldest_pending_age().as_secs_f64());
        metrics::gauge!(FAILED_EVENTS, "schema" => schema.clone()).set(stats.failed as f64);
        metrics::gauge!(BLOCKED_AGGREGATES, "schema" => schema.clone())
            .set(stats.blocked_aggregates as f64);
        metrics::gauge!(DEAD_TUPLES, "schema" => schema.clone()).set(stats.dead_tuples as f64);
        metrics::gauge!(LIVE_TUPLES, "schema" => schema.clone()).set(stats.live_tuples as f64);
        let mut now = BTreeSet::new();
        for t in &stats.event_types {
            self.event_type(
                &t.event_type,
                t.pending,
                t.failed,
                t.oldest_pending_age().as_secs_f64(),
            );
            now.insert(t.event_type.clone());
        }
        for gone in self.reported.difference(&now) {
            self.event_type(gone, 0, 0, 0.0);
        }
        self.reported = now;
    }

    fn event_type(&self, event_type: &str, pending: i64, failed: i64, oldest_age: f64) {
        let labels = [
            ("schema", self.schema.clone()),
            ("event_type", event_type.to_owned()),
        ];
        metrics::gauge!(EVENT_TYPE_PENDING, &labels).set(pending as f64);
        metrics::gauge!(EVENT_TYPE_FAILED, &labels).set(failed as f64);
        metrics::gauge!(EVENT_TYPE_OLDEST_PENDING_AGE, &labels).set(oldest_age);
    }
}

/// Creates the relay's counters at zero, so a rule over `increase()` sees
/// the first failure (a series that appears at 1 has no increase).
pub fn register_relay(schema: &str, transport: &'static str) {
    let schema = schema.to_owned();
    for kind in ["retryable", "permanent"] {
        metrics::counter!(PUBLISH_FAILURES, "schema" => schema.clone(), "transport" => transport, "kind" => kind)
            .increment(0);
    }
    metrics::counter!(PUBLISH_ATTEMPTS, "schema" => schema.clone(), "transport" => transport)
        .increment(0);
    metrics::counter!(PUBLISHED, "schema" => schema.clone(), "transport" => transport).increment(0);
    metrics::counter!(MOVED_TO_FAILED, "schema" => schema.clone()).increment(0);
    metrics::counter!(RELAY_REBALANCES, "schema" => schema.clone()).increment(0);
    metrics::counter!(STORE_ERRORS, "schema" => schema).increment(0);
}

/// Creates a consumer's counters at zero (see [`register_relay`]).
pub fn register_consumer(consumer: &str) {
    let consumer = consumer.to_owned();
    metrics::counter!(CONSUMER_DUPLICATES, "consumer" => consumer.clone()).increment(0);
    metrics::counter!(CONSUMER_QUARANTINED, "consumer" => consumer.clone()).increment(0);
    metrics::counter!(CONSUMER_DEAD_LETTERED, "consumer" => consumer.clone()).increment(0);
    metrics::counter!(CONSUMER_STRICT_STARTS, "consumer" => consumer.clone()).increment(0);
    for kind in ["database", "source"] {
        metrics::counter!(CONSUMER_ERRORS, "consumer" => consumer.clone(), "kind" => kind)
            .increment(0);
    }
}

/// Messages a consumer settled (counter, labels `consumer`, `outcome` =
/// applied|duplicate|stale|parked|quarantined|ignored|foreign|retry|dead_lettered).
pub const CONSUMER_MESSAGES: &str = "outbox_consumer_messages_total";
/// Duplicates a consumer's inbox rejected (counter, label `consumer`).
pub const CONSUMER_DUPLICATES: &str = "outbox_consumer_duplicates_total";
/// Messages a consumer quarantined (counter, label `consumer`).
pub const CONSUMER_QUARANTINED: &str = "outbox_consumer_quarantined_total";
/// Messages a consumer moved to its dead letters (counter, label `consumer`).
pub const CONSUMER_DEAD_LETTERED: &str = "outbox_consumer_dead_lettered_total";
/// Seconds from an event's emit to its handler's commit, for the latest
/// applied event (gauge, label `consumer`): the consumer lag in time.
pub const CONSUMER_LAG: &str = "outbox_consumer_lag_seconds";
/// Messages the broker holds for the consumer, not yet delivered (gauge,
/// label `consumer`; JetStream reports it with each message).
pub const CONSUMER_PENDING: &str = "outbox_consumer_pending_messages";
/// Time a handler ran, including its failures (histogram, label `consumer`).
pub const CONSUMER_HANDLER_DURATION: &str = "outbox_consumer_handler_duration_seconds";
/// Aggregates a strict consumer started at the lowest version that arrived,
/// because it had never seen them before (counter, label `consumer`).
pub const CONSUMER_STRICT_STARTS: &str = "outbox_consumer_strict_starts_total";
/// Letters replayed into a consumer (counter, labels `consumer`, `outcome`
/// = applied|already_applied|stale|parked|ignored|failed|still_unreadable|not_found).
pub const CONSUMER_REPLAYS: &str = "outbox_consumer_replays_total";
/// Database or source errors of a consumer loop (counter, labels
/// `consumer`, `kind` = database|source).
pub const CONSUMER_ERRORS: &str = "outbox_consumer_errors_total";

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up (Prometheus `counter`, names end in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Samples in buckets (Prometheus exposes `_bucket`, `_sum`, `_count`,
    /// or quantiles with `_sum` and `_count`).
    Histogram,
}

/// One metric the framework records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricDef {
    /// The name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// Its help text, as `describe_all` registers it.
    pub help: &'static str,
}

const fn def(name: &'static str, kind: MetricKind, help: &'static str) -> MetricDef {
    MetricDef { name, kind, help }
}

/// Every metric the framework records: what dashboards and alert rules
/// may refer to (a test checks that ops/grafana and ops/prometheus use
/// only these, and that the code records no other).
pub const ALL: &[MetricDef] = {
    use MetricKind::{Counter, Gauge, Histogram};
    &[
        def(PENDING_EVENTS, Gauge, "Events waiting to be published."),
        def(
            OLDEST_PENDING_AGE,
            Gauge,
            "Age of the oldest pending event in seconds.",
        ),
        def(FAILED_EVENTS, Gauge, "Events in the failed state."),
        def(
            BLOCKED_AGGREGATES,
            Gauge,
            "Aggregates waiting behind a retrying or failed head.",
        ),
        def(DEAD_TUPLES, Gauge, "Dead tuples in the outbox table."),
        def(LIVE_TUPLES, Gauge, "Live tuples in the outbox table."),
        def(
            EVENT_TYPE_PENDING,
            Gauge,
            "Events of one type waiting to be published.",
        ),
        def(
            EVENT_TYPE_OLDEST_PENDING_AGE,
            Gauge,
            "Age of the oldest pending event of one type in seconds.",
        ),
        def(
            EVENT_TYPE_FAILED,
            Gauge,
            "Events of one type in the failed state.",
        ),
        def(PUBLISH_ATTEMPTS, Counter, "Publish attempts."),
        def(PUBLISHED, Counter, "Events acknowledged by the broker."),
        def(PUBLISH_FAILURES, Counter, "Failed publish attempts."),
        def(
            MOVED_TO_FAILED,
            Counter,
            "Events moved to the failed state.",
        ),
        def(
            BATCH_DURATION,
            Histogram,
            "Seconds from claim to recorded outcome of one batch.",
        ),
        def(BATCH_EVENTS, Histogram, "Events per claimed batch."),
        def(
            TRANSPORT_UP,
            Gauge,
            "Whether the relay's transport can publish (1) or not (0).",
        ),
        def(
            STORE_ERRORS,
            Counter,
            "Relay claims or completions that failed on the database.",
        ),
        def(
            RELAY_PARTITIONS_OWNED,
            Gauge,
            "Partitions a relay worker owns now.",
        ),
        def(
            RELAY_REBALANCES,
            Counter,
            "Times a relay worker took or gave up partitions.",
        ),
        def(
            RETENTION_DELETED,
            Counter,
            "Published rows deleted by retention.",
        ),
        def(
            RETENTION_KEYS_DELETED,
            Counter,
            "Idempotency keys deleted by retention.",
        ),
        def(
            CONSUMER_MESSAGES,
            Counter,
            "Messages a consumer settled, by outcome.",
        ),
        def(
            CONSUMER_DUPLICATES,
            Counter,
            "Deliveries a consumer's inbox recognised as applied.",
        ),
        def(
            CONSUMER_QUARANTINED,
            Counter,
            "Messages a consumer quarantined.",
        ),
        def(
            CONSUMER_DEAD_LETTERED,
            Counter,
            "Messages a consumer moved to its dead letters.",
        ),
        def(
            CONSUMER_LAG,
            Gauge,
            "Seconds from emit to handler commit of the latest applied event.",
        ),
        def(
            CONSUMER_PENDING,
            Gauge,
            "Messages the broker holds for a consumer, not yet delivered.",
        ),
        def(
            CONSUMER_HANDLER_DURATION,
            Histogram,
            "Seconds a handler ran.",
        ),
        def(
            CONSUMER_STRICT_STARTS,
            Counter,
            "Aggregates a strict consumer started at the lowest version that arrived.",
        ),
        def(
            CONSUMER_REPLAYS,
            Counter,
            "Letters replayed into a consumer, by outcome.",
        ),
        def(
            CONSUMER_ERRORS,
            Counter,
            "Database or source errors of a consumer loop.",
        ),
    ]
};

/// Registers the help text (and unit) of every metric in [`ALL`] with the
/// installed recorder, so an exporter shows `# HELP` lines. Call it once
/// after installing the recorder (a Prometheus exporter, say).
pub fn describe_all() {
    for metric in ALL {
        let unit = metric
            .name
            .ends_with("_seconds")
            .then_some(metrics::Unit::Seconds);
        match (metric.kind, unit) {
            (MetricKind::Counter, _) => metrics::describe_counter!(metric.name, metric.help),
            (MetricKind::Gauge, Some(unit)) => {
                metrics::describe_gauge!(metric.name, unit, metric.help)
            }
            (MetricKind::Gauge, None) => metrics::describe_gauge!(metric.name, metric.help),
            (MetricKind::Histogram, Some(unit)) => {
                metrics::describe_histogram!(metric.name, unit, metric.help)
            }
            (MetricKind::Histogram, None) => {
                metrics::describe_histogram!(metric.name, metric.help)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ALL, MetricKind};

    /// Every `metrics::counter!`, `gauge!` and `histogram!` in this crate
    /// names a constant listed in `ALL`, with the matching kind.
    #[test]
    fn every_recorded_metric_is_listed() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![src];
        let mut recorded = Vec::new();
        while let Some(path) = files.pop() {
            if path.is_dir() {
                for entry in std::fs::read_dir(&path).unwrap() {
                    files.push(entry.unwrap().path());
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // Unit tests may record what they like.
            let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
            for (kind, macro_name) in [
                (MetricKind::Counter, "metrics::counter!("),
                (MetricKind::Gauge, "metrics::gauge!("),
                (MetricKind::Histogram, "metrics::histogram!("),
            ] {
                for (at, _) in text.match_indices(macro_name) {
                    let rest = text[at + macro_name.len()..].trim_start();
                    let constant: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    let constant = constant.rsplit("::").next().unwrap().to_owned();
                    recorded.push((path.display().to_string(), constant, kind));
                }
            }
        }
        assert!(recorded.len() > 20, "found only {recorded:?}");
        let metrics_rs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics.rs"),
        )
        .unwrap();
        for (file, constant, kind) in recorded {
            let declaration = format!("pub const {constant}: &str = \"");
            let at = metrics_rs
                .find(&declaration)
                .unwrap_or_else(|| panic!("{file}: {constant} is not a metric constant"));
            let name = metrics_rs[at + declaration.len()..]
                .split('"')
                .next()
                .unwrap();
            let listed = ALL
                .iter()
                .find(|m| m.name == name)
                .unwrap_or_else(|| panic!("{file}: {name} is recorded but not in ALL"));
            assert_eq!(listed.kind, kind, "{file}: {name}");
        }
    }

    #[test]
    fn counter_names_end_in_total_and_names_are_unique() {
        let mut names: Vec<&str> = ALL.iter().map(|m| m.name).collect();
        for metric in ALL {
            assert_eq!(
                metric.kind == MetricKind::Counter,
                metric.name.ends_with("_total"),
                "{}",
                metric.name
            );
            assert!(metric.name.starts_with("outbox_"), "{}", metric.name);
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }
}
