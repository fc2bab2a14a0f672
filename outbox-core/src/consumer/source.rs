//! Where messages come from: a [`MessageSource`] hands out deliveries, and
//! each [`Delivery`] is acknowledged (after the consumer's commit) or sent
//! back for a later retry. JetStream implements it in
//! [`crate::transport::nats`]; [`channel`] feeds a consumer from any stream
//! of envelopes (tests, other transports, a replay).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, mpsc};

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

/// The sending half of an in-memory source.
#[derive(Debug, Clone)]
pub struct ChannelSender {
    sender: mpsc::UnboundedSender<Incoming>,
}

impl ChannelSender {
    /// Delivers `envelope` (first attempt). Fails when the source is gone.
    pub fn send(&self, envelope: &Envelope) -> Result<(), SourceError> {
        self.send_incoming(Incoming::from_envelope(envelope, 1))
    }

    /// Delivers a raw message.
    pub fn send_incoming(&self, incoming: Incoming) -> Result<(), SourceError> {
        self.sender
            .send(incoming)
            .map_err(|_| SourceError("the channel source is closed".into()))
    }
}

/// An in-memory source: what is sent is delivered; a retry is delivered
/// again after its delay with the next attempt number. Closed when every
/// sender and every pending retry is gone.
#[derive(Debug)]
pub struct ChannelSource {
    receiver: Arc<Mutex<mpsc::UnboundedReceiver<Incoming>>>,
    sender: mpsc::WeakUnboundedSender<Incoming>,
    stats: Arc<ChannelStats>,
}

/// Creates an in-memory source and its sender.
pub fn channel() -> (ChannelSender, ChannelSource) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let source = ChannelSource {
        receiver: Arc::new(Mutex::new(receiver)),
        sender: sender.downgrade(),
        stats: Arc::default(),
    };
    (ChannelSender { sender }, source)
}

impl ChannelSource {
    /// What this source settled so far.
    pub fn stats(&self) -> Arc<ChannelStats> {
        Arc::clone(&self.stats)
    }
}

/// A message of a [`ChannelSource`].
#[derive(Debug)]
pub struct ChannelDelivery {
    incoming: Incoming,
    sender: Option<mpsc::UnboundedSender<Incoming>>,
    stats: Arc<ChannelStats>,
}

impl Delivery for ChannelDelivery {
    fn incoming(&self) -> &Incoming {
        &self.incoming
    }

    async fn ack(self) -> Result<(), SourceError> {
        self.stats.acked.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn retry_later(self, delay: Duration) -> Result<(), SourceError> {
        self.stats.retried.fetch_add(1, Ordering::Relaxed);
        let Some(sender) = self.sender else {
            return Err(SourceError("the channel source is closed".into()));
        };
        let incoming = self.incoming;
        let again = Incoming::new(
            incoming.attributes().to_vec(),
            incoming.payload().to_vec(),
            incoming.attempt() + 1,
        );
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = sender.send(again);
        });
        Ok(())
    }
}

impl MessageSource for ChannelSource {
    type Delivery = ChannelDelivery;

    async fn next_batch(&mut self, max: usize) -> Result<Vec<ChannelDelivery>, SourceError> {
        let mut receiver = self.receiver.lock().await;
        let mut batch = Vec::new();
        match receiver.recv().await {
            Some(first) => batch.push(first),
            None => return Ok(Vec::new()),
        }
        while batch.len() < max {
            match receiver.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        Ok(batch
            .into_iter()
            .map(|incoming| ChannelDelivery {
                incoming,
                sender: self.sender.upgrade(),
                stats: Arc::clone(&self.stats),
            })
            .collect())
    }
}
