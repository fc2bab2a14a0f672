//! A real browser for the console's tests: Debian's Chromium, headless,
//! driven through its chromedriver over WebDriver (fantoccini). The driver
//! runs in a time zone of its own (`Asia/Kolkata`, +05:30 all year) so a
//! test can tell the page shows times in the viewer's zone.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};

use crate::ports::{free_port, wait_until};

/// The viewer's zone the browser runs in.
pub const VIEWER_ZONE: &str = "Asia/Kolkata";

/// A headless Chromium session; the driver is killed when dropped.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    driver: Child,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a session. Panics with
    /// what to install when Chromium or its driver is missing (the scripts
    /// install both).
    pub async fn start() -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .env("TZ", VIEWER_ZONE)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start chromedriver ({error}): install Debian's chromium and chromium-driver (scripts/test.sh does)"
                )
            });
        wait_until(port, true, "chromedriver");
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium_binary(),
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1360,900",
                    "--lang=en-GB",
                ]
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a Chromium session through chromedriver");
        Browser { client, driver }
    }

    /// Closes the session and stops the driver.
    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}

fn chromium_binary() -> String {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|path| std::path::Path::new(path).exists())
        .unwrap_or("/usr/bin/chromium")
        .to_owned()
}

/// How long a page may take to show what a test waits for.
pub const PAGE_TIMEOUT: Duration = Duration::from_secs(20);
