"""CheckpointService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc, common_pb2
from stratad.domain.checkpoints import ChunkUpload, SaveInput
from stratad.domain.models import Checkpoint, SessionStatus
from stratad.domain.writes import PruneStrategy, PutWritesResult, WriteInput, pending_writes
from stratad.errors import InvalidArgumentError, StratadError
from stratad.server.runner import IO, SAVE_BYTES, WRITE_BYTES, bounded
from stratad.server.servicers.base import Servicer, answer_admission, tenant_of
from stratad.server.servicers.convert import (
    checkpoint_to_pb,
    load_to_pb,
    save_to_pb,
    session_to_pb,
    struct_to_dict,
)

#: Most requests of one SaveStates stream saved in one batch.
MAX_BATCH = 64
#: A loaded state is in memory about this many times while its answer is built:
#: the bytes read, the response message's copy, the encoded answer. LoadState
#: holds that much of the answer budget from before the read until it hands
#: the answer over (docs/limits.md).
ANSWER_COPIES = 3


async def _pump(
    requests: AsyncIterator[checkpoint_pb2.SaveStatesRequest],
    inbox: asyncio.Queue[checkpoint_pb2.SaveStatesRequest | None],
) -> None:
    try:
        async for request in requests:
            await inbox.put(request)
    finally:
        await inbox.put(None)  # end of the stream (or of a failed one)


async def _next_batch(
    inbox: asyncio.Queue[checkpoint_pb2.SaveStatesRequest | None],
) -> list[checkpoint_pb2.SaveStatesRequest]:
    """The next request (waiting for it) plus those already queued; [] at the end."""
    first = await inbox.get()
    if first is None:
        return []
    batch = [first]
    while len(batch) < MAX_BATCH and not inbox.empty():
        item = inbox.get_nowait()
        if item is None:
            inbox.put_nowait(None)  # seen again by the next call, which ends the loop
            break
        batch.append(item)
    return batch


def _item_error(code: grpc.StatusCode, message: str) -> checkpoint_pb2.SaveStatesResponse:
    return checkpoint_pb2.SaveStatesResponse(
        error=common_pb2.ItemError(code=code.value[0], message=message)
    )


def _writes_to_pb(result: PutWritesResult) -> checkpoint_pb2.PutWritesResponse:
    return checkpoint_pb2.PutWritesResponse(version=result.version, stored=result.stored)


def save_input(request: checkpoint_pb2.SaveStateRequest) -> SaveInput:
    upload = None
    if request.HasField("chunked"):
        c = request.chunked
        upload = ChunkUpload(
            size=c.size,
            digest=c.digest,
            chunks=[(ref.digest, ref.length) for ref in c.chunks],
            frames=list(c.frames),
            base_checkpoint_id=c.base_checkpoint_id,
            keep=c.keep,
        )
    return SaveInput(
        data=None if upload is not None else request.data,
        upload=upload,
        content_type=request.content_type,
        metadata=struct_to_dict(request.metadata),
        expected_version=request.expected_version,
        checkpoint_id=request.checkpoint_id,
        parent_checkpoint_id=request.parent_checkpoint_id,
        namespace=request.namespace,
        no_parent=request.no_parent,
    )


class CheckpointServicer(Servicer, checkpoint_pb2_grpc.CheckpointServiceServicer):
    async def SaveState(
        self, request: checkpoint_pb2.SaveStateRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.SaveStateResponse:
        return await self._save(tenant_of(context), request, context)

    async def _save(
        self,
        tenant: str,
        request: checkpoint_pb2.SaveStateRequest,
        context: grpc.aio.ServicerContext | None = None,
    ) -> checkpoint_pb2.SaveStateResponse:
        """Save one state; answer `context` (if given) as soon as the save is durable."""
        checkpoints = self.engine.checkpoints
        return await self.calls.mutate_and_answer(
            bounded(SAVE_BYTES, checkpoints.save_work),
            context,
            save_to_pb,
            checkpoints.save_state,
            tenant,
            request.session_id,
            save_input(request),
        )

    async def LoadState(
        self, request: checkpoint_pb2.LoadStateRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.LoadStateResponse:
        admit = answer_admission(context)
        result = await self.calls.run(
            IO,
            self.engine.checkpoints.load_state,
            tenant_of(context),
            request.session_id,
            request.checkpoint_id,
            request.namespace,
            include_structured=request.include_structured,
            before_read=lambda size: admit(ANSWER_COPIES * size),
        )
        response = load_to_pb(result)
        _add_writes(response.checkpoint, result.checkpoint, request.include_writes)
        return response

    async def PauseExecution(
        self, request: checkpoint_pb2.PauseExecutionRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.PauseExecutionResponse:
        tenant = tenant_of(context)
        response = checkpoint_pb2.PauseExecutionResponse()
        expected = request.expected_version
        if request.HasField("state"):
            state = request.state
            state.session_id = request.session_id
            state.expected_version = state.expected_version or expected
            response.saved.CopyFrom(await self._save(tenant, state))
            expected = 0  # checked by the save, which bumped the version
        info = await self.calls.run(
            IO,
            self.engine.checkpoints.set_status,
            tenant,
            request.session_id,
            SessionStatus.PAUSED,
            expected_version=expected,
        )
        response.session.CopyFrom(session_to_pb(info))
        return response

    async def ResumeExecution(
        self, request: checkpoint_pb2.ResumeExecutionRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.ResumeExecutionResponse:
        tenant = tenant_of(context)
        info = await self.calls.run(
            IO,
            self.engine.checkpoints.set_status,
            tenant,
            request.session_id,
            SessionStatus.ACTIVE,
            expected_version=request.expected_version,
            allowed_from=(SessionStatus.PAUSED,),
        )
        response = checkpoint_pb2.ResumeExecutionResponse(session=session_to_pb(info))
        if info.head:
            loaded = await self.calls.run(
                IO, self.engine.checkpoints.load_state, tenant, request.session_id, info.head
            )
            response.state.CopyFrom(load_to_pb(loaded))
        return response

    async def CreateCheckpoint(
        self, request: checkpoint_pb2.CreateCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.CreateCheckpointResponse:
        result = await self.calls.run(
            IO,
            self.engine.checkpoints.create_checkpoint,
            tenant_of(context),
            request.session_id,
            name=request.name,
            metadata=struct_to_dict(request.metadata),
            checkpoint_id=request.checkpoint_id,
            expected_version=request.expected_version,
        )
        return checkpoint_pb2.CreateCheckpointResponse(checkpoint=checkpoint_to_pb(result))

    async def RestoreCheckpoint(
        self, request: checkpoint_pb2.RestoreCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.RestoreCheckpointResponse:
        result = await self.calls.run(
            IO,
            self.engine.checkpoints.restore_checkpoint,
            tenant_of(context),
            request.checkpoint_id,
            make_current=request.make_current,
            expected_version=request.expected_version,
        )
        return checkpoint_pb2.RestoreCheckpointResponse(state=load_to_pb(result))

    async def ListCheckpoints(
        self, request: checkpoint_pb2.ListCheckpointsRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.ListCheckpointsResponse:
        page, token = await self.calls.run(
            IO,
            self.engine.checkpoints.list_checkpoints,
            tenant_of(context),
            request.session_id,
            namespace=request.namespace if request.HasField("namespace") else None,
            metadata=struct_to_dict(request.metadata_filter, "metadata_filter"),
            before=request.before,
            page_size=request.page_size,
            page_token=request.page_token,
        )
        response = checkpoint_pb2.ListCheckpointsResponse(
            checkpoints=[checkpoint_to_pb(c) for c in page], next_page_token=token
        )
        for out, cp in zip(response.checkpoints, page, strict=True):
            _add_writes(out, cp, request.include_writes)
        return response

    async def DeleteCheckpoint(
        self, request: checkpoint_pb2.DeleteCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.DeleteCheckpointResponse:
        await self.calls.run(
            IO,
            self.engine.checkpoints.delete_checkpoint,
            tenant_of(context),
            request.checkpoint_id,
            request.expected_version,
        )
        return checkpoint_pb2.DeleteCheckpointResponse()

    async def ForkSession(
        self, request: checkpoint_pb2.ForkSessionRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.ForkSessionResponse:
        info = await self.calls.run(
            IO,
            self.engine.checkpoints.fork_session,
            tenant_of(context),
            request.checkpoint_id,
            new_session_id=request.new_session_id,
            labels=dict(request.labels),
        )
        return checkpoint_pb2.ForkSessionResponse(session=session_to_pb(info))

    async def SaveStates(
        self,
        request_iterator: AsyncIterator[checkpoint_pb2.SaveStatesRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[checkpoint_pb2.SaveStatesResponse]:
        """Save whatever requests have arrived as one batch: in order, sharing fsyncs.

        A client that keeps several saves in flight gets them group-committed
        (one fsync per session per batch) instead of one fsync each.
        """
        tenant = tenant_of(context)
        inbox: asyncio.Queue[checkpoint_pb2.SaveStatesRequest | None] = asyncio.Queue(MAX_BATCH * 2)
        pump = asyncio.ensure_future(_pump(request_iterator, inbox))
        try:
            while batch := await _next_batch(inbox):
                for response in await self._save_batch(tenant, batch):
                    yield response
            await pump  # surface a failure of the request stream
        finally:
            pump.cancel()

    async def _save_batch(
        self, tenant: str, batch: list[checkpoint_pb2.SaveStatesRequest]
    ) -> list[checkpoint_pb2.SaveStatesResponse]:
        # An item the servicer already refuses (e.g. NaN in its metadata) fails
        # alone, like an item the domain refuses: the stream goes on.
        outcomes: list[StratadError | None] = []
        items = []
        for item in batch:
            try:
                items.append((item.request.session_id, save_input(item.request)))
            except StratadError as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
        checkpoints = self.engine.checkpoints
        try:
            results = iter(
                await self.calls.mutate(
                    bounded(SAVE_BYTES, checkpoints.save_many_work),
                    checkpoints.save_many,
                    tenant,
                    items,
                )
            )
        except StratadError as exc:  # the batch's commit failed (e.g. disk full)
            return [_item_error(grpc.StatusCode[exc.grpc_status], exc.message)] * len(batch)
        responses = []
        for refused in outcomes:
            r = refused if refused is not None else next(results)
            responses.append(
                _item_error(grpc.StatusCode[r.grpc_status], r.message)
                if isinstance(r, StratadError)
                else checkpoint_pb2.SaveStatesResponse(response=save_to_pb(r))
            )
        return responses

    async def FindMissingChunks(
        self, request: checkpoint_pb2.FindMissingChunksRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.FindMissingChunksResponse:
        missing = await self.calls.run(
            IO, self.engine.checkpoints.find_missing, tenant_of(context), list(request.digests)
        )
        return checkpoint_pb2.FindMissingChunksResponse(missing=missing)

    # -- pending writes, copy, prune, delete by metadata (domain/writes.py) ----------

    async def PutWrites(
        self, request: checkpoint_pb2.PutWritesRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.PutWritesResponse:
        writes = [WriteInput(w.idx, w.channel, w.type, w.value) for w in request.writes]
        return await self.calls.mutate_and_answer(
            bounded(WRITE_BYTES, sum(len(w.value) for w in writes)),
            context,
            _writes_to_pb,
            self.engine.checkpoint_extras.put_writes,
            tenant_of(context),
            request.session_id,
            request.checkpoint_id,
            request.task_id,
            writes,
            task_path=request.task_path,
            expected_version=request.expected_version,
        )

    async def CopySession(
        self, request: checkpoint_pb2.CopySessionRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.CopySessionResponse:
        result = await self.calls.run(
            IO,
            self.engine.checkpoint_extras.copy_session,
            tenant_of(context),
            request.source_session_id,
            target_session_id=request.target_session_id,
            labels=dict(request.labels),
            checkpoint_ids=dict(request.checkpoint_ids),
        )
        return checkpoint_pb2.CopySessionResponse(
            session=session_to_pb(result.session), checkpoint_ids=result.checkpoint_ids
        )

    async def PruneCheckpoints(
        self, request: checkpoint_pb2.PruneCheckpointsRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.PruneCheckpointsResponse:
        strategy = _PRUNE_STRATEGIES.get(request.strategy)
        if strategy is None:
            raise InvalidArgumentError("strategy must be KEEP_LATEST or DELETE")
        result = await self.calls.run(
            IO,
            self.engine.checkpoint_extras.prune,
            tenant_of(context),
            list(request.session_ids),
            strategy,
        )
        return checkpoint_pb2.PruneCheckpointsResponse(
            checkpoints_deleted=result.deleted, missing_session_ids=result.missing
        )

    async def DeleteCheckpoints(
        self, request: checkpoint_pb2.DeleteCheckpointsRequest, context: grpc.aio.ServicerContext
    ) -> checkpoint_pb2.DeleteCheckpointsResponse:
        result = await self.calls.run(
            IO,
            self.engine.checkpoint_extras.delete_matching,
            tenant_of(context),
            [struct_to_dict(f, "metadata_filters") for f in request.metadata_filters],
            session_id=request.session_id,
            namespace=request.namespace if request.HasField("namespace") else None,
        )
        return checkpoint_pb2.DeleteCheckpointsResponse(
            checkpoints_deleted=result.deleted, session_ids=result.session_ids
        )


_PRUNE_STRATEGIES = {
    checkpoint_pb2.PRUNE_STRATEGY_KEEP_LATEST: PruneStrategy.KEEP_LATEST,
    checkpoint_pb2.PRUNE_STRATEGY_DELETE: PruneStrategy.DELETE,
}


def _add_writes(out: checkpoint_pb2.Checkpoint, cp: Checkpoint, include: bool) -> None:
    """Pending writes of a checkpoint: always their count, the writes when asked."""
    out.pending_write_count = len(cp.writes)
    if include:
        out.pending_writes.extend(
            checkpoint_pb2.PendingWrite(
                task_id=w.task_id, task_path=w.task_path, idx=w.idx,
                channel=w.channel, type=w.type, value=w.value,
            )
            for w in pending_writes(cp)
        )  # fmt: skip
