//! `serve`: the whole system in one process. The HTTP API, a queue worker that plays the
//! part of the Functions `apply` trigger (the same dispatcher and `host.json` policy,
//! `crate::dispatch`: messages are handled concurrently and new ones received as soon as a
//! slot is free, so the WAL shards are applied in parallel), and a timer that plays the part
//! of the `sweep` trigger.
//!
//! Shutdown (Ctrl-C / SIGTERM, or the future passed to [`serve`]): stop accepting requests,
//! let in-flight requests and the message being applied finish, then return.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::catalog::Catalog;
use crate::dispatch::Dispatcher;
pub use crate::dispatch::{QueuePolicy, WorkerOptions};
use crate::error::Result;
use crate::jobs::JobHandler;

/// Tunables of the in-process worker and sweeper. The queue policy (batch size, retries,
/// poisoning) is not here: it is the app's `host.json`, as in the Functions app
/// ([`crate::dispatch::QueuePolicy`]).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The queue listener's own tunables.
    pub worker: WorkerOptions,
    /// Delivery, retry and poison rules: the app's `host.json` ([`QueuePolicy::host`]);
    /// tests change it.
    pub policy: QueuePolicy,
    /// Interval between sweeps.
    pub sweep_interval: Duration,
    /// Job work items handled at once from the scan queue (0: none; the stand-in for the
    /// Functions `scan` trigger, see [`crate::jobs`]).
    pub scan_workers: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            worker: WorkerOptions::default(),
            policy: QueuePolicy::host(),
            sweep_interval: Duration::from_secs(30),
            scan_workers: 4,
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
    // Single-partition mode has no WAL, queue or jobs: the HTTP API answers every write
    // itself, and nothing runs beside it.
    let wal_mode = catalog.mode() == crate::catalog::Mode::Wal;
    let worker = wal_mode.then(|| tokio::spawn(run_worker(catalog.clone(), opts.clone(), stop_rx.clone())));
    let sweeper = wal_mode.then(|| tokio::spawn(run_sweeper(catalog.clone(), opts.sweep_interval, stop_rx.clone())));
    let scanner = (wal_mode && opts.scan_workers > 0)
        .then(|| tokio::spawn(run_scan_worker(catalog.clone(), opts.clone(), stop_rx)));
    let app = crate::http::router(catalog);
    let served = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
    tracing::info!("HTTP server stopped; finishing background work");
    let _ = stop_tx.send(true);
    for task in [worker, sweeper, scanner].into_iter().flatten() {
        let _ = task.await;
    }
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

/// Runs the apply queue's dispatcher (the stand-in for the Functions `apply` trigger, with
/// the `host.json` policy; see `crate::dispatch`) until stopped. On stop, the messages in
/// flight are finished first. Returns at once for a catalog in single-partition mode, which
/// has no apply queue.
pub async fn run_worker(catalog: Arc<Catalog>, opts: ServeOptions, stop: watch::Receiver<bool>) {
    if catalog.mode() != crate::catalog::Mode::Wal {
        return;
    }
    Arc::new(Dispatcher::apply(catalog).with_policy(opts.policy)).run(opts.worker, stop).await
}

/// Runs the scan queue's dispatcher (job work items, [`crate::jobs`]; the stand-in for the
/// Functions `scan` trigger) with `opts.scan_workers` items at once, until stopped.
pub async fn run_scan_worker(catalog: Arc<Catalog>, opts: ServeOptions, stop: watch::Receiver<bool>) {
    let worker = WorkerOptions { concurrency: Some(opts.scan_workers.max(1)), ..opts.worker };
    Arc::new(JobHandler::dispatcher(catalog).with_policy(opts.policy)).run(worker, stop).await
}

/// Sweeps every `interval` until stopped.
pub async fn run_sweeper(catalog: Arc<Catalog>, interval: Duration, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            // In order, not at random: one seed, one execution (src/env.rs).
            biased;
            _ = stop.changed() => return,
            _ = crate::env::sleep(interval) => {}
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use serde_json::json;

    use super::*;
    use crate::catalog::CatalogOptions;
    use crate::config::Names;
    use crate::messages;
    use crate::record::Record;
    use crate::schema::Schema;
    use crate::store::layer::{Call, Layer, LayeredStore, Returned};
    use crate::store::local::LocalStore;
    use crate::store::{OpKind, Store, StoreResult};
    use crate::wal::{Op, ShardId, WalOptions};

    /// Once armed, holds every query of one WAL partition (an apply pass reading the shard's
    /// pending entries) until opened.
    struct HoldShard {
        table: String,
        partition: String,
        armed: AtomicBool,
        arrived: watch::Sender<u64>,
        open: watch::Sender<bool>,
    }

    impl Layer for HoldShard {
        async fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, mut attempt: F) -> StoreResult<T>
        where
            T: Returned + Send + 'a,
            F: FnMut() -> Fut + Send + 'a,
            Fut: Future<Output = StoreResult<T>> + Send + 'a,
        {
            if self.armed.load(Ordering::SeqCst)
                && call.op == OpKind::Query
                && call.target == self.table
                && call.partition_key == Some(self.partition.as_str())
            {
                let mut open = self.open.subscribe();
                self.arrived.send_modify(|n| *n += 1);
                let _ = open.wait_for(|o| *o).await;
            }
            attempt().await
        }
    }

    /// Only a hung worker reaches it.
    const DEADLINE: Duration = Duration::from_secs(30);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hint_is_handled_while_an_apply_pass_of_another_shard_is_still_running() {
        let names = Names::new("worker", None, None).unwrap();
        let schema = Schema::new(vec!["code".into()], "name").unwrap();
        let opts =
            CatalogOptions { wal: WalOptions { shards: 4, ..WalOptions::default() }, ..CatalogOptions::default() };
        let record = |i: usize| -> Record {
            let v = json!({"code": format!("c{i}"), "name": format!("n{i}")});
            v.as_object().unwrap().clone()
        };
        let route = |i: usize| {
            let keys = schema.record_keys(&record(i)).unwrap();
            ShardId::for_row_key(&keys.row_key, 4)
        };
        // Two records in different shards.
        let b = (1..100).find(|&i| route(i) != route(0)).unwrap();
        let (shard_a, shard_b) = (route(0), route(b));
        let hold = Arc::new(HoldShard {
            table: names.wal_table.clone(),
            partition: shard_a.partition(),
            armed: AtomicBool::new(false),
            arrived: watch::Sender::new(0),
            open: watch::Sender::new(false),
        });
        let local: Arc<dyn Store> = Arc::new(LocalStore::in_memory().unwrap());
        let store: Arc<dyn Store> = Arc::new(LayeredStore::with_layer(local, hold.clone()));
        let catalog = Arc::new(Catalog::open(store, names.clone(), schema.clone(), opts).await.unwrap());
        // Logged without hints; the hints are put by hand below.
        let id_a = catalog.wal().append(vec![(shard_a, Op::Upsert { record: record(0) })]).await.unwrap().remove(0);
        let id_b = catalog.wal().append(vec![(shard_b, Op::Upsert { record: record(b) })]).await.unwrap().remove(0);
        let hint = |shard: ShardId, id: &crate::wal::WalId| {
            messages::encode(&messages::hint_json(&shard.partition(), id.as_str()))
        };
        hold.armed.store(true, Ordering::SeqCst);

        let (stop_tx, stop_rx) = watch::channel(false);
        let opts = ServeOptions::default();
        let worker = tokio::spawn(run_worker(catalog.clone(), opts, stop_rx));
        catalog.store().put_message(&names.queue, &hint(shard_a, &id_a), Duration::ZERO).await.unwrap();
        // Shard A's apply pass is now running, held reading A's pending entries.
        let mut arrived = hold.arrived.subscribe();
        tokio::time::timeout(DEADLINE, arrived.wait_for(|n| *n >= 1))
            .await
            .expect("shard A's apply pass never started")
            .unwrap();

        catalog.store().put_message(&names.queue, &hint(shard_b, &id_b), Duration::ZERO).await.unwrap();
        let b_applied = async {
            while catalog.wal().is_pending(shard_b, &id_b).await.unwrap() {
                crate::env::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(DEADLINE, b_applied)
            .await
            .expect("the hint of shard B waited behind the apply pass of shard A");
        assert!(catalog.wal().is_pending(shard_a, &id_a).await.unwrap(), "shard A is still held");

        hold.open.send_replace(true);
        let a_applied = async {
            while catalog.wal().is_pending(shard_a, &id_a).await.unwrap() {
                crate::env::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(DEADLINE, a_applied).await.expect("shard A was not applied once released");
        stop_tx.send_replace(true);
        tokio::time::timeout(DEADLINE, worker).await.expect("the worker did not stop").unwrap();
    }
}
