//! Building a consumer: handlers are registered by type and checked
//! against the contracts linked into the binary before the first message.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::config::{ConsumerConfig, validate_name};
use super::handler::{Dispatch, FnHandler, Handler, HandlerError, Received, Typed};
use super::store::ConsumerStore;
use super::{Consumer, Inner};
use crate::contract::OutboxEvent;
use crate::registry::{ContractRegistry, RegistryErrors};
use crate::store::ConfigError;

/// One problem found while building a consumer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A setting or the name is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No handler was registered.
    #[error("consumer {consumer} has no handlers; register one with `on::<Event>(handler)`")]
    NoHandlers {
        /// The consumer.
        consumer: String,
    },
    /// Two handlers for one event type.
    #[error(
        "consumer {consumer} has two handlers for {event_type}: one for {first} and one for {second}; keep one (it receives every version, upcast)"
    )]
    DuplicateHandler {
        /// The consumer.
        consumer: String,
        /// The event type.
        event_type: &'static str,
        /// The type of the first handler's event.
        first: &'static str,
        /// The type of the second handler's event.
        second: &'static str,
    },
    /// The handler's type is not the newest version in the binary, so
    /// newer messages could never reach it.
    #[error(
        "consumer {consumer} handles {event_type} as {rust_type} (v{handler_version}), but v{newest} exists in this binary; handle the newest version, older ones are upcast to it"
    )]
    NotNewest {
        /// The consumer.
        consumer: String,
        /// The event type.
        event_type: &'static str,
        /// The handler's event type.
        rust_type: &'static str,
        /// Its version.
        handler_version: u32,
        /// The newest registered version.
        newest: u32,
    },
    /// A registered version cannot be upcast to the handler's version.
    #[error(
        "consumer {consumer} handles {event_type} v{handler_version}, whose upcast chain starts at v{readable_from}, but v{version} is registered; add an upcaster from v{version} or retire it"
    )]
    Unreachable {
        /// The consumer.
        consumer: String,
        /// The event type.
        event_type: &'static str,
        /// The handler's version.
        handler_version: u32,
        /// Where its chain starts.
        readable_from: u32,
        /// The version it cannot read.
        version: u32,
    },
    /// Strict ordering counts versions across all event types of an
    /// aggregate, so every event type of a handled aggregate type must be
    /// handled or explicitly skipped.
    #[error(
        "consumer {consumer} uses strict ordering on aggregate {aggregate_type}, but has no handler for its event type {event_type}; its versions would be gaps forever: handle it, or `.ignore(\"{event_type}\")` to let it move the position without a handler"
    )]
    StrictUnhandled {
        /// The consumer.
        consumer: String,
        /// The aggregate type.
        aggregate_type: &'static str,
        /// The event type without a handler.
        event_type: &'static str,
    },
    /// The binary's contracts are inconsistent.
    #[error("{0}")]
    Registry(RegistryErrors),
}

/// Every problem found while building a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildErrors(pub Vec<BuildError>);

impl fmt::Display for BuildErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} problem(s) building the consumer", self.0.len())?;
        for error in &self.0 {
            write!(f, "\n  - {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for BuildErrors {}

/// Collects handlers and settings; [`ConsumerBuilder::build_on`] checks them.
///
/// `C` is the connection type the handlers receive, the store's: a
/// consumer starts with [`ConsumerBuilder::for_connection`] and is built
/// with [`ConsumerBuilder::build_on`] (on PostgreSQL,
/// `outbox_postgres::prelude` adds `ConsumerBuilder::new(..)` and
/// `.build(pool, schema)` for `ConsumerBuilder<PgConnection>`).
///
/// Settings compose in any order: [`config`](Self::config) gives the whole
/// set, and each single setter ([`ordering`](Self::ordering),
/// [`retry`](Self::retry), [`batch_size`](Self::batch_size)) wins over the
/// same field of it, whether it was called before or after.
pub struct ConsumerBuilder<C> {
    name: String,
    config: ConsumerConfig,
    overrides: Overrides,
    handlers: Vec<Box<dyn Dispatch<C>>>,
    ignored: BTreeSet<String>,
    registry: Option<ContractRegistry>,
}

/// Settings given one by one; applied over [`ConsumerBuilder::config`].
#[derive(Debug, Default, Clone, Copy)]
struct Overrides {
    ordering: Option<super::Ordering>,
    retry: Option<super::RetryPolicy>,
    batch_size: Option<usize>,
}

impl Overrides {
    fn apply(self, mut config: ConsumerConfig) -> ConsumerConfig {
        if let Some(ordering) = self.ordering {
            config.ordering = ordering;
        }
        if let Some(retry) = self.retry {
            config.retry = retry;
        }
        if let Some(batch_size) = self.batch_size {
            config.batch_size = batch_size;
        }
        config
    }
}

impl<C> fmt::Debug for ConsumerBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("name", &self.name)
            .field("config", &self.overrides.apply(self.config.clone()))
            .field(
                "handlers",
                &self
                    .handlers
                    .iter()
                    .map(|h| h.rust_type())
                    .collect::<Vec<_>>(),
            )
            .field("ignored", &self.ignored)
            .finish_non_exhaustive()
    }
}

impl<C: Send + 'static> ConsumerBuilder<C> {
    /// A consumer called `name` whose handlers receive `&mut C`, the
    /// connection type of the store it will be built on with
    /// [`build_on`](Self::build_on).
    pub fn for_connection(name: impl Into<String>) -> ConsumerBuilder<C> {
        ConsumerBuilder {
            name: name.into(),
            config: ConsumerConfig::default(),
            overrides: Overrides::default(),
            handlers: Vec::new(),
            ignored: BTreeSet::new(),
            registry: None,
        }
    }

    /// Handles every version of `E`'s event type: older versions are
    /// upcast to `E` before `handler` sees them.
    pub fn on<E: OutboxEvent, H: Handler<E, C>>(mut self, handler: H) -> Self {
        self.handlers.push(Box::new(Typed::<E, H>::new(handler)));
        self
    }

    /// As [`on`](Self::on), with a closure:
    /// `|event, tx| Box::pin(async move { ...; Ok(()) })`.
    pub fn on_fn<E, F>(self, handler: F) -> Self
    where
        E: OutboxEvent,
        F: for<'a> Fn(Received<E>, &'a mut C) -> BoxFuture<'a, Result<(), HandlerError>>
            + Send
            + Sync
            + 'static,
    {
        self.on::<E, _>(FnHandler(handler))
    }

    /// Acknowledges messages of `event_type` without handling them. Known
    /// event types of the consumer's aggregate types are ignored without
    /// this; it is for types without a contract in this binary (which
    /// would otherwise be quarantined) and, under strict ordering, the
    /// required statement that a type of a handled aggregate only moves
    /// the position. Events of other aggregate types are foreign and
    /// acknowledged anyway.
    pub fn ignore(mut self, event_type: impl Into<String>) -> Self {
        self.ignored.insert(event_type.into());
        self
    }

    /// Sets every setting. An ordering, retry policy or batch size given
    /// with its own setter wins over the one in `config`, in whichever
    /// order the two are called.
    pub fn config(mut self, config: ConsumerConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the ordering policy (wins over [`config`](Self::config)'s).
    pub fn ordering(mut self, ordering: super::Ordering) -> Self {
        self.overrides.ordering = Some(ordering);
        self
    }

    /// Sets the retry policy (wins over [`config`](Self::config)'s).
    pub fn retry(mut self, retry: super::RetryPolicy) -> Self {
        self.overrides.retry = Some(retry);
        self
    }

    /// Sets the batch size, messages per transaction (wins over
    /// [`config`](Self::config)'s).
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.overrides.batch_size = Some(batch_size);
        self
    }

    /// Checks handlers against `registry` instead of the contracts linked
    /// into the binary (tests of the checks themselves).
    pub fn registry(mut self, registry: ContractRegistry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Checks everything and builds the consumer on `store` (its tables
    /// migrated by the store's own migrations).
    pub fn build_on<S>(mut self, store: S) -> Result<Consumer<S>, BuildErrors>
    where
        S: ConsumerStore,
        S::Db: sqlx::Database<Connection = C>,
    {
        self.config = self.overrides.apply(self.config);
        let mut problems = Vec::new();
        if let Err(error) = validate_name(&self.name) {
            problems.push(error.into());
        }
        if let Err(error) = self.config.validate() {
            problems.push(error.into());
        }
        if self.handlers.is_empty() {
            problems.push(BuildError::NoHandlers {
                consumer: self.name.clone(),
            });
        }
        let registry = match self.registry {
            Some(registry) => Some(registry),
            None => match ContractRegistry::global() {
                Ok(registry) => Some(registry.clone()),
                Err(errors) => {
                    problems.push(BuildError::Registry(errors.clone()));
                    None
                }
            },
        };
        let mut handlers: HashMap<&'static str, Box<dyn Dispatch<C>>> = HashMap::new();
        for handler in self.handlers {
            if let Some(registry) = &registry {
                problems.extend(check_reach(&self.name, handler.as_ref(), registry));
            }
            if let Some(first) = handlers.get(handler.event_type()) {
                problems.push(BuildError::DuplicateHandler {
                    consumer: self.name.clone(),
                    event_type: handler.event_type(),
                    first: first.rust_type(),
                    second: handler.rust_type(),
                });
                continue;
            }
            handlers.insert(handler.event_type(), handler);
        }
        let mut skipped_types = Vec::new();
        if let (super::Ordering::Strict { .. }, Some(registry)) = (self.config.ordering, &registry)
        {
            let aggregates: BTreeSet<&'static str> =
                handlers.values().map(|h| h.aggregate_type()).collect();
            for event_type in registry.event_types() {
                let Some(contract) = registry.current(event_type) else {
                    continue;
                };
                if !aggregates.contains(contract.aggregate_type)
                    || handlers.contains_key(event_type)
                {
                    continue;
                }
                if self.ignored.contains(event_type) {
                    skipped_types.push((contract.aggregate_type, event_type));
                } else {
                    problems.push(BuildError::StrictUnhandled {
                        consumer: self.name.clone(),
                        aggregate_type: contract.aggregate_type,
                        event_type,
                    });
                }
            }
        }
        // A missing registry was reported as a problem above.
        let registry = match registry {
            Some(registry) if problems.is_empty() => registry,
            _ => return Err(BuildErrors(problems)),
        };
        let mut aggregate_types: BTreeSet<&'static str> =
            handlers.values().map(|h| h.aggregate_type()).collect();
        aggregate_types.extend(
            self.ignored
                .iter()
                .filter_map(|event_type| registry.current(event_type))
                .map(|contract| contract.aggregate_type),
        );
        let name: Arc<str> = Arc::from(self.name.as_str());
        Ok(Consumer {
            inner: Arc::new(Inner {
                store,
                name,
                handlers,
                ignored: self.ignored,
                aggregate_types,
                registry,
                skipped_types,
                config: self.config,
                tally: Default::default(),
            }),
        })
    }
}

/// The registered versions of the handler's event type must all reach it.
fn check_reach<C>(
    consumer: &str,
    handler: &dyn Dispatch<C>,
    registry: &ContractRegistry,
) -> Vec<BuildError> {
    let mut problems = Vec::new();
    let versions: Vec<u32> = registry
        .versions(handler.event_type())
        .map(|contract| contract.schema_version)
        .collect();
    if let Some(&newest) = versions.iter().max()
        && newest > handler.version()
    {
        problems.push(BuildError::NotNewest {
            consumer: consumer.to_owned(),
            event_type: handler.event_type(),
            rust_type: handler.rust_type(),
            handler_version: handler.version(),
            newest,
        });
    }
    for version in versions {
        if version < handler.readable_from() {
            problems.push(BuildError::Unreachable {
                consumer: consumer.to_owned(),
                event_type: handler.event_type(),
                handler_version: handler.version(),
                readable_from: handler.readable_from(),
                version,
            });
        }
    }
    problems
}
