//! `serve`'s stand-in for the Functions host's queue listener: receives and dispatches
//! messages, at most `batchSize + newBatchThreshold` at once, receiving again as soon as a
//! slot is free (as the host fetches a new batch while earlier messages still run), so one
//! long message (an apply pass lasts up to its budget under load) never holds back the others.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::dispatcher::Dispatcher;

/// Tunables of the in-process listener that `host.json` does not cover.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// How long a received message stays invisible while it is handled (the host uses a
    /// 10-minute lease that it renews; a shorter one here redelivers sooner after a crash,
    /// and handling is idempotent).
    pub lease: Duration,
    /// Most messages at once; `None` = the policy's `batchSize + newBatchThreshold`.
    pub concurrency: Option<usize>,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions { lease: Duration::from_secs(30), concurrency: None }
    }
}

pub(super) async fn run(dispatcher: Arc<Dispatcher>, opts: WorkerOptions, mut stop: watch::Receiver<bool>) {
    let limit = opts.concurrency.unwrap_or_else(|| dispatcher.policy.concurrency()).max(1);
    let max_idle = dispatcher.policy.max_polling_interval.max(Duration::from_millis(20));
    let mut in_flight = tokio::task::JoinSet::new();
    // Polling an empty queue backs off from 20 ms to `max_polling_interval`, as the host
    // does, and starts again at 20 ms once a message came.
    let first = Duration::from_millis(20);
    let mut delays = crate::env::poll_delays(first, max_idle);
    let mut idle = first;
    loop {
        while in_flight.try_join_next().is_some() {}
        if *stop.borrow() {
            while in_flight.join_next().await.is_some() {}
            return;
        }
        let room = limit.saturating_sub(in_flight.len()).min(32);
        if room > 0 {
            match dispatcher.store.receive_messages(&dispatcher.queue, room, opts.lease).await {
                Ok(msgs) if !msgs.is_empty() => {
                    delays = crate::env::poll_delays(first, max_idle);
                    idle = first;
                    for m in msgs {
                        let d = dispatcher.clone();
                        in_flight.spawn(async move {
                            d.deliver(m).await;
                        });
                    }
                    continue;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(queue = %dispatcher.queue, error = %e, "receiving from the queue failed"),
            }
        }
        let wake = async {
            match dispatcher.handler.wake() {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // In order, not at random: one seed, one execution (src/env.rs).
            biased;
            changed = stop.changed() => {
                if changed.is_err() {
                    // The sender is gone: nobody can stop us any more, so stop now.
                    while in_flight.join_next().await.is_some() {}
                    return;
                }
            }
            // Full: wait for a slot.
            Some(_) = in_flight.join_next(), if room == 0 => {}
            _ = wake, if room > 0 => {
                delays = crate::env::poll_delays(first, max_idle);
                idle = first;
            }
            _ = crate::env::sleep(idle), if room > 0 => idle = delays.next().unwrap_or(max_idle),
        }
    }
}
