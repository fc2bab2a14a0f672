//! The publishing side: an idempotent producer, records keyed by
//! aggregate id, every delivery report awaited.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use outbox_core::Envelope;
use outbox_core::transport::{PublishFailure, Transport, TransportHealth};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use crate::config::{KafkaConfig, KafkaError, TopicTemplate};
use crate::headers;

/// The shortest time between two reachability probes while down.
const PROBE_PAUSE: Duration = Duration::from_secs(1);

/// The shortest time between two looks for topics that were missing.
const TOPIC_RECHECK: Duration = Duration::from_secs(10);

/// What the transport knows about the cluster's reachability.
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    state: Mutex<ReachState>,
    /// The producer must be replaced before the next publish: librdkafka
    /// reported a fatal error, or the cluster was unreachable and is back
    /// (a broker that lost its log also lost the idempotent producer's
    /// state, and the old producer would wait out every delivery timeout).
    replace: AtomicBool,
}

#[derive(Debug, Default)]
struct ReachState {
    down: Option<String>,
    last_probe: Option<Instant>,
}

impl Reachability {
    fn mark_down(&self, reason: String) {
        self.state.lock().expect("reachability lock").down = Some(reason);
    }

    fn mark_replace(&self) {
        self.replace.store(true, Ordering::SeqCst);
    }

    fn take_replace(&self) -> bool {
        self.replace.swap(false, Ordering::SeqCst)
    }

    fn mark_up(&self) {
        self.state.lock().expect("reachability lock").down = None;
    }

    /// `None` when up; the reason when down and a probe is not due yet;
    /// `Some("")` when down and a probe is due (it is recorded as started).
    fn down_reason(&self) -> Option<String> {
        let mut state = self.state.lock().expect("reachability lock");
        let reason = state.down.clone()?;
        if state
            .last_probe
            .is_some_and(|at| at.elapsed() < PROBE_PAUSE)
        {
            return Some(reason);
        }
        state.last_probe = Some(Instant::now());
        Some(String::new())
    }
}

/// Client callbacks: librdkafka reports "all brokers down" and fatal
/// errors here, which turn the transport's health down.
pub(crate) struct ProducerContext {
    reach: Arc<Reachability>,
}

impl ClientContext for ProducerContext {
    fn error(&self, error: ClientError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::AllBrokersDown) => self
                .reach
                .mark_down(format!("all Kafka brokers are down: {reason}")),
            Some(RDKafkaErrorCode::Fatal) => {
                tracing::warn!(
                    reason,
                    "the Kafka producer hit a fatal error (for an idempotent producer: the broker lost its producer state, e.g. a broker restarted without its log); it is replaced before the next publish"
                );
                self.reach.mark_replace();
            }
            _ => tracing::warn!(%error, reason, "librdkafka"),
        }
    }
}

/// Publishes envelopes to Kafka: topic from the template, key = aggregate
/// id (an aggregate stays on one partition, in order), CloudEvents headers,
/// `enable.idempotence` with `acks=all`.
///
/// Starts while the cluster is unreachable (reports itself down until its
/// metadata answers; the relay keeps events pending meanwhile).
pub struct KafkaTransport {
    /// Replaced after a fatal error (a new producer id and epoch); records
    /// the old one did not confirm were reported as retryable failures and
    /// are published again by the relay, in order.
    producer: RwLock<FutureProducer<ProducerContext>>,
    config: KafkaConfig,
    template: TopicTemplate,
    reach: Arc<Reachability>,
    /// Since when each topic the cluster does not know has been refused:
    /// retried until `unknown_topic_retry` has passed, then permanent.
    unknown_since: Mutex<HashMap<String, Instant>>,
    /// What the last look for the linked contracts' topics found.
    topics: Mutex<TopicLook>,
}

/// The transport's knowledge of the topics the linked contracts map to.
#[derive(Debug, Default)]
struct TopicLook {
    /// Whether a look has completed (the cluster answered with its topics).
    complete: bool,
    /// The expected topics that did not exist at the last complete look.
    missing: BTreeSet<String>,
    /// When the last look was tried, completed or not.
    tried_at: Option<Instant>,
}

impl TopicLook {
    /// Whether to look again: until a look completes (a transport that
    /// started while the cluster was down looks once it answers), and
    /// while topics are missing, at most every `TOPIC_RECHECK`.
    fn due(&self) -> bool {
        (!self.complete || !self.missing.is_empty())
            && self.tried_at.is_none_or(|at| at.elapsed() >= TOPIC_RECHECK)
    }
}

impl KafkaTransport {
    /// Validates the settings, creates the producer and asks the cluster
    /// for its metadata (up to `connect_timeout`); an unreachable cluster
    /// is not an error, a setting librdkafka refuses is; so is a missing
    /// topic that `create_topics` cannot create.
    pub async fn connect(config: KafkaConfig) -> Result<KafkaTransport, KafkaError> {
        let template = config.validate()?;
        let reach = Arc::new(Reachability::default());
        let producer = build_producer(&config, &reach)?;
        let transport = KafkaTransport {
            producer: RwLock::new(producer),
            config,
            template,
            reach,
            unknown_since: Mutex::new(HashMap::new()),
            topics: Mutex::new(TopicLook::default()),
        };
        if let Err(reason) = transport.probe(transport.config.connect_timeout).await {
            tracing::warn!(
                servers = %transport.config.bootstrap_servers,
                reason,
                "Kafka is not reachable; the transport reports itself down and events stay pending until it is"
            );
            transport.reach.mark_down(reason);
        } else {
            transport.check_topics().await?;
        }
        Ok(transport)
    }

    /// The topics the template renders for the contracts linked into the
    /// binary (every (aggregate type, event type) of the global registry).
    pub fn expected_topics(&self) -> BTreeSet<String> {
        let Ok(registry) = outbox_core::ContractRegistry::global() else {
            return BTreeSet::new();
        };
        registry
            .event_types()
            .filter_map(|event_type| registry.current(event_type))
            .filter_map(|c| self.template.topic_for(c.aggregate_type, c.event_type).ok())
            .collect()
    }

    /// The expected topics that did not exist at the last look.
    pub fn missing_topics(&self) -> Vec<String> {
        self.topics
            .lock()
            .expect("topic look lock")
            .missing
            .iter()
            .cloned()
            .collect()
    }

    /// Looks which expected topics exist (one metadata request for all
    /// topics: asking for one by name could make a broker auto-create it),
    /// creates the missing ones when `create_topics` says so, and
    /// remembers what is still missing for the health check.
    async fn check_topics(&self) -> Result<(), KafkaError> {
        let expected = self.expected_topics();
        let existing = match self.topic_names().await {
            Ok(existing) => existing,
            Err(reason) => {
                // Unknown until the next look; publishing tells meanwhile.
                tracing::debug!(
                    reason,
                    "could not list the Kafka topics; looking again later"
                );
                self.topics.lock().expect("topic look lock").tried_at = Some(Instant::now());
                return Ok(());
            }
        };
        let mut missing: BTreeSet<String> = expected.difference(&existing).cloned().collect();
        if let (Some(creation), false) = (self.config.create_topics, missing.is_empty()) {
            let created = self.create(&missing, creation).await?;
            for topic in created {
                missing.remove(&topic);
            }
        }
        if !missing.is_empty() {
            tracing::warn!(
                topics = ?missing,
                "Kafka topics the contracts map to do not exist; their events fail after unknown_topic_retry (create them, or set create_topics)"
            );
        }
        *self.topics.lock().expect("topic look lock") = TopicLook {
            complete: true,
            missing,
            tried_at: Some(Instant::now()),
        };
        Ok(())
    }

    async fn topic_names(&self) -> Result<BTreeSet<String>, String> {
        let producer = self.producer();
        let timeout = self.config.connect_timeout;
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, Timeout::After(timeout))
                .map(|metadata| {
                    metadata
                        .topics()
                        .iter()
                        .filter(|t| t.error().is_none())
                        .map(|t| t.name().to_owned())
                        .collect()
                })
                .map_err(|e| format!("no metadata from the Kafka cluster: {e}"))
        })
        .await
        .unwrap_or_else(|e| Err(format!("the metadata request did not finish: {e}")))
    }

    /// Creates `topics`; returns those that exist afterwards (created, or
    /// created by someone else meanwhile). Refusals other than "exists"
    /// are a start-up error naming the topic.
    async fn create(
        &self,
        topics: &BTreeSet<String>,
        creation: crate::config::TopicCreation,
    ) -> Result<Vec<String>, KafkaError> {
        let mut client = self.config.client_config();
        self.config.apply_extra(&mut client);
        let admin: AdminClient<DefaultClientContext> = client
            .create()
            .map_err(|e| KafkaError::Client(e.to_string()))?;
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|topic| {
                NewTopic::new(
                    topic,
                    creation.partitions,
                    TopicReplication::Fixed(creation.replication),
                )
            })
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(self.config.connect_timeout));
        let results = admin
            .create_topics(&new, &options)
            .await
            .map_err(|e| KafkaError::Client(format!("cannot create topics: {e}")))?;
        let mut exist = Vec::new();
        for result in results {
            match result {
                Ok(topic) => {
                    tracing::info!(
                        topic,
                        partitions = creation.partitions,
                        replication = creation.replication,
                        "created a Kafka topic"
                    );
                    exist.push(topic);
                }
                Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => exist.push(topic),
                Err((topic, code)) => {
                    return Err(KafkaError::Client(format!(
                        "cannot create topic {topic:?} ({} partitions, replication {}): {code}",
                        creation.partitions, creation.replication
                    )));
                }
            }
        }
        Ok(exist)
    }

    /// A record's failure for `topic`: an unknown topic or partition is
    /// retried until `unknown_topic_retry` has passed since the first
    /// refusal (a topic just created, a leader election), then permanent.
    fn failure(&self, topic: &str, error: &ClientError) -> PublishFailure {
        use RDKafkaErrorCode as C;
        let unknown = matches!(
            error.rdkafka_error_code(),
            Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition)
        );
        if !unknown {
            return classify(error);
        }
        let mut unknown_since = self.unknown_since.lock().expect("unknown topics lock");
        let since = *unknown_since
            .entry(topic.to_owned())
            .or_insert_with(Instant::now);
        let waited = since.elapsed();
        let limit = self.config.unknown_topic_retry;
        if waited < limit {
            PublishFailure::retryable(format!(
                "Kafka does not know topic {topic:?} or its partition (for {:.0} s; retried for up to {limit:?}: a topic just created, a leader election): {error}",
                waited.as_secs_f64()
            ))
        } else {
            PublishFailure::permanent(format!(
                "Kafka topic {topic:?} does not exist (unknown for {:.0} s, longer than unknown_topic_retry {limit:?}): {error}",
                waited.as_secs_f64()
            ))
        }
    }

    /// A delivered record: its topic is known (again).
    fn delivered(&self, topic: &str) {
        let mut unknown_since = self.unknown_since.lock().expect("unknown topics lock");
        if !unknown_since.is_empty() {
            unknown_since.remove(topic);
        }
    }

    /// The topic template in use.
    pub fn template(&self) -> &TopicTemplate {
        &self.template
    }

    /// The producer to use now, replaced first after a fatal error or an
    /// outage.
    fn producer(&self) -> FutureProducer<ProducerContext> {
        if self.reach.take_replace() {
            match build_producer(&self.config, &self.reach) {
                Ok(fresh) => {
                    *self.producer.write().expect("producer lock") = fresh;
                    tracing::info!(
                        "replaced the Kafka producer (after a fatal error or an outage)"
                    );
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot replace the Kafka producer; trying again at the next publish");
                    self.reach.mark_replace();
                }
            }
        }
        self.producer.read().expect("producer lock").clone()
    }

    /// Asks for the cluster's metadata (all topics, so nothing is created).
    async fn probe(&self, timeout: Duration) -> Result<(), String> {
        let producer = self.producer();
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, Timeout::After(timeout))
                .map(|_| ())
                .map_err(|e| format!("no metadata from the Kafka cluster: {e}"))
        })
        .await
        .unwrap_or_else(|e| Err(format!("the metadata probe did not finish: {e}")))
    }

    fn record<'a>(&self, topic: &'a str, envelope: &'a Envelope) -> FutureRecord<'a, [u8], [u8]> {
        let attributes = envelope.cloudevents_attributes_with(
            &self.config.source,
            self.config.dataschema_base.as_deref(),
        );
        FutureRecord::to(topic)
            .key(envelope.aggregate_id.as_bytes())
            .payload(envelope.payload.get().as_bytes())
            .timestamp(envelope.occurred_at.timestamp_millis())
            .headers(headers::write(attributes, &envelope.id.to_string()))
    }
}

/// A producer with the transport's settings: idempotent, `acks=all`.
fn build_producer(
    config: &KafkaConfig,
    reach: &Arc<Reachability>,
) -> Result<FutureProducer<ProducerContext>, KafkaError> {
    let mut client = config.client_config();
    client
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set(
            "message.timeout.ms",
            config.delivery_timeout.as_millis().to_string(),
        )
        .set("linger.ms", "2")
        .set("partitioner", &config.partitioner);
    config.apply_extra(&mut client);
    client
        .create_with_context(ProducerContext {
            reach: Arc::clone(reach),
        })
        .map_err(|e| KafkaError::Client(e.to_string()))
}

/// Retryable or not, by librdkafka's error code.
fn classify(error: &ClientError) -> PublishFailure {
    use RDKafkaErrorCode as C;
    let permanent = matches!(
        error.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::MessageBatchTooLarge
                | C::InvalidTopic
                | C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::InvalidRecord
        )
    );
    if permanent {
        PublishFailure::permanent(format!("Kafka refused the record: {error}"))
    } else {
        PublishFailure::retryable(format!("Kafka publish failed: {error}"))
    }
}

impl Transport for KafkaTransport {
    async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
        let producer = self.producer();
        let mut pending = Vec::with_capacity(events.len());
        for envelope in events {
            let topic = match self.template.render(envelope) {
                Ok(topic) => topic,
                Err(reason) => {
                    pending.push(Err(PublishFailure::permanent(reason)));
                    continue;
                }
            };
            match producer.send_result(self.record(&topic, envelope)) {
                Ok(delivery) => pending.push(Ok((topic, delivery))),
                Err((error, _record)) => pending.push(Err(self.failure(&topic, &error))),
            }
        }
        // Every record is queued; wait for all delivery reports at once.
        // librdkafka gives up on a record after `delivery_timeout`; the
        // margin covers the report's way back.
        let deadline = self.config.delivery_timeout + Duration::from_secs(5);
        let results = join_all(pending.into_iter().map(|queued| async move {
            let (topic, delivery) = queued?;
            match tokio::time::timeout(deadline, delivery).await {
                Ok(Ok(Ok(_delivered))) => {
                    self.delivered(&topic);
                    Ok(())
                }
                Ok(Ok(Err((error, _message)))) => Err(self.failure(&topic, &error)),
                Ok(Err(_canceled)) => Err(PublishFailure::retryable(
                    "the Kafka producer was dropped before the delivery report",
                )),
                Err(_) => Err(PublishFailure::retryable(format!(
                    "no delivery report from Kafka within {deadline:?}"
                ))),
            }
        }))
        .await;
        if results.iter().any(|r| r.is_ok()) {
            self.reach.mark_up();
        }
        results
    }

    fn name(&self) -> &'static str {
        "kafka"
    }

    async fn health(&self) -> TransportHealth {
        match self.reach.down_reason() {
            None => self.topics_health().await,
            Some(reason) if !reason.is_empty() => TransportHealth::Down { reason },
            Some(_) => match self.probe(Duration::from_secs(1)).await {
                Ok(()) => {
                    // Back after an outage: start over with a new producer
                    // id. Unconfirmed records were reported as retryable
                    // failures and come again from the relay, in order.
                    self.reach.mark_up();
                    self.reach.mark_replace();
                    self.topics_health().await
                }
                Err(reason) => {
                    self.reach.mark_down(reason.clone());
                    TransportHealth::Down { reason }
                }
            },
        }
    }
}

impl KafkaTransport {
    /// Up, or degraded while expected topics are missing. Looks (and
    /// creates, with `create_topics`) when no look has completed yet, so a
    /// transport that started while the cluster was down checks its topics
    /// once it answers, and again every `TOPIC_RECHECK` while some are
    /// missing.
    async fn topics_health(&self) -> TransportHealth {
        let due = self.topics.lock().expect("topic look lock").due();
        if due && let Err(error) = self.check_topics().await {
            tracing::warn!(%error, "looking for missing Kafka topics failed");
        }
        let missing = self.missing_topics();
        if missing.is_empty() {
            TransportHealth::Up
        } else {
            TransportHealth::Degraded {
                reason: format!(
                    "Kafka topics {} do not exist: their events fail after unknown_topic_retry ({:?}); create them, or set create_topics",
                    missing.join(", "),
                    self.config.unknown_topic_retry
                ),
            }
        }
    }
}

impl Drop for KafkaTransport {
    fn drop(&mut self) {
        // A producer's last handle purges and flushes for a moment when it
        // goes: not on a runtime worker. Records it did not confirm were
        // not marked published; the relay sends them again.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let producer = self.producer.read().expect("producer lock").clone();
            runtime.spawn_blocking(move || drop(producer));
        }
    }
}
