"""The Python SDK: `Client` (blocking) and `AsyncClient` (asyncio).

Both connect as `stratad.sdk.connection` resolves: the address, tenant, bearer
token and TLS settings given, else the STRATAD_ADDRESS, STRATAD_TENANT,
STRATAD_TOKEN(_FILE) and STRATAD_TLS* variables.

Both speak the stratad.api.v1 services and return their protobuf messages.
Every call has a deadline (`timeout`, overridable per call); gRPC retries
calls that fail with UNAVAILABLE before reaching the daemon (a service-config
retry policy with exponential backoff); failures are raised as the
`stratad.errors` class of their status code. Large states are uploaded in
chunks the daemon lacks (see sdk/upload.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

import grpc
import grpc.aio
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from stratad import tracing
from stratad.api.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    checkpoint_pb2,
    checkpoint_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from stratad.errors import (
    ERROR_BY_STATUS,
    ERROR_DOMAIN,
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    StratadError,
    UnavailableError,
)
from stratad.sdk import diagnose
from stratad.sdk.connection import DEFAULT_ADDRESS, TENANT_HEADER, Connection, TLSConfig
from stratad.sdk.native import NativeUnaryChannel
from stratad.sdk.upload import Uploader, UploadPlan

__all__ = [
    "DEFAULT_ADDRESS",
    "TENANT_HEADER",
    "AsyncClient",
    "Client",
    "TLSConfig",
    "error_info",
    "to_error",
]
M = TypeVar("M")
S = TypeVar("S")

_RETRY_POLICY = {
    "methodConfig": [
        {
            "name": [
                {"service": f"stratad.api.v1.{s}"}
                for s in (
                    "SessionService",
                    "CheckpointService",
                    "TaskService",
                    "CognitiveStateService",
                    "AgentStateService",
                    "ProfileService",
                    "CrystalService",
                    "AdminService",
                )
            ],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.05s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        },
        # A watch is not retried: a retried stream that had no event yet waits
        # on a daemon that is gone (it hung for good when the daemon was
        # SIGKILLed) instead of telling the caller, who resumes from the last
        # version seen (Client.watch_session, stratad ctl sessions watch).
        # The most specific name wins over the service-wide entry above.
        {"name": [{"service": "stratad.api.v1.SessionService", "method": "WatchSession"}]},
    ]
}


def channel_options(max_message_bytes: int = 64 << 20) -> list[tuple[str, Any]]:
    return [
        ("grpc.service_config", json.dumps(_RETRY_POLICY)),
        ("grpc.enable_retries", 1),
        ("grpc.max_send_message_length", max_message_bytes + (1 << 20)),
        ("grpc.max_receive_message_length", max_message_bytes + (1 << 20)),
    ]


def to_error(exc: grpc.RpcError) -> StratadError:
    """The stratad.errors exception for a failed call, with the server's reason.

    The reason and its metadata come from the `google.rpc.ErrorInfo` the
    daemon attaches to every error (`exc.reason`, e.g. "VERSION_CONFLICT");
    calls that carry none (a transport failure) get the class default.
    """
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(code)
    cls = ERROR_BY_STATUS.get(code.name, StratadError)
    info = error_info(exc)
    if info is None:
        return cls(details)
    return cls(details, reason=info.reason, metadata=dict(info.metadata))


def error_info(exc: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The stratad ErrorInfo of a failed call, if the daemon sent one."""
    try:
        status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    except (ValueError, AttributeError):  # a mismatched or malformed trailer
        return None
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == ERROR_DOMAIN:
            return info
    return None


#: Deepest nesting of objects and lists the daemon accepts in metadata (its
#: MAX_STRUCT_DEPTH, server/servicers/values.py): ``{"a": 1}`` is 1 level.
MAX_METADATA_DEPTH = 32


def check_depth(value: Any, what: str = "metadata") -> None:
    """Refuse ``value`` nested deeper than `MAX_METADATA_DEPTH` before it is sent,
    as the daemon would (InvalidArgumentError, reason INVALID_VALUE): deeper
    than about 33 levels protobuf itself fails to copy the Struct into a request
    with a DecodeError. An explicit stack: no depth exhausts Python's recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Iterable[Any] = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if depth + 1 > MAX_METADATA_DEPTH:
            raise InvalidArgumentError(
                f"{what} is nested deeper than {MAX_METADATA_DEPTH} levels of objects and lists",
                reason="INVALID_VALUE",
                metadata={"field": what, "max_depth": str(MAX_METADATA_DEPTH)},
            )
        stack.extend((child, depth + 1) for child in children)


def struct(value: dict[str, Any] | None) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    if value:
        check_depth(value)
        out.update(value)
    return out


def save_request(
    session_id: str,
    data: bytes,
    *,
    content_type: str = "",
    metadata: dict[str, Any] | None = None,
    expected_version: int = 0,
    checkpoint_id: str = "",
    parent_checkpoint_id: str = "",
    namespace: str = "",
) -> checkpoint_pb2.SaveStateRequest:
    return checkpoint_pb2.SaveStateRequest(
        session_id=session_id,
        data=data,
        content_type=content_type,
        metadata=struct(metadata),
        expected_version=expected_version,
        checkpoint_id=checkpoint_id,
        parent_checkpoint_id=parent_checkpoint_id,
        namespace=namespace,
    )


def _whole(
    request: checkpoint_pb2.SaveStateRequest, data: bytes | None
) -> checkpoint_pb2.SaveStateRequest:
    """`request` carrying its state whole (`data`, when it was kept apart; the
    caller's request is left as it was)."""
    if data is None:
        return request
    whole = checkpoint_pb2.SaveStateRequest()
    whole.CopyFrom(request)
    whole.data = data
    return whole


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


def _missing_chunks(exc: StratadError) -> bool:
    return isinstance(exc, FailedPreconditionError) and "chunks are missing" in exc.message


def _deltas_refused(exc: StratadError) -> bool:
    """A daemon from before delta uploads cannot decode one (it has no base for
    it) and refuses the save; newer ones decode them against the stored base."""
    return isinstance(exc, InvalidArgumentError) and "cannot be decoded without its base" in (
        exc.message
    )


def _base_gone(exc: StratadError, plan: UploadPlan) -> bool:
    base = plan.request.chunked.base_checkpoint_id
    return isinstance(exc, NotFoundError) and bool(base) and base in exc.message


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
        """Block until the daemon accepts connections."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            diagnosis = diagnose.diagnose_address(self.address, self.connection.tls)
            if diagnosis is not None:  # a TLS mismatch: say which setting to change
                raise UnavailableError(
                    diagnosis.message, reason=diagnosis.reason, metadata={"address": self.address}
                ) from None
            raise StratadError(f"no stratad daemon reachable at {self.address}") from None

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
        request = session_pb2.CreateSessionRequest(
            session_id=session_id,
            labels=labels or {},
            retention=session_pb2.RetentionPolicy(
                keep_last=keep_last, max_age_seconds=max_age_seconds
            ),
        )
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
        self, session_id: str, data: bytes, **options: Any
    ) -> checkpoint_pb2.SaveStateResponse:
        """Save `data` as a new checkpoint (options: content_type, metadata,
        expected_version, checkpoint_id, parent_checkpoint_id, namespace)."""
        # `data` stays out of the message unless it is sent whole: a chunked
        # upload would copy it in only to clear it again.
        return self.save(save_request(session_id, b"", **options), data)

    def save(
        self, request: checkpoint_pb2.SaveStateRequest, data: bytes | None = None
    ) -> checkpoint_pb2.SaveStateResponse:
        """Save `request`; its state is `data` when given, else the request's own
        `data` (keeping a large state out of the message saves copying it in)."""
        plan = self._uploader.plan(request, data) if self._uploader else None
        if plan is None:
            return self.call(self.checkpoints.SaveState, _whole(request, data))  # type: ignore[no-any-return]
        assert self._uploader is not None
        for _ in range(3):
            try:
                response = self.call(self.checkpoints.SaveState, plan.request)
            except StratadError as exc:
                if _missing_chunks(exc):
                    missing = self.find_missing_chunks(self._uploader.chunk_digests(plan))
                    plan = self._uploader.with_frames(plan, missing)
                elif _base_gone(exc, plan):
                    plan = self._uploader.without_base(plan)
                elif _deltas_refused(exc) and self._uploader.deltas:
                    plan = self._uploader.without_deltas(plan)
                else:
                    raise
                continue
            self._uploader.saved(plan, response.checkpoint_id)
            return response  # type: ignore[no-any-return]
        return self.call(self.checkpoints.SaveState, _whole(request, data))  # type: ignore[no-any-return]

    def load_state(
        self, session_id: str, checkpoint_id: str = "", namespace: str = ""
    ) -> checkpoint_pb2.LoadStateResponse:
        request = checkpoint_pb2.LoadStateRequest(
            session_id=session_id, checkpoint_id=checkpoint_id, namespace=namespace
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
        **options: Any,
    ) -> checkpoint_pb2.PauseExecutionResponse:
        """Pause the session, first saving `data` as a checkpoint when given."""
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
        request = checkpoint_pb2.CreateCheckpointRequest(
            session_id=session_id,
            name=name,
            metadata=struct(metadata),
            checkpoint_id=checkpoint_id,
            expected_version=expected_version,
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
    ) -> Iterator[checkpoint_pb2.Checkpoint]:
        """Checkpoints newest first, following page tokens."""
        token = ""
        while True:
            request = checkpoint_pb2.ListCheckpointsRequest(
                session_id=session_id,
                page_size=page_size,
                page_token=token,
                metadata_filter=struct(metadata_filter),
                before=before,
            )
            if namespace is not None:
                request.namespace = namespace
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
            (checkpoint_pb2.SaveStatesRequest(request=r) for r in requests),
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
        request = checkpoint_pb2.LoadStateRequest(
            session_id=session_id,
            checkpoint_id=checkpoint_id,
            namespace=namespace,
            include_writes=True,
        )
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
        request = checkpoint_pb2.CopySessionRequest(
            source_session_id=source_session_id,
            target_session_id=target_session_id,
            labels=labels or {},
            checkpoint_ids=checkpoint_ids or {},
        )
        return self.call(self.checkpoints.CopySession, request)  # type: ignore[no-any-return]

    def prune_checkpoints(
        self, session_ids: Iterable[str], strategy: str = "keep_latest"
    ) -> checkpoint_pb2.PruneCheckpointsResponse:
        """Keep the latest checkpoint of each namespace (`keep_latest`) or delete all (`delete`)."""
        request = checkpoint_pb2.PruneCheckpointsRequest(
            session_ids=list(session_ids), strategy=prune_strategy(strategy)
        )
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
        request = session_pb2.CreateSessionRequest(
            session_id=session_id,
            labels=labels or {},
            retention=session_pb2.RetentionPolicy(
                keep_last=keep_last, max_age_seconds=max_age_seconds
            ),
        )
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

    async def watch_session(
        self, session_id: str, from_version: int = 0
    ) -> AsyncIterator[session_pb2.SessionEvent]:
        request = session_pb2.WatchSessionRequest(session_id=session_id, from_version=from_version)
        stream = self.sessions.WatchSession(request, metadata=self._metadata)
        try:
            async for response in stream:
                yield response.event
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise to_error(await self.connection.aio_explain(exc)) from None
        finally:
            stream.cancel()

    async def save_state(
        self, session_id: str, data: bytes, **options: Any
    ) -> checkpoint_pb2.SaveStateResponse:
        return await self.save(save_request(session_id, b"", **options), data)

    async def save(
        self, request: checkpoint_pb2.SaveStateRequest, data: bytes | None = None
    ) -> checkpoint_pb2.SaveStateResponse:
        """Save `request`; its state is `data` when given (see Client.save)."""
        plan = self._uploader.plan(request, data) if self._uploader else None
        if plan is None:
            return await self.call(self.checkpoints.SaveState, _whole(request, data))  # type: ignore[no-any-return]
        assert self._uploader is not None
        for _ in range(3):
            try:
                response = await self.call(self.checkpoints.SaveState, plan.request)
            except StratadError as exc:
                if _missing_chunks(exc):
                    missing = await self.find_missing_chunks(self._uploader.chunk_digests(plan))
                    plan = self._uploader.with_frames(plan, missing)
                elif _base_gone(exc, plan):
                    plan = self._uploader.without_base(plan)
                elif _deltas_refused(exc) and self._uploader.deltas:
                    plan = self._uploader.without_deltas(plan)
                else:
                    raise
                continue
            self._uploader.saved(plan, response.checkpoint_id)
            return response  # type: ignore[no-any-return]
        return await self.call(self.checkpoints.SaveState, _whole(request, data))  # type: ignore[no-any-return]

    async def load_state(
        self, session_id: str, checkpoint_id: str = "", namespace: str = ""
    ) -> checkpoint_pb2.LoadStateResponse:
        request = checkpoint_pb2.LoadStateRequest(
            session_id=session_id, checkpoint_id=checkpoint_id, namespace=namespace
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
        **options: Any,
    ) -> checkpoint_pb2.PauseExecutionResponse:
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
        request = checkpoint_pb2.CreateCheckpointRequest(
            session_id=session_id,
            name=name,
            metadata=struct(metadata),
            checkpoint_id=checkpoint_id,
            expected_version=expected_version,
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
    ) -> AsyncIterator[checkpoint_pb2.Checkpoint]:
        token = ""
        while True:
            request = checkpoint_pb2.ListCheckpointsRequest(
                session_id=session_id,
                page_size=page_size,
                page_token=token,
                metadata_filter=struct(metadata_filter),
                before=before,
            )
            if namespace is not None:
                request.namespace = namespace
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

    async def verify(self) -> admin_pb2.VerifyResponse:
        return await self.call(self.admin.Verify, admin_pb2.VerifyRequest(), timeout=3600)  # type: ignore[no-any-return]

    async def collect_garbage(self) -> admin_pb2.CollectGarbageResponse:
        request = admin_pb2.CollectGarbageRequest()
        return await self.call(self.admin.CollectGarbage, request, timeout=3600)  # type: ignore[no-any-return]

    async def store_stats(self) -> admin_pb2.GetStoreStatsResponse:
        request = admin_pb2.GetStoreStatsRequest()
        return await self.call(self.admin.GetStoreStats, request)  # type: ignore[no-any-return]

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
        request = checkpoint_pb2.LoadStateRequest(
            session_id=session_id,
            checkpoint_id=checkpoint_id,
            namespace=namespace,
            include_writes=True,
        )
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
        request = checkpoint_pb2.CopySessionRequest(
            source_session_id=source_session_id,
            target_session_id=target_session_id,
            labels=labels or {},
            checkpoint_ids=checkpoint_ids or {},
        )
        return await self.call(self.checkpoints.CopySession, request)  # type: ignore[no-any-return]

    async def prune_checkpoints(
        self, session_ids: Iterable[str], strategy: str = "keep_latest"
    ) -> checkpoint_pb2.PruneCheckpointsResponse:
        """Keep the latest checkpoint of each namespace (`keep_latest`) or delete all (`delete`)."""
        request = checkpoint_pb2.PruneCheckpointsRequest(
            session_ids=list(session_ids), strategy=prune_strategy(strategy)
        )
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


# -- request helpers for PutWrites, PruneCheckpoints and DeleteCheckpoints -------------

_PRUNE_STRATEGIES = {
    "keep_latest": checkpoint_pb2.PRUNE_STRATEGY_KEEP_LATEST,
    "delete": checkpoint_pb2.PRUNE_STRATEGY_DELETE,
}


def prune_strategy(name: str) -> checkpoint_pb2.PruneStrategy.ValueType:
    try:
        return _PRUNE_STRATEGIES[name]
    except KeyError:
        raise ValueError(f"strategy must be one of {sorted(_PRUNE_STRATEGIES)}") from None


def put_writes_request(
    session_id: str,
    checkpoint_id: str,
    task_id: str,
    writes: Iterable[tuple[int, str, str, bytes]],
    task_path: str = "",
    expected_version: int = 0,
) -> checkpoint_pb2.PutWritesRequest:
    return checkpoint_pb2.PutWritesRequest(
        session_id=session_id,
        checkpoint_id=checkpoint_id,
        task_id=task_id,
        task_path=task_path,
        expected_version=expected_version,
        writes=[
            checkpoint_pb2.WriteValue(idx=idx, channel=channel, type=type_, value=value)
            for idx, channel, type_, value in writes
        ],
    )


def delete_checkpoints_request(
    metadata_filters: Iterable[dict[str, Any]], session_id: str = "", namespace: str | None = None
) -> checkpoint_pb2.DeleteCheckpointsRequest:
    request = checkpoint_pb2.DeleteCheckpointsRequest(
        session_id=session_id, metadata_filters=[struct(f) for f in metadata_filters]
    )
    if namespace is not None:
        request.namespace = namespace
    return request
