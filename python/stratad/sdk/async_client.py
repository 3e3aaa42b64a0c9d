"""`AsyncClient`: the asyncio twin of the SDK (its blocking twin is sdk/sync_client.py).

Owns the awaitable calls over a grpc.aio channel. The requests come from
sdk/messages.py and failures are mapped by sdk/rpc.py, as for `Client`, so the
two twins differ only in how they call; see sdk/client.py for the whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, Unpack

import grpc
import grpc.aio

from stratad.api.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    checkpoint_pb2,
    checkpoint_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from stratad.errors import AlreadyExistsError, StratadError
from stratad.sdk.connection import Connection, TLSConfig
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
    save_states_request,
    whole_request,
)
from stratad.sdk.rpc import channel_options, not_ready_error, to_error
from stratad.sdk.upload import Uploader

__all__ = ["AsyncClient"]


class AsyncClient:
    """The asyncio client: the same methods as `Client`, awaitable.

    Like any grpc.aio channel, it belongs to the event loop it was created in:
    create one per loop (per `asyncio.run`).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        tenant: str | None = None,
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        timeout: float = 30.0,
        chunked_uploads: bool = True,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        self.connection = Connection.resolve(address, tenant=tenant, token=token, tls=tls)
        self.address = self.connection.address
        self.tenant = self.connection.tenant
        self.timeout = timeout
        self._metadata = self.connection.metadata
        self._channel = self.connection.aio_channel(channel_options(max_message_bytes))
        self.sessions = session_pb2_grpc.SessionServiceStub(self._channel)
        self.checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(self._channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._uploader = Uploader() if chunked_uploads else None

    @classmethod
    def from_connection(cls, connection: Connection, **options: Any) -> AsyncClient:
        """A client for a resolved `Connection` (the environment is not read again)."""
        return cls(
            connection.address,
            tenant=connection.tenant,
            token=connection.token,
            tls=connection.tls or False,
            **options,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    @property
    def channel(self) -> grpc.aio.Channel:
        return self._channel

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What every call carries: the tenant header and the bearer token, when set."""
        return self._metadata

    async def call(
        self,
        method: Any,
        request: Any,
        timeout: float | None = None,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> Any:
        """As `Client.call`: ``metadata`` is sent as well as the client's own headers."""
        headers = (*self._metadata, *metadata)
        try:
            return await method(request, timeout=timeout or self.timeout, metadata=headers)
        except grpc.RpcError as exc:
            # UNAVAILABLE because of a TLS mismatch: a message that names the fix.
            raise to_error(await self.connection.aio_explain(exc)) from None

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """As `Client.wait_ready`: wait until the daemon accepts connections."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            tls = self.connection.tls
            raise await asyncio.to_thread(not_ready_error, self.address, tls) from None

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
            return (await self.call(self.sessions.CreateSession, request)).session  # type: ignore[no-any-return]
        except AlreadyExistsError:
            if not exist_ok:
                raise
        return await self.get_session(session_id)

    async def get_session(self, session_id: str) -> session_pb2.Session:
        request = session_pb2.GetSessionRequest(session_id=session_id)
        return (await self.call(self.sessions.GetSession, request)).session  # type: ignore[no-any-return]

    async def list_sessions(
        self, prefix: str = "", page_size: int = 100
    ) -> AsyncIterator[session_pb2.Session]:
        token = ""
        while True:
            request = session_pb2.ListSessionsRequest(
                prefix=prefix, page_size=page_size, page_token=token
            )
            page = await self.call(self.sessions.ListSessions, request)
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
        request = session_pb2.GetStructuredStateRequest(session_id=session_id)
        return await self.call(self.sessions.GetStructuredState, request)  # type: ignore[no-any-return]

    async def replace_structured_state(
        self, session_id: str, structured_json: bytes, *, expected_version: int = 0
    ) -> session_pb2.ReplaceStructuredStateResponse:
        request = replace_structured_state_request(session_id, structured_json, expected_version)
        return await self.call(self.sessions.ReplaceStructuredState, request)  # type: ignore[no-any-return]

    async def watch_session(
        self, session_id: str, from_version: int = 0, timeout: float | None = None
    ) -> AsyncIterator[session_pb2.SessionEvent]:
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
        """As `Client.save_state`."""
        request = save_request(session_id, b"", expected_version=expected_version, **options)
        return await self.save(request, data)

    async def save(
        self, request: checkpoint_pb2.SaveStateRequest, data: bytes | None = None
    ) -> checkpoint_pb2.SaveStateResponse:
        """Save `request`; its state is `data` when given (see Client.save)."""
        plan = self._uploader.plan(request, data) if self._uploader else None
        if plan is None:
            return await self.call(self.checkpoints.SaveState, whole_request(request, data))  # type: ignore[no-any-return]
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
            return response  # type: ignore[no-any-return]
        return await self.call(self.checkpoints.SaveState, whole_request(request, data))  # type: ignore[no-any-return]

    async def load_state(
        self,
        session_id: str,
        checkpoint_id: str = "",
        namespace: str = "",
        *,
        include_writes: bool = False,
        include_structured: bool = False,
    ) -> checkpoint_pb2.LoadStateResponse:
        """As `Client.load_state`."""
        request = load_state_request(
            session_id,
            checkpoint_id,
            namespace,
            include_writes=include_writes,
            include_structured=include_structured,
        )
        return await self.call(self.checkpoints.LoadState, request)  # type: ignore[no-any-return]

    async def find_missing_chunks(self, digests: list[str]) -> list[str]:
        request = checkpoint_pb2.FindMissingChunksRequest(digests=digests)
        return list((await self.call(self.checkpoints.FindMissingChunks, request)).missing)

    async def pause_execution(
        self,
        session_id: str,
        data: bytes | None = None,
        *,
        expected_version: int = 0,
        **options: Unpack[SaveOptions],
    ) -> checkpoint_pb2.PauseExecutionResponse:
        """As `Client.pause_execution`."""
        saved = None
        if data is not None:
            saved = await self.save_state(
                session_id, data, expected_version=expected_version, **options
            )
            expected_version = 0
        request = checkpoint_pb2.PauseExecutionRequest(
            session_id=session_id, expected_version=expected_version
        )
        response = await self.call(self.checkpoints.PauseExecution, request)
        if saved is not None:
            response.saved.CopyFrom(saved)
        return response  # type: ignore[no-any-return]

    async def resume_execution(
        self, session_id: str, expected_version: int = 0
    ) -> checkpoint_pb2.ResumeExecutionResponse:
        request = checkpoint_pb2.ResumeExecutionRequest(
            session_id=session_id, expected_version=expected_version
        )
        return await self.call(self.checkpoints.ResumeExecution, request)  # type: ignore[no-any-return]

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
        response = await self.call(self.checkpoints.CreateCheckpoint, request)
        return response.checkpoint  # type: ignore[no-any-return]

    async def restore_checkpoint(
        self, checkpoint_id: str, *, make_current: bool = False, expected_version: int = 0
    ) -> checkpoint_pb2.LoadStateResponse:
        request = checkpoint_pb2.RestoreCheckpointRequest(
            checkpoint_id=checkpoint_id,
            make_current=make_current,
            expected_version=expected_version,
        )
        return (await self.call(self.checkpoints.RestoreCheckpoint, request)).state  # type: ignore[no-any-return]

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
        token = ""
        while True:
            request = list_checkpoints_request(
                session_id, namespace, metadata_filter, before, page_size, token, include_writes
            )
            page = await self.call(self.checkpoints.ListCheckpoints, request)
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
        return (await self.call(self.checkpoints.ForkSession, request)).session  # type: ignore[no-any-return]

    async def save_states(
        self,
        requests: Iterable[checkpoint_pb2.SaveStateRequest]
        | AsyncIterable[checkpoint_pb2.SaveStateRequest],
        timeout: float | None = None,
    ) -> AsyncIterator[checkpoint_pb2.SaveStatesResponse]:
        """As `Client.save_states`; ``requests`` may also be an async iterable."""
        stream = self.checkpoints.SaveStates(
            _stream_of(requests), timeout=timeout, metadata=self._metadata
        )
        try:
            async for response in stream:
                yield response
        except grpc.RpcError as exc:
            raise to_error(await self.connection.aio_explain(exc)) from None
        finally:
            stream.cancel()

    # -- admin -------------------------------------------------------------------

    async def verify(self) -> admin_pb2.VerifyResponse:
        return await self.call(self.admin.Verify, admin_pb2.VerifyRequest(), timeout=3600)  # type: ignore[no-any-return]

    async def collect_garbage(self) -> admin_pb2.CollectGarbageResponse:
        request = admin_pb2.CollectGarbageRequest()
        return await self.call(self.admin.CollectGarbage, request, timeout=3600)  # type: ignore[no-any-return]

    async def store_stats(self) -> admin_pb2.GetStoreStatsResponse:
        request = admin_pb2.GetStoreStatsRequest()
        return await self.call(self.admin.GetStoreStats, request)  # type: ignore[no-any-return]

    async def replication_status(self) -> admin_pb2.GetReplicationStatusResponse:
        request = admin_pb2.GetReplicationStatusRequest()
        return await self.call(self.admin.GetReplicationStatus, request)  # type: ignore[no-any-return]

    async def restore_session_from_remote(self, session_id: str) -> session_pb2.Session:
        request = admin_pb2.RestoreSessionFromRemoteRequest(session_id=session_id)
        response = await self.call(self.admin.RestoreSessionFromRemote, request, timeout=3600)
        return response.session  # type: ignore[no-any-return]

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
        return await self.call(self.checkpoints.PutWrites, request)  # type: ignore[no-any-return]

    async def load_state_with_writes(
        self, session_id: str, checkpoint_id: str = "", namespace: str = ""
    ) -> checkpoint_pb2.LoadStateResponse:
        """load_state, plus the checkpoint's pending writes in `.checkpoint.pending_writes`."""
        request = load_state_request(session_id, checkpoint_id, namespace, include_writes=True)
        return await self.call(self.checkpoints.LoadState, request)  # type: ignore[no-any-return]

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
        return await self.call(self.checkpoints.CopySession, request)  # type: ignore[no-any-return]

    async def prune_checkpoints(
        self, session_ids: Iterable[str], strategy: str = "keep_latest"
    ) -> checkpoint_pb2.PruneCheckpointsResponse:
        """Keep the latest checkpoint of each namespace (`keep_latest`) or delete all (`delete`)."""
        request = prune_checkpoints_request(session_ids, strategy)
        return await self.call(self.checkpoints.PruneCheckpoints, request)  # type: ignore[no-any-return]

    async def delete_checkpoints(
        self,
        metadata_filters: Iterable[dict[str, Any]],
        *,
        session_id: str = "",
        namespace: str | None = None,
    ) -> checkpoint_pb2.DeleteCheckpointsResponse:
        """Delete checkpoints whose metadata matches any filter (all sessions when none given)."""
        request = delete_checkpoints_request(metadata_filters, session_id, namespace)
        return await self.call(self.checkpoints.DeleteCheckpoints, request)  # type: ignore[no-any-return]


def _stream_of(
    requests: Iterable[checkpoint_pb2.SaveStateRequest]
    | AsyncIterable[checkpoint_pb2.SaveStateRequest],
) -> Iterator[checkpoint_pb2.SaveStatesRequest] | AsyncIterator[checkpoint_pb2.SaveStatesRequest]:
    """The SaveStates stream of ``requests`` (grpc.aio takes either kind of iterator)."""
    if isinstance(requests, AsyncIterable):

        async def each() -> AsyncIterator[checkpoint_pb2.SaveStatesRequest]:
            async for request in requests:
                yield save_states_request(request)

        return each()
    return (save_states_request(request) for request in requests)
