//! The queue trigger's delivery, retry and poison rules, read from the app's `host.json`
//! (`extensions.queues`), so that `serve`'s worker and the Functions host follow one policy.
//!
//! Semantics (Azure Functions queue trigger, learn.microsoft.com/azure/azure-functions/
//! functions-bindings-storage-queue#host-json; restated in docs/FUNCTIONS.md):
//! - up to `batchSize` messages are fetched at once, and more are fetched when the number in
//!   flight drops to `newBatchThreshold`, so at most `batchSize + newBatchThreshold` run at once;
//! - a failed message becomes visible again after `visibilityTimeout`;
//! - a message that failed `maxDequeueCount` times is moved to `{queue}-poison`.

use std::time::Duration;

use serde_json::Value;

use crate::error::{Error, Result};

/// The app's own `host.json`, compiled in: the one source of the policy.
const HOST_JSON: &str = include_str!("../../host.json");

/// Delivery, retry and poison rules of a queue-triggered function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePolicy {
    /// Messages fetched per receive (`batchSize`, 1..=32).
    pub batch_size: usize,
    /// Fetch more when this few are in flight (`newBatchThreshold`).
    pub new_batch_threshold: usize,
    /// Longest wait between polls of an idle queue (`maxPollingInterval`).
    pub max_polling_interval: Duration,
    /// Delay before a failed message is visible again (`visibilityTimeout`).
    pub retry_delay: Duration,
    /// Deliveries after which a failing message goes to the poison queue (`maxDequeueCount`).
    pub max_dequeue_count: u32,
}

impl QueuePolicy {
    /// The policy of this app's `host.json` (compiled in; checked by a unit test, so it
    /// cannot fail at run time).
    pub fn host() -> QueuePolicy {
        static HOST: std::sync::OnceLock<QueuePolicy> = std::sync::OnceLock::new();
        // A unit test parses HOST_JSON; the fallback only guards against a broken build.
        HOST.get_or_init(|| QueuePolicy::from_host_json(HOST_JSON).unwrap_or(QueuePolicy::FUNCTIONS_DEFAULTS)).clone()
    }

    /// The Functions host's defaults when `host.json` says nothing.
    pub const FUNCTIONS_DEFAULTS: QueuePolicy = QueuePolicy {
        batch_size: 16,
        new_batch_threshold: 8,
        max_polling_interval: Duration::from_secs(60),
        retry_delay: Duration::ZERO,
        max_dequeue_count: 5,
    };

    /// Most messages handled at once: `batchSize + newBatchThreshold`.
    pub fn concurrency(&self) -> usize {
        self.batch_size + self.new_batch_threshold
    }

    /// Reads `extensions.queues` of a `host.json` text; absent keys take the host's defaults.
    /// Errors name the key and the rule it breaks.
    pub fn from_host_json(text: &str) -> Result<QueuePolicy> {
        let bad = |what: String| Error::Config(format!("host.json: extensions.queues.{what}"));
        let json: Value = serde_json::from_str(text).map_err(|e| Error::Config(format!("host.json: {e}")))?;
        let queues = json.get("extensions").and_then(|e| e.get("queues")).cloned().unwrap_or(Value::Null);
        let d = QueuePolicy::FUNCTIONS_DEFAULTS;
        let num = |key: &str, default: u64| -> Result<u64> {
            match queues.get(key) {
                None => Ok(default),
                Some(v) => v.as_u64().ok_or_else(|| bad(format!("{key} must be a non-negative integer"))),
            }
        };
        let span = |key: &str, default: Duration| -> Result<Duration> {
            match queues.get(key) {
                None => Ok(default),
                Some(v) => v
                    .as_str()
                    .and_then(parse_timespan)
                    .ok_or_else(|| bad(format!("{key} must be a time span like \"00:00:30\""))),
            }
        };
        let batch_size = num("batchSize", d.batch_size as u64)? as usize;
        if !(1..=32).contains(&batch_size) {
            return Err(bad(format!("batchSize {batch_size} is outside 1..=32")));
        }
        let max_dequeue_count = num("maxDequeueCount", u64::from(d.max_dequeue_count))?;
        if max_dequeue_count == 0 || max_dequeue_count > u64::from(u32::MAX) {
            return Err(bad(format!("maxDequeueCount {max_dequeue_count} must be at least 1")));
        }
        Ok(QueuePolicy {
            batch_size,
            new_batch_threshold: num("newBatchThreshold", (batch_size / 2) as u64)? as usize,
            max_polling_interval: span("maxPollingInterval", d.max_polling_interval)?,
            retry_delay: span("visibilityTimeout", d.retry_delay)?,
            max_dequeue_count: max_dequeue_count as u32,
        })
    }
}

/// Parses a .NET `TimeSpan` string: `[d.]hh:mm:ss[.fffffff]`.
fn parse_timespan(s: &str) -> Option<Duration> {
    let (days, rest) = match s.split_once('.') {
        Some((d, rest)) if !d.contains(':') => (d.parse::<u64>().ok()?, rest),
        _ => (0, s),
    };
    let mut parts = rest.split(':');
    let (h, m, sec) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (h, m): (u64, u64) = (h.parse().ok()?, m.parse().ok()?);
    let secs: f64 = sec.parse().ok()?;
    if h > 23 || m > 59 || !(0.0..60.0).contains(&secs) {
        return None;
    }
    Some(Duration::from_secs(days * 86_400 + h * 3_600 + m * 60) + Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_apps_host_json_is_the_policy() {
        let p = QueuePolicy::from_host_json(HOST_JSON).expect("host.json parses");
        assert_eq!(p, QueuePolicy::host());
        assert_eq!(p.max_dequeue_count, 10);
        assert_eq!(p.batch_size, 16);
        assert_eq!(p.concurrency(), 24);
        assert_eq!(p.retry_delay, Duration::from_secs(30));
        assert_eq!(p.max_polling_interval, Duration::from_secs(2));
    }

    #[test]
    fn absent_keys_take_the_functions_defaults() {
        let p = QueuePolicy::from_host_json(r#"{"version":"2.0"}"#).unwrap();
        assert_eq!(p, QueuePolicy::FUNCTIONS_DEFAULTS);
        let p = QueuePolicy::from_host_json(r#"{"extensions":{"queues":{"batchSize":4}}}"#).unwrap();
        assert_eq!((p.batch_size, p.new_batch_threshold), (4, 2));
    }

    #[test]
    fn bad_values_name_the_key() {
        for (text, key) in [
            (r#"{"extensions":{"queues":{"batchSize":33}}}"#, "batchSize"),
            (r#"{"extensions":{"queues":{"maxDequeueCount":0}}}"#, "maxDequeueCount"),
            (r#"{"extensions":{"queues":{"visibilityTimeout":"soon"}}}"#, "visibilityTimeout"),
            (r#"{"extensions":{"queues":{"batchSize":"8"}}}"#, "batchSize"),
        ] {
            let e = QueuePolicy::from_host_json(text).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn timespans() {
        assert_eq!(parse_timespan("00:00:30"), Some(Duration::from_secs(30)));
        assert_eq!(parse_timespan("1.00:00:01"), Some(Duration::from_secs(86_401)));
        assert_eq!(parse_timespan("00:01:00.5"), Some(Duration::from_millis(60_500)));
        assert_eq!(parse_timespan("00:60:00"), None);
        assert_eq!(parse_timespan("30"), None);
    }
}
