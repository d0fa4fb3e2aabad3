//! The host's HTTP front end for HTTP-triggered functions (contract §5, §7; docs/FUNCTIONS.md §2).
//!
//! Routes are `/{routePrefix}/{route}` with the function.json `methods` (all when omitted);
//! a request no function matches gets the host's own 404, before the handler sees anything.
//! A function that has exactly one `httpTrigger` input and one `http` output gets the request
//! in one of two modes (H `DefaultHttpWorkerService.InvokeAsync` checks proxying first, so a
//! host that knows both flags proxies when both are set; [`HttpMode`]):
//!
//! - **proxying** (`enableProxyingHttpRequest`, `ProxyInvocationRequest` → YARP in
//!   `DefaultHttpProxyService`): same method, path and raw query unchanged; the client's
//!   headers minus hop-by-hop ones and `Host`, plus `X-Forwarded-For/-Proto/-Host`,
//!   `X-Azure-Functions-HostVersion` and `X-Azure-Functions-InvocationId` (set, overriding the
//!   client's) and `x-ms-invocation-id` (added); the request body streamed whatever its
//!   framing (chunked without Content-Length included); the answer's status and headers
//!   relayed as soon as they arrive and its body streamed, never buffered; 240 s activity
//!   timeout (modelled as a 240 s read timeout); no redirect following.
//! - **forwarding** (`enableForwardingHttpRequest`, `ProcessHttpInAndOutInvocationRequest`):
//!   the request is rebuilt: same method and path, query rebuilt from the parsed query (every
//!   key, `code` included; repeated keys comma-joined), the client's headers plus
//!   `X-Azure-Functions-HostVersion`, `X-Azure-Functions-InvocationId` and
//!   `Azure-Functions-Host/<v>` appended to User-Agent, the body only when the request has a
//!   Content-Length > 0 (a chunked body is dropped). The whole answer is read (buffered)
//!   before it is relayed.
//!
//! In both, the handler's answer is relayed as-is (no redirect following; a 500 is not an
//! invocation failure). Deviation: the proxy's retries of a failed send (`RetryProxyHandler`,
//! up to 10 attempts on `HttpRequestException`) are not modelled; a send that fails is a 500.
//!
//! Authorization ("Azure mode", `HarnessOptions::function_key`): `function` and `admin`
//! functions need the key in `x-functions-key` or `code`, else 401 with no body, in both
//! modes (checked before forwarding). Without a key ("local mode", like Core Tools) nothing is
//! checked.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::SinkExt;
use http_body_util::{BodyExt, StreamBody};

use super::app::{App, AuthLevel, HttpMode, Trigger};
use super::payload::HOST_VERSION;

/// One forwarded (or refused) client request.
#[derive(Debug, Clone)]
pub struct HttpRecord {
    pub method: String,
    /// Client path and query.
    pub uri: String,
    /// Function that matched, if any.
    pub function: Option<String>,
    /// How it was handed to the handler, if it was.
    pub mode: Option<HttpMode>,
    /// What the handler was sent (path and query), if forwarded.
    pub forwarded_uri: Option<String>,
    pub invocation_id: Option<String>,
    pub status: u16,
    /// Until the answer's headers were relayed (in proxying mode the body may still be
    /// streaming then).
    pub elapsed_ms: u128,
    /// Forwarding mode: the client sent a body the host does not copy (no Content-Length).
    pub request_body_dropped: bool,
    /// Bytes of the handler's answer body the front had read when it started answering the
    /// client: all of it in forwarding mode (buffered), 0 in proxying mode (streamed).
    pub answer_bytes_read_before_relaying: Option<u64>,
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
                forwardable: app.host.http_mode().is_some() && *in_and_out_only,
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
    /// Forwarding mode's client: no redirect following.
    pub client: reqwest::Client,
    /// Proxying mode's client ([`proxy_client`]).
    pub proxy_client: reqwest::Client,
    pub records: Arc<Mutex<Vec<HttpRecord>>>,
}

/// The proxy's `HttpMessageInvoker`: no redirects, no cookies, 240 s without activity.
pub fn proxy_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .read_timeout(PROXY_ACTIVITY_TIMEOUT)
        .build()
        .expect("the proxy client")
}

/// `ForwarderRequestConfig.ActivityTimeout` of `DefaultHttpProxyService`.
pub const PROXY_ACTIVITY_TIMEOUT: Duration = Duration::from_secs(240);

fn key_matches(headers: &HeaderMap, query: Option<&str>, key: &str) -> bool {
    let header = headers.get("x-functions-key").and_then(|v| v.to_str().ok());
    let code =
        form_urlencoded::parse(query.unwrap_or("").as_bytes()).find(|(k, _)| k == "code").map(|(_, v)| v.into_owned());
    header == Some(key) || code.as_deref() == Some(key)
}

/// Hop-by-hop headers that are connection-specific, never relayed.
const HOP_BY_HOP: [&str; 6] = ["connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection", "te"];

async fn serve(
    State(front): State<Arc<Front>>,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let method = parts.method.clone();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().map(String::from);
    let mut record = HttpRecord {
        method: method.to_string(),
        uri: parts.uri.to_string(),
        function: None,
        mode: None,
        forwarded_uri: None,
        invocation_id: None,
        status: 0,
        elapsed_ms: 0,
        request_body_dropped: false,
        answer_bytes_read_before_relaying: None,
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
    let mode = match front.app.host.http_mode() {
        Some(mode) if m.forwardable => mode,
        _ => {
            // Harness::start refuses such apps; kept as a guard.
            let msg = format!(
                "harness: function {} would be invoked in payload mode, which this harness does not implement",
                m.function
            );
            return finish(record, (StatusCode::NOT_IMPLEMENTED, msg).into_response());
        }
    };
    record.mode = Some(mode);
    let invocation_id = uuid::Uuid::new_v4().to_string();
    record.invocation_id = Some(invocation_id.clone());
    let response = match mode {
        HttpMode::Forwarding => forward(&front, parts, body, &invocation_id, &mut record).await,
        HttpMode::Proxying => proxy(&front, parts, body, client, &invocation_id, &mut record).await,
    };
    finish(record, response)
}

/// The copy of `headers` both modes start from: without hop-by-hop headers and
/// Content-Length (set again for the body sent).
fn end_to_end_headers(headers: &HeaderMap, skip: &[&str]) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || skip.contains(&n) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

fn header_value(v: &str) -> HeaderValue {
    HeaderValue::from_str(v).expect("a valid header value")
}

/// `ProcessHttpInAndOutInvocationRequest`: the request rebuilt, the answer buffered.
async fn forward(
    front: &Front,
    parts: axum::http::request::Parts,
    body: Body,
    invocation_id: &str,
    record: &mut HttpRecord,
) -> Response {
    let content_length: usize = parts
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let bytes: Bytes = match axum::body::to_bytes(body, 64 * 1024 * 1024).await {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("harness: reading the body: {e}")).into_response(),
    };
    record.request_body_dropped = content_length == 0 && !bytes.is_empty();
    let path = parts.uri.path();
    let rebuilt = rebuild_query(parts.uri.query());
    let target = if rebuilt.is_empty() { path.to_string() } else { format!("{path}?{rebuilt}") };
    record.forwarded_uri = Some(target.clone());

    // reqwest sets Content-Length for the copied body.
    let mut headers = end_to_end_headers(&parts.headers, &["content-length"]);
    let ua = match parts.headers.get("user-agent").and_then(|v| v.to_str().ok()) {
        Some(ua) => format!("{ua} Azure-Functions-Host/{HOST_VERSION}"),
        None => format!("Azure-Functions-Host/{HOST_VERSION}"),
    };
    headers.insert("user-agent", header_value(&ua));
    headers.insert(HeaderName::from_static("x-azure-functions-hostversion"), HeaderValue::from_static(HOST_VERSION));
    headers.insert(HeaderName::from_static("x-azure-functions-invocationid"), header_value(invocation_id));

    let url = format!("http://127.0.0.1:{}{target}", front.handler_port);
    let mut request = front.client.request(parts.method, url).headers(headers);
    if content_length > 0 {
        request = request.body(bytes);
    }
    let response = match request.send().await {
        Ok(r) => r,
        // The host answers 500 when it cannot reach the worker.
        Err(e) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, format!("harness: forwarding failed: {e}")).into_response()
        }
    };
    let status = response.status();
    let out_headers = end_to_end_headers(response.headers(), &["content-length"]);
    let body = match response.bytes().await {
        Ok(b) => b,
        Err(e) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, format!("harness: reading the answer: {e}")).into_response()
        }
    };
    record.answer_bytes_read_before_relaying = Some(body.len() as u64);
    let mut relayed = Response::new(Body::from(body));
    *relayed.status_mut() = status;
    *relayed.headers_mut() = out_headers;
    relayed
}

/// The client's body as a streaming reqwest body: frames are pulled by a task and passed
/// through a bounded channel (axum's body is not `Sync`, which `reqwest::Body::wrap` needs).
fn streamed_request_body(body: Body) -> reqwest::Body {
    // The item type (`Result<http_body::Frame<Bytes>, io::Error>`) is inferred from the sends.
    let (mut tx, rx) = futures::channel::mpsc::channel(4);
    tokio::spawn(async move {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let item = frame.map_err(std::io::Error::other);
            let failed = item.is_err();
            if tx.send(item).await.is_err() || failed {
                return;
            }
        }
    });
    reqwest::Body::wrap(StreamBody::new(rx))
}

/// `ProxyInvocationRequest` (YARP): path and query unchanged, both bodies streamed.
async fn proxy(
    front: &Front,
    parts: axum::http::request::Parts,
    body: Body,
    client: SocketAddr,
    invocation_id: &str,
    record: &mut HttpRecord,
) -> Response {
    let target = parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_string(), |pq| pq.to_string());
    record.forwarded_uri = Some(target.clone());
    let has_body = parts.headers.contains_key("transfer-encoding")
        || parts
            .headers
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0);
    // YARP sends the destination's Host, keeps Content-Length (the body is relayed as is).
    let mut headers = end_to_end_headers(&parts.headers, &["host"]);
    if let Some(host) = parts.headers.get("host") {
        headers.insert(HeaderName::from_static("x-forwarded-host"), host.clone());
    }
    headers.insert(HeaderName::from_static("x-forwarded-for"), header_value(&client.ip().to_string()));
    headers.insert(HeaderName::from_static("x-forwarded-proto"), HeaderValue::from_static("http"));
    headers.insert(HeaderName::from_static("x-azure-functions-hostversion"), HeaderValue::from_static(HOST_VERSION));
    headers.insert(HeaderName::from_static("x-azure-functions-invocationid"), header_value(invocation_id));
    headers.append(HeaderName::from_static("x-ms-invocation-id"), header_value(invocation_id));

    let url = format!("http://127.0.0.1:{}{target}", front.handler_port);
    let mut request = front.proxy_client.request(parts.method, url).headers(headers);
    if has_body {
        request = request.body(streamed_request_body(body));
    }
    let response = match request.send().await {
        Ok(r) => r,
        // YARP answers 502 when the destination cannot be reached; the host's proxy service
        // turns a failed forward into an invocation failure (500).
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("harness: proxying failed: {e}")).into_response(),
    };
    record.answer_bytes_read_before_relaying = Some(0);
    let status = response.status();
    let out_headers = end_to_end_headers(response.headers(), &[]);
    // Each chunk is relayed as it arrives; an error ends the client's body with an error.
    let chunks = futures::stream::unfold(Some(response), |state| async move {
        let mut response = state?;
        match response.chunk().await {
            Ok(Some(chunk)) => Some((Ok(chunk), Some(response))),
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    });
    let mut relayed = Response::new(Body::from_stream(chunks));
    *relayed.status_mut() = status;
    *relayed.headers_mut() = out_headers;
    relayed
}

/// Starts the front end on a free port; returns the port and the server task.
pub async fn start(front: Arc<Front>) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new().fallback(serve).with_state(front);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await;
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
