"""`Client`: the blocking twin of the SDK (its asyncio twin is sdk/async_client.py).

Owns the blocking calls and their transport: a grpcio channel, and on a
plaintext connection the native HTTP/2 channel its unary calls go over
(sdk/native.py). The requests come from sdk/messages.py and failures are
mapped by sdk/rpc.py, as for `AsyncClient`; see sdk/client.py for the whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, Unpack, cast

import grpc

from stratad import tracing
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
from stratad.sdk.native import NativeUnaryChannel
from stratad.sdk.rpc import channel_options, not_ready_error, to_error
from stratad.sdk.upload import Uploader

__all__ = ["Client"]

S = TypeVar("S")


def _native_channel(connection: Connection, max_message_bytes: int) -> NativeUnaryChannel | None:
    """The native channel for unary calls, on a plaintext host:port or unix:
    address; None otherwise: TLS, an address form only grpcio resolves, or an
    application that traces (its CLIENT spans come from the instrumented
    grpcio channel, see stratad.tracing)."""
    if connection.tls is not None or tracing.client_tracer_provider() is not None:
        return None
    try:
        return NativeUnaryChannel(
            connection.address, max_message_bytes=max_message_bytes, explain=connection.explain
        )
    except ValueError:
        return None


class Client:
    """A blocking client. Use as a context manager, or call close().

    ``address`` (``HOST:PORT`` or ``unix:/path``), ``tenant``, ``token`` (a
    bearer token) and ``tls`` (a `TLSConfig`, True or False) default to the
    STRATAD_* variables when None or empty; see `stratad.sdk.connection`.
    Safe to share between threads. On a plaintext connection its unary calls
    go over the native HTTP/2 client (`native_calls`; sdk/native.py), streams
    and TLS connections over grpcio.
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
        native_calls: bool = True,
    ) -> None:
        self.connection = Connection.resolve(address, tenant=tenant, token=token, tls=tls)
        self.address = self.connection.address
        self.tenant = self.connection.tenant
        self.timeout = timeout
        self._metadata = self.connection.metadata
        self._channel = self.connection.channel(channel_options(max_message_bytes))
        self._native = _native_channel(self.connection, max_message_bytes) if native_calls else None
        self.sessions = self._stub(session_pb2, session_pb2_grpc.SessionServiceStub)
        self.checkpoints = self._stub(checkpoint_pb2, checkpoint_pb2_grpc.CheckpointServiceStub)
        self.admin = self._stub(admin_pb2, admin_pb2_grpc.AdminServiceStub)
        self._uploader = Uploader() if chunked_uploads else None

    def _stub(self, module: Any, stub_class: Callable[[grpc.Channel], S]) -> S:
        """The service's stub: unary methods over the native channel when there is one."""
        stub = stub_class(self._channel)
        if self._native is None:
            return stub
        name = stub_class.__name__.removesuffix("Stub")
        return cast(S, self._native.stub(module.DESCRIPTOR.services_by_name[name], stub))

    @classmethod
    def from_connection(cls, connection: Connection, **options: Any) -> Client:
        """A client for a resolved `Connection` (the environment is not read again)."""
        return cls(
            connection.address,
            tenant=connection.tenant,
            token=connection.token,
            tls=connection.tls or False,
            **options,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()
        if self._native is not None:
            self._native.close()

    @property
    def channel(self) -> grpc.Channel:
        return self._channel

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What every call carries: the tenant header and the bearer token, when set."""
        return self._metadata

    def call(
        self,
        method: Any,
        request: Any,
        timeout: float | None = None,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> Any:
        """Invoke a unary stub method with deadline, tenant and token; map errors.

        ``metadata`` is sent as well as the client's own headers (e.g.
        ``[("x-request-id", "req-42")]``); passing ``metadata=`` to a stub method
        directly would replace them, tenant and token included."""
        headers = (*self._metadata, *metadata)
        try:
            return method(request, timeout=timeout or self.timeout, metadata=headers)
        except grpc.RpcError as exc:
            raise to_error(exc) from None

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the daemon accepts connections; after ``timeout`` seconds
        raise UnavailableError naming the setting to change when a TLS mismatch
        is the cause, else StratadError."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise not_ready_error(self.address, self.connection.tls) from None

    # -- sessions ----------------------------------------------------------------

    def create_session(
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
            return self.call(self.sessions.CreateSession, request).session  # type: ignore[no-any-return]
        except AlreadyExistsError:
            if not exist_ok:
                raise
        return self.get_session(session_id)

    def get_session(self, session_id: str) -> session_pb2.Session:
        request = session_pb2.GetSessionRequest(session_id=session_id)
        return self.call(self.sessions.GetSession, request).session  # type: ignore[no-any-return]

    def list_sessions(
        self, prefix: str = "", page_size: int = 100
    ) -> Iterator[session_pb2.Session]:
        """Every session (following page tokens), ordered by ID."""
        token = ""
        while True:
            request = session_pb2.ListSessionsRequest(
                prefix=prefix, page_size=page_size, page_token=token
            )
            page = self.call(self.sessions.ListSessions, request)
            yield from page.sessions
            token = page.next_page_token
            if not token:
                return

    def delete_session(self, session_id: str, expected_version: int = 0) -> None:
        request = session_pb2.DeleteSessionRequest(
            session_id=session_id, expected_version=expected_version
        )
        self.call(self.sessions.DeleteSession, request)
        if self._uploader:
            self._uploader.forget_session(session_id)

    def get_structured_state(self, session_id: str) -> session_pb2.GetStructuredStateResponse:
        """The session's structured state (cognitive state, tasks, agent state) as one
        JSON object keyed by facet (``structured_json``), and the version it was read at."""
        request = session_pb2.GetStructuredStateRequest(session_id=session_id)
        return self.call(self.sessions.GetStructuredState, request)  # type: ignore[no-any-return]

    def replace_structured_state(
        self, session_id: str, structured_json: bytes, *, expected_version: int = 0
    ) -> session_pb2.ReplaceStructuredStateResponse:
        """Replace the session's structured state as a whole with ``structured_json``
        (a JSON object as `get_structured_state` returns it; ``b"{}"`` clears it)."""
        request = replace_structured_state_request(session_id, structured_json, expected_version)
        return self.call(self.sessions.ReplaceStructuredState, request)  # type: ignore[no-any-return]

    def watch_session(
        self, session_id: str, from_version: int = 0, timeout: float | None = None
    ) -> Iterator[session_pb2.SessionEvent]:
        """Events of the session as they happen (blocking iterator; cancel by closing it)."""
        request = session_pb2.WatchSessionRequest(session_id=session_id, from_version=from_version)
        stream = self.sessions.WatchSession(request, timeout=timeout, metadata=self._metadata)
        try:
            for response in stream:
                yield response.event
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise to_error(self.connection.explain(exc)) from None
        finally:
            stream.cancel()

    # -- state -------------------------------------------------------------------

    def save_state(
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
        return self.save(request, data)

    def save(
        self, request: checkpoint_pb2.SaveStateRequest, data: bytes | None = None
    ) -> checkpoint_pb2.SaveStateResponse:
        """Save `request`; its state is `data` when given, else the request's own
        `data` (keeping a large state out of the message saves copying it in)."""
        plan = self._uploader.plan(request, data) if self._uploader else None
        if plan is None:
            return self.call(self.checkpoints.SaveState, whole_request(request, data))  # type: ignore[no-any-return]
        assert self._uploader is not None
        for _ in range(3):
            try:
                response = self.call(self.checkpoints.SaveState, plan.request)
            except StratadError as exc:
                if missing_chunks(exc):
                    missing = self.find_missing_chunks(self._uploader.chunk_digests(plan))
                    plan = self._uploader.with_frames(plan, missing)
                    continue
                retry = replan(self._uploader, plan, exc)
                if retry is None:
                    raise
                plan = retry
                continue
            self._uploader.saved(plan, response.checkpoint_id)
            return response  # type: ignore[no-any-return]
        return self.call(self.checkpoints.SaveState, whole_request(request, data))  # type: ignore[no-any-return]

    def load_state(
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
        return self.call(self.checkpoints.LoadState, request)  # type: ignore[no-any-return]

    def find_missing_chunks(self, digests: list[str]) -> list[str]:
        request = checkpoint_pb2.FindMissingChunksRequest(digests=digests)
        return list(self.call(self.checkpoints.FindMissingChunks, request).missing)

    def pause_execution(
        self,
        session_id: str,
        data: bytes | None = None,
        *,
        expected_version: int = 0,
        **options: Unpack[SaveOptions],
    ) -> checkpoint_pb2.PauseExecutionResponse:
        """Pause the session, first saving `data` as a checkpoint when given (with
        ``options`` as `save_state` takes them, and ``expected_version``)."""
        if data is not None:
            saved = self.save_state(session_id, data, expected_version=expected_version, **options)
            expected_version = 0
        request = checkpoint_pb2.PauseExecutionRequest(
            session_id=session_id, expected_version=expected_version
        )
        response = self.call(self.checkpoints.PauseExecution, request)
        if data is not None:
            response.saved.CopyFrom(saved)
        return response  # type: ignore[no-any-return]

    def resume_execution(
        self, session_id: str, expected_version: int = 0
    ) -> checkpoint_pb2.ResumeExecutionResponse:
        request = checkpoint_pb2.ResumeExecutionRequest(
            session_id=session_id, expected_version=expected_version
        )
        return self.call(self.checkpoints.ResumeExecution, request)  # type: ignore[no-any-return]

    def create_checkpoint(
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
        return self.call(self.checkpoints.CreateCheckpoint, request).checkpoint  # type: ignore[no-any-return]

    def restore_checkpoint(
        self, checkpoint_id: str, *, make_current: bool = False, expected_version: int = 0
    ) -> checkpoint_pb2.LoadStateResponse:
        request = checkpoint_pb2.RestoreCheckpointRequest(
            checkpoint_id=checkpoint_id,
            make_current=make_current,
            expected_version=expected_version,
        )
        return self.call(self.checkpoints.RestoreCheckpoint, request).state  # type: ignore[no-any-return]

    def list_checkpoints(
        self,
        session_id: str,
        *,
        namespace: str | None = None,
        metadata_filter: dict[str, Any] | None = None,
        before: str = "",
        page_size: int = 100,
        include_writes: bool = False,
    ) -> Iterator[checkpoint_pb2.Checkpoint]:
        """Checkpoints newest first, following page tokens; with ``include_writes``
        each carries its pending writes."""
        token = ""
        while True:
            request = list_checkpoints_request(
                session_id, namespace, metadata_filter, before, page_size, token, include_writes
            )
            page = self.call(self.checkpoints.ListCheckpoints, request)
            yield from page.checkpoints
            token = page.next_page_token
            if not token:
                return

    def delete_checkpoint(self, checkpoint_id: str, expected_version: int = 0) -> None:
        request = checkpoint_pb2.DeleteCheckpointRequest(
            checkpoint_id=checkpoint_id, expected_version=expected_version
        )
        self.call(self.checkpoints.DeleteCheckpoint, request)

    def fork_session(
        self, checkpoint_id: str, new_session_id: str = "", labels: dict[str, str] | None = None
    ) -> session_pb2.Session:
        request = checkpoint_pb2.ForkSessionRequest(
            checkpoint_id=checkpoint_id, new_session_id=new_session_id, labels=labels or {}
        )
        return self.call(self.checkpoints.ForkSession, request).session  # type: ignore[no-any-return]

    def save_states(
        self, requests: Iterable[checkpoint_pb2.SaveStateRequest], timeout: float | None = None
    ) -> Iterator[checkpoint_pb2.SaveStatesResponse]:
        """Stream many saves; one response per request, in order (whole states)."""
        stream = self.checkpoints.SaveStates(
            (save_states_request(r) for r in requests),
            timeout=timeout,
            metadata=self._metadata,
        )
        try:
            yield from stream
        except grpc.RpcError as exc:
            raise to_error(self.connection.explain(exc)) from None

    # -- admin -------------------------------------------------------------------

    def verify(self) -> admin_pb2.VerifyResponse:
        return self.call(self.admin.Verify, admin_pb2.VerifyRequest(), timeout=3600)  # type: ignore[no-any-return]

    def collect_garbage(self) -> admin_pb2.CollectGarbageResponse:
        request = admin_pb2.CollectGarbageRequest()
        return self.call(self.admin.CollectGarbage, request, timeout=3600)  # type: ignore[no-any-return]

    def store_stats(self) -> admin_pb2.GetStoreStatsResponse:
        return self.call(self.admin.GetStoreStats, admin_pb2.GetStoreStatsRequest())  # type: ignore[no-any-return]

    def replication_status(self) -> admin_pb2.GetReplicationStatusResponse:
        """Replication to object storage: mode, backlog, lag (FailedPreconditionError
        when the daemon does not replicate)."""
        request = admin_pb2.GetReplicationStatusRequest()
        return self.call(self.admin.GetReplicationStatus, request)  # type: ignore[no-any-return]

    def restore_session_from_remote(self, session_id: str) -> session_pb2.Session:
        """Replace the daemon's copy of a session with its history in object storage."""
        request = admin_pb2.RestoreSessionFromRemoteRequest(session_id=session_id)
        response = self.call(self.admin.RestoreSessionFromRemote, request, timeout=3600)
        return response.session  # type: ignore[no-any-return]

    # -- pending writes, copy, prune, delete by metadata -----------------------------

    def put_writes(
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
        return self.call(self.checkpoints.PutWrites, request)  # type: ignore[no-any-return]

    def load_state_with_writes(
        self, session_id: str, checkpoint_id: str = "", namespace: str = ""
    ) -> checkpoint_pb2.LoadStateResponse:
        """load_state, plus the checkpoint's pending writes in `.checkpoint.pending_writes`."""
        request = load_state_request(session_id, checkpoint_id, namespace, include_writes=True)
        return self.call(self.checkpoints.LoadState, request)  # type: ignore[no-any-return]

    def copy_session(
        self,
        source_session_id: str,
        target_session_id: str = "",
        *,
        labels: dict[str, str] | None = None,
        checkpoint_ids: dict[str, str] | None = None,
    ) -> checkpoint_pb2.CopySessionResponse:
        """A new session with a copy of every checkpoint of the source (objects shared)."""
        request = copy_session_request(source_session_id, target_session_id, labels, checkpoint_ids)
        return self.call(self.checkpoints.CopySession, request)  # type: ignore[no-any-return]

    def prune_checkpoints(
        self, session_ids: Iterable[str], strategy: str = "keep_latest"
    ) -> checkpoint_pb2.PruneCheckpointsResponse:
        """Keep the latest checkpoint of each namespace (`keep_latest`) or delete all (`delete`)."""
        request = prune_checkpoints_request(session_ids, strategy)
        return self.call(self.checkpoints.PruneCheckpoints, request)  # type: ignore[no-any-return]

    def delete_checkpoints(
        self,
        metadata_filters: Iterable[dict[str, Any]],
        *,
        session_id: str = "",
        namespace: str | None = None,
    ) -> checkpoint_pb2.DeleteCheckpointsResponse:
        """Delete checkpoints whose metadata matches any filter (all sessions when none given)."""
        request = delete_checkpoints_request(metadata_filters, session_id, namespace)
        return self.call(self.checkpoints.DeleteCheckpoints, request)  # type: ignore[no-any-return]
