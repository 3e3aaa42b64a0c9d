"""SessionService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from stratad.api.v1 import session_pb2, session_pb2_grpc
from stratad.domain import events
from stratad.domain import structured as st
from stratad.domain.events import Lagged, QueueItem, SessionEvent
from stratad.errors import FailedPreconditionError, ResourceExhaustedError
from stratad.server.runner import CHEAP, IO
from stratad.server.servicers.base import Servicer, tenant_of
from stratad.server.servicers.convert import event_to_pb, session_to_pb
from stratad.server.servicers.structured import check_servable


class SessionServicer(Servicer, session_pb2_grpc.SessionServiceServicer):
    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.CreateSessionResponse:
        info = await self.calls.run(
            IO,
            self.engine.sessions.create,
            tenant_of(context),
            request.session_id,
            labels=dict(request.labels),
            keep_last=request.retention.keep_last,
            max_age_seconds=request.retention.max_age_seconds,
        )
        return session_pb2.CreateSessionResponse(session=session_to_pb(info))

    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.GetSessionResponse:
        info = await self.calls.run(
            IO, self.engine.sessions.info, tenant_of(context), request.session_id
        )
        return session_pb2.GetSessionResponse(session=session_to_pb(info))

    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.ListSessionsResponse:
        page, token = await self.calls.run(
            IO,
            self.engine.sessions.list,
            tenant_of(context),
            prefix=request.prefix,
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return session_pb2.ListSessionsResponse(
            sessions=[session_to_pb(s) for s in page], next_page_token=token
        )

    async def DeleteSession(
        self, request: session_pb2.DeleteSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.DeleteSessionResponse:
        await self.calls.run(
            IO,
            self.engine.sessions.delete,
            tenant_of(context),
            request.session_id,
            request.expected_version,
        )
        return session_pb2.DeleteSessionResponse()

    async def GetStructuredState(
        self, request: session_pb2.GetStructuredStateRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.GetStructuredStateResponse:
        applied = await self.calls.run(
            IO, st.current_json, self.engine.sessions, tenant_of(context), request.session_id
        )
        return session_pb2.GetStructuredStateResponse(
            structured_json=applied.result, version=applied.version
        )

    async def ReplaceStructuredState(
        self, request: session_pb2.ReplaceStructuredStateRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.ReplaceStructuredStateResponse:
        tenant = tenant_of(context)

        def replace() -> st.Applied[None]:
            structured = st.parse_whole(request.structured_json)
            check_servable(request.session_id, structured)
            return st.replace_whole(
                self.engine.sessions, tenant, request.session_id, structured,
                request.expected_version,
            )  # fmt: skip

        applied = await self.calls.run(IO, replace)
        return session_pb2.ReplaceStructuredStateResponse(version=applied.version)

    async def WatchSession(
        self, request: session_pb2.WatchSessionRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[session_pb2.WatchSessionResponse]:
        tenant = tenant_of(context)
        # Subscribed on the loop (events are queued through it), then the kept
        # events copied: no gap, and repeats are skipped (SessionWatch).
        watch = await self.calls.run(CHEAP, self.engine.sessions.watch, tenant, request.session_id)
        try:
            session_lock = self.calls.session_lock(tenant, request.session_id)
            history, current = await self.calls.run(CHEAP, watch.kept, waits_on=session_lock)
            last = request.from_version or current
            for replayed in _replay(history, request.from_version, current):
                last = replayed.version
                yield _response(request.session_id, replayed)
            while (event := await self._next(watch.subscription.queue)) is not None:
                if isinstance(event, Lagged):
                    raise watcher_lagged(request.session_id, last)
                if event.version <= last:
                    continue
                pending = await self.calls.run(
                    CHEAP, watch.between, last, event.version, waits_on=session_lock
                )
                for missed in pending or [event]:
                    last = missed.version
                    yield _response(request.session_id, missed)
        finally:
            watch.close()

    async def _next(self, queue: asyncio.Queue[QueueItem]) -> QueueItem:
        """The next event; None when the session is deleted or the daemon stops."""
        get = asyncio.ensure_future(queue.get())
        stop = asyncio.ensure_future(self.resources.stopping.wait())
        try:
            done, _ = await asyncio.wait({get, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Also when the watch itself is cancelled (the client left): a get
            # left pending on a dropped queue is garbage-collected while pending
            # ("Task was destroyed but it is pending!" in the daemon's log).
            for task in (get, stop):
                task.cancel()
        return get.result() if get in done else None


def watcher_lagged(session_id: str, last: int) -> ResourceExhaustedError:
    return ResourceExhaustedError(
        f"the watcher of session {session_id!r} fell {events.WATCH_QUEUE_EVENTS} events behind "
        f"(it is not reading its stream); watch again with from_version={last}",
        reason="WATCHER_TOO_SLOW",
        metadata={"resume_from_version": str(last), "queue_events": str(events.WATCH_QUEUE_EVENTS)},
    )


def _replay(history: list[SessionEvent], from_version: int, current: int) -> list[SessionEvent]:
    if not from_version or from_version >= current:
        return []
    if not history or history[0].version > from_version + 1:
        oldest = history[0].version if history else current
        raise FailedPreconditionError(
            f"events before version {oldest} are no longer kept; watch from {oldest - 1} or later"
        )
    return [e for e in history if e.version > from_version]


def _response(session_id: str, event: SessionEvent) -> session_pb2.WatchSessionResponse:
    return session_pb2.WatchSessionResponse(event=event_to_pb(session_id, event))
