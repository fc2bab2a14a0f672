//! Opening a connection and a channel, and declaring the exchange.
//!
//! lapin does not reconnect by itself here (its automatic recovery does not
//! bring back a channel the broker closed, and replays declarations we do
//! ourselves); both sides open a new connection when theirs is gone, at
//! most once per [`RECONNECT_PAUSE`].

use std::time::Duration;

use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::config::{RabbitConfig, RabbitError, redacted_url};

/// The shortest time between two connection attempts.
pub(crate) const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// A connection with one channel; the connection lives as long as the
/// channel is kept.
pub(crate) struct Link {
    pub(crate) connection: Connection,
    pub(crate) channel: Channel,
}

impl Link {
    /// Whether both the connection and the channel are usable.
    pub(crate) fn is_open(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }
}

/// Connects, opens a channel and declares (or checks) the exchange, all
/// within twice `connect_timeout` (a broker that takes the connection but
/// never answers does not hold up the caller).
pub(crate) async fn open(config: &RabbitConfig) -> Result<Link, RabbitError> {
    let limit = config.connect_timeout.saturating_mul(2);
    tokio::time::timeout(limit, open_unbounded(config))
        .await
        .unwrap_or_else(|_| {
            Err(RabbitError::Connect {
                url: redacted_url(&config.url),
                reason: format!("the set-up did not finish within {limit:?}"),
            })
        })
}

async fn open_unbounded(config: &RabbitConfig) -> Result<Link, RabbitError> {
    let connect_error = |reason: String| RabbitError::Connect {
        url: redacted_url(&config.url),
        reason,
    };
    let properties = ConnectionProperties::default().with_connection_name("outbox".into());
    let connection = tokio::time::timeout(
        config.connect_timeout,
        Connection::connect(&config.url, properties),
    )
    .await
    .map_err(|_| connect_error(format!("no answer within {:?}", config.connect_timeout)))?
    .map_err(|e| connect_error(e.to_string()))?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| connect_error(format!("cannot open a channel: {e}")))?;
    channel
        .exchange_declare(
            config.exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                passive: !config.declare,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| RabbitError::Topology {
            what: format!("exchange {}", config.exchange),
            reason: if config.declare {
                format!("cannot declare it (durable topic): {e}")
            } else {
                format!("it does not exist or cannot be checked (declare is off): {e}")
            },
        })?;
    Ok(Link {
        connection,
        channel,
    })
}

/// Whether a start-up error is about the settings or the broker's
/// topology (no retry helps) rather than a broker that did not answer.
pub(crate) fn is_misconfigured(error: &RabbitError) -> bool {
    match error {
        RabbitError::Config(_) | RabbitError::Topology { .. } => true,
        RabbitError::Connect { reason, .. } => {
            reason.contains("ACCESS_REFUSED") || reason.contains("access refused")
        }
    }
}
