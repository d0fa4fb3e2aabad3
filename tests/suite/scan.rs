//! The prefix scanner (seed 004, `src/scan/`) against each backend: a few hundred entities with
//! our key shapes, non-ASCII and astral characters, `%XX` escapes, a quote, the empty key and
//! U+FFFF inside keys, scanned with segments of 7. The scan must return exactly what a serial
//! continuation-token scan returns, in the same order, which proves the backend's `$filter`
//! handling of `'\u{ffff}'` bounds and non-ASCII literals (Azurite: UTF-16 code-unit order).

use crate::common;

use futures::{StreamExt, TryStreamExt};
use table_catalog::store::{BatchOp, Entity, Value};
use table_catalog::testing::scan::{self, Step};
use table_catalog::testing::store::conformance::unique_table;
use table_catalog::testing::store::pager;

const PREFIXES: [&str; 16] = [
    "",
    "1_a",
    "4_icao",
    "4_icaok",
    "3_eid",
    "%25",
    "é",
    "😀",
    "𐐷",
    "\u{e000}",
    "\u{fffe}",
    "D",
    "D\u{ffff}",
    "it's",
    "a%2Fb",
    "~",
];
const SUFFIXES: [&str; 6] = ["", "x", "jfk", "😀", "%41", "_1"];
const ROW_KEYS: [&str; 3] = ["", "a:0001", "é:ff"];

common::backend_tests! {
    #[tokio::test]
    async fn the_prefix_scan_returns_every_entity_once_on_every_backend(backend) {
        let store = common::store(backend);
        let t = unique_table("scan");
        store.create_table(&t).await.unwrap();
        let mut pks: Vec<String> =
            PREFIXES.iter().flat_map(|p| SUFFIXES.iter().map(move |s| format!("{p}{s}"))).collect();
        pks.sort();
        pks.dedup();
        for pk in &pks {
            let ops: Vec<BatchOp> = ROW_KEYS
                .iter()
                .map(|rk| BatchOp::Insert(Entity::new(pk.clone(), *rk).with("n", Value::Int32(1))))
                .collect();
            store.batch(&t, pk, &ops).await.unwrap_or_else(|e| panic!("{backend:?}: insert {pk:?}: {e}"));
        }
        let n = pks.len() * ROW_KEYS.len();
        assert!(n > 250, "a few hundred entities: {n}");
        let key = |e: Entity| (e.partition_key, e.row_key);
        let serial: Vec<(String, String)> =
            pager::scan_entities(store.as_ref(), &t, 1000).map_ok(key).try_collect().await.unwrap();
        assert_eq!(serial.len(), n, "{backend:?}: serial scan");
        let scanned: Vec<(String, String)> =
            scan::entities(store.as_ref(), &t, 7).take(n + 1).map_ok(key).try_collect().await.unwrap();
        assert_eq!(scanned, serial, "{backend:?}: the prefix scan returns the serial scan's entities, in its order");
        // The scan split the table: prefix steps below the root, pages of at most 7.
        let steps: Vec<(Step, scan::StepOutput)> = scan::walk(store.as_ref(), &t, 7).try_collect().await.unwrap();
        assert!(steps.iter().all(|(_, o)| o.entities.len() <= 7));
        let prefixes =
            steps.iter().filter(|(s, _)| matches!(s, Step::Prefix { prefix, .. } if !prefix.is_empty())).count();
        assert!(prefixes > 10, "{backend:?}: {prefixes} prefix steps");
        store.delete_table(&t).await.unwrap();
    }
}
