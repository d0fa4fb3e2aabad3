//! The one place where storage-service failures become [`StoreError`]s.
//!
//! `azure_core`'s `HttpError` prints the whole response body and all headers in its
//! `Display`, and transport errors print the request URL (which carries the SAS token when
//! one is used). Nothing here formats those: messages are built from the status, the
//! service error code and the first line of the service message only.

use azure_core::error::ErrorKind;

use crate::store::error::StoreError;

/// Longest service message kept in an error, in characters.
const MAX_MESSAGE_CHARS: usize = 160;

/// Maps an HTTP failure (status, service error code, service message) to a [`StoreError`].
///
/// This is the only status-to-variant mapping of the backend: [`map_error`] calls it for
/// failed requests and the `$batch` code for failed sub-responses.
pub(crate) fn classify(status: u16, code: Option<&str>, message: Option<&str>, what: &str) -> StoreError {
    let code = code.filter(|c| !c.is_empty());
    let mut text = format!("{what}: HTTP {status}");
    if let Some(code) = code {
        text.push(' ');
        text.push_str(&sanitize(code, 64));
    }
    if let Some(message) = message.map(|m| sanitize(m, MAX_MESSAGE_CHARS)).filter(|m| !m.is_empty()) {
        text.push_str(": ");
        text.push_str(&message);
    }
    let code_is = |c: &str| code.is_some_and(|have| have.eq_ignore_ascii_case(c));
    match status {
        404 => StoreError::NotFound(text),
        409 if code_is("TableBeingDeleted") || code_is("QueueBeingDeleted") => StoreError::Unavailable(text),
        409 => StoreError::AlreadyExists(text),
        412 => StoreError::PreconditionFailed(text),
        400 if code_is("PopReceiptMismatch") => StoreError::PreconditionFailed(text),
        400 | 411 | 413 | 414 | 415 | 416 => StoreError::InvalidInput(text),
        408 | 429 | 500..=599 => StoreError::Unavailable(text),
        _ => StoreError::Other(text),
    }
}

/// Maps an `azure_core` error to a [`StoreError`] without leaking bodies, URLs or secrets.
pub(crate) fn map_error(err: &azure_core::Error, what: &str) -> StoreError {
    match err.kind() {
        ErrorKind::HttpResponse { status, error_code } => {
            let http = err.as_http_error();
            let code = error_code.as_deref().or_else(|| http.and_then(|h| h.error_code()));
            let message = http.and_then(|h| h.error_message());
            classify(*status as u16, code, message, what)
        }
        ErrorKind::Io => {
            let detail = io_kind(err).map(|k| format!(" ({k:?})")).unwrap_or_default();
            StoreError::Unavailable(format!("{what}: connection to the storage service failed{detail}"))
        }
        // A managed-identity token failure (its message is ours and safe): transient, the
        // store's retry policy tries again.
        ErrorKind::Credential => match find_source::<super::identity::IdentityError>(err) {
            Some(e) => StoreError::Unavailable(format!("{what}: {e}")),
            None => StoreError::Other(format!("{what}: the request could not be signed (check the account key)")),
        },
        ErrorKind::DataConversion => {
            StoreError::Other(format!("{what}: unexpected response from the storage service (could not decode it)"))
        }
        _ => StoreError::Other(format!("{what}: storage client error")),
    }
}

/// The status and service error code of an HTTP failure, if `err` is one.
pub(crate) fn http_status(err: &azure_core::Error) -> Option<(u16, Option<&str>)> {
    match err.kind() {
        ErrorKind::HttpResponse { status, error_code } => Some((*status as u16, error_code.as_deref())),
        _ => None,
    }
}

/// The first error of type `T` in the source chain of `err` (`err` itself included).
fn find_source<T: std::error::Error + 'static>(err: &azure_core::Error) -> Option<&T> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = err.get_ref().map(|e| e as _);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

/// The `std::io::ErrorKind` somewhere in the source chain (e.g. `ConnectionRefused`).
fn io_kind(err: &azure_core::Error) -> Option<std::io::ErrorKind> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        current = e.source();
    }
    None
}

/// First line of `s`, control characters removed, at most `max` characters.
fn sanitize(s: &str, max: usize) -> String {
    let line = s.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let mut out: String = line.chars().filter(|c| !c.is_control()).take(max).collect();
    if line.chars().count() > max {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_semantic_variants() {
        let c = |s, code| classify(s, code, Some("msg\nRequestId:123\nTime:now"), "op");
        assert!(matches!(c(404, Some("ResourceNotFound")), StoreError::NotFound(_)));
        assert!(matches!(c(409, Some("EntityAlreadyExists")), StoreError::AlreadyExists(_)));
        assert!(matches!(c(409, Some("TableBeingDeleted")), StoreError::Unavailable(_)));
        assert!(matches!(c(412, Some("UpdateConditionNotSatisfied")), StoreError::PreconditionFailed(_)));
        assert!(matches!(c(400, Some("PopReceiptMismatch")), StoreError::PreconditionFailed(_)));
        assert!(matches!(c(400, Some("InvalidInput")), StoreError::InvalidInput(_)));
        assert!(matches!(c(413, Some("RequestBodyTooLarge")), StoreError::InvalidInput(_)));
        for s in [408, 429, 500, 502, 503, 504] {
            assert!(c(s, None).is_transient(), "{s}");
        }
        assert!(matches!(c(403, Some("AuthorizationFailure")), StoreError::Other(_)));
        let text = c(409, Some("EntityAlreadyExists")).to_string();
        assert!(text.contains("HTTP 409 EntityAlreadyExists: msg"), "{text}");
        assert!(!text.contains("RequestId"), "only the first line is kept: {text}");
    }

    #[test]
    fn long_messages_are_cut() {
        let long = "x".repeat(1000);
        let text = classify(500, None, Some(&long), "op").to_string();
        assert!(text.len() < 300, "{text}");
    }
}
