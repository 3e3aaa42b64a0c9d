"""The RPC methods of the SDK's twin clients, written once (for asyncio).

The twins differ in their transport and agree on everything else. So each is
a hand-written transport, `AsyncClient` (sdk/async_client.py: grpc.aio) and
`Client` (sdk/sync_client.py: grpcio, and the native HTTP/2 channel for unary
calls), over one method layer: `AsyncMethods` (sdk/_async_methods.py), written
by hand, and `SyncMethods` (sdk/_sync_methods.py), generated from it by
unasync (``make sdk-gen``, scripts/gen_sync_client.py: ``async``/``await``
dropped, ``AsyncIterator`` -> ``Iterator``, ``aio_explain`` -> ``explain``,
...; then ruff). A method builds its request (sdk/messages.py), sends it with
the transport's `call` (a unary call) or the stub's streaming method, and
returns the response or its part. RPC methods are added and changed in
sdk/_async_methods.py only, then ``make sdk-gen``; `make lint` and
tests/unit/test_sdk_generated.py fail while sdk/_sync_methods.py is stale.

What the transport provides is declared under TYPE_CHECKING below.
`save_states` is not here: its ``requests`` may be an async iterable on
`AsyncClient` only, so each transport has its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, Unpack

import grpc

from stratad.api.v1 import admin_pb2, checkpoint_pb2, session_pb2
from stratad.errors import AlreadyExistsError, StratadError
from stratad.sdk.messages import (
    SaveOptions,
    copy_session_request,
    create_checkpoint_request,
    create_session_request,
    delete_checkpoints_request,
    list_checkpoints_request,
    load_state_request,
    missing_chunks,
    prune_checkpoints_request,
    put_writes_request,
    replace_structured_state_request,
    replan,
    save_request,
    whole_request,
)
from stratad.sdk.rpc import to_error

if TYPE_CHECKING:
    from stratad.api.v1 import admin_pb2_grpc, checkpoint_pb2_grpc, session_pb2_grpc
    from stratad.sdk.connection import Connection
    from stratad.sdk.upload import Uploader

__all__ = ["AsyncMethods"]


class AsyncMethods:
    """Every RPC method of the client but `save_states`, over its transport."""

    if TYPE_CHECKING:  # the transport's, set and defined by the client class
        connection: Connection
        sessions: session_pb2_grpc.SessionServiceStub
        checkpoints: checkpoint_pb2_grpc.CheckpointServiceStub
        admin: admin_pb2_grpc.AdminServiceStub
        _metadata: tuple[tuple[str, str], ...]
        _uploader: Uploader | None

        async def call(
            self,
            method: Any,
            request: Any,
            timeout: float | None = None,
            metadata: Iterable[tuple[str, str]] = (),
        ) -> Any: ...

    # -- sessions ----------------------------------------------------------------

    async def create_session(
        self,
        session_id: str = "",
        *,
        labels: dict[str, str] | None = None,
        keep_last: int = 0,
        max_age_seconds: float = 0.0,
        exist_ok: bool = False,
    ) -> session_pb2.Session:
        """Create a session; with ``exist_ok`` an existing one is returned as it is
        (its labels and retention unchanged) instead of raising AlreadyExistsError,
        so that a script can be run again."""
        request = create_session_request(session_id, labels, keep_last, max_age_seconds)
        try:
            response: session_pb2.CreateSessionResponse = await self.call(
                self.sessions.CreateSession, request
            )
            return response.session
        except AlreadyExistsError:
            if not exist_ok:
                raise
        return await self.get_session(session_id)

    async def get_session(self, session_id: str) -> session_pb2.Session:
        request = session_pb2.GetSessionRequest(session_id=session_id)
        response: session_pb2.GetSessionResponse = await self.call(
            self.sessions.GetSession, request
        )
        return response.session

    async def list_sessions(
        self, prefix: str = "", page_size: int = 100
    ) -> AsyncIterator[session_pb2.Session]:
        """Every session (following page tokens), ordered by ID."""
        token = ""
        while True:
            request = session_pb2.ListSessionsRequest(
                prefix=prefix, page_size=page_size, page_token=token
            )
            page: session_pb2.ListSessionsResponse = await self.call(
                self.sessions.ListSessions, request
            )
            for session in page.sessions:
                yield session
            token = page.next_page_token
            if not token:
                return

    async def delete_session(self, session_id: str, expected_version: int = 0) -> None:
        request = session_pb2.DeleteSessionRequest(
            session_id=session_id, expected_version=expected_version
        )
        await self.call(self.sessions.DeleteSession, request)
        if self._uploader:
            self._uploader.forget_session(session_id)

    async def get_structured_state(self, session_id: str) -> session_pb2.GetStructuredStateResponse:
        """The session's structured state (cognitive state, tasks, agent state) as one
        JSON object keyed by facet (``structured_json``), and the version it was read at."""
        request = session_pb2.GetStructuredStateRequest(session_id=session_id)
        response: session_pb2.GetStructuredStateResponse = await self.call(
            self.sessions.GetStructuredState, request
        )
        return response

    async def replace_structured_state(
        self, session_id: str, structured_json: bytes, *, expected_version: int = 0
    ) -> session_pb2.ReplaceStructuredStateResponse:
        """Replace the session's structured state as a whole with ``structured_json``
        (a JSON object as `get_structured_state` returns it; ``b"{}"`` clears it)."""
        request = replace_structured_state_request(session_id, structured_json, expected_version)
        response: session_pb2.ReplaceStructuredStateResponse = await self.call(
            self.sessions.ReplaceStructuredState, request
        )
        return response

    async def watch_session(
        self, session_id: str, from_version: int = 0, timeout: float | None = None
    ) -> AsyncIterator[session_pb2.SessionEvent]:
        """Events of the session as they happen (`Client`: a blocking iterator,
        `AsyncClient`: an async one; cancel by closing it)."""
        request = session_pb2.WatchSessionRequest(session_id=session_id, from_version=from_version)
        stream = self.sessions.WatchSession(request, timeout=timeout, metadata=self._metadata)
        try:
            async for response in stream:
                yield response.event
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise to_error(await self.connection.aio_explain(exc)) from None
        finally:
            stream.cancel()

    # -- state -------------------------------------------------------------------

    async def save_state(
        self,
        session_id: str,
        data: bytes,
        *,
        expected_version: int = 0,
        **options: Unpack[SaveOptions],
    ) -> checkpoint_pb2.SaveStateResponse:
        """Save `data` as a new checkpoint, the session's head. Options
        (`stratad.sdk.messages.SaveOptions`): content_type, metadata,
        checkpoint_id, parent_checkpoint_id, namespace, no_parent."""
        # `data` stays out of the message unless it is sent whole: a chunked
        # upload would copy it in only to clear it again.
        request = save_request(session_id, b"", expected_version=expected_version, **options)
        return await self.save(request, data)

    async def save(
        self, request: checkpoint_pb2.SaveStateRequest, data: bytes | None = None
    ) -> checkpoint_pb2.SaveStateResponse:
        """Save `request`; its state is `data` when given, else the request's own
        `data` (keeping a large state out of the message saves copying it in)."""
        response: checkpoint_pb2.SaveStateResponse
        plan = self._uploader.plan(request, data) if self._uploader else None
        if plan is None:
            response = await self.call(self.checkpoints.SaveState, whole_request(request, data))
            return response
        assert self._uploader is not None
        for _ in range(3):
            try:
                response = await self.call(self.checkpoints.SaveState, plan.request)
            except StratadError as exc:
                if missing_chunks(exc):
                    missing = await self.find_missing_chunks(self._uploader.chunk_digests(plan))
                    plan = self._uploader.with_frames(plan, missing)
                    continue
                retry = replan(self._uploader, plan, exc)
                if retry is None:
                    raise
                plan = retry
                continue
            self._uploader.saved(plan, response.checkpoint_id)
            return response
        response = await self.call(self.checkpoints.SaveState, whole_request(request, data))
        return response

    async def load_state(
        self,
        session_id: str,
        checkpoint_id: str = "",
        namespace: str = "",
        *,
        include_writes: bool = False,
        include_structured: bool = False,
    ) -> checkpoint_pb2.LoadStateResponse:
        """The latest state (of ``namespace``), or a given checkpoint's; with
        ``include_writes`` its pending writes too (``.checkpoint.pending_writes``),
        with ``include_structured`` the structured state captured with it
        (``.structured_json``)."""
        request = load_state_request(
            session_id,
            checkpoint_id,
            namespace,
            include_writes=include_writes,
            include_structured=include_structured,
        )
        response: checkpoint_pb2.LoadStateResponse = await self.call(
            self.checkpoints.LoadState, request
        )
        return response

    async def find_missing_chunks(self, digests: list[str]) -> list[str]:
        request = checkpoint_pb2.FindMissingChunksRequest(digests=digests)
        response: checkpoint_pb2.FindMissingChunksResponse = await self.call(
            self.checkpoints.FindMissingChunks, request
        )
        return list(response.missing)

    async def pause_execution(
        self,
        session_id: str,
        data: bytes | None = None,
        *,
        expected_version: int = 0,
        **options: Unpack[SaveOptions],
    ) -> checkpoint_pb2.PauseExecutionResponse:
        """Pause the session, first saving `data` as a checkpoint when given (with
        ``options`` as `save_state` takes them, and ``expected_version``)."""
        saved = None
        if data is not None:
            saved = await self.save_state(
                session_id, data, expected_version=expected_version, **options
            )
            expected_version = 0
        request = checkpoint_pb2.PauseExecutionRequest(
            session_id=session_id, expected_version=expected_version
        )
        response: checkpoint_pb2.PauseExecutionResponse = await self.call(
            self.checkpoints.PauseExecution, request
        )
        if saved is not None:
            response.saved.CopyFrom(saved)
        return response

    async def resume_execution(
        self, session_id: str, expected_version: int = 0
    ) -> checkpoint_pb2.ResumeExecutionResponse:
        request = checkpoint_pb2.ResumeExecutionRequest(
            session_id=session_id, expected_version=expected_version
        )
        response: checkpoint_pb2.ResumeExecutionResponse = await self.call(
            self.checkpoints.ResumeExecution, request
        )
        return response

    async def create_checkpoint(
        self,
        session_id: str,
        name: str = "",
        *,
        metadata: dict[str, Any] | None = None,
        checkpoint_id: str = "",
        expected_version: int = 0,
    ) -> checkpoint_pb2.Checkpoint:
        request = create_checkpoint_request(
            session_id, name, metadata, checkpoint_id, expected_version
        )
        response: checkpoint_pb2.CreateCheckpointResponse = await self.call(
            self.checkpoints.CreateCheckpoint, request
        )
        return response.checkpoint

    async def restore_checkpoint(
        self, checkpoint_id: str, *, make_current: bool = False, expected_version: int = 0
    ) -> checkpoint_pb2.LoadStateResponse:
        request = checkpoint_pb2.RestoreCheckpointRequest(
            checkpoint_id=checkpoint_id,
            make_current=make_current,
            expected_version=expected_version,
        )
        response: checkpoint_pb2.RestoreCheckpointResponse = await self.call(
            self.checkpoints.RestoreCheckpoint, request
        )
        return response.state

    async def list_checkpoints(
        self,
        session_id: str,
        *,
        namespace: str | None = None,
        metadata_filter: dict[str, Any] | None = None,
        before: str = "",
        page_size: int = 100,
        include_writes: bool = False,
    ) -> AsyncIterator[checkpoint_pb2.Checkpoint]:
        """Checkpoints newest first, following page tokens; with ``include_writes``
        each carries its pending writes."""
        token = ""
        while True:
            request = list_checkpoints_request(
                session_id, namespace, metadata_filter, before, page_size, token, include_writes
            )
            page: checkpoint_pb2.ListCheckpointsResponse = await self.call(
                self.checkpoints.ListCheckpoints, request
            )
            for checkpoint in page.checkpoints:
                yield checkpoint
            token = page.next_page_token
            if not token:
                return

    async def delete_checkpoint(self, checkpoint_id: str, expected_version: int = 0) -> None:
        request = checkpoint_pb2.DeleteCheckpointRequest(
            checkpoint_id=checkpoint_id, expected_version=expected_version
        )
        await self.call(self.checkpoints.DeleteCheckpoint, request)

    async def fork_session(
        self, checkpoint_id: str, new_session_id: str = "", labels: dict[str, str] | None = None
    ) -> session_pb2.Session:
        request = checkpoint_pb2.ForkSessionRequest(
            checkpoint_id=checkpoint_id, new_session_id=new_session_id, labels=labels or {}
        )
        response: checkpoint_pb2.ForkSessionResponse = await self.call(
            self.checkpoints.ForkSession, request
        )
        return response.session

    # -- admin -------------------------------------------------------------------

    async def verify(self) -> admin_pb2.VerifyResponse:
        request = admin_pb2.VerifyRequest()
        response: admin_pb2.VerifyResponse = await self.call(
            self.admin.Verify, request, timeout=3600
        )
        return response

    async def collect_garbage(self) -> admin_pb2.CollectGarbageResponse:
        request = admin_pb2.CollectGarbageRequest()
        response: admin_pb2.CollectGarbageResponse = await self.call(
            self.admin.CollectGarbage, request, timeout=3600
        )
        return response

    async def store_stats(self) -> admin_pb2.GetStoreStatsResponse:
        request = admin_pb2.GetStoreStatsRequest()
        response: admin_pb2.GetStoreStatsResponse = await self.call(
            self.admin.GetStoreStats, request
        )
        return response

    async def replication_status(self) -> admin_pb2.GetReplicationStatusResponse:
        """Replication to object storage: mode, backlog, lag (FailedPreconditionError
        when the daemon does not replicate)."""
        request = admin_pb2.GetReplicationStatusRequest()
        response: admin_pb2.GetReplicationStatusResponse = await self.call(
            self.admin.GetReplicationStatus, request
        )
        return response

    async def restore_session_from_remote(self, session_id: str) -> session_pb2.Session:
        """Replace the daemon's copy of a session with its history in object storage."""
        request = admin_pb2.RestoreSessionFromRemoteRequest(session_id=session_id)
        response: admin_pb2.RestoreSessionFromRemoteResponse = await self.call(
            self.admin.RestoreSessionFromRemote, request, timeout=3600
        )
        return response.session

    # -- pending writes, copy, prune, delete by metadata -----------------------------

    async def put_writes(
        self,
        session_id: str,
        checkpoint_id: str,
        task_id: str,
        writes: Iterable[tuple[int, str, str, bytes]],
        *,
        task_path: str = "",
        expected_version: int = 0,
    ) -> checkpoint_pb2.PutWritesResponse:
        """Attach pending writes `(idx, channel, type, value)` to a checkpoint (upsert)."""
        request = put_writes_request(
            session_id, checkpoint_id, task_id, writes, task_path, expected_version
        )
        response: checkpoint_pb2.PutWritesResponse = await self.call(
            self.checkpoints.PutWrites, request
        )
        return response

    async def load_state_with_writes(
        self, session_id: str, checkpoint_id: str = "", namespace: str = ""
    ) -> checkpoint_pb2.LoadStateResponse:
        """load_state, plus the checkpoint's pending writes in `.checkpoint.pending_writes`."""
        request = load_state_request(session_id, checkpoint_id, namespace, include_writes=True)
        response: checkpoint_pb2.LoadStateResponse = await self.call(
            self.checkpoints.LoadState, request
        )
        return response

    async def copy_session(
        self,
        source_session_id: str,
        target_session_id: str = "",
        *,
        labels: dict[str, str] | None = None,
        checkpoint_ids: dict[str, str] | None = None,
    ) -> checkpoint_pb2.CopySessionResponse:
        """A new session with a copy of every checkpoint of the source (objects shared)."""
        request = copy_session_request(source_session_id, target_session_id, labels, checkpoint_ids)
        response: checkpoint_pb2.CopySessionResponse = await self.call(
            self.checkpoints.CopySession, request
        )
        return response

    async def prune_checkpoints(
        self, session_ids: Iterable[str], strategy: str = "keep_latest"
    ) -> checkpoint_pb2.PruneCheckpointsResponse:
        """Keep the latest checkpoint of each namespace (`keep_latest`) or delete all (`delete`)."""
        request = prune_checkpoints_request(session_ids, strategy)
        response: checkpoint_pb2.PruneCheckpointsResponse = await self.call(
            self.checkpoints.PruneCheckpoints, request
        )
        return response

    async def delete_checkpoints(
        self,
        metadata_filters: Iterable[dict[str, Any]],
        *,
        session_id: str = "",
        namespace: str | None = None,
    ) -> checkpoint_pb2.DeleteCheckpointsResponse:
        """Delete checkpoints whose metadata matches any filter (all sessions when none given)."""
        request = delete_checkpoints_request(metadata_filters, session_id, namespace)
        response: checkpoint_pb2.DeleteCheckpointsResponse = await self.call(
            self.checkpoints.DeleteCheckpoints, request
        )
        return response
