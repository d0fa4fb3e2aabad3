//! A TCP proxy between the handler and a storage endpoint (the Table service of Azurite), to
//! cause real, transient storage failures from outside the handler.
//!
//! Normally it relays bytes both ways. During an outage it drops every relayed connection
//! and answers each new request with what the Table service sends when it is overloaded:
//! `503 Server Busy` with error code `ServerBusy` (then closes the connection). The handler's
//! storage client sees exactly what it would see from Azure during throttling or an outage;
//! nothing in the handler is stubbed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Controls of a running proxy.
pub struct StorageProxy {
    pub port: u16,
    outage: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
    /// Requests answered with 503 so far.
    pub refused: Arc<AtomicU64>,
    /// Connections relayed so far.
    pub relayed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

const BUSY_BODY: &str = r#"{"odata.error":{"code":"ServerBusy","message":{"lang":"en-US","value":"The server is busy. (harness storage outage)"}}}"#;

impl StorageProxy {
    /// Starts relaying `127.0.0.1:{port}` to `127.0.0.1:{upstream}`.
    pub async fn start(upstream: u16) -> StorageProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let outage = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let refused = Arc::new(AtomicU64::new(0));
        let relayed = Arc::new(AtomicU64::new(0));
        let (o, g, r, rl) = (outage.clone(), generation.clone(), refused.clone(), relayed.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else { continue };
                if o.load(Ordering::SeqCst) {
                    let r = r.clone();
                    tokio::spawn(async move {
                        if answer_busy(conn).await {
                            r.fetch_add(1, Ordering::SeqCst);
                        }
                    });
                } else {
                    rl.fetch_add(1, Ordering::SeqCst);
                    let mut gen = g.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                        let mut conn = conn;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut conn, &mut up) => {}
                            _ = gen.changed() => {} // outage began: drop both ends
                        }
                    });
                }
            }
        });
        StorageProxy { port, outage, generation, refused, relayed, task }
    }

    /// Starts or ends an outage. Starting one also cuts the connections being relayed (the
    /// handler's client would otherwise keep using its pooled connections).
    pub fn set_outage(&self, on: bool) {
        self.outage.store(on, Ordering::SeqCst);
        if on {
            self.generation.send_modify(|g| *g += 1);
        }
    }

    pub fn outage(&self) -> bool {
        self.outage.load(Ordering::SeqCst)
    }
}

impl Drop for StorageProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request (head and Content-Length body) and answers 503 ServerBusy. True when a
/// request was answered.
async fn answer_busy(mut conn: TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize =
        head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    while buf.len() < head_end + length {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let response = format!(
        "HTTP/1.1 503 Server Busy\r\nContent-Type: application/json;odata=minimalmetadata;streaming=true;charset=utf-8\r\n\
         x-ms-error-code: ServerBusy\r\nx-ms-request-id: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BUSY_BODY}",
        uuid::Uuid::new_v4(),
        BUSY_BODY.len()
    );
    let _ = conn.write_all(response.as_bytes()).await;
    let _ = conn.shutdown().await;
    true
}
