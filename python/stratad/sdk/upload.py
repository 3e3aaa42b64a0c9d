"""Client-side chunked uploads: send the daemon only what it lacks.

Sending a whole state at every step is transport-bound (gRPC moves 40-70 MB/s
here). Instead the SDK cuts the state with the same FastCDC parameters as the
daemon, hashes each chunk, and sends the chunk list relative to the previous
checkpoint of the session (keep the first N chunks, then these) plus framed
copies of the chunks the daemon has not seen from this client. This is the
Bazel remote-cache FindMissingBlobs pattern without the extra round trip: if
the client's belief is wrong (GC, another client, a wiped daemon), the daemon
answers FAILED_PRECONDITION and the SDK asks FindMissingChunks and retries.

This module is sans-I/O: the sync and async clients drive it.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

from stratad import native
from stratad.api.v1 import checkpoint_pb2

#: States below this size are sent whole: one chunk gains nothing from dedup.
CHUNKED_MIN_BYTES = 16 << 10
#: Digests remembered as "the daemon has this" (LRU, per client).
KNOWN_DIGESTS = 1 << 20


@dataclass
class _LastSave:
    checkpoint_id: str
    digests: list[str]


@dataclass
class UploadPlan:
    request: checkpoint_pb2.SaveStateRequest
    key: tuple[str, str]
    digests: list[str]
    chunk_data: dict[str, bytes]


class Uploader:
    def __init__(self) -> None:
        # A blocking Client may be shared by threads: every access to the two
        # maps below holds this lock (the chunking and framing do not).
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], _LastSave] = {}
        self._known: collections.OrderedDict[str, None] = collections.OrderedDict()

    def plan(self, request: checkpoint_pb2.SaveStateRequest) -> UploadPlan | None:
        """Turn a whole-state request into a chunked one (None: send as is)."""
        data = request.data
        if len(data) < CHUNKED_MIN_BYTES:
            return None
        cuts = native.chunk_boundaries(data)
        slices = [data[off : off + n] for off, n in cuts]
        digests = [native.digest_hex(s) for s in slices]
        key = (request.session_id, request.namespace)
        chunked = checkpoint_pb2.ChunkedState(size=len(data), digest=native.digest_hex(data))
        keep = 0
        with self._lock:
            last = self._last.get(key)
            known = {d for d in digests if d in self._known}
        if last is not None:
            keep = _common_prefix(last.digests, digests)
            if keep:
                chunked.base_checkpoint_id = last.checkpoint_id
                chunked.keep = keep
        sent: set[str] = set()
        for digest, piece in zip(digests[keep:], slices[keep:], strict=True):
            chunked.chunks.add(digest=digest, length=len(piece))
            if digest not in known and digest not in sent:
                chunked.frames.append(native.encode_frame(piece))
                sent.add(digest)
        out = checkpoint_pb2.SaveStateRequest()
        out.CopyFrom(request)
        out.ClearField("data")
        out.chunked.CopyFrom(chunked)
        return UploadPlan(out, key, digests, dict(zip(digests, slices, strict=True)))

    def with_frames(self, plan: UploadPlan, missing: list[str]) -> UploadPlan:
        """After FAILED_PRECONDITION: forget what the daemon lacks, upload all of it."""
        with self._lock:
            for digest in missing:
                self._known.pop(digest, None)
        chunked = plan.request.chunked
        present = {native.frame_digest_hex(f) for f in chunked.frames}
        for digest in dict.fromkeys(missing):
            if digest not in present and digest in plan.chunk_data:
                chunked.frames.append(native.encode_frame(plan.chunk_data[digest]))
        return plan

    def without_base(self, plan: UploadPlan) -> UploadPlan:
        """The base checkpoint is gone: list every chunk, upload the unknown ones."""
        with self._lock:
            self._last.pop(plan.key, None)
        request = checkpoint_pb2.SaveStateRequest()
        request.CopyFrom(plan.request)
        request.ClearField("chunked")
        request.data = b"".join(plan.chunk_data[d] for d in plan.digests)
        replanned = self.plan(request)
        assert replanned is not None
        return replanned

    def chunk_digests(self, plan: UploadPlan) -> list[str]:
        return [ref.digest for ref in plan.request.chunked.chunks]

    def saved(self, plan: UploadPlan, checkpoint_id: str) -> None:
        with self._lock:
            self._last[plan.key] = _LastSave(checkpoint_id, plan.digests)
            for digest in plan.digests:
                self._known[digest] = None
                self._known.move_to_end(digest)
            while len(self._known) > KNOWN_DIGESTS:
                self._known.popitem(last=False)

    def forget_session(self, session_id: str) -> None:
        with self._lock:
            for key in [k for k in self._last if k[0] == session_id]:
                del self._last[key]


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
