//! The host's HTTP front end for HTTP-triggered functions (contract §5, §7).
//!
//! Routes are `/{routePrefix}/{route}` with the function.json `methods` (all when omitted);
//! a request no function matches gets the host's own 404, before the handler sees anything.
//! With `enableForwardingHttpRequest` and a function that has exactly one `httpTrigger`
//! input and one `http` output, the request is forwarded to the handler unchanged: same
//! method, path including the prefix, query rebuilt from the parsed query (every key, `code`
//! included; repeated keys comma-joined), the client's headers plus
//! `X-Azure-Functions-HostVersion`, `X-Azure-Functions-InvocationId` and
//! `Azure-Functions-Host/<v>` appended to User-Agent, the body only when the request has a
//! Content-Length > 0. The handler's answer is relayed as-is (no redirect following; a 500
//! is not an invocation failure).
//!
//! Authorization ("Azure mode", `HarnessOptions::function_key`): `function` and `admin`
//! functions need the key in `x-functions-key` or `code`, else 401 with no body. Without a
//! key ("local mode", like Core Tools) nothing is checked.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;

use super::app::{App, AuthLevel, Trigger};
use super::payload::HOST_VERSION;

/// One forwarded (or refused) client request.
#[derive(Debug, Clone)]
pub struct HttpRecord {
    pub method: String,
    /// Client path and query.
    pub uri: String,
    /// Function that matched, if any.
    pub function: Option<String>,
    /// What the handler was sent (path and query), if forwarded.
    pub forwarded_uri: Option<String>,
    pub invocation_id: Option<String>,
    pub status: u16,
    pub elapsed_ms: u128,
}

/// A matched route: function name and route parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteMatch {
    pub function: String,
    pub auth_level: AuthLevel,
    pub forwardable: bool,
    pub params: Vec<(String, String)>,
}

/// Matches `segments` against a route template (`records/batch`, `wal/{id}`,
/// `{id:int}`, `{id?}`, `{*rest}`). Literal segments match ignoring case.
fn match_template(template: &str, segments: &[&str]) -> Option<Vec<(String, String)>> {
    let parts: Vec<&str> = template.split('/').filter(|s| !s.is_empty()).collect();
    let mut params = Vec::new();
    let mut i = 0;
    for (pi, part) in parts.iter().enumerate() {
        if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            if let Some(name) = inner.strip_prefix('*') {
                params.push((name.to_string(), segments[i.min(segments.len())..].join("/")));
                return Some(params);
            }
            let optional = inner.ends_with('?');
            let inner = inner.trim_end_matches('?');
            let (name, constraint) = inner.split_once(':').unwrap_or((inner, ""));
            match segments.get(i) {
                Some(seg) => {
                    let ok = match constraint {
                        "" => true,
                        "int" | "long" => seg.parse::<i64>().is_ok(),
                        "alpha" => seg.chars().all(|c| c.is_ascii_alphabetic()),
                        "guid" => uuid::Uuid::parse_str(seg).is_ok(),
                        _ => true,
                    };
                    if !ok {
                        return None;
                    }
                    params.push((name.to_string(), seg.to_string()));
                    i += 1;
                }
                None if optional && pi == parts.len() - 1 => return Some(params),
                None => return None,
            }
        } else {
            match segments.get(i) {
                Some(seg) if seg.eq_ignore_ascii_case(part) => i += 1,
                _ => return None,
            }
        }
    }
    (i == segments.len()).then_some(params)
}

/// Finds the HTTP function serving `method path` (path without query).
pub fn route(app: &App, method: &str, path: &str) -> Option<RouteMatch> {
    let prefix = &app.host.route_prefix;
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest: &[&str] = if prefix.is_empty() {
        &segments
    } else {
        let prefix_segments: Vec<&str> = prefix.split('/').filter(|s| !s.is_empty()).collect();
        if segments.len() < prefix_segments.len()
            || !segments.iter().zip(&prefix_segments).all(|(a, b)| a.eq_ignore_ascii_case(b))
        {
            return None;
        }
        &segments[prefix_segments.len()..]
    };
    let method = method.to_ascii_lowercase();
    // Literal templates before parameterised ones, as ASP.NET routing prefers them.
    let mut candidates: Vec<_> = app.http_functions().collect();
    candidates.sort_by_key(|f| match &f.trigger {
        Trigger::Http { route, .. } => route.matches('{').count(),
        _ => 0,
    });
    for f in candidates {
        let Trigger::Http { route, methods, auth_level, in_and_out_only, .. } = &f.trigger else { continue };
        if methods.as_ref().is_some_and(|m| !m.contains(&method)) {
            continue;
        }
        if let Some(params) = match_template(route, rest) {
            return Some(RouteMatch {
                function: f.name.clone(),
                auth_level: *auth_level,
                forwardable: app.host.forwarding && *in_and_out_only,
                params,
            });
        }
    }
    None
}

/// `Uri.EscapeDataString`: everything but unreserved characters percent-encoded.
fn escape_data_string(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The query as the host rebuilds it from the parsed query collection.
pub fn rebuild_query(raw: Option<&str>) -> String {
    let mut grouped: Vec<(String, Vec<String>)> = Vec::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        match grouped.iter_mut().find(|(gk, _)| gk.eq_ignore_ascii_case(&k)) {
            Some((_, vs)) => vs.push(v.into_owned()),
            None => grouped.push((k.into_owned(), vec![v.into_owned()])),
        }
    }
    grouped
        .iter()
        .map(|(k, vs)| format!("{}={}", escape_data_string(k), escape_data_string(&vs.join(","))))
        .collect::<Vec<_>>()
        .join("&")
}

/// State of the front end.
pub struct Front {
    pub app: Arc<App>,
    pub handler_port: u16,
    pub function_key: Option<String>,
    pub client: reqwest::Client,
    pub records: Arc<Mutex<Vec<HttpRecord>>>,
}

fn key_matches(headers: &HeaderMap, query: Option<&str>, key: &str) -> bool {
    let header = headers.get("x-functions-key").and_then(|v| v.to_str().ok());
    let code =
        form_urlencoded::parse(query.unwrap_or("").as_bytes()).find(|(k, _)| k == "code").map(|(_, v)| v.into_owned());
    header == Some(key) || code.as_deref() == Some(key)
}

/// Hop-by-hop headers that are connection-specific, never relayed.
const HOP_BY_HOP: [&str; 6] = ["connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection", "te"];

async fn serve(State(front): State<Arc<Front>>, req: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let method = parts.method.clone();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().map(String::from);
    let uri = parts.uri.to_string();
    let mut record = HttpRecord {
        method: method.to_string(),
        uri,
        function: None,
        forwarded_uri: None,
        invocation_id: None,
        status: 0,
        elapsed_ms: 0,
    };
    let finish = |mut record: HttpRecord, response: Response| {
        record.status = response.status().as_u16();
        record.elapsed_ms = started.elapsed().as_millis();
        front.records.lock().unwrap().push(record);
        response
    };
    let Some(m) = route(&front.app, method.as_str(), &path) else {
        return finish(record, StatusCode::NOT_FOUND.into_response());
    };
    record.function = Some(m.function.clone());
    if let Some(key) = &front.function_key {
        if m.auth_level != AuthLevel::Anonymous && !key_matches(&parts.headers, query.as_deref(), key) {
            return finish(record, StatusCode::UNAUTHORIZED.into_response());
        }
    }
    if !m.forwardable {
        // Harness::start refuses such apps; kept as a guard.
        let msg = format!(
            "harness: function {} would be invoked in payload mode, which this harness does not implement",
            m.function
        );
        return finish(record, (StatusCode::NOT_IMPLEMENTED, msg).into_response());
    }
    let content_length: usize = parts
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let bytes: Bytes = match axum::body::to_bytes(body, 64 * 1024 * 1024).await {
        Ok(b) => b,
        Err(e) => {
            return finish(record, (StatusCode::BAD_REQUEST, format!("harness: reading the body: {e}")).into_response())
        }
    };
    let rebuilt = rebuild_query(query.as_deref());
    let target = if rebuilt.is_empty() { path.clone() } else { format!("{path}?{rebuilt}") };
    let invocation_id = uuid::Uuid::new_v4().to_string();
    record.forwarded_uri = Some(target.clone());
    record.invocation_id = Some(invocation_id.clone());

    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || n == "content-length" {
            continue; // reqwest sets Content-Length for the copied body
        }
        headers.append(name.clone(), value.clone());
    }
    let ua = match parts.headers.get("user-agent").and_then(|v| v.to_str().ok()) {
        Some(ua) => format!("{ua} Azure-Functions-Host/{HOST_VERSION}"),
        None => format!("Azure-Functions-Host/{HOST_VERSION}"),
    };
    headers.insert("user-agent", HeaderValue::from_str(&ua).unwrap());
    headers.insert(HeaderName::from_static("x-azure-functions-hostversion"), HeaderValue::from_static(HOST_VERSION));
    headers.insert(
        HeaderName::from_static("x-azure-functions-invocationid"),
        HeaderValue::from_str(&invocation_id).unwrap(),
    );

    let url = format!("http://127.0.0.1:{}{target}", front.handler_port);
    let mut request = front.client.request(method, url).headers(headers);
    if content_length > 0 {
        request = request.body(bytes);
    }
    let response = match request.send().await {
        Ok(r) => r,
        // The host answers 500 when it cannot reach the worker.
        Err(e) => {
            return finish(
                record,
                (StatusCode::INTERNAL_SERVER_ERROR, format!("harness: forwarding failed: {e}")).into_response(),
            )
        }
    };
    let status = response.status();
    let mut out_headers = HeaderMap::new();
    for (name, value) in response.headers() {
        if HOP_BY_HOP.contains(&name.as_str()) || name == "content-length" {
            continue;
        }
        out_headers.append(name.clone(), value.clone());
    }
    let body = match response.bytes().await {
        Ok(b) => b,
        Err(e) => {
            return finish(
                record,
                (StatusCode::INTERNAL_SERVER_ERROR, format!("harness: reading the answer: {e}")).into_response(),
            )
        }
    };
    let mut relayed = Response::new(Body::from(body));
    *relayed.status_mut() = status;
    *relayed.headers_mut() = out_headers;
    finish(record, relayed)
}

/// Starts the front end on a free port; returns the port and the server task.
pub async fn start(front: Arc<Front>) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new().fallback(serve).with_state(front);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (port, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        assert_eq!(match_template("records", &["records"]), Some(vec![]));
        assert_eq!(match_template("records", &["Records"]), Some(vec![]));
        assert_eq!(match_template("records", &["records", "batch"]), None);
        assert_eq!(match_template("wal/{id}", &["wal", "x"]), Some(vec![("id".into(), "x".into())]));
        assert_eq!(match_template("wal/{id}", &["wal"]), None);
        assert_eq!(match_template("wal/{id?}", &["wal"]), Some(vec![]));
        assert_eq!(match_template("n/{id:int}", &["n", "x"]), None);
        assert_eq!(match_template("f/{*rest}", &["f", "a", "b"]), Some(vec![("rest".into(), "a/b".into())]));
    }

    #[test]
    fn query_rebuild() {
        assert_eq!(rebuild_query(Some("icao=KJFK&code=k")), "icao=KJFK&code=k");
        assert_eq!(rebuild_query(Some("a=1&a=2&b=x+y")), "a=1%2C2&b=x%20y");
        assert_eq!(rebuild_query(None), "");
    }
}
