//! A fake App Service managed-identity endpoint on loopback (`tests/suite/identity.rs`,
//! `tests/faults/identity_azurite.rs`): it checks the `X-IDENTITY-HEADER` value, the `resource`, the
//! `api-version` and the `client_id` of every request and answers from a script.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use table_catalog::store::ManagedIdentityCredential;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The `IDENTITY_HEADER` secret the fake endpoint expects.
pub const HEADER: &str = "identity-header-SECRET-1234";

/// An unsigned JWT with the claims Azurite checks (`aud`, `iss`, `nbf`, `exp`).
pub fn jwt(now: i64, exp: i64) -> String {
    let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let header = b64(serde_json::json!({"alg": "RS256", "typ": "JWT"}));
    let claims = b64(serde_json::json!({
        "aud": "https://storage.azure.com",
        "iss": "https://sts.windows.net/00000000-0000-0000-0000-00000000000a/",
        "iat": now - 60, "nbf": now - 60, "exp": exp,
        "oid": "00000000-0000-0000-0000-00000000000b",
        "tid": "00000000-0000-0000-0000-00000000000a",
    }));
    format!("{header}.{claims}.c2lnbmF0dXJl")
}

/// One scripted answer of the fake identity endpoint.
#[derive(Clone)]
pub enum Answer {
    /// A token `token` valid for `secs` seconds from now.
    Token { token: &'static str, secs: i64 },
    /// A JWT (unsigned: Azurite's OAuth "basic" mode checks only its claims) for
    /// `https://storage.azure.com`, valid for `secs` seconds from now.
    Jwt { secs: i64 },
    /// An HTTP error status.
    Status(u16),
    /// Like `Token`, answered only once [`FakeIdentity::release`] was called (`expires_on`
    /// counts from then).
    Held { token: &'static str, secs: i64 },
}

/// A fake App Service managed-identity endpoint on 127.0.0.1.
pub struct FakeIdentity {
    pub url: String,
    requests: Arc<AtomicUsize>,
    release: Arc<tokio::sync::watch::Sender<bool>>,
    /// Problems seen in requests (wrong header, resource, client id).
    problems: Arc<Mutex<Vec<String>>>,
}

impl FakeIdentity {
    /// Serves `script` in order; the last answer repeats.
    pub async fn start(script: Vec<Answer>, client_id: Option<&'static str>) -> FakeIdentity {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/msi/token", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let problems = Arc::new(Mutex::new(Vec::new()));
        let release = Arc::new(tokio::sync::watch::Sender::new(false));
        let (count, seen, released) = (requests.clone(), problems.clone(), release.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                let n = count.fetch_add(1, Ordering::SeqCst);
                let answer = script[n.min(script.len() - 1)].clone();
                let seen = seen.clone();
                let mut released = released.subscribe();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).to_string();
                    let line = head.lines().next().unwrap_or_default().to_string();
                    let header_ok = head
                        .lines()
                        .any(|l| l.to_ascii_lowercase().starts_with("x-identity-header:") && l.ends_with(HEADER));
                    let mut problems = Vec::new();
                    if !header_ok {
                        problems.push(format!("no or wrong X-IDENTITY-HEADER: {line}"));
                    }
                    if !line.contains("resource=https%3A%2F%2Fstorage.azure.com ")
                        && !line.contains("resource=https%3A%2F%2Fstorage.azure.com&")
                    {
                        problems.push(format!("wrong resource: {line}"));
                    }
                    if !line.contains("api-version=2019-08-01") {
                        problems.push(format!("wrong api-version: {line}"));
                    }
                    match client_id {
                        Some(id) if !line.contains(&format!("client_id={id}")) => {
                            problems.push(format!("no client_id: {line}"))
                        }
                        None if line.contains("client_id=") => problems.push(format!("unexpected client_id: {line}")),
                        _ => {}
                    }
                    let (status, body) = if !problems.is_empty() {
                        seen.lock().unwrap().extend(problems);
                        (400, String::new())
                    } else {
                        if matches!(answer, Answer::Held { .. }) {
                            let _ = released.wait_for(|r| *r).await;
                        }
                        match answer {
                            Answer::Token { token, secs } | Answer::Held { token, secs } => {
                                let expires = time::OffsetDateTime::now_utc().unix_timestamp() + secs;
                                (
                                    200,
                                    format!(
                                        r#"{{"access_token":"{token}","expires_on":"{expires}","resource":"https://storage.azure.com","token_type":"Bearer","client_id":"x"}}"#
                                    ),
                                )
                            }
                            Answer::Jwt { secs } => {
                                let now = time::OffsetDateTime::now_utc().unix_timestamp();
                                let token = jwt(now, now + secs);
                                (
                                    200,
                                    format!(
                                        r#"{{"access_token":"{token}","expires_on":"{}","resource":"https://storage.azure.com","token_type":"Bearer"}}"#,
                                        now + secs
                                    ),
                                )
                            }
                            Answer::Status(s) => (s, r#"{"error":"boom SECRET-BODY"}"#.to_string()),
                        }
                    };
                    let rsp = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(rsp.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        FakeIdentity { url, requests, release, problems }
    }

    pub fn lookup(&self) -> impl Fn(&str) -> Option<String> + '_ {
        move |name: &str| match name {
            "IDENTITY_ENDPOINT" => Some(self.url.clone()),
            "IDENTITY_HEADER" => Some(HEADER.to_string()),
            _ => None,
        }
    }

    pub fn credential(&self, client_id: Option<&str>) -> ManagedIdentityCredential {
        ManagedIdentityCredential::from_lookup(self.lookup(), client_id.map(str::to_string))
            .unwrap()
            .with_backoff(Duration::from_millis(10))
    }

    /// Lets the [`Answer::Held`] answers go.
    pub fn release(&self) {
        self.release.send_replace(true);
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn assert_no_problems(&self) {
        let problems = self.problems.lock().unwrap();
        assert!(problems.is_empty(), "identity endpoint saw bad requests: {problems:?}");
    }
}
