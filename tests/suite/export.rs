//! Export round trip (issue 12, item 3): import a subset of the airports, export it, import
//! the export into an empty catalog, export again: the same records, each exactly once. On
//! the embedded store and on Azurite.

use crate::common;

use std::collections::BTreeSet;

use table_catalog::catalog::Catalog;
use table_catalog::testing::export;
use table_catalog::testing::import;

/// The first `n` airports of the shipped data set (header included).
fn airports_subset(n: usize) -> Vec<u8> {
    let text = std::fs::read_to_string(common::airports_csv()).unwrap();
    text.lines().take(n + 1).map(|l| format!("{l}\n")).collect::<String>().into_bytes()
}

async fn export_lines(c: &Catalog) -> Vec<String> {
    let mut out = Vec::new();
    let n = export::to_writer(c.store().as_ref(), &c.names().table, &c.schema(), 11, &mut out, |_| {}).await.unwrap();
    let lines: Vec<String> = String::from_utf8(out).unwrap().lines().map(String::from).collect();
    assert_eq!(lines.len() as u64, n);
    lines
}

common::backend_tests! {
    #[tokio::test]
    async fn export_then_import_into_an_empty_catalog_reproduces_it(backend) {
        let first = common::airports_catalog(backend).await;
        let rows = import::read_csv(&airports_subset(150), &first.schema()).unwrap();
        let summary = import::import_rows(&first, rows, 100, |_| {}).await.unwrap();
        assert_eq!((summary.logged, summary.rejected.len()), (150, 0), "{backend:?}");
        first.recover().await.unwrap();
        // A deleted record is not exported.
        let gone = table_catalog::query::Filter::new(vec![("icao".into(), "00AK".into())]);
        first.delete(gone, true).await.unwrap();

        let exported = export_lines(&first).await;
        assert_eq!(exported.len(), 149, "{backend:?}: every live record once");
        let unique: BTreeSet<&String> = exported.iter().collect();
        assert_eq!(unique.len(), exported.len(), "{backend:?}: no record twice");
        assert!(exported.iter().all(|l| !l.contains("_tc") && !l.contains("00AK")), "{backend:?}");

        let second = common::airports_catalog(backend).await;
        let rows = import::read_json_lines(exported.join("\n").as_bytes()).unwrap();
        let summary = import::import_rows(&second, rows, 100, |_| {}).await.unwrap();
        assert_eq!((summary.logged, summary.rejected.len()), (149, 0), "{backend:?}");
        second.recover().await.unwrap();
        let again = export_lines(&second).await;
        let (a, b): (BTreeSet<String>, BTreeSet<String>) =
            (exported.into_iter().collect(), again.into_iter().collect());
        assert_eq!(a, b, "{backend:?}: the export of the re-import is the same set of records");
        let report =
            table_catalog::testing::verify::verify(second.store().as_ref(), &second.names().table, &second.schema())
                .await
                .unwrap();
        assert!(report.ok() && report.records == 149, "{backend:?}: {report:?}");
    }
}
