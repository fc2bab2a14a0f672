//! A TCP proxy a test owns: it forwards a local port to a service and can
//! make the network between them misbehave without the shared service
//! being touched:
//!
//! - [`TcpProxy::down`] cuts every connection and refuses new ones (the
//!   client sees resets at once; [`TcpProxy::up`] accepts again);
//! - [`TcpProxy::delay`] holds every chunk of bytes, in both directions,
//!   for a latency before passing it on (pipelined: latency, not a
//!   bandwidth limit);
//! - [`TcpProxy::blackhole`] passes nothing on and connects nothing, like
//!   a network partition that drops packets: connections stay open, the
//!   client sees silence and its own timeouts, never a reset. What was
//!   sent meanwhile is held (bounded) and arrives after
//!   [`TcpProxy::heal`], as TCP's retransmissions would deliver it, and a
//!   peer that gave up meanwhile is seen closed only then.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does with the bytes of open connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// Passes them on at once.
    Forward,
    /// Passes each chunk on this long after it was read.
    Delay(Duration),
    /// Passes nothing on (held until the traffic changes).
    Blackhole,
}

/// The proxy's state, watched by every connection.
#[derive(Debug, Clone, Copy)]
struct Control {
    traffic: Traffic,
    /// New connections are closed at once.
    refusing: bool,
    /// Bumped to cut every open connection.
    cuts: u64,
}

/// Chunks held per direction before the proxy stops reading (backpressure
/// to the sender, as a full TCP window would).
const HELD_CHUNKS: usize = 256;
const CHUNK: usize = 16 * 1024;

/// A running proxy; dropped, it stops and cuts its connections.
pub struct TcpProxy {
    port: u16,
    control: watch::Sender<Control>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on a free local port and forwards to `target` (`host:port`).
    pub async fn start(target: &str) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (control, watching) = watch::channel(Control {
            traffic: Traffic::Forward,
            refusing: false,
            cuts: 0,
        });
        let target = target.to_owned();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if watching.borrow().refusing {
                    drop(inbound);
                    continue;
                }
                tokio::spawn(serve(inbound, target.clone(), watching.clone()));
            }
        });
        TcpProxy {
            port,
            control,
            task,
        }
    }

    /// The local address clients connect to (`127.0.0.1:<port>`).
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Cuts every open connection and refuses new ones.
    pub fn down(&self) {
        self.control.send_modify(|c| {
            c.refusing = true;
            c.cuts += 1;
        });
    }

    /// Accepts connections again.
    pub fn up(&self) {
        self.control.send_modify(|c| c.refusing = false);
    }

    /// Holds every chunk, both directions, `latency` before passing it on.
    pub fn delay(&self, latency: Duration) {
        self.control
            .send_modify(|c| c.traffic = Traffic::Delay(latency));
    }

    /// Passes nothing on and connects nothing until [`TcpProxy::heal`].
    pub fn blackhole(&self) {
        self.control.send_modify(|c| c.traffic = Traffic::Blackhole);
    }

    /// Forwards at once again (ends a delay or a blackhole).
    pub fn heal(&self) {
        self.control.send_modify(|c| c.traffic = Traffic::Forward);
    }

    /// What the proxy currently does with the bytes.
    pub fn traffic(&self) -> Traffic {
        self.control.borrow().traffic
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.control.send_modify(|c| {
            c.refusing = true;
            c.cuts += 1;
        });
    }
}

/// One client connection: connected to the target once the network lets
/// it through, then both directions piped until both end or a cut.
async fn serve(inbound: TcpStream, target: String, mut control: watch::Receiver<Control>) {
    let cuts = control.borrow_and_update().cuts;
    let cut = {
        let mut control = control.clone();
        async move {
            let _ = control.wait_for(|c| c.cuts != cuts).await;
        }
    };
    let connected = async {
        // A blackholed network drops the handshake too: the client waits.
        if control
            .wait_for(|c| c.traffic != Traffic::Blackhole)
            .await
            .is_err()
        {
            return;
        }
        let Ok(outbound) = TcpStream::connect(&target).await else {
            return;
        };
        let _ = inbound.set_nodelay(true);
        let _ = outbound.set_nodelay(true);
        let (from_client, to_client) = inbound.into_split();
        let (from_server, to_server) = outbound.into_split();
        tokio::join!(
            pipe(from_client, to_server, control.clone()),
            pipe(from_server, to_client, control.clone()),
        );
    };
    tokio::select! {
        _ = connected => {}
        _ = cut => {}
    }
}

/// One direction: a reader that holds chunks with the time they were read,
/// and a writer that passes each on when the traffic allows.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, control: watch::Receiver<Control>) {
    let (held, mut chunks) = mpsc::channel::<(Instant, Vec<u8>)>(HELD_CHUNKS);
    let reader = async move {
        loop {
            let mut buffer = vec![0_u8; CHUNK];
            match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    buffer.truncate(n);
                    if held.send((Instant::now(), buffer)).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        let mut control = control;
        while let Some((read_at, chunk)) = chunks.recv().await {
            loop {
                let traffic = control.borrow_and_update().traffic;
                match traffic {
                    Traffic::Forward => break,
                    Traffic::Delay(latency) => {
                        tokio::select! {
                            _ = tokio::time::sleep_until(read_at + latency) => break,
                            changed = control.changed() => if changed.is_err() { return },
                        }
                    }
                    Traffic::Blackhole => {
                        if control.changed().await.is_err() {
                            return;
                        }
                    }
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port; returns its address.
    async fn echo() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        address
    }

    async fn round_trip(socket: &mut TcpStream, bytes: &[u8]) -> Vec<u8> {
        socket.write_all(bytes).await.unwrap();
        let mut back = vec![0_u8; bytes.len()];
        socket.read_exact(&mut back).await.unwrap();
        back
    }

    #[tokio::test]
    async fn a_delay_holds_every_byte_at_least_the_latency_each_way() {
        let proxy = TcpProxy::start(&echo().await).await;
        let mut socket = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut socket, b"warm").await, b"warm");
        proxy.delay(Duration::from_millis(150));
        assert_eq!(proxy.traffic(), Traffic::Delay(Duration::from_millis(150)));
        let started = std::time::Instant::now();
        assert_eq!(round_trip(&mut socket, b"slow").await, b"slow");
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "a round trip through a 150 ms delay took {:?}",
            started.elapsed()
        );
        proxy.heal();
        assert_eq!(round_trip(&mut socket, b"fast").await, b"fast");
    }

    #[tokio::test]
    async fn a_blackhole_holds_traffic_and_new_connections_without_a_reset_until_it_heals() {
        let proxy = TcpProxy::start(&echo().await).await;
        let mut open = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut open, b"before").await, b"before");
        proxy.blackhole();
        open.write_all(b"during").await.unwrap();
        let mut fresh = TcpStream::connect(proxy.address()).await.unwrap();
        fresh.write_all(b"fresh").await.unwrap();
        let mut back = [0_u8; 6];
        // Silence, not a reset: the read neither returns nor fails.
        assert!(
            tokio::time::timeout(Duration::from_millis(400), open.read(&mut back))
                .await
                .is_err(),
            "bytes or a close came through the blackhole"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(100), fresh.read(&mut back))
                .await
                .is_err(),
            "a connection made during the blackhole answered"
        );
        proxy.heal();
        // What was sent meanwhile arrives, in order, on both.
        open.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"during");
        let mut back = [0_u8; 5];
        fresh.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"fresh");
    }

    #[tokio::test]
    async fn down_cuts_open_connections_and_refuses_new_ones_until_up() {
        let proxy = TcpProxy::start(&echo().await).await;
        let mut open = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut open, b"before").await, b"before");
        proxy.down();
        let mut byte = [0_u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), open.read(&mut byte))
            .await
            .expect("a cut connection closes");
        assert!(matches!(read, Ok(0) | Err(_)), "read {read:?} after a cut");
        let mut refused = TcpStream::connect(proxy.address()).await.unwrap();
        let read = tokio::time::timeout(Duration::from_secs(5), refused.read(&mut byte))
            .await
            .expect("a refused connection closes");
        assert!(matches!(read, Ok(0) | Err(_)), "read {read:?} while down");
        proxy.up();
        let mut again = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut again, b"after").await, b"after");
    }
}
