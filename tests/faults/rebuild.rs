//! `rebuild` jobs (issue 15: key rotation is a rebuild job; issue 13: changing the row key):
//! every record copied into a new catalog with another schema and hash secret, through its
//! WAL, by several workers; the new catalog verifies clean, finds every record by every
//! identifier with the new secret, and holds no key of the old one. A redacted field cannot be
//! re-keyed (the value is gone), and the job says so before it starts. Both backends.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::TryStreamExt;
use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::jobs::{JobKind, JobState, Jobs};
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::testing::hashed::HashKey;
use table_catalog::testing::jobs::rebuild::Rebuild;
use table_catalog::testing::schema::Schema;
use table_catalog::testing::store::pager;
use table_catalog::testing::{settings, verify};

const OLD_KEY: &str = "0000000000000000000000000000000000000000000000000000000000000001";
const NEW_KEY: &str = "00000000000000000000000000000000000000000000000000000000000000ff";

fn provider(i: usize) -> Record {
    json!({"eid": format!("E{i:03}"), "ssn": format!("123-45-{i:04}"), "npi": format!("14142{i:05}"),
           "lastname": format!("Faux{i}"), "firstname": format!("F{:03}", 999 - i)})
    .as_object()
    .cloned()
    .unwrap()
}

fn schema(redact: bool) -> Schema {
    let redact = if redact { vec!["ssn".to_string()] } else { vec![] };
    Schema::new(vec!["eid".into(), "ssn".into(), "npi".into()], "lastname")
        .unwrap()
        .with_hashed_keys(vec!["ssn".into()], redact, Some(HashKey::from_setting(OLD_KEY).unwrap()))
        .unwrap()
}

async fn source(backend: common::Backend, redact: bool) -> Arc<Catalog> {
    let names = Names::new(&common::unique_name("src"), None, None).unwrap();
    let c = Arc::new(
        Catalog::open(common::store(backend), names, schema(redact), CatalogOptions::default()).await.unwrap(),
    );
    c.upsert_many((0..150).map(provider).collect(), false).await.unwrap();
    c.recover().await.unwrap();
    c
}

async fn keys_of(c: &Catalog) -> BTreeSet<String> {
    let rows: Vec<_> = pager::scan_entities(c.store().as_ref(), &c.names().table, 1000).try_collect().await.unwrap();
    rows.into_iter().map(|e| e.partition_key).collect()
}

common::backend_tests! {
    /// The new secret is an environment setting, read when the runner is made: each backend's
    /// test sets it while it holds `TURN` and removes it at its end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rebuild_job_rotates_the_hash_key_and_changes_the_row_key(backend) {
        let _turn = crate::TURN.lock().await; // see tests/faults/main.rs
        std::env::set_var(settings::REBUILD_HASH_KEY, NEW_KEY);
        let src = source(backend, false).await;
        let into = common::unique_name("dst");
        let params = json!({"into": into, "row_key": "firstname", "segment": 20});
        let jobs = Jobs::for_catalog(src.clone());
        let job = jobs.start(JobKind::Rebuild, params.clone()).await.unwrap();
        let done = common::run_job_until_final(&src, &jobs, &job, 3).await;
        assert_eq!(done.state, JobState::Done, "{backend:?}: {done:?}");
        assert_eq!((done.counters["records"], done.counters["refused"]), (150, 0), "{backend:?}: {done:?}");

        let dst = Rebuild::new(src.clone()).target(&params).await.unwrap();
        dst.recover().await.unwrap();
        let report = verify::verify(dst.store().as_ref(), &dst.names().table, &dst.schema()).await.unwrap();
        assert!(report.ok(), "{backend:?}: {:?}", report.violations);
        assert_eq!(report.records, 150, "{backend:?}");
        assert_eq!(dst.schema().row_key, "firstname");
        assert_ne!(dst.schema().hash_key().map(|k| k.id().clone()), src.schema().hash_key().map(|k| k.id().clone()));
        for i in [0, 77, 149] {
            let want = vec![provider(i)];
            for (f, v) in [("ssn", format!("123-45-{i:04}")), ("eid", format!("E{i:03}"))] {
                let got = dst.query_all(&Filter::new(vec![(f.to_string(), v.clone())])).await.unwrap();
                assert_eq!(got, want, "{backend:?}: {f}={v} in the new catalog");
            }
        }
        // The hashed partitions were all re-keyed: none of the old ones is in the new table.
        let (old, new) = (keys_of(&src).await, keys_of(&dst).await);
        let hashed =
            |keys: &BTreeSet<String>| keys.iter().filter(|k| k.starts_with("3_ssn")).cloned().collect::<BTreeSet<_>>();
        assert_eq!(hashed(&new).len(), 150);
        assert!(hashed(&old).is_disjoint(&hashed(&new)), "{backend:?}: a hashed key survived the rotation");

        // A redacted field cannot be re-keyed; the job refuses before writing anything.
        let redacted = source(backend, true).await;
        let jobs = Jobs::for_catalog(redacted.clone());
        let e = jobs.start(JobKind::Rebuild, json!({"into": common::unique_name("dst")})).await.unwrap_err();
        assert!(e.to_string().contains("'ssn' is redacted"), "{e}");
        assert!(jobs.list(10, None).await.unwrap().jobs.is_empty(), "nothing was started");
        // Bad parameters name themselves.
        for (params, needle) in [
            (json!({}), "params.into"),
            (json!({"into": "bad-name"}), "params.into"),
            (json!({"into": src.names().table}), "another catalog"),
            (json!({"into": "Okname", "row_key": "ssn"}), "row-key field"),
            (json!({"into": "Okname", "speed": 1}), "params.speed"),
        ] {
            let e = Jobs::for_catalog(src.clone()).start(JobKind::Rebuild, params).await.unwrap_err().to_string();
            assert!(e.contains(needle), "{e} does not mention {needle}");
        }
        std::env::remove_var(settings::REBUILD_HASH_KEY);
    }
}
