//! History on the airports data set (issue 15, "Done when"): an import of airports plus
//! 1,000 updates and deletes yields exactly one history row per applied change, newest first.
//! `TC_HISTORY_AIRPORTS` sets how many airports are imported (default 4,000; 28,403 for all).

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::collections::BTreeMap;

use futures::TryStreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use table_catalog::catalog::CatalogOptions;
use table_catalog::history::{ChangeOp, HistoryEntry, HistoryOptions};
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::testing::import::{self, Format};
use table_catalog::testing::schema::Schema;
use table_catalog::testing::store::pager;

const FIELDS: [&str; 3] = ["icao", "iata", "lid"];

/// What the history of one identity must be, oldest first: (op, WAL id when known, record).
type Expected = Vec<(ChangeOp, Option<String>, Option<Record>)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn airports_plus_1000_updates_and_deletes_give_one_history_row_per_change() {
    let count: usize = std::env::var("TC_HISTORY_AIRPORTS").ok().and_then(|v| v.parse().ok()).unwrap_or(4_000);
    let opts = CatalogOptions { history: HistoryOptions::on(), ..CatalogOptions::default() };
    let c = common::catalog_with(common::Backend::Local, common::airports_schema(), opts).await;
    let schema: Schema = c.schema().as_ref().clone();
    let identity = |r: &Record| schema.record_keys(r).unwrap().row_key;
    let rows = import::read_file(&common::airports_csv(), Format::Csv, &c.schema()).unwrap();
    let rows: Vec<_> = rows.into_iter().take(count).collect();
    let imported: Vec<Record> = rows.iter().map(|(_, r)| r.clone().unwrap()).collect();
    let summary = import::import_rows(&c, rows, 500, |_| {}).await.unwrap();
    assert_eq!(summary.logged, imported.len());

    // The model: live records by identity, and the expected history of every identity.
    let mut live: BTreeMap<String, Record> = BTreeMap::new();
    let mut expected: BTreeMap<String, Expected> = BTreeMap::new();
    for r in &imported {
        live.insert(identity(r), r.clone());
        expected.entry(identity(r)).or_default().push((ChangeOp::Upsert, None, Some(r.clone())));
    }
    // 1,000 changes, issued one after the other (each acknowledged before the next, so WAL-id
    // order is issue order): 700 updates of a random airport (deleted ones come back), 300
    // deletes by one of its identifiers (of an airport already deleted, some match nothing).
    let mut rng = StdRng::seed_from_u64(15);
    let (mut updates, mut deletes, mut removed) = (0, 0, 0);
    for i in 0..1000 {
        let mut r = imported[rng.gen_range(0..imported.len())].clone();
        if rng.gen_bool(0.7) {
            r.insert("elevation".into(), json!(i));
            let id = c.upsert(r.clone(), false).await.unwrap().id;
            live.insert(identity(&r), r.clone());
            expected.entry(identity(&r)).or_default().push((ChangeOp::Upsert, Some(id), Some(r)));
            updates += 1;
        } else {
            let fields: Vec<&str> =
                FIELDS.iter().copied().filter(|f| r[*f].as_str().is_some_and(|v| !v.is_empty())).collect();
            let field = fields[rng.gen_range(0..fields.len())];
            let value = r[field].as_str().unwrap().to_string();
            let id = c.delete(Filter::new(vec![(field.into(), value.clone())]), false).await.unwrap().id;
            let matched: Vec<String> = live
                .iter()
                .filter(|(_, l)| l[field].as_str().is_some_and(|v| v.to_lowercase() == value.to_lowercase()))
                .map(|(k, _)| k.clone())
                .collect();
            for k in matched {
                live.remove(&k);
                expected.entry(k).or_default().push((ChangeOp::Delete, Some(id.clone()), None));
                removed += 1;
            }
            deletes += 1;
        }
    }
    c.recover().await.unwrap();
    assert_eq!(c.status().await.unwrap().pending, 0);

    let table = c.applier().history_table().unwrap().to_string();
    let rows: Vec<HistoryEntry> = pager::scan_entities(c.store().as_ref(), &table, 1000)
        .map_err(table_catalog::Error::from)
        .and_then(|e| std::future::ready(HistoryEntry::from_entity(&e)))
        .try_collect()
        .await
        .unwrap();
    let want_rows: usize = expected.values().map(Vec::len).sum();
    assert_eq!(rows.len(), want_rows, "one row per applied change");
    assert_eq!(want_rows, imported.len() + updates + removed);
    let mut found: BTreeMap<&str, Vec<&HistoryEntry>> = BTreeMap::new();
    for r in &rows {
        found.entry(r.identity.as_str()).or_default().push(r);
    }
    for (k, want) in &expected {
        let got = &found[k.as_str()];
        // Stored newest first: compare with the expected list reversed.
        assert_eq!(got.len(), want.len(), "{k}");
        for (g, (op, id, record)) in got.iter().zip(want.iter().rev()) {
            assert_eq!((g.op, &g.record), (*op, record), "{k}");
            if let Some(id) = id {
                assert_eq!(&g.wal_id, id, "{k}");
            }
        }
        assert!(got.windows(2).all(|w| w[0].wal_id > w[1].wal_id), "{k}: newest first");
    }
    // Read through the API by identifier: the same rows, newest first.
    let (k, want) = expected.iter().max_by_key(|(_, v)| v.len()).unwrap();
    let some = want.iter().find_map(|(_, _, r)| r.clone()).unwrap();
    let field = FIELDS.iter().find(|f| some[**f].as_str().is_some_and(|v| !v.is_empty())).unwrap();
    let page = c.history(field, some[*field].as_str().unwrap(), 1000, None).await.unwrap();
    let mine: Vec<&HistoryEntry> = page.history.iter().filter(|h| &h.identity == k).collect();
    assert_eq!(mine.len(), want.len());
    eprintln!(
        "history on airports: {} imported, {updates} updates, {deletes} deletes removing {removed} records: {} history rows",
        imported.len(),
        rows.len()
    );
}
