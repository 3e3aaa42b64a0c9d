"""LangGraph's checkpointer conformance suite against StratadSaver and a real daemon.

`langgraph-checkpoint-conformance` detects which capabilities a saver
implements and runs each one's spec. StratadSaver must pass all eight: the
base five (put, put_writes, get_tuple, list, delete_thread) and the extended
three (delete_for_runs, copy_thread, prune). Each capability suite gets a
fresh saver in a fresh tenant of one `stratad serve` subprocess, so the
suites' fixed thread IDs never meet. The report is printed (pytest -s shows
it; it is also in the failure message).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from stratad.integrations.langgraph import StratadSaver


def test_stratad_saver_passes_all_eight_capabilities(start_daemon: Callable[..., Any]) -> None:
    daemon = start_daemon()

    @checkpointer_test(name="StratadSaver")
    async def stratad_saver() -> AsyncGenerator[StratadSaver, None]:
        saver = StratadSaver(daemon.target, tenant=f"conformance-{uuid.uuid4().hex[:12]}")
        try:
            yield saver
        finally:
            await saver.aclose()

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        report = asyncio.run(validate(stratad_saver, progress=ProgressCallbacks.verbose()))
        report.print_report()
    text = out.getvalue()
    print(text)

    expected = {c.value for c in BASE_CAPABILITIES | EXTENDED_CAPABILITIES}
    assert set(report.results) == expected, text
    failed = {
        name: r.failures or ["not detected"]
        for name, r in report.results.items()
        if not (r.detected and r.passed is True)
    }
    assert not failed, f"capabilities not passed: {failed}\n{text}"
    assert report.conformance_level() == "FULL", text
    assert "Result: FULL (8/8)" in text, text
