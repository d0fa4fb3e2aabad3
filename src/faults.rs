//! Named crash points on the write and apply paths, for the reliability tests.
//!
//! Each call site names a step (`before_clock_publish`, `after_wal_write`, `before_enqueue`, `after_fanout_row`,
//! `before_history_write`, `after_history_write`, `barrier_wait`, `before_seal`, `before_checkpoint`,
//! `before_remove_applied`). The two history points are passed only by a catalog that keeps
//! history ([`crate::history`]): after a change's catalog rows, and after its history rows. `barrier_wait` is passed each
//! time a replace or delete by filter finds another shard behind its id and waits at the
//! low-watermark barrier ([`crate::apply::barrier`]); `before_seal` each time a barrier raises a
//! shard's seal ([`crate::wal::seal`]), i.e. only on the way of a replace or delete. Without the `testing` feature,
//! [`point`] is an inlined `Ok(())` and costs nothing. With it, a test can install a hook that
//! makes a point fail (as if the process died there: the caller sees an error and stops), and
//! the environment variable `TABLE_CATALOG_CRASH_AT=name` (or `name:k` for the k-th hit)
//! aborts the process at that point, for kill tests across processes.

/// The named points of an online index change ([`crate::indexes`], "Crash safety"): after
/// the schema row is written, after the clock's schema version is raised, and in the apply
/// of the change's entry before its job starts. Not in [`POINTS`], whose every point lies
/// after a write's WAL entry.
#[cfg_attr(not(feature = "testing"), allow(dead_code))] // read by the tests only
pub const SCHEMA_POINTS: &[&str] = &["after_schema_row", "after_schema_clock", "before_schema_job"];

/// The named points, in path order.
#[cfg_attr(not(feature = "testing"), allow(dead_code))] // read by the tests only
pub const POINTS: &[&str] = &[
    "before_clock_publish",
    "after_wal_write",
    "before_enqueue",
    "after_fanout_row",
    "before_history_write",
    "after_history_write",
    "barrier_wait",
    "before_seal",
    "before_checkpoint",
    "before_remove_applied",
];

#[cfg(not(feature = "testing"))]
/// Passes the named point (no-op in this build).
#[inline(always)]
pub fn point(_name: &'static str) -> crate::error::Result<()> {
    Ok(())
}

#[cfg(feature = "testing")]
pub use enabled::*;

#[cfg(feature = "testing")]
mod enabled {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, RwLock};

    use crate::error::{Error, Result};
    use crate::store::StoreError;

    type Hook = Arc<dyn Fn(&str) -> bool + Send + Sync>;
    static HOOK: RwLock<Option<Hook>> = RwLock::new(None);
    static HITS: AtomicU64 = AtomicU64::new(0);

    /// Installs a hook: when it returns true for a point, that point fails.
    pub fn set_hook(hook: impl Fn(&str) -> bool + Send + Sync + 'static) {
        if let Ok(mut h) = HOOK.write() {
            *h = Some(Arc::new(hook));
        }
    }

    /// Removes the hook.
    pub fn clear_hook() {
        if let Ok(mut h) = HOOK.write() {
            *h = None;
        }
    }

    /// Passes the named point: fails it when the hook says so, aborts the process when
    /// `TABLE_CATALOG_CRASH_AT` names it.
    pub fn point(name: &'static str) -> Result<()> {
        if let Ok(spec) = std::env::var("TABLE_CATALOG_CRASH_AT") {
            let (want, k) = spec.split_once(':').map_or((spec.as_str(), 1), |(n, k)| (n, k.parse().unwrap_or(1)));
            if want == name && HITS.fetch_add(1, Ordering::SeqCst) + 1 == k {
                eprintln!("crash point {name}: aborting");
                std::process::abort();
            }
        }
        let hook = HOOK.read().ok().and_then(|h| h.clone());
        if hook.is_some_and(|h| h(name)) {
            // Not transient: a crash ends the pass (no in-pass retry); the process's
            // next pass, hint or sweep goes on from what the store holds.
            return Err(Error::Store(StoreError::Other(format!("injected crash at {name}"))));
        }
        Ok(())
    }
}
