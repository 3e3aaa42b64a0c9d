"""StratadSaver's async API: `BaseCheckpointSaver`'s a-methods over an `AsyncClient`.

Owns aget_tuple, alist, aput, aput_writes, adelete_thread, adelete_for_runs,
acopy_thread and aprune, the twins of saver.py's blocking methods, each over
the `AsyncClient` of the running event loop (core.py's `_aclient`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
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
from stratad.sdk.client import AsyncClient


class AsyncMethods(SaverBase):
    """StratadSaver's async methods (see `StratadSaver`)."""

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
        for request in _prune_requests(sessions, strategy):
            await client.call(client.checkpoints.PruneCheckpoints, request)
