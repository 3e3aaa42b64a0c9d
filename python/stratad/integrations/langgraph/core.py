"""What StratadSaver's blocking and async methods share (see saver.py, aio.py).

Owns the saver's construction and its clients (a `stratad.Client`, and an
`AsyncClient` per event loop), the mapping of LangGraph's calls onto stratad
requests and of loaded states back onto `CheckpointTuple`s (through the
stored layout: layout.py, encoder.py), versions, and `_Landed`, which orders a
checkpoint's writes after its put when LangGraph runs them in parallel.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Self

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from stratad.api.v1 import checkpoint_pb2
from stratad.errors import NotFoundError
from stratad.integrations.langgraph.encoder import _Encoder
from stratad.integrations.langgraph.ids import (
    INTEGRATION_LABEL,
    THREAD_LABEL,
    langgraph_checkpoint_id,
    session_id_of,
    stratad_checkpoint_id,
)
from stratad.integrations.langgraph.layout import (
    CONTENT_TYPE_PREFIX,
    _decode,
    _Decoded,
    is_layout,
)
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

#: Metadata filters per DeleteCheckpoints call.
_FILTERS_PER_CALL = 1000
_PAGE = 100


def _json_safe(value: Any) -> Any:
    """Metadata as JSON values (for the Struct the daemon filters on)."""
    return json.loads(json.dumps(value, default=str))


def _thread_of(config: RunnableConfig) -> tuple[str, str]:
    configurable = config["configurable"]
    return str(configurable["thread_id"]), str(configurable.get("checkpoint_ns") or "")


class SaverBase(BaseCheckpointSaver[str]):
    """StratadSaver's construction, clients and request mapping (its arguments:
    see `StratadSaver`)."""

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
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


def _prune_requests(
    thread_sessions: list[str], strategy: str
) -> list[checkpoint_pb2.PruneCheckpointsRequest]:
    """The PruneCheckpoints calls of `prune`, at most 1000 sessions each."""
    value = prune_strategy(strategy)
    return [
        checkpoint_pb2.PruneCheckpointsRequest(
            session_ids=thread_sessions[start : start + 1000], strategy=value
        )
        for start in range(0, len(thread_sessions), 1000)
    ]


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
