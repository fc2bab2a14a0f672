//! NATS JetStream in the conformance suite: a private nats-server (default
//! `max_payload` 1 MiB), stopped and restarted with its store kept.

use outbox_postgres::PgConsumer;
use std::time::Duration;

use outbox_nats::{JetStreamSource, JetStreamSourceConfig, NatsConfig, NatsTransport};

use super::Broker;
use crate::NatsServer;

/// A private nats-server for one test.
pub struct NatsBroker {
    server: NatsServer,
}

impl NatsBroker {
    /// Starts the server.
    pub fn start() -> NatsBroker {
        NatsBroker {
            server: NatsServer::start(),
        }
    }

    fn config(&self) -> NatsConfig {
        NatsConfig {
            url: self.server.url(),
            ack_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            ..NatsConfig::default()
        }
    }
}

impl Broker for NatsBroker {
    type Transport = NatsTransport;
    type Source = JetStreamSource;

    fn name(&self) -> &'static str {
        "nats"
    }

    async fn transport(&self) -> NatsTransport {
        NatsTransport::connect(self.config())
            .await
            .expect("NATS transport")
    }

    async fn source(&self, consumer: &PgConsumer) -> JetStreamSource {
        // The stream must exist before a durable consumer can be made.
        drop(self.transport().await);
        let config = JetStreamSourceConfig {
            ack_wait: Duration::from_secs(2),
            ..JetStreamSourceConfig::for_consumer(consumer, self.config()).expect("source config")
        };
        JetStreamSource::connect(config)
            .await
            .expect("JetStream source")
    }

    async fn stop(&mut self) {
        self.server.stop();
    }

    async fn start(&mut self) {
        self.server.resume();
    }
}
