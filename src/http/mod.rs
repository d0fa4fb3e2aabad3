//! The HTTP API (axum), shared by `serve` and the Functions `handler` (the host forwards
//! HTTP requests unchanged, with the `/api` route prefix).
//!
//! | route | does |
//! |---|---|
//! | `POST /api/records[?wait=true][&upsert=true]` | insert one record (body: JSON object); 202, or 201 when applied (`wait`) |
//! | `PUT /api/records?field=value[&row_from=..&row_to=..][&wait=true]` | replace the matching records with the body; without a filter, upsert |
//! | `GET /api/records?field=value[&field2=value2][&row_from&row_to][&limit&continuation][&consistent=true][&fields=a,b]` | `{records, continuation}`; `consistent`: every write acknowledged before the request is included (503 + `Retry-After` when a backlog is in the way); `fields`: only these fields of each record (through a `keys`/`include` index, fields its rows hold, answered without reading the fact rows; 400 otherwise); header `X-TableCatalog-Index` names the index read ([`INDEX_HEADER`]) |
//! | `DELETE /api/records?field=value[&row_from&row_to][&wait=true]` | delete the matching records; 202 `{id}` |
//! | `POST /api/records/batch[?wait=true]` | upsert a JSON array or JSON lines; one result per input |
//! | `GET /api/records/history?field=value[&limit&continuation]` | `{history: [{identity, op, wal_id, time, time_us, record}], continuation}`, newest first ([`crate::history`]); 404 when the catalog keeps no history |
//! | `GET /api/wal/{id}` | `{id, state: pending|applied|dead|unknown, detail}` ([`crate::catalog::WalState`]); 404 when not pending and above every checkpoint |
//! | `GET /api/wal/dead[?limit&continuation]` | dead entries with the reason each died |
//! | `POST /api/wal/dead/redrive[?id=ID]` | move one dead entry (or all) back to pending |
//! | `GET /api/health`, `GET /api/status` | liveness; pending / oldest age / checkpoint / poison |
//! | `GET /api/metrics` | operator metrics, Prometheus text (`crate::metrics`) |
//! | `/api/jobs...`, `GET /api/export` | whole-table jobs and the export (`jobs`) |
//!
//! A catalog in single-partition mode ([`crate::catalog::Mode`]) is served by the same routes:
//! every write is applied before it is answered (201, or 200 for a delete, `applied: true`;
//! `wait` and `consistent` change nothing), and the routes of what that mode lacks (history,
//! jobs, index changes, the WAL's) answer 409 `not_supported_in_single_partition_mode`.
//!
//! Errors are `{"error": {"code", "message"}}`, unknown routes (404 `no_route`) and wrong
//! methods (405 `method_not_allowed`) included: 400 bad input, 404, 409, 413 too large,
//! 415 not JSON, 503 storage unavailable, 504 `wait` timed out (the write stays durable).

pub(crate) mod app;
pub(crate) mod error;
pub(crate) mod indexes;
pub(crate) mod jobs;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value as Json_};

pub use app::{AppState, DEFAULT_LIMIT, MAX_BATCH_BODY, MAX_RECORD_BODY};
pub use error::ApiError;

use crate::catalog::Written;
use crate::query::Filter;
use crate::record::Record;

/// Query parameters that are not filter fields. `code` is the Functions key.
const RESERVED: [&str; 10] =
    ["wait", "limit", "continuation", "row_from", "row_to", "upsert", "consistent", "code", "allow_partial", "fields"];

/// The response header of `GET /api/records` naming the index the lookup read: a field, or
/// a composite index such as `country+subd` (`crate::index_choice`).
pub const INDEX_HEADER: &str = "x-tablecatalog-index";

/// The API routes.
pub fn router(catalog: AppState) -> Router {
    Router::new()
        .route("/", get(|| async { "table-catalog" }))
        .route(
            "/api/records",
            post(insert_record)
                .put(replace_records)
                .get(query_records)
                .delete(delete_records)
                .layer(DefaultBodyLimit::max(MAX_RECORD_BODY)),
        )
        .route("/api/records/batch", post(batch).layer(DefaultBodyLimit::max(MAX_BATCH_BODY)))
        .route("/api/records/history", get(history))
        .route("/api/wal/dead", get(dead_entries))
        .route("/api/wal/dead/redrive", post(redrive))
        .route("/api/wal/{id}", get(wal_state))
        .route("/api/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/api/status", get(status))
        .route("/api/metrics", get(metrics))
        .merge(jobs::routes())
        .merge(indexes::routes())
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(catalog)
}

/// 404 with the JSON error body for a path no route serves.
async fn unknown_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

/// 405 with the JSON error body for a route that does not take this method (axum adds the
/// `Allow` header). Set on the routes of a router when it is called: call it again after
/// merging more routes (the Functions handler does).
pub(crate) async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// Parsed query string.
#[derive(Debug, Default)]
struct Params {
    fields: Vec<(String, String)>,
    wait: bool,
    upsert: bool,
    consistent: bool,
    allow_partial: bool,
    limit: Option<String>,
    continuation: Option<String>,
    row_from: Option<String>,
    row_to: Option<String>,
    /// `fields=a,b`: return only these fields ([`Filter::returning`]).
    returning: Option<Vec<String>>,
}

fn flag(name: &str, v: &str) -> Result<bool, ApiError> {
    match v {
        "" | "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ApiError::bad_request(format!("{name}: expected true or false, got '{v}'"))),
    }
}

fn params(raw: Option<String>) -> Result<Params, ApiError> {
    let mut p = Params::default();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let (k, v) = (k.into_owned(), v.into_owned());
        match k.as_str() {
            "wait" => p.wait = flag("wait", &v)?,
            "upsert" => p.upsert = flag("upsert", &v)?,
            "consistent" => p.consistent = flag("consistent", &v)?,
            "allow_partial" => p.allow_partial = flag("allow_partial", &v)?,
            "limit" => p.limit = Some(v),
            "continuation" => p.continuation = Some(v),
            "row_from" => p.row_from = Some(v),
            "row_to" => p.row_to = Some(v),
            "fields" => p.returning = Some(v.split(',').map(|f| f.trim().to_string()).collect()),
            _ if RESERVED.contains(&k.as_str()) => {}
            _ => p.fields.push((k, v)),
        }
    }
    Ok(p)
}

impl Params {
    fn filter(&self) -> Filter {
        Filter::new(self.fields.clone())
            .range(self.row_from.clone(), self.row_to.clone())
            .allow_partial(self.allow_partial)
            .returning(self.returning.clone())
    }

    /// `limit`, or [`DEFAULT_LIMIT`] (the range, 1-1,000, is checked where it is used).
    fn page_limit(&self) -> Result<usize, ApiError> {
        match &self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(l) => l.parse().map_err(|_| ApiError::bad_request(format!("limit: '{l}' is not a number (1..=1000)"))),
        }
    }
}

fn content_type(headers: &HeaderMap) -> String {
    headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase()
}

fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else {
            ApiError::bad_request(r.body_text())
        }
    })
}

/// The JSON object in a single-record body.
fn record_body(headers: &HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Record, ApiError> {
    let ct = content_type(headers);
    if !ct.starts_with("application/json") {
        return Err(ApiError::unsupported_media_type(&ct));
    }
    let bytes = body_bytes(body, MAX_RECORD_BODY)?;
    match serde_json::from_slice::<Json_>(&bytes) {
        Ok(Json_::Object(r)) => Ok(r),
        Ok(_) => Err(ApiError::bad_request("body: a record must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("body: invalid JSON: {e}"))),
    }
}

/// 202 when logged; when applied (`wait`), 201 for writes that store a record, 200 for deletes.
fn written(w: Written) -> Response {
    let status = match (w.applied, w.record.is_some()) {
        (false, _) => StatusCode::ACCEPTED,
        (true, true) => StatusCode::CREATED,
        (true, false) => StatusCode::OK,
    };
    (status, Json(w)).into_response()
}

async fn insert_record(
    State(c): State<AppState>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let p = params(q)?;
    let record = record_body(&headers, body)?;
    if !p.fields.is_empty() {
        return Err(ApiError::bad_request("POST /api/records takes no filter; use PUT to replace matching records"));
    }
    let w = if p.upsert { c.upsert(record, p.wait).await? } else { c.insert(record, p.wait).await? };
    Ok(written(w))
}

async fn replace_records(
    State(c): State<AppState>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let p = params(q)?;
    let record = record_body(&headers, body)?;
    let w = if p.fields.is_empty() {
        c.upsert(record, p.wait).await?
    } else {
        c.replace(p.filter(), record, p.wait).await?
    };
    Ok(written(w))
}

async fn query_records(State(c): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = params(q)?;
    let (filter, limit, token) = (p.filter(), p.page_limit()?, p.continuation.as_deref());
    let page = if p.consistent {
        c.query_consistent(&filter, limit, token).await?
    } else {
        c.query(&filter, limit, token).await?
    };
    let records: Vec<Record> = page.records.into_iter().map(|f| f.record).collect();
    let body = Json(json!({"records": records, "continuation": page.continuation}));
    match axum::http::HeaderValue::from_str(&page.index) {
        Ok(index) => Ok(([(INDEX_HEADER, index)], body).into_response()),
        Err(_) => Ok(body.into_response()),
    }
}

async fn delete_records(State(c): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = params(q)?;
    Ok(written(c.delete(p.filter(), p.wait).await?))
}

/// Splits a batch body into items: a JSON array, or JSON lines.
fn batch_items(ct: &str, bytes: &[u8]) -> Result<Vec<Result<Record, ApiError>>, ApiError> {
    let item = |v: Json_| match v {
        Json_::Object(r) => Ok(r),
        _ => Err(ApiError::bad_request("a record must be a JSON object")),
    };
    if ct.starts_with("application/json") {
        match serde_json::from_slice::<Json_>(bytes) {
            Ok(Json_::Array(items)) => Ok(items.into_iter().map(item).collect()),
            Ok(_) => Err(ApiError::bad_request("body: a batch is a JSON array of records (or JSON lines)")),
            Err(e) => Err(ApiError::bad_request(format!("body: invalid JSON: {e}"))),
        }
    } else if ct.starts_with("application/x-ndjson")
        || ct.starts_with("application/jsonl")
        || ct.starts_with("application/json-lines")
    {
        let text = std::str::from_utf8(bytes).map_err(|_| ApiError::bad_request("body: JSON lines must be UTF-8"))?;
        Ok(text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(n, l)| {
                serde_json::from_str::<Json_>(l)
                    .map_err(|e| ApiError::bad_request(format!("line {}: invalid JSON: {e}", n + 1)))
                    .and_then(item)
            })
            .collect())
    } else {
        Err(ApiError::unsupported_media_type(ct))
    }
}

async fn batch(
    State(c): State<AppState>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let p = params(q)?;
    let ct = content_type(&headers);
    let bytes = body_bytes(body, MAX_BATCH_BODY)?;
    if bytes.is_empty() {
        // A Functions host that forwards requests (`enableForwardingHttpRequest`, older
        // hosts) drops a body sent without Content-Length: say so rather than accept nothing.
        return Err(ApiError::bad_request(
            "body: empty; a batch is a JSON array of records (or JSON lines). Behind an Azure Functions \
             host that forwards requests, a body sent chunked (without Content-Length) arrives empty: send \
             Content-Length",
        ));
    }
    let items = batch_items(&ct, &bytes)?;
    let mut slots = Vec::with_capacity(items.len());
    let mut valid = Vec::new();
    for item in items {
        match item {
            Ok(r) => {
                slots.push(None);
                valid.push(r);
            }
            Err(e) => slots.push(Some(e)),
        }
    }
    let mut outcomes = c.upsert_many(valid, p.wait).await?.into_iter();
    let results: Vec<Json_> = slots
        .into_iter()
        .map(|slot| {
            let err = match slot {
                Some(e) => e,
                None => match outcomes.next() {
                    Some(Ok(id)) => return json!({"id": id}),
                    Some(Err(e)) => ApiError::from(e),
                    None => ApiError::bad_request("missing result"),
                },
            };
            json!({"error": {"code": err.code, "message": err.message}})
        })
        .collect();
    Ok((StatusCode::ACCEPTED, Json(json!({"results": results}))).into_response())
}

/// `GET /api/records/history?field=value[&limit&continuation]`: one index field and value.
async fn history(State(c): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = params(q)?;
    let [(field, value)] = p.fields.as_slice() else {
        return Err(ApiError::bad_request(format!(
            "GET /api/records/history takes exactly one field=value (an index field), got {}",
            p.fields.len()
        )));
    };
    if p.row_from.is_some() || p.row_to.is_some() || p.wait || p.upsert || p.consistent {
        return Err(ApiError::bad_request(
            "GET /api/records/history takes one field=value, limit and continuation only",
        ));
    }
    let page = c.history(field, value, p.page_limit()?, p.continuation.as_deref()).await?;
    Ok(Json(page).into_response())
}

/// `GET /api/wal/{id}`: `{id, state, detail}` ([`crate::catalog::WalState`]); 404 for an
/// id above every checkpoint and not pending.
async fn wal_state(State(c): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(c.wal_entry_state(&id).await?).into_response())
}

/// `GET /api/wal/dead[?limit&continuation]`: `{entries: [{id, op, shard, reason,
/// died_at_us}], continuation}`.
async fn dead_entries(State(c): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = params(q)?;
    if let Some((k, _)) = p.fields.first() {
        return Err(ApiError::bad_request(format!(
            "{k}: unknown parameter (GET /api/wal/dead takes limit, continuation)"
        )));
    }
    Ok(Json(c.dead(p.page_limit()?, p.continuation.as_deref()).await?).into_response())
}

/// `POST /api/wal/dead/redrive[?id=ID]`: moves one dead entry (or all) back to pending;
/// `{redriven: [ids]}`.
async fn redrive(State(c): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let mut id = None;
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "id" => id = Some(v.into_owned()),
            "code" => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "{other}: unknown parameter (POST /api/wal/dead/redrive takes id)"
                )))
            }
        }
    }
    let moved = c.redrive(id.as_deref()).await?;
    Ok(Json(json!({"redriven": moved})).into_response())
}

async fn status(State(c): State<AppState>) -> Result<Response, ApiError> {
    Ok(Json(c.status().await?).into_response())
}

async fn metrics(State(c): State<AppState>) -> Result<Response, ApiError> {
    let text = c.metrics_text().await?;
    Ok(([(axum::http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}
