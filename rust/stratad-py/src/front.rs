//! `stratad._core.NativeFront`: the Python face of `stratad-front` (see
//! python/stratad/server/front.py, its only user).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};
use stratad_front::{
    CallHandle, EdgeLimits, EventQueue, Front, FrontConfig, MetadataValue, TlsFiles,
};

/// The HTTP/2 server of the native front door, running on its own threads.
#[pyclass(frozen, module = "stratad._core")]
pub struct NativeFront {
    front: Mutex<Option<Front>>,
    queue: Arc<EventQueue>,
    ports: Vec<u16>,
}

#[pymethods]
impl NativeFront {
    #[new]
    #[pyo3(signature = (listen, methods, *, max_message_bytes, max_concurrent_calls, worker_threads, max_connections, max_streams_per_connection, idle_timeout, max_header_bytes, max_answer_bytes, tls_cert_file=None, tls_key_file=None, tls_client_ca_file=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        listen: Vec<String>,
        methods: Vec<(String, bool)>,
        max_message_bytes: usize,
        max_concurrent_calls: usize,
        worker_threads: usize,
        max_connections: usize,
        max_streams_per_connection: u32,
        idle_timeout: f64,
        max_header_bytes: usize,
        max_answer_bytes: usize,
        tls_cert_file: Option<std::path::PathBuf>,
        tls_key_file: Option<std::path::PathBuf>,
        tls_client_ca_file: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let tls = match (tls_cert_file, tls_key_file) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: tls_client_ca_file,
            }),
            (None, None) if tls_client_ca_file.is_none() => None,
            _ => {
                return Err(PyValueError::new_err(
                    "tls_cert_file and tls_key_file go together (and a client CA needs both)",
                ))
            }
        };
        if !(idle_timeout.is_finite() && idle_timeout > 0.0) {
            return Err(PyValueError::new_err(
                "idle_timeout must be a positive number of seconds",
            ));
        }
        let limits = EdgeLimits {
            max_connections,
            max_streams_per_connection,
            idle_timeout: Duration::from_secs_f64(idle_timeout),
            max_header_bytes,
            max_answer_bytes,
        };
        let config = FrontConfig {
            limits,
            tls,
            listen,
            methods,
            max_message_bytes,
            max_concurrent_calls,
            worker_threads,
        };
        // Bind errors name their address; the others (TLS files) say what they are.
        let front = py
            .detach(|| Front::start(config))
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let queue = front.queue().clone();
        let ports = front.ports().to_vec();
        Ok(NativeFront {
            front: Mutex::new(Some(front)),
            queue,
            ports,
        })
    }

    /// The port of each listener, in the order given (0 for a unix socket;
    /// the one chosen, when asked for port 0).
    #[getter]
    fn ports(&self) -> Vec<u16> {
        self.ports.clone()
    }

    /// Answer bytes not yet written to their clients' sockets.
    #[getter]
    fn answer_bytes(&self) -> usize {
        self.front
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, Front::answer_bytes)
    }

    /// How many times changed TLS files were loaded (0 without TLS).
    #[getter]
    fn tls_reloads(&self) -> u64 {
        self.front
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, Front::tls_reloads)
    }

    /// Every event queued, as `(kind, call, message, compressed)` tuples (`[]`
    /// if none); `compressed`: the message arrived compressed.
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
                let compressed = pyo3::types::PyBool::new(py, event.compressed)
                    .to_owned()
                    .into_any();
                PyTuple::new(py, [kind, call, message, compressed])
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
        &self.handle.peer.address
    }

    /// The client certificate (DER) the TLS handshake verified; None without mTLS.
    #[getter]
    fn peer_certificate<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.handle
            .peer
            .certificate
            .as_ref()
            .map(|der| PyBytes::new(py, der))
    }

    /// True for client and bidi streams (requests come one per `pull`).
    #[getter]
    fn request_streaming(&self) -> bool {
        self.handle.request_streaming
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

    /// Send one response message of a stream; `compress=False` exempts it
    /// from the call's compression. False once the call is over.
    #[pyo3(signature = (message, compress=true))]
    fn send(&self, message: &[u8], compress: bool) -> bool {
        self.handle
            .send(bytes::Bytes::copy_from_slice(message), compress)
    }

    /// Send the initial metadata now (else it goes, empty, with the first
    /// answer). False once the call is over.
    fn send_headers(&self, metadata: Vec<(String, Bound<'_, PyAny>)>) -> PyResult<bool> {
        let metadata = metadata
            .into_iter()
            .map(metadata_value)
            .collect::<PyResult<Vec<_>>>()?;
        Ok(self.handle.send_headers(metadata))
    }

    /// Compress the answers if the client accepts gzip or deflate (only
    /// before the first answer is sent).
    fn set_compression(&self, on: bool) {
        self.handle.set_compression(on);
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

    /// Hold `size` bytes of the answer budget for an answer about to be
    /// built (given back when an answer or the status is handed over). None
    /// when admitted, else why not: the call should end RESOURCE_EXHAUSTED.
    fn reserve_answer(&self, size: usize) -> Option<String> {
        self.handle.reserve_answer(size).err()
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
