//! The HTTP client every request of an [`super::AzureStore`] goes through: one pooled
//! `reqwest` client shared by the table, `$batch` and queue clients of a store.
//!
//! azure_core 0.21's default client (`new_http_client`) is built with
//! `pool_max_idle_per_host(0)`, a workaround for hyper issue #2312 (Azure/azure-sdk-for-rust
//! PR #1550): it keeps no connection between requests, so every storage request pays a new
//! TCP connection, and on Azure a TLS handshake, before the request itself; the server pays
//! for accepting and closing each one too. Measured on Azurite 3.37 (docs/BENCHMARKS.md,
//! "Connection reuse"): at least 1,100 connections opened and closed per second by one
//! `serve` process under 16 writing clients, and 7% of Azurite's CPU spent accepting and
//! closing them; with the pool, single writes +14-27% (1 process) and +30-43% (3 processes).
//!
//! hyper #2312 was a hang of a pooled connection whose background task belonged to a Tokio
//! runtime that had been dropped (a client shared across runtimes). A store's client is
//! created with the store and used on the runtime of the process; every attempt also runs
//! under the retry policy's per-attempt timeout ([`super::RetryPolicy::request_timeout`]), so
//! a stuck request fails as transient instead of hanging.
//!
//! Idle connections are closed after [`POOL_IDLE`], below the 5 s keep-alive timeout of
//! Node.js servers such as Azurite (`DEFAULT_TABLE_KEEP_ALIVE_TIMEOUT`), so the client does
//! not pick a connection the server is closing; a request that does meet a closed connection
//! fails as a connection error, which the retry policy treats as transient.

use std::sync::Arc;
use std::time::Duration;

use azure_core::{HttpClient, TransportOptions};

/// How long an idle connection stays in the pool.
pub const POOL_IDLE: Duration = Duration::from_secs(4);

/// The transport of a store's clients: one pooled HTTP client (see the module docs).
pub(crate) fn pooled_transport() -> TransportOptions {
    // Building fails only when the TLS backend cannot initialise; the default client (no
    // pooling) is then the fallback, as slow as before but working.
    let client: Arc<dyn HttpClient> = match reqwest::Client::builder().pool_idle_timeout(POOL_IDLE).build() {
        Ok(client) => Arc::new(client),
        Err(e) => {
            tracing::warn!(error = %e, "building the pooled HTTP client failed; using one connection per request");
            azure_core::new_http_client()
        }
    };
    TransportOptions::new(client)
}
