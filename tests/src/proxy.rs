//! A TCP proxy a test owns: it forwards a local port to a service and can
//! cut every connection and refuse new ones, so a client sees its broker go
//! down (and come back) without the shared service being stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; dropped, it stops.
pub struct TcpProxy {
    port: u16,
    up: Arc<AtomicBool>,
    cut: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on a free local port and forwards to `target` (`host:port`).
    pub async fn start(target: &str) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let up = Arc::new(AtomicBool::new(true));
        let (cut, cuts) = watch::channel(0_u64);
        let target = target.to_owned();
        let accepting = Arc::clone(&up);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if !accepting.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let target = target.clone();
                let mut cuts = cuts.clone();
                cuts.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        TcpProxy {
            port,
            up,
            cut,
            task,
        }
    }

    /// The local address clients connect to (`127.0.0.1:<port>`).
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Cuts every open connection and refuses new ones.
    pub fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    /// Accepts connections again.
    pub fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut.send_modify(|n| *n += 1);
    }
}
