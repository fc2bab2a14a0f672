//! A message source that misbehaves the way brokers and networks may:
//! it delivers some messages twice and hands each batch out in a shuffled
//! order, from a seed. Wrapped around a real source in the fault suite's
//! consumers, so the inbox and the ordering policies meet duplicates and
//! reordering they did not arrange themselves.

use std::time::Duration;

use outbox_core::consumer::{Delivery, Incoming, MessageSource, SourceError};

/// Settings of a [`ChaosSource`].
#[derive(Debug, Clone, Copy)]
pub struct Chaos {
    /// Seed of the choices.
    pub seed: u64,
    /// Out of 1,000 messages, how many are delivered a second time.
    pub duplicates_per_mille: u64,
    /// Whether each batch is shuffled.
    pub shuffle: bool,
}

impl Chaos {
    /// From `OUTBOX_CHAOS` (`<seed>:<duplicates per mille>:<shuffle 0|1>`),
    /// if set.
    pub fn from_env() -> Option<Chaos> {
        let text = std::env::var("OUTBOX_CHAOS").ok()?;
        let parts: Vec<&str> = text.split(':').collect();
        let [seed, duplicates, shuffle] = parts.as_slice() else {
            panic!("OUTBOX_CHAOS={text:?}: use <seed>:<duplicates per mille>:<shuffle 0|1>");
        };
        Some(Chaos {
            seed: seed.parse().expect("OUTBOX_CHAOS seed"),
            duplicates_per_mille: duplicates.parse().expect("OUTBOX_CHAOS duplicates"),
            shuffle: *shuffle == "1",
        })
    }
}

/// Duplicates and reorders what `inner` delivers.
pub struct ChaosSource<S> {
    inner: S,
    chaos: Chaos,
    state: u64,
}

impl<S> ChaosSource<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, chaos: Chaos) -> ChaosSource<S> {
        ChaosSource {
            inner,
            chaos,
            state: chaos.seed,
        }
    }

    /// SplitMix64.
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A real delivery, or a copy of one whose settlement is the real one's.
pub enum ChaosDelivery<D> {
    /// The broker's delivery.
    Real(D),
    /// A second delivery of the same message: acknowledging it does
    /// nothing (the real one settles the message with the broker).
    Copy(Incoming),
}

impl<D: Delivery> Delivery for ChaosDelivery<D> {
    fn incoming(&self) -> &Incoming {
        match self {
            ChaosDelivery::Real(delivery) => delivery.incoming(),
            ChaosDelivery::Copy(incoming) => incoming,
        }
    }

    async fn ack(self) -> Result<(), SourceError> {
        match self {
            ChaosDelivery::Real(delivery) => delivery.ack().await,
            ChaosDelivery::Copy(_) => Ok(()),
        }
    }

    async fn retry_later(self, delay: Duration) -> Result<(), SourceError> {
        match self {
            ChaosDelivery::Real(delivery) => delivery.retry_later(delay).await,
            ChaosDelivery::Copy(_) => Ok(()),
        }
    }
}

impl<S: MessageSource> MessageSource for ChaosSource<S> {
    type Delivery = ChaosDelivery<S::Delivery>;

    async fn next_batch(&mut self, max: usize) -> Result<Vec<Self::Delivery>, SourceError> {
        let batch = self.inner.next_batch(max).await?;
        let mut out = Vec::with_capacity(batch.len() + 1);
        for delivery in batch {
            if self.next() % 1_000 < self.chaos.duplicates_per_mille {
                out.push(ChaosDelivery::Copy(delivery.incoming().clone()));
            }
            out.push(ChaosDelivery::Real(delivery));
        }
        if self.chaos.shuffle {
            for i in (1..out.len()).rev() {
                let j = (self.next() % (i as u64 + 1)) as usize;
                out.swap(i, j);
            }
        }
        Ok(out)
    }
}
