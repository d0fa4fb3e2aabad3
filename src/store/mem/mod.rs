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
//! Pages split exactly at the requested limit (capped at [`super::page::MAX_PAGE`]) unless the
//! store is built with [`MemStore::with_short_pages`] (a fixed pattern) or
//! [`MemStore::with_random_short_pages`] (drawn from the random source, the simulation's seed
//! there), which return short and empty pages with tokens the way Azure may, to exercise
//! callers' continuation loops.

mod queues;
mod state;
mod tables;
#[cfg(test)]
mod tests;

pub use state::MemStore;
