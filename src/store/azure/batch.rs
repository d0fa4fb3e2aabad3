//! Entity group transactions (`$batch`), written and read by us.
//!
//! The crate's `TransactionBuilder` cannot report which operation failed: a failed batch is
//! returned as `Ok` with a single sub-response whose status is all it parses (the index is in
//! the body and in `Content-ID`, both dropped). It also leaves quotes in row keys unescaped,
//! sends `update`/`merge` without `If-Match` as upserts, and ends lines with bare `\n`. So the
//! multipart body is built here (CRLF, `Content-ID` = index + 1, escaped keys, `If-Match`
//! on every replace and delete) and sent through the crates' signed pipeline; the response
//! is parsed here, every sub-response checked, and the failing index recovered.

use azure_core::Url;

use super::entity::{ascii_json, escape_quotes, to_json};
use super::error::classify;
use crate::store::error::{StoreError, StoreResult};
use crate::store::table::{BatchOp, IfMatch, MAX_BATCH_BYTES};
use crate::store::value::ETag;

/// A ready `$batch` request body.
pub(crate) struct BatchBody {
    /// `multipart/mixed; boundary=batch_…`
    pub content_type: String,
    pub body: String,
}

/// `{base}/{segment}`, the segment percent-encoded once.
pub(crate) fn url_with_segment(base: &Url, segment: &str) -> StoreResult<Url> {
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| StoreError::Other("table endpoint URL cannot take a path".into()))?
        .pop_if_empty()
        .push(segment);
    Ok(url)
}

/// The address of one entity: `{base}/{table}(PartitionKey='…',RowKey='…')`, quotes doubled,
/// everything else percent-encoded once by the URL library.
pub(crate) fn entity_url(base: &Url, table: &str, partition_key: &str, row_key: &str) -> StoreResult<Url> {
    url_with_segment(
        base,
        &format!("{table}(PartitionKey='{}',RowKey='{}')", escape_quotes(partition_key), escape_quotes(row_key)),
    )
}

fn if_match_value(m: &IfMatch) -> &str {
    match m {
        IfMatch::Any => "*",
        IfMatch::Etag(ETag(e)) => e,
    }
}

/// Builds the body of an entity group transaction. Fails with `InvalidInput` when it would
/// exceed [`MAX_BATCH_BYTES`]. The caller has run `validate_batch` already.
pub(crate) fn build(base: &Url, table: &str, partition_key: &str, ops: &[BatchOp]) -> StoreResult<BatchBody> {
    let batch = format!("batch_{}", crate::env::uuid());
    let changeset = format!("changeset_{}", crate::env::uuid());
    let mut body = String::new();
    body.push_str(&format!("--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n"));
    for (index, op) in ops.iter().enumerate() {
        let (method, url, if_match, entity) = match op {
            BatchOp::Insert(e) => ("POST", url_with_segment(base, table)?, None, Some(e)),
            BatchOp::Upsert(e) => ("PUT", entity_url(base, table, partition_key, &e.row_key)?, None, Some(e)),
            BatchOp::Replace(e, m) => ("PUT", entity_url(base, table, partition_key, &e.row_key)?, Some(m), Some(e)),
            BatchOp::Delete { row_key, if_match } => {
                ("DELETE", entity_url(base, table, partition_key, row_key)?, Some(if_match), None)
            }
        };
        body.push_str(&format!(
            "--{changeset}\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n\
             {method} {url} HTTP/1.1\r\nContent-ID: {}\r\nAccept: application/json;odata=minimalmetadata\r\n\
             DataServiceVersion: 3.0;\r\n",
            index + 1
        ));
        if let Some(m) = if_match {
            body.push_str(&format!("If-Match: {}\r\n", if_match_value(m)));
        }
        match entity {
            Some(e) => {
                let json = serde_json::to_string(&to_json(e)?)
                    .map(|j| ascii_json(&j))
                    .map_err(|_| StoreError::InvalidInput(format!("batch: operation {index} cannot be serialized")))?;
                if matches!(op, BatchOp::Insert(_)) {
                    body.push_str("Prefer: return-no-content\r\n");
                }
                body.push_str(&format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}\r\n",
                    json.len()
                ));
            }
            None => body.push_str("\r\n"),
        }
        if body.len() > MAX_BATCH_BYTES {
            return Err(StoreError::InvalidInput(format!(
                "batch: the request body exceeds {MAX_BATCH_BYTES} bytes at operation {index} \
                 (entity group transactions are limited to 4 MiB)"
            )));
        }
    }
    body.push_str(&format!("--{changeset}--\r\n--{batch}--\r\n"));
    if body.len() > MAX_BATCH_BYTES {
        return Err(StoreError::InvalidInput(format!("batch: the request body exceeds {MAX_BATCH_BYTES} bytes")));
    }
    Ok(BatchBody { content_type: format!("multipart/mixed; boundary={batch}"), body })
}

/// One sub-response of a `$batch` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubResponse {
    pub status: u16,
    pub content_id: Option<usize>,
    pub etag: Option<String>,
    pub code: Option<String>,
    pub message: Option<String>,
}

/// Splits a multipart `$batch` reply into its HTTP sub-responses. `content_type` is the
/// outer `Content-Type` header (its boundary); nested boundaries are read from the body.
pub(crate) fn parse_response(content_type: Option<&str>, body: &str) -> Vec<SubResponse> {
    let mut boundaries: Vec<String> = content_type.and_then(boundary_of).into_iter().collect();
    for line in body.lines() {
        if line.to_ascii_lowercase().starts_with("content-type: multipart/mixed") {
            boundaries.extend(boundary_of(line));
        }
    }
    let is_boundary = |line: &str| {
        let line = line.trim_end();
        boundaries.iter().any(|b| line == format!("--{b}") || line == format!("--{b}--"))
            || (boundaries.is_empty()
                && (line.starts_with("--batchresponse_") || line.starts_with("--changesetresponse_")))
    };
    let mut parts: Vec<Vec<&str>> = vec![Vec::new()];
    for line in body.lines() {
        if is_boundary(line) {
            parts.push(Vec::new());
        } else if let Some(last) = parts.last_mut() {
            last.push(line.trim_end_matches('\r'));
        }
    }
    parts.iter().filter_map(|p| parse_part(p)).collect()
}

fn boundary_of(content_type: &str) -> Option<String> {
    let lower = content_type.to_ascii_lowercase();
    let at = lower.find("boundary=")? + "boundary=".len();
    let b = content_type[at..].split(';').next()?.trim().trim_matches('"');
    (!b.is_empty()).then(|| b.to_string())
}

fn parse_part(lines: &[&str]) -> Option<SubResponse> {
    let start = lines.iter().position(|l| l.starts_with("HTTP/1."))?;
    let status = lines[start].split_whitespace().nth(1)?.parse().ok()?;
    let mut sub = SubResponse { status, content_id: None, etag: None, code: None, message: None };
    let mut i = start + 1;
    while i < lines.len() && !lines[i].trim().is_empty() {
        if let Some((name, value)) = lines[i].split_once(':') {
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-id" => sub.content_id = value.parse().ok(),
                "etag" => sub.etag = Some(value.to_string()),
                "x-ms-error-code" => sub.code = Some(value.to_string()),
                _ => {}
            }
        }
        i += 1;
    }
    let body = lines.get(i..).unwrap_or_default().join("\n");
    let (code, message) = error_details(body.trim());
    sub.code = sub.code.or(code);
    sub.message = message;
    Some(sub)
}

/// Error code and message of a JSON (`odata.error`) or XML (`<Error>`) error body.
fn error_details(body: &str) -> (Option<String>, Option<String>) {
    if body.is_empty() {
        return (None, None);
    }
    if let Ok(json) = serde_json::from_str::<serde_json::Value>(body) {
        let err = json.get("odata.error").or_else(|| json.get("error")).unwrap_or(&json);
        let code = err.get("code").and_then(|c| c.as_str()).map(String::from);
        let message =
            err.get("message").and_then(|m| m.get("value").or(Some(m))).and_then(|m| m.as_str()).map(String::from);
        return (code, message);
    }
    (xml_element(body, "code"), xml_element(body, "message"))
}

/// Text of the first `<name>` or `<prefix:name>` element (case-insensitive), for XML error
/// bodies.
fn xml_element(body: &str, name: &str) -> Option<String> {
    // ASCII lowercasing keeps byte offsets, so positions in `lower` index `body` too.
    let lower = body.to_ascii_lowercase();
    for open in [format!("<{name}>"), format!(":{name}>")] {
        let mut from = 0;
        while let Some(pos) = lower[from..].find(&open) {
            let at = from + pos;
            let start = at + open.len();
            from = start;
            if open.starts_with(':') {
                // `<m:code>` is an opening tag, `</m:code>` is not.
                match lower[..at].rfind('<') {
                    Some(tag) if !lower[tag..].starts_with("</") => {}
                    _ => continue,
                }
            }
            let rest = &body[start..];
            let text = rest[..rest.find("</").unwrap_or(rest.len())].trim();
            return (!text.is_empty()).then(|| text.to_string());
        }
    }
    None
}

/// Turns the sub-responses of a batch of `ops_len` operations into one ETag per operation
/// (`None` for deletes), or the failure with its operation index.
pub(crate) fn interpret(ops: &[BatchOp], subs: &[SubResponse], what: &str) -> StoreResult<Vec<Option<ETag>>> {
    if let Some((position, failed)) = subs.iter().enumerate().find(|(_, s)| !(200..300).contains(&s.status)) {
        let index = failed
            .content_id
            .and_then(|id| id.checked_sub(1))
            .or_else(|| failed.message.as_deref().and_then(index_prefix))
            .unwrap_or(if ops.len() == 1 { 0 } else { position });
        let source = classify(failed.status, failed.code.as_deref(), failed.message.as_deref(), what);
        return Err(StoreError::BatchFailed { index, source: Box::new(source) });
    }
    if subs.len() != ops.len() {
        return Err(StoreError::Other(format!(
            "{what}: the service answered {} of {} operations; the outcome is unknown",
            subs.len(),
            ops.len()
        )));
    }
    let mut etags: Vec<Option<ETag>> = vec![None; ops.len()];
    for (position, sub) in subs.iter().enumerate() {
        let index = sub.content_id.and_then(|id| id.checked_sub(1)).filter(|&i| i < ops.len()).unwrap_or(position);
        etags[index] = sub.etag.clone().map(ETag);
    }
    for (index, op) in ops.iter().enumerate() {
        match (op, &etags[index]) {
            (BatchOp::Delete { .. }, _) => etags[index] = None,
            (_, None) => {
                return Err(StoreError::Other(format!("{what}: operation {index} succeeded without returning an ETag")))
            }
            _ => {}
        }
    }
    Ok(etags)
}

/// The `N:` index prefix the service puts on the message of a failed batch operation.
fn index_prefix(message: &str) -> Option<usize> {
    let (n, _) = message.split_once(':')?;
    n.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::value::Entity;

    fn base() -> Url {
        Url::parse("http://127.0.0.1:10002/devstoreaccount1").unwrap()
    }

    #[test]
    fn entity_urls_double_quotes_and_encode_once() {
        let url = entity_url(&base(), "t", "it's", "100% a+b é").unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:10002/devstoreaccount1/t(PartitionKey='it''s',RowKey='100%25%20a+b%20%C3%A9')"
        );
        let root = Url::parse("https://acct.table.core.windows.net/").unwrap();
        assert_eq!(url_with_segment(&root, "t").unwrap().as_str(), "https://acct.table.core.windows.net/t");
    }

    #[test]
    fn body_has_if_match_on_every_replace_and_delete() {
        let ops = vec![
            BatchOp::Insert(Entity::new("p", "a")),
            BatchOp::Upsert(Entity::new("p", "b")),
            BatchOp::Replace(Entity::new("p", "c'"), IfMatch::Any),
            BatchOp::Delete { row_key: "d".into(), if_match: IfMatch::Etag(ETag("W/\"x\"".into())) },
        ];
        let b = build(&base(), "t", "p", &ops).unwrap();
        assert!(b.content_type.starts_with("multipart/mixed; boundary=batch_"));
        assert_eq!(b.body.matches("If-Match: ").count(), 2);
        assert!(b.body.contains("RowKey='c'''"), "quote doubled in the batch URL");
        assert!(b.body.contains("Content-ID: 4\r\n"));
        assert!(!b.body.replace("\r\n", "").contains('\n'), "CRLF line endings only");
    }

    #[test]
    fn failed_batch_reports_the_index_from_content_id_or_message() {
        let reply = "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_2\r\n\r\n\
            --changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n\
            HTTP/1.1 409 Conflict\r\nContent-ID: 51\r\nContent-Type: application/json;odata=minimalmetadata;charset=utf-8\r\n\r\n\
            {\"odata.error\":{\"code\":\"EntityAlreadyExists\",\"message\":{\"lang\":\"en-US\",\"value\":\"50:The specified entity already exists.\\nRequestId:x\"}}}\r\n\
            --changesetresponse_2--\r\n--batchresponse_1--\r\n";
        let subs = parse_response(Some("multipart/mixed; boundary=batchresponse_1"), reply);
        assert_eq!(subs.len(), 1);
        assert_eq!(subs[0].code.as_deref(), Some("EntityAlreadyExists"));
        let ops: Vec<BatchOp> = (0..100).map(|i| BatchOp::Insert(Entity::new("p", format!("{i}")))).collect();
        match interpret(&ops, &subs, "batch") {
            Err(StoreError::BatchFailed { index: 50, source }) => {
                assert!(matches!(*source, StoreError::AlreadyExists(_)))
            }
            other => panic!("{other:?}"),
        }
        let without_id = reply.replace("Content-ID: 51\r\n", "");
        let subs = parse_response(None, &without_id);
        assert!(matches!(interpret(&ops, &subs, "batch"), Err(StoreError::BatchFailed { index: 50, .. })));
        let xml = "HTTP/1.1 412 Precondition Failed\r\n\r\n<?xml version=\"1.0\"?><Error><Code>UpdateConditionNotSatisfied</Code><Message>7:stale</Message></Error>";
        let subs = parse_response(None, xml);
        match interpret(&ops, &subs, "batch") {
            Err(StoreError::BatchFailed { index: 7, source }) => {
                assert!(matches!(*source, StoreError::PreconditionFailed(_)))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn successful_batch_needs_every_response() {
        let ops = vec![
            BatchOp::Insert(Entity::new("p", "a")),
            BatchOp::Delete { row_key: "b".into(), if_match: IfMatch::Any },
        ];
        let ok = |id: usize, status: u16, etag: Option<&str>| SubResponse {
            status,
            content_id: Some(id),
            etag: etag.map(String::from),
            code: None,
            message: None,
        };
        let subs = vec![ok(1, 204, Some("W/\"1\"")), ok(2, 204, None)];
        assert_eq!(interpret(&ops, &subs, "b").unwrap(), vec![Some(ETag("W/\"1\"".into())), None]);
        assert!(matches!(interpret(&ops, &subs[..1], "b"), Err(StoreError::Other(_))));
    }
}
