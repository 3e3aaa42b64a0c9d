//! Calls and the event queue between the HTTP/2 server and the daemon.

use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::answers::{CallAnswers, Charge};
use crate::status::{MetadataValue, Status};

/// What the daemon sends back for a call, in order: initial metadata (at
/// most once, before any message), messages, then the status.
pub(crate) enum Out {
    Headers(Vec<(String, MetadataValue)>),
    /// A response message; `compress`: compress it if the call's answers
    /// are compressed (the handler may exempt single messages); its place
    /// in the answer budget.
    Message(Bytes, bool, Charge),
    Finish(Status),
}

/// Who is calling, the same for every call of one connection.
#[derive(Debug)]
pub struct Peer {
    /// `ipv4:127.0.0.1:5000` or `ipv6:[::1]:5000`, as grpc writes peers.
    pub address: String,
    /// The client certificate (DER) a TLS handshake verified (mTLS).
    pub certificate: Option<Bytes>,
}

/// One call handed to the daemon: its facts, and the way to answer it.
#[derive(Debug)]
pub struct CallHandle {
    pub id: u64,
    /// `/package.Service/Method`.
    pub method: String,
    pub metadata: Vec<(String, MetadataValue)>,
    pub peer: Arc<Peer>,
    pub deadline: Option<Instant>,
    /// True for client and bidi streams: their requests arrive as
    /// [`EventKind::Message`] after `pull`s; else the one request comes with
    /// [`EventKind::Started`].
    pub request_streaming: bool,
    out: mpsc::UnboundedSender<Out>,
    pull: Option<mpsc::UnboundedSender<()>>,
    finished: AtomicBool,
    /// The handler asked for compressed answers (`set_compression`).
    compress: AtomicBool,
    /// Its answers not yet written to the socket (answers.rs).
    pub(crate) answers: Arc<CallAnswers>,
    /// What `reserve_answer` charged for an answer being built: given back
    /// when that answer (or the status) is handed over, or the call ends.
    reserved: Mutex<Option<Charge>>,
}

impl CallHandle {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        method: String,
        metadata: Vec<(String, MetadataValue)>,
        peer: Arc<Peer>,
        deadline: Option<Instant>,
        out: mpsc::UnboundedSender<Out>,
        pull: Option<mpsc::UnboundedSender<()>>,
        answers: Arc<CallAnswers>,
    ) -> Self {
        CallHandle {
            id,
            method,
            metadata,
            peer,
            deadline,
            request_streaming: pull.is_some(),
            out,
            pull,
            finished: AtomicBool::new(false),
            compress: AtomicBool::new(false),
            answers,
            reserved: Mutex::new(None),
        }
    }

    /// Charge `size` bytes of answer before the handler builds it: a handler
    /// that knows how large its answer will be (a loaded state) holds the
    /// memory it is about to take within the answer budget, under the same
    /// rules as answers handed over (answers.rs): a connection whose unread
    /// answers and answers being built hold its share gets the status to end
    /// the call with (RESOURCE_EXHAUSTED: its message), before anything is
    /// built. Replaces an earlier reservation.
    pub fn reserve_answer(&self, size: usize) -> Result<(), String> {
        self.release_reservation();
        let charge = self.answers.charge(size).map_err(|status| status.message)?;
        *self.reserved.lock().unwrap_or_else(PoisonError::into_inner) = Some(charge);
        Ok(())
    }

    fn release_reservation(&self) {
        self.reserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    /// Compress the answers (with the best encoding the client accepts; none:
    /// they go uncompressed). Counts only before the first answer is sent.
    pub fn set_compression(&self, on: bool) {
        self.compress.store(on, Ordering::Release);
    }

    pub(crate) fn compression_requested(&self) -> bool {
        self.compress.load(Ordering::Acquire)
    }

    /// Send the initial metadata now (else it goes with the first message,
    /// empty). False once the call is over.
    pub fn send_headers(&self, metadata: Vec<(String, MetadataValue)>) -> bool {
        !self.is_finished() && self.out.send(Out::Headers(metadata)).is_ok()
    }

    /// Time left before the caller's deadline (None: no deadline).
    pub fn time_remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Queue one response message (a stream's; a unary call answers with
    /// `finish`); `compress`: false exempts it from the call's compression.
    /// False once the call is over (finished, cancelled, or the client left).
    /// An answer its client leaves unread beyond the answer budget ends the
    /// call RESOURCE_EXHAUSTED instead (answers.rs).
    pub fn send(&self, message: Bytes, compress: bool) -> bool {
        if self.is_finished() {
            return false;
        }
        self.release_reservation();
        match self.answers.charge(message.len()) {
            Ok(charge) => self
                .out
                .send(Out::Message(message, compress, charge))
                .is_ok(),
            Err(status) => {
                self.fail(status);
                false
            }
        }
    }

    /// End the call: an optional last message, then the status. Only the
    /// first finish counts; false if the call was already over.
    pub fn finish(
        &self,
        message: Option<Bytes>,
        code: u32,
        text: String,
        trailers: Vec<(String, MetadataValue)>,
    ) -> bool {
        // Before the check: a reservation made after the server closed the
        // call (a handler still loading) is given back here, not at drop.
        self.release_reservation();
        if self.finished.swap(true, Ordering::AcqRel) {
            return false;
        }
        let mut status = Status {
            code,
            message: text,
            trailers,
        };
        if let Some(message) = message {
            match self.answers.charge(message.len()) {
                Ok(charge) => {
                    if self.out.send(Out::Message(message, true, charge)).is_err() {
                        return false;
                    }
                }
                Err(refused) => status = refused,
            }
        }
        self.out.send(Out::Finish(status)).is_ok()
    }

    /// Ask for the next request message of a stream (one per call of this).
    pub fn pull(&self) {
        if let Some(pull) = &self.pull {
            let _ = pull.send(());
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Mark over without a status sent by the daemon (the server answered it
    /// itself: deadline, bad request frame, or the client went away).
    pub(crate) fn close(&self) -> bool {
        self.release_reservation();
        !self.finished.swap(true, Ordering::AcqRel)
    }

    /// Finish from the server side, winning over a later daemon finish.
    pub(crate) fn fail(&self, status: Status) {
        if self.close() {
            let _ = self.out.send(Out::Finish(status));
        }
    }
}

/// What happened to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A new call; a unary one comes with its request message.
    Started = 0,
    /// The next request message of a stream (after a `pull`).
    Message = 1,
    /// The client half-closed a stream: no more requests.
    RequestsEnded = 2,
    /// The call ended without the daemon's answer (client gone, deadline,
    /// bad frame): stop working on it.
    Cancelled = 3,
}

#[derive(Debug)]
pub struct Event {
    pub kind: EventKind,
    pub call: Arc<CallHandle>,
    pub message: Option<Bytes>,
    /// The message arrived compressed (decompressed by now).
    pub compressed: bool,
}

/// Events from the server's threads to the daemon, taken in batches.
///
/// The daemon watches [`EventQueue::wake_fd`] in its event loop: the first
/// event pushed after a `take` writes one byte to it, so the loop wakes once
/// and takes every event that arrived meanwhile, on its own thread (no
/// dispatcher thread, no hand-off of the GIL).
pub struct EventQueue {
    pending: Mutex<Pending>,
    wake_tx: UnixStream,
    wake_rx: UnixStream,
}

#[derive(Default)]
struct Pending {
    events: VecDeque<Event>,
    /// A wake-up byte was written since the last `take`.
    signalled: bool,
}

impl EventQueue {
    pub(crate) fn new() -> std::io::Result<Self> {
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        Ok(EventQueue {
            pending: Mutex::default(),
            wake_tx,
            wake_rx,
        })
    }

    pub(crate) fn push(&self, event: Event) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.events.push_back(event);
        let wake = !std::mem::replace(&mut pending.signalled, true);
        drop(pending);
        if wake {
            self.wake();
        }
    }

    fn wake(&self) {
        // Never blocks; a full socket buffer already holds wake-ups.
        let _ = (&self.wake_tx).write(&[1]);
    }

    /// Every queued event (none: an empty Vec). Read the wake-up bytes from
    /// `wake_fd` first, so that a byte written after this is a new event's.
    pub fn take(&self) -> Vec<Event> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.signalled = false;
        pending.events.drain(..).collect()
    }

    /// The descriptor to watch for events (readable: call `take`).
    pub fn wake_fd(&self) -> RawFd {
        self.wake_rx.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answers::{AnswerBudget, ConnectionAnswers};

    fn call(connection: &Arc<ConnectionAnswers>) -> (CallHandle, mpsc::UnboundedReceiver<Out>) {
        let (out, sent) = mpsc::unbounded_channel();
        let peer = Arc::new(Peer {
            address: "ipv4:127.0.0.1:1".into(),
            certificate: None,
        });
        let answers = CallAnswers::new(connection.clone());
        let handle = CallHandle::new(1, "/m".into(), vec![], peer, None, out, None, answers);
        (handle, sent)
    }

    #[test]
    fn a_reserved_answer_holds_the_connections_share_until_it_is_handed_over() {
        let budget = AnswerBudget::new(800);
        let connection = ConnectionAnswers::new(budget.clone());
        let (building, mut sent) = call(&connection);
        let (other, _) = call(&connection);
        building.reserve_answer(300).expect("alone: admitted");
        assert_eq!(budget.in_use(), 300);
        let refused = other
            .reserve_answer(1)
            .expect_err("over the connection's share");
        assert!(refused.contains("read them first"), "{refused}");
        // Handing the answer over gives the reservation back and charges the answer.
        assert!(building.finish(
            Some(Bytes::from_static(b"answer")),
            0,
            String::new(),
            vec![]
        ));
        assert_eq!(budget.in_use(), 6);
        drop(sent.try_recv());
        assert_eq!(budget.in_use(), 0);
        // A call that ends without an answer gives its reservation back too.
        other.reserve_answer(50).expect("the share is free again");
        assert!(other.close());
        assert_eq!(budget.in_use(), 0);
        // A handler that reserves after the call was closed gives it back at its finish.
        other.reserve_answer(70).expect("admitted");
        assert!(!other.finish(None, 0, String::new(), vec![]));
        assert_eq!(budget.in_use(), 0);
    }
}
