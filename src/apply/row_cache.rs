//! What the applier last saw of catalog rows it wrote: `(PartitionKey, RowKey)` → (ETag,
//! WAL id of the write, schema version it was written under). It turns the update of a row
//! this process wrote or read before into one conditional replace instead of insert, 409,
//! read and replace, and lets an entry applied again in the same process (a group retried
//! after a 503) skip the rows it already wrote under its schema.
//!
//! Only a hint: a stale entry costs a failed conditional write (412 or 404) and the slow
//! path; it can never make a write go through that fencing would refuse, because every
//! write it enables is conditional on the cached ETag. It does make the applier skip a row
//! it remembers holding the same or a newer WAL id, which is wrong once something deleted
//! that row behind its back: the only such deleter is the job of `index drop`
//! (`crate::jobs::index`), so the cache is cleared whenever the schema version changes (an
//! index added again after a drop is a later version). Bounded: two generations of at most
//! [`GENERATION`] rows each; when the young one fills up, the old one is dropped.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::store::ETag;

/// Rows per generation (so at most twice this many are remembered; about 10 MiB).
pub const GENERATION: usize = 32_768;

type Key = (String, String);
/// What was seen of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Its ETag then.
    pub etag: ETag,
    /// The (effective) WAL id of the entry that wrote it.
    pub wal_id: String,
    /// The schema version it was written under ([`crate::record::RowMeta::schema_version`]).
    pub schema_version: u64,
}

/// One generation: row → what was seen of it.
type Generation = HashMap<Key, Seen>;

/// The cache (see the module docs).
#[derive(Debug, Default)]
pub struct RowCache {
    /// (young, old).
    gens: Mutex<(Generation, Generation)>,
}

impl RowCache {
    /// What was last seen of a row.
    pub fn get(&self, pk: &str, rk: &str) -> Option<Seen> {
        let g = self.gens.lock().unwrap_or_else(|p| p.into_inner());
        let key = (pk.to_string(), rk.to_string());
        g.0.get(&key).or_else(|| g.1.get(&key)).cloned()
    }

    /// Remembers a row's ETag, WAL id and schema version.
    pub fn put(&self, pk: &str, rk: &str, etag: ETag, wal_id: &str, schema_version: u64) {
        let mut g = self.gens.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.len() >= GENERATION {
            g.1 = std::mem::take(&mut g.0);
        }
        g.0.insert((pk.to_string(), rk.to_string()), Seen { etag, wal_id: wal_id.to_string(), schema_version });
    }

    /// Forgets every row.
    pub fn clear(&self) {
        let mut g = self.gens.lock().unwrap_or_else(|p| p.into_inner());
        *g = Default::default();
    }

    /// Forgets a row.
    pub fn forget(&self, pk: &str, rk: &str) {
        let mut g = self.gens.lock().unwrap_or_else(|p| p.into_inner());
        let key = (pk.to_string(), rk.to_string());
        g.0.remove(&key);
        g.1.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_forgets_and_stays_bounded() {
        let c = RowCache::default();
        c.put("p", "r", ETag("e1".into()), "id1", 2);
        assert_eq!(c.get("p", "r"), Some(Seen { etag: ETag("e1".into()), wal_id: "id1".into(), schema_version: 2 }));
        c.forget("p", "r");
        assert_eq!(c.get("p", "r"), None);
        for i in 0..(3 * GENERATION) {
            c.put("p", &i.to_string(), ETag(String::new()), "x", 0);
        }
        let g = c.gens.lock().unwrap();
        assert!(g.0.len() + g.1.len() <= 2 * GENERATION);
        assert!(g.0.contains_key(&("p".to_string(), (3 * GENERATION - 1).to_string())));
    }
}

/// Whether catalog rows this process has not seen before tend to exist already: an
/// exponentially weighted share of the recent unseen rows that existed (weight 1/16 for the
/// newest). When it is over one half, the fan-out reads such a row before writing it (2
/// requests for a changed row, instead of insert, 409, read, replace); otherwise it inserts
/// first (1 request for a new row). Only a cost model: either order is fenced the same way.
#[derive(Debug, Default)]
pub struct Existence {
    /// The share, in parts per 65,536.
    share: std::sync::atomic::AtomicU32,
}

impl Existence {
    const ONE: u32 = 1 << 16;

    /// True when an unseen row probably exists.
    pub fn likely(&self) -> bool {
        self.share.load(std::sync::atomic::Ordering::Relaxed) > Self::ONE / 2
    }

    /// Records whether an unseen row existed.
    pub fn note(&self, existed: bool) {
        use std::sync::atomic::Ordering;
        let _ = self.share.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
            Some(s - s / 16 + if existed { Self::ONE / 16 } else { 0 })
        });
    }
}

#[cfg(test)]
mod existence_tests {
    use super::Existence;

    #[test]
    fn the_existence_share_follows_the_workload() {
        let e = Existence::default();
        assert!(!e.likely(), "insert first until rows are seen to exist");
        for _ in 0..12 {
            e.note(true);
        }
        assert!(e.likely(), "mostly existing rows: read first");
        for _ in 0..12 {
            e.note(false);
        }
        assert!(!e.likely(), "mostly new rows again: insert first");
    }
}
