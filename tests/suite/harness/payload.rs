//! Invocation requests the host sends for non-HTTP triggers and how it judges the answers
//! (functions-host-contract.md §2-§4).

use std::time::Duration;

use serde_json::{json, Map, Value};
use time::format_description::BorrowedFormatItem;
use time::macros::format_description;
use time::OffsetDateTime;

use super::app::get_ci;

/// Host version the harness claims (`X-Azure-Functions-HostVersion`, User-Agent).
pub const HOST_VERSION: &str = "4.1037.0.0";

const SECONDS: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]+00:00");
const TICKS: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:7]Z");

/// A DateTimeOffset as the host writes binding data: whole seconds, `+00:00`.
pub fn host_time(t: OffsetDateTime) -> String {
    t.format(SECONDS).unwrap()
}

/// `sys.UtcNow`: 7 fractional digits, `Z`.
pub fn utc_now_ticks() -> String {
    OffsetDateTime::now_utc().format(TICKS).unwrap()
}

/// `OffsetDateTime::now_utc() + d`.
pub fn now_plus(d: Duration) -> OffsetDateTime {
    OffsetDateTime::now_utc() + d
}

/// The `sys` metadata object.
pub fn sys(function: &str) -> Value {
    json!({"MethodName": function, "UtcNow": utc_now_ticks(), "RandGuid": uuid::Uuid::new_v4().to_string()})
}

/// The host's rule 4: a string value is sent as `JsonConvert.SerializeObject(value)`, i.e. a
/// JSON string whose content is the JSON-quoted text.
pub fn host_string(s: &str) -> Value {
    Value::String(serde_json::to_string(s).unwrap())
}

/// Metadata of a queue-trigger invocation (`QueueTrigger` is dropped by the "...trigger" rule).
#[derive(Debug, Clone)]
pub struct QueueMeta {
    pub id: String,
    pub pop_receipt: String,
    pub dequeue_count: u32,
    pub insertion_time: OffsetDateTime,
    pub expiration_time: OffsetDateTime,
    pub next_visible_time: OffsetDateTime,
}

/// The trigger value of a queue message.
#[derive(Debug, Clone, Copy)]
pub enum QueueData<'a> {
    /// Default (`string`) binding: the UTF-8 text, double-encoded by rule 4.
    Text(&'a str),
    /// `dataType: binary`: the plain base64 of the bytes.
    Binary(&'a [u8]),
}

/// Body of `POST /{function}` for a queue message.
pub fn queue_invocation(function: &str, binding: &str, data: QueueData<'_>, meta: &QueueMeta) -> Value {
    let value = match data {
        QueueData::Text(text) => host_string(text),
        QueueData::Binary(bytes) => {
            use base64::Engine as _;
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    };
    let mut map = Map::new();
    map.insert(binding.to_string(), value);
    json!({
        "Data": map,
        "Metadata": {
            "DequeueCount": meta.dequeue_count.to_string(),
            "ExpirationTime": host_time(meta.expiration_time),
            "Id": host_string(&meta.id),
            "InsertionTime": host_time(meta.insertion_time),
            "NextVisibleTime": host_time(meta.next_visible_time),
            "PopReceipt": host_string(&meta.pop_receipt),
            "sys": sys(function),
        }
    })
}

/// `ScheduleStatus` (the schedule monitor's record), or `None` when the monitor is off.
#[derive(Debug, Clone)]
pub struct ScheduleStatus {
    pub last: OffsetDateTime,
    pub next: OffsetDateTime,
    pub last_updated: OffsetDateTime,
}

/// Body of `POST /{function}` for a timer: `TimerInfo` embedded as an object; Metadata has
/// only `sys` (`TimerTrigger` is dropped).
pub fn timer_invocation(function: &str, binding: &str, status: Option<&ScheduleStatus>, is_past_due: bool) -> Value {
    let status = match status {
        Some(s) => {
            json!({"Last": host_time(s.last), "Next": host_time(s.next), "LastUpdated": host_time(s.last_updated)})
        }
        None => Value::Null,
    };
    let mut data = Map::new();
    data.insert(
        binding.to_string(),
        json!({"Schedule": {"AdjustForDST": true}, "ScheduleStatus": status, "IsPastDue": is_past_due}),
    );
    json!({"Data": data, "Metadata": {"sys": sys(function)}})
}

/// Headers of an invocation request (besides Host, Transfer-Encoding, Connection).
pub fn invocation_headers(invocation_id: &str) -> Vec<(String, String)> {
    vec![
        ("Content-Type".into(), "application/json; charset=utf-8".into()),
        ("X-Azure-Functions-HostVersion".into(), HOST_VERSION.into()),
        ("X-Azure-Functions-InvocationId".into(), invocation_id.into()),
        ("User-Agent".into(), format!("Azure-Functions-Host/{HOST_VERSION}")),
    ]
}

/// How the host judges an invocation response.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// 2xx with a JSON `HttpScriptInvocationResult`: the invocation succeeded.
    Success { logs: Vec<String>, outputs: Map<String, Value>, return_value: Value },
    /// The invocation failed (queue message retried, then poisoned).
    Failure(String),
    /// A handler bug the host would not report as a failure: an empty (or `null`) 2xx body
    /// leaves the invocation uncompleted until functionTimeout.
    Bug(String),
}

impl Verdict {
    pub fn is_success(&self) -> bool {
        matches!(self, Verdict::Success { .. })
    }
}

/// Judges `status`, `content_type` and `body` like `ProcessDefaultInvocationRequest`.
pub fn judge(status: u16, content_type: Option<&str>, body: &[u8]) -> Verdict {
    if !(200..300).contains(&status) {
        // EnsureSuccessStatusCode: the body is never read.
        return Verdict::Failure(format!("Response status code does not indicate success: {status}"));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Bug(format!(
            "empty {status} body: the host never completes the invocation (hangs until functionTimeout)"
        ));
    }
    let media =
        content_type.unwrap_or("application/octet-stream").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if media != "application/json" && media != "text/json" {
        return Verdict::Failure(format!("UnsupportedMediaTypeException: no formatter reads '{media}'"));
    }
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Verdict::Failure(format!("Invalid HttpResponseMessage: {e}")),
    };
    let obj = match value {
        Value::Null => return Verdict::Bug("a 2xx `null` body: the host never completes the invocation".into()),
        Value::Object(o) => Value::Object(o),
        other => return Verdict::Failure(format!("Invalid HttpResponseMessage: expected an object, got {other}")),
    };
    let logs = match get_ci(&obj, "Logs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => match a.iter().map(|l| l.as_str().map(String::from)).collect::<Option<Vec<_>>>() {
            Some(l) => l,
            None => return Verdict::Failure("Invalid HttpResponseMessage: Logs must be strings".into()),
        },
        Some(other) => return Verdict::Failure(format!("Invalid HttpResponseMessage: Logs is {other}")),
    };
    let outputs = match get_ci(&obj, "Outputs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(other) => return Verdict::Failure(format!("Invalid HttpResponseMessage: Outputs is {other}")),
    };
    let return_value = get_ci(&obj, "ReturnValue").cloned().unwrap_or(Value::Null);
    Verdict::Success { logs, outputs, return_value }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_payload_has_the_host_encoding() {
        let t = OffsetDateTime::from_unix_timestamp(1_735_725_600).unwrap(); // 2025-01-01T10:00:00Z
        let meta = QueueMeta {
            id: "5f1c".into(),
            pop_receipt: "AgAA".into(),
            dequeue_count: 1,
            insertion_time: t,
            expiration_time: t,
            next_visible_time: t,
        };
        let v = queue_invocation("ProcessOrder", "order", QueueData::Text(r#"{"id":42,"sku":"A-1"}"#), &meta);
        let text = v.to_string();
        assert!(text.contains(r#""order":"\"{\\\"id\\\":42,\\\"sku\\\":\\\"A-1\\\"}\"""#), "{text}");
        assert_eq!(v["Metadata"]["DequeueCount"], "1");
        assert_eq!(v["Metadata"]["Id"], "\"5f1c\"");
        assert_eq!(v["Metadata"]["InsertionTime"], "2025-01-01T10:00:00+00:00");
        assert!(v["Metadata"].get("QueueTrigger").is_none());
        let now = v["Metadata"]["sys"]["UtcNow"].as_str().unwrap();
        assert_eq!(now.len(), "2025-01-01T10:00:01.1234567Z".len(), "{now}");
    }

    #[test]
    fn judging() {
        assert!(judge(200, Some("application/json"), br#"{"Outputs":{},"Logs":["a"],"ReturnValue":null}"#).is_success());
        assert!(judge(200, Some("application/json; charset=utf-8"), br#"{"logs":[]}"#).is_success());
        assert!(matches!(judge(500, Some("application/json"), b"{}"), Verdict::Failure(_)));
        assert!(matches!(judge(200, Some("text/plain"), b"{}"), Verdict::Failure(_)));
        assert!(matches!(judge(200, None, b"{}"), Verdict::Failure(_)));
        assert!(matches!(judge(200, Some("application/json"), b"{"), Verdict::Failure(_)));
        assert!(matches!(judge(200, Some("application/json"), b""), Verdict::Bug(_)));
        assert!(matches!(judge(204, None, b""), Verdict::Bug(_)));
    }
}
