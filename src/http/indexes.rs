//! Index routes (see [`crate::indexes`]):
//!
//! | route | does |
//! |---|---|
//! | `GET /api/indexes` | every index with its state (and its job's progress while one runs) |
//! | `POST /api/indexes` | add an index: body `{"field": "country"}` (or a composite index, `{"field": "country+subd"}`), optionally with `"projection": "all" \| "keys" \| "include:a,b"` (default `all`, [`crate::indexes::Projection`]); 202 with the change |
//! | `DELETE /api/indexes/{field}` | drop an added index (`/api/indexes/country+subd` for a composite one); 202 with the change |
//!
//! Errors: 400 for a bad field name, projection or body (a projection other than `all` on an
//! identity field included), 404 for an unknown index, 409 for an index
//! that exists already, an identity field (drop) or a backfilling index (drop).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde_json::{json, Value as Json_};

use super::app::AppState;
use super::error::ApiError;
use crate::indexes;

/// The routes of this module.
pub fn routes() -> Router<AppState> {
    Router::new().route("/api/indexes", get(list).post(add)).route("/api/indexes/{field}", delete(drop))
}

async fn list(State(c): State<AppState>) -> Result<Response, ApiError> {
    Ok(Json(json!({ "indexes": indexes::list(&c).await? })).into_response())
}

async fn add(State(c): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let body: Json_ = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!("body: not a JSON object {{\"field\": NAME, \"projection\": ..}}: {e}"))
    })?;
    if let Some(k) = body.as_object().and_then(|o| o.keys().find(|k| !["field", "projection"].contains(&k.as_str()))) {
        return Err(ApiError::bad_request(format!(
            "{k}: unknown field (the body is {{\"field\": NAME, \"projection\": \"all\" | \"keys\" | \"include:a,b\"}})"
        )));
    }
    let field = body
        .get("field")
        .and_then(Json_::as_str)
        .ok_or_else(|| ApiError::bad_request("field: required, the name of the record field to index"))?;
    let projection = match body.get("projection") {
        None | Some(Json_::Null) => indexes::Projection::All,
        Some(Json_::String(p)) => indexes::Projection::parse(p)?,
        Some(_) => {
            return Err(ApiError::bad_request("projection: a string, \"all\", \"keys\" or \"include:a,b\""));
        }
    };
    Ok((StatusCode::ACCEPTED, Json(indexes::add_projected(&c, field, projection).await?)).into_response())
}

async fn drop(State(c): State<AppState>, Path(field): Path<String>) -> Result<Response, ApiError> {
    Ok((StatusCode::ACCEPTED, Json(indexes::drop(&c, &field).await?)).into_response())
}
