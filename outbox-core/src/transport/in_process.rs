//! An in-process bus: the relay hands events to the consumers of its own
//! process, with no broker. A publish is acknowledged only after every
//! subscribed consumer has settled the event, that is committed it (applied
//! it, found it in its inbox, or quarantined or dead-lettered it), so
//! nothing counts as published that no consumer durably has:
//!
//! - a crash between a consumer's commit and the relay's mark publishes
//!   the event again, and that consumer's inbox drops the duplicate;
//! - a consumer whose handler asks for a retry, or that stops before it
//!   settles, fails the publish (retryable): the event stays pending and
//!   the relay's backoff delivers it again, to every subscriber (those that
//!   applied it find it in their inbox);
//! - with no consumer subscribed, or a subscribed one not running (its
//!   last source dropped: the task stopped or panicked), the transport
//!   reports itself down and refuses to publish (retryable), so no event is
//!   marked published that a subscribed consumer has not committed.
//!
//! Consumers subscribe by name, before the relay starts; several sources
//! of one name (instances of one consumer) share its queue and compete for
//! its messages. A subscription lasts as long as the bus: a consumer that
//! stops holds publishing back until it subscribes again (a new source of
//! the same name), or until [`InProcessBus::unsubscribe`] removes it for
//! good.
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool, consumer: outbox_postgres::PgConsumer) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_core::relay::{Relay, RelayConfig};
//! use outbox_core::transport::InProcessBus;
//! use outbox_postgres::SchemaName;
//! use outbox_postgres::prelude::*; // Relay::start_postgres
//!
//! let bus = InProcessBus::new();
//! let task = consumer.spawn(bus.subscribe("billing"));
//! let relay = Relay::start_postgres(pool, SchemaName::new("app")?, bus.transport(), RelayConfig::default()).await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::{PublishFailure, Transport, TransportHealth};
use crate::consumer::{Delivery, Incoming, MessageSource, SourceError};
use crate::envelope::Envelope;

/// How a consumer settled one delivery.
#[derive(Debug)]
enum Settlement {
    /// Committed: applied, a duplicate, or a letter.
    Acked,
    /// Not committed; its handler asked for a later delivery.
    RetryLater,
}

/// One message on its way to a consumer, with the way back.
#[derive(Debug)]
struct Handoff {
    event_id: Uuid,
    incoming: Incoming,
    settle: oneshot::Sender<Settlement>,
}

/// Deliveries per event id not yet acknowledged by one subscription, with
/// when the last one was handed out.
type Attempts = Arc<Mutex<AttemptCounts>>;

/// The counts, and the size at which they are next swept.
#[derive(Debug)]
struct AttemptCounts {
    counts: HashMap<Uuid, (u32, Instant)>,
    sweep_at: usize,
}

impl Default for AttemptCounts {
    fn default() -> Self {
        AttemptCounts {
            counts: HashMap::new(),
            sweep_at: ATTEMPTS_KEPT,
        }
    }
}

/// Past this many counted events, counts not handed out for
/// [`FORGET_AFTER`] are dropped: those of events the relay gave up on (or
/// an operator skipped), which never come to an ack.
const ATTEMPTS_KEPT: usize = 10_000;
/// How long an event's count outlives its last delivery once
/// [`ATTEMPTS_KEPT`] is passed; an event delivered again after that
/// counts from 1.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// Counts one more delivery of `event_id` at `now`; returns its number.
/// A sweep that leaves many recent counts is not repeated before the
/// counts have doubled, so sweeping costs O(1) per delivery over time.
fn count_attempt(attempts: &mut AttemptCounts, event_id: Uuid, now: Instant) -> u32 {
    if attempts.counts.len() >= attempts.sweep_at {
        attempts
            .counts
            .retain(|_, (_, last)| now.duration_since(*last) < FORGET_AFTER);
        attempts.sweep_at = (attempts.counts.len() * 2).max(ATTEMPTS_KEPT);
    }
    let entry = attempts.counts.entry(event_id).or_insert((0, now));
    entry.0 += 1;
    entry.1 = now;
    entry.0
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One consumer name's queue, as the bus holds it.
#[derive(Debug)]
struct Subscription {
    name: String,
    sender: mpsc::UnboundedSender<Handoff>,
    /// The queue's receiving end, held by the name's sources; gone (and
    /// the sender closed) when the last one is dropped.
    receiver: Weak<tokio::sync::Mutex<mpsc::UnboundedReceiver<Handoff>>>,
    attempts: Attempts,
}

impl Subscription {
    fn next_attempt(&self, event_id: Uuid) -> u32 {
        count_attempt(&mut lock(&self.attempts), event_id, Instant::now())
    }
}

#[derive(Debug, Default)]
struct Subscriptions(Mutex<Vec<Arc<Subscription>>>);

impl Subscriptions {
    /// Every subscription, running or not.
    fn all(&self) -> Vec<Arc<Subscription>> {
        lock(&self.0).clone()
    }

    /// Why publishing must wait now: no subscription, or one whose
    /// consumer is not running.
    fn not_ready(&self) -> Option<String> {
        let all = lock(&self.0);
        if all.is_empty() {
            return Some(NO_SUBSCRIBER.to_owned());
        }
        all.iter()
            .find(|s| s.sender.is_closed())
            .map(|s| not_running(&s.name))
    }
}

fn not_running(name: &str) -> String {
    format!("consumer {name} is subscribed to the in-process bus but not running")
}

/// The bus: subscribe consumers with [`subscribe`](InProcessBus::subscribe)
/// and give the relay its [`transport`](InProcessBus::transport). Cheap to
/// clone; the consumers' sources close when the bus and every transport
/// of it are dropped.
#[derive(Debug, Clone, Default)]
pub struct InProcessBus {
    subscriptions: Arc<Subscriptions>,
}

impl InProcessBus {
    /// A bus with no subscribers.
    pub fn new() -> InProcessBus {
        InProcessBus::default()
    }

    /// A source for the consumer `name` (pass it to
    /// [`Consumer::spawn`](crate::consumer::Consumer::spawn)). Events
    /// published from now on are delivered to it; a second source of the
    /// same name shares the queue.
    pub fn subscribe(&self, name: impl Into<String>) -> InProcessSource {
        let name = name.into();
        let mut all = lock(&self.subscriptions.0);
        let existing = all.iter().position(|s| s.name == name);
        if let Some(index) = existing
            && let Some(receiver) = all[index].receiver.upgrade()
        {
            return InProcessSource {
                receiver,
                attempts: Arc::clone(&all[index].attempts),
            };
        }
        let (sender, receiver) = mpsc::unbounded_channel();
        let receiver = Arc::new(tokio::sync::Mutex::new(receiver));
        // A consumer subscribing again keeps its delivery counts.
        let attempts = existing
            .map(|index| Arc::clone(&all[index].attempts))
            .unwrap_or_default();
        let subscription = Arc::new(Subscription {
            name,
            sender,
            receiver: Arc::downgrade(&receiver),
            attempts: Arc::clone(&attempts),
        });
        match existing {
            Some(index) => all[index] = subscription,
            None => all.push(subscription),
        }
        InProcessSource { receiver, attempts }
    }

    /// Removes the subscription of `name` for good: events are no longer
    /// held back for it. Returns whether there was one.
    pub fn unsubscribe(&self, name: &str) -> bool {
        let mut all = lock(&self.subscriptions.0);
        let before = all.len();
        all.retain(|s| s.name != name);
        all.len() < before
    }

    /// The relay's side of the bus.
    pub fn transport(&self) -> InProcessTransport {
        InProcessTransport {
            subscriptions: Arc::clone(&self.subscriptions),
        }
    }

    /// The names of the consumers subscribed (running or not).
    pub fn subscribers(&self) -> Vec<String> {
        self.subscriptions
            .all()
            .iter()
            .map(|s| s.name.clone())
            .collect()
    }
}

/// The relay's side of an [`InProcessBus`].
#[derive(Debug, Clone)]
pub struct InProcessTransport {
    subscriptions: Arc<Subscriptions>,
}

/// What the transport says when no consumer is there to take an event.
const NO_SUBSCRIBER: &str = "no consumer is subscribed to the in-process bus";

impl Transport for InProcessTransport {
    async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
        if let Some(reason) = self.subscriptions.not_ready() {
            return events
                .iter()
                .map(|_| Err(PublishFailure::retryable(reason.clone())))
                .collect();
        }
        let subscriptions = self.subscriptions.all();
        let mut results: Vec<Result<(), PublishFailure>> = vec![Ok(()); events.len()];
        let mut waiting = Vec::with_capacity(events.len() * subscriptions.len());
        for (index, envelope) in events.iter().enumerate() {
            for subscription in &subscriptions {
                let (settle, settled) = oneshot::channel();
                let handoff = Handoff {
                    event_id: envelope.id,
                    incoming: Incoming::from_envelope(
                        envelope,
                        subscription.next_attempt(envelope.id),
                    ),
                    settle,
                };
                if subscription.sender.send(handoff).is_err() {
                    results[index] =
                        Err(PublishFailure::retryable(not_running(&subscription.name)));
                } else {
                    waiting.push((index, subscription.name.clone(), settled));
                }
            }
        }
        let settled = futures_util::future::join_all(
            waiting
                .into_iter()
                .map(|(index, name, settled)| async move { (index, name, settled.await) }),
        )
        .await;
        for (index, name, settlement) in settled {
            let reason = match settlement {
                Ok(Settlement::Acked) => continue,
                Ok(Settlement::RetryLater) => {
                    format!("consumer {name} has not applied it (its handler asked for a retry)")
                }
                Err(_) => format!("consumer {name} stopped before it settled the message"),
            };
            if results[index].is_ok() {
                results[index] = Err(PublishFailure::retryable(reason));
            }
        }
        results
    }

    fn name(&self) -> &'static str {
        "in-process"
    }

    async fn health(&self) -> TransportHealth {
        match self.subscriptions.not_ready() {
            Some(reason) => TransportHealth::Down { reason },
            None => TransportHealth::Up,
        }
    }
}

/// A consumer's side of an [`InProcessBus`]: a [`MessageSource`]. It
/// closes (an empty batch) when the bus and its transports are gone.
#[derive(Debug)]
pub struct InProcessSource {
    receiver: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Handoff>>>,
    attempts: Attempts,
}

/// One message of an [`InProcessSource`]; settling it answers the relay's
/// publish. Dropped unsettled (the consumer stopped), it fails the publish.
#[derive(Debug)]
pub struct InProcessDelivery {
    incoming: Incoming,
    event_id: Uuid,
    settle: oneshot::Sender<Settlement>,
    attempts: Attempts,
}

impl Delivery for InProcessDelivery {
    fn incoming(&self) -> &Incoming {
        &self.incoming
    }

    async fn ack(self) -> Result<(), SourceError> {
        lock(&self.attempts).counts.remove(&self.event_id);
        // The relay may have stopped waiting (its publish timed out); it
        // publishes again and the inbox drops the duplicate.
        let _ = self.settle.send(Settlement::Acked);
        Ok(())
    }

    async fn retry_later(self, _delay: std::time::Duration) -> Result<(), SourceError> {
        // The relay's backoff decides when it comes again.
        let _ = self.settle.send(Settlement::RetryLater);
        Ok(())
    }
}

impl MessageSource for InProcessSource {
    type Delivery = InProcessDelivery;

    async fn next_batch(&mut self, max: usize) -> Result<Vec<InProcessDelivery>, SourceError> {
        let mut receiver = self.receiver.lock().await;
        let Some(first) = receiver.recv().await else {
            return Ok(Vec::new());
        };
        let mut handoffs = vec![first];
        while handoffs.len() < max {
            match receiver.try_recv() {
                Ok(next) => handoffs.push(next),
                Err(_) => break,
            }
        }
        // A handoff whose publish stopped waiting (it timed out) is
        // published again anyway: leave it out rather than let copies pile
        // up behind a slow consumer.
        handoffs.retain(|handoff| !handoff.settle.is_closed());
        Ok(handoffs
            .into_iter()
            .map(|handoff| InProcessDelivery {
                event_id: handoff.event_id,
                incoming: handoff.incoming,
                settle: handoff.settle,
                attempts: Arc::clone(&self.attempts),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_of_events_that_never_come_to_an_ack_are_forgotten_past_the_limit() {
        let start = Instant::now();
        let mut attempts = AttemptCounts::default();
        let given_up = Uuid::now_v7();
        assert_eq!(count_attempt(&mut attempts, given_up, start), 1);
        assert_eq!(count_attempt(&mut attempts, given_up, start), 2);
        // Many others, recent: below the limit nothing is forgotten.
        let later = start + FORGET_AFTER + Duration::from_secs(1);
        for _ in 1..ATTEMPTS_KEPT {
            count_attempt(&mut attempts, Uuid::now_v7(), later);
        }
        assert_eq!(attempts.counts.len(), ATTEMPTS_KEPT);
        // The next one passes the limit: the stale count goes, the recent
        // ones stay.
        let recent = Uuid::now_v7();
        count_attempt(&mut attempts, recent, later);
        assert!(!attempts.counts.contains_key(&given_up));
        assert_eq!(attempts.counts.len(), ATTEMPTS_KEPT);
        assert_eq!(count_attempt(&mut attempts, recent, later), 2);
        // The sweep left 9,999 recent counts: the next one waits until
        // there are twice as many.
        assert_eq!(attempts.sweep_at, 2 * (ATTEMPTS_KEPT - 1));
    }
}
