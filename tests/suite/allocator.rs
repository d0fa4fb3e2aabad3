//! The WAL id allocator (src/wal/clock.rs, src/wal/append.rs): the high row raised by
//! conditional replaces and group commit must keep the order invariant — an operation acknowledged before another one
//! is issued gets the smaller id — across processes and whatever their clocks say.

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::sync::Arc;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::record::Record;
use table_catalog::testing::wal::WalId;

fn rec(i: usize) -> Record {
    json!({"icao": format!("K{i:05}"), "name": format!("n{i}")}).as_object().cloned().unwrap()
}

async fn open(store: Arc<dyn table_catalog::store::Store>, names: &Names, skew_us: i64) -> Catalog {
    let mut o = CatalogOptions::default();
    o.wal.clock_skew_us = skew_us;
    let schema = table_catalog::testing::schema::Schema::new(vec!["icao".into()], "name").unwrap();
    Catalog::open(store, names.clone(), schema, o).await.unwrap()
}

/// A fresh store of `backend` and the names of a new catalog on it.
fn fresh(backend: common::Backend) -> (Arc<dyn table_catalog::store::Store>, Names) {
    (common::store(backend), Names::new(&common::unique_name("alloc"), None, None).unwrap())
}

/// The timestamp (µs) of an acknowledged write's WAL id.
fn micros(id: &str) -> i64 {
    WalId::parse(id).unwrap().micros().unwrap()
}

/// Now plus `hours` (negative: ago), in µs, as WAL ids count time.
fn hours_from_now(hours: i64) -> i64 {
    table_catalog::testing::wal::id::now_micros() + hours * 3600 * 1_000_000
}

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_id_issued_after_an_ack_in_another_process_is_larger_whatever_the_clocks(backend) {
        let (store, names) = fresh(backend);
        // Three "processes": clocks 10 s ahead, right, and 10 s behind.
        let fast = open(store.clone(), &names, 10_000_000).await;
        let right = open(store.clone(), &names, 0).await;
        let slow = open(store.clone(), &names, -10_000_000).await;
        let mut last: Option<WalId> = None;
        for (i, c) in [&fast, &slow, &right, &slow, &fast, &slow].into_iter().enumerate() {
            let id = WalId::parse(&c.upsert(rec(i), false).await.unwrap().id).unwrap();
            if let Some(prev) = &last {
                assert!(&id > prev, "{backend:?}: write {i} got {id}, not above the acknowledged {prev}");
            }
            last = Some(id);
        }
    }
}

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_get_distinct_ids_in_acknowledgement_order(backend) {
        let (store, names) = fresh(backend);
        let a = Arc::new(open(store.clone(), &names, 0).await);
        let b = Arc::new(open(store.clone(), &names, -5_000_000).await);
        // 4 waves of 32 concurrent writes over two processes: every id of a wave is above
        // every id of the waves acknowledged before it.
        let mut floor: Option<WalId> = None;
        let mut seen = std::collections::BTreeSet::new();
        for wave in 0..4 {
            let tasks: Vec<_> = (0..32)
                .map(|i| {
                    let c = if i % 2 == 0 { a.clone() } else { b.clone() };
                    tokio::spawn(async move { c.upsert(rec(wave * 100 + i), false).await.map(|w| w.id) })
                })
                .collect();
            let mut ids = Vec::new();
            for t in tasks {
                ids.push(WalId::parse(&t.await.unwrap().unwrap()).unwrap());
            }
            for id in &ids {
                assert!(seen.insert(id.clone()), "{backend:?}: id {id} handed out twice");
                if let Some(f) = &floor {
                    assert!(id > f, "{backend:?}: wave {wave} id {id} not above the earlier wave's {f}");
                }
            }
            floor = ids.into_iter().max();
        }
        a.recover().await.unwrap();
        assert_eq!(a.status().await.unwrap().pending, 0);
    }
}

common::backend_tests! {
    /// A catalog from before the high row (`src/wal/clock.rs`): per-process clock rows, one
    /// of them far ahead (a skewed clock), and the schema row. The first process creates the
    /// high row from them (ids above the largest), the sweeper then removes them all, and a
    /// new process still allocates above them.
    #[tokio::test]
    async fn a_catalog_with_per_process_clock_rows_gets_a_high_row_above_them_and_the_sweeper_retires_them(backend) {
        use table_catalog::store::{Entity, Value};
        use table_catalog::testing::wal::clock::{row_key, CLOCK, HIGH_ROW, SCHEMA_ROW};
        let (store, names) = fresh(backend);
        store.create_table(&names.wal_table).await.unwrap();
        let two_hours_ago = hours_from_now(-2);
        let tomorrow = hours_from_now(24);
        let gone = |owner: &str, last: i64| {
            Entity::new(CLOCK, row_key(last, owner).as_str())
                .with("last", Value::Int64(last))
                .with("at", Value::Int64(two_hours_ago))
        };
        store.upsert(&names.wal_table, &gone("old", 1)).await.unwrap();
        store.upsert(&names.wal_table, &gone("max", tomorrow)).await.unwrap();
        store.upsert(&names.wal_table, &Entity::new(CLOCK, SCHEMA_ROW).with("version", Value::Int64(0))).await.unwrap();
        let c = open(store.clone(), &names, 0).await;
        let id = c.upsert(rec(1), false).await.unwrap().id;
        assert!(micros(&id) > tomorrow, "{backend:?}: {id}");
        let report = c.sweep().await.unwrap();
        assert_eq!(report.clocks_removed, 3, "{backend:?}: {report:?}");
        for row in [row_key(1, "old"), row_key(tomorrow, "max"), SCHEMA_ROW.to_string()] {
            assert!(store.get(&names.wal_table, CLOCK, &row).await.unwrap().is_none(), "{backend:?}: {row}");
        }
        assert!(store.get(&names.wal_table, CLOCK, HIGH_ROW).await.unwrap().is_some(), "{backend:?}");
        // Ids keep going above it, in this process and in a new one.
        let id = c.upsert(rec(2), false).await.unwrap().id;
        assert!(micros(&id) > tomorrow, "{backend:?}: {id}");
        let d = open(store.clone(), &names, 0).await;
        let id = d.upsert(rec(3), false).await.unwrap().id;
        assert!(micros(&id) > tomorrow, "{backend:?}: {id}");
    }
}

common::backend_tests! {
    #[tokio::test]
    async fn a_catalog_with_legacy_clock_rows_keeps_its_ids_increasing_and_the_sweeper_retires_them(backend) {
        use table_catalog::store::{Entity, Value};
        let (store, names) = fresh(backend);
        store.create_table(&names.wal_table).await.unwrap();
        // Rows of the two earlier designs: the single sequencer row and a per-process row,
        // one of them far ahead (a skewed clock).
        let tomorrow = hours_from_now(24);
        store
            .upsert(&names.wal_table, &Entity::new("metadata", "clock-wal").with("last", Value::Int64(5)))
            .await
            .unwrap();
        let ahead =
            Entity::new("metadata", "clock-p1").with("last", Value::Int64(tomorrow)).with("at", Value::Int64(1));
        store.upsert(&names.wal_table, &ahead).await.unwrap();
        let c = open(store.clone(), &names, 0).await;
        let id = c.upsert(rec(1), false).await.unwrap().id;
        assert!(micros(&id) > tomorrow, "{backend:?}: {id}");
        let report = c.sweep().await.unwrap();
        assert_eq!(report.clocks_removed, 2, "{backend:?}: {report:?}");
        for row in ["clock-wal", "clock-p1"] {
            assert!(store.get(&names.wal_table, "metadata", row).await.unwrap().is_none(), "{backend:?}: {row}");
        }
        // A process that starts after the legacy rows are gone still allocates above them.
        let d = open(store.clone(), &names, 0).await;
        let id2 = d.upsert(rec(2), false).await.unwrap().id;
        assert!(id2 > id, "{backend:?}: {id2} not above {id}");
    }
}

common::backend_tests! {
    #[tokio::test]
    async fn the_clock_partition_holds_one_row_whatever_the_number_of_processes(backend) {
        use futures::TryStreamExt;
        use table_catalog::testing::store::pager;
use table_catalog::store::{RowRange};
        let (store, names) = fresh(backend);
        let a = open(store.clone(), &names, 0).await;
        let b = open(store.clone(), &names, 0).await;
        for i in 0..10 {
            a.upsert(rec(i), false).await.unwrap();
            b.upsert(rec(100 + i), false).await.unwrap();
        }
        let rows: Vec<_> = pager::entities(store.as_ref(), &names.wal_table, "clock", &RowRange::default(), 1000)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{backend:?}: every publication raises the one high row: {rows:?}");
    }
}

common::backend_tests! {
    #[tokio::test]
    async fn a_one_entity_page_is_the_first_row_in_rowkey_order_whatever_the_insertion_order(backend) {
        use futures::TryStreamExt;
        use table_catalog::testing::store::pager;
use table_catalog::store::{Entity, RowRange};
        let store = common::store(backend);
        let table = common::unique_name("topone");
        store.create_table(&table).await.unwrap();
        for rk in ["5", "9", "1", "7", "3"] {
            store.upsert(&table, &Entity::new("clock", rk)).await.unwrap();
        }
        store.delete(&table, "clock", "1", &table_catalog::store::IfMatch::Any).await.unwrap();
        store.upsert(&table, &Entity::new("clock", "2")).await.unwrap();
        let first: Option<Entity> =
            pager::entities(store.as_ref(), &table, "clock", &RowRange::default(), 1).try_next().await.unwrap();
        assert_eq!(first.map(|e| e.row_key), Some("2".to_string()), "{backend:?}");
    }
}

common::backend_tests! {
    /// Publications of one process ran one after the other, one store write each, so a process
    /// completed at most one append round per publication (one per commit on the embedded
    /// store): publications queued behind a running one are served by the next, which publishes
    /// the largest value asked for, and each caller still returns only once its value is covered.
    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn publications_queued_behind_a_running_one_are_served_by_the_next(backend) {
        use table_catalog::store::CountingStore;
        use table_catalog::testing::store::fault::{Fault, FaultStore, Gate, Rule, Trigger};
        use table_catalog::store::OpKind;
        use table_catalog::store::TableStore;
        use table_catalog::testing::wal::clock::Clock;
        let counting = Arc::new(CountingStore::new(common::store(backend)));
        let faulty = Arc::new(FaultStore::new(counting.clone(), 1));
        let table = common::unique_name("coalesce");
        counting.create_table(&table).await.unwrap();
        let clock = Arc::new(Clock::new("p", 0));
        clock.publish(faulty.as_ref(), &table, 1_000).await.unwrap(); // creates the high row
        let before = counting.counts().snapshot();
        // The first of the 20 publications is held at the store until every other one has
        // queued behind it (a current-thread runtime: the test goes on only once the task
        // has polled all 20). Without the hold, a fast store could answer the first before
        // the others were polled (this test failed that way on the in-memory store).
        let gate = Gate::new();
        faulty.add(Rule::new(&[OpKind::Replace], Trigger::Nth(1), Fault::Hold(gate.clone())));
        let task = tokio::spawn({
            let (clock, faulty, table) = (clock.clone(), faulty.clone(), table.clone());
            async move {
                // The first publishes 1,001, the next the largest of the rest, 1,020.
                let publications = (1..=20).map(|i| {
                    let (clock, faulty, table) = (clock.clone(), faulty.clone(), table.clone());
                    async move { clock.publish(faulty.as_ref(), &table, 1_000 + i).await }
                });
                futures::future::join_all(publications).await
            }
        });
        gate.reached(1).await;
        gate.open();
        for done in task.await.unwrap() {
            done.unwrap();
        }
        let writes = counting.counts().snapshot().since(&before);
        let (replaces, reads) = (writes.op(OpKind::Replace), writes.op(OpKind::Get));
        assert_eq!(
            (replaces, reads),
            (2, 0),
            "{backend:?}: 20 queued publications cost {replaces} replaces and {reads} reads (the ETag of the last write serves the next)"
        );
        assert_eq!(
            clock.high_water(faulty.as_ref(), &table).await.unwrap(),
            1_020,
            "{backend:?}: the largest value is published"
        );
    }
}

common::backend_tests! {
    /// The hinter spaces its hints by the process's share of the writes (src/hinter.rs): its
    /// publications over the catalog's, counted by the high row (`n`, src/wal/pace.rs). A
    /// process alone keeps a share of 1; two processes taking turns get about half each (the
    /// hints of both together then stay at about one per gap). Rates are taken over windows
    /// of 200 ms, so the rounds are spread over a few of them.
    #[tokio::test]
    async fn a_process_alone_has_the_whole_write_share_and_two_taking_turns_split_it(backend) {
        use std::time::Duration;
        use table_catalog::testing::wal::clock::Clock;
        let store = common::store(backend);
        let table = common::unique_name("share");
        store.create_table(&table).await.unwrap();
        let (a, b) = (Clock::new("a", 0), Clock::new("b", 0));
        for _ in 0..40 {
            let high = a.read(store.as_ref(), &table).await.unwrap().high;
            a.publish(store.as_ref(), &table, a.reserve(high, 1)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        assert_eq!(a.write_share().get(), 1.0, "{backend:?}: alone, every publication is its own");
        for _ in 0..80 {
            for c in [&b, &a] {
                let high = c.read(store.as_ref(), &table).await.unwrap().high;
                c.publish(store.as_ref(), &table, c.reserve(high, 1)).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        for (name, c) in [("a", &a), ("b", &b)] {
            let share = c.write_share().get();
            assert!((0.3..0.7).contains(&share), "{backend:?}: {name} took turns with another process, share {share}");
        }
    }
}

common::backend_tests! {
    /// Append rounds in flight follow the process's share of the writes (src/wal/append.rs,
    /// `rounds_for`): a process alone starts a new round for each write that arrives while
    /// fewer than `MAX_ROUNDS` run (its pace, 2.9 ms between round starts, is shorter than a
    /// round); a process with a small share runs one, and the writes that arrive meanwhile
    /// wait for the next. Each round's clock read is held at a gate, so the reads that reach
    /// it are the rounds in flight. Writes arrive one at a time (a round takes every write
    /// queued when it starts, so writes spawned together would share one round whatever the
    /// limit).
    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn a_process_with_a_small_share_of_the_writes_runs_one_append_round_at_a_time(backend) {
        use std::time::Duration;
        use table_catalog::testing::store::fault::{Fault, FaultStore, Gate, Rule, Trigger};
        use table_catalog::store::OpKind;
        use table_catalog::testing::wal::append::MAX_ROUNDS;
        for (share, rounds) in [(1.0, MAX_ROUNDS), (1.0 / 8.0, 1)] {
            let faulty = Arc::new(FaultStore::new(common::store(backend), 1));
            let names = Names::new(&common::unique_name("rounds"), None, None).unwrap();
            let catalog = Arc::new(open(faulty.clone(), &names, 0).await);
            // The process's first round; then the share as the pace would estimate it (no
            // other observation of the clock closes a window while the rounds are held).
            catalog.upsert(rec(0), false).await.unwrap();
            catalog.wal().write_share().set(share);
            let gate = Gate::new();
            // Each round's clock read (a point read of the high row) waits at the gate.
            let clock_read = Rule::new(&[OpKind::Get], Trigger::Always, Fault::Hold(gate.clone()));
            faulty.add(clock_read.on(&names.wal_table).partition(table_catalog::testing::wal::clock::CLOCK));
            let mut writes = Vec::new();
            for i in 1..=MAX_ROUNDS + 2 {
                let c = catalog.clone();
                writes.push(tokio::spawn(async move { c.upsert(rec(i), false).await }));
                // The write's own round reaches the gate, if the limit lets it start one.
                let expect = i.min(rounds) as u64;
                let _ = tokio::time::timeout(Duration::from_secs(10), gate.reached(expect)).await;
            }
            // A round the limit should not have let start reaches the gate during the pause.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let arrived = gate.state().arrived;
            gate.open();
            for w in writes {
                w.await.unwrap().unwrap();
            }
            assert_eq!(
                arrived,
                rounds as u64,
                "{backend:?}: share {share}: {arrived} rounds in flight for {} writes",
                MAX_ROUNDS + 2
            );
        }
    }
}

common::backend_tests! {
    /// A process refuses writes once the queue waiting for an append round is full
    /// (`WalOptions::max_queued_writes`, src/wal/append.rs): at once, with 503-style
    /// `Error::Busy` and a retry delay, and without logging anything; what was queued before
    /// is logged and acknowledged. The clock read of the first round is held at a gate, so
    /// that round runs and the writes behind it wait (a share of 1/8: one round at a time).
    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn writes_past_a_full_append_queue_are_refused_at_once_and_write_nothing(backend) {
        use std::time::Duration;
        use table_catalog::store::OpKind;
        use table_catalog::testing::store::fault::{Fault, FaultStore, Gate, Rule, Trigger};
        let faulty = Arc::new(FaultStore::new(common::store(backend), 1));
        let names = Names::new(&common::unique_name("queuefull"), None, None).unwrap();
        let mut o = CatalogOptions::default();
        o.wal.max_queued_writes = 5;
        let schema = table_catalog::testing::schema::Schema::new(vec!["icao".into()], "name").unwrap();
        let catalog = Arc::new(Catalog::open(faulty.clone(), names.clone(), schema, o).await.unwrap());
        catalog.upsert(rec(0), false).await.unwrap();
        catalog.wal().write_share().set(1.0 / 8.0);
        let gate = Gate::new();
        let clock_read = Rule::new(&[OpKind::Get], Trigger::Always, Fault::Hold(gate.clone()));
        faulty.add(clock_read.on(&names.wal_table).partition(table_catalog::testing::wal::clock::CLOCK));
        // The first write's round holds at the gate; the next five fill the queue.
        let mut queued = Vec::new();
        for i in 1..=6 {
            let c = catalog.clone();
            queued.push(tokio::spawn(async move { c.upsert(rec(i), false).await }));
            if i == 1 {
                tokio::time::timeout(Duration::from_secs(10), gate.reached(1)).await.unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // the five are queued
        let refused = tokio::time::timeout(Duration::from_secs(1), catalog.upsert(rec(7), false))
            .await
            .expect("refused at once, not after the round");
        match refused {
            Err(table_catalog::Error::Busy { message, retry_after_secs }) => {
                assert_eq!(retry_after_secs, 1);
                assert!(message.contains("max_queued_writes"), "{message}");
            }
            other => panic!("{backend:?}: a write past a full queue: {other:?}"),
        }
        gate.open();
        for w in queued {
            w.await.unwrap().unwrap();
        }
        catalog.recover().await.unwrap();
        let by_icao = |i: usize| table_catalog::query::Filter::new(vec![("icao".into(), format!("K{i:05}"))]);
        for i in 0..=6 {
            assert_eq!(catalog.query_all(&by_icao(i)).await.unwrap().len(), 1, "{backend:?}: K{i:05}");
        }
        assert!(catalog.query_all(&by_icao(7)).await.unwrap().is_empty(), "{backend:?}: the refused write wrote nothing");
        // With the queue drained, writes are taken again.
        catalog.upsert(rec(7), false).await.unwrap();
    }
}
