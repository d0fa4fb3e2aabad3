//! The catalog API end to end on the embedded store.

use std::sync::Arc;
use table_catalog::testing::CatalogInternals;

use serde_json::{json, Value};
use table_catalog::catalog::{Catalog, CatalogOptions, WalState};
use table_catalog::config::Names;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::store::LocalStore;
use table_catalog::testing::schema::Schema;
use table_catalog::Error;

async fn open() -> Catalog {
    let store = Arc::new(LocalStore::in_memory().unwrap());
    let schema = Schema::new(vec!["icao".into(), "iata".into(), "lid".into()], "name").unwrap();
    Catalog::open(store, Names::new("airports", None, None).unwrap(), schema, CatalogOptions::default()).await.unwrap()
}

fn rec(v: Value) -> Record {
    v.as_object().cloned().unwrap()
}

fn f(field: &str, value: &str) -> Filter {
    Filter::new(vec![(field.into(), value.into())])
}

fn jfk() -> Record {
    rec(
        json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport", "elevation": 13}),
    )
}

#[tokio::test]
async fn insert_is_found_by_every_identifier() {
    let c = open().await;
    let w = c.insert(jfk(), true).await.unwrap();
    assert!(w.applied);
    assert_eq!(c.wal_state(&w.id).await.unwrap(), WalState::Applied);
    for (field, value) in [("icao", "KJFK"), ("iata", "jfk"), ("lid", "JFK")] {
        let page = c.query(&f(field, value), 10, None).await.unwrap();
        assert_eq!(page.records.len(), 1, "{field}");
        assert_eq!(page.records[0].record, jfk());
    }
    let both = Filter::new(vec![("icao".into(), "kjfk".into()), ("iata".into(), "LGA".into())]);
    assert!(c.query(&both, 10, None).await.unwrap().records.is_empty());
    assert!(matches!(c.insert(jfk(), true).await, Err(Error::Conflict(_))));
    let status = c.status().await.unwrap();
    assert_eq!((status.pending, status.poison), (0, 0));
}

#[tokio::test]
async fn acknowledged_writes_apply_later_and_delete_follows_unapplied_insert() {
    let c = open().await;
    let a = c.upsert(jfk(), false).await.unwrap();
    assert_eq!(c.wal_state(&a.id).await.unwrap(), WalState::Pending);
    c.delete(f("iata", "JFK"), false).await.unwrap();
    assert_eq!(c.status().await.unwrap().pending, 2);
    c.recover().await.unwrap();
    for (field, value) in [("icao", "KJFK"), ("iata", "JFK"), ("lid", "JFK")] {
        assert!(c.query(&f(field, value), 10, None).await.unwrap().records.is_empty(), "{field}");
    }
    assert_eq!(c.status().await.unwrap().pending, 0);
}

#[tokio::test]
async fn replace_moves_a_record_between_index_values() {
    let c = open().await;
    c.upsert(jfk(), true).await.unwrap();
    let mut moved = jfk();
    moved.insert("iata".into(), json!("JFX"));
    c.replace(f("icao", "KJFK"), moved.clone(), true).await.unwrap();
    assert!(c.query(&f("iata", "JFK"), 10, None).await.unwrap().records.is_empty());
    for (field, value) in [("icao", "KJFK"), ("iata", "JFX"), ("lid", "JFK")] {
        let page = c.query(&f(field, value), 10, None).await.unwrap();
        assert_eq!(page.records.iter().map(|r| &r.record).collect::<Vec<_>>(), vec![&moved], "{field}");
    }
}

#[tokio::test]
async fn sparse_identifiers_get_no_row_and_ranges_page() {
    let c = open().await;
    let mut recs = Vec::new();
    for i in 0..25 {
        recs.push(rec(
            json!({"icao": format!("X{i:03}"), "iata": "", "lid": "SHARED", "name": format!("Field {i:02}")}),
        ));
    }
    let results = c.upsert_many(recs, true).await.unwrap();
    assert!(results.iter().all(|r| r.is_ok()));
    assert!(c.query(&f("iata", ""), 10, None).await.is_err(), "an empty value is not a query");
    let rows = c.store().scan(&c.names().table, 1000, None).await.unwrap().entities;
    assert_eq!(rows.len(), 50, "two rows per record: icao and lid");
    assert!(rows.iter().all(|e| !e.partition_key.starts_with("4_iata")), "no IATA rows");
    let mut all = Vec::new();
    let mut token = None;
    loop {
        let page = c.query(&f("lid", "shared"), 7, token.as_deref()).await.unwrap();
        all.extend(page.records.into_iter().map(|r| r.record["name"].as_str().unwrap().to_string()));
        match page.continuation {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(all.len(), 25);
    let ranged =
        c.query(&f("lid", "shared").range(Some("field 10".into()), Some("Field 14".into())), 100, None).await.unwrap();
    assert_eq!(ranged.records.len(), 5);
}

#[tokio::test]
async fn bad_input_is_rejected_and_writes_nothing() {
    let c = open().await;
    let cases = [
        (json!({"icao": "K"}), "row-key field 'name'"),
        (json!({"name": "x", "iata": ""}), "no value for any index field"),
        (json!({"name": "x", "icao": "k".repeat(600)}), "limit is 512"),
        (json!({"name": "x", "icao": "K", "PartitionKey": "p"}), "reserved"),
        (json!({"name": "x", "icao": "K", "_tc": 1}), "reserved"),
        (json!({"name": "x", "icao": "K", "a-b": 1}), "not a valid property name"),
        (json!({"name": "x", "icao": "K", "big": "x".repeat(300_000)}), "limit is 32768"),
    ];
    for (r, why) in cases {
        let err = c.upsert(rec(r), false).await.unwrap_err().to_string();
        assert!(err.contains(why), "{why}: {err}");
    }
    let err = c.query(&f("name", "x"), 10, None).await.unwrap_err().to_string();
    assert!(err.contains("'name' is not an index field"), "{err}");
    assert_eq!(c.status().await.unwrap().pending, 0, "nothing was logged");
}

#[tokio::test]
async fn queue_intents_are_logged_once_and_bad_ones_rejected_without_queue_transport() {
    use table_catalog::catalog::MessageOutcome;
    let c = open().await;
    let intent = json!({"v": 1, "op": "insert", "record": jfk()}).to_string();
    let first = c.process_message(&intent, "msg-1").await.unwrap();
    let again = c.process_message(&intent, "msg-1").await.unwrap();
    assert_eq!(first, again, "a redelivered intent maps to the same WAL entry");
    assert_eq!(c.query(&f("iata", "JFK"), 10, None).await.unwrap().records.len(), 1);
    let out = c.process_message("{not json", "msg-2").await.unwrap();
    assert!(matches!(out, MessageOutcome::Rejected { reason } if reason.contains("not valid JSON")));
    let bad = json!({"v": 1, "op": "insert", "record": {"icao": "K"}}).to_string();
    assert!(matches!(c.process_message(&bad, "msg-3").await.unwrap(), MessageOutcome::Rejected { .. }));
    // Poisoning is the dispatcher's (tests/suite/hostile.rs), not the catalog's.
    assert_eq!(c.status().await.unwrap().poison, 0);
}

#[tokio::test]
async fn schema_mismatch_is_reported() {
    let store = Arc::new(LocalStore::in_memory().unwrap());
    let names = Names::new("cat", None, None).unwrap();
    let s1 = Schema::new(vec!["a".into()], "b").unwrap();
    Catalog::open(store.clone(), names.clone(), s1, CatalogOptions::default()).await.unwrap();
    let s2 = Schema::new(vec!["a".into(), "c".into()], "b").unwrap();
    let err = Catalog::open(store, names, s2, CatalogOptions::default()).await.unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch(ref m) if m.contains("[a]")), "{err}");
}

#[tokio::test]
async fn an_apply_pass_stops_at_its_budget_and_hands_over() {
    use table_catalog::testing::apply::DrainOutcome;
    let store = Arc::new(LocalStore::in_memory().unwrap());
    let schema = Schema::new(vec!["icao".into()], "name").unwrap();
    let mut opts = CatalogOptions::default();
    opts.wal.apply_budget = std::time::Duration::ZERO;
    opts.wal.shards = 1; // one drain pass over one shard
    let c = Catalog::open(store, Names::new("budget", None, None).unwrap(), schema, opts).await.unwrap();
    let records: Vec<Record> =
        (0..300).map(|i| rec(json!({"icao": format!("K{i:04}"), "name": format!("n{i}")}))).collect();
    c.upsert_many(records, false).await.unwrap();
    // One group (a run of 64 upserts) per pass, then it stops with work left: a pass past its
    // deadline stops at the next group boundary, not at the end of its page of 128 entries.
    assert_eq!(c.recover().await.unwrap(), DrainOutcome::Partial { applied: 64 });
    assert_eq!(c.status().await.unwrap().pending, 236);
    // A queue message that runs out of budget enqueues a hint for the rest (sent by a
    // background task after the pass: wait for it, bounded).
    let queue = c.names().queue.clone();
    c.hints_settled().await; // the writes' own hints land first
    while c.store().approximate_count(&queue).await.unwrap() > 0 {
        let m = c.store().receive_messages(&queue, 32, std::time::Duration::from_secs(30)).await.unwrap();
        for m in m {
            c.store().delete_message(&queue, &m.id, &m.pop_receipt).await.unwrap();
        }
    }
    c.process_message(&table_catalog::testing::messages::hint_json("wal", "x"), "m1").await.unwrap();
    assert_eq!(c.status().await.unwrap().pending, 172);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while c.store().approximate_count(&queue).await.unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "no hint was enqueued for the rest");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn wal_state_reports_pending_applied_dead_and_unknown() {
    use table_catalog::store::{Entity, Value as V};
    use table_catalog::testing::wal::WalId;
    let c = open().await;
    let w = c.upsert(jfk(), false).await.unwrap();
    assert_eq!(c.wal_state(&w.id).await.unwrap(), WalState::Pending);
    // An entry no build can read (unknown format version) goes to the dead partition.
    let bad = WalId::new(table_catalog::testing::wal::id::now_micros() + 1_000_000, uuid::Uuid::new_v4());
    let entity = Entity::new("wal", bad.as_str()).with("v", V::Int32(99)).with("n", V::Int32(0));
    c.store().insert(&c.names().wal_table, &entity).await.unwrap();
    c.recover().await.unwrap();
    assert_eq!(c.wal_state(&w.id).await.unwrap(), WalState::Applied);
    assert_eq!(c.wal_state(bad.as_str()).await.unwrap(), WalState::Dead);
    assert!(c.wal().dead_reason(&bad).await.unwrap().is_some());
    let never = WalId::new(table_catalog::testing::wal::id::now_micros() + 60_000_000, uuid::Uuid::new_v4());
    assert!(matches!(c.wal_state(never.as_str()).await, Err(Error::NotFound(_))));
    // An id below the checkpoint that was never logged is not reported as applied (issue 28).
    let old = "2000-01-01T00:00:00.000000_00000000-0000-0000-0000-000000000000";
    assert_eq!(c.wal_state(old).await.unwrap(), WalState::Unknown);
}

/// `applied` only where the WAL knows it: the id is its shard's checkpoint. An entry applied
/// before a later one of the same shard is below the checkpoint: `unknown` ("applied if it
/// was ever logged"), as an id that was never logged is; the answer says so.
#[tokio::test]
async fn wal_state_says_applied_only_for_a_checkpoint() {
    let c = open().await;
    let first = c.upsert(jfk(), true).await.unwrap();
    assert_eq!(c.wal_state(&first.id).await.unwrap(), WalState::Applied);
    let mut newer = jfk();
    newer.insert("elevation".into(), json!(14));
    let second = c.upsert(newer, true).await.unwrap();
    assert_eq!(first.shard, second.shard, "one record, one shard");
    assert_eq!(c.wal_state(&second.id).await.unwrap(), WalState::Applied);
    assert_eq!(c.wal_state(&first.id).await.unwrap(), WalState::Unknown);
    let report = c.wal_entry_state(&first.id).await.unwrap();
    assert_eq!((report.id.as_str(), report.state), (first.id.as_str(), WalState::Unknown));
    assert!(report.detail.contains("applied if it was ever logged"), "{}", report.detail);
}
