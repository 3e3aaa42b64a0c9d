//! `stratad._core`: the Python face of `stratad-core`.
//!
//! This crate only converts types, releases the GIL around work on inputs
//! larger than 4 KiB (so that both cores work while the asyncio loop runs
//! other calls), and maps the core's errors to the exception classes of
//! `stratad.errors` in one place (`to_pyerr`). All logic, and its tests,
//! live in `stratad-core`; `python/stratad/native.py` is the only Python
//! module that imports this one, and `python/stratad/_core.pyi` describes it.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use pyo3::exceptions::PyOverflowError;
use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyType};
use stratad_core as core;

mod client;
mod front;

/// Inputs above this many bytes (or items) are processed with the GIL
/// released; below it, releasing and re-taking the GIL costs more than it
/// gains.
const DETACH_THRESHOLD: usize = 4096;

// The text signatures below spell the default chunk sizes out (so that
// `help()` and stubtest see real values); this fails to compile if they drift.
const _: () = assert!(
    core::DEFAULT_MIN_CHUNK == 2048
        && core::DEFAULT_AVG_CHUNK == 8192
        && core::DEFAULT_MAX_CHUNK == 32768
);

static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static CORRUPT_OBJECT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DECOMPRESSION_LIMIT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INTERNAL: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// The one mapping from core errors to `stratad.errors` exceptions.
fn to_pyerr(py: Python<'_>, error: core::Error) -> PyErr {
    let (cell, name) = match &error {
        core::Error::InvalidInput(_) => (&INVALID_ARGUMENT, "InvalidArgumentError"),
        core::Error::Corrupt(_) => (&CORRUPT_OBJECT, "CorruptObjectError"),
        core::Error::TooLarge { .. } => (&DECOMPRESSION_LIMIT, "DecompressionLimitError"),
        core::Error::Internal(_) => (&INTERNAL, "InternalError"),
    };
    match cell.import(py, "stratad.errors", name) {
        Ok(class) => PyErr::from_type(class.clone(), error.to_string()),
        // stratad.errors is part of the same package; if it cannot be
        // imported, that failure is the more useful error to show.
        Err(import_error) => import_error,
    }
}

/// Converts a core result, mapping its error with [`to_pyerr`].
fn check<T>(py: Python<'_>, result: core::Result<T>) -> PyResult<T> {
    result.map_err(|error| to_pyerr(py, error))
}

fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    to_pyerr(py, core::Error::InvalidInput(message.into()))
}

/// Runs `work` with the GIL released when `size` is above the threshold.
fn run<T, F>(py: Python<'_>, size: usize, work: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    if size > DETACH_THRESHOLD {
        py.detach(work)
    } else {
        work()
    }
}

/// A Python `int` argument. Ints beyond 64 bits saturate here, so that each
/// use can decide: a byte limit takes any non-negative int, other arguments
/// report an `InvalidArgumentError` rather than an `OverflowError`.
#[derive(Clone, Copy)]
struct Int(i128);

impl<'a, 'py> FromPyObject<'a, 'py> for Int {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<i64>() {
            Ok(value) => Ok(Int(i128::from(value))),
            Err(error) if error.is_instance_of::<PyOverflowError>(obj.py()) => {
                if obj.gt(0)? {
                    Ok(Int(i128::MAX))
                } else {
                    Ok(Int(i128::MIN))
                }
            }
            Err(error) => Err(error),
        }
    }
}

impl Int {
    /// A size or count: `0..=usize::MAX`.
    fn size(self, py: Python<'_>, name: &str) -> PyResult<usize> {
        match usize::try_from(self.0) {
            Ok(value) => Ok(value),
            Err(_) if self.0 < 0 => Err(invalid(py, format!("{name} must be >= 0"))),
            Err(_) => Err(invalid(py, format!("{name} is too large"))),
        }
    }

    /// A result count: any non-negative int (more than there can be is all).
    fn count(self, py: Python<'_>, name: &str) -> PyResult<usize> {
        if self.0 < 0 {
            return Err(invalid(py, format!("{name} must be >= 0")));
        }
        Ok(usize::try_from(self.0).unwrap_or(usize::MAX))
    }

    /// A byte limit: any non-negative int (above `u64::MAX` means no limit).
    fn limit(self, py: Python<'_>, name: &str) -> PyResult<u64> {
        if self.0 < 0 {
            return Err(invalid(py, format!("{name} must be >= 0")));
        }
        Ok(u64::try_from(self.0).unwrap_or(u64::MAX))
    }

    /// A zstd level (its range is checked by the core).
    fn level(self, py: Python<'_>) -> PyResult<i32> {
        i32::try_from(self.0).map_err(|_| invalid(py, "compression level is out of range"))
    }
}

/// Lowercase hex BLAKE3 digest of `data` (64 characters).
#[pyfunction]
fn digest_hex(py: Python<'_>, data: &[u8]) -> String {
    run(py, data.len(), || core::digest_hex(data))
}

/// FastCDC 2020 cut points of `data` as (offset, length) pairs.
#[pyfunction]
#[pyo3(
    signature = (data, min_size = Int(core::DEFAULT_MIN_CHUNK as i128), avg_size = Int(core::DEFAULT_AVG_CHUNK as i128), max_size = Int(core::DEFAULT_MAX_CHUNK as i128)),
    text_signature = "(data, min_size=2048, avg_size=8192, max_size=32768)"
)]
fn chunk_boundaries(
    py: Python<'_>,
    data: &[u8],
    min_size: Int,
    avg_size: Int,
    max_size: Int,
) -> PyResult<Vec<(usize, usize)>> {
    let (min, avg, max) = (
        min_size.size(py, "min_size")?,
        avg_size.size(py, "avg_size")?,
        max_size.size(py, "max_size")?,
    );
    let result = run(py, data.len(), || {
        core::chunk_boundaries(data, min, avg, max)
    });
    check(py, result)
}

/// One zstd frame of `data` (content size recorded).
#[pyfunction]
#[pyo3(signature = (data, level = Int(3)), text_signature = "(data, level=3)")]
fn compress<'py>(py: Python<'py>, data: &[u8], level: Int) -> PyResult<Bound<'py, PyBytes>> {
    let level = level.level(py)?;
    let result = run(py, data.len(), || core::compress(data, level));
    Ok(PyBytes::new(py, &check(py, result)?))
}

/// Decompresses one zstd frame, producing at most `max_size` bytes.
#[pyfunction]
fn decompress<'py>(py: Python<'py>, data: &[u8], max_size: Int) -> PyResult<Bound<'py, PyBytes>> {
    let max_size = max_size.limit(py, "max_size")?;
    let result = run(py, data.len(), || core::decompress(data, max_size));
    Ok(PyBytes::new(py, &check(py, result)?))
}

/// The object frame of `data` (zstd, or raw when zstd is not smaller).
#[pyfunction]
#[pyo3(signature = (data, level = Int(3)), text_signature = "(data, level=3)")]
fn encode_frame<'py>(py: Python<'py>, data: &[u8], level: Int) -> PyResult<Bound<'py, PyBytes>> {
    let level = level.level(py)?;
    let result = run(py, data.len(), || core::encode_frame(data, level));
    Ok(PyBytes::new(py, &check(py, result)?))
}

/// The data of a frame, after checking its header, sizes and digest.
#[pyfunction]
fn decode_frame<'py>(
    py: Python<'py>,
    frame: &[u8],
    max_size: Int,
) -> PyResult<Bound<'py, PyBytes>> {
    let max_size = max_size.limit(py, "max_size")?;
    let result = run(py, frame.len(), || core::decode_frame(frame, max_size));
    Ok(PyBytes::new(py, &check(py, result)?))
}

/// As `decode_frame`, but returns only the digest hex.
#[pyfunction]
fn verify_frame(py: Python<'_>, frame: &[u8], max_size: Int) -> PyResult<String> {
    let max_size = max_size.limit(py, "max_size")?;
    let result = run(py, frame.len(), || core::verify_frame(frame, max_size));
    Ok(core::to_hex(&check(py, result)?))
}

/// The digest hex recorded in a frame's (checked) header.
#[pyfunction]
fn frame_digest_hex(py: Python<'_>, frame: &[u8]) -> PyResult<String> {
    Ok(core::to_hex(&check(py, core::frame_digest(frame))?))
}

/// A delta depth argument: beyond 255 it saturates (any depth past the
/// chain limit is treated alike).
fn depth_arg(py: Python<'_>, value: Int, name: &str) -> PyResult<u8> {
    Ok(u8::try_from(value.limit(py, name)?.min(255)).unwrap_or(u8::MAX))
}

/// The frame of `data` as a delta on `base` when that is smaller, else its
/// plain frame (`plain`, when the caller already has it).
#[pyfunction]
#[pyo3(
    signature = (data, base, base_depth, level = Int(3), plain = None),
    text_signature = "(data, base, base_depth, level=3, plain=None)"
)]
fn encode_delta_frame<'py>(
    py: Python<'py>,
    data: &[u8],
    base: &[u8],
    base_depth: Int,
    level: Int,
    plain: Option<&[u8]>,
) -> PyResult<Bound<'py, PyBytes>> {
    let level = level.level(py)?;
    let depth = depth_arg(py, base_depth, "base_depth")?;
    let result = run(py, data.len(), || {
        core::encode_delta_frame_beside(data, base, depth, level, plain)
    });
    Ok(PyBytes::new(py, &check(py, result)?))
}

/// The delta frame of `data` on `base` whatever its size (no plain frame is
/// made to compare with); `base_depth` must be below the chain limit.
#[pyfunction]
#[pyo3(
    signature = (data, base, base_depth, level = Int(3)),
    text_signature = "(data, base, base_depth, level=3)"
)]
fn encode_delta_frame_always<'py>(
    py: Python<'py>,
    data: &[u8],
    base: &[u8],
    base_depth: Int,
    level: Int,
) -> PyResult<Bound<'py, PyBytes>> {
    let level = level.level(py)?;
    let depth = depth_arg(py, base_depth, "base_depth")?;
    let result = run(py, data.len(), || {
        core::encode_delta_frame_always(data, base, depth, level)
    });
    Ok(PyBytes::new(py, &check(py, result)?))
}

/// A delta frame with its depth set to `depth` (its base's depth + 1).
#[pyfunction]
fn with_delta_depth<'py>(
    py: Python<'py>,
    frame: &[u8],
    depth: Int,
) -> PyResult<Bound<'py, PyBytes>> {
    let depth = depth_arg(py, depth, "depth")?;
    let result = check(py, core::with_delta_depth(frame, depth))?;
    Ok(PyBytes::new(py, &result))
}

/// Length of the longest common prefix of two byte strings.
#[pyfunction]
fn common_prefix_length(py: Python<'_>, a: &[u8], b: &[u8]) -> usize {
    run(py, a.len().min(b.len()), || core::common_prefix_len(a, b))
}

/// A BLAKE3 digest fed piece by piece; `copy()` keeps its progress so far.
#[pyclass(frozen, module = "stratad._core")]
#[derive(Default)]
struct Digester {
    inner: Mutex<core::Digester>,
}

impl Digester {
    fn lock(&self) -> MutexGuard<'_, core::Digester> {
        // A panic cannot leave a digester half-updated in a way that matters
        // more than the panic itself: keep serving.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[pymethods]
impl Digester {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes.
    fn update(&self, py: Python<'_>, data: &[u8]) {
        run(py, data.len(), || self.lock().update(data));
    }

    /// A digester that continues from here independently.
    fn copy(&self) -> Self {
        Self {
            inner: Mutex::new(self.lock().clone()),
        }
    }

    /// Bytes fed so far.
    #[getter]
    fn count(&self) -> u64 {
        self.lock().count()
    }

    /// Lowercase hex digest of everything fed so far.
    fn hexdigest(&self) -> String {
        self.lock().hex()
    }

    fn __repr__(&self) -> String {
        format!("Digester(<{} bytes>)", self.lock().count())
    }
}

/// The data of a delta frame, decoded against its base's data.
#[pyfunction]
fn decode_delta_frame<'py>(
    py: Python<'py>,
    frame: &[u8],
    base: &[u8],
    max_size: Int,
) -> PyResult<Bound<'py, PyBytes>> {
    let max_size = max_size.limit(py, "max_size")?;
    let result = run(py, frame.len() + base.len(), || {
        core::decode_delta_frame(frame, base, max_size)
    });
    Ok(PyBytes::new(py, &check(py, result)?))
}

/// (base digest hex, depth) of a delta frame; None for a plain frame.
#[pyfunction]
fn frame_delta_base(py: Python<'_>, frame: &[u8]) -> PyResult<Option<(String, u8)>> {
    let base = check(py, core::frame_delta_base(frame))?;
    Ok(base.map(|(digest, depth)| (core::to_hex(&digest), depth)))
}

/// Keyword tokens of `text`, unique, in order of first appearance.
#[pyfunction]
fn tokenize(py: Python<'_>, text: &str) -> Vec<String> {
    run(py, text.len(), || core::tokenize(text))
}

/// Goal with specific values replaced by placeholders.
#[pyfunction]
fn generalize_goal(py: Python<'_>, goal: &str) -> String {
    run(py, goal.len(), || core::generalize_goal(goal))
}

/// Entity types found in `text`, unique, in order of first appearance.
#[pyfunction]
fn detect_entity_types(py: Python<'_>, text: &str) -> Vec<String> {
    run(py, text.len(), || core::detect_entity_types(text))
}

/// A crystal library's search structure (see docs/native.md): goal-token
/// inverted index, tool sets, effectiveness-boosted top-k, the novelty check
/// and the eviction order.
///
/// Safe to share between threads: searches on a large index run with the GIL
/// released under a read lock; changes take the write lock.
#[pyclass(frozen, module = "stratad._core")]
struct CrystalIndex {
    inner: RwLock<core::similarity::CrystalIndex>,
}

impl CrystalIndex {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, core::similarity::CrystalIndex> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, core::similarity::CrystalIndex> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A slot argument: `None` for anything that cannot be a slot.
fn slot_of(value: &Bound<'_, PyAny>) -> Option<u32> {
    value.extract::<u32>().ok()
}

#[pymethods]
impl CrystalIndex {
    #[new]
    fn new() -> Self {
        Self {
            inner: RwLock::new(core::similarity::CrystalIndex::new()),
        }
    }

    /// Adds a crystal; returns its slot.
    fn add(
        &self,
        py: Python<'_>,
        order: Int,
        goal_tokens: Vec<String>,
        tools: Vec<String>,
        effectiveness: f64,
        reuse_count: Int,
    ) -> PyResult<u32> {
        let order = order.limit(py, "order")?;
        let reuse_count = reuse_count.limit(py, "reuse_count")?;
        let result = self
            .write()
            .add(order, &goal_tokens, &tools, effectiveness, reuse_count);
        check(py, result)
    }

    /// Sets a slot's effectiveness and reuse count; returns whether it exists.
    fn update(
        &self,
        py: Python<'_>,
        slot: &Bound<'_, PyAny>,
        effectiveness: f64,
        reuse_count: Int,
    ) -> PyResult<bool> {
        let reuse_count = reuse_count.limit(py, "reuse_count")?;
        let Some(slot) = slot_of(slot) else {
            return Ok(false);
        };
        let result = self.write().update(slot, effectiveness, reuse_count);
        check(py, result)
    }

    /// Removes a slot's crystal; returns whether there was one.
    fn remove(&self, slot: &Bound<'_, PyAny>) -> bool {
        slot_of(slot).is_some_and(|slot| self.write().remove(slot))
    }

    fn __len__(&self) -> usize {
        self.read().len()
    }

    fn __contains__(&self, slot: &Bound<'_, PyAny>) -> bool {
        slot_of(slot).is_some_and(|slot| self.read().contains(slot))
    }

    /// The best `k` crystals for `query_tokens`, as (slot, score, similarity).
    fn top_k(
        &self,
        py: Python<'_>,
        query_tokens: Vec<String>,
        k: Int,
    ) -> PyResult<Vec<(u32, f64, f64)>> {
        let k = k.count(py, "k")?;
        let size = self.__len__();
        let matches = run(py, size, || self.read().top_k(&query_tokens, k));
        Ok(matches
            .into_iter()
            .map(|m| (m.slot, m.score, m.similarity))
            .collect())
    }

    /// The most similar crystal above both thresholds, as (slot,
    /// goal_similarity, tool_similarity), or None.
    fn find_similar(
        &self,
        py: Python<'_>,
        goal_tokens: Vec<String>,
        tools: Vec<String>,
        goal_threshold: f64,
        tool_threshold: f64,
    ) -> PyResult<Option<(u32, f64, f64)>> {
        let size = self.__len__();
        let result = run(py, size, || {
            self.read()
                .find_similar(&goal_tokens, &tools, goal_threshold, tool_threshold)
        });
        Ok(check(py, result)?.map(|s| (s.slot, s.goal_similarity, s.tool_similarity)))
    }

    /// The slot to evict next (other than `exclude`), or None.
    #[pyo3(signature = (exclude=None))]
    fn least_effective(&self, py: Python<'_>, exclude: Option<i64>) -> Option<u32> {
        // An exclusion that cannot be a slot excludes nothing.
        let exclude = exclude.and_then(|e| u32::try_from(e).ok());
        let size = self.__len__();
        run(py, size, || self.write().least_effective(exclude))
    }

    /// (count, effective count, total reuses, sum of effectiveness).
    fn stats(&self, py: Python<'_>, effective_threshold: f64) -> (usize, usize, u64, f64) {
        let size = self.__len__();
        let stats = run(py, size, || self.read().stats(effective_threshold));
        (
            stats.count,
            stats.effective,
            stats.total_reuses,
            stats.effectiveness_sum,
        )
    }

    /// An estimate of the heap bytes the index holds.
    fn memory_usage(&self, py: Python<'_>) -> usize {
        let size = self.__len__();
        run(py, size, || self.read().memory_usage())
    }

    fn __repr__(&self) -> String {
        format!("CrystalIndex(<{} crystals>)", self.__len__())
    }
}

/// The native core of stratad (see docs/native.md). Import `stratad.native`
/// rather than this module.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DEFAULT_MIN_CHUNK", core::DEFAULT_MIN_CHUNK)?;
    m.add("DEFAULT_AVG_CHUNK", core::DEFAULT_AVG_CHUNK)?;
    m.add("DEFAULT_MAX_CHUNK", core::DEFAULT_MAX_CHUNK)?;
    m.add("FRAME_HEADER_SIZE", core::FRAME_HEADER_SIZE)?;
    m.add("FORMAT_VERSION", core::FORMAT_VERSION)?;
    m.add("MAX_DELTA_DEPTH", core::MAX_DELTA_DEPTH)?;
    m.add_class::<Digester>()?;
    m.add_class::<CrystalIndex>()?;
    m.add_class::<front::NativeFront>()?;
    m.add_class::<front::FrontCall>()?;
    m.add_class::<client::NativeChannel>()?;
    m.add_function(wrap_pyfunction!(digest_hex, m)?)?;
    m.add_function(wrap_pyfunction!(common_prefix_length, m)?)?;
    m.add_function(wrap_pyfunction!(chunk_boundaries, m)?)?;
    m.add_function(wrap_pyfunction!(compress, m)?)?;
    m.add_function(wrap_pyfunction!(decompress, m)?)?;
    m.add_function(wrap_pyfunction!(encode_frame, m)?)?;
    m.add_function(wrap_pyfunction!(decode_frame, m)?)?;
    m.add_function(wrap_pyfunction!(verify_frame, m)?)?;
    m.add_function(wrap_pyfunction!(frame_digest_hex, m)?)?;
    m.add_function(wrap_pyfunction!(encode_delta_frame, m)?)?;
    m.add_function(wrap_pyfunction!(encode_delta_frame_always, m)?)?;
    m.add_function(wrap_pyfunction!(with_delta_depth, m)?)?;
    m.add_function(wrap_pyfunction!(decode_delta_frame, m)?)?;
    m.add_function(wrap_pyfunction!(frame_delta_base, m)?)?;
    m.add_function(wrap_pyfunction!(tokenize, m)?)?;
    m.add_function(wrap_pyfunction!(generalize_goal, m)?)?;
    m.add_function(wrap_pyfunction!(detect_entity_types, m)?)?;
    Ok(())
}
