//! One call: check its headers, hand it to the daemon through the event
//! queue, stream the daemon's answer back, and end it at its deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio::time::Sleep;

use crate::activity::Busy;
use crate::answers::{CallAnswers, ConnectionAnswers, STREAM_ANSWER_WINDOW};
use crate::call::{CallHandle, Event, EventKind, EventQueue, Out, Peer};
use crate::grpc::{self, Encoding, MessageReader};
use crate::shared::Shared;
use crate::status::{Code, MetadataValue, Status};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ResponseBody = BoxBody<Bytes, BoxError>;

/// Serve one HTTP/2 request: a gRPC call of a known method, or a status
/// saying why not.
pub(crate) async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
    peer: Arc<Peer>,
    answers: Arc<ConnectionAnswers>,
    busy: Busy,
) -> Response<ResponseBody> {
    if request.method() != http::Method::POST {
        return http_error(StatusCode::METHOD_NOT_ALLOWED);
    }
    // The gRPC spec: a request that is not gRPC gets HTTP 415.
    if !grpc::is_grpc(request.headers()) {
        return http_error(StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
    if let Err(status) = check_header_size(request.headers(), shared.limits.max_header_bytes) {
        return trailers_only(&status);
    }
    match serve(request, &shared, peer, answers, busy).await {
        Ok(response) => response,
        Err(status) => trailers_only(&status),
    }
}

/// RESOURCE_EXHAUSTED for a header list over `max` bytes, counted as HTTP/2
/// counts it (name + value + 32 per field), as grpc-core answers.
fn check_header_size(headers: &HeaderMap, max: usize) -> Result<(), Status> {
    let size: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 32)
        .sum();
    if max == 0 || size <= max {
        return Ok(());
    }
    Err(Status::new(
        Code::ResourceExhausted,
        format!("header list of {size} bytes is over the limit of {max} bytes"),
    ))
}

async fn serve(
    request: Request<Incoming>,
    shared: &Arc<Shared>,
    peer: Arc<Peer>,
    answers: Arc<ConnectionAnswers>,
    busy: Busy,
) -> Result<Response<ResponseBody>, Status> {
    let (parts, body) = request.into_parts();
    let method = parts.uri.path().to_owned();
    let Some(&streaming) = shared.methods.get(&method) else {
        return Err(Status::new(
            Code::Unimplemented,
            format!("Method not found: {method}"),
        ));
    };
    let encoding = grpc::request_encoding(&parts.headers)?;
    let answer_encoding = grpc::response_encoding(&parts.headers);
    let metadata = grpc::metadata_of(&parts.headers)?;
    let deadline = grpc::deadline_of(&parts.headers, Instant::now())?;
    let mut reader = MessageReader::new(body, shared.max_message_bytes, encoding);
    // A unary request first: a call whose request is still on its way holds
    // no slot, and ends at its deadline like any other.
    let request = if streaming {
        None
    } else {
        let message = within(deadline, reader.next()).await??;
        Some(message.ok_or_else(|| Status::new(Code::Internal, "missing request message"))?)
    };
    let slot = Slot::take(shared, deadline).await?;
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (pull_tx, pull_rx) = mpsc::unbounded_channel();
    let call = Arc::new(CallHandle::new(
        shared.next_id.fetch_add(1, Ordering::Relaxed),
        method,
        metadata,
        peer,
        deadline,
        out_tx,
        streaming.then_some(pull_tx),
        CallAnswers::new(answers),
    ));
    let (started, stop_reading) = match request {
        Some(message) => {
            let mut started = event(EventKind::Started, &call, Some(message.bytes));
            started.compressed = message.compressed;
            (started, None)
        }
        None => {
            let (stop_tx, stop_rx) = oneshot::channel();
            let queue = shared.queue.clone();
            let weak = Arc::downgrade(&call);
            tokio::spawn(read_requests(reader, pull_rx, stop_rx, weak, queue));
            (event(EventKind::Started, &call, None), Some(stop_tx))
        }
    };
    let call = started.call.clone();
    shared.queue.push(started);
    let guard = CancelOnDrop {
        call,
        queue: shared.queue.clone(),
    };
    let ending = Ending {
        guard,
        _slot: slot,
        _stop_reading: stop_reading,
        _busy: busy,
    };
    Ok(answer(out_rx, ending, deadline, answer_encoding).await)
}

fn event(kind: EventKind, call: &Arc<CallHandle>, message: Option<Bytes>) -> Event {
    Event {
        kind,
        call: call.clone(),
        message,
        compressed: false,
    }
}

/// `work`, or DEADLINE_EXCEEDED once `deadline` passes.
async fn within<T>(deadline: Option<Instant>, work: impl Future<Output = T>) -> Result<T, Status> {
    match deadline {
        None => Ok(work.await),
        Some(deadline) => tokio::time::timeout_at(deadline.into(), work)
            .await
            .map_err(|_| deadline_exceeded()),
    }
}

fn deadline_exceeded() -> Status {
    Status::new(Code::DeadlineExceeded, "Deadline Exceeded")
}

/// How long a call may wait for one of `max_concurrent_calls` before it is
/// refused. A burst of calls that end at once (refused by a limit, or
/// answered) frees its slots within milliseconds: refusing every call that
/// arrives meanwhile failed other clients' health checks and saves
/// (tests/hostile/test_unread_answers.py: 600 LoadStates from clients that
/// never read). Waiting calls hold no more than they already held (their
/// request has arrived; a stream's are not read yet), and take slots in the
/// order they came (tokio's semaphore is fair).
const SLOT_WAIT: Duration = Duration::from_secs(1);

/// A call's place in `max_concurrent_calls` (None: no limit), given back on drop.
struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
}

impl Slot {
    async fn take(shared: &Arc<Shared>, deadline: Option<Instant>) -> Result<Slot, Status> {
        let Some(slots) = &shared.slots else {
            return Ok(Slot { _permit: None });
        };
        let give_up = Instant::now() + SLOT_WAIT;
        let give_up = deadline.map_or(give_up, |deadline| deadline.min(give_up));
        match tokio::time::timeout_at(give_up.into(), slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Slot {
                _permit: Some(permit),
            }),
            _ if deadline.is_some_and(|deadline| deadline <= Instant::now()) => {
                Err(deadline_exceeded())
            }
            _ => Err(Status::new(
                Code::ResourceExhausted,
                "Concurrent RPC limit exceeded!",
            )),
        }
    }
}

/// Tells the daemon a call ended without its answer (client gone, deadline).
struct CancelOnDrop {
    call: Arc<CallHandle>,
    queue: Arc<EventQueue>,
}

impl CancelOnDrop {
    /// End the call here (its deadline passed): the daemon stops working on it.
    fn cancel(&self) {
        if self.call.close() {
            self.queue
                .push(event(EventKind::Cancelled, &self.call, None));
        }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// What a call holds until its answer is over, released in this order: the
/// daemon is told if it did not answer, the slot is given back, a stream's
/// request reader stops, and the connection counts one call less.
struct Ending {
    guard: CancelOnDrop,
    _slot: Slot,
    _stop_reading: Option<oneshot::Sender<()>>,
    _busy: Busy,
}

/// Feed a stream's requests to the daemon, one per `pull`, until the
/// requests end or the call's answer is over (`stop`: its sender is dropped
/// with the answer, even if the client never finishes sending). While the
/// stream's unread answers hold more than STREAM_ANSWER_WINDOW, no request
/// is read: a client that sends and never reads is held back, not served on.
async fn read_requests(
    mut reader: MessageReader<Incoming>,
    mut pulls: mpsc::UnboundedReceiver<()>,
    mut stop: oneshot::Receiver<()>,
    call: std::sync::Weak<CallHandle>,
    queue: Arc<EventQueue>,
) {
    loop {
        tokio::select! {
            _ = &mut stop => return,
            pulled = pulls.recv() => if pulled.is_none() { return },
        }
        let Some(answers) = call.upgrade().map(|c| c.answers.clone()) else {
            return;
        };
        let next = tokio::select! {
            _ = &mut stop => return,
            next = async {
                answers.drained_to(STREAM_ANSWER_WINDOW).await;
                reader.next().await
            } => next,
        };
        let Some(call) = call.upgrade() else { return };
        match next {
            Ok(Some(message)) => {
                let mut arrived = event(EventKind::Message, &call, Some(message.bytes));
                arrived.compressed = message.compressed;
                queue.push(arrived);
            }
            Ok(None) => {
                queue.push(event(EventKind::RequestsEnded, &call, None));
                return;
            }
            Err(status) => {
                call.fail(status);
                queue.push(event(EventKind::Cancelled, &call, None));
                return;
            }
        }
    }
}

/// Wait for the daemon's first output, then answer: Trailers-Only for a
/// status alone, else headers, messages as they come, trailers.
async fn answer(
    mut out: mpsc::UnboundedReceiver<Out>,
    ending: Ending,
    deadline: Option<Instant>,
    accepted: Option<Encoding>,
) -> Response<ResponseBody> {
    let first = match within(deadline, out.recv()).await {
        Ok(first) => first,
        Err(status) => {
            ending.guard.cancel();
            return trailers_only(&status);
        }
    };
    let call = &ending.guard.call;
    // Answers are compressed only if the handler asked before its first one.
    let encoding = accepted
        .filter(|_| call.compression_requested())
        .unwrap_or(Encoding::Identity);
    let (metadata, first) = match first {
        None => return trailers_only(&dropped()),
        Some(Out::Finish(status)) => return trailers_only(&status),
        Some(Out::Headers(metadata)) => (metadata, None),
        Some(Out::Message(message, compress, charge)) => (
            Vec::new(),
            Some(charge.attach(message_frame(&message, compress, encoding))),
        ),
    };
    let body = AnswerBody {
        first,
        out,
        ending,
        done: false,
        deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d.into()))),
        encoding,
    };
    let mut response = Response::new(body.boxed());
    grpc_headers(response.headers_mut(), encoding);
    append_metadata(response.headers_mut(), &metadata);
    response
}

fn message_frame(message: &[u8], compress: bool, encoding: Encoding) -> Bytes {
    grpc::frame(
        message,
        if compress {
            encoding
        } else {
            Encoding::Identity
        },
    )
}

fn dropped() -> Status {
    Status::new(Code::Internal, "the daemon dropped the call")
}

struct AnswerBody {
    first: Option<Bytes>,
    out: mpsc::UnboundedReceiver<Out>,
    ending: Ending,
    done: bool,
    deadline: Option<Pin<Box<Sleep>>>,
    encoding: Encoding,
}

impl AnswerBody {
    fn end(&mut self, status: &Status) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        let mut trailers = HeaderMap::new();
        grpc::status_headers(status, &mut trailers);
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }
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
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        loop {
            match self.out.poll_recv(cx) {
                Poll::Ready(Some(Out::Message(message, compress, charge))) => {
                    let frame = charge.attach(message_frame(&message, compress, self.encoding));
                    return Poll::Ready(Some(Ok(Frame::data(frame))));
                }
                // Initial metadata after the first answer has no place left.
                Poll::Ready(Some(Out::Headers(_))) => continue,
                Poll::Ready(Some(Out::Finish(status))) => return self.end(&status),
                Poll::Ready(None) => return self.end(&dropped()),
                Poll::Pending => break,
            }
        }
        // Nothing from the daemon yet: the deadline may end the call first.
        let expired = self
            .deadline
            .as_mut()
            .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready());
        if expired {
            self.ending.guard.cancel();
            return self.end(&deadline_exceeded());
        }
        Poll::Pending
    }
}

fn grpc_headers(headers: &mut HeaderMap, encoding: Encoding) {
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(
        "grpc-accept-encoding",
        HeaderValue::from_static(grpc::ACCEPT_ENCODING),
    );
    if encoding != Encoding::Identity {
        headers.insert("grpc-encoding", HeaderValue::from_static(encoding.name()));
    }
}

/// The handler's initial metadata; a key or value HTTP/2 cannot carry is left out.
fn append_metadata(headers: &mut HeaderMap, metadata: &[(String, MetadataValue)]) {
    for (key, value) in metadata {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            grpc::metadata_header(key, value),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
}

fn trailers_only(status: &Status) -> Response<ResponseBody> {
    let mut response = Response::new(empty());
    grpc_headers(response.headers_mut(), Encoding::Identity);
    grpc::status_headers(status, response.headers_mut());
    response
}

fn http_error(code: StatusCode) -> Response<ResponseBody> {
    let mut response = Response::new(empty());
    *response.status_mut() = code;
    response
}

fn empty() -> ResponseBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}
