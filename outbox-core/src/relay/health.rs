//! What a running relay knows about its own health: whether its transport
//! can publish, since when it cannot, and why. Workers update it before
//! each claim; [`Relay::health`](super::Relay::health) reads it, and the
//! `outbox_relay_transport_up` gauge mirrors it.

use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::metrics as m;
use crate::transport::TransportHealth;

/// The health of a running relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayHealth {
    /// Whether the transport can publish (the last look of any worker).
    pub transport: TransportHealth,
    /// Since when the transport is down, when it is.
    pub down_since: Option<DateTime<Utc>>,
}

impl RelayHealth {
    /// Whether the relay can publish.
    pub fn is_up(&self) -> bool {
        self.transport.is_up()
    }
}

/// Shared between a relay's workers and its handle.
#[derive(Debug)]
pub(crate) struct HealthState {
    current: Mutex<RelayHealth>,
}

impl HealthState {
    pub(crate) fn new() -> HealthState {
        HealthState {
            current: Mutex::new(RelayHealth {
                transport: TransportHealth::Up,
                down_since: None,
            }),
        }
    }

    pub(crate) fn get(&self) -> RelayHealth {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records a transport that can publish (up, or degraded with a
    /// reason); logs the recovery once, and a degradation when its reason
    /// changes.
    pub(crate) fn transport_up(
        &self,
        schema: &str,
        transport: &'static str,
        health: TransportHealth,
    ) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(since) = current.down_since.take() {
            tracing::info!(
                transport,
                down_for = ?(Utc::now() - since).to_std().unwrap_or_default(),
                "relay transport is back; publishing resumes"
            );
        }
        if let TransportHealth::Degraded { reason } = &health
            && current.transport != health
        {
            tracing::warn!(transport, %reason, "relay transport is degraded; publishing goes on");
        }
        current.transport = health;
        metrics::gauge!(m::TRANSPORT_UP, "schema" => schema.to_owned(), "transport" => transport)
            .set(1.0);
    }

    /// Records a transport that is down; logs the outage when it starts or
    /// its reason changes.
    pub(crate) fn transport_down(&self, schema: &str, transport: &'static str, reason: String) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let changed = match &current.transport {
            TransportHealth::Down { reason: old } => *old != reason,
            TransportHealth::Up | TransportHealth::Degraded { .. } => true,
        };
        if changed {
            tracing::warn!(transport, %reason, "relay transport is down; events stay pending, no attempts are used");
        }
        if current.down_since.is_none() {
            current.down_since = Some(Utc::now());
        }
        current.transport = TransportHealth::Down { reason };
        metrics::gauge!(m::TRANSPORT_UP, "schema" => schema.to_owned(), "transport" => transport)
            .set(0.0);
    }
}
