//! A blocking unary gRPC client, for the Python SDK's hot path.
//!
//! grpcio's blocking client spends ~175-250 µs of CPU per call on this
//! machine (docs/benchmarks.md): for an agent that saves a checkpoint per
//! step and waits for it, that is a third of each save. This client does
//! one call per [`UnaryClient::call`]: the request goes out and the answer
//! comes back on the calling thread (a current-thread tokio runtime, driven
//! by whichever caller is waiting), over one HTTP/2 connection opened on
//! first use and again after it breaks. It speaks plaintext HTTP/2 (TCP or a
//! unix socket); TLS channels stay on grpcio.
//!
//! Messages stay encoded protobuf, as in the server half of this crate;
//! retries and error mapping belong to the caller (`stratad/sdk/native.py`),
//! which learns from [`UnaryReply::committed`] whether a failed call may
//! have reached the daemon.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderMap, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use percent_encoding::percent_decode_str;
use tokio::net::{TcpStream, UnixStream};
use tokio::runtime::Runtime;

use crate::grpc;
use crate::status::{Code, MetadataValue};

/// Where the daemon listens.
#[derive(Debug, Clone)]
pub enum Target {
    /// `host:port`.
    Tcp(String),
    Unix(PathBuf),
}

impl Target {
    /// `host:port`, `unix:/path` or `unix:///path` (the forms grpc accepts).
    pub fn parse(address: &str) -> Result<Self, String> {
        if let Some(path) = address.strip_prefix("unix://") {
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        if let Some(path) = address.strip_prefix("unix:") {
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        if address.is_empty() || address.contains('/') {
            return Err(format!("not a host:port or unix: address: {address:?}"));
        }
        Ok(Target::Tcp(address.to_owned()))
    }

    /// The :authority of requests (grpc sends "localhost" for unix sockets).
    fn authority(&self) -> String {
        match self {
            Target::Tcp(address) => address.clone(),
            Target::Unix(_) => "localhost".to_owned(),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(address) => f.write_str(address),
            Target::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// The outcome of one call: the response message (OK calls) and the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnaryReply {
    pub message: Option<Bytes>,
    pub code: u32,
    pub details: String,
    /// Trailing metadata (`-bin` values decoded), grpc-status and grpc-message left out.
    pub trailers: Vec<(String, MetadataValue)>,
    /// Did the daemon start answering (response headers, not a Trailers-Only
    /// status)? A call that failed uncommitted did not run, and may be retried.
    pub committed: bool,
}

impl UnaryReply {
    fn failed(code: Code, details: impl Into<String>) -> Self {
        UnaryReply {
            message: None,
            code: code as u32,
            details: details.into(),
            trailers: Vec::new(),
            committed: false,
        }
    }
}

type Sender = SendRequest<Full<Bytes>>;

/// How often a waiting call asks whether it was interrupted.
pub const INTERRUPT_CHECK: Duration = Duration::from_millis(50);

pub struct UnaryClient {
    runtime: Runtime,
    target: Target,
    authority: String,
    max_receive_bytes: usize,
    sender: Mutex<Option<Sender>>,
}

impl UnaryClient {
    pub fn new(target: Target, max_receive_bytes: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        Ok(UnaryClient {
            runtime,
            authority: target.authority(),
            target,
            max_receive_bytes,
            sender: Mutex::new(None),
        })
    }

    /// Call `path` (`/package.Service/Method`) with one encoded request,
    /// within `timeout`. Blocks the calling thread; never panics on a bad
    /// answer (it becomes a status, as grpc would report it).
    pub fn call(
        &self,
        path: &str,
        message: &[u8],
        metadata: &[(String, MetadataValue)],
        timeout: Duration,
    ) -> UnaryReply {
        self.call_interruptible(path, message, metadata, timeout, || false)
            .unwrap_or_else(|| UnaryReply::failed(Code::Cancelled, "interrupted"))
    }

    /// [`call`](Self::call), asking `interrupted` every `INTERRUPT_CHECK` (50 ms)
    /// while it waits: when it answers true the call is abandoned (its
    /// stream reset, as a cancelled grpc call is) and None returned. The
    /// Python binding checks for signals there, so Ctrl-C does not wait for
    /// the deadline.
    pub fn call_interruptible(
        &self,
        path: &str,
        message: &[u8],
        metadata: &[(String, MetadataValue)],
        timeout: Duration,
        mut interrupted: impl FnMut() -> bool,
    ) -> Option<UnaryReply> {
        let request = match self.request(path, message, metadata, timeout) {
            Ok(request) => request,
            Err(text) => return Some(UnaryReply::failed(Code::Internal, text)),
        };
        self.runtime.block_on(async {
            let exchange = tokio::time::timeout(timeout, self.exchange(request));
            tokio::pin!(exchange);
            loop {
                tokio::select! {
                    outcome = &mut exchange => return Some(outcome.unwrap_or_else(|_| UnaryReply {
                        committed: true, // it may have run: never retried
                        ..UnaryReply::failed(Code::DeadlineExceeded, "Deadline Exceeded")
                    })),
                    _ = tokio::time::sleep(INTERRUPT_CHECK) => {
                        if interrupted() {
                            return None;
                        }
                    }
                }
            }
        })
    }

    fn request(
        &self,
        path: &str,
        message: &[u8],
        metadata: &[(String, MetadataValue)],
        timeout: Duration,
    ) -> Result<Request<Full<Bytes>>, String> {
        let uri = Uri::builder()
            .scheme("http")
            .authority(self.authority.as_str())
            .path_and_query(path)
            .build()
            .map_err(|e| format!("bad method path {path:?}: {e}"))?;
        let mut builder = Request::post(uri)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", grpc_timeout(timeout))
            .header("user-agent", "stratad-python-native");
        for (key, value) in metadata {
            builder = builder.header(key.as_str(), grpc::metadata_header(key, value)?);
        }
        builder
            .body(Full::new(grpc::frame(message, grpc::Encoding::Identity)))
            .map_err(|e| format!("bad request metadata: {e}"))
    }

    async fn exchange(&self, request: Request<Full<Bytes>>) -> UnaryReply {
        let mut sender = match self.ready_sender().await {
            Ok(sender) => sender,
            Err(text) => return UnaryReply::failed(Code::Unavailable, text),
        };
        let response = match sender.send_request(request).await {
            Ok(response) => response,
            Err(e) => {
                self.forget_closed();
                return UnaryReply::failed(Code::Unavailable, format!("connection failed: {e}"));
            }
        };
        let (parts, body) = response.into_parts();
        if let Some(status) = status_of(&parts.headers) {
            return UnaryReply {
                trailers: trailers_of(&parts.headers),
                ..status // Trailers-Only: the daemon answered with a status alone
            };
        }
        if let Some(reply) = http_failure(parts.status, &parts.headers) {
            return reply;
        }
        let collected = match Limited::new(body, self.max_receive_bytes + 5)
            .collect()
            .await
        {
            Ok(collected) => collected,
            Err(e) => {
                let code = if e.is::<http_body_util::LengthLimitError>() {
                    Code::ResourceExhausted
                } else {
                    Code::Unavailable
                };
                let reply = UnaryReply::failed(code, format!("response failed: {e}"));
                return UnaryReply {
                    committed: true,
                    ..reply
                };
            }
        };
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let reply = finish(collected.to_bytes(), &trailers, self.max_receive_bytes);
        UnaryReply {
            committed: true,
            ..reply
        }
    }

    /// The connection's sender, once it can take a request (connecting if
    /// there is none or the last one broke).
    async fn ready_sender(&self) -> Result<Sender, String> {
        let kept = self
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(mut sender) = kept {
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
            self.forget_closed();
        }
        let mut sender = self.connect().await?;
        sender
            .ready()
            .await
            .map_err(|e| format!("connection failed: {e}"))?;
        *self.sender.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender.clone());
        Ok(sender)
    }

    async fn connect(&self) -> Result<Sender, String> {
        let failed =
            |e: &dyn std::fmt::Display| format!("failed to connect to {}: {e}", self.target);
        match &self.target {
            Target::Tcp(address) => {
                let stream = TcpStream::connect(address).await.map_err(|e| failed(&e))?;
                let _ = stream.set_nodelay(true);
                self.handshake(stream).await
            }
            Target::Unix(path) => {
                let stream = UnixStream::connect(path).await.map_err(|e| failed(&e))?;
                self.handshake(stream).await
            }
        }
        .map_err(|e| failed(&e))
    }

    async fn handshake<S>(&self, stream: S) -> Result<Sender, hyper::Error>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        // Driven whenever a caller is inside `call` (a current-thread runtime).
        self.runtime.spawn(connection);
        Ok(sender)
    }

    /// After a failure: drop the kept connection if it is closed, so the next
    /// call connects again (one another caller already replaced stays).
    fn forget_closed(&self) {
        let mut slot = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|kept| kept.is_closed()) {
            *slot = None;
        }
    }
}

/// `grpc-timeout` for `timeout`, in the coarsest unit that keeps 8 digits.
fn grpc_timeout(timeout: Duration) -> String {
    let millis = timeout.as_millis().max(1);
    if millis < 100_000_000 {
        format!("{millis}m")
    } else {
        format!("{}S", timeout.as_secs().min(99_999_999))
    }
}

/// The status in a header block, if it holds one.
fn status_of(headers: &HeaderMap) -> Option<UnaryReply> {
    let code = headers.get("grpc-status")?;
    let code = code.to_str().ok().and_then(|text| text.parse::<u32>().ok());
    let Some(code) = code else {
        return Some(UnaryReply::failed(Code::Unknown, "malformed grpc-status"));
    };
    let details = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(|text| percent_decode_str(text).decode_utf8_lossy().into_owned())
        .unwrap_or_default();
    Some(UnaryReply {
        message: None,
        code,
        details,
        trailers: Vec::new(),
        committed: false,
    })
}

fn trailers_of(headers: &HeaderMap) -> Vec<(String, MetadataValue)> {
    let mut found = grpc::metadata_of(headers).unwrap_or_default();
    found.retain(|(key, _)| key != "grpc-status" && key != "grpc-message");
    found
}

/// A response that is not gRPC: its HTTP status mapped as the gRPC spec does.
fn http_failure(status: StatusCode, headers: &HeaderMap) -> Option<UnaryReply> {
    let is_grpc = headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if status == StatusCode::OK && is_grpc {
        return None;
    }
    let code = match status.as_u16() {
        200 => Code::Unknown,
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    let reply = UnaryReply::failed(code, format!("HTTP status {status} (not a gRPC answer)"));
    Some(UnaryReply {
        committed: code != Code::Unavailable,
        ..reply
    })
}

/// The reply of a call whose body and trailers have arrived.
fn finish(mut body: Bytes, trailers: &HeaderMap, max_bytes: usize) -> UnaryReply {
    let Some(status) = status_of(trailers) else {
        return UnaryReply::failed(Code::Internal, "the answer ended without a grpc-status");
    };
    let status = UnaryReply {
        trailers: trailers_of(trailers),
        ..status
    };
    if body.is_empty() {
        return status;
    }
    if body.len() < 5 || body[0] != 0 {
        return UnaryReply::failed(Code::Internal, "malformed or compressed response message");
    }
    let length = (&body[1..5]).get_u32() as usize;
    if length > max_bytes {
        return UnaryReply::failed(
            Code::ResourceExhausted,
            format!("Received message larger than max ({length} vs. {max_bytes})"),
        );
    }
    if body.len() != 5 + length {
        return UnaryReply::failed(Code::Internal, "not exactly one response message");
    }
    body.advance(5);
    UnaryReply {
        message: (status.code == Code::Ok as u32).then_some(body),
        ..status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use std::path::Path;

    fn trailers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (key, value) in pairs {
            map.insert(
                http::HeaderName::from_bytes(key.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn addresses_parse_like_grpc() {
        assert!(
            matches!(Target::parse("127.0.0.1:7000"), Ok(Target::Tcp(a)) if a == "127.0.0.1:7000")
        );
        assert!(
            matches!(Target::parse("unix:/run/s.sock"), Ok(Target::Unix(p)) if p == Path::new("/run/s.sock"))
        );
        assert!(
            matches!(Target::parse("unix:///run/s.sock"), Ok(Target::Unix(p)) if p == Path::new("/run/s.sock"))
        );
        assert!(Target::parse("http://x/y").is_err());
        assert!(Target::parse("").is_err());
    }

    #[test]
    fn timeouts_keep_eight_digits() {
        assert_eq!(grpc_timeout(Duration::from_millis(30_000)), "30000m");
        assert_eq!(grpc_timeout(Duration::from_micros(10)), "1m");
        assert_eq!(grpc_timeout(Duration::from_secs(10_000_000)), "10000000S");
    }

    #[test]
    fn one_message_and_ok_trailers_make_a_reply() {
        let body = grpc::frame(b"hello", grpc::Encoding::Identity);
        let reply = finish(body, &trailers(&[("grpc-status", "0"), ("x-a", "b")]), 100);
        assert_eq!(reply.code, 0);
        assert_eq!(reply.message.as_deref(), Some(&b"hello"[..]));
        assert_eq!(
            reply.trailers,
            vec![("x-a".to_owned(), MetadataValue::Text("b".into()))]
        );
    }

    #[test]
    fn statuses_and_details_are_decoded() {
        let reply = finish(
            Bytes::new(),
            &trailers(&[
                ("grpc-status", "5"),
                ("grpc-message", "session %22s%22 not found %E2%9C%93"),
                ("grpc-status-details-bin", "AQI"),
            ]),
            100,
        );
        assert_eq!((reply.code, reply.message), (5, None));
        assert_eq!(reply.details, "session \"s\" not found \u{2713}");
        assert_eq!(
            reply.trailers,
            vec![(
                "grpc-status-details-bin".to_owned(),
                MetadataValue::Binary(vec![1, 2])
            )]
        );
    }

    #[test]
    fn broken_answers_become_statuses_not_data() {
        let ok = trailers(&[("grpc-status", "0")]);
        let cut = grpc::frame(b"hello", grpc::Encoding::Identity).slice(..7);
        assert_eq!(finish(cut, &ok, 100).code, Code::Internal as u32);
        let mut two = grpc::frame(b"a", grpc::Encoding::Identity).to_vec();
        two.extend_from_slice(&grpc::frame(b"b", grpc::Encoding::Identity));
        assert_eq!(finish(two.into(), &ok, 100).code, Code::Internal as u32);
        let big = finish(grpc::frame(&[0; 200], grpc::Encoding::Identity), &ok, 100);
        assert_eq!(big.code, Code::ResourceExhausted as u32);
        assert_eq!(
            finish(
                grpc::frame(b"x", grpc::Encoding::Identity),
                &HeaderMap::new(),
                100
            )
            .code,
            Code::Internal as u32
        );
        let garbage = finish(Bytes::new(), &trailers(&[("grpc-status", "zero")]), 100);
        assert_eq!(garbage.code, Code::Unknown as u32);
    }

    #[test]
    fn http_errors_map_as_the_grpc_spec_says() {
        let grpc_type = trailers(&[("content-type", "application/grpc")]);
        assert!(http_failure(StatusCode::OK, &grpc_type).is_none());
        let html = trailers(&[("content-type", "text/html")]);
        let unavailable = http_failure(StatusCode::SERVICE_UNAVAILABLE, &html).unwrap();
        assert_eq!(unavailable.code, Code::Unavailable as u32);
        assert!(!unavailable.committed);
        assert_eq!(
            http_failure(StatusCode::NOT_FOUND, &html).unwrap().code,
            Code::Unimplemented as u32
        );
        assert_eq!(
            http_failure(StatusCode::OK, &html).unwrap().code,
            Code::Unknown as u32
        );
    }

    #[test]
    fn an_interrupted_call_is_abandoned_before_its_deadline() {
        // A peer that accepts and never answers.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let client = UnaryClient::new(Target::Tcp(address), 1 << 20).unwrap();
        let started = std::time::Instant::now();
        let mut asked = 0;
        let reply = client.call_interruptible("/a.B/C", b"", &[], Duration::from_secs(30), || {
            asked += 1;
            asked == 3
        });
        assert!(reply.is_none());
        assert!(started.elapsed() < Duration::from_secs(5));
        let reply = client.call("/a.B/C", b"", &[], Duration::from_millis(200));
        assert_eq!(reply.code, Code::DeadlineExceeded as u32);
        assert!(reply.committed);
        drop(listener);
    }

    #[test]
    fn nothing_listening_is_unavailable_and_uncommitted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        drop(listener);
        let client = UnaryClient::new(Target::Tcp(address), 1 << 20).unwrap();
        let reply = client.call("/a.B/C", b"", &[], Duration::from_secs(5));
        assert_eq!(reply.code, Code::Unavailable as u32);
        assert!(!reply.committed);
        assert!(
            reply.details.contains("failed to connect"),
            "{}",
            reply.details
        );
    }
}
