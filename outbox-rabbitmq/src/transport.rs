//! The publishing side: confirmed, persistent messages on a topic exchange.

use std::time::Instant;

use futures_util::future::join_all;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel};
use lapin::{Confirmation, PublisherConfirm};
use outbox_core::Envelope;
use outbox_core::transport::{PublishFailure, Transport, TransportHealth};
use tokio::sync::Mutex;

use crate::config::{RabbitConfig, RabbitError, RoutingKeyTemplate, redacted_url};
use crate::connection::{Link, RECONNECT_PAUSE, is_misconfigured, open};
use crate::headers;

/// Publishes envelopes to RabbitMQ with publisher confirms.
///
/// Starts while the broker is down (reports itself down until a
/// connection, a confirm-mode channel and the exchange are in place; the
/// relay keeps events pending meanwhile) and opens a new connection when
/// the broker closed the old one.
pub struct RabbitTransport {
    config: RabbitConfig,
    template: RoutingKeyTemplate,
    link: Mutex<LinkState>,
}

struct LinkState {
    link: Option<Link>,
    last_attempt: Option<Instant>,
    last_error: Option<String>,
}

impl RabbitTransport {
    /// Validates the settings and connects. A broker that does not answer
    /// is not an error (the transport starts down and keeps trying); a
    /// refused login, or an exchange that is missing while `declare` is off
    /// or declared with another type, is.
    pub async fn connect(config: RabbitConfig) -> Result<RabbitTransport, RabbitError> {
        let template = config.validate()?;
        let transport = RabbitTransport {
            config,
            template,
            link: Mutex::new(LinkState {
                link: None,
                last_attempt: None,
                last_error: None,
            }),
        };
        let mut state = transport.link.lock().await;
        match transport.open_confirming().await {
            Ok(link) => state.link = Some(link),
            Err(error) if is_misconfigured(&error) => return Err(error),
            Err(error) => {
                tracing::warn!(
                    url = %redacted_url(&transport.config.url),
                    %error,
                    "RabbitMQ is not available; the transport reports itself down and events stay pending until it is"
                );
                state.last_error = Some(error.to_string());
            }
        }
        state.last_attempt = Some(Instant::now());
        drop(state);
        Ok(transport)
    }

    /// The routing-key template in use.
    pub fn template(&self) -> &RoutingKeyTemplate {
        &self.template
    }

    async fn open_confirming(&self) -> Result<Link, RabbitError> {
        let link = open(&self.config).await?;
        let confirm_mode = link.channel.confirm_select(ConfirmSelectOptions::default());
        let reason = match tokio::time::timeout(self.config.connect_timeout, confirm_mode).await {
            Ok(Ok(())) => return Ok(link),
            Ok(Err(error)) => format!("cannot enable publisher confirms: {error}"),
            Err(_) => format!(
                "no answer to confirm.select within {:?}",
                self.config.connect_timeout
            ),
        };
        Err(RabbitError::Connect {
            url: redacted_url(&self.config.url),
            reason,
        })
    }

    /// The open channel, reconnecting when the last attempt is old enough.
    async fn channel(&self) -> Result<Channel, String> {
        let mut state = self.link.lock().await;
        if let Some(link) = &state.link
            && link.is_open()
        {
            return Ok(link.channel.clone());
        }
        state.link = None;
        // A link that broke is replaced at once; a failed attempt waits for
        // the pause before the next.
        if state.last_error.is_some()
            && state
                .last_attempt
                .is_some_and(|at| at.elapsed() < RECONNECT_PAUSE)
        {
            return Err(state
                .last_error
                .clone()
                .unwrap_or_else(|| "the connection to RabbitMQ was closed".into()));
        }
        state.last_attempt = Some(Instant::now());
        match self.open_confirming().await {
            Ok(link) => {
                let channel = link.channel.clone();
                state.link = Some(link);
                state.last_error = None;
                tracing::info!(url = %redacted_url(&self.config.url), "connected to RabbitMQ");
                Ok(channel)
            }
            Err(error) => {
                let reason = error.to_string();
                state.last_error = Some(reason.clone());
                Err(reason)
            }
        }
    }

    /// Whether the broker blocked the open connection.
    async fn blocked(&self) -> bool {
        let state = self.link.lock().await;
        state
            .link
            .as_ref()
            .is_some_and(|link| link.connection.status().blocked())
    }

    fn properties(&self, envelope: &Envelope) -> BasicProperties {
        let attributes = envelope.cloudevents_attributes_with(
            &self.config.source,
            self.config.dataschema_base.as_deref(),
        );
        BasicProperties::default()
            .with_message_id(envelope.id.to_string().into())
            .with_type(envelope.event_type.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_timestamp(envelope.occurred_at.timestamp().max(0) as u64)
            .with_app_id(short(&self.config.source).into())
            .with_headers(headers::write(attributes))
    }

    async fn send(
        &self,
        channel: &Channel,
        envelope: &Envelope,
    ) -> Result<PublisherConfirm, PublishFailure> {
        let routing_key = self
            .template
            .render(envelope)
            .map_err(PublishFailure::permanent)?;
        let payload = envelope.payload.get().as_bytes();
        if payload.len() > self.config.max_message_bytes {
            return Err(PublishFailure::permanent(format!(
                "the payload is {} bytes, over max_message_bytes ({}); RabbitMQ would refuse it",
                payload.len(),
                self.config.max_message_bytes
            )));
        }
        channel
            .basic_publish(
                self.config.exchange.as_str().into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: self.config.mandatory,
                    ..BasicPublishOptions::default()
                },
                payload,
                self.properties(envelope),
            )
            .await
            .map_err(|e| classify(&e, payload.len()))
    }
}

/// A short string of at most 255 bytes, cut at a character boundary.
fn short(text: &str) -> &str {
    let mut end = text.len().min(255);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Retryable or not. A message over the broker's `max_message_size` makes
/// it close the channel (406), and lapin fails every unconfirmed publish
/// of that channel with the same error: only the message of the size the
/// broker names is refused for good, the others are retryable.
fn classify(error: &lapin::Error, payload_len: usize) -> PublishFailure {
    let text = error.to_string();
    match refused_size(&text) {
        Some(size) if size == payload_len => {
            PublishFailure::permanent(format!("RabbitMQ refused the message: {text}"))
        }
        Some(_) => PublishFailure::retryable(format!(
            "the broker closed the channel for another, too large message ({text})"
        )),
        None => PublishFailure::retryable(format!("RabbitMQ publish failed: {text}")),
    }
}

/// The size in "message size 1234 is larger than configured max size ...".
fn refused_size(text: &str) -> Option<usize> {
    let rest = &text[text.find("message size ")? + "message size ".len()..];
    if !rest.contains("larger than configured max size") {
        return None;
    }
    rest.split_whitespace().next()?.parse().ok()
}

impl Transport for RabbitTransport {
    async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
        let channel = match self.channel().await {
            Ok(channel) => channel,
            Err(reason) => {
                let failure =
                    PublishFailure::retryable(format!("RabbitMQ is not connected: {reason}"));
                return events.iter().map(|_| Err(failure.clone())).collect();
            }
        };
        // A connection the broker blocked (a memory or disk alarm) takes no
        // writes until the alarm clears: bound the writes too.
        let deadline = self.config.confirm_timeout;
        let mut pending = Vec::with_capacity(events.len());
        for envelope in events {
            let sent = tokio::time::timeout(deadline, self.send(&channel, envelope))
                .await
                .unwrap_or_else(|_| {
                    Err(PublishFailure::retryable(format!(
                        "RabbitMQ took no message within {deadline:?} (a blocked connection: resource alarm?)"
                    )))
                });
            pending.push((sent, envelope.payload.get().len()));
        }
        // Every message is written; wait for all confirms at once so one
        // timeout bounds the whole batch.
        join_all(pending.into_iter().map(|(sent, payload_len)| async move {
            let confirm = sent?;
            match tokio::time::timeout(deadline, confirm).await {
                Ok(Ok(Confirmation::Ack(None))) => Ok(()),
                Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(PublishFailure::retryable(format!(
                    "RabbitMQ returned the message as unroutable ({} {}): no queue is bound for its routing key {:?}",
                    returned.reply_code, returned.reply_text, returned.routing_key.as_str()
                ))),
                Ok(Ok(Confirmation::Nack(_))) => Err(PublishFailure::retryable(
                    "RabbitMQ did not take the message (basic.nack)",
                )),
                Ok(Ok(Confirmation::NotRequested)) => Err(PublishFailure::retryable(
                    "the channel is not in confirm mode",
                )),
                Ok(Err(error)) => Err(classify(&error, payload_len)),
                Err(_) => Err(PublishFailure::retryable(format!(
                    "no confirm from RabbitMQ within {deadline:?}"
                ))),
            }
        }))
        .await
    }

    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    async fn health(&self) -> TransportHealth {
        if self.blocked().await {
            return TransportHealth::Down {
                reason: format!(
                    "RabbitMQ at {} blocked the connection (a memory or disk alarm); publishing resumes when it clears",
                    redacted_url(&self.config.url)
                ),
            };
        }
        match self.channel().await {
            Ok(_) => TransportHealth::Up,
            Err(reason) => TransportHealth::Down {
                reason: format!(
                    "RabbitMQ at {}: {reason}; reconnecting",
                    redacted_url(&self.config.url)
                ),
            },
        }
    }
}
