//! Migrating a one-shard catalog (the WAL partition `wal` only, as every catalog before
//! shards) to 4 shards by opening it with `shards = 4`, on the embedded store and on Azurite.
//!
//! 1. A catalog created with `shards = 1` logs entries without applying them (upserts and a
//!    delete by filter, all in `wal`, as an old process would have left them) and stops.
//! 2. Opened with `shards = 4`: the stored count becomes 4 and `status` lists 4 shards, the
//!    old entries still pending in `wal`. New writes spread over several shards, among them a
//!    new version of a record whose old version is pending in `wal` (now in another shard:
//!    the id fence must keep the new one), a new delete by filter that must see an old
//!    pending upsert and a new upsert in another shard (the barrier), and a new upsert of a
//!    record the old delete removes. Applying gives the state of applying everything in id
//!    order.
//! 3. A process opened afterwards with `shards = 1` finds the stored count still 4 (it is
//!    never lowered), routes its own upserts over 4 shards, and applies entries another
//!    process logged in shards 1..3.

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions, WalState};
use table_catalog::config::Names;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::store::Store;
use table_catalog::testing::schema::Schema;
use table_catalog::testing::verify;
use table_catalog::testing::wal::shard::stored_count;
use table_catalog::testing::wal::{Op, ShardId};

fn schema() -> Schema {
    Schema::new(vec!["a".into(), "g".into()], "name").unwrap()
}

/// Record `name` of group `g`, version `v`.
fn rec(name: &str, g: &str, v: u32) -> Record {
    json!({"name": name, "a": name, "g": g, "v": v}).as_object().cloned().unwrap()
}

fn by(field: &str, value: &str) -> Filter {
    Filter::new(vec![(field.into(), value.into())])
}

/// The shard an upsert of `r` goes to in a catalog of `count` shards.
fn shard_of(r: &Record, count: u16) -> ShardId {
    ShardId::for_row_key(&schema().record_keys(r).unwrap().row_key, count)
}

/// A record of group `g`, version `v`, named `{prefix}{i}` for the first `i` whose shard
/// (of 4) satisfies `want`.
fn rec_in(prefix: &str, g: &str, v: u32, want: impl Fn(ShardId) -> bool) -> Record {
    (0..1000).map(|i| rec(&format!("{prefix}{i}"), g, v)).find(|r| want(shard_of(r, 4))).unwrap()
}

async fn open(store: &Arc<dyn Store>, names: &Names, shards: u16) -> Catalog {
    let mut opts = CatalogOptions::default();
    opts.wal.shards = shards;
    Catalog::open(store.clone(), names.clone(), schema(), opts).await.unwrap()
}

/// The live record named `name`, if any.
async fn find(c: &Catalog, name: &str) -> Option<Record> {
    let found = c.query_all(&by("a", name)).await.unwrap();
    assert!(found.len() <= 1, "{name}: {found:?}");
    found.into_iter().next()
}

async fn migrate_one_shard_catalog_to_four(backend: common::Backend) {
    let store = common::store(backend);
    let names = Names::new(&common::unique_name("mig"), None, None).unwrap();
    let ctx = format!("{backend:?}");

    // 1. A one-shard catalog with entries logged in `wal`, none applied.
    let old = open(&store, &names, 1).await;
    assert_eq!(old.status().await.unwrap().shards.len(), 1, "{ctx}");
    assert_eq!(stored_count(store.as_ref(), &names.wal_table).await.unwrap(), 1, "{ctx}");
    // r1: deleted by the old delete, then written again by a new upsert. r2: a new version
    // comes later, routed to another shard. r3: written after the old delete (survives it).
    // r4: removed by a new delete. r7: removed by a new delete of its group.
    let r1 = rec_in("one", "ga", 1, |_| true);
    let r2 = rec_in("two", "gb", 1, |s| s != ShardId::ZERO);
    let r3 = rec_in("three", "ga", 1, |_| true);
    let r4 = rec_in("four", "gb", 1, |_| true);
    let r7 = rec_in("seven", "gc", 1, |_| true);
    let mut old_ids = Vec::new();
    for op in [
        Op::Upsert { record: r1.clone() },
        Op::Upsert { record: r2.clone() },
        Op::Upsert { record: r4.clone() },
        Op::Upsert { record: r7.clone() },
        Op::Delete { filter: by("g", "ga") },
        Op::Upsert { record: r3.clone() },
    ] {
        old_ids.extend(old.wal().append(vec![(ShardId::ZERO, op)]).await.unwrap());
    }
    let st = old.status().await.unwrap();
    assert_eq!((st.pending, st.shards.len()), (6, 1), "{ctx}: {st:?}");
    drop(old);

    // 2. Opened with 4 shards: the count is raised, the old entries wait in `wal`.
    let new = open(&store, &names, 4).await;
    assert_eq!(stored_count(store.as_ref(), &names.wal_table).await.unwrap(), 4, "{ctx}");
    let st = new.status().await.unwrap();
    let listed: Vec<&str> = st.shards.iter().map(|s| s.shard.as_str()).collect();
    assert_eq!(listed, ["wal", "wal-01", "wal-02", "wal-03"], "{ctx}: {st:?}");
    assert_eq!(st.shards.iter().map(|s| s.pending).collect::<Vec<_>>(), [6, 0, 0, 0], "{ctx}: {st:?}");
    for id in &old_ids {
        assert_eq!(new.wal_state(id.as_str()).await.unwrap(), WalState::Pending, "{ctx}");
    }

    // New writes, none applied yet. Many upserts: they land in several shards.
    let mut shards = BTreeSet::new();
    for i in 0..24 {
        let w = new.upsert(rec(&format!("many{i}"), "gm", 1), false).await.unwrap();
        shards.insert(w.shard.unwrap());
    }
    assert!(shards.len() >= 3, "{ctx}: 24 new upserts landed in {shards:?} only");
    let r2_new = rec(r2["name"].as_str().unwrap(), "gb", 2);
    let w = new.upsert(r2_new.clone(), false).await.unwrap();
    assert_ne!(w.shard, Some(ShardId::ZERO), "{ctx}: r2's new version goes to another shard than its old one");
    // A new upsert in another shard, then a delete of its group (and of the old r7).
    let r8 = rec_in("eight", "gc", 1, |s| s != ShardId::ZERO);
    new.upsert(r8.clone(), false).await.unwrap();
    new.delete(by("g", "gc"), false).await.unwrap();
    // A new delete of the old pending r4.
    new.delete(by("a", r4["name"].as_str().unwrap()), false).await.unwrap();
    // r1 again, after the old delete that removes its first version.
    let r1_new = rec(r1["name"].as_str().unwrap(), "ga", 2);
    new.upsert(r1_new.clone(), false).await.unwrap();
    let st = new.status().await.unwrap();
    assert!(st.shards[0].pending >= 6 + 2, "{ctx}: {st:?}");
    assert!(st.shards[1..].iter().filter(|s| s.pending > 0).count() >= 2, "{ctx}: {st:?}");

    new.recover().await.unwrap();
    let st = new.status().await.unwrap();
    assert!(st.shards.iter().all(|s| s.pending == 0), "{ctx}: {st:?}");
    assert_eq!((st.pending, st.dead), (0, 0), "{ctx}: {st:?}");
    for id in &old_ids {
        let state = new.wal_state(id.as_str()).await.unwrap();
        // Neither pending nor dead: applied (below or at its shard's checkpoint).
        assert!(matches!(state, WalState::Unknown | WalState::Applied), "{ctx}: {state:?}");
    }
    assert_eq!(find(&new, r1["name"].as_str().unwrap()).await, Some(r1_new.clone()), "{ctx}: r1");
    assert_eq!(find(&new, r2["name"].as_str().unwrap()).await, Some(r2_new), "{ctx}: r2 (new version wins)");
    assert_eq!(find(&new, r3["name"].as_str().unwrap()).await, Some(r3.clone()), "{ctx}: r3 (after the old delete)");
    assert_eq!(find(&new, r4["name"].as_str().unwrap()).await, None, "{ctx}: r4 (new delete saw the old upsert)");
    assert_eq!(new.query_all(&by("g", "gc")).await.unwrap(), Vec::<Record>::new(), "{ctx}: r7, r8");
    assert_eq!(new.query_all(&by("g", "ga")).await.unwrap().len(), 2, "{ctx}: r1, r3");
    assert_eq!(new.query_all(&by("g", "gm")).await.unwrap().len(), 24, "{ctx}");

    // 3. A process configured with one shard: the count stays 4, and it applies all 4.
    let one = open(&store, &names, 1).await;
    assert_eq!(stored_count(store.as_ref(), &names.wal_table).await.unwrap(), 4, "{ctx}");
    assert_eq!(one.wal().shard_count(), 4, "{ctx}: the stored count is in force");
    assert_eq!(one.status().await.unwrap().shards.len(), 4, "{ctx}");
    let mut logged = BTreeSet::new();
    for i in 0..24 {
        logged.insert(new.upsert(rec(&format!("late{i}"), "gl", 1), false).await.unwrap().shard.unwrap());
        logged.insert(one.upsert(rec(&format!("own{i}"), "go", 1), false).await.unwrap().shard.unwrap());
    }
    assert!(logged.iter().filter(|s| **s != ShardId::ZERO).count() >= 2, "{ctx}: {logged:?}");
    assert!(one.status().await.unwrap().shards[1..].iter().any(|s| s.pending > 0), "{ctx}");
    one.recover().await.unwrap();
    let st = one.status().await.unwrap();
    assert_eq!(st.shards.len(), 4, "{ctx}: {st:?}");
    assert!(st.shards.iter().all(|s| s.pending == 0), "{ctx}: {st:?}");
    assert_eq!(one.query_all(&by("g", "gl")).await.unwrap().len(), 24, "{ctx}");
    assert_eq!(one.query_all(&by("g", "go")).await.unwrap().len(), 24, "{ctx}");
    let report = verify::verify(store.as_ref(), &names.table, &schema()).await.unwrap();
    assert!(report.ok(), "{ctx}: {:?}", report.violations);
    assert_eq!(stored_count(store.as_ref(), &names.wal_table).await.unwrap(), 4, "{ctx}");

    if backend == common::Backend::Azurite {
        for t in [&names.table, &names.wal_table] {
            let _ = store.delete_table(t).await;
        }
        for q in [&names.queue, &names.poison_queue] {
            let _ = store.delete_queue(q).await;
        }
    }
}

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_shard_catalog_migrates_to_four_shards_and_never_back(backend) {
        migrate_one_shard_catalog_to_four(backend).await;
    }
}

/// Copies fixture folder `tests/data/compat/{name}` (a catalog a real older build wrote,
/// tests/data/compat/README.md) to a fresh temporary folder: opening a file in place can
/// rewrite it.
fn fixture_copy(name: &str) -> tempfile::TempDir {
    let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/compat").join(name);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(from.join("catalog.sqlite3"), dir.path().join("catalog.sqlite3")).unwrap();
    dir
}

/// Issue 27, item 6 (upgrades, tested against real older builds): catalogs written by the
/// release build of f9c09a6, the last commit before online index changes, open with this
/// build (the schema from the stored row, as an unconfigured process reads it), verify
/// clean, answer the lookups that build answered, apply an entry that build logged and left
/// pending, take writes and an online index change; and once the indexes changed, the
/// stored row is one that build refuses (its field-name check fails on the marker).
#[tokio::test]
async fn catalogs_written_by_the_build_of_f9c09a6_open_verify_and_take_writes() {
    use table_catalog::store::{Durability, LocalStore};
    use table_catalog::testing::wal::schema_row;
    for fixture in ["f9c09a6", "f9c09a6-pending"] {
        let dir = fixture_copy(fixture);
        let store: Arc<dyn Store> = Arc::new(LocalStore::open(dir.path(), Durability::Full).unwrap());
        let names = Names::new("airports", None, None).unwrap();
        let stored = schema_row::read(store.as_ref(), &names.wal_table).await.unwrap().expect("a schema row");
        assert_eq!((stored.index_keys.join(","), stored.row_key.as_str()), ("icao,iata,lid".into(), "name"));
        let schema = Schema::new(stored.index_keys.clone(), stored.row_key.clone()).unwrap();
        let c = Catalog::open(store.clone(), names.clone(), schema.clone(), CatalogOptions::default()).await.unwrap();
        c.recover().await.unwrap();
        assert_eq!(c.status().await.unwrap().pending, 0, "{fixture}");
        let report = verify::verify(store.as_ref(), &names.table, &c.schema()).await.unwrap();
        assert!(report.ok(), "{fixture}: {:?}", report.findings);
        // What the old build answered (tests/data/compat/README.md).
        let one = |f: &str, v: &str| {
            let c = &c;
            let (f, v) = (f.to_string(), v.to_string());
            async move { c.query_all(&by(&f, &v)).await.unwrap() }
        };
        let lowell = one("icao", "00AK").await;
        assert_eq!(lowell.len(), 1, "{fixture}");
        assert_eq!(lowell[0]["elevation"], json!(260), "{fixture}: the second upsert wins");
        assert!(one("icao", "00AA").await.is_empty(), "{fixture}: deleted by the old build");
        if fixture == "f9c09a6-pending" {
            let pending = one("icao", "ZZOL").await;
            assert_eq!(pending.len(), 1, "the old build's pending entry, applied by this one");
            assert_eq!(pending[0]["name"], json!("Old Pending Field"));
        }
        // Writes and an online index change, then verify again.
        let new = json!({"icao": "ZZNW", "iata": "ZNW", "lid": "ZZNW", "name": "New Field", "country": "XN"});
        c.upsert(new.as_object().cloned().unwrap(), true).await.unwrap();
        c.delete(by("icao", "00AK"), true).await.unwrap();
        assert_eq!(one("iata", "ZNW").await.len(), 1);
        assert!(one("icao", "00AK").await.is_empty());
        let c = Arc::new(c);
        table_catalog::indexes::add(&c, "country").await.unwrap();
        let row = schema_row::read_row(store.as_ref(), &names.wal_table).await.unwrap().unwrap();
        let stored_keys = row.str("index_keys").unwrap().to_string();
        assert!(stored_keys.ends_with(schema_row::CHANGED_MARKER), "{stored_keys}");
        // The old build, unconfigured, would build its schema from this list: refused.
        assert!(Schema::new(Schema::parse_list(&stored_keys), "name").is_err(), "{stored_keys}");
        let report = verify::verify(store.as_ref(), &names.table, &c.schema()).await.unwrap();
        assert!(report.ok(), "{fixture} after writes: {:?}", report.findings);
    }
}

/// Issue 30, item 2 (leases and checkpoints per shard): shard k ≥ 1 keeps its lease and
/// checkpoint rows in its own partition, not in `metadata`; a catalog from before the move,
/// whose checkpoint of shard k is `metadata/checkpoint-wal-{k:02}`, reads it while the new
/// row is missing, and the first advance starts the new row at the larger of the two, so
/// the checkpoint never reads lower across the upgrade (an entry that is no longer pending
/// stays at or below it).
async fn a_legacy_checkpoint_is_a_floor_and_shards_keep_their_rows_in_their_partition(backend: common::Backend) {
    use table_catalog::store::{Entity, Value};
    let store = common::store(backend);
    let names = Names::new(&common::unique_name("floor"), None, None).unwrap();
    let c = open(&store, &names, 4).await;
    let one = ShardId::new(1).unwrap();
    let legacy = "2999-01-01T00:00:00.000000_00000000-0000-0000-0000-000000000000";
    let row = Entity::new("metadata", "checkpoint-wal-01").with("datetime", Value::String(legacy.into()));
    store.insert(&names.wal_table, &row).await.unwrap();
    assert_eq!(c.wal().checkpoint(one).await.unwrap().map(|w| w.as_str().to_string()).as_deref(), Some(legacy));

    // An upsert in shard 1, applied: its id is below the legacy value, which stays.
    let r = rec_in("floor", "x", 1, |s| s == one);
    let id = c.upsert(r, true).await.unwrap().id;
    let own = store.get(&names.wal_table, "wal-01", "checkpoint").await.unwrap().expect("shard 1's own checkpoint row");
    assert_eq!(own.str("datetime"), Some(legacy), "the first advance folds the legacy value in");
    // Below the checkpoint, neither pending nor dead: applied.
    assert_eq!(c.wal_state(id.as_str()).await.unwrap(), WalState::Unknown, "{id}");

    // The lease of shard 1 is `wal-01/lease`; `metadata` holds no lease or checkpoint of it.
    assert!(store.get(&names.wal_table, "wal-01", "lease").await.unwrap().is_some());
    assert!(store.get(&names.wal_table, "metadata", "lease-wal-01").await.unwrap().is_none());
    // Shard 0 keeps the reference's rows.
    let zero_rec = rec_in("zero", "x", 1, |s| s == ShardId::ZERO);
    c.upsert(zero_rec, true).await.unwrap();
    assert!(store.get(&names.wal_table, "metadata", "checkpoint").await.unwrap().is_some());
    assert!(store.get(&names.wal_table, "metadata", "lease-wal").await.unwrap().is_some());
    assert!(store.get(&names.wal_table, "wal", "checkpoint").await.unwrap().is_none());
}

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_legacy_checkpoint_is_a_floor_and_shards_keep_their_rows_in_their_partition(backend) {
        a_legacy_checkpoint_is_a_floor_and_shards_keep_their_rows_in_their_partition(backend).await;
    }
}
