//! Transports for tests that are about the relay's database side: one that
//! records what it got (in order) and can refuse chosen events, and a
//! wrapper that counts publish calls of a real transport.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use outbox_core::Envelope;
use outbox_core::transport::{PublishFailure, Transport};
use std::sync::{Mutex, MutexGuard};

/// Locks ignoring poisoning: a panicking test thread must not hide the
/// recorded events from the assertion that follows.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

type Rule = Box<dyn Fn(&Envelope) -> Option<PublishFailure> + Send + Sync>;

/// Records every acknowledged envelope in publish order; refuses the
/// envelopes a rule picks.
#[derive(Clone)]
pub struct RecordingTransport {
    inner: Arc<Recording>,
}

struct Recording {
    published: Mutex<Vec<Envelope>>,
    attempts: AtomicU64,
    rule: Option<Rule>,
}

impl RecordingTransport {
    /// Accepts everything.
    pub fn new() -> Self {
        RecordingTransport {
            inner: Arc::new(Recording {
                published: Mutex::new(Vec::new()),
                attempts: AtomicU64::new(0),
                rule: None,
            }),
        }
    }

    /// Refuses the envelopes for which `rule` returns a failure.
    pub fn failing(
        rule: impl Fn(&Envelope) -> Option<PublishFailure> + Send + Sync + 'static,
    ) -> Self {
        RecordingTransport {
            inner: Arc::new(Recording {
                published: Mutex::new(Vec::new()),
                attempts: AtomicU64::new(0),
                rule: Some(Box::new(rule)),
            }),
        }
    }

    /// Everything acknowledged so far, in order.
    pub fn published(&self) -> Vec<Envelope> {
        lock(&self.inner.published).clone()
    }

    /// Number acknowledged so far.
    pub fn published_count(&self) -> usize {
        lock(&self.inner.published).len()
    }

    /// Publish attempts so far (acknowledged or not).
    pub fn attempts(&self) -> u64 {
        self.inner.attempts.load(Ordering::Relaxed)
    }
}

impl Default for RecordingTransport {
    fn default() -> Self {
        RecordingTransport::new()
    }
}

impl Transport for RecordingTransport {
    async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
        self.inner
            .attempts
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        let mut published = lock(&self.inner.published);
        events
            .iter()
            .map(|envelope| {
                if let Some(failure) = self.inner.rule.as_ref().and_then(|rule| rule(envelope)) {
                    return Err(failure);
                }
                published.push((*envelope).clone());
                Ok(())
            })
            .collect()
    }

    fn name(&self) -> &'static str {
        "recording"
    }
}

/// Acknowledges everything without keeping anything: the relay's own cost.
#[derive(Clone, Default)]
pub struct DiscardTransport {
    count: Arc<AtomicU64>,
}

impl DiscardTransport {
    /// Events acknowledged so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl Transport for DiscardTransport {
    async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
        self.count.fetch_add(events.len() as u64, Ordering::Relaxed);
        vec![Ok(()); events.len()]
    }

    fn name(&self) -> &'static str {
        "discard"
    }
}

/// Counts the events a real transport was asked to publish.
pub struct Counting<T> {
    inner: T,
    count: Arc<AtomicU64>,
}

impl<T> Counting<T> {
    /// Wraps `inner`; `count` grows by every event passed to it.
    pub fn new(inner: T, count: Arc<AtomicU64>) -> Self {
        Counting { inner, count }
    }
}

impl<T: Transport> Transport for Counting<T> {
    async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
        self.count.fetch_add(events.len() as u64, Ordering::Relaxed);
        self.inner.publish(events).await
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

/// Appends one line per event it is asked to publish to a file, before
/// acknowledging: `<unix nanos> <pid> <aggregate_id> <version> <token>`,
/// the token being the publishing worker's fencing token
/// ([`outbox_core::relay::fencing_token`], `-` without one). Several
/// relay processes writing their own files give a merged timeline of what
/// reached "the broker", by whom, under which ownership and when. Waits `delay` per call (a
/// broker's round trip), so batches take time.
pub struct LogTransport {
    file: Mutex<std::fs::File>,
    delay: std::time::Duration,
}

impl LogTransport {
    /// Appends to `path` (created if missing).
    pub fn create(path: &std::path::Path, delay: std::time::Duration) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(LogTransport {
            file: Mutex::new(file),
            delay,
        })
    }
}

impl Transport for LogTransport {
    async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
        use std::io::Write;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_nanos();
        let pid = std::process::id();
        let token = outbox_core::relay::fencing_token()
            .map_or_else(|| "-".to_owned(), |token| token.to_string());
        let mut lines = String::new();
        for envelope in events {
            lines.push_str(&format!(
                "{now} {pid} {} {} {token}\n",
                envelope.aggregate_id, envelope.aggregate_version
            ));
        }
        if let Err(error) = lock(&self.file).write_all(lines.as_bytes()) {
            return vec![Err(PublishFailure::retryable(format!("log: {error}"))); events.len()];
        }
        tokio::time::sleep(self.delay).await;
        vec![Ok(()); events.len()]
    }

    fn name(&self) -> &'static str {
        "log"
    }
}

/// Each aggregate's versions in the order they were published.
pub fn versions_by_aggregate(
    published: &[Envelope],
) -> std::collections::BTreeMap<String, Vec<i64>> {
    let mut versions: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for envelope in published {
        versions
            .entry(envelope.aggregate_id.clone())
            .or_default()
            .push(envelope.aggregate_version);
    }
    versions
}
