//! The embedded store's operations as SQL on one connection. Writes run inside the writer's
//! group transaction (each request in its own savepoint, see [`super::writer`]), reads on a
//! read connection or, for an in-memory store, on the writer's; none of these functions
//! opens a transaction itself.

use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Params};

use super::super::error::{
    already_exists, message_not_found, queue_not_found, table_not_found, StoreError, StoreResult,
};
use super::super::page::{Page, PartitionRange, RowRange};
use super::super::queue::{check_pop_receipt, ReceivedMessage};
use super::super::table::{check_if_match, BatchOp, IfMatch};
use super::super::value::{ETag, Entity};
use super::codec::{decode_props, encode_props, new_etag, now_ms, page_from};

/// Settings every connection needs: the key collation, the busy timeout, a statement cache
/// large enough for every statement of this module.
pub(super) fn configure(conn: &Connection) -> StoreResult<()> {
    conn.create_collation("UTF16", super::codec::utf16_cmp).map_err(db_err)?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(db_err)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// The database layout. `entities` keys compare with the `UTF16` collation.
pub(super) const SCHEMA: &str = "
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
CREATE INDEX IF NOT EXISTS messages_seq ON messages (seq);
";

/// Maps an SQLite error: busy/locked is transient ([`StoreError::Unavailable`]).
pub(super) fn db_err(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) =>
        {
            StoreError::Unavailable(format!("embedded store busy: {e}"))
        }
        other => StoreError::Other(format!("embedded store: {other}")),
    }
}

/// Runs a statement through the connection's statement cache.
fn exec(conn: &Connection, sql: &str, params: impl Params) -> StoreResult<usize> {
    conn.prepare_cached(sql).and_then(|mut s| s.execute(params)).map_err(db_err)
}

/// One optional row through the connection's statement cache.
fn one<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> StoreResult<Option<T>> {
    conn.prepare_cached(sql).and_then(|mut s| s.query_row(params, f).optional()).map_err(db_err)
}

// ---- tables ----

/// Creates a table (idempotent). `table` is lowercased by the caller.
pub(super) fn create_table(conn: &Connection, table: &str) -> StoreResult<()> {
    exec(conn, "INSERT OR IGNORE INTO tables (name) VALUES (?1)", [table]).map(|_| ())
}

/// Every table's name, in order.
pub(super) fn table_names(conn: &Connection) -> StoreResult<Vec<String>> {
    let mut stmt = conn.prepare_cached("SELECT name FROM tables ORDER BY name").map_err(db_err)?;
    let names = stmt.query_map([], |r| r.get::<_, String>(0)).map_err(db_err)?;
    names.collect::<rusqlite::Result<Vec<String>>>().map_err(db_err)
}

/// Deletes a table and its entities; a missing table is not an error.
pub(super) fn delete_table(conn: &Connection, table: &str) -> StoreResult<()> {
    exec(conn, "DELETE FROM entities WHERE tbl = ?1", [table])?;
    exec(conn, "DELETE FROM tables WHERE name = ?1", [table]).map(|_| ())
}

/// `NotFound` (TableNotFound) unless the table exists.
pub(super) fn require_table(conn: &Connection, table: &str) -> StoreResult<()> {
    one(conn, "SELECT 1 FROM tables WHERE name = ?1", [table], |r| r.get::<_, i64>(0))?
        .map(|_| ())
        .ok_or_else(|| table_not_found(table))
}

fn current_etag(conn: &Connection, table: &str, pk: &str, rk: &str) -> StoreResult<Option<String>> {
    one(conn, "SELECT etag FROM entities WHERE tbl = ?1 AND pk = ?2 AND rk = ?3", params![table, pk, rk], |r| r.get(0))
}

/// An entity checked against the service's limits and encoded for storage, ready to be
/// written. Built by the caller, off the writer thread.
pub(super) struct Encoded {
    pk: String,
    rk: String,
    props: String,
}

impl Encoded {
    /// Checks `e` ([`super::super::value::check_entity`]: property names, count, sizes) and
    /// encodes its properties.
    pub(super) fn new(e: &Entity) -> StoreResult<Encoded> {
        super::super::value::check_entity(e)?;
        Ok(Encoded { pk: e.partition_key.clone(), rk: e.row_key.clone(), props: encode_props(&e.properties) })
    }
}

/// One operation of an entity group transaction, encoded.
pub(super) enum Op {
    Insert(Encoded),
    Upsert(Encoded),
    Replace(Encoded, IfMatch),
    Delete { row_key: String, if_match: IfMatch },
}

impl Op {
    /// Encodes a batch operation (checking its entity).
    pub(super) fn new(op: &BatchOp) -> StoreResult<Op> {
        Ok(match op {
            BatchOp::Insert(e) => Op::Insert(Encoded::new(e)?),
            BatchOp::Upsert(e) => Op::Upsert(Encoded::new(e)?),
            BatchOp::Replace(e, m) => Op::Replace(Encoded::new(e)?, m.clone()),
            BatchOp::Delete { row_key, if_match } => {
                Op::Delete { row_key: row_key.clone(), if_match: if_match.clone() }
            }
        })
    }
}

/// Insert-or-replace without a precondition (`upsert`).
pub(super) fn upsert(conn: &Connection, table: &str, e: &Encoded) -> StoreResult<ETag> {
    let etag = new_etag();
    exec(
        conn,
        "INSERT OR REPLACE INTO entities (tbl, pk, rk, etag, props) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![table, e.pk, e.rk, etag.0, e.props],
    )?;
    Ok(etag)
}

/// Insert; `AlreadyExists` when the entity is there. One statement: the primary key refuses
/// a duplicate (the statement alone is rolled back), so there is no lookup first.
pub(super) fn insert(conn: &Connection, table: &str, e: &Encoded) -> StoreResult<ETag> {
    let etag = new_etag();
    let inserted = conn
        .prepare_cached("INSERT INTO entities (tbl, pk, rk, etag, props) VALUES (?1, ?2, ?3, ?4, ?5)")
        .and_then(|mut s| s.execute(params![table, e.pk, e.rk, etag.0, e.props]));
    match inserted {
        Ok(_) => Ok(etag),
        Err(rusqlite::Error::SqliteFailure(f, _)) if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
            Err(already_exists())
        }
        Err(other) => Err(db_err(other)),
    }
}

/// Replace under `if_match`.
pub(super) fn replace(conn: &Connection, table: &str, e: &Encoded, if_match: &IfMatch) -> StoreResult<ETag> {
    check_if_match(current_etag(conn, table, &e.pk, &e.rk)?.as_deref(), if_match, "replace")?;
    upsert(conn, table, e)
}

/// Delete under `if_match`.
pub(super) fn delete(conn: &Connection, table: &str, pk: &str, rk: &str, if_match: &IfMatch) -> StoreResult<()> {
    check_if_match(current_etag(conn, table, pk, rk)?.as_deref(), if_match, "delete")?;
    exec(conn, "DELETE FROM entities WHERE tbl = ?1 AND pk = ?2 AND rk = ?3", params![table, pk, rk]).map(|_| ())
}

/// The operations of an entity group transaction, in order; the caller's savepoint makes
/// them atomic. The first failing one gives `BatchFailed { index }`.
pub(super) fn batch(conn: &Connection, table: &str, pk: &str, ops: &[Op]) -> StoreResult<Vec<Option<ETag>>> {
    require_table(conn, table)?;
    let mut etags = Vec::with_capacity(ops.len());
    for (index, op) in ops.iter().enumerate() {
        let result = match op {
            Op::Insert(e) => insert(conn, table, e).map(Some),
            Op::Upsert(e) => upsert(conn, table, e).map(Some),
            Op::Replace(e, m) => replace(conn, table, e, m).map(Some),
            Op::Delete { row_key, if_match } => delete(conn, table, pk, row_key, if_match).map(|_| None),
        };
        etags.push(result.map_err(|source| StoreError::BatchFailed { index, source: Box::new(source) })?);
    }
    Ok(etags)
}

type Row = (String, String, String, String);

fn read_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

fn build_entity((pk, rk, etag, props): Row) -> StoreResult<Entity> {
    Ok(Entity { partition_key: pk, row_key: rk, etag: Some(ETag(etag)), properties: decode_props(&props)? })
}

fn entities(conn: &Connection, sql: &str, args: &[&dyn rusqlite::ToSql]) -> StoreResult<Vec<Entity>> {
    let mut stmt = conn.prepare_cached(sql).map_err(db_err)?;
    let rows = stmt.query_map(args, read_row).map_err(db_err)?;
    rows.map(|r| r.map_err(db_err).and_then(build_entity)).collect()
}

/// Point read.
pub(super) fn get(conn: &Connection, table: &str, pk: &str, rk: &str) -> StoreResult<Option<Entity>> {
    require_table(conn, table)?;
    one(
        conn,
        "SELECT pk, rk, etag, props FROM entities WHERE tbl = ?1 AND pk = ?2 AND rk = ?3",
        params![table, pk, rk],
        read_row,
    )?
    .map(build_entity)
    .transpose()
}

/// `SELECT {columns} FROM entities WHERE` table, partition and the range's bounds, with its
/// arguments (the RowKey comparisons use the column's UTF-16 collation).
fn range_query(columns: &str, table: &str, pk: &str, range: &RowRange) -> (String, Vec<String>) {
    let mut sql = format!("SELECT {columns} FROM entities WHERE tbl = ?1 AND pk = ?2");
    let mut args: Vec<String> = vec![table.to_string(), pk.to_string()];
    for (op, bound) in [(">=", &range.from), (">", &range.after), ("<", &range.before), ("<=", &range.to)] {
        if let Some(b) = bound {
            args.push(b.clone());
            sql.push_str(&format!(" AND rk {op} ?{}", args.len()));
        }
    }
    (sql, args)
}

/// One page of a partition range, at most `limit` entities (the caller clamps it and folds
/// the continuation token into `range.after`).
pub(super) fn query_partition(
    conn: &Connection,
    table: &str,
    pk: &str,
    range: &RowRange,
    limit: usize,
) -> StoreResult<Page> {
    require_table(conn, table)?;
    let (mut sql, args) = range_query("pk, rk, etag, props", table, pk, range);
    sql.push_str(&format!(" ORDER BY rk LIMIT {}", limit + 1));
    let args: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a as &dyn rusqlite::ToSql).collect();
    Ok(page_from(entities(conn, &sql, &args)?, limit))
}

/// `(count, first RowKey)` of a partition range, by SQL `COUNT` over at most `cap` rows.
pub(super) fn count_range(
    conn: &Connection,
    table: &str,
    pk: &str,
    range: &RowRange,
    cap: u64,
) -> StoreResult<(u64, Option<String>)> {
    require_table(conn, table)?;
    let (rows_sql, args) = range_query("1", table, pk, range);
    let count_sql = format!("SELECT COUNT(*) FROM ({rows_sql} LIMIT {})", i64::try_from(cap).unwrap_or(-1));
    let count: i64 = one(conn, &count_sql, rusqlite::params_from_iter(args.iter()), |r| r.get(0))?.unwrap_or(0);
    let (mut first_sql, args) = range_query("rk", table, pk, range);
    first_sql.push_str(" ORDER BY rk LIMIT 1");
    let first: Option<String> = one(conn, &first_sql, rusqlite::params_from_iter(args.iter()), |r| r.get(0))?;
    Ok((count.max(0) as u64, first))
}

/// One page of the whole table in (PartitionKey, RowKey) order, after `after` if given.
pub(super) fn scan(conn: &Connection, table: &str, limit: usize, after: Option<(String, String)>) -> StoreResult<Page> {
    require_table(conn, table)?;
    let lim = (limit + 1) as i64;
    let rows = match after {
        Some((pk, rk)) => entities(
            conn,
            "SELECT pk, rk, etag, props FROM entities WHERE tbl = ?1 AND (pk > ?2 OR (pk = ?2 AND rk > ?3)) ORDER BY pk, rk LIMIT ?4",
            &[&table, &pk, &rk, &lim],
        )?,
        None => entities(
            conn,
            "SELECT pk, rk, etag, props FROM entities WHERE tbl = ?1 ORDER BY pk, rk LIMIT ?2",
            &[&table, &lim],
        )?,
    };
    Ok(page_from(rows, limit))
}

/// One page of the entities whose PartitionKey lies in `range`, in (PartitionKey, RowKey)
/// order, strictly after `after` (a continuation position) if given, at most `limit`.
pub(super) fn query_partitions(
    conn: &Connection,
    table: &str,
    range: &PartitionRange,
    limit: usize,
    after: Option<(String, String)>,
) -> StoreResult<Page> {
    require_table(conn, table)?;
    let mut sql = String::from("SELECT pk, rk, etag, props FROM entities WHERE tbl = ?1");
    let mut args: Vec<String> = vec![table.to_string()];
    for (op, bound) in [(">", &range.after), ("<", &range.before), ("<=", &range.to)] {
        if let Some(b) = bound {
            args.push(b.clone());
            sql.push_str(&format!(" AND pk {op} ?{}", args.len()));
        }
    }
    if let Some((pk, rk)) = after {
        args.push(pk);
        args.push(rk);
        let (p, r) = (args.len() - 1, args.len());
        sql.push_str(&format!(" AND (pk > ?{p} OR (pk = ?{p} AND rk > ?{r}))"));
    }
    sql.push_str(&format!(" ORDER BY pk, rk LIMIT {}", limit + 1));
    let args: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a as &dyn rusqlite::ToSql).collect();
    Ok(page_from(entities(conn, &sql, &args)?, limit))
}

// ---- queues ----

/// Creates a queue (idempotent).
pub(super) fn create_queue(conn: &Connection, queue: &str) -> StoreResult<()> {
    exec(conn, "INSERT OR IGNORE INTO queues (name) VALUES (?1)", [queue]).map(|_| ())
}

/// Deletes a queue and its messages; a missing queue is not an error.
pub(super) fn delete_queue(conn: &Connection, queue: &str) -> StoreResult<()> {
    exec(conn, "DELETE FROM messages WHERE queue = ?1", [queue])?;
    exec(conn, "DELETE FROM queues WHERE name = ?1", [queue]).map(|_| ())
}

fn require_queue(conn: &Connection, queue: &str) -> StoreResult<()> {
    one(conn, "SELECT 1 FROM queues WHERE name = ?1", [queue], |r| r.get::<_, i64>(0))?
        .map(|_| ())
        .ok_or_else(|| queue_not_found(queue))
}

fn check_receipt(conn: &Connection, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()> {
    let current: Option<String> =
        one(conn, "SELECT pop_receipt FROM messages WHERE queue = ?1 AND id = ?2", params![queue, id], |r| r.get(0))?;
    check_pop_receipt(&current.ok_or_else(|| message_not_found(id))?, pop_receipt)
}

/// Appends a message visible after `visible_after`; returns its id.
pub(super) fn put_message(conn: &Connection, queue: &str, text: &str, visible_after: Duration) -> StoreResult<String> {
    require_queue(conn, queue)?;
    let id = crate::env::uuid().to_string();
    let seq: i64 = one(conn, "SELECT COALESCE(MAX(seq), 0) + 1 FROM messages", [], |r| r.get(0))?.unwrap_or(1);
    let visible_at = now_ms() + visible_after.as_millis() as i64;
    exec(
        conn,
        "INSERT INTO messages (queue, id, seq, text, visible_at, dequeue_count, pop_receipt) VALUES (?1, ?2, ?3, ?4, ?5, 0, '')",
        params![queue, id, seq, text, visible_at],
    )?;
    Ok(id)
}

/// Receives up to `max` visible messages and hides them for `visibility`.
pub(super) fn receive_messages(
    conn: &Connection,
    queue: &str,
    max: usize,
    visibility: Duration,
) -> StoreResult<Vec<ReceivedMessage>> {
    require_queue(conn, queue)?;
    let now = now_ms();
    let rows: Vec<(String, String, u32)> = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT id, text, dequeue_count FROM messages WHERE queue = ?1 AND visible_at <= ?2 ORDER BY visible_at, seq LIMIT ?3",
            )
            .map_err(db_err)?;
        let rows = stmt
            .query_map(params![queue, now, max as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(db_err)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(db_err)?
    };
    let hidden_until = now + (visibility.as_secs() as i64) * 1000;
    let mut out = Vec::with_capacity(rows.len());
    for (id, text, count) in rows {
        let receipt = crate::env::uuid().to_string();
        exec(
            conn,
            "UPDATE messages SET visible_at = ?1, dequeue_count = ?2, pop_receipt = ?3 WHERE queue = ?4 AND id = ?5",
            params![hidden_until, count + 1, receipt, queue, id],
        )?;
        out.push(ReceivedMessage { id, pop_receipt: receipt, dequeue_count: count + 1, text });
    }
    Ok(out)
}

/// Deletes a received message by its pop receipt.
pub(super) fn delete_message(conn: &Connection, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()> {
    require_queue(conn, queue)?;
    check_receipt(conn, queue, id, pop_receipt)?;
    exec(conn, "DELETE FROM messages WHERE queue = ?1 AND id = ?2", params![queue, id]).map(|_| ())
}

/// Makes a received message visible again after `visible_after`; returns the new receipt.
pub(super) fn release_message(
    conn: &Connection,
    queue: &str,
    id: &str,
    pop_receipt: &str,
    text: &str,
    visible_after: Duration,
) -> StoreResult<String> {
    require_queue(conn, queue)?;
    check_receipt(conn, queue, id, pop_receipt)?;
    let receipt = crate::env::uuid().to_string();
    let visible_at = now_ms() + visible_after.as_millis() as i64;
    exec(
        conn,
        "UPDATE messages SET visible_at = ?1, pop_receipt = ?2, text = ?3 WHERE queue = ?4 AND id = ?5",
        params![visible_at, receipt, text, queue, id],
    )?;
    Ok(receipt)
}

/// Number of messages, visible or not.
pub(super) fn approximate_count(conn: &Connection, queue: &str) -> StoreResult<u64> {
    require_queue(conn, queue)?;
    let n: i64 = one(conn, "SELECT COUNT(*) FROM messages WHERE queue = ?1", [queue], |r| r.get(0))?.unwrap_or(0);
    Ok(n.max(0) as u64)
}
