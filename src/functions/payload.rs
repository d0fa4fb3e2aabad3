//! Invocation payloads of the Azure Functions host for non-HTTP triggers, as a custom handler
//! receives and answers them. Pure types and functions: no I/O, no HTTP framework.
//!
//! The host `POST`s `/{function name}` with a JSON body `{"Data": {..}, "Metadata": {..}}`
//! and expects `200` with `{"Outputs": {..}, "Logs": [..], "ReturnValue": ..}` as
//! `application/json`; any non-2xx status fails the invocation (queue messages are then
//! retried and finally moved to the poison queue). Facts and their sources:
//! `docs/FUNCTIONS.md` (sections 2-4 of the host contract).
//!
//! Encoding quirks handled here, all from the host's code and captured payloads:
//!
//! - A queue trigger's `Data[name]` is a JSON string whose content is the message text quoted
//!   as JSON once more (`"\"{\\\"id\\\":42}\""`), whether or not the text is JSON.
//! - Scalar metadata arrives the same way: `DequeueCount` is the string `"1"`, `Id` and
//!   `PopReceipt` are strings with embedded quotes. The documented (but not observed) plain
//!   forms are accepted too: a number, an unquoted string.
//! - A timer trigger's `Data[name]` is an object `{Schedule, ScheduleStatus|null, IsPastDue}`.
//! - Key names follow Newtonsoft's case-insensitive matching: an exact match wins, else the
//!   first key that matches ignoring ASCII case.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// Content type of every answer to the host. The host rejects other media types
/// (`text/plain` fails the invocation even with a 200).
pub const RESPONSE_CONTENT_TYPE: &str = "application/json";

/// An invocation body the handler cannot use. Answered with a non-2xx status, so the host
/// counts a failed invocation (a queue message is retried, then poisoned).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// The body is not a JSON object of the expected shape.
    #[error("invocation body is not a JSON invocation request: {0}")]
    NotJson(String),
    /// `Data` has no entry for the trigger's binding name.
    #[error("invocation Data has no binding '{name}' (present: {present})")]
    MissingData {
        /// Binding name looked up (the `name` in function.json).
        name: String,
        /// Binding names present, comma-separated.
        present: String,
    },
    /// The binding value has an unusable shape.
    #[error("invocation Data binding '{name}': {reason}")]
    InvalidData {
        /// Binding name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A required `Metadata` key is missing.
    #[error("invocation Metadata has no '{0}'")]
    MissingMetadata(String),
    /// A `Metadata` value has an unusable shape.
    #[error("invocation Metadata '{key}': {reason}")]
    InvalidMetadata {
        /// Metadata key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The raw invocation request: input binding values and trigger metadata.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct InvocationRequest {
    /// One entry per input binding (trigger included), keyed by binding name.
    #[serde(rename = "Data", alias = "data", default, deserialize_with = "null_as_empty")]
    pub data: Map<String, Value>,
    /// Trigger metadata (`DequeueCount`, `Id`, `sys`, `RetryContext`, ...).
    #[serde(rename = "Metadata", alias = "metadata", default, deserialize_with = "null_as_empty")]
    pub metadata: Map<String, Value>,
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Map<String, Value>, D::Error> {
    Ok(Option::<Map<String, Value>>::deserialize(d)?.unwrap_or_default())
}

/// Value of `key` in `map`: the exact key, else the first key equal ignoring ASCII case.
fn get_ci<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).or_else(|| map.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v))
}

impl InvocationRequest {
    /// Parses an invocation body.
    pub fn parse(body: &[u8]) -> Result<Self, PayloadError> {
        serde_json::from_slice(body).map_err(|e| PayloadError::NotJson(e.to_string()))
    }

    /// The value of input binding `name` (case-insensitive).
    pub fn binding(&self, name: &str) -> Result<&Value, PayloadError> {
        get_ci(&self.data, name).ok_or_else(|| PayloadError::MissingData {
            name: name.to_string(),
            present: self.data.keys().map(String::as_str).collect::<Vec<_>>().join(", "),
        })
    }

    /// The metadata value of `key` (case-insensitive); `None` when absent or `null`.
    pub fn metadata_value(&self, key: &str) -> Option<&Value> {
        get_ci(&self.metadata, key).filter(|v| !v.is_null())
    }

    /// A scalar metadata value as text, with the host's extra JSON quoting removed:
    /// `"\"abc\""` gives `abc`, `"abc"` gives `abc`, `3` gives `3`. `None` when absent.
    pub fn metadata_text(&self, key: &str) -> Result<Option<String>, PayloadError> {
        match self.metadata_value(key) {
            None => Ok(None),
            Some(v) => host_scalar_text(v).map(Some).ok_or_else(|| PayloadError::InvalidMetadata {
                key: key.to_string(),
                reason: format!("expected a string or number, got {}", json_kind(v)),
            }),
        }
    }

    /// The `sys` metadata object, if present and well-formed.
    pub fn system_data(&self) -> Option<SystemData> {
        self.metadata_value("sys").and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// The `RetryContext` metadata object, present only when host.json configures a `retry`
    /// policy; `None` when absent or malformed.
    pub fn retry_context(&self) -> Option<RetryContext> {
        self.metadata_value("RetryContext").and_then(|v| serde_json::from_value(v.clone()).ok())
    }
}

/// Text of a scalar as the host sends it: strings lose one layer of JSON quoting if they
/// carry one (the host's `JsonConvert.SerializeObject` of a string), numbers and booleans
/// are printed. `None` for null, objects and arrays.
pub fn host_scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(unquote_once(s)),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null | Value::Object(_) | Value::Array(_) => None,
    }
}

/// `s` without one layer of JSON string quoting, when `s` is a JSON string literal;
/// otherwise `s` unchanged (the documented single-encoded form).
fn unquote_once(s: &str) -> String {
    match serde_json::from_str::<Value>(s) {
        Ok(Value::String(inner)) => inner,
        _ => s.to_string(),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The `sys` metadata the host adds to every invocation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct SystemData {
    /// Function name.
    #[serde(rename = "MethodName", alias = "methodName", default)]
    pub method_name: Option<String>,
    /// Host clock at dispatch, ISO-8601 with 7 fractional digits.
    #[serde(rename = "UtcNow", alias = "utcNow", default)]
    pub utc_now: Option<String>,
    /// A random GUID per invocation.
    #[serde(rename = "RandGuid", alias = "randGuid", default)]
    pub rand_guid: Option<String>,
}

/// The host's in-process retry state (only with a host.json `retry` policy, which this app
/// does not configure: queue retries go through the dequeue count instead).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct RetryContext {
    /// Retries so far (0 on the first attempt).
    #[serde(rename = "RetryCount", alias = "retryCount", default, deserialize_with = "flexible_u32")]
    pub retry_count: Option<u32>,
    /// The policy's maximum.
    #[serde(rename = "MaxRetryCount", alias = "maxRetryCount", default, deserialize_with = "flexible_u32")]
    pub max_retry_count: Option<u32>,
    /// The previous attempt's exception, as the host serialized it.
    #[serde(rename = "Exception", alias = "exception", default)]
    pub exception: Option<Value>,
}

fn flexible_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    let v = Option::<Value>::deserialize(d)?;
    Ok(v.as_ref().and_then(host_scalar_text).and_then(|s| s.trim().parse().ok()))
}

/// A queue-trigger invocation, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueInvocation {
    /// The message text exactly as it was enqueued (after the queue's base64 decoding).
    pub message: String,
    /// The queue message id, without the host's extra quotes.
    pub id: String,
    /// How many times the message has been dequeued, this delivery included (1 first time).
    pub dequeue_count: u32,
    /// The pop receipt of this delivery, without the extra quotes.
    pub pop_receipt: Option<String>,
    /// When the message was enqueued (`2025-01-01T10:00:00+00:00`, whole seconds).
    pub insertion_time: Option<String>,
    /// When the message expires.
    pub expiration_time: Option<String>,
    /// When the message becomes visible again if this invocation does not finish.
    pub next_visible_time: Option<String>,
    /// The host's `sys` metadata.
    pub sys: Option<SystemData>,
    /// Host retry state, if a retry policy is configured.
    pub retry: Option<RetryContext>,
}

/// Decodes the host's value of a queue trigger binding to the message text.
///
/// The host sends a JSON string whose content is the JSON-quoted message text; that layer is
/// removed. A string that is not a JSON string literal is taken as the text itself (the
/// single-encoded form some documentation shows). An object or array (a trigger bound to a
/// POCO type) is returned as compact JSON text.
pub fn decode_queue_message(name: &str, v: &Value) -> Result<String, PayloadError> {
    match v {
        Value::String(s) => Ok(unquote_once(s)),
        Value::Object(_) | Value::Array(_) => Ok(v.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Null => Err(PayloadError::InvalidData { name: name.to_string(), reason: "null message".into() }),
    }
}

/// Parses the host's request body for a queue trigger named `binding`.
///
/// Requires `Data[binding]`, `Metadata.Id` and `Metadata.DequeueCount` (a string like `"1"`
/// or a number, at least 1).
pub fn parse_queue_invocation(body: &[u8], binding: &str) -> Result<QueueInvocation, PayloadError> {
    let req = InvocationRequest::parse(body)?;
    let message = decode_queue_message(binding, req.binding(binding)?)?;
    let id = req.metadata_text("Id")?.ok_or_else(|| PayloadError::MissingMetadata("Id".into()))?;
    let count_text =
        req.metadata_text("DequeueCount")?.ok_or_else(|| PayloadError::MissingMetadata("DequeueCount".into()))?;
    let dequeue_count =
        count_text.trim().parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| PayloadError::InvalidMetadata {
            key: "DequeueCount".into(),
            reason: format!("expected a positive integer, got {count_text:?}"),
        })?;
    Ok(QueueInvocation {
        message,
        id,
        dequeue_count,
        pop_receipt: req.metadata_text("PopReceipt")?,
        insertion_time: req.metadata_text("InsertionTime")?,
        expiration_time: req.metadata_text("ExpirationTime")?,
        next_visible_time: req.metadata_text("NextVisibleTime")?,
        sys: req.system_data(),
        retry: req.retry_context(),
    })
}

/// The timer's schedule, as far as the host exposes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TimerSchedule {
    /// True for CRON schedules, false for TimeSpan schedules.
    #[serde(rename = "AdjustForDST", alias = "adjustForDST", alias = "adjustForDst", default)]
    pub adjust_for_dst: bool,
}

/// The schedule monitor's record of occurrences (`null` when the monitor is off).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ScheduleStatus {
    /// Last occurrence.
    #[serde(rename = "Last", alias = "last", default)]
    pub last: Option<String>,
    /// Next scheduled occurrence.
    #[serde(rename = "Next", alias = "next", default)]
    pub next: Option<String>,
    /// When the monitor last updated this status.
    #[serde(rename = "LastUpdated", alias = "lastUpdated", default)]
    pub last_updated: Option<String>,
}

/// The timer trigger's value (`TimerInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TimerInfo {
    /// Schedule details.
    #[serde(rename = "Schedule", alias = "schedule", default)]
    pub schedule: Option<TimerSchedule>,
    /// Monitor status; `None` when the host sends `null`.
    #[serde(rename = "ScheduleStatus", alias = "scheduleStatus", default)]
    pub schedule_status: Option<ScheduleStatus>,
    /// True when this run catches up on a missed occurrence.
    #[serde(rename = "IsPastDue", alias = "isPastDue", default)]
    pub is_past_due: bool,
}

/// A timer-trigger invocation, decoded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TimerInvocation {
    /// The trigger value.
    pub timer: TimerInfo,
    /// The host's `sys` metadata.
    pub sys: Option<SystemData>,
    /// Host retry state, if a retry policy is configured.
    pub retry: Option<RetryContext>,
}

/// Parses the host's request body for a timer trigger named `binding`. The value is an
/// object; a string holding that object's JSON is accepted too.
pub fn parse_timer_invocation(body: &[u8], binding: &str) -> Result<TimerInvocation, PayloadError> {
    let req = InvocationRequest::parse(body)?;
    let raw = req.binding(binding)?;
    let invalid = |reason: String| PayloadError::InvalidData { name: binding.to_string(), reason };
    let value = match raw {
        Value::Object(_) => raw.clone(),
        Value::String(s) => serde_json::from_str::<Value>(&unquote_once(s))
            .map_err(|e| invalid(format!("string is not a TimerInfo object: {e}")))?,
        other => return Err(invalid(format!("expected a TimerInfo object, got {}", json_kind(other)))),
    };
    let timer = serde_json::from_value(value).map_err(|e| invalid(format!("not a TimerInfo object: {e}")))?;
    Ok(TimerInvocation { timer, sys: req.system_data(), retry: req.retry_context() })
}

/// The handler's answer to a non-HTTP invocation.
///
/// `Outputs` maps output binding names to values (this app declares none), `Logs` lines are
/// logged by the host at Information level (only on a 2xx answer), `ReturnValue` goes to a
/// `$return` binding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InvocationResponse {
    /// Output binding values by binding name.
    #[serde(rename = "Outputs")]
    pub outputs: Map<String, Value>,
    /// Log lines for the host.
    #[serde(rename = "Logs")]
    pub logs: Vec<String>,
    /// Value for a `$return` binding; `null` when there is none.
    #[serde(rename = "ReturnValue")]
    pub return_value: Value,
}

impl Default for InvocationResponse {
    fn default() -> Self {
        InvocationResponse { outputs: Map::new(), logs: Vec::new(), return_value: Value::Null }
    }
}

/// The minimal valid answer, used if serialization ever failed.
const EMPTY_RESPONSE: &[u8] = br#"{"Outputs":{},"Logs":[],"ReturnValue":null}"#;

impl InvocationResponse {
    /// An answer with no outputs, no logs and a `null` return value.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same answer with one more log line.
    pub fn with_log(mut self, line: impl Into<String>) -> Self {
        self.logs.push(line.into());
        self
    }

    /// The JSON body, to be sent with [`RESPONSE_CONTENT_TYPE`]. Never empty: the host
    /// treats an empty 2xx body as an invocation that never completes.
    pub fn to_body(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|_| EMPTY_RESPONSE.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// docs/functions-host-contract.md §2 example, verbatim body.
    const QUEUE_EXAMPLE: &str = r#"{
  "Data": { "order": "\"{\\\"id\\\":42,\\\"sku\\\":\\\"A-1\\\"}\"" },
  "Metadata": {
    "DequeueCount": "1",
    "ExpirationTime": "2025-01-08T10:00:00+00:00",
    "Id": "\"5f1c0c8e-3a51-4c2e-9d6b-0f1e2d3c4b5a\"",
    "InsertionTime": "2025-01-01T10:00:00+00:00",
    "NextVisibleTime": "2025-01-01T10:10:01+00:00",
    "PopReceipt": "\"AgAAAAMAAAAAAAAA8d5gQex+2AE=\"",
    "sys": { "MethodName": "ProcessOrder", "UtcNow": "2025-01-01T10:00:01.1234567Z",
             "RandGuid": "0e7a3f52-9d1b-4b8e-a2c4-6f5d3e2b1a09" }
  }
}"#;

    /// docs/functions-host-contract.md §3 example, verbatim body.
    const TIMER_EXAMPLE: &str = r#"{
  "Data": { "myTimer": {
      "Schedule": { "AdjustForDST": true },
      "ScheduleStatus": { "Last": "2025-01-01T02:00:00+00:00", "Next": "2025-01-02T02:00:00+00:00",
                          "LastUpdated": "2025-01-01T02:00:00+00:00" },
      "IsPastDue": false } },
  "Metadata": { "sys": { "MethodName": "Nightly", "UtcNow": "2025-01-01T02:00:00.0312345Z",
                         "RandGuid": "4a0e6c1d-2b3f-4c5d-8e9f-a0b1c2d3e4f5" } }
}"#;

    #[test]
    fn queue_example_from_the_contract() {
        let q = parse_queue_invocation(QUEUE_EXAMPLE.as_bytes(), "order").unwrap();
        assert_eq!(q.message, r#"{"id":42,"sku":"A-1"}"#);
        let parsed: Value = serde_json::from_str(&q.message).unwrap();
        assert_eq!(parsed, json!({"id": 42, "sku": "A-1"}));
        assert_eq!(q.id, "5f1c0c8e-3a51-4c2e-9d6b-0f1e2d3c4b5a");
        assert_eq!(q.dequeue_count, 1);
        assert_eq!(q.pop_receipt.as_deref(), Some("AgAAAAMAAAAAAAAA8d5gQex+2AE="));
        assert_eq!(q.insertion_time.as_deref(), Some("2025-01-01T10:00:00+00:00"));
        assert_eq!(q.expiration_time.as_deref(), Some("2025-01-08T10:00:00+00:00"));
        assert_eq!(q.next_visible_time.as_deref(), Some("2025-01-01T10:10:01+00:00"));
        let sys = q.sys.unwrap();
        assert_eq!(sys.method_name.as_deref(), Some("ProcessOrder"));
        assert_eq!(sys.utc_now.as_deref(), Some("2025-01-01T10:00:01.1234567Z"));
        assert_eq!(q.retry, None);
    }

    #[test]
    fn queue_text_that_is_not_json_is_double_encoded_too() {
        // Captured payload form (contract §2, obs O): "inMsg": "\"aaaaa\"".
        let body = r#"{"Data":{"inMsg":"\"aaaaa\""},"Metadata":{"DequeueCount":"3","Id":"\"x\""}}"#;
        let q = parse_queue_invocation(body.as_bytes(), "inMsg").unwrap();
        assert_eq!(q.message, "aaaaa");
        assert_eq!(q.dequeue_count, 3);
        assert_eq!(q.id, "x");
    }

    #[test]
    fn queue_text_keeps_quotes_that_belong_to_the_message() {
        // Message text `"hello"` (with its quotes) is quoted once more by the host.
        let text = "\"hello\"";
        let host_value = serde_json::to_string(text).unwrap();
        let body = json!({"Data": {"message": host_value}, "Metadata": {"DequeueCount": "1", "Id": "\"m\""}});
        let q = parse_queue_invocation(body.to_string().as_bytes(), "message").unwrap();
        assert_eq!(q.message, text);
    }

    #[test]
    fn queue_round_trips_arbitrary_text() {
        for text in ["", "{\"v\":1,\"op\":\"insert\",\"record\":{\"a\":\"<&>'\"}}", "ünï \\ \n \"q\"", "42", "null"] {
            let host_value = serde_json::to_string(text).unwrap();
            let body = json!({"Data": {"message": host_value}, "Metadata": {"DequeueCount": "2", "Id": "\"i\""}});
            let q = parse_queue_invocation(body.to_string().as_bytes(), "message").unwrap();
            assert_eq!(q.message, text);
        }
    }

    #[test]
    fn documented_single_encoded_forms_are_accepted() {
        // functions-custom-handlers.md shows a number DequeueCount, an unquoted Id and a
        // message that is not double-encoded; the real host never sends these.
        let body = r#"{"Data":{"myQueueItem":"{ message: \"Message sent\" }"},
                       "Metadata":{"DequeueCount":1,"Id":"plain-id"}}"#;
        let q = parse_queue_invocation(body.as_bytes(), "myQueueItem").unwrap();
        assert_eq!(q.message, "{ message: \"Message sent\" }");
        assert_eq!(q.dequeue_count, 1);
        assert_eq!(q.id, "plain-id");
        let json_text = json!({"Data":{"m":"{\"v\":1}"},"Metadata":{"DequeueCount":"1","Id":"i"}});
        let q = parse_queue_invocation(json_text.to_string().as_bytes(), "m").unwrap();
        assert_eq!(q.message, "{\"v\":1}");
    }

    #[test]
    fn object_binding_value_becomes_json_text() {
        let body = json!({"Data": {"m": {"v": 1}}, "Metadata": {"DequeueCount": "1", "Id": "\"i\""}});
        let q = parse_queue_invocation(body.to_string().as_bytes(), "m").unwrap();
        assert_eq!(serde_json::from_str::<Value>(&q.message).unwrap(), json!({"v": 1}));
    }

    #[test]
    fn binding_and_metadata_keys_match_case_insensitively() {
        let body = r#"{"Data":{"Message":"\"t\""},"Metadata":{"dequeuecount":"4","ID":"\"i\""}}"#;
        let q = parse_queue_invocation(body.as_bytes(), "message").unwrap();
        assert_eq!((q.message.as_str(), q.dequeue_count, q.id.as_str()), ("t", 4, "i"));
    }

    #[test]
    fn queue_errors_name_what_is_missing() {
        let missing_binding = r#"{"Data":{"other":"\"t\""},"Metadata":{"DequeueCount":"1","Id":"\"i\""}}"#;
        match parse_queue_invocation(missing_binding.as_bytes(), "message") {
            Err(PayloadError::MissingData { name, present }) => {
                assert_eq!(name, "message");
                assert_eq!(present, "other");
            }
            other => panic!("unexpected {other:?}"),
        }
        let no_count = r#"{"Data":{"message":"\"t\""},"Metadata":{"Id":"\"i\""}}"#;
        assert_eq!(
            parse_queue_invocation(no_count.as_bytes(), "message"),
            Err(PayloadError::MissingMetadata("DequeueCount".into()))
        );
        let no_id = r#"{"Data":{"message":"\"t\""},"Metadata":{"DequeueCount":"1"}}"#;
        assert_eq!(
            parse_queue_invocation(no_id.as_bytes(), "message"),
            Err(PayloadError::MissingMetadata("Id".into()))
        );
        for bad in [r#""x""#, r#""0""#, "-1", r#"{"a":1}"#] {
            let body = format!(r#"{{"Data":{{"message":"\"t\""}},"Metadata":{{"Id":"\"i\"","DequeueCount":{bad}}}}}"#);
            assert!(
                matches!(parse_queue_invocation(body.as_bytes(), "message"), Err(PayloadError::InvalidMetadata { .. })),
                "{bad}"
            );
        }
        let null_msg = r#"{"Data":{"message":null},"Metadata":{"DequeueCount":"1","Id":"\"i\""}}"#;
        assert!(matches!(
            parse_queue_invocation(null_msg.as_bytes(), "message"),
            Err(PayloadError::InvalidData { .. })
        ));
        assert!(matches!(parse_queue_invocation(b"not json", "message"), Err(PayloadError::NotJson(_))));
        assert!(matches!(parse_queue_invocation(b"[1]", "message"), Err(PayloadError::NotJson(_))));
    }

    #[test]
    fn retry_context_is_read_when_present() {
        let body = json!({
            "Data": {"message": "\"t\""},
            "Metadata": {"DequeueCount": "1", "Id": "\"i\"",
                         "RetryContext": {"RetryCount": 2, "MaxRetryCount": "5", "Exception": null}}
        });
        let q = parse_queue_invocation(body.to_string().as_bytes(), "message").unwrap();
        let r = q.retry.unwrap();
        assert_eq!((r.retry_count, r.max_retry_count, r.exception), (Some(2), Some(5), None));
    }

    #[test]
    fn timer_example_from_the_contract() {
        let t = parse_timer_invocation(TIMER_EXAMPLE.as_bytes(), "myTimer").unwrap();
        assert_eq!(t.timer.schedule, Some(TimerSchedule { adjust_for_dst: true }));
        let status = t.timer.schedule_status.unwrap();
        assert_eq!(status.last.as_deref(), Some("2025-01-01T02:00:00+00:00"));
        assert_eq!(status.next.as_deref(), Some("2025-01-02T02:00:00+00:00"));
        assert_eq!(status.last_updated.as_deref(), Some("2025-01-01T02:00:00+00:00"));
        assert!(!t.timer.is_past_due);
        assert_eq!(t.sys.unwrap().method_name.as_deref(), Some("Nightly"));
    }

    #[test]
    fn timer_with_monitor_off_and_past_due() {
        let body = r#"{"Data":{"timer":{"Schedule":{"AdjustForDST":true},"ScheduleStatus":null,"IsPastDue":true}},
                       "Metadata":{"sys":{"MethodName":"sweep"}}}"#;
        let t = parse_timer_invocation(body.as_bytes(), "timer").unwrap();
        assert_eq!(t.timer.schedule_status, None);
        assert!(t.timer.is_past_due);
        // The same object sent as JSON text is accepted.
        let as_string = json!({"Data": {"timer": "{\"IsPastDue\":true}"}, "Metadata": {}});
        assert!(parse_timer_invocation(as_string.to_string().as_bytes(), "timer").unwrap().timer.is_past_due);
    }

    #[test]
    fn timer_errors() {
        assert!(matches!(
            parse_timer_invocation(br#"{"Data":{},"Metadata":{}}"#, "timer"),
            Err(PayloadError::MissingData { .. })
        ));
        assert!(matches!(
            parse_timer_invocation(br#"{"Data":{"timer":3},"Metadata":null}"#, "timer"),
            Err(PayloadError::InvalidData { .. })
        ));
        assert!(matches!(
            parse_timer_invocation(br#"{"Data":{"timer":{"IsPastDue":"yes"}}}"#, "timer"),
            Err(PayloadError::InvalidData { .. })
        ));
    }

    #[test]
    fn response_has_the_host_shape() {
        let body = InvocationResponse::new().with_log("applied 3 entries").to_body();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, json!({"Outputs": {}, "Logs": ["applied 3 entries"], "ReturnValue": null}));
        assert_eq!(RESPONSE_CONTENT_TYPE, "application/json");
        let empty: Value = serde_json::from_slice(&InvocationResponse::new().to_body()).unwrap();
        assert_eq!(empty, serde_json::from_slice::<Value>(EMPTY_RESPONSE).unwrap());
    }
}
