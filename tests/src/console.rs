//! Driving the web console in tests: requests through its router (no
//! socket), the CSRF token scraped from a page as a browser would submit
//! it, and the console served on a loopback port for a real browser.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// A response of the console.
#[derive(Debug)]
pub struct Page {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body as text.
    pub body: String,
}

impl Page {
    /// The CSRF token of the first action form on the page.
    pub fn csrf(&self) -> String {
        self.hidden("csrf")
    }

    /// The confirmation a preview page gives its run form.
    pub fn confirm(&self) -> String {
        self.hidden("confirm")
    }

    /// The value of the page's first field called `name`.
    fn hidden(&self, name: &str) -> String {
        let marker = format!("name=\"{name}\" value=\"");
        let start = self
            .body
            .find(&marker)
            .unwrap_or_else(|| panic!("no {name} field on the page:\n{}", self.body))
            + marker.len();
        let end = self.body[start..].find('"').expect("the field's end") + start;
        self.body[start..end].to_owned()
    }

    /// Asserts the status, showing the page when it differs.
    pub fn expect(self, status: StatusCode) -> Page {
        assert_eq!(self.status, status, "{}", self.body);
        self
    }
}

/// Sends one request through `router`.
pub async fn send(router: &Router, request: Request<Body>) -> Page {
    let response = router
        .clone()
        .oneshot(request)
        .await
        .expect("the router answers");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the body reads")
        .to_bytes();
    Page {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// `GET path`.
pub async fn get(router: &Router, path: &str) -> Page {
    send(
        router,
        Request::get(path).body(Body::empty()).expect("a request"),
    )
    .await
}

/// `POST path` with a form of `fields` (repeat a name for several values).
pub async fn post(router: &Router, path: &str, fields: &[(&str, &str)]) -> Page {
    post_with(router, path, fields, &[]).await
}

/// `POST path` with a form and extra headers.
pub async fn post_with(
    router: &Router,
    path: &str,
    fields: &[(&str, &str)],
    headers: &[(&str, &str)],
) -> Page {
    let body = {
        let mut form = String::new();
        for (index, (name, value)) in fields.iter().enumerate() {
            if index > 0 {
                form.push('&');
            }
            form.push_str(&encode(name));
            form.push('=');
            form.push_str(&encode(value));
        }
        form
    };
    let mut request = Request::post(path)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("host", "console.test");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(router, request.body(Body::from(body)).expect("a request")).await
}

fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Serves `router` on a free loopback port until the test ends.
pub async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        axum::serve(listener, router)
            .await
            .expect("the console serves");
    });
    address
}
