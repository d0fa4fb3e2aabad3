//! Configuration: names, schema and storage backend, from code or from the environment
//! (the settings listed in `crate::settings`).
//!
//! ```no_run
//! # async fn demo() -> table_catalog::Result<()> {
//! use table_catalog::config::Config;
//! let catalog = Config::new("airports")
//!     .index_keys(["icao", "iata", "lid"])
//!     .row_key("name")
//!     .local_path("/tmp/airports-store")
//!     .open()
//!     .await?;
//! # Ok(()) }
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use crate::catalog::{Catalog, CatalogOptions};
use crate::error::{Error, Result};
use crate::settings;
use crate::store::azure::{identity, AzureStore};
use crate::store::counting::{CountingStore, RequestCounts};
use crate::store::local::{Durability, LocalStore};
use crate::store::{Store, StoreError};
use crate::wal::schema_row;

pub use crate::hashed::{HashKey, HashKeyError, KeyId};
pub use crate::names::{validate_queue_name, validate_table_name, Names};
pub use crate::projection::{Projection, MAX_INCLUDED_FIELDS};
pub use crate::schema::{AddedIndex, IndexState, RecordKeys, Schema};
pub use crate::single::Mode;

/// Where the catalog is stored.
#[derive(Clone)]
pub enum Backend {
    /// The embedded store in this folder.
    Local(PathBuf),
    /// Azure Storage (or Azurite) through this connection string.
    Azure(String),
    /// Azure Storage through the app's managed identity: the `AzureWebJobsStorage__*`
    /// settings and `IDENTITY_ENDPOINT`/`IDENTITY_HEADER`, read when the store is opened
    /// (used when no connection string is set; see [`crate::store::IdentityConnection`]).
    AzureIdentity,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Local(p) => write!(f, "Local({})", p.display()),
            Backend::Azure(_) => f.write_str("Azure(<connection string redacted>)"),
            Backend::AzureIdentity => f.write_str("AzureIdentity"),
        }
    }
}

/// Everything needed to open a catalog.
#[derive(Debug, Clone)]
pub struct Config {
    /// Catalog table name.
    pub name: String,
    /// Indexed fields; `None` means "use the schema stored in the catalog".
    pub index_keys: Option<Vec<String>>,
    /// Row-key field; `None` means "use the stored schema".
    pub row_key: Option<String>,
    /// Hashed index fields (`crate::hashed`); `None` means "as stored" (none for a new
    /// catalog).
    pub hashed_keys: Option<Vec<String>>,
    /// Redacted fields, a subset of the hashed ones; `None` means "as stored".
    pub redact_keys: Option<Vec<String>>,
    /// The HMAC secret of hashed fields (`TABLE_CATALOG_HASH_KEY`). An invalid setting is
    /// kept as its error (which never holds the value) and reported when the catalog opens.
    pub hash_key: Option<std::result::Result<HashKey, HashKeyError>>,
    /// WAL table name (default `{name}wal`).
    pub wal_name: Option<String>,
    /// Apply queue name (default `{name}-apply`).
    pub queue: Option<String>,
    /// Storage backend.
    pub backend: Backend,
    /// Embedded-store durability.
    pub durability: Durability,
    /// Tunables.
    pub options: CatalogOptions,
    /// The catalog's mode ([`Mode`]: WAL, the default, or single-partition with its tenant
    /// key), chosen when it is created; opening it in the other mode fails.
    pub mode: Mode,
    /// A `TABLE_CATALOG_MODE` / `TABLE_CATALOG_TENANT` setting that did not parse, reported
    /// when the catalog opens.
    mode_error: Option<String>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// `TABLE_CATALOG_HISTORY`, `_DAYS` and `_MAX` over `defaults`. A value that does not parse
/// keeps the default and is logged (the CLI parses the same settings itself and refuses bad
/// values with the setting's name); a number out of range is refused when the catalog opens.
fn history_from_env(defaults: crate::history::HistoryOptions) -> crate::history::HistoryOptions {
    let mut h = defaults;
    if let Some(v) = env(settings::HISTORY) {
        match crate::history::parse_switch(settings::HISTORY, &v) {
            Ok(on) => h.enabled = on,
            Err(e) => tracing::warn!(error = %e, "ignored"),
        }
    }
    for (name, slot) in [(settings::HISTORY_DAYS, &mut h.keep_days), (settings::HISTORY_MAX, &mut h.max_per_record)] {
        if let Some(v) = env(name) {
            // Unparsable: 0, which opening the catalog refuses naming the setting.
            *slot = Some(v.parse().unwrap_or(0));
        }
    }
    h
}

impl Config {
    /// A configuration for catalog `name` on the embedded store in `.table-catalog/`.
    pub fn new(name: &str) -> Config {
        Config {
            name: name.to_string(),
            index_keys: None,
            row_key: None,
            hashed_keys: None,
            redact_keys: None,
            hash_key: None,
            wal_name: None,
            queue: None,
            backend: Backend::Local(PathBuf::from(settings::DEFAULT_LOCAL_PATH)),
            durability: Durability::Full,
            options: CatalogOptions::default(),
            mode: Mode::Wal,
            mode_error: None,
        }
    }

    /// Reads the environment: `TABLE_CATALOG_NAME` (default `catalog`),
    /// `TABLE_CATALOG_INDEX_KEYS`, `TABLE_CATALOG_ROW_KEY`, `TABLE_CATALOG_WAL_NAME`,
    /// `TABLE_CATALOG_QUEUE`, `TABLE_CATALOG_WAL_SHARDS`, `TABLE_CATALOG_HISTORY` (and its
    /// `_DAYS`, `_MAX`), `TABLE_CATALOG_LOCAL_PATH`, `TABLE_CATALOG_HASHED_KEYS`,
    /// `TABLE_CATALOG_REDACT_KEYS`, `TABLE_CATALOG_HASH_KEY`, and
    /// `AZURE_STORAGE_CONNECTION_STRING` falling back to `AzureWebJobsStorage`, then the
    /// identity-based `AzureWebJobsStorage__accountName`/`__tableServiceUri` (when none is
    /// set, the embedded store is used).
    pub fn from_env() -> Config {
        let mut c = Config::new(&env(settings::NAME).unwrap_or_else(|| settings::DEFAULT_NAME.to_string()));
        c.index_keys = env(settings::INDEX_KEYS).map(|v| Schema::parse_list(&v));
        c.row_key = env(settings::ROW_KEY);
        c.hashed_keys = env(settings::HASHED_KEYS).map(|v| Schema::parse_list(&v));
        c.redact_keys = env(settings::REDACT_KEYS).map(|v| Schema::parse_list(&v));
        c.hash_key = env(settings::HASH_KEY).map(|v| HashKey::from_setting(&v));
        c.wal_name = env(settings::WAL_NAME);
        c.queue = env(settings::QUEUE);
        if let Some(v) = env(settings::WAL_SHARDS) {
            // An unparsable count becomes 0, which opening the catalog refuses with the
            // setting's name and the limit.
            c.options.wal.shards = v.parse().unwrap_or(0);
        }
        c.options.history = history_from_env(c.options.history);
        if let Some(mode) = env(settings::MODE) {
            match Mode::parse(settings::MODE, &mode, env(settings::TENANT).as_deref()) {
                Ok(m) => c.mode = m,
                Err(Error::Config(m)) => c.mode_error = Some(m),
                Err(e) => c.mode_error = Some(e.to_string()),
            }
        }
        c.backend = match env(settings::CONNECTION_STRING).or_else(|| env(settings::WEBJOBS_STORAGE)) {
            Some(cs) => Backend::Azure(cs),
            None if identity::is_configured(env) => Backend::AzureIdentity,
            None => Backend::Local(PathBuf::from(
                env(settings::LOCAL_PATH).unwrap_or_else(|| settings::DEFAULT_LOCAL_PATH.into()),
            )),
        };
        c
    }

    /// Sets the index keys (builder style).
    pub fn index_keys<S: Into<String>>(mut self, keys: impl IntoIterator<Item = S>) -> Config {
        self.index_keys = Some(keys.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the row-key field (builder style).
    pub fn row_key(mut self, field: impl Into<String>) -> Config {
        self.row_key = Some(field.into());
        self
    }

    /// Hashes these index fields and redacts `redact` (a subset) with `key` (builder
    /// style; see `crate::hashed`).
    pub fn hashed_keys<S: Into<String>>(
        mut self,
        hashed: impl IntoIterator<Item = S>,
        redact: impl IntoIterator<Item = S>,
        key: HashKey,
    ) -> Config {
        self.hashed_keys = Some(hashed.into_iter().map(Into::into).collect());
        self.redact_keys = Some(redact.into_iter().map(Into::into).collect());
        self.hash_key = Some(Ok(key));
        self
    }

    /// Creates (or opens) the catalog in single-partition mode ([`Mode::SinglePartition`]):
    /// every row in the one partition `tenant`, every write one atomic entity group
    /// transaction (builder style).
    pub fn single_partition(self, tenant: impl Into<String>) -> Config {
        self.mode(Mode::SinglePartition { tenant: tenant.into() })
    }

    /// Sets the catalog's mode (builder style; see [`Config::single_partition`]). It replaces
    /// the mode settings [`Config::from_env`] read, an invalid one included.
    pub fn mode(mut self, mode: Mode) -> Config {
        self.mode = mode;
        self.mode_error = None;
        self
    }

    /// Uses the embedded store in `path` (builder style).
    pub fn local_path(mut self, path: impl Into<PathBuf>) -> Config {
        self.backend = Backend::Local(path.into());
        self
    }

    /// Uses Azure Storage (builder style).
    pub fn connection_string(mut self, cs: impl Into<String>) -> Config {
        self.backend = Backend::Azure(cs.into());
        self
    }

    /// The table and queue names. [`Error::Config`] when `TABLE_CATALOG_SCAN_QUEUE` is set
    /// to anything but `{queue}-scan` (it exists only for the `scan` trigger's binding).
    pub fn names(&self) -> Result<Names> {
        let names = Names::new(&self.name, self.wal_name.as_deref(), self.queue.as_deref())?;
        if let Some(scan) = std::env::var(settings::SCAN_QUEUE).ok().filter(|v| !v.is_empty()) {
            if scan.to_lowercase() != names.scan_queue {
                return Err(Error::Config(format!(
                    "{}: '{scan}' must be '{}' (the apply queue's name followed by '-scan')",
                    settings::SCAN_QUEUE,
                    names.scan_queue
                )));
            }
        }
        Ok(names)
    }

    /// Connects to the configured backend, wrapped in a [`CountingStore`] (two relaxed
    /// atomic increments per request).
    pub fn open_store(&self) -> Result<Arc<dyn Store>> {
        Ok(self.open_counted_store()?.0)
    }

    /// [`Config::open_store`], also returning the store's request counters.
    pub fn open_counted_store(&self) -> Result<(Arc<dyn Store>, Arc<RequestCounts>)> {
        let inner: Arc<dyn Store> = match &self.backend {
            Backend::Local(path) => Arc::new(LocalStore::open(path, self.durability)?),
            Backend::Azure(cs) => Arc::new(AzureStore::from_connection_string(cs)?),
            Backend::AzureIdentity => Arc::new(AzureStore::from_identity_lookup(env)?.ok_or_else(|| {
                StoreError::InvalidInput(format!(
                    "no identity-based storage connection: set {}accountName",
                    identity::PREFIX
                ))
            })?),
        };
        let store = CountingStore::new(inner);
        let counts = store.counts().clone();
        Ok((Arc::new(store), counts))
    }

    /// The schema: from the configuration, or the one stored in the catalog when the
    /// configuration names none; hashed and redacted fields likewise, with the configured
    /// secret (opening then checks them against the stored row).
    async fn resolve_schema(&self, store: &Arc<dyn Store>, names: &Names) -> Result<Schema> {
        let key = match &self.hash_key {
            Some(Err(e)) => return Err(Error::Config(e.to_string())),
            Some(Ok(key)) => Some(key.clone()),
            None => None,
        };
        let configured = match (&self.index_keys, &self.row_key) {
            (Some(keys), Some(row_key)) => Some(Schema::new(keys.clone(), row_key.clone())?),
            (None, None) => None,
            (None, Some(_)) => {
                return Err(Error::Config(format!("{} is set but {} is not", settings::ROW_KEY, settings::INDEX_KEYS)))
            }
            (Some(_), None) => {
                return Err(Error::Config(format!("{} is set but {} is not", settings::INDEX_KEYS, settings::ROW_KEY)))
            }
        };
        // A configured schema includes its hashed fields (none unless set); the stored row is
        // read only when no schema is configured, and opening checks one against the other.
        let (schema, stored) = match configured {
            Some(schema) => (schema, None),
            None => match schema_row::read(store.as_ref(), &names.wal_table).await? {
                Some(s) => (Schema::new(s.index_keys.clone(), s.row_key.clone())?, Some(s)),
                None => return Err(self.no_such_catalog(store, names).await),
            },
        };
        let hashed = self.hashed_keys.clone().or_else(|| stored.as_ref().map(|s| s.hashed.clone())).unwrap_or_default();
        let redact = self.redact_keys.clone().or_else(|| stored.as_ref().map(|s| s.redact.clone())).unwrap_or_default();
        schema.with_hashed_keys(hashed, redact, key)
    }

    /// The error for a catalog without a stored schema when none is configured: most often a
    /// missing or mistyped name, so it names the catalogs the store holds where it can list
    /// them (tables `T` whose WAL table `Twal` has a schema row), then how to create one.
    async fn no_such_catalog(&self, store: &Arc<dyn Store>, names: &Names) -> Error {
        let place = match &self.backend {
            Backend::Local(path) => format!("the embedded store in {}", path.display()),
            Backend::Azure(_) | Backend::AzureIdentity => "this storage account".to_string(),
        };
        let others = match existing_catalogs(store.as_ref()).await {
            Some(found) if found.is_empty() => "; there are no catalogs here".to_string(),
            Some(found) => format!("; catalogs here: {}", found.join(", ")),
            None => String::new(),
        };
        Error::Config(format!(
            "no catalog named '{}' in {place} (its WAL table '{}' holds no schema): to open an existing catalog, \
             set {} (--name){others}; to create '{}', set {} and {} (--index-keys, --row-key)",
            names.table,
            names.wal_table,
            settings::NAME,
            names.table,
            settings::INDEX_KEYS,
            settings::ROW_KEY
        ))
    }

    /// Connects and opens the catalog (creating tables and queues as needed).
    pub async fn open(&self) -> Result<Catalog> {
        if let Some(e) = &self.mode_error {
            return Err(Error::Config(e.clone()));
        }
        let names = self.names()?;
        let (store, counts) = self.open_counted_store()?;
        let schema = match &self.mode {
            Mode::Wal => match self.resolve_schema(&store, &names).await {
                Ok(schema) => Some(schema),
                // No WAL-mode schema: say so if it is a single-partition catalog.
                Err(e @ Error::Config(_)) => {
                    crate::single::meta::refuse_if_single(store.as_ref(), &names).await?;
                    return Err(e);
                }
                Err(e) => return Err(e),
            },
            // The stored schema, when none is configured, is the tenant's mode row's.
            Mode::SinglePartition { .. } => self.configured_schema()?,
        };
        Ok(Catalog::open_with_mode(store, names, schema, self.options.clone(), &self.mode)
            .await?
            .with_request_counts(counts))
    }

    /// The configured schema of a single-partition catalog (`None`: use the stored one).
    fn configured_schema(&self) -> Result<Option<Schema>> {
        let key = match &self.hash_key {
            Some(Err(e)) => return Err(Error::Config(e.to_string())),
            Some(Ok(key)) => Some(key.clone()),
            None => None,
        };
        match (&self.index_keys, &self.row_key) {
            (Some(keys), Some(row_key)) => {
                let schema = Schema::new(keys.clone(), row_key.clone())?;
                let hashed = self.hashed_keys.clone().unwrap_or_default();
                let redact = self.redact_keys.clone().unwrap_or_default();
                Ok(Some(schema.with_hashed_keys(hashed, redact, key)?))
            }
            (None, None) => Ok(None),
            _ => Err(Error::Config(format!("set both {} and {}", settings::INDEX_KEYS, settings::ROW_KEY))),
        }
    }
}

/// The catalogs in `store` with the default WAL name: tables `T` where `Twal` exists and
/// holds a schema row. `None` where the store cannot list tables or the listing fails (it only
/// feeds an error message).
async fn existing_catalogs(store: &dyn Store) -> Option<Vec<String>> {
    let tables = store.list_tables().await.ok()??;
    let mut found = Vec::new();
    for t in &tables {
        let wal = format!("{t}wal");
        if tables.contains(&wal) && matches!(schema_row::read(store, &wal).await, Ok(Some(_))) {
            found.push(t.clone());
        }
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_defaults_and_rules() {
        let n = Names::new("Airports", None, None).unwrap();
        assert_eq!(
            (n.wal_table.as_str(), n.queue.as_str(), n.poison_queue.as_str()),
            ("Airportswal", "airports-apply", "airports-apply-poison")
        );
        assert!(Names::new("a_b", None, None).unwrap_err().to_string().contains("TABLE_CATALOG_NAME"));
        assert!(Names::new("ab", None, None).is_err());
        assert!(Names::new("cat", Some("cat_WAL"), None).unwrap_err().to_string().contains("TABLE_CATALOG_WAL_NAME"));
        assert!(Names::new("cat", None, Some("Bad_Queue")).unwrap_err().to_string().contains("TABLE_CATALOG_QUEUE"));
        assert!(Names::new("cat", Some("CAT"), None).is_err());
        assert_eq!(n.history_table, "Airportshistory");
        assert!(n.check_history_table().is_ok());
        let long = Names::new(&"a".repeat(57), Some("w57"), Some("q57")).unwrap();
        let err = long.check_history_table().unwrap_err().to_string();
        assert!(err.contains("TABLE_CATALOG_NAME") && err.contains("56"), "{err}");
        assert!(Names::new(&"a".repeat(56), Some("w56"), Some("q56")).unwrap().check_history_table().is_ok());
    }

    #[test]
    fn debug_output_hides_the_connection_string() {
        let c = Config::new("cat").connection_string("AccountName=a;AccountKey=SECRETKEY==");
        assert!(!format!("{c:?}").contains("SECRETKEY"));
    }

    #[test]
    fn debug_output_hides_the_hash_key() {
        let secret = "c2VjcmV0LWtleS1vZi1hdC1sZWFzdC0zMi1ieXRlcy0xMjM0NQ==";
        let key = HashKey::from_setting(secret).unwrap();
        let c = Config::new("cat").hashed_keys(["ssn"], [], key);
        let text = format!("{c:?}");
        assert!(!text.contains(secret) && text.contains("[redacted]"), "{text}");
    }
}
