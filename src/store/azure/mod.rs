//! Azure Storage backend: the only module that touches the `azure_*` crates.
//!
//! It uses the legacy, unmaintained `azure_data_tables` / `azure_storage_queues` /
//! `azure_storage` / `azure_core` 0.21 and corrects their sharp edges here (see
//! `docs/AZURE.md` for the full list and the test covering each):
//!
//! - quotes in keys are doubled in every entity address and `$filter` literal (the crate
//!   builds `table(PartitionKey='…',RowKey='…')` verbatim);
//! - the crates' retry policy (8 retries, every method, no timeout) is off; [`RetryPolicy`]
//!   retries transient failures a bounded number of times with a timeout per attempt, and
//!   non-idempotent writes recognise their own earlier, committed attempt;
//! - entity group transactions are built and parsed here, because the crate reports a failed
//!   batch as `Ok` and loses the failing index; replace and delete always carry `If-Match`
//!   (without it the service treats an update as an upsert);
//! - connection strings are parsed here (`UseDevelopmentStorage=true`, explicit endpoints,
//!   case-insensitive keys), and no error or `Debug` output contains a key, SAS or
//!   connection string;
//! - identity-based access (the host's `AzureWebJobsStorage__*` settings, managed-identity
//!   tokens) is in [`identity`]: the crates take any `TokenCredential`;
//! - errors become [`crate::store::error::StoreError`]s in one place, without the
//!   response bodies the crate's `HttpError` prints.

mod batch;
mod conn;
mod entity;
mod error;
mod http;
pub(crate) mod identity;
mod queue;
mod retry;
mod table;

use std::fmt;

use azure_core::auth::Secret;
use azure_core::{ClientOptions, Pipeline, RetryOptions};
use azure_data_tables::clients::{TableServiceClient, TableServiceClientBuilder};
use azure_storage::{CloudLocation, StorageCredentials};
use azure_storage_queues::{QueueServiceClient, QueueServiceClientBuilder};

use crate::store::error::{StoreError, StoreResult};
pub(crate) use crate::store::queue::check_queue_name;
pub(crate) use crate::store::table::check_table_name;
pub use conn::{CredentialKind, DEV_ACCOUNT, DEV_ACCOUNT_KEY};
pub use retry::RetryPolicy;

/// Environment variables [`AzureStore::from_env`] reads, in order.
pub const CONNECTION_STRING_VARS: [&str; 2] = ["AZURE_STORAGE_CONNECTION_STRING", "AzureWebJobsStorage"];

/// Tables and queues of one Azure Storage account (or Azurite).
///
/// Cheap to clone: clones share the HTTP clients. `Debug` shows the account, the endpoints
/// and the kind of credential, never the credential itself.
#[derive(Clone)]
pub struct AzureStore {
    tables: TableServiceClient,
    queues: QueueServiceClient,
    /// The signed table pipeline, for the `$batch` requests we build ourselves.
    table_pipeline: Pipeline,
    info: conn::ConnectionInfo,
    retry: RetryPolicy,
}

impl AzureStore {
    /// Connects with a storage connection string: `UseDevelopmentStorage=true`,
    /// `AccountName=..;AccountKey=..[;EndpointSuffix=..][;DefaultEndpointsProtocol=..]`,
    /// optionally with explicit `TableEndpoint=`/`QueueEndpoint=`, or
    /// `SharedAccessSignature=` instead of the key. No I/O happens here.
    ///
    /// Errors are [`StoreError::InvalidInput`] naming the offending key, never its value.
    pub fn from_connection_string(connection_string: &str) -> StoreResult<AzureStore> {
        let info = conn::parse(connection_string)?;
        let credentials = match &info.credential {
            conn::Credential::SharedKey { account, key } => {
                StorageCredentials::access_key(account.clone(), Secret::new(key.clone()))
            }
            // The crate's parse error would quote the token; ours does not.
            conn::Credential::Sas(token) => StorageCredentials::sas_token(token).map_err(|_| {
                StoreError::InvalidInput("connection string: SharedAccessSignature is not a valid query string".into())
            })?,
            conn::Credential::ManagedIdentity { .. } => {
                return Err(StoreError::InvalidInput(
                    "connection string: no AccountKey or SharedAccessSignature".into(),
                ))
            }
        };
        Ok(AzureStore::with_credentials(info, credentials))
    }

    /// Connects with the app's managed identity: endpoints and identity from `connection`
    /// (the `AzureWebJobsStorage__*` settings), tokens from `credential`. No I/O happens here;
    /// token failures surface on the first request as [`StoreError::Unavailable`] naming the
    /// identity endpoint variable and the status.
    pub fn from_identity(
        connection: identity::IdentityConnection,
        credential: identity::ManagedIdentityCredential,
    ) -> AzureStore {
        let info = conn::ConnectionInfo {
            account: connection.account,
            table_endpoint: connection.table_endpoint,
            queue_endpoint: connection.queue_endpoint,
            credential: conn::Credential::ManagedIdentity { client_id: connection.client_id },
            development: false,
        };
        AzureStore::with_credentials(info, identity::storage_credentials(credential))
    }

    fn with_credentials(info: conn::ConnectionInfo, credentials: StorageCredentials) -> AzureStore {
        let account = info.account.clone().unwrap_or_default();
        let location =
            |endpoint: &azure_core::Url| CloudLocation::Custom { account: account.clone(), uri: endpoint.to_string() };
        // One pooled HTTP client for the three (see [`http`]).
        let transport = http::pooled_transport();
        let tables = TableServiceClientBuilder::with_location(location(&info.table_endpoint), credentials.clone())
            .retry(RetryOptions::none())
            .transport(transport.clone())
            .build();
        let queues = QueueServiceClientBuilder::with_location(location(&info.queue_endpoint), credentials.clone())
            .retry(RetryOptions::none())
            .transport(transport.clone())
            .build();
        let table_pipeline = azure_storage::clients::new_pipeline_from_options(
            ClientOptions::default().retry(RetryOptions::none()).transport(transport),
            credentials,
        );
        AzureStore { tables, queues, table_pipeline, info, retry: RetryPolicy::default() }
    }

    /// Connects with the managed identity configured by the `AzureWebJobsStorage__*` settings
    /// and `IDENTITY_ENDPOINT`/`IDENTITY_HEADER`, read through `lookup`; `Ok(None)` when no
    /// `AzureWebJobsStorage__accountName`/`__tableServiceUri` is set. Errors name the setting.
    pub fn from_identity_lookup(lookup: impl Fn(&str) -> Option<String>) -> StoreResult<Option<AzureStore>> {
        let Some(connection) = identity::IdentityConnection::from_lookup(&lookup)? else {
            return Ok(None);
        };
        let credential = identity::ManagedIdentityCredential::from_lookup(&lookup, connection.client_id.clone())?;
        Ok(Some(AzureStore::from_identity(connection, credential)))
    }

    /// Connects with the connection string in `AZURE_STORAGE_CONNECTION_STRING`, or else in
    /// `AzureWebJobsStorage` (the Functions host's setting), or else with the managed identity
    /// of the identity-based `AzureWebJobsStorage__*` settings ([`identity`](crate::store::IdentityConnection)). Empty values
    /// count as unset; `InvalidInput` when none is set.
    pub fn from_env() -> StoreResult<AzureStore> {
        AzureStore::from_lookup(|var| std::env::var(var).ok())
    }

    /// [`AzureStore::from_env`] with the environment given as a function (testable without
    /// mutating the process environment).
    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> StoreResult<AzureStore> {
        for var in CONNECTION_STRING_VARS {
            if let Some(value) = lookup(var).filter(|v| !v.trim().is_empty()) {
                return AzureStore::from_connection_string(&value).map_err(|e| match e {
                    StoreError::InvalidInput(msg) => StoreError::InvalidInput(format!("{var}: {msg}")),
                    other => other,
                });
            }
        }
        if let Some(store) = AzureStore::from_identity_lookup(&lookup)? {
            return Ok(store);
        }
        Err(StoreError::InvalidInput(format!(
            "no storage connection: set {} (or {}, or {}accountName for the managed identity)",
            CONNECTION_STRING_VARS[0],
            CONNECTION_STRING_VARS[1],
            identity::PREFIX
        )))
    }

    /// Replaces the retry policy (default: [`RetryPolicy::default`]).
    #[must_use]
    pub fn with_retry_policy(mut self, policy: RetryPolicy) -> AzureStore {
        self.retry = policy;
        self
    }

    /// The retry policy in use.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The storage account name, when the connection string names one.
    pub fn account(&self) -> Option<&str> {
        self.info.account.as_deref()
    }

    /// The table service endpoint, e.g. `https://acct.table.core.windows.net/`.
    pub fn table_endpoint(&self) -> &str {
        self.info.table_endpoint.as_str()
    }

    /// The queue service endpoint, e.g. `https://acct.queue.core.windows.net/`.
    pub fn queue_endpoint(&self) -> &str {
        self.info.queue_endpoint.as_str()
    }

    /// How requests are authorized.
    pub fn credential_kind(&self) -> CredentialKind {
        self.info.credential.kind()
    }

    /// True when the connection string was `UseDevelopmentStorage=true`.
    pub fn is_development_storage(&self) -> bool {
        self.info.development
    }
}

impl fmt::Debug for AzureStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzureStore")
            .field("account", &self.info.account)
            .field("table_endpoint", &self.info.table_endpoint.as_str())
            .field("queue_endpoint", &self.info.queue_endpoint.as_str())
            .field("credential", &self.info.credential.kind())
            .field("development_storage", &self.info.development)
            .field("retry", &self.retry)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_env_prefers_azure_storage_connection_string() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |var: &str| pairs.iter().find(|(k, _)| *k == var).map(|(_, v)| v.to_string())
        };
        let none = AzureStore::from_lookup(env(&[("AZURE_STORAGE_CONNECTION_STRING", " ")])).unwrap_err();
        assert!(none.to_string().contains("AZURE_STORAGE_CONNECTION_STRING"), "{none}");
        let jobs = AzureStore::from_lookup(env(&[("AzureWebJobsStorage", "UseDevelopmentStorage=true")])).unwrap();
        assert!(jobs.is_development_storage());
        let both = AzureStore::from_lookup(env(&[
            ("AzureWebJobsStorage", "UseDevelopmentStorage=true"),
            ("AZURE_STORAGE_CONNECTION_STRING", "AccountName=envacct;AccountKey=a2V5"),
        ]))
        .unwrap();
        assert_eq!(both.account(), Some("envacct"));
        let bad =
            AzureStore::from_lookup(env(&[("AZURE_STORAGE_CONNECTION_STRING", "AccountName=a;AccountKey=zz secret")]))
                .unwrap_err()
                .to_string();
        assert!(bad.contains("AZURE_STORAGE_CONNECTION_STRING: connection string: AccountKey"), "{bad}");
        assert!(!bad.contains("zz secret"), "{bad}");

        // No connection string: the identity-based settings, with the platform's endpoint.
        let identity = AzureStore::from_lookup(env(&[
            ("AzureWebJobsStorage__accountName", "acct1"),
            ("IDENTITY_ENDPOINT", "http://127.0.0.1:9/msi/token"),
            ("IDENTITY_HEADER", "h"),
        ]))
        .unwrap();
        assert_eq!(identity.credential_kind(), CredentialKind::ManagedIdentity);
        assert_eq!(identity.table_endpoint(), "https://acct1.table.core.windows.net/");
        let outside = AzureStore::from_lookup(env(&[("AzureWebJobsStorage__accountName", "acct1")])).unwrap_err();
        assert!(outside.to_string().contains("IDENTITY_ENDPOINT is not set"), "{outside}");
        let nothing = AzureStore::from_lookup(env(&[])).unwrap_err();
        assert!(nothing.to_string().contains("AzureWebJobsStorage__accountName"), "{nothing}");
    }

    #[test]
    fn names_are_checked() {
        assert!(check_table_name("t1a").is_ok());
        for bad in ["1ab", "ab", "a-b", "tä1", &"a".repeat(64)] {
            assert!(check_table_name(bad).is_err(), "{bad}");
        }
        assert!(check_queue_name("a-b-1").is_ok());
        for bad in ["A-b", "-ab", "ab-", "a--b", "ab"] {
            assert!(check_queue_name(bad).is_err(), "{bad}");
        }
    }
}
