//! Crashes around the history write: the apply path fails at `after_fanout_row`,
//! `before_history_write` (catalog rows written, history not), `after_history_write` and
//! `before_checkpoint` (history written, entries still pending), the first four times it passes
//! there; a new catalog instance (a restarted process, cold caches) recovers each time. Every
//! change must end with exactly one history row, on both backends.
//!
//! The crash-point hook is process-global, so this file holds one test.
#![cfg(feature = "testing")]

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::TryStreamExt;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::history::{HistoryEntry, HistoryOptions};
use table_catalog::record::Record;
use table_catalog::store::Store;
use table_catalog::testing::faults;
use table_catalog::testing::store::pager;

use common::history_fixtures::{f, jfk, lga};

async fn open(store: Arc<dyn Store>, names: &Names) -> Catalog {
    let mut o = CatalogOptions::default();
    o.wal.shards = 4;
    o.wal.lease_duration = std::time::Duration::from_millis(300);
    o.history = HistoryOptions::on();
    Catalog::open(store, names.clone(), common::airports_schema(), o).await.unwrap()
}

fn identity(r: &Record) -> String {
    common::airports_schema().record_keys(r).unwrap().row_key
}

/// The variants take turns: the crash-point hook is process-global.
use crate::TURN;

/// On the in-memory store under simulated time: each restart waits out the crashed pass's
/// leases (300 ms), which takes no real time here.
#[tokio::test(start_paused = true)]
async fn a_crash_before_or_after_the_history_write_leaves_exactly_one_row_per_change() {
    let _sim = common::simulated();
    let _turn = TURN.lock().await;
    crash_and_recover(common::Backend::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_or_after_the_history_write_leaves_exactly_one_row_per_change_on_azurite() {
    if let Some(azurite) = common::azurite() {
        let _turn = TURN.lock().await;
        crash_and_recover(azurite).await;
    }
}

async fn crash_and_recover(backend: common::Backend) {
    {
        for point in ["after_fanout_row", "before_history_write", "after_history_write", "before_checkpoint"] {
            let store = common::store(backend);
            let names = Names::new(&common::unique_name("hcrash"), None, None).unwrap();
            let c = open(store.clone(), &names).await;
            // Log everything first, then apply with the faults on.
            let ups: Vec<String> = c
                .upsert_many(vec![jfk(1), jfk(2), jfk(3), lga("LGA", 21)], false)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            let replaced = c.replace(f("icao", "KLGA"), lga("LGA", 22), false).await.unwrap().id;
            let moved = c.replace(f("iata", "LGA"), lga("LGX", 23), false).await.unwrap().id;
            let deleted = c.delete(f("lid", "JFK"), false).await.unwrap().id;
            c.hints_settled().await;

            let hits = Arc::new(AtomicU64::new(0));
            let h = hits.clone();
            // The first four passes fail (groups of several rows pass `after_fanout_row` once per
            // row, so failing every other pass would never let one through).
            faults::set_hook(move |p| p == point && h.fetch_add(1, Ordering::SeqCst) < 4);
            let mut restarts = 0;
            loop {
                let fresh = open(store.clone(), &names).await;
                let done = fresh.recover().await.is_ok() && fresh.status().await.unwrap().pending == 0;
                if done {
                    break;
                }
                restarts += 1;
                assert!(restarts < 100, "{backend:?} {point}: no progress");
                // A crashed pass may leave shard leases held (300 ms) by the dead instance.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            faults::clear_hook();
            assert!(hits.load(Ordering::SeqCst) >= 2 && restarts >= 1, "{backend:?} {point}: the point was never hit");

            let table = c.applier().history_table().unwrap().to_string();
            let rows: Vec<HistoryEntry> = pager::scan_entities(store.as_ref(), &table, 1000)
                .map_err(table_catalog::Error::from)
                .and_then(|e| std::future::ready(HistoryEntry::from_entity(&e)))
                .try_collect()
                .await
                .unwrap();
            let mut found: BTreeMap<(String, String), (usize, bool)> = BTreeMap::new();
            for r in &rows {
                let slot = found.entry((r.identity.clone(), r.wal_id.clone())).or_insert((0, r.record.is_some()));
                slot.0 += 1;
            }
            let (j, l, x) = (identity(&jfk(0)), identity(&lga("LGA", 0)), identity(&lga("LGX", 0)));
            let want: BTreeMap<(String, String), (usize, bool)> = [
                ((j.clone(), ups[0].clone()), (1, true)),
                ((j.clone(), ups[1].clone()), (1, true)),
                ((j.clone(), ups[2].clone()), (1, true)),
                ((j, deleted), (1, false)),
                ((l.clone(), ups[3].clone()), (1, true)),
                ((l.clone(), replaced), (1, true)),
                ((l, moved.clone()), (1, false)),
                ((x, moved), (1, true)),
            ]
            .into();
            assert_eq!(found, want, "{backend:?} {point} after {restarts} restarts");
        }
    }
}
