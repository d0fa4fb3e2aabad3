//! Sort-value ranges prune on the server: a query with `row_to` reads the rows of its RowKey
//! range, not the rest of the partition (issue 10, item 6). Counts the entities the store
//! returns through a counting layer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::query::Filter;
use table_catalog::record::{self, Record};
use table_catalog::store::LocalStore;
use table_catalog::store::{BatchOp, Entity, OpKind, StoreResult, TableStore, MAX_BATCH_OPS};
use table_catalog::store::{Call, Layer, LayeredStore, Returned};
use table_catalog::testing::schema::Schema;

/// Counts the entities that point reads, queries and scans return (a [`Layer`], so the
/// store's delegation is written once, in `LayeredStore`).
#[derive(Default)]
struct EntitiesRead(AtomicU64);

impl Layer for EntitiesRead {
    async fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, mut attempt: F) -> StoreResult<T>
    where
        T: Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: std::future::Future<Output = StoreResult<T>> + Send + 'a,
    {
        let result = attempt().await;
        if let (Ok(r), OpKind::Get | OpKind::Query | OpKind::Scan) = (&result, call.op) {
            self.0.fetch_add(r.returned() as u64, Ordering::SeqCst);
        }
        result
    }
}

type Counting = LayeredStore<EntitiesRead>;

/// Entities read since the last call.
fn take(store: &Counting) -> u64 {
    store.layer().0.swap(0, Ordering::SeqCst)
}

const ROWS: usize = 10_000;

/// A catalog indexed by `grp` (all records in one partition) and sorted by `name`, holding
/// the sort values "0".."9999" and one empty sort value. Rows are written straight into
/// the catalog table (as the applier writes them), which keeps the setup fast.
async fn catalog() -> (Catalog, Arc<Counting>) {
    let store = Arc::new(LayeredStore::with_layer(Arc::new(LocalStore::in_memory().unwrap()), EntitiesRead::default()));
    let schema = Schema::new(vec!["grp".into()], "name").unwrap();
    let names = Names::new("pruning", None, None).unwrap();
    let cat = Catalog::open(store.clone(), names, schema.clone(), CatalogOptions::default()).await.unwrap();
    let mut rows = Vec::new();
    for name in (0..ROWS).map(|i| i.to_string()).chain([String::new()]) {
        let rec = record(&name);
        let keys = schema.record_keys(&rec).unwrap();
        let (_, pk) = &keys.partitions[0];
        rows.push(Entity {
            partition_key: pk.clone(),
            row_key: keys.row_key,
            etag: None,
            properties: record::to_properties(&rec, "2026-01-01T00:00:00.000000_setup"),
        });
    }
    let pk = rows[0].partition_key.clone();
    for chunk in rows.chunks(MAX_BATCH_OPS) {
        let ops: Vec<BatchOp> = chunk.iter().cloned().map(BatchOp::Insert).collect();
        store.batch(&cat.names().table, &pk, &ops).await.unwrap();
    }
    take(&store);
    (cat, store)
}

fn record(name: &str) -> Record {
    json!({"grp": "g", "name": name}).as_object().cloned().unwrap()
}

fn filter(from: Option<&str>, to: Option<&str>) -> Filter {
    Filter::new(vec![("grp".into(), "g".into())]).range(from.map(String::from), to.map(String::from))
}

/// The sort values within `from..=to`, computed by plain string comparison (digits and the
/// empty string: no case, escape or sigma rules apply).
fn expected(from: Option<&str>, to: Option<&str>) -> Vec<String> {
    let mut want: Vec<String> = (0..ROWS)
        .map(|i| i.to_string())
        .chain([String::new()])
        .filter(|s| from.is_none_or(|f| s.as_str() >= f) && to.is_none_or(|t| s.as_str() <= t))
        .collect();
    // RowKey order: "{sort}:{fp}", and ':' sorts after the digits.
    want.sort_by_key(|s| format!("{s}:"));
    want
}

fn names(records: &[Record]) -> Vec<String> {
    records.iter().map(|r| r["name"].as_str().unwrap_or_default().to_string()).collect()
}

#[tokio::test]
async fn row_to_starting_with_a_digit_reads_only_its_prefix() {
    let (cat, store) = catalog().await;
    let found = cat.query_all(&filter(None, Some("1000"))).await.unwrap();
    let read = take(&store);
    assert_eq!(names(&found), ["0", "1000", "100", "10", "1", ""], "RowKey order: ':' sorts after the digits");
    assert_eq!(names(&found), expected(None, Some("1000")));
    // The RowKey range is `lt '1;'` plus the empty sort value's keys: "0", the 1,111 sort
    // values starting with '1' and the empty one. Before the fix it was `lt ';'`: all 10,001.
    assert_eq!(read, 1 + 1111 + 1, "entities read for row_to=1000 (partition holds {})", ROWS + 1);
}

#[tokio::test]
async fn bounded_queries_return_exactly_the_range_and_read_little() {
    let (cat, store) = catalog().await;
    // (from, to, most entities the query may read: the rows of its RowKey ranges)
    let cases: [(Option<&str>, Option<&str>, u64); 7] = [
        // ["9990", ...): 9990..9999, the prefixes "9", "99", "999" (':' sorts after '9')
        // and the empty sort value's ":fp".
        (Some("9990"), None, 10 + 3 + 1),
        // ["42", "42;"): "42", "420".."429", "4200".."4299".
        (Some("42"), Some("420"), 1 + 10 + 100),
        // ["5", "5;"): every sort value starting with '5' (the prefix "5" is in range and its
        // RowKey "5:fp" sorts above "5999:fp").
        (Some("5"), Some("5001"), 1111),
        // ["0", "0;") holds "0" only; nothing above `to` is read.
        (Some("0"), Some("0"), 1),
        // ["", "0;") and the empty sort value's range.
        (Some(""), Some("0"), 2),
        (None, Some(""), 1),
        // Nothing can match: nothing is read.
        (Some("7"), Some("6"), 0),
    ];
    for (from, to, most) in cases {
        let found = cat.query_all(&filter(from, to)).await.unwrap();
        let read = take(&store);
        assert_eq!(names(&found), expected(from, to), "records for {from:?}..={to:?}");
        assert!(read <= most, "{from:?}..={to:?} read {read} entities, expected at most {most}");
    }
}

#[tokio::test]
async fn pages_continue_from_the_digit_range_into_the_empty_sort_value() {
    let (cat, store) = catalog().await;
    let f = filter(None, Some("1000"));
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = cat.query(&f, 2, token.as_deref()).await.unwrap();
        seen.extend(page.records.iter().map(|r| r.record["name"].as_str().unwrap_or_default().to_string()));
        match page.continuation {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, expected(None, Some("1000")));
    assert!(take(&store) < 2 * 1113, "paging re-reads at most the pruned range per page boundary");
}
