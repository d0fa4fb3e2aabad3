//! The invocation endpoints the Functions host calls for non-HTTP triggers:
//! `POST /apply` (queue trigger) and `POST /sweep` (timer trigger), answered in the host's
//! format ([`payload::InvocationResponse`], `application/json`).
//!
//! Failure semantics (docs/FUNCTIONS.md): a non-2xx answer fails the invocation, so the host
//! makes the message visible again and retries it, and after `maxDequeueCount` deliveries
//! copies it to `{queue}-poison`. A transient failure therefore answers 500. A message that can
//! never succeed is put on the poison queue by the catalog itself, with its reason, and
//! answered 200 so the host does not retry it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

use super::payload::{self, InvocationResponse, RESPONSE_CONTENT_TYPE};
use super::{APPLY_BINDING, APPLY_FUNCTION, SWEEP_BINDING, SWEEP_FUNCTION};
use crate::catalog::{Catalog, MessageOutcome};

/// `POST /apply` and `POST /sweep`.
pub fn router(catalog: Arc<Catalog>) -> Router {
    Router::new()
        .route(&format!("/{APPLY_FUNCTION}"), post(apply))
        .route(&format!("/{SWEEP_FUNCTION}"), post(sweep))
        .with_state(catalog)
}

fn answer(status: StatusCode, body: InvocationResponse) -> Response {
    (status, [(header::CONTENT_TYPE, RESPONSE_CONTENT_TYPE)], body.to_body()).into_response()
}

async fn apply(State(catalog): State<Arc<Catalog>>, body: Bytes) -> Response {
    let inv = match payload::parse_queue_invocation(&body, APPLY_BINDING) {
        Ok(inv) => inv,
        Err(e) => {
            tracing::error!(error = %e, "unusable apply invocation");
            return answer(StatusCode::BAD_REQUEST, InvocationResponse::new().with_log(e.to_string()));
        }
    };
    match catalog.process_message(&inv.message, &inv.id, inv.dequeue_count).await {
        Ok(MessageOutcome::Applied { id }) => {
            let line = match id {
                Some(id) => format!("intent {} logged as {id} and applied", inv.id),
                None => format!("hint {} handled", inv.id),
            };
            answer(StatusCode::OK, InvocationResponse::new().with_log(line))
        }
        Ok(MessageOutcome::Poisoned { reason }) => answer(
            StatusCode::OK,
            InvocationResponse::new().with_log(format!("message {} moved to the poison queue: {reason}", inv.id)),
        ),
        Err(e) => {
            tracing::warn!(message_id = %inv.id, dequeue_count = inv.dequeue_count, error = %e, "apply failed; the host will retry");
            answer(StatusCode::INTERNAL_SERVER_ERROR, InvocationResponse::new().with_log(e.to_string()))
        }
    }
}

async fn sweep(State(catalog): State<Arc<Catalog>>, body: Bytes) -> Response {
    if let Err(e) = payload::parse_timer_invocation(&body, SWEEP_BINDING) {
        tracing::warn!(error = %e, "sweep invocation payload not understood; sweeping anyway");
    }
    match catalog.sweep().await {
        Ok(report) => {
            let line = serde_json::to_string(&report).unwrap_or_default();
            answer(StatusCode::OK, InvocationResponse::new().with_log(format!("sweep: {line}")))
        }
        Err(e) => answer(StatusCode::INTERNAL_SERVER_ERROR, InvocationResponse::new().with_log(e.to_string())),
    }
}

/// The whole custom-handler app: the forwarded HTTP API plus the invocation endpoints.
pub fn handler_router(catalog: Arc<Catalog>) -> Router {
    crate::http::router(catalog.clone()).merge(router(catalog))
}
