//! In-memory backend: tables and queues in `BTreeMap`s behind one mutex, with the semantics
//! of the other backends (the conformance suite, [`super::conformance`], is the judge).
//!
//! What it is for: the deterministic simulator (issue 26: catalog instances, clients and
//! faults on one thread, a tokio current-thread runtime with paused time, where one seed
//! gives one execution) and fast tests. The embedded store ([`super::local`]) cannot serve
//! there: its answers come from other OS threads, so with paused time the runtime sees
//! itself idle and auto-advances the clock at moments that depend on thread scheduling.
//!
//! What it does not model: latency, throttling, `503 ServerBusy`, lost or duplicated
//! responses. Those are wrappers around any store: [`super::sim`] (latency and scalability
//! targets) and `super::fault` (injected failures, feature `testing`). Nothing is
//! persisted; the data lives as long as the last clone of the store.
//!
//! Determinism rules (the same calls in the same order give the same answers, ETags and ids
//! included):
//! - no threads, no real time, no randomness: every method completes without awaiting
//!   anything, under one `std::sync::Mutex`, and iterates only ordered maps;
//! - ETags are `W/"1"`, `W/"2"`, ... from a per-store counter; queue message ids (`msg-1`,
//!   ...) and pop receipts (`rcpt-1`, ...) come from counters too;
//! - queue visibility reads "now" from `crate::env::now` in one private helper
//!   (`queues::now`): it follows tokio's paused clock in the simulator and real time
//!   elsewhere;
//! - keys compare by UTF-16 code units (`crate::store::key_rules::cmp_utf16`), the order of the Table
//!   service, Azurite and the embedded store's `UTF16` collation: astral characters
//!   (surrogate pairs) sort below U+E000..U+FFFF;
//! - receives return the visible messages in (visible since, put order) order, as the
//!   embedded store does.
//!
//! Pages split exactly at the requested limit (capped at [`super::MAX_PAGE`]) unless the
//! store is built with [`MemStore::with_short_pages`] (a fixed pattern) or
//! [`MemStore::with_random_short_pages`] (drawn from the random source, the simulation's seed
//! there), which return short and empty pages with tokens the way Azure may, to exercise
//! callers' continuation loops.

mod queues;
mod tables;
#[cfg(test)]
mod tests;

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The in-memory store. Cheap to clone; clones share the data (several simulated catalog
/// instances on one "storage account").
#[derive(Clone, Default)]
pub struct MemStore {
    state: Arc<Mutex<State>>,
    /// How query pages are cut.
    pages: Pages,
}

/// How query pages are cut (see [`MemStore::with_short_pages`],
/// [`MemStore::with_random_short_pages`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Pages {
    /// Every page full up to its limit.
    #[default]
    Full,
    /// Full, empty, half, full, empty, half, ...
    Pattern,
    /// Each page, the first included, cut with this probability to a size drawn uniformly
    /// from 0 to its limit less one.
    Random(f64),
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStore").field("pages", &self.pages).finish_non_exhaustive()
    }
}

impl MemStore {
    /// An empty store: no tables, no queues; pages are full up to their limit.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// An empty store whose query pages (`query_partition`, `query_partitions`, `scan`) are
    /// cut on a fixed pattern, as Azure may cut them: the first page of a query is full, the
    /// second empty, the third half the limit (at least one entity), then again full, empty,
    /// half, ...; every cut page with entities left after it carries a token. The pattern
    /// depends only on the page's place in its query (carried in the token), so it is
    /// deterministic, and every three pages make progress. `count_range` is not paged.
    pub fn with_short_pages() -> MemStore {
        MemStore { pages: Pages::Pattern, ..MemStore::default() }
    }

    /// An empty store whose query pages are cut at random: each page, the first of a query
    /// included, with probability `probability` (clamped to 0..=1) holds a number of
    /// entities drawn uniformly from 0 to its limit less one, and carries a token when
    /// entities are left after it. Draws come from `crate::env::with_rng`, so in a
    /// simulation the cuts replay from its seed; the expected number of pages per query grows
    /// by a factor of at most 1 / (1 - `probability`), so a query always ends.
    pub fn with_random_short_pages(probability: f64) -> MemStore {
        let probability = if probability.is_finite() { probability.clamp(0.0, 1.0) } else { 0.0 };
        MemStore { pages: Pages::Random(probability), ..MemStore::default() }
    }

    /// Runs `f` on the state under the lock. Never held across an await: `f` is synchronous.
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A panic inside `f` (a bug) leaves no half-applied change behind: every change
        // is made after its checks passed, so the state is usable after a poisoning.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut state)
    }
}

/// Everything the store holds.
#[derive(Default)]
struct State {
    /// Tables by lowercased name (table names are case-insensitive).
    tables: BTreeMap<String, tables::Table>,
    /// Queues by name.
    queues: BTreeMap<String, queues::Queue>,
    /// Last number used for an ETag, a message id, a pop receipt.
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    etag: u64,
    message: u64,
    receipt: u64,
}

impl Counters {
    fn etag(&mut self) -> super::ETag {
        self.etag += 1;
        super::ETag(format!("W/\"{}\"", self.etag))
    }

    /// A message's put order and id.
    fn message_id(&mut self) -> (u64, String) {
        self.message += 1;
        (self.message, format!("msg-{}", self.message))
    }

    fn pop_receipt(&mut self) -> String {
        self.receipt += 1;
        format!("rcpt-{}", self.receipt)
    }
}

/// A PartitionKey or RowKey in a map: ordered by UTF-16 code units, as the service orders
/// keys (Rust's `String` order is UTF-8 bytes, i.e. code points).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key(String);

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        crate::store::key_rules::cmp_utf16(&self.0, &other.0)
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Key {
    fn new(s: &str) -> Key {
        Key(s.to_string())
    }
}
