//! Embedded backend: one SQLite file (bundled build) holding tables and queues with Azure's
//! semantics: ETags and conditional writes, RowKey-ordered pages of at most 1,000 entities
//! with continuation tokens, atomic entity group transactions, queue visibility timeouts,
//! dequeue counts and pop receipts.
//!
//! Durability: SQLite in WAL journal mode. With [`Durability::Full`] (the default) every
//! commit is fsynced, so an acknowledged write survives a power loss; with
//! [`Durability::Process`] it survives a killed process but not an OS crash.
//!
//! Keys compare in UTF-16 code-unit order (the order Azurite uses; SQLite's own would be
//! code-point order), through a registered collation.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use base64::Engine as _;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{
    validate_batch, validate_message, validate_receive, BatchOp, ETag, Entity, IfMatch, Page, Properties, QueueStore,
    ReceivedMessage, RowRange, StoreError, StoreResult, TableStore, Value, MAX_PAGE,
};

/// How hard commits are pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// fsync on every commit (`synchronous=FULL`): survives power loss.
    #[default]
    Full,
    /// fsync at checkpoints only (`synchronous=NORMAL`): survives a killed process.
    Process,
}

/// The embedded store. Cheap to clone; clones share one connection.
#[derive(Clone)]
pub struct LocalStore {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalStore")
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tables (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS entities (
    tbl TEXT NOT NULL, pk TEXT NOT NULL COLLATE UTF16, rk TEXT NOT NULL COLLATE UTF16,
    etag TEXT NOT NULL, props TEXT NOT NULL,
    PRIMARY KEY (tbl, pk, rk)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queues (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS messages (
    queue TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, text TEXT NOT NULL,
    visible_at INTEGER NOT NULL, dequeue_count INTEGER NOT NULL, pop_receipt TEXT NOT NULL,
    PRIMARY KEY (queue, id));
CREATE INDEX IF NOT EXISTS messages_visible ON messages (queue, visible_at, seq);
";

fn db_err(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) =>
        {
            StoreError::Unavailable(format!("embedded store busy: {e}"))
        }
        other => StoreError::Other(format!("embedded store: {other}")),
    }
}

fn utf16_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn new_etag() -> ETag {
    ETag(format!("W/\"{}\"", uuid::Uuid::new_v4().simple()))
}

impl LocalStore {
    /// Opens (creating if needed) the store in folder `dir` (file `catalog.sqlite3`).
    pub fn open(dir: &Path, durability: Durability) -> StoreResult<LocalStore> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Other(format!("embedded store: cannot create {}: {e}", dir.display())))?;
        let conn = Connection::open(dir.join("catalog.sqlite3")).map_err(db_err)?;
        Self::init(conn, durability)
    }

    /// A private in-memory store (tests, benchmarks).
    pub fn in_memory() -> StoreResult<LocalStore> {
        Self::init(Connection::open_in_memory().map_err(db_err)?, Durability::Process)
    }

    fn init(conn: Connection, durability: Durability) -> StoreResult<LocalStore> {
        conn.create_collation("UTF16", utf16_cmp).map_err(db_err)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(db_err)?;
        let sync = match durability {
            Durability::Full => "FULL",
            Durability::Process => "NORMAL",
        };
        conn.execute_batch(&format!("PRAGMA journal_mode=WAL; PRAGMA synchronous={sync};")).map_err(db_err)?;
        conn.execute_batch(SCHEMA).map_err(db_err)?;
        Ok(LocalStore { conn: Arc::new(Mutex::new(conn)) })
    }

    /// Runs `f` on the connection off the async runtime.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().map_err(|_| StoreError::Other("embedded store: connection poisoned".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Other(format!("embedded store task failed: {e}")))?
    }
}

// ---- property encoding (a tagged JSON array per value) ----

fn encode_props(props: &Properties) -> String {
    use serde_json::json;
    let map: serde_json::Map<String, serde_json::Value> = props
        .iter()
        .map(|(k, v)| {
            let tagged = match v {
                Value::String(s) => json!(["S", s]),
                Value::Int32(i) => json!(["I", i]),
                Value::Int64(i) => json!(["L", i.to_string()]),
                Value::Double(f) if f.is_finite() => json!(["D", f]),
                Value::Double(f) => json!(["D", f.to_string()]),
                Value::Bool(b) => json!(["B", b]),
                Value::DateTime(s) => json!(["T", s]),
                Value::Guid(s) => json!(["G", s]),
                Value::Binary(b) => json!(["X", base64::engine::general_purpose::STANDARD.encode(b)]),
            };
            (k.clone(), tagged)
        })
        .collect();
    serde_json::Value::Object(map).to_string()
}

fn decode_props(text: &str) -> StoreResult<Properties> {
    let bad = || StoreError::Other("embedded store: corrupt property encoding".into());
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text).map_err(|_| bad())?;
    let mut props = Properties::new();
    for (k, v) in map {
        let (tag, val) = match v.as_array().map(Vec::as_slice) {
            Some([serde_json::Value::String(t), val]) => (t.clone(), val.clone()),
            _ => return Err(bad()),
        };
        let s = || val.as_str().map(String::from).ok_or_else(bad);
        let value = match tag.as_str() {
            "S" => Value::String(s()?),
            "I" => Value::Int32(val.as_i64().and_then(|i| i32::try_from(i).ok()).ok_or_else(bad)?),
            "L" => Value::Int64(s()?.parse().map_err(|_| bad())?),
            "D" => Value::Double(match val.as_f64() {
                Some(f) => f,
                None => s()?.parse().map_err(|_| bad())?,
            }),
            "B" => Value::Bool(val.as_bool().ok_or_else(bad)?),
            "T" => Value::DateTime(s()?),
            "G" => Value::Guid(s()?),
            "X" => Value::Binary(base64::engine::general_purpose::STANDARD.decode(s()?).map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        props.insert(k, value);
    }
    Ok(props)
}

// ---- table operations, as functions on a connection or transaction ----

/// `SELECT {columns} FROM entities WHERE` table, partition and the range's bounds, with its
/// arguments (the RowKey comparisons use the column's UTF-16 collation).
fn range_query(columns: &str, table: String, partition_key: String, range: &RowRange) -> (String, Vec<String>) {
    let mut sql = format!("SELECT {columns} FROM entities WHERE tbl = ?1 AND pk = ?2");
    let mut args: Vec<String> = vec![table, partition_key];
    for (op, bound) in [(">=", &range.from), (">", &range.after), ("<", &range.before), ("<=", &range.to)] {
        if let Some(b) = bound {
            args.push(b.clone());
            sql.push_str(&format!(" AND rk {op} ?{}", args.len()));
        }
    }
    (sql, args)
}

fn require_table(conn: &Connection, table: &str) -> StoreResult<()> {
    let found: Option<i64> =
        conn.query_row("SELECT 1 FROM tables WHERE name = ?1", [table], |r| r.get(0)).optional().map_err(db_err)?;
    found.map(|_| ()).ok_or_else(|| StoreError::NotFound(format!("table '{table}' does not exist (TableNotFound)")))
}

fn current_etag(conn: &Connection, table: &str, pk: &str, rk: &str) -> StoreResult<Option<String>> {
    conn.query_row("SELECT etag FROM entities WHERE tbl = ?1 AND pk = ?2 AND rk = ?3", params![table, pk, rk], |r| {
        r.get(0)
    })
    .optional()
    .map_err(db_err)
}

fn check_if_match(current: Option<String>, if_match: &IfMatch, what: &str) -> StoreResult<()> {
    match (current, if_match) {
        (None, _) => Err(StoreError::NotFound(format!("{what}: entity not found (ResourceNotFound)"))),
        (Some(cur), IfMatch::Etag(ETag(want))) if &cur != want => {
            Err(StoreError::PreconditionFailed(format!("{what}: ETag changed (UpdateConditionNotSatisfied)")))
        }
        _ => Ok(()),
    }
}

fn write_entity(conn: &Connection, table: &str, e: &Entity) -> StoreResult<ETag> {
    super::value::check_entity(e)?;
    let etag = new_etag();
    conn.execute(
        "INSERT OR REPLACE INTO entities (tbl, pk, rk, etag, props) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![table, e.partition_key, e.row_key, etag.0, encode_props(&e.properties)],
    )
    .map_err(db_err)?;
    Ok(etag)
}

fn do_insert(conn: &Connection, table: &str, e: &Entity) -> StoreResult<ETag> {
    if current_etag(conn, table, &e.partition_key, &e.row_key)?.is_some() {
        return Err(StoreError::AlreadyExists("insert: the entity already exists (EntityAlreadyExists)".into()));
    }
    write_entity(conn, table, e)
}

fn do_replace(conn: &Connection, table: &str, e: &Entity, if_match: &IfMatch) -> StoreResult<ETag> {
    check_if_match(current_etag(conn, table, &e.partition_key, &e.row_key)?, if_match, "replace")?;
    write_entity(conn, table, e)
}

fn do_delete(conn: &Connection, table: &str, pk: &str, rk: &str, if_match: &IfMatch) -> StoreResult<()> {
    check_if_match(current_etag(conn, table, pk, rk)?, if_match, "delete")?;
    conn.execute("DELETE FROM entities WHERE tbl = ?1 AND pk = ?2 AND rk = ?3", params![table, pk, rk])
        .map_err(db_err)?;
    Ok(())
}

fn row_to_entity(row: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, String, String)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

fn build_entity((pk, rk, etag, props): (String, String, String, String)) -> StoreResult<Entity> {
    Ok(Entity { partition_key: pk, row_key: rk, etag: Some(ETag(etag)), properties: decode_props(&props)? })
}

/// Continuation tokens: base64url of the JSON `[PartitionKey, RowKey]` of the last entity
/// returned; the next page starts strictly after it.
fn encode_token(pk: &str, rk: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::json!([pk, rk]).to_string())
}

fn decode_token(token: &str) -> StoreResult<(String, String)> {
    let bad = || StoreError::InvalidInput("continuation token is not one this store issued".into());
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    serde_json::from_slice::<(String, String)>(&bytes).map_err(|_| bad())
}

fn page_from(rows: Vec<Entity>, limit: usize) -> Page {
    let mut entities = rows;
    let continuation = if entities.len() > limit {
        entities.truncate(limit);
        entities.last().map(|e| encode_token(&e.partition_key, &e.row_key))
    } else {
        None
    };
    Page { entities, continuation }
}

#[async_trait]
impl TableStore for LocalStore {
    async fn create_table(&self, table: &str) -> StoreResult<()> {
        super::check_table_name(table)?;
        let t = table.to_lowercase();
        self.with(move |c| {
            c.execute("INSERT OR IGNORE INTO tables (name) VALUES (?1)", [t]).map(|_| ()).map_err(db_err)
        })
        .await
    }

    async fn delete_table(&self, table: &str) -> StoreResult<()> {
        let t = table.to_lowercase();
        self.with(move |c| {
            let tx = c.transaction().map_err(db_err)?;
            tx.execute("DELETE FROM entities WHERE tbl = ?1", [&t]).map_err(db_err)?;
            tx.execute("DELETE FROM tables WHERE name = ?1", [&t]).map_err(db_err)?;
            tx.commit().map_err(db_err)
        })
        .await
    }

    async fn get(&self, table: &str, partition_key: &str, row_key: &str) -> StoreResult<Option<Entity>> {
        let (t, pk, rk) = (table.to_lowercase(), partition_key.to_string(), row_key.to_string());
        self.with(move |c| {
            require_table(c, &t)?;
            c.query_row(
                "SELECT pk, rk, etag, props FROM entities WHERE tbl = ?1 AND pk = ?2 AND rk = ?3",
                params![t, pk, rk],
                row_to_entity,
            )
            .optional()
            .map_err(db_err)?
            .map(build_entity)
            .transpose()
        })
        .await
    }

    async fn insert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        let (t, e) = (table.to_lowercase(), entity.clone());
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
            require_table(&tx, &t)?;
            let etag = do_insert(&tx, &t, &e)?;
            tx.commit().map_err(db_err)?;
            Ok(etag)
        })
        .await
    }

    async fn upsert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        let (t, e) = (table.to_lowercase(), entity.clone());
        self.with(move |c| {
            require_table(c, &t)?;
            write_entity(c, &t, &e)
        })
        .await
    }

    async fn replace(&self, table: &str, entity: &Entity, if_match: &IfMatch) -> StoreResult<ETag> {
        let (t, e, m) = (table.to_lowercase(), entity.clone(), if_match.clone());
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
            require_table(&tx, &t)?;
            let etag = do_replace(&tx, &t, &e, &m)?;
            tx.commit().map_err(db_err)?;
            Ok(etag)
        })
        .await
    }

    async fn delete(&self, table: &str, partition_key: &str, row_key: &str, if_match: &IfMatch) -> StoreResult<()> {
        let (t, pk, rk, m) = (table.to_lowercase(), partition_key.to_string(), row_key.to_string(), if_match.clone());
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
            require_table(&tx, &t)?;
            do_delete(&tx, &t, &pk, &rk, &m)?;
            tx.commit().map_err(db_err)
        })
        .await
    }

    async fn query_partition(
        &self,
        table: &str,
        partition_key: &str,
        range: &RowRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        let limit = limit.clamp(1, MAX_PAGE);
        let mut range = range.clone();
        if let Some(token) = continuation {
            let (_, after) = decode_token(token)?;
            if range.after.as_ref().is_none_or(|a| utf16_cmp(&after, a).is_gt()) {
                range.after = Some(after);
            }
        }
        let (t, pk) = (table.to_lowercase(), partition_key.to_string());
        self.with(move |c| {
            require_table(c, &t)?;
            let (mut sql, args) = range_query("pk, rk, etag, props", t, pk, &range);
            sql.push_str(&format!(" ORDER BY rk LIMIT {}", limit + 1));
            let mut stmt = c.prepare_cached(&sql).map_err(db_err)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args.iter()), row_to_entity)
                .map_err(db_err)?
                .map(|r| r.map_err(db_err).and_then(build_entity))
                .collect::<StoreResult<Vec<_>>>()?;
            Ok(page_from(rows, limit))
        })
        .await
    }

    async fn count_range(
        &self,
        table: &str,
        partition_key: &str,
        range: &RowRange,
    ) -> StoreResult<(u64, Option<String>)> {
        let (t, pk, range) = (table.to_lowercase(), partition_key.to_string(), range.clone());
        self.with(move |c| {
            require_table(c, &t)?;
            let (count_sql, args) = range_query("COUNT(*)", t.clone(), pk.clone(), &range);
            let params = rusqlite::params_from_iter(args.iter());
            let count: i64 = c.query_row(&count_sql, params, |r| r.get(0)).map_err(db_err)?;
            let (mut first_sql, args) = range_query("rk", t, pk, &range);
            first_sql.push_str(" ORDER BY rk LIMIT 1");
            let params = rusqlite::params_from_iter(args.iter());
            let first: Option<String> = c.query_row(&first_sql, params, |r| r.get(0)).optional().map_err(db_err)?;
            Ok((count.max(0) as u64, first))
        })
        .await
    }

    async fn scan(&self, table: &str, limit: usize, continuation: Option<&str>) -> StoreResult<Page> {
        let limit = limit.clamp(1, MAX_PAGE);
        let after = continuation.map(decode_token).transpose()?;
        let t = table.to_lowercase();
        self.with(move |c| {
            require_table(c, &t)?;
            let (sql, args): (&str, Vec<String>) = match after {
                Some((pk, rk)) => (
                    "SELECT pk, rk, etag, props FROM entities WHERE tbl = ?1 AND (pk > ?2 OR (pk = ?2 AND rk > ?3)) ORDER BY pk, rk LIMIT ?4",
                    vec![t, pk, rk],
                ),
                None => ("SELECT pk, rk, etag, props FROM entities WHERE tbl = ?1 ORDER BY pk, rk LIMIT ?2", vec![t]),
            };
            let mut stmt = c.prepare_cached(sql).map_err(db_err)?;
            let mut params: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a as &dyn rusqlite::ToSql).collect();
            let lim = (limit + 1) as i64;
            params.push(&lim);
            let rows = stmt
                .query_map(params.as_slice(), row_to_entity)
                .map_err(db_err)?
                .map(|r| r.map_err(db_err).and_then(build_entity))
                .collect::<StoreResult<Vec<_>>>()?;
            Ok(page_from(rows, limit))
        })
        .await
    }

    async fn batch(&self, table: &str, partition_key: &str, ops: &[BatchOp]) -> StoreResult<Vec<Option<ETag>>> {
        validate_batch(partition_key, ops)?;
        for op in ops {
            if let BatchOp::Insert(e) | BatchOp::Upsert(e) | BatchOp::Replace(e, _) = op {
                super::value::check_entity(e)?;
            }
        }
        let (t, pk, ops) = (table.to_lowercase(), partition_key.to_string(), ops.to_vec());
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
            require_table(&tx, &t)?;
            let mut etags = Vec::with_capacity(ops.len());
            for (index, op) in ops.iter().enumerate() {
                let result = match op {
                    BatchOp::Insert(e) => do_insert(&tx, &t, e).map(Some),
                    BatchOp::Upsert(e) => write_entity(&tx, &t, e).map(Some),
                    BatchOp::Replace(e, m) => do_replace(&tx, &t, e, m).map(Some),
                    BatchOp::Delete { row_key, if_match } => do_delete(&tx, &t, &pk, row_key, if_match).map(|_| None),
                };
                // Dropping `tx` without commit rolls the whole batch back.
                etags.push(result.map_err(|source| StoreError::BatchFailed { index, source: Box::new(source) })?);
            }
            tx.commit().map_err(db_err)?;
            Ok(etags)
        })
        .await
    }
}

// ---- queues ----

fn require_queue(conn: &Connection, queue: &str) -> StoreResult<()> {
    let found: Option<i64> =
        conn.query_row("SELECT 1 FROM queues WHERE name = ?1", [queue], |r| r.get(0)).optional().map_err(db_err)?;
    found.map(|_| ()).ok_or_else(|| StoreError::NotFound(format!("queue '{queue}' does not exist (QueueNotFound)")))
}

fn check_receipt(conn: &Connection, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()> {
    let current: Option<String> = conn
        .query_row("SELECT pop_receipt FROM messages WHERE queue = ?1 AND id = ?2", params![queue, id], |r| r.get(0))
        .optional()
        .map_err(db_err)?;
    match current {
        None => Err(StoreError::NotFound(format!("message {id} not found (MessageNotFound)"))),
        Some(r) if r != pop_receipt => {
            Err(StoreError::PreconditionFailed("pop receipt does not match (PopReceiptMismatch)".into()))
        }
        Some(_) => Ok(()),
    }
}

#[async_trait]
impl QueueStore for LocalStore {
    async fn create_queue(&self, queue: &str) -> StoreResult<()> {
        super::check_queue_name(queue)?;
        let q = queue.to_string();
        self.with(move |c| {
            c.execute("INSERT OR IGNORE INTO queues (name) VALUES (?1)", [q]).map(|_| ()).map_err(db_err)
        })
        .await
    }

    async fn delete_queue(&self, queue: &str) -> StoreResult<()> {
        let q = queue.to_string();
        self.with(move |c| {
            let tx = c.transaction().map_err(db_err)?;
            tx.execute("DELETE FROM messages WHERE queue = ?1", [&q]).map_err(db_err)?;
            tx.execute("DELETE FROM queues WHERE name = ?1", [&q]).map_err(db_err)?;
            tx.commit().map_err(db_err)
        })
        .await
    }

    async fn put_message(&self, queue: &str, text: &str, visible_after: Duration) -> StoreResult<String> {
        validate_message(text, visible_after)?;
        let (q, text) = (queue.to_string(), text.to_string());
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
            require_queue(&tx, &q)?;
            let id = uuid::Uuid::new_v4().to_string();
            let seq: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) + 1 FROM messages", [], |r| r.get(0)).map_err(db_err)?;
            let visible_at = now_ms() + visible_after.as_millis() as i64;
            tx.execute(
                "INSERT INTO messages (queue, id, seq, text, visible_at, dequeue_count, pop_receipt) VALUES (?1, ?2, ?3, ?4, ?5, 0, '')",
                params![q, id, seq, text, visible_at],
            )
            .map_err(db_err)?;
            tx.commit().map_err(db_err)?;
            Ok(id)
        })
        .await
    }

    async fn receive_messages(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
    ) -> StoreResult<Vec<ReceivedMessage>> {
        validate_receive(max, visibility)?;
        let q = queue.to_string();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
            require_queue(&tx, &q)?;
            let now = now_ms();
            let rows: Vec<(String, String, u32)> = {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT id, text, dequeue_count FROM messages WHERE queue = ?1 AND visible_at <= ?2 ORDER BY visible_at, seq LIMIT ?3",
                    )
                    .map_err(db_err)?;
                let rows = stmt
                    .query_map(params![q, now, max as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .map_err(db_err)?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(db_err)?;
                rows
            };
            let hidden_until = now + (visibility.as_secs() as i64) * 1000;
            let mut out = Vec::with_capacity(rows.len());
            for (id, text, count) in rows {
                let receipt = uuid::Uuid::new_v4().to_string();
                tx.execute(
                    "UPDATE messages SET visible_at = ?1, dequeue_count = ?2, pop_receipt = ?3 WHERE queue = ?4 AND id = ?5",
                    params![hidden_until, count + 1, receipt, q, id],
                )
                .map_err(db_err)?;
                out.push(ReceivedMessage { id, pop_receipt: receipt, dequeue_count: count + 1, text });
            }
            tx.commit().map_err(db_err)?;
            Ok(out)
        })
        .await
    }

    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()> {
        let (q, id, r) = (queue.to_string(), id.to_string(), pop_receipt.to_string());
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
            require_queue(&tx, &q)?;
            check_receipt(&tx, &q, &id, &r)?;
            tx.execute("DELETE FROM messages WHERE queue = ?1 AND id = ?2", params![q, id]).map_err(db_err)?;
            tx.commit().map_err(db_err)
        })
        .await
    }

    async fn release_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visible_after: Duration,
    ) -> StoreResult<String> {
        validate_message(text, visible_after)?;
        let (q, id, r, text) = (queue.to_string(), id.to_string(), pop_receipt.to_string(), text.to_string());
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
            require_queue(&tx, &q)?;
            check_receipt(&tx, &q, &id, &r)?;
            let receipt = uuid::Uuid::new_v4().to_string();
            let visible_at = now_ms() + visible_after.as_millis() as i64;
            tx.execute(
                "UPDATE messages SET visible_at = ?1, pop_receipt = ?2, text = ?3 WHERE queue = ?4 AND id = ?5",
                params![visible_at, receipt, text, q, id],
            )
            .map_err(db_err)?;
            tx.commit().map_err(db_err)?;
            Ok(receipt)
        })
        .await
    }

    async fn approximate_count(&self, queue: &str) -> StoreResult<u64> {
        let q = queue.to_string();
        self.with(move |c| {
            require_queue(c, &q)?;
            c.query_row("SELECT COUNT(*) FROM messages WHERE queue = ?1", [q], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(db_err)
        })
        .await
    }
}
