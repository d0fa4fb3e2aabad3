//! The in-memory store's data: [`MemStore`] and everything it holds under its lock (tables,
//! queues, counters), and the UTF-16-ordered key of its maps. Tables and queues operate on
//! it (`tables`, `queues`).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::env::Instant;
use crate::store::value::{ETag, Properties};

/// The in-memory store. Cheap to clone; clones share the data (several simulated catalog
/// instances on one "storage account").
#[derive(Clone, Default)]
pub struct MemStore {
    pub(super) state: Arc<Mutex<State>>,
    /// How query pages are cut.
    pub(super) pages: Pages,
}

/// How query pages are cut (see [`MemStore::with_short_pages`],
/// [`MemStore::with_random_short_pages`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) enum Pages {
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
    pub(super) fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A panic inside `f` (a bug) leaves no half-applied change behind: every change
        // is made after its checks passed, so the state is usable after a poisoning.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut state)
    }
}

/// Everything the store holds.
#[derive(Default)]
pub(super) struct State {
    /// Tables by lowercased name (table names are case-insensitive).
    pub(super) tables: BTreeMap<String, Table>,
    /// Queues by name.
    pub(super) queues: BTreeMap<String, Queue>,
    /// Last number used for an ETag, a message id, a pop receipt.
    pub(super) counters: Counters,
}

#[derive(Default)]
pub(super) struct Counters {
    etag: u64,
    message: u64,
    receipt: u64,
}

impl Counters {
    pub(super) fn etag(&mut self) -> ETag {
        self.etag += 1;
        ETag(format!("W/\"{}\"", self.etag))
    }

    /// A message's put order and id.
    pub(super) fn message_id(&mut self) -> (u64, String) {
        self.message += 1;
        (self.message, format!("msg-{}", self.message))
    }

    pub(super) fn pop_receipt(&mut self) -> String {
        self.receipt += 1;
        format!("rcpt-{}", self.receipt)
    }
}

/// A PartitionKey or RowKey in a map: ordered by UTF-16 code units, as the service orders
/// keys (Rust's `String` order is UTF-8 bytes, i.e. code points).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Key(pub(super) String);

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
    pub(super) fn new(s: &str) -> Key {
        Key(s.to_string())
    }
}

/// An entity as stored (its keys are the maps' keys).
pub(super) struct Stored {
    pub(super) etag: ETag,
    pub(super) properties: Properties,
}

/// One table: partitions by PartitionKey, entities by RowKey. A partition leaves the map
/// with its last entity.
#[derive(Default)]
pub(super) struct Table {
    pub(super) partitions: BTreeMap<Key, BTreeMap<Key, Stored>>,
}

/// One queue: messages by id.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) messages: BTreeMap<String, Message>,
}

pub(super) struct Message {
    /// Put order (the message counter's value), to order receives.
    pub(super) seq: u64,
    pub(super) text: String,
    /// Hidden until then (a delayed put, a receive's visibility timeout, a release).
    pub(super) visible_at: Instant,
    pub(super) dequeue_count: u32,
    /// The receipt of the latest delivery. A message never received holds a receipt
    /// no caller was given, so no receipt deletes it.
    pub(super) pop_receipt: String,
}
