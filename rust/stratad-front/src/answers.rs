//! Answer bytes in flight: what the daemon has answered and the client has
//! not yet taken off the socket (queued for the HTTP/2 layer, or in its send
//! buffer behind a closed flow-control window). A client that never reads
//! would otherwise hold its answers in memory without bound.
//!
//! Each answer is charged from the moment the daemon hands it over until h2
//! has written it to the socket (the charge travels inside the frame's
//! `Bytes` and is released when h2 drops it). A connection may hold a share
//! of the budget; an answer beyond it (or beyond the whole budget) is not
//! queued: its call ends RESOURCE_EXHAUSTED. An answer alone is always
//! admitted, so a client that reads slowly still gets large answers one at
//! a time. A stream whose own answers pile up stops being read (rpc.rs):
//! backpressure, not failure, for a client that sends but does not read.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::Notify;

use crate::status::{Code, Status};

/// The connections' share: one connection may hold this part of the budget.
const CONNECTION_SHARE: usize = 8;
/// A stream's requests are not read while its unread answers hold more.
pub(crate) const STREAM_ANSWER_WINDOW: usize = 64 << 10;

/// The daemon's budget (0: no limit), shared by every connection.
#[derive(Debug)]
pub(crate) struct AnswerBudget {
    bytes: AtomicUsize,
    max: usize,
}

impl AnswerBudget {
    pub fn new(max: usize) -> Arc<AnswerBudget> {
        Arc::new(AnswerBudget {
            bytes: AtomicUsize::new(0),
            max,
        })
    }

    pub fn in_use(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }
}

/// One connection's answers in flight.
#[derive(Debug)]
pub(crate) struct ConnectionAnswers {
    bytes: AtomicUsize,
    budget: Arc<AnswerBudget>,
}

impl ConnectionAnswers {
    pub fn new(budget: Arc<AnswerBudget>) -> Arc<ConnectionAnswers> {
        Arc::new(ConnectionAnswers {
            bytes: AtomicUsize::new(0),
            budget,
        })
    }
}

/// One call's answers in flight, and a way to wait until they drain.
#[derive(Debug)]
pub(crate) struct CallAnswers {
    bytes: AtomicUsize,
    drained: Notify,
    connection: Arc<ConnectionAnswers>,
}

impl CallAnswers {
    pub fn new(connection: Arc<ConnectionAnswers>) -> Arc<CallAnswers> {
        Arc::new(CallAnswers {
            bytes: AtomicUsize::new(0),
            drained: Notify::new(),
            connection,
        })
    }

    /// Charge an answer of `size` bytes, or the status to end the call with.
    pub fn charge(self: &Arc<Self>, size: usize) -> Result<Charge, Status> {
        let connection = &self.connection;
        let budget = &connection.budget;
        if budget.max > 0 {
            let held = connection.bytes.load(Ordering::Acquire);
            let total = budget.bytes.load(Ordering::Acquire);
            let share = budget.max / CONNECTION_SHARE;
            let over_share = held > 0 && held + size > share;
            let over_budget = total > 0 && total + size > budget.max;
            if over_share || over_budget {
                return Err(Status::new(
                    Code::ResourceExhausted,
                    format!(
                        "answers not yet read by the client hold {held} bytes on this connection \
                         ({total} in all, budget {}): read them first",
                        budget.max
                    ),
                ));
            }
        }
        self.bytes.fetch_add(size, Ordering::AcqRel);
        connection.bytes.fetch_add(size, Ordering::AcqRel);
        budget.bytes.fetch_add(size, Ordering::AcqRel);
        Ok(Charge {
            size,
            call: self.clone(),
        })
    }

    /// Returns once this call's answers in flight are at most `bytes`.
    pub async fn drained_to(&self, bytes: usize) {
        loop {
            let notified = self.drained.notified();
            if self.bytes.load(Ordering::Acquire) <= bytes {
                return;
            }
            notified.await;
        }
    }
}

/// An answer's place in the budget, released when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    size: usize,
    call: Arc<CallAnswers>,
}

impl Charge {
    /// `frame` (the answer as it goes on the wire) holding this charge until
    /// the last copy of it is dropped: when h2 has written it.
    pub fn attach(self, frame: Bytes) -> Bytes {
        Bytes::from_owner(Charged {
            frame,
            _charge: self,
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let call = &self.call;
        call.bytes.fetch_sub(self.size, Ordering::AcqRel);
        call.connection.bytes.fetch_sub(self.size, Ordering::AcqRel);
        call.connection
            .budget
            .bytes
            .fetch_sub(self.size, Ordering::AcqRel);
        call.drained.notify_waiters();
    }
}

struct Charged {
    frame: Bytes,
    _charge: Charge,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.frame
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_holds_its_share_and_charges_come_back_with_the_frames() {
        let budget = AnswerBudget::new(800);
        let (a, b) = (
            ConnectionAnswers::new(budget.clone()),
            ConnectionAnswers::new(budget.clone()),
        );
        let call = CallAnswers::new(a);
        let alone = call.charge(500).expect("an answer alone is admitted");
        let refused = call.charge(1).expect_err("over the connection's share");
        assert_eq!(refused.code, Code::ResourceExhausted as u32);
        // Another connection is not held up by this one's share.
        let other = CallAnswers::new(b);
        let frame = other
            .charge(50)
            .unwrap()
            .attach(Bytes::from_static(b"answer"));
        assert_eq!(budget.in_use(), 550);
        let copy = frame.clone();
        drop(frame);
        assert_eq!(budget.in_use(), 550, "a copy still holds it");
        drop(copy);
        drop(alone);
        assert_eq!(budget.in_use(), 0);
        assert!(call.charge(100).is_ok());
    }
}
