//! How busy one connection is: its calls in progress ([`Busy`], one per
//! call) and how long it has had none ([`Activity::idle_for`], which closes
//! an idle connection). A leaf module: connection.rs keeps the [`Activity`]
//! of each connection and rpc.rs holds a call's [`Busy`] until its answer is
//! over.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A connection's calls in progress, and since when it has had none.
#[derive(Default)]
pub(crate) struct Activity {
    state: Mutex<(usize, Option<Instant>)>,
}

impl Activity {
    /// A call began: it keeps the connection busy until the guard drops.
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 += 1;
        Busy(self.clone())
    }

    /// Resolves once the connection has had no call for `timeout`.
    pub(crate) async fn idle_for(&self, timeout: Duration) {
        loop {
            let wake = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                match *state {
                    (0, Some(since)) if since.elapsed() >= timeout => return,
                    (0, Some(since)) => since + timeout,
                    (0, None) => *state.1.insert(Instant::now()) + timeout,
                    _ => Instant::now() + timeout,
                }
            };
            tokio::time::sleep_until(wake.into()).await;
        }
    }
}

/// Held by a call until its answer is over.
pub(crate) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 -= 1;
        if state.0 == 0 {
            state.1 = Some(Instant::now());
        }
    }
}
