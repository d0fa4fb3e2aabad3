//! Identity-based storage access (`src/store/azure/identity.rs`): the `AzureWebJobsStorage__*`
//! settings, and managed-identity tokens from a fake App Service identity endpoint served on
//! loopback by this test. The endpoint checks the `X-IDENTITY-HEADER` value, the `resource` and
//! the `client_id` of every request and answers from a script: tokens with a short `expires_on`
//! (refresh across expiry), HTTP 500s (retries), a dead endpoint (a clear error, no secret).
//! The end-to-end run on Azurite in OAuth mode is `tests/faults/identity_azurite.rs`.

use crate::common;

use std::time::Duration;

use azure_core::auth::TokenCredential;
use table_catalog::store::{AzureStore, CredentialKind, RetryPolicy};
use table_catalog::store::{IdentityConnection, ManagedIdentityCredential};
use table_catalog::store::{StoreError, TableStore};
use table_catalog::testing::store::identity::ATTEMPTS;

use common::identity::{Answer, FakeIdentity, HEADER};

const SCOPE: &str = "https://storage.azure.com/.default";

fn settings(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
}

#[test]
fn host_settings_give_the_endpoints_and_the_identity() {
    let none = IdentityConnection::from_lookup(settings(&[])).unwrap();
    assert_eq!(none, None);
    let c = IdentityConnection::from_lookup(settings(&[
        ("AzureWebJobsStorage__accountName", "acct1"),
        ("AzureWebJobsStorage__credential", "managedidentity"),
        ("AzureWebJobsStorage__clientId", "1111-2222"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(c.table_endpoint.as_str(), "https://acct1.table.core.windows.net/");
    assert_eq!(c.queue_endpoint.as_str(), "https://acct1.queue.core.windows.net/");
    assert_eq!((c.account.as_deref(), c.client_id.as_deref()), (Some("acct1"), Some("1111-2222")));

    let explicit = IdentityConnection::from_lookup(settings(&[
        ("AzureWebJobsStorage__tableServiceUri", "https://127.0.0.1:1234/devstoreaccount1/"),
        ("AzureWebJobsStorage__queueServiceUri", "https://127.0.0.1:1235/devstoreaccount1"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(explicit.table_endpoint.as_str(), "https://127.0.0.1:1234/devstoreaccount1");
    assert_eq!(explicit.queue_endpoint.as_str(), "https://127.0.0.1:1235/devstoreaccount1");
    assert_eq!(explicit.client_id, None);

    for (pairs, named) in [
        (
            &[("AzureWebJobsStorage__accountName", "a"), ("AzureWebJobsStorage__credential", "connectionstring")]
                as &'static [_],
            "AzureWebJobsStorage__credential",
        ),
        (&[("AzureWebJobsStorage__accountName", "Bad_Name")], "AzureWebJobsStorage__accountName"),
        (&[("AzureWebJobsStorage__tableServiceUri", "https://h/t")], "AzureWebJobsStorage__queueServiceUri"),
        (
            &[
                ("AzureWebJobsStorage__tableServiceUri", "not a url"),
                ("AzureWebJobsStorage__queueServiceUri", "https://h"),
            ],
            "AzureWebJobsStorage__tableServiceUri",
        ),
    ] {
        let err = IdentityConnection::from_lookup(settings(pairs)).unwrap_err().to_string();
        assert!(err.contains(named), "{named}: {err}");
    }

    // Outside App Service/Functions: the missing variable is named.
    let err = ManagedIdentityCredential::from_lookup(settings(&[("IDENTITY_HEADER", "x")]), None).unwrap_err();
    assert!(err.to_string().contains("IDENTITY_ENDPOINT is not set"), "{err}");
}

#[tokio::test]
async fn tokens_are_cached_and_refreshed_before_they_expire() {
    // Token 1 lives 2 s: refreshed after half its lifetime (1 s); token 2 lives an hour.
    let fake = FakeIdentity::start(
        vec![Answer::Token { token: "tok-1", secs: 2 }, Answer::Token { token: "tok-2", secs: 3600 }],
        Some("user-assigned-id"),
    )
    .await;
    let cred = fake.credential(Some("user-assigned-id"));
    let t1 = cred.get_token(&[SCOPE]).await.unwrap();
    assert_eq!(t1.token.secret(), "tok-1");
    assert_eq!(cred.get_token(&[SCOPE]).await.unwrap().token.secret(), "tok-1", "cached");
    assert_eq!(fake.requests(), 1);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Before expiry (2 s) but past the refresh point: a new token.
    assert_eq!(cred.get_token(&[SCOPE]).await.unwrap().token.secret(), "tok-2");
    assert_eq!(cred.get_token(&[SCOPE]).await.unwrap().token.secret(), "tok-2");
    assert_eq!(fake.requests(), 2);
    fake.assert_no_problems();
}

/// Issue 27 (operator costs): a refresh held every storage call, though the old token was
/// still valid: one caller fetched under the cache's lock, and a slow identity endpoint (up
/// to `ATTEMPTS` requests of 10 s) stalled the whole process.
#[tokio::test]
async fn a_token_refresh_does_not_hold_the_calls_made_while_the_old_token_is_usable() {
    // tok-1 lives 7-8 s (whole seconds): refreshed after half (≤ 4 s), usable until a quarter
    // is left (≥ 5.25 s).
    let fake = FakeIdentity::start(
        vec![Answer::Token { token: "tok-1", secs: 8 }, Answer::Held { token: "tok-2", secs: 3600 }],
        None,
    )
    .await;
    let cred = std::sync::Arc::new(fake.credential(None));
    assert_eq!(cred.get_token(&[SCOPE]).await.unwrap().token.secret(), "tok-1");
    tokio::time::sleep(Duration::from_millis(4100)).await;
    let refresher = tokio::spawn({
        let cred = cred.clone();
        async move { cred.get_token(&[SCOPE]).await.unwrap().token.secret().to_string() }
    });
    common::wait_for("the refresh to reach the endpoint", || async { (fake.requests() == 2).then_some(()) }).await;
    for _ in 0..5 {
        let token = tokio::time::timeout(Duration::from_secs(5), cred.get_token(&[SCOPE]))
            .await
            .expect("a call waited for the refresh though the old token is usable")
            .unwrap();
        assert_eq!(token.token.secret(), "tok-1");
    }
    assert_eq!(fake.requests(), 2, "one refresh");
    fake.release();
    assert_eq!(refresher.await.unwrap(), "tok-2");
    assert_eq!(cred.get_token(&[SCOPE]).await.unwrap().token.secret(), "tok-2");
    assert_eq!(fake.requests(), 2);
    fake.assert_no_problems();
}

#[tokio::test]
async fn a_failed_refresh_goes_on_with_the_usable_token_and_tries_again_later() {
    let fake = FakeIdentity::start(vec![Answer::Token { token: "tok-1", secs: 8 }, Answer::Status(500)], None).await;
    let cred = fake.credential(None);
    assert_eq!(cred.get_token(&[SCOPE]).await.unwrap().token.secret(), "tok-1");
    tokio::time::sleep(Duration::from_millis(4100)).await;
    assert_eq!(cred.get_token(&[SCOPE]).await.unwrap().token.secret(), "tok-1", "kept after the failure");
    assert_eq!(fake.requests(), 1 + ATTEMPTS);
    assert_eq!(cred.get_token(&[SCOPE]).await.unwrap().token.secret(), "tok-1");
    assert_eq!(fake.requests(), 1 + ATTEMPTS, "not tried again at once");
    fake.assert_no_problems();
}

#[tokio::test]
async fn transient_failures_of_the_identity_endpoint_are_retried() {
    let fake = FakeIdentity::start(
        vec![Answer::Status(500), Answer::Status(503), Answer::Token { token: "tok-ok", secs: 3600 }],
        None,
    )
    .await;
    let cred = fake.credential(None);
    assert_eq!(cred.get_token(&[SCOPE]).await.unwrap().token.secret(), "tok-ok");
    assert_eq!(fake.requests(), 3);
    fake.assert_no_problems();
}

#[tokio::test]
async fn a_failing_identity_endpoint_gives_a_clear_error_without_secrets() {
    let fake = FakeIdentity::start(vec![Answer::Status(500)], None).await;
    let cred = fake.credential(None);
    let err = cred.get_token(&[SCOPE]).await.unwrap_err();
    assert_eq!(fake.requests(), ATTEMPTS, "retried up to ATTEMPTS in all");
    let text = format!("{err} {err:?}");
    assert!(text.contains("IDENTITY_ENDPOINT") && text.contains("HTTP 500"), "{text}");
    assert!(!text.contains(HEADER) && !text.contains("SECRET"), "{text}");

    // Through the store: Unavailable (transient), naming the endpoint variable, no secret.
    let connection = IdentityConnection::from_lookup(settings(&[
        ("AzureWebJobsStorage__tableServiceUri", "http://127.0.0.1:9/devstoreaccount1"),
        ("AzureWebJobsStorage__queueServiceUri", "http://127.0.0.1:9/devstoreaccount1"),
    ]))
    .unwrap()
    .unwrap();
    let store = AzureStore::from_identity(connection, fake.credential(None)).with_retry_policy(RetryPolicy {
        max_attempts: 2,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(10),
        request_timeout: Duration::from_secs(10),
    });
    assert_eq!(store.credential_kind(), CredentialKind::ManagedIdentity);
    assert!(!format!("{store:?}").contains(HEADER));
    let err = store.create_table("idtest").await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("IDENTITY_ENDPOINT") && text.contains("HTTP 500"), "{text}");
    assert!(!text.contains(HEADER) && !text.contains("SECRET"), "{text}");
    assert_eq!(fake.requests(), ATTEMPTS * 3, "the store retried the whole request");

    // A dead endpoint: connection failures, retried, then a clear error.
    let dead = ManagedIdentityCredential::from_lookup(
        settings(&[("IDENTITY_ENDPOINT", "http://127.0.0.1:9/msi/token"), ("IDENTITY_HEADER", HEADER)]),
        None,
    )
    .unwrap()
    .with_backoff(Duration::from_millis(10));
    let err = dead.get_token(&[SCOPE]).await.unwrap_err().to_string();
    assert!(err.contains("IDENTITY_ENDPOINT") && err.contains("connection failed"), "{err}");
    assert!(!err.contains(HEADER), "{err}");
}
