"""AdminService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import grpc

from stratad.api.v1 import admin_pb2, admin_pb2_grpc
from stratad.domain.replication import Replicator
from stratad.errors import FailedPreconditionError
from stratad.ids import validate_id
from stratad.server.runner import IO
from stratad.server.servicers.base import Servicer, tenant_of
from stratad.server.servicers.convert import session_to_pb


class AdminServicer(Servicer, admin_pb2_grpc.AdminServiceServicer):
    async def Verify(
        self, request: admin_pb2.VerifyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.VerifyResponse:
        report = await self.calls.run(IO, self.engine.admin.verify, tenant_of(context))
        return admin_pb2.VerifyResponse(
            objects_checked=report.objects_checked,
            corrupt_objects=[
                admin_pb2.CorruptObject(digest=c.digest, problem=c.problem, session_ids=c.sessions)
                for c in report.corrupt
            ],
            damaged_sessions=report.damaged_sessions,
            ok=report.ok,
            remote_objects_checked=report.remote_objects_checked,
            remote_corrupt_objects=[
                admin_pb2.CorruptObject(digest=c.digest, problem=c.problem)
                for c in report.remote_corrupt
            ],
            remote_damaged_sessions=report.remote_damaged_sessions,
            remote_damaged_library_segments=report.remote_damaged_library,
        )

    async def CollectGarbage(
        self, request: admin_pb2.CollectGarbageRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CollectGarbageResponse:
        report = await self.calls.run(IO, self.engine.admin.collect_garbage, tenant_of(context))
        return admin_pb2.CollectGarbageResponse(
            objects_removed=report.objects_removed,
            bytes_freed=report.bytes_freed,
            objects_kept=report.objects_kept,
            seconds=report.seconds,
            remote_packs_deleted=report.remote_packs_deleted,
            remote_bytes_freed=report.remote_bytes_freed,
            remote_packs_condemned=report.remote_packs_condemned,
        )

    async def GetStoreStats(
        self, request: admin_pb2.GetStoreStatsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GetStoreStatsResponse:
        s = await self.calls.run(IO, self.engine.admin.stats, tenant_of(context))
        return admin_pb2.GetStoreStatsResponse(
            sessions=s.sessions,
            checkpoints=s.checkpoints,
            objects=s.objects,
            logical_bytes=s.logical_bytes,
            unique_bytes=s.unique_bytes,
            stored_bytes=s.stored_bytes,
            dedup_ratio=s.dedup_ratio,
            compression_ratio=s.compression_ratio,
        )

    async def GetReplicationStatus(
        self, request: admin_pb2.GetReplicationStatusRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GetReplicationStatusResponse:
        status = await self.calls.run(IO, self._replicator().status)
        return admin_pb2.GetReplicationStatusResponse(**status)

    async def RestoreSessionFromRemote(
        self, request: admin_pb2.RestoreSessionFromRemoteRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.RestoreSessionFromRemoteResponse:
        tenant = tenant_of(context)
        replicator = self._replicator()
        await self.calls.run(
            IO, replicator.restore, tenant, validate_id(request.session_id, "session_id")
        )
        info = await self.calls.run(IO, self.engine.sessions.info, tenant, request.session_id)
        return admin_pb2.RestoreSessionFromRemoteResponse(session=session_to_pb(info))

    def _replicator(self) -> Replicator:
        if self.engine.replicator is None:
            raise FailedPreconditionError(
                "replication is off on this daemon (set replication and remote_url)",
                reason="REPLICATION_OFF",
            )
        return self.engine.replicator
