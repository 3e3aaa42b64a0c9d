"""What the daemon owns for its lifetime and every servicer is built from.

Separate from `registry` (which lists the servicers) so that servicers can
name `Resources` without importing the module that imports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from stratad.config import Config
from stratad.domain.engine import Engine
from stratad.domain.quotas import Quotas
from stratad.server.limits import InflightBudget
from stratad.server.runner import Runner
from stratad.store.crypto import keyring_from_settings
from stratad.store.datadir import DataDir, open_data_dir
from stratad.store.remote import RemoteTier

#: Worker threads for blocking domain work. Native work releases the GIL and
#: journal fsyncs of concurrent writers overlap, so this is sized for I/O
#: concurrency rather than for the (two) cores.
WORKER_THREADS = 32


@dataclass(frozen=True, slots=True)
class Resources:
    """Everything a servicer is built from."""

    config: Config
    data_dir: DataDir
    #: The domain layer over the data directory.
    engine: Engine
    #: Where blocking domain work runs, off the event loop (through `runner`).
    executor: ThreadPoolExecutor
    #: How every call's domain work runs: on the event loop or on `executor`.
    runner: Runner
    #: Memory budget of the requests in flight (None: max_inflight_bytes = 0).
    budget: InflightBudget | None = None
    #: Set when shutdown begins. Long-lived streams (watches) should end when
    #: it is set, or graceful shutdown waits out the whole grace period.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def open_resources(config: Config) -> AsyncIterator[Resources]:
    """Open what the daemon owns for its lifetime, and release it on exit."""
    with open_data_dir(config.data_dir) as data_dir:
        keyring = (
            keyring_from_settings(
                config.encryption_key_file,
                config.encryption_old_key_files,
                dict(os.environ),
                data_dir.path,
            )
            if config.encryption == "on"
            else None
        )
        engine = Engine(
            data_dir.path,
            durability=config.durability,
            fsync_interval=config.fsync_interval_ms / 1000,
            max_state_bytes=config.max_message_bytes,
            quotas=Quotas(
                tenant_stored_bytes=config.max_tenant_stored_bytes,
                tenant_sessions=config.max_tenant_sessions,
                session_checkpoints=config.max_session_checkpoints,
            ),
            keyring=keyring,
        )
        if config.replication != "off":
            engine.replicate_to(
                RemoteTier.from_url(config.remote_url),
                mode=config.replication,
                node_id=config.node_id or default_node_id(),
                lag=config.replication_lag_ms / 1000,
                lease=config.replication_lease_ms / 1000,
                gc_grace=config.replication_gc_grace_seconds,
            )
        engine.open()  # recovery: replay journals, cut torn tails, restore objects
        executor = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="stratad-worker")
        budget = InflightBudget(config.max_inflight_bytes) if config.max_inflight_bytes else None
        try:
            yield Resources(
                config=config,
                data_dir=data_dir,
                engine=engine,
                executor=executor,
                runner=Runner(engine, executor),
                budget=budget,
            )
        finally:
            executor.shutdown(wait=True)
            engine.close()


def default_node_id() -> str:
    """The host name and PID: unique among the daemons sharing a bucket."""
    return f"{socket.gethostname()}-{os.getpid()}"
