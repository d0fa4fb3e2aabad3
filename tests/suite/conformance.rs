//! The storage conformance suite on the embedded store and the in-memory store.

use table_catalog::store::{LocalStore, MemStore};
use table_catalog::testing::store::conformance;

#[tokio::test]
async fn local_in_memory_passes_the_conformance_suite() {
    let store = LocalStore::in_memory().unwrap();
    conformance::run_all(&store).await;
}

#[tokio::test]
async fn local_file_store_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path(), table_catalog::store::Durability::Process).unwrap();
    conformance::run_all(&store).await;
}

#[tokio::test]
async fn local_file_store_with_full_durability_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path(), table_catalog::store::Durability::Full).unwrap();
    conformance::run_all(&store).await;
}

#[tokio::test]
async fn mem_store_passes_the_conformance_suite() {
    conformance::run_all(&MemStore::new()).await;
}

/// As the simulator runs it: one thread, tokio's clock paused (the visibility case's sleeps
/// advance it instantly).
#[tokio::test(start_paused = true)]
async fn mem_store_passes_the_conformance_suite_with_paused_time() {
    conformance::run_all(&MemStore::new()).await;
}
