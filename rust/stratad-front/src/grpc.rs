//! The gRPC-over-HTTP/2 wire details: message framing, metadata, deadlines
//! and statuses (github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md).

use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine as _;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::Body;
use http_body_util::BodyExt;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use crate::call::{MetadataValue, Status};

/// gRPC status codes (the ones this crate answers with itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// Headers of the protocol itself: not metadata a handler sees.
const RESERVED: [&str; 6] = [
    "content-type",
    "te",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-accept-encoding",
    "host",
];

/// Is this request a gRPC call we can serve natively (uncompressed)?
pub fn is_plain_grpc(headers: &HeaderMap) -> bool {
    let grpc = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    let identity = headers
        .get("grpc-encoding")
        .map(|v| v.as_bytes() == b"identity")
        .unwrap_or(true);
    grpc && identity
}

/// The call's metadata as a handler sees it: `-bin` values base64-decoded.
pub fn metadata_of(headers: &HeaderMap) -> Result<Vec<(String, MetadataValue)>, String> {
    let mut out = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let key = name.as_str();
        if RESERVED.contains(&key) {
            continue;
        }
        let value = if key.ends_with("-bin") {
            let raw = value.as_bytes();
            let decoded = STANDARD_NO_PAD
                .decode(
                    raw.strip_suffix(b"==")
                        .or(raw.strip_suffix(b"="))
                        .unwrap_or(raw),
                )
                .map_err(|_| format!("metadata {key} is not valid base64"))?;
            MetadataValue::Binary(decoded)
        } else {
            match value.to_str() {
                Ok(text) => MetadataValue::Text(text.to_owned()),
                Err(_) => return Err(format!("metadata {key} is not printable ASCII")),
            }
        };
        out.push((key.to_owned(), value));
    }
    Ok(out)
}

/// The header value that carries one metadata value (`-bin` keys: base64).
pub fn metadata_header(key: &str, value: &MetadataValue) -> Result<HeaderValue, String> {
    let value = match value {
        MetadataValue::Binary(bytes) if key.ends_with("-bin") => {
            HeaderValue::from_str(&STANDARD_NO_PAD.encode(bytes))
        }
        MetadataValue::Text(text) if !key.ends_with("-bin") => HeaderValue::from_str(text),
        _ => {
            return Err(format!(
                "metadata {key}: bytes go with -bin keys, text with others"
            ))
        }
    };
    value.map_err(|_| format!("metadata {key} is not printable ASCII"))
}

/// The deadline a `grpc-timeout` header sets ("100m" = 100 ms); None if absent.
pub fn deadline_of(headers: &HeaderMap, now: Instant) -> Result<Option<Instant>, String> {
    let Some(value) = headers.get("grpc-timeout") else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| "bad grpc-timeout".to_owned())?;
    let bad = || format!("bad grpc-timeout {text:?}");
    if text.len() < 2 || text.len() > 9 {
        return Err(bad());
    }
    let (digits, unit) = text.split_at(text.len() - 1);
    let amount: u64 = digits.parse().map_err(|_| bad())?;
    let timeout = match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return Err(bad()),
    };
    Ok(Some(
        now.checked_add(timeout)
            .unwrap_or(now + Duration::from_secs(86400 * 365)),
    ))
}

/// Reads length-prefixed messages from a request body.
pub struct MessageReader<B> {
    body: B,
    buffer: BytesMut,
    max_bytes: usize,
    ended: bool,
}

impl<B> MessageReader<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    pub fn new(body: B, max_bytes: usize) -> Self {
        MessageReader {
            body,
            buffer: BytesMut::new(),
            max_bytes,
            ended: false,
        }
    }

    /// The next message, None at the end of the stream, or the status to end
    /// the call with (a message too large, a compressed one, a cut frame).
    pub async fn next(&mut self) -> Result<Option<Bytes>, Status> {
        loop {
            if let Some(message) = self.parse()? {
                return Ok(Some(message));
            }
            if self.ended {
                return if self.buffer.is_empty() {
                    Ok(None)
                } else {
                    Err(Status::new(
                        Code::Internal,
                        "request stream ended inside a message",
                    ))
                };
            }
            match self.body.frame().await {
                None => self.ended = true,
                Some(Err(e)) => {
                    return Err(Status::new(
                        Code::Cancelled,
                        format!("request stream failed: {e}"),
                    ))
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    fn parse(&mut self) -> Result<Option<Bytes>, Status> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let compressed = self.buffer[0];
        let length = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if compressed != 0 {
            return Err(Status::new(
                Code::Internal,
                "compressed message without a grpc-encoding",
            ));
        }
        if length > self.max_bytes {
            return Err(Status::new(
                Code::ResourceExhausted,
                format!(
                    "Received message larger than max ({length} vs. {})",
                    self.max_bytes
                ),
            ));
        }
        if self.buffer.len() < 5 + length {
            self.buffer.reserve(5 + length - self.buffer.len());
            return Ok(None);
        }
        self.buffer.advance(5);
        Ok(Some(self.buffer.split_to(length).freeze()))
    }
}

/// One message as it goes on the wire: uncompressed flag, length, bytes.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.extend_from_slice(message);
    out.freeze()
}

/// What grpc-message must percent-encode: controls, non-ASCII, and '%'.
const MESSAGE_ESCAPES: &AsciiSet = &CONTROLS.add(b'%');

/// The trailers that carry `status` (or the headers of a Trailers-Only answer).
pub fn status_headers(status: &Status, into: &mut HeaderMap) {
    into.insert("grpc-status", HeaderValue::from(status.code));
    if !status.message.is_empty() {
        let encoded = utf8_percent_encode(&status.message, MESSAGE_ESCAPES).to_string();
        if let Ok(value) = HeaderValue::from_str(&encoded) {
            into.insert("grpc-message", value);
        }
    }
    for (key, value) in &status.trailers {
        let Ok(name) = HeaderName::from_bytes(key.as_bytes()) else {
            continue;
        };
        let value = match value {
            MetadataValue::Binary(bytes) => HeaderValue::from_str(&STANDARD.encode(bytes)),
            MetadataValue::Text(text) => HeaderValue::from_str(text),
        };
        if let Ok(value) = value {
            into.append(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A request body that yields the given chunks as data frames.
    struct Chunks(VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|c| Ok(http_body::Frame::data(c))))
        }
    }

    fn reader(chunks: &[&[u8]], max: usize) -> MessageReader<Chunks> {
        let chunks = chunks.iter().map(|c| Bytes::copy_from_slice(c)).collect();
        MessageReader::new(Chunks(chunks), max)
    }

    fn block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn messages_split_across_frames_are_reassembled() {
        let wire = [
            frame(b"hello").to_vec(),
            frame(b"").to_vec(),
            frame(b"world!").to_vec(),
        ]
        .concat();
        let (a, b) = wire.split_at(3);
        let (b, c) = b.split_at(9);
        let mut r = reader(&[a, b, c], 100);
        block(async {
            assert_eq!(
                r.next().await.unwrap().unwrap(),
                Bytes::from_static(b"hello")
            );
            assert_eq!(r.next().await.unwrap().unwrap(), Bytes::new());
            assert_eq!(
                r.next().await.unwrap().unwrap(),
                Bytes::from_static(b"world!")
            );
            assert!(r.next().await.unwrap().is_none());
        });
    }

    #[test]
    fn oversized_compressed_and_cut_messages_are_refused() {
        let big = frame(&[7u8; 11]);
        let err = block(reader(&[&big], 10).next()).unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted as u32);
        let mut compressed = frame(b"x").to_vec();
        compressed[0] = 1;
        let err = block(reader(&[&compressed], 10).next()).unwrap_err();
        assert_eq!(err.code, Code::Internal as u32);
        let cut = &frame(b"abcdef")[..8];
        let err = block(reader(&[cut], 10).next()).unwrap_err();
        assert_eq!(err.code, Code::Internal as u32);
    }

    #[test]
    fn timeouts_parse_and_garbage_is_refused() {
        let now = Instant::now();
        let mut h = HeaderMap::new();
        h.insert("grpc-timeout", HeaderValue::from_static("250m"));
        assert_eq!(
            deadline_of(&h, now).unwrap(),
            Some(now + Duration::from_millis(250))
        );
        h.insert("grpc-timeout", HeaderValue::from_static("2S"));
        assert_eq!(
            deadline_of(&h, now).unwrap(),
            Some(now + Duration::from_secs(2))
        );
        h.insert("grpc-timeout", HeaderValue::from_static("12x"));
        assert!(deadline_of(&h, now).is_err());
        assert_eq!(deadline_of(&HeaderMap::new(), now).unwrap(), None);
    }

    #[test]
    fn metadata_skips_protocol_headers_and_decodes_binary_values() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/grpc"));
        h.insert("x-stratad-tenant", HeaderValue::from_static("acme"));
        h.insert("trace-bin", HeaderValue::from_static("AAEC"));
        let mut m = metadata_of(&h).unwrap();
        m.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            m,
            vec![
                ("trace-bin".to_owned(), MetadataValue::Binary(vec![0, 1, 2])),
                (
                    "x-stratad-tenant".to_owned(),
                    MetadataValue::Text("acme".to_owned())
                ),
            ]
        );
    }

    #[test]
    fn status_messages_are_percent_encoded() {
        let mut h = HeaderMap::new();
        let status = Status {
            code: 3,
            message: "bad 100% \u{e9}\n".to_owned(),
            trailers: vec![("d-bin".to_owned(), MetadataValue::Binary(vec![255]))],
        };
        status_headers(&status, &mut h);
        assert_eq!(h["grpc-status"], "3");
        assert_eq!(h["grpc-message"], "bad 100%25 %C3%A9%0A");
        assert_eq!(h["d-bin"], "/w==");
    }
}
