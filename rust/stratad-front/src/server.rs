//! The HTTP/2 server: accepts connections, serves native methods through the
//! event queue, forwards the rest (proxy.rs).

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::call::{CallHandle, Event, EventKind, EventQueue, Out, Status};
use crate::grpc::{self, Code, MessageReader};
use crate::proxy::Backend;

/// HTTP/2 flow-control windows: a client may send this much on one call, and
/// on all its calls together, before the daemon has read it.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 8 << 20;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ResponseBody = BoxBody<Bytes, BoxError>;

pub struct FrontConfig {
    /// `host:port` to listen on (port 0: any free port).
    pub listen: String,
    /// The daemon's grpc.aio server, for every call not served natively.
    pub backend: PathBuf,
    /// Methods served through the event queue, `/package.Service/Method`.
    pub unary_methods: Vec<String>,
    pub stream_methods: Vec<String>,
    /// Largest request message accepted.
    pub max_message_bytes: usize,
    /// Most native calls in progress at once (0: no limit).
    pub max_concurrent_calls: usize,
    /// Proves to the daemon that a forwarded call came through here.
    pub front_key: String,
    pub worker_threads: usize,
}

struct Shared {
    unary: HashSet<String>,
    streams: HashSet<String>,
    queue: Arc<EventQueue>,
    backend: Backend,
    max_message_bytes: usize,
    max_concurrent_calls: usize,
    in_progress: AtomicUsize,
    /// Open client connections: shutdown waits for them to finish their calls.
    connections: AtomicUsize,
    next_id: AtomicU64,
}

/// A running front door. Dropping it stops it (without draining).
pub struct Front {
    runtime: Option<tokio::runtime::Runtime>,
    stop: watch::Sender<bool>,
    local_addr: SocketAddr,
    queue: Arc<EventQueue>,
    shared: Arc<Shared>,
}

impl Front {
    /// Bind `config.listen` and start serving on background threads.
    pub fn start(config: FrontConfig) -> std::io::Result<Front> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads.max(1))
            .thread_name("stratad-front")
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind(&config.listen)?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let queue = Arc::new(EventQueue::new()?);
        let backend = Backend::new(config.backend, &config.front_key)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let shared = Arc::new(Shared {
            unary: config.unary_methods.into_iter().collect(),
            streams: config.stream_methods.into_iter().collect(),
            queue: queue.clone(),
            backend,
            max_message_bytes: config.max_message_bytes,
            max_concurrent_calls: config.max_concurrent_calls,
            in_progress: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        });
        let (stop, stopped) = watch::channel(false);
        let listener = {
            let _guard = runtime.enter();
            TcpListener::from_std(listener)?
        };
        runtime.spawn(accept_loop(listener, shared.clone(), stopped));
        Ok(Front {
            runtime: Some(runtime),
            stop,
            local_addr,
            queue,
            shared,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn queue(&self) -> &Arc<EventQueue> {
        &self.queue
    }

    /// Stop accepting, let open connections finish their calls (HTTP/2
    /// GOAWAY), native and forwarded alike, for up to `grace`, then close
    /// everything.
    pub fn shutdown(&mut self, grace: Duration) {
        let _ = self.stop.send(true);
        let deadline = Instant::now() + grace;
        while self.shared.connections.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(deadline.saturating_duration_since(Instant::now()));
        }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                // EMFILE and friends: wait a little rather than spin.
                Err(_) => { tokio::time::sleep(Duration::from_millis(50)).await; continue; }
            },
            _ = stopped.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(
            stream,
            peer,
            shared.clone(),
            stopped.clone(),
        ));
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<bool>,
) {
    shared.connections.fetch_add(1, Ordering::AcqRel);
    let _open = OpenConnection(shared.clone());
    let peer = match peer {
        SocketAddr::V4(a) => format!("ipv4:{a}"),
        SocketAddr::V6(a) => format!("ipv6:{a}"),
    };
    let service = service_fn(move |request| {
        let shared = shared.clone();
        let peer = peer.clone();
        async move { Ok::<_, Infallible>(handle(request, shared, peer).await) }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // Fixed windows, not BDP probing: probing pings every connection while it
    // ramps up, which costs both sides CPU on the first thousands of calls.
    builder
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(16 << 10);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = stopped.changed() => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
    peer: String,
) -> Response<ResponseBody> {
    let path = request.uri().path();
    let native = request.method() == http::Method::POST
        && grpc::is_plain_grpc(request.headers())
        && (shared.unary.contains(path) || shared.streams.contains(path));
    if !native {
        return match shared.backend.forward(request, &peer).await {
            Ok(response) => response,
            Err(e) => trailers_only(&Status::new(
                Code::Unavailable,
                format!("daemon backend: {e}"),
            )),
        };
    }
    serve_native(request, shared, peer).await
}

async fn serve_native(
    request: Request<Incoming>,
    shared: Arc<Shared>,
    peer: String,
) -> Response<ResponseBody> {
    let (parts, body) = request.into_parts();
    let method = parts.uri.path().to_owned();
    let metadata = match grpc::metadata_of(&parts.headers) {
        Ok(m) => m,
        Err(e) => return trailers_only(&Status::new(Code::Internal, e)),
    };
    let deadline = match grpc::deadline_of(&parts.headers, Instant::now()) {
        Ok(d) => d,
        Err(e) => return trailers_only(&Status::new(Code::Internal, e)),
    };
    let Some(_slot) = Slot::take(&shared) else {
        return trailers_only(&Status::new(
            Code::ResourceExhausted,
            "Concurrent RPC limit exceeded!",
        ));
    };
    let mut reader = MessageReader::new(body, shared.max_message_bytes);
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let started = if shared.unary.contains(&method) {
        let message = match reader.next().await {
            Ok(Some(message)) => message,
            Ok(None) => {
                return trailers_only(&Status::new(Code::Internal, "missing request message"))
            }
            Err(status) => return trailers_only(&status),
        };
        let call = Arc::new(CallHandle::new(
            id, method, metadata, peer, deadline, out_tx, None,
        ));
        Event {
            kind: EventKind::Started,
            call,
            message: Some(message),
        }
    } else {
        let (pull_tx, pull_rx) = mpsc::unbounded_channel();
        let call = Arc::new(CallHandle::new(
            id,
            method,
            metadata,
            peer,
            deadline,
            out_tx,
            Some(pull_tx),
        ));
        tokio::spawn(read_requests(
            reader,
            pull_rx,
            Arc::downgrade(&call),
            shared.queue.clone(),
        ));
        Event {
            kind: EventKind::Started,
            call,
            message: None,
        }
    };
    let call = started.call.clone();
    shared.queue.push(started);
    let guard = CancelOnDrop {
        call: call.clone(),
        queue: shared.queue.clone(),
    };
    answer(out_rx, guard, deadline, _slot).await
}

/// Counts a connection as open until its task ends.
struct OpenConnection(Arc<Shared>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A native call's place in `max_concurrent_calls`, given back on drop.
struct Slot(Arc<Shared>);

impl Slot {
    fn take(shared: &Arc<Shared>) -> Option<Slot> {
        let before = shared.in_progress.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(shared.clone());
        (shared.max_concurrent_calls == 0 || before < shared.max_concurrent_calls).then_some(slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_progress.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Tells the daemon a call ended without its answer (client gone, deadline).
struct CancelOnDrop {
    call: Arc<CallHandle>,
    queue: Arc<EventQueue>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.call.close() {
            self.queue.push(Event {
                kind: EventKind::Cancelled,
                call: self.call.clone(),
                message: None,
            });
        }
    }
}

/// Feed a stream's requests to the daemon, one per `pull`. Holds the call
/// weakly: once nobody else holds it (answered, or cancelled and dropped by
/// the daemon), its pull sender goes with it and this task ends, even if the
/// client never finished sending.
async fn read_requests(
    mut reader: MessageReader<Incoming>,
    mut pulls: mpsc::UnboundedReceiver<()>,
    call: std::sync::Weak<CallHandle>,
    queue: Arc<EventQueue>,
) {
    while pulls.recv().await.is_some() {
        let next = reader.next().await;
        let Some(call) = call.upgrade() else { return };
        match next {
            Ok(Some(message)) => queue.push(Event {
                kind: EventKind::Message,
                call: call.clone(),
                message: Some(message),
            }),
            Ok(None) => {
                queue.push(Event {
                    kind: EventKind::RequestsEnded,
                    call: call.clone(),
                    message: None,
                });
                return;
            }
            Err(status) => {
                call.fail(status);
                queue.push(Event {
                    kind: EventKind::Cancelled,
                    call: call.clone(),
                    message: None,
                });
                return;
            }
        }
    }
}

/// Wait for the daemon's first output, then answer: Trailers-Only for a
/// status with no message, else headers, messages as they come, trailers.
async fn answer(
    mut out: mpsc::UnboundedReceiver<Out>,
    guard: CancelOnDrop,
    deadline: Option<Instant>,
    slot: Slot,
) -> Response<ResponseBody> {
    let first = match deadline {
        None => out.recv().await,
        Some(deadline) => match tokio::time::timeout_at(deadline.into(), out.recv()).await {
            Ok(first) => first,
            Err(_) => {
                drop(guard); // tells the daemon to stop
                return trailers_only(&Status::new(Code::DeadlineExceeded, "Deadline Exceeded"));
            }
        },
    };
    match first {
        None => trailers_only(&Status::new(Code::Internal, "the daemon dropped the call")),
        Some(Out::Finish(status)) => trailers_only(&status),
        Some(Out::Message(message)) => {
            let body = AnswerBody {
                first: Some(message),
                out,
                _guard: guard,
                _slot: slot,
                done: false,
                deadline,
            };
            let mut response = Response::new(body.boxed());
            grpc_headers(response.headers_mut());
            response
        }
    }
}

struct AnswerBody {
    first: Option<Bytes>,
    out: mpsc::UnboundedReceiver<Out>,
    _guard: CancelOnDrop,
    _slot: Slot,
    done: bool,
    deadline: Option<Instant>,
}

impl http_body::Body for AnswerBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(grpc::frame(&first)))));
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.done = true;
            self._guard
                .call
                .fail(Status::new(Code::DeadlineExceeded, "Deadline Exceeded"));
            return Poll::Ready(Some(Ok(Frame::trailers(status_map(&Status::new(
                Code::DeadlineExceeded,
                "Deadline Exceeded",
            ))))));
        }
        match self.out.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Out::Message(message))) => {
                Poll::Ready(Some(Ok(Frame::data(grpc::frame(&message)))))
            }
            Poll::Ready(Some(Out::Finish(status))) => {
                self.done = true;
                Poll::Ready(Some(Ok(Frame::trailers(status_map(&status)))))
            }
            Poll::Ready(None) => {
                self.done = true;
                let status = Status::new(Code::Internal, "the daemon dropped the call");
                Poll::Ready(Some(Ok(Frame::trailers(status_map(&status)))))
            }
        }
    }
}

fn status_map(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::new();
    grpc::status_headers(status, &mut map);
    map
}

fn grpc_headers(headers: &mut HeaderMap) {
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
}

fn trailers_only(status: &Status) -> Response<ResponseBody> {
    let mut response = Response::new(
        Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed(),
    );
    grpc_headers(response.headers_mut());
    grpc::status_headers(status, response.headers_mut());
    response
}
