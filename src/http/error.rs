//! API errors: `{"error": {"code", "message"}}` with the HTTP status the failure calls for.
//! Client mistakes get their message; internal failures get a generic one (details go to
//! the log), and no message ever carries credentials.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::error::Error;

/// An error answered over HTTP.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Seconds for a `Retry-After` header (503 `busy`).
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    /// A 400 with this message.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_input",
            message: message.into(),
            retry_after_secs: None,
        }
    }

    /// A 404 `no_route` for a path no route serves (`not_found` is for a resource a route
    /// looked for).
    pub fn no_route(method: &str, path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: "no_route",
            message: format!("no route {method} {path}; the routes are listed under \"HTTP API\" in README.md"),
            retry_after_secs: None,
        }
    }

    /// A 405 `method_not_allowed` for a route that exists but not with this method (the
    /// response's `Allow` header lists the methods it takes).
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: "method_not_allowed",
            message: format!("{method} is not allowed on {path}; the Allow header lists the methods it takes"),
            retry_after_secs: None,
        }
    }

    /// A 415 for a body that is not JSON.
    pub fn unsupported_media_type(got: &str) -> ApiError {
        ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: "unsupported_media_type",
            message: format!(
                "content type '{got}' is not supported; send application/json (or application/x-ndjson for batches)"
            ),
            retry_after_secs: None,
        }
    }

    /// A 413 for a body over `limit` bytes.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "too_large",
            message: format!("request body is over the limit of {limit} bytes"),
            retry_after_secs: None,
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let (status, code) = match &e {
            Error::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_input"),
            Error::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Error::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Error::SchemaMismatch(_) => (StatusCode::CONFLICT, "schema_mismatch"),
            Error::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            Error::Busy { .. } => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
            Error::IndexNotReady(_) => (StatusCode::CONFLICT, "index_not_ready"),
            Error::SchemaChanged(_) => (StatusCode::SERVICE_UNAVAILABLE, "schema_changed"),
            Error::NotSupported(_) => (StatusCode::CONFLICT, "not_supported_in_single_partition_mode"),
            Error::Store(s) if s.is_transient() => (StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %e, "request failed");
            "internal error; see the server log".to_string()
        } else {
            e.to_string()
        };
        let retry_after_secs = match &e {
            Error::Busy { retry_after_secs, .. } => Some(*retry_after_secs),
            Error::SchemaChanged(_) => Some(1),
            _ => None,
        };
        ApiError { status, code, message, retry_after_secs }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({"error": {"code": self.code, "message": self.message}}));
        match self.retry_after_secs {
            Some(secs) => (self.status, [(axum::http::header::RETRY_AFTER, secs.to_string())], body).into_response(),
            None => (self.status, body).into_response(),
        }
    }
}
