//! RabbitMQ in the conformance suite: the shared server at `AMQP_URL`,
//! reached through a TCP proxy the test owns (the broker "goes down" for
//! this test's clients only), with an exchange of the test's own.

use lapin::options::{
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use outbox_postgres::PgConsumer;
use outbox_rabbitmq::{RabbitConfig, RabbitSource, RabbitSourceConfig, RabbitTransport};

use super::{Broker, unique_name};
use crate::proxy::TcpProxy;

/// The server URL of the tests (`AMQP_URL`, default the local guest login).
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| RabbitConfig::default().url)
}

/// One test's view of the shared RabbitMQ.
pub struct RabbitBroker {
    proxy: TcpProxy,
    exchange: String,
    queues: std::sync::Mutex<Vec<String>>,
}

impl RabbitBroker {
    /// A proxy to the server and a fresh exchange name. Fails loudly when
    /// the server does not answer.
    pub async fn start() -> RabbitBroker {
        let url = amqp_url();
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| {
                panic!("RabbitMQ at {url} does not answer ({e}); run scripts/services.sh")
            });
        drop(connection);
        let target = host_port(&url);
        RabbitBroker {
            proxy: TcpProxy::start(&target).await,
            exchange: unique_name("conformance"),
            queues: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn config(&self) -> RabbitConfig {
        let url = amqp_url();
        let target = host_port(&url);
        RabbitConfig {
            url: url.replacen(&target, &self.proxy.address(), 1),
            exchange: self.exchange.clone(),
            max_message_bytes: 1024 * 1024,
            connect_timeout: std::time::Duration::from_secs(2),
            confirm_timeout: std::time::Duration::from_secs(5),
            ..RabbitConfig::default()
        }
    }

    /// Deletes the test's queues and exchange.
    pub async fn clean_up(self) {
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ for clean-up");
        let channel = connection.create_channel().await.expect("channel");
        let queues = self.queues.lock().unwrap().clone();
        for queue in queues {
            let _ = channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
    }
}

impl RabbitBroker {
    /// Declares `<exchange>.sink` bound with `#` to the test's exchange
    /// (which the transport declared), removed again by `clean_up`.
    async fn bind_sink(&self) {
        let queue = format!("{}.sink", self.exchange);
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ for the sink queue");
        let channel = connection.create_channel().await.expect("channel");
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare the sink queue");
        channel
            .queue_bind(
                queue.as_str().into(),
                self.exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the sink queue");
        let mut queues = self.queues.lock().unwrap();
        if !queues.contains(&queue) {
            queues.push(queue);
        }
    }
}

/// `host:port` of an AMQP URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

impl Broker for RabbitBroker {
    type Transport = RabbitTransport;
    type Source = RabbitSource;

    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    /// A transport with the crate's defaults (`mandatory` included), and
    /// a queue of the test's own bound to every routing key, so a publish
    /// with no consumer yet is routed rather than returned.
    async fn transport(&self) -> RabbitTransport {
        let transport = RabbitTransport::connect(self.config())
            .await
            .expect("RabbitMQ transport");
        self.bind_sink().await;
        transport
    }

    async fn source(&self, consumer: &PgConsumer) -> RabbitSource {
        let config =
            RabbitSourceConfig::for_consumer(consumer, self.config()).expect("source config");
        self.queues.lock().unwrap().push(config.queue.clone());
        RabbitSource::connect(config)
            .await
            .expect("RabbitMQ source")
    }

    async fn stop(&mut self) {
        self.proxy.down();
    }

    async fn start(&mut self) {
        self.proxy.up();
    }
}
