//! Where messages come from: a [`MessageSource`] hands out deliveries, and
//! each [`Delivery`] is acknowledged (after the consumer's commit) or sent
//! back for a later retry. The broker crates implement it (`outbox-nats`,
//! `outbox-kafka`, `outbox-rabbitmq`); [`channel`] feeds a consumer from
//! any stream of envelopes (tests, a bridge, a replay).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::incoming::Incoming;
use crate::envelope::Envelope;

/// A source failed to deliver or to settle a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message source: {0}")]
pub struct SourceError(pub String);

/// One delivered message and its settlement.
pub trait Delivery: Send + 'static {
    /// The message.
    fn incoming(&self) -> &Incoming;
    /// Acknowledges it: the source must not deliver it again.
    fn ack(self) -> impl Future<Output = Result<(), SourceError>> + Send;
    /// Asks for a new delivery after `delay`.
    fn retry_later(self, delay: Duration) -> impl Future<Output = Result<(), SourceError>> + Send;
}

/// A stream of deliveries.
pub trait MessageSource: Send + 'static {
    /// The delivery type.
    type Delivery: Delivery;
    /// Waits for at least one message and returns up to `max` that are
    /// ready; an empty batch means the source is closed.
    fn next_batch(
        &mut self,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Self::Delivery>, SourceError>> + Send;
}

/// Counts of what an in-memory source settled.
#[derive(Debug, Default)]
pub struct ChannelStats {
    acked: AtomicU64,
    retried: AtomicU64,
}

impl ChannelStats {
    /// Messages acknowledged.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Messages sent back for a retry.
    pub fn retried(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }
}

/// What the halves of an in-memory source share.
#[derive(Debug, Default)]
struct Shared {
    /// Live [`ChannelSender`]s.
    senders: AtomicUsize,
    /// Retries waiting for their delay.
    pending_retries: AtomicUsize,
    stats: ChannelStats,
}

/// The sending half of an in-memory source.
#[derive(Debug)]
pub struct ChannelSender {
    sender: mpsc::UnboundedSender<Incoming>,
    shared: Arc<Shared>,
}

impl Clone for ChannelSender {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::SeqCst);
        ChannelSender {
            sender: self.sender.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for ChannelSender {
    fn drop(&mut self) {
        self.shared.senders.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ChannelSender {
    /// Delivers `envelope` (first attempt).
    pub fn send(&self, envelope: &Envelope) -> Result<(), SourceError> {
        self.send_incoming(Incoming::from_envelope(envelope, 1))
    }

    /// Delivers a raw message.
    pub fn send_incoming(&self, incoming: Incoming) -> Result<(), SourceError> {
        self.sender
            .send(incoming)
            .map_err(|_| SourceError("the channel source is gone".into()))
    }
}

/// An in-memory source: what is sent is delivered; a retry is delivered
/// again after its delay with the next attempt number. It closes (an empty
/// batch) once every sender is dropped, the queue is empty and no retry is
/// waiting, so a retry is never lost to a closed channel.
#[derive(Debug)]
pub struct ChannelSource {
    receiver: mpsc::UnboundedReceiver<Incoming>,
    /// Kept for retries, so the queue outlives the senders.
    requeue: mpsc::UnboundedSender<Incoming>,
    shared: Arc<Shared>,
}

/// Creates an in-memory source and its sender.
pub fn channel() -> (ChannelSender, ChannelSource) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared::default());
    shared.senders.store(1, Ordering::SeqCst);
    let source = ChannelSource {
        receiver,
        requeue: sender.clone(),
        shared: Arc::clone(&shared),
    };
    (ChannelSender { sender, shared }, source)
}

impl ChannelSource {
    /// What this source settled so far.
    pub fn stats(&self) -> ChannelStatsHandle {
        ChannelStatsHandle(Arc::clone(&self.shared))
    }

    fn closed(&self) -> bool {
        self.shared.senders.load(Ordering::SeqCst) == 0
            && self.shared.pending_retries.load(Ordering::SeqCst) == 0
    }
}

/// A view of a channel source's [`ChannelStats`] that outlives the source.
#[derive(Debug, Clone)]
pub struct ChannelStatsHandle(Arc<Shared>);

impl std::ops::Deref for ChannelStatsHandle {
    type Target = ChannelStats;

    fn deref(&self) -> &ChannelStats {
        &self.0.stats
    }
}

/// A message of a [`ChannelSource`].
#[derive(Debug)]
pub struct ChannelDelivery {
    incoming: Incoming,
    requeue: mpsc::UnboundedSender<Incoming>,
    shared: Arc<Shared>,
}

impl Delivery for ChannelDelivery {
    fn incoming(&self) -> &Incoming {
        &self.incoming
    }

    async fn ack(self) -> Result<(), SourceError> {
        self.shared.stats.acked.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn retry_later(self, delay: Duration) -> Result<(), SourceError> {
        self.shared.stats.retried.fetch_add(1, Ordering::Relaxed);
        self.shared.pending_retries.fetch_add(1, Ordering::SeqCst);
        let again = Incoming::new(
            self.incoming.attributes().to_vec(),
            self.incoming.payload().to_vec(),
            self.incoming.attempt() + 1,
        );
        let (requeue, shared) = (self.requeue, self.shared);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // The source may be gone (the consumer stopped); then so is the
            // point of delivering.
            let _ = requeue.send(again);
            shared.pending_retries.fetch_sub(1, Ordering::SeqCst);
        });
        Ok(())
    }
}

impl MessageSource for ChannelSource {
    type Delivery = ChannelDelivery;

    async fn next_batch(&mut self, max: usize) -> Result<Vec<ChannelDelivery>, SourceError> {
        let first = loop {
            if let Ok(incoming) = self.receiver.try_recv() {
                break incoming;
            }
            if self.closed() {
                // A retry may have been queued between the two checks.
                match self.receiver.try_recv() {
                    Ok(incoming) => break incoming,
                    Err(_) => return Ok(Vec::new()),
                }
            }
            // Wake up for a message, or now and then to see whether the
            // source has closed.
            if let Ok(Some(incoming)) =
                tokio::time::timeout(Duration::from_millis(50), self.receiver.recv()).await
            {
                break incoming;
            }
        };
        let mut batch = vec![first];
        while batch.len() < max {
            match self.receiver.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        Ok(batch
            .into_iter()
            .map(|incoming| ChannelDelivery {
                incoming,
                requeue: self.requeue.clone(),
                shared: Arc::clone(&self.shared),
            })
            .collect())
    }
}
