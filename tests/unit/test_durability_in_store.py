"""Durability is the store's (store/log.py), not the domain's.

No module of python/stratad/domain/ fsyncs, renames files, reads journal records
by hand or maps journals: they hand records to the log engine and get back what
it recovered. The allowlist names the modules not moved yet; it only shrinks.
"""

from __future__ import annotations

import re
from pathlib import Path

DOMAIN = Path(__file__).resolve().parents[2] / "python" / "stratad" / "domain"

#: What only the store may do with files.
FORBIDDEN = re.compile(
    r"os\.fsync|os\.fdatasync|os\.replace|os\.rename|fsync_dir|_is_torn_tail|_read_record|\bmmap\b"
)

#: Module (relative to domain/) -> why it may still: this list must shrink, not grow.
ALLOWED = {
    "sessions.py": "moves onto store/log.py next (docs/design.md, How to change it)",
}


def offenders() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(DOMAIN.rglob("*.py")):
        hits = [
            f"{n}: {line.strip()}"
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if FORBIDDEN.search(line)
        ]
        if hits:
            found[path.relative_to(DOMAIN).as_posix()] = hits
    return found


def test_only_the_allowlisted_domain_modules_touch_durability() -> None:
    unexpected = {name: hits for name, hits in offenders().items() if name not in ALLOWED}
    assert not unexpected, f"durability belongs in store/log.py: {unexpected}"


def test_the_allowlist_names_only_modules_that_still_need_it() -> None:
    stale = set(ALLOWED) - set(offenders())
    assert not stale, f"remove from ALLOWED (moved to the store): {sorted(stale)}"
    assert len(ALLOWED) <= 1, "the allowlist only shrinks"


def test_the_check_sees_what_it_forbids() -> None:
    assert FORBIDDEN.search("os.fsync(fd)") and FORBIDDEN.search("import mmap")
    assert FORBIDDEN.search("journal_mod._read_record(data, pos)")
    assert not FORBIDDEN.search("self.log.append(record)")
