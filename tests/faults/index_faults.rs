//! Crash safety of an online index change (issue 13): fail each named point of the change
//! (`faults::SCHEMA_POINTS`) once, "restart" with a new catalog instance on the same storage,
//! run the same command again (the change's steps are idempotent), and check that the index
//! turns active, exactly one backfill job ran, lookups find every record and verify is clean.
//!
//! The crash-point hook is process-global, so this binary has one test, running the points
//! in turn.
#![cfg(feature = "testing")]

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::indexes;
use table_catalog::jobs::{JobKind, Jobs};
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::server::ServeOptions;
use table_catalog::testing::faults;
use table_catalog::testing::import::{self, Format};
use table_catalog::testing::schema::IndexState;

fn airports(n: usize) -> Vec<Record> {
    let rows = import::read_file(&common::airports_csv(), Format::Csv, &common::airports_schema()).unwrap();
    rows.into_iter().take(n).map(|(_, r)| r.expect("valid airport row")).collect()
}

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_index_change_stopped_at_any_point_completes_when_run_again(backend) {
        let _turn = crate::TURN.lock().await; // see tests/faults/main.rs
        for point in faults::SCHEMA_POINTS {
            let label = format!("{backend:?}, {point}");
            let c = common::catalog_with(backend, common::airports_schema(), CatalogOptions::default()).await;
            let mut records = airports(200);
            for (i, r) in records.iter_mut().enumerate() {
                r.insert("country".into(), json!(["US", "CA", "NL"][i % 3]));
            }
            c.upsert_many(records.clone(), true).await.unwrap();

            let fired = Arc::new(AtomicBool::new(false));
            let f = fired.clone();
            faults::set_hook(move |p| p == *point && !f.swap(true, Ordering::SeqCst));
            let first = indexes::add(&c, "country").await;
            let applied = c.recover().await;
            faults::clear_hook();
            assert!(fired.load(Ordering::SeqCst), "{label}: the point was reached");
            assert!(first.is_err() || applied.is_err(), "{label}: the crash surfaced");

            // A new process on the same storage runs the command again.
            let again = Arc::new(
                Catalog::open(
                    c.store().clone(),
                    c.names().clone(),
                    common::airports_schema(),
                    CatalogOptions::default(),
                )
                .await
                .unwrap(),
            );
            match indexes::add(&again, "country").await {
                Ok(_) => {}
                // The change was published before the crash: its entry is pending.
                Err(table_catalog::Error::Conflict(m)) if *point == "before_schema_job" => {
                    assert!(m.contains("backfilling"), "{label}: {m}")
                }
                Err(e) => panic!("{label}: running the command again failed: {e}"),
            }
            let (stop, rx) = tokio::sync::watch::channel(false);
            let opts = ServeOptions { scan_workers: 2, ..ServeOptions::default() };
            let worker = tokio::spawn(table_catalog::server::run_scan_worker(again.clone(), opts, rx));
            common::wait_for(&format!("{label}: country active"), || async {
                again.recover().await.unwrap();
                let list = indexes::list(&again).await.unwrap();
                list.iter().any(|i| i.field == "country" && i.state == IndexState::Active).then_some(())
            })
            .await;
            stop.send_replace(true);
            worker.await.unwrap();

            let jobs = Jobs::for_catalog(again.clone()).list(100, None).await.unwrap().jobs;
            let backfills = jobs.iter().filter(|j| j.kind == JobKind::Backfill).count();
            assert_eq!(backfills, 1, "{label}: one backfill job");
            let nl = again.query_all(&Filter::new(vec![("country".into(), "NL".into())])).await.unwrap();
            assert_eq!(nl.len(), records.iter().filter(|r| r["country"] == "NL").count(), "{label}");
            let schema = again.schema();
            let report = table_catalog::testing::verify::verify(again.store().as_ref(), &again.names().table, &schema)
                .await
                .unwrap();
            assert_eq!(report.total_findings(), 0, "{label}: {:?}", report.findings);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
