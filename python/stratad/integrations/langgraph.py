"""A LangGraph checkpointer that keeps every checkpoint in a stratad daemon.

    from stratad.integrations.langgraph import StratadSaver

    graph = builder.compile(checkpointer=StratadSaver("127.0.0.1:50051"))

How LangGraph's model maps onto stratad (see docs/langgraph.md):

- a thread is a session (its ID when it is a valid stratad ID, else
  `lg-<hash>`; the thread ID is kept in the session's labels);
- `checkpoint_ns` is the checkpoint's namespace;
- a LangGraph checkpoint ID becomes the stratad checkpoint ID
  `<checkpoint id>.<16 hex of hash(thread, namespace)>` (stratad IDs are unique
  in a tenant, LangGraph's only in a thread), its parent the stratad parent;
- the checkpoint is saved as the state's bytes in the layout of `encode_layout`
  (content type `application/vnd.langgraph.checkpoint+<serde type>`): every
  element of a list channel (a message history) is serialized on its own with
  the saver's `serde`, lists first, then the other channels, and the rest of the
  checkpoint (IDs, versions, metadata, parent) last, so a growing list grows the
  state at its end only and stratad's content-defined chunking and deltas store
  and send only what a step added. A value whose channel version did not change,
  and list elements already serialized (the same objects), are not serialized
  again. Checkpoints of earlier versions (the whole `serde.dumps_typed` of
  {checkpoint, metadata, parent_checkpoint_id}) still load. The metadata is also
  stored as the checkpoint's metadata Struct, which `list(filter=...)` and
  `delete_for_runs` match on;
- pending writes are stratad pending writes (PutWrites), keyed by
  (task_id, idx) with LangGraph's WRITES_IDX_MAP for special channels;
- `copy_thread` is CopySession (no state data is copied), `prune` is
  PruneCheckpoints, `delete_for_runs` is DeleteCheckpoints on `run_id`.

Both the blocking methods (a `stratad.Client`) and the async ones (an
`AsyncClient` per event loop) talk to the daemon directly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import operator
import random
import re
import struct as _struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from stratad.api.v1 import checkpoint_pb2
from stratad.errors import AlreadyExistsError, NotFoundError
from stratad.sdk.client import (
    AsyncClient,
    Client,
    delete_checkpoints_request,
    prune_strategy,
    put_writes_request,
    save_request,
    struct,
)
from stratad.sdk.connection import Connection, TLSConfig

__all__ = ["StratadSaver", "decode_layout", "encode_layout", "is_layout"]

CONTENT_TYPE_PREFIX = "application/vnd.langgraph.checkpoint+"
#: The first bytes of a checkpoint in the layout of `encode_layout`. Its content
#: type stays CONTENT_TYPE_PREFIX + the serde type (of the trailer): checkpoints
#: of earlier versions hold one serde.dumps_typed payload, which never starts so
#: (a msgpack map, a JSON object).
LAYOUT_MAGIC = b"SLG2\n"
#: Session labels of the sessions this saver creates.
INTEGRATION_LABEL = "stratad.integration"
THREAD_LABEL = "langgraph.thread_id"
#: Metadata filters per DeleteCheckpoints call.
_FILTERS_PER_CALL = 1000
_PAGE = 100

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
_REVERSIBLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,110}")
_SUFFIX = re.compile(r"(.+)\.[0-9a-f]{16}")


def session_id_of(thread_id: str, prefix: str = "") -> str:
    """The stratad session of a LangGraph thread."""
    candidate = f"{prefix}{thread_id}"
    if _ID.fullmatch(candidate):
        return candidate
    return f"{prefix}lg-{hashlib.blake2b(thread_id.encode(), digest_size=16).hexdigest()}"


def stratad_checkpoint_id(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
    """The stratad checkpoint ID of a LangGraph checkpoint (unique in the tenant)."""
    scope = hashlib.blake2b(f"{thread_id}\0{checkpoint_ns}".encode(), digest_size=8).hexdigest()
    if _REVERSIBLE.fullmatch(checkpoint_id):
        return f"{checkpoint_id}.{scope}"
    whole = f"{thread_id}\0{checkpoint_ns}\0{checkpoint_id}".encode()
    return f"lgx-{hashlib.blake2b(whole, digest_size=16).hexdigest()}"


def langgraph_checkpoint_id(stratad_id: str) -> str | None:
    """The LangGraph checkpoint ID inside a stratad one (None: only its state has it)."""
    match = _SUFFIX.fullmatch(stratad_id)
    return match.group(1) if match else None


# -- the stored layout ------------------------------------------------------------------
#
# state = MAGIC | piece* | trailer piece | u32 LE length of the trailer piece
# piece = u8 length of the serde type | u32 LE length of the data | type | data
#
# The pieces are, in order: every element of each list channel (channels sorted
# by name), then one piece per other channel (sorted by name). The trailer is
# serde.dumps_typed({"checkpoint": the checkpoint without channel_values,
# "metadata", "parent_checkpoint_id", "channels": [[name, element count, or -1
# for a value], ...]}). A list that grows by appending grows the state just
# before the trailer: the bytes before stay the same, so the chunks that hold
# them are the previous checkpoint's.

_PIECE_HEAD = _struct.Struct("<BI")
_TRAILER_LEN = _struct.Struct("<I")


def encode_piece(type_: str, data: bytes) -> bytes:
    tag = type_.encode()
    return _PIECE_HEAD.pack(len(tag), len(data)) + tag + data


def _read_pieces(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """(offset, type length, end) of each piece in data[start:end]."""
    out = []
    unpack = _PIECE_HEAD.unpack_from
    head = _PIECE_HEAD.size
    offset = start
    while offset < end:
        if offset + head > end:
            raise ValueError("truncated StratadSaver checkpoint (piece header)")
        tag_len, data_len = unpack(data, offset)
        stop = offset + head + tag_len + data_len
        if stop > end:
            raise ValueError("truncated StratadSaver checkpoint (piece)")
        out.append((offset, tag_len, stop))
        offset = stop
    return out


def _typed(data: bytes, piece: tuple[int, int, int]) -> tuple[str, bytes]:
    offset, tag_len, stop = piece
    body = offset + _PIECE_HEAD.size
    return data[body : body + tag_len].decode(), data[body + tag_len : stop]


def is_layout(data: bytes) -> bool:
    """Whether a StratadSaver state is in the layout `encode_layout` writes (else
    it is one serde.dumps_typed payload, as StratadSaver wrote before)."""
    return data.startswith(LAYOUT_MAGIC)


def encode_layout(
    serde: SerializerProtocol,
    checkpoint: Checkpoint,
    metadata: Any,
    parent_checkpoint_id: str | None,
) -> tuple[str, bytes]:
    """(serde type, bytes) of a checkpoint in the stored layout, every value
    serialized now (the saver reuses what earlier puts serialized: `_Encoder`)."""
    return _Encoder(serde, 0).encode(("", ""), checkpoint, metadata, parent_checkpoint_id)


def decode_layout(
    serde: SerializerProtocol, data: bytes, cache: _Decoded | None = None
) -> dict[str, Any]:
    """{"checkpoint", "metadata", "parent_checkpoint_id"} of a state in the layout.

    `cache`: decoded list elements by their serialized bytes (shared objects)."""
    return _decode(serde, data, cache)[0]


#: (channel, element count or -1, its pieces as (offset, type length, end)).
_Table = list[tuple[str, int, list[tuple[int, int, int]]]]


def _decode(
    serde: SerializerProtocol, data: bytes, cache: _Decoded | None
) -> tuple[dict[str, Any], _Table]:
    if not data.startswith(LAYOUT_MAGIC) or len(data) < len(LAYOUT_MAGIC) + 4:
        raise ValueError("not a StratadSaver checkpoint layout (bad magic)")
    (trailer_len,) = _TRAILER_LEN.unpack_from(data, len(data) - 4)
    trailer_start = len(data) - 4 - trailer_len
    if trailer_start < len(LAYOUT_MAGIC):
        raise ValueError("truncated StratadSaver checkpoint (trailer)")
    (trailer,) = _read_pieces(data, trailer_start, len(data) - 4)
    header = serde.loads_typed(_typed(data, trailer))
    pieces = _read_pieces(data, len(LAYOUT_MAGIC), trailer_start)
    values: dict[str, Any] = {}
    table: _Table = []
    at = 0
    for name, count in header.pop("channels"):
        n = 1 if count < 0 else count
        items = pieces[at : at + n]
        if len(items) != n:
            raise ValueError("truncated StratadSaver checkpoint (channel)")
        table.append((name, count, items))
        at += len(items)
        if count < 0:
            values[name] = serde.loads_typed(_typed(data, items[0]))
        elif cache is None:
            values[name] = [serde.loads_typed(_typed(data, p)) for p in items]
        else:
            values[name] = [cache.get(serde, data, p) for p in items]
    if at != len(pieces):
        raise ValueError("StratadSaver checkpoint has pieces its trailer does not name")
    checkpoint = header["checkpoint"]
    checkpoint["channel_values"] = values
    payload = {
        "checkpoint": checkpoint,
        "metadata": header["metadata"],
        "parent_checkpoint_id": header.get("parent_checkpoint_id"),
    }
    return payload, table


_MISSING = object()


class _Decoded:
    """Decoded list elements by their serialized piece (LRU, bounded in bytes).

    Loading a checkpoint decodes only the elements this saver has not decoded (or
    serialized) before; the objects are shared, as LangGraph shares them between
    the checkpoints of a running graph."""

    def __init__(self, max_bytes: int) -> None:
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[bytes, Any] = collections.OrderedDict()
        self._bytes = 0
        self.max_bytes = max_bytes

    def get(self, serde: SerializerProtocol, data: bytes, piece: tuple[int, int, int]) -> Any:
        whole = data[piece[0] : piece[2]]
        with self._lock:
            value = self._items.get(whole, _MISSING)
            if value is not _MISSING:
                self._items.move_to_end(whole)
                return value
        value = serde.loads_typed(_typed(data, piece))
        self.add(whole, value)
        return value

    def add(self, whole: bytes, value: Any) -> None:
        if len(whole) > self.max_bytes // 16:
            return
        with self._lock:
            if whole not in self._items:
                self._bytes += len(whole)
            self._items[whole] = value
            self._items.move_to_end(whole)
            while self._bytes > self.max_bytes:
                old, _ = self._items.popitem(last=False)
                self._bytes -= len(old)


class _ListMemo:
    """A list channel's last value: its elements, their pieces, and where each is."""

    __slots__ = ("nbytes", "objects", "pieces", "positions", "version")

    def __init__(
        self,
        version: Any,
        objects: list[Any],
        pieces: list[bytes],
        nbytes: int | None = None,
        positions: dict[int, int] | None = None,
    ) -> None:
        self.version = version
        self.objects = objects
        self.pieces = pieces
        self.nbytes = sum(map(len, pieces)) if nbytes is None else nbytes
        #: id(element) -> index (the elements are kept alive, so IDs are unique).
        self.positions = (
            {id(o): i for i, o in enumerate(objects)} if positions is None else positions
        )

    def shared_prefix(self, value: list[Any], dirty: set[int]) -> int:
        """How many leading elements of `value` are this list's (the same objects),
        up to the first one a task wrote since."""
        objects = self.objects
        limit = min(len(value), len(objects))
        if limit and all(map(operator.is_, value[:limit], objects[:limit])):
            keep = limit  # the usual case (appends only), compared at C speed
        else:
            pairs = enumerate(zip(value, objects, strict=False))
            keep = next((i for i, (a, b) in pairs if a is not b), limit)
        if dirty:
            changed = [i for i in map(self.positions.get, dirty) if i is not None and i < keep]
            keep = min(changed, default=keep)
        return keep


class _Encoder:
    """Serializes checkpoints into the layout, reusing the pieces of earlier puts
    of the same (thread, namespace, channel): a value whose channel version is
    the same (LangGraph changes a channel's version whenever its value changes),
    and the leading elements of a list that are the same objects as before
    (LangGraph's reducers, `add_messages` included, build a new list and replace
    elements rather than change them). Elements a task wrote (put_writes) since
    are serialized again. LRU, bounded in bytes; max_bytes 0: no memory."""

    def __init__(self, serde: SerializerProtocol, max_bytes: int) -> None:
        self.serde = serde
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._lists: collections.OrderedDict[tuple[str, str, str], _ListMemo] = (
            collections.OrderedDict()
        )
        self._values: collections.OrderedDict[tuple[str, str, str], tuple[Any, bytes]] = (
            collections.OrderedDict()
        )
        self._bytes = 0
        #: IDs of objects tasks wrote, by (thread, namespace): serialized again.
        self._written: dict[tuple[str, str], set[int]] = {}
        #: Called with (piece, object) for each list element serialized.
        self.on_piece: Callable[[bytes, Any], None] | None = None

    def written(self, scope: tuple[str, str], writes: Sequence[tuple[str, Any]]) -> None:
        if not self.max_bytes:
            return
        ids: set[int] = set()
        for _, value in writes:
            ids.add(id(value))
            if isinstance(value, list | tuple):
                ids.update(map(id, value))
        with self._lock:
            self._written.setdefault(scope, set()).update(ids)

    def encode(
        self,
        scope: tuple[str, str],
        checkpoint: Checkpoint,
        metadata: Any,
        parent_checkpoint_id: str | None,
    ) -> tuple[str, bytes]:
        """(serde type of the trailer, the state)."""
        values = checkpoint["channel_values"]
        versions = checkpoint.get("channel_versions") or {}
        lists = sorted(k for k, v in values.items() if type(v) is list)
        others = sorted(k for k in values if type(values[k]) is not list)
        with self._lock:
            dirty = self._written.pop(scope, set()) if self.max_bytes else set()
        parts = [LAYOUT_MAGIC]
        channels: list[list[Any]] = []
        for name in lists:
            pieces = self._list(scope, name, values[name], versions.get(name), dirty)
            parts += pieces
            channels.append([name, len(pieces)])
        for name in others:
            parts.append(self._value(scope, name, values[name], versions.get(name)))
            channels.append([name, -1])
        header = {
            "checkpoint": {k: v for k, v in checkpoint.items() if k != "channel_values"},
            "metadata": metadata,
            "parent_checkpoint_id": parent_checkpoint_id,
            "channels": channels,
        }
        type_, data = self.serde.dumps_typed(header)
        trailer = encode_piece(type_, data)
        parts.append(trailer)
        parts.append(_TRAILER_LEN.pack(len(trailer)))
        return type_, b"".join(parts)

    def _list(
        self, scope: tuple[str, str], name: str, value: list[Any], version: Any, dirty: set[int]
    ) -> list[bytes]:
        key = (*scope, name)
        with self._lock:
            memo = self._lists.get(key) if self.max_bytes else None
        keep = memo.shared_prefix(value, dirty) if memo is not None else 0
        pieces = memo.pieces[:keep] if memo is not None else []
        added = 0
        for item in value[keep:]:
            piece = encode_piece(*self.serde.dumps_typed(item))
            pieces.append(piece)
            added += len(piece)
            if self.on_piece is not None:
                self.on_piece(piece, item)
        if self.max_bytes:
            if memo is not None and keep == len(memo.objects):
                # Appends only: extend what the previous memo knew (it is replaced).
                positions = memo.positions
                positions.update((id(o), i) for i, o in enumerate(value[keep:], keep))
                entry = _ListMemo(version, list(value), pieces, memo.nbytes + added, positions)
            else:
                entry = _ListMemo(version, list(value), pieces)
            self._remember(self._lists, key, entry)
        return pieces

    def _value(self, scope: tuple[str, str], name: str, value: Any, version: Any) -> bytes:
        key = (*scope, name)
        with self._lock:
            known = self._values.get(key) if self.max_bytes else None
        if known is not None and version is not None and known[0] == version:
            return known[1]
        piece = encode_piece(*self.serde.dumps_typed(value))
        if self.max_bytes:
            self._remember(self._values, key, (version, piece))
        return piece

    def _remember(self, table: Any, key: tuple[str, str, str], entry: Any) -> None:
        size = entry.nbytes if isinstance(entry, _ListMemo) else len(entry[1])
        with self._lock:
            old = table.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes if isinstance(old, _ListMemo) else len(old[1])
            if size > self.max_bytes:
                return
            table[key] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                biggest = self._lists if self._lists else self._values
                _, gone = biggest.popitem(last=False)
                self._bytes -= gone.nbytes if isinstance(gone, _ListMemo) else len(gone[1])

    def seed(
        self, scope: tuple[str, str], checkpoint: Checkpoint, data: bytes, table: _Table
    ) -> None:
        """Remember the pieces of a loaded checkpoint, as `_decode` found them (a
        resumed thread's next put then serializes only what it adds)."""
        if not self.max_bytes:
            return
        values = checkpoint["channel_values"]
        versions = checkpoint.get("channel_versions") or {}
        for name, count, items in table:
            pieces = [data[p[0] : p[2]] for p in items]
            if count < 0:
                self._remember(self._values, (*scope, name), (versions.get(name), pieces[0]))
            else:
                memo = _ListMemo(versions.get(name), list(values[name]), pieces)
                self._remember(self._lists, (*scope, name), memo)


def _json_safe(value: Any) -> Any:
    """Metadata as JSON values (for the Struct the daemon filters on)."""
    return json.loads(json.dumps(value, default=str))


def _thread_of(config: RunnableConfig) -> tuple[str, str]:
    configurable = config["configurable"]
    return str(configurable["thread_id"]), str(configurable.get("checkpoint_ns") or "")


class StratadSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over a stratad daemon (see the module docstring).

    Args:
        address: the daemon's gRPC address (ignored when clients are given);
            None: ``$STRATAD_ADDRESS`` or 127.0.0.1:50051.
        tenant: the tenant to act in; "": ``$STRATAD_TENANT``, else the
            daemon's default (with auth on: the token's own tenant).
        token: bearer token; None: ``$STRATAD_TOKEN`` / ``$STRATAD_TOKEN_FILE``.
        tls: a `stratad.TLSConfig`, True or False; None: the STRATAD_TLS* variables.
        serde: LangGraph serializer (default: JsonPlusSerializer).
        client / async_client: existing SDK clients to use instead.
        session_prefix: prepended to thread IDs to form session IDs.
        timeout: deadline of each call, in seconds.
        cache_bytes: memory for serialized channel values and decoded list
            elements kept to serialize and decode only what changed (each of the
            two caches at most this many bytes of serialized values); 0: none.
        layout: "pieces" (the default: see `encode_layout`), or "payload": one
            serde.dumps_typed of the whole checkpoint, as StratadSaver wrote
            before, for readers that do not know the layout yet. Both load.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        tenant: str = "",
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        serde: SerializerProtocol | None = None,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        session_prefix: str = "",
        timeout: float = 30.0,
        cache_bytes: int = 128 << 20,
        layout: str = "pieces",
    ) -> None:
        super().__init__(serde=serde)
        if layout not in ("pieces", "payload"):
            raise ValueError(f"layout must be 'pieces' or 'payload', not {layout!r}")
        self.layout = layout
        self._encoder = _Encoder(self.serde, cache_bytes)
        self._decoded = _Decoded(cache_bytes)
        if cache_bytes:
            self._encoder.on_piece = self._decoded.add
        # Resolved once: every client this saver opens (one per event loop) is the same.
        self.connection = Connection.resolve(address, tenant=tenant, token=token, tls=tls)
        self.address = self.connection.address
        self.tenant = self.connection.tenant
        self.timeout = timeout
        self.session_prefix = session_prefix
        self._client = client
        self._own_client = client is None
        self._async_client = async_client
        self._own_async = async_client is None
        self._async_loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._landed = _Landed()

    # -- clients -----------------------------------------------------------------------

    @property
    def client(self) -> Client:
        with self._lock:
            if self._client is None:
                self._client = Client.from_connection(self.connection, timeout=self.timeout)
            return self._client

    def _aclient(self) -> AsyncClient:
        if not self._own_async:
            assert self._async_client is not None
            return self._async_client
        loop = asyncio.get_running_loop()
        if self._async_client is None or self._async_loop is not loop:
            # grpc.aio channels belong to the loop that first used them.
            self._async_client = AsyncClient.from_connection(self.connection, timeout=self.timeout)
            self._async_loop = loop
        return self._async_client

    def close(self) -> None:
        """Close the clients this saver created (not ones it was given)."""
        if self._own_client and self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        self.close()
        if self._own_async and self._async_client is not None:
            await self._async_client.close()
            self._async_client = None

    def __enter__(self) -> StratadSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> StratadSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- mapping ---------------------------------------------------------------------------

    def _session(self, thread_id: str) -> str:
        return session_id_of(thread_id, self.session_prefix)

    def _labels(self, thread_id: str) -> dict[str, str]:
        return {INTEGRATION_LABEL: "langgraph", THREAD_LABEL: thread_id}

    def _save_request(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
    ) -> tuple[checkpoint_pb2.SaveStateRequest, bytes, RunnableConfig]:
        """The save of a checkpoint: the request, its serialized state (kept out
        of the request: the SDK sends the new chunks only), the config to return."""
        thread_id, ns = _thread_of(config)
        parent = get_checkpoint_id(config)
        full = dict(get_checkpoint_metadata(config, metadata))
        full.pop("writes", None)
        if self.layout == "payload":
            type_, data = self.serde.dumps_typed(
                {"checkpoint": checkpoint, "metadata": full, "parent_checkpoint_id": parent}
            )
        else:
            type_, data = self._encoder.encode((thread_id, ns), checkpoint, full, parent)
        request = save_request(
            self._session(thread_id),
            b"",
            content_type=CONTENT_TYPE_PREFIX + type_,
            metadata=_json_safe(full),
            checkpoint_id=stratad_checkpoint_id(thread_id, ns, checkpoint["id"]),
            parent_checkpoint_id=stratad_checkpoint_id(thread_id, ns, parent) if parent else "",
            namespace=ns,
        )
        request.no_parent = not parent
        stored: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }
        return request, data, stored

    def _load_request(self, config: RunnableConfig) -> checkpoint_pb2.LoadStateRequest:
        thread_id, ns = _thread_of(config)
        checkpoint_id = get_checkpoint_id(config)
        return checkpoint_pb2.LoadStateRequest(
            session_id=self._session(thread_id),
            checkpoint_id=stratad_checkpoint_id(thread_id, ns, checkpoint_id)
            if checkpoint_id
            else "",
            namespace=ns,
            include_writes=True,
        )

    def _tuple(
        self, thread_id: str, loaded: checkpoint_pb2.LoadStateResponse, *, seed: bool = False
    ) -> CheckpointTuple:
        meta = loaded.checkpoint
        content_type = meta.content_type or loaded.content_type
        ns = meta.namespace
        if not content_type.startswith(CONTENT_TYPE_PREFIX):
            raise ValueError(
                f"checkpoint {meta.checkpoint_id!r} was not saved by StratadSaver "
                f"(content type {content_type!r})"
            )
        if is_layout(loaded.data):
            payload, table = _decode(self.serde, loaded.data, self._decoded)
            if seed:
                self._encoder.seed((thread_id, ns), payload["checkpoint"], loaded.data, table)
        else:  # written by StratadSaver before the layout: one serde.dumps_typed
            serde_type = content_type[len(CONTENT_TYPE_PREFIX) :]
            payload = self.serde.loads_typed((serde_type, loaded.data))
        checkpoint: Checkpoint = payload["checkpoint"]
        parent = payload.get("parent_checkpoint_id")
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint["id"],
                }
            },
            checkpoint=checkpoint,
            metadata=payload["metadata"],
            parent_config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": parent,
                }
            }
            if parent
            else None,
            pending_writes=[
                (w.task_id, w.channel, self.serde.loads_typed((w.type, w.value)))
                for w in meta.pending_writes
            ],
        )

    def _writes_request(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> checkpoint_pb2.PutWritesRequest:
        thread_id, ns = _thread_of(config)
        checkpoint_id = config["configurable"]["checkpoint_id"]
        items = []
        for idx, (channel, value) in enumerate(writes):
            type_, data = self.serde.dumps_typed(value)
            items.append((WRITES_IDX_MAP.get(channel, idx), channel, type_, data))
        return put_writes_request(
            self._session(thread_id),
            stratad_checkpoint_id(thread_id, ns, checkpoint_id),
            task_id,
            items,
            task_path,
        )

    def _list_request(
        self,
        session_id: str,
        thread_id: str,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        page_size: int,
    ) -> checkpoint_pb2.ListCheckpointsRequest:
        configurable = config["configurable"] if config else {}
        request = checkpoint_pb2.ListCheckpointsRequest(
            session_id=session_id,
            page_size=page_size,
            metadata_filter=struct(_json_safe(filter) if filter else None),
        )
        ns = configurable.get("checkpoint_ns")
        if ns is not None:
            request.namespace = ns
        before_id = get_checkpoint_id(before) if before else None
        if before and before_id:
            before_ns = before["configurable"].get("checkpoint_ns", ns or "")
            request.before = stratad_checkpoint_id(thread_id, before_ns or "", before_id)
        return request

    @staticmethod
    def _wanted(
        meta: checkpoint_pb2.Checkpoint,
        config: RunnableConfig | None,
        before_id: str | None,
    ) -> bool:
        """Client-side filters: an exact checkpoint_id, and `before` when the daemon lacks it."""
        lg_id = langgraph_checkpoint_id(meta.checkpoint_id)
        wanted_id = get_checkpoint_id(config) if config else None
        if wanted_id and lg_id is not None and lg_id != wanted_id:
            return False
        return not (before_id and lg_id is not None and lg_id >= before_id)

    # -- sync API ----------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, _ = _thread_of(config)
        try:
            loaded = self.client.call(self.client.checkpoints.LoadState, self._load_request(config))
        except NotFoundError:
            return None
        return self._tuple(thread_id, loaded, seed=True)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        remaining = limit if limit is not None else -1
        for thread_id, session_id in self._threads(config):
            for meta in self._metas(session_id, thread_id, config, filter, before, remaining):
                if remaining == 0:
                    return
                request = checkpoint_pb2.LoadStateRequest(
                    session_id=session_id, checkpoint_id=meta.checkpoint_id, include_writes=True
                )
                try:
                    loaded = self.client.call(self.client.checkpoints.LoadState, request)
                except NotFoundError:
                    continue  # deleted while listing
                yield self._tuple(thread_id, loaded)
                remaining -= 1
            if remaining == 0:
                return

    def _threads(self, config: RunnableConfig | None) -> Iterator[tuple[str, str]]:
        if config is not None:
            thread_id, _ = _thread_of(config)
            yield thread_id, self._session(thread_id)
            return
        for session in self.client.list_sessions(prefix=self.session_prefix):
            if session.labels.get(INTEGRATION_LABEL) == "langgraph":
                yield session.labels[THREAD_LABEL], session.session_id

    def _metas(
        self,
        session_id: str,
        thread_id: str,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int,
    ) -> Iterator[checkpoint_pb2.Checkpoint]:
        page_size = min(limit, 1000) if limit > 0 else _PAGE
        request = self._list_request(session_id, thread_id, config, filter, before, page_size)
        before_id = None
        while True:
            try:
                page = self.client.call(self.client.checkpoints.ListCheckpoints, request)
            except NotFoundError as exc:
                if request.before and request.before in exc.message:
                    # `before` names a checkpoint that is gone: compare IDs instead.
                    before_id = get_checkpoint_id(before) if before else None
                    request.before = ""
                    continue
                return  # no such thread
            for meta in page.checkpoints:
                if self._wanted(meta, config, before_id):
                    yield meta
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        request, data, stored = self._save_request(config, checkpoint, metadata)
        thread_id, _ = _thread_of(config)
        self._landed.starting(request.checkpoint_id)
        for _ in range(3):
            try:
                self.client.save(request, data)
                break
            except NotFoundError as exc:
                self._on_save_not_found(exc, request, thread_id)
        else:
            self.client.save(request, data)
        self._landed.landed(request.checkpoint_id)
        return stored

    def _on_save_not_found(
        self, exc: NotFoundError, request: checkpoint_pb2.SaveStateRequest, thread_id: str
    ) -> None:
        if f"session {request.session_id!r} not found" in exc.message:
            with contextlib.suppress(AlreadyExistsError):
                self.client.create_session(request.session_id, labels=self._labels(thread_id))
        elif _parent_gone(exc, request):
            _drop_parent(request)
        else:
            raise exc

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if not writes:
            return
        self._encoder.written(_thread_of(config), writes)
        request = self._writes_request(config, writes, task_id, task_path)
        key = request.checkpoint_id
        if self._landed.in_flight(key):
            self._landed.wait(key, self.timeout)
        try:
            self.client.call(self.client.checkpoints.PutWrites, request)
        except NotFoundError:
            # With durability "async" LangGraph may send a checkpoint's writes
            # before that checkpoint's put ran: wait for it, then try again.
            if not self._landed.wait(key, self.timeout):
                raise
            self.client.call(self.client.checkpoints.PutWrites, request)

    def delete_thread(self, thread_id: str) -> None:
        with contextlib.suppress(NotFoundError):
            self.client.delete_session(self._session(str(thread_id)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        for request in _delete_requests(run_ids):
            self.client.call(self.client.checkpoints.DeleteCheckpoints, request)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source = self._session(str(source_thread_id))
        try:
            metas = list(self.client.list_checkpoints(source, page_size=1000))
        except NotFoundError:
            return  # nothing to copy
        mapping = {}
        for meta in metas:
            lg_id = langgraph_checkpoint_id(meta.checkpoint_id)
            if lg_id is None:  # an ID only its state knows
                loaded = self.client.load_state(source, checkpoint_id=meta.checkpoint_id)
                lg_id = self._tuple(str(source_thread_id), loaded).checkpoint["id"]
            mapping[meta.checkpoint_id] = stratad_checkpoint_id(
                str(target_thread_id), meta.namespace, lg_id
            )
        try:
            self.client.copy_session(
                source,
                self._session(str(target_thread_id)),
                labels=self._labels(str(target_thread_id)),
                checkpoint_ids=mapping,
            )
        except NotFoundError:
            return  # the source went away meanwhile

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        sessions = [self._session(str(t)) for t in thread_ids]
        value = prune_strategy(strategy)
        for start in range(0, len(sessions), 1000):
            request = checkpoint_pb2.PruneCheckpointsRequest(
                session_ids=sessions[start : start + 1000], strategy=value
            )
            self.client.call(self.client.checkpoints.PruneCheckpoints, request)

    # -- async API -----------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, _ = _thread_of(config)
        client = self._aclient()
        try:
            loaded = await client.call(client.checkpoints.LoadState, self._load_request(config))
        except NotFoundError:
            return None
        return self._tuple(thread_id, loaded, seed=True)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        client = self._aclient()
        remaining = limit if limit is not None else -1
        async for thread_id, session_id in self._athreads(config):
            async for meta in self._ametas(
                session_id, thread_id, config, filter, before, remaining
            ):
                if remaining == 0:
                    return
                request = checkpoint_pb2.LoadStateRequest(
                    session_id=session_id, checkpoint_id=meta.checkpoint_id, include_writes=True
                )
                try:
                    loaded = await client.call(client.checkpoints.LoadState, request)
                except NotFoundError:
                    continue
                yield self._tuple(thread_id, loaded)
                remaining -= 1
            if remaining == 0:
                return

    async def _athreads(self, config: RunnableConfig | None) -> AsyncIterator[tuple[str, str]]:
        if config is not None:
            thread_id, _ = _thread_of(config)
            yield thread_id, self._session(thread_id)
            return
        async for session in self._aclient().list_sessions(prefix=self.session_prefix):
            if session.labels.get(INTEGRATION_LABEL) == "langgraph":
                yield session.labels[THREAD_LABEL], session.session_id

    async def _ametas(
        self,
        session_id: str,
        thread_id: str,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int,
    ) -> AsyncIterator[checkpoint_pb2.Checkpoint]:
        client = self._aclient()
        page_size = min(limit, 1000) if limit > 0 else _PAGE
        request = self._list_request(session_id, thread_id, config, filter, before, page_size)
        before_id = None
        while True:
            try:
                page = await client.call(client.checkpoints.ListCheckpoints, request)
            except NotFoundError as exc:
                if request.before and request.before in exc.message:
                    before_id = get_checkpoint_id(before) if before else None
                    request.before = ""
                    continue
                return
            for meta in page.checkpoints:
                if self._wanted(meta, config, before_id):
                    yield meta
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        request, data, stored = self._save_request(config, checkpoint, metadata)
        thread_id, _ = _thread_of(config)
        client = self._aclient()
        self._landed.starting(request.checkpoint_id)
        try:
            return await self._aput(client, request, data, stored, thread_id)
        finally:
            self._landed.landed(request.checkpoint_id)

    async def _aput(
        self,
        client: AsyncClient,
        request: checkpoint_pb2.SaveStateRequest,
        data: bytes,
        stored: RunnableConfig,
        thread_id: str,
    ) -> RunnableConfig:
        for _ in range(3):
            try:
                await client.save(request, data)
                return stored
            except NotFoundError as exc:
                if f"session {request.session_id!r} not found" in exc.message:
                    with contextlib.suppress(AlreadyExistsError):
                        await client.create_session(
                            request.session_id, labels=self._labels(thread_id)
                        )
                elif _parent_gone(exc, request):
                    _drop_parent(request)
                else:
                    raise
        await client.save(request, data)
        return stored

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if not writes:
            return
        client = self._aclient()
        self._encoder.written(_thread_of(config), writes)
        request = self._writes_request(config, writes, task_id, task_path)
        key = request.checkpoint_id
        if self._landed.in_flight(key):
            await self._landed.await_landed(key, self.timeout)
        try:
            await client.call(client.checkpoints.PutWrites, request)
        except NotFoundError:
            if not await self._landed.await_landed(key, self.timeout):
                raise
            await client.call(client.checkpoints.PutWrites, request)

    async def adelete_thread(self, thread_id: str) -> None:
        with contextlib.suppress(NotFoundError):
            await self._aclient().delete_session(self._session(str(thread_id)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        client = self._aclient()
        for request in _delete_requests(run_ids):
            await client.call(client.checkpoints.DeleteCheckpoints, request)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        client = self._aclient()
        source = self._session(str(source_thread_id))
        try:
            metas = [m async for m in client.list_checkpoints(source, page_size=1000)]
        except NotFoundError:
            return
        mapping = {}
        for meta in metas:
            lg_id = langgraph_checkpoint_id(meta.checkpoint_id)
            if lg_id is None:
                loaded = await client.load_state(source, checkpoint_id=meta.checkpoint_id)
                lg_id = self._tuple(str(source_thread_id), loaded).checkpoint["id"]
            mapping[meta.checkpoint_id] = stratad_checkpoint_id(
                str(target_thread_id), meta.namespace, lg_id
            )
        try:
            await client.copy_session(
                source,
                self._session(str(target_thread_id)),
                labels=self._labels(str(target_thread_id)),
                checkpoint_ids=mapping,
            )
        except NotFoundError:
            return

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        client = self._aclient()
        sessions = [self._session(str(t)) for t in thread_ids]
        value = prune_strategy(strategy)
        for start in range(0, len(sessions), 1000):
            request = checkpoint_pb2.PruneCheckpointsRequest(
                session_ids=sessions[start : start + 1000], strategy=value
            )
            await client.call(client.checkpoints.PruneCheckpoints, request)

    # -- versions --------------------------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Monotonic string versions, as InMemorySaver and the SQL savers use."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"


def _parent_gone(exc: NotFoundError, request: checkpoint_pb2.SaveStateRequest) -> bool:
    parent = request.parent_checkpoint_id
    return bool(parent) and f"parent checkpoint {parent!r} not found" in exc.message


def _drop_parent(request: checkpoint_pb2.SaveStateRequest) -> None:
    """The parent was deleted (its ID stays in the saved state): save as a new line."""
    request.parent_checkpoint_id = ""
    request.no_parent = True


def _delete_requests(run_ids: Sequence[str]) -> Iterator[checkpoint_pb2.DeleteCheckpointsRequest]:
    ids = [str(r) for r in run_ids]
    for start in range(0, len(ids), _FILTERS_PER_CALL):
        chunk = ids[start : start + _FILTERS_PER_CALL]
        yield delete_checkpoints_request([{"run_id": r} for r in chunk])


class _Landed:
    """The checkpoints this saver is saving or has saved (the most recent ones).

    LangGraph's default durability ("async") runs `put` and `put_writes` in
    the background without ordering them, so the writes of a checkpoint may
    reach the daemon before the checkpoint does. `put_writes` waits here for
    the put of its checkpoint instead of failing.
    """

    KEEP = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: collections.OrderedDict[str, threading.Event] = collections.OrderedDict()

    def _event(self, key: str) -> threading.Event:
        with self._lock:
            event = self._events.get(key)
            if event is None:
                event = self._events[key] = threading.Event()
                while len(self._events) > self.KEEP:
                    self._events.popitem(last=False)
            return event

    def starting(self, key: str) -> None:
        self._event(key)

    def landed(self, key: str) -> None:
        self._event(key).set()

    def in_flight(self, key: str) -> bool:
        with self._lock:
            event = self._events.get(key)
        return event is not None and not event.is_set()

    def wait(self, key: str, timeout: float) -> bool:
        return self._event(key).wait(timeout)

    async def await_landed(self, key: str, timeout: float) -> bool:
        event = self._event(key)
        deadline = time.monotonic() + timeout
        delay = 0.001
        while not event.is_set():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        return True
