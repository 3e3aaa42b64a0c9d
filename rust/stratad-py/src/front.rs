//! `stratad._core.NativeFront`: the Python face of `stratad-front` (see
//! python/stratad/server/front.py, its only user).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};
use stratad_front::{CallHandle, EventQueue, Front, FrontConfig, MetadataValue};

/// The HTTP/2 server of the native front door, running on its own threads.
#[pyclass(frozen, module = "stratad._core")]
pub struct NativeFront {
    front: Mutex<Option<Front>>,
    queue: Arc<EventQueue>,
    port: u16,
}

#[pymethods]
impl NativeFront {
    #[new]
    #[pyo3(signature = (listen, backend, unary_methods, stream_methods, *, max_message_bytes, max_concurrent_calls, front_key, worker_threads))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        listen: String,
        backend: std::path::PathBuf,
        unary_methods: Vec<String>,
        stream_methods: Vec<String>,
        max_message_bytes: usize,
        max_concurrent_calls: usize,
        front_key: String,
        worker_threads: usize,
    ) -> PyResult<Self> {
        let config = FrontConfig {
            listen: listen.clone(),
            backend,
            unary_methods,
            stream_methods,
            max_message_bytes,
            max_concurrent_calls,
            front_key,
            worker_threads,
        };
        let front = py
            .detach(|| Front::start(config))
            .map_err(|e| PyOSError::new_err(format!("cannot listen on {listen}: {e}")))?;
        let queue = front.queue().clone();
        let port = front.local_addr().port();
        Ok(NativeFront {
            front: Mutex::new(Some(front)),
            queue,
            port,
        })
    }

    /// The port it listens on (the one chosen, when asked for port 0).
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Every event queued, as `(kind, call, message)` tuples (`[]` if none).
    /// Call it when `wake_fd` is readable, after reading what it holds.
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let events = self.queue.take();
        events
            .into_iter()
            .map(|event| {
                let message = event.message.map(|m| PyBytes::new(py, &m).into_any());
                let call = Bound::new(py, FrontCall { handle: event.call })?.into_any();
                let kind = (event.kind as u8).into_pyobject(py)?.into_any();
                let message = match message {
                    Some(m) => m,
                    None => py.None().into_bound(py),
                };
                PyTuple::new(py, [kind, call, message])
            })
            .collect()
    }

    /// Readable when events are queued: watch it (e.g. `loop.add_reader`),
    /// read it empty, then `take_events`.
    #[getter]
    fn wake_fd(&self) -> i32 {
        self.queue.wake_fd()
    }

    /// Stop accepting; wait up to `grace` seconds for native calls in
    /// progress (the caller keeps answering them meanwhile); then close.
    fn shutdown(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        if !(grace.is_finite() && grace >= 0.0) {
            return Err(PyValueError::new_err(
                "grace must be a non-negative number of seconds",
            ));
        }
        let front = self
            .front
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut front) = front {
            py.detach(move || front.shutdown(Duration::from_secs_f64(grace)));
        }
        Ok(())
    }
}

/// One call of the native front door.
#[pyclass(frozen, module = "stratad._core")]
pub struct FrontCall {
    handle: Arc<CallHandle>,
}

#[pymethods]
impl FrontCall {
    /// Distinct for every call of one `NativeFront`.
    #[getter]
    fn id(&self) -> u64 {
        self.handle.id
    }

    #[getter]
    fn method(&self) -> &str {
        &self.handle.method
    }

    #[getter]
    fn peer(&self) -> &str {
        &self.handle.peer
    }

    #[getter]
    fn unary(&self) -> bool {
        self.handle.unary
    }

    /// `((key, value), ...)`: str values, bytes for `-bin` keys.
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let items = self.handle.metadata.iter().map(|(key, value)| {
            let value = match value {
                MetadataValue::Text(text) => PyString::new(py, text).into_any(),
                MetadataValue::Binary(bytes) => PyBytes::new(py, bytes).into_any(),
            };
            PyTuple::new(py, [PyString::new(py, key).into_any(), value])
        });
        PyTuple::new(py, items.collect::<PyResult<Vec<_>>>()?)
    }

    /// Seconds left before the caller's deadline; None without one.
    fn time_remaining(&self) -> Option<f64> {
        self.handle.time_remaining().map(|d| d.as_secs_f64())
    }

    /// Send one response message of a stream. False once the call is over.
    fn send(&self, message: &[u8]) -> bool {
        self.handle.send(bytes::Bytes::copy_from_slice(message))
    }

    /// End the call with `code` and `message`, after `response` if given.
    /// False if it was already over (only the first finish counts).
    #[pyo3(signature = (response, code, message, trailers=Vec::new()))]
    fn finish(
        &self,
        py: Python<'_>,
        response: Option<&[u8]>,
        code: u32,
        message: String,
        trailers: Vec<(String, Bound<'_, PyAny>)>,
    ) -> PyResult<bool> {
        let trailers = trailers
            .into_iter()
            .map(metadata_value)
            .collect::<PyResult<Vec<_>>>()?;
        let response = response.map(bytes::Bytes::copy_from_slice);
        // Without the GIL: waking the server thread that answers may switch
        // this core to it, and the event loop's GIL must not wait on that.
        Ok(py.detach(|| self.handle.finish(response, code, message, trailers)))
    }

    /// Ask for the next request message of a stream.
    fn pull(&self) {
        self.handle.pull();
    }
}

pub(crate) fn metadata_value(
    (key, value): (String, Bound<'_, PyAny>),
) -> PyResult<(String, MetadataValue)> {
    if let Ok(bytes) = value.cast::<PyBytes>() {
        return Ok((key, MetadataValue::Binary(bytes.as_bytes().to_vec())));
    }
    if let Ok(text) = value.cast::<PyString>() {
        return Ok((key, MetadataValue::Text(text.to_str()?.to_owned())));
    }
    Err(PyTypeError::new_err(format!(
        "metadata {key}: value must be str or bytes"
    )))
}
