//! What a page or an action can fail with, as the page that says so.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use outbox_core::ops::OpsError;

/// A request the console could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The operations API failed (a database error) or refused a repair.
    #[error(transparent)]
    Ops(#[from] OpsError),
    /// Nothing is there.
    #[error("not found: {0}")]
    NotFound(String),
    /// The request is malformed (a filter value, an id, a missing field).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The request may not do this (read-only console, a missing or wrong
    /// CSRF token, a POST from another site, or a run without a
    /// confirmation from this action's preview on these ids within the
    /// last 15 minutes).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The store keeps no consumer tables.
    #[error(
        "this store keeps no consumer tables: letters and replays exist where a consumer keeps its inbox"
    )]
    NoConsumerTables,
}

impl ConsoleError {
    fn status(&self) -> StatusCode {
        match self {
            ConsoleError::Ops(OpsError::Database { .. }) => StatusCode::INTERNAL_SERVER_ERROR,
            ConsoleError::Ops(_) | ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::NotFound(_) | ConsoleError::NoConsumerTables => StatusCode::NOT_FOUND,
            ConsoleError::Forbidden(_) => StatusCode::FORBIDDEN,
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = %self, "outbox console request failed");
        }
        let body = html! {
            (maud::DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    title { "outbox console: " (status.as_u16()) }
                }
                body {
                    h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
                    p.error { (self.to_string()) }
                    p { "Go back to the previous page to try again." }
                }
            }
        };
        (status, body).into_response()
    }
}
