//! Non-unique indexes (issue 13, item 4): an index field many records share (`country`)
//! works like any other. A lookup returns every record with that value, and the continuation
//! pages through them: each record once, no page over its limit. On the embedded store with
//! the first 10,000 airports and on Azurite with the first 3,000 (all 28,403 hold 12,590 US
//! airports: `TC_NON_UNIQUE_ALL=1`).

use crate::common;

use std::collections::BTreeSet;

use table_catalog::catalog::CatalogOptions;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::testing::import::{self, Format};
use table_catalog::testing::schema::Schema;

use common::Backend;

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lookup_by_a_shared_value_pages_through_every_record_once(backend) {
        let schema = Schema::new(vec!["icao".into(), "iata".into(), "country".into()], "name").unwrap();
        let rows = import::read_file(&common::airports_csv(), Format::Csv, &schema).unwrap();
        let all = std::env::var("TC_NON_UNIQUE_ALL").is_ok_and(|v| v == "1");
        let n = if all {
            usize::MAX
        } else if backend == Backend::Local {
            10_000
        } else {
            3_000
        };
        let records: Vec<Record> = rows.into_iter().take(n).map(|(_, r)| r.expect("valid airport row")).collect();
        let us = records.iter().filter(|r| r.get("country").and_then(|v| v.as_str()) == Some("US")).count();
        let c = common::catalog_with(backend, schema, CatalogOptions::default()).await;
        for chunk in records.chunks(2_000) {
            c.upsert_many(chunk.to_vec(), false).await.unwrap();
        }
        c.recover().await.unwrap();

        let filter = Filter::new(vec![("country".into(), "US".into())]);
        let (mut seen, mut pages, mut token) = (BTreeSet::new(), 0, None::<String>);
        loop {
            let page = c.query(&filter, 1000, token.as_deref()).await.unwrap();
            assert!(page.records.len() <= 1000, "{backend:?}: a page holds at most its limit");
            pages += 1;
            for r in &page.records {
                assert_eq!(r.record.get("country").and_then(|v| v.as_str()), Some("US"));
                let icao = r.record["icao"].as_str().unwrap().to_string();
                assert!(seen.insert(icao.clone()), "{backend:?}: {icao} returned twice");
            }
            match page.continuation {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        assert_eq!(seen.len(), us, "{backend:?}: every US airport, once");
        assert!(pages >= us.div_ceil(1000), "{backend:?}: {pages} pages for {us} records");
        // A rare value is still one short page.
        let one = c.query(&Filter::new(vec![("country".into(), "AQ".into())]), 1000, None).await.unwrap();
        assert!(one.continuation.is_none() && one.records.len() < 100, "{backend:?}");
        eprintln!("{backend:?}: country=US: {us} records in {pages} pages of at most 1,000");
    }
}
