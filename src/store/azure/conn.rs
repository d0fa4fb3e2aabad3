//! Storage connection strings, parsed by us.
//!
//! `azure_storage::ConnectionString` is case-sensitive, rejects unknown keys, never maps
//! `UseDevelopmentStorage=true` to the emulator (its `storage_credentials()` fails) and no
//! client builder reads `TableEndpoint`/`QueueEndpoint`. This parser accepts:
//!
//! - `UseDevelopmentStorage=true` (optionally `DevelopmentStorageProxyUri=`): Azurite's
//!   well-known account `devstoreaccount1` at `http://127.0.0.1:10002/devstoreaccount1`
//!   (tables) and `:10001` (queues);
//! - `AccountName=..;AccountKey=..` with optional `DefaultEndpointsProtocol` and
//!   `EndpointSuffix` (endpoints `{proto}://{account}.{table|queue}.{suffix}`);
//! - explicit `TableEndpoint=`/`QueueEndpoint=`, which override the derived endpoints (this
//!   is how tests point at Azurite on random ports);
//! - `SharedAccessSignature=` instead of the account key.
//!
//! Keys are case-insensitive, values are trimmed, unknown keys are ignored. Errors name the
//! offending key and never repeat a value.

use std::collections::BTreeMap;
use std::fmt;

use azure_core::Url;
use base64::Engine as _;

use crate::store::error::{StoreError, StoreResult};

/// Account name of the Azure Storage emulators (Azurite).
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
/// Well-known, public account key of the Azure Storage emulators (not a secret).
pub const DEV_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
const DEV_TABLE_PORT: u16 = 10002;
const DEV_QUEUE_PORT: u16 = 10001;

/// How requests to the storage account are authorized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialKind {
    /// Shared Key: the account name and key sign every request.
    SharedKey,
    /// A shared access signature appended to every request.
    SharedAccessSignature,
    /// Entra ID tokens of the app's managed identity (`AzureWebJobsStorage__*` settings).
    ManagedIdentity,
}

/// The secret part of a connection string. Never printed.
#[derive(Clone)]
pub(crate) enum Credential {
    SharedKey {
        account: String,
        key: String,
    },
    Sas(String),
    /// Tokens of a managed identity (no secret here: the token endpoint's header is read
    /// from the environment by [`super::identity::ManagedIdentityCredential`]).
    ManagedIdentity {
        client_id: Option<String>,
    },
}

impl Credential {
    pub(crate) fn kind(&self) -> CredentialKind {
        match self {
            Credential::SharedKey { .. } => CredentialKind::SharedKey,
            Credential::Sas(_) => CredentialKind::SharedAccessSignature,
            Credential::ManagedIdentity { .. } => CredentialKind::ManagedIdentity,
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::SharedKey { account, .. } => {
                f.debug_struct("SharedKey").field("account", account).field("key", &"<redacted>").finish()
            }
            Credential::Sas(_) => f.write_str("SharedAccessSignature(<redacted>)"),
            Credential::ManagedIdentity { client_id } => {
                f.debug_struct("ManagedIdentity").field("client_id", client_id).finish()
            }
        }
    }
}

/// A parsed connection string: where the services are and how to sign requests.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionInfo {
    /// Account name, when known (always with Shared Key).
    pub account: Option<String>,
    /// Table service endpoint, without a trailing slash, query or fragment.
    pub table_endpoint: Url,
    /// Queue service endpoint, without a trailing slash, query or fragment.
    pub queue_endpoint: Url,
    pub credential: Credential,
    /// True for `UseDevelopmentStorage=true`.
    pub development: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Setting {
    UseDevelopmentStorage,
    DevelopmentStorageProxyUri,
    DefaultEndpointsProtocol,
    AccountName,
    AccountKey,
    EndpointSuffix,
    TableEndpoint,
    QueueEndpoint,
    SharedAccessSignature,
}

impl Setting {
    const ALL: [Setting; 9] = [
        Setting::UseDevelopmentStorage,
        Setting::DevelopmentStorageProxyUri,
        Setting::DefaultEndpointsProtocol,
        Setting::AccountName,
        Setting::AccountKey,
        Setting::EndpointSuffix,
        Setting::TableEndpoint,
        Setting::QueueEndpoint,
        Setting::SharedAccessSignature,
    ];

    fn name(self) -> &'static str {
        match self {
            Setting::UseDevelopmentStorage => "UseDevelopmentStorage",
            Setting::DevelopmentStorageProxyUri => "DevelopmentStorageProxyUri",
            Setting::DefaultEndpointsProtocol => "DefaultEndpointsProtocol",
            Setting::AccountName => "AccountName",
            Setting::AccountKey => "AccountKey",
            Setting::EndpointSuffix => "EndpointSuffix",
            Setting::TableEndpoint => "TableEndpoint",
            Setting::QueueEndpoint => "QueueEndpoint",
            Setting::SharedAccessSignature => "SharedAccessSignature",
        }
    }

    fn parse(s: &str) -> Option<Setting> {
        Setting::ALL.into_iter().find(|k| k.name().eq_ignore_ascii_case(s))
    }
}

fn invalid(msg: impl fmt::Display) -> StoreError {
    StoreError::InvalidInput(format!("connection string: {msg}"))
}

/// Parses a storage connection string (see the module docs for the accepted forms).
pub(crate) fn parse(s: &str) -> StoreResult<ConnectionInfo> {
    let mut fields: BTreeMap<Setting, String> = BTreeMap::new();
    for (i, segment) in s.split(';').enumerate() {
        let segment = segment.trim();
        if segment.is_empty() {
            continue;
        }
        let Some((name, value)) = segment.split_once('=') else {
            return Err(invalid(format_args!("segment {} is not of the form Key=Value", i + 1)));
        };
        let (name, value) = (name.trim(), value.trim());
        let Some(key) = Setting::parse(name) else {
            // Ignored. The name is logged only when it looks like a key name (letters only, so
            // never a stray base64 secret), the value never.
            let shown = if !name.is_empty() && name.len() <= 32 && name.chars().all(|c| c.is_ascii_alphabetic()) {
                name
            } else {
                "<not a key name>"
            };
            tracing::debug!(key = shown, "connection string: ignoring unknown key");
            continue;
        };
        if value.is_empty() {
            return Err(invalid(format_args!("{} is empty", key.name())));
        }
        if fields.insert(key, value.to_string()).is_some() {
            return Err(invalid(format_args!("{} is given more than once", key.name())));
        }
    }
    if fields.is_empty() {
        return Err(invalid(
            "no settings found (expected e.g. AccountName=..;AccountKey=.. or UseDevelopmentStorage=true)",
        ));
    }

    let development = match fields.get(&Setting::UseDevelopmentStorage) {
        None => false,
        Some(v) if v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("false") => false,
        Some(_) => return Err(invalid("UseDevelopmentStorage must be true or false")),
    };
    if development {
        return development_storage(&fields);
    }
    if fields.contains_key(&Setting::DevelopmentStorageProxyUri) {
        return Err(invalid("DevelopmentStorageProxyUri requires UseDevelopmentStorage=true"));
    }

    let protocol = match fields.get(&Setting::DefaultEndpointsProtocol) {
        None => "https",
        Some(p) if p.eq_ignore_ascii_case("https") => "https",
        Some(p) if p.eq_ignore_ascii_case("http") => "http",
        Some(_) => return Err(invalid("DefaultEndpointsProtocol must be http or https")),
    };
    let suffix = fields.get(&Setting::EndpointSuffix).map(String::as_str).unwrap_or("core.windows.net");
    if !suffix.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-') || suffix.starts_with('.') {
        return Err(invalid("EndpointSuffix must be a DNS suffix such as core.windows.net"));
    }
    let account = fields.get(&Setting::AccountName).cloned();
    if let Some(a) = &account {
        if !a.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(invalid("AccountName must contain only letters and digits"));
        }
    }

    let credential = match (fields.get(&Setting::AccountKey), fields.get(&Setting::SharedAccessSignature)) {
        (Some(_), Some(_)) => {
            return Err(invalid("both AccountKey and SharedAccessSignature are given; keep exactly one of them"))
        }
        (Some(key), None) => {
            let Some(account) = account.clone() else {
                return Err(invalid("AccountKey requires AccountName"));
            };
            check_account_key(key)?;
            Credential::SharedKey { account, key: key.clone() }
        }
        (None, Some(sas)) => {
            let sas = sas.trim_start_matches('?');
            if !sas.split('&').any(|pair| pair.starts_with("sig=")) {
                return Err(invalid("SharedAccessSignature has no sig= parameter"));
            }
            Credential::Sas(sas.to_string())
        }
        (None, None) => return Err(invalid(
            "no credentials: give AccountName and AccountKey, or SharedAccessSignature, or UseDevelopmentStorage=true",
        )),
    };

    let endpoint = |key: Setting, service: &str| -> StoreResult<Url> {
        match (fields.get(&key), &account) {
            (Some(url), _) => parse_endpoint(url, key),
            (None, Some(account)) => parse_endpoint(&format!("{protocol}://{account}.{service}.{suffix}"), key),
            (None, None) => Err(invalid(format_args!("{} is missing (or give AccountName to derive it)", key.name()))),
        }
    };
    Ok(ConnectionInfo {
        table_endpoint: endpoint(Setting::TableEndpoint, "table")?,
        queue_endpoint: endpoint(Setting::QueueEndpoint, "queue")?,
        account,
        credential,
        development: false,
    })
}

fn development_storage(fields: &BTreeMap<Setting, String>) -> StoreResult<ConnectionInfo> {
    for key in fields.keys() {
        if !matches!(key, Setting::UseDevelopmentStorage | Setting::DevelopmentStorageProxyUri) {
            return Err(invalid(format_args!(
                "UseDevelopmentStorage=true cannot be combined with {}; for an emulator on other ports give \
                 AccountName, AccountKey, TableEndpoint and QueueEndpoint instead",
                key.name()
            )));
        }
    }
    let (scheme, host) = match fields.get(&Setting::DevelopmentStorageProxyUri) {
        None => ("http".to_string(), "127.0.0.1".to_string()),
        Some(proxy) => {
            let url = Url::parse(proxy).map_err(|_| invalid("DevelopmentStorageProxyUri is not an absolute URL"))?;
            let host = url.host_str().ok_or_else(|| invalid("DevelopmentStorageProxyUri has no host"))?;
            (url.scheme().to_string(), host.to_string())
        }
    };
    let at = |port: u16, key: Setting| parse_endpoint(&format!("{scheme}://{host}:{port}/{DEV_ACCOUNT}"), key);
    Ok(ConnectionInfo {
        account: Some(DEV_ACCOUNT.to_string()),
        table_endpoint: at(DEV_TABLE_PORT, Setting::TableEndpoint)?,
        queue_endpoint: at(DEV_QUEUE_PORT, Setting::QueueEndpoint)?,
        credential: Credential::SharedKey { account: DEV_ACCOUNT.to_string(), key: DEV_ACCOUNT_KEY.to_string() },
        development: true,
    })
}

/// The account key must be base64 (it is decoded to sign requests); checked here so that a
/// bad key fails at start-up with a clear message instead of on the first request.
fn check_account_key(key: &str) -> StoreResult<()> {
    match base64::engine::general_purpose::STANDARD.decode(key) {
        Ok(bytes) if !bytes.is_empty() => Ok(()),
        _ => Err(invalid("AccountKey is not valid base64")),
    }
}

/// An absolute http(s) URL with a host, no credentials, query or fragment; trailing slashes
/// removed (the clients append path segments).
fn parse_endpoint(value: &str, key: Setting) -> StoreResult<Url> {
    let mut url = Url::parse(value).map_err(|_| invalid(format_args!("{} is not an absolute URL", key.name())))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(invalid(format_args!("{} must be an http or https URL with a host", key.name())));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(format_args!(
            "{} must not contain a query, fragment or user info (give a SAS as SharedAccessSignature=)",
            key.name()
        )));
    }
    let path = url.path().trim_end_matches('/').to_string();
    url.set_path(&path);
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "c2VjcmV0LWtleS1mb3ItdGVzdHM=";

    #[test]
    fn account_key_derives_endpoints() {
        let c = parse(&format!(
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};EndpointSuffix=core.windows.net"
        ))
        .unwrap();
        assert_eq!(c.table_endpoint.as_str(), "https://acct.table.core.windows.net/");
        assert_eq!(c.queue_endpoint.as_str(), "https://acct.queue.core.windows.net/");
        assert_eq!(c.credential.kind(), CredentialKind::SharedKey);
    }

    #[test]
    fn keys_are_case_insensitive_and_values_keep_their_equals_signs() {
        let c = parse(&format!("accountname=acct;ACCOUNTKEY={KEY};tableendpoint=http://h:1/acct/;Foo=bar")).unwrap();
        assert_eq!(c.table_endpoint.as_str(), "http://h:1/acct");
        match c.credential {
            Credential::SharedKey { key, .. } => assert_eq!(key, KEY),
            other => panic!("expected a key, got {other:?}"),
        }
    }

    #[test]
    fn errors_name_the_key_but_not_the_value() {
        let secret = "bm90LXRoZS1yZWFsLWtleQ==";
        for (s, want) in [
            (format!("AccountName=a;AccountKey={secret};AccountKey={secret}"), "AccountKey is given more than once"),
            (format!("AccountKey={secret}"), "AccountKey requires AccountName"),
            (format!("AccountName=a;AccountKey={secret};SharedAccessSignature=sv=1&sig={secret}"), "both AccountKey"),
            (format!("AccountName=a;AccountKey={secret};TableEndpoint=ftp://x"), "TableEndpoint must be"),
            (format!("AccountName=a;AccountKey={secret};DefaultEndpointsProtocol=gopher"), "DefaultEndpointsProtocol"),
            (format!("UseDevelopmentStorage=true;AccountKey={secret}"), "cannot be combined with AccountKey"),
            (format!("AccountName=a;{}", &secret[..8]), "segment 2"),
        ] {
            let err = parse(&s).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
            assert!(!err.contains(&secret[..8]), "{err:?} leaks the secret");
        }
    }
}
