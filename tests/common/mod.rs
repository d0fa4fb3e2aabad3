//! Shared test helpers: a catalog on each backend the run has (the embedded store always;
//! Azurite when `TC_TEST_AZURE_CONNECTION` is set, which `scripts/test.sh` does; without it
//! the Azurite variant is reported as skipped, see [`skip`]), one test per backend through
//! [`backend_tests!`].
#![allow(dead_code)]

pub mod history_fixtures;
pub mod identity;
pub mod serve;
pub mod skip;

use std::sync::Arc;

use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::store::AzureStore;
use table_catalog::store::LocalStore;
use table_catalog::store::Store;
use table_catalog::testing::schema::Schema;

/// A storage backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Local,
    Azurite,
    /// The in-memory store under simulated time, for tests of logic that wait on leases,
    /// deadlines or grace periods: see [`simulated`].
    Simulated,
}

/// One test per backend: turns
///
/// ```ignore
/// common::backend_tests! {
///     /// What the test shows.
///     #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
///     async fn name(backend) { /* the body, with `backend: Backend` */ }
/// }
/// ```
///
/// into a module `name` (with the doc comments and any `#[cfg(..)]`) holding the body as
/// `async fn body(backend: Backend)` and two tests with the other attributes: `name::local`
/// on [`Backend::Local`] and `name::azurite` on [`Backend::Azurite`], which, when the run
/// has no Azurite (`TC_TEST_AZURE_CONNECTION` unset), reports itself as skipped
/// ([`skip::azurite`]) and returns. So a failure on one backend does not hide the other's
/// result, and the two run in parallel; a filter on `name` selects both. The module sees
/// the file's items and imports (`use super::*`). Several tests may go in one invocation.
/// `#[azurite_ignore = "why"]` marks the Azurite test only `#[ignore]`: a check whose
/// embedded variant runs in CI and whose Azurite variant is one of the long checks run by
/// `scripts/test.sh --test suite -- --ignored` (README, "Long checks").
#[macro_export]
macro_rules! backend_tests {
    () => {};
    // Doc comments and `cfg` go on the module, `azurite_ignore` on the Azurite test only,
    // other attributes on each test.
    (@test [$($m:tt)*] [$($t:tt)*] [$($z:tt)*] #[doc $($a:tt)*] $($rest:tt)*) => {
        $crate::backend_tests!(@test [$($m)* #[doc $($a)*]] [$($t)*] [$($z)*] $($rest)*);
    };
    (@test [$($m:tt)*] [$($t:tt)*] [$($z:tt)*] #[cfg $($a:tt)*] $($rest:tt)*) => {
        $crate::backend_tests!(@test [$($m)* #[cfg $($a)*]] [$($t)*] [$($z)*] $($rest)*);
    };
    (@test [$($m:tt)*] [$($t:tt)*] [$($z:tt)*] #[azurite_ignore = $why:literal] $($rest:tt)*) => {
        $crate::backend_tests!(@test [$($m)*] [$($t)*] [$($z)* #[ignore = $why]] $($rest)*);
    };
    (@test [$($m:tt)*] [$($t:tt)*] [$($z:tt)*] #[$($a:tt)*] $($rest:tt)*) => {
        $crate::backend_tests!(@test [$($m)*] [$($t)* #[$($a)*]] [$($z)*] $($rest)*);
    };
    (@test [$($m:tt)*] [$($t:tt)*] [$($z:tt)*] async fn $name:ident($backend:ident) $body:block $($rest:tt)*) => {
        $($m)*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($backend: $crate::common::Backend) $body

            $($t)*
            async fn local() {
                body($crate::common::Backend::Local).await
            }

            $($t)*
            $($z)*
            async fn azurite() {
                if $crate::common::skip::azurite(&$crate::common::skip::current_test()).is_none() {
                    return;
                }
                body($crate::common::Backend::Azurite).await
            }
        }
        $crate::backend_tests!($($rest)*);
    };
    ($($rest:tt)+) => {
        $crate::backend_tests!(@test [] [] [] $($rest)+);
    };
}
// Unused in tests/randomized, which has no per-backend tests.
#[allow(unused_imports)]
pub use crate::backend_tests;

/// A fresh store of the backend.
pub fn store(backend: Backend) -> Arc<dyn Store> {
    match backend {
        Backend::Local => Arc::new(LocalStore::in_memory().unwrap()),
        Backend::Simulated => mem_store(),
        Backend::Azurite => {
            let cs = std::env::var("TC_TEST_AZURE_CONNECTION").unwrap();
            Arc::new(AzureStore::from_connection_string(&cs).unwrap())
        }
    }
}

/// The in-memory store the deterministic simulator uses ([`MemStore`]): for tests of logic
/// that wait on leases, deadlines or backoff, run under simulated time ([`simulated`]).
pub fn mem_store() -> Arc<dyn Store> {
    Arc::new(table_catalog::store::MemStore::new())
}

/// Makes this thread's environment simulated while the guard lives: time from tokio's
/// clock, which the test pauses (`#[tokio::test(start_paused = true)]`, a current-thread
/// runtime), so a wait for a lease to expire takes no real time; randomness from a fixed
/// seed. Only with [`mem_store`]: the embedded store answers from a thread of its own, and
/// paused time would run ahead while the runtime waits for it ([`Backend::Simulated`]).
pub fn simulated() -> table_catalog::testing::env::Simulated {
    table_catalog::testing::env::simulate(1, 1_798_761_600_000_000)
}

/// [`Backend::Azurite`] when the run has it (else the running test's Azurite variant is
/// reported as skipped): for the real-time variant of a test whose embedded variant runs
/// under simulated time.
pub fn azurite() -> Option<Backend> {
    skip::azurite(&format!("{} (Azurite variant)", skip::current_test())).map(|_| Backend::Azurite)
}

/// A unique catalog name.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// The airports schema: index keys icao, iata, lid; row key name.
pub fn airports_schema() -> Schema {
    Schema::new(vec!["icao".into(), "iata".into(), "lid".into()], "name").unwrap()
}

/// A fresh airports catalog on the backend.
pub async fn airports_catalog(backend: Backend) -> Arc<Catalog> {
    catalog_with(backend, airports_schema(), CatalogOptions::default()).await
}

/// A fresh catalog with this schema and options.
pub async fn catalog_with(backend: Backend, schema: Schema, opts: CatalogOptions) -> Arc<Catalog> {
    let names = Names::new(&unique_name("t"), None, None).unwrap();
    Arc::new(Catalog::open(store(backend), names, schema, opts).await.unwrap())
}

/// Path of the airports data set shipped in the repository.
pub fn airports_csv() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/airports.csv")
}

/// One request through an axum router (no socket): (status, body as JSON, or the raw text as
/// a JSON string when it is not JSON).
pub async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    ct: Option<&str>,
    body: impl Into<axum::body::Body>,
) -> (axum::http::StatusCode, serde_json::Value) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let mut req = axum::http::Request::builder().method(method).uri(uri);
    if let Some(ct) = ct {
        req = req.header("content-type", ct);
    }
    let resp = app.clone().oneshot(req.body(body.into()).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// A store layer counting the calls `counts` selects (e.g. the requests to one table), for
/// tests that count storage requests.
pub struct CallCounter {
    counts: Box<dyn Fn(&table_catalog::store::Call<'_>) -> bool + Send + Sync>,
    /// Calls counted so far.
    pub count: std::sync::atomic::AtomicU64,
}

impl CallCounter {
    /// Counts the calls for which `counts` is true.
    pub fn new(counts: impl Fn(&table_catalog::store::Call<'_>) -> bool + Send + Sync + 'static) -> CallCounter {
        CallCounter { counts: Box::new(counts), count: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Calls counted so far.
    pub fn get(&self) -> u64 {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl table_catalog::store::Layer for CallCounter {
    async fn run<'a, T, F, Fut>(
        &'a self,
        call: table_catalog::store::Call<'a>,
        mut attempt: F,
    ) -> table_catalog::store::StoreResult<T>
    where
        T: table_catalog::store::Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: std::future::Future<Output = table_catalog::store::StoreResult<T>> + Send + 'a,
    {
        if (self.counts)(&call) {
            self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        attempt().await
    }
}

/// Polls `probe` every 50 ms until it returns `Some`; fails naming `what` after 180 s (only a
/// broken or hung system reaches that, even on a loaded 2-core machine running the suite's
/// tests side by side; a passing test never waits for the bound).
pub async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut probe: impl FnMut() -> F) -> T {
    const DEADLINE: std::time::Duration = std::time::Duration::from_secs(180);
    let polling = async {
        loop {
            if let Some(v) = probe().await {
                return v;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(DEADLINE, polling).await.unwrap_or_else(|_| panic!("{what}: not within {DEADLINE:?}"))
}

/// How many rows (live or tombstones) of index `field` the catalog table holds, up to 1,000:
/// the partitions whose key starts with the index's prefix (`{n}_{field}`).
pub async fn rows_of_index(c: &Catalog, field: &str) -> usize {
    let prefix = table_catalog::testing::jobs::index::partition_prefix(field);
    let range = table_catalog::store::PartitionRange {
        after: Some(prefix.clone()),
        before: None,
        to: Some(format!("{prefix}\u{ffff}")),
    };
    c.store().query_partitions(&c.names().table, &range, 1000, None).await.unwrap().entities.len()
}

/// Runs the scan queue's dispatcher of `c` with `workers` work items at once until `job` is
/// final, and returns it as it ended.
pub async fn run_job_until_final(
    c: &Arc<Catalog>,
    jobs: &table_catalog::jobs::Jobs,
    job: &table_catalog::jobs::Job,
    workers: usize,
) -> table_catalog::jobs::Job {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let opts = table_catalog::server::ServeOptions { scan_workers: workers, ..Default::default() };
    let worker = tokio::spawn(table_catalog::server::run_scan_worker(c.clone(), opts, stop_rx));
    let done = wait_for("the job to finish", || async {
        let j = jobs.get(&job.id).await.unwrap();
        j.state.is_final().then_some(j)
    })
    .await;
    stop_tx.send_replace(true);
    worker.await.unwrap();
    done
}
