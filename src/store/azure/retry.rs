//! Our retry loop. The crates' own policy (8 retries over up to 60 s on every method,
//! including non-idempotent POSTs, and no timeout at all) is switched off with
//! `RetryOptions::none()`; this one is bounded, jittered, times out every attempt, and
//! reports whether an earlier attempt failed transiently, so callers can recognise the
//! "my first attempt was committed after all" case of non-idempotent writes.

use std::future::Future;
use std::time::Duration;

use rand::Rng as _;

use crate::store::error::{StoreError, StoreResult};

/// Bounded retry with exponential backoff and jitter, and a per-attempt timeout.
///
/// Transient failures ([`StoreError::is_transient`]: HTTP 408/429/5xx, connection errors,
/// timeouts) are retried; everything else is returned at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included (at least 1).
    pub max_attempts: u32,
    /// Backoff before the first retry; doubles for each further retry.
    pub initial_backoff: Duration,
    /// Upper bound of one backoff.
    pub max_backoff: Duration,
    /// Time limit of one attempt (request and response body). Azure's own server-side limit
    /// is 30 s per request.
    pub request_timeout: Duration,
}

impl Default for RetryPolicy {
    /// 4 attempts, 200 ms doubling backoff capped at 5 s, 30 s per attempt.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// What [`RetryPolicy::run`] ended with.
pub(crate) struct Outcome<T> {
    /// The last attempt's result.
    pub result: StoreResult<T>,
    /// True when an earlier attempt failed transiently, so a non-idempotent write may have
    /// been committed by it.
    pub after_transient: bool,
}

impl RetryPolicy {
    /// The backoff before retry number `retry` (1-based): `initial * 2^(retry-1)` capped at
    /// `max_backoff`, then "equal jitter" (uniform in [half, full]).
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry.saturating_sub(1));
        let full = self.initial_backoff.saturating_mul(factor).min(self.max_backoff);
        let half = full / 2;
        let spread = (full - half).as_millis() as u64;
        let jitter = if spread == 0 { 0 } else { crate::env::with_rng(|r| r.gen_range(0..=spread)) };
        half + Duration::from_millis(jitter)
    }

    /// Runs an idempotent create or delete (of a table or queue): `call` builds the request,
    /// and an error `tolerated` accepts (AlreadyExists for a create, NotFound for a delete)
    /// counts as success.
    pub(crate) async fn run_idempotent<F, R, T>(
        &self,
        what: &str,
        tolerated: fn(&StoreError) -> bool,
        call: F,
    ) -> StoreResult<()>
    where
        F: Fn() -> R,
        R: std::future::IntoFuture<Output = azure_core::Result<T>>,
    {
        self.run(what, || {
            let request = call();
            async move {
                match request.await {
                    Ok(_) => Ok(()),
                    Err(e) => match super::error::map_error(&e, what) {
                        err if tolerated(&err) => Ok(()),
                        err => Err(err),
                    },
                }
            }
        })
        .await
        .result
    }

    /// Runs `attempt` until it succeeds, fails permanently, or the attempts are used up.
    pub(crate) async fn run<T, F, Fut>(&self, what: &str, mut attempt: F) -> Outcome<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        let max = self.max_attempts.max(1);
        let mut after_transient = false;
        let mut n = 1;
        loop {
            let result = match tokio::time::timeout(self.request_timeout, attempt()).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::Unavailable(format!(
                    "{what}: no response within {} ms",
                    self.request_timeout.as_millis()
                ))),
            };
            match result {
                Err(e) if e.is_transient() && n < max => {
                    tracing::debug!(operation = what, attempt = n, error = %e, "transient storage failure, retrying");
                    after_transient = true;
                    crate::env::sleep(self.backoff(n)).await;
                    n += 1;
                }
                result => return Outcome { result, after_transient },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn fast() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
            request_timeout: Duration::from_millis(50),
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy::default();
        for retry in 1..10 {
            let d = p.backoff(retry);
            let full = (p.initial_backoff * 2u32.pow(retry - 1)).min(p.max_backoff);
            assert!(d >= full / 2 && d <= full, "retry {retry}: {d:?}");
        }
    }

    #[tokio::test]
    async fn transient_errors_are_retried_a_bounded_number_of_times() {
        let calls = AtomicU32::new(0);
        let out: Outcome<()> = fast()
            .run("op", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(StoreError::Unavailable("503".into()))
            })
            .await;
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert!(out.after_transient && matches!(out.result, Err(StoreError::Unavailable(_))));
    }

    #[tokio::test]
    async fn permanent_errors_are_not_retried_and_hangs_time_out() {
        let calls = AtomicU32::new(0);
        let out: Outcome<()> = fast()
            .run("op", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(StoreError::NotFound("404".into()))
            })
            .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(!out.after_transient);
        let out: Outcome<()> = fast().run("op", std::future::pending).await;
        assert!(matches!(out.result, Err(StoreError::Unavailable(m)) if m.contains("no response")));
    }
}
