//! Jobs over the prefix scan (issue 12, item 2): a verify job run by several workers counts
//! exactly what a serial verify counts and reports the same findings; a repair job leaves
//! verify at 0; the HTTP routes start, show, list, cancel and stream; the export route streams
//! every record once. On the embedded store and on Azurite.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Value};
use table_catalog::catalog::Catalog;
use table_catalog::jobs::{JobKind, JobState, Jobs};
use table_catalog::record::{self, Record};
use table_catalog::store::{Entity, IfMatch};
use table_catalog::testing::import::{self, Format};
use table_catalog::testing::verify::{self, VerifyOptions};

use common::Backend;

fn airports(n: usize) -> Vec<Record> {
    let rows = import::read_file(&common::airports_csv(), Format::Csv, &common::airports_schema()).unwrap();
    rows.into_iter().take(n).map(|(_, r)| r.expect("valid airport row")).collect()
}

/// A catalog of `n` airports, applied, then corrupted around the WAL: an index row deleted
/// from every 50th record, a stale row (older WAL id, other payload) in every 70th.
async fn corrupted(backend: Backend, n: usize) -> Arc<Catalog> {
    let c = common::airports_catalog(backend).await;
    let records = airports(n);
    c.upsert_many(records.clone(), false).await.unwrap();
    c.recover().await.unwrap();
    let t = c.names().table.clone();
    for (i, r) in records.iter().enumerate() {
        let keys = c.schema().record_keys(r).unwrap();
        let (_, pk) = keys.partitions.last().unwrap().clone();
        if i % 50 == 7 {
            c.store().delete(&t, &pk, &keys.row_key, &IfMatch::Any).await.unwrap();
        } else if i % 70 == 3 {
            let mut stale = r.clone();
            stale.insert("city".into(), json!("stale"));
            let old = "2001-01-01T00:00:00.000000_00000000-0000-0000-0000-000000000000";
            let e = Entity { properties: record::to_properties(&stale, old), ..Entity::new(pk, keys.row_key) };
            c.store().upsert(&t, &e).await.unwrap();
        }
    }
    c
}

fn finding_lines(values: &[Value]) -> BTreeSet<String> {
    values.iter().map(|v| v.to_string()).collect()
}

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_verify_job_counts_what_a_serial_verify_counts_and_a_repair_job_fixes_it(backend) {
        let c = corrupted(backend, 400).await;
        let (store, table) = (c.store().as_ref(), c.names().table.clone());
        let serial = verify::verify_with(store, &table, &c.schema(), VerifyOptions { segment: 1000, concurrency: 8 })
            .await
            .unwrap();
        assert_eq!(serial.total_findings(), 8 + 6, "{backend:?}: {:?}", serial.findings);

        let jobs = Jobs::for_catalog(c.clone());
        let job = jobs.start(JobKind::Verify, json!({"segment": 40})).await.unwrap();
        let done = common::run_job_until_final(&c, &jobs, &job, 4).await;
        assert_eq!(done.state, JobState::Done, "{backend:?}: {done:?}");
        assert_eq!(done.counters["rows"], serial.rows as u64, "{backend:?}: {done:?}");
        assert_eq!(done.counters["records"], serial.records as u64, "{backend:?}");
        assert_eq!(done.counters["findings"], serial.total_findings(), "{backend:?}");
        for (kind, n) in &serial.findings {
            assert_eq!(done.counters.get(*kind), Some(n), "{backend:?} {kind}");
        }
        assert!(done.steps_done > 10, "{backend:?}: segment 40 splits the scan: {done:?}");
        let partitions: BTreeSet<String> =
            verify::scan_all(store, &table).await.unwrap().into_iter().map(|e| e.partition_key).collect();
        assert_eq!(done.counters["partitions"], partitions.len() as u64, "{backend:?}: each partition counted once");
        assert!(done.started.is_some() && done.finished.is_some(), "{done:?}");
        let found: Vec<Value> = futures::TryStreamExt::try_collect(jobs.findings(&job.id)).await.unwrap();
        let want: Vec<Value> = serial.violations.iter().map(|f| serde_json::to_value(f).unwrap()).collect();
        assert_eq!(finding_lines(&found), finding_lines(&want), "{backend:?}: the same findings");

        let repair = jobs.start(JobKind::Repair, json!({"segment": 100})).await.unwrap();
        let repaired = common::run_job_until_final(&c, &jobs, &repair, 3).await;
        assert_eq!(repaired.state, JobState::Done, "{backend:?}: {repaired:?}");
        assert_eq!(repaired.counters["upserts"], 14, "{backend:?}: {repaired:?}");
        c.recover().await.unwrap();
        let after = verify::verify(store, &table, &c.schema()).await.unwrap();
        assert!(after.ok(), "{backend:?}: {:?}", after.violations);
        assert_eq!(after.records, 400, "{backend:?}");
    }
}

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_job_and_export_routes(backend) {
        let c = corrupted(backend, 120).await;
        let app = table_catalog::http::router(c.clone());
        let call = |m: &'static str, uri: String, body: &'static str| {
            let app = app.clone();
            async move { common::call(&app, m, &uri, Some("application/json"), body).await }
        };
        let (s, body) = call("POST", "/api/jobs".into(), r#"{"kind":"verify","params":{"segment":25}}"#).await;
        assert_eq!(s, 202, "{backend:?}: {body}");
        let id = body["id"].as_str().unwrap().to_string();
        let jobs = Jobs::for_catalog(c.clone());
        let job = jobs.get(&table_catalog::jobs::JobId::parse(&id).unwrap()).await.unwrap();
        let done = common::run_job_until_final(&c, &jobs, &job, 2).await;
        let (s, body) = call("GET", format!("/api/jobs/{id}"), "").await;
        assert_eq!((s.as_u16(), body["state"].as_str()), (200, Some("done")), "{backend:?}: {body}");
        assert_eq!(body["counters"]["rows"].as_u64(), Some(done.counters["rows"]));
        let (s, list) = call("GET", "/api/jobs?limit=5".into(), "").await;
        assert_eq!((s.as_u16(), list["jobs"][0]["id"].as_str()), (200, Some(id.as_str())), "{list}");
        let (s, text) = call("GET", format!("/api/jobs/{id}/findings"), "").await;
        assert_eq!(s, 200);
        let lines = text.as_str().map_or(1, |t| t.lines().count());
        assert_eq!(lines as u64, done.counters["findings"], "{backend:?}: {text}");
        let (s, body) = call("DELETE", format!("/api/jobs/{id}"), "").await;
        assert_eq!(s, 409, "cancelling a done job: {body}");

        // Refusals name the field.
        for (m, uri, body, status, needle) in [
            ("POST", "/api/jobs", r#"{"kind":"vacuum"}"#, 400, "kind:"),
            ("POST", "/api/jobs", r#"{"kind":"verify","params":{"segment":0}}"#, 400, "params.segment"),
            ("POST", "/api/jobs", r#"{"kind":"verify","params":{"speed":1}}"#, 400, "params.speed"),
            ("POST", "/api/jobs", r#"{"kind":"verify","extra":1}"#, 400, "extra"),
            ("POST", "/api/jobs", "not json", 400, "body:"),
            ("GET", "/api/jobs/../../etc", "", 404, ""),
            ("GET", "/api/jobs/123", "", 400, "id:"),
            ("GET", "/api/jobs/9223370000000000000-0123abcd", "", 404, "no job"),
            ("GET", "/api/jobs?limit=0", "", 400, "limit"),
            ("GET", "/api/export?segment=5000", "", 400, "segment"),
        ] {
            let (s, b) = call(m, uri.into(), body).await;
            assert_eq!(s.as_u16(), status, "{backend:?} {m} {uri}: {b}");
            assert!(b.to_string().contains(needle), "{backend:?} {m} {uri}: {b}");
        }

        // Export: every live record once (the corrupted catalog still has all 120).
        let (s, text) = call("GET", "/api/export?segment=17".into(), "").await;
        assert_eq!(s, 200);
        let text = text.as_str().unwrap_or_default().to_string();
        let exported: BTreeSet<String> = text.lines().map(String::from).collect();
        assert_eq!(text.lines().count(), 120, "{backend:?}");
        assert_eq!(exported.len(), 120, "{backend:?}: each record once");
    }
}

#[tokio::test]
async fn the_scan_dispatcher_is_the_catalogs_scan_queue() {
    let c = common::airports_catalog(Backend::Local).await;
    let d = table_catalog::testing::job_dispatcher(c.clone());
    assert_eq!(d.queue(), c.names().scan_queue);
    assert!(c.names().scan_queue.ends_with("-apply-scan"));
    assert_eq!(d.policy().max_dequeue_count, 10, "host.json's maxDequeueCount");
}

common::backend_tests! {
    /// `trim-history` removes exactly the history rows older than the retention period, across
    /// the whole history table (records written long ago are never trimmed at write time).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trim_history_job_removes_exactly_the_expired_rows(backend) {
        use table_catalog::catalog::CatalogOptions;
        use table_catalog::history::{inverted_time, HistoryOptions};
        use table_catalog::testing::store::pager;
        use table_catalog::testing::wal::id::now_micros;

        let opts = CatalogOptions { history: HistoryOptions::on(), ..CatalogOptions::default() };
        let c = common::catalog_with(backend, common::airports_schema(), opts).await;
        c.upsert_many(airports(60), false).await.unwrap();
        c.recover().await.unwrap();
        let table = c.names().history_table.clone();
        let rows: Vec<Entity> =
            futures::TryStreamExt::try_collect(pager::scan_entities(c.store().as_ref(), &table, 1000)).await.unwrap();
        assert_eq!(rows.len(), 60, "{backend:?}: one history row per record");
        // Back-date a copy of every third row by 40 days.
        let old = inverted_time(now_micros() - 40 * 86_400_000_000);
        let mut expired = 0u64;
        for e in rows.iter().step_by(3) {
            let aged = Entity { row_key: format!("{old}{}", &e.row_key[19..]), etag: None, ..e.clone() };
            c.store().insert(&table, &aged).await.unwrap();
            expired += 1;
        }
        let jobs = Jobs::for_catalog(c.clone());
        let job = jobs.start(JobKind::TrimHistory, json!({"days": 30, "segment": 7})).await.unwrap();
        let done = common::run_job_until_final(&c, &jobs, &job, 3).await;
        assert_eq!(done.state, JobState::Done, "{backend:?}: {done:?}");
        assert_eq!((done.counters["rows"], done.counters["removed"]), (60 + expired, expired), "{backend:?}: {done:?}");
        let left: Vec<Entity> =
            futures::TryStreamExt::try_collect(pager::scan_entities(c.store().as_ref(), &table, 1000)).await.unwrap();
        assert_eq!(left.len(), 60, "{backend:?}: the recent rows are kept");
        // Without history or without a period, the job refuses to start.
        let e = jobs.start(JobKind::TrimHistory, json!({})).await.unwrap_err().to_string();
        assert!(e.contains("params.days"), "{e}");
        let plain = common::airports_catalog(backend).await;
        let e = Jobs::for_catalog(plain).start(JobKind::TrimHistory, json!({"days": 1})).await.unwrap_err().to_string();
        assert!(e.contains("keeps no history"), "{e}");
    }
}
