"""Client-side chunked uploads: send the daemon only what it lacks.

Sending a whole state at every step is transport-bound (gRPC moves 40-70 MB/s
here). Instead the SDK cuts the state with the same FastCDC parameters as the
daemon, hashes each chunk, and sends the chunk list relative to the previous
checkpoint of the session (keep the first N chunks, then these) plus framed
copies of the chunks the daemon has not seen from this client. This is the
Bazel remote-cache FindMissingBlobs pattern without the extra round trip: if
the client's belief is wrong (GC, another client, a wiped daemon), the daemon
answers FAILED_PRECONDITION and the SDK asks FindMissingChunks and retries.

Cutting and hashing the whole state again at every save would cost the
client more than the daemon's round trip. The previous state of each session
is kept (`StateCut`): the new one is compared with it, the chunks that end
before their first difference are taken as they were (FastCDC cuts depend
only on the bytes from a chunk's start to just past its end, so they would be
cut the same again), and the state digest resumes from a copy of the digester
taken where a kept chunk ends. Only the changed tail is cut and hashed; the
result is exactly what cutting the whole state gives
(tests/unit/test_upload_cut.py holds it to that).

This module is sans-I/O: the sync and async clients drive it.
"""

from __future__ import annotations

import bisect
import collections
import threading
from dataclasses import dataclass, field

from stratad import native
from stratad.api.v1 import checkpoint_pb2

#: States below this size are sent whole: one chunk gains nothing from dedup.
CHUNKED_MIN_BYTES = 16 << 10
#: Digests remembered as "the daemon has this" (LRU, per client).
KNOWN_DIGESTS = 1 << 20
#: Bytes of previous states kept to cut the next state of their session
#: incrementally (LRU by session, per client); beyond it, states are cut whole.
KEPT_STATE_BYTES = 256 << 20
#: Digester copies kept at the starts of a state's last chunks: a growing state
#: changes its last chunk or two, so the next digest resumes from one of these.
DIGEST_RESUME_POINTS = 4


@dataclass(frozen=True)
class StateCut:
    """A state cut into chunks, kept to cut the next state of its session."""

    data: bytes
    cuts: list[tuple[int, int]]  # (offset, length) per chunk
    digests: list[str]  # per chunk
    digest: str  # of the whole state
    #: chunk index -> digester fed with the bytes before that chunk.
    resume_points: dict[int, native.Digester] = field(default_factory=dict)
    #: Chunks taken from the previous state unchanged (not cut or hashed again).
    reused: int = 0


def cut_state(data: bytes, previous: StateCut | None = None) -> StateCut:
    """Cut and hash `data` as `native.chunk_boundaries` and `digest_hex` would,
    reusing what `previous` (an earlier state of the same session) shares with it."""
    keep = _reusable_chunks(previous, data)
    start = previous.cuts[keep - 1][0] + previous.cuts[keep - 1][1] if previous and keep else 0
    tail = native.chunk_boundaries(data[start:] if start else data)
    cuts = (previous.cuts[:keep] if previous else []) + [(start + o, n) for o, n in tail]
    digests = (previous.digests[:keep] if previous else []) + [
        native.digest_hex(data[o : o + n]) for o, n in cuts[keep:]
    ]
    # Resume the state digest at the latest copy taken at or before the first
    # recut chunk (the bytes before it are the same in both states).
    resume, digester = 0, native.Digester()
    earlier = [i for i in previous.resume_points if i <= keep] if previous else []
    if previous is not None and earlier:
        resume = max(earlier)
        digester = previous.resume_points[resume].copy()
    first_point = max(len(cuts) - DIGEST_RESUME_POINTS, resume)
    position = cuts[resume][0] if resume < len(cuts) else len(data)
    points: dict[int, native.Digester] = {}
    for index in range(first_point, len(cuts)):
        offset = cuts[index][0]
        if offset > position:
            digester.update(data[position:offset])
            position = offset
        points[index] = digester.copy()
    if position < len(data):
        digester.update(data[position:] if position else data)
    return StateCut(data, cuts, digests, digester.hexdigest(), points, keep)


#: FastCDC (v2020) reads the byte after a cut before cutting there, and scans
#: only while two more bytes follow: a cut of the previous state is a cut of
#: the next one when the bytes up to 2 past it are the same in both. 64 leaves
#: room; tests/unit/test_upload_cut.py holds the result to whole-state cutting.
_CUT_MARGIN = 64


def _reusable_chunks(previous: StateCut | None, data: bytes) -> int:
    """How many leading chunks of `previous` are chunks of `data` too: those
    ending at least `_CUT_MARGIN` bytes before the two states differ (or
    `data` ends). The last chunk is never one, as its end was the end of the
    data, not a cut the content chose."""
    if previous is None or len(previous.cuts) < 2:
        return 0
    limit = native.common_prefix_length(previous.data, data) - _CUT_MARGIN
    ends = [o + n for o, n in previous.cuts]
    return bisect.bisect_right(ends, limit)


@dataclass
class _LastSave:
    checkpoint_id: str
    digests: list[str]


@dataclass
class UploadPlan:
    request: checkpoint_pb2.SaveStateRequest
    key: tuple[str, str]
    cut: StateCut

    @property
    def digests(self) -> list[str]:
        return self.cut.digests

    def chunk(self, digest: str) -> bytes | None:
        """The bytes of one of the state's chunks (None: not one of them)."""
        for (offset, length), d in zip(self.cut.cuts, self.cut.digests, strict=True):
            if d == digest:
                return self.cut.data[offset : offset + length]
        return None


class Uploader:
    def __init__(self) -> None:
        # A blocking Client may be shared by threads: every access to the two
        # maps below holds this lock (the chunking and framing do not).
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], _LastSave] = {}
        self._known: collections.OrderedDict[str, None] = collections.OrderedDict()
        # The last state cut per session: only a speed-up, whichever state
        # it is (cutting is content-defined), so it may be dropped any time.
        self._cuts: collections.OrderedDict[tuple[str, str], StateCut] = collections.OrderedDict()
        self._cut_bytes = 0
        #: Rewritten chunks go as deltas, until a daemon too old for them
        #: refuses one (`without_deltas`).
        self.deltas = True

    def plan(
        self, request: checkpoint_pb2.SaveStateRequest, data: bytes | None = None
    ) -> UploadPlan | None:
        """Turn a whole-state request into a chunked one (None: send as is).
        `data`: the state, when the caller kept it out of `request`."""
        if data is None:
            data = request.data
        if len(data) < CHUNKED_MIN_BYTES:
            return None
        key = (request.session_id, request.namespace)
        with self._lock:
            previous = self._cuts.get(key)
        cut = cut_state(data, previous)
        digests = cut.digests
        chunked = checkpoint_pb2.ChunkedState(size=len(data), digest=cut.digest)
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
        for index in range(keep, len(digests)):
            digest, (offset, length) = digests[index], cut.cuts[index]
            chunked.chunks.add(digest=digest, length=length)
            if digest not in known and digest not in sent:
                piece = data[offset : offset + length]
                chunked.frames.append(self._frame(piece, previous, index))
                sent.add(digest)
        out = checkpoint_pb2.SaveStateRequest()
        out.CopyFrom(request)
        out.ClearField("data")
        out.chunked.CopyFrom(chunked)
        return UploadPlan(out, key, cut)

    def _frame(self, piece: bytes, previous: StateCut | None, index: int) -> bytes:
        """The frame a new chunk is uploaded in: a delta on the previous state's
        chunk at its place when the daemon holds that one and both start alike
        (a growing state's rewritten last chunk then costs about what was
        added, and the daemon keeps the delta as it comes instead of
        compressing the chunk again), else a plain frame."""
        if self.deltas and previous is not None and index < len(previous.cuts):
            offset, length = previous.cuts[index]
            same_start = previous.data[offset : offset + _SAME_START] == piece[:_SAME_START]
            with self._lock:
                held = previous.digests[index] in self._known
            if same_start and held:
                replaced = previous.data[offset : offset + length]
                return native.encode_delta_frame_always(piece, replaced, 0)
        return native.encode_frame(piece)

    def with_frames(self, plan: UploadPlan, missing: list[str]) -> UploadPlan:
        """After FAILED_PRECONDITION: forget what the daemon lacks, upload all of it."""
        with self._lock:
            for digest in missing:
                self._known.pop(digest, None)
        chunked = plan.request.chunked
        # A missing chunk sent as a delta: its base is gone too; send it whole.
        lacking = set(missing)
        frames = [f for f in chunked.frames if native.frame_digest_hex(f) not in lacking]
        present = {native.frame_digest_hex(f) for f in frames}
        for digest in dict.fromkeys(missing):
            piece = plan.chunk(digest) if digest not in present else None
            if piece is not None:
                frames.append(native.encode_frame(piece))
        del chunked.frames[:]
        chunked.frames.extend(frames)
        return plan

    def without_deltas(self, plan: UploadPlan) -> UploadPlan:
        """The daemon predates delta uploads (it refused one as undecodable):
        send this plan's chunks in plain frames, and every later plan's too."""
        self.deltas = False
        chunked = plan.request.chunked
        frames = []
        for frame in chunked.frames:
            if native.frame_delta_base(frame) is not None:
                piece = plan.chunk(native.frame_digest_hex(frame))
                assert piece is not None, "a plan's frames are of its own chunks"
                frame = native.encode_frame(piece)
            frames.append(frame)
        del chunked.frames[:]
        chunked.frames.extend(frames)
        return plan

    def without_base(self, plan: UploadPlan) -> UploadPlan:
        """The base checkpoint is gone: list every chunk, upload the unknown ones."""
        with self._lock:
            self._last.pop(plan.key, None)
        request = checkpoint_pb2.SaveStateRequest()
        request.CopyFrom(plan.request)
        request.ClearField("chunked")
        replanned = self.plan(request, plan.cut.data)
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
            self._keep_cut(plan.key, plan.cut)

    def _keep_cut(self, key: tuple[str, str], cut: StateCut) -> None:
        """Keep `cut` for the session's next save (the lock is held)."""
        old = self._cuts.pop(key, None)
        if old is not None:
            self._cut_bytes -= len(old.data)
        if len(cut.data) > KEPT_STATE_BYTES:
            return
        self._cuts[key] = cut
        self._cut_bytes += len(cut.data)
        while self._cut_bytes > KEPT_STATE_BYTES:
            _, dropped = self._cuts.popitem(last=False)
            self._cut_bytes -= len(dropped.data)

    def forget_session(self, session_id: str) -> None:
        with self._lock:
            for key in [k for k in self._last if k[0] == session_id]:
                del self._last[key]
            for key in [k for k in self._cuts if k[0] == session_id]:
                self._cut_bytes -= len(self._cuts.pop(key).data)


#: A new chunk is sent as a delta on the chunk it replaces only if both start
#: with the same bytes (a grown or edited chunk does; the daemon's own rule).
_SAME_START = 64


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
