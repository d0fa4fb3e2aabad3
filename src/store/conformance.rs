//! The storage conformance suite: one set of cases every backend must pass, run on the
//! embedded store (`tests/suite/conformance.rs`) and on Azurite (`tests/suite/azure_store.rs`).
//!
//! Each case creates its own uniquely named table or queue and deletes it at the end, so
//! cases never depend on what an emulator kept from earlier runs. A failing case panics
//! with a message naming the case and the backend's answer.

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;

use super::error::StoreError;
use super::page::{PartitionRange, RowRange};
use super::pager;
use super::queue::Store;
use super::table::{BatchOp, IfMatch, MAX_BATCH_OPS};
use super::value::{Entity, Value};

/// A unique table name (alphanumeric, starts with a letter).
pub fn unique_table(prefix: &str) -> String {
    format!("{prefix}{}", &crate::env::uuid().simple().to_string()[..12])
}

/// A unique queue name (lowercase, dashes).
pub fn unique_queue(prefix: &str) -> String {
    format!("{prefix}-{}", &crate::env::uuid().simple().to_string()[..12])
}

/// Key strings that are legal in Azure but hard to carry through URLs and OData filters.
pub fn tricky_keys() -> Vec<String> {
    let mut keys: Vec<String> = [
        "it's",
        "''",
        "'",
        "a',RowKey='x",
        "x' or PartitionKey ne '",
        "100%",
        "50%25",
        "%41",
        "a+b",
        "a b",
        "a&b=c",
        "a)b(",
        "é",
        "😀",
        "",
        "\u{e000}",
        "~",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    keys.push("😀".repeat(256));
    keys.push("k".repeat(512));
    keys
}

/// Runs every case.
pub async fn run_all(store: &dyn Store) {
    entity_crud(store).await;
    typed_values_round_trip(store).await;
    entity_limits(store).await;
    tricky_keys_everywhere(store).await;
    conditional_writes(store).await;
    paging(store).await;
    range_queries(store).await;
    scan_orders_partitions(store).await;
    partition_range_queries(store).await;
    batches(store).await;
    queue_basics(store).await;
    queue_visibility_and_receipts(store).await;
    queue_limits(store).await;
}

fn e(pk: &str, rk: &str, n: i32) -> Entity {
    Entity::new(pk, rk).with("n", Value::Int32(n))
}

/// Insert, get, upsert, delete, missing tables.
pub async fn entity_crud(store: &dyn Store) {
    let t = unique_table("crud");
    assert!(
        matches!(store.get(&t, "p", "r").await, Err(StoreError::NotFound(_))),
        "get on a missing table is NotFound"
    );
    store.create_table(&t).await.unwrap();
    store.create_table(&t).await.expect("create_table is idempotent");
    assert_eq!(store.get(&t, "p", "r").await.unwrap(), None);
    let etag = store.insert(&t, &e("p", "r", 1)).await.unwrap();
    let got = store.get(&t, "p", "r").await.unwrap().expect("inserted entity is readable");
    assert_eq!(got.etag.as_ref(), Some(&etag));
    assert_eq!(got.properties["n"], Value::Int32(1));
    assert!(matches!(store.insert(&t, &e("p", "r", 2)).await, Err(StoreError::AlreadyExists(_))));
    let etag2 = store.upsert(&t, &e("p", "r", 3)).await.unwrap();
    assert_ne!(etag, etag2, "every write yields a new ETag");
    assert_eq!(store.get(&t, "p", "r").await.unwrap().unwrap().properties["n"], Value::Int32(3));
    store.upsert(&t, &e("p", "new", 4)).await.expect("upsert creates");
    store.delete(&t, "p", "r", &IfMatch::Any).await.unwrap();
    assert_eq!(store.get(&t, "p", "r").await.unwrap(), None);
    assert!(matches!(store.delete(&t, "p", "r", &IfMatch::Any).await, Err(StoreError::NotFound(_))));
    store.delete_table(&t).await.unwrap();
}

/// Every EDM type reads back exactly.
pub async fn typed_values_round_trip(store: &dyn Store) {
    let t = unique_table("types");
    store.create_table(&t).await.unwrap();
    let entity = Entity::new("p", "r")
        .with("s", Value::String("it's <&> \"q\" é 😀".into()))
        .with("empty", Value::String(String::new()))
        .with("i32min", Value::Int32(i32::MIN))
        .with("i64max", Value::Int64(i64::MAX))
        .with("i64min", Value::Int64(i64::MIN))
        .with("exact", Value::Int64(9_007_199_254_740_993))
        .with("d", Value::Double(0.1))
        .with("big", Value::Double(1e300))
        .with("nan", Value::Double(f64::NAN))
        .with("inf", Value::Double(f64::INFINITY))
        .with("b", Value::Bool(true))
        .with("bin", Value::Binary(vec![0, 1, 254, 255]))
        .with("guid", Value::Guid("c9da6455-213d-42c9-9a79-3e9149a57833".into()))
        .with("long", Value::String("x".repeat(32 * 1024)));
    store.insert(&t, &entity).await.unwrap();
    let got = store.get(&t, "p", "r").await.unwrap().unwrap();
    for (name, want) in &entity.properties {
        let have = got.properties.get(name).unwrap_or_else(|| panic!("property {name} missing"));
        match (want, have) {
            (Value::Double(a), Value::Double(b)) if a.is_nan() => assert!(b.is_nan(), "{name}"),
            _ => assert_eq!(want, have, "property {name}"),
        }
    }
    store.delete_table(&t).await.unwrap();
}

/// The Table service's entity limits, checked before I/O (Azurite enforces only some).
pub async fn entity_limits(store: &dyn Store) {
    let t = unique_table("limits");
    store.create_table(&t).await.unwrap();
    let mut full = Entity::new("p", "full");
    for i in 0..252 {
        full.properties.insert(format!("p{i}"), Value::Int32(i));
    }
    store.insert(&t, &full).await.expect("252 properties");
    let mut over = full.clone();
    over.row_key = "over".into();
    over.properties.insert("one_more".into(), Value::Int32(0));
    let bad = [
        over,
        e("p", "name1", 0).with("1abc", Value::Int32(1)),
        e("p", "name2", 0).with("a-b", Value::Int32(1)),
        e("p", "name3", 0).with("x".repeat(256), Value::Int32(1)),
        e("p", "str", 0).with("s", Value::String("é".repeat(32 * 1024 + 1))),
        e("p", "bin", 0).with("b", Value::Binary(vec![0; 64 * 1024 + 1])),
        (0..20).fold(e("p", "big", 0), |acc, i| acc.with(format!("s{i}"), Value::String("x".repeat(30_000)))),
    ];
    for entity in bad {
        let rk = entity.row_key.clone();
        assert!(matches!(store.insert(&t, &entity).await, Err(StoreError::InvalidInput(_))), "insert {rk}");
        assert!(matches!(store.upsert(&t, &entity).await, Err(StoreError::InvalidInput(_))), "upsert {rk}");
        assert!(
            matches!(store.batch(&t, "p", &[BatchOp::Insert(entity)]).await, Err(StoreError::InvalidInput(_))),
            "batch {rk}"
        );
        assert_eq!(store.get(&t, "p", &rk).await.unwrap(), None, "{rk} not written");
    }
    // Keys with a character Azure forbids, or over 512 UTF-16 units (no read back: Azurite
    // answers a GET of a key holding `/` with HTTP 500).
    for (pk, rk) in
        [("p", "a/b"), ("p", "a\\b"), ("p", "a#b"), ("p", "a?b"), ("p", "a\tb"), ("p", "a\u{7f}b"), ("p/q", "k")]
            .map(|(p, r)| (p.to_string(), r.to_string()))
            .into_iter()
            .chain([("p".to_string(), "k".repeat(513))])
    {
        let entity = e(&pk, &rk, 0);
        assert!(matches!(store.insert(&t, &entity).await, Err(StoreError::InvalidInput(_))), "insert {pk:?} {rk:?}");
        assert!(matches!(store.upsert(&t, &entity).await, Err(StoreError::InvalidInput(_))), "upsert {pk:?} {rk:?}");
        assert!(
            matches!(store.batch(&t, &pk, &[BatchOp::Insert(entity)]).await, Err(StoreError::InvalidInput(_))),
            "batch {pk:?} {rk:?}"
        );
    }
    store
        .insert(&t, &e("p", "ok", 0).with("s", Value::String("😀".repeat(16 * 1024))))
        .await
        .expect("32,768 UTF-16 units");
    store.delete_table(&t).await.unwrap();
}

/// Quotes, percent signs, plus, spaces, non-ASCII and 512-unit keys, as PartitionKey and
/// RowKey, through point reads, conditional writes, queries and batches.
pub async fn tricky_keys_everywhere(store: &dyn Store) {
    let t = unique_table("keys");
    store.create_table(&t).await.unwrap();
    let keys = tricky_keys();
    for (i, k) in keys.iter().enumerate() {
        let i = i as i32;
        let etag = store.insert(&t, &e(k, k, i)).await.unwrap_or_else(|err| panic!("insert {k:?}: {err}"));
        let got = store.get(&t, k, k).await.unwrap().unwrap_or_else(|| panic!("get {k:?}"));
        assert_eq!((got.partition_key.as_str(), got.row_key.as_str()), (k.as_str(), k.as_str()));
        let etag = store
            .replace(&t, &e(k, k, i + 100), &IfMatch::Etag(etag))
            .await
            .unwrap_or_else(|err| panic!("replace {k:?}: {err}"));
        let page = store.query_partition(&t, k, &RowRange::default(), 1000, None).await.unwrap();
        assert_eq!(page.entities.len(), 1, "query of partition {k:?}");
        assert_eq!(page.entities[0].properties["n"], Value::Int32(i + 100));
        let exact = RowRange { from: Some(k.clone()), to: Some(k.clone()), ..RowRange::default() };
        assert_eq!(store.query_partition(&t, k, &exact, 1000, None).await.unwrap().entities.len(), 1, "range on {k:?}");
        // The key as RowKey inside a batch (delete addresses it in the URL).
        let alt = if k.encode_utf16().count() >= 511 {
            format!("{}2", k.chars().skip(1).collect::<String>())
        } else {
            format!("{k}2")
        };
        store
            .batch(&t, k, &[BatchOp::Insert(e(k, &alt, 0))])
            .await
            .unwrap_or_else(|err| panic!("batch insert {k:?}: {err}"));
        store
            .batch(&t, k, &[BatchOp::Delete { row_key: alt.clone(), if_match: IfMatch::Any }])
            .await
            .unwrap_or_else(|err| panic!("batch delete {k:?}: {err}"));
        store.delete(&t, k, k, &IfMatch::Etag(etag)).await.unwrap_or_else(|err| panic!("delete {k:?}: {err}"));
        assert_eq!(store.get(&t, k, k).await.unwrap(), None, "{k:?} deleted");
    }
    // A quote must not let a key address another entity.
    store.insert(&t, &e("p", "a", 1)).await.unwrap();
    assert_eq!(store.get(&t, "p", "a',RowKey='x").await.unwrap(), None);
    assert_eq!(
        store
            .query_partition(&t, "p' or PartitionKey ne '", &RowRange::default(), 10, None)
            .await
            .unwrap()
            .entities
            .len(),
        0
    );
    store.delete_table(&t).await.unwrap();
}

/// ETag preconditions on replace and delete.
pub async fn conditional_writes(store: &dyn Store) {
    let t = unique_table("cond");
    store.create_table(&t).await.unwrap();
    let v1 = store.insert(&t, &e("p", "r", 1)).await.unwrap();
    let v2 = store.replace(&t, &e("p", "r", 2), &IfMatch::Etag(v1.clone())).await.unwrap();
    assert!(
        matches!(
            store.replace(&t, &e("p", "r", 3), &IfMatch::Etag(v1.clone())).await,
            Err(StoreError::PreconditionFailed(_))
        ),
        "replace with a stale ETag"
    );
    assert!(matches!(store.delete(&t, "p", "r", &IfMatch::Etag(v1)).await, Err(StoreError::PreconditionFailed(_))));
    assert!(
        matches!(store.replace(&t, &e("p", "ghost", 1), &IfMatch::Any).await, Err(StoreError::NotFound(_))),
        "replace never creates"
    );
    assert_eq!(store.get(&t, "p", "ghost").await.unwrap(), None);
    let v3 = store.replace(&t, &e("p", "r", 4), &IfMatch::Any).await.unwrap();
    assert_ne!(v2, v3);
    // An ETag returned by a query works as a precondition.
    let listed = store.query_partition(&t, "p", &RowRange::default(), 10, None).await.unwrap();
    let etag = listed.entities[0].etag.clone().expect("query results carry ETags");
    store.delete(&t, "p", "r", &IfMatch::Etag(etag)).await.unwrap();
    // Re-insert after delete gets a fresh ETag.
    let v4 = store.insert(&t, &e("p", "r", 5)).await.unwrap();
    assert_ne!(v4, v3);
    store.delete_table(&t).await.unwrap();
}

async fn fill(store: &dyn Store, t: &str, pk: &str, n: usize) {
    let entities: Vec<Entity> = (0..n).map(|i| e(pk, &format!("{i:05}"), i as i32)).collect();
    for chunk in entities.chunks(MAX_BATCH_OPS) {
        let ops: Vec<BatchOp> = chunk.iter().cloned().map(BatchOp::Insert).collect();
        store.batch(t, pk, &ops).await.unwrap();
    }
}

async fn read_all(store: &dyn Store, t: &str, pk: &str, range: &RowRange, page_size: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = store.query_partition(t, pk, range, page_size, token.as_deref()).await.unwrap();
        assert!(page.entities.len() <= page_size);
        out.extend(page.entities.into_iter().map(|e| e.row_key));
        match page.continuation {
            Some(next) => token = Some(next),
            None => return out,
        }
    }
}

/// Pages of at most 1,000 with continuation tokens: exact counts, order, no duplicates.
pub async fn paging(store: &dyn Store) {
    let t = unique_table("paging");
    store.create_table(&t).await.unwrap();
    for n in [0usize, 1, 999, 1000, 1001, 2500] {
        let pk = format!("p{n}");
        fill(store, &t, &pk, n).await;
        let keys = read_all(store, &t, &pk, &RowRange::default(), 1000).await;
        assert_eq!(keys.len(), n, "partition of {n}");
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "RowKey order for {n}");
        assert_eq!(keys.iter().collect::<HashSet<_>>().len(), n, "no duplicates for {n}");
        let counted = store.count_range(&t, &pk, &RowRange::default(), u64::MAX).await.unwrap();
        assert_eq!(counted, (n as u64, keys.first().cloned()), "count of {n}");
        let at_n = store.count_range(&t, &pk, &RowRange::default(), n as u64 + 1).await.unwrap();
        assert_eq!(at_n, counted, "a cap above the count of {n} counts exactly");
        if n > 1 {
            // A cap below the count: at least the cap, at most the count, and no page once
            // the cap is reached (a paged backend stops at the end of the page that reached it).
            let (capped, first) = store.count_range(&t, &pk, &RowRange::default(), 2).await.unwrap();
            assert!((2..=n as u64).contains(&capped) && capped <= 1000, "count of {n} capped at 2: {capped}");
            assert_eq!(first, keys.first().cloned());
        }
    }
    let small = read_all(store, &t, "p1001", &RowRange::default(), 7).await;
    assert_eq!(small.len(), 1001, "small pages");
    // First page of a limited query, then resume from its token.
    let first = store.query_partition(&t, "p2500", &RowRange::default(), 5, None).await.unwrap();
    assert_eq!(first.entities.len(), 5);
    let second =
        store.query_partition(&t, "p2500", &RowRange::default(), 5, first.continuation.as_deref()).await.unwrap();
    assert_eq!(second.entities[0].row_key, "00005");
    // A page size over 1,000 is capped.
    let capped = store.query_partition(&t, "p2500", &RowRange::default(), 5000, None).await.unwrap();
    assert_eq!(capped.entities.len(), 1000);
    assert!(capped.continuation.is_some());
    store.delete_table(&t).await.unwrap();
}

/// RowKey bounds, alone and combined, and UTF-16 ordering.
pub async fn range_queries(store: &dyn Store) {
    let t = unique_table("range");
    store.create_table(&t).await.unwrap();
    fill(store, &t, "p", 50).await;
    let r = |from: Option<&str>, after: Option<&str>, before: Option<&str>, to: Option<&str>| RowRange {
        from: from.map(String::from),
        after: after.map(String::from),
        before: before.map(String::from),
        to: to.map(String::from),
    };
    assert_eq!(read_all(store, &t, "p", &r(Some("00010"), None, None, Some("00019")), 1000).await.len(), 10);
    assert_eq!(read_all(store, &t, "p", &r(None, Some("00010"), Some("00019"), None), 1000).await.len(), 8);
    assert_eq!(read_all(store, &t, "p", &r(Some("00045"), None, None, None), 3).await.len(), 5);
    assert_eq!(read_all(store, &t, "p", &r(Some("1"), None, None, None), 1000).await.len(), 0);
    for (range, want) in [
        (r(Some("00010"), None, None, Some("00019")), (10, Some("00010".to_string()))),
        (r(None, Some("00010"), Some("00019"), None), (8, Some("00011".to_string()))),
        (r(Some("1"), None, None, None), (0, None)),
    ] {
        assert_eq!(store.count_range(&t, "p", &range, u64::MAX).await.unwrap(), want, "{range:?}");
    }
    // UTF-16 code-unit order: an emoji (surrogate U+D83D) sorts before U+E000 and U+FF5E.
    for k in ["\u{ff5e}", "\u{e000}", "😀", "z", "A", ""] {
        store.insert(&t, &e("u", k, 0)).await.unwrap();
    }
    let keys = read_all(store, &t, "u", &RowRange::default(), 1000).await;
    assert_eq!(keys, ["", "A", "z", "😀", "\u{e000}", "\u{ff5e}"]);
    let tail = RowRange { after: Some("z".into()), ..RowRange::default() };
    assert_eq!(store.count_range(&t, "u", &tail, u64::MAX).await.unwrap(), (3, Some("😀".into())));
    store.delete_table(&t).await.unwrap();
}

/// A whole-table scan walks partitions in order.
pub async fn scan_orders_partitions(store: &dyn Store) {
    let t = unique_table("scan");
    store.create_table(&t).await.unwrap();
    for pk in ["b", "a", "c"] {
        fill(store, &t, pk, 30).await;
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = store.scan(&t, 25, token.as_deref()).await.unwrap();
        seen.extend(page.entities.into_iter().map(|e| (e.partition_key, e.row_key)));
        match page.continuation {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    assert_eq!(seen.len(), 90);
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "scan order");
    store.delete_table(&t).await.unwrap();
}

/// `(PartitionKey, RowKey)` of every entity of a PartitionKey range query, through the pager.
async fn read_range(store: &dyn Store, t: &str, range: &PartitionRange, page_size: usize) -> Vec<(String, String)> {
    pager::range_pages(store, t, range, page_size)
        .map_ok(|page| {
            assert!(page.entities.len() <= page_size, "a page holds at most its size");
            page.entities.into_iter().map(|e| (e.partition_key, e.row_key)).collect::<Vec<_>>()
        })
        .try_concat()
        .await
        .unwrap_or_else(|err| panic!("range query {range:?}: {err}"))
}

/// PartitionKey range queries across partitions (the prefix scanner's query, seed 004):
/// exclusive and inclusive bounds, (PartitionKey, RowKey) order by UTF-16 code units,
/// `'\u{ffff}'` as an upper-bound sentinel, non-ASCII keys and surrogate pairs, paging.
pub async fn partition_range_queries(store: &dyn Store) {
    let t = unique_table("prange");
    assert!(
        matches!(store.query_partitions(&t, &PartitionRange::default(), 10, None).await, Err(StoreError::NotFound(_))),
        "range query on a missing table is NotFound"
    );
    store.create_table(&t).await.unwrap();
    assert_eq!(read_range(store, &t, &PartitionRange::default(), 10).await, [], "empty table");
    // In UTF-16 order: "" < "C" < "D" < "Da" < "Davis" < "D%41" ... see `want` below.
    let pks = ["Davis", "D", "", "E", "C", "D\u{e000}", "D😀", "Da", "D%41", "D\u{fffe}", "é", "😀x", "it's"];
    for pk in pks {
        for rk in ["b", "a", "😀"] {
            store.insert(&t, &e(pk, rk, 0)).await.unwrap_or_else(|err| panic!("insert {pk:?}/{rk:?}: {err}"));
        }
    }
    let want_pks = ["", "C", "D", "D%41", "Da", "Davis", "D😀", "D\u{e000}", "D\u{fffe}", "E", "it's", "é", "😀x"];
    let rows = |pks: &[&str]| -> Vec<(String, String)> {
        pks.iter().flat_map(|pk| ["a", "b", "😀"].map(|rk| (pk.to_string(), rk.to_string()))).collect()
    };
    let range = |after: Option<&str>, before: Option<&str>, to: Option<&str>| PartitionRange {
        after: after.map(String::from),
        before: before.map(String::from),
        to: to.map(String::from),
    };
    // Whole table, in (PartitionKey, RowKey) order, paged with continuation tokens.
    for page_size in [1000, 7, 1] {
        assert_eq!(
            read_range(store, &t, &PartitionRange::default(), page_size).await,
            rows(&want_pks),
            "order, pages of {page_size}"
        );
    }
    // Exclusive bounds on both ends.
    assert_eq!(
        read_range(store, &t, &range(Some("D"), Some("Davis"), None), 2).await,
        rows(&["D%41", "Da"]),
        "gt/lt exclusive"
    );
    assert_eq!(
        read_range(store, &t, &range(Some("D"), None, Some("Davis")), 2).await,
        rows(&["D%41", "Da", "Davis"]),
        "le inclusive"
    );
    // The empty PartitionKey is the smallest; `gt ''` excludes it.
    assert_eq!(read_range(store, &t, &range(None, Some("C"), None), 1000).await, rows(&[""]), "lt 'C'");
    assert_eq!(read_range(store, &t, &range(Some(""), Some("D"), None), 1000).await, rows(&["C"]), "gt ''");
    // U+FFFF sorts after every other character, astral ones (surrogates) included: the
    // prefix scanner's `PartitionKey gt 'D' and PartitionKey le 'D\u{ffff}'` is "D*".
    let d_star = rows(&["D%41", "Da", "Davis", "D😀", "D\u{e000}", "D\u{fffe}"]);
    assert_eq!(read_range(store, &t, &range(Some("D"), None, Some("D\u{ffff}")), 3).await, d_star, "D* by sentinel");
    assert_eq!(read_range(store, &t, &range(Some("D"), Some("D\u{ffff}"), None), 1000).await, d_star, "lt sentinel");
    assert_eq!(
        read_range(store, &t, &range(Some("D\u{ffff}"), None, None), 1000).await,
        rows(&["E", "it's", "é", "😀x"]),
        "gt sentinel"
    );
    assert_eq!(
        read_range(store, &t, &range(Some("Davis"), None, Some("D\u{ffff}")), 1000).await,
        rows(&["D😀", "D\u{e000}", "D\u{fffe}"]),
        "after Davis within D*"
    );
    // Astral characters sort below U+E000 and above ASCII.
    assert_eq!(
        read_range(store, &t, &range(Some("é"), Some("\u{e000}"), None), 1000).await,
        rows(&["😀x"]),
        "surrogate pair range"
    );
    // An empty range, and a quote that must stay inside its literal.
    assert_eq!(read_range(store, &t, &range(Some("E"), Some("C"), None), 1000).await, [], "empty range");
    assert_eq!(
        read_range(store, &t, &range(Some("it'r"), None, Some("it's")), 1000).await,
        rows(&["it's"]),
        "quote in a bound"
    );
    // A short first page still resumes exactly after its last entity.
    let first = store.query_partitions(&t, &range(Some("C"), None, None), 4, None).await.unwrap();
    assert_eq!(first.entities.len(), 4);
    let token = first.continuation.clone().expect("more entities follow");
    let second = store.query_partitions(&t, &range(Some("C"), None, None), 4, Some(&token)).await.unwrap();
    assert_eq!((second.entities[0].partition_key.as_str(), second.entities[0].row_key.as_str()), ("D%41", "b"));
    // A page size over 1,000 is capped.
    assert!(store.query_partitions(&t, &PartitionRange::default(), 5000, None).await.unwrap().entities.len() <= 1000);
    store.delete_table(&t).await.unwrap();
}

/// Entity group transactions: limits checked before I/O, atomic failure with its index.
pub async fn batches(store: &dyn Store) {
    let t = unique_table("batch");
    store.create_table(&t).await.unwrap();
    let ops = |n: usize, pk: &str| (0..n).map(|i| BatchOp::Insert(e(pk, &format!("{i:03}"), 0))).collect::<Vec<_>>();
    let etags = store.batch(&t, "full", &ops(100, "full")).await.unwrap();
    assert_eq!(etags.len(), 100);
    assert!(
        matches!(store.batch(&t, "over", &ops(101, "over")).await, Err(StoreError::InvalidInput(_))),
        "101 operations"
    );
    let mut mixed = ops(2, "m1");
    mixed.push(BatchOp::Insert(e("m2", "x", 0)));
    assert!(matches!(store.batch(&t, "m1", &mixed).await, Err(StoreError::InvalidInput(_))), "mixed partitions");
    assert_eq!(read_all(store, &t, "m2", &RowRange::default(), 1000).await.len(), 0);
    let dup = vec![BatchOp::Insert(e("d", "x", 0)), BatchOp::Upsert(e("d", "x", 1))];
    assert!(matches!(store.batch(&t, "d", &dup).await, Err(StoreError::InvalidInput(_))), "duplicate RowKey");
    // Failures at index 0, 50 and 99 leave nothing written.
    store.insert(&t, &e("f", "050", 0)).await.unwrap();
    let v = store.insert(&t, &e("f2", "099", 0)).await.unwrap();
    store.upsert(&t, &e("f2", "099", 1)).await.unwrap();
    let cases: Vec<(&str, Vec<BatchOp>, usize)> = vec![
        ("f", ops(100, "f"), 50),
        (
            "f0",
            {
                let mut o = ops(10, "f0");
                o[0] = BatchOp::Replace(e("f0", "000", 1), IfMatch::Any);
                o
            },
            0,
        ),
        (
            "f2",
            {
                let mut o = ops(100, "f2");
                o[99] = BatchOp::Replace(e("f2", "099", 2), IfMatch::Etag(v));
                o
            },
            99,
        ),
    ];
    for (pk, batch, want) in cases {
        match store.batch(&t, pk, &batch).await {
            Err(StoreError::BatchFailed { index, .. }) => assert_eq!(index, want, "failing index in {pk}"),
            other => panic!("batch in {pk} should fail at {want}: {other:?}"),
        }
        let left = read_all(store, &t, pk, &RowRange::default(), 1000).await;
        assert!(left.len() <= 1, "batch in {pk} must write nothing, found {}", left.len());
    }
    // Replace with If-Match never creates, in a batch either.
    let r = store.batch(&t, "g", &[BatchOp::Replace(e("g", "ghost", 0), IfMatch::Any)]).await;
    assert!(matches!(r, Err(StoreError::BatchFailed { index: 0, .. })));
    assert_eq!(store.get(&t, "g", "ghost").await.unwrap(), None);
    // Mixed operation kinds.
    store.insert(&t, &e("k", "a", 0)).await.unwrap();
    let ops = vec![
        BatchOp::Upsert(e("k", "b", 1)),
        BatchOp::Replace(e("k", "a", 2), IfMatch::Any),
        BatchOp::Insert(e("k", "c", 3)),
    ];
    store.batch(&t, "k", &ops).await.unwrap();
    store.batch(&t, "k", &[BatchOp::Delete { row_key: "c".into(), if_match: IfMatch::Any }]).await.unwrap();
    assert_eq!(read_all(store, &t, "k", &RowRange::default(), 1000).await, ["a", "b"]);
    store.delete_table(&t).await.unwrap();
}

/// Put, receive, delete, counts.
pub async fn queue_basics(store: &dyn Store) {
    let q = unique_queue("basic");
    store.create_queue(&q).await.unwrap();
    store.create_queue(&q).await.expect("create_queue is idempotent");
    let text = "{\"json\":1} <&> \"quoted\" 'single' ünï 😀";
    store.put_message(&q, text, Duration::ZERO).await.unwrap();
    assert_eq!(store.approximate_count(&q).await.unwrap(), 1);
    let got = store.receive_messages(&q, 32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].text, text);
    assert_eq!(got[0].dequeue_count, 1);
    assert!(store.receive_messages(&q, 32, Duration::from_secs(30)).await.unwrap().is_empty(), "hidden while leased");
    store.delete_message(&q, &got[0].id, &got[0].pop_receipt).await.unwrap();
    assert!(matches!(store.delete_message(&q, &got[0].id, &got[0].pop_receipt).await, Err(StoreError::NotFound(_))));
    assert_eq!(store.approximate_count(&q).await.unwrap(), 0);
    // A delayed message is invisible until its delay passes.
    store.put_message(&q, "later", Duration::from_secs(3600)).await.unwrap();
    assert!(store.receive_messages(&q, 1, Duration::from_secs(30)).await.unwrap().is_empty());
    store.delete_queue(&q).await.unwrap();
}

/// Visibility timeout, redelivery with a higher dequeue count, pop receipts.
pub async fn queue_visibility_and_receipts(store: &dyn Store) {
    let q = unique_queue("vis");
    store.create_queue(&q).await.unwrap();
    store.put_message(&q, "m", Duration::ZERO).await.unwrap();
    let first = store.receive_messages(&q, 1, Duration::from_secs(1)).await.unwrap().remove(0);
    let mut second = Vec::new();
    for _ in 0..40 {
        crate::env::sleep(Duration::from_millis(250)).await;
        second = store.receive_messages(&q, 1, Duration::from_secs(30)).await.unwrap();
        if !second.is_empty() {
            break;
        }
    }
    let second = second.pop().expect("message reappears after its visibility timeout");
    assert_eq!(second.id, first.id);
    assert_eq!(second.dequeue_count, 2);
    assert_ne!(second.pop_receipt, first.pop_receipt);
    assert!(matches!(
        store.delete_message(&q, &first.id, &first.pop_receipt).await,
        Err(StoreError::PreconditionFailed(_))
    ));
    // Release keeps the text; only the newest receipt works.
    let receipt = store.release_message(&q, &second.id, &second.pop_receipt, "m", Duration::ZERO).await.unwrap();
    assert!(matches!(
        store.delete_message(&q, &second.id, &second.pop_receipt).await,
        Err(StoreError::PreconditionFailed(_))
    ));
    let again = store.receive_messages(&q, 1, Duration::from_secs(30)).await.unwrap().remove(0);
    assert_eq!((again.text.as_str(), again.dequeue_count), ("m", 3));
    assert!(matches!(store.delete_message(&q, &again.id, &receipt).await, Err(StoreError::PreconditionFailed(_))));
    store.delete_message(&q, &again.id, &again.pop_receipt).await.unwrap();
    store.delete_queue(&q).await.unwrap();
}

/// Limits checked before I/O.
pub async fn queue_limits(store: &dyn Store) {
    let q = unique_queue("lim");
    store.create_queue(&q).await.unwrap();
    store.put_message(&q, &"a".repeat(64 * 1024), Duration::ZERO).await.expect("64 KiB message");
    assert!(matches!(
        store.put_message(&q, &"a".repeat(64 * 1024 + 1), Duration::ZERO).await,
        Err(StoreError::InvalidInput(_))
    ));
    assert!(matches!(store.receive_messages(&q, 0, Duration::from_secs(30)).await, Err(StoreError::InvalidInput(_))));
    assert!(matches!(store.receive_messages(&q, 33, Duration::from_secs(30)).await, Err(StoreError::InvalidInput(_))));
    assert!(matches!(
        store.receive_messages(&q, 1, Duration::from_millis(500)).await,
        Err(StoreError::InvalidInput(_))
    ));
    assert!(matches!(
        store.put_message(&q, "x", Duration::from_secs(7 * 24 * 3600 + 1)).await,
        Err(StoreError::InvalidInput(_))
    ));
    assert!(matches!(store.put_message("missing-queue-xyz", "x", Duration::ZERO).await, Err(StoreError::NotFound(_))));
    store.delete_queue(&q).await.unwrap();
}
