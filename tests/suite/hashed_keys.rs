//! Hashed (blind-index) keys and redaction (issue 15, item 3): records with SSNs imported
//! into a catalog whose `ssn` index is hashed leave no plaintext SSN, nor its lowercased or
//! escaped form, in any PartitionKey or RowKey of the raw catalog table (and, with `redact`,
//! in no property and no WAL entry either), while lookups by SSN, through the library and
//! `GET /api/records?ssn=...`, return the record. The raw table is read with the store's own
//! scan, not the catalog API: on Azurite through a second, independent client built from the
//! connection string. On the embedded store and on Azurite.

use crate::common;

use std::sync::Arc;

use futures::TryStreamExt;
use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::store::AzureStore;
use table_catalog::store::CountingStore;
use table_catalog::store::{Entity, OpKind, Store, TableStore, Value};
use table_catalog::testing::hashed::HashKey;
use table_catalog::testing::schema::Schema;
use table_catalog::testing::store::pager;
use table_catalog::Error;

/// 32 bytes, base64 (a test key, not a secret of any deployment).
const KEY: &str = "q83vEjRWeJCrze8SNFZ4kKvN7xI0VniQq83vEjRWeJA=";
/// Another key.
const OTHER_KEY: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";
const RECORDS: usize = 40;

fn ssn(i: usize) -> String {
    match i {
        // Letters, and characters keys escape: the lowercased and escaped forms differ.
        0 => "XY/45#6789".to_string(),
        1 => "Ab-99-%001".to_string(),
        _ => format!("123-45-{:04}", 6700 + i),
    }
}

fn provider(i: usize) -> Record {
    json!({"eid": format!("E{i:03}"), "ssn": ssn(i), "npi": format!("14142{i:05}"), "lastname": format!("Faux{i}")})
        .as_object()
        .cloned()
        .unwrap()
}

fn schema(redact: bool, key: &str) -> Schema {
    let redact = if redact { vec!["ssn".to_string()] } else { vec![] };
    Schema::new(vec!["eid".into(), "ssn".into(), "npi".into()], "lastname")
        .unwrap()
        .with_hashed_keys(vec!["ssn".into()], redact, Some(HashKey::from_setting(key).unwrap()))
        .unwrap()
}

/// A store reading the same tables through another client: on Azurite a new client from the
/// connection string; the embedded store is in memory, so its own raw scan.
fn independent(backend: common::Backend, store: &Arc<dyn Store>) -> Arc<dyn Store> {
    match backend {
        common::Backend::Local | common::Backend::Simulated => store.clone(),
        common::Backend::Azurite => {
            let cs = std::env::var("TC_TEST_AZURE_CONNECTION").unwrap();
            Arc::new(AzureStore::from_connection_string(&cs).unwrap())
        }
    }
}

async fn raw_rows(store: &dyn TableStore, table: &str) -> Vec<Entity> {
    pager::scan_entities(store, table, 1000).try_collect().await.unwrap()
}

/// Every form of an SSN that would give it away: as written, lowercased, and escaped as a
/// plaintext key would hold it.
fn forms(i: usize) -> Vec<String> {
    let s = ssn(i);
    let lower = s.to_lowercase();
    let mut forms = vec![s, table_catalog::testing::keys::escape_key(&lower), lower];
    forms.sort();
    forms.dedup();
    forms
}

fn strings_of(e: &Entity) -> Vec<String> {
    e.properties
        .values()
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => format!("{other:?}"),
        })
        .collect()
}

/// The plaintext SSNs found in `rows`: in keys always, in properties too when `properties`.
fn leaks(rows: &[Entity], properties: bool) -> Vec<String> {
    let mut found = Vec::new();
    for e in rows {
        let mut texts = vec![e.partition_key.clone(), e.row_key.clone()];
        if properties {
            texts.extend(strings_of(e));
        }
        for i in 0..RECORDS {
            for form in forms(i) {
                if texts.iter().any(|t| t.contains(&form)) {
                    found.push(format!("{form:?} in {}/{}", e.partition_key, e.row_key));
                }
            }
        }
    }
    found
}

async fn open(store: Arc<dyn Store>, name: &str, schema: Schema) -> table_catalog::Result<Catalog> {
    Catalog::open(store, Names::new(name, None, None).unwrap(), schema, CatalogOptions::default()).await
}

async fn no_plaintext_ssn_in_the_raw_table(backend: common::Backend, redact: bool) {
    let ctx = format!("{backend:?}, redact={redact}");
    let store = common::store(backend);
    let name = common::unique_name("hashed");
    let c = open(store.clone(), &name, schema(redact, KEY)).await.unwrap();
    let results = c.upsert_many((0..RECORDS).map(provider).collect(), false).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{ctx}: {results:?}");
    c.hints_settled().await;

    // Logged, not applied: with redact, not even the WAL entries hold an SSN.
    let reader = independent(backend, &store);
    let wal = raw_rows(reader.as_ref(), &c.names().wal_table).await;
    assert!(wal.iter().any(|e| e.properties.contains_key("b0")), "{ctx}: the entries are pending");
    if redact {
        assert_eq!(leaks(&wal, true), Vec::<String>::new(), "{ctx}: plaintext SSN in the WAL");
    }
    // A delete by SSN is logged with the hashed value, whether or not the field is redacted.
    let gone = RECORDS - 1;
    c.delete(Filter::new(vec![("ssn".into(), ssn(gone))]), false).await.unwrap();
    let wal = raw_rows(reader.as_ref(), &c.names().wal_table).await;
    let plain_delete = wal.iter().filter(|e| strings_of(e).iter().any(|s| s.contains(&ssn(gone)))).count();
    assert_eq!(plain_delete, if redact { 0 } else { 1 }, "{ctx}: only the upsert of a hashed field holds it");
    c.recover().await.unwrap();

    let rows = raw_rows(reader.as_ref(), &c.names().table).await;
    assert_eq!(leaks(&rows, false), Vec::<String>::new(), "{ctx}: plaintext SSN in a PartitionKey or RowKey");
    let ssn_rows: Vec<&Entity> = rows.iter().filter(|e| e.partition_key.starts_with("3_ssn")).collect();
    assert_eq!(rows.len(), 3 * RECORDS, "{ctx}: three index rows per record (the deleted one as tombstones)");
    assert_eq!(ssn_rows.len(), RECORDS, "{ctx}");
    for e in &ssn_rows {
        let hex = &e.partition_key["3_ssn".len()..];
        assert!(hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()), "{ctx}: {}", e.partition_key);
    }
    if redact {
        assert_eq!(leaks(&rows, true), Vec::<String>::new(), "{ctx}: plaintext SSN in a row property");
    } else {
        assert!(!leaks(&rows, true).is_empty(), "{ctx}: without redact the payload keeps the SSN");
    }

    // Lookups hash the value the same way, case-insensitively.
    for i in 0..RECORDS - 1 {
        for value in [ssn(i), ssn(i).to_lowercase()] {
            let found = c.query_all(&Filter::new(vec![("ssn".into(), value.clone())])).await.unwrap();
            assert_eq!(found.len(), 1, "{ctx}: lookup by {value:?}");
            assert_eq!(found[0]["eid"], json!(format!("E{i:03}")), "{ctx}");
            let stored = found[0]["ssn"].as_str().unwrap();
            if redact {
                assert!(stored.starts_with("hmac-sha256:") && stored.len() == 12 + 64, "{ctx}: {stored}");
            } else {
                assert_eq!(stored, ssn(i), "{ctx}");
            }
        }
    }
    let deleted = c.query_all(&Filter::new(vec![("ssn".into(), ssn(gone))])).await.unwrap();
    assert!(deleted.is_empty(), "{ctx}: the delete by SSN found its record");
    assert!(c.query_all(&Filter::new(vec![("ssn".into(), "123456706".into())])).await.unwrap().is_empty());

    // Through HTTP, as `GET /api/records?ssn=123-45-6702` (the path serve and the handler share).
    let app = table_catalog::http::router(Arc::new(c));
    let (status, body) =
        common::call(&app, "GET", &format!("/api/records?ssn={}", ssn(2)), None, axum::body::Body::empty()).await;
    assert_eq!(status, 200, "{ctx}: {body}");
    assert_eq!(body["records"][0]["eid"], json!("E002"), "{ctx}: {body}");

    // Another secret, or no hashing, cannot open it (it would write rows no lookup finds).
    let err = open(store.clone(), &name, schema(redact, OTHER_KEY)).await.unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch(_)), "{ctx}: {err}");
    let msg = err.to_string();
    assert!(msg.contains("TABLE_CATALOG_HASH_KEY") && msg.contains("Rotating"), "{ctx}: {msg}");
    assert!(!msg.contains(KEY) && !msg.contains(OTHER_KEY), "{ctx}: the error shows a key: {msg}");
    let plain = Schema::new(vec!["eid".into(), "ssn".into(), "npi".into()], "lastname").unwrap();
    let err = open(store, &name, plain).await.unwrap_err().to_string();
    assert!(err.contains("hashed keys [ssn]"), "{ctx}: {err}");
}

common::backend_tests! {
    #[tokio::test]
    async fn hashed_ssn_never_appears_in_a_key_and_lookups_by_ssn_work(backend) {
        no_plaintext_ssn_in_the_raw_table(backend, false).await;
    }
}

common::backend_tests! {
    #[tokio::test]
    async fn redacted_ssn_appears_nowhere_in_the_catalog_or_the_wal(backend) {
        no_plaintext_ssn_in_the_raw_table(backend, true).await;
    }
}

/// Storage requests of `writes` single upserts (logged, hints sent), of applying them, and of
/// one lookup per record, on a fresh catalog. The lookups' count leaves out point reads: a
/// lookup re-reads the schema row when this process's copy is older than
/// `indexes::LOOKUP_SCHEMA_AGE` (5 s), which depends on how long the writes took (on a loaded
/// machine one run counted 21 requests for 20 lookups), not on the keys; a lookup itself is
/// queries only.
async fn requests(backend: common::Backend, schema: Schema, writes: usize) -> [u64; 3] {
    let counting = Arc::new(CountingStore::new(common::store(backend)));
    let c = open(counting.clone(), &common::unique_name("hcost"), schema).await.unwrap();
    let at = |c: &CountingStore| c.counts().snapshot();
    let start = at(&counting);
    for i in 0..writes {
        c.upsert(provider(i), false).await.unwrap();
        c.hints_settled().await;
    }
    let logged = at(&counting);
    c.recover().await.unwrap();
    let applied = at(&counting);
    for i in 0..writes {
        assert_eq!(c.query_all(&Filter::new(vec![("ssn".into(), ssn(i))])).await.unwrap().len(), 1);
    }
    let read = at(&counting);
    let lookups = read.since(&applied);
    let schema_reads = lookups.by_op.get(&OpKind::Get).map_or(0, |n| n.total);
    [logged.since(&start).total, applied.since(&logged).total, lookups.total - schema_reads]
}

common::backend_tests! {
    /// Hashing adds no storage request: the keys are computed locally. Printed for
    /// docs/BENCHMARKS.md.
    #[tokio::test]
    async fn hashing_costs_no_extra_storage_request(backend) {
        const WRITES: usize = 20;
        let plain = Schema::new(vec!["eid".into(), "ssn".into(), "npi".into()], "lastname").unwrap();
        let plain = requests(backend, plain, WRITES).await;
        let hashed = requests(backend, schema(false, KEY), WRITES).await;
        let redacted = requests(backend, schema(true, KEY), WRITES).await;
        println!("{backend:?}: requests for {WRITES} upserts [log, apply, {WRITES} lookups]: plaintext {plain:?}, hashed {hashed:?}, hashed+redact {redacted:?}");
        assert_eq!(hashed, plain, "{backend:?}: hashed keys changed the request count");
        assert_eq!(redacted, plain, "{backend:?}: redaction changed the request count");
    }
}
