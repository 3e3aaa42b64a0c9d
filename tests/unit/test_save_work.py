"""Checkpoints.save_work: what decides whether a save may run on the event loop.

A chunked upload is judged by what it declares; its digest check hashes the
whole state unless it resumes where one of the session's last uploads left off.
So the next step of a large growing state is cheap (its new bytes), while an
upload that cannot resume, or declares a huge state, is judged by its size.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratad.api.v1 import checkpoint_pb2
from stratad.domain import checkpoints as domain
from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.sdk.upload import Uploader
from stratad.server.runner import INLINE_BUDGETS, SAVE_BYTES
from stratad.server.servicers.checkpoint import save_input

STEP = 2_000
INLINE_SAVE_BYTES = INLINE_BUDGETS[SAVE_BYTES].limit


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path / "data")
    engine.open()
    engine.sessions.create("default", "s")
    yield engine
    engine.close()


def growing(steps: int, base: int = 1 << 20) -> list[bytes]:
    rng = random.Random(3)
    text = bytes(rng.choice(b"abcdefgh {}:,") for _ in range(base + steps * STEP))
    return [text[: base + i * STEP] for i in range(steps)]


def upload(uploader: Uploader, data: bytes) -> tuple[SaveInput, object]:
    plan = uploader.plan(checkpoint_pb2.SaveStateRequest(session_id="s"), data)
    assert plan is not None
    return save_input(plan.request), plan


def save(engine: Engine, uploader: Uploader, data: bytes) -> int:
    """Save `data` as the SDK would; return the work it was judged to be."""
    inp, plan = upload(uploader, data)
    work = engine.checkpoints.save_work("default", "s", inp)
    result = engine.checkpoints.save_state("default", "s", inp)
    uploader.saved(plan, result.checkpoint.checkpoint_id)  # type: ignore[arg-type]
    return work


def test_a_growing_state_costs_its_new_bytes_after_the_first_save(engine: Engine) -> None:
    uploader = Uploader()
    first, *rest = (save(engine, uploader, s) for s in growing(6))
    assert first >= 1 << 20  # nothing to resume from: the whole state is hashed
    assert all(work <= INLINE_SAVE_BYTES for work in rest), rest
    assert max(rest) < 4 * 32 << 10  # the kept tail chunks and the new ones


def test_an_upload_that_cannot_resume_is_judged_by_its_size(engine: Engine) -> None:
    states = growing(3)
    uploader = Uploader()
    save(engine, uploader, states[0])
    inp, _ = upload(uploader, states[1])
    assert inp.upload is not None and inp.upload.keep > 0
    # The daemon lost its resume points (a restart, another daemon): full size.
    engine.sessions.live("default", "s").digest_resume.clear()
    assert engine.checkpoints.save_work("default", "s", inp) >= len(states[1])
    # Nor does a base the session never uploaded resume.
    inp.upload.base_checkpoint_id = "ckpt_unknown"
    assert engine.checkpoints.save_work("default", "s", inp) >= len(states[1])


def test_an_unknown_session_or_whole_state_is_its_size(engine: Engine) -> None:
    assert engine.checkpoints.save_work("default", "s", SaveInput(data=b"x" * 5000)) == 5000
    inp, _ = upload(Uploader(), growing(1)[0])
    assert engine.checkpoints.save_work("default", "missing", inp) >= 1 << 20


def test_resume_points_of_the_last_uploads_survive_a_save_in_between(engine: Engine) -> None:
    """Two writers on one session: a save judged cheap must still resume when
    the other writer's save landed between its judgement and its run."""
    states = growing(4)
    writer = Uploader()
    save(engine, writer, states[0])
    inp, _ = upload(writer, states[1])  # keeps the first checkpoint's chunks
    assert inp.upload is not None and inp.upload.keep > 0
    assert engine.checkpoints.save_work("default", "s", inp) <= INLINE_SAVE_BYTES
    save(engine, Uploader(), states[2])  # the other writer lands first
    assert engine.checkpoints.save_work("default", "s", inp) <= INLINE_SAVE_BYTES
    result = engine.checkpoints.save_state("default", "s", inp)
    assert result.checkpoint.size == len(states[1])
    # Only the last DIGEST_RESUME_UPLOADS uploads are kept: then it is full size.
    for extra in states[2:]:
        save(engine, Uploader(), extra)
    live = engine.sessions.live("default", "s")
    assert len(live.digest_resume) == domain.DIGEST_RESUME_UPLOADS
    assert inp.upload.base_checkpoint_id not in live.digest_resume
    assert engine.checkpoints.save_work("default", "s", inp) >= len(states[1])
