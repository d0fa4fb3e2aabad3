//! TableCatalog: a multi-index catalog over Azure Table Storage with a crash-safe
//! write-ahead log.
//!
//! A record (a JSON object) is stored once per index value, each copy in the partition of
//! that value, so a lookup by any indexed field is one partition query. A write is durable
//! once its WAL entry is (`wait = false`), and applied to every index by the apply engine
//! (`wait = true` returns then). docs/ARCHITECTURE.md has the design and its invariants.
//!
//! The surface a user needs:
//! - [`Config`]: where the catalog lives (Azure Storage by connection string or managed
//!   identity, or the embedded store) and its schema; [`Config::open`] gives a [`Catalog`].
//! - [`Catalog`]: `insert`, `upsert`, `replace`, `delete`, `query` (filters and paging:
//!   [`query::Filter`], [`query::ResultPage`]), `query_consistent`, `history`, `status`,
//!   `recover`; index changes ([`indexes`]) and whole-table jobs ([`jobs`]).
//! - [`Error`] / [`Result`]: every failure, with the field and limit it concerns.
//! - [`store::TableStore`] and [`store::QueueStore`] (together [`store::Store`]): the storage
//!   traits, for another backend.
//! - [`http`], [`functions`], [`server`]: the HTTP API, the Azure Functions handler and the
//!   local `serve`, which the `table-catalog` binary (feature `cli`) runs.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> table_catalog::Result<()> {
//! use serde_json::json;
//! use table_catalog::{query::Filter, Config};
//!
//! let dir = tempfile::tempdir().expect("a temporary folder");
//! // The embedded store in `dir`; `.connection_string(..)` instead for Azure Storage or Azurite,
//! // `Config::from_env()` for the settings of the `table-catalog` binary.
//! let catalog =
//!     Config::new("airports").index_keys(["icao", "iata"]).row_key("name").local_path(dir.path()).open().await?;
//! let jfk = json!({"icao": "KJFK", "iata": "JFK", "name": "John F Kennedy International Airport"});
//! catalog.upsert(jfk.as_object().expect("an object").clone(), true).await?; // true: applied when it returns
//! let page = catalog.query(&Filter::new(vec![("iata".into(), "jfk".into())]), 10, None).await?;
//! assert_eq!(page.records[0].record["icao"], "KJFK");
//! catalog.delete(Filter::new(vec![("icao".into(), "KJFK".into())]), true).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod env;
pub mod error;
pub mod functions;
pub mod hashed;
pub mod keys;
pub mod record;
pub mod schema;
pub mod settings;
pub mod store;

pub use error::{Error, Result};
pub mod apply;
pub mod catalog;
pub mod config;
pub mod dispatch;
pub mod faults;
pub mod hinter;
pub mod history;
pub mod messages;
pub mod metrics;
pub mod names;
pub mod query;
pub mod scan;
pub mod wal;
pub use catalog::{Catalog, CatalogOptions};
pub use config::Config;
pub mod export;
pub mod http;
pub mod import;
pub mod indexes;
pub mod jobs;
pub mod repair;
pub mod server;
pub mod verify;

/// README.md, so that its Rust example (the "Library" section) compiles as a doctest; its
/// command blocks run in `tests/suite/readme.rs`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
