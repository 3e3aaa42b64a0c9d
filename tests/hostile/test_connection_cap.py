"""Case 7: idle connections must not use up the daemon's file descriptors.

The daemon runs with RLIMIT_NOFILE `NOFILE`; `IDLE` connections (more than
that) are opened to the listener and send nothing. The daemon must refuse
connections beyond a cap of its own rather than run out of descriptors: a
well-behaved client, connected before, still creates sessions (each opens a
journal) and saves 256 KiB states (stored as objects, which the background
syncer writes) without INTERNAL (EMFILE), nothing is logged at ERROR (no
"background sync failed"), and the daemon's descriptors never reach the
limit.
"""

from __future__ import annotations

import os
import time
from typing import Any

import grpc
from h2attack import close_all, open_idle
from harness import GoodClient, Sampler, Verdict, raised_nofile

from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc, session_pb2, session_pb2_grpc

NOFILE = 1024
IDLE = 1150
NEW_SESSIONS = 20
STATE_BYTES = 256 << 10


def test_idle_connections_do_not_exhaust_descriptors(hostile_daemon: Any, listener: str) -> None:
    with raised_nofile(IDLE + 512):
        daemon = hostile_daemon(listener, nofile=NOFILE)
        verdict = Verdict(f"7 {IDLE} idle connections, RLIMIT_NOFILE {NOFILE} [{listener}]", daemon)
        channel = daemon.endpoint.channel()
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="before"), timeout=5)
        with Sampler(daemon) as sampler:
            good = GoodClient(daemon.endpoint).start()
            idle = open_idle(daemon.endpoint, IDLE, seconds=3.0)
            time.sleep(1.0)  # the daemon accepts what it will
            fds_now = daemon.fds()[0]
            failures = []
            for n in range(NEW_SESSIONS):
                # States large enough to be stored as objects: the background
                # syncer must open files to write them.
                data = os.urandom(STATE_BYTES)
                try:
                    save = checkpoint_pb2.SaveStateRequest(session_id="before", data=data)
                    checkpoints.SaveState(save, timeout=5)
                    session_id = f"during-{n}"
                    request = session_pb2.CreateSessionRequest(session_id=session_id)
                    sessions.CreateSession(request, timeout=5)
                    save = checkpoint_pb2.SaveStateRequest(session_id=session_id, data=data)
                    checkpoints.SaveState(save, timeout=5)
                except grpc.RpcError as exc:
                    failures.append(f"{exc.code().name} {exc.details()!r}")
            time.sleep(1.5)  # the background syncer runs every 100 ms
            report = good.stop()
            close_all(idle)
        channel.close()
        verdict.note(f"{len(idle)} of {IDLE} idle connections established; daemon fds {fds_now}")
        verdict.check(
            f"{NEW_SESSIONS} x (SaveState, CreateSession, SaveState) during the flood succeed",
            not failures,
            f"{len(failures)} failed, first: {failures[:1]}",
        )
        verdict.check(
            f"the daemon's descriptors stayed below RLIMIT_NOFILE ({NOFILE})",
            sampler.peak_fds < NOFILE,
            f"peak {sampler.peak_fds}",
        )
        logged = daemon.output()
        verdict.check(
            "no 'background sync failed' logged",
            "background sync failed" not in logged,
            f"{logged.count('background sync failed')} times",
        )
        verdict.good_client(report)
        verdict.rss(sampler)
        verdict.finish(clean_log=True)
