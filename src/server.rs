//! `serve`: the whole system in one process. The HTTP API, a queue worker that plays the
//! part of the Functions `apply` trigger (same retry and poison rules; the messages of one
//! receive are handled concurrently, so the WAL shards are applied in parallel), and a timer
//! that plays the part of the `sweep` trigger.
//!
//! Shutdown (Ctrl-C / SIGTERM, or the future passed to [`serve`]): stop accepting requests,
//! let in-flight requests and the message being applied finish, then return.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::catalog::{Catalog, MessageOutcome};
use crate::error::Result;
use crate::messages;
use crate::store::ReceivedMessage;

/// Tunables of the in-process worker and sweeper.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Messages received per poll (1..=32; the Functions default `batchSize` is 16).
    pub batch_size: usize,
    /// How long a received message stays invisible while it is handled.
    pub visibility_timeout: Duration,
    /// Longest idle wait between polls of the queue.
    pub max_poll_interval: Duration,
    /// Interval between sweeps.
    pub sweep_interval: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            batch_size: 16,
            visibility_timeout: Duration::from_secs(30),
            max_poll_interval: Duration::from_secs(2),
            sweep_interval: Duration::from_secs(30),
        }
    }
}

/// Serves the API on `listener` with the worker and the sweeper until `shutdown` resolves.
pub async fn serve(
    catalog: Arc<Catalog>,
    listener: TcpListener,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let worker = tokio::spawn(run_worker(catalog.clone(), opts.clone(), stop_rx.clone()));
    let sweeper = tokio::spawn(run_sweeper(catalog.clone(), opts.sweep_interval, stop_rx));
    let app = crate::http::router(catalog);
    let served = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
    tracing::info!("HTTP server stopped; finishing background work");
    let _ = stop_tx.send(true);
    let _ = worker.await;
    let _ = sweeper.await;
    served.map_err(|e| crate::Error::Config(format!("HTTP server failed: {e}")))
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutdown requested");
}

/// Receives apply-queue messages and handles them until stopped.
pub async fn run_worker(catalog: Arc<Catalog>, opts: ServeOptions, mut stop: watch::Receiver<bool>) {
    let mut idle = Duration::from_millis(20);
    loop {
        if *stop.borrow() {
            return;
        }
        let received = catalog
            .store()
            .receive_messages(&catalog.names().queue, opts.batch_size.clamp(1, 32), opts.visibility_timeout)
            .await;
        match received {
            Ok(msgs) if !msgs.is_empty() => {
                idle = Duration::from_millis(20);
                // Concurrently, like the Functions host with `batchSize`: hints of different
                // shards are applied in parallel (hints of one shard find it busy and return).
                futures::stream::iter(msgs).for_each_concurrent(None, |m| handle_message(&catalog, m)).await;
                continue;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "receiving from the apply queue failed"),
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = catalog.work_signal().notified() => idle = Duration::from_millis(20),
            _ = tokio::time::sleep(idle) => idle = (idle * 2).min(opts.max_poll_interval),
        }
    }
}

/// Handles one message like the Functions host and the `apply` function together:
/// invalid Base64 goes straight to the poison queue; success deletes the message; a
/// transient failure makes it visible again after a backoff, and after `max_dequeue_count`
/// deliveries it goes to the poison queue.
pub async fn handle_message(catalog: &Catalog, m: ReceivedMessage) {
    let queue = &catalog.names().queue;
    let outcome = match messages::decode(&m.text) {
        Ok(text) => catalog.process_message(&text, &m.id, m.dequeue_count).await,
        Err(e) => catalog
            .poison(&m.text, &m.id, m.dequeue_count, &e.to_string())
            .await
            .map(|_| MessageOutcome::Poisoned { reason: e.to_string() }),
    };
    let done = match outcome {
        Ok(_) => true,
        Err(e) if m.dequeue_count >= catalog.options().max_dequeue_count => {
            let reason = format!("failed {} times; last error: {e}", m.dequeue_count);
            match catalog.poison(&m.text, &m.id, m.dequeue_count, &reason).await {
                Ok(()) => true,
                Err(pe) => {
                    tracing::error!(error = %pe, "could not move a message to the poison queue");
                    false
                }
            }
        }
        Err(e) => {
            let backoff = Duration::from_secs(1u64 << m.dequeue_count.min(5));
            tracing::warn!(message_id = %m.id, dequeue_count = m.dequeue_count, error = %e, ?backoff, "apply failed; will retry");
            if let Err(re) = catalog.store().release_message(queue, &m.id, &m.pop_receipt, &m.text, backoff).await {
                tracing::debug!(error = %re, "could not release the message; it reappears after its visibility timeout");
            }
            false
        }
    };
    if done {
        if let Err(e) = catalog.store().delete_message(queue, &m.id, &m.pop_receipt).await {
            tracing::debug!(error = %e, "could not delete a handled message; it will be handled again (idempotent)");
        }
    }
}

/// Sweeps every `interval` until stopped.
pub async fn run_sweeper(catalog: Arc<Catalog>, interval: Duration, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match catalog.sweep().await {
            Ok(r) => tracing::info!(
                pending = r.pending,
                oldest_pending_age_ms = r.oldest_pending_age_ms,
                applied = r.applied,
                tombstones_removed = r.tombstones_removed,
                dead = r.dead,
                "sweep"
            ),
            Err(e) => tracing::warn!(error = %e, "sweep failed"),
        }
    }
}
