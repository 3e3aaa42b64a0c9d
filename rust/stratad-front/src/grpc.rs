//! The gRPC-over-HTTP/2 wire details: message framing, metadata, deadlines
//! and statuses (github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md).

use std::io::Read as _;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine as _;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::Body;
use http_body_util::BodyExt;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use crate::status::{Code, MetadataValue, Status};

/// Headers of the protocol itself: not metadata a handler sees.
const RESERVED: [&str; 6] = [
    "content-type",
    "te",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-accept-encoding",
    "host",
];

/// Is this request a gRPC call (by its content type)?
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The message encodings served, as `grpc-accept-encoding` lists them.
pub const ACCEPT_ENCODING: &str = "identity,deflate,gzip";

/// A message encoding (gRPC's name for a compression algorithm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Deflate,
    Gzip,
}

impl Encoding {
    fn named(name: &str) -> Option<Encoding> {
        match name.trim() {
            "identity" => Some(Encoding::Identity),
            "deflate" => Some(Encoding::Deflate),
            "gzip" => Some(Encoding::Gzip),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Encoding::Identity => "identity",
            Encoding::Deflate => "deflate",
            Encoding::Gzip => "gzip",
        }
    }

    /// `data` compressed with this encoding (identity: unchanged).
    pub fn compress(self, data: &[u8]) -> Bytes {
        let level = flate2::Compression::fast();
        let result = match self {
            Encoding::Identity => return Bytes::copy_from_slice(data),
            Encoding::Gzip => {
                let mut out = Vec::new();
                flate2::read::GzEncoder::new(data, level)
                    .read_to_end(&mut out)
                    .map(|_| out)
            }
            Encoding::Deflate => {
                let mut out = Vec::new();
                flate2::read::ZlibEncoder::new(data, level)
                    .read_to_end(&mut out)
                    .map(|_| out)
            }
        };
        // Reading from a slice into a Vec cannot fail.
        Bytes::from(result.unwrap_or_default())
    }

    /// `data` decompressed, refusing to produce more than `max_bytes`.
    pub fn decompress(self, data: &[u8], max_bytes: usize) -> Result<Bytes, Status> {
        let limit = max_bytes as u64 + 1;
        let mut out = Vec::new();
        let read = match self {
            Encoding::Identity => return Ok(Bytes::copy_from_slice(data)),
            Encoding::Gzip => flate2::read::GzDecoder::new(data)
                .take(limit)
                .read_to_end(&mut out),
            Encoding::Deflate => flate2::read::ZlibDecoder::new(data)
                .take(limit)
                .read_to_end(&mut out),
        };
        if let Err(e) = read {
            return Err(Status::new(
                Code::Internal,
                format!("request message is not valid {}: {e}", self.name()),
            ));
        }
        if out.len() > max_bytes {
            return Err(Status::new(
                Code::ResourceExhausted,
                format!(
                    "Received message larger than max (more than {max_bytes} bytes once decompressed)"
                ),
            ));
        }
        Ok(Bytes::from(out))
    }
}

/// The encoding of the request's messages (`grpc-encoding`; none: identity),
/// or the status for one not served (UNIMPLEMENTED, as the gRPC spec says).
pub fn request_encoding(headers: &HeaderMap) -> Result<Encoding, Status> {
    let Some(value) = headers.get("grpc-encoding") else {
        return Ok(Encoding::Identity);
    };
    let name = String::from_utf8_lossy(value.as_bytes());
    Encoding::named(&name).ok_or_else(|| {
        Status::new(
            Code::Unimplemented,
            format!("grpc-encoding {name:?} is not supported (supported: {ACCEPT_ENCODING})"),
        )
    })
}

/// The encoding to compress answers with if the handler asks for compression:
/// the best one the client lists in `grpc-accept-encoding` (None: identity only).
pub fn response_encoding(headers: &HeaderMap) -> Option<Encoding> {
    let accepted: Vec<Encoding> = headers
        .get_all("grpc-accept-encoding")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(Encoding::named)
        .collect();
    [Encoding::Gzip, Encoding::Deflate]
        .into_iter()
        .find(|e| accepted.contains(e))
}

/// The call's metadata as a handler sees it: `-bin` values base64-decoded.
/// A value that is neither (non-ASCII text, bad base64) is the caller's
/// mistake: INVALID_ARGUMENT naming the key.
pub fn metadata_of(headers: &HeaderMap) -> Result<Vec<(String, MetadataValue)>, Status> {
    metadata_values(headers).map_err(|e| Status::new(Code::InvalidArgument, e))
}

fn metadata_values(headers: &HeaderMap) -> Result<Vec<(String, MetadataValue)>, String> {
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
/// The spec allows 8 digits; more are read too (a deadline far away), as
/// grpc-core does, rather than failing a call over its padding.
pub fn deadline_of(headers: &HeaderMap, now: Instant) -> Result<Option<Instant>, Status> {
    deadline_value(headers, now).map_err(|e| Status::new(Code::Internal, e))
}

fn deadline_value(headers: &HeaderMap, now: Instant) -> Result<Option<Instant>, String> {
    let Some(value) = headers.get("grpc-timeout") else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| "malformed grpc-timeout".to_owned())?;
    let bad = || format!("malformed grpc-timeout {text:?}");
    if text.len() < 2 || text.len() > 21 || !text.is_ascii() {
        return Err(bad());
    }
    let (digits, unit) = text.split_at(text.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let amount: u64 = digits.parse().unwrap_or(u64::MAX);
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

/// One request message, decompressed; `compressed`: it arrived compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub bytes: Bytes,
    pub compressed: bool,
}

/// Reads length-prefixed messages from a request body.
pub struct MessageReader<B> {
    body: B,
    buffer: BytesMut,
    max_bytes: usize,
    encoding: Encoding,
    ended: bool,
}

impl<B> MessageReader<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    /// Messages of at most `max_bytes` (compressed and decompressed), sent
    /// with `encoding` (`grpc-encoding`) when their flag says compressed.
    pub fn new(body: B, max_bytes: usize, encoding: Encoding) -> Self {
        MessageReader {
            body,
            buffer: BytesMut::new(),
            max_bytes,
            encoding,
            ended: false,
        }
    }

    /// The next message, None at the end of the stream, or the status to end
    /// the call with (a message too large, a cut frame, bad compression).
    pub async fn next(&mut self) -> Result<Option<Message>, Status> {
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

    fn parse(&mut self) -> Result<Option<Message>, Status> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let compressed = match self.buffer[0] {
            0 => false,
            1 => true,
            flag => {
                return Err(Status::new(
                    Code::Internal,
                    format!("bad message flag {flag} (0 or 1)"),
                ))
            }
        };
        let length = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if compressed && self.encoding == Encoding::Identity {
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
        let raw = self.buffer.split_to(length).freeze();
        let bytes = if compressed {
            self.encoding.decompress(&raw, self.max_bytes)?
        } else {
            raw
        };
        Ok(Some(Message { bytes, compressed }))
    }
}

/// One message as it goes on the wire: compressed flag, length, bytes
/// (compressed with `encoding` unless it is identity).
pub fn frame(message: &[u8], encoding: Encoding) -> Bytes {
    let compressed = encoding != Encoding::Identity;
    let packed;
    let body: &[u8] = if compressed {
        packed = encoding.compress(message);
        &packed
    } else {
        message
    };
    let mut out = BytesMut::with_capacity(5 + body.len());
    out.put_u8(u8::from(compressed));
    out.put_u32(body.len() as u32);
    out.extend_from_slice(body);
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
        MessageReader::new(Chunks(chunks), max, Encoding::Gzip)
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
            frame(b"hello", Encoding::Identity).to_vec(),
            frame(b"", Encoding::Identity).to_vec(),
            frame(b"world!", Encoding::Gzip).to_vec(),
        ]
        .concat();
        let (a, b) = wire.split_at(3);
        let (b, c) = b.split_at(9);
        let mut r = reader(&[a, b, c], 100);
        block(async {
            let plain = |b: &'static [u8]| Message {
                bytes: Bytes::from_static(b),
                compressed: false,
            };
            assert_eq!(r.next().await.unwrap().unwrap(), plain(b"hello"));
            assert_eq!(r.next().await.unwrap().unwrap(), plain(b""));
            let last = r.next().await.unwrap().unwrap();
            assert_eq!((&last.bytes[..], last.compressed), (&b"world!"[..], true));
            assert!(r.next().await.unwrap().is_none());
        });
    }

    #[test]
    fn oversized_compressed_and_cut_messages_are_refused() {
        let big = frame(&[7u8; 11], Encoding::Identity);
        let err = block(reader(&[&big], 10).next()).unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted as u32);
        // Small on the wire, too large once decompressed.
        let bomb = frame(&[0u8; 1000], Encoding::Gzip);
        assert!(bomb.len() < 100);
        let err = block(reader(&[&bomb], 100).next()).unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted as u32);
        let mut compressed = frame(b"x", Encoding::Identity).to_vec();
        compressed[0] = 1;
        let plain = MessageReader::new(
            Chunks([Bytes::from(compressed)].into()),
            10,
            Encoding::Identity,
        );
        let err = block(async move {
            let mut plain = plain;
            plain.next().await
        })
        .unwrap_err();
        assert_eq!(err.code, Code::Internal as u32);
        let mut garbage = frame(b"xyz", Encoding::Identity).to_vec();
        garbage[0] = 1; // flagged compressed, but not gzip
        let err = block(reader(&[&garbage], 10).next()).unwrap_err();
        assert_eq!(err.code, Code::Internal as u32);
        let cut = &frame(b"abcdef", Encoding::Identity)[..8];
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
        h.insert("grpc-timeout", HeaderValue::from_static("123456789S"));
        assert!(deadline_of(&h, now).unwrap().is_some());
        for bad in ["12x", "abc", "-1S", "S", "1.5S"] {
            h.insert("grpc-timeout", HeaderValue::from_static(bad));
            assert_eq!(
                deadline_of(&h, now).unwrap_err().code,
                Code::Internal as u32
            );
        }
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
    fn bad_metadata_values_are_invalid_arguments() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-stratad-tenant",
            HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        let err = metadata_of(&h).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument as u32);
        assert!(err.message.contains("x-stratad-tenant"));
        let mut h = HeaderMap::new();
        h.insert("trace-bin", HeaderValue::from_static("!!!"));
        assert_eq!(
            metadata_of(&h).unwrap_err().code,
            Code::InvalidArgument as u32
        );
    }

    #[test]
    fn encodings_are_negotiated_as_the_spec_says() {
        let mut h = HeaderMap::new();
        assert_eq!(request_encoding(&h).unwrap(), Encoding::Identity);
        assert_eq!(response_encoding(&h), None);
        h.insert("grpc-encoding", HeaderValue::from_static("br"));
        assert_eq!(
            request_encoding(&h).unwrap_err().code,
            Code::Unimplemented as u32
        );
        h.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        assert_eq!(request_encoding(&h).unwrap(), Encoding::Gzip);
        h.insert(
            "grpc-accept-encoding",
            HeaderValue::from_static("identity, deflate"),
        );
        assert_eq!(response_encoding(&h), Some(Encoding::Deflate));
        h.insert(
            "grpc-accept-encoding",
            HeaderValue::from_static("deflate,gzip"),
        );
        assert_eq!(response_encoding(&h), Some(Encoding::Gzip));
        for encoding in [Encoding::Gzip, Encoding::Deflate] {
            let packed = encoding.compress(b"hello hello hello");
            assert_eq!(
                &encoding.decompress(&packed, 100).unwrap()[..],
                b"hello hello hello"
            );
        }
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
