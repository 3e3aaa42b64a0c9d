"""`StratadSaver`, the LangGraph checkpointer: its blocking API.

Owns `BaseCheckpointSaver`'s blocking methods (get_tuple, list, put,
put_writes, delete_thread, delete_for_runs, copy_thread, prune) over a
`stratad.Client`; their async twins are aio.py's, what both share core.py's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)

from stratad.api.v1 import checkpoint_pb2
from stratad.errors import AlreadyExistsError, NotFoundError
from stratad.integrations.langgraph.aio import AsyncMethods
from stratad.integrations.langgraph.core import (
    _PAGE,
    SaverBase,
    _delete_requests,
    _drop_parent,
    _parent_gone,
    _prune_requests,
    _thread_of,
)
from stratad.integrations.langgraph.ids import (
    INTEGRATION_LABEL,
    THREAD_LABEL,
    langgraph_checkpoint_id,
    stratad_checkpoint_id,
)


class StratadSaver(AsyncMethods, SaverBase):
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
        for request in _prune_requests(sessions, strategy):
            self.client.call(self.client.checkpoints.PruneCheckpoints, request)
