//! Job and export routes (see [`crate::jobs`], `crate::export`):
//!
//! | route | does |
//! |---|---|
//! | `POST /api/jobs` | start a job: body `{"kind": "verify"|"repair"|"rebuild"|"trim-history", "params": {...}}`; 202 with the job |
//! | `GET /api/jobs[?limit&continuation]` | jobs, newest first |
//! | `GET /api/jobs/{id}` | one job, with live totals while it runs |
//! | `DELETE /api/jobs/{id}` | cancel; 409 when it is already final |
//! | `GET /api/jobs/{id}/findings` | its findings, `application/x-ndjson` |
//! | `GET /api/export[?segment=N]` | every live record once, `application/x-ndjson`, streamed |

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::{SinkExt, StreamExt, TryStreamExt};
use serde_json::Value as Json_;

use super::app::AppState;
use super::error::ApiError;
use crate::error::Error;
use crate::jobs::{JobId, JobKind, Jobs};
use crate::store::MAX_PAGE;

/// Media type of JSON lines.
pub const NDJSON: &str = "application/x-ndjson";

/// The routes of this module.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/jobs", get(list).post(start))
        .route("/api/jobs/{id}", get(show).delete(cancel))
        .route("/api/jobs/{id}/findings", get(findings))
        .route("/api/export", get(export))
}

/// The catalog's jobs; 409 `not_supported_in_single_partition_mode` in that mode.
fn jobs(c: &AppState) -> Result<Jobs, ApiError> {
    c.wal_mode_only("whole-table jobs")?;
    Ok(Jobs::for_catalog(c.clone()))
}

/// Query parameters `(name, value)`, the Functions key `code` dropped; unknown names are
/// refused naming the route's parameters.
fn query(raw: Option<String>, route: &str, known: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
    let mut out = Vec::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        if k == "code" {
            continue;
        }
        if !known.contains(&k.as_ref()) {
            return Err(ApiError::bad_request(format!("{k}: unknown parameter ({route} takes {})", known.join(", "))));
        }
        out.push((k.into_owned(), v.into_owned()));
    }
    Ok(out)
}

fn number(name: &str, value: &str, max: usize) -> Result<usize, ApiError> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| ApiError::bad_request(format!("{name}: '{value}' is not a whole number in 1..={max}")))
}

async fn start(State(c): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let body: Json_ = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("body: not a JSON object {{\"kind\", \"params\"}}: {e}")))?;
    let kind = body.get("kind").and_then(Json_::as_str).ok_or_else(|| {
        let kinds: Vec<&str> = JobKind::BY_HAND.iter().map(|k| k.name()).collect();
        ApiError::bad_request(format!("kind: required ({})", kinds.join(", ")))
    })?;
    let kind = JobKind::parse(kind)?;
    if let Some(k) = body.as_object().and_then(|o| o.keys().find(|k| !["kind", "params"].contains(&k.as_str()))) {
        return Err(ApiError::bad_request(format!("{k}: unknown field (a job has kind and params)")));
    }
    let params = body.get("params").cloned().unwrap_or_else(|| Json_::Object(Default::default()));
    let job = jobs(&c)?.start(kind, params).await?;
    Ok((StatusCode::ACCEPTED, Json(job)).into_response())
}

async fn list(State(c): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let (mut limit, mut token) = (super::app::DEFAULT_LIMIT, None);
    for (k, v) in query(q, "GET /api/jobs", &["limit", "continuation"])? {
        match k.as_str() {
            // The range is checked by `Jobs::list`, with the message `jobs list --limit` gives.
            "limit" => {
                limit = v
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("limit: '{v}' is not a number (1..={MAX_PAGE})")))?
            }
            _ => token = Some(v),
        }
    }
    Ok(Json(jobs(&c)?.list(limit, token.as_deref()).await?).into_response())
}

async fn show(State(c): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(jobs(&c)?.get(&JobId::parse(&id)?).await?).into_response())
}

async fn cancel(State(c): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(jobs(&c)?.cancel(&JobId::parse(&id)?).await?).into_response())
}

async fn findings(State(c): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let id = JobId::parse(&id)?;
    let jobs = jobs(&c)?;
    jobs.get(&id).await?; // 404 for an unknown job
    let lines = jobs.findings(&id).map_ok(|f| Bytes::from(format!("{f}\n")));
    Ok(ndjson(Body::from_stream(lines)))
}

fn ndjson(body: Body) -> Response {
    ([(header::CONTENT_TYPE, NDJSON)], body).into_response()
}

/// Streams the export: a task owns the catalog and feeds a bounded channel, so memory is
/// bounded by the channel and one scan segment, whatever the table's size. A storage error
/// mid-way ends the body with an error (the client sees a truncated response, never a short
/// export that looks complete).
async fn export(State(c): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let mut segment = MAX_PAGE;
    for (_, v) in query(q, "GET /api/export", &["segment"])? {
        segment = number("segment", &v, MAX_PAGE)?;
    }
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, Error>>(64);
    let catalog: Arc<crate::catalog::Catalog> = c.clone();
    tokio::spawn(async move {
        let names = catalog.names().clone();
        let schema = catalog.schema();
        let mut records = match catalog.single_records(segment) {
            Some(records) => records,
            None => crate::export::records(catalog.store().as_ref(), &names.table, &schema, segment),
        };
        while let Some(item) = records.next().await {
            let line = item.map(|r| Bytes::from(format!("{}\n", Json_::Object(r))));
            let failed = line.is_err();
            if tx.send(line).await.is_err() || failed {
                return; // the client went away, or the error was sent
            }
        }
    });
    Ok(ndjson(Body::from_stream(rx)))
}
