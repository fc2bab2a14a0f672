//! Reading what arrived at a JetStream stream, in stream order.

use std::time::Duration;

use async_nats::jetstream::{
    self,
    consumer::{AckPolicy, DeliverPolicy, pull},
};
use futures_util::StreamExt;

/// One stored message.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    /// The subject it was published to.
    pub subject: String,
    /// Header name → value.
    pub headers: Vec<(String, String)>,
    /// The payload.
    pub payload: Vec<u8>,
}

impl StoredMessage {
    /// The value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every message of `stream`, in stream order.
pub async fn read_all(url: &str, stream: &str) -> Vec<StoredMessage> {
    let client = async_nats::connect(url)
        .await
        .unwrap_or_else(|e| panic!("NATS at {url} is not reachable: {e}"));
    let context = jetstream::new(client);
    let stream = context.get_stream(stream).await.expect("stream exists");
    let consumer = stream
        .create_consumer(pull::Config {
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .expect("ephemeral consumer");
    let mut all = Vec::new();
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .messages()
            .await
            .expect("fetch");
        let mut got = 0;
        while let Some(message) = batch.next().await {
            let message = message.expect("message");
            got += 1;
            let headers = message
                .headers
                .as_ref()
                .map(|h| {
                    h.iter()
                        .flat_map(|(name, values)| {
                            values
                                .iter()
                                .map(move |v| (name.to_string(), v.as_str().to_owned()))
                        })
                        .collect()
                })
                .unwrap_or_default();
            all.push(StoredMessage {
                subject: message.subject.to_string(),
                headers,
                payload: message.payload.to_vec(),
            });
        }
        if got == 0 {
            break;
        }
    }
    all
}

/// Number of messages in `stream` (zero while it does not exist yet).
pub async fn count(url: &str, stream: &str) -> u64 {
    let client = async_nats::connect(url).await.expect("NATS reachable");
    let context = jetstream::new(client);
    match context.get_stream(stream).await {
        Ok(mut stream) => stream.info().await.expect("stream info").state.messages,
        Err(error) if error.to_string().contains("stream not found") => 0,
        Err(error) => panic!("cannot read stream {stream}: {error}"),
    }
}
