//! A minimal HTTP/1.1 client over a TCP stream, for what the host itself sends to the handler:
//! the readiness probe (`GET /`) and invocation requests (`POST /{function}`), whose body the
//! host streams without a precomputed length (`Transfer-Encoding: chunked`, contract §2).
//! reqwest (without its `stream` feature) always sends a Content-Length, hence this.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response as read off the wire.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    /// First header value named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Sends one request on a new connection (`Connection: close`) and reads the whole response.
/// With `chunked`, the body is sent with `Transfer-Encoding: chunked` in 16 KiB chunks.
pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: Option<&[u8]>,
    chunked: bool,
    timeout: Duration,
) -> io::Result<RawResponse> {
    let fut = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        match body {
            Some(_) if chunked => head.push_str("Transfer-Encoding: chunked\r\n"),
            Some(b) => head.push_str(&format!("Content-Length: {}\r\n", b.len())),
            None => {}
        }
        head.push_str("Connection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await?;
        if let Some(b) = body {
            if chunked {
                for chunk in b.chunks(16 * 1024) {
                    stream.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await?;
                    stream.write_all(chunk).await?;
                    stream.write_all(b"\r\n").await?;
                }
                stream.write_all(b"0\r\n\r\n").await?;
            } else {
                stream.write_all(b).await?;
            }
        }
        stream.flush().await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        parse_response(&raw)
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no response in time"))?
}

/// Parses a complete HTTP/1.1 response (Content-Length, chunked, or read-to-close body).
pub fn parse_response(raw: &[u8]) -> io::Result<RawResponse> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| invalid("no complete response head"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| invalid("response head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    if !parts.next().unwrap_or_default().starts_with("HTTP/1.") {
        return Err(invalid(format!("not an HTTP response: {status_line:?}")));
    }
    let status: u16 = parts.next().and_then(|s| s.parse().ok()).ok_or_else(|| invalid("bad status code"))?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let rest = &raw[end + 4..];
    let header = |n: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.clone());
    let body = if header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        decode_chunked(rest)?
    } else if let Some(len) = header("content-length") {
        let len: usize = len.parse().map_err(|_| invalid("bad Content-Length"))?;
        if rest.len() < len {
            return Err(invalid(format!("body shorter ({}) than Content-Length {len}", rest.len())));
        }
        rest[..len].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(RawResponse { status, headers, body })
}

fn decode_chunked(mut rest: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let nl = rest.windows(2).position(|w| w == b"\r\n").ok_or_else(|| invalid("truncated chunk size"))?;
        let size_text = std::str::from_utf8(&rest[..nl]).map_err(|_| invalid("bad chunk size"))?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| invalid(format!("bad chunk size {size_text:?}")))?;
        rest = &rest[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size + 2 {
            return Err(invalid("truncated chunk"));
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_length_and_chunked_responses() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
            .unwrap();
        assert_eq!(
            (r.status, r.header("Content-Type"), r.body.as_slice()),
            (200, Some("application/json"), &b"{}"[..])
        );
        let r = parse_response(b"HTTP/1.1 500 X\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (500, &b"abcde"[..]));
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
    }
}
