"""Crash tests: a ``stratad serve`` subprocess killed with SIGKILL under load.

Eight writer threads save checkpoints concurrently (six sessions of their own,
two threads sharing a seventh; small states sent whole, growing states above
16 KiB sent as chunked uploads or chunked by the daemon; some with checkpoint
IDs the client picks). Each writer records every save whose response it
received (*acknowledged*) and the one it was waiting for when the daemon died
(*in flight*). The daemon is killed at a random moment, restarted on the same
data directory, and then:

- every acknowledged checkpoint loads with identical bytes and digest;
- each writer's in-flight save is either fully there (loads identical) or
  absent (NOT_FOUND); no other checkpoint exists;
- checkpoint versions run 2..version with no gap, and the latest state is the
  newest checkpoint;
- Verify reports ok, and every session accepts a new save.

docs/storage.md promises this in every durability mode: a SIGKILL leaves the
kernel's page cache, and so every acknowledged write, intact.

The random choices (kill moment, state sizes and contents) come from
``random.Random`` seeded from ``CRASH_SEED`` (random unless set in the
environment); every test prints its seed, so a failure can be replayed with
``CRASH_SEED=<base seed> pytest tests/e2e/test_crash.py -k <test id>``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest

import stratad
from stratad import native
from stratad.errors import NotFoundError

BASE_SEED = int(os.environ.get("CRASH_SEED") or random.SystemRandom().randrange(1 << 32))
ROUNDS = 5
SLOW_ROUNDS = 50
#: The kill comes this many seconds (uniformly drawn) after every writer has
#: had at least one save acknowledged.
KILL_DELAY_RANGE = (0.2, 1.5)
#: Bounds on waits that normally take milliseconds (a shared, noisy machine).
FIRST_SAVES_TIMEOUT = 60.0
WRITER_EXIT_TIMEOUT = 60.0
#: The SDK sends states at least this large as chunked uploads.
CHUNKED_UPLOAD_MIN_BYTES = 16 << 10


class Daemon(Protocol):
    """What these tests use of the e2e conftest's ``Daemon``."""

    target: str
    data_dir: Path

    def signal(self, signum: int) -> None: ...
    def wait(self, timeout: float) -> int: ...
    def stop(self, timeout: float = 30.0) -> int: ...
    def kill(self) -> None: ...
    def output(self) -> str: ...


#: The vocabulary of the reference workload (docs/design.md).
WORKLOAD_TEXT = (
    "the agent decided to call the search tool because the user asked about quarterly "
    "revenue figures and then it summarized results into a table with notes about errors "
    "retries and timeouts"
)
WORDS = WORKLOAD_TEXT.split()


@dataclass(frozen=True)
class WriterSpec:
    """What one writer thread saves, and how."""

    name: str
    session_id: str
    #: Growing conversation states above 16 KiB instead of small random ones.
    growing: bool
    #: The client picks each checkpoint ID (``<name>-<seq>``).
    client_ids: bool
    #: The SDK uploads large states as chunks (False: whole, chunked by the daemon).
    chunked_uploads: bool = True


WRITERS = (
    WriterSpec("small-a", "crash-small-a", growing=False, client_ids=False),
    WriterSpec("small-b", "crash-small-b", growing=False, client_ids=True),
    WriterSpec("small-c", "crash-small-c", growing=False, client_ids=False),
    WriterSpec("grow-a", "crash-grow-a", growing=True, client_ids=False),
    WriterSpec("grow-b", "crash-grow-b", growing=True, client_ids=True),
    WriterSpec(
        "grow-whole", "crash-grow-whole", growing=True, client_ids=False, chunked_uploads=False
    ),
    # Two threads sharing one session.
    WriterSpec("shared-grow", "crash-shared", growing=True, client_ids=True),
    WriterSpec("shared-small", "crash-shared", growing=False, client_ids=False),
)


@dataclass(frozen=True)
class Save:
    """One SaveState as the writer knows it."""

    seq: int
    #: The ID the client asked for, or (once acknowledged) the daemon's answer;
    #: "" for an unacknowledged save whose ID the daemon would have picked.
    checkpoint_id: str
    data: bytes
    digest: str
    #: The session version the acknowledgement reported (0 if unacknowledged).
    version: int = 0


@dataclass
class WriterLog:
    spec: WriterSpec
    acknowledged: list[Save] = field(default_factory=list)
    in_flight: Save | None = None
    error: BaseException | None = None
    error_before_kill: bool = False
    #: Set when the writer's first save is answered (acknowledged or failed).
    first_answer: threading.Event = field(default_factory=threading.Event)


def small_states(rng: random.Random) -> Iterator[bytes]:
    """Unrelated small states: random bytes, text, and now and then an empty one."""
    for step in range(1_000_000):
        if step % 17 == 5:
            yield b""
        elif step % 2:
            yield rng.randbytes(rng.randint(1, 4096))
        else:
            words = [rng.choice(WORDS) for _ in range(rng.randint(1, 400))]
            yield json.dumps({"step": step, "note": " ".join(words)}).encode()


def growing_states(rng: random.Random, writer: str) -> Iterator[bytes]:
    """The growing conversation of docs/design.md, from above 16 KiB up."""
    messages: list[dict[str, str]] = []

    def message() -> dict[str, str]:
        role = "user" if len(messages) % 2 == 0 else "assistant"
        return {"role": role, "content": " ".join(rng.choice(WORDS) for _ in range(80))}

    while len(json.dumps(messages)) < CHUNKED_UPLOAD_MIN_BYTES + 4096:
        messages.append(message())
    for step in range(1_000_000):
        state = {"messages": messages, "step": step, "scratch": {"tool": "search", "n": step}}
        yield json.dumps({"writer": writer, **state}, separators=(",", ":")).encode()
        for _ in range(rng.randint(1, 3)):
            messages.append(message())


def run_writer(
    log: WriterLog, target: str, seed: int, killed: threading.Event, stop: threading.Event
) -> None:
    """Save until a save fails (the daemon died) or `stop` is set."""
    spec = log.spec
    rng = random.Random(f"{seed}:{spec.name}")
    states = growing_states(rng, spec.name) if spec.growing else small_states(rng)
    # Once the daemon is dead a call fails at once (after the SDK's few
    # UNAVAILABLE retries); the timeout only bounds a call that hangs.
    with stratad.Client(target, timeout=30.0, chunked_uploads=spec.chunked_uploads) as client:
        for seq, data in enumerate(states):
            if stop.is_set():
                return
            requested_id = f"{spec.name}-{seq}" if spec.client_ids else ""
            log.in_flight = Save(seq, requested_id, data, native.digest_hex(data))
            try:
                response = client.save_state(
                    spec.session_id,
                    data,
                    checkpoint_id=requested_id,
                    metadata={"writer": spec.name, "seq": str(seq)},
                )
            except Exception as exc:  # recorded here, judged by the test
                log.error = exc
                log.error_before_kill = not killed.is_set()
                log.first_answer.set()
                return
            log.acknowledged.append(
                Save(seq, response.checkpoint_id, data, response.digest, response.version)
            )
            log.in_flight = None
            log.first_answer.set()


@dataclass
class CrashRound:
    seed: int
    durability: str
    #: Seconds from "every writer has a save acknowledged" to the SIGKILL.
    kill_delay: float
    logs: list[WriterLog] = field(default_factory=list)

    def describe(self) -> str:
        return (
            f"CRASH_SEED={BASE_SEED} round seed={self.seed} durability={self.durability} "
            f"kill after {self.kill_delay:.3f}s"
        )


def run_until_killed(daemon: Daemon, crash: CrashRound) -> None:
    """Create the sessions, start the writers, SIGKILL the daemon, collect the logs."""
    with stratad.Client(daemon.target) as client:
        for session_id in dict.fromkeys(spec.session_id for spec in WRITERS):
            client.create_session(session_id)
    crash.logs = [WriterLog(spec) for spec in WRITERS]
    killed, stop = threading.Event(), threading.Event()
    threads = [
        threading.Thread(
            target=run_writer,
            args=(log, daemon.target, crash.seed, killed, stop),
            name=f"writer-{log.spec.name}",
            daemon=True,
        )
        for log in crash.logs
    ]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + FIRST_SAVES_TIMEOUT
        for log in crash.logs:
            if not log.first_answer.wait(max(0.0, deadline - time.monotonic())):
                pytest.fail(
                    f"writer {log.spec.name} had no save answered within "
                    f"{FIRST_SAVES_TIMEOUT}s; {crash.describe()}"
                )
            if log.error is not None:
                pytest.fail(f"writer {log.spec.name} failed: {log.error!r}; {crash.describe()}")
        time.sleep(crash.kill_delay)  # the random moment of the crash, not a synchronisation
        killed.set()
        daemon.signal(signal.SIGKILL)
        daemon.wait(timeout=30)
    finally:
        stop.set()
        daemon.kill()
        for thread in threads:
            thread.join(WRITER_EXIT_TIMEOUT)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"writers still running after the kill: {stuck}; {crash.describe()}"
    early = [(log.spec.name, log.error) for log in crash.logs if log.error_before_kill]
    assert not early, f"saves failed before the kill: {early}; {crash.describe()}"
    print(
        "saves acknowledged:",
        {log.spec.name: len(log.acknowledged) for log in crash.logs},
        "in flight:",
        {log.spec.name: log.in_flight.seq for log in crash.logs if log.in_flight},
    )


def check_recovered(client: stratad.Client, crash: CrashRound) -> None:
    """Everything acknowledged is there, byte for byte; nothing half-written is."""
    context = crash.describe()
    in_flight_present: list[str] = []
    by_session: dict[str, list[WriterLog]] = {}
    for log in crash.logs:
        by_session.setdefault(log.spec.session_id, []).append(log)
    for session_id, logs in by_session.items():
        acknowledged = {s.checkpoint_id: s for log in logs for s in log.acknowledged}
        for checkpoint_id, acked in acknowledged.items():
            loaded = client.load_state(session_id, checkpoint_id=checkpoint_id)
            assert (loaded.checkpoint_id, loaded.digest) == (checkpoint_id, acked.digest), context
            assert loaded.data == acked.data, f"{checkpoint_id}: bytes differ; {context}"
            assert loaded.checkpoint.version == acked.version, context

        listed = list(client.list_checkpoints(session_id))
        for cp in listed:
            if cp.checkpoint_id in acknowledged:
                continue
            # Not acknowledged: it must be the in-flight save of one of this
            # session's writers, complete.
            writer, seq = str(cp.metadata["writer"]), int(str(cp.metadata["seq"]))
            in_flight = {log.spec.name: log.in_flight for log in logs if log.in_flight}
            save: Save | None = in_flight.get(writer)
            assert save is not None and save.seq == seq, (
                f"{session_id}: unexpected checkpoint {cp.checkpoint_id} ({writer} #{seq}); "
                f"in flight: { {w: s.seq for w, s in in_flight.items()} }; {context}"
            )
            assert not save.checkpoint_id or save.checkpoint_id == cp.checkpoint_id, context
            loaded = client.load_state(session_id, checkpoint_id=cp.checkpoint_id)
            assert (loaded.digest, loaded.data) == (save.digest, save.data), (
                f"in-flight save {cp.checkpoint_id} is visible but not identical; {context}"
            )
            in_flight_present.append(writer)
        for log in logs:
            if log.in_flight is None or not log.in_flight.checkpoint_id:
                continue
            try:
                loaded = client.load_state(session_id, checkpoint_id=log.in_flight.checkpoint_id)
            except NotFoundError:
                continue  # absent: fine
            assert loaded.data == log.in_flight.data, context

        session = client.get_session(session_id)
        versions = sorted(cp.version for cp in listed)
        assert versions == list(range(2, session.version + 1)), (
            f"{session_id}: checkpoint versions {versions[:3]}..{versions[-3:]} do not run "
            f"2..{session.version}; {context}"
        )
        assert session.checkpoint_count == len(listed), context
        latest = client.load_state(session_id)
        newest = max(listed, key=lambda cp: cp.version)
        assert (latest.checkpoint_id, latest.version) == (newest.checkpoint_id, session.version)

    print("in-flight saves found complete after the restart:", in_flight_present or "none")
    verify = client.verify()
    assert verify.ok, f"Verify after the crash: {verify}; {context}"
    assert not verify.corrupt_objects and not verify.damaged_sessions, context

    # The recovered journals accept appends, and what is appended reads back.
    for session_id in by_session:
        data = f"after the crash: {session_id}".encode() * 1000
        saved = client.save_state(session_id, data)
        assert client.load_state(session_id).data == data
        assert client.load_state(session_id, checkpoint_id=saved.checkpoint_id).data == data


def crash_and_recover(start_daemon: Callable[..., Daemon], seed: int, durability: str) -> None:
    crash = CrashRound(seed, durability, random.Random(seed).uniform(*KILL_DELAY_RANGE))
    print(crash.describe())
    first = start_daemon("--durability", durability)
    run_until_killed(first, crash)
    second = start_daemon("--durability", durability, data_dir=first.data_dir)
    with stratad.Client(second.target) as client:
        check_recovered(client, crash)
    assert second.stop() == 0, second.output()


@pytest.mark.parametrize("round_index", range(ROUNDS))
def test_sigkill_under_load_loses_no_acknowledged_save(
    start_daemon: Callable[..., Daemon], round_index: int
) -> None:
    crash_and_recover(start_daemon, BASE_SEED + round_index, "fsync")


@pytest.mark.parametrize("durability", ["interval", "none"])
def test_sigkill_loses_nothing_acknowledged_in_any_durability_mode(
    start_daemon: Callable[..., Daemon], durability: str
) -> None:
    # Only a machine crash may lose writes in these modes, never a daemon crash.
    offset = {"interval": 1000, "none": 2000}[durability]
    crash_and_recover(start_daemon, BASE_SEED + offset, durability)


#: Encryption at rest on (docs/security.md): a fixed test master key.
ENCRYPTED = {"STRATAD_ENCRYPTION": "on", "STRATAD_ENCRYPTION_KEY": "5e" * 32}


@pytest.mark.parametrize("durability", ["fsync", "none"])
def test_sigkill_with_encryption_at_rest_loses_no_acknowledged_save(
    start_daemon: Callable[..., Daemon], durability: str
) -> None:
    # Sealed records and objects: torn tails are still cut, nothing acknowledged is lost.
    offset = {"fsync": 3000, "none": 4000}[durability]

    def start_encrypted(*args: str, **options: object) -> Daemon:
        return start_daemon(*args, env=ENCRYPTED, **options)

    crash_and_recover(start_encrypted, BASE_SEED + offset, durability)


@pytest.mark.slow
@pytest.mark.parametrize("round_index", range(SLOW_ROUNDS))
def test_sigkill_soak(start_daemon: Callable[..., Daemon], round_index: int) -> None:
    crash_and_recover(start_daemon, BASE_SEED + 10_000 + round_index, "fsync")
