//! The whole airports data set (28,403 airports, sparse icao / iata / lid identifiers, names
//! with `'` and `/`) through the batch import path on the embedded store.

use crate::common;

use std::collections::HashSet;

use table_catalog::query::Filter;
use table_catalog::testing::import::{self, Format};
use table_catalog::testing::verify;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_airport_is_found_by_each_identifier_it_has() {
    let catalog = common::airports_catalog(common::Backend::Local).await;
    let rows = import::read_file(&common::airports_csv(), Format::Csv, &catalog.schema()).unwrap();
    assert_eq!(rows.len(), 28_403);
    let records: Vec<_> = rows.iter().map(|(_, r)| r.clone().unwrap()).collect();
    let summary = import::import_rows(&catalog, rows, 500, |_| {}).await.unwrap();
    assert_eq!((summary.logged, summary.rejected.len()), (28_403, 0), "{:?}", summary.rejected.first());
    catalog.recover().await.unwrap();
    assert_eq!(catalog.status().await.unwrap().pending, 0);

    let report = verify::verify(catalog.store().as_ref(), &catalog.names().table, &catalog.schema()).await.unwrap();
    assert!(report.ok(), "{:?}", &report.violations[..report.violations.len().min(5)]);
    assert_eq!(report.records, 28_403);
    let expected_rows: usize = records
        .iter()
        .map(|r| ["icao", "iata", "lid"].iter().filter(|f| r[**f].as_str().is_some_and(|v| !v.is_empty())).count())
        .sum();
    assert_eq!(report.rows, expected_rows, "one row per identifier an airport has, none for missing ones");
    let rows = verify::scan_all(catalog.store().as_ref(), &catalog.names().table).await.unwrap();
    assert!(
        rows.iter().all(|e| e.partition_key != "4_iata" && e.partition_key != "3_lid"),
        "no row for an empty identifier"
    );

    let mut lookups = 0;
    let mut without_iata = 0;
    for r in &records {
        for field in ["icao", "iata", "lid"] {
            let value = r[field].as_str().unwrap();
            if value.is_empty() {
                without_iata += usize::from(field == "iata");
                continue;
            }
            let found = catalog.query_all(&Filter::new(vec![(field.into(), value.into())])).await.unwrap();
            assert!(found.contains(r), "{field}={value} does not find {}", r["name"]);
            lookups += 1;
        }
    }
    assert!(without_iata > 10_000, "the data set has many airports without IATA code");
    assert!(lookups > 45_000);
    // Names with quotes and slashes round-trip.
    let names: HashSet<&str> =
        records.iter().filter_map(|r| r["name"].as_str()).filter(|n| n.contains('\'') || n.contains('/')).collect();
    assert!(names.len() > 500);
}
