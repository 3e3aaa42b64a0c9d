"""Type stub of the Rust extension `stratad._core` (see docs/native.md).

Import `stratad.native` instead of this module.
"""

from collections.abc import Sequence
from typing import final

__all__ = [
    "DEFAULT_AVG_CHUNK",
    "DEFAULT_MAX_CHUNK",
    "DEFAULT_MIN_CHUNK",
    "FORMAT_VERSION",
    "FRAME_HEADER_SIZE",
    "MAX_DELTA_DEPTH",
    "CrystalIndex",
    "Digester",
    "FrontCall",
    "NativeChannel",
    "NativeFront",
    "chunk_boundaries",
    "common_prefix_length",
    "compress",
    "decode_delta_frame",
    "decode_frame",
    "decompress",
    "detect_entity_types",
    "digest_hex",
    "encode_delta_frame",
    "encode_delta_frame_always",
    "encode_frame",
    "frame_delta_base",
    "frame_digest_hex",
    "generalize_goal",
    "tokenize",
    "verify_frame",
    "with_delta_depth",
]

DEFAULT_MIN_CHUNK: int
DEFAULT_AVG_CHUNK: int
DEFAULT_MAX_CHUNK: int
FRAME_HEADER_SIZE: int
FORMAT_VERSION: int
MAX_DELTA_DEPTH: int

def digest_hex(data: bytes) -> str:
    """Lowercase hex BLAKE3 digest of `data` (64 characters)."""

def common_prefix_length(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of two byte strings."""

@final
class Digester:
    """A BLAKE3 digest fed piece by piece; `copy()` keeps its progress so far."""

    def __init__(self) -> None: ...
    def update(self, data: bytes) -> None:
        """Feeds the next bytes."""
    def copy(self) -> Digester:
        """A digester that continues from here independently."""
    @property
    def count(self) -> int:
        """Bytes fed so far."""
    def hexdigest(self) -> str:
        """Lowercase hex digest of everything fed so far."""

def chunk_boundaries(
    data: bytes, min_size: int = 2048, avg_size: int = 8192, max_size: int = 32768
) -> list[tuple[int, int]]:
    """FastCDC 2020 cut points of `data` as (offset, length) pairs."""

def compress(data: bytes, level: int = 3) -> bytes:
    """One zstd frame of `data` (content size recorded)."""

def decompress(data: bytes, max_size: int) -> bytes:
    """Decompress one zstd frame, producing at most `max_size` bytes."""

def encode_frame(data: bytes, level: int = 3) -> bytes:
    """The object frame of `data` (zstd, or raw when zstd is not smaller)."""

def decode_frame(frame: bytes, max_size: int) -> bytes:
    """The data of a frame, after checking its header, sizes and digest."""

def verify_frame(frame: bytes, max_size: int) -> str:
    """As `decode_frame`, but return only the digest hex."""

def frame_digest_hex(frame: bytes) -> str:
    """The digest hex recorded in a frame's (checked) header."""

def encode_delta_frame(
    data: bytes, base: bytes, base_depth: int, level: int = 3, plain: bytes | None = None
) -> bytes:
    """The frame of `data` as a delta on `base` when that is smaller, else its
    plain frame (`plain`, when the caller already has it)."""

def encode_delta_frame_always(data: bytes, base: bytes, base_depth: int, level: int = 3) -> bytes:
    """The delta frame of `data` on `base` whatever its size (no plain frame is
    made to compare with); `base_depth` must be below the chain limit."""

def with_delta_depth(frame: bytes, depth: int) -> bytes:
    """A delta frame with its depth set to `depth` (its base's depth + 1)."""

def decode_delta_frame(frame: bytes, base: bytes, max_size: int) -> bytes:
    """The data of a delta frame, decoded against its base's data."""

def frame_delta_base(frame: bytes) -> tuple[str, int] | None:
    """(base digest hex, depth) of a delta frame; None for a plain frame."""

def tokenize(text: str) -> list[str]:
    """Keyword tokens of `text`, unique, in order of first appearance."""

def generalize_goal(goal: str) -> str:
    """Goal with specific values replaced by placeholders."""

def detect_entity_types(text: str) -> list[str]:
    """Entity types found in `text`, unique, in order of first appearance."""

@final
class CrystalIndex:
    """A crystal library's search structure: goal-token inverted index, tool sets,
    effectiveness-boosted top-k, the novelty check and the eviction order."""

    def __new__(cls) -> CrystalIndex: ...
    def add(
        self,
        order: int,
        goal_tokens: Sequence[str],
        tools: Sequence[str],
        effectiveness: float,
        reuse_count: int,
    ) -> int:
        """Add a crystal; return its slot."""
    def update(self, slot: object, effectiveness: float, reuse_count: int) -> bool:
        """Set a slot's effectiveness and reuse count; return whether it exists."""
    def remove(self, slot: object) -> bool:
        """Remove a slot's crystal; return whether there was one."""
    def __len__(self) -> int: ...
    def __contains__(self, slot: object, /) -> bool: ...
    def top_k(self, query_tokens: Sequence[str], k: int) -> list[tuple[int, float, float]]:
        """The best `k` crystals for `query_tokens`, as (slot, score, similarity)."""
    def find_similar(
        self,
        goal_tokens: Sequence[str],
        tools: Sequence[str],
        goal_threshold: float,
        tool_threshold: float,
    ) -> tuple[int, float, float] | None:
        """The most similar crystal above both thresholds, as (slot, goal_similarity,
        tool_similarity), or None."""
    def least_effective(self, exclude: int | None = None) -> int | None:
        """The slot to evict next (other than `exclude`), or None."""
    def stats(self, effective_threshold: float) -> tuple[int, int, int, float]:
        """(count, effective count, total reuses, sum of effectiveness)."""
    def memory_usage(self) -> int:
        """An estimate of the heap bytes the index holds."""

@final
class NativeFront:
    """The native gRPC front door's HTTP/2 server, on its own threads (see
    python/stratad/server/front.py, its only user)."""

    def __new__(
        cls,
        listen: Sequence[str],
        methods: Sequence[tuple[str, bool]],
        *,
        max_message_bytes: int,
        max_concurrent_calls: int,
        worker_threads: int,
        max_connections: int,
        max_streams_per_connection: int,
        idle_timeout: float,
        max_header_bytes: int,
        max_answer_bytes: int,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        tls_client_ca_file: str | None = None,
    ) -> NativeFront:
        """Bind every `listen` address (host:port) and serve `methods` ((path,
        requests are a stream)), with TLS if given the PEM files (mTLS with a
        client CA); raises OSError if it cannot bind or load them."""
    @property
    def ports(self) -> list[int]:
        """The port of each listener, in order (0 for a unix socket)."""
    @property
    def answer_bytes(self) -> int:
        """Answer bytes not yet written to their clients' sockets."""
    @property
    def tls_reloads(self) -> int:
        """How many times changed TLS files were loaded (0 without TLS)."""
    @property
    def wake_fd(self) -> int:
        """Readable when events are queued: read it empty, then take_events()."""
    def take_events(self) -> list[tuple[int, FrontCall, bytes | None, bool]]:
        """Every queued event as (kind, call, message, compressed); [] if none."""
    def shutdown(self, grace: float) -> None:
        """Stop accepting; wait up to `grace` s for calls in progress; close."""

@final
class NativeChannel:
    """A plaintext HTTP/2 connection to a daemon for unary gRPC calls (see
    python/stratad/sdk/native.py, its only user). Connects on first use and
    again after the connection breaks."""

    def __new__(cls, address: str, *, max_receive_bytes: int) -> NativeChannel:
        """`address`: host:port or unix:/path; raises ValueError for others."""
    def unary(
        self,
        method: str,
        request: bytes,
        metadata: Sequence[tuple[str, str | bytes]],
        timeout: float,
    ) -> tuple[bytes | None, int, str, tuple[tuple[str, str | bytes], ...], bool]:
        """Call `method` (/package.Service/Method) with an encoded request, waiting
        at most `timeout` s without the GIL: (response or None, status code,
        details, trailing metadata, committed). A failure is a status, not an
        exception; `committed` is False when the daemon had not started
        answering (the call did not run). Signals are checked every 50 ms
        while it waits: an exception a signal handler raises (Ctrl-C's
        KeyboardInterrupt) abandons the call and is raised here."""

@final
class FrontCall:
    """One call of the native front door."""

    @property
    def id(self) -> int: ...
    @property
    def method(self) -> str: ...
    @property
    def peer(self) -> str: ...
    @property
    def peer_certificate(self) -> bytes | None:
        """The client certificate (DER) the TLS handshake verified; None without mTLS."""
    @property
    def request_streaming(self) -> bool: ...
    @property
    def metadata(self) -> tuple[tuple[str, str | bytes], ...]: ...
    def time_remaining(self) -> float | None:
        """Seconds left before the caller's deadline; None without one."""
    def send(self, message: bytes, compress: bool = True) -> bool:
        """Send one response message of a stream; False once the call is over."""
    def send_headers(self, metadata: Sequence[tuple[str, str | bytes]]) -> bool:
        """Send the initial metadata now; False once the call is over."""
    def set_compression(self, on: bool) -> None:
        """Compress the answers if the client accepts gzip or deflate."""
    def finish(
        self,
        response: bytes | None,
        code: int,
        message: str,
        trailers: Sequence[tuple[str, str | bytes]] = ...,
    ) -> bool:
        """End the call (only the first finish counts)."""
    def reserve_answer(self, size: int) -> str | None:
        """Hold ``size`` bytes of the answer budget for an answer about to be
        built; None when admitted, else why not (end the call RESOURCE_EXHAUSTED)."""
    def pull(self) -> None:
        """Ask for the next request message of a stream."""
