//! What the modules serving connections share: the front door's state that
//! every call of every connection reads ([`Shared`]), the per-client limits
//! in it ([`EdgeLimits`]), and the count of open connections
//! ([`OpenConnection`]).
//!
//! A leaf module: server.rs builds a [`Shared`] and hands it to every
//! connection it accepts (connection.rs, unix.rs), whose calls (rpc.rs) read
//! it. None of those is imported from here, so the dependencies between them
//! point one way: server -> unix -> connection -> rpc, all of them -> shared.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::answers::AnswerBudget;
use crate::call::EventQueue;
use crate::tls::Certificates;

/// What one client may hold of the front door (docs/security.md lists them).
#[derive(Debug, Clone)]
pub struct EdgeLimits {
    /// Open client connections; one more is closed at once (0: no limit).
    pub max_connections: usize,
    /// Concurrent streams (calls) one connection may open (HTTP/2 SETTINGS).
    pub max_streams_per_connection: u32,
    /// A connection with no call for this long is closed (GOAWAY).
    pub idle_timeout: Duration,
    /// Largest header list (metadata) of a call: RESOURCE_EXHAUSTED above.
    pub max_header_bytes: usize,
    /// Answer bytes not yet read by their clients (answers.rs; 0: no limit).
    pub max_answer_bytes: usize,
}

/// What every connection's calls share.
pub(crate) struct Shared {
    /// Method path -> its requests are a stream.
    pub methods: HashMap<String, bool>,
    pub queue: Arc<EventQueue>,
    pub max_message_bytes: usize,
    /// One permit per call in progress, `max_concurrent_calls` of them (None: no limit).
    pub slots: Option<Arc<Semaphore>>,
    pub limits: EdgeLimits,
    /// Open client connections: shutdown waits for them to finish their calls.
    pub connections: AtomicUsize,
    pub next_id: AtomicU64,
    pub tls: Option<Certificates>,
    pub answers: Arc<AnswerBudget>,
}

/// Counts a connection as open until it is dropped.
pub(crate) struct OpenConnection(pub Arc<Shared>);

impl OpenConnection {
    pub fn count(shared: &Arc<Shared>) -> OpenConnection {
        shared.connections.fetch_add(1, Ordering::AcqRel);
        OpenConnection(shared.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}
