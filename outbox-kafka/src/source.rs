//! The consuming side: a consumer group feeding the consumer engine, with
//! offsets committed only after the consumer's transaction committed.
//!
//! Kafka acknowledges by offset, not by message: a partition's committed
//! offset may only pass messages that are settled. The source keeps, per
//! assigned partition, the offsets handed out and not yet settled; an ack
//! settles one, and the committed offset moves to just past the longest
//! settled prefix (so an ack of offset 7 while 5 is still being retried
//! commits nothing). A retry holds its offset open and comes back through a
//! local queue after its delay, with the next attempt number. On a
//! rebalance the revoked partitions' open offsets are forgotten: the new
//! owner starts at the committed offset and receives them again (the inbox
//! turns what was applied into duplicates), and an ack arriving late for a
//! partition this instance no longer owns commits nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use outbox_core::consumer::{
    Consumer, ConsumerStore, Delivery, Incoming, MessageSource, SourceError,
};
use outbox_core::store::ConfigError;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::config::{KafkaConfig, KafkaError, TopicTemplate};
use crate::headers;

/// Settings of a Kafka source.
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    /// The cluster (and extra client settings).
    pub kafka: KafkaConfig,
    /// The consumer group (usually the consumer's name).
    pub group_id: String,
    /// The topics to subscribe to.
    pub topics: Vec<String>,
    /// Where a group without a committed offset starts (default
    /// `earliest`: nothing published before the first start is missed).
    pub auto_offset_reset: String,
    /// How long the group membership may stay unsettled (looking for a
    /// coordinator, joining, syncing) before the source gives up on it:
    /// it closes its client, forgets what it had open (the offsets were
    /// not committed, so the group delivers them again) and joins with a
    /// new client. librdkafka can stay in a join the coordinator never
    /// answers after the coordinator went down and came back, receiving
    /// nothing and reporting nothing; this is the way out. Default 360 s:
    /// past the longest a rebalance may legitimately take, which waits for
    /// a slow member up to `max.poll.interval.ms` (300 s by default) plus
    /// the session timeout; lower it with those. `Duration::ZERO` turns it
    /// off. A member with no partitions in a settled group (more members
    /// than partitions), and one whose topics do not exist yet, are
    /// settled.
    pub rejoin_after: Duration,
}

impl KafkaSourceConfig {
    /// Settings aligned with `consumer`: group = consumer name, the topics
    /// of every (aggregate type, event type) it must receive under the
    /// template (one per aggregate type with the default template), from
    /// the earliest offset.
    ///
    /// Other event types on those topics (another service's events of the
    /// same aggregate type) arrive too and are acknowledged as foreign or
    /// ignored, as the consumer's table says.
    pub fn for_consumer<S: ConsumerStore>(
        consumer: &Consumer<S>,
        kafka: KafkaConfig,
    ) -> Result<Self, ConfigError> {
        let template = TopicTemplate::new(&kafka.topic_template)?;
        let mut topics = Vec::new();
        for (aggregate_type, event_type) in consumer.subscribed_types() {
            let topic = template
                .topic_for(aggregate_type, event_type)
                .map_err(|reason| ConfigError::InvalidValue {
                    what: "Kafka topic template",
                    reason,
                })?;
            topics.push(topic);
        }
        topics.sort();
        topics.dedup();
        Ok(KafkaSourceConfig {
            kafka,
            group_id: consumer.name().to_owned(),
            topics,
            auto_offset_reset: "earliest".to_owned(),
            rejoin_after: Duration::from_secs(360),
        })
    }
}

/// Open offsets of the partitions this instance owns.
#[derive(Debug, Default)]
struct Tracker {
    partitions: HashMap<(String, i32), PartitionOffsets>,
    next_epoch: u64,
}

#[derive(Debug)]
struct PartitionOffsets {
    /// Which assignment the offsets belong to.
    epoch: u64,
    /// Offsets handed out, and whether each is settled.
    open: BTreeMap<i64, bool>,
    /// Whether anything was settled in this assignment. Until then a
    /// record may be one an earlier owner (or this process before a crash)
    /// already handed to a handler: it is delivered as a redelivery, so the
    /// consumer counts its handler starts and a record that takes the
    /// process down each time ends in the dead letters.
    settled_any: bool,
}

impl Tracker {
    fn assign(&mut self, topic: &str, partition: i32) -> u64 {
        self.next_epoch += 1;
        let epoch = self.next_epoch;
        self.partitions.insert(
            (topic.to_owned(), partition),
            PartitionOffsets {
                epoch,
                open: BTreeMap::new(),
                settled_any: false,
            },
        );
        epoch
    }

    /// Records a received offset; returns the assignment it belongs to
    /// and the attempt to deliver it as, or `None` for a partition this
    /// instance does not own (its owner receives the record).
    fn received(&mut self, topic: &str, partition: i32, offset: i64) -> Option<(u64, u32)> {
        let owned = self.partitions.get_mut(&(topic.to_owned(), partition))?;
        owned.open.insert(offset, false);
        let attempt = if owned.settled_any { 1 } else { 2 };
        Some((owned.epoch, attempt))
    }

    fn owns(&self, position: &Position) -> bool {
        self.partitions
            .get(&(position.topic.clone(), position.partition))
            .is_some_and(|owned| owned.epoch == position.epoch)
    }

    /// Settles an offset; returns the offset to commit when the settled
    /// prefix grew.
    fn settle(&mut self, position: &Position) -> Option<i64> {
        let owned = self
            .partitions
            .get_mut(&(position.topic.clone(), position.partition))?;
        if owned.epoch != position.epoch {
            return None;
        }
        owned.open.insert(position.offset, true);
        owned.settled_any = true;
        let mut commit = None;
        while let Some(entry) = owned.open.first_entry() {
            if !*entry.get() {
                break;
            }
            commit = Some(*entry.key() + 1);
            entry.remove();
        }
        commit
    }
}

/// Where a record came from.
#[derive(Debug, Clone)]
struct Position {
    topic: String,
    partition: i32,
    offset: i64,
    epoch: u64,
}

/// Since when the group membership has not been settled, as librdkafka's
/// statistics report it.
#[derive(Debug, Default)]
struct Membership {
    unsettled_since: Option<Instant>,
    /// The last reported states (`cgrp.state`, `cgrp.join_state`).
    states: (String, String),
}

impl Membership {
    /// Records a statistics report of the group handler's states.
    fn observe(&mut self, state: &str, join_state: &str, now: Instant) {
        // `up`/`init`: subscribed to topics that do not exist (yet), so
        // there is no group to join; nothing a new client would change.
        if state == "up" && matches!(join_state, "steady" | "init") {
            self.unsettled_since = None;
        } else {
            self.unsettled_since.get_or_insert(now);
        }
        self.states = (state.to_owned(), join_state.to_owned());
    }

    /// Whether the membership has been unsettled for `limit` or longer.
    fn stuck(&self, limit: Duration, now: Instant) -> bool {
        !limit.is_zero()
            && self
                .unsettled_since
                .is_some_and(|since| now.duration_since(since) >= limit)
    }
}

/// Rebalance callbacks: assigned partitions start with nothing open,
/// revoked ones are forgotten. Statistics: the group membership's state.
pub struct GroupContext {
    tracker: Arc<Mutex<Tracker>>,
    membership: Arc<Mutex<Membership>>,
}

impl ClientContext for GroupContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        if let Some(group) = statistics.cgrp {
            self.membership.lock().expect("membership lock").observe(
                &group.state,
                &group.join_state,
                Instant::now(),
            );
        }
    }
}

impl ConsumerContext for GroupContext {
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(error) = result {
            // The next settled offset commits again; until then a restart
            // re-reads (the inbox turns what was applied into duplicates).
            tracing::warn!(%error, ?offsets, "Kafka offset commit failed");
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut tracker = self.tracker.lock().expect("offset tracker lock");
        match rebalance {
            Rebalance::Assign(list) => {
                for element in list.elements() {
                    tracker.assign(element.topic(), element.partition());
                }
            }
            Rebalance::Revoke(list) => {
                for element in list.elements() {
                    tracker
                        .partitions
                        .remove(&(element.topic().to_owned(), element.partition()));
                }
            }
            Rebalance::Error(error) => tracing::warn!(%error, "Kafka rebalance failed"),
        }
    }
}

type GroupConsumer = StreamConsumer<GroupContext>;

/// Feeds a consumer from a Kafka consumer group.
pub struct KafkaSource {
    consumer: Arc<GroupConsumer>,
    tracker: Arc<Mutex<Tracker>>,
    membership: Arc<Mutex<Membership>>,
    retries: mpsc::UnboundedReceiver<(Position, Incoming)>,
    requeue: mpsc::UnboundedSender<(Position, Incoming)>,
    config: KafkaSourceConfig,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("group_id", &self.config.group_id)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Validates the settings, creates the group consumer and subscribes.
    /// The cluster need not be reachable: librdkafka joins the group once
    /// it is.
    pub async fn connect(config: KafkaSourceConfig) -> Result<KafkaSource, KafkaError> {
        outbox_core::consumer::validate_consumer_name(&config.group_id)?;
        config.kafka.validate()?;
        if config.topics.is_empty() {
            return Err(ConfigError::InvalidValue {
                what: "Kafka topics",
                reason: "subscribe to at least one topic".into(),
            }
            .into());
        }
        let tracker = Arc::new(Mutex::new(Tracker::default()));
        let membership = Arc::new(Mutex::new(Membership::default()));
        let consumer = subscribe(&config, &tracker, &membership)?;
        let (requeue, retries) = mpsc::unbounded_channel();
        Ok(KafkaSource {
            consumer: Arc::new(consumer),
            tracker,
            membership,
            retries,
            requeue,
            config,
        })
    }

    /// Leaves the group with the old client and joins with a new one,
    /// when the membership has been unsettled for `rejoin_after`.
    fn rejoin_if_stuck(&mut self) -> Result<(), KafkaError> {
        let (stuck, states) = {
            let membership = self.membership.lock().expect("membership lock");
            (
                membership.stuck(self.config.rejoin_after, Instant::now()),
                membership.states.clone(),
            )
        };
        if !stuck {
            return Ok(());
        }
        tracing::warn!(
            group = %self.config.group_id,
            state = %states.0,
            join_state = %states.1,
            after = ?self.config.rejoin_after,
            "Kafka group membership unsettled too long: joining again with a new client"
        );
        // The new client gets its own offsets and membership: the old one
        // keeps calling back (its revocations, its statistics) while it
        // closes, into what was its own. What it had open was not
        // committed unless settled: the group hands it out again, and
        // retries of it coming back are left to the new owner.
        self.tracker = Arc::new(Mutex::new(Tracker::default()));
        self.membership = Arc::new(Mutex::new(Membership::default()));
        let fresh = subscribe(&self.config, &self.tracker, &self.membership)?;
        let old = std::mem::replace(&mut self.consumer, Arc::new(fresh));
        close_off_runtime(old);
        Ok(())
    }

    fn delivery(&self, position: Position, incoming: Incoming) -> KafkaDelivery {
        KafkaDelivery {
            position,
            incoming,
            consumer: Arc::clone(&self.consumer),
            tracker: Arc::clone(&self.tracker),
            requeue: self.requeue.clone(),
        }
    }

    fn received(&self, message: &BorrowedMessage<'_>) -> Option<KafkaDelivery> {
        let (topic, partition, offset) = (message.topic(), message.partition(), message.offset());
        let received = self
            .tracker
            .lock()
            .expect("offset tracker lock")
            .received(topic, partition, offset);
        let Some((epoch, attempt)) = received else {
            tracing::warn!(
                topic,
                partition,
                offset,
                "a record of a partition this instance does not own; left to its owner"
            );
            return None;
        };
        let (attributes, problem) = headers::read_checked(message);
        let payload = message.payload().unwrap_or_default().to_vec();
        let incoming = match problem {
            None => Incoming::new(attributes, payload, attempt),
            Some(reason) => Incoming::malformed(attributes, payload, attempt, reason),
        };
        let position = Position {
            topic: topic.to_owned(),
            partition,
            offset,
            epoch,
        };
        Some(self.delivery(position, incoming))
    }

    /// A retry that came back, unless its partition moved to another
    /// instance meanwhile (the new owner receives it from the broker).
    fn returned(&self, position: Position, incoming: Incoming) -> Option<KafkaDelivery> {
        let owned = self
            .tracker
            .lock()
            .expect("offset tracker lock")
            .owns(&position);
        owned.then(|| self.delivery(position, incoming))
    }
}

/// A group consumer with the source's settings, subscribed.
fn subscribe(
    config: &KafkaSourceConfig,
    tracker: &Arc<Mutex<Tracker>>,
    membership: &Arc<Mutex<Membership>>,
) -> Result<GroupConsumer, KafkaError> {
    let mut client = config.kafka.client_config();
    client
        .set("group.id", &config.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", &config.auto_offset_reset);
    config.kafka.apply_extra(&mut client);
    if !config.rejoin_after.is_zero() {
        // The membership is read from the statistics; an interval of the
        // user's own is kept (0 leaves the watch blind: said at connect).
        let own = config
            .kafka
            .client
            .iter()
            .find(|(key, _)| key == "statistics.interval.ms");
        match own {
            Some((_, value)) if value.trim() == "0" => tracing::warn!(
                group = %config.group_id,
                "statistics.interval.ms = 0: the source cannot see a group membership that stays unsettled, rejoin_after has no effect"
            ),
            Some(_) => {}
            None => {
                let interval = (config.rejoin_after / 4)
                    .clamp(Duration::from_secs(1), Duration::from_secs(15));
                client.set("statistics.interval.ms", interval.as_millis().to_string());
            }
        }
    }
    let consumer: GroupConsumer = client
        .create_with_context(GroupContext {
            tracker: Arc::clone(tracker),
            membership: Arc::clone(membership),
        })
        .map_err(|e| KafkaError::Client(e.to_string()))?;
    let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|e| KafkaError::Subscribe {
            topics: config.topics.clone(),
            reason: e.to_string(),
        })?;
    Ok(consumer)
}

/// Closing a group consumer leaves the group and waits for it: not on a
/// runtime worker. Deliveries still alive keep it open until the last one
/// goes.
fn close_off_runtime(consumer: Arc<GroupConsumer>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn_blocking(move || drop(consumer));
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        close_off_runtime(Arc::clone(&self.consumer));
    }
}

/// A Kafka record being processed.
pub struct KafkaDelivery {
    position: Position,
    incoming: Incoming,
    consumer: Arc<GroupConsumer>,
    tracker: Arc<Mutex<Tracker>>,
    requeue: mpsc::UnboundedSender<(Position, Incoming)>,
}

impl std::fmt::Debug for KafkaDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaDelivery")
            .field("topic", &self.position.topic)
            .field("partition", &self.position.partition)
            .field("offset", &self.position.offset)
            .field("attempt", &self.incoming.attempt())
            .finish_non_exhaustive()
    }
}

impl Delivery for KafkaDelivery {
    fn incoming(&self) -> &Incoming {
        &self.incoming
    }

    async fn ack(self) -> Result<(), SourceError> {
        let commit = self
            .tracker
            .lock()
            .expect("offset tracker lock")
            .settle(&self.position);
        let Some(next) = commit else {
            return Ok(());
        };
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(
            &self.position.topic,
            self.position.partition,
            Offset::Offset(next),
        )
        .map_err(|e| SourceError(format!("Kafka offset {next}: {e}")))?;
        self.consumer
            .commit(&list, CommitMode::Async)
            .map_err(|e| SourceError(format!("Kafka commit failed: {e}")))
    }

    async fn retry_later(self, delay: Duration) -> Result<(), SourceError> {
        let again = Incoming::new(
            self.incoming.attributes().to_vec(),
            self.incoming.payload().to_vec(),
            self.incoming.attempt() + 1,
        );
        let (requeue, position) = (self.requeue, self.position);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // The source may be gone (the consumer stopped): the offset was
            // never committed, so the group delivers it again.
            let _ = requeue.send((position, again));
        });
        Ok(())
    }
}

impl MessageSource for KafkaSource {
    type Delivery = KafkaDelivery;

    async fn next_batch(&mut self, max: usize) -> Result<Vec<KafkaDelivery>, SourceError> {
        let mut batch = Vec::new();
        // How often a wait for messages looks at the group membership.
        let look = Duration::from_secs(1);
        while batch.is_empty() {
            self.rejoin_if_stuck()
                .map_err(|e| SourceError(format!("Kafka rejoin failed: {e}")))?;
            let consumer = Arc::clone(&self.consumer);
            tokio::select! {
                Some((position, incoming)) = self.retries.recv() => {
                    batch.extend(self.returned(position, incoming));
                }
                received = consumer.recv() => match received {
                    Ok(message) => batch.extend(self.received(&message)),
                    Err(error) => {
                        return Err(SourceError(format!("Kafka receive failed: {error}")));
                    }
                },
                () = tokio::time::sleep(look) => {}
            }
        }
        while batch.len() < max {
            if let Ok((position, incoming)) = self.retries.try_recv() {
                batch.extend(self.returned(position, incoming));
                continue;
            }
            match self.consumer.recv().now_or_never() {
                Some(Ok(message)) => batch.extend(self.received(&message)),
                _ => break,
            }
        }
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_membership_unsettled_for_the_limit_is_stuck_and_a_settled_one_never() {
        let start = Instant::now();
        let limit = Duration::from_secs(120);
        let mut membership = Membership::default();
        membership.observe("up", "steady", start);
        membership.observe("up", "init", start + Duration::from_secs(1));
        assert!(
            !membership.stuck(limit, start + Duration::from_secs(600)),
            "no topic yet"
        );
        assert!(!membership.stuck(limit, start + Duration::from_secs(600)));
        membership.observe("up", "wait-join", start + Duration::from_secs(10));
        membership.observe("wait-coord", "init", start + Duration::from_secs(60));
        assert!(!membership.stuck(limit, start + Duration::from_secs(129)));
        assert!(membership.stuck(limit, start + Duration::from_secs(130)));
        assert!(
            !membership.stuck(Duration::ZERO, start + Duration::from_secs(600)),
            "off"
        );
        membership.observe("up", "steady", start + Duration::from_secs(131));
        assert!(!membership.stuck(limit, start + Duration::from_secs(600)));
    }

    #[test]
    fn commits_only_past_the_settled_prefix() {
        let mut tracker = Tracker::default();
        let epoch = tracker.assign("t", 0);
        let at = |offset| Position {
            topic: "t".into(),
            partition: 0,
            offset,
            epoch,
        };
        assert_eq!(tracker.received("u", 0, 1), None, "not owned");
        assert_eq!(
            tracker.received("t", 0, 5),
            Some((epoch, 2)),
            "before any settle"
        );
        for offset in [6, 7] {
            tracker.received("t", 0, offset);
        }
        assert_eq!(tracker.settle(&at(6)), None, "5 is still open");
        assert_eq!(tracker.settle(&at(5)), Some(7));
        assert_eq!(tracker.settle(&at(7)), Some(8));
        assert_eq!(
            tracker.received("t", 0, 8),
            Some((epoch, 1)),
            "after a settle"
        );
        // Revoked and assigned again: a late ack of the old assignment
        // commits nothing.
        tracker.assign("t", 0);
        assert_eq!(tracker.settle(&at(8)), None);
        assert!(!tracker.owns(&at(8)));
    }
}
