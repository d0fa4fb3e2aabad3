//! Dead entries and environment faults (issue 12, item 3, `redrive`): an entry goes to the
//! WAL's `dead` partition only when its own content can never apply; a catalog table that is
//! missing or refuses access (403) holds the entries pending, and they apply once it is
//! back. Dead entries are listed with their reason, and `redrive` moves them back to pending,
//! where they apply in id order (a write acknowledged after a re-driven one still wins).
//! On the embedded store and on Azurite.
#![cfg(feature = "testing")]

use crate::common;

use std::sync::Arc;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions, WalState};
use table_catalog::config::Names;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::store::{StoreError, TableStore};
use table_catalog::testing::store::fault::{Fault, FaultStore, OpKind, Rule, Trigger};

const WRITES: [OpKind; 5] = [OpKind::Insert, OpKind::Upsert, OpKind::Replace, OpKind::Delete, OpKind::Batch];

fn airport(i: u32, v: u32) -> Record {
    json!({"icao": format!("R{i:03}"), "iata": format!("Q{i:02}"), "lid": "", "name": format!("Redrive field {i}"), "v": v})
        .as_object()
        .cloned()
        .unwrap()
}

async fn open(backend: common::Backend) -> (Arc<FaultStore>, Catalog) {
    let faults = Arc::new(FaultStore::new(common::store(backend), 1));
    let names = Names::new(&common::unique_name("redrive"), None, None).unwrap();
    let c = Catalog::open(faults.clone(), names, common::airports_schema(), CatalogOptions::default()).await.unwrap();
    (faults, c)
}

/// Every write to the catalog table fails with `error`.
fn refuse_catalog_writes(faults: &FaultStore, c: &Catalog, error: StoreError) {
    faults.add(Rule::new(&WRITES, Trigger::Always, Fault::Fail(error)).on(&c.names().table));
}

async fn v_of(c: &Catalog, i: u32) -> Option<u64> {
    let found = c.query_all(&Filter::new(vec![("icao".into(), format!("R{i:03}"))])).await.unwrap();
    found.first().and_then(|r| r["v"].as_u64())
}

async fn environment_fault_is_retried_not_buried(backend: common::Backend, error: StoreError) {
    let (faults, c) = open(backend).await;
    refuse_catalog_writes(&faults, &c, error.clone());
    for i in 0..5 {
        c.upsert(airport(i, 1), false).await.unwrap();
    }
    let failed = c.recover().await;
    assert!(failed.is_err(), "{error}: applying must fail while the catalog table refuses writes");
    let st = c.status().await.unwrap();
    assert_eq!((st.pending, st.dead), (5, 0), "{error}: the entries stay pending, none dead");
    faults.clear();
    c.recover().await.unwrap();
    let st = c.status().await.unwrap();
    assert_eq!((st.pending, st.dead), (0, 0));
    for i in 0..5 {
        assert_eq!(v_of(&c, i).await, Some(1), "{error}: record {i} applied once the table was back");
    }
}

common::backend_tests! {
    #[tokio::test]
    async fn a_catalog_table_refusing_access_holds_entries_pending_instead_of_burying_them(backend) {
        let forbidden = StoreError::Other("injected 403 AuthorizationPermissionMismatch".into());
        environment_fault_is_retried_not_buried(backend, forbidden).await;
        let missing = StoreError::NotFound("injected 404 TableNotFound".into());
        environment_fault_is_retried_not_buried(backend, missing).await;
    }
}

common::backend_tests! {
    /// The table really deleted, then created again: nothing lost, nothing dead.
    #[tokio::test]
    async fn a_deleted_catalog_table_holds_entries_pending_until_it_is_created_again(backend) {
        let (faults, c) = open(backend).await;
        c.upsert(airport(0, 1), true).await.unwrap();
        faults.delete_table(&c.names().table).await.unwrap();
        for i in 1..4 {
            c.upsert(airport(i, 1), false).await.unwrap();
        }
        assert!(c.recover().await.is_err(), "{backend:?}: applying to a deleted table must fail");
        let st = c.status().await.unwrap();
        assert_eq!((st.pending, st.dead), (3, 0), "{backend:?}");
        // Azure refuses to create a table while it is being deleted (409 TableBeingDeleted);
        // retry for a while as an operator would.
        let mut created = false;
        for _ in 0..60 {
            if faults.create_table(&c.names().table).await.is_ok() {
                created = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        assert!(created, "{backend:?}: could not create the table again");
        c.recover().await.unwrap();
        let st = c.status().await.unwrap();
        assert_eq!((st.pending, st.dead), (0, 0), "{backend:?}");
        for i in 1..4 {
            assert_eq!(v_of(&c, i).await, Some(1), "{backend:?}: record {i}");
        }
    }
}

common::backend_tests! {
    #[tokio::test]
    async fn a_dead_entry_is_listed_with_its_reason_and_redrive_applies_it_in_id_order(backend) {
        let (faults, c) = open(backend).await;
        // Storage refuses the rows as breaking a service rule: the entry's own fault.
        refuse_catalog_writes(&faults, &c, StoreError::InvalidInput("injected 400 PropertyValueTooLarge".into()));
        let old = c.upsert(airport(1, 1), false).await.unwrap();
        let other = c.upsert(airport(2, 1), false).await.unwrap();
        c.recover().await.unwrap();
        faults.clear();
        let st = c.status().await.unwrap();
        assert_eq!((st.pending, st.dead), (0, 2), "{backend:?}: both entries buried");
        assert_eq!(c.wal_state(&old.id).await.unwrap(), WalState::Dead);

        let listed = c.dead(1000, None).await.unwrap();
        let ids: Vec<&str> = listed.entries.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, [old.id.as_str(), other.id.as_str()], "{backend:?}: listed in id order");
        let first = &listed.entries[0];
        assert!(first.reason.contains("PropertyValueTooLarge"), "{backend:?}: reason {:?}", first.reason);
        assert_eq!(first.op.as_deref(), Some("upsert"));
        assert_eq!(first.shard.as_deref(), old.shard.map(|s| s.partition()).as_deref());
        assert!(first.died_at_us.is_some());

        // A newer write of record 1, acknowledged and applied before the re-drive.
        c.upsert(airport(1, 2), true).await.unwrap();
        let moved = c.redrive(Some(&old.id)).await.unwrap();
        assert_eq!(moved, std::slice::from_ref(&old.id));
        c.recover().await.unwrap();
        assert_eq!(v_of(&c, 1).await, Some(2), "{backend:?}: the re-driven older write must not win");
        // Neither pending nor dead; below its shard's checkpoint (the newer write of record 1,
        // applied before it), so the WAL can only say "applied if it was ever logged".
        assert_eq!(c.wal_state(&old.id).await.unwrap(), WalState::Unknown);

        // The rest, all at once.
        let moved = c.redrive(None).await.unwrap();
        assert_eq!(moved, std::slice::from_ref(&other.id));
        c.recover().await.unwrap();
        assert_eq!(v_of(&c, 2).await, Some(1), "{backend:?}: record 2 applied after its re-drive");
        let st = c.status().await.unwrap();
        assert_eq!((st.pending, st.dead), (0, 0), "{backend:?}");
        assert!(c.redrive(None).await.unwrap().is_empty());

        // Bad ids: clear errors naming the field.
        let e = c.redrive(Some("not-an-id")).await.unwrap_err().to_string();
        assert!(e.contains("id:"), "{e}");
        let e = c.redrive(Some(&old.id)).await.unwrap_err();
        assert!(matches!(e, table_catalog::Error::NotFound(_)), "{e}");
    }
}

#[tokio::test]
async fn dead_entries_are_listed_and_redriven_over_http() {
    let (faults, c) = open(common::Backend::Local).await;
    refuse_catalog_writes(&faults, &c, StoreError::InvalidInput("injected 400 EntityTooLarge".into()));
    let w = c.upsert(airport(7, 1), false).await.unwrap();
    c.recover().await.unwrap();
    faults.clear();
    let app = table_catalog::http::router(Arc::new(c));
    let (status, body) = common::call(&app, "GET", "/api/wal/dead?limit=10", None, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["entries"][0]["id"], json!(w.id));
    assert!(body["entries"][0]["reason"].as_str().unwrap().contains("EntityTooLarge"), "{body}");
    let (status, body) = common::call(&app, "GET", "/api/wal/dead?limit=0", None, "").await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("limit"), "{body}");
    let (status, body) = common::call(&app, "POST", "/api/wal/dead/redrive?bogus=1", None, "").await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = common::call(&app, "POST", &format!("/api/wal/dead/redrive?id={}", w.id), None, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["redriven"], json!([w.id]));
    let (_, state) = common::call(&app, "GET", &format!("/api/wal/{}", w.id), None, "").await;
    assert_eq!(state["state"], "pending", "{state}");
}
