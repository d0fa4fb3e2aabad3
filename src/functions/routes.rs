//! The invocation endpoints the Functions host calls for non-HTTP triggers:
//! `POST /apply` and `POST /scan` (queue triggers) and `POST /sweep` (timer trigger), answered in the host's
//! format ([`payload::InvocationResponse`], `application/json`).
//!
//! Failure semantics (docs/FUNCTIONS.md): a non-2xx answer fails the invocation, so the host
//! makes the message visible again and retries it, and after `maxDequeueCount` deliveries
//! copies it to `{queue}-poison`. A transient failure therefore answers 500. A message that can
//! never succeed is put on the poison queue by the dispatcher (`crate::dispatch`, the same
//! one `serve` runs), with its reason, and answered 200 so the host does not retry it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

use super::names::{APPLY_BINDING, APPLY_FUNCTION, SCAN_BINDING, SCAN_FUNCTION, SWEEP_BINDING, SWEEP_FUNCTION};
use super::payload::{self, InvocationResponse, RESPONSE_CONTENT_TYPE};
use crate::catalog::Catalog;
use crate::dispatch::{Delivery, Dispatcher, Disposition};
use crate::jobs::JobHandler;

/// `POST /apply` and `POST /sweep`.
pub fn router(catalog: Arc<Catalog>) -> Router {
    Router::new()
        .route(&format!("/{APPLY_FUNCTION}"), post(apply))
        .route(&format!("/{SCAN_FUNCTION}"), post(scan))
        .route(&format!("/{SWEEP_FUNCTION}"), post(sweep))
        .with_state(catalog)
}

fn answer(status: StatusCode, body: InvocationResponse) -> Response {
    (status, [(header::CONTENT_TYPE, RESPONSE_CONTENT_TYPE)], body.to_body()).into_response()
}

async fn apply(State(catalog): State<Arc<Catalog>>, body: Bytes) -> Response {
    invoke(Dispatcher::apply(catalog.clone()), &body, APPLY_BINDING).await
}

async fn scan(State(catalog): State<Arc<Catalog>>, body: Bytes) -> Response {
    invoke(JobHandler::dispatcher(catalog), &body, SCAN_BINDING).await
}

/// One queue-trigger invocation through `dispatcher`: 200 when done or poisoned by us, 500
/// for the host to retry (and to poison after `maxDequeueCount`).
async fn invoke(dispatcher: Dispatcher, body: &[u8], binding: &str) -> Response {
    let inv = match payload::parse_queue_invocation(body, binding) {
        Ok(inv) => inv,
        Err(e) => {
            tracing::error!(error = %e, queue = dispatcher.queue(), "unusable queue invocation");
            return answer(StatusCode::BAD_REQUEST, InvocationResponse::new().with_log(e.to_string()));
        }
    };
    let delivery = Delivery { text: &inv.message, id: &inv.id, dequeue_count: inv.dequeue_count };
    match dispatcher.invoke(delivery).await {
        Ok(Disposition::Done(line)) => answer(StatusCode::OK, InvocationResponse::new().with_log(line)),
        Ok(Disposition::Poisoned(reason)) => answer(
            StatusCode::OK,
            InvocationResponse::new().with_log(format!("message {} moved to the poison queue: {reason}", inv.id)),
        ),
        Ok(Disposition::Retry(e)) => {
            tracing::warn!(message_id = %inv.id, dequeue_count = inv.dequeue_count, error = %e, queue = dispatcher.queue(), "message failed; the host will retry");
            answer(StatusCode::INTERNAL_SERVER_ERROR, InvocationResponse::new().with_log(e))
        }
        Err(e) => {
            tracing::warn!(message_id = %inv.id, error = %e, "could not poison a rejected message; the host will retry");
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
    crate::http::router(catalog.clone()).merge(router(catalog)).method_not_allowed_fallback(crate::http::wrong_method)
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use serde_json::{json, Map, Value};
    use tower::ServiceExt;

    use super::*;
    use crate::catalog::CatalogOptions;
    use crate::config::Names;
    use crate::schema::Schema;
    use crate::store::local::LocalStore;

    async fn catalog() -> Arc<Catalog> {
        let store = Arc::new(LocalStore::in_memory().unwrap());
        let names = Names::new("routes", None, None).unwrap();
        let schema = Schema::new(vec!["eid".into(), "ssn".into()], "lastname").unwrap();
        Arc::new(Catalog::open(store, names, schema, CatalogOptions::default()).await.unwrap())
    }

    /// The body the host sends for an apply-queue message (functions-host-contract.md §2):
    /// the text JSON-quoted inside a JSON string, `DequeueCount` as a string, `Id` quoted.
    fn queue_invocation(text: &str, id: &str, dequeue_count: u32) -> String {
        let mut data = Map::new();
        data.insert(APPLY_BINDING.to_string(), Value::String(serde_json::to_string(text).unwrap()));
        json!({
            "Data": data,
            "Metadata": {
                "DequeueCount": dequeue_count.to_string(),
                "Id": serde_json::to_string(id).unwrap(),
                "PopReceipt": "\"AgAAAAMAAAAAAAAA8d5gQex+2AE=\"",
                "InsertionTime": "2025-01-01T10:00:00+00:00",
                "sys": {"MethodName": APPLY_FUNCTION, "UtcNow": "2025-01-01T10:00:01.1234567Z", "RandGuid": "0e7a3f52-9d1b-4b8e-a2c4-6f5d3e2b1a09"}
            }
        })
        .to_string()
    }

    /// `POST path` with a host invocation body: (status, content type, JSON body).
    async fn invoke(app: &Router, path: &str, body: String) -> (StatusCode, String, Value) {
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json; charset=utf-8")
            .header("X-Azure-Functions-InvocationId", "7d4c2b7e-0c1a-4f43-9a7b-3d2f1e0c9b8a")
            .body(Body::from(body))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let ct = resp.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, ct, serde_json::from_slice(&bytes).expect("a JSON body"))
    }

    fn logs(body: &Value) -> String {
        body["Logs"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect::<Vec<_>>().join("\n")
    }

    fn assert_host_shape(body: &Value) {
        assert_eq!(body["Outputs"], json!({}), "{body}");
        assert_eq!(body["ReturnValue"], Value::Null, "{body}");
        assert!(body["Logs"].is_array(), "{body}");
    }

    #[tokio::test]
    async fn apply_logs_an_intent_once_per_message_id_and_applies_it() {
        let catalog = catalog().await;
        let app = router(catalog.clone());
        let intent = r#"{"v":1,"op":"insert","record":{"eid":"F314","ssn":"123-45-6789","lastname":"Faux"}}"#;
        let (status, ct, first) = invoke(&app, "/apply", queue_invocation(intent, "msg-1", 1)).await;
        assert_eq!(status, StatusCode::OK, "{first}");
        assert_eq!(ct, RESPONSE_CONTENT_TYPE);
        assert_host_shape(&first);
        assert!(logs(&first).contains("intent msg-1 logged as"), "{first}");
        // Redelivery of the same queue message: logged once, same WAL id.
        let (status, _, second) = invoke(&app, "/apply", queue_invocation(intent, "msg-1", 2)).await;
        assert_eq!(status, StatusCode::OK, "{second}");
        assert_eq!(logs(&first), logs(&second));
        let filter =
            crate::messages::filter_from_object(json!({"ssn": "123-45-6789"}).as_object().unwrap(), None, None)
                .unwrap();
        let records = catalog.query_all(&filter).await.unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(catalog.status().await.unwrap().pending, 0);
    }

    #[tokio::test]
    async fn apply_handles_a_hint() {
        let app = router(catalog().await);
        let hint = crate::messages::hint_json("wal", "20250101T100000000000Z_00000000-0000-0000-0000-000000000000");
        let (status, _, body) = invoke(&app, "/apply", queue_invocation(&hint, "h-1", 1)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(logs(&body).contains("hint h-1 handled"), "{body}");
    }

    #[tokio::test]
    async fn apply_poisons_a_message_that_can_never_succeed_and_succeeds() {
        let catalog = catalog().await;
        let app = router(catalog.clone());
        for (i, text) in ["not json", r#"{"v":1,"op":"explode"}"#, r#"{"v":1,"op":"insert","record":{"lastname":"x"}}"#]
            .iter()
            .enumerate()
        {
            let (status, ct, body) = invoke(&app, "/apply", queue_invocation(text, &format!("bad-{i}"), 1)).await;
            assert_eq!(status, StatusCode::OK, "{text}: {body}");
            assert_eq!(ct, RESPONSE_CONTENT_TYPE);
            assert_host_shape(&body);
            assert!(logs(&body).contains("poison"), "{text}: {body}");
        }
        assert_eq!(catalog.status().await.unwrap().poison, 3);
    }

    #[tokio::test]
    async fn apply_rejects_an_unusable_invocation_with_a_non_2xx_json_answer() {
        let app = router(catalog().await);
        for body in [
            "not json".to_string(),
            json!({"Data": {"other": "\"x\""}, "Metadata": {"DequeueCount": "1", "Id": "\"i\""}}).to_string(),
            json!({"Data": {APPLY_BINDING: "\"x\""}, "Metadata": {"Id": "\"i\""}}).to_string(),
        ] {
            let (status, ct, answer) = invoke(&app, "/apply", body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(ct, RESPONSE_CONTENT_TYPE);
            assert_host_shape(&answer);
        }
    }

    #[tokio::test]
    async fn sweep_answers_in_the_host_format() {
        let app = router(catalog().await);
        let mut data = Map::new();
        data.insert(
            SWEEP_BINDING.to_string(),
            json!({"Schedule": {"AdjustForDST": true}, "ScheduleStatus": null, "IsPastDue": false}),
        );
        let body = json!({"Data": data, "Metadata": {"sys": {"MethodName": SWEEP_FUNCTION}}}).to_string();
        let (status, ct, answer) = invoke(&app, "/sweep", body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(ct, RESPONSE_CONTENT_TYPE);
        assert_host_shape(&answer);
        assert!(logs(&answer).starts_with("sweep: "), "{answer}");
    }

    /// A single-partition catalog behind the Functions handler: the forwarded API writes and
    /// reads through the same routes (applied when answered), the timer's sweep has nothing
    /// to do, and an apply-queue message is refused with the mode's reason.
    #[tokio::test]
    async fn single_partition_catalog_behind_the_handler() {
        let store = Arc::new(LocalStore::in_memory().unwrap());
        let names = Names::new("routessp", None, None).unwrap();
        let schema = Schema::new(vec!["eid".into(), "ssn".into()], "lastname").unwrap();
        let mode = crate::catalog::Mode::SinglePartition { tenant: "t1".into() };
        let catalog = Arc::new(
            Catalog::open_with_mode(store, names, Some(schema), CatalogOptions::default(), &mode).await.unwrap(),
        );
        let app = handler_router(catalog.clone());
        let req = Request::builder()
            .method("POST")
            .uri("/api/records")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"eid":"F314","ssn":"123","lastname":"Faux"}"#))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        let req = Request::builder().uri("/api/records?ssn=123").body(Body::empty()).unwrap();
        let bytes = app.clone().oneshot(req).await.unwrap().into_body().collect().await.unwrap().to_bytes();
        let found: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(found["records"][0]["eid"], "F314", "{found}");
        let mut data = Map::new();
        data.insert(SWEEP_BINDING.to_string(), json!({"IsPastDue": false}));
        let body = json!({"Data": data, "Metadata": {"sys": {"MethodName": SWEEP_FUNCTION}}}).to_string();
        let (status, _, answer) = invoke(&app, "/sweep", body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let outcome = catalog.process_message(r#"{"shard":"wal"}"#, "m1").await.unwrap();
        match outcome {
            crate::catalog::MessageOutcome::Rejected { reason } => {
                assert!(reason.contains("single-partition"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn handler_router_answers_the_readiness_probe_and_the_forwarded_api() {
        let app = handler_router(catalog().await);
        for path in ["/", "/api/health"] {
            let req = Request::builder().uri(path).body(Body::empty()).unwrap();
            let resp = app.clone().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "GET {path}");
        }
    }
}
