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
//! - [`catalog::Mode`]: how a catalog stores records, chosen at creation: the WAL mode (the
//!   default, described here) or single-partition mode ([`Config::single_partition`]: every
//!   row in one partition, each write one atomic entity group transaction, no WAL).
//! - [`Catalog`]: `insert`, `upsert`, `replace`, `delete`, `query` (filters and paging:
//!   [`query::Filter`], [`query::ResultPage`]), `query_consistent`, `history`, `status`,
//!   `recover`; index changes ([`indexes`]) and whole-table jobs ([`jobs`]).
//! - [`Error`] / [`Result`]: every failure, with the field and limit it concerns.
//! - [`store::TableStore`] and [`store::QueueStore`] (together [`store::Store`]): the storage
//!   traits, for another backend.
//! - [`http`], [`functions`], [`server`]: the HTTP API, the Azure Functions handler and the
//!   local `serve`, which the `table-catalog` binary (feature `cli`) runs.
//!
//! These twelve modules are the API: [`catalog`], [`config`], [`error`], [`query`],
//! [`record`], [`indexes`], [`jobs`], [`history`], [`store`], [`functions`], [`http`] and
//! [`server`]. No module nested in them is public: each re-exports at its top level what a
//! user names (the backends [`store::LocalStore`], [`store::AzureStore`] and
//! [`store::MemStore`] among them). The types of the internals that their signatures carry
//! are re-exported there too:
//! the WAL ids, [`catalog::WalOptions`] and what `recover`, `sweep` and `dead` return from
//! [`catalog`]; [`config::Schema`], [`config::Names`] and the hashed-key types from
//! [`config`]; the queue worker's options from [`server`]. The WAL, the apply engine, the
//! queue dispatcher, the scanners and the whole-table tools are private, so changing them
//! does not change the API. The hidden modules `cli_support` (feature `cli`, for the
//! binary) and `testing` (feature `testing`, for the crate's own tests) re-export those
//! internals; they are not part of the API and carry no semver promise.
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
// Every type a public signature carries can be named from a public module.
#![warn(unnameable_types)]
// Without `cli` (a library user's `default-features = false`) the operator tools that only
// the binary calls (import, verify, repair, the WAL's admin reads, ...) are compiled but
// unused. Builds with `cli` (the default, and every test build) still check dead code.
#![cfg_attr(not(feature = "cli"), allow(dead_code, unused_imports))]

// The public API: at most 12 modules (issue 29). Everything else is `pub(crate)`.
pub mod catalog;
pub mod config;
pub mod error;
pub mod functions;
pub mod history;
pub mod http;
pub mod indexes;
pub mod jobs;
pub mod query;
pub mod record;
pub mod server;
pub mod store;

pub use catalog::{Catalog, CatalogOptions};
pub use config::Config;
pub use error::{Error, Result};

// Internals: the WAL, the apply engine, the queue dispatcher, the whole-table tools.
pub(crate) mod apply;
pub(crate) mod composite;
pub(crate) mod dispatch;
pub(crate) mod env;
pub(crate) mod export;
pub(crate) mod faults;
pub(crate) mod hashed;
pub(crate) mod hinter;
pub(crate) mod import;
pub(crate) mod index_choice;
pub(crate) mod job_core;
pub(crate) mod keys;
pub(crate) mod messages;
pub(crate) mod metrics;
pub(crate) mod names;
pub(crate) mod projection;
pub(crate) mod repair;
pub(crate) mod scan;
pub(crate) mod schema;
pub(crate) mod schema_manager;
pub(crate) mod settings;
pub(crate) mod single;
pub(crate) mod status;
pub(crate) mod verify;
pub(crate) mod wal;

/// Re-exports every public item of each named internal module under a module of the same
/// name (`pub mod wal { pub use crate::wal::*; }`): the modules themselves stay `pub(crate)`.
#[cfg(any(feature = "cli", feature = "testing"))]
macro_rules! reexport_internals {
    ($($m:ident),* $(,)?) => {
        $(pub mod $m {
            pub use crate::$m::*;
        })*
    };
}

/// Re-exports every public item of each named nested module of `$parent` (`store::pager`,
/// `jobs::rebuild`, ...) under `pub mod $name`: the nested modules themselves stay
/// `pub(crate)`, so no nested module of the API is public.
#[cfg(any(feature = "cli", feature = "testing"))]
macro_rules! reexport_nested {
    ($($(#[$attr:meta])* $name:ident = $($path:ident)::+),* $(,)?) => {
        $($(#[$attr])* pub mod $name {
            pub use crate::$($path)::+::*;
        })*
    };
}

/// Internals for the `table-catalog` binary (feature `cli`, on by default): the operator
/// commands reach the WAL, the scanners and the whole-table tools through here. Hidden, and
/// not part of the API: no semver promise, may change with any release.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli_support {
    pub use crate::catalog::internals::CatalogInternals;
    reexport_internals!(
        apply, dispatch, env, export, import, keys, messages, repair, scan, schema, settings, verify, wal
    );

    /// The whole-table job kinds the binary runs itself (`rebuild`'s target).
    pub mod jobs {
        reexport_nested!(rebuild = jobs::rebuild);
    }

    /// The simulated Azure account of the `bench` commands.
    pub mod store {
        reexport_nested!(
            #[cfg(feature = "bench")]
            sim = store::sim
        );
    }
}

/// Internals for the crate's own tests (feature `testing`): every private module, and
/// `CatalogInternals` for a catalog's WAL and apply engine. Hidden, and not part of the API:
/// no semver promise.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing {
    pub use crate::catalog::internals::CatalogInternals;

    /// The dispatcher of `catalog`'s scan queue (`JobHandler::dispatcher`).
    pub fn job_dispatcher(catalog: std::sync::Arc<crate::Catalog>) -> crate::dispatch::Dispatcher {
        crate::jobs::JobHandler::dispatcher(catalog)
    }

    reexport_internals!(
        apply, composite, dispatch, env, export, faults, hashed, hinter, import, keys, messages, metrics, names,
        repair, scan, schema, settings, verify, wal,
    );

    /// The job kinds' modules (`jobs::{handler, index, kinds, rebuild, trim}`).
    pub mod jobs {
        reexport_nested!(
            handler = jobs::handler,
            index = jobs::index,
            kinds = jobs::kinds,
            rebuild = jobs::rebuild,
            trim = jobs::trim,
        );
    }

    /// The history modules (`history::{read, retention}`).
    pub mod history {
        reexport_nested!(read = history::read, retention = history::retention);
    }

    /// The storage modules the API does not re-export: the pager, the conformance suite,
    /// `FaultStore`, the simulated account, the managed-identity details, ...
    pub mod store {
        reexport_nested!(
            bulk_delete = store::bulk_delete,
            conformance = store::conformance,
            counting = store::counting,
            fault = store::fault,
            identity = store::azure::identity,
            layer = store::layer,
            local = store::local,
            mem = store::mem,
            pager = store::pager,
            sim = store::sim,
        );
    }
}

/// README.md, so that its Rust example (the "Library" section) compiles as a doctest; its
/// command blocks run in `tests/suite/readme.rs`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
