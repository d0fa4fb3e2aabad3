//! Operator metrics in the Prometheus text format (`GET /api/metrics`), rendered per catalog
//! with `prometheus-client` (no global recorder: each [`crate::Catalog`] owns its
//! [`ApplyMetrics`], so tests running many catalogs in one process do not share counters).
//!
//! | metric | type | unit / labels | alert on |
//! |---|---|---|---|
//! | `tablecatalog_wal_pending{shard}` | gauge | entries | growing for minutes |
//! | `tablecatalog_wal_oldest_pending_age_seconds` | gauge | seconds (0 when none) | > a few minutes: applies stalled |
//! | `tablecatalog_wal_dead` | gauge | entries | > 0 |
//! | `tablecatalog_poison_queue_depth` | gauge | messages (approximate) | > 0 |
//! | `tablecatalog_apply_entries_total` | counter | entries applied (or moved aside as dead) by this process | rate 0 while pending > 0 |
//! | `tablecatalog_apply_passes_total` | counter | apply passes run by this process (not `Busy` ones) | |
//! | `tablecatalog_apply_duration_seconds` | histogram | seconds per apply pass | p99 near `apply_budget` |
//! | `tablecatalog_apply_retries_total` | counter | apply-queue messages that failed transiently (redelivered by the host or `serve`'s worker) | sustained rate |
//! | `tablecatalog_poisoned_messages_total` | counter | messages this process moved to the poison queue | any increase |
//! | `tablecatalog_storage_requests_total{op,outcome}` | counter | storage requests ([`crate::store::CountingStore`]) | `outcome="unavailable"` rate: throttling |
//! | `tablecatalog_storage_conflicts_total{status}` | counter | requests answered 409 (`status="409"`) or 412 (`status="412"`) | sustained 412 rate: contention |
//!
//! Request counters are present when the catalog has its store's counters
//! ([`crate::Catalog::with_request_counts`]; [`crate::Config::open`] does).
//!
//! Cost of one scrape: the gauges come from [`crate::Catalog::status`]: per WAL shard one
//! backlog query and one checkpoint read, plus one dead-partition count and one queue
//! metadata request, plus one shard-count read: `2 * shards + 3` storage requests when each
//! backlog fits a page of 1,000 keys, and at most `12 * shards + 13` however large the
//! backlog: counts stop at [`crate::wal::COUNT_CAP`] (10,000) per shard, and the status then
//! says `pending_capped` (the gauge is a lower bound).
//!
//! Not exported: attempts inside the Azure backend's retry layer (`src/store/azure/retry.rs`);
//! a storage call counts once, so `outcome="unavailable"` counts calls whose last attempt failed.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::status::Status;
use crate::store::counting::Outcome;

/// The `Content-Type` of the rendered text (Prometheus text exposition format 0.0.4).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Apply counters of one catalog (cheap to clone: the metrics are shared).
#[derive(Debug, Clone)]
pub struct ApplyMetrics {
    entries: Counter,
    passes: Counter,
    duration: Histogram,
    retries: Counter,
    poisoned: Counter,
}

impl Default for ApplyMetrics {
    fn default() -> ApplyMetrics {
        ApplyMetrics {
            entries: Counter::default(),
            passes: Counter::default(),
            // 1 ms .. ~33 s, doubling.
            duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            retries: Counter::default(),
            poisoned: Counter::default(),
        }
    }
}

impl ApplyMetrics {
    /// Records one apply pass that applied `applied` entries in `elapsed`, and logs it
    /// (one `info` line per pass: `shard`, `applied`, `duration_ms`, `outcome`).
    pub fn record_pass(&self, shard: &str, applied: usize, elapsed: Duration, outcome: &str) {
        self.passes.inc();
        self.entries.inc_by(applied as u64);
        self.duration.observe(elapsed.as_secs_f64());
        tracing::info!(shard, applied, duration_ms = elapsed.as_millis() as u64, outcome, "apply pass");
    }

    /// Counts an apply-queue message that failed transiently (it will be delivered again).
    pub fn retried(&self) {
        self.retries.inc();
    }

    /// Counts a message moved to the poison queue (its reason is logged by
    /// [`crate::Catalog::poison`]).
    pub fn poisoned(&self) {
        self.poisoned.inc();
    }
}

/// Renders `status` and `apply` as Prometheus text.
///
/// Errors: only a formatting error of the encoder (not expected with a `String`).
pub fn render(status: &Status, apply: &ApplyMetrics) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::with_prefix("tablecatalog");

    let pending = Family::<Vec<(String, String)>, Gauge>::default();
    for s in &status.shards {
        pending.get_or_create(&vec![("shard".into(), s.shard.clone())]).set(s.pending as i64);
    }
    reg.register("wal_pending", "WAL entries not yet applied, per shard", pending);

    let age = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    age.set(status.oldest_pending_age_ms.unwrap_or(0) as f64 / 1000.0);
    reg.register("wal_oldest_pending_age_seconds", "Age of the oldest pending WAL entry (0 when none)", age);

    let dead = Gauge::<i64>::default();
    dead.set(status.dead as i64);
    reg.register("wal_dead", "WAL entries that could not be applied", dead);

    let poison = Gauge::<i64>::default();
    poison.set(status.poison as i64);
    reg.register("poison_queue_depth", "Messages on the poison queue (approximate)", poison);

    reg.register("apply_entries", "WAL entries applied by this process", apply.entries.clone());
    reg.register("apply_passes", "Apply passes run by this process", apply.passes.clone());
    reg.register("apply_duration_seconds", "Duration of one apply pass", apply.duration.clone());
    reg.register(
        "apply_retries",
        "Apply-queue messages that failed transiently and will be retried",
        apply.retries.clone(),
    );
    reg.register("poisoned_messages", "Messages this process moved to the poison queue", apply.poisoned.clone());

    if let Some(req) = &status.requests {
        let requests = Family::<Vec<(String, String)>, Counter>::default();
        for (op, counts) in &req.by_op {
            for (outcome, n) in &counts.outcomes {
                let label = serde_json::to_value(outcome).ok().and_then(|v| v.as_str().map(String::from));
                let labels = vec![("op".into(), op.name().to_string()), ("outcome".into(), label.unwrap_or_default())];
                requests.get_or_create(&labels).inc_by(*n);
            }
        }
        reg.register("storage_requests", "Storage requests by operation and outcome", requests);

        let conflicts = Family::<Vec<(String, String)>, Counter>::default();
        conflicts.get_or_create(&vec![("status".into(), "409".into())]).inc_by(req.outcome(Outcome::Conflict));
        conflicts.get_or_create(&vec![("status".into(), "412".into())]).inc_by(req.outcome(Outcome::Precondition));
        reg.register(
            "storage_conflicts",
            "Storage requests answered 409 Conflict or 412 Precondition Failed",
            conflicts,
        );
    }

    let mut out = String::new();
    encode(&mut out, &reg)?;
    Ok(out)
}
