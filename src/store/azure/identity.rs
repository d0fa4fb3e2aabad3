//! Identity-based storage access: the Functions host's `AzureWebJobsStorage__*` settings and
//! tokens from the App Service / Functions managed-identity endpoint.
//!
//! Settings (the names the host reads for its own identity-based connection, [Functions docs:
//! "Connecting to host storage with an identity"]; `__` is the host's section separator):
//!
//! - `AzureWebJobsStorage__accountName`: endpoints `https://{account}.table.core.windows.net`
//!   and `https://{account}.queue.core.windows.net`;
//! - `AzureWebJobsStorage__tableServiceUri`, `AzureWebJobsStorage__queueServiceUri`: explicit
//!   endpoints (override the derived ones; both needed without `__accountName`);
//! - `AzureWebJobsStorage__credential`: `managedidentity` (the only value accepted; unset means
//!   the same);
//! - `AzureWebJobsStorage__clientId`: the client id of a user-assigned identity (unset: the
//!   system-assigned identity).
//!
//! Tokens: `GET {IDENTITY_ENDPOINT}?api-version=2019-08-01&resource=https://storage.azure.com
//! [&client_id=..]` with the `X-IDENTITY-HEADER: {IDENTITY_HEADER}` header, both variables set by
//! App Service and Functions [App Service docs: "REST endpoint reference" of managed
//! identities]. The answer's `expires_on` is Unix seconds (a string or a number).
//!
//! Why not `azure_identity`: version 0.21 (the one built on our `azure_core` 0.21) hard-codes the
//! system-assigned identity in `AppServiceManagedIdentityCredential::create`, and its
//! `ImdsManagedIdentityCredential` (which takes a client id) is crate-private; a user-assigned
//! identity, what the Flex Consumption samples use, cannot be selected through it.
//!
//! Caching: one token at a time, refreshed when less than [`REFRESH_MARGIN`] (or half its
//! lifetime, for short-lived tokens) is left. One caller refreshes; while the current token is
//! still usable (until [`USABLE_MARGIN`], or a quarter of its lifetime, before it expires) the
//! others go on with it instead of waiting, and a failed refresh keeps it and is tried again
//! [`RETRY_AFTER_FAILURE`] later. Only when no usable token is left do callers wait for the
//! refresh. A failed request is retried [`ATTEMPTS`] times in all when transient (connection
//! failures, HTTP 408, 429 and 5xx). Errors name the endpoint variable and the status, never the
//! `IDENTITY_HEADER` value, the token or the response body.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::{AccessToken, Secret, TokenCredential};
use azure_core::Url;
use time::OffsetDateTime;

use crate::store::error::{StoreError, StoreResult};

pub use crate::settings::{IDENTITY_ENDPOINT, IDENTITY_HEADER};

/// Prefix of the host's identity-based storage settings (`crate::settings::WEBJOBS_*`).
pub const PREFIX: &str = "AzureWebJobsStorage__";
/// API version of the App Service managed-identity protocol.
const API_VERSION: &str = "2019-08-01";
/// Refresh a token when less than this is left (or half its lifetime, if shorter).
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// A token is used until this much (or a quarter of its lifetime, if shorter) is left; then
/// callers wait for a new one.
pub const USABLE_MARGIN: Duration = Duration::from_secs(60);
/// After a failed refresh while the token is still usable, the next refresh is tried this
/// much later (at the latest when the token stops being usable).
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);
/// Attempts per token request (the first and the retries) on transient failures.
pub const ATTEMPTS: usize = 4;
/// Timeout of one token request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the services are and which identity to use, from the `AzureWebJobsStorage__*` settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityConnection {
    /// Account name, when `__accountName` is set.
    pub account: Option<String>,
    /// Table service endpoint.
    pub table_endpoint: Url,
    /// Queue service endpoint.
    pub queue_endpoint: Url,
    /// Client id of a user-assigned identity; `None`: the system-assigned identity.
    pub client_id: Option<String>,
}

impl IdentityConnection {
    /// Reads the `AzureWebJobsStorage__*` settings through `lookup` (empty values count as unset).
    ///
    /// `Ok(None)` when neither `__accountName` nor `__tableServiceUri` is set (no identity-based
    /// connection configured). Errors ([`StoreError::InvalidInput`]) name the setting: an
    /// endpoint that is not an absolute http(s) URL, a missing queue endpoint, a `__credential`
    /// other than `managedidentity`, an account name that is not 3-24 lowercase letters/digits.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> StoreResult<Option<IdentityConnection>> {
        let get =
            |suffix: &str| lookup(&format!("{PREFIX}{suffix}")).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let account = get("accountName");
        let table = get("tableServiceUri");
        if account.is_none() && table.is_none() {
            return Ok(None);
        }
        let bad = |suffix: &str, why: &str| StoreError::InvalidInput(format!("{PREFIX}{suffix}: {why}"));
        if let Some(credential) = get("credential") {
            if !credential.eq_ignore_ascii_case("managedidentity") {
                return Err(bad("credential", "only `managedidentity` is supported"));
            }
        }
        if let Some(a) = &account {
            let ok = (3..=24).contains(&a.len()) && a.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
            if !ok {
                return Err(bad("accountName", "must be 3-24 lowercase letters and digits (a storage account name)"));
            }
        }
        let endpoint = |suffix: &str, service: &str| -> StoreResult<Url> {
            let text = match (get(suffix), &account) {
                (Some(uri), _) => uri,
                (None, Some(a)) => format!("https://{a}.{service}.core.windows.net"),
                (None, None) => return Err(bad(suffix, "not set (needed when accountName is not set)")),
            };
            let mut url = Url::parse(&text).map_err(|_| bad(suffix, "not an absolute URL"))?;
            if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none() {
                return Err(bad(suffix, "must be an http(s) URL with a host"));
            }
            url.set_query(None);
            url.set_fragment(None);
            let path = url.path().trim_end_matches('/').to_string();
            url.set_path(&path);
            Ok(url)
        };
        Ok(Some(IdentityConnection {
            table_endpoint: endpoint("tableServiceUri", "table")?,
            queue_endpoint: endpoint("queueServiceUri", "queue")?,
            client_id: get("clientId"),
            account,
        }))
    }
}

/// True when `lookup` gives `AzureWebJobsStorage__accountName` or `__tableServiceUri` (non-empty).
pub fn is_configured(lookup: impl Fn(&str) -> Option<String>) -> bool {
    ["accountName", "tableServiceUri"]
        .iter()
        .any(|s| lookup(&format!("{PREFIX}{s}")).is_some_and(|v| !v.trim().is_empty()))
}

/// A failure to get a token; its message is safe to show (no secret, no response body).
#[derive(Debug)]
pub(crate) struct IdentityError(pub String);

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IdentityError {}

fn identity_error(msg: String) -> azure_core::Error {
    azure_core::Error::new(azure_core::error::ErrorKind::Credential, IdentityError(msg))
}

/// Tokens from the App Service / Functions managed-identity endpoint, cached (see the module docs).
pub struct ManagedIdentityCredential {
    endpoint: Url,
    header: Secret,
    client_id: Option<String>,
    http: reqwest::Client,
    /// The current token (never held across a request).
    cache: std::sync::Mutex<Option<Cached>>,
    /// Held by the one caller that refreshes.
    refreshing: tokio::sync::Mutex<()>,
    backoff: Duration,
}

#[derive(Clone)]
struct Cached {
    resource: String,
    token: AccessToken,
    refresh_at: OffsetDateTime,
    usable_until: OffsetDateTime,
}

impl fmt::Debug for ManagedIdentityCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedIdentityCredential")
            .field("endpoint", &self.endpoint.as_str())
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl ManagedIdentityCredential {
    /// Reads `IDENTITY_ENDPOINT` and `IDENTITY_HEADER` through `lookup`. No I/O happens here.
    ///
    /// Errors ([`StoreError::InvalidInput`]) name the missing or invalid variable.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        client_id: Option<String>,
    ) -> StoreResult<ManagedIdentityCredential> {
        let missing = |var: &str| {
            StoreError::InvalidInput(format!(
                "{var} is not set: the managed-identity endpoint is only available on App Service and \
                 Azure Functions (with an identity assigned); elsewhere use a connection string"
            ))
        };
        let endpoint =
            lookup(IDENTITY_ENDPOINT).filter(|v| !v.trim().is_empty()).ok_or_else(|| missing(IDENTITY_ENDPOINT))?;
        let header = lookup(IDENTITY_HEADER).filter(|v| !v.is_empty()).ok_or_else(|| missing(IDENTITY_HEADER))?;
        let endpoint = Url::parse(endpoint.trim())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| StoreError::InvalidInput(format!("{IDENTITY_ENDPOINT}: not an http(s) URL")))?;
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|_| StoreError::Other("managed identity: could not build the HTTP client".into()))?;
        Ok(ManagedIdentityCredential {
            endpoint,
            header: Secret::new(header),
            client_id,
            http,
            cache: std::sync::Mutex::new(None),
            refreshing: tokio::sync::Mutex::new(()),
            backoff: Duration::from_millis(200),
        })
    }

    /// Sets the first retry delay (doubles per retry; default 200 ms).
    #[must_use]
    pub fn with_backoff(mut self, first: Duration) -> ManagedIdentityCredential {
        self.backoff = first;
        self
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Option<Cached>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached token for `resource`: `(fresh, usable)`: fresh when it needs no refresh yet
    /// (then `usable` is `None`), else the cached entry while it is still usable.
    fn cached(&self, resource: &str) -> (Option<AccessToken>, Option<Cached>) {
        let now = crate::env::now_utc();
        match self.lock_cache().as_ref().filter(|c| c.resource == resource) {
            Some(c) if now < c.refresh_at => (Some(c.token.clone()), None),
            Some(c) if now < c.usable_until => (None, Some(c.clone())),
            _ => (None, None),
        }
    }

    /// One token request with retries of transient failures.
    async fn fetch(&self, resource: &str) -> azure_core::Result<AccessToken> {
        let mut url = self.endpoint.clone();
        url.query_pairs_mut().append_pair("api-version", API_VERSION).append_pair("resource", resource);
        if let Some(id) = &self.client_id {
            url.query_pairs_mut().append_pair("client_id", id);
        }
        // Doubling from the first delay: 200 ms, 400 ms, 800 ms by default (with jitter).
        let mut delays = {
            use backon::BackoffBuilder;
            crate::env::backoff(self.backoff, self.backoff * 4, ATTEMPTS - 1).build()
        };
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            let sent = self.http.get(url.clone()).header("X-IDENTITY-HEADER", self.header.secret()).send().await;
            let transient = match sent {
                Ok(rsp) if rsp.status().is_success() => {
                    let body = rsp.bytes().await.map_err(|_| {
                        identity_error(format!("managed identity ({IDENTITY_ENDPOINT}): the answer was cut off"))
                    })?;
                    return parse_token(&body);
                }
                Ok(rsp) => {
                    let status = rsp.status().as_u16();
                    last = format!("HTTP {status}");
                    if status == 400 {
                        last.push_str(" (is this identity assigned to the app? check AzureWebJobsStorage__clientId)");
                    }
                    matches!(status, 408 | 429 | 500..=599)
                }
                Err(e) => {
                    last = if e.is_timeout() { "timed out".into() } else { "connection failed".into() };
                    true
                }
            };
            let delay = match delays.next() {
                Some(delay) if transient && attempt < ATTEMPTS => delay,
                _ => break,
            };
            tracing::warn!(attempt, error = %last, "managed identity token request failed; retrying");
            crate::env::sleep(delay).await;
        }
        Err(identity_error(format!("managed identity ({IDENTITY_ENDPOINT}) gave no token for {resource}: {last}")))
    }
}

/// Parses the endpoint's JSON answer: `access_token` and `expires_on` (Unix seconds, string or number).
fn parse_token(body: &[u8]) -> azure_core::Result<AccessToken> {
    #[derive(serde::Deserialize)]
    struct Answer {
        access_token: String,
        expires_on: serde_json::Value,
    }
    let bad = || {
        identity_error(format!(
            "managed identity ({IDENTITY_ENDPOINT}): unexpected answer (no access_token/expires_on)"
        ))
    };
    let answer: Answer = serde_json::from_slice(body).map_err(|_| bad())?;
    let seconds = match &answer.expires_on {
        serde_json::Value::String(s) => s.trim().parse::<i64>().ok(),
        serde_json::Value::Number(n) => n.as_i64(),
        _ => None,
    }
    .ok_or_else(bad)?;
    let expires_on = OffsetDateTime::from_unix_timestamp(seconds).map_err(|_| bad())?;
    Ok(AccessToken::new(answer.access_token, expires_on))
}

/// `expires_on` less `margin`, or less `lifetime / divisor` when that is shorter (the token
/// was fetched `now`).
fn before_expiry(now: OffsetDateTime, expires_on: OffsetDateTime, margin: Duration, divisor: i32) -> OffsetDateTime {
    let lifetime: time::Duration = (expires_on - now).max(time::Duration::ZERO);
    let most = time::Duration::try_from(margin).unwrap_or(time::Duration::ZERO);
    expires_on - (lifetime / divisor).min(most)
}

impl Cached {
    fn new(resource: &str, token: AccessToken, now: OffsetDateTime) -> Cached {
        Cached {
            resource: resource.to_string(),
            refresh_at: before_expiry(now, token.expires_on, REFRESH_MARGIN, 2),
            usable_until: before_expiry(now, token.expires_on, USABLE_MARGIN, 4),
            token,
        }
    }
}

#[async_trait::async_trait]
impl TokenCredential for ManagedIdentityCredential {
    async fn get_token(&self, scopes: &[&str]) -> azure_core::Result<AccessToken> {
        let [scope] = scopes else {
            return Err(identity_error(format!("managed identity: one scope expected, got {}", scopes.len())));
        };
        let resource = scope.strip_suffix("/.default").unwrap_or(scope);
        let (fresh, usable) = self.cached(resource);
        if let Some(token) = fresh {
            return Ok(token);
        }
        // One caller refreshes; the others go on with a usable token, or wait for it.
        let _refreshing = match (self.refreshing.try_lock(), usable) {
            (Ok(guard), _) => guard,
            (Err(_), Some(usable)) => return Ok(usable.token),
            (Err(_), None) => self.refreshing.lock().await,
        };
        let (fresh, usable) = self.cached(resource);
        if let Some(token) = fresh {
            return Ok(token); // refreshed while this caller waited
        }
        match self.fetch(resource).await {
            Ok(token) => {
                tracing::debug!(expires_on = %token.expires_on, "managed identity token fetched");
                *self.lock_cache() = Some(Cached::new(resource, token.clone(), crate::env::now_utc()));
                Ok(token)
            }
            Err(e) => match usable {
                Some(mut usable) => {
                    let retry = crate::env::now_utc() + RETRY_AFTER_FAILURE;
                    usable.refresh_at = retry.min(usable.usable_until);
                    tracing::warn!(
                        usable_until = %usable.usable_until,
                        error = %e,
                        "managed identity token refresh failed; going on with the current token"
                    );
                    let token = usable.token.clone();
                    *self.lock_cache() = Some(usable);
                    Ok(token)
                }
                None => Err(e),
            },
        }
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        *self.lock_cache() = None;
        Ok(())
    }
}

/// The credential as the storage clients take it.
pub(crate) fn storage_credentials(credential: ManagedIdentityCredential) -> azure_storage::StorageCredentials {
    azure_storage::StorageCredentials::token_credential(Arc::new(credential))
}
