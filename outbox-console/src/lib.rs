//! A web operations console for the outbox, on the operations API.
//!
//! [`Console::router`] is an axum [`Router`] a service mounts behind its own
//! authentication; `outbox console --listen 127.0.0.1:8080` serves the same
//! console standalone. Pages are rendered on the server as plain HTML and
//! forms (they work without JavaScript; one small script, shipped in the
//! crate, shows times and reads typed filter times in the viewer's zone,
//! ticks all rows of a table, and keeps a confirmed form from being sent
//! twice by a double click):
//!
//! - `/`: the status (backlog and its oldest age, failed, blocked,
//!   consumers with their lag, duplicates and letters, the relay workers'
//!   partitions, the problems a health check flags);
//! - `/events`: events by status with the CLI's filters and paging;
//!   `/events/{id}` one event, its payload redacted, its audit history;
//! - `/blocked`: aggregates waiting behind a retrying or failed head;
//! - `/consumers/{consumer}/{quarantined|dead_lettered}`: a consumer's
//!   letters grouped by error fingerprint (the same failure once, with a
//!   count, first and last seen, example ids), one failure's letters a
//!   page at a time (`?fingerprint=`), or every letter paged (`?list=1`);
//!   `…/{id}` one letter;
//! - `/audit`: the audit log.
//!
//! Every action (retry or skip a failed head, retry a retrying head now,
//! republish, replay or discard letters) is a POST carrying a CSRF token,
//! shows first what it would touch (by id, or by a filter capped at an
//! explicit limit), and runs only when confirmed from that preview (within
//! 15 minutes, for exactly its ids) with a reason, through the
//! operations API, which writes the audit row with the operator that
//! [`Identify`] names. [`Console::read_only`] refuses every action.
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_console::{Console, Identify};
//! use outbox_postgres::Ops;
//! use outbox_postgres::SchemaName;
//!
//! # #[derive(Clone)] struct User { login: String }
//! let ops = Ops::new(pool, SchemaName::new("app")?);
//! let console = Console::new(
//!     ops,
//!     // Who the operator is: here, what the service's auth middleware found.
//!     Identify::from_fn(|parts| parts.extensions.get::<User>().map(|u| u.login.clone())),
//! );
//! let app = axum::Router::new().nest("/outbox", console.base_path("/outbox").router());
//! # let _ = app; Ok(()) }
//! ```

mod actions;
mod error;
mod form;
mod identity;
mod store;
mod views;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use outbox_core::ops::StatusOptions;

pub use error::ConsoleError;
pub use identity::{Identify, Operator, operator_name};
pub use store::ConsoleStore;

use identity::{CsrfKey, Unidentified};

/// The console over one store. Build it, then take its [`Console::router`].
#[derive(Debug, Clone)]
pub struct Console<S> {
    store: S,
    identify: Identify,
    read_only: bool,
    base_path: String,
    allowed_hosts: Vec<String>,
    status_options: StatusOptions,
}

impl<S: ConsoleStore> Console<S> {
    /// A console over `store`, whose requests' operators `identify` names.
    pub fn new(store: S, identify: Identify) -> Console<S> {
        Console {
            store,
            identify,
            read_only: false,
            base_path: String::new(),
            allowed_hosts: Vec::new(),
            status_options: StatusOptions::default(),
        }
    }

    /// Serves only requests whose `Host` is one of `hosts`, given as
    /// browsers send it (`host:port`, but without the port when it is the
    /// scheme's default, 80 or 443; any case); others get 421. Needed wherever being able to connect is
    /// what admits a request ([`Identify::fixed`] on loopback): a page of
    /// another site whose name its DNS rebinds to 127.0.0.1 is same-origin
    /// with it to the browser, but its requests name its own host. Default:
    /// any host (the embedding service's authentication admits requests).
    pub fn allowed_hosts(
        mut self,
        hosts: impl IntoIterator<Item = impl Into<String>>,
    ) -> Console<S> {
        self.allowed_hosts = hosts
            .into_iter()
            .map(|h| h.into().to_ascii_lowercase())
            .collect();
        self
    }

    /// The path the router is nested under (`"/outbox"` for
    /// `Router::nest("/outbox", …)`); links are built from it. Default:
    /// served at the root.
    pub fn base_path(mut self, path: impl Into<String>) -> Console<S> {
        self.base_path = path.into().trim_end_matches('/').to_owned();
        self
    }

    /// The thresholds the status page flags problems by (a pending event
    /// older than `max_pending_age`, a consumer lagging more than
    /// `max_consumer_lag`) and how many blocked aggregates it lists; the
    /// tool's `status --max-age/--max-lag`. Default:
    /// [`StatusOptions::default`] (5 minutes each, 20 aggregates).
    pub fn status_options(mut self, options: StatusOptions) -> Console<S> {
        self.status_options = options;
        self
    }

    /// Shows everything and refuses every action (403), hiding their
    /// buttons.
    pub fn read_only(mut self, read_only: bool) -> Console<S> {
        self.read_only = read_only;
        self
    }

    /// The routes, to serve, or to nest under the [`Console::base_path`].
    pub fn router(self) -> Router {
        let shared = Arc::new(Shared {
            store: self.store,
            read_only: self.read_only,
            base: self.base_path,
            csrf: CsrfKey::random(),
            status_options: self.status_options,
        });
        let identify = self.identify;
        let allowed_hosts = Arc::new(self.allowed_hosts);
        Router::new()
            .route("/", get(views::status::page::<S>))
            .route("/events", get(views::events::list::<S>))
            .route("/events/{id}", get(views::events::detail::<S>))
            .route("/blocked", get(views::blocked::page::<S>))
            .route(
                "/consumers/{consumer}/{kind}",
                get(views::letters::list::<S>),
            )
            .route(
                "/consumers/{consumer}/{kind}/{id}",
                get(views::letters::detail::<S>),
            )
            .route("/audit", get(views::audit::page::<S>))
            .route("/actions/preview", post(actions::preview::<S>))
            .route("/actions/run", post(actions::run::<S>))
            .route("/assets/console.css", get(views::assets::css))
            .route("/assets/console.js", get(views::assets::js))
            .fallback(not_found)
            .with_state(shared)
            .layer(middleware::from_fn(move |request, next| {
                identified(identify.clone(), Arc::clone(&allowed_hosts), request, next)
            }))
    }
}

/// What every handler shares.
pub(crate) struct Shared<S> {
    pub(crate) store: S,
    pub(crate) read_only: bool,
    /// The mount path links start with.
    pub(crate) base: String,
    pub(crate) csrf: CsrfKey,
    /// The status page's thresholds.
    pub(crate) status_options: StatusOptions,
}

/// A handler's state.
pub(crate) type Ctx<S> = State<Arc<Shared<S>>>;

async fn not_found() -> ConsoleError {
    ConsoleError::NotFound("no such page".into())
}

/// Names the operator of every request (refusing those without one) and
/// sets the headers that keep the pages to themselves: no framing, no
/// script or style from elsewhere, no caching, no referrer to other sites.
async fn identified(
    identify: Identify,
    allowed_hosts: Arc<Vec<String>>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase)
        .or_else(|| {
            parts
                .uri
                .authority()
                .map(|a| a.as_str().to_ascii_lowercase())
        });
    let host_allowed =
        allowed_hosts.is_empty() || host.is_some_and(|host| allowed_hosts.contains(&host));
    let mut response = if !host_allowed {
        (
            StatusCode::MISDIRECTED_REQUEST,
            "this outbox console serves only its own address (the request named another host)",
        )
            .into_response()
    } else {
        match identify.operator(&parts) {
            Ok(operator) => {
                parts.extensions.insert(operator);
                next.run(Request::from_parts(parts, body)).await
            }
            Err(Unidentified::Challenge) => {
                let mut response = (
                    StatusCode::UNAUTHORIZED,
                    "the outbox console needs an operator name and the console token (HTTP Basic)",
                )
                    .into_response();
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"outbox console\", charset=\"UTF-8\""),
                );
                response
            }
            Err(Unidentified::Refuse) => (
                StatusCode::FORBIDDEN,
                "the outbox console serves identified operators only",
            )
                .into_response(),
        }
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        // Not `no-referrer`: under it browsers send `Origin: null` with a
        // form's POST, and the console could not tell its own forms from
        // another site's.
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
