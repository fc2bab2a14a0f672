//! The console's only assets, shipped in the crate: a stylesheet and a
//! script that shows times in the viewer's zone.

use axum::http::header;
use axum::response::IntoResponse;

/// The stylesheet.
pub(crate) async fn css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../../assets/console.css"),
    )
}

/// The script.
pub(crate) async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../../assets/console.js"),
    )
}
