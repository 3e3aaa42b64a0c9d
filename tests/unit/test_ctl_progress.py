"""The progress line of long `stratad ctl` operations."""

from __future__ import annotations

import io

from stratad.ctl.progress import Progress


def test_counted_progress_draws_a_bar_and_ends_the_line() -> None:
    out = io.StringIO()
    with Progress("export s1", 4, enabled=True, stream=out, interval=0) as progress:
        for _ in range(4):
            progress.advance()
    text = out.getvalue()
    assert text.endswith("\n")
    last = text.rstrip("\n").split("\r")[-1]
    assert last.startswith("export s1 [" + "#" * 24 + "] 4/4 100%")


def test_half_way() -> None:
    progress = Progress("import", 10, enabled=False)
    progress.update(5)
    assert "[" + "#" * 12 + "-" * 12 + "] 5/10  50%" in progress.line()


def test_unknown_length_spins_with_the_elapsed_time() -> None:
    out = io.StringIO()
    progress = Progress("verify", enabled=True, stream=out, interval=0)
    progress.update()
    progress.update()
    progress.close()
    frames = out.getvalue().strip().split("\r")
    assert all(f.strip().startswith("verify ") and f.strip().endswith("s") for f in frames if f)


def test_disabled_writes_nothing() -> None:
    out = io.StringIO()
    with Progress("gc", 3, enabled=False, stream=out) as progress:
        progress.advance(3)
    assert out.getvalue() == ""


def test_auto_is_off_when_the_stream_is_not_a_terminal() -> None:
    assert Progress("x", stream=io.StringIO()).enabled is False


def test_a_shorter_line_blanks_out_the_previous_one() -> None:
    out = io.StringIO()
    progress = Progress("label", 1000, enabled=True, stream=out, interval=0)
    progress.update(1000)
    progress.total = 0
    progress.update(0)
    first, second = out.getvalue().split("\r")[1:3]
    assert len(second) >= len(first)
