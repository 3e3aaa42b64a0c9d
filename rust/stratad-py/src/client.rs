//! `stratad._core.NativeChannel`: the Python face of `stratad_front::UnaryClient`
//! (see python/stratad/sdk/native.py, its only user).

use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};
use stratad_front::{MetadataValue, Target, UnaryClient};

use crate::front::metadata_value;

/// A plaintext HTTP/2 connection to a daemon for unary gRPC calls.
#[pyclass(frozen, module = "stratad._core")]
pub struct NativeChannel {
    client: UnaryClient,
}

#[pymethods]
impl NativeChannel {
    #[new]
    #[pyo3(signature = (address, *, max_receive_bytes))]
    fn new(address: &str, max_receive_bytes: usize) -> PyResult<Self> {
        let target = Target::parse(address).map_err(PyValueError::new_err)?;
        let client = UnaryClient::new(target, max_receive_bytes)
            .map_err(|e| PyOSError::new_err(format!("cannot start a client runtime: {e}")))?;
        Ok(NativeChannel { client })
    }

    /// Call `method` with the encoded `request`; wait at most `timeout`
    /// seconds, without the GIL. Returns ``(response or None, code, details,
    /// trailers, committed)``; a failed call is a status, never an exception.
    fn unary<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        request: &[u8],
        metadata: Vec<(String, Bound<'py, PyAny>)>,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyTuple>> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(PyValueError::new_err(
                "timeout must be a positive number of seconds",
            ));
        }
        let metadata = metadata
            .into_iter()
            .map(metadata_value)
            .collect::<PyResult<Vec<_>>>()?;
        let timeout = Duration::from_secs_f64(timeout.min(1e9));
        // Signals are checked while the call waits (every INTERRUPT_CHECK):
        // Ctrl-C raises KeyboardInterrupt then, not at the deadline.
        let mut raised: Option<PyErr> = None;
        let reply = py.detach(|| {
            self.client
                .call_interruptible(method, request, &metadata, timeout, || {
                    Python::attach(|py| py.check_signals())
                        .map_err(|e| raised = Some(e))
                        .is_err()
                })
        });
        let Some(reply) = reply else {
            return Err(raised.unwrap_or_else(|| PyOSError::new_err("call interrupted")));
        };
        let message = match &reply.message {
            Some(bytes) => PyBytes::new(py, bytes).into_any(),
            None => py.None().into_bound(py),
        };
        let trailers = reply.trailers.iter().map(|(key, value)| {
            let value = match value {
                MetadataValue::Text(text) => PyString::new(py, text).into_any(),
                MetadataValue::Binary(bytes) => PyBytes::new(py, bytes).into_any(),
            };
            PyTuple::new(py, [PyString::new(py, key).into_any(), value])
        });
        let trailers = PyTuple::new(py, trailers.collect::<PyResult<Vec<_>>>()?)?;
        (
            message,
            reply.code,
            reply.details,
            trailers,
            reply.committed,
        )
            .into_pyobject(py)
    }
}
