//! The HTTP API end to end (axum router, no socket), on every backend.

use crate::common;

use axum::body::Body;
use axum::http::StatusCode;
use serde_json::{json, Value};

use common::{airports_catalog, call};

fn jfk() -> Value {
    json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport", "elevation": 13})
}

const JSON: Option<&str> = Some("application/json");

common::backend_tests! {
    #[tokio::test]
    async fn write_then_look_up_by_every_identifier(backend) {
        let app = table_catalog::http::router(airports_catalog(backend).await);
        let (s, body) = call(&app, "POST", "/api/records?wait=true", JSON, jfk().to_string()).await;
        assert_eq!(s, StatusCode::CREATED, "{backend:?} {body}");
        assert_eq!(body["record"], jfk());
        let id = body["id"].as_str().unwrap().to_string();
        let (s, body) = call(&app, "GET", &format!("/api/wal/{id}"), None, Body::empty()).await;
        assert_eq!((s, body["state"].as_str()), (StatusCode::OK, Some("applied")));
        for q in ["icao=KJFK", "iata=jfk", "lid=JFK", "icao=KJFK&iata=JFK", "lid=jfk&row_from=john&row_to=john%20g"] {
            let (s, body) = call(&app, "GET", &format!("/api/records?{q}"), None, Body::empty()).await;
            assert_eq!(s, StatusCode::OK, "{q}");
            assert_eq!(body["records"], json!([jfk()]), "{backend:?} {q}");
        }
        let (s, body) = call(&app, "POST", "/api/records", JSON, jfk().to_string()).await;
        assert_eq!(s, StatusCode::CONFLICT, "{body}");
        let (s, _) = call(&app, "POST", "/api/records?upsert=true", JSON, jfk().to_string()).await;
        assert_eq!(s, StatusCode::ACCEPTED);
        let (s, body) = call(&app, "DELETE", "/api/records?iata=JFK&wait=true", None, Body::empty()).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        let (_, body) = call(&app, "GET", "/api/records?lid=JFK", None, Body::empty()).await;
        assert_eq!(body["records"], json!([]));
        let (s, body) = call(&app, "GET", "/api/status", None, Body::empty()).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!((body["pending"].as_u64(), body["poison"].as_u64()), (Some(0), Some(0)), "{body}");
        assert!(body["checkpoint"].is_string());
        assert_eq!(call(&app, "GET", "/api/health", None, Body::empty()).await.0, StatusCode::OK);
    }
}

common::backend_tests! {
    #[tokio::test]
    async fn replace_and_batch(backend) {
        let app = table_catalog::http::router(airports_catalog(backend).await);
        let batch = json!([
            {"icao": "KLGA", "iata": "LGA", "name": "LaGuardia Airport"},
            {"icao": "KEWR", "name": "Newark Liberty International Airport", "iata": "EWR"},
            {"name": "no identifiers"},
            [1, 2],
            {"icao": "EGLL", "iata": "LHR", "name": "Heathrow", "bad-name": 1}
        ]);
        let (s, body) = call(&app, "POST", "/api/records/batch?wait=true", JSON, batch.to_string()).await;
        assert_eq!(s, StatusCode::ACCEPTED);
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), 5);
        assert!(results[0]["id"].is_string() && results[1]["id"].is_string());
        for (i, why) in [(2, "no value for any index field"), (3, "JSON object"), (4, "not a valid property name")] {
            assert_eq!(results[i]["error"]["code"], "invalid_input", "{i}");
            assert!(results[i]["error"]["message"].as_str().unwrap().contains(why), "{i}: {}", results[i]);
        }
        let lines = "{\"icao\":\"KBOS\",\"iata\":\"BOS\",\"name\":\"Logan\"}\n\n{oops\n";
        let (s, body) = call(&app, "POST", "/api/records/batch?wait=true", Some("application/x-ndjson"), lines).await;
        assert_eq!(s, StatusCode::ACCEPTED);
        assert!(body["results"][0]["id"].is_string());
        assert!(body["results"][1]["error"]["message"].as_str().unwrap().contains("line 3"));
        let (_, body) = call(&app, "GET", "/api/records?iata=BOS", None, Body::empty()).await;
        assert_eq!(body["records"][0]["name"], "Logan");
        // An empty body (what a forwarding Functions host makes of a chunked upload) is refused.
        let (s, body) = call(&app, "POST", "/api/records/batch", Some("application/x-ndjson"), "").await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("Content-Length"), "{body}");
        // Replace moves LaGuardia to a new IATA code.
        let moved = json!({"icao": "KLGA", "iata": "LGX", "name": "LaGuardia Airport"});
        let (s, _) = call(&app, "PUT", "/api/records?icao=KLGA&wait=true", JSON, moved.to_string()).await;
        assert_eq!(s, StatusCode::CREATED);
        let (_, old) = call(&app, "GET", "/api/records?iata=LGA", None, Body::empty()).await;
        let (_, new) = call(&app, "GET", "/api/records?iata=LGX", None, Body::empty()).await;
        assert_eq!((old["records"].as_array().unwrap().len(), new["records"].as_array().unwrap().len()), (0, 1));
    }
}

common::backend_tests! {
    #[tokio::test]
    async fn paging_with_continuation(backend) {
        let app = table_catalog::http::router(airports_catalog(backend).await);
        let batch: Vec<Value> = (0..30)
            .map(|i| json!({"icao": format!("X{i:03}"), "lid": "SHARED", "name": format!("Field {i:02}")}))
            .collect();
        let (s, _) = call(&app, "POST", "/api/records/batch?wait=true", JSON, Value::Array(batch).to_string()).await;
        assert_eq!(s, StatusCode::ACCEPTED);
        let mut names = Vec::new();
        let mut uri = "/api/records?lid=shared&limit=7".to_string();
        loop {
            let (s, body) = call(&app, "GET", &uri, None, Body::empty()).await;
            assert_eq!(s, StatusCode::OK, "{body}");
            names.extend(body["records"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_string()));
            match body["continuation"].as_str() {
                Some(t) => uri = format!("/api/records?lid=shared&limit=7&continuation={t}"),
                None => break,
            }
        }
        let want: Vec<String> = (0..30).map(|i| format!("Field {i:02}")).collect();
        assert_eq!(names, want, "{backend:?}");
    }
}

common::backend_tests! {
    #[tokio::test]
    async fn bad_input_gets_a_clear_4xx_and_writes_nothing(backend) {
        let catalog = airports_catalog(backend).await;
        let app = table_catalog::http::router(catalog.clone());
        let mut too_many = serde_json::Map::new();
        too_many.insert("icao".into(), json!("K"));
        too_many.insert("name".into(), json!("x"));
        for i in 0..251 {
            too_many.insert(format!("f{i}"), json!(i));
        }
        let cases: Vec<(Option<&str>, String, StatusCode, &str)> = vec![
            (JSON, json!({"icao": "KJFK"}).to_string(), StatusCode::BAD_REQUEST, "row-key field 'name'"),
            (
                JSON,
                json!({"name": "x", "iata": ""}).to_string(),
                StatusCode::BAD_REQUEST,
                "no value for any index field",
            ),
            (JSON, json!({"name": "x", "icao": "k".repeat(600)}).to_string(), StatusCode::BAD_REQUEST, "limit is 512"),
            (JSON, json!({"name": "x", "icao": "K", "RowKey": "r"}).to_string(), StatusCode::BAD_REQUEST, "reserved"),
            (JSON, json!({"name": "x", "icao": "K", "_tc": "r"}).to_string(), StatusCode::BAD_REQUEST, "reserved"),
            (JSON, "[1,2]".to_string(), StatusCode::BAD_REQUEST, "JSON object"),
            (JSON, "\"text\"".to_string(), StatusCode::BAD_REQUEST, "JSON object"),
            (JSON, "{\"icao\": \"K\", ".to_string(), StatusCode::BAD_REQUEST, "invalid JSON"),
            (
                JSON,
                json!({"name": "x", "icao": "K", "s": "x".repeat(40_000)}).to_string(),
                StatusCode::PAYLOAD_TOO_LARGE,
                "32768",
            ),
            (JSON, Value::Object(too_many).to_string(), StatusCode::BAD_REQUEST, "limit is 251"),
            (
                JSON,
                json!({"name": "x", "icao": "K", "s": "x".repeat(2 * 1024 * 1024)}).to_string(),
                StatusCode::PAYLOAD_TOO_LARGE,
                "limit",
            ),
            (Some("text/plain"), jfk().to_string(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "application/json"),
            (None, jfk().to_string(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "application/json"),
        ];
        for (ct, body, want, why) in cases {
            let (s, resp) = call(&app, "POST", "/api/records", ct, body.clone()).await;
            assert_eq!(s, want, "{backend:?} {}: {resp}", &body[..body.len().min(60)]);
            let msg = resp["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains(why), "{why}: {msg}");
        }
        for (uri, why) in [
            ("/api/records?city=x", "'city' is not an index field"),
            ("/api/records", "at least one index field"),
            ("/api/records?icao=K&limit=5000", "out of range"),
            ("/api/records?icao=K&limit=abc", "not a number"),
            ("/api/records?icao=K&continuation=%25%25", "continuation"),
            ("/api/records?icao=x%27%20or%20PartitionKey%20ne%20%27", ""),
        ] {
            let (s, resp) = call(&app, "GET", uri, None, Body::empty()).await;
            if why.is_empty() {
                assert_eq!((s, resp["records"].clone()), (StatusCode::OK, json!([])), "OData injection finds nothing");
            } else {
                assert_eq!(s, StatusCode::BAD_REQUEST, "{uri}: {resp}");
                assert!(resp["error"]["message"].as_str().unwrap().contains(why), "{uri}: {resp}");
            }
        }
        let (s, _) = call(&app, "GET", "/api/wal/not-an-id", None, Body::empty()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        let (s, _) = call(
            &app,
            "GET",
            "/api/wal/2026-01-01T00:00:00.000000_00000000-0000-0000-0000-000000000000",
            None,
            Body::empty(),
        )
        .await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        let status = catalog.status().await.unwrap();
        assert_eq!(status.pending, 0, "nothing was written");
        assert!(status.checkpoint.is_none(), "nothing was ever applied");
        let rows =
            table_catalog::testing::verify::scan_all(catalog.store().as_ref(), &catalog.names().table).await.unwrap();
        assert!(rows.is_empty());
    }
}

/// An unknown route (404) and a route called with a method it does not take (405) answer
/// the same JSON error body as every other error, naming the method and path; the 405 keeps
/// its `Allow` header. The Functions custom handler (more routes merged in) answers alike.
#[tokio::test]
async fn unknown_routes_and_wrong_methods_answer_json_errors() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let catalog = airports_catalog(common::Backend::Local).await;
    let apps = [
        ("serve", table_catalog::http::router(catalog.clone())),
        ("handler", table_catalog::functions::handler_router(catalog.clone())),
    ];
    for (name, app) in apps {
        // The Functions invocation endpoints are merged into the handler only.
        let sweep = match name {
            "handler" => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "GET is not allowed on /sweep"),
            _ => (StatusCode::NOT_FOUND, "no_route", "no route GET /sweep"),
        };
        let cases = [
            ("GET", "/sweep", sweep.0, sweep.1, sweep.2),
            ("GET", "/api/nope", StatusCode::NOT_FOUND, "no_route", "no route GET /api/nope"),
            ("GET", "/nope/deeper?x=1", StatusCode::NOT_FOUND, "no_route", "no route GET /nope/deeper"),
            (
                "PATCH",
                "/api/records",
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "PATCH is not allowed on /api/records",
            ),
            (
                "POST",
                "/api/status",
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "POST is not allowed on /api/status",
            ),
            ("DELETE", "/api/wal/dead", StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "DELETE is not allowed"),
        ];
        for (method, uri, status, code, message) in cases {
            let req = axum::http::Request::builder().method(method).uri(uri).body(Body::empty()).unwrap();
            let resp = app.clone().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), status, "{name} {method} {uri}");
            let allow = resp.headers().get("allow").map(|v| v.to_str().unwrap_or_default().to_string());
            assert_eq!(
                resp.headers().get("content-type").and_then(|v| v.to_str().ok()),
                Some("application/json"),
                "{name} {method} {uri}"
            );
            let body: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
            assert_eq!(body["error"]["code"], code, "{name} {method} {uri}: {body}");
            let got = body["error"]["message"].as_str().unwrap_or_default();
            assert!(got.contains(message), "{name} {method} {uri}: {got}");
            if status == StatusCode::METHOD_NOT_ALLOWED {
                assert!(allow.is_some_and(|a| !a.is_empty()), "{name} {method} {uri}: the Allow header stays");
            }
        }
    }
}

/// `POST /api/jobs` without a kind names every kind it starts by hand, the ones the README's
/// route table lists (it named only verify and repair, though rebuild and trim-history start).
#[tokio::test]
async fn a_job_without_a_kind_names_the_kinds_it_starts() {
    let app = table_catalog::http::router(airports_catalog(common::Backend::Local).await);
    let (s, body) = call(&app, "POST", "/api/jobs", JSON, "{}".to_string()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(message, "kind: required (verify, repair, rebuild, trim-history)", "{body}");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let row = readme.lines().find(|l| l.starts_with("| `POST /api/jobs`")).unwrap();
    assert!(row.contains(r#"{"kind": "verify"|"repair"|"rebuild"|"trim-history""#), "{row}");
}
