//! The stored mode of a single-partition catalog: one row per tenant in the catalog table's
//! partition [`META_PARTITION`] (RowKey: the tenant's PartitionKey), holding the schema the
//! tenant's catalog was created with. Opening checks it both ways:
//!
//! - single-partition mode refuses a catalog whose WAL table holds a WAL-mode schema row
//!   (`crate::wal::schema_row`), and a tenant whose stored schema differs from the configured
//!   one ([`Error::SchemaMismatch`]);
//! - WAL mode refuses a catalog table that holds any such row ([`refuse_if_single`]).

use crate::error::{Error, Result};
use crate::names::Names;
use crate::schema::Schema;
use crate::store::{Entity, RowRange, StoreError, TableStore, Value};

/// The partition of the mode rows in the catalog table (no index key or tenant row shares
/// it: `~` sorts after every key this mode writes, and tenants live in their own partition).
pub(crate) const META_PARTITION: &str = "~single-partition";
/// The `mode` property's value.
const MODE: &str = "single-partition";
/// The row's format (raised if its meaning changes).
const FORMAT: i32 = 1;

fn stored_schema(row: &Entity) -> Result<Schema> {
    let keys = row.str("index_keys").map(Schema::parse_list).unwrap_or_default();
    let row_key = row.str("row_key").unwrap_or_default();
    Schema::new(keys, row_key)
}

fn describe(s: &Schema) -> String {
    format!("index keys {}, row key {}", s.identity_keys().join(","), s.row_key)
}

/// The schema of tenant `partition` in `names.table`, creating the catalog table and the
/// mode row when the tenant is new. `configured`: the schema the caller was configured with
/// (`None`: use the stored one). Errors: the catalog is a WAL-mode one, the stored schema
/// differs from the configured one ([`Error::SchemaMismatch`]), no stored schema and none
/// configured ([`Error::Config`]), hashed fields ([`Error::NotSupported`]), storage failures.
pub(crate) async fn open(
    store: &dyn TableStore,
    names: &Names,
    partition: &str,
    configured: Option<Schema>,
) -> Result<Schema> {
    if let Some(s) = configured.as_ref().filter(|s| !s.hashed().is_empty()) {
        return Err(Error::NotSupported(format!(
            "hashed index fields ({}) are not supported in single-partition mode; use the WAL mode",
            s.hashed().join(", ")
        )));
    }
    if crate::wal::schema_row::read(store, &names.wal_table).await?.is_some() {
        return Err(Error::SchemaMismatch(format!(
            "catalog '{}' was created in WAL mode (its WAL table '{}' holds its schema); open it without \
             single-partition mode (unset TABLE_CATALOG_MODE, or --mode wal)",
            names.table, names.wal_table
        )));
    }
    store.create_table(&names.table).await?;
    for _ in 0..3 {
        if let Some(row) = store.get(&names.table, META_PARTITION, partition).await? {
            let stored = stored_schema(&row)?;
            return match configured {
                Some(c) if c.identity_keys() != stored.identity_keys() || c.row_key != stored.row_key => {
                    Err(Error::SchemaMismatch(format!(
                        "single-partition catalog '{}' (tenant row '{partition}') was created with {}, not {}",
                        names.table,
                        describe(&stored),
                        describe(&c)
                    )))
                }
                _ => Ok(stored),
            };
        }
        let Some(schema) = configured.clone() else {
            return Err(Error::Config(format!(
                "no single-partition catalog '{}' for tenant '{partition}': to create it, set {} and {} \
                 (--index-keys, --row-key)",
                names.table,
                crate::settings::INDEX_KEYS,
                crate::settings::ROW_KEY
            )));
        };
        let row = Entity::new(META_PARTITION, partition)
            .with("mode", Value::String(MODE.into()))
            .with("format", Value::Int32(FORMAT))
            .with("index_keys", Value::String(schema.identity_keys().join(",")))
            .with("row_key", Value::String(schema.row_key.clone()));
        match store.insert(&names.table, &row).await {
            Ok(_) => return Ok(schema),
            // Created meanwhile by another process: compare with what it stored.
            Err(StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Store(StoreError::Unavailable("single-partition: the mode row kept changing while opening".into())))
}

/// Refuses to open `names.table` in WAL mode when it holds single-partition mode rows
/// (one request: the first row of [`META_PARTITION`]; a missing table passes).
pub(crate) async fn refuse_if_single(store: &dyn TableStore, names: &Names) -> Result<()> {
    let page = match store.query_partition(&names.table, META_PARTITION, &RowRange::default(), 1, None).await {
        Ok(page) => page,
        Err(StoreError::NotFound(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    match page.entities.first() {
        None => Ok(()),
        Some(row) => Err(Error::SchemaMismatch(format!(
            "catalog '{}' was created in single-partition mode (tenant row '{}'); open it in that mode \
             (TABLE_CATALOG_MODE=single-partition and TABLE_CATALOG_TENANT, or --mode single-partition --tenant)",
            names.table, row.row_key
        ))),
    }
}
