//! Local ports for the processes tests start: a free one, and waiting
//! until a port accepts connections or stops accepting them.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("no free port")
}

/// Waits up to 10 s until 127.0.0.1:`port` accepts connections (`open`)
/// or refuses them; panics naming `what` otherwise.
pub fn wait_until(port: u16, open: bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_ok() != open {
        let state = if open { "start" } else { "stop" };
        assert!(
            Instant::now() < deadline,
            "{what} on {port} did not {state}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
